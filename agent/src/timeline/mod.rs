//! Timeline events: what changed on this node, when, and who caused it —
//! the evidence layer on top of the request records. Engines starting and
//! stopping, model versions appearing, replacing and coming back, callers
//! that are new, surging, failing or retrying, token distributions that
//! drift, GPUs that throttle or fill up.
//!
//! ```text
//!  records ─▶ models ─┐
//!          ─▶ callers ┼─▶ Event ─▶ Sinks (events log, OTLP logs and the
//!          ─▶ drift  ─┤              tokentap.events counter, console)
//!  NodeState ▶ engines┤
//!  GPU samples ▶ gpu ─┘
//! ```
//!
//! Every event is `{ts, kind, message, attributes}`; `kind` names are a
//! contract (docs/metrics.md, "Timeline events"); attribute keys are the
//! metric attribute names, so an event lines up with the series it explains.
//!
//! Time: the detectors run on the records' own clock (a request's end) and,
//! live, on the pipeline's ticks; nothing reads the wall clock, so a replay
//! or a unit test with a simulated clock gives the same events.
//!
//! Owns: the detectors and their state (bounded: `max_callers` keys).
//! Must not: keep prompt or completion text (a request body is only ever a
//! keyed hash, `Finished::prompt_fp`), or block the pipeline.

pub mod answers;
pub mod callers;
pub mod config;
pub mod drift;
pub mod engines;
pub mod gpu;
pub mod shifts;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashSet};

use serde_json::{Map, Value};

pub use self::config::Config;
use crate::{
    record::Finished,
    stage::events::{Detector, RecordCx},
    stage::gpu::GpuSample,
    stage::NodeState,
    vocab::Subject,
};

pub use crate::stage::events::{kind, Attr, Event};

/// Rounds for display in attributes (4 significant decimals is plenty for
/// rates and seconds).
pub(crate) fn round4(x: f64) -> f64 {
    (x * 10_000.0).round() / 10_000.0
}

/// The events' ceiling: at most `max` per minute of their own clock; the
/// rest is folded, and said in one `events.folded` event (by kind) when a
/// later event or tick passes the minute.
struct Ceiling {
    max: u32,
    /// The minute being counted (ts / 60 s) and its events so far.
    minute: u64,
    n: u32,
    /// Folded in that minute, by kind.
    folded: BTreeMap<&'static str, u64>,
    /// Folded since the start.
    total_folded: u64,
}

const MINUTE_NS: u64 = 60_000_000_000;

impl Ceiling {
    /// Applies the ceiling to `out[start..]` (the events just made), in
    /// place; `now_ns` closes past minutes.
    fn apply(&mut self, out: &mut Vec<Event>, start: usize, now_ns: u64) {
        let new: Vec<Event> = out.drain(start..).collect();
        for e in new {
            self.roll(e.ts_ns / MINUTE_NS, out);
            if self.n < self.max {
                self.n += 1;
                out.push(e);
            } else {
                *self.folded.entry(e.kind).or_default() += 1;
                self.total_folded += 1;
            }
        }
        self.roll(now_ns / MINUTE_NS, out);
    }

    /// Moves to `minute` (never back), saying what the minute before folded.
    fn roll(&mut self, minute: u64, out: &mut Vec<Event>) {
        if minute <= self.minute {
            return;
        }
        if !self.folded.is_empty() {
            let folded = std::mem::take(&mut self.folded);
            let total: u64 = folded.values().sum();
            let by_kind: Map<String, Value> = folded
                .iter()
                .map(|(k, n)| (k.to_string(), Value::from(*n)))
                .collect();
            out.push(
                Event::new(
                    (self.minute + 1) * MINUTE_NS,
                    kind::EVENTS_FOLDED,
                    format!(
                        "{total} events over the ceiling of {} per minute folded: {}",
                        self.max,
                        folded
                            .iter()
                            .map(|(k, n)| format!("{k} ×{n}"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                )
                .with("folded", total)
                .with("folded_by_kind", Value::Object(by_kind))
                .with("max_events_per_minute", self.max),
            );
        }
        self.minute = minute;
        self.n = 0;
    }
}

/// The tenants, and the callers, with events of their own: the first
/// `named_callers` of each seen (the values the metrics carry by name).
/// Only they are judged one by one (surges, bursts, storms, drift); the
/// rest are summed up (`caller.new` summaries).
struct Naming {
    max: usize,
    tenants: HashSet<String>,
    callers: HashSet<String>,
}

impl Naming {
    /// Whether `name` is named: already, or now, while there is room.
    fn admit(&mut self, subject: Subject, name: &str) -> bool {
        let set = match subject {
            Subject::Tenant => &mut self.tenants,
            Subject::Caller => &mut self.callers,
        };
        if set.contains(name) {
            return true;
        }
        if set.len() < self.max {
            set.insert(name.to_string());
            return true;
        }
        false
    }
}

/// The detectors, in the order they see each input (and so the order of
/// their events from one input). Adding a detector: its file, and its line
/// here.
fn detectors(cfg: &Config) -> Vec<Box<dyn Detector>> {
    vec![
        Box::new(engines::Models::new(cfg)),
        Box::new(engines::Engines::default()),
        Box::new(callers::Callers::new(cfg)),
        Box::new(drift::Drift::new(cfg)),
        Box::new(gpu::Gpus::new(cfg)),
        // Last: it observes what the others made for the same input.
        Box::new(answers::Answers::new(cfg)),
    ]
}

/// All detectors, fed by the pipeline.
pub struct Timeline {
    detectors: Vec<Box<dyn Detector>>,
    naming: Naming,
    /// The detectors' clock: the latest time seen (record end or tick).
    now_ns: u64,
    ceiling: Ceiling,
}

impl Timeline {
    pub fn new(cfg: Config) -> Self {
        Self {
            detectors: detectors(&cfg),
            naming: Naming {
                max: cfg.named_callers,
                tenants: HashSet::new(),
                callers: HashSet::new(),
            },
            now_ns: 0,
            ceiling: Ceiling {
                max: cfg.max_events_per_minute,
                minute: 0,
                n: 0,
                folded: BTreeMap::new(),
                total_folded: 0,
            },
        }
    }

    /// Events folded by the ceiling since the start.
    pub fn folded(&self) -> u64 {
        self.ceiling.total_folded
    }

    /// A finished, enriched request.
    pub fn on_record(&mut self, f: &Finished, out: &mut Vec<Event>) {
        // A gateway's request is the engine's, seen one hop earlier: the
        // events count it once, at the engine.
        if f.role == Some(crate::vocab::ServingRole::Gateway) {
            return;
        }
        let start = out.len();
        let end = f.t0_ns + (f.duration_s.unwrap_or(0.0) * 1e9) as u64;
        self.advance(end, None, out);
        let subject = Subject::of(f.tenant.as_deref(), f.caller.as_deref());
        let cx = RecordCx {
            end_ns: end,
            subject,
            named: subject.is_some_and(|(s, n)| self.naming.admit(s, n)),
        };
        self.each(out, |d, out| d.record(f, &cx, out));
        self.ceiling.apply(out, start, self.now_ns);
    }

    /// A pipeline tick (live runs only): engines that started or stopped,
    /// windows that closed. `in_flight`: requests in flight now.
    pub fn on_tick(
        &mut self,
        now_ns: u64,
        node: &NodeState,
        in_flight: usize,
        out: &mut Vec<Event>,
    ) {
        let start = out.len();
        let t = now_ns.max(self.now_ns);
        self.each(out, |d, out| d.tick(t, node, out));
        self.advance(now_ns, Some(in_flight), out);
        self.ceiling.apply(out, start, self.now_ns);
    }

    /// A GPU sample (`node` names the engines on each device).
    pub fn on_gpu_sample(&mut self, s: &GpuSample, node: &NodeState, out: &mut Vec<Event>) {
        let start = out.len();
        self.each(out, |d, out| d.gpu_sample(s, node, out));
        self.ceiling.apply(out, start, self.now_ns);
    }

    /// End of input: windows still open are judged, and what the last
    /// minute folded is said.
    pub fn finish(&mut self, out: &mut Vec<Event>) {
        let start = out.len();
        self.each(out, |d, out| d.finish(out));
        self.ceiling.apply(out, start, self.now_ns);
        self.ceiling.roll(u64::MAX, out);
    }

    /// The clock moves to `t` (never back).
    fn advance(&mut self, t: u64, in_flight: Option<usize>, out: &mut Vec<Event>) {
        if t > self.now_ns {
            self.now_ns = t;
        }
        let now = self.now_ns;
        self.each(out, |d, out| d.clock(now, in_flight, out));
    }

    /// Runs `call` on every detector in order, each one's events checked
    /// against its declaration (debug builds). The caller applies the
    /// ceiling once to all the events of one input.
    fn each(
        &mut self,
        out: &mut Vec<Event>,
        mut call: impl FnMut(&mut dyn Detector, &mut Vec<Event>),
    ) {
        for i in 0..self.detectors.len() {
            let from = out.len();
            call(self.detectors[i].as_mut(), out);
            if cfg!(debug_assertions) {
                for e in &out[from..] {
                    check_declared(e, self.detectors[i].kinds());
                }
            }
            for (j, d) in self.detectors.iter_mut().enumerate() {
                if j != i {
                    for e in &out[from..] {
                        d.observe(e);
                    }
                }
            }
        }
    }
}

/// Panics when a detector emits a kind it did not declare in
/// [`Detector::kinds`] (whether the kind and its attributes are declared is
/// checked as the event is made: `Event::new`, `Event::with`).
fn check_declared(e: &Event, kinds: &[&str]) {
    assert!(
        kinds.contains(&e.kind),
        "a detector emitted {} without declaring it in kinds()",
        e.kind
    );
}
