//! One OTLP span per LLM request, to the collector the metrics go to (same
//! endpoint, TLS and headers rules; `/v1/traces` over HTTP;
//! `OTEL_EXPORTER_OTLP_TRACES_*` honoured).
//!
//! The span: kind SERVER, named `{gen_ai.operation.name} {gen_ai.request.model}`,
//! from t0 (the request's arrival, else its read) to the last byte written,
//! with the GenAI conventions' attributes and tokentap's identity. Events
//! carry their true times: `gen_ai.first_token` at t0 + TTFT (and
//! `gen_ai.first_reasoning_token` when reasoning came first),
//! `tokentap.request.read` at t0 + `queue_s` (the engine read it). The
//! engine's own stages (`prefill_s`, …) are durations without a clock of
//! their own, so they are attributes, not events.
//!
//! Parent: the request's W3C `traceparent`, when valid, so the span joins
//! the caller's trace; otherwise a trace of its own. Sampling happens here,
//! after the request ended: a share (`--traces-sample`) by trace id (every
//! agent keeps the same traces), and always the failed ones and those
//! slower to their first token than `--traces-slow-ttft`.

use std::{
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use anyhow::Result;
use opentelemetry::{
    trace::{
        Span as _, SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId,
        TraceState, Tracer as _, TracerProvider as _,
    },
    Context, KeyValue,
};
use opentelemetry_sdk::{
    error::OTelSdkResult,
    trace::{IdGenerator, Sampler, SdkTracer, SdkTracerProvider, SpanData, SpanExporter},
    Resource,
};

use crate::record::Finished;
use crate::sinks::otlp::{
    exporter::{Collector, Signal},
    MetricsConfig,
};
use crate::stage::{health::Health, Sink, Tick};

/// The span exporter, with failures counted in `tokentap.export.failures`
/// and said once per outage.
#[derive(Debug)]
struct Counted<E> {
    inner: E,
    report: crate::sinks::otlp::exporter::FailureReport,
}

impl<E: SpanExporter> SpanExporter for Counted<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let r = self.inner.export(batch).await;
        self.report.after(&r);
        r
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// The OTLP trace sink: one span per LLM request, sampled.
pub struct TraceExport {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    sample: f64,
    slow_ttft: Option<f64>,
}

/// Whether a request's span is kept: failures and slow first tokens
/// always; the rest when the trace id falls in the sampled share (its low
/// 8 bytes as a fraction of 2^64, as the W3C random trace id flag
/// intends: every agent decides the same for one trace).
pub fn keep(
    trace_id: [u8; 16],
    error: bool,
    ttft_s: Option<f64>,
    sample: f64,
    slow_ttft: Option<f64>,
) -> bool {
    if error || matches!((ttft_s, slow_ttft), (Some(t), Some(s)) if t > s) {
        return true;
    }
    if sample >= 1.0 {
        return true;
    }
    let low = u64::from_be_bytes(trace_id[8..].try_into().unwrap_or([0; 8]));
    (low as f64) < sample * (u64::MAX as f64)
}

/// A fresh random id (a trace's without a parent, for `keep`).
fn random_bytes<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    // SAFETY: writes at most `N` bytes into `b`.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), N, 0) };
    if n != N as isize {
        // Never fails for a few bytes on Linux ≥ 3.17; fall back to time.
        let t = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos()
            .to_le_bytes();
        for (i, x) in b.iter_mut().enumerate() {
            *x = t[i % t.len()] ^ (i as u8);
        }
    }
    b
}

thread_local! {
    /// The trace and span id the next span gets (set just before it is
    /// started, on the thread that starts it): a record's own ids, so that
    /// a gateway's span is the parent its engine's record names, and the
    /// trace id sampling decided on is the one exported.
    static NEXT_IDS: std::cell::Cell<([u8; 16], Option<[u8; 8]>)> =
        const { std::cell::Cell::new(([0; 16], None)) };
}

/// The SDK's id source: the ids [`NEXT_IDS`] holds, else random ones.
#[derive(Debug)]
struct ChosenIds;

impl IdGenerator for ChosenIds {
    fn new_trace_id(&self) -> TraceId {
        let t = NEXT_IDS.with(|c| c.get().0);
        if t == [0; 16] {
            TraceId::from_bytes(random_bytes::<16>())
        } else {
            TraceId::from_bytes(t)
        }
    }

    fn new_span_id(&self) -> SpanId {
        let s = NEXT_IDS.with(|c| c.get().1);
        SpanId::from_bytes(s.unwrap_or_else(random_bytes::<8>))
    }
}

fn at(ns: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_nanos(ns)
}

fn after(t0: SystemTime, s: f64) -> SystemTime {
    t0 + Duration::from_secs_f64(s.max(0.0))
}

impl TraceExport {
    /// The sink for `cfg`'s collector (its traces endpoint, the sampling
    /// flags); None when the collector is named for metrics only. Needs a
    /// tokio runtime for gRPC.
    pub fn for_collector(cfg: &MetricsConfig, health: Arc<Health>) -> Result<Option<Self>> {
        match Collector::beside_metrics(cfg, Signal::Traces, "request spans are", "")? {
            Some(c) => Ok(Some(Self::new(
                &c,
                health,
                cfg.traces_sample,
                cfg.traces_slow_ttft,
            )?)),
            None => Ok(None),
        }
    }

    fn new(
        collector: &Collector,
        health: Arc<Health>,
        sample: f64,
        slow_ttft: Option<f64>,
    ) -> Result<Self> {
        let (exporter, cause) = collector.span_exporter()?;
        let provider = SdkTracerProvider::builder()
            .with_resource(crate::sinks::otlp::agent_resource(&[]))
            // Sampled here, after the request ended (`keep`).
            .with_sampler(Sampler::AlwaysOn)
            .with_id_generator(ChosenIds)
            .with_batch_exporter(Counted {
                inner: exporter,
                report: crate::sinks::otlp::exporter::FailureReport::new(
                    health,
                    cause,
                    "of request spans".into(),
                    "does the Collector have a traces pipeline? The request log and metrics have every request",
                    true,
                ),
            })
            .build();
        let tracer = provider.tracer("tokentap");
        Ok(Self {
            provider,
            tracer,
            sample,
            slow_ttft,
        })
    }

    fn span(&self, f: &Finished) {
        let r = &f.record;
        // The caller's trace, or (a gateway's request without one) the
        // trace its engine's record was put in.
        let own_trace = r
            .trace_id
            .as_deref()
            .and_then(|t| TraceId::from_hex(t).ok())
            .filter(|t| *t != TraceId::INVALID);
        let parent = own_trace.zip(
            r.parent_span_id
                .as_deref()
                .and_then(|s| SpanId::from_hex(s).ok())
                .filter(|s| *s != SpanId::INVALID),
        );
        let trace_id = own_trace
            .map(|t| t.to_bytes())
            .unwrap_or_else(random_bytes::<16>);
        if !keep(
            trace_id,
            r.error_type.is_some(),
            r.ttft_s,
            self.sample,
            self.slow_ttft,
        ) {
            return;
        }
        let cx = match parent {
            Some((t, s)) => Context::new().with_remote_span_context(SpanContext::new(
                t,
                s,
                TraceFlags::SAMPLED,
                true,
                TraceState::default(),
            )),
            None => Context::new(),
        };
        let op = r.operation.map_or("request", |o| o.as_str());
        let model = r
            .request_model
            .as_deref()
            .or(r.response_model.as_deref())
            .unwrap_or("unknown");
        let t0 = at(r.t0_ns);
        // The SDK takes the ids from `NEXT_IDS` (the trace id only without
        // a parent: a parent's is the span's).
        let span_id = r
            .span_id
            .as_deref()
            .and_then(|s| SpanId::from_hex(s).ok())
            .filter(|s| *s != SpanId::INVALID)
            .map(|s| s.to_bytes());
        NEXT_IDS.with(|c| c.set((trace_id, span_id)));
        let mut span = self
            .tracer
            .span_builder(format!("{op} {model}"))
            .with_kind(SpanKind::Server)
            .with_start_time(t0)
            .with_attributes(attributes(f))
            .start_with_context(&self.tracer, &cx);
        NEXT_IDS.with(|c| c.set(([0; 16], None)));
        if let Some(q) = r.queue_s {
            span.add_event_with_timestamp("tokentap.request.read", after(t0, q), vec![]);
        }
        if let Some(t) = r.ttft_reasoning_s {
            span.add_event_with_timestamp("gen_ai.first_reasoning_token", after(t0, t), vec![]);
        }
        if let Some(t) = r.ttft_s {
            span.add_event_with_timestamp("gen_ai.first_token", after(t0, t), vec![]);
        }
        if let Some(e) = &r.error_type {
            span.set_status(Status::error(e.as_str().to_string()));
        }
        span.end_with_timestamp(after(t0, r.duration_s.unwrap_or(0.0)));
    }
}

impl Sink for TraceExport {
    fn record(&mut self, f: &Finished) -> Result<()> {
        self.span(f);
        Ok(())
    }

    /// The SDK's batch processor exports on its own thread; what is
    /// queued goes at the end.
    fn shutdown(self: Box<Self>, _: &Tick<'_>) -> Result<()> {
        crate::sinks::otlp::final_export("request spans", move || self.provider.shutdown());
        Ok(())
    }
}

/// The GenAI conventions' attributes and tokentap's identity.
fn attributes(f: &Finished) -> Vec<KeyValue> {
    let r = &f.record;
    let mut a = Vec::with_capacity(24);
    let mut s = |k: &'static str, v: Option<&str>| {
        if let Some(v) = v {
            a.push(KeyValue::new(k, v.to_string()));
        }
    };
    s("gen_ai.operation.name", r.operation.map(|o| o.as_str()));
    s("gen_ai.provider.name", r.provider.as_deref());
    s("gen_ai.request.model", r.request_model.as_deref());
    s("gen_ai.response.model", r.response_model.as_deref());
    s("client.address", r.caller.as_deref());
    s("tokentap.model.version", r.model_version.as_deref());
    s("tokentap.tenant", r.tenant.as_deref());
    s("tokentap.request.type", r.request_type.as_deref());
    s("tokentap.request.id", r.request_id.as_deref());
    s("container.id", r.container_id.as_deref());
    s("k8s.pod.name", r.k8s_pod_name.as_deref());
    s("k8s.namespace.name", r.k8s_namespace.as_deref());
    let stages = r.stages_source.map(|x| x.to_string());
    s("tokentap.stages.source", stages.as_deref());
    let role = r.role.map(crate::vocab::ServingRole::as_str);
    s("tokentap.role", role);
    s("tokentap.gateway", r.gateway.as_deref());
    if let Some(e) = &r.error_type {
        a.push(KeyValue::new("error.type", e.as_str().to_string()));
    }
    if let Some(f) = &r.finish_reason {
        a.push(KeyValue::new(
            "gen_ai.response.finish_reasons",
            opentelemetry::Value::Array(vec![opentelemetry::StringValue::from(f.clone())].into()),
        ));
    }
    for (k, v) in [
        ("gen_ai.usage.input_tokens", r.input_tokens),
        ("gen_ai.usage.output_tokens", r.output_tokens),
        ("tokentap.cached_input_tokens", r.cached_input_tokens),
    ] {
        if let Some(v) = v {
            a.push(KeyValue::new(k, v as i64));
        }
    }
    if let Some(p) = r.server_port {
        a.push(KeyValue::new("server.port", p as i64));
    }
    a.push(KeyValue::new("tokentap.stream", r.stream));
    for (k, v) in [
        ("gen_ai.server.time_to_first_token", r.ttft_s),
        ("tokentap.queue_s", r.queue_s),
        ("tokentap.engine_queue_s", r.engine_queue_s),
        ("tokentap.prefill_s", r.prefill_s),
        ("tokentap.decode_s", r.decode_s),
        ("tokentap.gateway_s", r.gateway_s),
        ("tokentap.gateway_return_s", r.gateway_return_s),
    ] {
        if let Some(v) = v {
            a.push(KeyValue::new(k, v));
        }
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_and_slow_first_tokens_are_always_kept() {
        let id = [0xff; 16];
        assert!(!keep(id, false, Some(0.1), 0.0, None));
        assert!(keep(id, true, None, 0.0, None), "an error");
        assert!(keep(id, false, Some(2.5), 0.0, Some(2.0)), "slow");
        assert!(!keep(id, false, Some(1.5), 0.0, Some(2.0)));
        assert!(keep(id, false, None, 1.0, None), "everything at 1.0");
    }

    #[test]
    fn the_share_kept_follows_the_trace_id() {
        let mut low = [0u8; 16];
        low[15] = 1;
        assert!(keep(low, false, None, 0.5, None));
        let high = [0xff; 16];
        assert!(!keep(high, false, None, 0.5, None));
        // About the share over many random ids.
        let kept = (0..2000)
            .filter(|_| keep(random_bytes::<16>(), false, None, 0.25, None))
            .count();
        assert!((350..=650).contains(&kept), "{kept} of 2000 at 0.25");
    }
}
