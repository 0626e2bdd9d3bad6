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
}

impl EngineInfoTask {
    /// Starts the asking thread; its requests carry `marker`.
    pub fn spawn(marker: Marker) -> std::io::Result<Self> {
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
            let Some(engine) = p.engine.filter(|e| e.spec().info.is_some()) else {
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
