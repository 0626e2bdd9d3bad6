//! Drivers: `tokentap run` (live capture through the pipeline until a
//! signal or `--duration`) and `tokentap replay` (a capture file through
//! the same pipeline). They build the pipeline from a plan; they hold no
//! per-request logic.

use std::{path::Path, sync::Arc, time::Duration};

use anyhow::{bail, Context, Result};

use super::{
    enrich::{Container, EngineName, KubePods, ModelVersion},
    plan::{IdentityPlan, RunPlan, Targeting},
    targets::Targeter,
    Pipeline, TICK,
};
use crate::{
    capfile::Writer,
    capture::{Capture, ProcEvent},
    decode::IdentityConfig,
    enginemetrics::task::{EngineMetricsTask, SharedEngineStates},
    event::SocketEvent,
    gpu::{
        instruments::SharedGpu,
        sampler::{self, SamplerConfig},
        stage::{GpuStage, SharedView},
        task::GpuTask,
    },
    host::kube::KubeMeta,
    identity::{
        caller::{load_key, ApiKeyHasher, CallerConfig, INSTALL_KEY_PATH},
        request_type::Rules,
    },
    sinks::{console::ConsoleSink, otlp::Metrics, requests_log::RequestLog},
    source::EventSource,
    stage::{health::Health, Task, TaskCx},
};

/// Resolves when SIGINT or SIGTERM arrives.
pub async fn shutdown_signal() {
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

/// Resolves after `d`, or never.
pub async fn deadline(d: Option<Duration>) {
    match d {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

/// Reads what tenants and API-key ids need. Runs before anything starts:
/// an unreadable salt file stops the agent here, naming the file.
pub fn identity(plan: &IdentityPlan, rules: Rules, install_key: &Path) -> Result<IdentityConfig> {
    let (key, origin) = load_key(plan.api_key_salt_file.as_deref(), install_key)?;
    if let Some(n) = origin.notice() {
        eprintln!("{n}");
    }
    let hasher = ApiKeyHasher::new(&key)?;
    Ok(IdentityConfig::new(
        CallerConfig::new(&plan.tenant_headers, Some(hasher)),
        rules,
    ))
}

/// The live agent.
pub async fn run(plan: RunPlan) -> Result<()> {
    // Missing privileges first: nothing else is worth saying without them.
    // With probes the agent stays up, not ready, saying the kernel's own
    // refusal (a DaemonSet pod shows NotReady, not a crash loop).
    if plan.health_addr.is_none() {
        crate::capture::check_privileges()?;
    }
    let id = identity(
        &plan.identity,
        plan.request_types.clone(),
        Path::new(INSTALL_KEY_PATH),
    )?;
    let mut events_cfg = plan.events.clone();
    // The callers with events of their own are those the metrics name.
    events_cfg.named_callers = plan.max_tenants;
    let health = Arc::new(Health::default());
    if let Some(addr) = plan.health_addr {
        super::healthz::serve(addr, health.clone()).await?;
    }
    let mut pipe = Pipeline::new(health.clone())
        .identity(id)
        .max_decode_memory(plan.max_decode_memory)
        .enricher(EngineName)
        .enricher(Container)
        .enricher(ModelVersion)
        .timeline(crate::timeline::Timeline::new(events_cfg), true);
    if plan.tokenize_cpu > 0.0 {
        pipe = pipe.tokens(super::tokens::TokensStage::start(
            plan.tokenize_cpu,
            plan.tokenize_check_ratio,
            health.clone(),
        )?);
    }
    if let Some(node) = &plan.kube_node {
        // After ModelVersion: a pod's model-version label overrides it.
        let km = KubeMeta::start(node).await?;
        eprintln!("tokentap: naming pods from the Kubernetes API (pods on node {node})");
        pipe = pipe.enricher(KubePods(km));
    }
    // Sinks are built before capture starts, so a bad path or endpoint
    // fails before anything is attached.
    if let Some(p) = &plan.requests_log {
        pipe = pipe.sink(Box::new(
            RequestLog::create(p)?.all_requests(plan.log_all_requests),
        ));
    }
    if let Some(p) = &plan.events_log {
        pipe = pipe.sink(Box::new(crate::sinks::events_log::EventLog::create(p)?));
    }
    if let Some(c) = &plan.console {
        pipe = pipe.sink(Box::new(ConsoleSink::new(c.clone())));
    }
    let mut instruments: Vec<Box<dyn crate::stage::InstrumentSet>> = Vec::new();
    let mut side_tasks: Vec<Box<dyn Task>> = Vec::new();
    // The scrapes and info requests reach the engines' sockets, which are
    // captured: they carry a token the decoder recognises, and are not LLM
    // traffic.
    let marker = crate::selftraffic::Marker::new();
    if plan.engine_metrics.is_some() || plan.engine_info {
        pipe = pipe.self_marker(marker.clone());
    }
    {
        let published = crate::enginemetrics::info::SharedEngineInfo::default();
        let task = crate::enginemetrics::info::EngineInfoTask::spawn(
            marker.clone(),
            plan.engine_info,
            published.clone(),
        )
        .context("starting the engine-info thread")?;
        side_tasks.push(Box::new(task));
        instruments.push(Box::new(crate::enginemetrics::info::EngineInfoInstruments(
            published,
        )));
    }
    if let Some(every) = plan.engine_metrics {
        let handle = crate::enginemetrics::scrape::spawn(every, marker)
            .context("starting the engine-metrics scraper thread")?;
        let states = SharedEngineStates::default();
        let ports = match &plan.targeting {
            Targeting::Ports(p) | Targeting::Pids { ports: p, .. } => p.clone(),
            Targeting::Discover => vec![],
        };
        let task = EngineMetricsTask::new(handle, ports, states.clone(), health.clone());
        instruments.push(Box::new(
            crate::enginemetrics::instruments::EngineStateInstruments(states),
        ));
        side_tasks.push(Box::new(task));
    }
    // NVML starts once every sink is built (below), so what it says about
    // the GPUs never comes before an error in the flags, the config file or
    // the collector settings.
    let mut gpu_devices = None;
    if plan.gpu.is_some() {
        let devices = SharedGpu::default();
        let view = SharedView::default();
        pipe = pipe.gpu(GpuStage::new(view.clone()));
        instruments.push(Box::new(
            crate::gpu::engine_instruments::EngineGpuInstruments(view),
        ));
        instruments.push(Box::new(crate::gpu::instruments::DeviceInstruments(
            devices.clone(),
        )));
        gpu_devices = Some(devices);
    }
    if let Some(m) = &plan.metrics {
        pipe = pipe.sink(Box::new(Metrics::new(m, health.clone(), instruments)?));
        if let Some(s) = crate::sinks::otlp::events::EventExport::for_collector(m, health.clone())?
        {
            pipe = pipe.sink(Box::new(s));
        }
        if let Some(s) = crate::sinks::otlp::traces::TraceExport::for_collector(m, health.clone())?
        {
            pipe = pipe.sink(Box::new(s));
        }
    }

    let end = deadline(plan.duration);
    tokio::pin!(end);
    let stop = shutdown_signal();
    tokio::pin!(stop);

    crate::capture::check_pids(&plan.capture)?;
    if let (Some(g), Some(devices)) = (&plan.gpu, gpu_devices) {
        // NVML on its own thread; without it (no GPU, no driver) it says
        // why once and retries, and requests are measured as usual. Started
        // before the programs load, so its first samples (the engine ↔ GPU
        // map) are there by the time the agent says it is ready.
        let sampler = sampler::spawn(SamplerConfig::new(g.library.clone(), g.interval));
        side_tasks.push(Box::new(GpuTask::new(
            sampler,
            devices,
            plan.capture.proc_root.clone(),
        )));
    }
    let mut cap = match Capture::start(&plan.capture) {
        Ok(c) => c,
        // With probes, a kernel that refuses the programs leaves the agent
        // running and not ready (the pod shows NotReady with the reason),
        // retrying in case the node is fixed; without, it exits.
        Err(e) if plan.health_addr.is_some() => {
            attach_retrying(&plan, &health, e, &mut end, &mut stop).await?
        }
        Err(e) => return Err(e),
    };
    let mut batch = Vec::new();
    cap.seed(&mut batch);
    let mut targeter = Targeter::new(
        plan.targeting.clone(),
        plan.capture.proc_root.clone(),
        plan.tokenize_cpu > 0.0,
    );
    let ready = targeter.start(&mut cap, &mut pipe.node, &mut batch)?;
    eprintln!("{ready}");
    // Ready once the engines running now are targeted in the kernel, not
    // merely once the programs are attached: a request sent on the strength
    // of /readyz must be measured.
    health.set_ready(Ok(()));
    let mut src = EventSource::Live(Box::new(cap));
    // Targeting first: it names the processes the other tasks look at.
    let mut tasks: Vec<Box<dyn Task>> = vec![Box::new(targeter)];
    tasks.extend(side_tasks);
    let mut procs = Vec::new();
    let every = plan.console.as_ref().map_or(TICK, |c| c.every.min(TICK));
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        health.beat();
        pipe.events(&mut batch)?;
        if let Some(cap) = src.live_mut() {
            cap.set_decode_pressure(pipe.decoder().over_budget());
        }
        tokio::select! {
            res = src.next_batch(&mut batch) => {
                res?;
                // Process events (a new server's exec or listen) are acted
                // on as they arrive, not at the next tick.
                if let Some(cap) = src.live_mut() {
                    cap.take_proc_events(&mut procs);
                }
                if !procs.is_empty() {
                    run_tasks(&mut tasks, &mut src, &mut pipe, &mut batch, &mut procs)?;
                }
            }
            _ = tick.tick() => {
                run_tasks(&mut tasks, &mut src, &mut pipe, &mut batch, &mut procs)?;
                pipe.tick(src.capture_stats().as_ref())?;
            }
            _ = &mut end => break,
            _ = &mut stop => break,
        }
    }
    src.finish(&mut batch);
    pipe.events(&mut batch)?;
    let stats = src.capture_stats();
    let sum = pipe.shutdown(stats.as_ref())?;
    eprintln!(
        "tokentap: {} requests recorded, {} still in flight at shutdown (not recorded), {} not LLM requests and {} own scrapes (counted, not recorded); capture {}; decode {}",
        sum.records,
        sum.in_flight,
        sum.health.non_llm_requests,
        sum.health.self_requests,
        serde_json::to_string(&stats.unwrap_or_default()).unwrap_or_default(),
        sum.decode
    );
    Ok(())
}

/// How often a refused attach is tried again.
const ATTACH_RETRY: Duration = Duration::from_secs(30);

/// Keeps trying to attach after `first` failed, answering probes (alive,
/// not ready with the error). Told to stop first, it returns the last
/// error, so the exit status says the agent never measured.
async fn attach_retrying(
    plan: &RunPlan,
    health: &Health,
    first: anyhow::Error,
    end: &mut (impl std::future::Future<Output = ()> + Unpin),
    stop: &mut (impl std::future::Future<Output = ()> + Unpin),
) -> Result<Capture> {
    let mut last = first;
    let why = |e: &anyhow::Error| format!("{e:#}");
    eprintln!(
        "tokentap: {}; /readyz answers 503 and attaching is retried every {} s",
        why(&last),
        ATTACH_RETRY.as_secs()
    );
    health.set_ready(Err(why(&last)));
    let mut beat = tokio::time::interval(Duration::from_secs(1));
    let mut next = tokio::time::Instant::now() + ATTACH_RETRY;
    loop {
        tokio::select! {
            _ = beat.tick() => {
                health.beat();
                if tokio::time::Instant::now() < next {
                    continue;
                }
                next += ATTACH_RETRY;
                match Capture::start(&plan.capture) {
                    Ok(c) => {
                        eprintln!("tokentap: eBPF programs attached");
                        return Ok(c);
                    }
                    Err(e) => {
                        health.set_ready(Err(why(&e)));
                        last = e;
                    }
                }
            }
            _ = &mut *end => break,
            _ = &mut *stop => break,
        }
    }
    Err(last.context("stopped before the eBPF programs could be attached"))
}

fn run_tasks(
    tasks: &mut [Box<dyn Task>],
    src: &mut EventSource,
    pipe: &mut Pipeline,
    batch: &mut Vec<SocketEvent>,
    procs: &mut Vec<ProcEvent>,
) -> Result<()> {
    for t in tasks.iter_mut() {
        t.tick(&mut TaskCx {
            capture: src.live_mut(),
            node: &mut pipe.node,
            events: batch,
            proc_events: procs,
        })?;
    }
    procs.clear();
    pipe.gpu_samples()
}

/// What `replay` writes, and the identity settings it decodes with.
#[derive(Clone, Debug, Default)]
pub struct ReplayPlan {
    pub events: Option<std::path::PathBuf>,
    pub requests_log: Option<std::path::PathBuf>,
    /// `--log-all-requests`: non-LLM requests too, `operation: null`.
    pub log_all_requests: bool,
    pub events_log: Option<std::path::PathBuf>,
    /// Tenant headers (lowercase; `plan::tenant_header_names`).
    pub tenant_headers: Vec<String>,
    /// The key `api_key_id` is made with; None: the node's install key if
    /// there is one, else a random key for this replay.
    pub api_key_salt_file: Option<std::path::PathBuf>,
    /// The agent's config file: its `[[request_type]]` rules and `[events]`
    /// thresholds apply (its other keys are `run`'s and are ignored).
    pub config: Option<std::path::PathBuf>,
}

/// A capture file through the same pipeline (no enrichers that need the
/// live node: its processes are not this machine's).
pub async fn replay(file: &Path, plan: &ReplayPlan) -> Result<()> {
    let key = crate::identity::caller::replay_key(
        plan.api_key_salt_file.as_deref(),
        Path::new(INSTALL_KEY_PATH),
    )?;
    let hasher = Some(ApiKeyHasher::new(&key)?);
    let (rules, events_cfg) = match &plan.config {
        Some(p) => {
            let c = super::config::ConfigFile::load(p)?;
            (c.request_types, c.events)
        }
        None => (Rules::default(), crate::timeline::Config::default()),
    };
    let id = IdentityConfig::new(CallerConfig::new(&plan.tenant_headers, hasher), rules);
    let (events, requests_log, events_log) = (
        plan.events.as_deref(),
        plan.requests_log.as_deref(),
        plan.events_log.as_deref(),
    );
    if events.is_none() && requests_log.is_none() && events_log.is_none() {
        eprintln!(
            "tokentap: nothing will be written: give --requests-log PATH (request records), \
             --events-log PATH (timeline events) or --events PATH (the socket events); \
             \"-\" is stdout. Checking the file only"
        );
    }
    let mut src = EventSource::replay(file)?;
    let mut writer = events.map(Writer::create).transpose()?;
    let mut pipe = Pipeline::new(Arc::new(Health::default())).identity(id);
    if let Some(p) = requests_log {
        pipe = pipe.sink(Box::new(
            RequestLog::create(p)?.all_requests(plan.log_all_requests),
        ));
    }
    if let Some(p) = events_log {
        // The records' own clock: the same events as when they were live
        // (the config file's thresholds, else the defaults).
        pipe = pipe
            .timeline(crate::timeline::Timeline::new(events_cfg), false)
            .sink(Box::new(crate::sinks::events_log::EventLog::create(p)?));
    }
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
        pipe.events(&mut batch)?;
        if !more {
            break;
        }
    }
    pipe.end_of_input()?;
    if let Some(w) = writer.as_mut() {
        w.flush()?;
    }
    let sum = pipe.shutdown(None)?;
    for b in src.bad_lines() {
        eprintln!(
            "tokentap: {}:{}: skipped malformed line: {}",
            file.display(),
            b.line_no,
            b.error
        );
    }
    if requests_log.is_some() {
        eprintln!(
            "tokentap: {} requests recorded, {} not LLM requests (counted, not recorded); decode stats {}",
            sum.records, sum.health.non_llm_requests, sum.decode
        );
    }
    eprintln!(
        "tokentap: replayed {n} events from {} ({} malformed lines skipped)",
        file.display(),
        src.bad_lines().len()
    );
    if n == 0 && !src.bad_lines().is_empty() {
        bail!(
            "{}: no line is a capture event (is it a capture file? `tokentap capture --out FILE` writes one)",
            file.display()
        );
    }
    Ok(())
}
