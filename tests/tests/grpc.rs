//! HTTP/2 and gRPC against real peers, as root, the engine in its own
//! network namespace:
//!
//! (a) a Triton-compatible gRPC server (tritonclient's
//!     `GRPCInferenceService` stubs, `tests/peers/triton_server.py`) whose
//!     client (`tritonclient.grpc`'s streaming client) opened its channel
//!     and `ModelStreamInfer` stream **before** the agent started: every
//!     later request on that stream is recorded with its model, `id`,
//!     token count and TTFT;
//! (b) the same, with each later batch on a new channel;
//! (c) Hypercorn serving an OpenAI-style app over h2c to the `openai` SDK
//!     on httpx's HTTP/2 client, three streams at once on one connection:
//!     records exact, never mixed.
//!
//! Ground truth is the servers' own log (`recv` when a request reached the
//! handler, `send` right before each response was handed to the stack):
//! the agent's first-token write (t0 + TTFT) must match the server's first
//! output `send` within 1 ms p99, its token count the server's outputs.
//! The client's times are printed beside them (grpcio and httpx queue
//! between the socket and the caller, so they are not compared).

use std::{
    collections::HashMap,
    io::{BufRead, BufReader, Write},
    path::Path,
    process::{Child, ChildStdin, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use serde_json::Value;
use tokentap_tests::{
    assert_root, interrupt,
    peers::{free_port, quantile, Peers},
    read_jsonl, scratch_dir, start, Netns, RunAgent, Running,
};

fn python(peers: &Peers, script: &str) -> Command {
    let mut c = Command::new(peers.dir.join(".venv/bin/python"));
    c.arg(peers.dir.join(script)).env("PYTHONUNBUFFERED", "1");
    c
}

/// A client in a hold mode: `HELD` once its connection is open, then one
/// `go K` → `DONE` per batch.
struct Held {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
}

impl Held {
    fn start(mut cmd: Command) -> Held {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the client");
        let stdin = child.stdin.take().unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let mut h = Held {
            child,
            stdin,
            lines,
        };
        h.wait_for("HELD");
        h
    }

    fn wait_for(&mut self, word: &str) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let l = self
                .lines
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                .unwrap_or_else(|_| panic!("the client never said {word}"));
            if l.trim() == word {
                return;
            }
        }
    }

    fn go(&mut self, k: usize) {
        writeln!(self.stdin, "go {k}").unwrap();
        self.stdin.flush().unwrap();
        self.wait_for("DONE");
    }

    fn quit(mut self) {
        let _ = writeln!(self.stdin, "quit");
        let _ = self.stdin.flush();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if self.child.try_wait().unwrap().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
    }
}

fn agent(dir: &Path, port: u16) -> (Running, mpsc::Receiver<String>) {
    let run = RunAgent::new()
        .no_gpu()
        .port(port)
        .requests_log(&dir.join("requests.jsonl"))
        .arg("--log-all-requests");
    start(&mut run.command(), "ready", "tokentap run")
}

/// The server's account per request id: when its first output was sent,
/// when its last response was sent, how many responses carried output.
struct Truth {
    first_send: u64,
    outputs: u64,
}

fn truth(log: &Path) -> HashMap<String, Truth> {
    let mut t: HashMap<String, Truth> = HashMap::new();
    for l in read_jsonl(log) {
        if l["ev"] != "send" || l["output"] != true {
            continue;
        }
        let id = l["id"].as_str().unwrap().to_string();
        let ts = l["t_ns"].as_u64().unwrap();
        let e = t.entry(id).or_insert(Truth {
            first_send: ts,
            outputs: 0,
        });
        e.first_send = e.first_send.min(ts);
        e.outputs += 1;
    }
    t
}

/// Compares the agent's records of `ids` with the server's log; returns
/// |t1 − first send| in ms per request.
fn compare(
    records: &[Value],
    ids: &[String],
    truth: &HashMap<String, Truth>,
    model: &str,
) -> Vec<f64> {
    let mut diffs = vec![];
    for id in ids {
        let r = records
            .iter()
            .find(|r| r["request_id"] == id.as_str())
            .unwrap_or_else(|| panic!("request {id} not recorded: {records:#?}"));
        let t = &truth[id];
        assert_eq!(r["request_model"], model, "{r}");
        assert_eq!(r["protocol"], "grpc", "{r}");
        assert_eq!(r["error_type"], Value::Null, "{r}");
        assert_eq!(r["output_tokens"].as_u64(), Some(t.outputs), "{id}: {r}");
        let t1 = r["t0_ns"].as_u64().unwrap() + (r["ttft_s"].as_f64().unwrap() * 1e9) as u64;
        let d = (t1 as f64 - t.first_send as f64) / 1e6;
        println!(
            "{id}: ttft {:.3} ms (t0 {}), first output written {:+.3} ms after the server's send",
            r["ttft_s"].as_f64().unwrap() * 1e3,
            r["t0_source"],
            d
        );
        diffs.push(d.abs());
    }
    diffs
}

fn triton(new_channel: bool) {
    let test = if new_channel {
        "grpc_triton_new_channel"
    } else {
        "grpc_triton_stream_open_before_agent"
    };
    assert_root(test);
    let peers = Peers::installed(test);
    let dir = scratch_dir(test);
    let ns = Netns::create(
        if new_channel { "ttgn" } else { "ttgs" },
        if new_channel { 217 } else { 216 },
    );
    let port = free_port();
    let log = dir.join("server.jsonl");
    let mut server = ns.command(peers.dir.join(".venv/bin/python"));
    server
        .arg(peers.dir.join("triton_server.py"))
        .args(["--host", "0.0.0.0", "--port", &port.to_string()])
        .arg("--log")
        .arg(&log)
        .env("PYTHONUNBUFFERED", "1");
    let (_server, _server_out) = start(&mut server, "READY", "triton_server.py");
    let mut client = python(&peers, "triton_client.py");
    client
        .args(["--url", &format!("{}:{port}", ns.ns_addr)])
        .args(["--plan", if new_channel { "hold-new" } else { "hold" }])
        .args(["--empty-final", "alternate"])
        .arg("--out")
        .arg(dir.join("client.jsonl"));
    let mut held = Held::start(client);
    // The channel and its stream are open: now the agent starts.
    let (mut tt, tt_out) = agent(&dir, port);
    std::thread::sleep(Duration::from_millis(500));
    held.go(4);
    held.go(3);
    held.quit();
    std::thread::sleep(Duration::from_millis(1500));
    let (ok, lines) = interrupt(&mut tt, tt_out);
    assert!(ok, "agent failed: {lines:#?}");
    let records = read_jsonl(&dir.join("requests.jsonl"));
    let client: Vec<Value> = read_jsonl(&dir.join("client.jsonl"));
    let ids: Vec<String> = client
        .iter()
        .filter_map(|c| c["id"].as_str())
        .filter(|id| *id != "r1")
        .map(str::to_string)
        .collect();
    assert_eq!(ids.len(), 7, "{client:#?}");
    let truth = truth(&log);
    let diffs = compare(&records, &ids, &truth, "llm");
    let p99 = quantile(&diffs, 0.99);
    println!(
        "{test}: |t1 − server send| p99 {p99:.3} ms over {}",
        diffs.len()
    );
    assert!(
        p99 <= 1.0,
        "first-token write vs the server's send: p99 {p99:.3} ms"
    );
    // The agent's own account: no connection lost its way.
    let decode = tokentap_tests::shutdown(&lines).decode;
    println!("{decode}");
    assert_eq!(decode["desyncs"], 0, "{decode}");
}

#[test]
#[ignore = "needs root and the real peers (cargo xtask test installs them and runs it as root)"]
fn grpc_triton_stream_open_before_the_agent_is_recorded_request_by_request() {
    triton(false);
}

#[test]
#[ignore = "needs root and the real peers (cargo xtask test installs them and runs it as root)"]
fn grpc_triton_new_channels_after_the_agent_started_are_recorded() {
    triton(true);
}

#[test]
#[ignore = "needs root and the real peers (cargo xtask test installs them and runs it as root)"]
fn h2_three_concurrent_streams_from_the_openai_sdk_are_recorded_exactly() {
    let test = "h2_concurrent_streams";
    assert_root(test);
    let peers = Peers::installed(test);
    let dir = scratch_dir(test);
    let ns = Netns::create("tth2", 218);
    let port = free_port();
    // The agent first, then the engine (as in a pod started after it).
    let (mut tt, tt_out) = agent(&dir, port);
    let log = dir.join("server.jsonl");
    let mut server = ns.command(peers.dir.join(".venv/bin/python"));
    server
        .arg(peers.dir.join("h2_app.py"))
        .args(["--host", "0.0.0.0", "--port", &port.to_string()])
        .arg("--log")
        .arg(&log)
        .env("PYTHONUNBUFFERED", "1");
    let (_server, _server_out) = start(&mut server, "READY", "h2_app.py");
    std::thread::sleep(Duration::from_millis(1500));
    let out = dir.join("client.jsonl");
    for round in 0..3 {
        let st = python(&peers, "h2_client.py")
            .args(["--base-url", &format!("http://{}:{port}/v1", ns.ns_addr)])
            .args(["--concurrent", "3", "--tag-prefix", &format!("h2r{round}-")])
            .arg("--out")
            .arg(&out)
            .status()
            .unwrap();
        assert!(st.success(), "h2_client.py round {round}");
    }
    std::thread::sleep(Duration::from_millis(1500));
    let (ok, lines) = interrupt(&mut tt, tt_out);
    assert!(ok, "agent failed: {lines:#?}");
    let decode = tokentap_tests::shutdown(&lines).decode;
    assert_eq!(decode["desyncs"], 0, "{decode}");
    let records = read_jsonl(&dir.join("requests.jsonl"));
    let client = read_jsonl(&out);
    assert_eq!(client.len(), 9);
    let sends: HashMap<String, (u64, u64)> = {
        let mut m: HashMap<String, (u64, u64)> = HashMap::new();
        for l in read_jsonl(&log) {
            if l["ev"] == "send" && l["kind"] == "token" {
                let id = l["id"].as_str().unwrap().to_string();
                let ts = l["t_ns"].as_u64().unwrap();
                let e = m.entry(id).or_insert((ts, 0));
                e.0 = e.0.min(ts);
                e.1 += 1;
            }
        }
        m
    };
    let mut diffs = vec![];
    let mut ports = std::collections::HashSet::new();
    for c in &client {
        let tag = c["model"].as_str().unwrap();
        let id = c["id"].as_str().unwrap();
        ports.insert(c["local_port"].as_u64());
        let mine: Vec<&Value> = records
            .iter()
            .filter(|r| r["request_model"] == tag)
            .collect();
        let [r] = mine.as_slice() else {
            panic!(
                "{tag}: recorded {} times, want once: {records:#?}",
                mine.len()
            )
        };
        assert_eq!(r["protocol"], "h2", "{r}");
        assert_eq!(r["request_id"], id, "{r}");
        assert_eq!(r["response_model"], tag, "never mixed between streams: {r}");
        assert_eq!(r["error_type"], Value::Null, "{r}");
        assert_eq!(r["output_tokens"], c["usage"]["completion_tokens"], "{r}");
        assert_eq!(r["input_tokens"], c["usage"]["prompt_tokens"], "{r}");
        assert_eq!(r["tokens_exact"], true, "{r}");
        let (first, n) = sends[id];
        assert_eq!(r["chunks"].as_u64(), Some(n), "{r}");
        let t1 = r["t0_ns"].as_u64().unwrap() + (r["ttft_s"].as_f64().unwrap() * 1e9) as u64;
        let d = (t1 as f64 - first as f64) / 1e6;
        println!(
            "{tag}: ttft {:.3} ms, client ttft_rx {:.3} ms, first chunk written {d:+.3} ms after the app's send",
            r["ttft_s"].as_f64().unwrap() * 1e3,
            c["ttft_rx_s"].as_f64().unwrap_or(f64::NAN) * 1e3
        );
        diffs.push(d.abs());
    }
    assert_eq!(
        ports.len(),
        3,
        "one connection per round, three streams each"
    );
    let p99 = quantile(&diffs, 0.99);
    println!(
        "{test}: |t1 − app send| p99 {p99:.3} ms over {}",
        diffs.len()
    );
    assert!(p99 <= 1.0, "p99 {p99:.3} ms");
}
