//! End to end, as root: `tokentap run --otlp-endpoint` against the
//! simulated engine, with an OTLP/gRPC receiver in the test. The exported
//! histograms' counts and sums must equal what the request log implies,
//! with the GenAI semantic conventions' names and units.

use std::{
    net::TcpStream,
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use serde_json::Value;
use tokentap_tests::{
    assert_root, http, interrupt,
    otlp::{
        assert_exports_match_log, counter, exponential_histograms, gauge_points,
        start_http_receiver, start_receiver, sum_point_attributes,
    },
    read_jsonl, scratch_dir, start, start_simengine, tokentap_bin,
};

/// `tokentap run` on `pid`, exporting every second to 127.0.0.1:`otlp_port`,
/// with `extra` arguments; returns once it is ready.
fn start_agent(
    pid: u32,
    otlp_port: u16,
    extra: &[&str],
) -> (tokentap_tests::Running, std::sync::mpsc::Receiver<String>) {
    start(
        Command::new(tokentap_bin())
            .args(["run", "--pid", &pid.to_string(), "--no-console"])
            .args(["--export-interval", "1"])
            .arg("--otlp-endpoint")
            .arg(format!("http://127.0.0.1:{otlp_port}"))
            .args(extra),
        "; ready",
        "tokentap run",
    )
}

/// Sends one request with `body` and reads its whole response.
fn request(s: &mut TcpStream, body: &serde_json::Value) {
    let r = http::round_trip(s, "/v1/chat/completions", &body.to_string()).expect("round trip");
    assert!(r.complete);
}

fn one_request(s: &mut TcpStream, i: u64) {
    request(
        s,
        &serde_json::json!({"model": "sim", "stream": true, "stream_options": {"include_usage": true},
            "sim": {"id": i, "ttft_ms": 2, "gap_ms": 1, "tokens": 3}}),
    );
}

#[test]
#[ignore = "needs root: loads eBPF (cargo xtask test runs it as root)"]
fn a_collector_that_is_down_at_start_gets_the_metrics_once_it_is_up() {
    assert_root("OTLP collector down then up");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // A free port with nothing listening on it (yet).
    let otlp_port = tokentap_tests::free_port();
    let (engine, port, _) = start_simengine(Path::new(env!("CARGO_BIN_EXE_simengine")), &[]);
    let (mut agent, out) = start_agent(engine.0.id(), otlp_port, &["--exponential-histograms"]);
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    for i in 0..5 {
        one_request(&mut s, i);
    }
    // Several export intervals against a dead collector.
    std::thread::sleep(Duration::from_millis(2500));
    assert!(
        agent.0.try_wait().unwrap().is_none(),
        "the agent must keep running without a collector"
    );
    let (sink, _) = start_receiver(&rt, otlp_port);
    for i in 5..10 {
        one_request(&mut s, i);
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let exports = sink.0.lock().unwrap().clone();
        if counter(&exports, "tokentap.requests") == Some(10)
            && counter(&exports, "tokentap.export.failures").unwrap_or(0) > 0
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "metrics did not arrive after the collector came up"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let expo = exponential_histograms(&sink.0.lock().unwrap());
    assert!(
        expo.iter()
            .any(|n| n == "gen_ai.server.time_to_first_token"),
        "--exponential-histograms exports base-2 exponential histograms: {expo:?}"
    );
    let (ok, lines) = interrupt(&mut agent, out);
    let stderr = lines.join("\n");
    assert!(ok, "tokentap run failed: {stderr}");
    drop(engine);
    assert!(
        stderr.contains("OTLP export to") && stderr.contains("failed"),
        "the failure is reported: {stderr}"
    );
    assert!(
        stderr.contains("works again"),
        "the recovery is reported: {stderr}"
    );
    // Reported once per interval, not per record: a handful of lines.
    let lines = stderr.lines().filter(|l| l.contains("failed")).count();
    assert!(
        lines <= 10,
        "{lines} failure lines for ~3 intervals: {stderr}"
    );
}

#[test]
#[ignore = "needs root: loads eBPF (cargo xtask test runs it as root)"]
fn exported_histograms_agree_with_the_request_log() {
    check_export("grpc");
}

#[test]
#[ignore = "needs root: loads eBPF (cargo xtask test runs it as root)"]
fn http_protobuf_export_agrees_with_the_request_log_too() {
    check_export("http/protobuf");
}

fn check_export(protocol: &str) {
    assert_root("OTLP export");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (sink, otlp_port) = if protocol == "grpc" {
        start_receiver(&rt, 0)
    } else {
        start_http_receiver(0)
    };

    let dir = scratch_dir(&format!("otlp-{}", protocol.replace('/', "-")));
    let log = dir.join("requests.jsonl");
    let (engine, port, _) = start_simengine(Path::new(env!("CARGO_BIN_EXE_simengine")), &[]);
    let (mut agent, out) = start_agent(
        engine.0.id(),
        otlp_port,
        &[
            "--otlp-protocol",
            protocol,
            "--requests-log",
            log.to_str().expect("scratch paths are UTF-8"),
        ],
    );

    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    for i in 0..40u64 {
        let (stream, status) = match i % 8 {
            0 => (false, 200),
            1 => (true, 429),
            _ => (true, 200),
        };
        request(
            &mut s,
            &serde_json::json!({"model": "sim-otlp", "stream": stream, "stream_options": {"include_usage": i % 2 == 0},
                "sim": {"id": i, "status": status, "ttft_ms": 3 + i % 5, "gap_ms": 1, "tokens": 2 + i % 6}}),
        );
    }
    std::thread::sleep(Duration::from_millis(300));
    let (ok, lines) = interrupt(&mut agent, out);
    let stderr = lines.join("\n");
    assert!(ok, "tokentap run failed: {stderr}");
    drop(engine);

    let recs = read_jsonl(&log);
    assert_eq!(recs.len(), 40, "{stderr}");
    let exports = sink.0.lock().unwrap().clone();
    assert!(!exports.is_empty(), "no OTLP export arrived: {stderr}");
    assert_exports_match_log(&exports, &recs);
    let resource = &exports.last().unwrap().resource_metrics[0].resource;
    let service = resource
        .as_ref()
        .and_then(|r| r.attributes.iter().find(|a| a.key == "service.name"))
        .and_then(|a| a.value.as_ref())
        .map(|v| format!("{:?}", v.value));
    assert!(
        service.is_some_and(|s| s.contains("tokentap")),
        "service.name missing"
    );
    let errors: Vec<&Value> = recs
        .iter()
        .filter(|r| r["error_type"] == "http_429")
        .collect();
    assert_eq!(errors.len(), 5);
    // Attributes as DESIGN §4: failures carry error.type; every point the
    // operation, model, engine and port.
    let points = sum_point_attributes(&exports, "tokentap.requests");
    assert!(!points.is_empty());
    let has =
        |p: &Vec<(String, String)>, k: &str, v: &str| p.iter().any(|(pk, pv)| pk == k && pv == v);
    for p in &points {
        assert!(has(p, "gen_ai.operation.name", "chat"), "{p:?}");
        assert!(has(p, "gen_ai.request.model", "sim-otlp"), "{p:?}");
        assert!(p.iter().any(|(k, _)| k == "gen_ai.provider.name"), "{p:?}");
        assert!(has(p, "server.port", &port.to_string()), "{p:?}");
    }
    assert!(
        points.iter().any(|p| has(p, "error.type", "http_429")),
        "{points:?}"
    );
}

#[test]
#[ignore = "needs root: loads eBPF (cargo xtask test runs it as root)"]
fn the_engines_own_metrics_are_exported_and_the_agents_scrapes_are_not_requests() {
    assert_root("engine metrics");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (sink, otlp_port) = start_receiver(&rt, 0);
    let dir = scratch_dir("engine-metrics");
    let log = dir.join("requests.jsonl");
    // simengine answers GET /metrics in llama.cpp server's names, with
    // llamacpp:requests_processing = requests being answered now.
    let (engine, port, _) = start_simengine(Path::new(env!("CARGO_BIN_EXE_simengine")), &[]);
    let (mut agent, out) = start_agent(
        engine.0.id(),
        otlp_port,
        &["--requests-log", log.to_str().expect("UTF-8 path")],
    );
    // One slow stream (60 tokens 50 ms apart: 3 s) spans several scrapes.
    let slow = std::thread::spawn(move || {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        request(
            &mut s,
            &serde_json::json!({"model": "sim-scraped", "stream": true,
                "sim": {"id": 1, "ttft_ms": 5, "gap_ms": 50, "tokens": 60}}),
        );
    });
    slow.join().unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let (ok, lines) = interrupt(&mut agent, out);
    let stderr = lines.join("\n");
    assert!(ok, "tokentap run failed: {stderr}");
    let exports = sink.0.lock().unwrap().clone();
    let running = gauge_points(&exports, "tokentap.engine.requests.running");
    assert!(
        running.iter().any(|(_, v)| *v == 1.0),
        "the scrape during the stream saw it running: {running:?}\n{stderr}"
    );
    assert!(
        running.iter().any(|(_, v)| *v == 0.0),
        "and idle after: {running:?}"
    );
    let (attrs, _) = &running[0];
    let get = |k: &str| attrs.iter().find(|(a, _)| a == k).map(|(_, v)| v.clone());
    assert_eq!(get("gen_ai.provider.name").as_deref(), Some("llama.cpp"));
    assert_eq!(get("tokentap.engine.pid"), Some(engine.0.id().to_string()));
    assert_eq!(get("server.port"), Some(port.to_string()));
    assert!(!gauge_points(&exports, "tokentap.engine.requests.waiting").is_empty());
    // The scrapes went through the captured engine's sockets, but only the
    // LLM request is a record.
    let recs = read_jsonl(&log);
    assert_eq!(recs.len(), 1, "{recs:?}");
    assert_eq!(recs[0]["path"], "/v1/chat/completions");
    let own = counter(&exports, "tokentap.self_requests").unwrap_or(0);
    assert!(own >= 2, "scrapes seen and dropped: {own}");
    assert_eq!(
        counter(&exports, "tokentap.engine.scrape.failures"),
        Some(0)
    );
}
