//! Helpers shared by tokentap's root integration tests: locating the
//! binaries, driving the `sockpeer` test server, running the agent and
//! reading what it wrote.
//!
//! eBPF tests need root. They are `#[ignore]`d with a reason saying so,
//! so a plain `cargo test` reports them as ignored, never as passed;
//! `cargo xtask test` runs them as root with `--include-ignored`, and one
//! started without root fails at once (see [`assert_root`]).

use std::{
    io::{BufRead, BufReader, Write},
    path::{Path, PathBuf},
    process::{Child, ChildStdin, Command, Stdio},
    sync::{mpsc, Arc, Mutex},
    time::{Duration, Instant},
};

use serde_json::Value;

pub mod cgroups;
pub mod fakekube;
pub mod fakenvml;
pub mod http;
pub mod otlp;
pub mod peers;
pub mod transcript;

/// One ping-pong step of the `exchange` script: the request the client
/// sends, the syscall the server reads it with, the response and the
/// syscall the server writes it with.
pub struct Step {
    pub req: Vec<u8>,
    pub read_with: &'static str,
    pub resp: Vec<u8>,
    pub write_with: &'static str,
}

/// Syscall names as the capture reports them. On x86_64 `recv` and `send`
/// are library calls over `recvfrom`/`sendto`.
pub const READERS: [(&str, &str); 5] = [
    ("read", "read"),
    ("readv", "readv"),
    ("recv", "recvfrom"),
    ("recvfrom", "recvfrom"),
    ("recvmsg", "recvmsg"),
];
pub const WRITERS: [(&str, &str); 5] = [
    ("write", "write"),
    ("writev", "writev"),
    ("send", "sendto"),
    ("sendto", "sendto"),
    ("sendmsg", "sendmsg"),
];

pub fn exchange_script() -> Vec<Step> {
    (0..5)
        .map(|i| {
            let mut req = format!("req-{i}-").into_bytes();
            req.extend((0..100 + i * 37).map(|k| b'a' + ((k + i) % 26) as u8));
            let mut resp = format!("data: {{\"i\":{i}}}\n\n").into_bytes();
            resp.extend((0..200 + i * 53).map(|k| b'A' + ((k * 7 + i) % 26) as u8));
            Step {
                req,
                read_with: READERS[i].0,
                resp,
                write_with: WRITERS[i].0,
            }
        })
        .collect()
}

/// Fails the test unless it runs as root. Every test that loads eBPF is
/// `#[ignore = "needs root: …"]` and calls this first: a plain `cargo test`
/// reports it as ignored, and `--include-ignored` without root fails here
/// instead of passing without having run.
pub fn assert_root(test: &str) {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert!(
        euid == 0,
        "{test}: needs root to load eBPF (running as uid {euid}); run the root tests with \
         `sudo cargo xtask test`, which includes the ignored ones"
    );
}

/// The client side of sockpeer's `exchange` script (after the server was
/// told to run it): every request written, every response read and
/// checked byte for byte.
pub fn play_exchange_client(s: &mut std::net::TcpStream) {
    use std::io::Read as _;
    for step in exchange_script() {
        s.write_all(&step.req).expect("write request");
        let mut buf = vec![0; step.resp.len()];
        s.read_exact(&mut buf).expect("read response");
        assert_eq!(buf, step.resp);
    }
}

/// A network namespace joined to the host by a veth pair (host
/// `10.<net>.X.1/30`, namespace `10.<net>.X.2/30`, X from the test
/// process's pid), loopback up inside; deleted on drop, even on panic (the
/// guard exists before the first command, so a half-built set-up goes too).
/// Needs root and iproute2.
pub struct Netns {
    pub name: String,
    pub host_if: String,
    pub host_addr: String,
    pub ns_addr: String,
}

/// Runs `ip ARGS` and panics with its stderr when it fails.
pub fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .expect("run ip (iproute2)");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Netns {
    /// `tag` keeps names and subnets of different test binaries apart
    /// (they may run at once): names `<tag>-<pid>`, subnet `10.<net>.X.0/30`.
    pub fn create(tag: &str, net: u8) -> Netns {
        let pid = std::process::id();
        let x = pid % 256;
        let ns = Netns {
            name: format!("{tag}-{pid}"),
            host_if: format!("{tag}h{pid}"),
            host_addr: format!("10.{net}.{x}.1"),
            ns_addr: format!("10.{net}.{x}.2"),
        };
        let ns_if = format!("{tag}n{pid}");
        ip(&["netns", "add", &ns.name]);
        ip(&[
            "link",
            "add",
            &ns.host_if,
            "type",
            "veth",
            "peer",
            "name",
            &ns_if,
            "netns",
            &ns.name,
        ]);
        ip(&[
            "addr",
            "add",
            &format!("{}/30", ns.host_addr),
            "dev",
            &ns.host_if,
        ]);
        ip(&["link", "set", &ns.host_if, "up"]);
        let inside = |args: &[&str]| ip(&[&["netns", "exec", &ns.name, "ip"][..], args].concat());
        inside(&["addr", "add", &format!("{}/30", ns.ns_addr), "dev", &ns_if]);
        inside(&["link", "set", &ns_if, "up"]);
        inside(&["link", "set", "lo", "up"]);
        ns
    }

    /// Routes from this namespace to `other`'s address through the host
    /// (two pods on one node: each reaches the other through the node).
    /// Needs the host to forward IPv4 (`net.ipv4.ip_forward`, set when 0).
    pub fn route_to(&self, other: &Netns) {
        let fwd = "/proc/sys/net/ipv4/ip_forward";
        if std::fs::read_to_string(fwd).is_ok_and(|v| v.trim() == "0") {
            std::fs::write(fwd, "1").expect("enable IPv4 forwarding");
        }
        ip(&[
            "netns",
            "exec",
            &self.name,
            "ip",
            "route",
            "add",
            &format!("{}/32", other.ns_addr),
            "via",
            &self.host_addr,
        ]);
    }

    /// `program` run inside the namespace. `ip netns exec` execs it in
    /// place, so the child's pid is the program's.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name]).arg(program);
        c
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Deleting one end of a veth pair deletes the other.
        let _ = Command::new("ip")
            .args(["link", "del", &self.host_if])
            .status();
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// target/<profile> of the running test binary.
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let deps = exe.parent().expect("deps dir");
    deps.parent().expect("profile dir").to_path_buf()
}

/// The agent binary built by `cargo xtask build` / `cargo xtask test`.
pub fn tokentap_bin() -> PathBuf {
    let p = std::env::var_os("TOKENTAP_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| target_dir().join("tokentap"));
    assert!(
        p.exists(),
        "{} is missing: run the tests through `cargo xtask test`",
        p.display()
    );
    p
}

fn lines_of(r: impl std::io::Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(r).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// The `sockpeer` test server, driven line by line over stdin/stdout.
pub struct Peer {
    child: Child,
    stdin: ChildStdin,
    out: mpsc::Receiver<String>,
    pub pid: u32,
    pub port: u16,
}

impl Peer {
    pub fn spawn(bin: &Path) -> Peer {
        let mut child = Command::new(bin)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn sockpeer");
        let stdin = child.stdin.take().expect("stdin");
        let out = lines_of(child.stdout.take().expect("stdout"));
        let pid = child.id();
        let mut p = Peer {
            child,
            stdin,
            out,
            pid,
            port: 0,
        };
        let l = p.line(Duration::from_secs(10));
        p.port = l
            .strip_prefix("port ")
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("sockpeer said {l:?}"));
        p
    }

    /// Send a command without waiting for its reply.
    pub fn send(&mut self, cmd: &str) {
        writeln!(self.stdin, "{cmd}").expect("write to sockpeer");
        self.stdin.flush().expect("flush");
    }

    /// Next reply line (panics after `timeout`).
    pub fn line(&mut self, timeout: Duration) -> String {
        self.out
            .recv_timeout(timeout)
            .unwrap_or_else(|e| panic!("sockpeer gave no reply within {timeout:?}: {e}"))
    }

    /// Send a command and wait for its reply.
    pub fn cmd(&mut self, cmd: &str) -> String {
        self.send(cmd);
        self.line(Duration::from_secs(30))
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A running `tokentap capture`.
pub struct Agent {
    child: Child,
    stderr: Arc<Mutex<Vec<String>>>,
    pub out: PathBuf,
}

/// What a finished capture left behind.
pub struct Captured {
    pub events: Vec<Value>,
    pub stats: Value,
    pub stderr: Vec<String>,
    pub exit_ok: bool,
}

impl Agent {
    /// Starts `tokentap capture ARGS --out OUT` and waits until it says it
    /// is attached.
    pub fn capture(args: &[&str], out: &Path) -> Agent {
        Agent::capture_via(Command::new(tokentap_bin()), args, out)
    }

    /// As [`Agent::capture`], with `cmd` running the agent (e.g. a wrapper
    /// that changes its mount namespace, ending in the tokentap binary).
    pub fn capture_via(mut cmd: Command, args: &[&str], out: &Path) -> Agent {
        let mut child = cmd
            .arg("capture")
            .args(args)
            .arg("--out")
            .arg(out)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn tokentap");
        let rx = lines_of(child.stderr.take().expect("stderr"));
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(l) => {
                    let ready = l.ends_with("; ready");
                    stderr.lock().unwrap().push(l);
                    if ready {
                        break;
                    }
                }
                Err(_) => {
                    let _ = child.kill();
                    panic!(
                        "tokentap capture did not become ready: {:?}",
                        stderr.lock().unwrap()
                    );
                }
            }
        }
        let keep = stderr.clone();
        std::thread::spawn(move || {
            for l in rx {
                keep.lock().unwrap().push(l);
            }
        });
        Agent {
            child,
            stderr,
            out: out.to_path_buf(),
        }
    }

    /// SIGINT, wait (bounded), and read the capture file.
    pub fn stop(mut self) -> Captured {
        // SAFETY: plain signal to our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        self.wait(Duration::from_secs(30))
    }

    /// Wait for a capture with --duration to end by itself.
    pub fn wait(&mut self, timeout: Duration) -> Captured {
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(st) = self.child.try_wait().expect("try_wait") {
                break st;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("tokentap did not exit within {timeout:?} (hang)");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        std::thread::sleep(Duration::from_millis(100));
        let stderr = self.stderr.lock().unwrap().clone();
        let stats = stderr
            .iter()
            .rev()
            .find_map(|l| l.split_once(" stats ").map(|(_, j)| j.to_string()))
            .and_then(|j| serde_json::from_str(&j).ok())
            .unwrap_or(Value::Null);
        Captured {
            events: read_jsonl(&self.out),
            stats,
            stderr,
            exit_ok: status.success(),
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn read_jsonl(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad JSON line {l:?}: {e}")))
        .collect()
}

/// A JSON Lines log's complete lines so far (its writer may be mid-line).
pub fn logged(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The agent's shutdown line (`tokentap: N requests recorded, …; capture
/// {json}; decode {json}`) and its two JSON parts.
pub struct Shutdown {
    pub line: String,
    /// The capture's counters (`Value::Null` in a replay, which has none).
    pub capture: Value,
    /// The decoder's counters (`desyncs`, `shed`, `held_bytes_peak`, …).
    pub decode: Value,
}

/// Finds and parses the shutdown line among an agent's output `lines`;
/// panics, showing them, when there is none or its decode part is not
/// JSON (a check on its counters must never pass for want of them).
pub fn shutdown(lines: &[String]) -> Shutdown {
    let line = lines
        .iter()
        .rev()
        .find(|l| l.contains("requests recorded"))
        .unwrap_or_else(|| panic!("no shutdown line in the agent's output: {lines:#?}"))
        .clone();
    let (head, decode) = line
        .rsplit_once("; decode ")
        .unwrap_or_else(|| panic!("no decode counters in {line}"));
    let decode: Value =
        serde_json::from_str(decode).unwrap_or_else(|e| panic!("decode counters in {line}: {e}"));
    let capture = head
        .split_once("; capture ")
        .and_then(|(_, j)| serde_json::from_str(j).ok())
        .unwrap_or(Value::Null);
    Shutdown {
        line,
        capture,
        decode,
    }
}

/// Decoded payload of a data event.
pub fn payload(ev: &Value) -> Vec<u8> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(ev["data_b64"].as_str().unwrap_or(""))
        .expect("base64")
}

/// Wall-clock time, UNIX-epoch nanoseconds (0 if the clock is before 1970).
/// Time this machine's CPUs together lost to its hypervisor so far (the
/// `steal` column of /proc/stat's `cpu` line, USER_HZ = 100), ms: a VM
/// whose vCPU is descheduled stops every clock-reading process at once,
/// so a timing test prints how much of that its run saw.
pub fn steal_ms() -> u64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    stat.lines()
        .find(|l| l.starts_with("cpu "))
        .and_then(|l| l.split_whitespace().nth(8))
        .and_then(|v| v.parse::<u64>().ok())
        .map_or(0, |ticks| ticks * 10)
}

pub fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// A socket fd read the way the test peers time their reads: each read
/// first waits in poll(2) until data is there, so the read itself does
/// not block, and the wall-clock bracket [just before, just after] of the
/// first read since `first` was cleared is kept. The kernel's timestamp of
/// that read (syscall exit) lies inside the bracket.
pub struct BracketedFd {
    pub fd: i32,
    pub first: Option<[u64; 2]>,
    /// The kernel's receive time of the first byte the first read took
    /// (`SO_TIMESTAMPNS`, peeked before that read): when it reached the
    /// socket, by the kernel's clock, independent of the agent. `None`
    /// when the socket does not timestamp (see [`enable_rx_timestamps`]).
    pub first_rx: Option<u64>,
    /// Left unread this long after poll says a request's first bytes are
    /// there (an engine too busy to read: the request waits in the socket).
    pub delay: std::time::Duration,
}

impl std::io::Read for BracketedFd {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let mut pfd = libc::pollfd {
            fd: self.fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut pfd, 1, -1) };
        if self.first.is_none() && !self.delay.is_zero() {
            std::thread::sleep(self.delay);
        }
        if self.first.is_none() {
            self.first_rx = peek_rx_ns(self.fd);
        }
        let lo = now_ns();
        // SAFETY: a valid buffer of buf.len() bytes.
        let r = unsafe { libc::read(self.fd, buf.as_mut_ptr().cast(), buf.len()) };
        let hi = now_ns();
        if r < 0 {
            return Err(std::io::Error::last_os_error());
        }
        self.first.get_or_insert([lo, hi]);
        Ok(r as usize)
    }
}

/// Asks the kernel to timestamp what `fd` (a listening socket: its
/// accepted ones inherit it) receives (`SO_TIMESTAMPNS`). It also turns on
/// receive timestamps for every socket of the host, so segments that
/// arrive before `accept()` are stamped when they arrive.
pub fn enable_rx_timestamps(fd: i32) {
    let on: libc::c_int = 1;
    // SAFETY: a valid int option.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_TIMESTAMPNS,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

/// The receive timestamp (UNIX-epoch ns) of the next byte `fd` would read,
/// peeked without taking it; `None` without one.
fn peek_rx_ns(fd: i32) -> Option<u64> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    let mut control = [0u64; 16];
    // SAFETY: msghdr over valid local buffers; the kernel writes at most
    // msg_controllen bytes of control data.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&control) as _;
        if libc::recvmsg(fd, &mut msg, libc::MSG_PEEK | libc::MSG_DONTWAIT) <= 0 {
            return None;
        }
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_TIMESTAMPNS {
                let ts: libc::timespec = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast());
                return Some(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64);
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    None
}

/// A TCP connection to 127.0.0.1:`port` from the source address `src`.
pub fn connect_from(src: std::net::Ipv4Addr, port: u16) -> std::net::TcpStream {
    // SAFETY: plain socket calls on a fresh fd with valid sockaddr_in
    // structs; the fd is handed to TcpStream, which owns and closes it.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
        let stream = <std::net::TcpStream as std::os::fd::FromRawFd>::from_raw_fd(fd);
        let addr = |ip: std::net::Ipv4Addr, port: u16| libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: port.to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from_ne_bytes(ip.octets()),
            },
            sin_zero: [0; 8],
        };
        let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        let a = addr(src, 0);
        let rc = libc::bind(fd, (&a as *const libc::sockaddr_in).cast(), len);
        assert_eq!(rc, 0, "bind {src}: {}", std::io::Error::last_os_error());
        let a = addr(std::net::Ipv4Addr::LOCALHOST, port);
        let rc = libc::connect(fd, (&a as *const libc::sockaddr_in).cast(), len);
        assert_eq!(rc, 0, "connect: {}", std::io::Error::last_os_error());
        stream
    }
}

/// A loopback port with nothing listening on it right now (two calls may
/// return the same port).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind an ephemeral port")
        .port()
}

/// A fresh scratch directory under the system temp dir.
pub fn scratch_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tokentap-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("mkdir scratch");
    d
}

/// A child process that is killed and reaped when dropped.
pub struct Running(pub Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `cmd` with its stdout and stderr read line by line, and returns
/// once a line contains `ready` (panics after 90 s). The receiver yields
/// every line, those before `ready` included, and ends when both pipes
/// close.
pub fn start(cmd: &mut Command, ready: &str, what: &str) -> (Running, mpsc::Receiver<String>) {
    let mut child = Running(
        cmd.stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .stdin(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {what}: {e}")),
    );
    let (tx, rx) = mpsc::channel();
    for r in [
        Box::new(child.0.stdout.take().expect("stdout")) as Box<dyn std::io::Read + Send>,
        Box::new(child.0.stderr.take().expect("stderr")),
    ] {
        let tx = tx.clone();
        std::thread::spawn(move || {
            for l in BufReader::new(r).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
    }
    drop(tx);
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut seen = vec![];
    loop {
        let l = rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .unwrap_or_else(|_| panic!("{what} did not start: {seen:?}"));
        let done = l.contains(ready);
        seen.push(l);
        if done {
            break;
        }
    }
    let (tx, out) = mpsc::channel();
    std::thread::spawn(move || {
        for l in seen.into_iter().chain(rx) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    (child, out)
}

/// Starts the simulated engine (`bin`, from `env!("CARGO_BIN_EXE_simengine")`)
/// and returns it with its port.
pub fn start_simengine(bin: &Path, args: &[&str]) -> (Running, u16, mpsc::Receiver<String>) {
    let (engine, out) = start(Command::new(bin).args(args), "listening", "simengine");
    let port = out
        .recv()
        .ok()
        .and_then(|l| l.strip_prefix("listening ").and_then(|p| p.parse().ok()))
        .expect("simengine says its port");
    (engine, port, out)
}

/// SIGINT, then wait (panics after 30 s: a hang); returns whether it
/// exited successfully and everything it printed.
pub fn interrupt(p: &mut Running, out: mpsc::Receiver<String>) -> (bool, Vec<String>) {
    // SAFETY: a plain signal to our own child.
    unsafe { libc::kill(p.0.id() as i32, libc::SIGINT) };
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(st) = p.0.try_wait().expect("try_wait") {
            break st;
        }
        assert!(
            Instant::now() < deadline,
            "the process did not stop on SIGINT (hang)"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    (status.success(), out.iter().collect())
}

/// `tokentap run` as a test starts it: the built binary, `run
/// --no-console`, then what the test adds. Every test that starts the
/// agent goes through this, so a flag every test needs (or a renamed one)
/// changes here once.
///
/// ```no_run
/// use tokentap_tests::RunAgent;
/// let log = std::path::Path::new("requests.jsonl");
/// let (agent, out) = RunAgent::new().port(8000).no_gpu().requests_log(log).start();
/// ```
#[derive(Clone, Debug)]
pub struct RunAgent {
    args: Vec<std::ffi::OsString>,
    env: Vec<(std::ffi::OsString, Option<std::ffi::OsString>)>,
}

impl Default for RunAgent {
    fn default() -> Self {
        Self::new()
    }
}

impl RunAgent {
    /// `tokentap run --no-console`.
    pub fn new() -> Self {
        Self {
            args: vec!["run".into(), "--no-console".into()],
            env: Vec::new(),
        }
    }

    pub fn arg(mut self, a: impl AsRef<std::ffi::OsStr>) -> Self {
        self.args.push(a.as_ref().to_os_string());
        self
    }

    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_os_string()));
        self
    }

    /// `--port P`.
    pub fn port(self, p: u16) -> Self {
        self.args(["--port", &p.to_string()])
    }

    /// `--pid P`.
    pub fn pid(self, p: u32) -> Self {
        self.args(["--pid", &p.to_string()])
    }

    /// `--no-gpu`.
    pub fn no_gpu(self) -> Self {
        self.arg("--no-gpu")
    }

    /// `--requests-log PATH`.
    pub fn requests_log(self, p: &Path) -> Self {
        self.arg("--requests-log").arg(p)
    }

    /// `--events-log PATH`.
    pub fn events_log(self, p: &Path) -> Self {
        self.arg("--events-log").arg(p)
    }

    /// The OTLP tests' agent: `--pid PID --no-gpu --no-engine-metrics`
    /// exporting to 127.0.0.1:`otlp_port` every second ([`Self::otlp`]).
    pub fn exporting(pid: u32, otlp_port: u16) -> Self {
        Self::new()
            .pid(pid)
            .no_gpu()
            .arg("--no-engine-metrics")
            .otlp(otlp_port)
    }

    /// `--otlp-endpoint http://127.0.0.1:PORT --export-interval 1`.
    pub fn otlp(self, port: u16) -> Self {
        self.args(["--otlp-endpoint", &format!("http://127.0.0.1:{port}")])
            .args(["--export-interval", "1"])
    }

    pub fn env(mut self, k: impl AsRef<std::ffi::OsStr>, v: impl AsRef<std::ffi::OsStr>) -> Self {
        self.env
            .push((k.as_ref().to_os_string(), Some(v.as_ref().to_os_string())));
        self
    }

    pub fn env_remove(mut self, k: impl AsRef<std::ffi::OsStr>) -> Self {
        self.env.push((k.as_ref().to_os_string(), None));
        self
    }

    /// The arguments after the binary (for a test that runs the agent
    /// through a wrapper: `unshare`, `ip netns exec`, `setpriv`).
    pub fn run_args(&self) -> Vec<std::ffi::OsString> {
        self.args.clone()
    }

    /// The whole command, not started (for `.output()`, or a test that
    /// adds what the builder does not know).
    pub fn command(&self) -> Command {
        let mut c = Command::new(tokentap_bin());
        c.args(&self.args);
        self.apply_env(&mut c);
        c
    }

    /// `cmd` (a wrapper) with the agent binary and its arguments appended
    /// and the environment set.
    pub fn wrapped(&self, mut cmd: Command) -> Command {
        cmd.arg(tokentap_bin()).args(&self.args);
        self.apply_env(&mut cmd);
        cmd
    }

    fn apply_env(&self, c: &mut Command) {
        for (k, v) in &self.env {
            match v {
                Some(v) => c.env(k, v),
                None => c.env_remove(k),
            };
        }
    }

    /// Starts it and returns once it says it is ready (`; ready`; panics
    /// after 90 s), with every line it prints.
    pub fn start(&self) -> (Running, mpsc::Receiver<String>) {
        start(&mut self.command(), "; ready", "tokentap run")
    }

    /// [`Self::start`] through a wrapper command.
    pub fn start_wrapped(&self, cmd: Command) -> (Running, mpsc::Receiver<String>) {
        start(&mut self.wrapped(cmd), "; ready", "tokentap run")
    }
}
