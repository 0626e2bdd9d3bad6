//! End to end, as root: the model version follows what the engine serves,
//! not the process. The agent runs first with `--port`; the simulated
//! engine (named like llama.cpp's server, `-m FILE` on its command line) is
//! started with model file A, stopped, started with B, stopped, started
//! with A again → the records say vA, vB, vA. Then A's header bytes change
//! in place (same size, same mtime) → a new version; and the engine's
//! `TOKENTAP_MODEL_VERSION` wins verbatim. The OTLP export carries each
//! record's version as `tokentap.model.version`.

use std::{
    fs::File,
    net::TcpStream,
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use serde_json::{json, Value};
use tokentap_tests::{
    assert_root, http, interrupt, logged,
    otlp::{sum_point_attributes, Receiver},
    read_jsonl, scratch_dir, start, RunAgent,
};

/// Requests per phase after the probe that shows the agent found the engine.
const N: usize = 4;
const MODEL_BYTES: usize = 2 << 20;

/// A fake 2 MiB "GGUF" file: magic, then bytes that depend on `seed`.
fn write_model(path: &Path, seed: u8) {
    let mut b: Vec<u8> = (0..MODEL_BYTES)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect();
    b[..4].copy_from_slice(b"GGUF");
    std::fs::write(path, b).expect("write model file");
}

/// One phase: the engine serving `model` (with `env` set), requests tagged
/// `tag` until the agent records one for this engine, then [`N`] more;
/// the engine is killed at the end. Returns the engine's pid.
fn phase(port: u16, log: &Path, model: &Path, tag: &str, env: &[(&str, &str)]) -> u32 {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_simengine"));
    cmd.args(["--port", &port.to_string(), "--label", "llama-server", "-m"])
        .arg(model)
        .envs(env.iter().copied());
    let (engine, out) = start(&mut cmd, "listening", "simengine");
    drop(out);
    let pid = engine.0.id();
    let t = Instant::now();
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect to the engine");
    let send = |s: &mut TcpStream, model: &str, i: usize| {
        let body = json!({"model": model, "stream": true, "stream_options": {"include_usage": true},
            "sim": {"id": i, "ttft_ms": 1, "gap_ms": 1, "tokens": 3}});
        let r = http::round_trip(s, "/v1/chat/completions", &body.to_string()).expect("request");
        assert!(r.complete && r.status() == Some(200));
    };
    let probe = format!("{tag}-probe");
    loop {
        send(&mut s, &probe, 0);
        if logged(log)
            .iter()
            .any(|r| r["request_model"] == probe.as_str() && r["pid"] == pid)
        {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the agent did not record requests to the engine (pid {pid}) within 30 s"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    for i in 0..N {
        send(&mut s, tag, i + 1);
    }
    // Every tagged request is in the log before the engine goes.
    let t = Instant::now();
    while logged(log)
        .iter()
        .filter(|r| r["request_model"] == tag)
        .count()
        < N
    {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "{tag} requests not logged"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(s);
    drop(engine);
    // The agent sees the listener go before the next engine takes the port.
    std::thread::sleep(Duration::from_millis(500));
    pid
}

/// The one version every record tagged `tag` carries (all the same, a
/// 12-hex-character fingerprint unless `verbatim`).
fn version_of(records: &[Value], tag: &str, pid: u32) -> String {
    let mine: Vec<&Value> = records
        .iter()
        .filter(|r| r["request_model"] == tag)
        .collect();
    assert_eq!(mine.len(), N, "{tag}: every request logged once");
    let v = mine[0]["model_version"]
        .as_str()
        .unwrap_or_else(|| panic!("{tag}: no model_version: {}", mine[0]))
        .to_string();
    for r in &mine {
        assert_eq!(r["pid"], pid, "{r}");
        assert_eq!(r["provider"], "llama.cpp", "{r}");
        assert_eq!(
            r["model_version"],
            v.as_str(),
            "one version per engine: {r}"
        );
    }
    v
}

fn is_fingerprint(v: &str) -> bool {
    v.len() == 12 && v.bytes().all(|b| b.is_ascii_hexdigit())
}

#[test]
#[ignore = "needs root: loads eBPF (cargo xtask test runs it as root)"]
fn model_a_then_b_then_a_again_gives_va_vb_va_and_a_changed_header_a_new_version() {
    assert_root("model version");
    let dir = scratch_dir("modelversion");
    let log = dir.join("requests.jsonl");
    let port = tokentap_tests::free_port();
    let (model_a, model_b) = (dir.join("a.gguf"), dir.join("b.gguf"));
    write_model(&model_a, 1);
    write_model(&model_b, 2);
    let mtime_a = std::fs::metadata(&model_a)
        .and_then(|m| m.modified())
        .expect("mtime");

    let otlp = Receiver::start();

    let (mut agent, agent_out) = start(
        &mut RunAgent::new()
            .port(port)
            .otlp(otlp.port)
            .requests_log(&log)
            .command(),
        "waiting for a listener on port",
        "tokentap run",
    );

    let pid_a1 = phase(port, &log, &model_a, "phase-a1", &[]);
    let pid_b = phase(port, &log, &model_b, "phase-b", &[]);
    let pid_a2 = phase(port, &log, &model_a, "phase-a2", &[]);
    // A changed in place: same size, same mtime, other header bytes.
    {
        use std::io::{Seek as _, Write as _};
        let mut f = File::options().write(true).open(&model_a).unwrap();
        f.seek(std::io::SeekFrom::Start(64)).unwrap();
        f.write_all(b"general.name=other-build").unwrap();
        f.set_modified(mtime_a).unwrap();
    }
    assert_eq!(
        std::fs::metadata(&model_a).unwrap().len(),
        MODEL_BYTES as u64
    );
    let pid_a3 = phase(port, &log, &model_a, "phase-a3", &[]);
    let pid_o = phase(
        port,
        &log,
        &model_a,
        "phase-override",
        &[("TOKENTAP_MODEL_VERSION", "release-2026.11 rc1")],
    );

    // Let one more export carry the last phase.
    std::thread::sleep(Duration::from_millis(2500));
    let (ok, stderr) = interrupt(&mut agent, agent_out);
    assert!(ok, "tokentap run failed: {stderr:?}");

    let records = read_jsonl(&log);
    let va1 = version_of(&records, "phase-a1", pid_a1);
    let vb = version_of(&records, "phase-b", pid_b);
    let va2 = version_of(&records, "phase-a2", pid_a2);
    let va3 = version_of(&records, "phase-a3", pid_a3);
    let vo = version_of(&records, "phase-override", pid_o);
    eprintln!("versions: A {va1}, B {vb}, A again {va2}, A changed {va3}, override {vo:?}");
    assert!(is_fingerprint(&va1) && is_fingerprint(&vb) && is_fingerprint(&va3));
    assert_ne!(pid_a1, pid_a2, "a new process");
    assert_eq!(va1, va2, "serving A again gives A's version back");
    assert_ne!(va1, vb, "B is another build");
    assert_ne!(va3, va1, "A's header changed: a new version");
    assert_ne!(va3, vb);
    assert_eq!(
        vo, "release-2026.11 rc1",
        "the environment's override, verbatim"
    );

    // The metric attribute: each tagged series carries its version.
    let exports = otlp.metrics.exports();
    let points = sum_point_attributes(&exports, "tokentap.requests");
    for (tag, v) in [
        ("phase-a1", &va1),
        ("phase-b", &vb),
        ("phase-a2", &va2),
        ("phase-a3", &va3),
        ("phase-override", &vo),
    ] {
        let versions: Vec<&str> = points
            .iter()
            .filter(|p| {
                p.iter()
                    .any(|(k, val)| k == "gen_ai.request.model" && val == tag)
            })
            .filter_map(|p| {
                p.iter()
                    .find(|(k, _)| k == "tokentap.model.version")
                    .map(|(_, val)| val.as_str())
            })
            .collect();
        assert_eq!(versions, vec![v.as_str()], "{tag}: {points:?}");
    }
}
