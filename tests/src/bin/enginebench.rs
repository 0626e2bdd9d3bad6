//! Real-engine rows of `cargo xtask bench` (root, peers installed):
//!
//! * throughput of llama.cpp's `llama-server` under concurrent streamed
//!   load from the `openai` SDK client, without and with `tokentap run`
//!   attached, alternating rounds; requests/s and tokens/s (server usage);
//! * per-request TTFT/TPOT difference between tokentap and the client
//!   (sequential mixed requests, like the fidelity test) on both engines.
//!
//! Prints one JSON object. Usage: enginebench ROUNDS REQUESTS_PER_ROUND

use std::{
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use serde_json::{json, Value};
use tokentap_tests::{
    interrupt,
    peers::{free_port, lowest_priority, quantile, Comparison, Engine, Peers},
    read_jsonl, scratch_dir, start, tokentap_bin, Running,
};

/// `tokentap run` on `pid`; `low` runs it at nice 19 (the fidelity runs:
/// its timestamps are the kernel's, so it never needs to run first).
fn agent(pid: u32, log: &Path, low: bool) -> (Running, std::sync::mpsc::Receiver<String>) {
    let mut cmd = Command::new(tokentap_bin());
    if low {
        lowest_priority(&mut cmd);
    }
    start(
        cmd.args(["run", "--pid", &pid.to_string(), "--no-console"])
            .arg("--requests-log")
            .arg(log),
        "; ready",
        "tokentap run",
    )
}

/// utime+stime of a process, seconds, and its peak RSS (VmHWM), KiB.
fn cpu_and_peak_rss(pid: u32) -> (f64, f64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let f: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, r)| r.split_whitespace().collect())
        .unwrap_or_default();
    let t = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let hwm = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    ((t(11) + t(12)) / hz, hwm)
}

fn load_round(peers: &Peers, port: u16, n: usize, out: &Path) -> (f64, f64) {
    let t = Instant::now();
    let recs = peers.client(
        &format!("http://127.0.0.1:{port}/v1"),
        &[
            "--n",
            &n.to_string(),
            "--concurrency",
            "4",
            "--only",
            "chat-stream-usage",
            "--max-tokens",
            "64",
            "--tag",
            "load",
        ],
        out,
    );
    let wall = t.elapsed().as_secs_f64();
    let tokens: u64 = recs
        .iter()
        .map(|r| r["completion_tokens"].as_u64().unwrap_or(0))
        .sum();
    (n as f64 / wall, tokens as f64 / wall)
}

fn fidelity(peers: &Peers, kind: Engine, dir: &Path) -> Value {
    let port = free_port();
    let (engine, _o) = peers.start_engine(kind, port, 1);
    let log = dir.join(format!("fid-{}.jsonl", kind.name()));
    let (mut a, ao) = agent(engine.0.id(), &log, true);
    let client = peers.client(
        &format!("http://127.0.0.1:{port}/v1"),
        &[
            "--n",
            "60",
            "--max-tokens",
            "32",
            "--cancel-every",
            "12",
            "--warmup",
            "2",
            "--think-ms",
            "50",
        ],
        &dir.join(format!("client-{}.jsonl", kind.name())),
    );
    std::thread::sleep(Duration::from_millis(500));
    let _ = interrupt(&mut a, ao);
    drop(engine);
    let records = read_jsonl(&log);
    let c = Comparison::new(&client, &records);
    let (t50, t99) = Comparison::abs_ms(&c.ttft_diff);
    let (p50, p99) = Comparison::abs_ms(&c.tpot_diff);
    let (s50, s99) = Comparison::abs_ms(&c.ttft_sdk_diff);
    let (b50, b99) = Comparison::abs_ms(&c.before_read);
    let (c50, c99) = Comparison::abs_ms(&c.to_client);
    json!({"sdk_ttft_p50_ms": s50, "sdk_ttft_p99_ms": s99,
           "before_read_p50_ms": b50, "before_read_p99_ms": b99,
           "to_client_p50_ms": c50, "to_client_p99_ms": c99,"engine": kind.name(), "requests": client.len(), "matched": c.pairs.len(),
           "ttft_n": c.ttft_diff.len(), "ttft_client_behind": c.client_behind.len(), "ttft_p50_ms": t50, "ttft_p99_ms": t99,
           "tpot_n": c.tpot_diff.len(), "tpot_p50_ms": p50, "tpot_p99_ms": p99})
}

fn main() {
    let mut args = std::env::args().skip(1);
    let rounds: usize = args.next().and_then(|v| v.parse().ok()).unwrap_or(3);
    let n: usize = args.next().and_then(|v| v.parse().ok()).unwrap_or(32);
    let peers = Peers::installed("enginebench");
    let dir = scratch_dir("enginebench");

    let port = free_port();
    let (engine, _o) = peers.start_engine(Engine::Native, port, 4);
    let pid = engine.0.id();
    load_round(&peers, port, 8, &dir.join("warmup.jsonl"));
    let (mut plain, mut traced) = (vec![], vec![]);
    let (mut agent_cpu, mut agent_rss, mut events) = (vec![], vec![], vec![]);
    for r in 0..rounds {
        eprint!("\renginebench: load round {}/{rounds} ...   ", r + 1);
        plain.push(load_round(&peers, port, n, &dir.join("plain.jsonl")));
        let log = dir.join("traced-requests.jsonl");
        let _ = std::fs::remove_file(&log);
        let (mut a, ao) = agent(pid, &log, false);
        let (cpu0, _) = cpu_and_peak_rss(a.0.id());
        let t = Instant::now();
        traced.push(load_round(&peers, port, n, &dir.join("traced.jsonl")));
        let wall = t.elapsed().as_secs_f64();
        let (cpu1, rss) = cpu_and_peak_rss(a.0.id());
        let (_, lines) = interrupt(&mut a, ao);
        let ev = lines
            .iter()
            .find_map(|l| {
                // "…; capture {json}; decode {json}"
                let j = l.split_once("; capture ")?.1.split_once("; decode ")?.0;
                serde_json::from_str::<Value>(j).ok()?["events"].as_f64()
            })
            .unwrap_or(0.0);
        agent_cpu.push((cpu1 - cpu0) / wall);
        agent_rss.push(rss);
        events.push(ev / wall);
    }
    eprintln!();
    drop(engine);
    let med = |v: Vec<f64>| quantile(&v, 0.5);
    let fid: Vec<Value> = [Engine::Python, Engine::Native]
        .into_iter()
        .map(|k| fidelity(&peers, k, &dir))
        .collect();
    println!(
        "{}",
        json!({
            "engine": "llama-server", "rounds": rounds, "requests_per_round": n, "concurrency": 4,
            "untraced_req_s": med(plain.iter().map(|p| p.0).collect()),
            "traced_req_s": med(traced.iter().map(|p| p.0).collect()),
            "untraced_tok_s": med(plain.iter().map(|p| p.1).collect()),
            "traced_tok_s": med(traced.iter().map(|p| p.1).collect()),
            "agent_cpu_frac": med(agent_cpu),
            "agent_peak_rss_kib": med(agent_rss),
            "agent_events_per_s": med(events),
            "fidelity": fid,
        })
    );
}
