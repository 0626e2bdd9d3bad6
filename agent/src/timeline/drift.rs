//! `tokens.drift`: per (tenant or caller, model version, request type), the
//! input- and output-token counts of the latest `drift_window_requests`
//! successful requests against a baseline made of the key's first
//! `drift_baseline_requests`. A drift is a percentile (p50 or p95) that
//! moved by ≥ `drift_ratio` up or down **and** a Kolmogorov–Smirnov
//! distance ≥ `drift_distance` between the two samples — context bloat
//! (RAG recall growing, templates growing) or runaway outputs show here
//! while the request rate is flat. After a drift the key starts a new
//! baseline from its next requests, so a size that keeps growing is
//! reported again each time it moves by the ratio once more.
//!
//! Counts are judged every fifth of a window, not at every request, and
//! in the order requests started: each waits until it started
//! `drift_hold_s` before the latest end seen for its key (ordered by end,
//! long answers come last, and a tenant that stops sending would look as if
//! its outputs grew). At most [`MAX_HELD`] wait per key.

use std::{
    cmp::Reverse,
    collections::{BinaryHeap, HashMap, VecDeque},
};

/// (t0, input tokens, output tokens) of a request waiting to be judged.
type Held = (u64, Option<u64>, Option<u64>);

/// Requests waiting for their turn, per key, at most (the oldest goes
/// through early beyond this).
const MAX_HELD: usize = 4096;

use super::{kind, round4, Config, Event};
use crate::{
    record::Finished,
    stage::events::{Detector, RecordCx},
    vocab::Subject,
};

#[derive(Default)]
struct Series {
    baseline: Vec<u32>,
    /// Sorted once the baseline is full.
    sorted: bool,
    recent: VecDeque<u32>,
    since_check: u32,
}

/// What a comparison found.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shift {
    pub base_p50: u32,
    pub base_p95: u32,
    pub win_p50: u32,
    pub win_p95: u32,
    pub ks: f64,
}

impl Shift {
    fn ratio(a: u32, b: u32) -> f64 {
        (a as f64 + 1.0) / (b as f64 + 1.0)
    }
    pub fn p50_ratio(&self) -> f64 {
        Self::ratio(self.win_p50, self.base_p50)
    }
    pub fn p95_ratio(&self) -> f64 {
        Self::ratio(self.win_p95, self.base_p95)
    }
    /// The larger move of the two percentiles, as a factor ≥ 1.
    pub fn moved(&self) -> f64 {
        let f = |r: f64| r.max(1.0 / r);
        f(self.p50_ratio()).max(f(self.p95_ratio()))
    }
}

/// Nearest-rank percentile of sorted `v` (non-empty).
fn pct(v: &[u32], q: f64) -> u32 {
    let rank = ((v.len() as f64) * q).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

/// The two-sample Kolmogorov–Smirnov statistic of sorted `a` and `b`: the
/// largest gap between their empirical distribution functions (0–1).
pub fn ks_distance(a: &[u32], b: &[u32]) -> f64 {
    if a.is_empty() || b.is_empty() {
        return 0.0;
    }
    let (mut i, mut j, mut d) = (0usize, 0usize, 0f64);
    while i < a.len() && j < b.len() {
        let x = a[i].min(b[j]);
        while i < a.len() && a[i] == x {
            i += 1;
        }
        while j < b.len() && b[j] == x {
            j += 1;
        }
        let gap = (i as f64 / a.len() as f64 - j as f64 / b.len() as f64).abs();
        d = d.max(gap);
    }
    d
}

impl Series {
    /// Adds a count; returns the shift when a comparison is due.
    fn push(&mut self, x: u32, cfg: &Config) -> Option<Shift> {
        let base_n = cfg.drift_baseline_requests as usize;
        let win_n = cfg.drift_window_requests as usize;
        if self.baseline.len() < base_n {
            self.baseline.push(x);
            return None;
        }
        if !self.sorted {
            self.baseline.sort_unstable();
            self.sorted = true;
        }
        if self.recent.len() == win_n {
            self.recent.pop_front();
        }
        self.recent.push_back(x);
        self.since_check += 1;
        if self.recent.len() < win_n || self.since_check < (win_n as u32 / 5).max(1) {
            return None;
        }
        self.since_check = 0;
        let mut r: Vec<u32> = self.recent.iter().copied().collect();
        r.sort_unstable();
        Some(Shift {
            base_p50: pct(&self.baseline, 0.5),
            base_p95: pct(&self.baseline, 0.95),
            win_p50: pct(&r, 0.5),
            win_p95: pct(&r, 0.95),
            ks: ks_distance(&self.baseline, &r),
        })
    }
}

struct Key {
    subject: Subject,
    name: String,
    model_version: Option<String>,
    request_type: Option<String>,
    input: Series,
    output: Series,
    /// Requests waiting to be judged in t0 order.
    held: BinaryHeap<Reverse<Held>>,
}

pub struct Drift {
    cfg: Config,
    keys: HashMap<(String, Option<String>, Option<String>), Key>,
    pub untracked: u64,
}

impl Detector for Drift {
    fn kinds(&self) -> &'static [&'static str] {
        &[kind::TOKENS_DRIFT]
    }

    fn record(&mut self, f: &Finished, cx: &RecordCx<'_>, out: &mut Vec<Event>) {
        self.on_record(f, cx, out);
    }
}

impl Drift {
    pub fn new(cfg: &Config) -> Self {
        Self {
            cfg: cfg.clone(),
            keys: HashMap::new(),
            untracked: 0,
        }
    }

    fn on_record(&mut self, f: &Finished, cx: &RecordCx<'_>, out: &mut Vec<Event>) {
        if f.error_type.is_some() || !cx.named {
            // A failed request's sizes say nothing about the traffic;
            // callers beyond the named ones are not judged.
            return;
        }
        let Some((subject, name)) = cx.subject else {
            return;
        };
        let t = cx.end_ns;
        let k = (
            format!("{}={name}", subject.attr()),
            f.model_version.clone(),
            f.request_type.clone(),
        );
        if !self.keys.contains_key(&k) {
            if self.keys.len() >= self.cfg.max_callers {
                self.untracked += 1;
                return;
            }
            self.keys.insert(
                k.clone(),
                Key {
                    subject,
                    name: name.to_string(),
                    model_version: f.model_version.clone(),
                    request_type: f.request_type.clone(),
                    input: Series::default(),
                    output: Series::default(),
                    held: BinaryHeap::new(),
                },
            );
        }
        let key = self.keys.get_mut(&k).expect("inserted above");
        let cfg = &self.cfg;
        key.held
            .push(Reverse((f.t0_ns, f.input_tokens, f.output_tokens)));
        let horizon = t.saturating_sub((cfg.drift_hold_s * 1e9) as u64);
        let mut ready = Vec::new();
        while let Some(Reverse((t0, i, o))) = key.held.peek().copied() {
            if t0 > horizon && key.held.len() <= MAX_HELD {
                break;
            }
            key.held.pop();
            ready.push((i, o));
        }
        for (which, v) in ready
            .into_iter()
            .flat_map(|(i, o)| [("input", i), ("output", o)])
        {
            let Some(v) = v else { continue };
            let series = if which == "input" {
                &mut key.input
            } else {
                &mut key.output
            };
            let Some(s) = series.push(v.min(u32::MAX as u64) as u32, cfg) else {
                continue;
            };
            if s.moved() < cfg.drift_ratio || s.ks < cfg.drift_distance {
                continue;
            }
            let base_n = series.baseline.len();
            let win_n = series.recent.len();
            *series = Series::default();
            let up = s.p50_ratio().max(s.p95_ratio()) >= cfg.drift_ratio;
            let who = key.subject.who(&key.name);
            out.push(
                Event::new(
                    t,
                    kind::TOKENS_DRIFT,
                    format!(
                        "{who} ({}, version {}): {which} tokens p50 {} → {} (×{:.2}), p95 {} → {} (×{:.2}); KS distance {:.2}, last {win_n} requests vs a baseline of {base_n}",
                        key.request_type.as_deref().unwrap_or("?"),
                        key.model_version.as_deref().unwrap_or("?"),
                        s.base_p50,
                        s.win_p50,
                        s.p50_ratio(),
                        s.base_p95,
                        s.win_p95,
                        s.p95_ratio(),
                        s.ks
                    ),
                )
                .with(key.subject.attr(), key.name.as_str())
                .with("tokentap.model.version", key.model_version.clone())
                .with("tokentap.request.type", key.request_type.clone())
                .with("gen_ai.provider.name", f.provider.clone())
                .with(
                    "gen_ai.request.model",
                    f.response_model.clone().or_else(|| f.request_model.clone()),
                )
                .with("gen_ai.token.type", which)
                .with("direction", if up { "up" } else { "down" })
                .with("baseline_p50", s.base_p50)
                .with("baseline_p95", s.base_p95)
                .with("window_p50", s.win_p50)
                .with("window_p95", s.win_p95)
                .with("p50_ratio", round4(s.p50_ratio()))
                .with("p95_ratio", round4(s.p95_ratio()))
                .with("ks_distance", round4(s.ks))
                .with("baseline_requests", base_n as u64)
                .with("window_requests", win_n as u64),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ks_of_equal_samples_is_zero_and_of_disjoint_ones_is_one() {
        let a = [1, 2, 3, 4, 5];
        assert_eq!(ks_distance(&a, &a), 0.0);
        assert_eq!(ks_distance(&a, &[10, 11, 12]), 1.0);
        // Half of b lies below a.
        let d = ks_distance(&[10, 20], &[5, 30]);
        assert!((d - 0.5).abs() < 1e-9, "{d}");
    }
}
