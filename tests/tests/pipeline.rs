//! The pipeline between the decoder and the sinks, on synthetic socket
//! events (no root): what reaches the sinks as an LLM request and what is
//! only counted. An engine's port also answers health checks and
//! Prometheus scrapes (kubelet probes, another monitoring agent); those are
//! not LLM requests and must not show up in RPM, request counts, the
//! console or caller events.

use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use tokentap::{
    pipeline::Pipeline,
    record::{Finished, RouteClass},
    stage::{health::Health, Sink, Tick},
};
use tokentap_tests::{
    transcript::{events, Transcript},
    RunAgent,
};

/// LLM requests, and the others with their route class.
#[derive(Clone, Default)]
struct Collect(
    Arc<Mutex<Vec<Finished>>>,
    Arc<Mutex<Vec<(String, RouteClass)>>>,
);

impl Sink for Collect {
    fn record(&mut self, f: &Finished) -> anyhow::Result<()> {
        self.0.lock().unwrap().push(f.clone());
        Ok(())
    }
    fn other_request(&mut self, f: &Finished, class: RouteClass) -> anyhow::Result<()> {
        self.1
            .lock()
            .unwrap()
            .push((format!("{} {}", f.record.method, f.record.path), class));
        Ok(())
    }
    fn tick(&mut self, _t: &Tick<'_>) -> anyhow::Result<()> {
        Ok(())
    }
    fn shutdown(self: Box<Self>, _t: &Tick<'_>) -> anyhow::Result<()> {
        Ok(())
    }
}

fn get(path: &str, t_ms: u64, content_type: &str, body: &str) -> Vec<Value> {
    vec![
        json!({"t_ms": t_ms, "request": {"method": "GET", "path": path,
            "headers": {"Host": "engine:8000"}}}),
        json!({"t_ms": t_ms + 1, "response": {"status": 200,
            "headers": {"Content-Type": content_type}, "body": body}}),
    ]
}

fn stream(path: &str, t_ms: u64, request: Value, events: &[Value]) -> Vec<Value> {
    let mut v = vec![
        json!({"t_ms": t_ms, "request": {"method": "POST", "path": path,
            "headers": {"Host": "engine:8000", "Content-Type": "application/json"},
            "json": request}}),
        json!({"t_ms": t_ms + 1, "response": {"status": 200,
            "headers": {"Content-Type": "text/event-stream"}, "chunked": true}}),
    ];
    for (i, e) in events.iter().enumerate() {
        v.push(json!({"t_ms": t_ms + 10 + i as u64 * 5, "sse": e}));
    }
    v.push(json!({"t_ms": t_ms + 10 + events.len() as u64 * 5, "sse_raw": "data: [DONE]\n\n"}));
    v.push(json!({"t_ms": t_ms + 11 + events.len() as u64 * 5, "end": true}));
    v
}

fn chunk(text: &str) -> Value {
    json!({"object": "chat.completion.chunk", "model": "m",
        "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": null}]})
}

#[test]
fn only_requests_of_a_known_llm_operation_reach_the_llm_sinks_and_the_rest_are_counted_by_route_class(
) {
    let mut steps = vec![];
    steps.extend(get(
        "/metrics",
        0,
        "text/plain; version=0.0.4",
        "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 1\n",
    ));
    steps.extend(get(
        "/health",
        10,
        "application/json",
        "{\"status\":\"ok\"}",
    ));
    steps.extend(get("/health?verbose=1", 20, "application/json", "{}"));
    steps.extend(get(
        "/v1/models",
        25,
        "application/json",
        r#"{"object":"list","data":[{"id":"m","object":"model","owned_by":"vllm","max_model_len":8192}]}"#,
    ));
    steps.extend(stream(
        "/v1/chat/completions",
        30,
        json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"}]}),
        &[chunk("a"), chunk("b")],
    ));
    // A path the decoder does not name, even streaming OpenAI-shaped
    // chunks: its operation is unknown, so it is not an LLM request.
    steps.extend(stream(
        "/internal/llm/stream",
        100,
        json!({"model": "m", "stream": true, "prompt": "hi"}),
        &[chunk("x"), chunk("y")],
    ));
    // An OpenAI batch creation: no inference happens in it.
    steps.push(
        json!({"t_ms": 150, "request": {"method": "POST", "path": "/v1/batches",
        "headers": {"Host": "engine:8000", "Content-Type": "application/json"},
        "json": {"input_file_id": "file-1", "endpoint": "/v1/chat/completions",
                 "completion_window": "24h"}}}),
    );
    steps.push(json!({"t_ms": 160, "response": {"status": 200,
        "headers": {"Content-Type": "application/json"},
        "body": "{\"id\":\"batch_1\",\"object\":\"batch\",\"status\":\"validating\"}"}}));
    // Not LLM requests, though on LLM-ish paths: polling the batch, a CORS
    // preflight, the tokenizer (with a model in its body).
    steps.extend(get("/v1/batches/batch_1", 170, "application/json", "{}"));
    steps.push(json!({"t_ms": 180, "request": {"method": "OPTIONS",
        "path": "/v1/chat/completions", "headers": {"Host": "engine:8000"}}}));
    steps.push(json!({"t_ms": 181, "response": {"status": 204, "headers": {}}}));
    steps.push(
        json!({"t_ms": 185, "request": {"method": "POST", "path": "/tokenize",
        "headers": {"Host": "engine:8000", "Content-Type": "application/json"},
        "json": {"model": "m", "prompt": "hi"}}}),
    );
    steps.push(json!({"t_ms": 186, "response": {"status": 200,
        "headers": {"Content-Type": "application/json"},
        "body": "{\"tokens\":[1,2],\"count\":2}"}}));
    // A failed POST to an API the decoder does not name.
    steps.push(
        json!({"t_ms": 190, "request": {"method": "POST", "path": "/v2/models/llm/infer",
        "headers": {"Host": "engine:8000", "Content-Type": "application/json"},
        "json": {"inputs": []}}}),
    );
    steps.push(json!({"t_ms": 195, "response": {"status": 500,
        "headers": {"Content-Type": "application/json"}, "body": "{\"error\":\"boom\"}"}}));
    steps.extend(get("/metrics", 200, "text/plain", "up 1\n"));
    // A 404 on the chat path: a misrouted client, visible as `other`.
    steps.push(
        json!({"t_ms": 210, "request": {"method": "POST", "path": "/v1/chat/completions",
        "headers": {"Host": "engine:8000", "Content-Type": "application/json"},
        "json": {"model": "absent", "messages": []}}}),
    );
    steps.push(json!({"t_ms": 215, "response": {"status": 404,
        "headers": {"Content-Type": "application/json"}, "body": "{\"error\":\"no such model\"}"}}));
    let t: Transcript = serde_json::from_value(json!({"steps": steps, "expect": []})).unwrap();

    let health = Arc::new(Health::default());
    let sink = Collect::default();
    let mut pipe = Pipeline::new(health.clone()).sink(Box::new(sink.clone()));
    let mut evs = events(&t);
    pipe.events(&mut evs).unwrap();
    pipe.end_of_input().unwrap();
    let sum = pipe.shutdown(None).unwrap();

    let got = sink.0.lock().unwrap();
    let paths: Vec<&str> = got.iter().map(|f| f.record.path.as_str()).collect();
    assert_eq!(
        paths,
        ["/v1/chat/completions"],
        "only the LLM request reaches the sinks"
    );
    assert_eq!(
        got[0].record.operation,
        Some(tokentap::vocab::Operation::Chat)
    );
    let others = sink.1.lock().unwrap().clone();
    let want: Vec<(String, RouteClass)> = [
        ("GET /metrics", RouteClass::Metrics),
        ("GET /health", RouteClass::Health),
        ("GET /health?verbose=1", RouteClass::Health),
        ("GET /v1/models", RouteClass::Models),
        ("POST /internal/llm/stream", RouteClass::Other),
        ("POST /v1/batches", RouteClass::Other),
        ("GET /v1/batches/batch_1", RouteClass::Other),
        ("OPTIONS /v1/chat/completions", RouteClass::Other),
        ("POST /tokenize", RouteClass::Other),
        ("POST /v2/models/llm/infer", RouteClass::Other),
        ("GET /metrics", RouteClass::Metrics),
        ("POST /v1/chat/completions", RouteClass::Other),
    ]
    .into_iter()
    .map(|(p, c)| (p.to_string(), c))
    .collect();
    assert_eq!(others, want);
    assert_eq!(health.snapshot().non_llm_requests, 12);
    assert_eq!(sum.records, 1, "the summary counts what was recorded");
}

#[test]
fn replay_decodes_tenant_and_api_key_id_like_the_live_agent_when_given_its_settings() {
    let dir = tokentap_tests::scratch_dir("replay-identity");
    let mut steps = stream(
        "/v1/chat/completions",
        0,
        json!({"model": "m", "stream": true, "messages": []}),
        &[chunk("a")],
    );
    steps[0]["request"]["headers"]["Authorization"] = json!("Bearer sk-test-123");
    steps[0]["request"]["headers"]["X-Team"] = json!("search");
    let t: Transcript = serde_json::from_value(json!({"steps": steps, "expect": []})).unwrap();
    let cap = dir.join("cap.jsonl");
    let mut text: String = events(&t)
        .iter()
        .map(|e| tokentap::capfile::to_line(e) + "\n")
        .collect();
    text += "not json\n";
    std::fs::write(&cap, text).unwrap();
    let salt = dir.join("salt");
    std::fs::write(&salt, "replay-test-salt").unwrap();
    let replay = |extra: &[&str]| {
        let out = std::process::Command::new(tokentap_tests::tokentap_bin())
            .arg("replay")
            .arg(&cap)
            .args(extra)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        (
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let salt_arg = salt.to_str().unwrap();
    let (stdout, stderr) = replay(&[
        "--requests-log",
        "-",
        "--api-key-salt-file",
        salt_arg,
        "--tenant-header",
        "X-Team",
    ]);
    let rec: Value = serde_json::from_str(stdout.lines().next().expect("a record")).unwrap();
    assert_eq!(rec["tenant"], "search", "{rec}");
    let id = rec["api_key_id"].as_str().expect("api_key_id");
    assert!(!id.is_empty() && !id.contains("sk-test"), "{rec}");
    // The same key gives the same id; the malformed line is reported before
    // the summary lines.
    let (again, _) = replay(&["--requests-log", "-", "--api-key-salt-file", salt_arg]);
    let again: Value = serde_json::from_str(again.lines().next().unwrap()).unwrap();
    assert_eq!(again["api_key_id"], rec["api_key_id"]);
    assert_eq!(
        again["tenant"],
        Value::Null,
        "no tenant header given, no user field"
    );
    let lines: Vec<&str> = stderr.lines().collect();
    let bad = lines.iter().position(|l| l.contains("malformed line:"));
    let summary = lines.iter().position(|l| l.contains("requests recorded"));
    assert!(
        matches!((bad, summary), (Some(b), Some(s)) if b < s),
        "{stderr}"
    );
    // The agent's config file: its request-type rules apply as they did
    // live.
    let config = dir.join("tokentap.toml");
    std::fs::write(
        &config,
        "no-console = true\n[[request_type]]\nname = \"team-search\"\nheader = \"x-team=search\"\n",
    )
    .unwrap();
    let (typed, _) = replay(&["--requests-log", "-", "--config", config.to_str().unwrap()]);
    let typed: Value = serde_json::from_str(typed.lines().next().unwrap()).unwrap();
    assert_eq!(typed["request_type"], "team-search", "{typed}");
    assert_eq!(
        rec["request_type"], "chat",
        "without the rules: the built-in"
    );
    // Without a salt file: an id all the same (the node's install key, or
    // a random one for this replay, said on stderr), never the key.
    let (stdout, stderr) = replay(&["--requests-log", "-"]);
    let rec2: Value = serde_json::from_str(stdout.lines().next().unwrap()).unwrap();
    let id2 = rec2["api_key_id"]
        .as_str()
        .expect("api_key_id without a salt file");
    assert!(!id2.contains("sk-test") && id2.len() == 12, "{rec2}");
    assert!(stderr.contains("api_key_id"), "which key is said: {stderr}");
    let (_, stderr) = replay(&[]);
    assert!(
        stderr.contains("nothing will be written") && stderr.contains("--requests-log"),
        "{stderr}"
    );
}

#[test]
fn replay_of_a_file_without_one_valid_line_fails() {
    let dir = tokentap_tests::scratch_dir("replay-invalid");
    let f = dir.join("not-a-capture.jsonl");
    std::fs::write(&f, "GET / HTTP/1.1\nnot json either\n").unwrap();
    let out = std::process::Command::new(tokentap_tests::tokentap_bin())
        .arg("replay")
        .arg(&f)
        .args(["--requests-log", "-"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("no line is a capture event"), "{stderr}");
}

#[test]
fn argument_errors_come_before_anything_nvml_says() {
    // A pid that does not exist is an argument error: said at once, before
    // the GPU sampler starts (and says the driver is missing). Probes on
    // (`--health-addr`): no privilege check first, so any user runs this.
    let out = RunAgent::new()
        .pid(999_999_999)
        .args(["--health-addr", "127.0.0.1:0"])
        .env("TOKENTAP_NVML_LIBRARY", "/nonexistent/libnvidia-ml.so.1")
        .command()
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("no process with pid 999999999"), "{stderr}");
    assert!(
        !stderr.contains("NVML") && !stderr.contains("GPU metrics off"),
        "NVML spoke before the argument error: {stderr}"
    );
}
