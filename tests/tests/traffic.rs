//! End to end, as root: an engine's port carries more than LLM calls.
//! Kubelet probes (`/health`, from another source address, each on a new
//! connection), a Prometheus scraper on one keep-alive connection and
//! model listings reach the same port as the chats. Only the chats are LLM
//! requests: the request histograms and `tokentap.requests` at a real OTLP
//! receiver count exactly them, no timeline event names the prober, and
//! `tokentap.http.requests` counts the rest by route class.

use std::{
    collections::BTreeMap,
    net::{Ipv4Addr, TcpStream},
    path::Path,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

use tokentap_tests::{
    assert_root, connect_from, http, interrupt,
    otlp::{counter, histogram, start_receiver, sum_points},
    read_jsonl, scratch_dir, start, start_simengine, RunAgent,
};

#[test]
#[ignore = "needs root: loads eBPF (cargo xtask test runs it as root)"]
fn probes_scrapes_and_model_listings_are_counted_apart_and_only_chats_are_llm_requests() {
    assert_root("production traffic");
    let rt = tokentap_tests::otlp::runtime();
    let (sink, otlp_port) = start_receiver(&rt, 0);
    let dir = scratch_dir("traffic");
    let log = dir.join("requests.jsonl");
    let all_log = dir.join("all-requests.jsonl");
    let events = dir.join("events.jsonl");
    let (engine, port, _) = start_simengine(Path::new(env!("CARGO_BIN_EXE_simengine")), &[]);
    let (mut agent, out) = RunAgent::exporting(engine.0.id(), otlp_port)
        .requests_log(&log)
        .events_log(&events)
        .start();
    // A second agent on the same engine logs every request.
    let (mut all_agent, all_out) = start(
        &mut RunAgent::new()
            .pid(engine.0.id())
            .no_gpu()
            .arg("--log-all-requests")
            .requests_log(&all_log)
            .command(),
        "; ready",
        "tokentap run --log-all-requests",
    );

    let stop = Arc::new(AtomicBool::new(false));
    // The kubelet: a new connection from 127.0.0.2 every 50 ms, /health
    // three times out of four, else /v1/models.
    let prober = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut sent = BTreeMap::<&str, u64>::new();
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let (path, class) = if i % 4 == 3 {
                    ("/v1/models", "models")
                } else {
                    ("/health", "health")
                };
                let mut s = connect_from(Ipv4Addr::new(127, 0, 0, 2), port);
                let r = http::get(&mut s, path).expect("probe");
                assert_eq!(r.status(), Some(200));
                *sent.entry(class).or_default() += 1;
                i += 1;
                drop(s);
                std::thread::sleep(Duration::from_millis(50));
            }
            sent
        })
    };
    // Prometheus: one keep-alive connection, a scrape every 200 ms, and
    // one path the engine does not have.
    let scraper = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut s = connect_from(Ipv4Addr::new(127, 0, 0, 3), port);
            let mut n = 0u64;
            let r = http::get(&mut s, "/version").expect("unknown path");
            assert_eq!(r.status(), Some(404));
            while !stop.load(Ordering::Relaxed) {
                let r = http::get(&mut s, "/metrics").expect("scrape");
                assert_eq!(r.status(), Some(200));
                n += 1;
                std::thread::sleep(Duration::from_millis(200));
            }
            n
        })
    };
    // 12 chats, on two keep-alive connections.
    for c in 0..2u64 {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        for i in 0..6u64 {
            let body = serde_json::json!({"model": "sim-traffic", "stream": true,
                "stream_options": {"include_usage": true},
                "sim": {"id": c * 6 + i, "ttft_ms": 20, "gap_ms": 5, "tokens": 4}});
            let r = http::round_trip(&mut s, "/v1/chat/completions", &body.to_string()).unwrap();
            assert!(r.complete);
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let probes = prober.join().unwrap();
    let scrapes = scraper.join().unwrap();
    // Two exports after the last request.
    std::thread::sleep(Duration::from_millis(2500));
    let (ok, lines) = interrupt(&mut agent, out);
    let stderr = lines.join("\n");
    assert!(ok, "tokentap run failed: {stderr}");
    let (ok, all_lines) = interrupt(&mut all_agent, all_out);
    assert!(ok, "tokentap run --log-all-requests failed: {all_lines:?}");
    drop(engine);

    assert!(
        probes["health"] >= 20 && scrapes >= 10,
        "{probes:?} {scrapes}"
    );
    let recs = read_jsonl(&log);
    assert_eq!(recs.len(), 12, "only the chats are records: {stderr}");
    assert!(recs.iter().all(|r| r["operation"] == "chat"));

    let exports = sink.exports();
    let (n, _, _) = histogram(&exports, "gen_ai.server.request.duration").expect("duration");
    assert_eq!(n, 12, "gen_ai.server.request.duration count");
    let (n, _, _) = histogram(&exports, "gen_ai.server.time_to_first_token").expect("ttft");
    assert_eq!(n, 12);
    assert_eq!(counter(&exports, "tokentap.requests"), Some(12));

    // tokentap.http.requests by route class, with method and status.
    let mut by_class = BTreeMap::<String, u64>::new();
    for (attrs, v) in sum_points(&exports, "tokentap.http.requests") {
        let get = |k: &str| {
            attrs
                .iter()
                .find(|(a, _)| a == k)
                .map(|(_, v)| v.clone())
                .unwrap_or_else(|| panic!("{k} missing: {attrs:?}"))
        };
        assert_eq!(get("http.request.method"), "GET");
        assert_eq!(get("server.port"), port.to_string());
        let class = get("tokentap.http.route_class");
        let status = get("http.response.status_code");
        assert_eq!(
            status,
            if class == "other" { "404" } else { "200" },
            "{attrs:?}"
        );
        *by_class.entry(class).or_default() += v;
    }
    let want: BTreeMap<String, u64> = [
        ("health".to_string(), probes["health"]),
        (
            "models".to_string(),
            probes.get("models").copied().unwrap_or(0),
        ),
        ("metrics".to_string(), scrapes),
        ("other".to_string(), 1),
    ]
    .into();
    assert_eq!(by_class, want, "{stderr}");

    // No timeline event (caller.new, surge, …) names the prober or the
    // scraper; the chats' caller is there.
    let evs = read_jsonl(&events);
    for e in &evs {
        let t = e.to_string();
        assert!(
            !t.contains("127.0.0.2") && !t.contains("127.0.0.3"),
            "an event names a probe's caller: {t}"
        );
    }
    assert!(
        evs.iter()
            .any(|e| e["kind"] == "caller.new" && e.to_string().contains("127.0.0.1")),
        "the chats' caller is on the timeline: {evs:?}"
    );

    // --log-all-requests: the same 12 chats plus every other request, those
    // with operation null.
    let all = read_jsonl(&all_log);
    let (llm, other): (Vec<_>, Vec<_>) = all.iter().partition(|r| !r["operation"].is_null());
    assert_eq!(llm.len(), 12);
    let total_other = probes.values().sum::<u64>() + scrapes + 1;
    assert_eq!(other.len() as u64, total_other);
    assert!(other
        .iter()
        .any(|r| r["path"] == "/version" && r["status"] == 404));
}

#[test]
#[ignore = "needs root: loads eBPF (cargo xtask test runs it as root)"]
fn a_long_stream_running_when_the_agent_starts_is_no_decode_error_and_its_connection_is_then_measured(
) {
    assert_root("agent started beside a long stream");
    let rt = tokentap_tests::otlp::runtime();
    let (sink, otlp_port) = start_receiver(&rt, 0);
    let dir = scratch_dir("joined-stream");
    let log = dir.join("requests.jsonl");
    let (engine, port, _) = start_simengine(Path::new(env!("CARGO_BIN_EXE_simengine")), &[]);
    // A 9-second stream (90 tokens, 100 ms apart) on a keep-alive
    // connection, started before the agent.
    let (tx, rx) = std::sync::mpsc::channel::<TcpStream>();
    let streamer = std::thread::spawn(move || {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let body = serde_json::json!({"model": "sim-long", "stream": true,
            "sim": {"id": 0, "ttft_ms": 10, "gap_ms": 100, "tokens": 90}});
        let r = http::round_trip(&mut s, "/v1/chat/completions", &body.to_string()).unwrap();
        assert!(r.complete);
        tx.send(s).unwrap();
    });
    std::thread::sleep(Duration::from_millis(1500));
    let (mut agent, out) = RunAgent::exporting(engine.0.id(), otlp_port)
        .requests_log(&log)
        .start();
    let mut s = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the long stream ends");
    streamer.join().unwrap();
    for i in 1..=3u64 {
        let body = serde_json::json!({"model": "sim-long", "stream": true,
            "sim": {"id": i, "ttft_ms": 10, "gap_ms": 2, "tokens": 4}});
        let r = http::round_trip(&mut s, "/v1/chat/completions", &body.to_string()).unwrap();
        assert!(r.complete);
    }
    std::thread::sleep(Duration::from_millis(2500));
    let (ok, lines) = interrupt(&mut agent, out);
    let stderr = lines.join("\n");
    assert!(ok, "{stderr}");
    let recs = read_jsonl(&log);
    assert_eq!(
        recs.len(),
        3,
        "the requests after the joined stream, on its connection: {stderr}"
    );
    assert!(recs.iter().all(|r| r["output_tokens"] == 4), "{recs:?}");
    let exports = sink.exports();
    assert_eq!(
        counter(&exports, "tokentap.decode.errors"),
        Some(0),
        "{stderr}"
    );
    assert!(
        counter(&exports, "tokentap.decode.joined_mid_stream") >= Some(1),
        "{stderr}"
    );
}
