//! OTLP metrics: request records → OpenTelemetry instruments (names,
//! units and bucket boundaries of the GenAI semantic conventions, DESIGN
//! §4), plus the agent's own health, exported by the SDK's periodic reader
//! over gRPC or HTTP/protobuf.
//!
//! Owns: the meter provider and its instruments, attribute cardinality
//! caps, export failure accounting. Must not: block the capture loop (the
//! SDK exports on its own thread; a dead collector only costs that thread
//! retries) or put unbounded values into attributes.
//!
//! `exporter.rs` builds the exporters (one builder for metrics and logs);
//! `events.rs` sends timeline events as OTLP log records.

pub mod events;
pub mod exporter;
pub mod traces;

use std::{
    collections::{HashMap, HashSet},
    sync::{atomic::Ordering, Arc},
    time::Duration,
};

use anyhow::{bail, Result};
use opentelemetry::{
    metrics::{Counter, Histogram, MeterProvider as _},
    KeyValue,
};
use opentelemetry_sdk::{
    error::OTelSdkResult,
    metrics::{
        data::ResourceMetrics, exporter::PushMetricExporter, Aggregation, Instrument,
        InstrumentKind, PeriodicReader, SdkMeterProvider, Stream, Temporality,
    },
    Resource,
};

pub use crate::vocab::{OTHER, UNKNOWN};
use crate::{
    record::{Finished, RequestRecord, RouteClass},
    stage::{health::Health, Sink, Tick},
};

/// GenAI semantic conventions' explicit bucket boundaries.
pub const TTFT_BUCKETS: [f64; 16] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
];
pub const TPOT_BUCKETS: [f64; 13] = [
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
];
pub const DURATION_BUCKETS: [f64; 14] = [
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
];
pub const TOKEN_BUCKETS: [f64; 14] = [
    1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0,
    16777216.0, 67108864.0,
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OtlpProtocol {
    Grpc,
    HttpProtobuf,
}

impl std::str::FromStr for OtlpProtocol {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "grpc" => Ok(Self::Grpc),
            "http/protobuf" | "http" => Ok(Self::HttpProtobuf),
            other => Err(format!(
                "unknown OTLP protocol {other:?}: use grpc or http/protobuf"
            )),
        }
    }
}

#[derive(Clone, Debug)]
pub struct MetricsConfig {
    /// Collector endpoint; None: from OTEL_EXPORTER_OTLP_ENDPOINT.
    pub endpoint: Option<String>,
    /// Extra CA certificates (PEM) for an https:// collector
    /// (`--otlp-ca-file`; else `OTEL_EXPORTER_OTLP_[SIGNAL_]CERTIFICATE`).
    pub ca_file: Option<std::path::PathBuf>,
    /// `--otlp-header K=V` values, as given (over the environment's
    /// `OTEL_EXPORTER_OTLP_[SIGNAL_]HEADERS`).
    pub headers: Vec<String>,
    pub protocol: OtlpProtocol,
    pub interval: Duration,
    /// Base-2 exponential histograms instead of the explicit buckets.
    pub exponential: bool,
    /// Distinct model names kept as attribute values; the rest are "other".
    pub max_models: usize,
    /// Distinct tenants, and separately distinct callers, kept as attribute
    /// values; the rest are "other".
    pub max_tenants: usize,
    /// Share of requests exported as spans (`--traces-sample`).
    pub traces_sample: f64,
    /// Spans of requests slower than this to their first token are always
    /// exported (`--traces-slow-ttft`).
    pub traces_slow_ttft: Option<f64>,
}

/// Wraps the OTLP exporter to count failures and report them once per
/// export interval (never per record), and to say when exports recover.
struct Counted<E> {
    inner: E,
    report: crate::sinks::otlp::exporter::FailureReport,
}

impl<E: PushMetricExporter> PushMetricExporter for Counted<E> {
    async fn export(&self, metrics: &ResourceMetrics) -> OTelSdkResult {
        let r = self.inner.export(metrics).await;
        self.report.after(&r);
        r
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn temporality(&self) -> Temporality {
        self.inner.temporality()
    }
}

/// The request instruments of one meter provider (one resource).
struct RequestInstruments {
    ttft: Histogram<f64>,
    tpot: Histogram<f64>,
    duration: Histogram<f64>,
    chunk: Histogram<f64>,
    queue: Histogram<f64>,
    /// The engine's own stage times (`prefill_s`, …), by stage.
    engine_queue: Histogram<f64>,
    prefill: Histogram<f64>,
    decode: Histogram<f64>,
    cached_input: Counter<u64>,
    tokens: Histogram<u64>,
    requests: Counter<u64>,
    /// `tokentap.http.requests`: requests that are not LLM requests.
    http: Counter<u64>,
}

impl RequestInstruments {
    fn new(meter: &opentelemetry::metrics::Meter) -> Self {
        let h = |name: &'static str, unit: &'static str, desc: &'static str, b: &[f64]| {
            meter
                .f64_histogram(name)
                .with_unit(unit)
                .with_description(desc)
                .with_boundaries(b.to_vec())
                .build()
        };
        let ttft = h(
            "gen_ai.server.time_to_first_token",
            "s",
            "Time from the request's arrival at the engine's socket (else its first read) to the write of the first generated content",
            &TTFT_BUCKETS,
        );
        let tpot = h(
            "gen_ai.server.time_per_output_token",
            "s",
            "(last content write - first content write) / (output tokens - 1)",
            &TPOT_BUCKETS,
        );
        let duration = h(
            "gen_ai.server.request.duration",
            "s",
            "Time from the request's arrival at the engine's socket (else its first read) to the last response byte written",
            &DURATION_BUCKETS,
        );
        let queue = h(
            "tokentap.server.queue_time",
            "s",
            "Time a request waited unread in the engine's socket: first read - arrival (requests whose arrival the kernel reported)",
            &TTFT_BUCKETS,
        );
        let engine_queue = h(
            "tokentap.server.engine_queue_time",
            "s",
            "Time a request waited in the engine's scheduler, as the engine reports it (TGI x-queue-time)",
            &TTFT_BUCKETS,
        );
        let prefill = h(
            "tokentap.server.prefill_time",
            "s",
            "Prompt processing up to the first token, as the engine reports it (llama.cpp timings.prompt_ms, Ollama prompt_eval_duration)",
            &TTFT_BUCKETS,
        );
        let decode = h(
            "tokentap.server.decode_time",
            "s",
            "Generating the tokens after the first, as the engine reports it (llama.cpp timings.predicted_ms, Ollama eval_duration)",
            &DURATION_BUCKETS,
        );
        let cached_input = meter
            .u64_counter("tokentap.server.cached_input_tokens")
            .with_unit("{token}")
            .with_description("Input tokens the engine served from its prefix cache (usage.prompt_tokens_details.cached_tokens, llama.cpp timings.cache_n)")
            .build();
        let chunk = h(
            "tokentap.server.time_per_output_chunk",
            "s",
            "Gap between consecutive writes carrying generated content",
            &DURATION_BUCKETS,
        );
        let tokens = meter
            .u64_histogram("gen_ai.server.token.usage")
            .with_unit("{token}")
            .with_description("Input and output tokens per request (gen_ai.token.type)")
            .with_boundaries(TOKEN_BUCKETS.to_vec())
            .build();
        let requests = meter
            .u64_counter("tokentap.requests")
            .with_unit("{request}")
            .with_description("Finished requests, failures included (error.type)")
            .build();
        let http = meter
            .u64_counter("tokentap.http.requests")
            .with_unit("{request}")
            .with_description(
                "Requests on an engine's port that are not LLM requests (probes, scrapes, model listings, other paths), by tokentap.http.route_class",
            )
            .build();
        Self {
            ttft,
            tpot,
            duration,
            chunk,
            queue,
            engine_queue,
            prefill,
            decode,
            cached_input,
            tokens,
            requests,
            http,
        }
    }

    fn record(&self, f: &Finished, attrs: &[KeyValue]) {
        let r = &f.record;
        // A gateway's request is the engine's request seen one hop
        // earlier: its latencies are its own (`tokentap.role` = `gateway`),
        // but the request and its tokens are counted once, at the engine.
        let counted = r.role != Some(crate::vocab::ServingRole::Gateway);
        if counted {
            self.requests.add(1, attrs);
        }
        if let Some(d) = r.duration_s {
            self.duration.record(d, attrs);
        }
        if let Some(v) = r.ttft_s {
            self.ttft.record(v, attrs);
        }
        if let Some(v) = r.tpot_s {
            self.tpot.record(v, attrs);
        }
        if let Some(v) = r.queue_s {
            self.queue.record(v, attrs);
        }
        for (h, v) in [
            (&self.engine_queue, r.engine_queue_s),
            (&self.prefill, r.prefill_s),
            (&self.decode, r.decode_s),
        ] {
            if let Some(v) = v {
                h.record(v, attrs);
            }
        }
        if let Some(n) = r.cached_input_tokens.filter(|_| counted) {
            self.cached_input.add(n, attrs);
        }
        for g in &f.chunk_gaps_s {
            self.chunk.record(*g, attrs);
        }
        if !counted {
            return;
        }
        for (kind, n) in [("input", r.input_tokens), ("output", r.output_tokens)] {
            if let Some(n) = n {
                let mut a = attrs.to_vec();
                a.push(KeyValue::new("gen_ai.token.type", kind));
                self.tokens.record(n, &a);
            }
        }
    }
}

/// Engine containers with a resource of their own at most; later ones are
/// exported under the agent's resource (and counted as overflow).
pub const MAX_CONTAINER_RESOURCES: usize = 64;

/// The OTLP sink. Request metrics of an engine in a container go out under
/// a resource of that container's own (`container.id`, `k8s.pod.uid`), so a
/// Collector's `k8sattributes` processor can add the pod's name, namespace
/// and labels; the agent's own metrics (health, GPUs) and requests of
/// engines outside containers use the agent's resource.
pub struct Metrics {
    cfg: MetricsConfig,
    /// The metrics exporter's resolved settings (each container's provider
    /// gets an exporter of its own built from them).
    collector: crate::sinks::otlp::exporter::Collector,
    health: Arc<Health>,
    provider: SdkMeterProvider,
    requests: RequestInstruments,
    /// container.id → its provider and instruments.
    containers: HashMap<String, (SdkMeterProvider, RequestInstruments)>,
    attrs: AttributeMap,
    /// Engine pid → (engine, model) from records, for GPU instruments.
    engine_names: crate::stage::EngineNames,
    /// What the features' instrument sets returned: alive with the meter.
    _feature_instruments: Vec<Box<dyn std::any::Any + Send>>,
    /// `tokentap.events`: timeline events by kind and subject.
    events: Counter<u64>,
}

/// An attribute with unbounded values (model names, tenants, callers): the
/// first `max` distinct values pass, later ones read "other". Holds at
/// most `max` values (each bounded by its source: a tenant is at most 128
/// bytes).
pub struct Capped {
    seen: HashSet<String>,
    max: usize,
    /// Values folded into "other" (each time one is).
    pub overflow: u64,
}

impl Capped {
    pub fn new(max: usize) -> Self {
        Self {
            seen: HashSet::new(),
            max,
            overflow: 0,
        }
    }

    /// The value as the request metrics export it, without admitting it or
    /// counting an overflow (timeline events name tenants, callers and
    /// versions their requests already brought in).
    pub fn peek(&self, v: Option<&str>) -> String {
        match v {
            None => UNKNOWN.to_string(),
            Some(v) if self.seen.contains(v) => v.to_string(),
            Some(_) => OTHER.to_string(),
        }
    }

    pub fn get(&mut self, v: Option<&str>) -> String {
        let Some(v) = v else {
            return UNKNOWN.to_string();
        };
        if self.seen.contains(v) {
            return v.to_string();
        }
        if self.seen.len() < self.max {
            self.seen.insert(v.to_string());
            return v.to_string();
        }
        self.overflow += 1;
        OTHER.to_string()
    }

    /// Distinct values kept (at most `max`).
    pub fn len(&self) -> usize {
        self.seen.len()
    }

    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }
}

/// Which cap an attribute's values count against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CapKey {
    Model,
    /// `tokentap.model.version`: as many distinct values as model names.
    ModelVersion,
    Tenant,
    Caller,
}

/// The one mapping from a record to metric attributes, with a
/// cardinality cap per unbounded key.
pub struct AttributeMap {
    caps: HashMap<CapKey, Capped>,
    health: Arc<Health>,
}

impl AttributeMap {
    /// `max_tenants` caps tenants and callers, each on its own.
    pub fn new(max_models: usize, max_tenants: usize, health: Arc<Health>) -> Self {
        Self {
            caps: [
                (CapKey::Model, Capped::new(max_models)),
                (CapKey::ModelVersion, Capped::new(max_models)),
                (CapKey::Tenant, Capped::new(max_tenants)),
                (CapKey::Caller, Capped::new(max_tenants)),
            ]
            .into(),
            health,
        }
    }

    /// Distinct values the cap of `key` holds now.
    pub fn held(&self, key: CapKey) -> usize {
        self.caps.get(&key).map_or(0, Capped::len)
    }

    /// What [`Self::capped`] would export for `v`, without admitting it.
    pub fn peek(&self, key: CapKey, v: Option<&str>) -> String {
        self.caps
            .get(&key)
            .map_or_else(|| OTHER.to_string(), |c| c.peek(v))
    }

    fn capped(&mut self, key: CapKey, v: Option<&str>) -> String {
        let c = self.caps.get_mut(&key).expect("every CapKey has a cap");
        let before = c.overflow;
        let out = c.get(v);
        if c.overflow > before {
            self.health
                .attribute_overflow
                .fetch_add(1, Ordering::Relaxed);
        }
        out
    }

    /// Attributes of every request instrument; `error.type` is added when
    /// the request failed (on every instrument, TTFT and TPOT included).
    pub fn of(&mut self, r: &RequestRecord) -> Vec<KeyValue> {
        let mut attrs = vec![
            KeyValue::new(
                "gen_ai.operation.name",
                r.operation.map_or(UNKNOWN, |o| o.as_str()),
            ),
            KeyValue::new(
                "gen_ai.provider.name",
                r.provider.clone().unwrap_or_else(|| UNKNOWN.to_string()),
            ),
            KeyValue::new(
                "gen_ai.request.model",
                self.capped(CapKey::Model, r.request_model.as_deref()),
            ),
            KeyValue::new(
                "gen_ai.response.model",
                self.capped(CapKey::Model, r.response_model.as_deref()),
            ),
            KeyValue::new("tokentap.stream", r.stream),
            KeyValue::new(
                "tokentap.tenant",
                self.capped(CapKey::Tenant, r.tenant.as_deref()),
            ),
            KeyValue::new(
                "tokentap.caller",
                self.capped(CapKey::Caller, r.caller.as_deref()),
            ),
            // Bounded: the built-ins plus the config file's rule names.
            KeyValue::new(
                "tokentap.request.type",
                r.request_type
                    .clone()
                    .unwrap_or_else(|| UNKNOWN.to_string()),
            ),
        ];
        if let Some(p) = r.server_port {
            attrs.push(KeyValue::new("server.port", p as i64));
        }
        // Only when known: a replay, or a process the agent did not name,
        // has no version (omitted rather than one "unknown" series).
        if let Some(v) = r.model_version.as_deref() {
            attrs.push(KeyValue::new(
                "tokentap.model.version",
                self.capped(CapKey::ModelVersion, Some(v)),
            ));
        }
        // The engine's build, when known (a handful of values per node).
        if let Some(v) = r.engine_version.as_deref() {
            attrs.push(KeyValue::new("tokentap.engine.version", v.to_string()));
        }
        if let Some(e) = r.error_type {
            attrs.push(KeyValue::new("error.type", e.as_str()));
        }
        // Only on requests seen at two hops (a gateway joined): `gateway`
        // or `engine` (bounded).
        if let Some(role) = r.role {
            attrs.push(KeyValue::new("tokentap.role", role.as_str()));
        }
        attrs
    }
}

/// `http.request.method` as the conventions bound it: the known methods,
/// else `_OTHER`.
fn http_method(m: &str) -> &'static str {
    const KNOWN: [&str; 9] = [
        "GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH", "CONNECT", "TRACE",
    ];
    KNOWN
        .into_iter()
        .find(|k| k.eq_ignore_ascii_case(m))
        .unwrap_or("_OTHER")
}

/// A provider's last export (`shutdown`), blocking, off the async workers
/// (the gRPC client needs them meanwhile); a failure is said, naming
/// `what`.
pub(crate) fn final_export(
    what: &str,
    shutdown: impl FnOnce() -> opentelemetry_sdk::error::OTelSdkResult,
) {
    tokio::task::block_in_place(move || {
        if let Err(e) = shutdown() {
            eprintln!("tokentap: final OTLP export of {what} did not complete: {e}");
        }
    });
}

/// The agent's health instruments (`stage::health::INSTRUMENTS`), read
/// from `health` when the SDK collects.
fn register_health(meter: &opentelemetry::metrics::Meter, health: &Arc<Health>) {
    use crate::stage::health::{HealthKind, Reading, INSTRUMENTS};
    for i in INSTRUMENTS {
        let h = health.clone();
        let read = i.read;
        // The values a collection observes, with their attributes.
        let values = move || -> Vec<(i64, Vec<KeyValue>)> {
            match read {
                Reading::One(f) => vec![(f(&h), vec![])],
                Reading::ByReason(f) => f(&h)
                    .into_iter()
                    .map(|(r, n)| (n as i64, vec![KeyValue::new("reason", r)]))
                    .collect(),
                Reading::ByAttrs(f) => f(&h)
                    .into_iter()
                    .map(|(kv, n)| {
                        (
                            n as i64,
                            kv.into_iter().map(|(k, v)| KeyValue::new(k, v)).collect(),
                        )
                    })
                    .collect(),
            }
        };
        // One builder per kind; the same unit, description and callback.
        macro_rules! register {
            ($builder:ident, $value:expr) => {
                meter
                    .$builder(i.name)
                    .with_unit(i.unit)
                    .with_description(i.description)
                    .with_callback(move |o| {
                        for (v, a) in values() {
                            o.observe($value(v), &a);
                        }
                    })
                    .build()
            };
        }
        let non_negative = |v: i64| v.max(0) as u64;
        match i.kind {
            HealthKind::Counter => drop(register!(u64_observable_counter, non_negative)),
            HealthKind::Gauge => drop(register!(u64_observable_gauge, non_negative)),
            HealthKind::UpDown => drop(register!(i64_observable_up_down_counter, |v: i64| v)),
        }
    }
}

/// A meter provider exporting to the configured collector, with the
/// agent's resource plus `extra` attributes (an engine container's
/// `container.id` / `k8s.pod.uid`). Each has its own exporter: the SDK
/// gives one resource per provider.
fn build_provider(
    cfg: &MetricsConfig,
    collector: &crate::sinks::otlp::exporter::Collector,
    health: &Arc<Health>,
    extra: &[KeyValue],
) -> Result<SdkMeterProvider> {
    let (exporter, cause) = collector.metric_exporter()?;
    let counted = Counted {
        inner: exporter,
        report: crate::sinks::otlp::exporter::FailureReport::new(
            health.clone(),
            cause,
            format!("to {}", collector.target()),
            "capture goes on, the next interval retries",
            false,
        ),
    };
    let reader = PeriodicReader::builder(counted)
        .with_interval(cfg.interval)
        .build();
    let mut builder = SdkMeterProvider::builder()
        .with_resource(agent_resource(extra))
        .with_reader(reader);
    if cfg.exponential {
        builder = builder.with_view(|i: &Instrument| {
            (i.kind() == InstrumentKind::Histogram)
                .then(|| {
                    Stream::builder()
                        .with_aggregation(Aggregation::Base2ExponentialHistogram {
                            max_size: 160,
                            max_scale: 20,
                            record_min_max: true,
                        })
                        .build()
                        .ok()
                })
                .flatten()
        });
    }
    Ok(builder.build())
}

/// The agent's OTLP resource (service, host, node) plus `extra`.
pub(crate) fn agent_resource(extra: &[KeyValue]) -> Resource {
    // OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES are read by the
    // builder's detectors; only default the name when neither sets it.
    let mut res = Resource::builder();
    let named = std::env::var_os("OTEL_SERVICE_NAME").is_some()
        || std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|v| v.contains("service.name="));
    if !named {
        res = res.with_service_name("tokentap");
    }
    let mut attrs = vec![KeyValue::new("host.name", crate::host::node::node_name())];
    attrs.extend_from_slice(extra);
    if let Ok(node) = std::env::var("NODE_NAME") {
        attrs.push(KeyValue::new("k8s.node.name", node));
    }
    res.with_attributes(attrs).build()
}

impl Metrics {
    /// Builds the exporter and instruments. Needs a tokio runtime for gRPC.
    /// The sink, with the features' instrument sets registered on its
    /// meter.
    pub fn new(
        cfg: &MetricsConfig,
        health: Arc<Health>,
        instruments: Vec<Box<dyn crate::stage::InstrumentSet>>,
    ) -> Result<Self> {
        if let Some(e) = &cfg.endpoint {
            if !(e.starts_with("http://") || e.starts_with("https://")) {
                bail!("--otlp-endpoint must be an http:// or https:// URL, got {e:?}");
            }
        }
        let env = |k: &str| std::env::var(k).ok();
        let collector = crate::sinks::otlp::exporter::Collector::resolve(
            cfg,
            crate::sinks::otlp::exporter::Signal::Metrics,
            &env,
        )?;
        let provider = build_provider(cfg, &collector, &health, &[])?;
        let meter = provider.meter("tokentap");
        let requests = RequestInstruments::new(&meter);
        register_health(&meter, &health);
        let engine_names = crate::stage::EngineNames::default();
        let feature_instruments = instruments
            .iter()
            .map(|set| set.register(&meter, &engine_names))
            .collect();
        let events = meter
            .u64_counter("tokentap.events")
            .with_unit("{event}")
            .with_description(
                "Timeline events (engine, model version, caller, token drift, GPU) by kind",
            )
            .build();
        Ok(Self {
            events,
            _feature_instruments: feature_instruments,
            engine_names,
            provider,
            requests,
            containers: HashMap::new(),
            attrs: AttributeMap::new(cfg.max_models, cfg.max_tenants, health.clone()),
            cfg: cfg.clone(),
            collector,
            health,
        })
    }

    pub fn record(&mut self, f: &Finished) {
        let r = &f.record;
        if r.gpu_uuids.is_some() {
            let model = self.attrs.capped(
                CapKey::Model,
                r.response_model.as_deref().or(r.request_model.as_deref()),
            );
            let mut n = self.engine_names.lock().unwrap_or_else(|p| p.into_inner());
            n.insert(
                r.pid,
                (r.provider.clone().unwrap_or_else(|| UNKNOWN.into()), model),
            );
        }
        let attrs = self.attrs.of(r);
        self.instruments_for(r).record(f, &attrs);
    }

    /// A request that is not an LLM request: `tokentap.http.requests` with
    /// the engine's identity, the method, the status and the route class —
    /// no model, tenant or caller (those are LLM request attributes, capped
    /// by LLM traffic alone).
    pub fn other_request(&mut self, f: &Finished, class: RouteClass) {
        let r = &f.record;
        let mut attrs = vec![
            KeyValue::new(
                "gen_ai.provider.name",
                r.provider.clone().unwrap_or_else(|| UNKNOWN.to_string()),
            ),
            KeyValue::new("http.request.method", http_method(&r.method)),
            KeyValue::new("tokentap.http.route_class", class.as_str()),
        ];
        if let Some(s) = r.status {
            attrs.push(KeyValue::new("http.response.status_code", s as i64));
        }
        if let Some(p) = r.server_port {
            attrs.push(KeyValue::new("server.port", p as i64));
        }
        if let Some(v) = r.model_version.as_deref() {
            // Peeked, not admitted: the caps are filled by LLM traffic.
            attrs.push(KeyValue::new(
                "tokentap.model.version",
                self.attrs.peek(CapKey::ModelVersion, Some(v)),
            ));
        }
        self.instruments_for(r).http.add(1, &attrs);
    }

    /// The instruments of the record's engine container (its own
    /// resource, made on its first request), else the agent's.
    fn instruments_for(&mut self, r: &RequestRecord) -> &RequestInstruments {
        let Some(id) = &r.container_id else {
            return &self.requests;
        };
        if !self.containers.contains_key(id) && self.containers.len() < MAX_CONTAINER_RESOURCES {
            let mut extra = vec![KeyValue::new("container.id", id.clone())];
            if let Some(uid) = &r.k8s_pod_uid {
                extra.push(KeyValue::new("k8s.pod.uid", uid.clone()));
            }
            // --kube-metadata: names known when the container's first
            // request is recorded (a resource cannot change afterwards).
            if let Some(n) = &r.k8s_pod_name {
                extra.push(KeyValue::new("k8s.pod.name", n.clone()));
            }
            if let Some(n) = &r.k8s_namespace {
                extra.push(KeyValue::new("k8s.namespace.name", n.clone()));
            }
            if let Some(image) = &r.container_image {
                let (name, tag) = crate::host::kube::image_name_tag(image);
                extra.push(KeyValue::new("container.image.name", name.to_string()));
                if let Some(t) = tag {
                    extra.push(KeyValue::new(
                        "container.image.tags",
                        opentelemetry::Value::Array(
                            vec![opentelemetry::StringValue::from(t.to_string())].into(),
                        ),
                    ));
                }
            }
            if let Some(d) = &r.container_image_id {
                extra.push(KeyValue::new("oci.manifest.digest", d.clone()));
            }
            match build_provider(&self.cfg, &self.collector, &self.health, &extra) {
                Ok(p) => {
                    let ri = RequestInstruments::new(&p.meter("tokentap"));
                    self.containers.insert(id.clone(), (p, ri));
                }
                Err(e) => eprintln!(
                    "tokentap: cannot export container {id}'s metrics under its own resource ({e:#}); using the agent's"
                ),
            }
        }
        match self.containers.get(id) {
            Some((_, ri)) => ri,
            None => {
                self.health
                    .attribute_overflow
                    .fetch_add(1, Ordering::Relaxed);
                &self.requests
            }
        }
    }

    /// Final collection and export of every provider (each bounded by the
    /// SDK's 5 s shutdown).
    /// One timeline event: counted (`tokentap.events`, with the kind and
    /// the tenant, caller and model version it names, each capped like the
    /// request attributes) and exported as a log record.
    pub fn event(&mut self, e: &crate::stage::events::Event) {
        let s = |k: &str| e.attr(k).and_then(|v| v.as_str()).map(str::to_string);
        let mut attrs = vec![KeyValue::new("tokentap.event.kind", e.kind)];
        if let Some(t) = s("tokentap.tenant") {
            let v = self.attrs.peek(CapKey::Tenant, Some(&t));
            attrs.push(KeyValue::new("tokentap.tenant", v));
        }
        if let Some(c) = s("tokentap.caller") {
            let v = self.attrs.peek(CapKey::Caller, Some(&c));
            attrs.push(KeyValue::new("tokentap.caller", v));
        }
        if let Some(m) = s("tokentap.model.version") {
            let v = self.attrs.peek(CapKey::ModelVersion, Some(&m));
            attrs.push(KeyValue::new("tokentap.model.version", v));
        }
        if let Some(k) = s("error.type") {
            attrs.push(KeyValue::new("error.type", k));
        }
        self.events.add(1, &attrs);
    }

    pub fn shutdown(self) {
        for p in std::iter::once(&self.provider).chain(self.containers.values().map(|(p, _)| p)) {
            if let Err(e) = p.shutdown() {
                eprintln!("tokentap: final OTLP export did not complete: {e}");
            }
        }
    }
}

impl Sink for Metrics {
    fn record(&mut self, f: &Finished) -> Result<()> {
        Metrics::record(self, f);
        Ok(())
    }

    fn other_request(&mut self, f: &Finished, class: RouteClass) -> Result<()> {
        Metrics::other_request(self, f, class);
        Ok(())
    }

    fn event(&mut self, e: &crate::stage::events::Event) -> Result<()> {
        Metrics::event(self, e);
        Ok(())
    }

    /// The SDK's periodic reader exports on its own thread; health is read
    /// by the observable instruments' callbacks.
    fn tick(&mut self, _: &Tick<'_>) -> Result<()> {
        Ok(())
    }

    fn shutdown(self: Box<Self>, _: &Tick<'_>) -> Result<()> {
        // Blocking final export, off the async workers (the gRPC client
        // needs them to make progress meanwhile).
        let m = *self;
        tokio::task::block_in_place(move || m.shutdown());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unbounded_values_are_capped_into_other() {
        let mut c = Capped::new(2);
        assert_eq!(c.get(Some("a")), "a");
        assert_eq!(c.get(Some("b")), "b");
        assert_eq!(c.get(Some("c")), "other");
        assert_eq!(c.get(Some("a")), "a");
        assert_eq!(c.get(None), "unknown");
    }

    fn version_attr(attrs: &[KeyValue]) -> Option<String> {
        attrs
            .iter()
            .find(|kv| kv.key.as_str() == "tokentap.model.version")
            .map(|kv| kv.value.to_string())
    }

    #[test]
    fn the_model_version_is_an_attribute_when_known_capped_apart_from_model_names() {
        let health = Arc::new(Health::default());
        let mut m = AttributeMap::new(2, 100, health.clone());
        let rec = |v: Option<&str>| RequestRecord {
            request_model: Some("m".into()),
            model_version: v.map(str::to_string),
            ..Default::default()
        };
        assert_eq!(
            version_attr(&m.of(&rec(None))),
            None,
            "omitted when unknown"
        );
        assert_eq!(
            version_attr(&m.of(&rec(Some("aaa")))).as_deref(),
            Some("aaa")
        );
        assert_eq!(
            version_attr(&m.of(&rec(Some("bbb")))).as_deref(),
            Some("bbb")
        );
        assert_eq!(
            version_attr(&m.of(&rec(Some("ccc")))).as_deref(),
            Some("other")
        );
        assert_eq!(health.attribute_overflow.load(Ordering::Relaxed), 1);
        // Versions do not use up the model names' slots.
        let attrs = m.of(&RequestRecord {
            request_model: Some("m2".into()),
            ..Default::default()
        });
        assert!(attrs
            .iter()
            .any(|kv| kv.key.as_str() == "gen_ai.request.model" && kv.value.to_string() == "m2"));
    }

    fn attr<'a>(attrs: &'a [KeyValue], key: &str) -> &'a opentelemetry::Value {
        &attrs
            .iter()
            .find(|kv| kv.key.as_str() == key)
            .unwrap_or_else(|| panic!("no {key}"))
            .value
    }

    #[test]
    fn tenant_caller_and_request_type_are_attributes_with_unknown_for_null() {
        let mut m = AttributeMap::new(4, 4, Arc::new(Health::default()));
        let r = RequestRecord {
            tenant: Some("acme".into()),
            caller: Some("10.0.0.7".into()),
            request_type: Some("rag".into()),
            ..Default::default()
        };
        let a = m.of(&r);
        assert_eq!(attr(&a, "tokentap.tenant").as_str(), "acme");
        assert_eq!(attr(&a, "tokentap.caller").as_str(), "10.0.0.7");
        assert_eq!(attr(&a, "tokentap.request.type").as_str(), "rag");
        let a = m.of(&RequestRecord::default());
        assert_eq!(attr(&a, "tokentap.tenant").as_str(), UNKNOWN);
        assert_eq!(attr(&a, "tokentap.caller").as_str(), UNKNOWN);
        assert_eq!(attr(&a, "tokentap.request.type").as_str(), UNKNOWN);
    }

    /// 10,000 distinct tenants (and callers) from one client: at most
    /// N + 1 distinct values exported per key, every overflow counted in
    /// health, and each cap holds at most N values (memory bounded).
    #[test]
    fn ten_thousand_tenants_export_at_most_n_plus_one_values_and_count_the_overflow() {
        const N: usize = 100;
        let health = Arc::new(Health::default());
        let mut m = AttributeMap::new(64, N, health.clone());
        let mut tenants = HashSet::new();
        let mut callers = HashSet::new();
        for i in 0..10_000u32 {
            let r = RequestRecord {
                tenant: Some(format!("tenant-{i}")),
                caller: Some(format!("10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255)),
                request_model: Some("m".into()),
                ..Default::default()
            };
            let a = m.of(&r);
            tenants.insert(attr(&a, "tokentap.tenant").as_str().to_string());
            callers.insert(attr(&a, "tokentap.caller").as_str().to_string());
        }
        assert_eq!(tenants.len(), N + 1, "N tenants and `other`");
        assert!(tenants.contains(OTHER));
        assert_eq!(callers.len(), N + 1, "callers are capped on their own");
        assert_eq!(m.held(CapKey::Tenant), N);
        assert_eq!(m.held(CapKey::Caller), N);
        assert_eq!(m.held(CapKey::Model), 1, "other keys are not affected");
        assert_eq!(
            health.attribute_overflow.load(Ordering::Relaxed),
            2 * (10_000 - N as u64),
            "each value folded into `other` is counted"
        );
        // A tenant seen before the cap filled keeps its own value.
        let a = m.of(&RequestRecord {
            tenant: Some("tenant-3".into()),
            ..Default::default()
        });
        assert_eq!(attr(&a, "tokentap.tenant").as_str(), "tenant-3");
    }

    #[test]
    fn bucket_lists_are_sorted_and_protocols_parse() {
        for b in [
            &TTFT_BUCKETS[..],
            &TPOT_BUCKETS,
            &DURATION_BUCKETS,
            &TOKEN_BUCKETS,
        ] {
            assert!(b.windows(2).all(|w| w[0] < w[1]));
        }
        assert_eq!("grpc".parse::<OtlpProtocol>(), Ok(OtlpProtocol::Grpc));
        assert_eq!(
            "http/protobuf".parse::<OtlpProtocol>(),
            Ok(OtlpProtocol::HttpProtobuf)
        );
        assert!("udp".parse::<OtlpProtocol>().is_err());
    }
}
