//! The agent's own health, owned by the pipeline: capture and decode
//! counters published at every tick, plus counters the sinks bump (export
//! failures, attribute overflow). The metrics sink reads them when the SDK
//! collects; the console shows them.
//!
//! Owns: the counters. Must not: know who exports them.

use std::sync::{
    atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering::Relaxed},
    Mutex,
};

use serde::Serialize;

use crate::{capture::CaptureStats, decode::DecodeStats};

#[derive(Default, Debug)]
pub struct Health {
    /// Socket events captured (or replayed).
    pub events: AtomicU64,
    /// Kernel records dropped (ring buffer full).
    pub dropped: AtomicU64,
    /// Request reads left in the kernel under pressure, and the pressure
    /// episodes (`CaptureStats::bodies_left`, `pressure_episodes`).
    pub bodies_left: AtomicU64,
    pub pressure_episodes: AtomicU64,
    /// Connections whose bytes stopped making sense as HTTP.
    pub decode_errors: AtomicU64,
    /// Connections speaking a protocol the decoder does not follow (TLS, a
    /// `101 Switching Protocols` to anything but h2c).
    pub unsupported_protocol: AtomicU64,
    /// Of those, connections carrying TLS (ciphertext).
    pub tls: AtomicU64,
    /// Connections joined mid-way (open before the agent saw them open):
    /// decoded from their next request on.
    pub joined: AtomicU64,
    /// Connections decoded as HTTP/2.
    pub http2: AtomicU64,
    /// HTTP/2 header fields naming a header-table entry never seen.
    pub unresolved_headers: AtomicU64,
    /// HTTP/2 connections dropped from decoding, by reason, and gRPC
    /// messages skipped, by reason (`decode::DecodeStats`).
    pub protocol_counts: Mutex<Vec<(&'static str, &'static str, u64)>>,
    pub connections: AtomicI64,
    pub in_flight: AtomicI64,
    /// Bytes the decoder's connections hold now, and the most they held
    /// (against `--max-decode-memory`).
    pub decode_memory: AtomicU64,
    pub decode_memory_peak: AtomicU64,
    /// OTLP exports that failed (bumped by the metrics sink's exporter).
    pub export_failures: AtomicU64,
    /// Attribute values folded into `other` by a cardinality cap.
    pub attribute_overflow: AtomicU64,
    /// Requests the agent made itself (engine /metrics scrapes), seen in
    /// the capture and not recorded.
    pub self_requests: AtomicU64,
    /// Timeline events over the ceiling, folded (`max_events_per_minute`).
    pub events_folded: AtomicU64,
    /// Requests on an engine's port that are not LLM requests (probes,
    /// scrapes, model listings: [`crate::record::Finished::non_llm_route`]);
    /// exported by route class as `tokentap.http.requests`.
    pub non_llm_requests: AtomicU64,
    /// Engine /metrics scrapes that failed (timeouts, refused, errors).
    pub scrape_failures: AtomicU64,
    /// Milliseconds since the agent started, at the main loop's last pass
    /// (`/healthz`).
    pub heartbeat_ms: AtomicU64,
    /// The TLS source (`tokentap.tls.*`): what it attached, what it
    /// captured, what it lost.
    pub tls_source: Mutex<crate::capture::tls::TlsCounts>,
    /// Served TLS connections that ended without plaintext (the engine's
    /// TLS library is not one tokentap reads, or `--no-tls`).
    pub tls_undecoded: AtomicU64,
    /// The eBPF programs are attached (`/readyz`).
    pub attached: AtomicBool,
    /// Why the agent is not ready (shown by `/readyz` with its 503).
    pub not_ready: Mutex<String>,
}

/// A plain copy of [`Health`] (for the console and the shutdown line).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct HealthSnapshot {
    pub events: u64,
    pub dropped: u64,
    pub decode_errors: u64,
    pub unsupported_protocol: u64,
    pub tls: u64,
    pub joined: u64,
    pub connections: i64,
    pub in_flight: i64,
    pub export_failures: u64,
    pub attribute_overflow: u64,
    pub self_requests: u64,
    pub events_folded: u64,
    pub non_llm_requests: u64,
    pub scrape_failures: u64,
}

impl Health {
    /// The main loop is alive (called at every pass and tick).
    pub fn beat(&self) {
        self.heartbeat_ms.store(uptime_ms(), Relaxed);
    }

    /// Ready, or not ready and why.
    pub fn set_ready(&self, ready: Result<(), String>) {
        let mut why = self.not_ready.lock().unwrap_or_else(|p| p.into_inner());
        match ready {
            Ok(()) => {
                why.clear();
                self.attached.store(true, Relaxed);
            }
            Err(e) => {
                *why = e;
                self.attached.store(false, Relaxed);
            }
        }
    }

    /// Publishes what capture and decoding report now.
    pub fn publish(&self, capture: Option<&CaptureStats>, decode: &DecodeStats, in_flight: usize) {
        match capture {
            Some(st) => {
                self.events.store(st.events, Relaxed);
                self.dropped.store(st.records_dropped, Relaxed);
                self.bodies_left.store(st.bodies_left, Relaxed);
                self.pressure_episodes.store(st.pressure_episodes, Relaxed);
                self.connections.store(st.conns_active as i64, Relaxed);
                *self.tls_source.lock().unwrap_or_else(|p| p.into_inner()) = st.tls.clone();
            }
            // Replay: events are what the decoder saw.
            None => self.events.store(decode.events, Relaxed),
        }
        self.decode_errors.store(decode.desyncs, Relaxed);
        self.unsupported_protocol
            .store(decode.unsupported_protocol, Relaxed);
        self.tls.store(decode.tls, Relaxed);
        self.tls_undecoded.store(decode.tls_undecoded, Relaxed);
        self.joined.store(decode.joined, Relaxed);
        self.http2.store(decode.http2, Relaxed);
        self.unresolved_headers
            .store(decode.unresolved_headers, Relaxed);
        let counts = decode.protocol_counts();
        *self
            .protocol_counts
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = counts;
        self.in_flight.store(in_flight as i64, Relaxed);
        self.decode_memory.store(decode.held_bytes, Relaxed);
        self.decode_memory_peak
            .store(decode.held_bytes_peak, Relaxed);
    }

    pub fn snapshot(&self) -> HealthSnapshot {
        HealthSnapshot {
            events: self.events.load(Relaxed),
            dropped: self.dropped.load(Relaxed),
            decode_errors: self.decode_errors.load(Relaxed),
            unsupported_protocol: self.unsupported_protocol.load(Relaxed),
            tls: self.tls.load(Relaxed),
            joined: self.joined.load(Relaxed),
            connections: self.connections.load(Relaxed),
            in_flight: self.in_flight.load(Relaxed),
            export_failures: self.export_failures.load(Relaxed),
            attribute_overflow: self.attribute_overflow.load(Relaxed),
            self_requests: self.self_requests.load(Relaxed),
            events_folded: self.events_folded.load(Relaxed),
            non_llm_requests: self.non_llm_requests.load(Relaxed),
            scrape_failures: self.scrape_failures.load(Relaxed),
        }
    }
}

impl HealthSnapshot {
    /// One line for the console's footer.
    pub fn line(&self) -> String {
        let mut s = format!(
            "events {} dropped {} conns {} decode errors {}",
            self.events, self.dropped, self.connections, self.decode_errors
        );
        if self.unsupported_protocol > 0 {
            s += &format!(" unsupported protocol {}", self.unsupported_protocol);
            if self.tls > 0 {
                s += &format!(" (TLS {})", self.tls);
            }
        }
        if self.export_failures > 0 {
            s += &format!(" export failures {}", self.export_failures);
        }
        s
    }
}

fn started() -> std::time::Instant {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    *START.get_or_init(std::time::Instant::now)
}

/// Milliseconds since the first call (the agent's start, in practice: the
/// first heartbeat); the clock of the heartbeat and of `/healthz`.
pub fn uptime_ms() -> u64 {
    started().elapsed().as_millis() as u64
}
