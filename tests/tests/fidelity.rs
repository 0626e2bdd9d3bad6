//! Fidelity against real engines and a real client, as root: tokentap
//! attached to llama.cpp (llama-cpp-python's server, then the native
//! llama-server) while the official `openai` SDK streams chat and
//! completion requests — with and without `stream_options.include_usage`,
//! non-streamed, and some cancelled mid-stream by the client — and exports
//! to a real OpenTelemetry collector (Rotel).
//!
//! Asserted: every client request is in the request log exactly once; the
//! p99 of |tokentap TTFT − client TTFT| is ≤ 1 ms on loopback, with t0 the
//! request's arrival at the engine's socket; token counts
//! equal the server's usage where the client received usage; cancelled
//! requests carry `error_type: client_disconnect`; Rotel received
//! tokentap's metrics. Per-request differences are printed.
//!
//! The client times at its socket (the kernel's transmit timestamp of its
//! request, and its receive timestamps, each read ending at a line end so that an event is never
//! stamped with a later one's arrival; `tests/peers/client.py`, whose
//! `--self-test` each run checks that rule with first). Requests go one at a time, 50 ms
//! apart, after two warm-up requests. Engine, client and agent run at the
//! default priority, unpinned: with t0 taken when the request reaches the
//! engine's socket (`tcp:tcp_probe`), the time a busy two-core machine
//! leaves the request unread is inside tokentap's TTFT, as it is inside
//! the client's (the printed split shows client send → t0 and t1 → the
//! client's receive). Before arrival timestamps this test needed the engine
//! and client at nice −10 and the agent at 19. See docs/comparison.md.
//!
//! The peers come from PyPI through `tests/peers/install.sh` (`cargo xtask
//! peers`, run by `cargo xtask test`).

use std::{
    sync::Mutex,
    time::{Duration, Instant},
};

use serde_json::Value;
use tokentap_tests::{
    assert_root, interrupt,
    peers::{free_port, Comparison, Engine, Peers},
    read_jsonl, scratch_dir, steal_ms, RunAgent,
};

/// Requests per engine; every 12th is cancelled by the client. Enough
/// that about 100 streams complete, so the p99 is not just the maximum.
const N: usize = 168;
/// Streamed requests the client sends first (its own warm-up: lazy
/// imports, connection set-up), logged by tokentap but not compared.
const WARMUP: usize = 2;
/// Loopback bound on the p99 of |TTFT difference| (issue 14; 2 ms with
/// t0 at the read, issue 5).
const TTFT_P99_MAX_MS: f64 = 1.0;
/// The bound on |tokentap's TPOT − the client's| at p99, ms.
const TPOT_P99_MAX_MS: f64 = 0.5;

/// The engines run one at a time: two on two cores would measure each
/// other.
static SERIAL: Mutex<()> = Mutex::new(());

#[test]
#[ignore = "needs root and the real peers (cargo xtask test installs them and runs it as root)"]
fn fidelity_llama_cpp_python() {
    fidelity(Engine::Python);
}

#[test]
#[ignore = "needs root and the real peers (cargo xtask test installs them and runs it as root)"]
fn fidelity_llama_server() {
    fidelity(Engine::Native);
}

fn fidelity(kind: Engine) {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let test = format!("fidelity_{}", kind.name());
    assert_root(&test);
    let peers = Peers::installed(&test);
    peers.client_self_test();
    let dir = scratch_dir(&test);
    let log = dir.join("requests.jsonl");

    let (grpc, http) = (free_port(), free_port());
    let (mut rotel, rotel_out) = peers.start_rotel(grpc, http);
    wait_listening(grpc, "rotel");

    let port = free_port();
    let (engine, _engine_out) = peers.start_engine(kind, port, 1);
    let (mut agent, agent_out) = RunAgent::new()
        .pid(engine.0.id())
        .otlp(grpc)
        .requests_log(&log)
        .start();

    let t = Instant::now();
    let steal_before = steal_ms();
    let client = peers.client(
        &format!("http://127.0.0.1:{port}/v1"),
        &[
            "--n",
            &N.to_string(),
            "--max-tokens",
            "32",
            "--cancel-every",
            "12",
            "--warmup",
            &WARMUP.to_string(),
            "--think-ms",
            "50",
        ],
        &dir.join("client.jsonl"),
    );
    let client_s = t.elapsed().as_secs_f64();
    let steal = steal_ms() - steal_before;
    // Let the last cancelled stream's failed write arrive, and one export.
    std::thread::sleep(Duration::from_millis(1500));
    let (ok, agent_lines) = interrupt(&mut agent, agent_out);
    assert!(ok, "tokentap run failed: {agent_lines:?}");
    drop(engine);

    let records = read_jsonl(&log);
    assert_eq!(client.len(), N, "the client ran every request");
    let cmp = Comparison::new(&client, &records);

    println!(
        "{:>3} {:<10} {:>6} {:>5} {:>6} | {:>9} {:>9} {:>8} | {:>8} {:>8} {:>8} | tokens c/t",
        "i",
        "endpoint",
        "stream",
        "usage",
        "cancel",
        "ttft_c_ms",
        "ttft_t_ms",
        "diff",
        "tpot_c",
        "tpot_t",
        "diff"
    );
    // Where a difference comes from (both CLOCK_REALTIME): the request
    // waiting before the engine read it (client send → t0), and the first
    // event travelling to the client (t1 → client receive).
    let split = |q: &Value, r: &Value| -> String {
        match (
            q["send_ns"].as_i64(),
            q["first_rx_ns"].as_i64(),
            r["t0_ns"].as_i64(),
            r["ttft_s"].as_f64(),
        ) {
            (Some(send), Some(rx), Some(t0), Some(ttft)) => {
                let t1 = t0 + (ttft * 1e9) as i64;
                let behind = if q["first_rx_own"] == false {
                    " (client behind: rx is a later segment's; not compared)"
                } else {
                    ""
                };
                format!(
                    "send→t0 {:.3} t1→rx {:.3}{behind}",
                    (t0 - send) as f64 / 1e6,
                    (rx - t1) as f64 / 1e6
                )
            }
            _ => String::new(),
        }
    };
    let ms = |v: &Value| {
        v.as_f64()
            .map(|x| format!("{:.3}", x * 1e3))
            .unwrap_or("-".into())
    };
    // The rows furthest from the client, repeated in a failure's message
    // (a CI log keeps the head and tail of a long table, not its middle).
    let mut worst: Vec<(f64, String)> = vec![];
    for p in &cmp.pairs {
        let (q, r) = (p.client, p.record);
        let diff = |k: &str| match (r[k].as_f64(), q[k].as_f64()) {
            (Some(a), Some(b)) => format!("{:+.3}", (a - b) * 1e3),
            _ => "-".into(),
        };
        let row = format!(
            "{:>3} {:<10} {:>6} {:>5} {:>6} | {:>9} {:>9} {:>8} | {:>8} {:>8} {:>8} | {}/{} {} {}",
            q["i"],
            q["endpoint"].as_str().unwrap(),
            q["stream"],
            q["include_usage"],
            q["cancelled"],
            ms(&q["ttft_s"]),
            ms(&r["ttft_s"]),
            diff("ttft_s"),
            ms(&q["tpot_s"]),
            ms(&r["tpot_s"]),
            diff("tpot_s"),
            q["completion_tokens"],
            r["output_tokens"],
            r["error_type"],
            split(q, r)
        );
        println!("{row}");
        if let (Some(a), Some(b)) = (r["ttft_s"].as_f64(), q["ttft_s"].as_f64()) {
            worst.push(((a - b).abs(), row));
        }
    }
    worst.sort_by(|a, b| b.0.total_cmp(&a.0));
    let worst: String = worst
        .iter()
        .take(5)
        .map(|(_, row)| format!("\n{row}"))
        .collect();
    let (t50, t99) = Comparison::abs_ms(&cmp.ttft_diff);
    let (p50, p99) = Comparison::abs_ms(&cmp.tpot_diff);
    let (s50, s99) = Comparison::abs_ms(&cmp.ttft_sdk_diff);
    let (b50, b99) = Comparison::abs_ms(&cmp.before_read);
    let (c50, c99) = Comparison::abs_ms(&cmp.to_client);
    println!(
        "{}: the TTFT difference split: request unread in the engine's socket (client send → t0) \
         p50 {b50:.3} ms p99 {b99:.3} ms; first event t1 → client receive p50 {c50:.3} ms p99 {c99:.3} ms",
        kind.name()
    );
    println!(
        "{}: {N} requests in {client_s:.1}s; |TTFT diff| p50 {t50:.3} ms p99 {t99:.3} ms (n={}, \
         {} more with the client behind); \
         |TPOT diff| p50 {p50:.3} ms p99 {p99:.3} ms (n={}); vs TTFT after the SDK's parsing: \
         p50 {s50:.3} ms p99 {s99:.3} ms",
        kind.name(),
        cmp.ttft_diff.len(),
        cmp.client_behind.len(),
        cmp.tpot_diff.len()
    );
    let clock_sends = client
        .iter()
        .filter(|q| q["stream"] == true && q["send_stamp"] != "kernel")
        .count();
    let conditions = format!(
        "the VM's vCPUs lost {steal} ms to the hypervisor (steal) during the client's run; \
         {clock_sends} streams' sends timed by the client's clock, not the kernel's transmit stamp"
    );
    println!("{}: {conditions}", kind.name());

    assert!(
        cmp.missing.is_empty(),
        "requests missing from the log: {:?}",
        cmp.missing
    );
    assert!(
        cmp.duplicated.is_empty(),
        "requests logged twice: {:?}",
        cmp.duplicated
    );
    assert_eq!(
        records.len(),
        N + WARMUP,
        "no record beyond the client's requests (and its warm-up)"
    );
    for r in &records {
        assert_eq!(r["t0_source"], "arrival", "t0 is the arrival: {r}");
    }
    for p in &cmp.pairs {
        let (q, r) = (p.client, p.record);
        let what = format!("client {q}\nrecord {r}");
        let stream = q["stream"].as_bool().unwrap();
        assert_eq!(r["stream"].as_bool(), Some(stream), "{what}");
        let path = r["path"].as_str().unwrap();
        match q["endpoint"].as_str().unwrap() {
            "chat" => assert_eq!(path, "/v1/chat/completions", "{what}"),
            _ => assert_eq!(path, "/v1/completions", "{what}"),
        }
        if q["cancelled"].as_bool().unwrap() {
            assert_eq!(r["error_type"], "client_disconnect", "{what}");
            continue;
        }
        assert_eq!(r["status"], 200, "{what}");
        assert!(r["error_type"].is_null(), "{what}");
        if let Some(n) = q["completion_tokens"].as_u64() {
            assert_eq!(r["output_tokens"].as_u64(), Some(n), "{what}");
            assert_eq!(r["input_tokens"], q["prompt_tokens"], "{what}");
            assert_eq!(r["tokens_exact"], true, "{what}");
        } else if stream {
            assert_eq!(r["chunks"], q["content_chunks"], "content events: {what}");
        }
        if stream {
            assert!(r["ttft_s"].as_f64().is_some(), "{what}");
        } else {
            // Both ends on one host, the client timed at its socket:
            // within ±0.06 ms in the runs we looked at; 2 ms either way
            // fails a record timed from the wrong call.
            let d = r["duration_s"].as_f64().unwrap() - q["duration_s"].as_f64().unwrap();
            assert!(
                d.abs() <= 0.002,
                "tokentap's duration is {:+.3} ms from the client's (more than 2 ms): {what}",
                d * 1e3
            );
        }
    }
    let completed = cmp
        .pairs
        .iter()
        .filter(|p| p.client["stream"] == true && p.client["cancelled"] == false)
        .count();
    assert_eq!(
        cmp.ttft_diff.len() + cmp.client_behind.len(),
        completed,
        "a TTFT for every completed stream"
    );
    // Where the client fell behind, its kernel stamped the first event with
    // a later one's arrival (client.py's module doc): no ground truth
    // there. Such streams are left out of the comparison, so they must stay
    // rare, or the p99 below would describe a chosen few: at most one in
    // five, leaving ≥ 90 compared. (Here 0–5 of 112; a CI machine whose
    // llama-server streamed a token every 1.85 ms, against 2.3–3.2 ms here,
    // left the Python client behind on 5 of its first 48.) As the client's
    // figure is then an upper bound, tokentap's TTFT must still not exceed
    // it by more than twice the p99 bound (a per-stream check on a handful
    // of streams, not a p99: it catches a first token put on the wrong
    // write, which is off by a token gap or more).
    assert!(
        cmp.ttft_diff.len() >= 90,
        "only {} of {completed} completed streams have an exact client clock",
        cmp.ttft_diff.len()
    );
    assert!(
        cmp.client_behind.len() * 5 <= completed,
        "the client's clock has no exact first-event arrival for {} of {completed} completed streams: {:?}",
        cmp.client_behind.len(),
        cmp.client_behind
    );
    for (tag, d) in &cmp.client_behind {
        assert!(
            *d * 1e3 <= 2.0 * TTFT_P99_MAX_MS,
            "{tag}: tokentap's TTFT exceeds the client's (an upper bound there) by {:.3} ms",
            d * 1e3
        );
    }
    // TPOT averages the gaps between the first and last token over the
    // tokens: p99 0.002–0.023 ms here; a last token on the wrong write
    // moves it by a gap / N, well past this.
    assert!(
        p99 <= TPOT_P99_MAX_MS,
        "p99 |TPOT difference| {p99:.3} ms > {TPOT_P99_MAX_MS} ms (p50 {p50:.3} ms)"
    );
    assert!(
        t99 <= TTFT_P99_MAX_MS,
        "p99 |TTFT difference| {t99:.3} ms > {TTFT_P99_MAX_MS} ms; the split is \
         send→t0 p99 {b99:.3} ms, t1→rx p99 {c99:.3} ms; {conditions}; the furthest rows:{worst}"
    );

    // Rotel logs each batch of metrics it receives.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut seen = vec![];
    let got = loop {
        match rotel_out.recv_timeout(Duration::from_millis(200)) {
            Ok(l) => {
                let hit = l.contains("gen_ai.server.time_to_first_token");
                seen.push(l);
                if hit {
                    break true;
                }
            }
            Err(_) if Instant::now() > deadline => break false,
            Err(_) => {}
        }
    };
    let _ = rotel.0.kill();
    assert!(got, "Rotel received no TTFT metric; it printed: {seen:?}");
}

fn wait_listening(port: u16, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "{what} is not listening on {port}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
