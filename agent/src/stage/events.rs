//! The timeline event: the events log's line and the sinks' message
//! (`{ts, kind, message, attributes}`; kinds are a contract). The
//! detectors that make events live in `timeline/`.

use serde::Serialize;
use serde_json::{Map, Value};

use crate::{
    record::{rfc3339, Finished},
    stage::{gpu::GpuSample, NodeState},
    vocab::Subject,
};

/// Where a kind's events come from (docs/metrics.md's "from" column).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The targeted processes, at each pipeline tick.
    Ticks,
    /// Finished requests.
    Records,
    /// GPU samples.
    GpuSamples,
    /// Every other event (the ceiling).
    AllEvents,
}

impl Source {
    /// The words docs/metrics.md's table says it in.
    pub fn doc(self) -> &'static str {
        match self {
            Source::Ticks => "targeted processes, each tick",
            Source::Records => "records",
            Source::GpuSamples => "GPU samples",
            Source::AllEvents => "all events",
        }
    }
}

/// One event kind, declared: its name, where its events come from and
/// every attribute key they may carry (a value not known is left out).
/// The `--events-log` help, `deploy/prometheus/lint.py`'s kind list and
/// docs/metrics.md's table are made from or checked against [`kind::ALL`];
/// the timeline checks (debug builds) that each event it makes is a
/// declared kind of its detector with declared attributes only.
#[derive(Debug)]
pub struct Decl {
    pub name: &'static str,
    pub from: Source,
    pub attributes: &'static [&'static str],
}

impl Decl {
    /// The declaration of `name`.
    pub fn of(name: &str) -> Option<&'static Decl> {
        kind::ALL.iter().find(|d| d.name == name)
    }
}

/// Declares the kinds: a constant per kind and [`kind::ALL`], in the order
/// docs/metrics.md lists them.
macro_rules! kinds {
    ($($(#[$doc:meta])* $id:ident = $name:literal, $from:ident, [$($attr:literal),* $(,)?];)*) => {
        $($(#[$doc])* pub const $id: &str = $name;)*
        /// Every kind, declared, in the order docs/metrics.md lists them.
        pub const ALL: &[Decl] = &[$(Decl {
            name: $name,
            from: Source::$from,
            attributes: &[$($attr),*],
        }),*];
    };
}

/// Event kinds (a contract: dashboards and alert rules match on them).
/// Adding one: its line here, the detector that emits it
/// ([`Detector::kinds`]), and its row in docs/metrics.md.
pub mod kind {
    use super::{Decl, Source};

    kinds! {
        ENGINE_START = "engine.start", Ticks, [
            "gen_ai.provider.name", "process.pid", "gen_ai.request.model",
            "tokentap.model.version", "server.port", "container.id", "k8s.pod.uid",
            "tokentap.already_running",
        ];
        ENGINE_STOP = "engine.stop", Ticks, [
            "gen_ai.provider.name", "process.pid", "gen_ai.request.model",
            "tokentap.model.version", "server.port", "container.id", "k8s.pod.uid",
        ];
        ENGINE_VERSION_CHANGE = "engine.version.change", Ticks, [
            "gen_ai.provider.name", "gen_ai.request.model", "tokentap.engine.version",
            "tokentap.engine.version.previous", "tokentap.serving_config.version",
            "tokentap.model.version", "process.pid", "process.pid.previous", "container.id",
            "k8s.pod.uid",
        ];
        ENGINE_CONFIG_CHANGE = "engine.config.change", Ticks, [
            "gen_ai.provider.name", "gen_ai.request.model", "tokentap.engine.version",
            "tokentap.serving_config.version", "tokentap.serving_config.version.previous",
            "tokentap.model.version", "process.pid", "process.pid.previous", "container.id",
            "k8s.pod.uid", "changed", "previous", "current", "serving_config",
        ];
        ENGINE_IMAGE_CHANGE = "engine.image.change", Records, [
            "gen_ai.provider.name", "gen_ai.request.model", "container.image.name",
            "oci.manifest.digest", "container.image.id.previous", "process.pid",
            "container.id", "k8s.pod.name", "k8s.namespace.name",
        ];
        MODEL_VERSION_NEW = "model_version.new", Records, [
            "tokentap.model.version", "gen_ai.request.model", "gen_ai.provider.name",
            "process.pid", "container.id", "k8s.pod.uid", "k8s.pod.name", "k8s.namespace.name",
        ];
        MODEL_VERSION_ROLLOUT = "model_version.rollout", Records, [
            "tokentap.model.version", "gen_ai.request.model", "gen_ai.provider.name",
            "process.pid", "container.id", "k8s.pod.uid", "k8s.pod.name", "k8s.namespace.name",
            "tokentap.model.version.previous",
        ];
        MODEL_VERSION_ROLLBACK = "model_version.rollback", Records, [
            "tokentap.model.version", "gen_ai.request.model", "gen_ai.provider.name",
            "process.pid", "container.id", "k8s.pod.uid", "k8s.pod.name", "k8s.namespace.name",
            "tokentap.model.version.previous", "idle_s",
        ];
        CALLER_NEW = "caller.new", Records, [
            "tokentap.tenant", "tokentap.caller", "gen_ai.provider.name", "gen_ai.request.model",
            "tokentap.model.version", "tokentap.request.type", "process.pid",
            "summary", "new_callers", "requests", "window_s", "top_callers",
        ];
        CALLER_SURGE = "caller.surge", Records, [
            "tokentap.tenant", "tokentap.caller", "window_s", "requests", "concurrency",
            "in_flight_requests", "ttft_p95_s", "gpu_utilization", "gen_ai.provider.name",
            "gen_ai.request.model", "tokentap.model.version", "process.pid",
            "rate_rps", "baseline_requests", "baseline_rps", "baseline_ttft_p95_s",
        ];
        CALLER_ERROR_BURST = "caller.error_burst", Records, [
            "tokentap.tenant", "tokentap.caller", "window_s", "requests", "concurrency",
            "in_flight_requests", "ttft_p95_s", "gpu_utilization", "gen_ai.provider.name",
            "gen_ai.request.model", "tokentap.model.version", "process.pid",
            "error.type", "errors", "error_fraction",
        ];
        CALLER_RETRY_STORM = "caller.retry_storm", Records, [
            "tokentap.tenant", "tokentap.caller", "window_s", "requests", "concurrency",
            "in_flight_requests", "ttft_p95_s", "gpu_utilization", "gen_ai.provider.name",
            "gen_ai.request.model", "tokentap.model.version", "process.pid",
            "repeated_requests", "repeated_fraction", "distinct_repeated_bodies",
            "max_repeats_of_one_body", "errors", "errors_window_before", "error_counts",
        ];
        TOKENS_DRIFT = "tokens.drift", Records, [
            "tokentap.tenant", "tokentap.caller", "tokentap.model.version",
            "tokentap.request.type", "gen_ai.provider.name", "gen_ai.request.model",
            "gen_ai.token.type", "direction", "baseline_p50", "baseline_p95", "window_p50",
            "window_p95", "p50_ratio", "p95_ratio", "ks_distance", "baseline_requests",
            "window_requests",
        ];
        LATENCY_SHIFT = "latency.shift", Records, [
            "metric", "gen_ai.provider.name", "gen_ai.request.model", "tokentap.model.version",
            "direction", "before", "after", "since", "window_s", "stage", "stages", "cause",
            "causes", "cause_event", "cause_event_ts", "tokentap.tenant", "tokentap.caller",
            "tokentap.request.type", "moved", "steady",
        ];
        ERRORS_SHIFT = "errors.shift", Records, [
            "metric", "error.class", "gen_ai.provider.name", "gen_ai.request.model",
            "tokentap.model.version", "direction", "before", "after", "since", "window_s",
            "cause", "causes", "cause_event", "cause_event_ts", "tokentap.tenant",
            "tokentap.caller", "tokentap.request.type", "moved", "steady",
        ];
        TOKENS_SHIFT = "tokens.shift", Records, [
            "metric", "gen_ai.provider.name", "gen_ai.request.model", "tokentap.model.version",
            "direction", "before", "after", "since", "window_s", "cause", "causes",
            "cause_event", "cause_event_ts", "tokentap.tenant", "tokentap.caller",
            "tokentap.request.type", "moved", "steady",
        ];
        CHANGE_IMPACT = "change.impact", Records, [
            "gen_ai.provider.name", "gen_ai.request.model", "tokentap.model.version", "change",
            "change_ts", "verdict", "regressed", "improved", "before", "after", "window_s",
        ];
        GPU_THROTTLE_START = "gpu.throttle.start", GpuSamples, [
            "gpu.uuid", "gpu.index", "gpu.name", "engines", "reasons", "sm_clock_mhz",
            "temperature_c", "power_w", "gpu_utilization",
        ];
        GPU_THROTTLE_STOP = "gpu.throttle.stop", GpuSamples, [
            "gpu.uuid", "gpu.index", "gpu.name", "engines", "reasons", "sm_clock_mhz",
            "temperature_c", "power_w", "gpu_utilization", "duration_s",
        ];
        GPU_MEMORY_HIGH = "gpu.memory.high", GpuSamples, [
            "gpu.uuid", "gpu.index", "gpu.name", "engines", "memory_used_bytes",
            "memory_total_bytes", "memory_fraction",
        ];
        /// The events over the log's ceiling in a minute, counted by kind.
        EVENTS_FOLDED = "events.folded", AllEvents, [
            "folded", "folded_by_kind", "max_events_per_minute",
        ];
    }

    /// The kinds' names, joined with `, ` (help texts list them from here).
    pub fn names() -> String {
        ALL.iter().map(|d| d.name).collect::<Vec<_>>().join(", ")
    }
}

/// A timeline detector: reads some of the records, ticks, GPU samples and
/// the clock, and emits events of the kinds it declares. The timeline
/// (`timeline/mod.rs`) runs a list of them, in order, each call in the
/// order the list gives; a detector implements what it reads.
pub trait Detector: Send {
    /// The kinds it emits (each declared in [`kind::ALL`]).
    fn kinds(&self) -> &'static [&'static str];
    /// A finished LLM request (gateways' copies excluded), at its end.
    fn record(&mut self, _f: &Finished, _cx: &RecordCx<'_>, _out: &mut Vec<Event>) {}
    /// The detectors' clock moved to `now_ns` (a record's end, or a tick);
    /// `in_flight`: the node's requests in flight, at a tick.
    fn clock(&mut self, _now_ns: u64, _in_flight: Option<usize>, _out: &mut Vec<Event>) {}
    /// A pipeline tick (live runs only), with what the tasks know of the
    /// targeted processes.
    fn tick(&mut self, _now_ns: u64, _node: &NodeState, _out: &mut Vec<Event>) {}
    /// A GPU sample (`node` names the engines on each device).
    fn gpu_sample(&mut self, _s: &GpuSample, _node: &NodeState, _out: &mut Vec<Event>) {}
    /// End of input: judge what is still open.
    fn finish(&mut self, _out: &mut Vec<Event>) {}
    /// An event another detector made (for the same input, before this
    /// detector's own call when it comes later in the list).
    fn observe(&mut self, _e: &Event) {}
}

/// What a detector is told with a record besides the record.
pub struct RecordCx<'a> {
    /// The request's end (the detectors' clock).
    pub end_ns: u64,
    /// Its tenant, else its caller.
    pub subject: Option<(Subject, &'a str)>,
    /// That subject is a named one (the first `--max-tenants` of its kind
    /// seen): only those get per-caller events.
    pub named: bool,
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
    /// An event of a declared kind (checked in debug builds).
    pub fn new(ts_ns: u64, kind: &'static str, message: String) -> Self {
        debug_assert!(
            Decl::of(kind).is_some(),
            "event kind {kind} is not declared in stage::events::kind::ALL"
        );
        Self {
            ts: rfc3339(ts_ns),
            kind,
            message,
            attributes: Map::new(),
            ts_ns,
        }
    }

    /// Adds an attribute; `None` values are left out. The key must be one
    /// its kind declares (checked in debug builds: every unit test that
    /// makes an event checks it).
    pub fn with(mut self, key: &str, v: impl Into<Attr>) -> Self {
        debug_assert!(
            Decl::of(self.kind).is_none_or(|d| d.attributes.contains(&key)),
            "{} event has attribute {key:?}, not declared in stage::events::kind::ALL",
            self.kind
        );
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

#[cfg(test)]
mod tests {
    use super::{kind, Decl};

    /// docs/metrics.md's "Timeline events" section.
    fn doc_section() -> String {
        let doc =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/metrics.md"))
                .expect("docs/metrics.md");
        let start = doc
            .find("\n## Timeline events")
            .expect("a Timeline events section");
        let end = doc[start + 1..]
            .find("\n## ")
            .map_or(doc.len(), |e| start + 1 + e);
        doc[start..end].to_string()
    }

    #[test]
    fn the_docs_table_lists_every_declared_kind_in_order_with_its_source_and_attributes() {
        let section = doc_section();
        let rows: Vec<Vec<&str>> = section
            .lines()
            .filter(|l| l.starts_with("| `"))
            .map(|l| l.trim_matches('|').split(" | ").map(str::trim).collect())
            .filter(|cols: &Vec<&str>| cols.len() == 4)
            .collect();
        let documented: Vec<(&str, &str)> = rows
            .iter()
            .map(|c| (c[0].trim_matches('`'), c[2]))
            .collect();
        let declared: Vec<(&str, &str)> =
            kind::ALL.iter().map(|d| (d.name, d.from.doc())).collect();
        assert_eq!(
            documented, declared,
            "docs/metrics.md's kinds table (kind, from) against stage::events::kind::ALL"
        );
        for d in kind::ALL {
            for a in d.attributes {
                // `KEY` or `KEY: value`.
                assert!(
                    section.contains(&format!("`{a}`")) || section.contains(&format!("`{a}: ")),
                    "{}'s attribute {a} is not documented in docs/metrics.md, \"Timeline events\"",
                    d.name
                );
            }
        }
    }

    #[test]
    fn kinds_and_attributes_are_declared_once() {
        let mut names: Vec<&str> = kind::ALL.iter().map(|d| d.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), kind::ALL.len(), "a kind declared twice");
        for d in kind::ALL {
            let mut a = d.attributes.to_vec();
            a.sort_unstable();
            a.dedup();
            assert_eq!(
                a.len(),
                d.attributes.len(),
                "{}: an attribute listed twice",
                d.name
            );
            assert!(Decl::of(d.name).is_some_and(|x| x.from == d.from));
        }
    }
}
