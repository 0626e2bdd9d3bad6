//! The engine-metrics task: keeps the scraper's targets in step with the
//! engines being captured (each target that listens on a TCP port), and
//! publishes the latest scraped state for the metrics sink.
//!
//! Owns: which engines are scraped, on which port. Must not: scrape on the
//! pipeline's thread (the scraper has its own).

use std::{
    collections::HashMap,
    sync::{atomic::Ordering, Arc, Mutex},
};

use anyhow::Result;

use super::{scrape::ScrapeHandle, EngineState, Target};
use crate::engines::Engine;
use crate::stage::{health::Health, Task, TaskCx};
use crate::vocab::UNKNOWN;

/// Engine pid → (engine name, port, state) of the last good scrape.
pub type SharedEngineStates = Arc<Mutex<HashMap<u32, (String, u16, EngineState)>>>;

pub struct EngineMetricsTask {
    handle: ScrapeHandle,
    /// Only these ports when `--port` was given (else each engine's first
    /// listening port).
    ports: Vec<u16>,
    states: SharedEngineStates,
    health: Arc<Health>,
    failures_seen: u64,
}

impl EngineMetricsTask {
    pub fn new(
        handle: ScrapeHandle,
        ports: Vec<u16>,
        states: SharedEngineStates,
        health: Arc<Health>,
    ) -> Self {
        Self {
            handle,
            ports,
            states,
            health,
            failures_seen: 0,
        }
    }
}

impl Task for EngineMetricsTask {
    fn tick(&mut self, cx: &mut TaskCx<'_>) -> Result<()> {
        let mut targets = Vec::new();
        let mut meta = HashMap::new();
        for (&pid, p) in &cx.node.processes {
            // A gateway's /metrics is its engine's, proxied (or its own).
            if cx.node.gateways.contains(&pid) {
                continue;
            }
            let port = p
                .listen_ports
                .iter()
                .copied()
                .find(|port| self.ports.is_empty() || self.ports.contains(port));
            let Some(port) = port else {
                continue;
            };
            meta.insert(pid, (p.engine, port));
            targets.push(Target {
                pid,
                port,
                engine: p.engine,
            });
        }
        targets.sort_by_key(|t| t.pid);
        self.handle.set_targets(targets);
        let latest = self.handle.latest();
        let mut states = self.states.lock().unwrap_or_else(|p| p.into_inner());
        states.clear();
        for (pid, st) in latest {
            if let Some((engine, port)) = meta.get(&pid) {
                let name = engine
                    .or(st.family)
                    .map_or(UNKNOWN, Engine::name)
                    .to_string();
                states.insert(pid, (name, *port, st));
            }
        }
        let s = self.handle.stats();
        let failures = s.timeouts + s.refused + s.http_errors + s.parse_errors + s.other_errors;
        if failures > self.failures_seen {
            self.health
                .scrape_failures
                .fetch_add(failures - self.failures_seen, Ordering::Relaxed);
            self.failures_seen = failures;
        }
        Ok(())
    }
}
