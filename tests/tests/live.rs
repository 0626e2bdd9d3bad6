//! End to end, as root: the simulated engine (`simengine`) answers 200
//! scripted requests (streamed with and without usage, non-streamed, 429s,
//! clients that disconnect mid-stream, three different write syscalls)
//! while `tokentap run` captures it. Every request must appear once in the
//! request log, with TTFT, TPOT and duration inside the interval the
//! engine's own clock brackets (its clock just before and just after each
//! syscall; on loopback a few µs wide unless the engine is preempted), and
//! exact token counts. t0 is the request's arrival at the socket; the
//! engine's read (its bracket) is t0 + `queue_s`, and the engine-side
//! intervals are the record's minus `queue_s`.

use std::{
    collections::HashMap, io::Write, net::TcpStream, path::Path, process::Command, time::Duration,
};

use serde_json::{json, Value};
use tokentap_tests::{
    assert_root, http, interrupt, logged,
    otlp::{assert_exports_match_log, Receiver},
    read_jsonl, scratch_dir, start, start_simengine, Netns, RunAgent,
};

const WRITERS: [&str; 3] = ["write", "writev", "send"];

fn spec(thread: usize, i: usize) -> Value {
    let n = thread * 1000 + i;
    let k = i % 20;
    let (status, stream, usage, tokens, gap) = match k {
        0 => (429, false, false, 1, 1),
        1 => (200, true, true, 40, 5), // the client disconnects after 3 chunks
        2 | 3 => (200, false, false, 2 + i % 9, 1),
        4..=9 => (200, true, false, 2 + (i * 3) % 15, 1 + i % 4),
        _ => (200, true, true, 2 + (i * 5) % 15, 1 + i % 4),
    };
    json!({
        "model": if thread.is_multiple_of(2) { "sim-a" } else { "sim-b" },
        "stream": stream,
        "stream_options": {"include_usage": usage},
        "messages": [{"role": "user", "content": "hello there"}],
        "sim": {"id": n, "status": status, "ttft_ms": 5 + (i * 7) % 25, "gap_ms": gap, "tokens": tokens,
                "write": WRITERS[i % 3]}
    })
}

/// Sends request `i` of client `thread` and reads its response; the
/// spec's disconnecting requests stop after 3 content chunks. Returns
/// whether the response was read whole.
fn exchange(s: &mut TcpStream, thread: usize, i: usize) -> bool {
    let body = spec(thread, i).to_string();
    s.write_all(http::post("/v1/chat/completions", "sim", &body).as_bytes())
        .expect("send request");
    let disconnect = i % 20 == 1;
    let r = http::read_response_until(s, |body| {
        disconnect
            && String::from_utf8_lossy(body)
                .matches("\"content\":\"tok")
                .count()
                >= 3
    })
    .expect("read response");
    r.complete
}

fn client(port: u16, thread: usize, n: usize) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    for i in 0..n {
        if !exchange(&mut s, thread, i) {
            http::abort(s);
            s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        }
    }
}

#[test]
#[ignore = "needs root: loads eBPF (cargo xtask test runs it as root)"]
fn two_hundred_scripted_requests_match_the_engines_clock() {
    assert_root("live run against simengine");
    let otlp = Receiver::start();
    let dir = scratch_dir("live");
    let truth_path = dir.join("truth.jsonl");
    let log_path = dir.join("requests.jsonl");
    let (engine, port, _) = start_simengine(
        Path::new(env!("CARGO_BIN_EXE_simengine")),
        &["--truth", truth_path.to_str().unwrap()],
    );
    let pid = engine.0.id();
    let (mut agent, agent_out) = RunAgent::new()
        .pid(pid)
        .otlp(otlp.port)
        .requests_log(&log_path)
        .start();

    let threads: Vec<_> = (0..4)
        .map(|t| std::thread::spawn(move || client(port, t, 50)))
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    std::thread::sleep(Duration::from_millis(300));
    let (ok, stderr) = interrupt(&mut agent, agent_out);
    assert!(ok, "tokentap run failed: {stderr:?}");
    drop(engine);

    let truth = read_jsonl(&truth_path);
    let records = read_jsonl(&log_path);
    assert_eq!(truth.len(), 200, "the engine answered every request");
    assert_eq!(
        records.len(),
        200,
        "every request appears once in the request log: {stderr:?}"
    );

    let mut by_client: HashMap<String, Vec<&Value>> = HashMap::new();
    for r in &records {
        by_client
            .entry(r["client"].as_str().unwrap_or("?").to_string())
            .or_default()
            .push(r);
    }
    // The engine brackets each instant between its clock just before a call
    // and just after it returned; the kernel's timestamp lies inside. A
    // difference of two instants therefore lies in [lo, hi] below. SLACK
    // covers the monotonic→wall-clock conversion.
    const SLACK: f64 = 200e-6;
    let br = |v: &Value| -> (f64, f64) {
        (
            v[0].as_u64().unwrap() as f64 / 1e9,
            v[1].as_u64().unwrap() as f64 / 1e9,
        )
    };
    let within = |what: &str, got: f64, lo: f64, hi: f64, t: &Value| {
        assert!(
            got >= lo - SLACK && got <= hi + SLACK,
            "{what} {got:.6} outside [{lo:.6}, {hi:.6}] for {t}"
        );
        (got - (lo + hi) / 2.0).abs()
    };
    // Every request's arrival was seen (its connection opened after the
    // agent started): t0 is the arrival, queue_s its wait before the read.
    for r in &records {
        assert_eq!(r["t0_source"], "arrival", "{r}");
        assert!(r["queue_s"].as_f64().unwrap() >= 0.0, "{r}");
    }
    let queue = |r: &Value| r["queue_s"].as_f64().unwrap_or(0.0);
    let mut used = std::collections::HashSet::new();
    let (mut dev_ttft, mut dev_tpot, mut dev_dur, mut widest) = (0f64, 0f64, 0f64, 0f64);
    for t in &truth {
        let client = t["client"].as_str().unwrap();
        let (read_lo, read_hi) = br(&t["read"]);
        // The record whose t0 is nearest the bracket (a request answered
        // in ~100 µs, like a 429, leaves the next one's read within SLACK
        // of its own).
        // t0 is the request's arrival; the engine brackets its read, which
        // the record gives as t0 + queue_s.
        let off_bracket = |r: &Value| {
            let t_read = r["t0_ns"].as_u64().unwrap() as f64 / 1e9 + queue(r);
            (read_lo - t_read).max(t_read - read_hi).max(0.0)
        };
        let r = by_client
            .get(client)
            .and_then(|rs| {
                rs.iter()
                    .copied()
                    .filter(|r| off_bracket(r) <= SLACK)
                    .min_by(|a, b| off_bracket(a).total_cmp(&off_bracket(b)))
            })
            .unwrap_or_else(|| panic!("no record whose t0 lies in the engine's read bracket: {t}"));
        assert!(
            used.insert((client.to_string(), r["t0_ns"].as_u64())),
            "two requests matched one record: {t}"
        );
        widest = widest.max(read_hi - read_lo);
        let id = t["id"].as_u64().unwrap();
        let s = spec(id as usize / 1000, id as usize % 1000);
        let tokens = t["tokens"].as_u64().unwrap();
        match (
            t["status"].as_u64().unwrap(),
            t["outcome"].as_str().unwrap(),
        ) {
            (429, _) => assert_eq!(r["error_type"], "http_429", "{r}"),
            (_, "client_disconnect") => assert_eq!(r["error_type"], "client_disconnect", "{r}"),
            _ => {
                assert_eq!(r["error_type"], Value::Null, "{r}");
                assert_eq!(r["output_tokens"], tokens, "{r}");
                assert_eq!(r["request_model"], s["model"]);
                let (end_lo, end_hi) = br(&t["end"]);
                dev_dur = dev_dur.max(within(
                    "duration",
                    r["duration_s"].as_f64().unwrap() - queue(r),
                    end_lo - read_hi,
                    end_hi - read_lo,
                    t,
                ));
                if t["stream"] == true {
                    assert_eq!(r["tokens_exact"], t["usage"], "{r}");
                    // With usage both counts are its; without, both are
                    // estimates (the simulated engine's prompt / 4, its
                    // chunks).
                    let source = if t["usage"] == true {
                        "usage"
                    } else {
                        "estimate"
                    };
                    assert_eq!(r["tokens_source"], source, "{r}");
                    assert_eq!(r["chunks"], tokens);
                    let (f_lo, f_hi) = br(&t["first"]);
                    let (l_lo, l_hi) = br(&t["last"]);
                    dev_ttft = dev_ttft.max(within(
                        "ttft",
                        r["ttft_s"].as_f64().unwrap() - queue(r),
                        f_lo - read_hi,
                        f_hi - read_lo,
                        t,
                    ));
                    if tokens > 1 {
                        let n = (tokens - 1) as f64;
                        dev_tpot = dev_tpot.max(within(
                            "tpot",
                            r["tpot_s"].as_f64().unwrap(),
                            (l_lo - f_hi) / n,
                            (l_hi - f_lo) / n,
                            t,
                        ));
                    }
                } else {
                    assert_eq!(r["tokens_exact"], true);
                    assert_eq!(r["tokens_source"], "usage", "{r}");
                    assert_eq!(r["stream"], false);
                }
            }
        }
    }
    eprintln!(
        "largest |agent − engine bracket midpoint|: ttft {:.1} µs, tpot {:.1} µs, duration {:.1} µs (widest read bracket {:.1} µs)",
        dev_ttft * 1e6,
        dev_tpot * 1e6,
        dev_dur * 1e6,
        widest * 1e6
    );
    // The exported histograms say what the request log says.
    let exports = otlp.metrics.exports();
    assert!(!exports.is_empty(), "no OTLP export arrived: {stderr:?}");
    assert_exports_match_log(&exports, &records);
    // Every value lay inside the engine's bracket (checked above), so the
    // agent is never further from the truth than the bracket is wide; the
    // midpoint deviations printed are dominated by the engine being
    // preempted mid-call on a 2-core machine.
    let _ = Path::new("");
}

#[test]
#[ignore = "needs root: loads eBPF (cargo xtask test runs it as root)"]
fn run_without_targets_finds_an_engine_by_its_command_line() {
    assert_root("discovery");
    let dir = scratch_dir("discover");
    let log_path = dir.join("requests.jsonl");
    // The simulated engine, named like llama.cpp's server on its command line.
    let (engine, port, _) = start_simengine(
        Path::new(env!("CARGO_BIN_EXE_simengine")),
        &["--label", "llama-server"],
    );
    let (mut agent, agent_out) = RunAgent::new().requests_log(&log_path).start();
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    for i in 0..3 {
        assert!(exchange(&mut s, 0, 10 + i));
    }
    std::thread::sleep(Duration::from_millis(300));
    let (ok, stderr) = interrupt(&mut agent, agent_out);
    assert!(ok, "tokentap run failed: {stderr:?}");
    let found = format!("found llama.cpp (pid {})", engine.0.id());
    assert!(stderr.iter().any(|l| l.contains(&found)), "{stderr:?}");
    let recs = read_jsonl(&log_path);
    assert_eq!(recs.len(), 3, "{stderr:?}");
    for r in &recs {
        assert_eq!(r["provider"], "llama.cpp");
        assert_eq!(r["server_port"], port);
    }
}

/// Starts simengine on 0.0.0.0:`port` inside `ns`; returns it and its pid.
fn engine_in(ns: &Netns, port: u16, truth: &Path) -> (tokentap_tests::Running, u32) {
    let (engine, _) = start(
        ns.command(Path::new(env!("CARGO_BIN_EXE_simengine")))
            .args(["--port", &port.to_string(), "--addr", "0.0.0.0"])
            .arg("--truth")
            .arg(truth),
        "listening",
        "simengine in its network namespace",
    );
    let pid = engine.0.id();
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    assert_eq!(
        comm.trim(),
        "simengine",
        "ip netns exec ran the engine in place"
    );
    (engine, pid)
}

/// Sends requests tagged `model` over one connection until one of them is
/// in the request log with the engine's `pid` (the agent has found the
/// engine); returns how long that took.
fn until_recorded(addr: &str, port: u16, log: &Path, pid: u32, model: &str) -> Duration {
    let t = std::time::Instant::now();
    let mut s = TcpStream::connect((addr, port)).expect("connect to the engine");
    loop {
        let body = json!({"model": model, "stream": true, "sim": {"ttft_ms": 1, "gap_ms": 1, "tokens": 2}});
        let r = http::round_trip(&mut s, "/v1/chat/completions", &body.to_string())
            .expect("probe request");
        assert!(r.complete);
        if logged(log)
            .iter()
            .any(|r| r["request_model"] == model && r["pid"] == pid)
        {
            return t.elapsed();
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the agent did not record requests to the engine (pid {pid}) within 30 s"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `n` streamed requests tagged `model`, each with a distinct token count.
fn send_tagged(addr: &str, port: u16, model: &str, n: usize) {
    let mut s = TcpStream::connect((addr, port)).expect("connect to the engine");
    for i in 0..n {
        let body = json!({"model": model, "stream": true, "stream_options": {"include_usage": true},
            "sim": {"id": i, "ttft_ms": 2, "gap_ms": 1, "tokens": 2 + i}});
        let r =
            http::round_trip(&mut s, "/v1/chat/completions", &body.to_string()).expect("request");
        assert!(r.complete && r.status() == Some(200));
    }
}

#[test]
#[ignore = "needs root: loads eBPF and creates a network namespace (cargo xtask test runs it as root)"]
fn an_engine_in_its_own_network_namespace_started_after_the_agent_and_restarted_is_recorded() {
    assert_root("engine in a network namespace");
    const N: usize = 12;
    let dir = scratch_dir("netns");
    let log = dir.join("requests.jsonl");
    let port = tokentap_tests::free_port();
    let ns = Netns::create("tt", 213);

    // The agent first, with only a port: nothing listens on it yet.
    let (mut agent, agent_out) = start(
        &mut RunAgent::new().port(port).requests_log(&log).command(),
        "waiting for a listener on port",
        "tokentap run",
    );
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        agent.0.try_wait().expect("try_wait").is_none(),
        "the agent must wait for the engine, not exit"
    );

    // The engine, started after the agent, in its own network namespace.
    let (engine1, pid1) = engine_in(&ns, port, &dir.join("truth1.jsonl"));
    let found1 = until_recorded(&ns.ns_addr, port, &log, pid1, "probe-1");
    send_tagged(&ns.ns_addr, port, "netns-a", N);

    // Killed and restarted on the same port in the same namespace.
    drop(engine1);
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        agent.0.try_wait().expect("try_wait").is_none(),
        "the agent must outlive the engine it watches"
    );
    let (engine2, pid2) = engine_in(&ns, port, &dir.join("truth2.jsonl"));
    assert_ne!(pid1, pid2);
    let found2 = until_recorded(&ns.ns_addr, port, &log, pid2, "probe-2");
    send_tagged(&ns.ns_addr, port, "netns-b", N);

    std::thread::sleep(Duration::from_millis(1500));
    let (ok, stderr) = interrupt(&mut agent, agent_out);
    assert!(ok, "tokentap run failed: {stderr:?}");
    drop(engine2);
    eprintln!(
        "the agent recorded the engine {:.0} ms after it started, the restarted one after {:.0} ms",
        found1.as_secs_f64() * 1e3,
        found2.as_secs_f64() * 1e3
    );

    let records = read_jsonl(&log);
    for (model, pid, truth) in [
        ("netns-a", pid1, "truth1.jsonl"),
        ("netns-b", pid2, "truth2.jsonl"),
    ] {
        let mine: Vec<&Value> = records
            .iter()
            .filter(|r| r["request_model"] == model)
            .collect();
        assert_eq!(
            mine.len(),
            N,
            "every {model} request is in the request log once: {stderr:?}"
        );
        for (i, r) in mine.iter().enumerate() {
            assert_eq!(r["pid"], pid, "{r}");
            assert_eq!(r["server_port"], port, "{r}");
            assert_eq!(r["error_type"], Value::Null, "{r}");
            assert_eq!(r["output_tokens"], (2 + i) as u64, "in order: {r}");
            assert_eq!(r["tokens_exact"], true, "{r}");
            assert!(
                r["client"]
                    .as_str()
                    .is_some_and(|c| c.starts_with(&format!("{}:", ns.host_addr))),
                "the client as the engine's namespace sees it: {r}"
            );
            assert!(r["ttft_s"].as_f64().is_some(), "{r}");
        }
        // Nothing beyond what this engine answered is attributed to it, and
        // everything after the agent first saw it is there (its truth
        // file has the probes sent before that, too).
        let answered = read_jsonl(&dir.join(truth)).len();
        let attributed = records.iter().filter(|r| r["pid"] == pid).count();
        assert!(
            attributed <= answered && attributed > N,
            "{attributed} records for pid {pid}, which answered {answered} requests"
        );
    }
}

#[test]
#[ignore = "needs root: loads eBPF (cargo xtask test runs it as root)"]
fn an_engine_started_after_the_agent_is_found_from_its_exec_within_seconds() {
    assert_root("discovery after start");
    let dir = scratch_dir("discover-late");
    let log_path = dir.join("requests.jsonl");
    let (mut agent, agent_out) = RunAgent::new().requests_log(&log_path).start();
    // Let the first full scan pass, so only the exec event can find it
    // before the next one (5 s later).
    std::thread::sleep(Duration::from_millis(1500));
    let (engine, port, _) = start_simengine(
        Path::new(env!("CARGO_BIN_EXE_simengine")),
        &["--label", "llama-server"],
    );
    let listening = std::time::Instant::now();
    let found = format!("found pid {}", engine.0.id());
    let mut lines = vec![];
    let latency = loop {
        match agent_out.recv_timeout(Duration::from_secs(10)) {
            Ok(l) if l.contains(&found) => break listening.elapsed(),
            Ok(l) => lines.push(l),
            Err(_) => panic!("the engine was not found within 10 s: {lines:?}"),
        }
    };
    eprintln!("engine found {latency:?} after it listened");
    assert!(
        latency < Duration::from_millis(3500),
        "found only after {latency:?}: the exec event should find it within ~1 s (the full rescan runs every 5 s)"
    );
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    assert!(exchange(&mut s, 0, 30));
    std::thread::sleep(Duration::from_millis(300));
    let (ok, stderr) = interrupt(&mut agent, agent_out);
    assert!(ok, "tokentap run failed: {stderr:?}");
    let recs = read_jsonl(&log_path);
    assert_eq!(recs.len(), 1, "{stderr:?}");
    assert_eq!(recs[0]["provider"], "llama.cpp");
    assert_eq!(recs[0]["pid"], engine.0.id());
}

#[test]
#[ignore = "needs root: loads eBPF (cargo xtask test runs it as root)"]
fn a_pid_whose_tree_never_listens_gets_one_clear_warning() {
    assert_root("pid without listener");
    let mut idle = tokentap_tests::Running(
        Command::new("sh")
            .args(["-c", "sleep 60 & wait"])
            .spawn()
            .expect("spawn sh"),
    );
    let (mut agent, agent_out) = RunAgent::new().pid(idle.0.id()).start();
    std::thread::sleep(Duration::from_secs(13));
    let (ok, stderr) = interrupt(&mut agent, agent_out);
    let _ = idle.0.kill();
    assert!(ok, "tokentap run failed: {stderr:?}");
    let warnings: Vec<_> = stderr
        .iter()
        .filter(|l| l.contains("listens on a TCP port"))
        .collect();
    assert_eq!(warnings.len(), 1, "exactly one warning: {stderr:?}");
    assert!(warnings[0].contains(&format!("--pid [{}]", idle.0.id())));
}
