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
    pub protocol_counts: Mutex<crate::decode::ProtocolCounts>,
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
    /// The engines' tokenizers (`pipeline::tokens`): what they counted,
    /// what fell back to the estimate and why, their agreement with the
    /// engines' own counts, which engines have one.
    pub tokens: Mutex<TokenCounts>,
    /// The eBPF programs are attached (`/readyz`).
    pub attached: AtomicBool,
    /// Why the agent is not ready (shown by `/readyz` with its 503).
    pub not_ready: Mutex<String>,
}

/// What the tokenizer stage did since the start (`tokentap.tokens.*`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TokenCounts {
    /// Counts the tokenizer set, by direction (`input`, `output`).
    pub tokenized: std::collections::BTreeMap<&'static str, u64>,
    /// Counts that stayed the estimate, by reason (`budget`,
    /// `queue_full`, `timeout`, `text_lost`, and `tokenize::Failure`'s).
    pub failed: std::collections::BTreeMap<&'static str, u64>,
    /// Sampled checks against the engine's own counts, by engine,
    /// direction and result (`agree`, `disagree`).
    pub agreement: std::collections::BTreeMap<(String, &'static str, &'static str), u64>,
    /// Engine processes alive now, by how finding their tokenizer ended.
    pub tokenizer: std::collections::BTreeMap<&'static str, u64>,
    /// CPU the tokenizer thread used (ns).
    pub cpu_ns: u64,
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

/// How a health instrument is exported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HealthKind {
    /// A monotonic count.
    Counter,
    /// A value now.
    Gauge,
    /// A value now that is a sum of up and down counts.
    UpDown,
}

/// What a health instrument reads when the SDK collects.
#[derive(Clone, Copy)]
pub enum Reading {
    One(fn(&Health) -> i64),
    /// One value per `reason` attribute.
    ByReason(fn(&Health) -> Vec<(&'static str, u64)>),
    /// Values with attributes of their own (key, value).
    ByAttrs(fn(&Health) -> Attributed),
}

/// Values, each with its attributes (key, value).
pub type Attributed = Vec<(Vec<(&'static str, String)>, u64)>;

/// One of the agent's own instruments: the OTLP sink registers each on its
/// meter. Adding a health counter: its field in [`Health`], where it is
/// bumped or published, and its row in [`INSTRUMENTS`] (and docs/metrics.md,
/// `deploy/prometheus/lint.py`'s table).
pub struct HealthInstrument {
    pub name: &'static str,
    pub unit: &'static str,
    pub description: &'static str,
    pub kind: HealthKind,
    pub read: Reading,
}

/// A row of [`INSTRUMENTS`].
const fn row(
    kind: HealthKind,
    name: &'static str,
    unit: &'static str,
    description: &'static str,
    read: Reading,
) -> HealthInstrument {
    HealthInstrument {
        name,
        unit,
        description,
        kind,
        read,
    }
}

fn load(a: &AtomicU64) -> i64 {
    a.load(Relaxed) as i64
}

/// The TLS source's counters, read from the health copy.
fn tls(h: &Health) -> crate::capture::tls::TlsCounts {
    h.tls_source
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
}

fn tokens(h: &Health) -> TokenCounts {
    h.tokens.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

fn by(key: &'static str, m: std::collections::BTreeMap<&'static str, u64>) -> Attributed {
    m.into_iter()
        .map(|(v, n)| (vec![(key, v.to_string())], n))
        .collect()
}

fn reasons(h: &Health) -> crate::decode::ProtocolCounts {
    h.protocol_counts
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
}

use HealthKind::{Counter, Gauge, UpDown};
use Reading::{ByAttrs, ByReason, One};

/// The agent's health instruments (`tokentap.*`): the one list of them.
pub static INSTRUMENTS: &[HealthInstrument] = &[
    row(Counter, "tokentap.capture.events", "{event}", "Socket events captured", One(|h| load(&h.events))),
    row(Counter, "tokentap.capture.dropped", "{record}", "Kernel records dropped (ring buffer full)", One(|h| load(&h.dropped))),
    row(Counter, "tokentap.capture.bodies_left", "{call}", "Reads of a request beyond its first 16 KiB left in the kernel while the capture was under pressure (the ring buffer filling or the decoder over --max-decode-memory): their length counted, their bytes not copied, the request's input tokens estimated", One(|h| load(&h.bodies_left))),
    row(Counter, "tokentap.capture.pressure", "{episode}", "Times the capture went under pressure (ring buffer a quarter full, or the decoder over its memory budget)", One(|h| load(&h.pressure_episodes))),
    row(Counter, "tokentap.decode.errors", "{error}", "Connections whose bytes stopped being HTTP", One(|h| load(&h.decode_errors))),
    row(Counter, "tokentap.decode.unsupported_protocol", "{connection}", "Connections speaking a protocol the decoder does not follow (TLS, upgrades other than h2c)", One(|h| load(&h.unsupported_protocol))),
    row(Counter, "tokentap.decode.tls", "{connection}", "Connections carrying TLS (ciphertext, not decoded): served ones also count in tokentap.decode.unsupported_protocol, an engine's own outgoing HTTPS only here", One(|h| load(&h.tls))),
    row(Counter, "tokentap.decode.joined_mid_stream", "{connection}", "Connections found already open (agent start, a new engine): decoded from their next request on, what was in flight on them not recorded", One(|h| load(&h.joined))),
    row(Counter, "tokentap.decode.http2", "{connection}", "Connections decoded as HTTP/2 (prior knowledge, or recognised by their frames when found open)", One(|h| load(&h.http2))),
    row(Counter, "tokentap.decode.unresolved_headers", "{field}", "HTTP/2 header fields that named a header-table entry sent before the agent joined the connection (their values unknown)", One(|h| load(&h.unresolved_headers))),
    row(Counter, "tokentap.tls.calls", "{call}", "OpenSSL SSL_read/SSL_write calls of targets whose plaintext was captured", One(|h| tls(h).calls as i64)),
    row(Counter, "tokentap.tls.unattributed", "{call}", "OpenSSL calls that returned plaintext on a socket tokentap could not name (no socket call inside, no memory BIO tied to one): not captured", One(|h| tls(h).unattributed as i64)),
    row(Counter, "tokentap.tls.bios_linked", "{bio}", "Memory BIOs (asyncio/uvicorn TLS) tied to their socket by content", One(|h| tls(h).bios_linked as i64)),
    row(Gauge, "tokentap.tls.processes", "{process}", "Target processes whose OpenSSL is probed now", One(|h| tls(h).source.processes as i64)),
    row(Gauge, "tokentap.tls.libraries", "{file}", "OpenSSL library files (device, inode) probed now", One(|h| tls(h).source.libraries as i64)),
    row(Counter, "tokentap.tls.attach_failures", "{process}", "Target processes whose TLS is not read, by reason (permission: the kernel refuses uprobes without CAP_SYS_ADMIN; java, boringssl, gnutls: stacks tokentap cannot read; symbol_missing, unreadable, attach, load; memory_bio: socket BIOs only)", ByReason(|h| tls(h).source.attach_failures.iter().map(|(r, n)| (r.as_str(), *n)).collect())),
    row(Counter, "tokentap.tls.undecoded", "{connection}", "Served TLS connections that ended without plaintext (the engine's TLS is not OpenSSL, or --no-tls): their requests are not measured; also in tokentap.decode.unsupported_protocol", One(|h| load(&h.tls_undecoded))),
    row(Counter, "tokentap.decode.http2.dropped", "{connection}", "HTTP/2 connections dropped from decoding, by reason (malformed frames, HPACK errors, a header block that never ends, a gRPC length past 64 MiB, a reused stream id, too many streams); also counted in tokentap.decode.errors", ByReason(|h| reasons(h).http2_dropped)),
    row(Counter, "tokentap.files.refused", "{file}", "Engines' files (under /proc/PID/root) not read, by reason: not_regular (a FIFO, socket or device where a file was expected: never opened), oversized, no_openat2 (paths cannot be resolved inside the container: nothing read)", ByReason(|_| crate::host::rootfs::refused().to_vec())),
    row(Counter, "tokentap.decode.shed", "{cut}", "What the decoder's memory budget (--max-decode-memory) took back, by reason: tokenize_text (text kept for an engine's tokenizer: its counts keep the estimate), response_body (a non-streamed body not read: its tokens unknown), stream_event (a stream event being assembled), gateway_held (the gateway join's waiting records, released unjoined), partial_head (an idle connection's unfinished head or header block: decoded again from its next request), in_flight (a connection's requests ended as truncated_capture)", ByReason(|h| reasons(h).shed.iter().map(|(r, n)| (r.as_str(), *n)).collect())),
    row(Counter, "tokentap.tokens.tokenized", "{count}", "Token counts set by the engine's own tokenizer (tokens_source tokenizer), by direction (input, output): requests whose response carried no counts", ByAttrs(|h| by("direction", tokens(h).tokenized))),
    row(Counter, "tokentap.tokens.tokenize_failed", "{count}", "Token counts of requests with an engine tokenizer that stayed the estimate, by reason: budget (--tokenize-cpu spent), queue_full, timeout, tool_call (an answer that called tools whose chat template does not write its calls back), text_lost (the request's text was not kept whole: too large, cut by the capture, shed by the memory budget), body (not the JSON the operation reads), no_template, template (the chat template failed), encode, operation (an API not tokenized: Responses)", ByAttrs(|h| by("reason", tokens(h).failed))),
    row(Counter, "tokentap.tokens.agreement", "{check}", "Sampled checks (--tokenize-check-ratio) of the engine's tokenizer against the engine's own counts, by engine (gen_ai.provider.name), direction (input, output) and result (agree, disagree)", ByAttrs(|h| tokens(h).agreement.into_iter().map(|((e, d, r), n)| (vec![("gen_ai.provider.name", e), ("direction", d.to_string()), ("result", r.to_string())], n)).collect())),
    row(Gauge, "tokentap.tokens.tokenizer", "{process}", "Engine processes by how finding their tokenizer ended (state: loaded, not_found, unsupported — GGUF engines, invalid)", ByAttrs(|h| by("state", tokens(h).tokenizer))),
    row(Counter, "tokentap.tokens.tokenize_cpu", "ns", "CPU time the tokenizer thread used (its budget: --tokenize-cpu)", One(|h| tokens(h).cpu_ns as i64)),
    row(Gauge, "tokentap.decode.memory", "By", "Bytes the decoder's connections hold now (parsing buffers, header tables, per-connection state), against --max-decode-memory", One(|h| load(&h.decode_memory))),
    row(Counter, "tokentap.decode.grpc.skipped", "{message}", "gRPC messages not read, by reason (unsupported_compression, oversized: read from their leading fields, bad_message, unrecognised service, orphan_response)", ByReason(|h| reasons(h).grpc_skipped.iter().map(|(r, n)| (r.as_str(), *n)).collect())),
    row(Counter, "tokentap.metrics.attribute_overflow", "{value}", "Attribute values exported as \"other\" by a cardinality cap (--max-models, --max-tenants)", One(|h| load(&h.attribute_overflow))),
    row(Counter, "tokentap.self_requests", "{request}", "Requests the agent made itself (engine /metrics scrapes), not recorded as LLM requests", One(|h| load(&h.self_requests))),
    row(Counter, "tokentap.events.folded", "{event}", "Timeline events over the ceiling ([events] max_events_per_minute), folded into one events.folded per minute", One(|h| load(&h.events_folded))),
    row(Counter, "tokentap.engine.scrape.failures", "{scrape}", "Engine /metrics scrapes that failed (timeout, refused, HTTP or parse error)", One(|h| load(&h.scrape_failures))),
    row(Counter, "tokentap.export.failures", "{export}", "OTLP exports that failed", One(|h| load(&h.export_failures))),
    row(UpDown, "tokentap.connections.active", "{connection}", "Connections of targets open now", One(|h| h.connections.load(Relaxed))),
    row(UpDown, "tokentap.requests.in_flight", "{request}", "Requests received and not yet answered (concurrency)", One(|h| h.in_flight.load(Relaxed))),
];

fn started() -> std::time::Instant {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    *START.get_or_init(std::time::Instant::now)
}

/// Milliseconds since the first call (the agent's start, in practice: the
/// first heartbeat); the clock of the heartbeat and of `/healthz`.
pub fn uptime_ms() -> u64 {
    started().elapsed().as_millis() as u64
}
