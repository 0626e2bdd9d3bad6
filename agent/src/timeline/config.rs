//! The detectors' thresholds: the `[events]` table of the config file
//! (`tokentap run --config FILE`). Every key is optional; an unknown key or
//! a value out of range stops the agent at start, naming it.

use anyhow::{bail, Context, Result};
use serde::Deserialize;

/// The config file's table name.
pub const CONFIG_KEY: &str = "events";

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Length of the callers' detection window, seconds (surge, error
    /// bursts, retry storms are judged once per window per caller).
    pub window_s: f64,
    /// Windows closed after the window ends, seconds, so that records the
    /// GPU join holds back (up to one GPU interval) still count in it.
    pub grace_s: f64,
    /// Windows of a caller's own traffic (idle ones included) before its
    /// rate is judged against its baseline.
    pub warmup_windows: u32,
    /// Weight of the latest window in the caller's baseline rate
    /// (exponential moving average; 0.1 ≈ the last ten windows).
    pub baseline_alpha: f64,
    /// `caller.surge`: a window with at least `surge_factor` × the
    /// baseline's requests …
    pub surge_factor: f64,
    /// … and at least this many requests.
    pub surge_min_requests: u32,
    /// `caller.error_burst`: at least this many errors of one kind in a
    /// window …
    pub error_burst_min: u32,
    /// … making up at least this fraction of the caller's requests in it.
    pub error_burst_fraction: f64,
    /// `caller.retry_storm`: at least this many repeated requests (a body
    /// seen before in the same window) in a window that follows errors or
    /// disconnects (in it or in the one before).
    pub retry_storm_min: u32,
    /// … that make up at least this fraction of its requests in the window
    /// (clients that retry the odd failure are not a storm).
    pub retry_storm_fraction: f64,
    /// `tokens.drift`: requests that make a key's baseline distribution
    /// (per tenant or caller, model version, request type).
    pub drift_baseline_requests: u32,
    /// Latest requests compared with the baseline.
    pub drift_window_requests: u32,
    /// A percentile (p50 or p95) that moved by at least this factor, up or
    /// down …
    pub drift_ratio: f64,
    /// … and a Kolmogorov–Smirnov distance (0–1) of at least this much
    /// between the two distributions.
    pub drift_distance: f64,
    /// Requests reach the drift comparison in the order they started, once
    /// they started this long before the latest one ended (seconds). In
    /// the order they end, long answers would come last — a tenant that
    /// stops sending would look as if its outputs had grown.
    pub drift_hold_s: f64,
    /// `model_version.rollback`: a replaced version that comes back after
    /// serving nothing for at least this long (a version still serving
    /// beside its successor — a canary — is not a rollback).
    pub rollback_idle_s: f64,
    /// `gpu.throttle.start/stop`: consecutive GPU samples with (without) a
    /// throttle reason before the event.
    pub gpu_throttle_samples: u32,
    /// `gpu.memory.high`: used / total memory of a GPU at or above this.
    pub gpu_memory_high: f64,
    /// Callers, and separately drift keys, tracked at most (each caller
    /// holds a few hundred bytes, each drift key ~2 kB); later ones are not
    /// judged (the first caller over the limit is said once on stderr).
    pub max_callers: usize,
    /// Tenants (and separately callers) that get events of their own: the
    /// first this many seen, as the metrics' `--max-tenants` cap names
    /// them (set from `--max-tenants`, not a key of the table). Callers
    /// beyond them are summed up in one `caller.new` per window and are
    /// not judged for surges, error bursts or retry storms.
    #[serde(skip)]
    pub named_callers: usize,
    /// The events log's ceiling: events per minute at most (of their own
    /// clock); beyond it events are folded — counted by kind in one
    /// `events.folded` event when the minute ends, and in
    /// `tokentap.events.folded`.
    pub max_events_per_minute: u32,
    /// `latency.shift`, `errors.shift`, `tokens.shift`: length of a
    /// served model's window, seconds (its own, not `window_s`).
    pub shift_window_s: f64,
    /// Requests a window needs to be judged (or be a baseline).
    pub shift_min_requests: u32,
    /// A latency's or token count's p50 or p95 that moved by at least this
    /// factor, up or down (and by its floor: 5 ms for TTFT and duration,
    /// 1 ms for TPOT, 8 tokens) …
    pub shift_ratio: f64,
    /// … in this many consecutive windows is a shift (said once; over
    /// when as many windows are back within half the threshold).
    pub shift_hold_windows: u32,
    /// Normal windows pooled into the baseline (and windows at a new
    /// level before it becomes the baseline).
    pub shift_baseline_windows: u32,
    /// An error class's rate at least this far above the baseline's
    /// (and twice it) …
    pub shift_error_rate: f64,
    /// … with at least this many errors in the window.
    pub shift_error_min: u32,
    /// A change (model version, engine version/config/image, restart) or
    /// traffic/resource event up to this long before a shift's first
    /// window is one of its causes, seconds.
    pub shift_lookback_s: f64,
    /// `change.impact`: windows served after a change before its verdict.
    pub impact_windows: u32,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            window_s: 60.0,
            grace_s: 2.0,
            warmup_windows: 5,
            baseline_alpha: 0.1,
            surge_factor: 3.0,
            surge_min_requests: 20,
            error_burst_min: 5,
            error_burst_fraction: 0.2,
            retry_storm_min: 10,
            retry_storm_fraction: 0.3,
            drift_baseline_requests: 200,
            drift_window_requests: 50,
            drift_ratio: 1.5,
            drift_distance: 0.5,
            drift_hold_s: 60.0,
            rollback_idle_s: 30.0,
            gpu_throttle_samples: 3,
            gpu_memory_high: 0.95,
            max_callers: 10_000,
            named_callers: 100,
            max_events_per_minute: 120,
            shift_window_s: 60.0,
            shift_min_requests: 30,
            shift_ratio: 1.5,
            shift_hold_windows: 2,
            shift_baseline_windows: 10,
            shift_error_rate: 0.05,
            shift_error_min: 5,
            shift_lookback_s: 600.0,
            impact_windows: 3,
        }
    }
}

impl Config {
    /// The `[events]` table of a config file's text (defaults without
    /// one; the agent reads its file once, `pipeline::config::ConfigFile`,
    /// and hands [`Config::from_value`] the table).
    pub fn parse(text: &str) -> Result<Self> {
        let mut table: toml::Table = toml::from_str(text).context("not valid TOML")?;
        Self::from_value(table.remove(CONFIG_KEY))
    }

    /// The config file's `[events]` value (defaults without one).
    pub fn from_value(v: Option<toml::Value>) -> Result<Self> {
        let Some(v) = v else {
            return Ok(Self::default());
        };
        let cfg: Config = v
            .try_into()
            .map_err(|e| anyhow::anyhow!("[{CONFIG_KEY}]: {e}"))?;
        cfg.check()?;
        Ok(cfg)
    }

    pub fn check(&self) -> Result<()> {
        let positive = [
            ("window_s", self.window_s),
            ("surge_factor", self.surge_factor),
            ("drift_ratio", self.drift_ratio),
        ];
        for (k, v) in positive {
            if !(v.is_finite() && v > 0.0) {
                bail!("[{CONFIG_KEY}] {k} = {v}: must be a number above 0");
            }
        }
        if !(self.grace_s.is_finite() && self.grace_s >= 0.0) {
            bail!(
                "[{CONFIG_KEY}] grace_s = {}: must be 0 or more",
                self.grace_s
            );
        }
        if !(self.drift_hold_s.is_finite() && self.drift_hold_s >= 0.0) {
            bail!(
                "[{CONFIG_KEY}] drift_hold_s = {}: must be 0 or more",
                self.drift_hold_s
            );
        }
        if !(self.rollback_idle_s.is_finite() && self.rollback_idle_s >= 0.0) {
            bail!(
                "[{CONFIG_KEY}] rollback_idle_s = {}: must be 0 or more",
                self.rollback_idle_s
            );
        }
        let fractions = [
            ("baseline_alpha", self.baseline_alpha),
            ("error_burst_fraction", self.error_burst_fraction),
            ("retry_storm_fraction", self.retry_storm_fraction),
            ("drift_distance", self.drift_distance),
            ("gpu_memory_high", self.gpu_memory_high),
        ];
        for (k, v) in fractions {
            if !(v > 0.0 && v <= 1.0) {
                bail!("[{CONFIG_KEY}] {k} = {v}: must be above 0 and at most 1");
            }
        }
        if self.surge_factor <= 1.0 {
            bail!(
                "[{CONFIG_KEY}] surge_factor = {}: must be above 1 (a multiple of the baseline)",
                self.surge_factor
            );
        }
        if self.drift_ratio <= 1.0 {
            bail!(
                "[{CONFIG_KEY}] drift_ratio = {}: must be above 1 (a factor up or down)",
                self.drift_ratio
            );
        }
        let counts = [
            ("surge_min_requests", self.surge_min_requests),
            ("error_burst_min", self.error_burst_min),
            ("retry_storm_min", self.retry_storm_min),
            ("drift_baseline_requests", self.drift_baseline_requests),
            ("drift_window_requests", self.drift_window_requests),
            ("gpu_throttle_samples", self.gpu_throttle_samples),
            ("max_events_per_minute", self.max_events_per_minute),
        ];
        for (k, v) in counts {
            if v == 0 {
                bail!("[{CONFIG_KEY}] {k} = 0: must be at least 1");
            }
        }
        if self.max_callers == 0 {
            bail!("[{CONFIG_KEY}] max_callers = 0: must be at least 1");
        }
        if !(self.shift_window_s.is_finite() && self.shift_window_s > 0.0) {
            bail!(
                "[{CONFIG_KEY}] shift_window_s = {}: must be a number above 0",
                self.shift_window_s
            );
        }
        if !(self.shift_ratio.is_finite() && self.shift_ratio > 1.0) {
            bail!(
                "[{CONFIG_KEY}] shift_ratio = {}: must be above 1 (a factor up or down)",
                self.shift_ratio
            );
        }
        if !(self.shift_error_rate > 0.0 && self.shift_error_rate <= 1.0) {
            bail!(
                "[{CONFIG_KEY}] shift_error_rate = {}: must be above 0 and at most 1",
                self.shift_error_rate
            );
        }
        if !(self.shift_lookback_s.is_finite() && self.shift_lookback_s >= 0.0) {
            bail!(
                "[{CONFIG_KEY}] shift_lookback_s = {}: must be 0 or more",
                self.shift_lookback_s
            );
        }
        for (k, v) in [
            ("shift_min_requests", self.shift_min_requests),
            ("shift_hold_windows", self.shift_hold_windows),
            ("shift_error_min", self.shift_error_min),
            ("impact_windows", self.impact_windows),
        ] {
            if v == 0 {
                bail!("[{CONFIG_KEY}] {k} = 0: must be at least 1");
            }
        }
        if self.shift_baseline_windows < 2 {
            bail!(
                "[{CONFIG_KEY}] shift_baseline_windows = {}: must be at least 2",
                self.shift_baseline_windows
            );
        }
        Ok(())
    }

    /// The shift detector's thresholds.
    pub fn shift_settings(&self) -> super::shifts::Settings {
        super::shifts::Settings {
            window_s: self.shift_window_s,
            min_requests: self.shift_min_requests,
            ratio: self.shift_ratio,
            hold_windows: self.shift_hold_windows,
            baseline_windows: self.shift_baseline_windows,
            error_rate: self.shift_error_rate,
            error_min: self.shift_error_min,
        }
    }

    pub(crate) fn window_ns(&self) -> u64 {
        (self.window_s * 1e9) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_without_a_table_and_overrides_with_one() {
        assert_eq!(
            Config::parse("no-console = true\n").unwrap(),
            Config::default()
        );
        let c = Config::parse("[events]\nwindow_s = 2\nsurge_factor = 4.5\n").unwrap();
        assert_eq!(c.window_s, 2.0);
        assert_eq!(c.surge_factor, 4.5);
        assert_eq!(c.error_burst_min, Config::default().error_burst_min);
    }

    #[test]
    fn unknown_keys_and_bad_values_are_refused_by_name() {
        let e = Config::parse("[events]\nwindow = 2\n").unwrap_err();
        assert!(format!("{e:#}").contains("unknown field `window`"), "{e:#}");
        let e = Config::parse("[events]\nsurge_factor = 0.5\n").unwrap_err();
        assert!(format!("{e:#}").contains("surge_factor = 0.5"), "{e:#}");
        let e = Config::parse("[events]\nerror_burst_fraction = 2\n").unwrap_err();
        assert!(format!("{e:#}").contains("error_burst_fraction"), "{e:#}");
        let e = Config::parse("[events]\nretry_storm_min = 0\n").unwrap_err();
        assert!(format!("{e:#}").contains("retry_storm_min = 0"), "{e:#}");
        let e = Config::parse("[events]\nwindow_s = \"1m\"\n").unwrap_err();
        assert!(format!("{e:#}").contains("window_s"), "{e:#}");
        let e = Config::parse("[events]\nshift_ratio = 1\n").unwrap_err();
        assert!(format!("{e:#}").contains("shift_ratio = 1"), "{e:#}");
        let e = Config::parse("[events]\nshift_baseline_windows = 1\n").unwrap_err();
        assert!(format!("{e:#}").contains("shift_baseline_windows"), "{e:#}");
        let e = Config::parse("[events]\nimpact_windows = 0\n").unwrap_err();
        assert!(format!("{e:#}").contains("impact_windows = 0"), "{e:#}");
    }
}
