//! Timeline events as OTLP log records, to the collector the metrics go to
//! (same endpoint and protocol; `/v1/logs` over HTTP). Each record has the
//! event's kind as its event name and `tokentap.event.kind` attribute, the
//! message as its body, and the event's attributes (strings, numbers,
//! booleans; lists and objects as JSON text). Exported in batches by the
//! SDK's own thread; a collector that is down loses nothing the events log
//! keeps.

use std::{
    sync::Arc,
    time::{Duration, UNIX_EPOCH},
};

use anyhow::Result;
use opentelemetry::{
    logs::{AnyValue, LogRecord as _, Logger as _, LoggerProvider as _, Severity},
    Key,
};
use opentelemetry_sdk::{
    error::OTelSdkResult,
    logs::{LogBatch, LogExporter, SdkLogger, SdkLoggerProvider},
    Resource,
};
use serde_json::Value;

use crate::record::Finished;
use crate::sinks::otlp::{
    exporter::{Collector, Signal},
    MetricsConfig,
};
use crate::stage::{events::Event, health::Health, Sink, Tick};

/// The log exporter, with failures counted in `tokentap.export.failures`
/// and said once per outage (a Collector without a `logs` pipeline
/// refuses them: the events log and the `tokentap.events` counter still
/// have every event).
#[derive(Debug)]
struct Counted<E> {
    inner: E,
    report: crate::sinks::otlp::exporter::FailureReport,
}

impl<E: LogExporter> LogExporter for Counted<E> {
    async fn export(&self, batch: LogBatch<'_>) -> OTelSdkResult {
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

/// The OTLP log sink: one log record per timeline event.
pub struct EventExport {
    provider: SdkLoggerProvider,
    logger: SdkLogger,
}

fn any_value(v: &Value) -> AnyValue {
    match v {
        Value::Bool(b) => AnyValue::Boolean(*b),
        Value::Number(n) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => AnyValue::Int(i),
            (None, Some(f)) => AnyValue::Double(f),
            _ => AnyValue::String(n.to_string().into()),
        },
        Value::String(s) => AnyValue::String(s.clone().into()),
        other => AnyValue::String(other.to_string().into()),
    }
}

impl EventExport {
    /// The sink for `cfg`'s collector (its logs endpoint); None when the
    /// collector is named for metrics only. Needs a tokio runtime for gRPC.
    pub fn for_collector(cfg: &MetricsConfig, health: Arc<Health>) -> Result<Option<Self>> {
        match Collector::beside_metrics(
            cfg,
            Signal::Logs,
            "timeline events are",
            " (--events-log and tokentap.events have them all)",
        )? {
            Some(c) => Ok(Some(Self::new(&c, health)?)),
            None => Ok(None),
        }
    }

    fn new(collector: &Collector, health: Arc<Health>) -> Result<Self> {
        let (exporter, cause) = collector.log_exporter()?;
        let provider = SdkLoggerProvider::builder()
            .with_resource(crate::sinks::otlp::agent_resource(&[]))
            .with_batch_exporter(Counted {
                inner: exporter,
                report: crate::sinks::otlp::exporter::FailureReport::new(
                    health,
                    cause,
                    "of timeline events".into(),
                    "does the Collector have a logs pipeline? Events are still counted in tokentap.events and written to --events-log",
                    true,
                ),
            })
            .build();
        let logger = provider.logger("tokentap");
        Ok(Self { provider, logger })
    }

    fn emit(&self, e: &Event) {
        let mut r = self.logger.create_log_record();
        r.set_event_name(e.kind);
        r.set_timestamp(UNIX_EPOCH + Duration::from_nanos(e.ts_ns));
        r.set_observed_timestamp(std::time::SystemTime::now());
        r.set_severity_number(Severity::Info);
        r.set_severity_text("INFO");
        r.set_body(AnyValue::String(e.message.clone().into()));
        r.add_attribute(Key::from_static_str("tokentap.event.kind"), e.kind);
        for (k, v) in &e.attributes {
            r.add_attribute(Key::new(k.clone()), any_value(v));
        }
        self.logger.emit(r);
    }
}

impl Sink for EventExport {
    /// Requests are not events.
    fn record(&mut self, _: &Finished) -> Result<()> {
        Ok(())
    }

    fn event(&mut self, e: &Event) -> Result<()> {
        self.emit(e);
        Ok(())
    }

    /// The SDK's batch processor exports on its own thread; what is
    /// queued goes at the end.
    fn shutdown(self: Box<Self>, _: &Tick<'_>) -> Result<()> {
        crate::sinks::otlp::final_export("events", move || self.provider.shutdown());
        Ok(())
    }
}
