//! The `tokentap` command line.

use std::{path::PathBuf, process::ExitCode, time::Duration};

use anyhow::{bail, Result};
use clap::{Args, Parser, Subcommand};
use tokentap::{
    capfile::Writer,
    capture::Capture,
    event::SocketEvent,
    pipeline::{
        plan::{merge_config_file, resolve, run_option_names, KernelFlags, ProcessEnv, RunFlags},
        run::{deadline, shutdown_signal},
    },
    source::EventSource,
};

const EBPF_ENV_HELP: &str =
    "Environment: TOKENTAP_EBPF_OBJECT=PATH loads the eBPF programs from PATH \
instead of the ones built into this binary (for testing; the object's record-layout version must \
match this agent's, or it is refused). RUST_LOG=info|debug for diagnostics.";

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
    #[command(after_help = EBPF_ENV_HELP)]
    Run(Box<RunFlags>),
    /// Record the raw socket traffic of processes to a capture file.
    ///
    /// The file is JSON Lines, one socket event per line (open, data,
    /// close); payload bytes are base64. It holds prompts and completions,
    /// so it is created with mode 0600. Feed it to `tokentap replay` to
    /// reproduce anything seen in the field without root.
    ///
    /// Example: tokentap capture --port 8000 --out llm.jsonl --duration 60
    #[command(after_help = EBPF_ENV_HELP)]
    Capture(CaptureArgs),
    /// Read a capture file back through the same event stream the live
    /// agent uses.
    ///
    /// Malformed lines are reported with their line number and skipped.
    Replay(ReplayArgs),
    /// Sample the GPUs through NVML for a while and print what tokentap
    /// sees: per device utilisation, memory, power, energy per pass, the
    /// processes on it; with --pid, which GPUs that process tree uses.
    /// Needs no eBPF. Used by `cargo xtask gpu-check`.
    GpuCheck {
        /// Seconds to sample.
        #[arg(long, value_name = "SECS", default_value_t = 20.0)]
        secs: f64,
        /// Seconds between samples.
        #[arg(long, value_name = "SECS", default_value_t = 1.0)]
        interval: f64,
        /// Show which GPUs this process (and its children, its container)
        /// uses.
        #[arg(long, value_name = "PID")]
        pid: Option<u32>,
        /// The NVML library to load (default: the system's libnvidia-ml.so.1).
        #[arg(long, value_name = "PATH", env = "TOKENTAP_NVML_LIBRARY")]
        nvml_library: Option<PathBuf>,
    },
    /// Benchmark helper: attach only the reference "floor" programs (one
    /// map lookup on write enter/exit) for SECS seconds.
    #[command(hide = true)]
    Floor {
        #[arg(long, value_name = "SECS", default_value_t = 10.0)]
        duration: f64,
    },
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
    kernel: KernelFlags,
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
    /// Run the timeline detectors (default thresholds) on the decoded
    /// requests and write their events as JSON Lines ("-" for stdout).
    #[arg(long, value_name = "PATH")]
    events_log: Option<PathBuf>,
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let args: Vec<String> = std::env::args().collect();
    let args = match merge_config_file(&args, &run_option_names()) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("tokentap: error: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    let cli = Cli::parse_from(args);
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
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
            Cmd::Run(a) => match resolve(&a, &ProcessEnv) {
                Ok(plan) => tokentap::pipeline::run::run(plan).await,
                Err(e) => Err(e),
            },
            Cmd::Capture(a) => capture(a).await,
            Cmd::Replay(a) => {
                tokentap::pipeline::run::replay(
                    &a.file,
                    a.events.as_deref(),
                    a.requests_log.as_deref(),
                    a.events_log.as_deref(),
                )
                .await
            }
            Cmd::Floor { duration } => floor(duration).await,
            Cmd::GpuCheck {
                secs,
                interval,
                pid,
                nvml_library,
            } => tokentap::gpu::check::run(
                nvml_library,
                Duration::from_secs_f64(interval.max(0.05)),
                secs,
                pid,
            ),
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
        "tokentap: capturing pids {:?}{}; data hooks {}; ready",
        cap.targets(),
        if a.ports.is_empty() {
            String::new()
        } else {
            format!(" ports {:?}", a.ports)
        },
        cap.data_hooks().name()
    );
    let mut src = EventSource::Live(Box::new(cap));
    let end = deadline(a.duration.map(|s| Duration::from_secs_f64(s.max(0.0))));
    tokio::pin!(end);
    let stop = shutdown_signal();
    tokio::pin!(stop);
    loop {
        for ev in batch.drain(..) {
            writer.write(&ev)?;
        }
        tokio::select! {
            r = src.next_batch(&mut batch) => { r?; }
            _ = &mut end => break,
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
