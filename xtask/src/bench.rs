//! `cargo xtask bench …`: benchmarks that print a table. Every figure in
//! a table comes from the same run, and overheads are reported as
//! differences/ratios of conditions measured side by side (alternating, the
//! median of several rounds), because absolute numbers on shared machines
//! are noisy.

use std::{
    io::{BufRead, BufReader, Write},
    path::{Path, PathBuf},
    process::{Child, ChildStdout, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use crate::util::root;

pub fn run(which: &str, secs: f64, rounds: usize) -> Result<()> {
    match which {
        "capture" => {
            crate::build(true)?;
            capture(secs, rounds)
        }
        "decode" => {
            crate::build(true)?;
            decode(secs, rounds)
        }
        "all" => {
            crate::build(true)?;
            decode(secs, rounds)?;
            capture(secs, rounds)
        }
        other => bail!("unknown bench {other:?}; available: capture, decode, all"),
    }
}

/// One-line description of the machine for table headers.
pub fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("model name")
                    .map(|r| r.trim_start_matches([' ', '\t', ':']).to_string())
            })
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let mem_gib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        })
        .map(|kb| kb / 1024.0 / 1024.0)
        .unwrap_or(0.0);
    format!("{cpu}, {cores} cores, {mem_gib:.0} GiB, Linux {kernel}")
}

fn bin(name: &str) -> PathBuf {
    root().join("target/release").join(name)
}

#[derive(Clone, Copy, Debug, Default)]
struct Sample {
    writes: f64,
    wall_s: f64,
    cpu_s: f64,
    /// Agent counters (capture runs only).
    sent: f64,
    dropped: f64,
    events: f64,
    agent_cpu_s: f64,
}

impl Sample {
    fn rate(&self) -> f64 {
        self.writes / self.wall_s
    }
    fn cpu_ns_per_write(&self) -> f64 {
        self.cpu_s * 1e9 / self.writes
    }
    fn cpu_ms_per_s(&self) -> f64 {
        self.cpu_s * 1e3 / self.wall_s
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Tracer {
    None,
    /// The reference programs: one map lookup on write enter/exit.
    Floor,
    /// The agent, targeting the workload.
    AgentOnWorkload,
    /// The agent, targeting an idle process (the workload is not targeted).
    AgentElsewhere,
}

fn lines(out: ChildStdout) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    rx
}

fn wait_ready(rx: &mpsc::Receiver<String>, what: &str) -> Result<String> {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let l = rx
            .recv_timeout(left)
            .with_context(|| format!("{what} did not become ready"))?;
        if l.contains("ready") {
            return Ok(l);
        }
    }
}

struct Spawned {
    child: Child,
    rx: mpsc::Receiver<String>,
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn_tokentap(args: &[String]) -> Result<Spawned> {
    let mut child = Command::new(bin("tokentap"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting tokentap")?;
    let err = child.stderr.take().context("stderr")?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(err).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    let s = Spawned { child, rx };
    wait_ready(&s.rx, "tokentap")?;
    Ok(s)
}

/// utime+stime of a process, in seconds.
fn proc_cpu_s(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
        return 0.0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = f.get(11).and_then(|u| u.parse::<f64>().ok()).unwrap_or(0.0)
        + f.get(12).and_then(|s| s.parse::<f64>().ok()).unwrap_or(0.0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    ticks / hz
}

fn measure(workload: &[&str], tracer: Tracer) -> Result<Sample> {
    let mut child = Command::new(bin("benchpeer"))
        .args(workload)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("starting benchpeer (built by `cargo xtask build --release`)")?;
    let mut stdin = child.stdin.take().context("stdin")?;
    let rx = lines(child.stdout.take().context("stdout")?);
    let mut peer = Spawned { child, rx };
    let ready = wait_ready(&peer.rx, "benchpeer")?;
    let pid: u32 = ready
        .strip_prefix("ready ")
        .and_then(|p| p.parse().ok())
        .context("benchpeer ready line")?;

    let mut idle = None;
    let agent = match tracer {
        Tracer::None => None,
        Tracer::Floor => Some(spawn_tokentap(&[
            "floor".into(),
            "--duration".into(),
            "600".into(),
        ])?),
        Tracer::AgentOnWorkload | Tracer::AgentElsewhere => {
            let target = if tracer == Tracer::AgentOnWorkload {
                pid
            } else {
                let mut c = Command::new(bin("benchpeer"))
                    .arg("idle")
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .spawn()?;
                let rx = lines(c.stdout.take().context("stdout")?);
                let s = Spawned { child: c, rx };
                let l = wait_ready(&s.rx, "idle benchpeer")?;
                let p = l
                    .strip_prefix("ready ")
                    .and_then(|p| p.parse().ok())
                    .context("idle pid")?;
                idle = Some(s);
                p
            };
            Some(spawn_tokentap(&[
                "capture".into(),
                "--pid".into(),
                target.to_string(),
                "--out".into(),
                "/dev/null".into(),
            ])?)
        }
    };
    writeln!(stdin, "go")?;
    stdin.flush()?;
    let line = peer
        .rx
        .recv_timeout(Duration::from_secs(120))
        .context("benchpeer gave no result")?;
    let v: Value = serde_json::from_str(&line).with_context(|| format!("bad result {line:?}"))?;
    let mut s = Sample {
        writes: v["writes"].as_f64().unwrap_or(0.0),
        wall_s: v["wall_s"].as_f64().unwrap_or(1.0),
        cpu_s: v["cpu_s"].as_f64().unwrap_or(0.0),
        ..Sample::default()
    };
    let _ = peer.child.wait();
    if let Some(a) = agent {
        if matches!(tracer, Tracer::AgentOnWorkload | Tracer::AgentElsewhere) {
            // Let it drain, then stop it and read its counters.
            std::thread::sleep(Duration::from_millis(300));
            s.agent_cpu_s = proc_cpu_s(a.child.id());
            // SAFETY: signal to our own child.
            unsafe { libc::kill(a.child.id() as i32, libc::SIGINT) };
            let deadline = Instant::now() + Duration::from_secs(60);
            while let Ok(l) =
                a.rx.recv_timeout(deadline.saturating_duration_since(Instant::now()))
            {
                if let Some((_, j)) = l.split_once(" stats ") {
                    let st: Value = serde_json::from_str(j)?;
                    s.sent = st["records_sent"].as_f64().unwrap_or(0.0);
                    s.dropped = st["records_dropped"].as_f64().unwrap_or(0.0);
                    s.events = st["events"].as_f64().unwrap_or(0.0);
                    break;
                }
            }
        }
        drop(a);
    }
    drop(stdin);
    drop(idle);
    Ok(s)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    if v.is_empty() {
        return f64::NAN;
    }
    v[v.len() / 2]
}

/// Runs every tracer for `workload` `rounds` times, alternating, and
/// returns per-tracer samples.
fn rounds_of(workload: &[&str], tracers: &[Tracer], rounds: usize) -> Result<Vec<Vec<Sample>>> {
    let mut out = vec![Vec::new(); tracers.len()];
    for r in 0..rounds {
        for (i, t) in tracers.iter().enumerate() {
            eprint!(
                "\rxtask bench: {} round {}/{rounds} ...      ",
                workload.join(" "),
                r + 1
            );
            out[i].push(measure(workload, *t)?);
        }
    }
    eprintln!();
    Ok(out)
}

fn med(samples: &[Sample], f: impl Fn(&Sample) -> f64) -> f64 {
    median(samples.iter().map(f).collect())
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "NOT met"
    }
}

fn decode(secs: f64, rounds: usize) -> Result<()> {
    let mut runs = vec![];
    for r in 0..rounds {
        eprint!("\rxtask bench: decode round {}/{rounds} ...   ", r + 1);
        let out = crate::util::output(Command::new(bin("decodebench")).arg(secs.to_string()))?;
        runs.push(serde_json::from_str::<Value>(out.trim())?);
    }
    eprintln!();
    let m = |k: &str| median(runs.iter().filter_map(|v| v[k].as_f64()).collect());
    let date = crate::util::output(Command::new("date").arg("-u").arg("+%Y-%m-%d %H:%M UTC"))
        .unwrap_or_default();
    let sse = m("sse_events_per_s");
    let mut t = format!("### `cargo xtask bench decode` — {}\n\n", date.trim());
    t += &format!(
        "Machine: {}. One thread decoding an in-memory mix ({} socket events, {} SSE events per pass: 64 keep-alive connections, OpenAI-compatible chat streams of 256 content chunks, 1 in 10 requests non-streamed); median of {rounds} rounds of {secs} s.\n\n",
        machine(),
        runs[0]["socket_events"],
        runs[0]["sse_events"]
    );
    t += "| metric | per core | target |\n|---|---|---|\n";
    t += &format!(
        "| SSE events decoded | {:.0}/s | ≥ 1,000,000/s: {} |\n",
        sse,
        verdict(sse >= 1e6)
    );
    t += &format!(
        "| socket events (syscalls) | {:.0}/s | – |\n",
        m("socket_events_per_s")
    );
    t += &format!("| request records | {:.0}/s | – |\n", m("records_per_s"));
    t += &format!("| payload bytes | {:.1} MB/s | – |\n", m("mb_per_s"));
    println!("{t}");
    std::fs::write(root().join("target/bench-decode.md"), &t)?;
    Ok(())
}

fn capture(secs: f64, rounds: usize) -> Result<()> {
    if unsafe { libc::geteuid() } != 0 {
        bail!("the capture bench loads eBPF: run it as root");
    }
    let s = format!("{secs}");
    let tcp_max = rounds_of(
        &["tcp", &s],
        &[Tracer::None, Tracer::AgentOnWorkload],
        rounds,
    )?;
    let tcp_paced = rounds_of(
        &["tcp", &s, "20000"],
        &[Tracer::None, Tracer::AgentOnWorkload],
        rounds,
    )?;
    let pipe = rounds_of(
        &["pipe", &s],
        &[Tracer::None, Tracer::Floor, Tracer::AgentElsewhere],
        rounds,
    )?;

    let mut t = String::new();
    let date = crate::util::output(Command::new("date").arg("-u").arg("+%Y-%m-%d %H:%M UTC"))
        .unwrap_or_default();
    t += &format!("### `cargo xtask bench capture` — {}\n\n", date.trim());
    t += &format!("Machine: {}. Each figure is the median of {rounds} rounds of {secs} s; conditions alternate within a round.\n\n", machine());
    t += "| # | workload | metric | no agent | floor (1 lookup) | agent | result | target |\n|---|---|---|---|---|---|---|---|\n";

    let (b, a) = (&tcp_max[0], &tcp_max[1]);
    let added = med(a, Sample::cpu_ns_per_write) - med(b, Sample::cpu_ns_per_write);
    t += &format!(
        "| 1 | targeted loopback TCP server, 300-byte write(), max rate | writes/s | {:.0} | – | {:.0} | {:.1}% of untraced | – |\n",
        med(b, Sample::rate),
        med(a, Sample::rate),
        100.0 * med(a, Sample::rate) / med(b, Sample::rate)
    );
    t += &format!(
        "| 1 | same | writer CPU ns per write() | {:.0} | – | {:.0} | +{added:.0} ns per traced call | ≤ 1000 ns: {} |\n",
        med(b, Sample::cpu_ns_per_write),
        med(a, Sample::cpu_ns_per_write),
        verdict(added <= 1000.0)
    );
    let (b, a) = (&tcp_paced[0], &tcp_paced[1]);
    let extra_pct = (med(a, Sample::cpu_ms_per_s) - med(b, Sample::cpu_ms_per_s)) / 10.0;
    t += &format!(
        "| 2 | same server paced at 20,000 writes/s ({:.0} achieved) | writer CPU ms per s | {:.2} | – | {:.2} | +{extra_pct:.2}% of one core | ≤ 2%: {} |\n",
        med(a, Sample::rate),
        med(b, Sample::cpu_ms_per_s),
        med(a, Sample::cpu_ms_per_s),
        verdict(extra_pct <= 2.0)
    );
    let (b, f, a) = (&pipe[0], &pipe[1], &pipe[2]);
    let (nb, nf, na) = (
        med(b, Sample::cpu_ns_per_write),
        med(f, Sample::cpu_ns_per_write),
        med(a, Sample::cpu_ns_per_write),
    );
    let ratio = (na - nb) / (nf - nb);
    t += &format!(
        "| 3 | process NOT targeted, 16-byte write() to a pipe, max rate | writes/s | {:.0} | {:.0} | {:.0} | – | – |\n",
        med(b, Sample::rate),
        med(f, Sample::rate),
        med(a, Sample::rate)
    );
    t += &format!(
        "| 3 | same | CPU ns per write() | {nb:.0} | {nf:.0} (+{:.0}) | {na:.0} (+{:.0}) | agent adds {ratio:.2}× the floor's cost | ≤ 1.3×: {} |\n",
        nf - nb,
        na - nb,
        verdict(ratio <= 1.3)
    );
    for (name, set) in [("1 (max rate)", &tcp_max[1]), ("2 (20k/s)", &tcp_paced[1])] {
        let sent = med(set, |s| s.sent);
        let dropped = med(set, |s| s.dropped);
        t += &format!(
            "| 4 | records at workload {name} | delivered / dropped | – | – | {:.0} / {:.0} | {:.3}% dropped; agent CPU {:.1}% of a core | – |\n",
            sent,
            dropped,
            100.0 * dropped / (sent + dropped).max(1.0),
            100.0 * med(set, |s| s.agent_cpu_s) / secs
        );
    }
    t += "\nRows 1–2: CPU time of the workload's writing thread (CLOCK_THREAD_CPUTIME_ID), so the agent's own CPU on the other core does not count against it. Row 3: the floor is the cheapest useful tracer — one hash lookup on write enter and exit (`agent-ebpf/src/floor.rs`); \"agent adds N× the floor\" = (agent − none) / (floor − none).\n";
    println!("{t}");
    let out = root().join("target/bench-capture.md");
    std::fs::write(&out, &t)?;
    eprintln!("xtask bench: table also written to {}", out.display());
    let _ = Path::new("");
    Ok(())
}
