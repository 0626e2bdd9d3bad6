//! `gpu.throttle.start` / `gpu.throttle.stop`: a GPU's clocks held down by
//! power or thermal limits (NVML's throttle reasons `sw_power_cap`,
//! `hw_slowdown`, `sw_thermal_slowdown`, `hw_thermal_slowdown`,
//! `hw_power_brake_slowdown`) for `gpu_throttle_samples` samples in a row,
//! and released as long; `gpu.memory.high`: a GPU's memory at or above
//! `gpu_memory_high` of its total (again once it fell 5 points below).
//! Clock settings an operator chose (application clocks, sync boost) are
//! not throttling.

use std::collections::HashMap;

use super::{kind, round4, Config, Event};
use crate::{
    stage::gpu::{DeviceSample, GpuSample},
    stage::{events::Detector, NodeState},
};

/// Reasons that mean the GPU is slowed against its will.
pub const THROTTLE_REASONS: [&str; 5] = [
    "sw_power_cap",
    "hw_slowdown",
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
];

#[derive(Default)]
struct DeviceState {
    throttled: bool,
    /// Samples in a row that disagree with `throttled`.
    streak: u32,
    since_ns: u64,
    reasons: Vec<String>,
    memory_high: bool,
}

pub struct Gpus {
    samples: u32,
    memory_high: f64,
    by_uuid: HashMap<String, DeviceState>,
}

/// The engines (serving processes, or their GPU workers' parents) with a
/// process on this device.
fn engines_on(d: &DeviceSample, node: &NodeState) -> Vec<String> {
    let mut v: Vec<String> = d
        .processes
        .iter()
        .filter_map(|p| {
            node.processes.get(&p.pid).map(|i| {
                format!(
                    "{} (pid {})",
                    i.engine.map_or("engine", |e| e.name()),
                    p.pid
                )
            })
        })
        .collect();
    v.sort();
    v.dedup();
    v
}

impl Detector for Gpus {
    fn kinds(&self) -> &'static [&'static str] {
        &[
            kind::GPU_THROTTLE_START,
            kind::GPU_THROTTLE_STOP,
            kind::GPU_MEMORY_HIGH,
        ]
    }

    fn gpu_sample(&mut self, s: &GpuSample, node: &NodeState, out: &mut Vec<Event>) {
        self.on_sample(s, node, out);
    }
}

impl Gpus {
    pub fn new(cfg: &Config) -> Self {
        Self {
            samples: cfg.gpu_throttle_samples,
            memory_high: cfg.gpu_memory_high,
            by_uuid: HashMap::new(),
        }
    }

    pub fn on_sample(&mut self, s: &GpuSample, node: &NodeState, out: &mut Vec<Event>) {
        for d in &s.devices {
            let st = self.by_uuid.entry(d.uuid.clone()).or_default();
            let base = |k: &'static str, msg: String| {
                Event::new(s.ts_ns, k, msg)
                    .with("gpu.uuid", d.uuid.as_str())
                    .with("gpu.index", d.index)
                    .with("gpu.name", d.name.as_str())
                    .with("engines", engines_on(d, node))
            };
            if let Some(r) = &d.throttle_reasons {
                let active: Vec<String> = r
                    .iter()
                    .filter(|x| THROTTLE_REASONS.contains(&x.as_str()))
                    .cloned()
                    .collect();
                let now = !active.is_empty();
                if now == st.throttled {
                    st.streak = 0;
                    if now {
                        st.reasons = active;
                    }
                } else {
                    st.streak += 1;
                    if now {
                        st.reasons = active;
                    }
                    if st.streak >= self.samples {
                        st.throttled = now;
                        st.streak = 0;
                        let detail = |e: Event| {
                            e.with("reasons", st.reasons.clone())
                                .with("sm_clock_mhz", d.sm_clock_mhz)
                                .with("temperature_c", d.temperature_c)
                                .with("power_w", d.power_w)
                                .with("gpu_utilization", d.util_gpu)
                        };
                        if now {
                            st.since_ns = s.ts_ns;
                            out.push(detail(base(
                                kind::GPU_THROTTLE_START,
                                format!(
                                    "GPU {} ({}) throttled: {}{}",
                                    d.index,
                                    d.name,
                                    st.reasons.join(", "),
                                    d.sm_clock_mhz
                                        .map(|c| format!(", SM clock {c} MHz"))
                                        .unwrap_or_default()
                                ),
                            )));
                        } else {
                            let dur = s.ts_ns.saturating_sub(st.since_ns) as f64 / 1e9;
                            out.push(
                                detail(base(
                                    kind::GPU_THROTTLE_STOP,
                                    format!(
                                        "GPU {} ({}) no longer throttled, after {dur:.0} s ({})",
                                        d.index,
                                        d.name,
                                        st.reasons.join(", ")
                                    ),
                                ))
                                .with("duration_s", round4(dur)),
                            );
                        }
                    }
                }
            }
            if let (Some(used), Some(total)) = (d.memory_used_bytes, d.memory_total_bytes) {
                if total > 0 {
                    let frac = used as f64 / total as f64;
                    if !st.memory_high && frac >= self.memory_high {
                        st.memory_high = true;
                        out.push(
                            base(
                                kind::GPU_MEMORY_HIGH,
                                format!(
                                    "GPU {} ({}) memory {:.1} % used ({:.1} of {:.1} GiB)",
                                    d.index,
                                    d.name,
                                    frac * 100.0,
                                    used as f64 / (1u64 << 30) as f64,
                                    total as f64 / (1u64 << 30) as f64
                                ),
                            )
                            .with("memory_used_bytes", used)
                            .with("memory_total_bytes", total)
                            .with("memory_fraction", round4(frac)),
                        );
                    } else if st.memory_high && frac < self.memory_high - 0.05 {
                        st.memory_high = false;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stage::gpu::GpuProcess;
    use crate::stage::ProcessInfo;

    fn sample(t: u64, reasons: &[&str], used_gib: u64) -> GpuSample {
        GpuSample {
            ts_ns: t * 1_000_000_000,
            devices: vec![DeviceSample {
                index: 0,
                uuid: "GPU-0".into(),
                name: "H200".into(),
                memory_used_bytes: Some(used_gib << 30),
                memory_total_bytes: Some(100 << 30),
                sm_clock_mhz: Some(1200),
                throttle_reasons: Some(reasons.iter().map(|r| r.to_string()).collect()),
                processes: vec![GpuProcess {
                    pid: 42,
                    used_bytes: None,
                    sm_util: None,
                }],
                ..Default::default()
            }],
        }
    }

    #[test]
    fn throttling_needs_three_samples_each_way_and_memory_high_fires_once() {
        let mut node = NodeState::default();
        node.processes.insert(
            42,
            ProcessInfo {
                engine: Some(crate::engines::Engine::Vllm),
                ..Default::default()
            },
        );
        let mut g = Gpus::new(&Config::default());
        let mut out = vec![];
        // A lone throttled sample (flapping) and chosen clocks: nothing.
        let seq: &[(&[&str], u64)] = &[
            (&["sw_power_cap"], 50),
            (&[], 50),
            (&["applications_clocks_setting"], 50),
            (&["applications_clocks_setting"], 50),
            (&["applications_clocks_setting"], 50),
            // Power capped for good; memory fills (once), dips 2 points
            // (no re-arm), goes high again.
            (&["sw_power_cap"], 96),
            (&["sw_power_cap", "sw_thermal_slowdown"], 93),
            (&["sw_power_cap"], 97),
            (&["sw_power_cap"], 50),
            (&[], 50),
            (&[], 50),
            (&[], 50),
        ];
        for (t, (r, m)) in seq.iter().enumerate() {
            g.on_sample(&sample(t as u64, r, *m), &node, &mut out);
        }
        let kinds: Vec<(&str, u64)> = out
            .iter()
            .map(|e| (e.kind, e.ts_ns / 1_000_000_000))
            .collect();
        assert_eq!(
            kinds,
            [
                (kind::GPU_MEMORY_HIGH, 5),
                (kind::GPU_THROTTLE_START, 7),
                (kind::GPU_THROTTLE_STOP, 11)
            ]
        );
        assert_eq!(
            out[1].attr("reasons").unwrap(),
            &serde_json::json!(["sw_power_cap"])
        );
        assert_eq!(
            out[1].attr("engines").unwrap(),
            &serde_json::json!(["vllm (pid 42)"])
        );
        assert_eq!(out[2].attr("duration_s").unwrap(), 4.0);
    }
}
