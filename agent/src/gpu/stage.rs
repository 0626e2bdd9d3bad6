//! The GPU stage of the pipeline: finished records of engines that run on
//! GPUs wait here for the next GPU sample (at most a sampling interval, or
//! [`MAX_HOLD`] if samples stop), which closes the interval their end falls
//! in; then they get `gpu_uuids`, `gpu_util_avg`, `gpu_mem_used_bytes` and
//! `energy_j` and go on to the sinks. Records of engines without a GPU pass
//! straight through.
//!
//! Owns: the sample history, the engine ↔ GPU map, per-request energy
//! accumulation, idle energy and energy per token (read by the metrics
//! sink through [`GpuView`]). Must not: do I/O (samples and the process
//! snapshot come from the GPU task).

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use super::{
    join::{attribute, engine_gpus, EnergySource, EngineGpus, History, ProcSnapshot, Progress},
    types::GpuSample,
};
use crate::record::{Finished, InFlight};

/// Longest a record waits for a GPU sample (samples stopped: NVML lost).
pub const MAX_HOLD_NS: u64 = 10_000_000_000;
pub const MAX_HOLD: std::time::Duration = std::time::Duration::from_nanos(MAX_HOLD_NS);
/// Records held at most (beyond, the oldest are released unjoined).
pub const MAX_HELD: usize = 100_000;

/// What the metrics sink exports about GPUs and engines, updated at every
/// sample.
#[derive(Clone, Debug, Default)]
pub struct GpuView {
    pub latest: Option<GpuSample>,
    /// Engine pid → its GPUs.
    pub engines: HashMap<u32, EngineGpus>,
    /// Idle energy per device UUID since start, joules (a counter).
    pub idle_energy_j: HashMap<String, f64>,
    /// Per engine pid: (output tokens, joules) of its requests since the
    /// metrics were last collected (the collector's callback takes and
    /// resets it, so energy per token is over the export interval).
    pub energy_since_collect: HashMap<u32, (f64, f64)>,
}

pub type SharedView = Arc<Mutex<GpuView>>;

pub struct GpuStage {
    history: History,
    engines: HashMap<u32, EngineGpus>,
    /// Tokens of each request already attributed to earlier intervals.
    counted: HashMap<u64, f64>,
    /// Energy accumulated per request id while in flight.
    energy: HashMap<u64, (f64, EnergySource)>,
    held: Vec<Finished>,
    view: SharedView,
}

/// Output tokens a finished request is weighed by: content events written
/// (streams; an event is roughly a token), else the reported output tokens.
fn tokens_of(f: &Finished) -> u64 {
    if f.record.stream {
        f.content_events
    } else {
        f.record.output_tokens.unwrap_or(0)
    }
}

fn end_ns(f: &Finished) -> u64 {
    f.record.t0_ns + (f.record.duration_s.unwrap_or(0.0) * 1e9) as u64
}

fn overlap(a: u64, b: u64, from: u64, to: u64) -> f64 {
    b.min(to).saturating_sub(a.max(from)) as f64
}

impl GpuStage {
    pub fn new(view: SharedView) -> Self {
        Self {
            history: History::new(3600),
            engines: HashMap::new(),
            counted: HashMap::new(),
            energy: HashMap::new(),
            held: Vec::new(),
            view,
        }
    }

    /// A finished record: held when its engine has GPUs (returns None),
    /// else returned as it is.
    pub fn on_finished(&mut self, f: Finished, out: &mut Vec<Finished>) {
        if !self.engines.contains_key(&f.record.pid) {
            self.counted.remove(&f.seq);
            if let Some((j, src)) = self.energy.remove(&f.seq) {
                // Its engine lost its GPUs after the request began.
                let mut f = f;
                f.record.energy_j = Some(j);
                f.record.energy_source = Some(src.as_str().into());
                out.push(f);
                return;
            }
            out.push(f);
            return;
        }
        if self.held.len() >= MAX_HELD {
            let old = self.held.remove(0);
            out.push(self.complete(old));
        }
        self.held.push(f);
    }

    /// A new sample closes the interval since the previous one: split its
    /// energy, refresh the engine ↔ GPU map, release the held records that
    /// ended inside it. `engines`: the pids that serve requests (targets);
    /// `in_flight`: the decoder's requests in flight now.
    pub fn on_sample(
        &mut self,
        sample: GpuSample,
        snap: &ProcSnapshot,
        engines: &[u32],
        in_flight: &[InFlight],
        out: &mut Vec<Finished>,
    ) {
        let map = engine_gpus(engines, &sample, snap);
        let mut energy_last = HashMap::new();
        let mut idle = HashMap::new();
        if let Some(prev) = self.history.latest() {
            let (from, to) = (prev.ts_ns, sample.ts_ns);
            // Progress in (from, to] of every request of a GPU engine: those
            // still in flight and those finished (held) since `from`.
            let mut progress: HashMap<u32, Vec<(u64, Progress)>> = HashMap::new();
            for x in in_flight {
                let total = x.content_events as f64;
                let seen = self.counted.insert(x.seq, total).unwrap_or(0.0);
                progress.entry(x.pid).or_default().push((
                    x.seq,
                    Progress {
                        tokens: (total - seen).max(0.0),
                        in_flight_ns: overlap(x.t0_ns, to, from, to),
                    },
                ));
            }
            for f in &self.held {
                let end = end_ns(f);
                let seen = self.counted.get(&f.seq).copied().unwrap_or(0.0);
                let left = (tokens_of(f) as f64 - seen).max(0.0);
                // Ended after this sample was taken (decoded before it
                // arrived): the part of its remaining tokens that falls in
                // this interval, by time; the rest goes to the next one.
                let tokens = if end > to {
                    let start = f.record.t0_ns.max(from);
                    let share = if end > start {
                        overlap(start, end, from, to) / (end - start) as f64
                    } else {
                        0.0
                    };
                    left * share
                } else {
                    left
                };
                self.counted.insert(f.seq, seen + tokens);
                progress.entry(f.record.pid).or_default().push((
                    f.seq,
                    Progress {
                        tokens,
                        in_flight_ns: overlap(f.record.t0_ns, end, from, to),
                    },
                ));
            }
            // The map as it was during the interval (the previous sample's),
            // plus engines that appeared now (a worker mid-request).
            let mut during = self.engines.clone();
            for (e, g) in &map {
                during.entry(*e).or_insert_with(|| g.clone());
            }
            let split = attribute(prev, &sample, &during, &progress);
            for (id, (j, src)) in split.requests {
                let slot = self.energy.entry(id).or_insert((0.0, src));
                slot.0 += j;
                if src == EnergySource::Power {
                    slot.1 = EnergySource::Power;
                }
            }
            energy_last = split.per_engine;
            idle = split.idle;
        }
        let to = sample.ts_ns;
        self.engines = map;
        self.history.push(sample.clone());
        // Release what ended by this sample.
        let mut keep = Vec::with_capacity(self.held.len());
        for f in std::mem::take(&mut self.held) {
            if end_ns(&f) <= to {
                let done = self.complete(f);
                out.push(done);
            } else {
                keep.push(f);
            }
        }
        self.held = keep;
        // Forget counts of requests that are no longer in flight nor held.
        let live: std::collections::HashSet<u64> = in_flight
            .iter()
            .map(|x| x.seq)
            .chain(self.held.iter().map(|f| f.seq))
            .collect();
        self.counted.retain(|k, _| live.contains(k));
        self.energy.retain(|k, _| live.contains(k));
        let mut v = self.view.lock().unwrap_or_else(|p| p.into_inner());
        v.latest = Some(sample);
        v.engines = self.engines.clone();
        for (uuid, j) in idle {
            *v.idle_energy_j.entry(uuid).or_default() += j;
        }
        for (pid, (tokens, joules)) in energy_last {
            let e = v.energy_since_collect.entry(pid).or_default();
            e.0 += tokens;
            e.1 += joules;
        }
    }

    /// Releases records held longer than [`MAX_HOLD`] (no sample came).
    pub fn expire(&mut self, now_ns: u64, out: &mut Vec<Finished>) {
        if self.held.is_empty() {
            return;
        }
        let mut keep = Vec::with_capacity(self.held.len());
        for f in std::mem::take(&mut self.held) {
            if now_ns.saturating_sub(end_ns(&f)) > MAX_HOLD_NS {
                out.push(self.complete(f));
            } else {
                keep.push(f);
            }
        }
        self.held = keep;
    }

    /// NVML stopped answering: release what is held (with what is known
    /// up to the last sample) and forget the engine ↔ GPU map, so later
    /// records pass through without stale GPU fields. The history stays:
    /// samples that come back continue it.
    pub fn unavailable(&mut self, out: &mut Vec<Finished>) {
        if self.engines.is_empty() && self.held.is_empty() {
            return;
        }
        // Records that started by the last sample ran on the GPUs that
        // sample mapped (and were given their share of its energy): joined
        // with the map as it was. Later ones started after NVML was last
        // heard from: no GPU to join.
        let last = self.history.latest().map_or(0, |s| s.ts_ns);
        let (known, after): (Vec<_>, Vec<_>) = std::mem::take(&mut self.held)
            .into_iter()
            .partition(|f| f.record.t0_ns <= last);
        for f in known {
            out.push(self.complete(f));
        }
        self.engines.clear();
        for f in after {
            out.push(self.complete(f));
        }
        self.counted.clear();
        self.energy.clear();
        let mut v = self.view.lock().unwrap_or_else(|p| p.into_inner());
        v.engines.clear();
        v.latest = None;
        v.energy_since_collect.clear();
    }

    /// Everything held, at shutdown.
    pub fn flush(&mut self, out: &mut Vec<Finished>) {
        for f in std::mem::take(&mut self.held) {
            out.push(self.complete(f));
        }
    }

    /// Fills the GPU fields of a record whose interval is closed (or that
    /// cannot wait longer).
    fn complete(&mut self, mut f: Finished) -> Finished {
        let end = end_ns(&f);
        self.counted.remove(&f.seq);
        let energy = self.energy.remove(&f.seq);
        let r = &mut f.record;
        if let Some(g) = self.engines.get(&r.pid) {
            r.gpu_util_avg = self.history.util_avg(&g.uuids, r.t0_ns, end);
            r.gpu_mem_used_bytes = g.memory_used_bytes();
            r.gpu_uuids = Some(g.uuids.clone());
        }
        if let Some((j, src)) = energy {
            r.energy_j = Some(j);
            r.energy_source = Some(src.as_str().into());
        }
        f
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::types::{DeviceSample, GpuProcess};
    use crate::record::RequestRecord;

    const S: u64 = 1_000_000_000;

    fn sample(t_s: u64, energy_mj: u64, util: f64, pids: &[u32]) -> GpuSample {
        GpuSample {
            ts_ns: t_s * S,
            devices: vec![DeviceSample {
                uuid: "GPU-0".into(),
                util_gpu: Some(util),
                energy_total_mj: Some(energy_mj),
                processes: pids
                    .iter()
                    .map(|&pid| GpuProcess {
                        pid,
                        used_bytes: Some(1 << 30),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }],
        }
    }

    fn finished(seq: u64, pid: u32, t0_s: f64, dur_s: f64, events: u64) -> Finished {
        Finished {
            record: RequestRecord {
                pid,
                method: "POST".into(),
                path: "/v1/chat/completions".into(),
                status: Some(200),
                operation: Some(crate::vocab::Operation::Chat),
                stream: true,
                duration_s: Some(dur_s),
                chunks: Some(events),
                output_tokens: Some(events),
                t0_ns: (t0_s * 1e9) as u64,
                ..Default::default()
            },
            seq,
            content_events: events,
            self_request: false,
            chunk_gaps_s: vec![],
            prompt_fp: None,
            text: None,
        }
    }

    fn in_flight(seq: u64, pid: u32, t0_s: f64, events: u64) -> InFlight {
        InFlight {
            seq,
            pid,
            t0_ns: (t0_s * 1e9) as u64,
            content_events: events,
        }
    }

    #[test]
    fn energy_is_conserved_across_overlapping_requests_and_idle_intervals() {
        let view = SharedView::default();
        let mut st = GpuStage::new(view.clone());
        let snap = ProcSnapshot::default();
        let mut out = vec![];
        // t=0: engine 7 on GPU-0; nothing in flight.
        st.on_sample(sample(0, 0, 0.0, &[7]), &snap, &[7], &[], &mut out);
        // (0, 1]: 100 J, nothing in flight → idle.
        st.on_sample(sample(1, 100_000, 0.0, &[7]), &snap, &[7], &[], &mut out);
        // (1, 2]: 300 J; request 1 wrote 10 events, request 2 wrote 20.
        let fl = [in_flight(1, 7, 1.2, 10), in_flight(2, 7, 1.5, 20)];
        st.on_sample(sample(2, 400_000, 0.5, &[7]), &snap, &[7], &fl, &mut out);
        // Request 1 ends at 2.5 s with 30 events (20 more); request 2 still
        // in flight with 20 (none more).
        st.on_finished(finished(1, 7, 1.2, 1.3, 30), &mut out);
        assert!(out.is_empty(), "held until the sample after its end");
        // (2, 3]: 200 J, all to request 1 (the only one with tokens).
        let fl = [in_flight(2, 7, 1.5, 20)];
        st.on_sample(sample(3, 600_000, 1.0, &[7]), &snap, &[7], &fl, &mut out);
        assert_eq!(out.len(), 1);
        let r = &out[0].record;
        assert!(
            (r.energy_j.unwrap() - (100.0 + 200.0)).abs() < 1e-6,
            "{r:?}"
        );
        assert_eq!(r.energy_source.as_deref(), Some("counter"));
        assert_eq!(r.gpu_uuids.as_deref(), Some(&["GPU-0".to_string()][..]));
        assert_eq!(r.gpu_mem_used_bytes, Some(1 << 30));
        // [1.2, 2.5]: 0.8 s at 0.5, 0.5 s at 1.0.
        let u = r.gpu_util_avg.unwrap();
        assert!((u - (0.8 * 0.5 + 0.5 * 1.0) / 1.3).abs() < 1e-6, "{u}");
        let v = view.lock().unwrap();
        assert_eq!(v.idle_energy_j["GPU-0"], 100.0);
        // (1, 2]: 30 tokens, 300 J; (2, 3]: 20 tokens, 200 J.
        assert_eq!(v.energy_since_collect[&7], (50.0, 500.0));
    }

    #[test]
    fn records_of_engines_without_gpus_pass_straight_through() {
        let mut st = GpuStage::new(SharedView::default());
        let mut out = vec![];
        st.on_sample(
            sample(0, 0, 0.0, &[99]),
            &ProcSnapshot::default(),
            &[7],
            &[],
            &mut out,
        );
        st.on_finished(finished(1, 7, 0.0, 0.5, 3), &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].record.gpu_uuids, None);
        assert_eq!(out[0].record.energy_j, None);
    }

    #[test]
    fn a_worker_appearing_mid_request_gets_the_interval_it_appeared_in() {
        let mut st = GpuStage::new(SharedView::default());
        let snap = ProcSnapshot {
            ancestors: [(70, vec![7, 1])].into(),
            ..Default::default()
        };
        let mut out = vec![];
        // The engine's worker (70, child of 7) is not on the GPU yet.
        st.on_sample(sample(0, 0, 0.0, &[]), &snap, &[7], &[], &mut out);
        // It is at t=1; request 5 wrote 4 events in (0, 1].
        let fl = [in_flight(5, 7, 0.1, 4)];
        st.on_sample(sample(1, 50_000, 0.9, &[70]), &snap, &[7], &fl, &mut out);
        st.on_finished(finished(5, 7, 0.1, 0.95, 4), &mut out);
        assert!(out.is_empty());
        st.on_sample(sample(2, 60_000, 0.9, &[70]), &snap, &[7], &[], &mut out);
        assert_eq!(out.len(), 1);
        // (0, 1]: 50 J by its 4 events; (1, 2]: it was the only request in
        // flight (until 1.05 s, no new events): the interval's 10 J by time
        // in flight. Sampling granularity: an interval is not split into
        // busy and idle parts.
        assert!((out[0].record.energy_j.unwrap() - 60.0).abs() < 1e-9);
    }

    #[test]
    fn a_record_that_ended_after_the_sample_was_taken_waits_for_the_next_one() {
        let mut st = GpuStage::new(SharedView::default());
        let snap = ProcSnapshot::default();
        let mut out = vec![];
        st.on_sample(sample(0, 0, 0.0, &[7]), &snap, &[7], &[], &mut out);
        // Ends at 1.5 s with 10 events, evenly over [0.5, 1.5]: decoded
        // before the t=1 sample arrived.
        st.on_finished(finished(1, 7, 0.5, 1.0, 10), &mut out);
        st.on_sample(sample(1, 10_000, 0.0, &[7]), &snap, &[7], &[], &mut out);
        assert!(out.is_empty(), "its end is in the next interval");
        st.on_sample(sample(2, 30_000, 0.0, &[7]), &snap, &[7], &[], &mut out);
        assert_eq!(out.len(), 1);
        // Both intervals' energy (10 J + 20 J) went to it: it was alone.
        assert!((out[0].record.energy_j.unwrap() - 30.0).abs() < 1e-9);
    }

    #[test]
    fn when_nvml_goes_away_held_records_are_released_and_later_ones_pass_through() {
        let mut st = GpuStage::new(SharedView::default());
        let snap = ProcSnapshot::default();
        let mut out = vec![];
        st.on_sample(sample(0, 0, 0.5, &[7]), &snap, &[7], &[], &mut out);
        st.on_sample(sample(1, 0, 0.5, &[7]), &snap, &[7], &[], &mut out);
        // In flight at the last sample (t=1) and ended after it: held;
        // then one that started after it; then NVML goes away.
        st.on_finished(finished(1, 7, 0.5, 0.9, 3), &mut out);
        st.on_finished(finished(2, 7, 1.2, 0.1, 3), &mut out);
        assert!(out.is_empty());
        st.unavailable(&mut out);
        assert_eq!(out.len(), 2);
        let by_seq = |s: u64| out.iter().find(|f| f.seq == s).unwrap();
        assert_eq!(
            by_seq(1).record.gpu_uuids.as_deref(),
            Some(&["GPU-0".to_string()][..]),
            "it ran on the GPU the last sample mapped"
        );
        assert_eq!(
            by_seq(2).record.gpu_uuids,
            None,
            "it started after NVML was last heard from: no GPU to join"
        );
        st.on_finished(finished(3, 7, 2.0, 0.5, 3), &mut out);
        assert_eq!(out.len(), 3, "not held: no GPU map any more");
        assert_eq!(out[2].record.gpu_uuids, None);
    }

    #[test]
    fn held_records_are_released_when_samples_stop() {
        let mut st = GpuStage::new(SharedView::default());
        let mut out = vec![];
        st.on_sample(
            sample(0, 0, 0.0, &[7]),
            &ProcSnapshot::default(),
            &[7],
            &[],
            &mut out,
        );
        st.on_finished(finished(1, 7, 0.0, 0.5, 3), &mut out);
        st.expire(5 * S, &mut out);
        assert!(out.is_empty());
        st.expire(11 * S, &mut out);
        assert_eq!(out.len(), 1);
        assert!(out[0].record.gpu_uuids.is_some());
    }
}
