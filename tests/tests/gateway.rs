//! The entry stage through a gateway, as root: Debian's nginx as a
//! streaming reverse proxy (`proxy_buffering off`, HTTP/1.1 keep-alive
//! upstream, two workers) in one network namespace, the simulated engine
//! in another (two pods on one node, each reaching the other through the
//! node), both targets (`--port` of each). The engine is restarted
//! mid-test (nginx reconnects upstream).
//!
//! Every engine record carries `gateway_s` (the proxy's arrival → the
//! engine's) within 1 ms of what the test's clocks say (the client's send
//! → the kernel's receive timestamp of the request at the engine's socket,
//! `SO_TIMESTAMPNS`, from the engine's truth file), and the
//! proxy's record is linked to it (role, gateway pid and port, the proxy's
//! span the engine span's parent). One user request is counted once: the
//! proxy's upstream view is never a record, `tokentap.requests` is the
//! number of requests, and the TTFT histogram has them under both roles.

use std::{path::Path, process::Command, time::Duration};

use serde_json::{json, Value};
use tokentap_tests::{
    assert_root, free_port, http, interrupt, otlp, read_jsonl, scratch_dir, start, Netns, RunAgent,
    Running,
};

/// nginx's master, stopped the way its service stops it (SIGTERM: the
/// workers leave with it; a SIGKILL would orphan them).
struct Nginx(Running);

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.0 .0.id().to_string()])
            .status();
        for _ in 0..40 {
            if matches!(self.0 .0.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// One request through the proxy on its own connection, read to the end;
/// returns the client's send bracket [before the write, after it].
fn ask(addr: &str, id: u64) -> [u64; 2] {
    let body = json!({"model": format!("gw-{id}"), "stream": true,
        "sim": {"id": id, "ttft_ms": 15, "gap_ms": 2, "tokens": 3}})
    .to_string();
    let req = http::post_with_headers(
        "/v1/chat/completions",
        "gateway",
        &[("Connection", "close")],
        &body,
    );
    let (r, [lo, hi]) = http::exchange(addr, &req).expect("a response through nginx");
    let t = String::from_utf8_lossy(&r.body);
    assert!(t.contains("[DONE]"), "request {id} through nginx: {t}");
    [lo, hi]
}

/// Waits (at most 5 s) until the engine's truth file has `n` complete
/// lines.
fn wait_for_truth(truth: &Path, n: usize) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while std::time::Instant::now() < deadline {
        let t = std::fs::read_to_string(truth).unwrap_or_default();
        if t.ends_with('\n') && t.lines().count() >= n {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("the engine wrote fewer than {n} truth lines");
}

fn nginx_conf(dir: &Path, port: u16, engine: &str) -> std::path::PathBuf {
    let conf = dir.join("nginx.conf");
    let d = dir.display();
    std::fs::write(
        &conf,
        format!(
            "worker_processes 2;\n\
             pid {d}/nginx.pid;\n\
             error_log stderr notice;\n\
             events {{ worker_connections 64; }}\n\
             http {{\n\
               access_log off;\n\
               client_body_temp_path {d}/body; proxy_temp_path {d}/proxy;\n\
               fastcgi_temp_path {d}/fcgi; uwsgi_temp_path {d}/uwsgi; scgi_temp_path {d}/scgi;\n\
               upstream engine {{ server {engine}; keepalive 4; }}\n\
               server {{\n\
                 listen 0.0.0.0:{port};\n\
                 location / {{\n\
                   proxy_pass http://engine;\n\
                   proxy_http_version 1.1;\n\
                   proxy_set_header Connection \"\";\n\
                   proxy_buffering off;\n\
                 }}\n\
               }}\n\
             }}\n"
        ),
    )
    .unwrap();
    conf
}

fn start_engine(
    ns: &Netns,
    port: u16,
    truth: &Path,
) -> (Running, std::sync::mpsc::Receiver<String>) {
    start(
        ns.command(Path::new(env!("CARGO_BIN_EXE_simengine")))
            .args([
                "--addr",
                "0.0.0.0",
                "--port",
                &port.to_string(),
                "--nodelay",
            ])
            .arg("--truth")
            .arg(truth),
        "listening",
        "simengine",
    )
}

#[test]
#[ignore = "needs root: eBPF, network namespaces, Debian's nginx (cargo xtask test runs it as root)"]
fn an_engine_behind_nginx_gets_the_entry_stage_and_one_request_is_counted_once() {
    assert_root("gateway");
    assert!(
        Path::new("/usr/sbin/nginx").exists(),
        "nginx is not installed: tests/peers/install.sh installs it (cargo xtask test runs it)"
    );
    let dir = scratch_dir("gateway");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (metrics, _logs, spans, rport) = otlp::start_receiver_with_traces(&rt, 0);
    let engine_ns = Netns::create("gwe", 74);
    let proxy_ns = Netns::create("gwp", 75);
    proxy_ns.route_to(&engine_ns);
    engine_ns.route_to(&proxy_ns);
    let (eport, pport) = (free_port(), free_port());
    let truth = dir.join("truth.jsonl");
    let mut engine = start_engine(&engine_ns, eport, &truth);
    let first_engine = engine.0 .0.id();
    let conf = nginx_conf(&dir, pport, &format!("{}:{eport}", engine_ns.ns_addr));
    let (nginx, _nginx_out) = start(
        proxy_ns
            .command("/usr/sbin/nginx")
            .arg("-p")
            .arg(&dir)
            .arg("-c")
            .arg(&conf)
            .args(["-e", "stderr", "-g", "daemon off;"]),
        "start worker process",
        "nginx",
    );
    let nginx = Nginx(nginx);
    let log = dir.join("requests.jsonl");
    let (mut agent, agent_out) = RunAgent::new()
        .port(pport)
        .port(eport)
        .no_gpu()
        .otlp(rport)
        .args(["--traces-sample", "1"])
        .requests_log(&log)
        .events_log(&dir.join("events.jsonl"))
        .start();
    let addr = format!("{}:{pport}", proxy_ns.ns_addr);
    let mut sent = std::collections::BTreeMap::new();
    // One at a time (nginx reuses its kept-alive upstream connections),
    // then four at once.
    for id in 0..4 {
        sent.insert(id, ask(&addr, id));
    }
    let handles: Vec<_> = (4..8)
        .map(|id| {
            let a = addr.clone();
            std::thread::spawn(move || (id, ask(&a, id)))
        })
        .collect();
    for h in handles {
        let (id, b) = h.join().unwrap();
        sent.insert(id, b);
    }
    // The engine restarts (a new pid on the same port): nginx connects
    // upstream anew. It writes each request's truth line after the
    // response's last byte: wait for them before killing it.
    wait_for_truth(&truth, sent.len());
    drop(engine);
    std::thread::sleep(Duration::from_millis(300));
    engine = start_engine(&engine_ns, eport, &truth);
    std::thread::sleep(Duration::from_millis(1500));
    for id in 8..12 {
        sent.insert(id, ask(&addr, id));
    }
    std::thread::sleep(Duration::from_millis(1500));
    wait_for_truth(&truth, sent.len());
    // nginx stops while the agent runs: its master (which owns the
    // listening socket and never forwards) leaves as its workers do, as a
    // gateway, without an `engine.stop`.
    let master = nginx.0 .0.id();
    drop(nginx);
    let mut early = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !early
        .iter()
        .any(|l: &String| l.contains(&format!("pid {master} exited")))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the agent did not see nginx's master {master} exit: {early:#?}"
        );
        if let Ok(l) = agent_out.recv_timeout(Duration::from_millis(200)) {
            early.push(l);
        }
    }
    // A tick or two for the timeline to act on it.
    std::thread::sleep(Duration::from_millis(1000));
    let (ok, mut lines) = interrupt(&mut agent, agent_out);
    early.append(&mut lines);
    let lines = early;
    assert!(ok, "tokentap run failed: {lines:#?}");
    drop(engine);
    let summary = lines
        .iter()
        .find(|l| l.contains("requests recorded"))
        .unwrap_or_else(|| panic!("no shutdown line: {lines:#?}"));
    eprintln!("{summary}");

    let records = read_jsonl(&log);
    let truths = read_jsonl(&truth);
    let n = sent.len();
    let of = |id: u64, role: &str| -> Vec<&Value> {
        records
            .iter()
            .filter(|r| r["request_model"] == format!("gw-{id}") && r["role"] == role)
            .collect()
    };
    // Nothing else: no record of nginx's upstream side, none unjoined.
    assert_eq!(records.len(), 2 * n, "{records:#?}");
    let mut devs = Vec::new();
    for (&id, send) in &sent {
        let (e, g) = (of(id, "engine"), of(id, "gateway"));
        assert_eq!((e.len(), g.len()), (1, 1), "gw-{id}: {records:#?}");
        let (e, g) = (e[0], g[0]);
        assert_eq!(e["server_port"], eport, "{e}");
        assert_eq!(g["server_port"], pport, "{g}");
        for r in [e, g] {
            assert_eq!(r["gateway"], "nginx", "{r}");
            assert_eq!(r["gateway_port"], pport, "{r}");
            assert_eq!(r["gateway_pid"], g["pid"], "{r}");
            assert_eq!(r["gateway_s"], e["gateway_s"]);
        }
        assert_eq!(e["trace_id"], g["trace_id"], "gw-{id}");
        assert_eq!(e["parent_span_id"], g["span_id"], "gw-{id}");
        assert!(g["span_id"].is_string(), "{g}");
        let gateway_s = e["gateway_s"].as_f64().unwrap();
        let (t0e, t0g) = (e["t0_ns"].as_u64().unwrap(), g["t0_ns"].as_u64().unwrap());
        assert!((gateway_s - (t0e - t0g) as f64 / 1e9).abs() < 1e-9, "{e}");
        assert!(e["gateway_return_s"].as_f64().unwrap() >= 0.0, "{e}");
        // Ground truth: the client's send and the engine's read.
        let t = truths
            .iter()
            .find(|t| t["id"] == id)
            .unwrap_or_else(|| panic!("gw-{id}: no truth line"));
        let read = [
            t["read"][0].as_u64().unwrap(),
            t["read"][1].as_u64().unwrap(),
        ];
        assert!(read[0] > 0, "gw-{id}: the engine read it fresh: {t}");
        assert!(
            t0g >= send[0] && t0e <= read[1],
            "gw-{id}: arrivals inside the brackets: {e} {g} {t}"
        );
        // The engine's arrival by the kernel's receive timestamp at its
        // socket (`SO_TIMESTAMPNS`, not the agent's); the proxy's arrival
        // lies inside the client's send (the segment reaches nginx's socket
        // inside that write).
        let rx = t["rx"]
            .as_u64()
            .unwrap_or_else(|| panic!("gw-{id}: no receive timestamp: {t}"));
        assert!(rx <= read[1], "gw-{id}: received before read: {t}");
        let truth_s = (rx as f64 - send[0] as f64) / 1e9;
        devs.push(((gateway_s - truth_s) * 1e6, id));
        assert!(
            (gateway_s - truth_s).abs() <= 1e-3,
            "gw-{id}: gateway_s {gateway_s} vs the test's clocks {truth_s}: {t}"
        );
    }
    eprintln!("gateway_s − (engine socket receive − client send), µs: {devs:?}");

    // The timeline: the restarted engine's stop (the control: stops are
    // reported), and none for nginx's master or workers.
    let events = read_jsonl(&dir.join("events.jsonl"));
    let stops: Vec<u64> = events
        .iter()
        .filter(|e| e["kind"] == "engine.stop")
        .filter_map(|e| e["attributes"]["process.pid"].as_u64())
        .collect();
    let workers: std::collections::BTreeSet<u64> = records
        .iter()
        .filter_map(|r| r["gateway_pid"].as_u64())
        .collect();
    assert!(
        stops.contains(&(first_engine as u64)),
        "no engine.stop for the restarted engine {first_engine}: {events:#?}"
    );
    assert!(
        !stops.contains(&(master as u64)) && !stops.iter().any(|p| workers.contains(p)),
        "nginx (master {master}, workers {workers:?}) stopped as an engine: {events:#?}"
    );

    // Counted once.
    let exports = metrics.exports();
    assert_eq!(otlp::counter(&exports, "tokentap.requests"), Some(n as u64));
    let by_role = otlp::histogram_counts_by(
        &exports,
        "gen_ai.server.time_to_first_token",
        "tokentap.role",
    );
    assert_eq!(by_role.get("engine"), Some(&(n as u64)), "{by_role:?}");
    assert_eq!(by_role.get("gateway"), Some(&(n as u64)), "{by_role:?}");

    // One trace per request: the engine's span is the gateway span's child.
    let spans = spans.spans();
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    for r in &records {
        let s = spans
            .iter()
            .filter(|s| s.start_time_unix_nano == r["t0_ns"].as_u64().unwrap())
            .collect::<Vec<_>>();
        assert_eq!(s.len(), 1, "one span for {r}: {spans:#?}");
        assert_eq!(hex(&s[0].trace_id), r["trace_id"].as_str().unwrap(), "{r}");
        if r["role"] == "gateway" {
            assert_eq!(hex(&s[0].span_id), r["span_id"].as_str().unwrap(), "{r}");
            assert!(s[0].parent_span_id.is_empty(), "{r}");
        } else {
            assert_eq!(
                hex(&s[0].parent_span_id),
                r["parent_span_id"].as_str().unwrap()
            );
        }
    }
}
