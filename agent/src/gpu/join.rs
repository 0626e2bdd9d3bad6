//! The engine ↔ GPU join and the per-request GPU arithmetic. Pure: the
//! process tree and cgroups come in as a [`ProcSnapshot`], samples as
//! [`GpuSample`]s, request progress as token counts; nothing here reads
//! /proc, NVML or a clock.
//!
//! * **Engine ↔ GPU map.** An engine (the process that serves HTTP) uses the
//!   devices whose process lists hold its pid, a descendant of it (vLLM,
//!   SGLang and TGI run GPU work in worker processes), or a process in the
//!   same container (cgroup). NVML reports host pids; the agent runs in the
//!   host pid namespace.
//! * **Utilisation over a request**: NVML's utilisation is the busy fraction
//!   of its last sample period; each sample is taken to cover the time since
//!   the previous one, and a request's `gpu_util_avg` is the time-weighted
//!   mean over the parts of those periods inside the request, averaged over
//!   the engine's GPUs.
//! * **Energy**: each interval between two samples, the energy of an
//!   engine's GPUs (energy-counter deltas; power × time where the counter is
//!   unsupported) goes to that engine's requests in proportion to the output
//!   tokens each produced in the interval (in proportion to time in flight
//!   when none produced a token: prefill); an interval with nothing in
//!   flight is idle energy. A GPU shared by several engines has its energy
//!   split between them by their tokens in the interval too.
//!
//! Owns: these rules. Must not: do I/O.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::types::{DeviceSample, GpuSample};

pub use crate::stage::gpu::ProcSnapshot;

/// An engine's GPUs at one sample.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EngineGpus {
    /// Device UUIDs, sorted.
    pub uuids: Vec<String>,
    /// The engine's processes on those devices and their GPU memory (summed
    /// over devices; None when NVML could not say for any of them).
    pub processes: BTreeMap<u32, Option<u64>>,
}

impl EngineGpus {
    /// GPU memory held by the engine's processes (None when unknown).
    pub fn memory_used_bytes(&self) -> Option<u64> {
        let known: Vec<u64> = self.processes.values().flatten().copied().collect();
        (!known.is_empty()).then(|| known.iter().sum())
    }
}

/// Does GPU process `p` belong to engine `e`?
pub fn belongs(p: u32, e: u32, snap: &ProcSnapshot) -> bool {
    if p == e {
        return true;
    }
    if snap.ancestors.get(&p).is_some_and(|a| a.contains(&e)) {
        return true;
    }
    matches!(
        (snap.container.get(&p), snap.container.get(&e)),
        (Some(a), Some(b)) if a == b
    )
}

/// The GPUs of each engine in `engines`, from one sample.
pub fn engine_gpus(
    engines: &[u32],
    sample: &GpuSample,
    snap: &ProcSnapshot,
) -> HashMap<u32, EngineGpus> {
    let mut out: HashMap<u32, EngineGpus> = HashMap::new();
    for dev in &sample.devices {
        for proc_ in &dev.processes {
            for &e in engines {
                if !belongs(proc_.pid, e, snap) {
                    continue;
                }
                let g = out.entry(e).or_default();
                if !g.uuids.contains(&dev.uuid) {
                    g.uuids.push(dev.uuid.clone());
                }
                let mem = g.processes.entry(proc_.pid).or_insert(None);
                if let Some(b) = proc_.used_bytes {
                    *mem = Some(mem.unwrap_or(0) + b);
                }
            }
        }
    }
    for g in out.values_mut() {
        g.uuids.sort();
    }
    out
}

/// Samples kept for per-request utilisation (bounded).
#[derive(Clone, Debug, Default)]
pub struct History {
    samples: std::collections::VecDeque<GpuSample>,
    max: usize,
}

impl History {
    pub fn new(max: usize) -> Self {
        Self {
            samples: Default::default(),
            max: max.max(2),
        }
    }

    pub fn push(&mut self, s: GpuSample) {
        if self.samples.len() == self.max {
            self.samples.pop_front();
        }
        self.samples.push_back(s);
    }

    pub fn latest(&self) -> Option<&GpuSample> {
        self.samples.back()
    }

    /// Time-weighted mean GPU utilisation of `uuids` over `[from_ns,
    /// to_ns]`: each sample covers (previous sample, sample]; the parts of
    /// those periods inside the window weigh in. Per device, then the mean
    /// over devices with data. None when no sample period overlaps.
    pub fn util_avg(&self, uuids: &[String], from_ns: u64, to_ns: u64) -> Option<f64> {
        let mut per_dev = vec![];
        for uuid in uuids {
            let (mut sum, mut weight) = (0.0, 0.0);
            let mut prev_ts: Option<u64> = None;
            for s in &self.samples {
                let start = prev_ts.unwrap_or(s.ts_ns);
                prev_ts = Some(s.ts_ns);
                let Some(u) = device(s, uuid).and_then(|d| d.util_gpu) else {
                    continue;
                };
                let lo = start.max(from_ns);
                let hi = s.ts_ns.min(to_ns);
                if hi > lo {
                    let w = (hi - lo) as f64;
                    sum += u * w;
                    weight += w;
                } else if start == s.ts_ns && (from_ns..=to_ns).contains(&s.ts_ns) {
                    // The first sample has no period: count it as an
                    // instant only when nothing else weighs in.
                    sum += u * 1e-9;
                    weight += 1e-9;
                }
            }
            if weight > 0.0 {
                per_dev.push(sum / weight);
            }
        }
        (!per_dev.is_empty()).then(|| per_dev.iter().sum::<f64>() / per_dev.len() as f64)
    }
}

fn device<'a>(s: &'a GpuSample, uuid: &str) -> Option<&'a DeviceSample> {
    s.devices.iter().find(|d| d.uuid == uuid)
}

/// Where an interval's energy came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EnergySource {
    /// The device's total-energy counter.
    Counter,
    /// Power × interval (the counter is unsupported or reset).
    Power,
}

impl EnergySource {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Counter => "counter",
            Self::Power => "power",
        }
    }
}

/// Energy of one device over one interval, in joules.
pub fn device_energy_j(
    prev: &DeviceSample,
    prev_ts_ns: u64,
    cur: &DeviceSample,
    cur_ts_ns: u64,
) -> Option<(f64, EnergySource)> {
    if let (Some(a), Some(b)) = (prev.energy_total_mj, cur.energy_total_mj) {
        // A counter that went backwards was reset (driver reload): the
        // delta is unknown; fall back to power for this interval.
        if b >= a {
            return Some(((b - a) as f64 / 1000.0, EnergySource::Counter));
        }
    }
    let dt_s = cur_ts_ns.saturating_sub(prev_ts_ns) as f64 / 1e9;
    let p = match (prev.power_w, cur.power_w) {
        (Some(a), Some(b)) => (a + b) / 2.0,
        (None, Some(b)) => b,
        (Some(a), None) => a,
        (None, None) => return None,
    };
    Some((p * dt_s, EnergySource::Power))
}

/// One request's share of an interval: output tokens produced in it, and
/// nanoseconds in flight during it (for prefill-only intervals).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Progress {
    pub tokens: f64,
    pub in_flight_ns: f64,
}

/// What one interval's attribution gives.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct IntervalEnergy {
    /// Joules per request id.
    pub requests: HashMap<u64, (f64, EnergySource)>,
    /// Joules of devices with nothing in flight, per device UUID.
    pub idle: HashMap<String, f64>,
    /// Output tokens and joules per engine pid (for energy per token).
    pub per_engine: HashMap<u32, (f64, f64)>,
}

/// Splits one interval's energy (`prev` → `cur`) between requests.
/// `engines`: each engine's GPUs; `progress`: per engine, each request id
/// in flight during the interval with its progress in it. A device used by
/// several engines is split between them in proportion to their tokens (or
/// time in flight when no tokens).
pub fn attribute(
    prev: &GpuSample,
    cur: &GpuSample,
    engines: &HashMap<u32, EngineGpus>,
    progress: &HashMap<u32, Vec<(u64, Progress)>>,
) -> IntervalEnergy {
    let mut out = IntervalEnergy::default();
    let mut seen_dev = HashSet::new();
    for dev in &cur.devices {
        let Some(prev_dev) = device(prev, &dev.uuid) else {
            continue;
        };
        if !seen_dev.insert(dev.uuid.clone()) {
            continue;
        }
        let Some((joules, source)) = device_energy_j(prev_dev, prev.ts_ns, dev, cur.ts_ns) else {
            continue;
        };
        // Every request of every engine using this device.
        let mut reqs: Vec<(u32, u64, Progress)> = vec![];
        for (&e, g) in engines {
            if !g.uuids.contains(&dev.uuid) {
                continue;
            }
            for &(id, p) in progress.get(&e).map(Vec::as_slice).unwrap_or(&[]) {
                reqs.push((e, id, p));
            }
        }
        let tokens: f64 = reqs.iter().map(|r| r.2.tokens).sum();
        let time: f64 = reqs.iter().map(|r| r.2.in_flight_ns).sum();
        let weight = |p: &Progress| {
            if tokens > 0.0 {
                p.tokens / tokens
            } else if time > 0.0 {
                p.in_flight_ns / time
            } else {
                0.0
            }
        };
        if tokens <= 0.0 && time <= 0.0 {
            *out.idle.entry(dev.uuid.clone()).or_default() += joules;
            continue;
        }
        for (e, id, p) in &reqs {
            let j = joules * weight(p);
            let slot = out.requests.entry(*id).or_insert((0.0, source));
            slot.0 += j;
            if source == EnergySource::Power {
                slot.1 = EnergySource::Power;
            }
            let pe = out.per_engine.entry(*e).or_default();
            pe.1 += j;
        }
    }
    for (&e, reqs) in progress {
        if let Some(pe) = out.per_engine.get_mut(&e) {
            pe.0 = reqs.iter().map(|r| r.1.tokens).sum();
        }
    }
    out
}

/// Output tokens of a request spread evenly over its generation window
/// (`[t1, tn]`, or `[t0, end]` when it streamed no tokens separately), and
/// the part of them inside `[from, to]`; plus its time in flight there.
pub fn progress_in(
    window: (u64, u64),
    in_flight: (u64, u64),
    tokens: f64,
    from: u64,
    to: u64,
) -> Progress {
    let overlap = |a: u64, b: u64| b.min(to).saturating_sub(a.max(from)) as f64;
    let (g0, g1) = window;
    let tokens_in = if g1 > g0 {
        tokens * overlap(g0, g1) / (g1 - g0) as f64
    } else if (from..to).contains(&g0) || (g0 == to && from < to) {
        tokens // all at one instant inside the interval
    } else {
        0.0
    };
    Progress {
        tokens: tokens_in,
        in_flight_ns: overlap(in_flight.0, in_flight.1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::types::GpuProcess;

    fn dev(
        uuid: &str,
        util: f64,
        energy_mj: Option<u64>,
        power: f64,
        procs: &[(u32, u64)],
    ) -> DeviceSample {
        DeviceSample {
            uuid: uuid.into(),
            name: "H200".into(),
            util_gpu: Some(util),
            energy_total_mj: energy_mj,
            power_w: Some(power),
            processes: procs
                .iter()
                .map(|&(pid, b)| GpuProcess {
                    pid,
                    used_bytes: Some(b),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    fn sample(ts_s: f64, devices: Vec<DeviceSample>) -> GpuSample {
        GpuSample {
            ts_ns: (ts_s * 1e9) as u64,
            devices,
        }
    }

    #[test]
    fn an_engines_gpus_are_those_of_its_workers_and_its_container() {
        let s = sample(
            1.0,
            vec![
                dev("GPU-a", 0.5, None, 100.0, &[(200, 10)]), // worker (child of 100)
                dev("GPU-b", 0.5, None, 100.0, &[(300, 20)]), // same container as 100
                dev("GPU-c", 0.5, None, 100.0, &[(400, 30)]), // unrelated
                dev("GPU-d", 0.5, None, 100.0, &[(100, 5), (200, 7)]),
            ],
        );
        let snap = ProcSnapshot {
            ancestors: [(200, vec![150, 100, 1]), (300, vec![1]), (400, vec![1])].into(),
            container: [(100, "pod-x/ctr-1".into()), (300, "pod-x/ctr-1".into())].into(),
        };
        let m = engine_gpus(&[100], &s, &snap);
        let g = &m[&100];
        assert_eq!(g.uuids, vec!["GPU-a", "GPU-b", "GPU-d"]);
        assert_eq!(g.processes[&200], Some(17), "summed over devices");
        assert_eq!(g.memory_used_bytes(), Some(5 + 17 + 20));
        assert!(!g.processes.contains_key(&400));
    }

    #[test]
    fn utilisation_is_time_weighted_over_the_request() {
        let mut h = History::new(16);
        h.push(sample(10.0, vec![dev("G", 0.2, None, 0.0, &[])]));
        h.push(sample(11.0, vec![dev("G", 0.8, None, 0.0, &[])])); // covers (10, 11]
        h.push(sample(12.0, vec![dev("G", 0.4, None, 0.0, &[])])); // covers (11, 12]
        let g = vec!["G".to_string()];
        // [10.5, 12]: 0.5 s at 0.8, 1 s at 0.4.
        let u = h.util_avg(&g, 10_500_000_000, 12_000_000_000).unwrap();
        assert!((u - (0.8 * 0.5 + 0.4 * 1.0) / 1.5).abs() < 1e-9, "{u}");
        // A window after the last sample: nothing covers it yet.
        assert_eq!(h.util_avg(&g, 12_100_000_000, 12_500_000_000), None);
        // Two GPUs: the mean of their means.
        let mut h = History::new(4);
        h.push(sample(
            0.0,
            vec![dev("A", 0.0, None, 0.0, &[]), dev("B", 0.0, None, 0.0, &[])],
        ));
        h.push(sample(
            1.0,
            vec![dev("A", 1.0, None, 0.0, &[]), dev("B", 0.5, None, 0.0, &[])],
        ));
        let u = h
            .util_avg(&["A".into(), "B".into()], 0, 1_000_000_000)
            .unwrap();
        assert!((u - 0.75).abs() < 1e-9);
    }

    #[test]
    fn energy_comes_from_counter_deltas_and_falls_back_to_power_after_a_reset() {
        let a = dev("G", 0.0, Some(1_000_000), 300.0, &[]);
        let b = dev("G", 0.0, Some(1_250_000), 300.0, &[]);
        let (j, src) = device_energy_j(&a, 0, &b, 1_000_000_000).unwrap();
        assert_eq!((j, src), (250.0, EnergySource::Counter));
        // Counter went backwards (driver reload): power × time.
        let c = dev("G", 0.0, Some(5), 200.0, &[]);
        let (j, src) = device_energy_j(&b, 0, &c, 2_000_000_000).unwrap();
        assert_eq!(src, EnergySource::Power);
        assert!((j - 250.0 * 2.0).abs() < 1e-9);
        // No counter at all.
        let d = dev("G", 0.0, None, 100.0, &[]);
        assert_eq!(
            device_energy_j(&d, 0, &d, 500_000_000),
            Some((50.0, EnergySource::Power))
        );
    }

    fn engines(list: &[(u32, &[&str])]) -> HashMap<u32, EngineGpus> {
        list.iter()
            .map(|(e, u)| {
                (
                    *e,
                    EngineGpus {
                        uuids: u.iter().map(|s| s.to_string()).collect(),
                        processes: Default::default(),
                    },
                )
            })
            .collect()
    }

    #[test]
    fn overlapping_requests_share_an_interval_by_tokens_and_idle_intervals_are_idle() {
        let prev = sample(0.0, vec![dev("G", 0.0, Some(0), 0.0, &[])]);
        let cur = sample(1.0, vec![dev("G", 0.0, Some(300_000), 0.0, &[])]); // 300 J
        let eng = engines(&[(7, &["G"])]);
        let progress: HashMap<u32, Vec<(u64, Progress)>> = [(
            7,
            vec![
                (
                    1,
                    Progress {
                        tokens: 10.0,
                        in_flight_ns: 1e9,
                    },
                ),
                (
                    2,
                    Progress {
                        tokens: 20.0,
                        in_flight_ns: 1e9,
                    },
                ),
            ],
        )]
        .into();
        let e = attribute(&prev, &cur, &eng, &progress);
        assert!((e.requests[&1].0 - 100.0).abs() < 1e-9);
        assert!((e.requests[&2].0 - 200.0).abs() < 1e-9);
        assert_eq!(e.requests[&1].1, EnergySource::Counter);
        assert!(e.idle.is_empty());
        assert_eq!(e.per_engine[&7], (30.0, 300.0));
        // Nothing in flight: idle.
        let e = attribute(&prev, &cur, &eng, &HashMap::new());
        assert!(e.requests.is_empty());
        assert_eq!(e.idle["G"], 300.0);
        // In flight but no token yet (prefill): by time in flight.
        let progress: HashMap<u32, Vec<(u64, Progress)>> = [(
            7,
            vec![
                (
                    1,
                    Progress {
                        tokens: 0.0,
                        in_flight_ns: 0.25e9,
                    },
                ),
                (
                    2,
                    Progress {
                        tokens: 0.0,
                        in_flight_ns: 0.75e9,
                    },
                ),
            ],
        )]
        .into();
        let e = attribute(&prev, &cur, &eng, &progress);
        assert!((e.requests[&1].0 - 75.0).abs() < 1e-9);
        assert!((e.requests[&2].0 - 225.0).abs() < 1e-9);
    }

    #[test]
    fn two_engines_on_one_gpu_split_it_by_their_tokens() {
        let prev = sample(0.0, vec![dev("G", 0.0, Some(0), 0.0, &[])]);
        let cur = sample(1.0, vec![dev("G", 0.0, Some(100_000), 0.0, &[])]);
        let eng = engines(&[(7, &["G"]), (8, &["G"])]);
        let progress: HashMap<u32, Vec<(u64, Progress)>> = [
            (
                7,
                vec![(
                    1,
                    Progress {
                        tokens: 30.0,
                        in_flight_ns: 1e9,
                    },
                )],
            ),
            (
                8,
                vec![(
                    2,
                    Progress {
                        tokens: 10.0,
                        in_flight_ns: 1e9,
                    },
                )],
            ),
        ]
        .into();
        let e = attribute(&prev, &cur, &eng, &progress);
        assert!((e.requests[&1].0 - 75.0).abs() < 1e-9);
        assert!((e.requests[&2].0 - 25.0).abs() < 1e-9);
        assert_eq!(e.per_engine[&7], (30.0, 75.0));
    }

    #[test]
    fn tokens_are_spread_over_the_generation_window() {
        // 10 tokens between 1 s and 3 s; the interval [2 s, 4 s] holds half.
        let p = progress_in((1_000, 3_000), (0, 3_000), 10.0, 2_000, 4_000);
        assert!((p.tokens - 5.0).abs() < 1e-9);
        assert_eq!(p.in_flight_ns, 1_000.0);
        // A one-instant window (a single token) inside / outside.
        assert_eq!(
            progress_in((1_500, 1_500), (0, 1_500), 1.0, 1_000, 2_000).tokens,
            1.0
        );
        assert_eq!(
            progress_in((2_500, 2_500), (0, 2_500), 1.0, 1_000, 2_000).tokens,
            0.0
        );
    }
}
