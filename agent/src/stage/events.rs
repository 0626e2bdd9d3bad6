//! The timeline event: the events log's line and the sinks' message
//! (`{ts, kind, message, attributes}`; kinds are a contract). The
//! detectors that make events live in `timeline/`.

use serde::Serialize;
use serde_json::{Map, Value};

use crate::record::rfc3339;

/// Event kinds (a contract: dashboards and alert rules match on them).
pub mod kind {
    pub const ENGINE_START: &str = "engine.start";
    pub const ENGINE_STOP: &str = "engine.stop";
    pub const MODEL_VERSION_NEW: &str = "model_version.new";
    pub const MODEL_VERSION_ROLLOUT: &str = "model_version.rollout";
    pub const MODEL_VERSION_ROLLBACK: &str = "model_version.rollback";
    pub const ENGINE_VERSION_CHANGE: &str = "engine.version.change";
    pub const ENGINE_CONFIG_CHANGE: &str = "engine.config.change";
    pub const ENGINE_IMAGE_CHANGE: &str = "engine.image.change";
    pub const CALLER_NEW: &str = "caller.new";
    pub const CALLER_SURGE: &str = "caller.surge";
    pub const CALLER_ERROR_BURST: &str = "caller.error_burst";
    pub const CALLER_RETRY_STORM: &str = "caller.retry_storm";
    pub const TOKENS_DRIFT: &str = "tokens.drift";
    pub const GPU_THROTTLE_START: &str = "gpu.throttle.start";
    pub const GPU_THROTTLE_STOP: &str = "gpu.throttle.stop";
    pub const GPU_MEMORY_HIGH: &str = "gpu.memory.high";
    /// The events over the log's ceiling in a minute, counted by kind.
    pub const EVENTS_FOLDED: &str = "events.folded";
    /// Every kind, in the order docs/metrics.md lists them.
    pub const ALL: [&str; 17] = [
        ENGINE_START,
        ENGINE_STOP,
        ENGINE_VERSION_CHANGE,
        ENGINE_CONFIG_CHANGE,
        ENGINE_IMAGE_CHANGE,
        MODEL_VERSION_NEW,
        MODEL_VERSION_ROLLOUT,
        MODEL_VERSION_ROLLBACK,
        CALLER_NEW,
        CALLER_SURGE,
        CALLER_ERROR_BURST,
        CALLER_RETRY_STORM,
        TOKENS_DRIFT,
        GPU_THROTTLE_START,
        GPU_THROTTLE_STOP,
        GPU_MEMORY_HIGH,
        EVENTS_FOLDED,
    ];
}

/// One timeline event: one line of the events log.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Event {
    /// RFC 3339 UTC time of what the event reports.
    pub ts: String,
    pub kind: &'static str,
    /// One line for a human.
    pub message: String,
    /// What lines the event up with the metrics (metric attribute names:
    /// `gen_ai.provider.name`, `tokentap.model.version`, `tokentap.tenant`,
    /// …) and its evidence (counts, rates, window, baseline).
    pub attributes: Map<String, Value>,
    /// Nanosecond `ts`.
    #[serde(skip)]
    pub ts_ns: u64,
}

impl Event {
    pub fn new(ts_ns: u64, kind: &'static str, message: String) -> Self {
        Self {
            ts: rfc3339(ts_ns),
            kind,
            message,
            attributes: Map::new(),
            ts_ns,
        }
    }

    /// Adds an attribute; `None` values are left out.
    pub fn with(mut self, key: &str, v: impl Into<Attr>) -> Self {
        if let Some(v) = v.into().0 {
            self.attributes.insert(key.to_string(), v);
        }
        self
    }

    pub fn attr(&self, key: &str) -> Option<&Value> {
        self.attributes.get(key)
    }
}

/// An attribute value (None: left out).
pub struct Attr(Option<Value>);

macro_rules! attr_from {
    ($($t:ty),*) => {$(
        impl From<$t> for Attr {
            fn from(v: $t) -> Self {
                Attr(Some(Value::from(v)))
            }
        }
        impl From<Option<$t>> for Attr {
            fn from(v: Option<$t>) -> Self {
                Attr(v.map(Value::from))
            }
        }
    )*};
}
attr_from!(u64, u32, i64, f64, bool, String, Vec<String>, Vec<u32>);

impl From<&str> for Attr {
    fn from(v: &str) -> Self {
        Attr(Some(Value::from(v)))
    }
}

impl From<Option<&str>> for Attr {
    fn from(v: Option<&str>) -> Self {
        Attr(v.map(Value::from))
    }
}

impl From<Value> for Attr {
    fn from(v: Value) -> Self {
        Attr((!v.is_null()).then_some(v))
    }
}
