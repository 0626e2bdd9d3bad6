//! Workload for `cargo xtask bench capture`. Prints `ready PID`, waits for
//! a `go` line on stdin, runs, prints one JSON line with what it measured
//! on its writing thread: `{"writes":N,"wall_s":W,"cpu_s":C}`.
//!
//! Modes:
//!   tcp SECS [RATE]  a write-heavy SSE server: one loopback connection
//!                    carries an OpenAI-style streamed chat request, and
//!                    the response is 300-byte write()s, each one HTTP
//!                    chunk with one SSE token event (a reader thread
//!                    drains it), as fast as possible or paced at RATE
//!                    writes/s (in 1 ms batches)
//!   pipe SECS        16-byte write()s to a pipe (drained by the same thread)
//!   sys SECS         getppid() in a loop: a syscall that is not a socket
//!                    call (what a hook on every syscall costs the rest)
//!   bulk SECS        a bulk TCP transfer over loopback: 64 KiB write()s,
//!                    drained by a reader thread (what the arrival program,
//!                    on every TCP segment the host receives, costs
//!                    traffic that is not an engine's)
//!   idle             do nothing until stdin closes (a harmless target)
//!   conns N          accept N loopback connections from a child process
//!                    (not this one, so only the server side is a target);
//!                    each sends one partial HTTP request head that the
//!                    server reads, so every connection holds decoder
//!                    state; all stay open until stdin closes. Prints
//!                    `{"conns":N}` once all are open.
//!   uploads N        prints `ready PID PORT`, then accepts N loopback
//!                    connections (from `uploads-client`, started by the
//!                    caller: a child would be a target too); each sends a
//!                    chat request head declaring a 1 MB body and 900 KB
//!                    of it, never the rest (a slow or hostile upload);
//!                    the server reads every byte sent and keeps none; all
//!                    stay open until stdin closes. Prints
//!                    `{"conns":N,"bytes":B}` once all were read.
//!   uploads-client PORT N   opens the N connections, one after the
//!                    other, each written whole; holds them until its
//!                    stdin closes.
//!   conns-client PORT N   the child: opens N connections and writes

use std::{
    io::{BufRead, Read, Write},
    net::{TcpListener, TcpStream},
    os::fd::AsRawFd,
    time::{Duration, Instant},
};

use tokentap_tests::http;

fn wait_go() {
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).ok();
}

/// Writes `chunk` to `fd` for `secs`, optionally paced; returns (writes, wall, cpu).
fn write_loop(fd: i32, chunk: &[u8], secs: f64, rate: Option<f64>) -> (u64, f64, f64) {
    let start = Instant::now();
    let cpu0 = tokentap::host::thread_cpu_s();
    let end = start + Duration::from_secs_f64(secs);
    let mut n = 0u64;
    let one = |n: &mut u64| {
        // SAFETY: valid buffer.
        let r = unsafe { libc::write(fd, chunk.as_ptr().cast(), chunk.len()) };
        if r > 0 {
            *n += 1;
        }
    };
    match rate {
        None => {
            while Instant::now() < end {
                for _ in 0..64 {
                    one(&mut n);
                }
            }
        }
        Some(rate) => {
            let per_ms = rate / 1000.0;
            let mut due = 0.0f64;
            let mut tick = start;
            while tick < end {
                due += per_ms;
                while (n as f64) < due {
                    one(&mut n);
                }
                tick += Duration::from_millis(1);
                let now = Instant::now();
                if tick > now {
                    std::thread::sleep(tick - now);
                }
            }
        }
    }
    (
        n,
        start.elapsed().as_secs_f64(),
        tokentap::host::thread_cpu_s() - cpu0,
    )
}

/// One HTTP chunk of `total` bytes carrying one OpenAI-style SSE event
/// with one content token (padded with an `id` field).
fn sse_chunk(total: usize) -> Vec<u8> {
    let frame = |pad: usize| {
        let ev = format!(
            "data: {{\"id\":\"{}\",\"object\":\"chat.completion.chunk\",\"model\":\"bench\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\" tok\"}}}}]}}\n\n",
            "x".repeat(pad)
        );
        format!("{:x}\r\n{ev}\r\n", ev.len()).into_bytes()
    };
    let base = frame(0).len();
    frame(total.saturating_sub(base))
}

/// `uploads`: a chat request's head declaring 1,000,000 body bytes, and
/// the first 900,000 of them (the model first, then one long prompt).
fn upload_wire() -> Vec<u8> {
    const DECLARED: usize = 1_000_000;
    const SENT: usize = 900_000;
    let mut body =
        br#"{"model":"upload","stream":true,"messages":[{"role":"user","content":""#.to_vec();
    body.extend(b"word ".iter().cycle().take(SENT - body.len()));
    let mut wire = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nContent-Length: {DECLARED}\r\n\r\n"
    )
    .into_bytes();
    wire.extend_from_slice(&body);
    wire
}

fn raise_nofile(want: u64) {
    let lim = libc::rlimit {
        rlim_cur: want,
        rlim_max: want,
    };
    // SAFETY: valid struct; failure leaves the old limit (then accept fails loudly).
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
}

fn report(writes: u64, wall: f64, cpu: f64) {
    println!("{{\"writes\":{writes},\"wall_s\":{wall:.6},\"cpu_s\":{cpu:.6}}}");
    std::io::stdout().flush().ok();
}

/// Runs `batch` (which returns the calls it made) until `secs` have
/// passed, then reports calls, wall time and this thread's CPU time.
fn timed_batches(secs: f64, mut batch: impl FnMut() -> u64) {
    let start = Instant::now();
    let cpu0 = tokentap::host::thread_cpu_s();
    let end = start + Duration::from_secs_f64(secs);
    let mut n = 0u64;
    while Instant::now() < end {
        n += batch();
    }
    report(
        n,
        start.elapsed().as_secs_f64(),
        tokentap::host::thread_cpu_s() - cpu0,
    );
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize| args.get(i).map(String::as_str);
    match arg(0) {
        Some("tcp") => {
            let secs: f64 = arg(1).and_then(|s| s.parse().ok()).unwrap_or(3.0);
            let rate: Option<f64> = arg(2).and_then(|s| s.parse().ok());
            let l = TcpListener::bind("127.0.0.1:0").expect("bind");
            let port = l.local_addr().expect("addr").port();
            let reader = std::thread::spawn(move || {
                let mut c = TcpStream::connect(("127.0.0.1", port)).expect("connect");
                let body = r#"{"model":"bench","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
                c.write_all(http::post("/v1/chat/completions", "bench", body).as_bytes())
                    .expect("write request");
                let mut buf = vec![0u8; 1 << 16];
                while let Ok(k) = c.read(&mut buf) {
                    if k == 0 {
                        break;
                    }
                }
            });
            let (mut conn, _) = l.accept().expect("accept");
            http::read_request(&mut conn, &mut Vec::new())
                .expect("read request")
                .expect("client closed before its request");
            conn.write_all(http::SSE_HEAD.as_bytes())
                .expect("write response head");
            println!("ready {}", std::process::id());
            std::io::stdout().flush().ok();
            wait_go();
            let (n, wall, cpu) = write_loop(conn.as_raw_fd(), &sse_chunk(300), secs, rate);
            let _ = conn.write_all(http::LAST_CHUNK.as_bytes());
            drop(conn);
            reader.join().ok();
            report(n, wall, cpu);
        }
        Some("bulk") => {
            let secs: f64 = arg(1).and_then(|s| s.parse().ok()).unwrap_or(3.0);
            let l = TcpListener::bind("127.0.0.1:0").expect("bind");
            let port = l.local_addr().expect("addr").port();
            let reader = std::thread::spawn(move || {
                let mut c = TcpStream::connect(("127.0.0.1", port)).expect("connect");
                let mut buf = vec![0u8; 1 << 16];
                while let Ok(k) = c.read(&mut buf) {
                    if k == 0 {
                        break;
                    }
                }
            });
            let (conn, _) = l.accept().expect("accept");
            println!("ready {}", std::process::id());
            std::io::stdout().flush().ok();
            wait_go();
            let (n, wall, cpu) = write_loop(conn.as_raw_fd(), &vec![b'b'; 1 << 16], secs, None);
            drop(conn);
            reader.join().ok();
            report(n, wall, cpu);
        }
        Some("pipe") => {
            // No reader thread: the writer fills the pipe with 16-byte
            // writes and drains it itself with one large read every 2048
            // writes, so no wake-ups or scheduling enter the measurement.
            let secs: f64 = arg(1).and_then(|s| s.parse().ok()).unwrap_or(3.0);
            let mut p = [0i32; 2];
            // SAFETY: valid array.
            assert_eq!(unsafe { libc::pipe(p.as_mut_ptr()) }, 0);
            println!("ready {}", std::process::id());
            std::io::stdout().flush().ok();
            wait_go();
            let chunk = [b'y'; 16];
            let mut buf = vec![0u8; 2048 * 16];
            timed_batches(secs, || {
                let mut n = 0;
                for _ in 0..2048 {
                    // SAFETY: valid buffers and fds.
                    if unsafe { libc::write(p[1], chunk.as_ptr().cast(), 16) } == 16 {
                        n += 1;
                    }
                }
                // SAFETY: as above.
                unsafe { libc::read(p[0], buf.as_mut_ptr().cast(), buf.len()) };
                n
            });
        }
        Some("sys") => {
            let secs: f64 = arg(1).and_then(|s| s.parse().ok()).unwrap_or(3.0);
            println!("ready {}", std::process::id());
            std::io::stdout().flush().ok();
            wait_go();
            timed_batches(secs, || {
                for _ in 0..2048 {
                    // SAFETY: no arguments, no side effects. Through
                    // syscall(2) so libc cannot answer it from a cache.
                    unsafe { libc::syscall(libc::SYS_getppid) };
                }
                2048
            });
        }
        Some("conns") => {
            let n: usize = arg(1).and_then(|s| s.parse().ok()).unwrap_or(10_000);
            raise_nofile(n as u64 * 2 + 64);
            let l = TcpListener::bind("127.0.0.1:0").expect("bind");
            let port = l.local_addr().expect("addr").port();
            println!("ready {}", std::process::id());
            std::io::stdout().flush().ok();
            wait_go();
            let mut client = std::process::Command::new(std::env::current_exe().expect("exe"))
                .args(["conns-client", &port.to_string(), &n.to_string()])
                .stdin(std::process::Stdio::piped())
                .spawn()
                .expect("spawn conns-client");
            let mut held = Vec::with_capacity(n);
            let mut buf = [0u8; 256];
            for _ in 0..n {
                let (mut c, _) = l.accept().expect("accept");
                let _ = c.read(&mut buf);
                held.push(c);
            }
            println!("{{\"conns\":{}}}", held.len());
            std::io::stdout().flush().ok();
            let mut sink = String::new();
            std::io::stdin().lock().read_to_string(&mut sink).ok();
            drop(client.stdin.take());
            let _ = client.wait();
        }
        Some("uploads") => {
            let n: usize = arg(1).and_then(|s| s.parse().ok()).unwrap_or(1000);
            raise_nofile(n as u64 * 2 + 64);
            let l = TcpListener::bind("127.0.0.1:0").expect("bind");
            let port = l.local_addr().expect("addr").port();
            // The clients are started by whoever reads this (not a child
            // of this process: the agent follows a target's children).
            println!("ready {} {port}", std::process::id());
            std::io::stdout().flush().ok();
            let want = upload_wire().len();
            let mut held = Vec::with_capacity(n);
            let mut buf = vec![0u8; 64 * 1024];
            let mut bytes = 0u64;
            for _ in 0..n {
                let (mut c, _) = l.accept().expect("accept");
                let mut got = 0;
                while got < want {
                    match c.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(k) => got += k,
                    }
                }
                bytes += got as u64;
                held.push(c);
            }
            println!("{{\"conns\":{},\"bytes\":{bytes}}}", held.len());
            std::io::stdout().flush().ok();
            let mut sink = String::new();
            std::io::stdin().lock().read_to_string(&mut sink).ok();
        }
        Some("uploads-client") => {
            let port: u16 = arg(1).and_then(|s| s.parse().ok()).expect("port");
            let n: usize = arg(2).and_then(|s| s.parse().ok()).expect("count");
            raise_nofile(n as u64 + 64);
            let wire = upload_wire();
            let mut held = Vec::with_capacity(n);
            for _ in 0..n {
                let mut c = TcpStream::connect(("127.0.0.1", port)).expect("connect");
                c.write_all(&wire).expect("write");
                held.push(c);
            }
            let mut sink = String::new();
            std::io::stdin().lock().read_to_string(&mut sink).ok();
        }
        Some("conns-client") => {
            let port: u16 = arg(1).and_then(|s| s.parse().ok()).expect("port");
            let n: usize = arg(2).and_then(|s| s.parse().ok()).expect("count");
            raise_nofile(n as u64 + 64);
            let mut held = Vec::with_capacity(n);
            for _ in 0..n {
                let mut c = TcpStream::connect(("127.0.0.1", port)).expect("connect");
                c.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: bench\r\n")
                    .expect("write");
                held.push(c);
            }
            // Until the parent closes our stdin.
            let mut sink = String::new();
            std::io::stdin().lock().read_to_string(&mut sink).ok();
        }
        Some("idle") => {
            println!("ready {}", std::process::id());
            std::io::stdout().flush().ok();
            let mut sink = String::new();
            std::io::stdin().lock().read_to_string(&mut sink).ok();
        }
        _ => {
            eprintln!("usage: benchpeer tcp SECS [RATE] | pipe SECS | sys SECS | bulk SECS | conns N | uploads N | idle");
            std::process::exit(2);
        }
    }
}
