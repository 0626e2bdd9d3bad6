//! Shifts of a served model's latency, errors and tokens (issue 37): the
//! statistics under `latency.shift`, `errors.shift` and `tokens.shift`.
//!
//! Per group — an engine and the model it serves by name — the records'
//! own clock is cut into fixed windows of `window_s`. When a window closes
//! with at least `min_requests` requests, each metric is judged against
//! the group's own baseline: the windows before it that were normal for
//! that metric (at most `baseline_windows`, pooled):
//!
//! * latency (TTFT, TPOT, non-streamed duration) and tokens per request
//!   (input, output): the window's p50 or p95 moved by at least `ratio`
//!   (up, or down by its inverse) and by at least the metric's floor
//!   ([`Metric::floor`]: a TTFT from 2 to 4 ms is no shift);
//! * errors by class ([`ErrorClass`]): the window's rate at least
//!   `error_rate` above the baseline's, at least twice it, and at least
//!   `error_min` errors.
//!
//! A move must hold for `hold_windows` consecutive windows before it is a
//! shift (one slow minute is not an event), and is said once: the metric
//! is then `shifted` until `hold_windows` windows fall back inside the
//! hysteresis band (half the threshold, on a log scale for ratios) — or,
//! after `baseline_windows` windows at the new level, that level becomes
//! the baseline (a lasting regression is one finding, not sixty). Windows
//! that moved are never pooled into the baseline.
//!
//! With each finding comes the evidence the attribution needs: which
//! stage of the request moved most (`gateway_s`, `queue_s`,
//! `engine_queue_s`, `prefill_s`, `decode_s`) and whether it explains the
//! move; whether the move is in every caller's requests or only some
//! (the subjects — tenants, else callers — and request types whose own
//! medians moved, and those that did not); which subject's share of the
//! traffic and input tokens grew most; the request rate before and after.
//!
//! Nothing here reads a clock: the windows run on the records' end times,
//! so a replay or a unit test gives the same findings.
//!
//! Owns: windows, baselines, the per-metric state machine, the evidence.
//! Must not: keep request text, or more than a bounded sample per window
//! ([`MAX_VALUES`] values per series, [`MAX_KEYS`] subjects and request
//! types per window, [`MAX_GROUPS`] groups).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use crate::record::RequestRecord;
use crate::vocab::ErrorType;

/// Values kept per series per window: beyond it, every other value is
/// dropped and the window keeps one in 2, 4, … (an even thinning, no
/// randomness).
pub const MAX_VALUES: usize = 512;
/// Values kept per series of one subject or request type per window
/// (enough for its own median; a window holds up to [`MAX_KEYS`] of them).
pub const KEY_VALUES: usize = 32;
/// Subjects (and separately request types) kept per window; later ones
/// are summed into [`OTHER`].
pub const MAX_KEYS: usize = 64;
/// Groups (engine, model) tracked at most; later ones are not judged.
pub const MAX_GROUPS: usize = 256;
/// The key requests of subjects and types beyond [`MAX_KEYS`] share.
pub const OTHER: &str = "other";

/// A per-request metric judged by its quantiles.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Metric {
    Ttft,
    Tpot,
    /// Request duration of non-streamed requests.
    Duration,
    InputTokens,
    OutputTokens,
}

impl Metric {
    pub const ALL: [Metric; 5] = [
        Metric::Ttft,
        Metric::Tpot,
        Metric::Duration,
        Metric::InputTokens,
        Metric::OutputTokens,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Metric::Ttft => "ttft",
            Metric::Tpot => "tpot",
            Metric::Duration => "duration",
            Metric::InputTokens => "input_tokens",
            Metric::OutputTokens => "output_tokens",
        }
    }

    /// A latency (`latency.shift`), else a token count (`tokens.shift`).
    pub fn is_latency(self) -> bool {
        matches!(self, Metric::Ttft | Metric::Tpot | Metric::Duration)
    }

    /// The least absolute move that counts (seconds, or tokens).
    pub fn floor(self) -> f64 {
        match self {
            Metric::Ttft | Metric::Duration => 0.005,
            Metric::Tpot => 0.001,
            Metric::InputTokens | Metric::OutputTokens => 8.0,
        }
    }

    /// The request stages that make up this latency, in the order they
    /// happen.
    pub fn stages(self) -> &'static [Stage] {
        match self {
            Metric::Ttft => &[
                Stage::Gateway,
                Stage::Queue,
                Stage::EngineQueue,
                Stage::Prefill,
            ],
            Metric::Tpot => &[Stage::Decode],
            Metric::Duration => &Stage::ALL,
            Metric::InputTokens | Metric::OutputTokens => &[],
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// A stage of a request's time, as the record names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Stage {
    Gateway,
    Queue,
    EngineQueue,
    Prefill,
    Decode,
}

impl Stage {
    pub const ALL: [Stage; 5] = [
        Stage::Gateway,
        Stage::Queue,
        Stage::EngineQueue,
        Stage::Prefill,
        Stage::Decode,
    ];

    /// The record's field (and the event's `stage` value without `_s`).
    pub fn name(self) -> &'static str {
        match self {
            Stage::Gateway => "gateway",
            Stage::Queue => "queue",
            Stage::EngineQueue => "engine_queue",
            Stage::Prefill => "prefill",
            Stage::Decode => "decode",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// A class of failed requests judged as a rate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ErrorClass {
    /// Clients that gave up (disconnects, gRPC deadline exceeded).
    Timeout,
    /// 429, gRPC resource exhausted.
    RateLimited,
    /// 5xx, error events in a stream, the engine resetting mid-answer,
    /// gRPC internal/unavailable/unknown.
    Server,
    /// 401, 403, gRPC unauthenticated/permission denied.
    Auth,
}

impl ErrorClass {
    pub const ALL: [ErrorClass; 4] = [
        ErrorClass::Timeout,
        ErrorClass::RateLimited,
        ErrorClass::Server,
        ErrorClass::Auth,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ErrorClass::Timeout => "timeout",
            ErrorClass::RateLimited => "rate_limited",
            ErrorClass::Server => "server_error",
            ErrorClass::Auth => "auth",
        }
    }

    /// The class of a record's outcome; None for a success, and for what
    /// the capture (not the engine) failed at.
    pub fn of(r: &RequestRecord) -> Option<ErrorClass> {
        if matches!(r.status, Some(401 | 403)) {
            return Some(ErrorClass::Auth);
        }
        match r.error_type? {
            ErrorType::ClientDisconnect => Some(ErrorClass::Timeout),
            ErrorType::Http429 => Some(ErrorClass::RateLimited),
            ErrorType::Http5xx | ErrorType::StreamError | ErrorType::UpstreamReset => {
                Some(ErrorClass::Server)
            }
            // gRPC: 4 deadline exceeded, 8 resource exhausted, 7
            // permission denied, 16 unauthenticated, 2 unknown, 13
            // internal, 14 unavailable.
            ErrorType::Grpc(4) => Some(ErrorClass::Timeout),
            ErrorType::Grpc(8) => Some(ErrorClass::RateLimited),
            ErrorType::Grpc(7 | 16) => Some(ErrorClass::Auth),
            ErrorType::Grpc(2 | 13 | 14) => Some(ErrorClass::Server),
            _ => None,
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// What is judged: a metric's quantiles or an error class's rate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Judged {
    Metric(Metric),
    Errors(ErrorClass),
}

impl Judged {
    pub fn name(self) -> &'static str {
        match self {
            Judged::Metric(m) => m.name(),
            Judged::Errors(c) => c.name(),
        }
    }

    /// The event kind a shift of it is.
    pub fn kind(self) -> &'static str {
        match self {
            Judged::Metric(m) if m.is_latency() => "latency.shift",
            Judged::Metric(_) => "tokens.shift",
            Judged::Errors(_) => "errors.shift",
        }
    }

    fn bit(self) -> u16 {
        match self {
            Judged::Metric(m) => 1 << m.index(),
            Judged::Errors(c) => 1 << (8 + c.index()),
        }
    }

    fn all() -> impl Iterator<Item = Judged> {
        Metric::ALL
            .into_iter()
            .map(Judged::Metric)
            .chain(ErrorClass::ALL.into_iter().map(Judged::Errors))
    }
}

/// The thresholds (the `[events]` table's `shift_*` keys).
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    pub window_s: f64,
    pub min_requests: u32,
    pub ratio: f64,
    pub hold_windows: u32,
    pub baseline_windows: u32,
    pub error_rate: f64,
    pub error_min: u32,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            window_s: 60.0,
            min_requests: 30,
            ratio: 1.5,
            hold_windows: 2,
            baseline_windows: 10,
            error_rate: 0.05,
            error_min: 5,
        }
    }
}

/// One request as the shift detector sees it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Obs {
    pub engine: String,
    pub model: String,
    pub model_version: Option<String>,
    pub pid: u32,
    /// Its tenant, else its caller …
    pub subject: Option<String>,
    /// … a tenant.
    pub subject_tenant: bool,
    pub request_type: Option<String>,
    pub end_ns: u64,
    pub metrics: [Option<f64>; 5],
    pub stages: [Option<f64>; 5],
    pub error: Option<ErrorClass>,
}

impl Obs {
    /// What a finished record says (`subject`: its tenant, else caller,
    /// and whether it is a tenant).
    pub fn of(r: &RequestRecord, end_ns: u64, subject: Option<(&str, bool)>) -> Obs {
        let mut metrics = [None; 5];
        let ok = r.error_type.is_none();
        // Latencies of answered requests only: a failure's time is the
        // error's, judged as a rate.
        if ok {
            metrics[Metric::Ttft.index()] = r.ttft_s;
            metrics[Metric::Tpot.index()] = r.tpot_s;
            metrics[Metric::Duration.index()] = if r.stream { None } else { r.duration_s };
            metrics[Metric::OutputTokens.index()] = r.output_tokens.map(|n| n as f64);
        }
        metrics[Metric::InputTokens.index()] = r.input_tokens.map(|n| n as f64);
        let mut stages = [None; 5];
        stages[Stage::Gateway.index()] = r.gateway_s;
        stages[Stage::Queue.index()] = r.queue_s;
        stages[Stage::EngineQueue.index()] = r.engine_queue_s;
        stages[Stage::Prefill.index()] = r.prefill_s;
        stages[Stage::Decode.index()] = r.decode_s;
        Obs {
            engine: r.provider.clone().unwrap_or_else(|| "unknown".into()),
            model: r
                .response_model
                .clone()
                .or_else(|| r.request_model.clone())
                .unwrap_or_else(|| "unknown".into()),
            model_version: r.model_version.clone(),
            pid: r.pid,
            subject: subject.map(|(s, _)| s.to_string()),
            subject_tenant: subject.is_some_and(|(_, t)| t),
            request_type: r.request_type.clone(),
            end_ns,
            metrics,
            stages: if ok { stages } else { [None; 5] },
            error: ErrorClass::of(r),
        }
    }
}

/// Values thinned evenly past [`MAX_VALUES`].
#[derive(Clone, Debug, Default)]
struct Values {
    v: Vec<f32>,
    /// Keep one value in `stride`.
    stride: u32,
    seen: u32,
}

impl Values {
    fn push(&mut self, x: f64) {
        self.push_capped(x, MAX_VALUES);
    }

    /// As [`Values::push`], thinning past `cap` values.
    fn push_capped(&mut self, x: f64, cap: usize) {
        if self.stride == 0 {
            self.stride = 1;
        }
        self.seen += 1;
        if !self.seen.is_multiple_of(self.stride) {
            return;
        }
        if self.v.len() >= cap {
            let mut i = 0;
            self.v.retain(|_| {
                i += 1;
                i % 2 == 0
            });
            self.stride *= 2;
            if !self.seen.is_multiple_of(self.stride) {
                return;
            }
        }
        self.v.push(x as f32);
    }
}

/// Per subject or request type within a window.
#[derive(Clone, Debug, Default)]
struct KeyStats {
    n: u32,
    /// A tenant (subjects only).
    tenant: bool,
    errors: [u32; 4],
    input_sum: f64,
    /// The metrics' values (thinned), for their own medians.
    metrics: [Values; 5],
}

/// One window of a group.
#[derive(Clone, Debug, Default)]
struct Window {
    start_ns: u64,
    n: u32,
    metrics: [Values; 5],
    stages: [Values; 5],
    errors: [u32; 4],
    subjects: BTreeMap<String, KeyStats>,
    types: BTreeMap<String, KeyStats>,
    /// The engine processes that served it (at most [`MAX_KEYS`]).
    pids: BTreeSet<u32>,
    /// What this window is no baseline for (a [`Judged::bit`] each).
    excluded: u16,
    model_version: Option<String>,
}

impl Window {
    fn add(&mut self, o: &Obs) {
        self.n += 1;
        for (i, m) in o.metrics.iter().enumerate() {
            if let Some(x) = m.filter(|x| x.is_finite()) {
                self.metrics[i].push(x);
            }
        }
        for (i, s) in o.stages.iter().enumerate() {
            if let Some(x) = s.filter(|x| x.is_finite()) {
                self.stages[i].push(x);
            }
        }
        if let Some(c) = o.error {
            self.errors[c.index()] += 1;
        }
        if self.pids.len() < MAX_KEYS {
            self.pids.insert(o.pid);
        }
        for (map, key, tenant) in [
            (&mut self.subjects, o.subject.as_deref(), o.subject_tenant),
            (&mut self.types, o.request_type.as_deref(), false),
        ] {
            let key = key.unwrap_or("unknown");
            let key = if map.contains_key(key) || map.len() < MAX_KEYS {
                key
            } else {
                OTHER
            };
            let k = map.entry(key.to_string()).or_default();
            k.n += 1;
            k.tenant = tenant && key != OTHER;
            if let Some(c) = o.error {
                k.errors[c.index()] += 1;
            }
            k.input_sum += o.metrics[Metric::InputTokens.index()].unwrap_or(0.0);
            for (i, m) in o.metrics.iter().enumerate() {
                if let Some(x) = m.filter(|x| x.is_finite()) {
                    k.metrics[i].push_capped(x, KEY_VALUES);
                }
            }
        }
        if o.model_version.is_some() {
            self.model_version = o.model_version.clone();
        }
    }
}

/// Nearest-rank quantile of `v` (sorted here); None when empty.
pub fn quantile(v: &mut [f32], q: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_unstable_by(|a, b| a.total_cmp(b));
    let rank = ((v.len() as f64) * q).ceil() as usize;
    Some(v[rank.clamp(1, v.len()) - 1] as f64)
}

/// p50 and p95 of values.
fn p50_p95(v: &[f32]) -> Option<(f64, f64)> {
    let mut v = v.to_vec();
    Some((quantile(&mut v, 0.5)?, quantile(&mut v, 0.95)?))
}

/// One side of a finding (the baseline, or the windows that moved).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Side {
    pub requests: u64,
    /// Seconds the side covers (windows × `window_s`).
    pub seconds: f64,
    /// Metrics: p50 and p95; errors: the rate (both fields).
    pub p50: f64,
    pub p95: f64,
}

impl Side {
    pub fn rate_per_s(&self) -> f64 {
        if self.seconds > 0.0 {
            self.requests as f64 / self.seconds
        } else {
            0.0
        }
    }
}

/// A stage's move, for a latency finding.
#[derive(Clone, Debug, PartialEq)]
pub struct StageMove {
    pub stage: Stage,
    /// Before and after, seconds: p50s, or p95s when the latency's move
    /// is in its p95 only.
    pub before: f64,
    pub after: f64,
    /// Its share of the metric's move (1 = all of it).
    pub share: f64,
}

/// Whether the move is in every caller's (request type's) requests, and
/// who carries the traffic.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Spread {
    /// Keys (with enough requests on both sides) whose own p50 moved past
    /// the threshold, most first.
    pub moved: Vec<String>,
    /// Keys (with enough requests on both sides) whose own p50 did not.
    pub steady: Vec<String>,
    /// The key whose share of the requests grew most: (key, share
    /// before, share after).
    pub grew: Option<(String, f64, f64)>,
    /// The key whose input tokens per request grew most: (key, before,
    /// after).
    pub input_grew: Option<(String, f64, f64)>,
    /// Keys seen only after (new traffic).
    pub new: Vec<String>,
    /// The keys above that are tenants (else callers; request types are
    /// neither).
    pub tenants: BTreeSet<String>,
}

/// A shift, with its evidence.
#[derive(Clone, Debug, PartialEq)]
pub struct Finding {
    pub engine: String,
    pub model: String,
    pub model_version: Option<String>,
    /// The engine processes that served the windows that moved.
    pub pids: Vec<u32>,
    pub judged: Judged,
    /// +1 up, −1 down.
    pub direction: i8,
    pub before: Side,
    pub after: Side,
    /// The first window that moved, and the end of the window that made
    /// it a shift (ns).
    pub since_ns: u64,
    /// The start of the baseline's first window (ns): a change before it
    /// is in the baseline already.
    pub baseline_from_ns: u64,
    pub at_ns: u64,
    /// The stages of a latency's time, the one that moved most first.
    pub stages: Vec<StageMove>,
    pub subjects: Spread,
    pub types: Spread,
}

impl Finding {
    /// The stage that explains at least half of a latency's move.
    pub fn stage(&self) -> Option<Stage> {
        self.stages
            .first()
            .filter(|s| s.share >= 0.5)
            .map(|s| s.stage)
    }
}

/// Where one judged series of a group stands.
#[derive(Clone, Debug, Default)]
enum State {
    /// Normal; `moving` consecutive windows moved in `dir` so far.
    #[default]
    Normal,
    Moving {
        dir: i8,
        windows: u32,
        since_ns: u64,
    },
    /// Said; `back` consecutive windows inside the band so far, `at` the
    /// windows at the new level.
    Shifted { dir: i8, back: u32, at: u32 },
}

struct Group {
    cur: Window,
    /// The windows before, newest last (the baseline pool and the moved
    /// windows: each knows what it is no baseline for).
    past: VecDeque<Window>,
    states: HashMap<Judged, State>,
}

/// The shift detector's statistics over every group.
pub struct Shifts {
    s: Settings,
    groups: HashMap<(String, String), Group>,
    /// Groups not tracked (over [`MAX_GROUPS`]).
    pub untracked: u64,
}

/// What a closed window says of one judged series.
enum Verdict {
    /// Too few requests (or values) to judge, or no baseline yet.
    Unknown,
    /// Inside the threshold; `inside_band`: inside the hysteresis band.
    Steady {
        inside_band: bool,
    },
    Moved(i8),
}

impl Shifts {
    pub fn new(s: Settings) -> Self {
        Shifts {
            s,
            groups: HashMap::new(),
            untracked: 0,
        }
    }

    fn window_ns(&self) -> u64 {
        (self.s.window_s * 1e9) as u64
    }

    /// One request. Findings of windows it closed go to `out`.
    pub fn record(&mut self, o: &Obs, out: &mut Vec<Finding>) {
        self.clock(o.end_ns, out);
        let key = (o.engine.clone(), o.model.clone());
        if !self.groups.contains_key(&key) {
            if self.groups.len() >= MAX_GROUPS {
                self.untracked += 1;
                return;
            }
            let w = self.window_ns();
            self.groups.insert(
                key.clone(),
                Group {
                    cur: Window {
                        start_ns: o.end_ns - o.end_ns % w.max(1),
                        ..Window::default()
                    },
                    past: VecDeque::new(),
                    states: HashMap::new(),
                },
            );
        }
        let g = self.groups.get_mut(&key).expect("inserted above");
        g.cur.add(o);
    }

    /// The clock moved to `now_ns`: windows that ended are judged.
    pub fn clock(&mut self, now_ns: u64, out: &mut Vec<Finding>) {
        let w = self.window_ns().max(1);
        let keys: Vec<(String, String)> = self
            .groups
            .iter()
            .filter(|(_, g)| now_ns >= g.cur.start_ns + w)
            .map(|(k, _)| k.clone())
            .collect();
        for k in keys {
            // Every window that ended, the idle ones too (they count as
            // too few requests: they neither move nor reset anything).
            loop {
                let g = self.groups.get_mut(&k).expect("listed above");
                if now_ns < g.cur.start_ns + w {
                    break;
                }
                let next = Window {
                    start_ns: g.cur.start_ns + w,
                    model_version: g.cur.model_version.clone(),
                    ..Window::default()
                };
                let closed = std::mem::replace(&mut g.cur, next);
                if closed.n == 0 {
                    // An idle window: nothing to judge or keep; a run of
                    // them is skipped at once.
                    if now_ns >= g.cur.start_ns + w {
                        let idle = (now_ns - g.cur.start_ns) / w;
                        g.cur.start_ns += idle * w;
                    }
                    continue;
                }
                let found = self.close(&k, closed);
                out.extend(found);
            }
        }
    }

    fn close(&mut self, key: &(String, String), mut win: Window) -> Vec<Finding> {
        let s = self.s.clone();
        let w_s = s.window_s;
        let g = self.groups.get_mut(key).expect("a tracked group");
        let mut found = Vec::new();
        if win.n < s.min_requests {
            // Too few to judge: no baseline either.
            win.excluded = u16::MAX;
            push_past(g, win, &s);
            return found;
        }
        for j in Judged::all() {
            let verdict = judge(&s, &g.past, &win, j);
            let state = g.states.entry(j).or_default();
            let mut exclude = false;
            match (state.clone(), verdict) {
                (_, Verdict::Unknown) => {}
                (State::Normal | State::Moving { .. }, Verdict::Moved(d)) => {
                    exclude = true;
                    // The run of windows moving this way, this one
                    // included.
                    let (windows, since_ns) = match state.clone() {
                        State::Moving {
                            dir,
                            windows,
                            since_ns,
                        } if dir == d => (windows + 1, since_ns),
                        _ => (1, win.start_ns),
                    };
                    if windows >= s.hold_windows {
                        *state = State::Shifted {
                            dir: d,
                            back: 0,
                            at: windows,
                        };
                        found.push(finding(&s, key, &g.past, &win, j, d, since_ns, w_s));
                    } else {
                        *state = State::Moving {
                            dir: d,
                            windows,
                            since_ns,
                        };
                    }
                }
                (State::Moving { .. }, Verdict::Steady { .. }) => {
                    // A blip: the windows it moved in stay out of the
                    // baseline; this one goes in.
                    *state = State::Normal;
                }
                (State::Normal, Verdict::Steady { .. }) => {}
                (State::Shifted { dir, back, at }, Verdict::Steady { inside_band: true }) => {
                    if back + 1 >= s.hold_windows {
                        *state = State::Normal;
                    } else {
                        exclude = true;
                        *state = State::Shifted {
                            dir,
                            back: back + 1,
                            at,
                        };
                    }
                }
                (State::Shifted { dir, at, .. }, _) => {
                    exclude = true;
                    if at + 1 >= s.baseline_windows {
                        // The new level is the normal now: the windows at
                        // it become the baseline.
                        let bit = j.bit();
                        let n = g.past.len();
                        for (i, p) in g.past.iter_mut().enumerate() {
                            if i + (at as usize) < n {
                                p.excluded |= bit;
                            } else {
                                p.excluded &= !bit;
                            }
                        }
                        exclude = false;
                        *state = State::Normal;
                    } else {
                        *state = State::Shifted {
                            dir,
                            back: 0,
                            at: at + 1,
                        };
                    }
                }
            }
            if exclude {
                win.excluded |= j.bit();
            }
        }
        push_past(g, win, &s);
        found
    }
}

/// Before and after a change, for `change.impact`.
#[derive(Clone, Debug, PartialEq)]
pub struct Impact {
    pub engine: String,
    pub model: String,
    pub model_version: Option<String>,
    pub before: Sides,
    pub after: Sides,
}

/// Each metric's side, and the error rate (every class).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sides {
    pub requests: u64,
    pub seconds: f64,
    pub metrics: BTreeMap<Metric, (f64, f64)>,
    pub error_rate: f64,
}

impl Shifts {
    /// What changed at `at_ns` for the groups `matches` names (engine,
    /// model, the pids that served it): the windows that ended before it
    /// against the `after` windows that started after it (the one it fell
    /// in is neither), each with at least `min_requests` requests; None
    /// until `after` such windows closed (or with no window before).
    pub fn impact(
        &self,
        at_ns: u64,
        after: usize,
        matches: impl Fn(&str, &str, &BTreeSet<u32>) -> bool,
    ) -> Vec<Impact> {
        let w = self.window_ns();
        let mut out = Vec::new();
        for ((engine, model), g) in &self.groups {
            let pids: BTreeSet<u32> = g.past.iter().flat_map(|w| w.pids.iter().copied()).collect();
            if !matches(engine, model, &pids) {
                continue;
            }
            let full = |x: &&Window| x.n >= self.s.min_requests;
            let before: Vec<&Window> = {
                let mut v: Vec<&Window> = g
                    .past
                    .iter()
                    .rev()
                    .filter(|x| x.start_ns + w <= at_ns)
                    .filter(full)
                    .take(self.s.baseline_windows as usize)
                    .collect();
                v.reverse();
                v
            };
            let later: Vec<&Window> = g
                .past
                .iter()
                .filter(|x| x.start_ns >= at_ns)
                .filter(full)
                .take(after)
                .collect();
            if before.is_empty() || later.len() < after {
                continue;
            }
            let sides = |ws: &[&Window]| -> Sides {
                let requests: u64 = ws.iter().map(|x| x.n as u64).sum();
                let errors: u64 = ws.iter().map(|x| x.errors.iter().sum::<u32>() as u64).sum();
                Sides {
                    requests,
                    seconds: ws.len() as f64 * self.s.window_s,
                    metrics: Metric::ALL
                        .iter()
                        .filter_map(|&m| {
                            p50_p95(&pooled(ws, |x| &x.metrics[m.index()])).map(|q| (m, q))
                        })
                        .collect(),
                    error_rate: errors as f64 / requests.max(1) as f64,
                }
            };
            out.push(Impact {
                engine: engine.clone(),
                model: model.clone(),
                model_version: later.last().and_then(|x| x.model_version.clone()),
                before: sides(&before),
                after: sides(&later),
            });
        }
        out.sort_by(|a, b| (&a.engine, &a.model).cmp(&(&b.engine, &b.model)));
        out
    }
}

impl Impact {
    /// `regressed`, `improved` or `no_change`, and the metrics that moved
    /// each way: a latency's p50 or p95 by the shift ratio and floor, the
    /// error rate by `error_rate` (tokens are reported, not judged).
    pub fn verdict(&self, s: &Settings) -> (&'static str, Vec<String>, Vec<String>) {
        let (mut worse, mut better) = (Vec::new(), Vec::new());
        for m in [Metric::Ttft, Metric::Tpot, Metric::Duration] {
            let (Some(&(b50, b95)), Some(&(a50, a95))) =
                (self.before.metrics.get(&m), self.after.metrics.get(&m))
            else {
                continue;
            };
            let dir = |b: f64, a: f64| -> i8 {
                if a >= b * s.ratio && a - b >= m.floor() {
                    1
                } else if a * s.ratio <= b && b - a >= m.floor() {
                    -1
                } else {
                    0
                }
            };
            let d = [dir(b50, a50), dir(b95, a95)];
            if d.contains(&1) {
                worse.push(m.name().to_string());
            } else if d.contains(&-1) {
                better.push(m.name().to_string());
            }
        }
        let (eb, ea) = (self.before.error_rate, self.after.error_rate);
        if ea - eb >= s.error_rate {
            worse.push("error_rate".into());
        } else if eb - ea >= s.error_rate {
            better.push("error_rate".into());
        }
        let verdict = if !worse.is_empty() {
            "regressed"
        } else if !better.is_empty() {
            "improved"
        } else {
            "no_change"
        };
        (verdict, worse, better)
    }
}

/// Keeps a closed window: the baseline pool holds `baseline_windows`
/// windows usable for each series, and the moved windows besides, at most
/// twice that in all.
fn push_past(g: &mut Group, win: Window, s: &Settings) {
    g.past.push_back(win);
    let max = (s.baseline_windows as usize * 2).max(4);
    while g.past.len() > max {
        g.past.pop_front();
    }
}

/// The baseline windows of `j`: the newest `baseline_windows` that are
/// baseline for it.
fn baseline<'a>(s: &Settings, past: &'a VecDeque<Window>, j: Judged) -> Vec<&'a Window> {
    let mut v: Vec<&Window> = past
        .iter()
        .rev()
        .filter(|w| w.excluded & j.bit() == 0)
        .take(s.baseline_windows as usize)
        .collect();
    v.reverse();
    v
}

fn pooled(ws: &[&Window], f: impl Fn(&Window) -> &Values) -> Vec<f32> {
    ws.iter().flat_map(|w| f(w).v.iter().copied()).collect()
}

fn judge(s: &Settings, past: &VecDeque<Window>, win: &Window, j: Judged) -> Verdict {
    let base = baseline(s, past, j);
    if base.len() < 2 {
        return Verdict::Unknown;
    }
    match j {
        Judged::Metric(m) => {
            let now = &win.metrics[m.index()].v;
            let before = pooled(&base, |w| &w.metrics[m.index()]);
            let min = (s.min_requests as usize / 2).max(1);
            if now.len() < min || before.len() < min {
                return Verdict::Unknown;
            }
            let (Some((b50, b95)), Some((w50, w95))) = (p50_p95(&before), p50_p95(now)) else {
                return Verdict::Unknown;
            };
            let moved = |b: f64, w: f64, r: f64| -> i8 {
                if w >= b * r && w - b >= m.floor() {
                    1
                } else if w * r <= b && b - w >= m.floor() {
                    -1
                } else {
                    0
                }
            };
            let d = if moved(b50, w50, s.ratio) != 0 {
                moved(b50, w50, s.ratio)
            } else {
                moved(b95, w95, s.ratio)
            };
            if d != 0 {
                return Verdict::Moved(d);
            }
            let band = s.ratio.sqrt();
            Verdict::Steady {
                inside_band: moved(b50, w50, band) == 0 && moved(b95, w95, band) == 0,
            }
        }
        Judged::Errors(c) => {
            let (bn, be): (u64, u64) = base.iter().fold((0, 0), |(n, e), w| {
                (n + w.n as u64, e + w.errors[c.index()] as u64)
            });
            if bn == 0 {
                return Verdict::Unknown;
            }
            let rb = be as f64 / bn as f64;
            let errs = win.errors[c.index()];
            let rw = errs as f64 / win.n as f64;
            if errs >= s.error_min && rw - rb >= s.error_rate && rw >= 2.0 * rb {
                return Verdict::Moved(1);
            }
            Verdict::Steady {
                inside_band: rw - rb < s.error_rate / 2.0,
            }
        }
    }
}

/// The evidence of a shift of `j` found at window `win`.
#[allow(clippy::too_many_arguments)]
fn finding(
    s: &Settings,
    key: &(String, String),
    past: &VecDeque<Window>,
    win: &Window,
    j: Judged,
    dir: i8,
    since_ns: u64,
    window_s: f64,
) -> Finding {
    let base = baseline(s, past, j);
    // The windows that moved: those since the first one, and this one.
    let mut moved: Vec<&Window> = past
        .iter()
        .filter(|w| w.start_ns >= since_ns && w.excluded & j.bit() != 0)
        .collect();
    moved.push(win);
    let side = |ws: &[&Window]| -> Side {
        let requests: u64 = ws.iter().map(|w| w.n as u64).sum();
        let seconds = ws.len() as f64 * window_s;
        match j {
            Judged::Metric(m) => {
                let (p50, p95) =
                    p50_p95(&pooled(ws, |w| &w.metrics[m.index()])).unwrap_or((0.0, 0.0));
                Side {
                    requests,
                    seconds,
                    p50,
                    p95,
                }
            }
            Judged::Errors(c) => {
                let e: u64 = ws.iter().map(|w| w.errors[c.index()] as u64).sum();
                let rate = if requests > 0 {
                    e as f64 / requests as f64
                } else {
                    0.0
                };
                Side {
                    requests,
                    seconds,
                    p50: rate,
                    p95: rate,
                }
            }
        }
    };
    let before = side(&base);
    let after = side(&moved);
    let mut stages = Vec::new();
    if let Judged::Metric(m) = j {
        // The stages compared at the quantile that moved: the median, or
        // (a move in part of the traffic) the p95.
        let r50 = (after.p50 + 1e-9) / (before.p50 + 1e-9);
        let p95 = !(r50 >= s.ratio || r50 <= 1.0 / s.ratio);
        let pick = |q: (f64, f64)| if p95 { q.1 } else { q.0 };
        let dm = if p95 {
            after.p95 - before.p95
        } else {
            after.p50 - before.p50
        };
        for &st in m.stages() {
            let b = p50_p95(&pooled(&base, |w| &w.stages[st.index()])).map(pick);
            let a = p50_p95(&pooled(&moved, |w| &w.stages[st.index()])).map(pick);
            if let (Some(b), Some(a)) = (b, a) {
                let share = if dm.abs() > 0.0 { (a - b) / dm } else { 0.0 };
                stages.push(StageMove {
                    stage: st,
                    before: b,
                    after: a,
                    share,
                });
            }
        }
        stages.sort_by(|x, y| y.share.total_cmp(&x.share));
    }
    Finding {
        engine: key.0.clone(),
        model: key.1.clone(),
        model_version: win.model_version.clone(),
        pids: moved
            .iter()
            .flat_map(|w| w.pids.iter().copied())
            .collect::<BTreeSet<u32>>()
            .into_iter()
            .collect(),
        judged: j,
        direction: dir,
        before,
        after,
        since_ns,
        baseline_from_ns: base.first().map_or(since_ns, |w| w.start_ns),
        at_ns: win.start_ns + (window_s * 1e9) as u64,
        stages,
        subjects: spread(s, &base, &moved, j, |w| &w.subjects),
        types: spread(s, &base, &moved, j, |w| &w.types),
    }
}

/// Per key (subject or request type): who moved, who did not, who grew.
fn spread(
    s: &Settings,
    base: &[&Window],
    moved: &[&Window],
    j: Judged,
    keys: impl Fn(&Window) -> &BTreeMap<String, KeyStats>,
) -> Spread {
    #[derive(Default)]
    struct Agg {
        n: u64,
        errors: u64,
        input: f64,
        v: Vec<f32>,
    }
    let agg = |ws: &[&Window]| -> (BTreeMap<String, Agg>, u64) {
        let mut m: BTreeMap<String, Agg> = BTreeMap::new();
        let mut total = 0;
        for w in ws {
            for (k, st) in keys(w) {
                let a = m.entry(k.clone()).or_default();
                a.n += st.n as u64;
                if let Judged::Errors(c) = j {
                    a.errors += st.errors[c.index()] as u64;
                }
                a.input += st.input_sum;
                total += st.n as u64;
                if let Judged::Metric(me) = j {
                    a.v.extend_from_slice(&st.metrics[me.index()].v);
                }
            }
        }
        (m, total)
    };
    let (b, bt) = agg(base);
    let (a, at) = agg(moved);
    let mut out = Spread::default();
    for w in base.iter().chain(moved) {
        for (k, st) in keys(w) {
            if st.tenant {
                out.tenants.insert(k.clone());
            }
        }
    }
    let enough = 5;
    let mut moved_keys: Vec<(f64, String)> = Vec::new();
    if let Judged::Metric(m) = j {
        for (k, ak) in &a {
            let Some(bk) = b.get(k) else { continue };
            if ak.v.len() < enough || bk.v.len() < enough {
                continue;
            }
            let (Some((b50, _)), Some((a50, _))) = (p50_p95(&bk.v), p50_p95(&ak.v)) else {
                continue;
            };
            let r = (a50 + 1e-9) / (b50 + 1e-9);
            let past = (a50 - b50).abs() >= m.floor() && (r >= s.ratio || r <= 1.0 / s.ratio);
            if past {
                moved_keys.push((r.max(1.0 / r), k.clone()));
            } else {
                out.steady.push(k.clone());
            }
        }
    }
    if let Judged::Errors(_) = j {
        // A key's own error rate rose past the threshold (a key new
        // since counts from 0).
        for (k, ak) in &a {
            if (ak.n as usize) < enough {
                continue;
            }
            let rb = b
                .get(k)
                .map_or(0.0, |bk| bk.errors as f64 / bk.n.max(1) as f64);
            let ra = ak.errors as f64 / ak.n as f64;
            if ra - rb >= s.error_rate && ak.errors >= s.error_min as u64 {
                moved_keys.push((ra - rb, k.clone()));
            } else {
                out.steady.push(k.clone());
            }
        }
    }
    moved_keys.sort_by(|x, y| y.0.total_cmp(&x.0).then(x.1.cmp(&y.1)));
    out.moved = moved_keys.into_iter().map(|(_, k)| k).collect();
    let share = |n: u64, t: u64| if t > 0 { n as f64 / t as f64 } else { 0.0 };
    let mut grew: Option<(f64, String, f64, f64)> = None;
    let mut input_grew: Option<(f64, String, f64, f64)> = None;
    for (k, ak) in &a {
        let sa = share(ak.n, at);
        match b.get(k) {
            None => out.new.push(k.clone()),
            Some(bk) => {
                let sb = share(bk.n, bt);
                if sa - sb > grew.as_ref().map_or(0.0, |g| g.0) {
                    grew = Some((sa - sb, k.clone(), sb, sa));
                }
                if ak.n as usize >= enough && bk.n as usize >= enough {
                    let (ib, ia) = (bk.input / bk.n as f64, ak.input / ak.n as f64);
                    let r = (ia + 1.0) / (ib + 1.0);
                    if r > input_grew.as_ref().map_or(1.0, |g| g.0) {
                        input_grew = Some((r, k.clone(), ib, ia));
                    }
                }
            }
        }
    }
    // New keys count as growth from nothing.
    for k in &out.new {
        let sa = share(a[k].n, at);
        if sa > grew.as_ref().map_or(0.0, |g| g.0) {
            grew = Some((sa, k.clone(), 0.0, sa));
        }
    }
    out.grew = grew.map(|(_, k, b, a)| (k, b, a));
    out.input_grew = input_grew.map(|(_, k, b, a)| (k, b, a));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    /// A simulated request: `ttft` seconds, split into queue and prefill
    /// as given, from `subject`.
    fn obs(end_s: f64, subject: &str, queue: f64, prefill: f64, input: f64) -> Obs {
        let mut o = Obs {
            engine: "llama.cpp".into(),
            model: "m".into(),
            model_version: Some("v1".into()),
            pid: 42,
            subject: Some(subject.into()),
            subject_tenant: true,
            request_type: Some("chat".into()),
            end_ns: (end_s * 1e9) as u64,
            ..Obs::default()
        };
        o.metrics[Metric::Ttft.index()] = Some(queue + prefill);
        o.metrics[Metric::Tpot.index()] = Some(0.01);
        o.metrics[Metric::InputTokens.index()] = Some(input);
        o.metrics[Metric::OutputTokens.index()] = Some(64.0);
        o.stages[Stage::Queue.index()] = Some(queue);
        o.stages[Stage::Prefill.index()] = Some(prefill);
        o.stages[Stage::Decode.index()] = Some(0.64);
        o
    }

    /// `minutes` of traffic from `from_s`, 1 request a second from each
    /// of `subjects`, shaped by `f(minute, subject, i)` → (queue,
    /// prefill, input, error).
    fn run(
        sh: &mut Shifts,
        from_s: f64,
        minutes: u32,
        subjects: &[&str],
        f: impl Fn(u32, &str, u32) -> (f64, f64, f64, Option<ErrorClass>),
    ) -> Vec<Finding> {
        let mut out = Vec::new();
        for m in 0..minutes {
            for i in 0..60 {
                for (k, s) in subjects.iter().enumerate() {
                    let t = from_s + (m * 60 + i) as f64 + k as f64 * 0.01;
                    let (q, p, input, e) = f(m, s, i);
                    let mut o = obs(t, s, q, p, input);
                    if let Some(e) = e {
                        o.error = Some(e);
                        o.metrics = [None, None, None, Some(input), None];
                        o.stages = [None; 5];
                    }
                    sh.record(&o, &mut out);
                }
            }
        }
        sh.clock((from_s as u64 + minutes as u64 * 60 + 61) * S, &mut out);
        out
    }

    /// Small jitter that is the same every run.
    fn jitter(i: u32) -> f64 {
        ((i * 7919) % 13) as f64 / 1000.0
    }

    #[test]
    fn a_steady_hour_finds_nothing() {
        let mut sh = Shifts::new(Settings::default());
        let out = run(&mut sh, 0.0, 60, &["a", "b"], |_, _, i| {
            (
                0.002 + jitter(i) / 10.0,
                0.05 + jitter(i),
                200.0 + (i % 9) as f64,
                None,
            )
        });
        assert!(out.is_empty(), "{out:#?}");
    }

    #[test]
    fn one_slow_minute_is_no_shift() {
        let mut sh = Shifts::new(Settings::default());
        let out = run(&mut sh, 0.0, 30, &["a", "b"], |m, _, i| {
            let p = if m == 15 { 0.4 } else { 0.05 };
            (0.002, p + jitter(i), 200.0, None)
        });
        assert!(out.is_empty(), "{out:#?}");
    }

    #[test]
    fn a_lasting_prefill_regression_is_one_shift_with_its_stage() {
        let mut sh = Shifts::new(Settings::default());
        let out = run(&mut sh, 0.0, 60, &["a", "b"], |m, _, i| {
            let p = if m >= 20 { 0.2 } else { 0.05 };
            (0.002, p + jitter(i), 200.0, None)
        });
        let ttft: Vec<&Finding> = out
            .iter()
            .filter(|f| f.judged == Judged::Metric(Metric::Ttft))
            .collect();
        assert_eq!(ttft.len(), 1, "{out:#?}");
        let f = ttft[0];
        assert_eq!(f.direction, 1);
        assert_eq!(f.judged.kind(), "latency.shift");
        assert_eq!(f.stage(), Some(Stage::Prefill), "{f:#?}");
        assert!(f.before.p50 < 0.07 && f.after.p50 > 0.19, "{f:#?}");
        assert_eq!(f.since_ns, 20 * 60 * S);
        assert_eq!(f.at_ns, 22 * 60 * S);
        // Every caller moved alike.
        assert_eq!(f.subjects.moved, vec!["a".to_string(), "b".to_string()]);
        assert!(f.subjects.steady.is_empty());
        // Nothing else moved.
        assert_eq!(out.len(), 1, "{out:#?}");
    }

    #[test]
    fn a_shift_that_ends_can_be_found_again() {
        let mut sh = Shifts::new(Settings::default());
        let out = run(&mut sh, 0.0, 60, &["a"], |m, _, i| {
            let p = if (20..28).contains(&m) || m >= 40 {
                0.2
            } else {
                0.05
            };
            (0.002, p + jitter(i), 200.0, None)
        });
        let n = out
            .iter()
            .filter(|f| f.judged == Judged::Metric(Metric::Ttft))
            .count();
        assert_eq!(n, 2, "{out:#?}");
    }

    #[test]
    fn a_new_level_becomes_the_baseline() {
        let s = Settings {
            baseline_windows: 5,
            ..Settings::default()
        };
        let mut sh = Shifts::new(s);
        // Up at 20, stays: one shift; at 40 back down to where it was —
        // by then the new level is the baseline, so that is a shift down.
        let out = run(&mut sh, 0.0, 60, &["a"], |m, _, i| {
            let p = if (20..40).contains(&m) { 0.2 } else { 0.05 };
            (0.002, p + jitter(i), 200.0, None)
        });
        let dirs: Vec<i8> = out
            .iter()
            .filter(|f| f.judged == Judged::Metric(Metric::Ttft))
            .map(|f| f.direction)
            .collect();
        assert_eq!(dirs, vec![1, -1], "{out:#?}");
    }

    #[test]
    fn queueing_from_one_callers_surge_names_the_stage_and_the_caller() {
        let mut sh = Shifts::new(Settings::default());
        let mut out = run(&mut sh, 0.0, 20, &["a", "b"], |_, _, i| {
            (0.002, 0.05 + jitter(i), 200.0, None)
        });
        // Caller c arrives with 3× the others' traffic; everyone queues.
        out.extend(run(
            &mut sh,
            1200.0,
            10,
            &["a", "b", "c", "c2", "c3"],
            |_, _, i| (0.3, 0.05 + jitter(i), 200.0, None),
        ));
        let f = out
            .iter()
            .find(|f| f.judged == Judged::Metric(Metric::Ttft))
            .unwrap_or_else(|| panic!("{out:#?}"));
        assert_eq!(f.stage(), Some(Stage::Queue), "{f:#?}");
        assert!(f.after.rate_per_s() > 2.0 * f.before.rate_per_s(), "{f:#?}");
        assert!(f.subjects.new.contains(&"c".to_string()), "{f:#?}");
        assert!(
            f.subjects
                .grew
                .as_ref()
                .is_some_and(|g| g.0.starts_with('c')),
            "{f:#?}"
        );
    }

    #[test]
    fn one_tenants_longer_prompts_are_named() {
        let mut sh = Shifts::new(Settings::default());
        let out = run(&mut sh, 0.0, 40, &["a", "b"], |m, s, i| {
            let long = m >= 20 && s == "b";
            let input = if long { 1000.0 } else { 200.0 };
            let p = if long { 0.25 } else { 0.05 };
            (0.002, p + jitter(i), input + (i % 5) as f64, None)
        });
        let t = out
            .iter()
            .find(|f| f.judged == Judged::Metric(Metric::InputTokens))
            .unwrap_or_else(|| panic!("{out:#?}"));
        assert_eq!(t.judged.kind(), "tokens.shift");
        let (who, before, after) = t.subjects.input_grew.clone().unwrap();
        assert_eq!(who, "b");
        assert!(before < 210.0 && after > 990.0, "{t:#?}");
        // The TTFT moved for b only (its p95 carries the group).
        let l = out
            .iter()
            .find(|f| f.judged == Judged::Metric(Metric::Ttft))
            .unwrap_or_else(|| panic!("{out:#?}"));
        assert_eq!(l.subjects.moved, vec!["b".to_string()], "{l:#?}");
        assert_eq!(l.subjects.steady, vec!["a".to_string()], "{l:#?}");
        assert_eq!(l.stage(), Some(Stage::Prefill), "{l:#?}");
    }

    #[test]
    fn auth_failures_of_one_tenant_are_an_errors_shift_naming_it() {
        let mut sh = Shifts::new(Settings::default());
        let out = run(&mut sh, 0.0, 40, &["a", "b", "c"], |m, s, i| {
            let e = (m >= 20 && s == "c").then_some(ErrorClass::Auth);
            (0.002, 0.05 + jitter(i), 200.0, e)
        });
        let f: Vec<&Finding> = out
            .iter()
            .filter(|f| f.judged == Judged::Errors(ErrorClass::Auth))
            .collect();
        assert_eq!(f.len(), 1, "{out:#?}");
        let f = f[0];
        assert_eq!(f.judged.kind(), "errors.shift");
        assert!(f.before.p50 < 0.01 && f.after.p50 > 0.3, "{f:#?}");
        assert_eq!(f.subjects.moved, vec!["c".to_string()], "{f:#?}");
        assert!(f.subjects.tenants.contains("c"));
        // No other series moved: the failed requests' latency is not
        // judged, and their share of traffic is unchanged.
        assert!(
            out.iter()
                .all(|x| x.judged == Judged::Errors(ErrorClass::Auth)),
            "{out:#?}"
        );
    }

    #[test]
    fn quiet_groups_are_not_judged_and_thinning_keeps_bounds() {
        let mut sh = Shifts::new(Settings::default());
        // 10 requests a minute: under min_requests, nothing to judge.
        let mut out = Vec::new();
        for i in 0..600u64 {
            let p = if i > 300 { 1.0 } else { 0.05 };
            sh.record(&obs(i as f64 * 6.0, "a", 0.0, p, 10.0), &mut out);
        }
        assert!(out.is_empty(), "{out:#?}");
        let mut v = Values::default();
        for i in 0..100_000 {
            v.push(i as f64);
        }
        assert!(
            v.v.len() <= MAX_VALUES && v.v.len() >= MAX_VALUES / 2,
            "{}",
            v.v.len()
        );
        // Evenly spread over what was seen.
        assert!(*v.v.last().unwrap() > 90_000.0);
    }

    #[test]
    fn error_classes_follow_the_records_outcome() {
        let r = |status: u16, e: Option<ErrorType>| RequestRecord {
            status: Some(status),
            error_type: e,
            ..Default::default()
        };
        assert_eq!(ErrorClass::of(&r(200, None)), None);
        assert_eq!(
            ErrorClass::of(&r(401, Some(ErrorType::Http4xx))),
            Some(ErrorClass::Auth)
        );
        assert_eq!(ErrorClass::of(&r(404, Some(ErrorType::Http4xx))), None);
        assert_eq!(
            ErrorClass::of(&r(429, Some(ErrorType::Http429))),
            Some(ErrorClass::RateLimited)
        );
        assert_eq!(
            ErrorClass::of(&r(200, Some(ErrorType::ClientDisconnect))),
            Some(ErrorClass::Timeout)
        );
        assert_eq!(
            ErrorClass::of(&r(200, Some(ErrorType::TruncatedCapture))),
            None,
            "the capture's failure, not the engine's"
        );
    }
}
