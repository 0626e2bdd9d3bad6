//! Each engine process's own info endpoint (the catalogue's
//! `InfoEndpoint`: vLLM `/version`, TGI `/info`, llama.cpp `/props`, …),
//! asked **once per process** from inside its network namespace, carrying
//! this run's own-traffic token like the metrics scrape, on a thread of its
//! own. What it says — the engine's build and its effective settings —
//! goes into the process's facts in [`NodeState`] (`engine_version`,
//! `serving_config`), where the enricher puts them on records and the
//! timeline compares them.
//!
//! An engine that does not answer yet (loading its model) is asked again,
//! [`ATTEMPTS`] times at most, [`RETRY`] apart; then its facts are final
//! without it (`info_settled`), as for an engine without such an endpoint.
//!
//! Must not: block the pipeline (the thread does the network), keep
//! anything of an answer but what `identity::engine_info` reads.

use std::{
    collections::HashMap,
    sync::{Arc, Condvar, Mutex},
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::Result;

use super::scrape::Scraper;
use crate::{
    engines::Engine,
    identity::engine_info::{self, EngineInfo},
    selftraffic::Marker,
    stage::{Task, TaskCx},
};

/// Times an engine's info endpoint is asked at most.
pub const ATTEMPTS: u32 = 5;
/// Time between two attempts.
pub const RETRY: Duration = Duration::from_secs(2);

#[derive(Default)]
struct Shared {
    queue: Vec<(u32, u16, Engine)>,
    done: Vec<(u32, Option<EngineInfo>)>,
    stop: bool,
}

struct Asked {
    attempts: u32,
    next: Instant,
    pending: bool,
}

pub struct EngineInfoTask {
    shared: Arc<(Mutex<Shared>, Condvar)>,
    thread: Option<JoinHandle<()>>,
    asked: HashMap<u32, Asked>,
    /// Ask the endpoints (off: `--no-engine-info`; the facts from /proc
    /// are then final at once).
    ask: bool,
    published: SharedEngineInfo,
}

/// One engine process as `tokentap.engine.info` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineFacts {
    pub engine: String,
    pub model: Option<String>,
    pub model_version: Option<String>,
    pub engine_version: Option<String>,
    pub serving_config_version: Option<String>,
}

/// Engine pid → its facts, for the `tokentap.engine.info` gauge.
pub type SharedEngineInfo = Arc<Mutex<HashMap<u32, EngineFacts>>>;

/// `tokentap.engine.info`: 1 per serving engine process, its build,
/// serving configuration and model versions as attributes (a dashboard
/// overlays them; a change is a new series).
pub struct EngineInfoInstruments(pub SharedEngineInfo);

impl crate::stage::InstrumentSet for EngineInfoInstruments {
    fn register(
        &self,
        meter: &opentelemetry::metrics::Meter,
        _engines: &crate::stage::EngineNames,
    ) -> Box<dyn std::any::Any + Send> {
        use opentelemetry::KeyValue;
        let st = self.0.clone();
        let _ = meter
            .u64_observable_gauge("tokentap.engine.info")
            // No unit: an info gauge (Prometheus `tokentap_engine_info`).
            .with_unit("")
            .with_description(
                "1 per serving engine process: its build, serving configuration and model versions",
            )
            .with_callback(move |o| {
                let st = st.lock().unwrap_or_else(|p| p.into_inner());
                for (pid, f) in st.iter() {
                    let mut a = vec![
                        KeyValue::new("gen_ai.provider.name", f.engine.clone()),
                        KeyValue::new("tokentap.engine.pid", *pid as i64),
                    ];
                    if let Some(v) = &f.model {
                        a.push(KeyValue::new("gen_ai.request.model", v.clone()));
                    }
                    if let Some(v) = &f.model_version {
                        a.push(KeyValue::new("tokentap.model.version", v.clone()));
                    }
                    if let Some(v) = &f.engine_version {
                        a.push(KeyValue::new("tokentap.engine.version", v.clone()));
                    }
                    if let Some(v) = &f.serving_config_version {
                        a.push(KeyValue::new("tokentap.serving_config.version", v.clone()));
                    }
                    o.observe(1, &a);
                }
            })
            .build();
        Box::new(())
    }
}

impl EngineInfoTask {
    /// Starts the asking thread (when `ask`); its requests carry
    /// `marker`. What it learns is published in `published`.
    pub fn spawn(marker: Marker, ask: bool, published: SharedEngineInfo) -> std::io::Result<Self> {
        let shared: Arc<(Mutex<Shared>, Condvar)> = Arc::default();
        let sh = shared.clone();
        let mut scraper = Scraper::new(super::scrape::DEFAULT_TIMEOUT, marker);
        let thread = std::thread::Builder::new()
            .name("tt-engineinfo".into())
            .spawn(move || loop {
                let asks = {
                    let (m, cv) = &*sh;
                    let mut st = m.lock().unwrap_or_else(|p| p.into_inner());
                    while st.queue.is_empty() && !st.stop {
                        st = cv.wait(st).unwrap_or_else(|p| p.into_inner());
                    }
                    if st.stop {
                        return;
                    }
                    std::mem::take(&mut st.queue)
                };
                for (pid, port, engine) in asks {
                    let Some(ep) = engine.spec().info.as_ref() else {
                        continue;
                    };
                    let got = match scraper.get(pid, port, ep.path) {
                        Ok(body) => engine_info::parse(engine, &body),
                        Err(e) => {
                            log::debug!("engine info: pid {pid} port {port} {}: {e}", ep.path);
                            None
                        }
                    };
                    let (m, _) = &*sh;
                    m.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .done
                        .push((pid, got));
                }
            })?;
        Ok(Self {
            shared,
            thread: Some(thread),
            asked: HashMap::new(),
            ask,
            published,
        })
    }
}

impl Drop for EngineInfoTask {
    fn drop(&mut self) {
        let (m, cv) = &*self.shared;
        m.lock().unwrap_or_else(|p| p.into_inner()).stop = true;
        cv.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Task for EngineInfoTask {
    fn tick(&mut self, cx: &mut TaskCx<'_>) -> Result<()> {
        let now = Instant::now();
        let done = {
            let (m, _) = &*self.shared;
            std::mem::take(&mut m.lock().unwrap_or_else(|p| p.into_inner()).done)
        };
        for (pid, got) in done {
            let Some(a) = self.asked.get_mut(&pid) else {
                continue;
            };
            a.pending = false;
            let Some(p) = cx.node.processes.get_mut(&pid) else {
                continue;
            };
            match got {
                Some(info) => {
                    if info.version.is_some() {
                        p.engine_version = info.version;
                    }
                    p.serving_config = p
                        .serving_config
                        .take()
                        .map(|c| c.with_settings(&info.settings));
                    p.info_settled = true;
                }
                None if a.attempts >= ATTEMPTS => p.info_settled = true,
                None => {}
            }
        }
        let mut ask = Vec::new();
        for (&pid, p) in cx.node.processes.iter_mut() {
            if p.info_settled || p.listen_ports.is_empty() || cx.node.gateways.contains(&pid) {
                continue;
            }
            let Some(engine) = p.engine.filter(|e| self.ask && e.spec().info.is_some()) else {
                // Nothing to ask: the facts read from /proc are final.
                p.info_settled = true;
                continue;
            };
            let a = self.asked.entry(pid).or_insert(Asked {
                attempts: 0,
                next: now,
                pending: false,
            });
            if a.pending || now < a.next {
                continue;
            }
            a.attempts += 1;
            a.next = now + RETRY;
            a.pending = true;
            ask.push((pid, p.listen_ports[0], engine));
        }
        let procs = &cx.node.processes;
        self.asked.retain(|pid, _| procs.contains_key(pid));
        let serving = cx.node.serving_pids();
        let facts: HashMap<u32, EngineFacts> = serving
            .into_iter()
            .filter_map(|pid| {
                let p = &procs[&pid];
                Some((
                    pid,
                    EngineFacts {
                        engine: p.engine?.name().to_string(),
                        model: p.model.clone(),
                        model_version: p.model_version.clone(),
                        engine_version: p.engine_version.clone(),
                        serving_config_version: p
                            .serving_config
                            .as_ref()
                            .map(|c| c.version.clone()),
                    },
                ))
            })
            .collect();
        *self.published.lock().unwrap_or_else(|p| p.into_inner()) = facts;
        if !ask.is_empty() {
            let (m, cv) = &*self.shared;
            m.lock()
                .unwrap_or_else(|p| p.into_inner())
                .queue
                .extend(ask);
            cv.notify_all();
        }
        Ok(())
    }
}
