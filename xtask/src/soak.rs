//! `cargo xtask bench soak --secs N`: the agent on a simulated engine for N
//! seconds (≥ 300 for the issue-21 figures) of streamed chats from
//! thousands of distinct end users (OpenAI `user`) and API keys, most on a
//! fresh connection each. Rows: requests sent and recorded, the events
//! log against its ceiling, per-caller `caller.new` events against
//! `--max-tenants`, and the agent's RSS over time (flat after warm-up).

use std::{
    io::{Read, Write},
    net::TcpStream,
    process::{Command, Stdio},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use serde_json::Value;

use crate::bench::{bin, proc_rss_kib, row, verdict, wait_ready, Row, Spawned};

/// Distinct end users and API keys the load cycles through.
const USERS: u64 = 5_000;
const KEYS: u64 = 3_000;
/// `--max-tenants` for the agent, and an events ceiling below what the
/// first minute makes (an engine.start and 50 named caller.new), so that
/// folding is exercised too.
const MAX_TENANTS: u64 = 50;
const CEILING_PER_MIN: u64 = 40;
/// Requests per second the load aims at (over 4 client threads).
const TARGET_RPS: f64 = 150.0;

pub fn soak(secs: f64) -> Result<Vec<Row>> {
    if secs < 60.0 {
        anyhow::bail!("bench soak needs --secs 60 or more (300 for the issue-21 figures)");
    }
    let dir = crate::util::root().join("target/soak");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let config = dir.join("tokentap.toml");
    std::fs::write(
        &config,
        format!("[events]\nmax_events_per_minute = {CEILING_PER_MIN}\n"),
    )?;
    let events_log = dir.join("events.jsonl");
    let requests_log = dir.join("requests.jsonl");

    let (engine, port) = crate::bench::start_simengine()?;

    let mut agent = Command::new(bin("tokentap"))
        .args(["run", "--pid", &engine.child.id().to_string()])
        .args(["--no-console", "--no-gpu", "--max-tenants"])
        .arg(MAX_TENANTS.to_string())
        .arg("--events-log")
        .arg(&events_log)
        .arg("--requests-log")
        .arg(&requests_log)
        .arg("--config")
        .arg(&config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting tokentap")?;
    let err = agent.stderr.take().context("stderr")?;
    let rx = lines_of(err);
    let agent = Spawned { child: agent, rx };
    wait_ready(&agent.rx, "tokentap")?;
    let agent_pid = agent.child.id();

    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let next = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (stop, sent, failed, next) =
                (stop.clone(), sent.clone(), failed.clone(), next.clone());
            std::thread::spawn(move || {
                let pace = Duration::from_secs_f64(4.0 / TARGET_RPS);
                let mut keep: Option<TcpStream> = None;
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    // Nine in ten on a fresh connection; the tenth on the
                    // thread's kept-alive one.
                    let reuse = i % 10 == 0;
                    let conn = match keep.take().filter(|_| reuse) {
                        Some(c) => Ok(c),
                        None => TcpStream::connect(("127.0.0.1", port)),
                    };
                    match conn.and_then(|mut c| chat(&mut c, i).map(|()| c)) {
                        Ok(c) => {
                            sent.fetch_add(1, Ordering::Relaxed);
                            if reuse || keep.is_none() {
                                keep = Some(c);
                            }
                        }
                        Err(_) => {
                            failed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    if let Some(rest) = pace.checked_sub(t.elapsed()) {
                        std::thread::sleep(rest);
                    }
                }
            })
        })
        .collect();

    // The RSS curve: one sample every 10 s.
    let start = Instant::now();
    let mut curve = vec![];
    while start.elapsed().as_secs_f64() < secs {
        std::thread::sleep(Duration::from_secs(10).min(Duration::from_secs_f64(
            (secs - start.elapsed().as_secs_f64()).max(0.1),
        )));
        curve.push((
            start.elapsed().as_secs(),
            proc_rss_kib(agent_pid).0 / 1024.0,
        ));
        eprint!(
            "\rxtask bench soak: {:.0}/{secs:.0} s, {} requests, RSS {:.1} MiB   ",
            start.elapsed().as_secs_f64(),
            sent.load(Ordering::Relaxed),
            curve.last().map_or(0.0, |c| c.1)
        );
    }
    eprintln!();
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
    std::thread::sleep(Duration::from_secs(3));
    let peak = proc_rss_kib(agent_pid).1 / 1024.0;
    // SIGINT: the agent flushes its logs and judges the open windows.
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(agent_pid as i32, libc::SIGINT) };
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut agent = agent;
    while agent.child.try_wait()?.is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(agent);
    drop(engine);

    let read = |p: &std::path::Path| -> Vec<Value> {
        std::fs::read_to_string(p)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    };
    let events = read(&events_log);
    let records = read(&requests_log).len() as u64;
    let sent = sent.load(Ordering::Relaxed);
    let failed = failed.load(Ordering::Relaxed);
    let new: Vec<&Value> = events
        .iter()
        .filter(|e| e["kind"] == "caller.new")
        .collect();
    let summaries = new
        .iter()
        .filter(|e| e["attributes"]["summary"] == true)
        .count() as u64;
    let named = new.len() as u64 - summaries;
    let mut per_min = std::collections::BTreeMap::<String, u64>::new();
    for e in &events {
        let ts = e["ts"].as_str().unwrap_or_default();
        *per_min
            .entry(ts.get(..16).unwrap_or(ts).to_string())
            .or_default() += 1;
    }
    let max_min = per_min.values().copied().max().unwrap_or(0);
    let folded_events: Vec<&Value> = events
        .iter()
        .filter(|e| e["kind"] == "events.folded")
        .collect();
    let folded: u64 = folded_events
        .iter()
        .filter_map(|e| e["attributes"]["folded"].as_u64())
        .sum();
    let folded_new: u64 = folded_events
        .iter()
        .filter_map(|e| e["attributes"]["folded_by_kind"]["caller.new"].as_u64())
        .sum();
    // Flat after warm-up: the last third's mean against the middle third's.
    let third = (curve.len() / 3).max(1);
    let mean = |s: &[(u64, f64)]| s.iter().map(|c| c.1).sum::<f64>() / s.len().max(1) as f64;
    let mid = mean(&curve[third..2 * third]);
    let last = mean(&curve[2 * third..]);
    let growth = last / mid.max(f64::MIN_POSITIVE);
    let curve_text: Vec<String> = curve
        .iter()
        .map(|(t, mib)| format!("{t}s {mib:.1}"))
        .collect();
    Ok(vec![
        row(
            format!(
                "soak {secs:.0} s: streamed chats from {USERS} end users (`user`) and {KEYS} API keys, 9 in 10 on a fresh connection"
            ),
            format!("{sent} sent ({failed} failed)"),
            format!("{records} recorded"),
            format!("{:.2}% recorded", 100.0 * records as f64 / sent.max(1) as f64),
            format!("100%: {}", verdict(records == sent)),
        ),
        row(
            format!("events log at a ceiling of {CEILING_PER_MIN} a minute: events in the busiest minute (all kinds)"),
            "–",
            format!(
                "{} events written in {} minutes; {folded} folded ({folded_new} of them caller.new)",
                events.len(),
                per_min.len()
            ),
            format!("max {max_min} per minute"),
            format!(
                "≤ {} (ceiling + its events.folded), some folded: {}",
                CEILING_PER_MIN + 1,
                verdict(max_min <= CEILING_PER_MIN + 1 && folded > 0)
            ),
        ),
        row(
            format!("caller.new events naming one caller (--max-tenants {MAX_TENANTS})"),
            "–",
            format!(
                "{named} written + {folded_new} folded, {summaries} window summaries"
            ),
            format!("{} named", named + folded_new),
            format!(
                "≤ {MAX_TENANTS}: {}",
                verdict(named + folded_new <= MAX_TENANTS)
            ),
        ),
        row(
            "agent RSS (MiB) every 10 s",
            curve_text.join(", "),
            format!("peak {peak:.1} MiB"),
            format!("last third / middle third {growth:.3}×"),
            format!("flat (≤ 1.05×): {}", verdict(growth <= 1.05)),
        ),
    ])
}

/// One streamed chat of user `i`, read to its end.
pub(crate) fn chat(c: &mut TcpStream, i: u64) -> std::io::Result<()> {
    c.set_read_timeout(Some(Duration::from_secs(10)))?;
    let body = format!(
        r#"{{"model":"soak","stream":true,"user":"user-{}","messages":[{{"role":"user","content":"hi"}}],"sim":{{"id":{i},"ttft_ms":2,"gap_ms":1,"tokens":3}}}}"#,
        i % USERS
    );
    write!(
        c,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: soak\r\nAuthorization: Bearer sk-soak-{}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        i % KEYS,
        body.len()
    )?;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.ends_with(b"0\r\n\r\n") {
        let n = c.read(&mut buf)?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        got.extend_from_slice(&buf[..n]);
    }
    Ok(())
}

/// Lines of the agent's stderr (its ready line), the rest echoed.
pub(crate) fn lines_of(err: std::process::ChildStderr) -> std::sync::mpsc::Receiver<String> {
    use std::io::BufRead;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in std::io::BufReader::new(err).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    rx
}
