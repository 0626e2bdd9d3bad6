//! HTTP/2 cleartext end to end, as root, with no Python in the loop (it
//! runs in the kernel matrix's VMs too): the agent first, waiting on the
//! port; an engine on the `h2` crate (`h2engine`, the stack under hyper and
//! axum) started after it in its own network namespace; an `h2` client
//! multiplexing streamed chats on one connection. Every stream is one
//! record (`protocol: h2`), its tokens the engine's usage, and its TTFT
//! between the two clocks that bracket it: no shorter than the engine's
//! own (request complete in the handler → first chunk queued, both inside
//! the agent's span) and no longer than the client's (its send → the first
//! content it received, both outside it).

use std::{collections::HashMap, time::Duration};

use bytes::Bytes;
use serde_json::{json, Value};
use tokentap_tests::{
    assert_root, free_port, interrupt, now_ns, read_jsonl, scratch_dir, start, Netns, RunAgent,
};

/// Streams on the measured connection, all open at once.
const STREAMS: usize = 8;
/// The engine's schedule per stream.
const TTFT_MS: u64 = 40;
const GAP_MS: u64 = 6;
const TOKENS: u64 = 5;
/// Slack for the two clock readings on either side (ns): the reads
/// themselves, and the client woken by the engine's write before that
/// write's syscall returned (the kernel's timestamp is at its exit).
const SLACK_NS: i64 = 1_000_000;

/// What the client saw of one stream.
struct Seen {
    model: String,
    send_ns: u64,
    first_ns: u64,
    status: u16,
    body: String,
}

async fn stream(mut client: h2::client::SendRequest<Bytes>, host: &str, model: String) -> Seen {
    let body = json!({"model": model, "stream": true,
        "stream_options": {"include_usage": true},
        "messages": [{"role": "user", "content": "Say something over HTTP/2."}],
        "sim": {"ttft_ms": TTFT_MS, "gap_ms": GAP_MS, "tokens": TOKENS, "prompt_tokens": 9}})
    .to_string();
    let req = http::Request::builder()
        .method("POST")
        .uri(format!("http://{host}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(())
        .unwrap();
    client = client.ready().await.expect("h2 ready");
    let send_ns = now_ns();
    let (resp, mut send) = client.send_request(req, false).expect("send_request");
    send.send_data(Bytes::from(body), true).expect("send body");
    let resp = resp.await.expect("response");
    let status = resp.status().as_u16();
    let mut recv = resp.into_body();
    let mut text = String::new();
    let mut first_ns = 0;
    while let Some(chunk) = recv.data().await {
        let chunk = chunk.expect("data");
        let _ = recv.flow_control().release_capacity(chunk.len());
        if first_ns == 0 && chunk.windows(9).any(|w| w == b"\"content\"") {
            first_ns = now_ns();
        }
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    Seen {
        model,
        send_ns,
        first_ns,
        status,
        body: text,
    }
}

/// `n` streams at once on one new h2c connection.
fn streams(addr: &str, port: u16, prefix: &str, n: usize) -> Vec<Seen> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let host = format!("{addr}:{port}");
    rt.block_on(async move {
        let tcp = tokio::net::TcpStream::connect(&host)
            .await
            .expect("connect");
        tcp.set_nodelay(true).unwrap();
        let (client, conn) = h2::client::handshake(tcp).await.expect("h2 handshake");
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let tasks: Vec<_> = (0..n)
            .map(|i| {
                let c = client.clone();
                let h = host.clone();
                let model = format!("{prefix}-{i}");
                tokio::spawn(async move { stream(c, &h, model).await })
            })
            .collect();
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.expect("stream task"));
        }
        out
    })
}

#[test]
#[ignore = "needs root: eBPF, network namespaces (cargo xtask test runs it as root)"]
fn streams_multiplexed_on_one_h2c_connection_match_the_engines_clock() {
    assert_root("http2");
    let dir = scratch_dir("http2");
    let port = free_port();
    let log = dir.join("requests.jsonl");
    let truth = dir.join("truth.jsonl");
    let (mut tt, tt_out) = start(
        &mut RunAgent::new()
            .no_gpu()
            .port(port)
            .requests_log(&log)
            .command(),
        "ready",
        "tokentap run",
    );
    let ns = Netns::create("th2", 73);
    let mut e = ns.command(env!("CARGO_BIN_EXE_h2engine"));
    e.args([
        "--addr",
        &ns.ns_addr,
        "--port",
        &port.to_string(),
        "--truth",
    ])
    .arg(&truth);
    let (_engine, _engine_out) = start(&mut e, "listening", "h2engine");

    // Until the agent has the engine: a connection it sees from its start.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut warm = 0;
    while !read_jsonl(&log).iter().any(|r| {
        r["request_model"]
            .as_str()
            .is_some_and(|m| m.starts_with("warm-"))
    }) {
        assert!(
            std::time::Instant::now() < deadline,
            "the agent recorded no warm-up stream in 60 s"
        );
        streams(&ns.ns_addr, port, &format!("warm-{warm}"), 1);
        warm += 1;
        std::thread::sleep(Duration::from_millis(300));
    }

    let seen = streams(&ns.ns_addr, port, "h2", STREAMS);
    std::thread::sleep(Duration::from_millis(700));
    let (ok, lines) = interrupt(&mut tt, tt_out);
    assert!(ok, "tokentap run failed: {lines:#?}");
    let decode = tokentap_tests::shutdown(&lines).decode;
    assert_eq!(decode["desyncs"], 0, "{decode}");

    let truth: HashMap<String, Value> = read_jsonl(&truth)
        .into_iter()
        .map(|t| (t["model"].as_str().unwrap().to_string(), t))
        .collect();
    let all = read_jsonl(&log);
    let measured = all
        .iter()
        .filter(|r| {
            r["request_model"]
                .as_str()
                .is_some_and(|m| m.starts_with("h2-"))
        })
        .count();
    assert_eq!(measured, seen.len(), "each stream recorded once: {all:#?}");
    let records: HashMap<String, Value> = all
        .into_iter()
        .filter_map(|r| Some((r["request_model"].as_str()?.to_string(), r)))
        .collect();
    let mut rows = Vec::new();
    for s in &seen {
        assert_eq!(s.status, 200, "{}: status", s.model);
        assert!(
            s.body.contains("[DONE]"),
            "{}: the stream did not end",
            s.model
        );
        let t = &truth[&s.model];
        let r = records
            .get(&s.model)
            .unwrap_or_else(|| panic!("no record of {} (records: {:?})", s.model, records.keys()));
        assert_eq!(r["protocol"], "h2", "{}", s.model);
        // A connection opened after the agent had the engine: every
        // stream's first byte was seen reaching the socket.
        assert_eq!(r["t0_source"], "arrival", "{}", s.model);
        assert_eq!(r["operation"], "chat", "{}", s.model);
        assert_eq!(r["stream"], true, "{}", s.model);
        assert_eq!(r["status"], 200, "{}", s.model);
        assert_eq!(r["output_tokens"], TOKENS, "{}", s.model);
        assert_eq!(r["input_tokens"], 9, "{}", s.model);
        assert_eq!(r["tokens_exact"], true, "{}", s.model);
        assert!(
            r["error_type"].is_null(),
            "{}: {}",
            s.model,
            r["error_type"]
        );
        let ttft_ns = (r["ttft_s"].as_f64().expect("ttft_s") * 1e9) as i64;
        let engine_ns = t["first"].as_i64().unwrap() - t["recv"].as_i64().unwrap();
        let client_ns = s.first_ns as i64 - s.send_ns as i64;
        rows.push(format!(
            "{}: engine {:.3} ms ≤ agent {:.3} ms ≤ client {:.3} ms (t0 {})",
            s.model,
            engine_ns as f64 / 1e6,
            ttft_ns as f64 / 1e6,
            client_ns as f64 / 1e6,
            r["t0_source"]
        ));
        assert!(
            ttft_ns >= engine_ns - SLACK_NS && ttft_ns <= client_ns + SLACK_NS,
            "{}: TTFT outside the engine's and the client's clocks: {}",
            s.model,
            rows.last().unwrap()
        );
        assert!(
            ttft_ns >= (TTFT_MS as i64) * 1_000_000,
            "{}",
            rows.last().unwrap()
        );
        let tpot = r["tpot_s"].as_f64().expect("tpot_s");
        assert!(
            tpot >= GAP_MS as f64 / 1e3 * 0.9,
            "{}: tpot {tpot}",
            s.model
        );
    }
    eprintln!("{}", rows.join("\n"));
}
