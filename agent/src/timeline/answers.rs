//! Answers (issue 37): when a served model's TTFT, TPOT, duration, errors
//! or tokens shift, say what moved them — and after every change, say what
//! it did.
//!
//! * `latency.shift`, `errors.shift`, `tokens.shift`: the shifts
//!   [`super::shifts`] finds, each with its evidence (before and after,
//!   the stage that moved, the callers and request types it is in) and
//!   its causes, ranked: `model` (a `model_version.*` event on that engine
//!   and model shortly before), `environment` (`engine.version.change`,
//!   `engine.config.change`, `engine.image.change`, an engine (re)start),
//!   `traffic` (the request rate up, a `caller.surge`/`caller.retry_storm`,
//!   input tokens per request up — naming the caller or request type that
//!   carries it —, or a shift in some callers' requests only), `resources`
//!   (`gpu.throttle.start`, `gpu.memory.high` on the engine's GPUs), else
//!   `unknown`.
//! * `change.impact`: after each change event (rollout, rollback, new
//!   version, engine version/config/image change, restart), once
//!   `impact_windows` windows were served after it, before and after of
//!   TTFT, TPOT, duration, error rate and tokens, with a verdict
//!   (`regressed`, `improved`, `no_change`).
//!
//! The detector runs last, so it has seen (`Detector::observe`) every
//! event the others made for the same input. Nothing reads the wall
//! clock.
//!
//! Owns: the change history (bounded: [`MAX_SEEN`] events, the lookback),
//! attribution, the impact reports. Must not: keep request text.

use std::collections::{BTreeSet, VecDeque};

use serde_json::{json, Map, Value};

use super::shifts::{Finding, Impact, Judged, Metric, Settings, Shifts, Side};
use super::{kind, round4, Config, Event};
use crate::{
    record::{rfc3339, Finished},
    stage::events::{Detector, RecordCx},
    vocab::Subject,
};

/// Events kept for attribution at most.
pub const MAX_SEEN: usize = 4096;
/// Changes waiting for their impact at most.
pub const MAX_PENDING: usize = 256;

/// What a cause category an event is evidence of.
fn category(kind: &str) -> Option<&'static str> {
    match kind {
        kind::MODEL_VERSION_NEW | kind::MODEL_VERSION_ROLLOUT | kind::MODEL_VERSION_ROLLBACK => {
            Some("model")
        }
        kind::ENGINE_VERSION_CHANGE
        | kind::ENGINE_CONFIG_CHANGE
        | kind::ENGINE_IMAGE_CHANGE
        | kind::ENGINE_START => Some("environment"),
        kind::CALLER_SURGE | kind::CALLER_RETRY_STORM => Some("traffic"),
        kind::GPU_THROTTLE_START | kind::GPU_MEMORY_HIGH => Some("resources"),
        _ => None,
    }
}

/// An event seen, as attribution needs it.
#[derive(Clone, Debug)]
struct Seen {
    kind: &'static str,
    ts_ns: u64,
    engine: Option<String>,
    model: Option<String>,
    pids: Vec<u32>,
    /// GPU events: the engines on the device ("vllm (pid 42)").
    engines: Vec<String>,
    subject: Option<(Subject, String)>,
}

impl Seen {
    fn of(e: &Event) -> Option<Seen> {
        category(e.kind)?;
        // An engine already running when the agent started did not
        // (re)start: no change.
        if e.kind == kind::ENGINE_START && e.attr("tokentap.already_running") == Some(&json!(true))
        {
            return None;
        }
        let s = |k: &str| e.attr(k).and_then(Value::as_str).map(str::to_string);
        let mut pids = Vec::new();
        for k in ["process.pid", "process.pid.previous"] {
            if let Some(p) = e.attr(k).and_then(Value::as_u64) {
                pids.push(p as u32);
            }
        }
        let engines = e
            .attr("engines")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        let subject = s("tokentap.tenant")
            .map(|t| (Subject::Tenant, t))
            .or_else(|| s("tokentap.caller").map(|c| (Subject::Caller, c)));
        Some(Seen {
            kind: e.kind,
            ts_ns: e.ts_ns,
            engine: s("gen_ai.provider.name"),
            model: s("gen_ai.request.model"),
            pids,
            engines,
            subject,
        })
    }

    /// Whether it concerns the group `engine`/`model` served by `pids`.
    fn concerns(&self, engine: &str, model: &str, pids: &BTreeSet<u32>) -> bool {
        if !self.engines.is_empty() {
            // "engine (pid N)": that pid, else that engine.
            return self.engines.iter().any(|x| {
                let (name, pid) = x.split_once(" (pid ").unwrap_or((x.as_str(), ""));
                let pid: Option<u32> = pid.trim_end_matches(')').parse().ok();
                pid.map_or(name == engine, |p| pids.contains(&p))
            });
        }
        if self.engine.as_deref().is_some_and(|e| e != engine) {
            return false;
        }
        if self.engine.is_none() && self.pids.is_empty() {
            return false;
        }
        self.model.as_deref().is_none_or(|m| m == model)
            || self.pids.iter().any(|p| pids.contains(p))
    }
}

/// One cause of a shift, ranked by `score` (3: direct evidence at the
/// shift's start; 2: evidence within the lookback; 1: the shape alone).
#[derive(Clone, Debug, PartialEq)]
pub struct Cause {
    pub cause: &'static str,
    pub score: u8,
    pub reason: String,
    pub event: Option<&'static str>,
    pub event_ts_ns: Option<u64>,
    /// The caller (tenant) or request type that carries traffic.
    pub subject: Option<(Subject, String)>,
    pub request_type: Option<String>,
}

/// The order causes of equal score are listed in.
const ORDER: [&str; 4] = ["model", "environment", "traffic", "resources"];

pub struct Answers {
    s: Settings,
    shifts: Shifts,
    lookback_ns: u64,
    impact_windows: usize,
    seen: VecDeque<Seen>,
    /// Changes waiting for their impact.
    pending: Vec<Seen>,
}

impl Answers {
    pub fn new(cfg: &Config) -> Self {
        let s = cfg.shift_settings();
        Answers {
            shifts: Shifts::new(s.clone()),
            lookback_ns: (cfg.shift_lookback_s * 1e9) as u64,
            impact_windows: cfg.impact_windows as usize,
            s,
            seen: VecDeque::new(),
            pending: Vec::new(),
        }
    }

    /// The causes of `f`, best first; `also`: the group's other findings
    /// of the same window (an input-token shift explains a latency one).
    pub fn causes(&self, f: &Finding, also: &[Finding]) -> Vec<Cause> {
        let pids: BTreeSet<u32> = f.pids.iter().copied().collect();
        let window_ns = (self.s.window_s * 1e9) as u64;
        // Evidence from the lookback before the shift, and never from
        // before the baseline began (a change the baseline already
        // reflects — the version first seen when the agent started — is
        // no cause).
        let from = f
            .since_ns
            .saturating_sub(self.lookback_ns)
            .max(f.baseline_from_ns.saturating_add(window_ns));
        let mut out: Vec<Cause> = Vec::new();
        for e in self.seen.iter().filter(|e| {
            e.ts_ns >= from && e.ts_ns <= f.at_ns && e.concerns(&f.engine, &f.model, &pids)
        }) {
            let Some(cat) = category(e.kind) else {
                continue;
            };
            let near = e.ts_ns + window_ns >= f.since_ns;
            let score = if near { 3 } else { 2 };
            let reason = match cat {
                "traffic" => format!(
                    "{} of {} at {}",
                    e.kind,
                    e.subject.as_ref().map_or("a caller", |s| s.1.as_str()),
                    rfc3339(e.ts_ns)
                ),
                _ => format!("{} at {}", e.kind, rfc3339(e.ts_ns)),
            };
            out.push(Cause {
                cause: cat,
                score,
                reason,
                event: Some(e.kind),
                event_ts_ns: Some(e.ts_ns),
                subject: e.subject.clone(),
                request_type: None,
            });
        }
        // Traffic the windows themselves show.
        let (rb, ra) = (f.before.rate_per_s(), f.after.rate_per_s());
        let rate_up = rb > 0.0 && ra >= rb * self.s.ratio;
        let who = f.subjects.grew.clone().filter(|g| g.2 - g.1 >= 0.1);
        if rate_up && f.judged != Judged::Metric(Metric::InputTokens) {
            out.push(Cause {
                cause: "traffic",
                score: if ra >= 2.0 * rb { 3 } else { 2 },
                reason: format!(
                    "request rate {:.2}/s → {:.2}/s{}",
                    rb,
                    ra,
                    who.as_ref().map_or(String::new(), |g| format!(
                        "; {} from {:.0} % to {:.0} % of the requests",
                        g.0,
                        g.1 * 100.0,
                        g.2 * 100.0
                    ))
                ),
                event: None,
                event_ts_ns: None,
                subject: who.as_ref().map(|g| subject_of(&f.subjects.tenants, &g.0)),
                request_type: None,
            });
        }
        // Longer prompts: an input-token shift up in the same group, or
        // one subject's prompts growing by the ratio.
        let input_shift = also.iter().any(|x| {
            x.judged == Judged::Metric(Metric::InputTokens)
                && x.direction > 0
                && x.since_ns <= f.at_ns
        });
        if let Some((k, b, a)) = f.subjects.input_grew.clone() {
            let grew = (a + 1.0) / (b + 1.0) >= self.s.ratio;
            let tokens = f.judged == Judged::Metric(Metric::InputTokens);
            if grew {
                let confined =
                    f.subjects.moved.first() == Some(&k) && !f.subjects.steady.is_empty();
                out.push(Cause {
                    cause: "traffic",
                    score: if confined || input_shift || tokens {
                        3
                    } else {
                        2
                    },
                    reason: format!(
                        "input tokens per request of {k} {b:.0} → {a:.0}{}",
                        if confined {
                            format!(
                                "; the shift is in its requests only ({} steady)",
                                f.subjects.steady.join(", ")
                            )
                        } else {
                            String::new()
                        }
                    ),
                    event: None,
                    event_ts_ns: None,
                    subject: Some(subject_of(&f.subjects.tenants, &k)),
                    request_type: None,
                });
            }
        }
        // A shift in some callers' (request types') requests only.
        for (spread, is_type) in [(&f.subjects, false), (&f.types, true)] {
            if !spread.moved.is_empty() && !spread.steady.is_empty() {
                let k = spread.moved[0].clone();
                if out
                    .iter()
                    .any(|c| c.subject.as_ref().is_some_and(|s| s.1 == k))
                {
                    continue;
                }
                out.push(Cause {
                    cause: "traffic",
                    score: 1,
                    reason: format!(
                        "only in the requests of {} (steady: {})",
                        spread.moved.join(", "),
                        spread.steady.join(", ")
                    ),
                    event: None,
                    event_ts_ns: None,
                    subject: (!is_type).then(|| subject_of(&spread.tenants, &k)),
                    request_type: is_type.then_some(k),
                });
            }
        }
        out.sort_by(|a, b| {
            b.score
                .cmp(&a.score)
                .then(rank(a.cause).cmp(&rank(b.cause)))
                .then(telling(b.event.unwrap_or("")).cmp(&telling(a.event.unwrap_or(""))))
                .then(b.event_ts_ns.cmp(&a.event_ts_ns))
        });
        // One line per cause and evidence.
        out.dedup_by(|a, b| a.cause == b.cause && a.event == b.event && a.subject == b.subject);
        out
    }

    fn shift_event(&self, f: &Finding, causes: &[Cause]) -> Event {
        let top = causes.first();
        let cause = top.map_or("unknown", |c| c.cause);
        let metric = match f.judged {
            Judged::Metric(m) => m.name(),
            Judged::Errors(_) => "error_rate",
        };
        let side = |x: &Side| -> Value {
            let mut m = Map::new();
            match f.judged {
                Judged::Metric(_) => {
                    m.insert("p50".into(), json!(round6(x.p50)));
                    m.insert("p95".into(), json!(round6(x.p95)));
                }
                Judged::Errors(_) => {
                    m.insert("rate".into(), json!(round4(x.p50)));
                }
            }
            m.insert("requests".into(), json!(x.requests));
            m.insert("rps".into(), json!(round4(x.rate_per_s())));
            Value::Object(m)
        };
        let stages: Map<String, Value> = f
            .stages
            .iter()
            .map(|s| {
                (
                    s.stage.name().to_string(),
                    json!({"before": round6(s.before), "after": round6(s.after), "share": round4(s.share)}),
                )
            })
            .collect();
        let traffic = causes.iter().find(|c| c.cause == "traffic");
        let named = traffic.and_then(|c| c.subject.clone());
        let request_type = traffic.and_then(|c| c.request_type.clone());
        let what = match f.judged {
            Judged::Metric(_) => format!(
                "{metric} p50 {} → {}, p95 {} → {}",
                show(f.before.p50, f.judged),
                show(f.after.p50, f.judged),
                show(f.before.p95, f.judged),
                show(f.after.p95, f.judged)
            ),
            Judged::Errors(c) => format!(
                "{} errors {:.1} % → {:.1} %",
                c.name(),
                f.before.p50 * 100.0,
                f.after.p50 * 100.0
            ),
        };
        let message = format!(
            "{}/{}: {what}{}; cause {cause}{}",
            f.engine,
            f.model,
            f.stage()
                .map_or(String::new(), |s| format!(", in {}", s.name())),
            top.map_or(String::new(), |c| format!(" ({})", c.reason))
        );
        let kind = f.judged.kind();
        let mut e = Event::new(f.at_ns, kind, message)
            .with("metric", metric)
            .with("gen_ai.provider.name", f.engine.as_str())
            .with("gen_ai.request.model", f.model.as_str())
            .with("tokentap.model.version", f.model_version.clone())
            .with("direction", if f.direction > 0 { "up" } else { "down" })
            .with("before", side(&f.before))
            .with("after", side(&f.after))
            .with("since", rfc3339(f.since_ns))
            .with("window_s", self.s.window_s)
            .with("cause", cause)
            .with(
                "causes",
                Value::Array(
                    causes
                        .iter()
                        .map(|c| json!({"cause": c.cause, "score": c.score, "reason": c.reason, "event": c.event}))
                        .collect(),
                ),
            )
            .with("cause_event", top.and_then(|c| c.event))
            .with("cause_event_ts", top.and_then(|c| c.event_ts_ns).map(rfc3339))
            .with("tokentap.request.type", request_type)
            .with(
                "moved",
                f.subjects.moved.iter().take(10).cloned().collect::<Vec<String>>(),
            )
            .with(
                "steady",
                f.subjects.steady.iter().take(10).cloned().collect::<Vec<String>>(),
            );
        if let Judged::Errors(c) = f.judged {
            e = e.with("error.class", c.name());
        }
        if matches!(f.judged, Judged::Metric(m) if m.is_latency()) {
            e = e
                .with("stage", f.stage().map(|s| s.name()))
                .with("stages", Value::Object(stages));
        }
        if let Some((subject, name)) = named.or_else(|| {
            // An errors or latency shift confined to one subject names it.
            (f.subjects.moved.len() == 1 && !f.subjects.steady.is_empty())
                .then(|| subject_of(&f.subjects.tenants, &f.subjects.moved[0]))
        }) {
            e = e.with(subject.attr(), name);
        }
        e
    }

    fn impact_event(&self, now_ns: u64, change: &Seen, i: &Impact) -> Event {
        let (verdict, worse, better) = i.verdict(&self.s);
        let side = |x: &super::shifts::Sides| -> Value {
            let mut m = Map::new();
            for (metric, (p50, p95)) in &x.metrics {
                m.insert(format!("{}_p50", metric.name()), json!(round6(*p50)));
                m.insert(format!("{}_p95", metric.name()), json!(round6(*p95)));
            }
            m.insert("error_rate".into(), json!(round4(x.error_rate)));
            m.insert("requests".into(), json!(x.requests));
            m.insert(
                "rps".into(),
                json!(round4(x.requests as f64 / x.seconds.max(1e-9))),
            );
            Value::Object(m)
        };
        let ttft = |x: &super::shifts::Sides| {
            x.metrics
                .get(&Metric::Ttft)
                .map_or("-".to_string(), |q| format!("{:.1} ms", q.0 * 1e3))
        };
        let message = format!(
            "{}/{}: after {} at {}: {verdict}{} (TTFT p50 {} → {}, errors {:.1} % → {:.1} %)",
            i.engine,
            i.model,
            change.kind,
            rfc3339(change.ts_ns),
            if worse.is_empty() && better.is_empty() {
                String::new()
            } else {
                format!(
                    " ({}{})",
                    if worse.is_empty() {
                        String::new()
                    } else {
                        format!("worse: {}", worse.join(", "))
                    },
                    if better.is_empty() {
                        String::new()
                    } else {
                        format!(
                            "{}better: {}",
                            if worse.is_empty() { "" } else { "; " },
                            better.join(", ")
                        )
                    }
                )
            },
            ttft(&i.before),
            ttft(&i.after),
            i.before.error_rate * 100.0,
            i.after.error_rate * 100.0,
        );
        Event::new(now_ns, kind::CHANGE_IMPACT, message)
            .with("gen_ai.provider.name", i.engine.as_str())
            .with("gen_ai.request.model", i.model.as_str())
            .with("tokentap.model.version", i.model_version.clone())
            .with("change", change.kind)
            .with("change_ts", rfc3339(change.ts_ns))
            .with("verdict", verdict)
            .with("regressed", worse)
            .with("improved", better)
            .with("before", side(&i.before))
            .with("after", side(&i.after))
            .with("window_s", self.s.window_s)
    }
}

/// How much a change kind says (the one named when several events are
/// one change: a version first seen that replaces the old one is its
/// rollout; a restart that changed the configuration is that change).
fn telling(k: &str) -> u8 {
    match k {
        kind::MODEL_VERSION_ROLLBACK => 5,
        kind::MODEL_VERSION_ROLLOUT => 4,
        kind::ENGINE_VERSION_CHANGE | kind::ENGINE_CONFIG_CHANGE | kind::ENGINE_IMAGE_CHANGE => 3,
        kind::MODEL_VERSION_NEW => 2,
        _ => 1,
    }
}

fn rank(cause: &str) -> usize {
    ORDER
        .iter()
        .position(|c| *c == cause)
        .unwrap_or(ORDER.len())
}

fn subject_of(tenants: &BTreeSet<String>, k: &str) -> (Subject, String) {
    if tenants.contains(k) {
        (Subject::Tenant, k.to_string())
    } else {
        (Subject::Caller, k.to_string())
    }
}

fn round6(x: f64) -> f64 {
    (x * 1e6).round() / 1e6
}

fn show(x: f64, j: Judged) -> String {
    match j {
        Judged::Metric(m) if m.is_latency() => format!("{:.1} ms", x * 1e3),
        _ => format!("{x:.0}"),
    }
}

impl Detector for Answers {
    fn kinds(&self) -> &'static [&'static str] {
        &[
            kind::LATENCY_SHIFT,
            kind::ERRORS_SHIFT,
            kind::TOKENS_SHIFT,
            kind::CHANGE_IMPACT,
        ]
    }

    fn observe(&mut self, e: &Event) {
        let Some(seen) = Seen::of(e) else { return };
        if matches!(category(e.kind), Some("model" | "environment")) {
            // One change, one impact: a restart's engine.start and the
            // config change it brought are the same change (the more
            // telling kind named, the earliest time kept).
            let window_ns = (self.s.window_s * 1e9) as u64;
            let same = self.pending.iter().position(|p| {
                p.engine == seen.engine
                    && p.ts_ns.abs_diff(seen.ts_ns) <= window_ns
                    && (p.model == seen.model || p.pids.iter().any(|x| seen.pids.contains(x)))
            });
            match same {
                Some(i) => {
                    let p = &mut self.pending[i];
                    if telling(seen.kind) > telling(p.kind) {
                        p.kind = seen.kind;
                    }
                    p.ts_ns = p.ts_ns.min(seen.ts_ns);
                    p.pids.extend(seen.pids.iter().copied());
                }
                None if self.pending.len() < MAX_PENDING => self.pending.push(seen.clone()),
                None => {}
            }
        }
        self.seen.push_back(seen);
        while self.seen.len() > MAX_SEEN {
            self.seen.pop_front();
        }
    }

    fn record(&mut self, f: &Finished, cx: &RecordCx<'_>, out: &mut Vec<Event>) {
        let subject = cx.subject.map(|(s, n)| (n, s == Subject::Tenant));
        let o = super::shifts::Obs::of(&f.record, cx.end_ns, subject);
        let mut found = Vec::new();
        self.shifts.record(&o, &mut found);
        self.report(found, cx.end_ns, out);
    }

    fn clock(&mut self, now_ns: u64, _in_flight: Option<usize>, out: &mut Vec<Event>) {
        let mut found = Vec::new();
        self.shifts.clock(now_ns, &mut found);
        self.report(found, now_ns, out);
    }

    fn finish(&mut self, out: &mut Vec<Event>) {
        // Windows still open are not judged: a window cut short by the
        // end of input is not a window.
        let _ = out;
    }
}

impl Answers {
    fn report(&mut self, found: Vec<Finding>, now_ns: u64, out: &mut Vec<Event>) {
        for f in &found {
            let also: Vec<Finding> = found
                .iter()
                .filter(|x| x.engine == f.engine && x.model == f.model && *x != f)
                .cloned()
                .collect();
            let causes = self.causes(f, &also);
            out.push(self.shift_event(f, &causes));
        }
        // Changes whose after-windows are in.
        let keep_ns = self.lookback_ns.max((3600.0 * 1e9) as u64);
        let mut still = Vec::new();
        for change in std::mem::take(&mut self.pending) {
            let impacts = self
                .shifts
                .impact(change.ts_ns, self.impact_windows, |e, m, pids| {
                    change.concerns(e, m, pids)
                });
            if !impacts.is_empty() {
                for i in &impacts {
                    out.push(self.impact_event(now_ns, &change, i));
                }
            } else if now_ns.saturating_sub(change.ts_ns) < keep_ns {
                still.push(change);
            }
        }
        self.pending = still;
        let oldest = now_ns.saturating_sub(self.lookback_ns.saturating_mul(2));
        while self.seen.front().is_some_and(|e| e.ts_ns < oldest) {
            self.seen.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::RequestRecord;
    use crate::stage::gpu::{DeviceSample, GpuProcess, GpuSample};
    use crate::stage::{NodeState, ProcessInfo};
    use crate::timeline::Timeline;

    const T0: u64 = 1_800_000_000_000_000_000;
    const S: u64 = 1_000_000_000;

    /// A served request ending `t_s` after T0.
    fn rec(t_s: f64, tenant: &str, version: &str, pid: u32, prefill: f64) -> Finished {
        let ttft = 0.002 + prefill;
        Finished {
            record: RequestRecord {
                tenant: Some(tenant.into()),
                model_version: Some(version.into()),
                request_type: Some("chat".into()),
                response_model: Some("llama".into()),
                provider: Some("vllm".into()),
                pid,
                status: Some(200),
                stream: true,
                ttft_s: Some(ttft),
                tpot_s: Some(0.01),
                queue_s: Some(0.002),
                prefill_s: Some(prefill),
                decode_s: Some(0.5),
                duration_s: Some(ttft + 0.5),
                input_tokens: Some(300),
                output_tokens: Some(50),
                t0_ns: T0 + (t_s * 1e9) as u64 - ((ttft + 0.5) * 1e9) as u64,
                ..Default::default()
            },
            seq: 0,
            content_events: 0,
            self_request: false,
            chunk_gaps_s: vec![],
            prompt_fp: None,
            text: None,
        }
    }

    /// Deterministic jitter of a few ms.
    fn jitter(i: u64) -> f64 {
        ((i * 7919) % 17) as f64 / 1000.0
    }

    /// Feeds `secs` seconds of 2 requests a second (tenants a and b),
    /// shaped by `at(t)` → (version, pid, prefill), with a tick a second
    /// and GPU samples from `gpu(t)`.
    fn day(
        secs: u64,
        node: &NodeState,
        at: impl Fn(u64) -> (&'static str, u32, f64),
        gpu: impl Fn(u64) -> Option<GpuSample>,
    ) -> Vec<Event> {
        let mut tl = Timeline::new(Config::default());
        let mut out = Vec::new();
        for t in 0..secs {
            tl.on_tick(T0 + t * S, node, 1, &mut out);
            if let Some(g) = gpu(t) {
                tl.on_gpu_sample(&g, node, &mut out);
            }
            let (v, pid, prefill) = at(t);
            for (k, tenant) in ["a", "b"].iter().enumerate() {
                let i = t * 2 + k as u64;
                tl.on_record(
                    &rec(
                        t as f64 + 0.3 + k as f64 * 0.4,
                        tenant,
                        v,
                        pid,
                        prefill + jitter(i),
                    ),
                    &mut out,
                );
            }
        }
        tl.finish(&mut out);
        out
    }

    fn of<'a>(ev: &'a [Event], k: &str) -> Vec<&'a Event> {
        ev.iter().filter(|e| e.kind == k).collect()
    }

    /// A new version launched that is slower, then rolled back: each
    /// change has its impact, the shifts are the model's.
    #[test]
    fn a_rollout_and_its_rollback_are_each_a_change_with_its_impact() {
        let node = NodeState::default();
        let ev = day(
            3600,
            &node,
            |t| match t {
                ..1200 => ("v1", 100, 0.05),
                1200..2400 => ("v2", 101, 0.15),
                _ => ("v1", 102, 0.05),
            },
            |_| None,
        );
        let rollout = of(&ev, kind::MODEL_VERSION_ROLLOUT);
        let rollback = of(&ev, kind::MODEL_VERSION_ROLLBACK);
        assert_eq!((rollout.len(), rollback.len()), (1, 1), "{ev:#?}");
        let impact = of(&ev, kind::CHANGE_IMPACT);
        assert_eq!(impact.len(), 2, "{impact:#?}");
        assert_eq!(
            impact[0].attr("change").unwrap(),
            kind::MODEL_VERSION_ROLLOUT
        );
        assert_eq!(
            impact[0].attr("verdict").unwrap(),
            "regressed",
            "{:#?}",
            impact[0]
        );
        assert_eq!(impact[0].attr("regressed").unwrap(), &json!(["ttft"]));
        assert_eq!(impact[0].attr("tokentap.model.version").unwrap(), "v2");
        assert_eq!(
            impact[1].attr("change").unwrap(),
            kind::MODEL_VERSION_ROLLBACK
        );
        assert_eq!(
            impact[1].attr("verdict").unwrap(),
            "improved",
            "{:#?}",
            impact[1]
        );
        let before = impact[0].attr("before").unwrap()["ttft_p50"]
            .as_f64()
            .unwrap();
        let after = impact[0].attr("after").unwrap()["ttft_p50"]
            .as_f64()
            .unwrap();
        assert!(before < 0.07 && after > 0.15, "{:#?}", impact[0]);
        // The TTFT shifted up with v2 and down with the rollback, each
        // linked to its change, in the prefill.
        let shifts = of(&ev, kind::LATENCY_SHIFT);
        let dirs: Vec<(&str, &str, &str)> = shifts
            .iter()
            .map(|e| {
                (
                    e.attr("direction").unwrap().as_str().unwrap(),
                    e.attr("cause").unwrap().as_str().unwrap(),
                    e.attr("cause_event").unwrap().as_str().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            dirs,
            [
                ("up", "model", kind::MODEL_VERSION_ROLLOUT),
                ("down", "model", kind::MODEL_VERSION_ROLLBACK)
            ],
            "{shifts:#?}"
        );
        assert_eq!(shifts[0].attr("stage").unwrap(), "prefill");
        assert_eq!(shifts[0].attr("metric").unwrap(), "ttft");
        // No other shift: errors and tokens did not move.
        assert!(of(&ev, kind::ERRORS_SHIFT).is_empty());
        assert!(of(&ev, kind::TOKENS_SHIFT).is_empty());
    }

    /// The GPU throttles and the TTFT rises with nothing else changed:
    /// the cause is the resources.
    #[test]
    fn a_throttled_gpu_is_the_cause_of_the_shift_it_brings() {
        let mut node = NodeState::default();
        node.processes.insert(
            100,
            ProcessInfo {
                engine: Some(crate::engines::Engine::Vllm),
                ..Default::default()
            },
        );
        let throttled = |t: u64| t >= 1195;
        let ev = day(
            1800,
            &node,
            |t| ("v1", 100, if t >= 1200 { 0.2 } else { 0.05 }),
            |t| {
                Some(GpuSample {
                    ts_ns: T0 + t * S,
                    devices: vec![DeviceSample {
                        index: 0,
                        uuid: "GPU-0".into(),
                        name: "H200".into(),
                        throttle_reasons: Some(if throttled(t) {
                            vec!["hw_thermal_slowdown".into()]
                        } else {
                            vec![]
                        }),
                        processes: vec![GpuProcess {
                            pid: 100,
                            used_bytes: None,
                            sm_util: None,
                        }],
                        ..Default::default()
                    }],
                })
            },
        );
        assert_eq!(of(&ev, kind::GPU_THROTTLE_START).len(), 1, "{ev:#?}");
        let shifts = of(&ev, kind::LATENCY_SHIFT);
        assert_eq!(shifts.len(), 1, "{shifts:#?}");
        assert_eq!(
            shifts[0].attr("cause").unwrap(),
            "resources",
            "{:#?}",
            shifts[0]
        );
        assert_eq!(
            shifts[0].attr("cause_event").unwrap(),
            kind::GPU_THROTTLE_START
        );
        // No change was made: no impact report.
        assert!(of(&ev, kind::CHANGE_IMPACT).is_empty());
    }

    /// A steady day: nothing shifts, nothing changes.
    #[test]
    fn a_steady_day_says_nothing() {
        let node = NodeState::default();
        let ev = day(3600, &node, |_| ("v1", 100, 0.05), |_| None);
        let said: Vec<&Event> = ev
            .iter()
            .filter(|e| e.kind != kind::MODEL_VERSION_NEW && e.kind != kind::CALLER_NEW)
            .collect();
        assert!(said.is_empty(), "{said:#?}");
    }
}
