//! The `tokentap` command line.

use std::{path::PathBuf, process::ExitCode, time::Duration};

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use tokentap::{
    capfile::Writer,
    capture::{Capture, CaptureOptions},
    console::Console,
    decode::Decoder,
    discover,
    event::SocketEvent,
    metrics::{Metrics, MetricsConfig, OtlpProtocol},
    requests::RequestLog,
    source::EventSource,
};

/// tokentap measures LLM inference services (TTFT, TPOT, tokens, request
/// rate) from the kernel: eBPF programs timestamp an engine's socket reads
/// and writes, so nothing in the engine changes.
///
/// Capturing needs root (or CAP_BPF, CAP_PERFMON and CAP_SYS_ADMIN to mount
/// tracefs). Replaying a capture file needs nothing.
#[derive(Parser)]
#[command(
    name = "tokentap",
    version,
    propagate_version = true,
    args_override_self = true
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the agent: capture the engines' traffic, decode every LLM
    /// request, write the request log, show the live console view, export
    /// OTLP metrics.
    ///
    /// With no --pid/--port it finds inference servers itself (vLLM,
    /// SGLang, TGI, llama.cpp, Ollama, Triton, LMDeploy: by command line,
    /// among processes listening on TCP) and keeps looking every 5 s.
    ///
    /// Example: tokentap run --port 8000 --requests-log requests.jsonl --otlp-endpoint http://127.0.0.1:4317
    Run(RunArgs),
    /// Record the raw socket traffic of processes to a capture file.
    ///
    /// The file is JSON Lines, one socket event per line (open, data,
    /// close); payload bytes are base64. It holds prompts and completions,
    /// so it is created with mode 0600. Feed it to `tokentap replay` to
    /// reproduce anything seen in the field without root.
    ///
    /// Example: tokentap capture --port 8000 --out llm.jsonl --duration 60
    Capture(CaptureArgs),
    /// Read a capture file back through the same event stream the live
    /// agent uses.
    ///
    /// Malformed lines are reported with their line number and skipped.
    Replay(ReplayArgs),
    /// Benchmark helper: attach only the reference "floor" programs (one
    /// map lookup on write enter/exit) for SECS seconds.
    #[command(hide = true)]
    Floor {
        #[arg(long, value_name = "SECS", default_value_t = 10.0)]
        duration: f64,
    },
}

#[derive(Args)]
struct RunArgs {
    /// Read options from a TOML file: keys are the long option names
    /// (`requests-log = "/var/log/tokentap.jsonl"`, `pid = [1234]`,
    /// `no-console = true`, `otlp-endpoint = "http://collector:4317"`).
    /// Options given on the command line win; lists are joined.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Capture this inference-server process (repeatable).
    #[arg(long = "pid", value_name = "PID")]
    pids: Vec<u32>,
    /// Only server connections on this local port (repeatable). Without
    /// --pid, every process listening on it is captured.
    #[arg(long = "port", value_name = "PORT")]
    ports: Vec<u16>,
    /// Append one JSON object per finished request to PATH ("-" for
    /// stdout; the console then goes to stderr). No prompt or completion
    /// text is written. Keys: docs/metrics.md.
    #[arg(long, value_name = "PATH")]
    requests_log: Option<PathBuf>,
    /// Do not show the console view.
    #[arg(long)]
    no_console: bool,
    /// Sliding window of the console view, in seconds.
    #[arg(long, value_name = "SECS", default_value_t = 60)]
    console_window: u64,
    /// Seconds between console updates (default: 1 on a terminal, 10 as
    /// plain lines otherwise).
    #[arg(long, value_name = "SECS")]
    console_interval: Option<f64>,
    /// Stop after this many seconds (default: until Ctrl-C / SIGTERM).
    #[arg(long, value_name = "SECS")]
    duration: Option<f64>,
    /// Export OTLP metrics to this collector (e.g. http://127.0.0.1:4317
    /// for gRPC, http://127.0.0.1:4318 for HTTP). Without it, metrics are
    /// exported only when OTEL_EXPORTER_OTLP_ENDPOINT is set.
    #[arg(long, value_name = "URL")]
    otlp_endpoint: Option<String>,
    /// OTLP transport: grpc or http/protobuf (default: OTEL_EXPORTER_OTLP_PROTOCOL, else grpc).
    #[arg(long, value_name = "PROTO")]
    otlp_protocol: Option<String>,
    /// Seconds between metric exports.
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    export_interval: f64,
    /// Export base-2 exponential histograms instead of the semantic
    /// conventions' explicit buckets.
    #[arg(long)]
    exponential_histograms: bool,
    /// Distinct model names used as metric attribute values; later ones
    /// are exported as "other" (cardinality cap).
    #[arg(long, value_name = "N", default_value_t = 64)]
    max_models: usize,
    #[command(flatten)]
    kernel: KernelArgs,
}

#[derive(Args)]
struct CaptureArgs {
    /// Capture this process (repeatable).
    #[arg(long = "pid", value_name = "PID")]
    pids: Vec<u32>,
    /// Only server connections on this local port (repeatable). Without
    /// --pid, captures every process listening on it.
    #[arg(long = "port", value_name = "PORT")]
    ports: Vec<u16>,
    /// Capture file to write ("-" for stdout).
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
    /// Stop after this many seconds (default: until Ctrl-C / SIGTERM).
    #[arg(long, value_name = "SECS")]
    duration: Option<f64>,
    #[command(flatten)]
    kernel: KernelArgs,
}

/// Kernel-side capture settings.
#[derive(Args, Clone)]
struct KernelArgs {
    /// Ring buffer between kernel and agent, in bytes (a power of two,
    /// ≥ 4096). When it is full the kernel drops records and counts them;
    /// traced processes never wait.
    #[arg(long, value_name = "BYTES", default_value_t = 16 << 20)]
    ring_buffer_bytes: u32,
    /// Payload bytes captured per syscall at most (the rest is counted in
    /// the event's `ret`, not captured). Capped at 1 MiB.
    #[arg(long, value_name = "BYTES", default_value_t = agent_ebpf::DEFAULT_MAX_CALL_BYTES)]
    max_call_bytes: u32,
    /// Connections tracked at once at most.
    #[arg(long, value_name = "N", default_value_t = 65536)]
    max_conns: u32,
}

impl KernelArgs {
    /// Capture options for these targets with these kernel settings.
    fn options(&self, pids: &[u32], ports: &[u16]) -> CaptureOptions {
        CaptureOptions {
            pids: pids.to_vec(),
            ports: ports.to_vec(),
            ring_bytes: self.ring_buffer_bytes,
            max_call_bytes: self.max_call_bytes,
            max_conns: self.max_conns,
            ..CaptureOptions::default()
        }
    }
}

#[derive(Args)]
struct ReplayArgs {
    /// Capture file written by `tokentap capture` (or any tool following
    /// the format in docs/architecture.md).
    file: PathBuf,
    /// Write the events read, normalised, as JSON Lines ("-" for stdout).
    #[arg(long, value_name = "PATH")]
    events: Option<PathBuf>,
    /// Decode the events and write one JSON object per finished LLM
    /// request ("-" for stdout). Keys: see docs/metrics.md.
    #[arg(long, value_name = "PATH")]
    requests_log: Option<PathBuf>,
}

/// `tokentap run --config FILE …`: the file's options, as command-line
/// arguments placed before the user's (so the user's win).
fn config_args(args: &[String]) -> Result<Vec<String>> {
    let Some(run_at) = args.iter().position(|a| a == "run") else {
        return Ok(args.to_vec());
    };
    let path = args.iter().enumerate().skip(run_at).find_map(|(i, a)| {
        a.strip_prefix("--config=").map(str::to_string).or_else(|| {
            (a == "--config")
                .then(|| args.get(i + 1).cloned())
                .flatten()
        })
    });
    let Some(path) = path else {
        return Ok(args.to_vec());
    };
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read config file {path}"))?;
    let table: toml::Table =
        toml::from_str(&text).with_context(|| format!("config file {path} is not valid TOML"))?;
    let known: Vec<String> = {
        use clap::CommandFactory as _;
        let cmd = Cli::command();
        cmd.find_subcommand("run")
            .map(|r| {
                r.get_arguments()
                    .filter_map(|a| a.get_long().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut extra = vec![];
    for (key, value) in table {
        let name = key.replace('_', "-");
        if name == "config" || name == "help" || !known.contains(&name) {
            bail!("config file {path}: unknown option `{key}` (the keys are `tokentap run` long option names, see `tokentap run --help`)");
        }
        let flag = format!("--{name}");
        let scalar = |v: &toml::Value| -> Result<String> {
            Ok(match v {
                toml::Value::String(s) => s.clone(),
                toml::Value::Integer(i) => i.to_string(),
                toml::Value::Float(f) => f.to_string(),
                other => bail!("config file {path}: `{key}` has an unsupported value {other:?}"),
            })
        };
        match &value {
            toml::Value::Boolean(true) => extra.push(flag),
            toml::Value::Boolean(false) => {}
            toml::Value::Array(items) => {
                for it in items {
                    extra.push(flag.clone());
                    extra.push(scalar(it)?);
                }
            }
            v => {
                extra.push(flag);
                extra.push(scalar(v)?);
            }
        }
    }
    let mut out = args[..=run_at].to_vec();
    out.extend(extra);
    out.extend_from_slice(&args[run_at + 1..]);
    Ok(out)
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let args: Vec<String> = std::env::args().collect();
    let args = match config_args(&args) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("tokentap: error: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    let cli = Cli::parse_from(args);
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("tokentap: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let res = rt.block_on(async {
        match cli.cmd {
            Cmd::Run(a) => run(a).await,
            Cmd::Capture(a) => capture(a).await,
            Cmd::Replay(a) => replay(a).await,
            Cmd::Floor { duration } => floor(duration).await,
        }
    });
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tokentap: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Resolves when SIGINT or SIGTERM arrives.
async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        std::future::pending::<()>().await;
        return;
    };
    tokio::select! {
        _ = int.recv() => {},
        _ = term.recv() => {},
    }
}

fn stdout_is_terminal() -> bool {
    // SAFETY: isatty has no preconditions.
    unsafe { libc::isatty(1) == 1 }
}

fn now_wall_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

async fn run(a: RunArgs) -> Result<()> {
    // No --pid/--port: find inference servers by command line and keep
    // looking for new ones.
    let discovering = a.pids.is_empty() && a.ports.is_empty();
    let proc_root = std::path::PathBuf::from("/proc");
    let mut engines: std::collections::HashMap<u32, &'static str> =
        std::collections::HashMap::new();
    let opts = CaptureOptions {
        allow_no_targets: discovering,
        ..a.kernel.options(&a.pids, &a.ports)
    };
    let mut log = match &a.requests_log {
        Some(p) => Some(RequestLog::create(p)?),
        None => None,
    };
    let log_on_stdout = a
        .requests_log
        .as_deref()
        .is_some_and(|p| p.as_os_str() == "-");
    let tty = stdout_is_terminal() && !log_on_stdout;
    let show = !a.no_console;
    let every = Duration::from_secs_f64(
        a.console_interval
            .unwrap_or(if tty { 1.0 } else { 10.0 })
            .max(0.1),
    );
    let mut console = Console::new(a.console_window);
    let protocol = match &a.otlp_protocol {
        Some(p) => p.parse::<OtlpProtocol>().map_err(anyhow::Error::msg)?,
        None => std::env::var("OTEL_EXPORTER_OTLP_PROTOCOL")
            .ok()
            .and_then(|p| p.parse().ok())
            .unwrap_or(OtlpProtocol::Grpc),
    };
    let export =
        a.otlp_endpoint.is_some() || std::env::var_os("OTEL_EXPORTER_OTLP_ENDPOINT").is_some();
    let mut metrics = if export {
        Some(Metrics::new(&MetricsConfig {
            endpoint: a.otlp_endpoint.clone(),
            protocol,
            interval: Duration::from_secs_f64(a.export_interval.max(0.1)),
            exponential: a.exponential_histograms,
            max_models: a.max_models,
        })?)
    } else {
        None
    };

    let mut cap = Capture::start(&opts)?;
    let mut batch: Vec<SocketEvent> = Vec::new();
    cap.seed(&mut batch);
    for pid in cap.targets() {
        if let Some(e) = discover::engine_of(&proc_root, pid) {
            engines.insert(pid, e);
        }
    }
    if discovering {
        for (pid, engine) in discover::scan(&proc_root) {
            if cap.add_target(pid, &mut batch)? {
                eprintln!("tokentap: found {engine} (pid {pid})");
            }
            engines.insert(pid, engine);
        }
        eprintln!(
            "tokentap: watching for inference servers (vLLM, SGLang, TGI, llama.cpp, Ollama, Triton, LMDeploy); found {}; ready",
            cap.targets().len()
        );
    } else {
        eprintln!(
            "tokentap: running on pids {:?}{}; ready",
            cap.targets(),
            if a.ports.is_empty() {
                String::new()
            } else {
                format!(" ports {:?}", a.ports)
            }
        );
    }
    let mut rescan = tokio::time::interval(Duration::from_secs(5));
    rescan.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut src = EventSource::Live(Box::new(cap));
    let mut decoder = Decoder::new();
    let mut records = Vec::new();
    let deadline = async {
        match a.duration {
            Some(s) => tokio::time::sleep(Duration::from_secs_f64(s.max(0.0))).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(deadline);
    let stop = shutdown_signal();
    tokio::pin!(stop);
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        for ev in batch.drain(..) {
            decoder.on_event(&ev, &mut records);
        }
        for mut r in records.drain(..) {
            if r.provider.is_none() {
                r.provider = engines.get(&r.pid).copied();
            }
            if let Some(l) = log.as_mut() {
                l.write(&r)?;
            }
            console.record(&r);
            if let Some(m) = metrics.as_mut() {
                m.record(&r);
            }
        }
        tokio::select! {
            res = src.next_batch(&mut batch) => { res?; }
            _ = tick.tick() => {
                if let Some(l) = log.as_mut() {
                    l.flush()?;
                }
                if let Some(m) = metrics.as_ref() {
                    use std::sync::atomic::Ordering::Relaxed;
                    let st = src.capture_stats().unwrap_or_default();
                    m.health.events.store(st.events, Relaxed);
                    m.health.dropped.store(st.records_dropped, Relaxed);
                    m.health.connections.store(st.conns_active as i64, Relaxed);
                    m.health.decode_errors.store(decoder.stats.desyncs, Relaxed);
                    m.health.in_flight.store(decoder.in_flight() as i64, Relaxed);
                }
                if show {
                    let rows = console.rows(now_wall_ns());
                    let st = src.capture_stats().unwrap_or_default();
                    let health = format!(
                        "events {} dropped {} conns {} decode errors {}",
                        st.events, st.records_dropped, st.conns_active, decoder.stats.desyncs
                    );
                    if tty {
                        print!("\x1b[2J\x1b[H{}", Console::render(&rows, decoder.in_flight(), &health));
                        let _ = std::io::Write::flush(&mut std::io::stdout());
                    } else {
                        for line in Console::lines(&rows, decoder.in_flight()) {
                            if log_on_stdout { eprintln!("{line}") } else { println!("{line}") }
                        }
                    }
                }
            }
            _ = rescan.tick(), if discovering => {
                if let Some(cap) = src.live_mut() {
                    for (pid, engine) in discover::scan(&proc_root) {
                        if cap.add_target(pid, &mut batch)? {
                            eprintln!("tokentap: found {engine} (pid {pid})");
                        }
                        engines.insert(pid, engine);
                    }
                }
            }
            _ = &mut deadline => break,
            _ = &mut stop => break,
        }
    }
    src.finish(&mut batch);
    for ev in batch.drain(..) {
        decoder.on_event(&ev, &mut records);
    }
    for mut r in records.drain(..) {
        if r.provider.is_none() {
            r.provider = engines.get(&r.pid).copied();
        }
        if let Some(l) = log.as_mut() {
            l.write(&r)?;
        }
        if let Some(m) = metrics.as_mut() {
            m.record(&r);
        }
    }
    if let Some(l) = log.as_mut() {
        l.flush()?;
    }
    if let Some(m) = metrics.take() {
        // Blocking final export, off the async workers (the gRPC client
        // needs them to make progress meanwhile).
        let _ = tokio::task::spawn_blocking(move || m.shutdown()).await;
    }
    let st = src.capture_stats().unwrap_or_default();
    eprintln!(
        "tokentap: {} requests recorded, {} still in flight at shutdown (not recorded); capture {}; decode {}",
        decoder.stats.records,
        decoder.in_flight(),
        serde_json::to_string(&st).unwrap_or_default(),
        serde_json::to_string(&decoder.stats).unwrap_or_default()
    );
    Ok(())
}

async fn capture(a: CaptureArgs) -> Result<()> {
    if a.pids.is_empty() && a.ports.is_empty() {
        bail!(
            "capture needs at least one --pid PID or --port PORT (see `tokentap capture --help`)"
        );
    }
    let opts = a.kernel.options(&a.pids, &a.ports);
    let mut writer = Writer::create(&a.out)?;
    if a.out.as_os_str() != "-" {
        eprintln!(
            "tokentap: writing {} with mode 0600: it contains request and response payloads (prompts, completions)",
            a.out.display()
        );
    }
    let mut cap = Capture::start(&opts)?;
    let mut batch: Vec<SocketEvent> = Vec::new();
    cap.seed(&mut batch);
    eprintln!(
        "tokentap: capturing pids {:?}{}; ready",
        cap.targets(),
        if a.ports.is_empty() {
            String::new()
        } else {
            format!(" ports {:?}", a.ports)
        }
    );
    let mut src = EventSource::Live(Box::new(cap));
    let deadline = async {
        match a.duration {
            Some(s) => tokio::time::sleep(Duration::from_secs_f64(s.max(0.0))).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(deadline);
    let stop = shutdown_signal();
    tokio::pin!(stop);
    loop {
        for ev in batch.drain(..) {
            writer.write(&ev)?;
        }
        tokio::select! {
            r = src.next_batch(&mut batch) => { r?; }
            _ = &mut deadline => break,
            _ = &mut stop => break,
        }
    }
    src.finish(&mut batch);
    for ev in batch.drain(..) {
        writer.write(&ev)?;
    }
    writer.flush()?;
    if let Some(st) = src.capture_stats() {
        eprintln!(
            "tokentap: {} events written; stats {}",
            writer.events,
            serde_json::to_string(&st).unwrap_or_default()
        );
    }
    Ok(())
}

async fn floor(secs: f64) -> Result<()> {
    let _ebpf = tokentap::capture::attach_floor()?;
    eprintln!("tokentap: floor programs attached; ready");
    tokio::select! {
        _ = tokio::time::sleep(Duration::from_secs_f64(secs.max(0.0))) => {},
        _ = shutdown_signal() => {},
    }
    Ok(())
}

async fn replay(a: ReplayArgs) -> Result<()> {
    let mut src = EventSource::replay(&a.file)?;
    let mut writer = match &a.events {
        Some(p) => Some(Writer::create(p)?),
        None => None,
    };
    let mut log = match &a.requests_log {
        Some(p) => Some(RequestLog::create(p)?),
        None => None,
    };
    let mut decoder = Decoder::new();
    let mut records = Vec::new();
    let mut batch = Vec::new();
    let mut n = 0u64;
    loop {
        let more = src.next_batch(&mut batch).await?;
        n += batch.len() as u64;
        if let Some(w) = writer.as_mut() {
            for ev in &batch {
                w.write(ev)?;
            }
        }
        if let Some(l) = log.as_mut() {
            for ev in &batch {
                decoder.on_event(ev, &mut records);
            }
            if !more {
                decoder.finish(&mut records);
            }
            for r in records.drain(..) {
                l.write(&r)?;
            }
        }
        batch.clear();
        if !more {
            break;
        }
    }
    if let Some(w) = writer.as_mut() {
        w.flush()?;
    }
    if let Some(l) = log.as_mut() {
        l.flush()?;
        eprintln!(
            "tokentap: {} requests decoded; decode stats {}",
            l.records,
            serde_json::to_string(&decoder.stats).unwrap_or_default()
        );
    }
    for b in src.bad_lines() {
        eprintln!(
            "tokentap: {}:{}: skipped malformed line: {}",
            a.file.display(),
            b.line_no,
            b.error
        );
    }
    eprintln!(
        "tokentap: replayed {n} events from {} ({} malformed lines skipped)",
        a.file.display(),
        src.bad_lines().len()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_file_options_come_before_the_command_line_so_it_wins() {
        let dir = std::env::temp_dir().join(format!("tokentap-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("c.toml");
        std::fs::write(&f, "pid = [1, 2]\nno-console = true\nexport_interval = 2.5\nexponential-histograms = false\n").unwrap();
        let args: Vec<String> = [
            "tokentap",
            "run",
            "--config",
            f.to_str().unwrap(),
            "--export-interval",
            "3",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let out = config_args(&args).unwrap();
        let cli = Cli::try_parse_from(&out).unwrap();
        let Cmd::Run(r) = cli.cmd else {
            panic!("not run")
        };
        assert_eq!(r.pids, vec![1, 2]);
        assert!(r.no_console);
        assert!(!r.exponential_histograms);
        assert_eq!(r.export_interval, 3.0);
        std::fs::write(&f, "nope = 1\n").unwrap();
        assert!(format!("{:#}", config_args(&args).unwrap_err()).contains("unknown option `nope`"));
    }
}
