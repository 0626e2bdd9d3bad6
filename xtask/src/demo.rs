//! `cargo xtask demo`: how a newcomer sees tokentap work on a machine with
//! no GPU and no engine. Starts the simulated engine (`simengine`), a small
//! load of streamed chat requests for two models (some rate-limited), and
//! `tokentap run` on the engine's pid with its console view, for SECS
//! seconds. Needs root (eBPF).

use std::{
    io::{BufRead, BufReader},
    net::TcpStream,
    process::{Command, Stdio},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

use anyhow::{bail, Context, Result};

use crate::util::root;

// The tests crate's HTTP helpers, by path: depending on `tokentap-tests`
// would build the agent (and tonic, opentelemetry) into xtask, whose job
// is to build the agent first, with the eBPF object it embeds.
#[path = "../../tests/src/http.rs"]
#[allow(dead_code)]
mod http;

fn load(port: u16, worker: u64, stop: Arc<AtomicBool>) -> Result<()> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        i += 1;
        let model = if worker.is_multiple_of(2) {
            "llama-3-8b-instruct"
        } else {
            "qwen2-7b-instruct"
        };
        let slow = if worker.is_multiple_of(2) { 1 } else { 2 };
        let status = if i.is_multiple_of(25) { 429 } else { 200 };
        let write = ["write", "writev", "send"][(i % 3) as usize];
        let body = serde_json::json!({
            "model": model, "stream": true, "stream_options": {"include_usage": true},
            "messages": [{"role": "user", "content": "Tell me about lighthouses."}],
            "sim": {"id": i, "status": status, "ttft_ms": (40 + (i * 37) % 160) * slow,
                    "gap_ms": (8 + i % 12) * slow, "tokens": 16 + (i * 13) % 96,
                    "write": write}
        })
        .to_string();
        http::round_trip(&mut s, "/v1/chat/completions", &body)?;
        std::thread::sleep(Duration::from_millis(50 + (i * 29) % 400));
    }
    Ok(())
}

pub fn run(secs: u64) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the demo loads eBPF programs: run it as root");
    }
    crate::build(crate::Profile::Release)?;
    let bin = root().join("target/release");
    let mut engine = Command::new(bin.join("simengine"))
        .stdout(Stdio::piped())
        .spawn()
        .context("starting simengine")?;
    let mut line = String::new();
    BufReader::new(engine.stdout.take().context("stdout")?).read_line(&mut line)?;
    let port: u16 = line
        .trim()
        .strip_prefix("listening ")
        .and_then(|p| p.parse().ok())
        .context("simengine did not say its port")?;
    eprintln!(
        "xtask demo: simulated engine (pid {}) on 127.0.0.1:{port}; starting tokentap for {secs} s",
        engine.id()
    );
    let mut agent = Command::new(bin.join("tokentap"))
        .args([
            "run",
            "--pid",
            &engine.id().to_string(),
            "--duration",
            &secs.to_string(),
            "--console-window",
            "30",
        ])
        .spawn()
        .context("starting tokentap")?;
    std::thread::sleep(Duration::from_secs(3));
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let stop = stop.clone();
            std::thread::spawn(move || load(port, w, stop))
        })
        .collect();
    let st = agent.wait()?;
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        let _ = w.join();
    }
    let _ = engine.kill();
    let _ = engine.wait();
    if !st.success() {
        bail!("tokentap run failed: {st}");
    }
    Ok(())
}
