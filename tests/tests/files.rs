//! The agent reads engines' files and must never be stopped by them, as
//! root: three vLLM-named engines (`simengine`) in one network namespace,
//! the agent started first —
//! 1. one whose `vllm-*.dist-info/METADATA` (found through its
//!    `VIRTUAL_ENV`) is a FIFO, as any container can make with `mkfifo`;
//! 2. one whose model directory's `config.json` is an absolute symlink to
//!    a FIFO;
//! 3. a normal one.
//!
//! Before, the first froze the agent's main thread in `open()`: no record
//! of any engine from then on, SIGINT ignored. Now all three engines'
//! requests are recorded, the FIFOs are refused unopened and counted
//! (`tokentap.files.refused{reason="not_regular"}`), the normal engine's
//! version is read, and SIGINT stops the agent within 5 s.

use std::{
    ffi::CString,
    os::unix::ffi::OsStrExt,
    path::Path,
    time::{Duration, Instant},
};

use serde_json::json;
use tokentap_tests::{
    assert_root, free_port, http, otlp, read_jsonl, scratch_dir, start, Netns, RunAgent,
};

fn mkfifo(p: &Path) {
    let c = CString::new(p.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid path.
    assert_eq!(
        unsafe { libc::mkfifo(c.as_ptr(), 0o644) },
        0,
        "mkfifo {p:?}"
    );
}

fn ask(addr: &str, model: &str) {
    let body = json!({"model": model, "stream": true,
        "sim": {"ttft_ms": 3, "gap_ms": 1, "tokens": 2}})
    .to_string();
    let req = http::post_with_headers(
        "/v1/chat/completions",
        "engine",
        &[("Connection", "close")],
        &body,
    );
    let (r, _) = http::exchange(addr, &req).expect("a response from the engine");
    assert!(
        String::from_utf8_lossy(&r.body).contains("[DONE]"),
        "{model}: no stream"
    );
}

#[test]
#[ignore = "needs root: eBPF, network namespaces (cargo xtask test runs it as root)"]
fn fifos_among_an_engines_files_are_refused_and_nothing_stalls() {
    assert_root("files");
    let dir = scratch_dir("files");
    // Engine 1's virtualenv: site-packages with a FIFO for METADATA.
    let venv = dir.join("venv");
    let info = venv.join("lib/python3.11/site-packages/vllm-0.6.1.dist-info");
    std::fs::create_dir_all(&info).unwrap();
    mkfifo(&info.join("METADATA"));
    // Engine 2's model: config.json → an absolute path that is a FIFO.
    let model = dir.join("models/tiny");
    std::fs::create_dir_all(&model).unwrap();
    mkfifo(&dir.join("trap"));
    std::os::unix::fs::symlink(dir.join("trap"), model.join("config.json")).unwrap();
    // Engine 3: a normal virtualenv and model.
    let good = dir.join("good-venv/lib/python3.11/site-packages/vllm-0.6.3.dist-info");
    std::fs::create_dir_all(&good).unwrap();
    std::fs::write(
        good.join("METADATA"),
        "Metadata-Version: 2.1\nName: vllm\nVersion: 0.6.3\n\n",
    )
    .unwrap();
    let good_model = dir.join("models/good");
    std::fs::create_dir_all(&good_model).unwrap();
    std::fs::write(good_model.join("config.json"), "{}").unwrap();

    let rt = tokio::runtime::Runtime::new().unwrap();
    let (metrics, rport) = otlp::start_receiver(&rt, 0);
    let ns = Netns::create("tfi", 78);
    let ports = [free_port(), free_port(), free_port()];
    let log = dir.join("requests.jsonl");
    let run = RunAgent::new().no_gpu().arg("--no-engine-info");
    let (mut agent, agent_out) = ports
        .iter()
        .fold(run, |run, p| run.port(*p))
        .otlp(rport)
        .requests_log(&log)
        .start();
    let mut engines = Vec::new();
    let setups = [
        (venv.clone(), dir.join("models/none")),
        (dir.join("no-venv"), model.clone()),
        (dir.join("good-venv"), good_model.clone()),
    ];
    for (i, (env, model)) in setups.iter().enumerate() {
        let mut c = ns.command(Path::new(env!("CARGO_BIN_EXE_simengine")));
        c.env("VIRTUAL_ENV", env)
            .args(["--addr", "0.0.0.0", "--port", &ports[i].to_string()])
            .args(["vllm.entrypoints.openai.api_server", "--model"])
            .arg(model);
        engines.push(start(&mut c, "listening", "simengine"));
    }
    std::thread::sleep(Duration::from_millis(1500));
    for (i, p) in ports.iter().enumerate() {
        let addr = format!("{}:{p}", ns.ns_addr);
        for j in 0..3 {
            ask(&addr, &format!("e{}-{j}", i + 1));
        }
    }
    std::thread::sleep(Duration::from_millis(2500));
    let refused = |exports: &[_]| otlp::counter(exports, "tokentap.files.refused").unwrap_or(0);
    let counted = refused(&metrics.exports());

    // SIGINT: stopped within 5 s.
    let t = Instant::now();
    // SAFETY: a plain signal to our own child.
    unsafe { libc::kill(agent.0.id() as i32, libc::SIGINT) };
    let status = loop {
        if let Some(st) = agent.0.try_wait().unwrap() {
            break st;
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the agent did not stop within 5 s of SIGINT"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let stopped = t.elapsed();
    let lines: Vec<String> = agent_out.try_iter().collect();
    assert!(status.success(), "tokentap run failed: {lines:#?}");
    drop(engines);

    let records = read_jsonl(&log);
    for i in 1..=3 {
        let rs: Vec<_> = records
            .iter()
            .filter(|r| {
                r["request_model"]
                    .as_str()
                    .is_some_and(|m| m.starts_with(&format!("e{i}-")))
            })
            .collect();
        assert_eq!(rs.len(), 3, "engine {i}: {records:#?}");
        for r in &rs {
            assert!(r["ttft_s"].is_number(), "{r}");
            assert_eq!(r["provider"], "vllm", "{r}");
        }
        let version = &rs[0]["engine_version"];
        match i {
            1 => assert!(version.is_null(), "a FIFO's version: {version}"),
            3 => assert_eq!(version, "0.6.3", "the normal engine's build"),
            _ => {}
        }
    }
    // Both FIFOs: refused unopened (the model one once per read of its
    // directory's config files).
    assert!(counted >= 2, "files refused: {counted}");
    println!(
        "files: 3 engines x 3 requests recorded; files refused {counted}; stopped {:.2} s after SIGINT",
        stopped.as_secs_f64()
    );
}
