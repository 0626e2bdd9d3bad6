//! Abnormal callers: per tenant (else caller — the peer, or its pod), in
//! fixed windows of `window_s`:
//!
//! - `caller.new`: the first request of a tenant or caller — for the named
//!   ones (the first `named_callers` tenants, and callers, seen: the values
//!   the metrics carry by name under `--max-tenants`); callers beyond them
//!   are summed up in one `caller.new` per window (how many, the busiest
//!   few) and are not judged for what follows, so that thousands of end
//!   users make a handful of events, not thousands;
//! - `caller.surge`: a window with ≥ `surge_factor` × the caller's own
//!   baseline (an exponential moving average of its requests per window,
//!   idle windows included, judged after `warmup_windows`) and
//!   ≥ `surge_min_requests`;
//! - `caller.error_burst`: ≥ `error_burst_min` errors of one kind making up
//!   ≥ `error_burst_fraction` of the caller's requests in a window; kinds
//!   `http_429` (rate limited), `http_401_403` (permission), `http_5xx`,
//!   `client_disconnect` (the client gave up: disconnects and timeouts);
//! - `caller.retry_storm`: ≥ `retry_storm_min` repeated requests (a body
//!   already sent in the same window, by its keyed fingerprint), making up
//!   ≥ `retry_storm_fraction` of the window's requests, in a window that
//!   follows errors or disconnects (in it or in the one before).
//!
//! Each fires once per episode and is re-armed when the window falls
//! below half its bound (70 % of it for a surge). Every event carries the
//! evidence (counts, rates, window, baseline) and the concurrent state:
//! the caller's mean concurrency and TTFT p95 in the window, the node's
//! requests in flight, and the mean GPU utilisation of its requests.

use std::collections::{BTreeMap, HashMap};

use super::{kind, round4, Config, Event};
use crate::{
    record::Finished,
    stage::events::{Detector, RecordCx},
    vocab::{ErrorType, Subject},
};

/// Error kinds a burst is judged on (`error.type` of the event), in the
/// order of [`error_kind`]'s indices.
pub const ERROR_KINDS: [&str; 4] = ["http_429", "http_401_403", "http_5xx", "client_disconnect"];

/// The kind of a failed request (its index in [`ERROR_KINDS`]), when it is
/// one bursts are judged on.
pub fn error_kind(f: &Finished) -> Option<usize> {
    if f.error_type == Some(ErrorType::ClientDisconnect) {
        return Some(3);
    }
    match f.status? {
        429 => Some(0),
        401 | 403 => Some(1),
        s if s >= 500 => Some(2),
        _ => None,
    }
}

/// One caller's requests in one window.
#[derive(Default)]
struct WindowStats {
    requests: u32,
    errors: [u32; 4],
    /// Failed requests of other kinds (other 4xx, stream errors, …).
    other_errors: u32,
    ttfts: Vec<f64>,
    /// Sum of the requests' durations (mean concurrency × window).
    busy_s: f64,
    gpu_sum: f64,
    gpu_n: u32,
    /// Requests per body fingerprint.
    fps: HashMap<u64, u32>,
    /// Requests whose body was already sent in this window.
    repeats: u32,
}

impl WindowStats {
    fn errors_total(&self) -> u32 {
        self.errors.iter().sum::<u32>() + self.other_errors
    }
}

/// What a caller's events say about where its traffic goes (the latest
/// request's).
#[derive(Clone, Default)]
struct Context {
    provider: Option<String>,
    model: Option<String>,
    model_version: Option<String>,
    pid: u32,
}

struct CallerState {
    subject: Subject,
    name: String,
    first_window: u64,
    last_active_window: u64,
    /// Windows judged so far (idle ones included).
    windows: u32,
    /// Requests per window, moving average.
    baseline: f64,
    /// TTFT p95 of its unsurged windows, moving average.
    baseline_ttft_p95: Option<f64>,
    surging: bool,
    bursting: [bool; 4],
    storming: bool,
    /// Errors in the window before.
    prev_errors: u32,
    ctx: Context,
}

pub struct Callers {
    cfg: Config,
    window_ns: u64,
    grace_ns: u64,
    /// After this many idle windows (a day's worth) a caller is forgotten.
    evict_windows: u64,
    callers: HashMap<String, CallerState>,
    /// Open windows by index (time / window).
    open: BTreeMap<u64, HashMap<String, WindowStats>>,
    /// Windows before this index are closed (None: nothing seen yet).
    next_to_close: Option<u64>,
    /// Callers not tracked (over `max_callers`).
    pub untracked: u64,
    /// Callers beyond the named ones: the window each was first seen in
    /// (by a hash of its key; at most `max_callers`, forgotten like the
    /// named ones after a day idle).
    unnamed_first: HashMap<u64, (u64, u64)>,
    /// Per open window, the callers beyond the named ones first seen in
    /// it, with their requests in it (the summary `caller.new`).
    new_unnamed: BTreeMap<u64, HashMap<String, u32>>,
    /// The node's requests in flight at the latest tick.
    in_flight: usize,
}

/// The p95 of `v` (sorted in place), nearest rank.
pub(crate) fn p95(v: &mut [f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let rank = ((v.len() as f64) * 0.95).ceil() as usize;
    Some(v[rank.clamp(1, v.len()) - 1])
}

impl Callers {
    pub fn new(cfg: &Config) -> Self {
        let window_ns = cfg.window_ns().max(1);
        Self {
            cfg: cfg.clone(),
            window_ns,
            grace_ns: (cfg.grace_s * 1e9) as u64,
            evict_windows: (86_400_000_000_000 / window_ns).max(10),
            callers: HashMap::new(),
            open: BTreeMap::new(),
            next_to_close: None,
            untracked: 0,
            unnamed_first: HashMap::new(),
            new_unnamed: BTreeMap::new(),
            in_flight: 0,
        }
    }

    /// A request of a caller beyond the named ones: counted for its
    /// window's summary when the caller is new in that window.
    fn unnamed(&mut self, key: &str, subject: Subject, name: &str, idx: u64) {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        key.hash(&mut h);
        let h = h.finish();
        let room = self.unnamed_first.len() < self.cfg.max_callers;
        let first = match self.unnamed_first.get_mut(&h) {
            Some((first, last)) => {
                *last = idx;
                *first
            }
            None if room => {
                self.unnamed_first.insert(h, (idx, idx));
                idx
            }
            None => {
                if self.untracked == 0 {
                    eprintln!(
                        "tokentap: events: more than {} callers beyond the named ones remembered; later ones are not counted as new (raise [events] max_callers)",
                        self.cfg.max_callers
                    );
                }
                self.untracked += 1;
                return;
            }
        };
        if first == idx {
            *self
                .new_unnamed
                .entry(idx)
                .or_default()
                .entry(subject.who(name))
                .or_default() += 1;
        }
    }

    fn on_record(&mut self, f: &Finished, cx: &RecordCx<'_>, out: &mut Vec<Event>) {
        let Some((subject, name)) = cx.subject else {
            return;
        };
        let key = format!("{}={name}", subject.attr());
        let mut idx = cx.end_ns / self.window_ns;
        match self.next_to_close {
            // A record for a window already judged counts in the oldest
            // open one.
            Some(n) => idx = idx.max(n),
            None => self.next_to_close = Some(idx),
        }
        if !cx.named {
            self.unnamed(&key, subject, name, idx);
            return;
        }
        let ctx = Context {
            provider: f.provider.clone(),
            model: f.response_model.clone().or_else(|| f.request_model.clone()),
            model_version: f.model_version.clone(),
            pid: f.pid,
        };
        match self.callers.get_mut(&key) {
            Some(c) => {
                c.last_active_window = idx;
                c.ctx = ctx;
            }
            None => {
                if self.callers.len() >= self.cfg.max_callers {
                    if self.untracked == 0 {
                        eprintln!(
                            "tokentap: events: more than {} tenants/callers active; later ones are not judged for surges, error bursts or retry storms (raise [events] max_callers)",
                            self.cfg.max_callers
                        );
                    }
                    self.untracked += 1;
                    return;
                }
                out.push(
                    Event::new(
                        f.t0_ns,
                        kind::CALLER_NEW,
                        format!(
                            "{}: first request, to {}",
                            subject.who(name),
                            ctx.model.as_deref().unwrap_or("an unnamed model")
                        ),
                    )
                    .with(subject.attr(), name)
                    .with("gen_ai.provider.name", ctx.provider.clone())
                    .with("gen_ai.request.model", ctx.model.clone())
                    .with("tokentap.model.version", ctx.model_version.clone())
                    .with("tokentap.request.type", f.request_type.clone())
                    .with("process.pid", f.pid),
                );
                self.callers.insert(
                    key.clone(),
                    CallerState {
                        subject,
                        name: name.to_string(),
                        first_window: idx,
                        last_active_window: idx,
                        windows: 0,
                        baseline: 0.0,
                        baseline_ttft_p95: None,
                        surging: false,
                        bursting: [false; 4],
                        storming: false,
                        prev_errors: 0,
                        ctx,
                    },
                );
            }
        }
        let w = self.open.entry(idx).or_default().entry(key).or_default();
        w.requests += 1;
        match error_kind(f) {
            Some(k) => w.errors[k] += 1,
            None if f.error_type.is_some() => w.other_errors += 1,
            None => {}
        }
        if let Some(t) = f.ttft_s {
            w.ttfts.push(t);
        }
        w.busy_s += f.duration_s.unwrap_or(0.0);
        if let Some(g) = f.gpu_util_avg {
            w.gpu_sum += g;
            w.gpu_n += 1;
        }
        if let Some(fp) = f.prompt_fp {
            let n = w.fps.entry(fp).or_insert(0);
            *n += 1;
            if *n >= 2 {
                w.repeats += 1;
            }
        }
    }

    /// Closes the windows that ended at least `grace_s` before `now_ns`.
    fn advance(&mut self, now_ns: u64, in_flight: Option<usize>, out: &mut Vec<Event>) {
        if let Some(n) = in_flight {
            self.in_flight = n;
        }
        let Some(mut next) = self.next_to_close else {
            return;
        };
        let closable = now_ns.saturating_sub(self.grace_ns) / self.window_ns;
        // After a long silence, only the last windows matter (each idle
        // window decays the baselines; a thousand of them leave nothing).
        if closable.saturating_sub(next) > 1000
            && self.open.range(..closable - 1000).next().is_none()
            && self.new_unnamed.range(..closable - 1000).next().is_none()
        {
            for c in self.callers.values_mut() {
                c.baseline = 0.0;
                c.surging = false;
            }
            next = closable - 1000;
        }
        while next < closable {
            self.close(next, out);
            next += 1;
        }
        self.next_to_close = Some(next);
    }

    /// Judges every window still open (end of input).
    fn close_all(&mut self, out: &mut Vec<Event>) {
        let Some(mut next) = self.next_to_close else {
            return;
        };
        let last = self
            .open
            .keys()
            .next_back()
            .copied()
            .max(self.new_unnamed.keys().next_back().copied())
            .unwrap_or(next);
        while next <= last {
            self.close(next, out);
            next += 1;
        }
        self.next_to_close = Some(next);
    }

    fn close(&mut self, idx: u64, out: &mut Vec<Event>) {
        let mut stats = self.open.remove(&idx).unwrap_or_default();
        let ts = (idx + 1) * self.window_ns;
        for (key, c) in self.callers.iter_mut() {
            if idx < c.first_window {
                continue;
            }
            let mut w = stats.remove(key).unwrap_or_default();
            let ttft_p95 = p95(&mut w.ttfts);
            let j = Judged {
                cfg: &self.cfg,
                ts,
                n: w.requests,
                ttft_p95,
                gpu: (w.gpu_n > 0).then(|| round4(w.gpu_sum / w.gpu_n as f64)),
                in_flight: self.in_flight,
                w,
            };
            j.surge(c, out);
            j.error_bursts(c, out);
            j.retry_storm(c, out);
            j.learn(c);
        }
        if let Some(m) = self.new_unnamed.remove(&idx) {
            out.push(unnamed_summary(ts, m, &self.cfg));
        }
        let evict = self.evict_windows;
        self.callers
            .retain(|_, c| c.last_active_window + evict >= idx);
        self.unnamed_first
            .retain(|_, (_, last)| *last + evict >= idx);
    }
}

impl Detector for Callers {
    fn kinds(&self) -> &'static [&'static str] {
        &[
            kind::CALLER_NEW,
            kind::CALLER_SURGE,
            kind::CALLER_ERROR_BURST,
            kind::CALLER_RETRY_STORM,
        ]
    }

    fn record(&mut self, f: &Finished, cx: &RecordCx<'_>, out: &mut Vec<Event>) {
        self.on_record(f, cx, out);
    }

    fn clock(&mut self, now_ns: u64, in_flight: Option<usize>, out: &mut Vec<Event>) {
        self.advance(now_ns, in_flight, out);
    }

    fn finish(&mut self, out: &mut Vec<Event>) {
        self.close_all(out);
    }
}

/// A surge re-arms once a window falls below this fraction of its bound
/// (hysteresis: a rate hovering at the bound is one episode, not many).
const SURGE_REARM_FRACTION: f64 = 0.7;

/// The TTFT baseline follows at least this fast, whatever
/// `baseline_alpha` says: latency baselines must catch up with a new
/// model or GPU within a few windows, request rates may learn slower.
const TTFT_BASELINE_MIN_WEIGHT: f64 = 0.2;

/// A surge's factor over a baseline near zero is shown capped, so that the
/// message stays readable (the attributes carry the exact counts).
const FACTOR_SHOWN_MAX: f64 = 1e6;

/// One caller's closed window, with what every event about it carries.
/// Each detector is one method: it judges the window against the caller's
/// state, may emit one event, and re-arms with hysteresis.
struct Judged<'a> {
    cfg: &'a Config,
    /// The window's end (the events' time).
    ts: u64,
    w: WindowStats,
    n: u32,
    ttft_p95: Option<f64>,
    gpu: Option<f64>,
    in_flight: usize,
}

impl Judged<'_> {
    /// `e` with the caller, its latest context and the window's evidence.
    fn state(&self, e: Event, c: &CallerState) -> Event {
        let window_s = self.cfg.window_s;
        e.with(c.subject.attr(), c.name.as_str())
            .with("gen_ai.provider.name", c.ctx.provider.clone())
            .with("gen_ai.request.model", c.ctx.model.clone())
            .with("tokentap.model.version", c.ctx.model_version.clone())
            .with("process.pid", c.ctx.pid)
            .with("window_s", window_s)
            .with("requests", self.n)
            .with("concurrency", round4(self.w.busy_s / window_s))
            .with("in_flight_requests", self.in_flight as u64)
            .with("ttft_p95_s", self.ttft_p95.map(round4))
            .with("gpu_utilization", self.gpu)
    }

    /// `caller.surge`, against the baseline before this window.
    fn surge(&self, c: &mut CallerState, out: &mut Vec<Event>) {
        let (cfg, n, window_s) = (self.cfg, self.n, self.cfg.window_s);
        let threshold = (cfg.surge_factor * c.baseline).max(cfg.surge_min_requests as f64);
        let warm = c.windows >= cfg.warmup_windows;
        if warm && !c.surging && n as f64 >= threshold {
            c.surging = true;
            let factor = n as f64 / c.baseline.max(f64::MIN_POSITIVE);
            let ttft = match (self.ttft_p95, c.baseline_ttft_p95) {
                (Some(a), Some(b)) => format!(" (TTFT p95 {a:.3} s vs {b:.3} s)"),
                (Some(a), None) => format!(" (TTFT p95 {a:.3} s)"),
                _ => String::new(),
            };
            out.push(
                self.state(
                    Event::new(
                        self.ts,
                        kind::CALLER_SURGE,
                        format!(
                            "{}: {n} requests in {window_s} s, {:.1}× its baseline of {:.1}{ttft}",
                            c.subject.who(&c.name),
                            factor.min(FACTOR_SHOWN_MAX),
                            c.baseline
                        ),
                    ),
                    c,
                )
                .with("rate_rps", round4(n as f64 / window_s))
                .with("baseline_requests", round4(c.baseline))
                .with("baseline_rps", round4(c.baseline / window_s))
                .with("baseline_ttft_p95_s", c.baseline_ttft_p95.map(round4)),
            );
        } else if c.surging && (n as f64) < SURGE_REARM_FRACTION * threshold {
            c.surging = false;
        }
    }

    /// `caller.error_burst`, one per error kind; re-armed below half its
    /// count or fraction.
    fn error_bursts(&self, c: &mut CallerState, out: &mut Vec<Event>) {
        let (cfg, n, window_s) = (self.cfg, self.n, self.cfg.window_s);
        for (k, name) in ERROR_KINDS.iter().enumerate() {
            let m = self.w.errors[k];
            let frac = if n > 0 { m as f64 / n as f64 } else { 0.0 };
            if !c.bursting[k] && m >= cfg.error_burst_min && frac >= cfg.error_burst_fraction {
                c.bursting[k] = true;
                out.push(
                    self.state(
                        Event::new(
                            self.ts,
                            kind::CALLER_ERROR_BURST,
                            format!(
                                "{}: {m} of {n} requests failed with {name} in {window_s} s",
                                c.subject.who(&c.name)
                            ),
                        ),
                        c,
                    )
                    .with("error.type", *name)
                    .with("errors", m)
                    .with("error_fraction", round4(frac)),
                );
            } else if c.bursting[k]
                && (2 * m < cfg.error_burst_min || frac < cfg.error_burst_fraction / 2.0)
            {
                c.bursting[k] = false;
            }
        }
    }

    /// `caller.retry_storm`: repeated bodies after failures (in this window
    /// or the one before); re-armed below half its count or fraction.
    fn retry_storm(&self, c: &mut CallerState, out: &mut Vec<Event>) {
        let (cfg, n, w) = (self.cfg, self.n, &self.w);
        let errs = w.errors_total();
        let repeat_frac = if n > 0 {
            w.repeats as f64 / n as f64
        } else {
            0.0
        };
        if !c.storming
            && w.repeats >= cfg.retry_storm_min
            && repeat_frac >= cfg.retry_storm_fraction
            && errs + c.prev_errors > 0
        {
            c.storming = true;
            let repeated: Vec<u32> = w.fps.values().copied().filter(|&x| x >= 2).collect();
            let max = repeated.iter().copied().max().unwrap_or(0);
            out.push(
                self.state(
                    Event::new(
                        self.ts,
                        kind::CALLER_RETRY_STORM,
                        format!(
                            "{}: {} repeated requests ({} distinct bodies, one sent {max} times) in {} s after {} failed requests",
                            c.subject.who(&c.name),
                            w.repeats,
                            repeated.len(),
                            cfg.window_s,
                            errs + c.prev_errors
                        ),
                    ),
                    c,
                )
                .with("repeated_requests", w.repeats)
                .with("repeated_fraction", round4(repeat_frac))
                .with("distinct_repeated_bodies", repeated.len() as u64)
                .with("max_repeats_of_one_body", max)
                .with("errors", errs)
                .with("errors_window_before", c.prev_errors)
                .with("error_counts", error_counts(&w.errors)),
            );
        } else if c.storming
            && (2 * w.repeats < cfg.retry_storm_min || repeat_frac < cfg.retry_storm_fraction / 2.0)
        {
            c.storming = false;
        }
        c.prev_errors = errs;
    }

    /// The baselines learn from this window: the request rate as a running
    /// mean during warm-up, then a moving average; the TTFT p95 from
    /// windows without a surge.
    fn learn(&self, c: &mut CallerState) {
        let (cfg, n) = (self.cfg, self.n as f64);
        if c.windows < cfg.warmup_windows {
            c.baseline = (c.baseline * c.windows as f64 + n) / (c.windows as f64 + 1.0);
        } else {
            c.baseline += cfg.baseline_alpha * (n - c.baseline);
        }
        if !c.surging {
            if let Some(p) = self.ttft_p95 {
                c.baseline_ttft_p95 = Some(match c.baseline_ttft_p95 {
                    Some(b) => b + cfg.baseline_alpha.max(TTFT_BASELINE_MIN_WEIGHT) * (p - b),
                    None => p,
                });
            }
        }
        c.windows = c.windows.saturating_add(1);
    }
}

/// Callers that show in the summary's message and `top_callers`.
const SUMMARY_TOP: usize = 5;

/// One `caller.new` for the callers beyond the named ones first seen in a
/// window: how many, and the busiest few (by requests in the window).
fn unnamed_summary(ts: u64, m: HashMap<String, u32>, cfg: &Config) -> Event {
    let n = m.len();
    let requests: u64 = m.values().map(|&r| r as u64).sum();
    let mut top: Vec<(String, u32)> = m.into_iter().collect();
    top.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    top.truncate(SUMMARY_TOP);
    let list: Vec<String> = top.iter().map(|(w, r)| format!("{w} ({r})")).collect();
    Event::new(
        ts,
        kind::CALLER_NEW,
        format!(
            "{n} new callers beyond the {} named ones in {} s ({requests} requests; in metrics as \"other\"); busiest: {}",
            cfg.named_callers,
            cfg.window_s,
            list.join(", ")
        ),
    )
    .with("summary", true)
    .with("new_callers", n as u64)
    .with("requests", requests)
    .with("window_s", cfg.window_s)
    .with("top_callers", list)
}

fn error_counts(e: &[u32; 4]) -> serde_json::Value {
    let mut m = serde_json::Map::new();
    for (k, name) in ERROR_KINDS.iter().enumerate() {
        if e[k] > 0 {
            m.insert(name.to_string(), e[k].into());
        }
    }
    serde_json::Value::Object(m)
}
