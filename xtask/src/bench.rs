//! `cargo xtask bench …`: benchmarks that print a table. Every figure in
//! a table comes from the same run, and overheads are reported as
//! differences/ratios of conditions measured side by side (alternating, the
//! median of several rounds), because absolute numbers on shared machines
//! are noisy.

use std::{
    io::{BufRead, BufReader, Write},
    path::PathBuf,
    process::{Child, ChildStdout, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use crate::util::root;

pub fn run(which: &str, secs: f64, rounds: usize) -> Result<()> {
    let parts: &[&str] = match which {
        "all" => &[
            "decode", "gpu", "tokens", "capture", "conns", "hostile", "engine", "tls", "traces",
        ],
        "gpu" => &["gpu"],
        "capture" => &["capture"],
        "decode" => &["decode"],
        "conns" => &["conns"],
        "hostile" => &["hostile"],
        "engine" => &["engine"],
        "tls" => &["tls"],
        "traces" => &["traces"],
        "tokens" => &["tokens"],
        "soak" => &["soak"],
        other => {
            bail!(
                "unknown bench {other:?}; available: all, capture, decode, gpu, conns, hostile, engine, tls, traces, tokens, soak"
            )
        }
    };
    let root_needed = parts
        .iter()
        .any(|p| !matches!(*p, "decode" | "gpu" | "tokens"));
    // SAFETY: geteuid has no preconditions.
    if root_needed && unsafe { libc::geteuid() } != 0 {
        bail!("this bench loads eBPF: run it as root (`bench decode` does not need root)");
    }
    if parts
        .iter()
        .any(|p| matches!(*p, "engine" | "tls" | "traces" | "tokens"))
    {
        crate::peers()?;
    }
    crate::build(crate::Profile::Dist)?;
    let mut rows = vec![];
    for p in parts {
        rows.extend(match *p {
            "decode" => decode(secs, rounds)?,
            "capture" => capture(secs, rounds)?,
            "gpu" => gpu()?,
            "conns" => conns(10_000)?,
            "hostile" => hostile(&[100, 1000, 5000])?,
            "soak" => crate::soak::soak(secs)?,
            "tls" => tls(rounds)?,
            "traces" => crate::tracebench::traces(secs, rounds)?,
            "tokens" => tokens(secs, rounds)?,
            _ => engine(rounds)?,
        });
    }
    let date = crate::util::output(Command::new("date").arg("-u").arg("+%Y-%m-%d %H:%M UTC"))
        .unwrap_or_default();
    let mut t = format!(
        "#### `cargo xtask bench {which} --secs {secs} --rounds {rounds}` — {}\n\nMachine: {}.\n\n",
        date.trim(),
        machine()
    );
    t += "| # | what | baseline | with tokentap | result | target |\n|---|---|---|---|---|---|\n";
    for (i, r) in rows.iter().enumerate() {
        t += &format!(
            "| {} | {} | {} | {} | {} | {} |\n",
            i + 1,
            r.what,
            r.base,
            r.traced,
            r.result,
            r.target
        );
    }
    t += NOTES;
    println!("{t}");
    let out = root().join(format!("target/bench-{which}.md"));
    std::fs::write(&out, &t)?;
    eprintln!("xtask bench: table also written to {}", out.display());
    Ok(())
}

const NOTES: &str = "
Baselines and traced conditions alternate within each round; figures are medians over rounds. \
Capture rows: the workload is a write-heavy SSE server (each write one HTTP chunk with one OpenAI-style token event), \
its writer thread's CPU (CLOCK_THREAD_CPUTIME_ID) so the agent's own CPU on the other core does not count against it; \
the agent is `tokentap run` (capture + decode + records) with `--data-hooks btf` (the default where the kernel allows it), \
compared in the same run with `--data-hooks tracepoint` (the syscall-tracepoint programs, the fallback) and \
`--capture-reference` (the earlier capture path: tracepoint programs, per-record ring reads, a wake-up every 64 \
records; \"the reference's added cost\" = (BTF − untraced) / (reference − untraced)). Floor: one hash lookup on write \
enter and exit (`agent-ebpf/src/bin/floor.rs`, its own object, attached by the bench). The reference is the agent built with \
the `bench-reference` feature (target/dist/tokentap-reference); the shipped binary has neither. \
Engine rows: llama.cpp `llama-server` (1 thread, 4 slots, tiny random-weight model) under 4 concurrent `openai` SDK \
streams of 64 tokens; TTFT/TPOT differences: 60 sequential mixed requests per engine, tokentap − client per request.
";

/// The GPU sampler's CPU per pass, 8 GPUs × 64 processes, through
/// nvml-wrapper against the scripted fake NVML (`tests/tests/gpu.rs`,
/// release build).
fn gpu() -> Result<Vec<Row>> {
    let res = crate::util::cargo()
        .args([
            "test",
            "--release",
            "-p",
            "tokentap-tests",
            "--test",
            "gpu",
            "sampler_cpu_per_pass_with_8_gpus_and_64_processes",
            "--",
            "--nocapture",
        ])
        .output()?;
    // The test prints its line on stderr (the parent re-prints the child's).
    let out = format!(
        "{}{}",
        String::from_utf8_lossy(&res.stdout),
        String::from_utf8_lossy(&res.stderr)
    );
    if !res.status.success() {
        bail!("the GPU sampler bench failed:\n{out}");
    }
    let line = out
        .lines()
        .find_map(|l| l.find("gpu-sampler-bench:").map(|i| l[i..].to_string()))
        .ok_or_else(|| anyhow::anyhow!("the GPU sampler bench printed no result:\n{out}"))?;
    let median = line
        .split("median ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .unwrap_or("?")
        .to_string();
    Ok(vec![row(
        "GPU sampler CPU per pass, 8 GPUs × 64 processes (fake NVML, nvml-wrapper FFI)",
        "–",
        format!("{median} µs"),
        format!(
            "{median} µs per pass = {:.3} % of a core at 1 pass/s",
            median.parse::<f64>().unwrap_or(f64::NAN) / 1e4
        ),
        "–",
    )])
}

/// One row of the table.
pub(crate) struct Row {
    what: String,
    base: String,
    traced: String,
    result: String,
    target: String,
}

pub(crate) fn row(
    what: impl Into<String>,
    base: impl Into<String>,
    traced: impl Into<String>,
    result: impl Into<String>,
    target: impl Into<String>,
) -> Row {
    Row {
        what: what.into(),
        base: base.into(),
        traced: traced.into(),
        result: result.into(),
        target: target.into(),
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

pub(crate) fn bin(name: &str) -> PathBuf {
    root()
        .join("target")
        .join(crate::Profile::Dist.dir())
        .join(name)
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
    /// Agent peak RSS (VmHWM), KiB.
    agent_rss_kib: f64,
    /// Kernel run time of the agent's eBPF programs during the workload,
    /// and how many times they ran (only when measured with stats on).
    prog_ns: f64,
    prog_runs: f64,
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
    /// The agent, targeting the workload, with these data hooks.
    AgentOnWorkload(Hooks),
    /// The agent, targeting an idle process (the workload is not targeted).
    AgentElsewhere(Hooks),
}

/// How the agent captures: the BTF data program (the default where the
/// kernel allows it), the syscall-tracepoint programs (the fallback), or
/// the earlier capture path (`--capture-reference`, in the bench's own build:
/// tracepoint programs, per-record ring reads, a wake-up every 64
/// records) — this benchmark's reference.
#[derive(Clone, Copy, PartialEq)]
enum Hooks {
    Btf,
    Tracepoint,
    Reference,
    /// The BTF path in the release-profile build (`cargo xtask run`'s:
    /// no LTO), against the dist build (the image's) in the same rounds.
    BtfRelease,
}

impl Hooks {
    fn args(self) -> Vec<String> {
        match self {
            Hooks::Btf | Hooks::BtfRelease => vec!["--data-hooks".into(), "btf".into()],
            Hooks::Tracepoint => vec!["--data-hooks".into(), "tracepoint".into()],
            Hooks::Reference => vec!["--capture-reference".into()],
        }
    }
    /// The binary: the reference path is only in the bench's own build.
    fn binary(self) -> PathBuf {
        match self {
            Hooks::Reference => bin(REFERENCE_BIN),
            Hooks::BtfRelease => root()
                .join("target")
                .join(crate::Profile::Release.dir())
                .join("tokentap"),
            _ => bin("tokentap"),
        }
    }
    /// What the agent's ready line must say.
    fn ready(self) -> &'static str {
        match self {
            Hooks::Btf | Hooks::BtfRelease => "data hooks btf; ready",
            _ => "data hooks tracepoint; ready",
        }
    }
}

pub(crate) fn lines(out: ChildStdout) -> mpsc::Receiver<String> {
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

pub(crate) fn wait_ready(rx: &mpsc::Receiver<String>, what: &str) -> Result<String> {
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

pub(crate) struct Spawned {
    pub(crate) child: Child,
    pub(crate) rx: mpsc::Receiver<String>,
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The agent built with the `bench-reference` feature (its
/// `--capture-reference` path), beside the shipped one in target/dist.
const REFERENCE_BIN: &str = "tokentap-reference";

/// The floor tracer's eBPF object, built by [`capture_builds`].
static FLOOR_OBJECT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// What the capture bench needs beyond the shipped build: the floor
/// tracer's object (`agent-ebpf/src/bin/floor.rs`), the release-profile
/// agent, and the agent with the reference path (`--features
/// bench-reference`), copied to target/dist/tokentap-reference; then the
/// shipped agent again, so target/dist/tokentap is the binary that ships.
fn capture_builds() -> Result<()> {
    let tc = crate::toolchain::ensure()?;
    let floor = crate::ebpf::build_floor(&tc)?;
    let _ = FLOOR_OBJECT.set(floor);
    let mut cmd = crate::util::cargo();
    cmd.args(["build", "-p", "tokentap", "--bin", "tokentap"])
        .args(crate::Profile::Release.args())
        .env("TOKENTAP_EBPF_OBJ", crate::ebpf::object_path());
    crate::util::run(&mut cmd)?;
    let mut cmd = crate::util::cargo();
    cmd.args(["build", "-p", "tokentap", "--bin", "tokentap"])
        .args(["--features", "bench-reference"])
        .args(crate::Profile::Dist.args())
        .env("TOKENTAP_EBPF_OBJ", crate::ebpf::object_path());
    crate::util::run(&mut cmd)?;
    std::fs::copy(bin("tokentap"), bin(REFERENCE_BIN)).context("copying the reference build")?;
    crate::build(crate::Profile::Dist)
}

/// Attaches the floor tracer (one hash lookup on write enter and exit) in
/// this process; the programs stay attached while the returned object
/// lives.
fn attach_floor() -> Result<aya::Ebpf> {
    let obj = FLOOR_OBJECT
        .get()
        .context("the floor object was not built")?;
    if !std::path::Path::new("/sys/kernel/tracing/events").is_dir() {
        crate::util::run(Command::new("mount").args([
            "-t",
            "tracefs",
            "tracefs",
            "/sys/kernel/tracing",
        ]))?;
    }
    let mut ebpf = aya::Ebpf::load_file(obj)
        .with_context(|| format!("loading the floor tracer {}", obj.display()))?;
    for (prog, tp) in [
        ("floor_sys_enter_write", "sys_enter_write"),
        ("floor_sys_exit_write", "sys_exit_write"),
    ] {
        let p: &mut aya::programs::TracePoint = ebpf
            .program_mut(prog)
            .with_context(|| format!("the floor object has no {prog}"))?
            .try_into()?;
        p.load().with_context(|| format!("loading {prog}"))?;
        p.attach("syscalls", tp)
            .with_context(|| format!("attaching {prog}"))?;
    }
    Ok(ebpf)
}

/// The simulated engine (target/dist), and the port it listens on.
pub(crate) fn start_simengine() -> Result<(Spawned, u16)> {
    let mut engine = Command::new(bin("simengine"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("starting simengine (built by `cargo xtask build --dist`)")?;
    let rx = lines(engine.stdout.take().context("stdout")?);
    let engine = Spawned { child: engine, rx };
    let port: u16 = engine
        .rx
        .recv_timeout(Duration::from_secs(30))
        .ok()
        .and_then(|l| l.strip_prefix("listening ").and_then(|p| p.parse().ok()))
        .context("simengine says its port")?;
    Ok((engine, port))
}

/// Starts tokentap; `expect`: a text its ready line must contain.
fn spawn_tokentap(args: &[String], expect: Option<&str>) -> Result<Spawned> {
    spawn_agent(&bin("tokentap"), args, expect)
}

/// Starts the agent binary at `path`.
fn spawn_agent(path: &std::path::Path, args: &[String], expect: Option<&str>) -> Result<Spawned> {
    let mut child = Command::new(path)
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
    let ready = wait_ready(&s.rx, "tokentap")?;
    if let Some(want) = expect {
        if !ready.contains(want) {
            bail!("tokentap's ready line lacks {want:?}: {ready}");
        }
    }
    Ok(s)
}

/// VmRSS and VmHWM (peak) of a process, KiB.
pub(crate) fn proc_rss_kib(pid: u32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |k: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(k))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0.0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// utime+stime of a process, in seconds.
pub(crate) fn proc_cpu_s(pid: u32) -> f64 {
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

/// IDs of the eBPF programs loaded now.
fn prog_ids() -> Result<std::collections::HashSet<u32>> {
    aya::programs::loaded_programs()
        .map(|p| Ok(p.context("listing eBPF programs")?.id()))
        .collect()
}

/// Total kernel run time (ns) and run count of the programs loaded now
/// that are not in `old` (the agent's, loaded after `old` was taken).
fn prog_totals(old: &std::collections::HashSet<u32>) -> Result<(f64, f64)> {
    let (mut ns, mut runs) = (0.0, 0.0);
    for p in aya::programs::loaded_programs() {
        let p = p.context("reading eBPF program info")?;
        if !old.contains(&p.id()) {
            ns += p.run_time().as_nanos() as f64;
            runs += p.run_count() as f64;
        }
    }
    Ok((ns, runs))
}

/// One timed run of `workload` under `tracer`.
fn measure(workload: &[&str], tracer: Tracer) -> Result<Sample> {
    measure_with(workload, tracer, false)
}

/// One run of `workload` under `tracer`; with `prog_stats`, the kernel's
/// run-time statistics are switched on for it (BPF_ENABLE_STATS: two clock
/// reads per program run, so such a run is not one of the timed ones) and
/// the agent's programs' run time and count are read around the workload.
fn measure_with(workload: &[&str], tracer: Tracer, prog_stats: bool) -> Result<Sample> {
    let mut child = workload_command(workload)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("starting benchpeer (built by `cargo xtask build --dist`)")?;
    let mut stdin = child.stdin.take().context("stdin")?;
    let rx = lines(child.stdout.take().context("stdout")?);
    let mut peer = Spawned { child, rx };
    let ready = wait_ready(&peer.rx, "benchpeer")?;
    let pid: u32 = ready
        .strip_prefix("ready ")
        .and_then(|p| p.parse().ok())
        .context("benchpeer ready line")?;

    let mut idle = None;
    let stats = if prog_stats {
        let on = aya::sys::enable_stats(aya::sys::Stats::RunTime)
            .context("enabling eBPF run-time statistics (BPF_ENABLE_STATS)")?;
        Some((on, prog_ids()?))
    } else {
        None
    };
    let mut floor = None;
    let agent = match tracer {
        Tracer::None => None,
        Tracer::Floor => {
            floor = Some(attach_floor()?);
            None
        }
        Tracer::AgentOnWorkload(hooks) | Tracer::AgentElsewhere(hooks) => {
            let target = if matches!(tracer, Tracer::AgentOnWorkload(_)) {
                pid
            } else {
                let idle_workload: &[&str] = if workload.first() == Some(&"tls") {
                    &["tls", "idle"]
                } else {
                    &["idle"]
                };
                let mut c = workload_command(idle_workload)
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
            let mut args: Vec<String> = vec![
                "run".into(),
                "--pid".into(),
                target.to_string(),
                "--no-console".into(),
            ];
            args.extend(hooks.args());
            Some(spawn_agent(&hooks.binary(), &args, Some(hooks.ready()))?)
        }
    };
    let at_go = match &stats {
        Some((_, old)) => prog_totals(old)?,
        None => (0.0, 0.0),
    };
    writeln!(stdin, "go")?;
    stdin.flush()?;
    let line = peer
        .rx
        .recv_timeout(Duration::from_secs(120))
        .context("benchpeer gave no result")?;
    let at_end = match &stats {
        Some((_, old)) => prog_totals(old)?,
        None => (0.0, 0.0),
    };
    drop(stats);
    drop(floor);
    let v: Value = serde_json::from_str(&line).with_context(|| format!("bad result {line:?}"))?;
    let mut s = Sample {
        writes: v["writes"].as_f64().unwrap_or(0.0),
        wall_s: v["wall_s"].as_f64().unwrap_or(1.0),
        cpu_s: v["cpu_s"].as_f64().unwrap_or(0.0),
        prog_ns: at_end.0 - at_go.0,
        prog_runs: at_end.1 - at_go.1,
        ..Sample::default()
    };
    let _ = peer.child.wait();
    if let Some(a) = agent {
        if matches!(
            tracer,
            Tracer::AgentOnWorkload(_) | Tracer::AgentElsewhere(_)
        ) {
            // Let it drain, then stop it and read its counters.
            std::thread::sleep(Duration::from_millis(300));
            s.agent_cpu_s = proc_cpu_s(a.child.id());
            s.agent_rss_kib = proc_rss_kib(a.child.id()).1;
            // SAFETY: signal to our own child.
            unsafe { libc::kill(a.child.id() as i32, libc::SIGINT) };
            let deadline = Instant::now() + Duration::from_secs(60);
            while let Ok(l) =
                a.rx.recv_timeout(deadline.saturating_duration_since(Instant::now()))
            {
                // "tokentap: … ; capture {json}; decode {json}"
                if let Some(j) = l
                    .split_once("; capture ")
                    .and_then(|(_, r)| r.split_once("; decode "))
                    .map(|(j, _)| j)
                {
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

/// The workload's process: `benchpeer ARGS`, or for `tls …` the TLS
/// workload (`tests/peers/tls_bench.py`, Python's ssl over the system's
/// OpenSSL, in the peers' virtualenv).
fn workload_command(workload: &[&str]) -> Command {
    if workload.first() == Some(&"tls") {
        let peers = root().join("tests/peers");
        let mut c = Command::new(peers.join(".venv/bin/python"));
        c.arg(peers.join("tls_bench.py")).args(&workload[1..]);
        c
    } else {
        let mut c = Command::new(bin("benchpeer"));
        c.args(workload);
        c
    }
}

/// TLS: an HTTPS SSE writer (Python's ssl, OpenSSL over a socket BIO:
/// every chunk one `SSL_write`) untraced, with the agent on it (TLS
/// source: uprobes on its OpenSSL, plaintext captured and decoded), and
/// with the agent on another process that maps the same libssl (the
/// writer not a target). Alternating, medians over rounds.
fn tls(rounds: usize) -> Result<Vec<Row>> {
    const WRITES: &str = "20000";
    let workload = ["tls", "stream", WRITES];
    let tracers = [
        Tracer::None,
        Tracer::AgentOnWorkload(Hooks::Btf),
        Tracer::AgentElsewhere(Hooks::Btf),
    ];
    let s = rounds_of(&workload, &tracers, rounds)?;
    let per_write_us = |v: &[Sample]| med(v, |x| x.cpu_s / x.writes.max(1.0) * 1e6);
    let rate = |v: &[Sample]| med(v, |x| x.writes / x.wall_s.max(1e-9));
    let (c0, c1, c2) = (
        per_write_us(&s[0]),
        per_write_us(&s[1]),
        per_write_us(&s[2]),
    );
    let (r0, r1, r2) = (rate(&s[0]), rate(&s[1]), rate(&s[2]));
    let events = med(&s[1], |x| x.events);
    Ok(vec![
        row(
            format!("TLS SSE writer CPU per SSL_write (Python ssl, {WRITES} writes of one event)"),
            format!("{c0:.2} µs"),
            format!("{c1:.2} µs"),
            format!(
                "+{:.2} µs per write ({:.2}×); {events:.0} events captured",
                c1 - c0,
                c1 / c0
            ),
            "measured",
        ),
        row(
            "TLS streaming max rate (the same writer, as fast as its reader takes it)",
            format!("{r0:.0} writes/s"),
            format!("{r1:.0} writes/s"),
            format!("{:.2}×", r1 / r0),
            format!("≥ 0.9×: {}", verdict(r1 / r0 >= 0.9)),
        ),
        row(
            "Non-target process using the same libssl (agent's TLS probes on another process)",
            format!("{r0:.0} writes/s, {c0:.2} µs/write"),
            format!("{r2:.0} writes/s, {c2:.2} µs/write"),
            format!("{:.2}× the CPU per write", c2 / c0),
            format!("≤ 1.1×: {}", verdict(c2 / c0 <= 1.1)),
        ),
    ])
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

pub(crate) fn verdict(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "NOT met"
    }
}

/// The engine's tokenizer (`tokenbench`): throughput per core, CPU per
/// 1,000 requests with and without the prefix cache, the budget at 10×.
fn tokens(secs: f64, rounds: usize) -> Result<Vec<Row>> {
    let peers = crate::util::root().join("tests/peers");
    let mut runs = vec![];
    for r in 0..rounds {
        eprint!("\rxtask bench: tokens round {}/{rounds} ...   ", r + 1);
        let out = crate::util::output(
            Command::new(bin("tokenbench"))
                .arg(&peers)
                .arg(secs.to_string()),
        )?;
        runs.push(serde_json::from_str::<Value>(out.trim())?);
    }
    eprintln!();
    let m = |k: &str| median(runs.iter().filter_map(|v| v[k].as_f64()).collect());
    let mut rows = vec![];
    for (name, kind) in [
        ("claude", "tokenizer.json: byte-level BPE, 65k vocabulary"),
        (
            "llama2",
            "tokenizer.json: Metaspace BPE with byte fallback, 32k",
        ),
        ("gguf-llama-spm", "GGUF, llama.cpp's SPM, 32k"),
        (
            "gguf-llama-bpe",
            "GGUF, llama.cpp's BPE, llama3 pre-tokenizer, 128k",
        ),
        (
            "gguf-qwen2",
            "GGUF, llama.cpp's BPE, qwen2 pre-tokenizer, 152k",
        ),
    ] {
        rows.push(row(
            format!("tokenizer throughput, one core: `{name}` ({kind}), 20 kB texts"),
            "–",
            format!("{:.2} M tokens/s", m(&format!("tokens_per_s.{name}")) / 1e6),
            "–",
            "informational",
        ));
    }
    for size in ["2k", "32k"] {
        let un = m(&format!("cpu_ms_per_1k.{size}.uncached"));
        let ca = m(&format!("cpu_ms_per_1k.{size}.cached"));
        rows.push(row(
            format!(
                "agent CPU per 1,000 streamed chats counted with the tokenizer, {size}-token prompts ({} tokens: a conversation growing by one turn a request; Llama-2 tokenizer, Llama-2 chat format); baseline without the prefix cache",
                runs[0][format!("prompt_tokens.{size}.cached")]
            ),
            format!("{:.0} ms", un),
            format!("{:.0} ms", ca),
            format!("{:.1}× less CPU", un / ca.max(1e-9)),
            "the prefix cache pays for multi-turn traffic",
        ));
    }
    let b = &runs[0];
    let f = |k: &str| b[k].as_f64().unwrap_or(0.0);
    rows.push(row(
        "the budget (--tokenize-cpu 0.25) fed 10× the 32k uncached rate a quarter core sustains, one run",
        format!("{:.0} requests/s offered", f("budget.offered_per_s")),
        format!(
            "{:.0} counted, {:.0} past the budget, {:.0} refused (queue full)",
            f("budget.counted"),
            f("budget.over_budget"),
            f("budget.queue_full")
        ),
        format!("{:.2} cores used by the tokenizer thread", f("budget.cores")),
        "≤ 0.25 core (+ its 2 s burst over the run)",
    ));
    Ok(rows)
}

fn decode(secs: f64, rounds: usize) -> Result<Vec<Row>> {
    let mut runs = vec![];
    for r in 0..rounds {
        eprint!("\rxtask bench: decode round {}/{rounds} ...   ", r + 1);
        let out = crate::util::output(Command::new(bin("decodebench")).arg(secs.to_string()))?;
        runs.push(serde_json::from_str::<Value>(out.trim())?);
    }
    eprintln!();
    let m = |k: &str| median(runs.iter().filter_map(|v| v[k].as_f64()).collect());
    let sse = m("sse_events_per_s");
    let serde_only = m("sse_events_per_s_serde_only");
    let ratio = median(
        runs.iter()
            .filter_map(|v| {
                Some(v["sse_events_per_s"].as_f64()? / v["sse_events_per_s_serde_only"].as_f64()?)
            })
            .collect(),
    );
    Ok(vec![row(
        format!(
            "decode, one thread, in-memory mix of 64 keep-alive connections of OpenAI chat streams ({:.1} MB/s of payload); baseline: the same decoder with the chat-chunk pre-scan off (every event through serde), alternating in the same run",
            m("mb_per_s")
        ),
        format!("{serde_only:.0} SSE events/s"),
        format!("{sse:.0} SSE events/s"),
        format!(
            "{ratio:.2}× (median of per-run ratios); {:.0} socket events/s, {:.0} records/s",
            m("socket_events_per_s"),
            m("records_per_s")
        ),
        format!(
            "≥ 1.5× and ≥ 1,500,000/s: {}",
            verdict(ratio >= 1.5 && sse >= 1.5e6)
        ),
    ), {
        let grpc = m("grpc_messages_per_s");
        row(
            "decode, one thread, same run: 64 HTTP/2 connections, each one Triton ModelStreamInfer stream (10 requests × 256 responses, two requests in flight, one gRPC message per DATA frame and write); baseline: the HTTP/1.1 mix above",
            format!("{sse:.0} SSE events/s (HTTP/1.1)"),
            format!("{grpc:.0} gRPC response messages/s"),
            format!(
                "{:.2}× the HTTP/1.1 event rate; {:.0} records/s",
                grpc / sse,
                m("grpc_records_per_s")
            ),
            format!("≥ 1,000,000 messages/s: {}", verdict(grpc >= 1e6)),
        )
    }, {
        let h2 = m("h2_sse_events_per_s");
        row(
            "decode, one thread, same run: 64 h2c connections of the same OpenAI chat streams, 4 streams at once per connection, each SSE event its own DATA frame; baseline: the HTTP/1.1 mix above",
            format!("{sse:.0} SSE events/s (HTTP/1.1)"),
            format!("{h2:.0} SSE events/s over HTTP/2"),
            format!(
                "{:.2}× the HTTP/1.1 rate; {:.0} records/s",
                h2 / sse,
                m("h2_records_per_s")
            ),
            "(reported)".to_string(),
        )
    }])
}

fn capture(secs: f64, rounds: usize) -> Result<Vec<Row>> {
    use Hooks::{Btf, BtfRelease, Reference as Ref, Tracepoint as Tp};
    capture_builds()?;
    let s = format!("{secs}");
    let on = Tracer::AgentOnWorkload;
    let off = Tracer::AgentElsewhere;
    let traced = [Tracer::None, on(Ref), on(Tp), on(Btf), on(BtfRelease)];
    let tcp_max = rounds_of(&["tcp", &s], &traced, rounds)?;
    let tcp_paced = rounds_of(&["tcp", &s, "20000"], &traced, rounds)?;
    let pipe = rounds_of(
        &["pipe", &s],
        &[Tracer::None, Tracer::Floor, off(Ref), off(Btf)],
        rounds,
    )?;
    let sys = rounds_of(&["sys", &s], &[Tracer::None, off(Ref), off(Btf)], rounds)?;
    let bulk = rounds_of(&["bulk", &s], &[Tracer::None, off(Btf)], rounds)?;
    // The programs' own kernel time, from the kernel's run-time statistics:
    // one run per path, outside the timed rounds (statistics add two clock
    // reads to every program run).
    eprintln!("xtask bench: eBPF program run time (BPF_ENABLE_STATS) ...");
    let stats = |w: &[&str], ts: &[Tracer]| -> Result<Vec<Sample>> {
        ts.iter().map(|t| measure_with(w, *t, true)).collect()
    };
    let prog_tcp = stats(&["tcp", &s], &[on(Ref), on(Tp), on(Btf)])?;
    let prog_pipe = stats(&["pipe", &s], &[off(Ref), off(Btf)])?;
    let prog_sys = stats(&["sys", &s], &[off(Ref), off(Btf)])?;
    let mut rows = vec![];
    // "new / reference" for added costs; the target is ≤ 0.5.
    let half = |new: f64, old: f64| {
        let r = new / old;
        (
            format!("{r:.2}× the reference's added cost"),
            format!("≤ 0.5×: {}", verdict(r <= 0.5)),
        )
    };

    let (b, r, t, a) = (&tcp_max[0], &tcp_max[1], &tcp_max[2], &tcp_max[3]);
    let pct = |x: &[Sample]| 100.0 * med(x, Sample::rate) / med(b, Sample::rate);
    rows.push(row(
        "write-heavy SSE server, max rate: throughput (baseline: untraced; the reference = the earlier capture path (per-record ring reads, a wake-up every 64 records); tracepoint = today's syscall-tracepoint programs with batched ring reads, the fallback)",
        format!(
            "{:.0} writes/s; reference {:.0} ({:.1}%); tracepoint {:.0} ({:.1}%)",
            med(b, Sample::rate),
            med(r, Sample::rate),
            pct(r),
            med(t, Sample::rate),
            pct(t)
        ),
        format!("BTF {:.0} writes/s", med(a, Sample::rate)),
        format!("{:.1}% of untraced", pct(a)),
        "–",
    ));
    let nb = med(b, Sample::cpu_ns_per_write);
    let add = |x: &[Sample]| med(x, Sample::cpu_ns_per_write) - nb;
    let (res, target) = half(add(a), add(r));
    rows.push(row(
        "same: server CPU per write(), added by tracing",
        format!(
            "{nb:.0} ns untraced; reference +{:.0} ns; tracepoint +{:.0} ns",
            add(r),
            add(t)
        ),
        format!("BTF +{:.0} ns per traced call", add(a)),
        res,
        target,
    ));
    let (b, r, t, a) = (&tcp_paced[0], &tcp_paced[1], &tcp_paced[2], &tcp_paced[3]);
    let cb = med(b, Sample::cpu_ms_per_s);
    let extra = |x: &[Sample]| (med(x, Sample::cpu_ms_per_s) - cb) / 10.0;
    let (res, target) = half(extra(a), extra(r));
    rows.push(row(
        format!(
            "same server paced at 20,000 writes/s ({:.0} achieved): extra server CPU",
            med(a, Sample::rate)
        ),
        format!(
            "{cb:.2} ms/s untraced; reference +{:.2}% of a core; tracepoint +{:.2}%",
            extra(r),
            extra(t)
        ),
        format!("BTF +{:.2}% of one core", extra(a)),
        res,
        target,
    ));
    let per10k = |set: &[Sample]| {
        let ev_s = med(set, |s| s.events) / secs;
        (
            ev_s,
            100.0 * med(set, |s| s.agent_cpu_s) / secs / (ev_s / 1e4),
            med(set, |s| s.agent_rss_kib) / 1024.0,
        )
    };
    for (name, set, release) in [
        ("max rate", &tcp_max[3], &tcp_max[4]),
        ("20k writes/s", &tcp_paced[3], &tcp_paced[4]),
    ] {
        let (ev_s, cpu, rss) = per10k(set);
        let (rel_ev_s, rel_cpu, _) = per10k(release);
        rows.push(row(
            format!("same, {name}: the release-profile agent (`cargo xtask run`'s build, no LTO) against the dist build (the image's, fat LTO), same rounds"),
            format!("dist {cpu:.2}% of a core per 10k events/s ({ev_s:.0} events/s)"),
            format!("release {rel_cpu:.2}% per 10k events/s ({rel_ev_s:.0} events/s)"),
            format!("release/dist {:.2}×", rel_cpu / cpu),
            "–",
        ));
        rows.push(row(
            format!("agent cost at the SSE server's {name} ({ev_s:.0} events/s), BTF path"),
            "–",
            format!(
                "{:.1}% of a core, peak RSS {rss:.1} MiB",
                100.0 * med(set, |s| s.agent_cpu_s) / secs
            ),
            format!("{cpu:.2}% of a core per 10k events/s"),
            "–",
        ));
    }
    let sent = med(&tcp_max[3], |s| s.sent);
    let dropped = med(&tcp_max[3], |s| s.dropped);
    rows.push(row(
        "ring-buffer drops at the highest sustained rate (SSE server, max rate, BTF path)",
        "–",
        format!("{sent:.0} delivered / {dropped:.0} dropped"),
        format!(
            "{:.3}% dropped",
            100.0 * dropped / (sent + dropped).max(1.0)
        ),
        "–",
    ));
    let (b, f, r, a) = (&pipe[0], &pipe[1], &pipe[2], &pipe[3]);
    let nb = med(b, Sample::cpu_ns_per_write);
    let add = |x: &[Sample]| med(x, Sample::cpu_ns_per_write) - nb;
    let (res, target) = half(add(a), add(r));
    rows.push(row(
        "process NOT targeted, 16-byte pipe write(): added CPU per write (the floor tracer, one lookup on write enter and exit, for scale)",
        format!(
            "{nb:.0} ns untraced; reference +{:.0} ns; floor +{:.0} ns",
            add(r),
            add(f)
        ),
        format!("BTF +{:.0} ns", add(a)),
        res,
        target,
    ));
    let (b, r, a) = (&sys[0], &sys[1], &sys[2]);
    let nb = med(b, Sample::cpu_ns_per_write);
    let add = |x: &[Sample]| med(x, Sample::cpu_ns_per_write) - nb;
    rows.push(row(
        "process NOT targeted, getppid(): added CPU per call (a syscall no program is for; the BTF program runs at every syscall's exit)",
        format!("{nb:.0} ns untraced; reference +{:.0} ns", add(r)),
        format!("BTF +{:.0} ns", add(a)),
        format!("{:+.0} ns vs the reference", add(a) - add(r)),
        "–",
    ));
    // ns of program time and program runs per workload call.
    let per_call = |x: &Sample| {
        (
            x.prog_ns / x.writes.max(1.0),
            x.prog_runs / x.writes.max(1.0),
        )
    };
    // `base`: the paths compared with, the reference first.
    let prog_row = |what: &str, base: &[(&str, &Sample)], btf: &Sample| {
        let (bns, bruns) = per_call(btf);
        row(
            format!("{what}: the agent's eBPF programs' own run time per call (kernel run-time statistics, one run each outside the timed rounds; the tracepoint dispatch around the programs is not in it, the statistics' own two clock reads per program run are)"),
            base.iter()
                .map(|(name, x)| {
                    let (ns, runs) = per_call(x);
                    format!("{name} {ns:.0} ns ({runs:.2} program runs)")
                })
                .collect::<Vec<_>>()
                .join("; "),
            format!("BTF {bns:.0} ns ({bruns:.2} program runs)"),
            match per_call(base[0].1) {
                (_, runs) if runs < 0.01 => "the reference runs no program for it".to_string(),
                (ns, _) => format!("{:.2}× the reference's", bns / ns),
            },
            "–",
        )
    };
    rows.push(prog_row(
        "SSE server writes, targeted",
        &[("reference", &prog_tcp[0]), ("tracepoint", &prog_tcp[1])],
        &prog_tcp[2],
    ));
    rows.push(prog_row(
        "pipe write() of a process NOT targeted",
        &[("reference", &prog_pipe[0])],
        &prog_pipe[1],
    ));
    rows.push(prog_row(
        "getppid() of a process NOT targeted",
        &[("reference", &prog_sys[0])],
        &prog_sys[1],
    ));
    let (b, a) = (&bulk[0], &bulk[1]);
    let mib = |set: &[Sample]| med(set, Sample::rate) * 65536.0 / (1 << 20) as f64;
    let kept = mib(a) / mib(b);
    rows.push(row(
        "bulk TCP transfer between processes NOT targeted (64 KiB writes, loopback): throughput with the arrival program on every received segment",
        format!("{:.0} MiB/s", mib(b)),
        format!("{:.0} MiB/s", mib(a)),
        format!("{:.3}× untraced", kept),
        format!("≥ 0.98×: {}", verdict(kept >= 0.98)),
    ));
    Ok(rows)
}

/// Agent RSS with `n` open connections of a targeted server, each holding
/// a partial request in the decoder.
fn conns(n: usize) -> Result<Vec<Row>> {
    let mut child = Command::new(bin("benchpeer"))
        .args(["conns", &n.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("starting benchpeer conns")?;
    let mut stdin = child.stdin.take().context("stdin")?;
    let rx = lines(child.stdout.take().context("stdout")?);
    let peer = Spawned { child, rx };
    let pid: u32 = wait_ready(&peer.rx, "benchpeer conns")?
        .strip_prefix("ready ")
        .and_then(|p| p.parse().ok())
        .context("benchpeer ready line")?;
    let agent = spawn_tokentap(
        &[
            "run".into(),
            "--pid".into(),
            pid.to_string(),
            "--no-console".into(),
        ],
        None,
    )?;
    std::thread::sleep(Duration::from_millis(500));
    let before = proc_rss_kib(agent.child.id()).0;
    writeln!(stdin, "go")?;
    stdin.flush()?;
    let line = peer
        .rx
        .recv_timeout(Duration::from_secs(180))
        .context("benchpeer conns gave no result")?;
    let opened = serde_json::from_str::<Value>(&line)?["conns"]
        .as_u64()
        .unwrap_or(0);
    std::thread::sleep(Duration::from_secs(2));
    let (after, peak) = proc_rss_kib(agent.child.id());
    drop(agent);
    drop(stdin);
    drop(peer);
    Ok(vec![row(
        format!("agent memory with {opened} open tracked connections (each with a partial request buffered)"),
        format!("RSS {:.1} MiB (0 connections)", before / 1024.0),
        format!("RSS {:.1} MiB (peak {:.1})", after / 1024.0, peak / 1024.0),
        format!("{:.2} KiB per connection", (after - before) / opened.max(1) as f64),
        "–",
    )])
}

/// The agent's memory under held uploads: for each count, that many
/// connections each holding 900 KB of a chat body declared as 1 MB
/// (benchpeer `uploads`), the agent on the server with its defaults
/// (`--max-decode-memory` 64 MiB, a 16 MiB ring). Its peak RSS, what its
/// decoder held at most, what it shed and what the kernel left unread
/// (from its shutdown line).
fn hostile(counts: &[usize]) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    for &n in counts {
        let mut child = Command::new(bin("benchpeer"))
            .args(["uploads", &n.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("starting benchpeer uploads")?;
        let _stdin = child.stdin.take().context("stdin")?;
        let rx = lines(child.stdout.take().context("stdout")?);
        let peer = Spawned { child, rx };
        let ready = wait_ready(&peer.rx, "benchpeer uploads")?;
        let mut words = ready.split_whitespace().skip(1);
        let (Some(pid), Some(port)) = (
            words.next().and_then(|p| p.parse::<u32>().ok()),
            words.next().and_then(|p| p.parse::<u16>().ok()),
        ) else {
            bail!("benchpeer uploads: a ready line without pid and port: {ready}");
        };
        let agent = spawn_tokentap(
            &[
                "run".into(),
                "--pid".into(),
                pid.to_string(),
                "--no-console".into(),
                "--no-gpu".into(),
            ],
            None,
        )?;
        std::thread::sleep(Duration::from_millis(500));
        let before = proc_rss_kib(agent.child.id()).0;
        // The clients in a process of their own, not the target's child.
        let mut clients = Command::new(bin("benchpeer"))
            .args(["uploads-client", &port.to_string(), &n.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .context("starting benchpeer uploads-client")?;
        let line = peer
            .rx
            .recv_timeout(Duration::from_secs(600))
            .context("benchpeer uploads gave no result")?;
        let done: Value = serde_json::from_str(&line)?;
        let opened = done["conns"].as_u64().unwrap_or(0);
        let gb = done["bytes"].as_u64().unwrap_or(0) as f64 / 1e9;
        std::thread::sleep(Duration::from_secs(3));
        let (_, peak) = proc_rss_kib(agent.child.id());
        // SAFETY: a plain signal to our own child.
        unsafe { libc::kill(agent.child.id() as i32, libc::SIGINT) };
        let summary = shutdown_line(&agent.rx);
        drop(agent);
        drop(peer);
        let stats = |key: &str| -> Value {
            summary
                .split_once(&format!("; {key} "))
                .and_then(|(_, rest)| {
                    let j = rest.split("; ").next().unwrap_or(rest);
                    serde_json::from_str(j).ok()
                })
                .unwrap_or(Value::Null)
        };
        drop(clients.stdin.take());
        let _ = clients.wait();
        let (cap, dec) = (stats("capture"), stats("decode"));
        let shed: u64 = dec["shed"]
            .as_object()
            .map_or(0, |m| m.values().filter_map(Value::as_u64).sum());
        rows.push(row(
            format!("agent peak RSS with {opened} connections each holding 900 KB of a declared 1 MB chat body ({gb:.1} GB sent)"),
            format!("RSS {:.1} MiB (0 connections)", before / 1024.0),
            format!(
                "peak {:.1} MiB; decoder held ≤ {:.1} MiB, shed {shed}; kernel left {} reads unread, dropped {}",
                peak / 1024.0,
                dec["held_bytes_peak"].as_f64().unwrap_or(0.0) / 1048576.0,
                cap["bodies_left"].as_u64().unwrap_or(0),
                cap["records_dropped"].as_u64().unwrap_or(0),
            ),
            format!("{:.1} KiB per connection", (peak - before).max(0.0) / opened.max(1) as f64),
            "< 200 MiB peak (the base DaemonSet's limit is 256 MiB)",
        ));
    }
    Ok(rows)
}

/// The agent's shutdown line (`… requests recorded …; capture {…}; decode {…}`),
/// waited for up to 10 s after SIGINT.
fn shutdown_line(rx: &mpsc::Receiver<String>) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        match rx.recv_timeout(left) {
            Ok(l) if l.contains("requests recorded") => return l,
            Ok(_) => {}
            Err(_) => break,
        }
    }
    String::new()
}

/// The real-engine rows (tests/src/bin/enginebench.rs).
fn engine(rounds: usize) -> Result<Vec<Row>> {
    eprintln!("xtask bench: real engine (llama.cpp), {rounds} rounds ...");
    let out = crate::util::output(
        Command::new(bin("enginebench"))
            .args([rounds.to_string(), "32".into()])
            .env("TOKENTAP_BIN", bin("tokentap"))
            .stderr(Stdio::inherit()),
    )?;
    let v: Value =
        serde_json::from_str(out.trim()).with_context(|| format!("enginebench said {out:?}"))?;
    let f = |k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    let mut rows = vec![
        row(
            "real engine (llama-server) under load: requests/s",
            format!("{:.2}/s", f("untraced_req_s")),
            format!("{:.2}/s", f("traced_req_s")),
            format!(
                "{:.1}% of untraced",
                100.0 * f("traced_req_s") / f("untraced_req_s")
            ),
            "–",
        ),
        row(
            "same: output tokens/s",
            format!("{:.0}/s", f("untraced_tok_s")),
            format!("{:.0}/s", f("traced_tok_s")),
            format!(
                "{:.1}% of untraced",
                100.0 * f("traced_tok_s") / f("untraced_tok_s")
            ),
            "–",
        ),
        row(
            format!("same: agent cost ({:.0} events/s)", f("agent_events_per_s")),
            "–",
            format!(
                "{:.1}% of a core, peak RSS {:.1} MiB",
                100.0 * f("agent_cpu_frac"),
                f("agent_peak_rss_kib") / 1024.0
            ),
            // At a few hundred events/s the agent's fixed costs (10 ms
            // ring polls, 1 s ticks) dominate: a per-10k figure would
            // extrapolate them, so rows 5–6 carry that figure.
            "fixed costs dominate at this rate",
            "–",
        ),
    ];
    for e in v["fidelity"].as_array().into_iter().flatten() {
        let g = |k: &str| e[k].as_f64().unwrap_or(f64::NAN);
        rows.push(row(
            format!(
                "TTFT / TPOT difference vs the openai client, {} ({} of {} requests matched)",
                e["engine"].as_str().unwrap_or("?"),
                e["matched"],
                e["requests"]
            ),
            "–",
            format!(
                "abs ΔTTFT p50 {:.3} ms, p99 {:.3} ms (n={}); abs ΔTPOT p50 {:.3} ms, p99 {:.3} ms (n={}); ΔTTFT split: before the engine's read p99 {:.3} ms, t1 → client p99 {:.3} ms",
                g("ttft_p50_ms"),
                g("ttft_p99_ms"),
                e["ttft_n"],
                g("tpot_p50_ms"),
                g("tpot_p99_ms"),
                e["tpot_n"],
                g("before_read_p99_ms"),
                g("to_client_p99_ms")
            ),
            format!("p99 abs ΔTTFT {:.3} ms", g("ttft_p99_ms")),
            format!("≤ 2 ms: {}", verdict(g("ttft_p99_ms") <= 2.0)),
        ));
    }
    Ok(rows)
}
