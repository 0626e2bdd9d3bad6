//! One tenant's uploads must not cost everyone else their records, as
//! root: the agent (started first) watches `simengine` in its own network
//! namespace while one client uploads streamed chat requests of 8 MB
//! bodies at 50 MB/s, and 20 streamed chats (4 clients × 5, each on its
//! own connection) run beside it.
//!
//! Twice: with the default ring buffer (16 MiB: this machine's agent may
//! keep up, and nothing is held back), and with a 1 MiB ring, where the
//! upload fills a quarter of it within milliseconds: the kernel then
//! leaves each upload's bytes beyond its first 16 KiB unread
//! (`capture.bodies_left`), reporting only their length.
//!
//! Both times: every chat is in the request log once, with its TTFT
//! (between the engine's schedule and the client's own clock), the
//! engine's token count and `tokens_exact`; every upload is recorded with
//! its model (from the body's head) and an input-token figure near its
//! body's size / 4, marked an estimate (`tokens_exact: false`, as for any
//! stream without `usage`); records the kernel dropped, if any, are named
//! in the failure message and the log line.

use std::{
    io::Write,
    net::TcpStream,
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use serde_json::{json, Value};
use tokentap_tests::{
    assert_root, free_port, http as h1, logged, read_jsonl, scratch_dir, start, Netns, RunAgent,
};

/// The upload's rate and each upload's body size.
const UPLOAD_BYTES_PER_S: f64 = 50e6;
const UPLOAD_BODY: usize = 8_000_000;
/// Bytes per write of the uploader.
const UPLOAD_WRITE: usize = 64 * 1024;
/// Chats: clients × requests each, and the engine's schedule.
const CHAT_CLIENTS: usize = 4;
const CHATS_EACH: usize = 5;
const TTFT_MS: u64 = 15;
const GAP_MS: u64 = 2;
/// Slack for the agent's TTFT against the client's, seconds.
const SLACK_S: f64 = 0.005;
/// The first bytes of a content delta in simengine's stream chunks.
const CONTENT: &[u8] = b"\"content\":\"tok";

/// The two runs share the engines' ports' namespace names: one at a time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
#[ignore = "needs root: eBPF, network namespaces (cargo xtask test runs it as root)"]
fn an_upload_at_50_mb_s_leaves_20_streamed_chats_recorded_whole() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let run = burst_run("bst", 81, None);
    eprintln!("burst: default ring: {}", run.line);
}

#[test]
#[ignore = "needs root: eBPF, network namespaces (cargo xtask test runs it as root)"]
fn a_small_ring_under_the_upload_holds_its_body_in_the_kernel_and_loses_no_chat() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let run = burst_run("bsr", 82, Some(1 << 20));
    eprintln!("burst: 1 MiB ring: {}", run.line);
    assert!(
        run.bodies_left > 0,
        "a 1 MiB ring under a 50 MB/s upload, and no body was left in the kernel: {}",
        run.line
    );
}

struct Run {
    bodies_left: u64,
    line: String,
}

/// One streamed chat as its client saw it.
struct Chat {
    model: String,
    tokens: u64,
    client_ttft_s: f64,
}

fn chats(addr: &str, port: u16, client: usize) -> Vec<Chat> {
    (0..CHATS_EACH)
        .map(|i| {
            let n = client * CHATS_EACH + i;
            let mut s = TcpStream::connect((addr, port)).expect("connect to simengine");
            s.set_nodelay(true).expect("nodelay");
            s.set_read_timeout(Some(Duration::from_secs(20)))
                .expect("read timeout");
            let model = format!("chat-{n}");
            let tokens = 4 + (n % 5) as u64;
            let body = json!({"model": model, "stream": true,
                "stream_options": {"include_usage": true},
                "messages": [{"role": "user", "content": "hello beside an upload"}],
                "sim": {"id": 1000 + n, "ttft_ms": TTFT_MS, "gap_ms": GAP_MS, "tokens": tokens}})
            .to_string();
            let sent = Instant::now();
            s.write_all(h1::post("/v1/chat/completions", "engine", &body).as_bytes())
                .expect("send a chat");
            let mut first: Option<Instant> = None;
            let r = h1::read_response_until(&mut s, |b| {
                if first.is_none() && b.windows(CONTENT.len()).any(|w| w == CONTENT) {
                    first = Some(Instant::now());
                }
                false
            })
            .expect("read a chat's response");
            assert!(
                r.complete && r.status() == Some(200),
                "{model}: {:?}",
                r.status()
            );
            let first = first.unwrap_or_else(|| panic!("{model}: no content chunk"));
            std::thread::sleep(Duration::from_millis(40));
            Chat {
                model,
                tokens,
                client_ttft_s: (first - sent).as_secs_f64(),
            }
        })
        .collect()
}

/// One upload's wire: head and body (`"model"` first, then the prompt).
fn upload_request(n: usize) -> (Vec<u8>, usize) {
    let open = format!(
        "{{\"model\":\"upload\",\"stream\":true,\"sim\":{{\"id\":{n},\"ttft_ms\":1,\"gap_ms\":1,\"tokens\":2}},\"messages\":[{{\"role\":\"user\",\"content\":\""
    );
    let close = "\"}]}";
    let text = UPLOAD_BODY - open.len() - close.len();
    let mut body = open.into_bytes();
    body.extend(b"word ".iter().cycle().take(text));
    body.extend_from_slice(close.as_bytes());
    assert_eq!(body.len(), UPLOAD_BODY);
    let mut wire = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: engine\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    wire.extend_from_slice(&body);
    (wire, text)
}

/// Uploads at `UPLOAD_BYTES_PER_S` until `stop`, one request after the
/// other on one connection; returns how many were answered and the
/// bytes sent.
fn upload(addr: &str, port: u16, stop: &AtomicBool) -> (usize, u64) {
    let mut s = TcpStream::connect((addr, port)).expect("connect to simengine");
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("read timeout");
    let start = Instant::now();
    let mut sent = 0u64;
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) {
        let (wire, _) = upload_request(n);
        for piece in wire.chunks(UPLOAD_WRITE) {
            s.write_all(piece).expect("upload");
            sent += piece.len() as u64;
            let due = Duration::from_secs_f64(sent as f64 / UPLOAD_BYTES_PER_S);
            if let Some(wait) = due.checked_sub(start.elapsed()) {
                std::thread::sleep(wait);
            }
        }
        let r = h1::read_response_until(&mut s, |_| false).expect("the upload's answer");
        assert!(
            r.complete && r.status() == Some(200),
            "upload {n}: {:?}",
            r.status()
        );
        n += 1;
    }
    (n, sent)
}

fn burst_run(ns_name: &str, octet: u8, ring: Option<u32>) -> Run {
    assert_root("burst");
    let dir = scratch_dir(&format!("burst-{ns_name}"));
    let log = dir.join("requests.jsonl");
    let port = free_port();
    let ns = Netns::create(ns_name, octet);

    // The agent first.
    let mut run = RunAgent::new().no_gpu().port(port).requests_log(&log);
    if let Some(r) = ring {
        run = run.arg("--ring-buffer-bytes").arg(r.to_string());
    }
    let (mut agent, agent_out) = start(&mut run.command(), "ready", "tokentap run");
    let agent_pid = agent.0.id();
    let (_engine, _engine_out) = start(
        ns.command(env!("CARGO_BIN_EXE_simengine")).args([
            "--addr",
            &ns.ns_addr,
            "--port",
            &port.to_string(),
            "--nodelay",
        ]),
        "listening",
        "simengine",
    );
    let addr = ns.ns_addr.as_str();

    // Until the agent has the engine: a recorded request.
    let deadline = Instant::now() + Duration::from_secs(60);
    for warm in 0.. {
        if logged(&log).iter().any(|r| {
            r["request_model"]
                .as_str()
                .is_some_and(|m| m.starts_with("warm-"))
        }) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no warm-up request recorded in 60 s"
        );
        let mut s = TcpStream::connect((addr, port)).expect("connect to simengine");
        let body = json!({"model": format!("warm-{warm}"), "stream": true,
            "sim": {"ttft_ms": 1, "gap_ms": 1, "tokens": 2}});
        let r = h1::round_trip(&mut s, "/v1/chat/completions", &body.to_string())
            .expect("warm-up request");
        assert!(r.complete, "warm-up response incomplete");
        std::thread::sleep(Duration::from_millis(300));
    }

    // The upload, and the chats beside it once it runs.
    let stop = AtomicBool::new(false);
    let t = Instant::now();
    let ((uploads, up_bytes), chats): ((usize, u64), Vec<Chat>) = std::thread::scope(|s| {
        let up = s.spawn(|| upload(addr, port, &stop));
        std::thread::sleep(Duration::from_millis(300));
        let clients: Vec<_> = (0..CHAT_CLIENTS)
            .map(|c| s.spawn(move || chats(addr, port, c)))
            .collect();
        let chats: Vec<Chat> = clients
            .into_iter()
            .flat_map(|c| c.join().expect("chat client"))
            .collect();
        stop.store(true, Ordering::Relaxed);
        (up.join().expect("uploader"), chats)
    });
    let secs = t.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        agent.0.try_wait().expect("try_wait").is_none(),
        "the agent died under the upload"
    );
    // SAFETY: a plain signal to our own child.
    unsafe { libc::kill(agent_pid as i32, libc::SIGINT) };
    let status = agent.0.wait().expect("wait for the agent");
    let lines: Vec<String> = agent_out.iter().collect();
    assert!(status.success(), "tokentap run failed: {lines:#?}");
    let tokentap_tests::Shutdown {
        line: summary,
        capture,
        ..
    } = tokentap_tests::shutdown(&lines);
    let dropped = capture["records_dropped"].as_u64().unwrap_or(0);
    let bodies_left = capture["bodies_left"].as_u64().unwrap_or(0);

    let records = read_jsonl(&log);
    let mut failures = Vec::new();
    for c in &chats {
        let mine: Vec<&Value> = records
            .iter()
            .filter(|r| r["request_model"] == c.model.as_str())
            .collect();
        let [r] = mine.as_slice() else {
            failures.push(format!("{}: {} records", c.model, mine.len()));
            continue;
        };
        let ttft = r["ttft_s"].as_f64();
        let fine = r["error_type"].is_null()
            && r["output_tokens"] == c.tokens
            && r["tokens_exact"] == true
            && ttft.is_some_and(|t| {
                t >= TTFT_MS as f64 / 1e3 * 0.95 && t <= c.client_ttft_s + SLACK_S
            });
        if !fine {
            failures.push(format!(
                "{}: want {} tokens, TTFT in [{TTFT_MS} ms, client {:.4} s + {SLACK_S}]: {r}",
                c.model, c.tokens, c.client_ttft_s
            ));
        }
    }
    let (_, text) = upload_request(0);
    let ups: Vec<&Value> = records
        .iter()
        .filter(|r| r["request_model"] == "upload")
        .collect();
    if ups.len() != uploads {
        failures.push(format!(
            "{uploads} uploads answered, {} recorded",
            ups.len()
        ));
    }
    let want_in = text as f64 / 4.0;
    for r in &ups {
        let tokens_in = r["input_tokens"].as_f64().unwrap_or(0.0);
        if r["status"] != 200
            || r["tokens_exact"] != false
            || (tokens_in - want_in).abs() > want_in * 0.05
        {
            failures.push(format!(
                "an upload: want status 200, ~{want_in:.0} input tokens (estimated): {r}"
            ));
        }
    }
    let line = format!(
        "{} chats ok of {}, {uploads} uploads ({:.0} MB at {:.1} MB/s), records dropped {dropped}, bodies left in the kernel {bodies_left}",
        chats.len() - failures.iter().filter(|f| f.starts_with("chat-")).count(),
        chats.len(),
        up_bytes as f64 / 1e6,
        up_bytes as f64 / 1e6 / secs,
    );
    assert!(
        failures.is_empty(),
        "{line}:\n{}\n{summary}",
        failures.join("\n")
    );
    Run { bodies_left, line }
}
