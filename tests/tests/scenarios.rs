//! The five situations timeline events exist for, end to end as root: the
//! real agent (started first, `--port`, engines in their own network
//! namespaces) against the simulated engine, events read from
//! `--events-log`.
//!
//! 1. new model launch: a second engine with a new version → its requests
//!    carry it; `model_version.new` and `model_version.rollout`;
//! 2. rollback: the old version comes back → `model_version.rollback`; the
//!    two versions' metrics stay apart (OTLP), events also arrive as OTLP
//!    log records;
//! 3. caller scale-up: one tenant multiplies its concurrency →
//!    `caller.surge` names it, with the TTFT rise in its window;
//! 4. permission change: a tenant starts getting 403 → `caller.error_burst`
//!    with `error.type = http_401_403`;
//! 5. anomaly investigation: one tenant times out and retries, another's
//!    prompts grow → `caller.retry_storm` and `tokens.drift` name them, and
//!    no event but its `caller.new` names the well-behaved tenant.

use std::{
    io::Write,
    net::TcpStream,
    path::Path,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use serde_json::{json, Value};
use tokentap_tests::{
    assert_root, free_port, http, interrupt, logged,
    otlp::{histogram_counts_by, Receiver},
    read_jsonl, scratch_dir, start, Netns, RunAgent, Running,
};

const EVENTS_CONFIG: &str = "[events]\nwindow_s = 1\ngrace_s = 0.3\nwarmup_windows = 3\nrollback_idle_s = 1\nretry_storm_min = 5\ndrift_baseline_requests = 30\ndrift_window_requests = 15\ndrift_hold_s = 0.5\n";

/// The simulated engine on 0.0.0.0:`port` inside `ns`, with `env`.
fn engine(ns: &Netns, port: u16, env: &[(&str, &str)]) -> Running {
    let (e, out) = start(
        ns.command(Path::new(env!("CARGO_BIN_EXE_simengine")))
            .args(["--addr", "0.0.0.0", "--port", &port.to_string(), "vllm-sim"])
            .envs(env.iter().copied()),
        "listening",
        "simengine",
    );
    drop(out);
    e
}

fn agent(dir: &Path, port: u16, extra: &[String]) -> (Running, std::sync::mpsc::Receiver<String>) {
    let cfg = dir.join("tokentap.toml");
    std::fs::write(&cfg, EVENTS_CONFIG).unwrap();
    let salt = dir.join("salt");
    std::fs::write(&salt, "scenario-salt").unwrap();
    let run = RunAgent::new()
        .port(port)
        .no_gpu()
        .arg("--config")
        .arg(&cfg)
        .requests_log(&dir.join("requests.jsonl"))
        .events_log(&dir.join("events.jsonl"))
        .args(["--tenant-header", "X-Tenant-ID"])
        .arg("--api-key-salt-file")
        .arg(&salt)
        .args(extra);
    start(&mut run.command(), "ready", "tokentap run")
}

/// One request on `s` for `tenant`; the response's status.
fn send(s: &mut TcpStream, tenant: &str, body: &Value) -> std::io::Result<u16> {
    let b = body.to_string();
    s.write_all(
        http::post_with_headers("/v1/chat/completions", "t", &[("X-Tenant-ID", tenant)], &b)
            .as_bytes(),
    )?;
    let r = http::read_response(s)?;
    Ok(r.status().unwrap_or(0))
}

fn chat(id: u64, sim: Value) -> Value {
    json!({"model": "sim-a", "stream": true, "stream_options": {"include_usage": true},
        "messages": [{"role": "user", "content": format!("question {id}")}], "sim": sim})
}

/// Sends to `addr` until the agent has recorded a request from engine pid
/// `pid`, then `n` more; returns the pids' records' count.
fn serve_phase(addr: &str, log: &Path, pid: u32, n: u64, tag: &str) {
    let t = Instant::now();
    let mut s = TcpStream::connect(addr).expect("connect to the engine");
    let sim = json!({"ttft_ms": 2, "gap_ms": 1, "tokens": 3});
    let mut i = 0;
    while !logged(log).iter().any(|r| r["pid"] == pid) {
        assert_eq!(send(&mut s, tag, &chat(i, sim.clone())).unwrap(), 200);
        i += 1;
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the agent did not record requests of pid {pid} within 30 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    for k in 0..n {
        assert_eq!(
            send(&mut s, tag, &chat(1000 + k, sim.clone())).unwrap(),
            200
        );
    }
}

fn events_of<'a>(ev: &'a [Value], kind: &str) -> Vec<&'a Value> {
    ev.iter().filter(|e| e["kind"] == kind).collect()
}

#[test]
#[ignore = "needs root: eBPF, network namespaces (cargo xtask test runs it as root)"]
fn new_model_launch_then_rollback_gives_new_rollout_rollback_and_separate_metrics() {
    assert_root("scenarios: launch and rollback");
    let dir = scratch_dir("scenario-rollout");
    let otlp = Receiver::start();
    let port = free_port();
    let (mut tt, tt_out) = agent(
        &dir,
        port,
        &[
            "--export-interval".into(),
            "1".into(),
            "--otlp-endpoint".into(),
            otlp.endpoint(),
        ],
    );
    let log = dir.join("requests.jsonl");
    let ns1 = Netns::create("tsa", 61);
    let ns2 = Netns::create("tsb", 62);
    let a_addr = format!("{}:{port}", ns1.ns_addr);
    let b_addr = format!("{}:{port}", ns2.ns_addr);

    // 1. v1 serving, then v2 launched in another pod, then v1 retired.
    let mut a = engine(&ns1, port, &[("TOKENTAP_MODEL_VERSION", "rel-1")]);
    let a_pid = a.0.id();
    serve_phase(&a_addr, &log, a_pid, 5, "app");
    let mut b = engine(&ns2, port, &[("TOKENTAP_MODEL_VERSION", "rel-2")]);
    let b_pid = b.0.id();
    serve_phase(&b_addr, &log, b_pid, 5, "app");
    a.0.kill().unwrap();
    a.0.wait().unwrap();
    serve_phase(&b_addr, &log, b_pid, 5, "app");

    // 2. v2 withdrawn; v1 comes back (after rollback_idle_s without v1).
    b.0.kill().unwrap();
    b.0.wait().unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let a2 = engine(&ns1, port, &[("TOKENTAP_MODEL_VERSION", "rel-1")]);
    let a2_pid = a2.0.id();
    serve_phase(&a_addr, &log, a2_pid, 5, "app");
    std::thread::sleep(Duration::from_millis(2500)); // a tick and an export
    let (ok, out) = interrupt(&mut tt, tt_out);
    assert!(ok, "agent failed: {out:#?}");
    drop(a2);

    let recs = read_jsonl(&log);
    let ev = read_jsonl(&dir.join("events.jsonl"));
    let show = || {
        ev.iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    };
    for r in &recs {
        let want = if r["pid"] == b_pid { "rel-2" } else { "rel-1" };
        assert_eq!(r["model_version"], want, "{r}");
    }
    let kinds: Vec<(&str, &str)> = ev
        .iter()
        .filter(|e| e["kind"].as_str().unwrap().starts_with("model_version."))
        .map(|e| {
            (
                e["kind"].as_str().unwrap(),
                e["attributes"]["tokentap.model.version"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        kinds,
        [
            ("model_version.new", "rel-1"),
            ("model_version.new", "rel-2"),
            ("model_version.rollout", "rel-2"),
            ("model_version.rollback", "rel-1"),
        ],
        "events:\n{}",
        show()
    );
    let rollout = events_of(&ev, "model_version.rollout")[0];
    assert_eq!(
        rollout["attributes"]["tokentap.model.version.previous"],
        "rel-1"
    );
    assert_eq!(rollout["attributes"]["gen_ai.request.model"], "sim-a");
    let rollback = events_of(&ev, "model_version.rollback")[0];
    assert_eq!(
        rollback["attributes"]["tokentap.model.version.previous"],
        "rel-2"
    );
    // Each engine's start, and the stops of the two that were killed.
    let pids = |kind: &str| -> Vec<u64> {
        events_of(&ev, kind)
            .iter()
            .map(|e| e["attributes"]["process.pid"].as_u64().unwrap())
            .collect()
    };
    assert_eq!(
        pids("engine.start"),
        [a_pid as u64, b_pid as u64, a2_pid as u64],
        "{}",
        show()
    );
    assert_eq!(
        pids("engine.stop"),
        [a_pid as u64, b_pid as u64],
        "{}",
        show()
    );
    for e in &ev {
        for k in ["ts", "kind", "message", "attributes"] {
            assert!(!e[k].is_null(), "{k} missing: {e}");
        }
    }

    // The versions' metrics stay apart: request counts per version in the
    // OTLP export equal the request log's.
    let by_version = histogram_counts_by(
        &otlp.metrics.exports(),
        "gen_ai.server.request.duration",
        "tokentap.model.version",
    );
    let count = |v: &str| recs.iter().filter(|r| r["model_version"] == v).count() as u64;
    assert_eq!(
        by_version.get("rel-1"),
        Some(&count("rel-1")),
        "{by_version:?}"
    );
    assert_eq!(
        by_version.get("rel-2"),
        Some(&count("rel-2")),
        "{by_version:?}"
    );

    // Every event also went out as an OTLP log record.
    let mut got: Vec<String> = otlp.logs.records().into_iter().map(|(k, _, _)| k).collect();
    let mut want: Vec<String> = ev
        .iter()
        .map(|e| e["kind"].as_str().unwrap().to_string())
        .collect();
    got.sort();
    want.sort();
    assert_eq!(got, want, "OTLP log records vs the events log");
}

/// A client loop until `stop`: `conc` connections of `tenant`, each sending
/// `body(i)` back to back with `pause` between.
fn clients(
    addr: &str,
    tenant: &'static str,
    conc: usize,
    pause: Duration,
    stop: Arc<AtomicBool>,
    body: impl Fn(u64) -> Value + Send + Sync + 'static,
) -> Vec<std::thread::JoinHandle<u64>> {
    let body = Arc::new(body);
    (0..conc)
        .map(|c| {
            let (addr, stop, body) = (addr.to_string(), stop.clone(), body.clone());
            std::thread::spawn(move || {
                let mut s = TcpStream::connect(&addr).expect("connect");
                let mut n = 0u64;
                while !stop.load(Ordering::SeqCst) {
                    let _ = send(&mut s, tenant, &body(c as u64 * 1_000_000 + n));
                    n += 1;
                    std::thread::sleep(pause);
                }
                n
            })
        })
        .collect()
}

#[test]
#[ignore = "needs root: eBPF, network namespaces (cargo xtask test runs it as root)"]
fn surge_permission_change_retry_storm_and_drift_name_the_right_tenants_only() {
    assert_root("scenarios: callers");
    let dir = scratch_dir("scenario-callers");
    let port = free_port();
    let (mut tt, tt_out) = agent(&dir, port, &[]);
    let log = dir.join("requests.jsonl");
    let ns = Netns::create("tsc", 63);
    let _engine = engine(&ns, port, &[]);
    let addr = format!("{}:{port}", ns.ns_addr);
    serve_phase(&addr, &log, _engine.0.id(), 0, "probe");
    // The engine queues: 3 ms more TTFT per request it is already answering.
    let sim = |status: u64, ttft: u64, prompt: u64| {
        json!({"ttft_ms": ttft, "gap_ms": 2, "tokens": 4, "status": status,
            "prompt_tokens": prompt, "queue_ms_per_inflight": 3})
    };
    let t0 = Instant::now();
    let since = move || t0.elapsed().as_secs_f64();
    let stop = Arc::new(AtomicBool::new(false));
    let mut threads = vec![];
    // Well-behaved: one connection, a request every 100 ms, same sizes.
    threads.extend(clients(
        &addr,
        "steady",
        1,
        Duration::from_millis(100),
        stop.clone(),
        move |i| chat(i, sim(200, 20, 800)),
    ));
    // Prompts of ~1000 tokens, growing 4 % a request after 4 s (RAG recall
    // creeping up), at a flat rate.
    threads.extend(clients(
        &addr,
        "rag-app",
        1,
        Duration::from_millis(100),
        stop.clone(),
        move |i| {
            let t = since();
            let grown = if t > 4.0 {
                1.04f64.powf((t - 4.0) * 10.0)
            } else {
                1.0
            };
            let prompt =
                (1000.0 * grown * (0.97 + 0.06 * ((i * 7919) % 100) as f64 / 100.0)) as u64;
            let mut b = chat(i, sim(200, 20, prompt));
            b["messages"][0]["content"] = json!("ctx ".repeat(prompt as usize / 4));
            b
        },
    ));
    // Its key is revoked at 4.5 s: 403 from then on.
    threads.extend(clients(
        &addr,
        "billing",
        1,
        Duration::from_millis(50),
        stop.clone(),
        move |i| {
            let status = if since() > 4.5 { 403 } else { 200 };
            chat(i, sim(status, 20, 300))
        },
    ));
    // One connection until 5 s, then ten (a scale-up).
    threads.extend(clients(
        &addr,
        "scaler",
        1,
        Duration::ZERO,
        stop.clone(),
        move |i| chat(i, sim(200, 20, 500)),
    ));
    let stop_scale = Arc::new(AtomicBool::new(false));
    // Until 5 s well-behaved; then each request times out on the client
    // (the engine is slow for it) and is retried 4 times at once.
    let retry_stop = stop.clone();
    let retry_addr = addr.clone();
    let retrier = std::thread::spawn(move || {
        let mut s = TcpStream::connect(&retry_addr).unwrap();
        let mut i = 0u64;
        while since() < 5.0 {
            let _ = send(&mut s, "mobile", &chat(i, sim(200, 20, 400)));
            i += 1;
            std::thread::sleep(Duration::from_millis(100));
        }
        let storm: Vec<_> = (0..3u64)
            .map(|c| {
                let (addr, stop) = (retry_addr.clone(), retry_stop.clone());
                std::thread::spawn(move || {
                    let mut j = 0u64;
                    while !stop.load(Ordering::SeqCst) && since() < 8.0 {
                        let body = chat(5_000_000 + c * 1000 + j, sim(200, 600, 400));
                        for _attempt in 0..4 {
                            let mut s = TcpStream::connect(&addr).unwrap();
                            s.set_read_timeout(Some(Duration::from_millis(150)))
                                .unwrap();
                            let _ = send(&mut s, "mobile", &body);
                        }
                        j += 1;
                    }
                })
            })
            .collect();
        for t in storm {
            t.join().unwrap();
        }
    });
    while since() < 5.0 {
        std::thread::sleep(Duration::from_millis(20));
    }
    let surge = clients(
        &addr,
        "scaler",
        9,
        Duration::ZERO,
        stop_scale.clone(),
        move |i| chat(i, sim(200, 20, 500)),
    );
    while since() < 8.0 {
        std::thread::sleep(Duration::from_millis(20));
    }
    stop_scale.store(true, Ordering::SeqCst);
    for t in surge {
        t.join().unwrap();
    }
    while since() < 10.0 {
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, Ordering::SeqCst);
    for t in threads {
        t.join().unwrap();
    }
    retrier.join().unwrap();
    std::thread::sleep(Duration::from_millis(1500)); // the last windows close
    let (ok, out) = interrupt(&mut tt, tt_out);
    assert!(ok, "agent failed: {out:#?}");

    let ev = read_jsonl(&dir.join("events.jsonl"));
    let show = ev
        .iter()
        .map(|e| e.to_string())
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(dir.join("events-shown.jsonl"), &show).unwrap();
    let tenant = |e: &Value| {
        e["attributes"]["tokentap.tenant"]
            .as_str()
            .unwrap_or("")
            .to_string()
    };
    let of = |kind: &str| -> Vec<&Value> { events_of(&ev, kind) };

    // 3. The scale-up: a surge of `scaler`, TTFT p95 up in its window.
    let surges: Vec<_> = of("caller.surge")
        .into_iter()
        .filter(|e| tenant(e) == "scaler")
        .collect();
    assert_eq!(surges.len(), 1, "one surge of scaler:\n{show}");
    let a = &surges[0]["attributes"];
    assert!(
        a["ttft_p95_s"].as_f64().unwrap() > a["baseline_ttft_p95_s"].as_f64().unwrap(),
        "the TTFT rise shows in the surge's window: {a}"
    );
    assert!(a["rate_rps"].as_f64().unwrap() >= 3.0 * a["baseline_rps"].as_f64().unwrap());
    assert!(a["concurrency"].as_f64().unwrap() > 2.0, "{a}");

    // 4. The permission change: an error burst of `billing`, kind 401/403.
    let bursts: Vec<_> = of("caller.error_burst")
        .into_iter()
        .filter(|e| tenant(e) == "billing")
        .collect();
    assert_eq!(bursts.len(), 1, "{show}");
    assert_eq!(bursts[0]["attributes"]["error.type"], "http_401_403");

    // 5. The investigation: `mobile` retries in a storm, `rag-app` drifts
    // on input tokens, upward.
    let storms: Vec<_> = of("caller.retry_storm");
    assert_eq!(storms.len(), 1, "{show}");
    assert_eq!(tenant(storms[0]), "mobile");
    let drifts: Vec<_> = of("tokens.drift");
    assert!(!drifts.is_empty(), "{show}");
    for d in &drifts {
        assert_eq!(tenant(d), "rag-app", "{d}");
        assert_eq!(d["attributes"]["gen_ai.token.type"], "input", "{d}");
        assert_eq!(d["attributes"]["direction"], "up", "{d}");
    }

    // Nobody else is named: `steady` only by its caller.new; every anomaly
    // event names one of the tenants that misbehaved.
    let steady: Vec<_> = ev.iter().filter(|e| tenant(e) == "steady").collect();
    assert_eq!(steady.len(), 1, "{show}");
    assert_eq!(steady[0]["kind"], "caller.new");
    for e in &ev {
        let k = e["kind"].as_str().unwrap();
        if k.starts_with("caller.") && k != "caller.new" || k == "tokens.drift" {
            assert!(
                ["scaler", "billing", "mobile", "rag-app"].contains(&tenant(e).as_str()),
                "{e}"
            );
        }
    }
    let new: Vec<String> = of("caller.new").iter().map(|e| tenant(e)).collect();
    for t in ["steady", "rag-app", "billing", "scaler", "mobile"] {
        assert!(new.contains(&t.to_string()), "caller.new for {t}: {new:?}");
    }
}
