//! Root integration tests of what is captured as a target: children a
//! launcher forks (before or after the agent attached), not its threads,
//! and not a child that has exited; servers in another network namespace
//! selected by `--port`; and the kernel/user ABI check on the eBPF object.

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::TcpStream,
    path::{Path, PathBuf},
    process::{Child, ChildStdin, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use serde_json::Value;
use tokentap_tests::{
    assert_root, exchange_script, payload, play_exchange_client, scratch_dir, tokentap_bin, Agent,
};

/// A process driven line by line over stdin/stdout, like `Peer`, but
/// started by any command (a shell wrapper around `sockpeer`, `unshare`,
/// this test binary in helper mode).
struct Driven {
    child: Child,
    stdin: Option<ChildStdin>,
    out: mpsc::Receiver<String>,
}

impl Driven {
    fn spawn(cmd: &mut Command) -> Driven {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn");
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("stdout");
        let (tx, out) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Driven { child, stdin, out }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn send(&mut self, line: &str) {
        let s = self.stdin.as_mut().expect("stdin open");
        writeln!(s, "{line}").expect("write");
        s.flush().expect("flush");
    }

    /// The next line containing `prefix` (others are skipped: libtest
    /// chatter in helper mode), from `prefix` on; panics after 30 s.
    fn wait_for(&mut self, prefix: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let l = self
                .out
                .recv_timeout(left)
                .unwrap_or_else(|e| panic!("no line with {prefix:?}: {e}"));
            if let Some(at) = l.find(prefix) {
                return l[at..].to_string();
            }
        }
    }

    fn cmd(&mut self, line: &str) -> String {
        self.send(line);
        self.out
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("no reply to {line:?}: {e}"))
    }
}

impl Drop for Driven {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn sockpeer() -> &'static str {
    env!("CARGO_BIN_EXE_sockpeer")
}

/// The direct children of `pid` (from /proc/*/stat).
fn children_of(pid: u32) -> Vec<u32> {
    let mut out = vec![];
    for ent in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(p) = ent.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
            continue;
        };
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
            continue;
        };
        if rest.split_whitespace().nth(1) == Some(&pid.to_string()) {
            out.push(p);
        }
    }
    out
}

/// Waits until `pid` has exactly one child and returns it.
fn only_child(pid: u32) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let c = children_of(pid);
        if c.len() == 1 {
            return c[0];
        }
        assert!(Instant::now() < deadline, "{pid} has children {c:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The client side of sockpeer's `exchange` script.
fn client_exchange(p: &mut Driven, s: &mut TcpStream) {
    p.send("exchange");
    play_exchange_client(s);
    assert_eq!(p.wait_for("done"), "done");
}

fn accepted_fd(reply: &str) -> i64 {
    reply
        .strip_prefix("accepted ")
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad accept reply {reply:?}"))
}

fn port_of(line: &str) -> u16 {
    line.strip_prefix("port ")
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("sockpeer said {line:?}"))
}

fn want_in() -> Vec<u8> {
    exchange_script()
        .iter()
        .flat_map(|s| s.req.clone())
        .collect()
}

fn inbound(evs: &[Value], pid: u32, fd: i64) -> Vec<u8> {
    evs.iter()
        .filter(|e| e["type"] == "data" && e["pid"] == pid && e["fd"] == fd && e["dir"] == "in")
        .flat_map(payload)
        .collect()
}

/// A shell that forks sockpeer (a separate process: `&`, not `exec`) and
/// waits for it; with `gate`, it first waits for a `go` line. The shell
/// reads its own line byte by byte, so sockpeer gets every later line.
fn wrapper(gate: bool) -> Driven {
    // A background job's stdin is /dev/null unless redirected from a
    // saved copy (`<&0` alone would copy the /dev/null).
    let script = if gate {
        "read go; exec 3<&0; \"$0\" <&3 3<&- & wait"
    } else {
        "exec 3<&0; \"$0\" <&3 3<&- & wait"
    };
    Driven::spawn(Command::new("sh").args(["-c", script, sockpeer()]))
}

#[test]
#[ignore = "needs root: loads eBPF (cargo xtask test runs it as root)"]
fn a_server_a_wrapper_forks_after_the_agent_attached_is_captured() {
    assert_root("targets fork after attach");
    let dir = scratch_dir("fork-after");
    let mut w = wrapper(true);
    let agent = Agent::capture(&["--pid", &w.pid().to_string()], &dir.join("cap.jsonl"));
    w.send("go");
    let port = port_of(&w.wait_for("port "));
    let server = only_child(w.pid());
    assert_ne!(server, w.pid());

    let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let fd = accepted_fd(&w.cmd("accept"));
    client_exchange(&mut w, &mut c);
    assert_eq!(w.cmd("close"), "done");
    std::thread::sleep(Duration::from_millis(200));
    let cap = agent.stop();
    assert!(cap.exit_ok, "{:?}", cap.stderr);

    let opens: Vec<&Value> = cap.events.iter().filter(|e| e["type"] == "open").collect();
    assert_eq!(opens.len(), 1, "{opens:?}");
    assert_eq!(opens[0]["pid"], server);
    assert_eq!(opens[0]["fd"], fd);
    assert_eq!(opens[0]["local"], format!("127.0.0.1:{port}"));
    assert!(
        inbound(&cap.events, server, fd) == want_in(),
        "inbound bytes differ"
    );
    assert!(
        cap.stats["forks_followed"].as_u64() >= Some(1),
        "{:?}",
        cap.stats
    );
}

#[test]
#[ignore = "needs root: loads eBPF (cargo xtask test runs it as root)"]
fn a_server_a_wrapper_forked_before_the_agent_started_is_captured_with_its_open_connections() {
    assert_root("targets fork before start");
    let dir = scratch_dir("fork-before");
    let mut w = wrapper(false);
    let port = port_of(&w.wait_for("port "));
    let server = only_child(w.pid());
    let mut early = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let early_fd = accepted_fd(&w.cmd("accept"));

    let agent = Agent::capture(&["--pid", &w.pid().to_string()], &dir.join("cap.jsonl"));
    client_exchange(&mut w, &mut early);
    let mut late = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let late_fd = accepted_fd(&w.cmd("accept"));
    client_exchange(&mut w, &mut late);
    std::thread::sleep(Duration::from_millis(200));
    let cap = agent.stop();
    assert!(cap.exit_ok, "{:?}", cap.stderr);

    assert!(
        cap.stderr
            .iter()
            .any(|l| l.contains(&format!("capturing pids [{}, {server}]", w.pid()))),
        "the existing child is a target from the start: {:?}",
        cap.stderr
    );
    let opens: Vec<&Value> = cap.events.iter().filter(|e| e["type"] == "open").collect();
    assert_eq!(opens.len(), 2, "{opens:?}");
    assert_eq!(
        (&opens[0]["pid"], &opens[0]["fd"]),
        (&server.into(), &early_fd.into())
    );
    assert_eq!(
        opens[0]["peer"],
        early.local_addr().unwrap().to_string(),
        "the connection open before start is seeded"
    );
    assert_eq!(
        (&opens[1]["pid"], &opens[1]["fd"]),
        (&server.into(), &late_fd.into())
    );
    assert!(inbound(&cap.events, server, early_fd) == want_in());
    assert!(inbound(&cap.events, server, late_fd) == want_in());
}

/// Helper mode of the test below (this binary re-run with
/// `TARGETS_HELPER=1`): after `go`, four threads, then one child process
/// that is reaped; then it waits for stdin to close.
fn thread_and_fork_helper() {
    let mut stdin = std::io::stdin().lock();
    let mut line = String::new();
    println!("helper ready");
    stdin.read_line(&mut line).unwrap();
    let threads: Vec<_> = (0..4)
        .map(|_| std::thread::spawn(|| std::thread::sleep(Duration::from_millis(50))))
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let mut child = Command::new("sleep").arg("0.2").spawn().unwrap();
    let child_pid = child.id();
    assert!(child.wait().unwrap().success());
    println!("helper done {child_pid}");
    let _ = stdin.read_line(&mut line);
}

#[test]
#[ignore = "needs root: loads eBPF (cargo xtask test runs it as root)"]
fn threads_of_a_target_are_not_new_targets_and_an_exited_child_leaves_targets() {
    if std::env::var_os("TARGETS_HELPER").is_some() {
        thread_and_fork_helper();
        return;
    }
    assert_root("targets threads and exit");
    let dir = scratch_dir("threads");
    let mut h = Driven::spawn(
        Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "--include-ignored",
                "threads_of_a_target_are_not_new_targets_and_an_exited_child_leaves_targets",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("TARGETS_HELPER", "1"),
    );
    h.wait_for("helper ready");
    let agent = Agent::capture(&["--pid", &h.pid().to_string()], &dir.join("cap.jsonl"));
    h.send("go");
    h.wait_for("helper done ");
    std::thread::sleep(Duration::from_millis(300));
    let cap = agent.stop();
    assert!(cap.exit_ok, "{:?}", cap.stderr);
    let st = &cap.stats;
    assert_eq!(
        st["forks_followed"], 1,
        "four threads and one process: only the process is followed: {st:?}"
    );
    assert_eq!(st["targets_exited"], 1, "the child's exit: {st:?}");
    assert_eq!(st["targets"], 1, "only the helper is left: {st:?}");
    assert_eq!(
        st["targets_in_kernel"], 1,
        "only the helper is left: {st:?}"
    );
    assert_eq!(st["targets_full"], 0, "{st:?}");
}

#[test]
#[ignore = "needs root: loads eBPF (cargo xtask test runs it as root)"]
fn port_selects_a_listener_in_another_network_namespace() {
    assert_root("targets netns port");
    let dir = scratch_dir("netns");
    // sockpeer in a fresh network namespace: same pid as `unshare`.
    let mut p = Driven::spawn(Command::new("unshare").args([
        "--net",
        "sh",
        "-c",
        "ip link set lo up && exec \"$0\"",
        sockpeer(),
    ]));
    let port = port_of(&p.wait_for("port "));
    let ns = format!("/proc/{}/ns/net", p.pid());
    assert_ne!(
        std::fs::read_link(&ns).unwrap(),
        std::fs::read_link("/proc/self/ns/net").unwrap(),
        "sockpeer must be in another network namespace"
    );

    let agent = Agent::capture(&["--port", &port.to_string()], &dir.join("cap.jsonl"));
    // Connect from inside the namespace, on a thread that enters it.
    let nsfile = std::fs::File::open(&ns).unwrap();
    let conn = std::thread::spawn(move || {
        use std::os::fd::AsRawFd;
        // SAFETY: valid namespace fd; affects only this thread.
        let rc = unsafe { libc::setns(nsfile.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
        TcpStream::connect(("127.0.0.1", port)).unwrap()
    });
    let fd = accepted_fd(&p.cmd("accept"));
    let mut c = conn.join().unwrap();
    client_exchange(&mut p, &mut c);
    std::thread::sleep(Duration::from_millis(200));
    let cap = agent.stop();
    assert!(cap.exit_ok, "{:?}", cap.stderr);
    let opens: Vec<&Value> = cap.events.iter().filter(|e| e["type"] == "open").collect();
    assert_eq!(opens.len(), 1, "{opens:?}");
    assert_eq!(opens[0]["pid"], p.pid());
    assert_eq!(opens[0]["local"], format!("127.0.0.1:{port}"));
    assert!(inbound(&cap.events, p.pid(), fd) == want_in());
}

/// The eBPF object the agent embeds (what xtask built).
fn built_object() -> PathBuf {
    std::env::var_os("TOKENTAP_EBPF_OBJ")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../target/bpf/bpfel-unknown-none/release/agent-ebpf")
        })
}

/// Byte range of section `name` in a 64-bit little-endian ELF file.
fn section_range(elf: &[u8], name: &str) -> Option<std::ops::Range<usize>> {
    let u16_at = |at: usize| u16::from_le_bytes(elf[at..at + 2].try_into().unwrap()) as usize;
    let u32_at = |at: usize| u32::from_le_bytes(elf[at..at + 4].try_into().unwrap()) as usize;
    let u64_at = |at: usize| u64::from_le_bytes(elf[at..at + 8].try_into().unwrap()) as usize;
    let (shoff, shentsize, shnum, shstrndx) =
        (u64_at(0x28), u16_at(0x3a), u16_at(0x3c), u16_at(0x3e));
    let hdr = |i: usize| shoff + i * shentsize;
    let strtab = u64_at(hdr(shstrndx) + 0x18);
    (0..shnum).find_map(|i| {
        let at = strtab + u32_at(hdr(i));
        let end = at + elf[at..].iter().position(|&c| c == 0)?;
        (&elf[at..end] == name.as_bytes()).then(|| {
            let off = u64_at(hdr(i) + 0x18);
            off..off + u64_at(hdr(i) + 0x20)
        })
    })
}

#[test]
fn an_object_built_for_another_record_layout_is_refused_before_loading() {
    let dir = scratch_dir("abi");
    let mut elf = std::fs::read(built_object())
        .expect("the eBPF object: run the tests through `cargo xtask test`");
    let r = section_range(&elf, "tokentap_abi").expect("tokentap_abi section");
    assert_eq!(r.len(), 4);
    let built = u32::from_le_bytes(elf[r.clone()].try_into().unwrap());
    elf[r].copy_from_slice(&(built + 1).to_le_bytes());
    let patched = dir.join("patched.o");
    std::fs::write(&patched, &elf).unwrap();

    // Not root: the check comes before anything needs a privilege.
    let out = Command::new(tokentap_bin())
        .args(["capture", "--pid", &std::process::id().to_string()])
        .args(["--out", dir.join("cap.jsonl").to_str().unwrap()])
        .env("TOKENTAP_EBPF_OBJECT", &patched)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "eBPF object built for record layout v{}, this agent expects v{built}",
            built + 1
        )) && err.contains("cargo xtask build"),
        "{err}"
    );
}

#[test]
#[ignore = "needs root: loads eBPF (cargo xtask test runs it as root)"]
fn an_object_given_by_path_with_the_right_version_loads() {
    assert_root("targets object by path");
    let dir = scratch_dir("abi-ok");
    let copy = dir.join("copy.o");
    std::fs::copy(built_object(), &copy).unwrap();
    let mut agent = Command::new(tokentap_bin())
        .args(["capture", "--pid", &std::process::id().to_string()])
        .args(["--duration", "0.2", "--out"])
        .arg(dir.join("cap.jsonl"))
        .env("TOKENTAP_EBPF_OBJECT", &copy)
        .env("RUST_LOG", "info")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = String::new();
    agent
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(agent.wait().unwrap().success(), "{err}");
    assert!(err.contains("; ready"), "{err}");
}

/// The library API the discovery stage uses: start with a `--port` that
/// nothing listens on yet, add a launcher later, and see the fork of its
/// server, the server's exec and the exits as process events, with the
/// target set (userspace and kernel) following them.
#[test]
#[ignore = "needs root: loads eBPF (cargo xtask test runs it as root)"]
fn process_events_follow_a_launcher_added_after_start() {
    use tokentap::capture::{Capture, CaptureOptions, ProcEvent};
    assert_root("targets process events");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let unused_port = tokentap_tests::free_port();
        let mut cap = Capture::start(&CaptureOptions {
            ports: vec![unused_port],
            allow_no_targets: true,
            ..CaptureOptions::default()
        })
        .expect("start with a port nobody listens on yet");
        assert!(cap.targets().is_empty());

        let mut w = wrapper(true);
        let mut evs = vec![];
        assert!(cap.add_target(w.pid(), &mut evs).unwrap());
        assert!(
            !cap.add_target(w.pid(), &mut evs).unwrap(),
            "already a target"
        );
        w.send("go");
        w.wait_for("port ");
        let server = only_child(w.pid());

        let mut seen: Vec<ProcEvent> = vec![];
        let mut until = |cap: &mut Capture, want: ProcEvent| {
            let deadline = Instant::now() + Duration::from_secs(10);
            let mut evs = vec![];
            while !seen.contains(&want) {
                assert!(Instant::now() < deadline, "no {want:?} in {seen:?}");
                // Drain without waiting (no await needed), then pause.
                cap.drain(&mut evs);
                cap.take_proc_events(&mut seen);
                std::thread::sleep(Duration::from_millis(10));
            }
        };
        until(
            &mut cap,
            ProcEvent::Fork {
                parent: w.pid(),
                child: server,
            },
        );
        until(
            &mut cap,
            ProcEvent::Exec {
                pid: server,
                comm: "sockpeer".into(),
            },
        );
        assert_eq!(cap.targets(), {
            let mut v = vec![w.pid(), server];
            v.sort_unstable();
            v
        });
        // sockpeer exits, then the shell (its `wait` returns).
        w.send("exit");
        until(&mut cap, ProcEvent::Exit { pid: server });
        until(&mut cap, ProcEvent::Exit { pid: w.pid() });
        assert!(cap.targets().is_empty(), "{:?}", cap.targets());
        let st = cap.stats();
        assert_eq!(st.targets_in_kernel, 0, "{st:?}");
        assert_eq!((st.forks_followed, st.targets_exited), (1, 2), "{st:?}");
        assert_eq!(st.proc_events_dropped, 0, "{st:?}");
    });
}
