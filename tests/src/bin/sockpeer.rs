//! Test server for the capture integration tests. Listens on 127.0.0.1,
//! prints `port N`, then obeys one command per stdin line, answering each
//! with one stdout line. Every socket call is a raw libc call so the tests
//! know exactly which syscall moved which bytes.
//!
//! Commands: `accept`, `accept-null` (accept4 with a NULL address),
//! `exchange` (the ping-pong script of `tokentap_tests::exchange_script`;
//! each recv-family read is preceded by a `MSG_PEEK` of the same family),
//! `big N` (one recvfrom with MSG_WAITALL of N bytes, then replies "ok"),
//! `noise` (traffic on a pipe, a file, a socketpair and an accepted unix
//! socket: none of it may be captured), `flood N SIZE` (N writes),
//! `stream GAP_MS` (SSE-sized writes until one fails), `close`, `exit`.

use std::{
    io::{BufRead, Write},
    net::TcpListener,
    os::fd::AsRawFd,
    time::Duration,
};

use tokentap_tests::{
    exchange_script,
    http::{self, chunk},
    now_ns, BracketedFd,
};

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn iov(buf: &mut [u8]) -> libc::iovec {
    libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    }
}

fn msg(iovs: &mut [libc::iovec]) -> libc::msghdr {
    // SAFETY: msghdr is plain data; zero is a valid "no name, no control".
    let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
    m.msg_iov = iovs.as_mut_ptr();
    m.msg_iovlen = iovs.len();
    m
}

/// One call of `how` reading into `buf`; returns the syscall's result.
/// The recv family first peeks (`MSG_PEEK`, as servers that sniff a
/// protocol do): the capture must take the bytes once, when read.
fn read_once(fd: i32, buf: &mut [u8], how: &str) -> isize {
    // SAFETY: buffers outlive the calls; lengths match.
    unsafe {
        let mut peek = [0u8; 8];
        match how {
            "recv" | "recvfrom" => {
                libc::recvfrom(
                    fd,
                    peek.as_mut_ptr().cast(),
                    peek.len(),
                    libc::MSG_PEEK,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                );
            }
            "recvmsg" => {
                let mut v = [iov(&mut peek)];
                let mut m = msg(&mut v);
                libc::recvmsg(fd, &mut m, libc::MSG_PEEK);
            }
            _ => {}
        }
        match how {
            "read" => libc::read(fd, buf.as_mut_ptr().cast(), buf.len()),
            "readv" => {
                let (a, b) = buf.split_at_mut(buf.len() / 2);
                let v = [iov(a), iov(b)];
                libc::readv(fd, v.as_ptr(), 2)
            }
            "recv" => libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0),
            "recvfrom" => libc::recvfrom(
                fd,
                buf.as_mut_ptr().cast(),
                buf.len(),
                0,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            ),
            "recvmsg" => {
                let (a, b) = buf.split_at_mut(buf.len() / 3);
                let mut v = [iov(a), iov(b)];
                let mut m = msg(&mut v);
                libc::recvmsg(fd, &mut m, 0)
            }
            other => panic!("unknown reader {other}"),
        }
    }
}

/// One call of `how` writing `data`.
fn write_once(fd: i32, data: &[u8], how: &str) -> isize {
    let mut copy = data.to_vec();
    // SAFETY: as above.
    unsafe {
        match how {
            "write" => libc::write(fd, data.as_ptr().cast(), data.len()),
            "writev" => {
                let n = copy.len();
                let (a, rest) = copy.split_at_mut(n / 3);
                let (b, c) = rest.split_at_mut(n / 3);
                let v = [iov(a), iov(b), iov(c)];
                libc::writev(fd, v.as_ptr(), 3)
            }
            "send" => libc::send(fd, data.as_ptr().cast(), data.len(), libc::MSG_NOSIGNAL),
            "sendto" => libc::sendto(
                fd,
                data.as_ptr().cast(),
                data.len(),
                libc::MSG_NOSIGNAL,
                std::ptr::null(),
                0,
            ),
            "sendmsg" => {
                let (a, b) = copy.split_at_mut(data.len() / 2);
                let mut v = [iov(a), iov(b)];
                let m = msg(&mut v);
                libc::sendmsg(fd, &m, libc::MSG_NOSIGNAL)
            }
            other => panic!("unknown writer {other}"),
        }
    }
}

fn read_exact_with(fd: i32, n: usize, how: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let mut buf = vec![0u8; n - out.len()];
        let r = read_once(fd, &mut buf, how);
        assert!(r > 0, "{how} returned {r} (errno {})", errno());
        out.extend_from_slice(&buf[..r as usize]);
    }
    out
}

fn write_all_with(fd: i32, data: &[u8], how: &str) {
    let mut off = 0;
    while off < data.len() {
        let r = write_once(fd, &data[off..], how);
        assert!(r > 0, "{how} returned {r} (errno {})", errno());
        off += r as usize;
    }
}

/// Traffic that must never be captured: pipe, file, socketpair, and a unix
/// connection accepted with a NULL address (the kernel side cannot tell
/// its family; userspace must untrack it).
fn noise() {
    // SAFETY: fds created and closed here.
    unsafe {
        let mut p = [0i32; 2];
        assert_eq!(libc::pipe(p.as_mut_ptr()), 0);
        write_all_with(p[1], b"pipe bytes", "write");
        read_exact_with(p[0], 10, "read");
        libc::close(p[0]);
        libc::close(p[1]);

        let path = std::env::temp_dir().join(format!("sockpeer-{}.txt", std::process::id()));
        let f = std::fs::File::create(&path).expect("create file");
        write_all_with(f.as_raw_fd(), b"file bytes", "write");
        drop(f);
        let _ = std::fs::remove_file(&path);

        let mut sp = [0i32; 2];
        assert_eq!(
            libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM, 0, sp.as_mut_ptr()),
            0
        );
        write_all_with(sp[0], b"socketpair bytes", "sendto");
        read_exact_with(sp[1], 16, "recvfrom");
        libc::close(sp[0]);
        libc::close(sp[1]);

        let sock = std::env::temp_dir().join(format!("sockpeer-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&sock);
        let l = std::os::unix::net::UnixListener::bind(&sock).expect("unix bind");
        let c = std::os::unix::net::UnixStream::connect(&sock).expect("unix connect");
        let fd = libc::accept4(l.as_raw_fd(), std::ptr::null_mut(), std::ptr::null_mut(), 0);
        assert!(fd >= 0);
        write_all_with(c.as_raw_fd(), b"unix bytes", "write");
        read_exact_with(fd, 10, "read");
        write_all_with(fd, b"unix reply", "writev");
        // Keep the accepted fd open a moment so the agent can look it up.
        std::thread::sleep(Duration::from_millis(50));
        libc::close(fd);
        drop(c);
        drop(l);
        let _ = std::fs::remove_file(&sock);
    }
}

/// Answers one OpenAI-style chat request with a chunked SSE stream: a
/// role-only chunk, `n` content chunks `gap` apart (the first one `gap`
/// after the request), a usage chunk and [DONE]. Returns, as JSON, the
/// wall-clock bracket [just before, just after] of the first request read
/// (entered once poll says data is there) and of each content write: the
/// kernel's timestamps lie inside them even when this process is preempted.
fn serve_sse(fd: i32, n: usize, gap: Duration) -> String {
    let mut conn = BracketedFd {
        fd,
        first: None,
        first_rx: None,
        delay: std::time::Duration::ZERO,
    };
    http::read_request(&mut conn, &mut Vec::new())
        .expect("request read failed")
        .expect("the client closed before its request");
    let t_read = conn.first.unwrap_or_default();
    let role = chunk("data: {\"model\":\"sim\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n");
    write_all_with(fd, format!("{}{role}", http::SSE_HEAD).as_bytes(), "write");
    let mut writes = vec![];
    for i in 0..n {
        std::thread::sleep(gap);
        let c = chunk(&format!("data: {{\"model\":\"sim\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"tok{i} \"}}}}]}}\n\n"));
        // Alternate write paths like real engines do.
        let lo = now_ns();
        write_all_with(fd, c.as_bytes(), if i % 2 == 0 { "writev" } else { "send" });
        writes.push([lo, now_ns()]);
    }
    let tail = chunk(&format!("data: {{\"model\":\"sim\",\"choices\":[],\"usage\":{{\"prompt_tokens\":7,\"completion_tokens\":{n}}}}}\n\ndata: [DONE]\n\n")) + http::LAST_CHUNK;
    write_all_with(fd, tail.as_bytes(), "write");
    let t_end = now_ns();
    format!("done {{\"read\":{t_read:?},\"writes\":{writes:?},\"t_end\":{t_end}}}")
}

/// The CPUs this process may run on (at start, before any pinning).
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t filled in by the kernel for this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return vec![];
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect()
    }
}

/// Moves the calling thread to `cpu`; returns the CPU it then runs on.
fn pin_to(cpu: usize) -> i32 {
    // SAFETY: a zeroed cpu_set_t with one bit set, for this thread;
    // sched_getcpu has no preconditions.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        libc::sched_getcpu()
    }
}

fn main() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let lfd = listener.as_raw_fd();
    let port = listener.local_addr().expect("addr").port();
    let mut out = std::io::stdout();
    writeln!(out, "port {port}").ok();
    out.flush().ok();
    let mut conn: i32 = -1;
    let allowed = allowed_cpus();
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let words: Vec<&str> = line.split_whitespace().collect();
        let reply = match words.as_slice() {
            ["accept"] => {
                // SAFETY: sockaddr storage sized for any family.
                let mut sa: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
                let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
                conn = unsafe {
                    libc::accept(
                        lfd,
                        (&mut sa as *mut libc::sockaddr_storage).cast(),
                        &mut len,
                    )
                };
                format!("accepted {conn}")
            }
            ["accept-null"] => {
                // SAFETY: NULL address is allowed.
                conn = unsafe { libc::accept4(lfd, std::ptr::null_mut(), std::ptr::null_mut(), 0) };
                format!("accepted {conn}")
            }
            ["exchange"] => {
                for step in exchange_script() {
                    let got = read_exact_with(conn, step.req.len(), step.read_with);
                    assert_eq!(got, step.req);
                    write_all_with(conn, &step.resp, step.write_with);
                }
                "done".to_string()
            }
            ["big", n] => {
                let n: usize = n.parse().expect("N");
                let mut buf = vec![0u8; n];
                // SAFETY: buffer of n bytes.
                let r = unsafe {
                    libc::recvfrom(
                        conn,
                        buf.as_mut_ptr().cast(),
                        n,
                        libc::MSG_WAITALL,
                        std::ptr::null_mut(),
                        std::ptr::null_mut(),
                    )
                };
                write_all_with(conn, b"ok", "write");
                format!("done {r}")
            }
            ["noise"] => {
                noise();
                "done".to_string()
            }
            ["flood", n, size] => {
                let n: usize = n.parse().expect("N");
                let chunk = vec![b'x'; size.parse().expect("SIZE")];
                let (mut ok, mut err) = (0, 0);
                for _ in 0..n {
                    if write_once(conn, &chunk, "write") > 0 {
                        ok += 1;
                    } else {
                        err += 1;
                    }
                }
                format!("done {ok} {err}")
            }
            ["stream", gap_ms] => {
                let gap = Duration::from_millis(gap_ms.parse().expect("GAP_MS"));
                let chunk = format!(
                    "data: {{\"choices\":[{{\"delta\":{{\"content\":\"{}\"}}}}]}}\n\n",
                    "tok ".repeat(50)
                );
                let mut i = 0u64;
                let e = loop {
                    let r = write_once(conn, chunk.as_bytes(), "send");
                    if r < 0 {
                        break errno();
                    }
                    i += 1;
                    if i > 100_000 {
                        break 0;
                    }
                    std::thread::sleep(gap);
                };
                format!("done {e}")
            }
            ["serve-sse", n, gap_ms] => {
                let n: usize = n.parse().expect("N");
                let gap = Duration::from_millis(gap_ms.parse().expect("GAP_MS"));
                serve_sse(conn, n, gap)
            }
            ["hop", n] => {
                // N 100-byte writes, each from the next allowed CPU in
                // turn, then the close from the CPU after the last write's.
                // Reply: the allowed CPUs, the distinct CPUs the writes ran
                // on, and whether the close ran on another CPU than the
                // last write.
                let n: usize = n.parse().expect("N");
                let cpus = if allowed.is_empty() {
                    vec![0]
                } else {
                    allowed.clone()
                };
                let mut used = std::collections::BTreeSet::new();
                let mut last = -1;
                for i in 0..n {
                    last = pin_to(cpus[i % cpus.len()]);
                    used.insert(last);
                    let msg = format!("{:<99}\n", format!("hop {i}"));
                    write_all_with(conn, msg.as_bytes(), "write");
                }
                let at_close = pin_to(cpus[n % cpus.len()]);
                // SAFETY: closing our own fd.
                unsafe { libc::close(conn) };
                conn = -1;
                format!(
                    "done {} {} {}",
                    allowed.len(),
                    used.len(),
                    u8::from(at_close != last)
                )
            }
            ["close"] => {
                // SAFETY: closing our own fd.
                unsafe { libc::close(conn) };
                conn = -1;
                "done".to_string()
            }
            ["exit"] => break,
            _ => format!("unknown command {line:?}"),
        };
        writeln!(out, "{reply}").ok();
        out.flush().ok();
    }
}
