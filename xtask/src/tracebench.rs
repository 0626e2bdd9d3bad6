//! `cargo xtask bench traces`: what the request spans cost the agent. The
//! simulated engine answers streamed chats at a steady rate from 4 client
//! threads (9 in 10 on a fresh connection); the agent exports to a real
//! OpenTelemetry receiver (Rotel, exporting nowhere) with `--traces-sample
//! 0` (no spans: the sampling decision only) and `--traces-sample 1`
//! (every request a span), alternating, the median of the rounds. The row:
//! agent CPU seconds per 1,000 requests, which is also the share of a core
//! at 1,000 requests per second.

use std::{
    net::TcpStream,
    process::{Command, Stdio},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use anyhow::{Context, Result};

use crate::bench::{bin, proc_cpu_s, row, wait_ready, Row, Spawned};

/// Requests per second the load aims at (the simulated engine and the
/// agent share two cores with the client).
const TARGET_RPS: f64 = 300.0;

pub fn traces(secs: f64, rounds: usize) -> Result<Vec<Row>> {
    let secs = secs.max(5.0);
    let (engine, port) = crate::bench::start_simengine()?;
    let rotel_port = free_port()?;
    let rotel_bin = crate::util::root()
        .join("tests/peers/.venv/lib/python3.11/site-packages/rotel/rotel-agent");
    let mut rotel = Command::new(&rotel_bin)
        .args(["start", "--exporter", "blackhole", "--otlp-grpc-endpoint"])
        .arg(format!("127.0.0.1:{rotel_port}"))
        .arg("--otlp-http-endpoint")
        .arg(format!("127.0.0.1:{}", free_port()?))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {} (cargo xtask peers)", rotel_bin.display()))?;
    std::thread::sleep(Duration::from_secs(1));

    let mut per_k = [vec![], vec![]];
    let mut rps = [vec![], vec![]];
    for r in 0..rounds {
        for (i, sample) in ["0", "1"].iter().enumerate() {
            eprint!("\rxtask bench: traces round {}/{rounds} ...      ", r + 1);
            let (cpu, n, wall) = one(engine.child.id(), port, rotel_port, sample, secs)?;
            per_k[i].push(cpu / n.max(1) as f64 * 1000.0);
            rps[i].push(n as f64 / wall);
        }
    }
    eprintln!();
    let _ = rotel.kill();
    let _ = rotel.wait();
    drop(engine);
    let med = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
        v[v.len() / 2]
    };
    let (off, on) = (med(&mut per_k[0]), med(&mut per_k[1]));
    let (r_off, r_on) = (med(&mut rps[0]), med(&mut rps[1]));
    Ok(vec![row(
        format!(
            "agent CPU per 1,000 requests with a span each vs none (simulated engine, {r_on:.0} req/s, Rotel receiving)"
        ),
        format!("{off:.3} s ({r_off:.0} req/s, --traces-sample 0)"),
        format!("{on:.3} s (--traces-sample 1)"),
        format!(
            "+{:.3} s per 1k requests = +{:.1} % of a core at 1k req/s ({:.2}×)",
            on - off,
            (on - off) * 100.0,
            on / off.max(f64::MIN_POSITIVE)
        ),
        "measured",
    )])
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// One condition: (agent CPU s during the load, requests answered, wall s).
fn one(
    engine_pid: u32,
    port: u16,
    rotel_port: u16,
    sample: &str,
    secs: f64,
) -> Result<(f64, u64, f64)> {
    let mut agent = Command::new(bin("tokentap"))
        .args(["run", "--pid", &engine_pid.to_string()])
        .args(["--no-console", "--no-gpu", "--no-engine-metrics"])
        .arg("--otlp-endpoint")
        .arg(format!("http://127.0.0.1:{rotel_port}"))
        .args(["--export-interval", "1", "--traces-sample", sample])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting tokentap")?;
    let rx = crate::soak::lines_of(agent.stderr.take().context("stderr")?);
    let agent = Spawned { child: agent, rx };
    wait_ready(&agent.rx, "tokentap")?;
    let pid = agent.child.id();
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let next = Arc::new(AtomicU64::new(0));
    let cpu0 = proc_cpu_s(pid);
    let t0 = Instant::now();
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (stop, sent, next) = (stop.clone(), sent.clone(), next.clone());
            std::thread::spawn(move || {
                let pace = Duration::from_secs_f64(4.0 / TARGET_RPS);
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if let Ok(mut c) = TcpStream::connect(("127.0.0.1", port)) {
                        if crate::soak::chat(&mut c, i).is_ok() {
                            sent.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    if let Some(rest) = pace.checked_sub(t.elapsed()) {
                        std::thread::sleep(rest);
                    }
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs_f64(secs));
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
    let wall = t0.elapsed().as_secs_f64();
    // The last spans and metrics out: one export interval.
    std::thread::sleep(Duration::from_millis(1200));
    let cpu = proc_cpu_s(pid) - cpu0;
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(pid as i32, libc::SIGINT) };
    let mut agent = agent;
    let deadline = Instant::now() + Duration::from_secs(30);
    while agent.child.try_wait()?.is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok((cpu, sent.load(Ordering::Relaxed), wall))
}
