//! The agent's one data path: **source → decoder → enrichers → sinks**,
//! plus periodic tasks. `tokentap run` and `tokentap replay` build the same
//! [`Pipeline`]; only the source differs (live kernel capture or a capture
//! file).
//!
//! ```text
//!  EventSource ──SocketEvent──▶ Decoder ──Finished──▶ Enrichers ──▶ Sinks
//!  (capture | capfile)                    (identity)     (request log,
//!        ▲                                    ▲           console, OTLP)
//!        └──── Tasks (targeting, …) ──▶ NodeState ───────┘   ▲ Health
//! ```
//!
//! A new capability is a new [`Enricher`] (identity on a finished record),
//! [`Task`] (periodic work: finding engines, sampling GPUs) or [`Sink`]
//! (an output), registered where the pipeline is built ([`run`]) — not a
//! new branch in `main.rs`.
//!
//! Owns: the fan-out to sinks, the order of stages, health publication,
//! the shutdown sequence. Must not: parse bytes (decode) or know a sink's
//! format.

pub mod enrich;
pub mod health;
pub mod healthz;
pub mod plan;
pub mod run;
pub mod targets;

use std::{collections::HashMap, sync::Arc, time::Duration};

use anyhow::Result;

use self::{enrich::Enricher, health::Health};
use crate::{
    capture::{Capture, CaptureStats, ProcEvent},
    decode::Decoder,
    event::SocketEvent,
    gpu::{join::ProcSnapshot, stage::GpuStage, types::GpuSample},
    record::{Finished, RouteClass},
};

pub use self::plan::{resolve, RunPlan};

/// An output of finished requests (and of periodic state).
pub trait Sink {
    /// One finished, enriched LLM request.
    fn record(&mut self, f: &Finished) -> Result<()>;
    /// A finished request that is not an LLM request (a probe, a scrape, a
    /// model listing, an unknown path: [`Finished::non_llm_route`]),
    /// enriched with the engine's identity. Sinks that count or log such
    /// traffic override this; nothing LLM-related may see it.
    fn other_request(&mut self, _f: &Finished, _class: RouteClass) -> Result<()> {
        Ok(())
    }
    /// One timeline event (engine, model version, caller, drift, GPU);
    /// sinks that show or export events override this.
    fn event(&mut self, _e: &crate::timeline::Event) -> Result<()> {
        Ok(())
    }
    /// Periodic work: flush, redraw, publish. Called once per pipeline tick.
    fn tick(&mut self, t: &Tick<'_>) -> Result<()>;
    /// Last chance to flush or export; called once, after the last record.
    fn shutdown(self: Box<Self>, t: &Tick<'_>) -> Result<()>;
}

/// What a sink sees at a tick.
pub struct Tick<'a> {
    /// Wall-clock nanoseconds now.
    pub now_ns: u64,
    pub health: &'a health::HealthSnapshot,
}

/// What the agent knows about processes on this node, written by tasks
/// (targeting today; container, GPU and model identity next) and read by
/// enrichers.
#[derive(Default, Debug)]
pub struct NodeState {
    pub processes: HashMap<u32, ProcessInfo>,
    /// GPU samples (with the /proc facts the join needs) not yet taken by
    /// the pipeline's GPU stage.
    pub gpu_samples: Vec<(GpuSample, ProcSnapshot)>,
    /// NVML stopped answering (every GPU lost, driver gone): the GPU stage
    /// forgets its engine map until samples come back.
    pub gpu_unavailable: bool,
}

impl NodeState {
    /// Targets that serve HTTP (listen on TCP): the engines requests are
    /// attributed to. Their children (GPU workers) are targets too, but
    /// belong to them.
    pub fn serving_pids(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self
            .processes
            .iter()
            .filter(|(_, p)| !p.listen_ports.is_empty())
            .map(|(pid, _)| *pid)
            .collect();
        v.sort_unstable();
        v
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcessInfo {
    /// The engine its command line names (gen_ai.provider.name).
    pub engine: Option<String>,
    /// TCP ports it listens on (in its own network namespace), sorted.
    pub listen_ports: Vec<u16>,
    /// Its container (and pod), from its cgroup.
    pub container: Option<crate::capture::procfs::ContainerIdentity>,
    /// What it serves (`identity::model_version`), computed once when it
    /// is named (and again when it execs), never per request.
    pub model_version: Option<String>,
    /// The served model as its command line names it (first served name,
    /// else first model path): what timeline events call the engine's model.
    pub model: Option<String>,
}

/// Periodic work beside the data path (finding engines, sampling GPUs).
pub trait Task {
    /// Runs once per pipeline tick, and as soon as process events arrive
    /// (then possibly several times a second: keep the work proportional to
    /// what changed, and rate-limit full scans yourself).
    fn tick(&mut self, cx: &mut TaskCx<'_>) -> Result<()>;
}

/// What a task may use at a tick.
pub struct TaskCx<'a> {
    /// The live capture (None when replaying).
    pub capture: Option<&'a mut Capture>,
    pub node: &'a mut NodeState,
    /// Socket events a task produces (seeded connections of a new target)
    /// go here, into the next batch.
    pub events: &'a mut Vec<SocketEvent>,
    /// Process events (exec, fork, exit) since the last tick.
    pub proc_events: &'a [ProcEvent],
}

/// Decoder, enrichers and sinks, fed one batch of events at a time.
pub struct Pipeline {
    decoder: Decoder,
    enrichers: Vec<Box<dyn Enricher>>,
    sinks: Vec<Box<dyn Sink>>,
    pub node: NodeState,
    pub health: Arc<Health>,
    /// Joins GPU state into records of engines on GPUs (None: no GPU
    /// sampling).
    gpu: Option<GpuStage>,
    /// Timeline events from records, ticks and GPU samples (None: off).
    timeline: Option<crate::timeline::Timeline>,
    /// Ticks feed the timeline's clock (live runs; a replay's clock is its
    /// records').
    live: bool,
    finished: Vec<Finished>,
    ready: Vec<Finished>,
    events: Vec<crate::timeline::Event>,
    /// LLM requests handed to the sinks.
    recorded: u64,
}

impl Pipeline {
    pub fn new(health: Arc<Health>) -> Self {
        Self {
            decoder: Decoder::new(),
            enrichers: Vec::new(),
            sinks: Vec::new(),
            node: NodeState::default(),
            health,
            gpu: None,
            timeline: None,
            live: false,
            finished: Vec::new(),
            ready: Vec::new(),
            events: Vec::new(),
            recorded: 0,
        }
    }

    /// Requests carrying `m` in the own-traffic header are the agent's own
    /// (its scrapes of engines' /metrics): counted in health as
    /// `self_requests`, never recorded.
    pub fn self_marker(mut self, m: crate::selftraffic::Marker) -> Self {
        self.decoder = std::mem::take(&mut self.decoder).with_self_marker(m);
        self
    }

    /// What the decoder keeps of each request's identity (tenant headers,
    /// API-key ids, request-type rules).
    pub fn identity(mut self, id: crate::decode::IdentityConfig) -> Self {
        self.decoder = std::mem::take(&mut self.decoder).with_identity(id);
        self
    }

    /// Adds the GPU join (records of GPU engines wait for the next sample).
    pub fn gpu(mut self, stage: GpuStage) -> Self {
        self.gpu = Some(stage);
        self
    }

    /// Adds the timeline detectors; `live`: pipeline ticks are the clock
    /// too (a live run), not only the records' times (a replay).
    pub fn timeline(mut self, t: crate::timeline::Timeline, live: bool) -> Self {
        self.timeline = Some(t);
        self.live = live;
        self
    }

    pub fn enricher(mut self, e: impl Enricher + 'static) -> Self {
        self.enrichers.push(Box::new(e));
        self
    }

    pub fn sink(mut self, s: Box<dyn Sink>) -> Self {
        self.sinks.push(s);
        self
    }

    pub fn decoder(&self) -> &Decoder {
        &self.decoder
    }

    /// Decodes `events` (drained) and hands every finished request to the
    /// enrichers, then to every sink.
    pub fn events(&mut self, events: &mut Vec<SocketEvent>) -> Result<()> {
        for ev in events.drain(..) {
            self.decoder.on_event(&ev, &mut self.finished);
        }
        for (pid, port) in self.decoder.take_tls_servers() {
            eprintln!(
                "tokentap: pid {pid}{} speaks TLS: tokentap sees only ciphertext there, so its requests are not measured \
                 (counted in tokentap.decode.tls); measure where TLS ends (the plaintext side of a terminating proxy or sidecar)",
                port.map(|p| format!(" on port {p}")).unwrap_or_default()
            );
        }
        self.flush_finished()
    }

    fn flush_finished(&mut self) -> Result<()> {
        for mut f in self.finished.drain(..) {
            if f.self_request {
                self.health
                    .self_requests
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                continue;
            }
            for e in &mut self.enrichers {
                e.enrich(&mut f.record, &self.node);
            }
            if let Some(class) = f.non_llm_route() {
                // Identity only: no GPU join, no timeline, no LLM sink.
                self.health
                    .non_llm_requests
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                for s in &mut self.sinks {
                    s.other_request(&f, class)?;
                }
                continue;
            }
            match &mut self.gpu {
                Some(g) => g.on_finished(f, &mut self.ready),
                None => self.ready.push(f),
            }
        }
        self.send_ready()
    }

    fn send_ready(&mut self) -> Result<()> {
        self.recorded += self.ready.len() as u64;
        for f in self.ready.drain(..) {
            for s in &mut self.sinks {
                s.record(&f)?;
            }
            if let Some(t) = &mut self.timeline {
                t.on_record(&f, &mut self.events);
            }
        }
        self.send_events()
    }

    fn send_events(&mut self) -> Result<()> {
        if let Some(t) = &self.timeline {
            self.health
                .events_folded
                .store(t.folded(), std::sync::atomic::Ordering::Relaxed);
        }
        for e in self.events.drain(..) {
            for s in &mut self.sinks {
                s.event(&e)?;
            }
        }
        Ok(())
    }

    /// Hands GPU samples the tasks queued in [`NodeState`] to the GPU
    /// stage (each closes an interval and releases the records that ended
    /// in it).
    pub fn gpu_samples(&mut self) -> Result<()> {
        let samples = std::mem::take(&mut self.node.gpu_samples);
        let unavailable = std::mem::take(&mut self.node.gpu_unavailable);
        let Some(g) = &mut self.gpu else {
            return Ok(());
        };
        if unavailable && samples.is_empty() {
            g.unavailable(&mut self.ready);
            return self.send_ready();
        }
        if samples.is_empty() {
            g.expire(now_wall_ns(), &mut self.ready);
            return self.send_ready();
        }
        let engines = self.node.serving_pids();
        let mut in_flight = Vec::new();
        self.decoder.in_flight_requests(&mut in_flight);
        for (sample, snap) in samples {
            if let Some(t) = &mut self.timeline {
                t.on_gpu_sample(&sample, &self.node, &mut self.events);
            }
            g.on_sample(sample, &snap, &engines, &in_flight, &mut self.ready);
        }
        self.send_ready()
    }

    /// Publishes health and lets every sink do its periodic work.
    pub fn tick(&mut self, capture: Option<&CaptureStats>) -> Result<()> {
        self.health.beat();
        self.health
            .publish(capture, &self.decoder.stats, self.decoder.in_flight());
        let now_ns = now_wall_ns();
        if let (Some(t), true) = (&mut self.timeline, self.live) {
            t.on_tick(
                now_ns,
                &self.node,
                self.decoder.in_flight(),
                &mut self.events,
            );
        }
        self.send_events()?;
        let snap = self.health.snapshot();
        let t = Tick {
            now_ns,
            health: &snap,
        };
        for s in &mut self.sinks {
            s.tick(&t)?;
        }
        Ok(())
    }

    /// End of input (a replay's end): requests still in flight end as
    /// `truncated_capture`.
    pub fn end_of_input(&mut self) -> Result<()> {
        self.decoder.finish(&mut self.finished);
        self.flush_finished()
    }

    /// Last tick, then every sink's shutdown (all of them, even when one
    /// fails; the first error is returned).
    pub fn shutdown(mut self, capture: Option<&CaptureStats>) -> Result<Summary> {
        if let Some(g) = &mut self.gpu {
            g.flush(&mut self.ready);
        }
        self.send_ready()?;
        if let Some(t) = &mut self.timeline {
            t.finish(&mut self.events);
        }
        self.send_events()?;
        self.health
            .publish(capture, &self.decoder.stats, self.decoder.in_flight());
        let snap = self.health.snapshot();
        let t = Tick {
            now_ns: now_wall_ns(),
            health: &snap,
        };
        let mut first_err = None;
        for s in self.sinks.drain(..) {
            if let Err(e) = s.shutdown(&t) {
                first_err.get_or_insert(e);
            }
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        Ok(Summary {
            records: self.recorded,
            in_flight: self.decoder.in_flight(),
            decode: serde_json::to_string(&self.decoder.stats).unwrap_or_default(),
            health: snap,
        })
    }
}

/// What a finished pipeline reports.
pub struct Summary {
    /// LLM requests handed to the sinks (the agent's own scrapes and
    /// non-LLM requests left out).
    pub records: u64,
    /// Requests still in flight when a live run stopped (not recorded).
    pub in_flight: usize,
    pub decode: String,
    pub health: health::HealthSnapshot,
}

pub fn now_wall_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// The pipeline's tick: log flushes, console redraws, health.
pub const TICK: Duration = Duration::from_secs(1);
