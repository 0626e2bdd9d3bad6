//! Device-level GPU instruments (OpenTelemetry hardware semantic
//! conventions, `hw.*`, plus `tokentap.gpu.*` extensions), observed from
//! the latest [`GpuSample`] at each collection.
//!
//! Owns: [`GpuLatest`] (the last sample and the energy totals kept
//! monotonic across NVML counter resets) and the observable instruments
//! over it. Must not: call NVML (values come from samples only), or put
//! per-process or per-engine data on these instruments (the engine join
//! adds those).
//!
//! `hw.energy` is a monotonic counter in J. NVML's total-energy counter
//! restarts from zero when the driver reloads; the exported total starts
//! at the first reading and then adds each sample's increase, taking a
//! reading lower than the previous one as a restart (the increase is then
//! the reading itself). So the exported counter never goes backwards; it
//! under-counts only the energy between the last sample before a reset and
//! the reset.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use opentelemetry::{
    metrics::{
        AsyncInstrument, Meter, ObservableCounter, ObservableGauge, ObservableUpDownCounter,
    },
    KeyValue,
};

use super::types::{DeviceSample, GpuSample};

/// The latest sample and, per device (`hw.id`), the energy total.
#[derive(Debug, Default)]
pub struct GpuLatest {
    sample: Option<GpuSample>,
    energy: HashMap<String, EnergyTotal>,
}

#[derive(Debug, Clone, Copy)]
struct EnergyTotal {
    last_raw_mj: u64,
    total_mj: u64,
}

impl GpuLatest {
    /// Takes a new sample; call it for every sample, in order (energy is
    /// accumulated here, not at collection time, so a reset between two
    /// collections is still seen).
    pub fn update(&mut self, sample: GpuSample) {
        for d in &sample.devices {
            let Some(raw) = d.energy_total_mj else {
                continue;
            };
            self.energy
                .entry(d.uuid.clone())
                .and_modify(|e| {
                    let increase = if raw >= e.last_raw_mj {
                        raw - e.last_raw_mj
                    } else {
                        raw // the counter restarted (driver reload)
                    };
                    e.total_mj = e.total_mj.saturating_add(increase);
                    e.last_raw_mj = raw;
                })
                .or_insert(EnergyTotal {
                    last_raw_mj: raw,
                    total_mj: raw,
                });
        }
        self.sample = Some(sample);
    }

    /// Forgets the sample (NVML went away: no stale gauges); the energy
    /// totals stay, so `hw.energy` goes on from where it was.
    pub fn clear(&mut self) {
        self.sample = None;
    }

    pub fn sample(&self) -> Option<&GpuSample> {
        self.sample.as_ref()
    }

    /// The monotonic energy total of a device, J.
    pub fn energy_j(&self, uuid: &str) -> Option<f64> {
        self.energy.get(uuid).map(|e| e.total_mj as f64 / 1000.0)
    }
}

pub type SharedGpu = Arc<Mutex<GpuLatest>>;

/// `hw.id`, `hw.name`, `hw.vendor` and, for MIG, `hw.parent`.
pub fn device_attributes(d: &DeviceSample) -> Vec<KeyValue> {
    let mut a = vec![
        KeyValue::new("hw.id", d.uuid.clone()),
        KeyValue::new("hw.name", d.name.clone()),
        KeyValue::new("hw.vendor", "nvidia"),
    ];
    if let Some(p) = &d.parent_uuid {
        a.push(KeyValue::new("hw.parent", p.clone()));
    }
    a
}

/// The device-level instruments, from the sampler's latest samples.
pub struct DeviceInstruments(pub SharedGpu);

impl crate::stage::InstrumentSet for DeviceInstruments {
    fn register(
        &self,
        meter: &Meter,
        _engines: &crate::stage::EngineNames,
    ) -> Box<dyn std::any::Any + Send> {
        Box::new(register(meter, self.0.clone()))
    }
}

/// The registered instruments; keep it alive as long as the meter.
pub struct GpuInstruments {
    _gauges_f64: Vec<ObservableGauge<f64>>,
    _gauges_u64: Vec<ObservableGauge<u64>>,
    _updown: Vec<ObservableUpDownCounter<i64>>,
    _counters: Vec<ObservableCounter<f64>>,
}

/// Calls `each` for every device of the latest sample.
fn for_devices(shared: &SharedGpu, mut each: impl FnMut(&GpuLatest, &DeviceSample)) {
    let guard = match shared.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    };
    if let Some(s) = &guard.sample {
        for d in &s.devices {
            each(&guard, d);
        }
    }
}

/// An observation: one value with its extra attributes (beyond the
/// device's own).
type Reading<T> = Option<(T, Vec<KeyValue>)>;

fn observe<T: Copy>(
    shared: &SharedGpu,
    obs: &dyn AsyncInstrument<T>,
    read: impl Fn(&GpuLatest, &DeviceSample) -> Reading<T>,
) {
    for_devices(shared, |latest, d| {
        if let Some((v, extra)) = read(latest, d) {
            let mut attrs = device_attributes(d);
            attrs.extend(extra);
            obs.observe(v, &attrs);
        }
    });
}

fn gpu_type() -> Vec<KeyValue> {
    vec![KeyValue::new("hw.type", "gpu")]
}

/// Registers the device instruments on `meter`, reading `shared`.
pub fn register(meter: &Meter, shared: SharedGpu) -> GpuInstruments {
    let gauge = |name: &'static str,
                 unit: &'static str,
                 description: &'static str,
                 read: fn(&GpuLatest, &DeviceSample) -> Reading<f64>| {
        let s = shared.clone();
        meter
            .f64_observable_gauge(name)
            .with_unit(unit)
            .with_description(description)
            .with_callback(move |obs| observe(&s, obs, read))
            .build()
    };
    let gauges_f64 = vec![
        gauge(
            "hw.gpu.utilization",
            "1",
            "GPU utilisation over NVML's last sample period, fraction 0-1",
            |_, d| {
                d.util_gpu
                    .map(|v| (v, vec![KeyValue::new("hw.gpu.task", "general")]))
            },
        ),
        gauge(
            "hw.gpu.memory.utilization",
            "1",
            "GPU memory used / memory limit",
            |_, d| match (d.memory_used_bytes, d.memory_total_bytes) {
                (Some(used), Some(total)) if total > 0 => {
                    Some((used as f64 / total as f64, vec![]))
                }
                _ => None,
            },
        ),
        gauge("hw.power", "W", "GPU power draw", |_, d| {
            d.power_w.map(|v| (v, gpu_type()))
        }),
        gauge("hw.temperature", "Cel", "GPU temperature", |_, d| {
            d.temperature_c.map(|v| (v, gpu_type()))
        }),
        gauge(
            "tokentap.gpu.memory_controller.utilization",
            "1",
            "GPU memory-controller utilisation (NVML), fraction 0-1",
            |_, d| d.util_memory_controller.map(|v| (v, vec![])),
        ),
        gauge(
            "tokentap.gpu.throttled",
            "1",
            "1 while any clock throttle/event reason other than idle is active",
            |_, d| {
                d.throttle_reasons.as_ref().map(|r| {
                    let (v, reason) = if r.is_empty() {
                        (0.0, "none".to_string())
                    } else {
                        (1.0, r.join(","))
                    };
                    (
                        v,
                        vec![KeyValue::new("tokentap.gpu.throttle_reason", reason)],
                    )
                })
            },
        ),
    ];

    let s = shared.clone();
    let sm_clock = meter
        .u64_observable_gauge("tokentap.gpu.clock.sm")
        .with_unit("MHz")
        .with_description("GPU SM clock")
        .with_callback(move |obs| {
            observe(&s, obs, |_, d| {
                d.sm_clock_mhz.map(|v| (u64::from(v), vec![]))
            })
        })
        .build();

    let updown =
        |name: &'static str, description: &'static str, read: fn(&DeviceSample) -> Option<u64>| {
            let s = shared.clone();
            meter
                .i64_observable_up_down_counter(name)
                .with_unit("By")
                .with_description(description)
                .with_callback(move |obs| {
                    observe(&s, obs, |_, d| {
                        read(d)
                            .and_then(|v| i64::try_from(v).ok())
                            .map(|v| (v, vec![]))
                    })
                })
                .build()
        };
    let updowns = vec![
        updown("hw.gpu.memory.usage", "GPU memory used", |d| {
            d.memory_used_bytes
        }),
        updown("hw.gpu.memory.limit", "GPU memory size", |d| {
            d.memory_total_bytes
        }),
    ];

    let s = shared.clone();
    let energy = meter
        .f64_observable_counter("hw.energy")
        .with_unit("J")
        .with_description(
            "GPU energy (NVML total-energy counter, kept monotonic across driver reloads)",
        )
        .with_callback(move |obs| {
            observe(&s, obs, |latest, d| {
                latest.energy_j(&d.uuid).map(|v| (v, gpu_type()))
            })
        })
        .build();

    GpuInstruments {
        _gauges_f64: gauges_f64,
        _gauges_u64: vec![sm_clock],
        _updown: updowns,
        _counters: vec![energy],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::types::GpuProcess;
    use opentelemetry::metrics::MeterProvider as _;
    use opentelemetry_sdk::{
        error::OTelSdkResult,
        metrics::{
            data::{AggregatedMetrics, MetricData, ResourceMetrics},
            exporter::PushMetricExporter,
            PeriodicReader, SdkMeterProvider, Temporality,
        },
    };
    use std::{collections::BTreeMap, time::Duration};

    /// One exported data point, flattened.
    #[derive(Clone, Debug, PartialEq)]
    struct Point {
        name: String,
        unit: String,
        attrs: BTreeMap<String, String>,
        value: f64,
        monotonic: Option<bool>,
    }

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<Point>>>);

    fn attrs<'a>(it: impl Iterator<Item = &'a KeyValue>) -> BTreeMap<String, String> {
        it.map(|kv| (kv.key.to_string(), kv.value.to_string()))
            .collect()
    }

    fn points<T: Copy>(
        name: &str,
        unit: &str,
        data: &MetricData<T>,
        to_f64: fn(T) -> f64,
        out: &mut Vec<Point>,
    ) {
        let point = |attrs, value, monotonic| Point {
            name: name.into(),
            unit: unit.into(),
            attrs,
            value: to_f64(value),
            monotonic,
        };
        match data {
            MetricData::Gauge(g) => out.extend(
                g.data_points()
                    .map(|p| point(attrs(p.attributes()), p.value(), None)),
            ),
            MetricData::Sum(s) => out.extend(
                s.data_points()
                    .map(|p| point(attrs(p.attributes()), p.value(), Some(s.is_monotonic()))),
            ),
            _ => {}
        }
    }

    impl PushMetricExporter for Captured {
        async fn export(&self, metrics: &ResourceMetrics) -> OTelSdkResult {
            let mut out = Vec::new();
            for sm in metrics.scope_metrics() {
                for m in sm.metrics() {
                    let (name, unit) = (m.name(), m.unit());
                    match m.data() {
                        AggregatedMetrics::F64(d) => points(name, unit, d, |v| v, &mut out),
                        AggregatedMetrics::U64(d) => points(name, unit, d, |v| v as f64, &mut out),
                        AggregatedMetrics::I64(d) => points(name, unit, d, |v| v as f64, &mut out),
                    }
                }
            }
            *self.0.lock().unwrap() = out;
            Ok(())
        }
        fn force_flush(&self) -> OTelSdkResult {
            Ok(())
        }
        fn shutdown_with_timeout(&self, _: Duration) -> OTelSdkResult {
            Ok(())
        }
        fn temporality(&self) -> Temporality {
            Temporality::Cumulative
        }
    }

    struct Harness {
        provider: SdkMeterProvider,
        captured: Captured,
        shared: SharedGpu,
        _instruments: GpuInstruments,
    }

    impl Harness {
        fn new() -> Self {
            let captured = Captured::default();
            let reader = PeriodicReader::builder(captured.clone())
                .with_interval(Duration::from_secs(3600))
                .build();
            let provider = SdkMeterProvider::builder().with_reader(reader).build();
            let shared = SharedGpu::default();
            let instruments = register(&provider.meter("test"), shared.clone());
            Self {
                provider,
                captured,
                shared,
                _instruments: instruments,
            }
        }

        fn collect(&self) -> Vec<Point> {
            self.provider.force_flush().unwrap();
            self.captured.0.lock().unwrap().clone()
        }

        fn update(&self, s: GpuSample) {
            self.shared.lock().unwrap().update(s);
        }
    }

    fn gpu(energy_mj: Option<u64>) -> DeviceSample {
        DeviceSample {
            index: 0,
            uuid: "GPU-aaaa".into(),
            name: "NVIDIA H100 80GB HBM3".into(),
            parent_uuid: None,
            util_gpu: Some(0.37),
            util_memory_controller: Some(0.12),
            memory_used_bytes: Some(20 << 30),
            memory_total_bytes: Some(80 << 30),
            power_w: Some(250.5),
            energy_total_mj: energy_mj,
            temperature_c: Some(61.0),
            sm_clock_mhz: Some(1980),
            throttle_reasons: Some(vec!["sw_power_cap".into(), "hw_slowdown".into()]),
            processes: vec![GpuProcess {
                pid: 42,
                used_bytes: Some(1 << 30),
                sm_util: Some(0.3),
            }],
        }
    }

    fn mig() -> DeviceSample {
        DeviceSample {
            index: 0,
            uuid: "MIG-bbbb".into(),
            name: "NVIDIA H100 MIG 1g.10gb".into(),
            parent_uuid: Some("GPU-aaaa".into()),
            memory_used_bytes: Some(1 << 30),
            memory_total_bytes: Some(10 << 30),
            throttle_reasons: Some(vec![]),
            ..DeviceSample::default()
        }
    }

    fn find<'a>(pts: &'a [Point], name: &str, id: &str) -> &'a Point {
        pts.iter()
            .find(|p| p.name == name && p.attrs.get("hw.id").map(String::as_str) == Some(id))
            .unwrap_or_else(|| panic!("no {name} for {id} in {pts:#?}"))
    }

    #[test]
    fn every_device_instrument_has_its_name_unit_attributes_and_value() {
        let h = Harness::new();
        h.update(GpuSample {
            ts_ns: 1,
            devices: vec![gpu(Some(5_000_500)), mig()],
        });
        let pts = h.collect();
        let expect = [
            (
                "hw.gpu.utilization",
                "1",
                0.37,
                Some(("hw.gpu.task", "general")),
            ),
            ("hw.gpu.memory.utilization", "1", 0.25, None),
            ("hw.gpu.memory.usage", "By", (20u64 << 30) as f64, None),
            ("hw.gpu.memory.limit", "By", (80u64 << 30) as f64, None),
            ("hw.power", "W", 250.5, Some(("hw.type", "gpu"))),
            ("hw.energy", "J", 5000.5, Some(("hw.type", "gpu"))),
            ("hw.temperature", "Cel", 61.0, Some(("hw.type", "gpu"))),
            (
                "tokentap.gpu.memory_controller.utilization",
                "1",
                0.12,
                None,
            ),
            ("tokentap.gpu.clock.sm", "MHz", 1980.0, None),
            (
                "tokentap.gpu.throttled",
                "1",
                1.0,
                Some(("tokentap.gpu.throttle_reason", "sw_power_cap,hw_slowdown")),
            ),
        ];
        for (name, unit, value, extra) in expect {
            let p = find(&pts, name, "GPU-aaaa");
            assert_eq!(p.unit, unit, "{name}");
            assert!(
                (p.value - value).abs() < 1e-9,
                "{name}: {} != {value}",
                p.value
            );
            assert_eq!(p.attrs["hw.name"], "NVIDIA H100 80GB HBM3", "{name}");
            assert_eq!(p.attrs["hw.vendor"], "nvidia", "{name}");
            assert!(!p.attrs.contains_key("hw.parent"), "{name}");
            let mut n_attrs = 3;
            if let Some((k, v)) = extra {
                assert_eq!(p.attrs.get(k).map(String::as_str), Some(v), "{name}");
                n_attrs += 1;
            }
            assert_eq!(p.attrs.len(), n_attrs, "{name}: {:?}", p.attrs);
        }
        assert_eq!(find(&pts, "hw.energy", "GPU-aaaa").monotonic, Some(true));
        assert_eq!(
            find(&pts, "hw.gpu.memory.usage", "GPU-aaaa").monotonic,
            Some(false)
        );

        // The MIG instance: hw.parent, only the readings it has.
        let m = find(&pts, "hw.gpu.memory.utilization", "MIG-bbbb");
        assert_eq!(m.attrs["hw.parent"], "GPU-aaaa");
        assert!((m.value - 0.1).abs() < 1e-9);
        let t = find(&pts, "tokentap.gpu.throttled", "MIG-bbbb");
        assert_eq!(
            (t.value, t.attrs["tokentap.gpu.throttle_reason"].as_str()),
            (0.0, "none")
        );
        let mig_names: Vec<_> = pts
            .iter()
            .filter(|p| p.attrs.get("hw.id").map(String::as_str) == Some("MIG-bbbb"))
            .map(|p| p.name.as_str())
            .collect();
        for absent in [
            "hw.power",
            "hw.energy",
            "hw.gpu.utilization",
            "hw.temperature",
        ] {
            assert!(!mig_names.contains(&absent), "{absent} without a reading");
        }
    }

    #[test]
    fn energy_never_decreases_across_a_counter_reset() {
        let h = Harness::new();
        let mut exported = Vec::new();
        // 1000 J, +500 J, driver reload (counter back to 0.2 J), +300 J,
        // and a sample without the reading.
        for raw in [
            Some(1_000_000),
            Some(1_500_000),
            Some(200),
            Some(300_200),
            None,
        ] {
            h.update(GpuSample {
                ts_ns: 1,
                devices: vec![gpu(raw)],
            });
            exported.push(find(&h.collect(), "hw.energy", "GPU-aaaa").value);
        }
        assert_eq!(exported, vec![1000.0, 1500.0, 1500.2, 1800.2, 1800.2]);
    }

    #[test]
    fn a_reset_between_two_collections_is_still_counted() {
        let h = Harness::new();
        for raw in [1_000_000, 1_600_000, 100_000] {
            h.update(GpuSample {
                ts_ns: 1,
                devices: vec![gpu(Some(raw))],
            });
        }
        assert_eq!(find(&h.collect(), "hw.energy", "GPU-aaaa").value, 1700.0);
    }

    #[test]
    fn cleared_samples_export_no_gauges_but_energy_is_kept() {
        let h = Harness::new();
        h.update(GpuSample {
            ts_ns: 1,
            devices: vec![gpu(Some(2_000))],
        });
        h.shared.lock().unwrap().clear();
        assert_eq!(h.shared.lock().unwrap().energy_j("GPU-aaaa"), Some(2.0));
        let pts = h.collect();
        assert!(
            !pts.iter().any(|p| p.name == "hw.power"),
            "stale gauge after clear: {pts:#?}"
        );
    }
}
