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

pub mod config;
pub mod enrich;
pub mod explain;
pub mod healthz;
pub mod plan;
pub mod run;
pub mod targets;
pub mod tokens;

use std::{sync::Arc, time::Duration};

use anyhow::Result;

use crate::{
    capture::CaptureStats,
    decode::Decoder,
    event::SocketEvent,
    gpu::stage::GpuStage,
    record::Finished,
    stage::{health, health::Health, Enricher, NodeState, Sink, Tick},
};

pub use self::plan::{resolve, RunPlan};

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
    /// Counts requests without the engine's counts with its own tokenizer
    /// (None: `--tokenize-cpu 0`, or a replay).
    tokens: Option<tokens::TokensStage>,
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
            tokens: None,
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

    /// The decoder's memory budget (`--max-decode-memory`).
    pub fn max_decode_memory(mut self, bytes: u64) -> Self {
        self.decoder = std::mem::take(&mut self.decoder).with_max_memory(bytes as usize);
        self
    }

    /// Adds the GPU join (records of GPU engines wait for the next sample).
    pub fn gpu(mut self, stage: GpuStage) -> Self {
        self.gpu = Some(stage);
        self
    }

    /// Adds the tokenizer stage (records of engines with a tokenizer wait
    /// for their counts).
    pub fn tokens(mut self, stage: tokens::TokensStage) -> Self {
        self.tokens = Some(stage);
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
        if !self.decoder.gateways().is_subset(&self.node.forwarding) {
            self.node.set_forwarding(self.decoder.gateways());
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
        if let Some(t) = &mut self.tokens {
            let mut counted = Vec::new();
            t.poll(&mut counted);
            for f in counted {
                self.after_tokens(f);
            }
        }
        let finished = std::mem::take(&mut self.finished);
        for mut f in finished {
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
                f.text = None;
                for s in &mut self.sinks {
                    s.other_request(&f, class)?;
                }
                continue;
            }
            let f = match &mut self.tokens {
                Some(t) => match t.on_finished(f, &self.node) {
                    Some(f) => f,
                    None => continue,
                },
                None => f,
            };
            self.after_tokens(f);
        }
        self.send_ready()
    }

    /// A record with its final counts: to the GPU join, or ready.
    fn after_tokens(&mut self, mut f: Finished) {
        f.text = None;
        match &mut self.gpu {
            Some(g) => g.on_finished(f, &mut self.ready),
            None => self.ready.push(f),
        }
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
        if let Some(t) = &mut self.tokens {
            if let Some(pids) = t.text_pids(&self.node) {
                self.decoder.set_text_pids(pids);
            }
            self.flush_finished()?;
        }
        if self.live {
            // Engine records whose gateway's record never came.
            self.decoder.tick(now_wall_ns(), &mut self.finished);
            self.flush_finished()?;
        }
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
        // Finished requests the gateway join still holds.
        self.decoder.release_held(&mut self.finished);
        self.flush_finished()?;
        if let Some(mut t) = self.tokens.take() {
            let mut counted = Vec::new();
            t.flush(&mut counted);
            for f in counted {
                self.after_tokens(f);
            }
        }
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
