//! A simulated OpenAI-compatible inference engine with a known schedule,
//! for tests and the demo. Each request says how it wants to be answered,
//! in an extra `sim` object of the JSON body:
//!
//!   {"model":"sim-a","stream":true,"stream_options":{"include_usage":true},
//!    "messages":[…],"sim":{"id":7,"ttft_ms":20,"gap_ms":3,"tokens":12,
//!    "status":200,"write":"writev"}}
//!
//! `GET /metrics` answers a Prometheus exposition in llama.cpp server's
//! names (`llamacpp:requests_processing` = requests being answered now);
//! `GET /health` (`/healthz`, `/ready`, `/ping`) and `GET /v1/models`
//! answer as engines do; `GET /version` answers vLLM's `{"version": …}`
//! with `SIMENGINE_VERSION` from the environment when it is set; any other
//! `GET` is a 404.
//! `"tool_call": true` streams tool-call deltas instead of content.
//! `prompt_tokens` is what the usage report says the prompt had (default
//! 5); `queue_ms_per_inflight` adds that many ms to the time to first token
//! per request already being answered (an engine that queues under load).
//! `status` other than 200 answers with that error; `write` picks the
//! syscall for stream chunks (`write`, `writev`, `send`), like engines that
//! differ in their I/O paths. The engine appends one JSON line per request
//! to the truth file (`--truth PATH`) with wall-clock times read right after
//! its own calls: each instant is a bracket `[lo, hi]` — the clock read just
//! before the syscall and just after it returned — because the kernel's
//! timestamp (syscall exit) lies in between even when the engine is
//! preempted. `rx`: the kernel's receive timestamp (`SO_TIMESTAMPNS`) of a
//! request's first byte, when it reached the socket (null for a pipelined
//! request, already buffered). `read` (first read of the request, entered only once poll says
//! data is there), `first`/`last` (first/last content write), `end` (last
//! write); plus the token count and the outcome (`client_disconnect` when a
//! write failed).
//!
//! `--read-delay-ms A,B,C` leaves each request that starts on an empty
//! buffer unread for the next delay of the list (in turn, across
//! connections) after poll says it is there; `--accept-delay-ms N` leaves
//! each new connection unaccepted for N ms: an engine too busy to read.
//! `--nodelay` sets TCP_NODELAY on connections (as real engines do).
//!
//! Usage: simengine [--port N] [--addr IP] [--truth PATH] [--gpu-worker];
//! listens on IP:N (default 127.0.0.1, any free port) and prints `listening
//! PORT`. `--gpu-worker` first starts a child process standing for the
//! engine's GPU worker (vLLM-style: the HTTP server is not the process on
//! the GPU), prints `worker PID`, and kills it on exit.
//! Other arguments are ignored (tests put names on the command line for
//! discovery to find).

use std::{
    io::Write,
    net::{TcpListener, TcpStream},
    os::fd::AsRawFd,
    sync::{Arc, Mutex},
    time::Duration,
};

use serde_json::{json, Value};
use tokentap_tests::{
    http::{self, chunk},
    now_ns, BracketedFd,
};

/// Like `sys_write`, returning the [before, after] clock bracket of the
/// call that wrote the last byte.
fn timed_write(fd: i32, data: &[u8], how: &str) -> Option<[u64; 2]> {
    let lo = now_ns();
    let ok = sys_write(fd, data, how);
    let hi = now_ns();
    ok.then_some([lo, hi])
}

fn sys_write(fd: i32, data: &[u8], how: &str) -> bool {
    let mut off = 0;
    while off < data.len() {
        let rest = &data[off..];
        // SAFETY: valid buffers for the calls below.
        let r = unsafe {
            match how {
                "writev" => {
                    let (a, b) = rest.split_at(rest.len() / 2);
                    let iov = [
                        libc::iovec {
                            iov_base: a.as_ptr() as *mut _,
                            iov_len: a.len(),
                        },
                        libc::iovec {
                            iov_base: b.as_ptr() as *mut _,
                            iov_len: b.len(),
                        },
                    ];
                    libc::writev(fd, iov.as_ptr(), 2)
                }
                "send" => libc::send(fd, rest.as_ptr().cast(), rest.len(), libc::MSG_NOSIGNAL),
                _ => libc::write(fd, rest.as_ptr().cast(), rest.len()),
            }
        };
        if r <= 0 {
            return false;
        }
        off += r as usize;
    }
    true
}

/// Reads one request (head + Content-Length body); None at EOF. The
/// bracket is that of the first read of the request when it started on an
/// empty buffer ([0, 0] when it was already buffered: pipelined).
fn read_request(
    conn: &mut BracketedFd,
    pending: &mut Vec<u8>,
) -> Option<([u64; 2], String, Value)> {
    let fresh = pending.is_empty();
    conn.first = None;
    let req = http::read_request(conn, pending).ok()??;
    let t_read = match (fresh, conn.first) {
        (true, Some(b)) => b,
        _ => [0, 0],
    };
    let start = req.head.text.lines().next().unwrap_or("").to_string();
    Some((
        t_read,
        start,
        serde_json::from_slice(&req.body).unwrap_or(Value::Null),
    ))
}

/// `--read-delay-ms A,B,C`: the delays, used in turn by each request that
/// starts on an empty buffer, across connections.
static READ_DELAYS: std::sync::OnceLock<Vec<u64>> = std::sync::OnceLock::new();
static READS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

fn next_read_delay() -> Duration {
    match READ_DELAYS.get() {
        Some(d) if !d.is_empty() => {
            let i = READS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Duration::from_millis(d[i % d.len()])
        }
        _ => Duration::ZERO,
    }
}

/// Requests being answered now (what `GET /metrics` reports, in llama.cpp
/// server's metric names).
static IN_FLIGHT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn metrics_text() -> String {
    let running = IN_FLIGHT.load(std::sync::atomic::Ordering::SeqCst);
    format!(
        "# HELP llamacpp:requests_processing Number of requests processing.\n\
         # TYPE llamacpp:requests_processing gauge\n\
         llamacpp:requests_processing {running}\n\
         # HELP llamacpp:requests_deferred Number of requests deferred.\n\
         # TYPE llamacpp:requests_deferred gauge\n\
         llamacpp:requests_deferred 0\n"
    )
}

fn serve(stream: TcpStream, truth: Arc<Mutex<Option<std::fs::File>>>) {
    let fd = stream.as_raw_fd();
    let peer = stream
        .peer_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let mut pending = Vec::new();
    let mut conn = BracketedFd {
        fd,
        first: None,
        first_rx: None,
        delay: std::time::Duration::ZERO,
    };
    while let Some((t_read, start, body)) = {
        // A request that starts on an empty buffer waits the next scripted
        // delay in the socket before the engine reads it.
        conn.delay = if pending.is_empty() {
            next_read_delay()
        } else {
            Duration::ZERO
        };
        read_request(&mut conn, &mut pending)
    } {
        // What an engine's port answers besides inference: probes, the
        // model list, anything else is not found.
        if start.starts_with("get ") || start.starts_with("head ") {
            let path = start.split(' ').nth(1).unwrap_or("");
            let r = match path.split('?').next().unwrap_or("") {
                "/metrics" => http::response(200, "text/plain; version=0.0.4", &metrics_text()),
                "/health" | "/healthz" | "/ready" | "/ping" => {
                    http::response(200, "application/json", "{\"status\":\"ok\"}")
                }
                "/v1/models" => http::response(
                    200,
                    "application/json",
                    &json!({"object": "list", "data": [{"id": "sim", "object": "model", "owned_by": "simengine"}]}).to_string(),
                ),
                // vLLM's `/version`, when the environment names a build
                // (`SIMENGINE_VERSION`): how the agent learns the engine's.
                "/version" => match std::env::var("SIMENGINE_VERSION") {
                    Ok(v) => http::response(200, "application/json", &json!({"version": v}).to_string()),
                    Err(_) => http::response(404, "application/json", "{\"error\":\"not found\"}"),
                },
                _ => http::response(404, "application/json", "{\"error\":\"not found\"}"),
            };
            if !sys_write(fd, r.as_bytes(), "write") {
                break;
            }
            continue;
        }
        let busy = IN_FLIGHT.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let sim = &body["sim"];
        let get = |k: &str, d: u64| sim[k].as_u64().unwrap_or(d);
        let id = get("id", 0);
        let status = get("status", 200);
        // A busy engine queues: each request already being answered adds
        // `queue_ms_per_inflight` to this one's time to first token.
        let ttft =
            Duration::from_millis(get("ttft_ms", 10) + busy * get("queue_ms_per_inflight", 0));
        let prompt_tokens = get("prompt_tokens", 5);
        let gap = Duration::from_millis(get("gap_ms", 2));
        let tokens = get("tokens", 8) as usize;
        let how = sim["write"].as_str().unwrap_or("write").to_string();
        let model = body["model"].as_str().unwrap_or("sim").to_string();
        let stream_req = body["stream"].as_bool().unwrap_or(false);
        let usage = body["stream_options"]["include_usage"]
            .as_bool()
            .unwrap_or(false);
        let mut t = json!({"id": id, "client": peer, "read": t_read, "rx": conn.first_rx.filter(|_| t_read != [0, 0]), "status": status, "tokens": tokens, "stream": stream_req, "usage": usage, "read_delay_ms": conn.delay.as_millis() as u64});
        let mut ok = true;
        let mut end: Option<[u64; 2]> = None;
        if status != 200 {
            let b = json!({"error": {"message": "simulated", "code": status}}).to_string();
            end = timed_write(
                fd,
                http::response(status as u16, "application/json", &b).as_bytes(),
                "write",
            );
            ok = end.is_some();
        } else if !stream_req {
            std::thread::sleep(ttft + gap * tokens as u32);
            let b = json!({"model": model, "choices": [{"index": 0, "message": {"role": "assistant", "content": "tok ".repeat(tokens)}, "finish_reason": "length"}], "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": tokens}}).to_string();
            end = timed_write(
                fd,
                http::response(200, "application/json", &b).as_bytes(),
                "write",
            );
            ok = end.is_some();
        } else {
            let role = json!({"model": model, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]});
            let head = format!("{}{}", http::SSE_HEAD, chunk(&format!("data: {role}\n\n")));
            ok &= sys_write(fd, head.as_bytes(), "write");
            let mut first: Option<[u64; 2]> = None;
            let mut last: Option<[u64; 2]> = None;
            for i in 0..tokens {
                if !ok {
                    break;
                }
                std::thread::sleep(if i == 0 { ttft } else { gap });
                let delta = if sim["tool_call"].as_bool().unwrap_or(false) {
                    json!({"tool_calls": [{"index": 0, "function": {"arguments": format!("a{i}")}}]})
                } else {
                    json!({"content": format!("tok{i} ")})
                };
                let c = json!({"model": model, "choices": [{"index": 0, "delta": delta}]});
                match timed_write(fd, chunk(&format!("data: {c}\n\n")).as_bytes(), &how) {
                    Some(b) => {
                        first.get_or_insert(b);
                        last = Some(b);
                    }
                    None => ok = false,
                }
            }
            if ok {
                let mut tail = String::new();
                tail += &chunk(&format!(
                    "data: {}\n\n",
                    json!({"model": model, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
                ));
                if usage {
                    tail += &chunk(&format!(
                        "data: {}\n\n",
                        json!({"model": model, "choices": [], "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": tokens}})
                    ));
                }
                tail += &chunk("data: [DONE]\n\n");
                tail += http::LAST_CHUNK;
                end = timed_write(fd, tail.as_bytes(), "write");
                ok = end.is_some();
            }
            t["first"] = json!(first);
            t["last"] = json!(last);
        }
        IN_FLIGHT.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        t["end"] = json!(end);
        t["outcome"] = json!(if ok { "ok" } else { "client_disconnect" });
        if let Some(f) = truth.lock().unwrap().as_mut() {
            let _ = writeln!(f, "{t}");
            let _ = f.flush();
        }
        if !ok {
            break;
        }
    }
}

const USAGE: &str = "\
simengine: a simulated OpenAI-compatible inference engine with a known schedule.

Usage: simengine [--port N] [--addr IP] [--truth PATH] [--gpu-worker]
                 [--read-delay-ms A,B,C] [--accept-delay-ms N] [--nodelay] [NAME...]

Listens on IP:N (default 127.0.0.1, any free port) and prints `listening PORT`.
Each request's JSON body says how to answer it in a `sim` object, e.g.
  {\"model\":\"sim-a\",\"stream\":true,\"sim\":{\"ttft_ms\":20,\"gap_ms\":3,\"tokens\":12}}
(keys: id, ttft_ms, gap_ms, tokens, status, write, tool_call, prompt_tokens,
queue_ms_per_inflight). GET /metrics answers in llama.cpp server's names;
GET /health, /healthz, /ready, /ping and /v1/models answer; other GETs 404.
  --truth PATH          append one JSON line per request: the engine's own clock
  --gpu-worker          start a child process standing for a GPU worker
  --read-delay-ms LIST  leave requests unread for these delays, in turn
  --accept-delay-ms N   leave each new connection unaccepted for N ms
  --nodelay             TCP_NODELAY on connections
Other arguments are ignored (tests put engine names there for discovery).";

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{USAGE}");
        return;
    }
    let opt = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let port: u16 = opt("--port").and_then(|p| p.parse().ok()).unwrap_or(0);
    let truth = opt("--truth").map(|p| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
            .expect("truth file")
    });
    let truth = Arc::new(Mutex::new(truth));
    if args.iter().any(|a| a == "--gpu-worker") {
        // The child dies with us (PR_SET_PDEATHSIG in the child).
        let child = unsafe { libc::fork() };
        if child == 0 {
            // SAFETY: in the child: ask for SIGKILL when the parent dies,
            // then sleep until killed.
            unsafe {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                loop {
                    libc::pause();
                }
            }
        }
        println!("worker {child}");
    }
    if let Some(d) = opt("--read-delay-ms") {
        let v: Vec<u64> = d
            .split(',')
            .map(|x| x.trim().parse().expect("--read-delay-ms A,B,C (ms)"))
            .collect();
        READ_DELAYS.set(v).ok();
    }
    // `--accept-delay-ms N`: each connection waits N ms before it is
    // accepted (its request, sent at once, waits in the socket).
    let accept_delay = Duration::from_millis(
        opt("--accept-delay-ms")
            .map(|v| v.parse().expect("--accept-delay-ms N"))
            .unwrap_or(0),
    );
    // `--nodelay`: TCP_NODELAY on every connection, as uvicorn and most
    // engines' servers set it (without it a small write can wait for the
    // client's delayed ACK: on the wire later than the write).
    let nodelay = args.iter().any(|a| a == "--nodelay");
    let addr = opt("--addr").unwrap_or_else(|| "127.0.0.1".to_string());
    let l = TcpListener::bind((addr.as_str(), port))
        .unwrap_or_else(|e| panic!("simengine: cannot listen on {addr}:{port}: {e}"));
    // Receive timestamps: the truth file's `rx` (when a request's first
    // byte reached the socket, by the kernel's clock).
    tokentap_tests::enable_rx_timestamps(l.as_raw_fd());
    println!("listening {}", l.local_addr().expect("addr").port());
    std::io::stdout().flush().ok();
    loop {
        if !accept_delay.is_zero() {
            // Wait until a connection is queued, then leave it there.
            let mut pfd = libc::pollfd {
                fd: l.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            unsafe { libc::poll(&mut pfd, 1, -1) };
            std::thread::sleep(accept_delay);
        }
        let Ok((s, _)) = l.accept() else { continue };
        if nodelay {
            let _ = s.set_nodelay(true);
        }
        let t = truth.clone();
        std::thread::spawn(move || serve(s, t));
    }
}
