//! One OTLP span per LLM request, as root: the simulated engine in its own
//! network namespace, clients sending W3C `traceparent` headers, the agent
//! exporting to an OTLP/gRPC receiver with `--traces-sample 0` and
//! `--traces-slow-ttft 0.05`. Fast successful requests are not exported
//! (sampled out); slow ones and failed ones always are, each a SERVER span
//! in the caller's trace with the caller's span as parent, its first-token
//! event at t0 + `ttft_s` of the request log (±1 µs), failures with an
//! error status. A malformed or all-zero `traceparent` starts a trace of
//! its own (counted), never an error.

use std::{path::Path, time::Duration};

use serde_json::{json, Value};
use tokentap_tests::{
    assert_root, free_port, http, interrupt, otlp, read_jsonl, scratch_dir, start, Netns, RunAgent,
};

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

/// One request on its own connection, read to the end of its response.
fn ask(addr: &str, id: u64, ttft_ms: u64, status: u16, traceparent: &str) {
    let body = json!({"model": format!("tr-{id}"), "stream": true,
        "sim": {"id": id, "ttft_ms": ttft_ms, "gap_ms": 2, "tokens": 3, "status": status}})
    .to_string();
    let req = http::post_with_headers(
        "/v1/chat/completions",
        "engine",
        &[("traceparent", traceparent), ("Connection", "close")],
        &body,
    );
    let (r, _) = http::exchange(addr, &req).expect("a response from the engine");
    let t = String::from_utf8_lossy(&r.body);
    assert!(
        r.head.text.starts_with(&format!("http/1.1 {status}")),
        "request {id}: {}",
        r.head.text
    );
    if status == 200 {
        assert!(t.contains("[DONE]"), "request {id}: {t}");
    }
}

fn span_id(i: u64) -> String {
    format!("{:016x}", 0x1000 + i)
}

#[test]
#[ignore = "needs root: eBPF, network namespaces (cargo xtask test runs it as root)"]
fn slow_and_failed_requests_are_spans_in_the_callers_trace() {
    assert_root("traces");
    let dir = scratch_dir("traces");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (_metrics, _logs, spans, rport) = otlp::start_receiver_with_traces(&rt, 0);
    let ns = Netns::create("ttr", 72);
    let port = free_port();
    let (_engine, _engine_out) = start(
        ns.command(Path::new(env!("CARGO_BIN_EXE_simengine")))
            .args([
                "--addr",
                "0.0.0.0",
                "--port",
                &port.to_string(),
                "--nodelay",
            ]),
        "listening",
        "simengine",
    );
    let log = dir.join("requests.jsonl");
    let (mut agent, agent_out) = RunAgent::new()
        .port(port)
        .no_gpu()
        .otlp(rport)
        .args(["--traces-sample", "0", "--traces-slow-ttft", "0.05"])
        .requests_log(&log)
        .start();
    let addr = format!("{}:{port}", ns.ns_addr);
    let tp = |i: u64| format!("00-{TRACE}-{}-01", span_id(i));
    // Fast and fine: sampled out.
    for i in 0..3 {
        ask(&addr, i, 5, 200, &tp(i));
    }
    // Slow to the first token: kept.
    for i in 3..5 {
        ask(&addr, i, 90, 200, &tp(i));
    }
    // Failed: kept.
    ask(&addr, 5, 5, 500, &tp(5));
    // Malformed, then all-zero: a trace of their own, kept (failed, slow).
    ask(&addr, 6, 5, 500, "00-not-a-trace");
    ask(
        &addr,
        7,
        90,
        200,
        "00-00000000000000000000000000000000-0000000000000000-01",
    );
    std::thread::sleep(Duration::from_millis(700));
    let (ok, lines) = interrupt(&mut agent, agent_out);
    assert!(ok, "tokentap run failed: {lines:#?}");
    let summary = lines
        .iter()
        .find(|l| l.contains("requests recorded"))
        .unwrap_or_else(|| panic!("no shutdown line: {lines:#?}"));
    assert!(summary.contains(r#""invalid_traceparent":2"#), "{summary}");

    let records = read_jsonl(&log);
    let rec = |i: u64| -> &Value {
        records
            .iter()
            .find(|r| r["request_model"] == format!("tr-{i}"))
            .unwrap_or_else(|| panic!("tr-{i} not recorded: {records:#?}"))
    };
    let spans = spans.spans();
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    let named = |i: u64| {
        spans
            .iter()
            .filter(|s| {
                s.attributes.iter().any(|kv| {
                    kv.key == "gen_ai.request.model"
                        && format!("{:?}", kv.value).contains(&format!("\"tr-{i}\""))
                })
            })
            .collect::<Vec<_>>()
    };
    for i in 0..3 {
        assert!(named(i).is_empty(), "tr-{i} sampled out: {:#?}", named(i));
    }
    for i in 3..8 {
        let s = named(i);
        assert_eq!(s.len(), 1, "tr-{i}: one span: {spans:#?}");
        let s = s[0];
        let r = rec(i);
        // SERVER = 2 in OTLP's SpanKind.
        assert_eq!(s.kind, 2, "tr-{i}: {s:?}");
        assert_eq!(s.name, format!("chat tr-{i}"));
        let t0 = r["t0_ns"].as_u64().unwrap();
        assert_eq!(s.start_time_unix_nano, t0, "tr-{i}: start = t0");
        if i <= 5 {
            assert_eq!(hex(&s.trace_id), TRACE, "tr-{i}: the caller's trace");
            assert_eq!(
                hex(&s.parent_span_id),
                span_id(i),
                "tr-{i}: the caller's span"
            );
        } else {
            assert_ne!(hex(&s.trace_id), TRACE, "tr-{i}: a trace of its own");
            assert!(s.parent_span_id.is_empty(), "tr-{i}: a root span");
        }
        let failed = r["error_type"] != Value::Null;
        let status = s.status.as_ref().map(|st| st.code).unwrap_or(0);
        // STATUS_CODE_ERROR = 2.
        assert_eq!(status == 2, failed, "tr-{i}: {s:?} {r}");
        // A streamed answer that did not fail has its first token: the
        // span's event is checked below, never skipped for want of one.
        assert!(
            r["stream"] != true || failed || r["ttft_s"].is_number(),
            "tr-{i}: a streamed answer without a TTFT: {r}"
        );
        if let Some(ttft) = r["ttft_s"].as_f64() {
            let ev = s
                .events
                .iter()
                .find(|e| e.name == "gen_ai.first_token")
                .unwrap_or_else(|| panic!("tr-{i}: no first-token event: {s:?}"));
            let want = t0 as f64 + ttft * 1e9;
            assert!(
                (ev.time_unix_nano as f64 - want).abs() <= 1_000.0,
                "tr-{i}: first token at {} vs t0 + ttft {want}",
                ev.time_unix_nano
            );
        }
    }
}
