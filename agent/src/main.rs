//! The `tokentap` command line.

use std::{path::PathBuf, process::ExitCode, time::Duration};

use anyhow::{bail, Context, Result};
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use tokentap::{
    capfile::Writer,
    capture::Capture,
    event::SocketEvent,
    pipeline::{
        config::run_plan,
        plan::{tenant_header_names, KernelFlags, ProcessEnv, RunFlags},
        run::{deadline, shutdown_signal, ReplayPlan},
    },
    source::EventSource,
};

/// `run --help`'s description; the engines it finds come from the
/// catalogue (`engines::Engine::ALL`).
fn run_long_about() -> String {
    format!(
        "Run the agent: capture the engines' traffic, decode every LLM request, write the \
         request log, show the live console view, export OTLP metrics.\n\n\
         With no --pid/--port it finds inference servers itself ({}: by command line, among \
         processes listening on TCP) and keeps looking every 5 s.\n\n\
         Example: tokentap run --port 8000 --requests-log requests.jsonl --otlp-endpoint \
         http://127.0.0.1:4317",
        tokentap::engines::Engine::titles()
    )
}

const EBPF_ENV_HELP: &str =
    "Environment: TOKENTAP_EBPF_OBJECT=PATH loads the eBPF programs from PATH \
instead of the ones built into this binary (for testing; the object's record-layout version must \
match this agent's, or it is refused). RUST_LOG=info|debug for diagnostics.";

/// tokentap measures LLM inference services (TTFT, TPOT, tokens, request
/// rate) from the kernel: eBPF programs timestamp an engine's socket reads
/// and writes, so nothing in the engine changes.
///
/// Capturing (`run`, `capture`) needs root, or CAP_BPF + CAP_PERFMON +
/// CAP_SYS_PTRACE + CAP_DAC_READ_SEARCH (+ CAP_SYS_ADMIN only where tracefs
/// is not mounted); docs/deploy.md, "Privileges". Replaying a capture file
/// needs nothing.
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
    #[command(after_help = EBPF_ENV_HELP, long_about = run_long_about())]
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
    /// Say what moved a served model's latency, errors and tokens: the
    /// chain of evidence per engine and model from an events log (and a
    /// requests log) — changes, shifts with their causes, each change's
    /// impact, the callers involved, the numbers per model version.
    ///
    /// Example: tokentap explain --events events.jsonl --requests
    /// requests.jsonl --since 2026-12-07T08:00:00Z --engine vllm
    Explain(ExplainArgs),
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
}

#[derive(Args)]
struct CaptureArgs {
    /// Capture this process (repeatable).
    #[arg(long = "pid", value_name = "PID", value_parser = clap::value_parser!(u32).range(1..))]
    pids: Vec<u32>,
    /// Only server connections on this local port (repeatable). Without
    /// --pid, captures every process listening on it.
    #[arg(long = "port", value_name = "PORT", value_parser = clap::value_parser!(u16).range(1..))]
    ports: Vec<u16>,
    /// Capture file to write ("-" for stdout).
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
    /// Stop after this many seconds, ≥ 0 (default: until Ctrl-C / SIGTERM).
    #[arg(long, value_name = "SECS", value_parser = tokentap::pipeline::plan::secs_at_least_zero)]
    duration: Option<f64>,
    #[command(flatten)]
    kernel: KernelFlags,
}

#[derive(Args)]
struct ExplainArgs {
    /// The events log (`tokentap run --events-log`; "-" for stdin).
    #[arg(long, value_name = "FILE")]
    events: PathBuf,
    /// The requests log (`--requests-log`; "-" for stdin): the numbers per
    /// model version and the callers.
    #[arg(long, value_name = "FILE")]
    requests: Option<PathBuf>,
    /// Only from this time on (RFC 3339, e.g. 2026-12-07T08:00:00Z).
    #[arg(long, value_name = "TIME", value_parser = rfc3339_time)]
    since: Option<std::time::SystemTime>,
    /// Only up to this time (RFC 3339).
    #[arg(long, value_name = "TIME", value_parser = rfc3339_time)]
    until: Option<std::time::SystemTime>,
    /// Only this engine (`gen_ai.provider.name`: vllm, llama.cpp, …).
    #[arg(long, value_name = "ENGINE")]
    engine: Option<String>,
    /// Only this served model (`gen_ai.request.model`).
    #[arg(long, value_name = "MODEL")]
    model: Option<String>,
    /// One JSON object (groups, their events, versions, callers, answers)
    /// instead of text.
    #[arg(long)]
    json: bool,
}

fn rfc3339_time(s: &str) -> Result<std::time::SystemTime, String> {
    tokentap::pipeline::explain::parse_time(s)
        .map_err(|e| format!("{s}: not an RFC 3339 time ({e}); e.g. 2026-12-07T08:00:00Z"))
}

fn explain(a: ExplainArgs) -> Result<()> {
    use std::io::BufReader;
    let open = |p: &PathBuf| -> Result<Box<dyn std::io::BufRead>> {
        if p.as_os_str() == "-" {
            Ok(Box::new(BufReader::new(std::io::stdin())))
        } else {
            let f =
                std::fs::File::open(p).with_context(|| format!("cannot open {}", p.display()))?;
            Ok(Box::new(BufReader::new(f)))
        }
    };
    if a.events.as_os_str() == "-" && a.requests.as_ref().is_some_and(|r| r.as_os_str() == "-") {
        bail!("--events and --requests cannot both be stdin (\"-\")");
    }
    let events = open(&a.events)?;
    let requests = a.requests.as_ref().map(open).transpose()?;
    let filter = tokentap::pipeline::explain::Filter {
        since: a.since,
        until: a.until,
        engine: a.engine,
        model: a.model,
    };
    let report = tokentap::pipeline::explain::explain(events, requests, &filter)?;
    if a.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", tokentap::pipeline::explain::render(&report));
    }
    Ok(())
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
    /// Also write requests that are not LLM requests (probes, scrapes,
    /// unknown paths) with `operation: null`, as `run` does.
    #[arg(long)]
    log_all_requests: bool,
    /// Run the timeline detectors on the decoded requests and write their
    /// events as JSON Lines ("-" for stdout).
    #[arg(long, value_name = "PATH")]
    events_log: Option<PathBuf>,
    /// Take the request's tenant from this header (repeatable; as `run`).
    #[arg(long = "tenant-header", value_name = "NAME")]
    tenant_headers: Vec<String>,
    /// Key for `api_key_id`: the bytes of this file (give the live agent's
    /// to get the ids it exported). Without it: this node's install key
    /// (/var/lib/tokentap/api-key-salt) when there is one, else a random
    /// key for this replay (ids agree within it only).
    #[arg(long, value_name = "PATH")]
    api_key_salt_file: Option<PathBuf>,
    /// The agent's config file: its `[[request_type]]` rules and `[events]`
    /// thresholds apply, as they did live (its other keys are ignored).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
}

fn main() -> ExitCode {
    // rustls-platform-verifier logs each refused certificate at ERROR; the
    // export failure line already says why (sinks::otlp::exporter::ExplainingClient).
    env_logger::Builder::from_env(
        env_logger::Env::default().default_filter_or("warn,rustls_platform_verifier=off"),
    )
    .init();
    // TLS (an https:// collector, the Kubernetes API) is rustls with ring
    // throughout; clients that do not name a provider take this one.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let matches = Cli::command().get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    // `run`: its config file's options go under the command line's.
    let plan = match (&cli.cmd, matches.subcommand_matches("run")) {
        (Cmd::Run(flags), Some(given)) => match run_plan((**flags).clone(), given, &ProcessEnv) {
            Ok(p) => Some(p),
            Err(e) => {
                eprintln!("tokentap: error: {e:#}");
                return ExitCode::FAILURE;
            }
        },
        _ => None,
    };
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
            Cmd::Run(_) => match plan {
                Some(plan) => tokentap::pipeline::run::run(plan).await,
                None => unreachable!("`run` was resolved above"),
            },
            Cmd::Capture(a) => capture(a).await,
            Cmd::Replay(a) => match tenant_header_names(&a.tenant_headers) {
                Ok(tenant_headers) => {
                    let plan = ReplayPlan {
                        events: a.events,
                        requests_log: a.requests_log,
                        log_all_requests: a.log_all_requests,
                        events_log: a.events_log,
                        tenant_headers,
                        api_key_salt_file: a.api_key_salt_file,
                        config: a.config,
                    };
                    tokentap::pipeline::run::replay(&a.file, &plan).await
                }
                Err(e) => Err(e),
            },
            Cmd::Explain(a) => explain(a),
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
    tokentap::capture::check_privileges()?;
    let opts = a.kernel.options(&a.pids, &a.ports);
    // Attach first: a capture that cannot start leaves no empty file.
    let mut cap = Capture::start(&opts)?;
    let mut writer = Writer::create(&a.out)?;
    if a.out.as_os_str() != "-" {
        eprintln!(
            "tokentap: writing {} with mode 0600: it contains request and response payloads (prompts, completions)",
            a.out.display()
        );
    }
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
    let end = deadline(a.duration.map(Duration::from_secs_f64));
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
