//! OTLP instruments that tie GPUs to engines (the device-level `hw.*`
//! instruments are the sampler's): the engine → GPU map as an info gauge,
//! GPU memory per process (named with its engine when it belongs to one),
//! energy per output token per engine and model since the previous export,
//! and idle energy per device. GPU UUIDs never go on request histograms.
//!
//! Owns: these instruments' names, units and attributes. Must not: block
//! (callbacks read the shared view under a short lock).

use std::collections::HashMap;

use opentelemetry::{metrics::Meter, KeyValue};

use super::stage::SharedView;
use crate::stage::{EngineNames, InstrumentSet};

/// The engine ↔ GPU instruments, from the GPU join's shared view.
pub struct EngineGpuInstruments(pub SharedView);

impl InstrumentSet for EngineGpuInstruments {
    fn register(&self, meter: &Meter, engines: &EngineNames) -> Box<dyn std::any::Any + Send> {
        register(meter, self.0.clone(), engines.clone());
        Box::new(())
    }
}

fn engine_attrs(names: &HashMap<u32, (String, String)>, pid: u32) -> Vec<KeyValue> {
    let (engine, _) = names
        .get(&pid)
        .cloned()
        .unwrap_or_else(|| ("unknown".into(), "unknown".into()));
    vec![
        KeyValue::new("gen_ai.provider.name", engine),
        KeyValue::new("tokentap.engine.pid", pid as i64),
    ]
}

pub fn register(meter: &Meter, view: SharedView, names: EngineNames) {
    let (v, n) = (view.clone(), names.clone());
    let _ = meter
        .i64_observable_gauge("tokentap.engine.gpu")
        .with_unit("1")
        .with_description("1 for each GPU an engine's processes use (the engine to GPU map)")
        .with_callback(move |o| {
            let v = v.lock().unwrap_or_else(|p| p.into_inner());
            let n = n.lock().unwrap_or_else(|p| p.into_inner());
            for (pid, g) in &v.engines {
                for uuid in &g.uuids {
                    let mut a = engine_attrs(&n, *pid);
                    a.push(KeyValue::new("hw.id", uuid.clone()));
                    o.observe(1, &a);
                }
            }
        })
        .build();
    let (v, n) = (view.clone(), names.clone());
    let _ = meter
        .i64_observable_up_down_counter("tokentap.gpu.process.memory.usage")
        .with_unit("By")
        .with_description(
            "GPU memory a process holds on a device (with its engine when it belongs to one)",
        )
        .with_callback(move |o| {
            let v = v.lock().unwrap_or_else(|p| p.into_inner());
            let n = n.lock().unwrap_or_else(|p| p.into_inner());
            let Some(s) = &v.latest else {
                return;
            };
            for d in &s.devices {
                for p in &d.processes {
                    let Some(bytes) = p.used_bytes else {
                        continue;
                    };
                    let mut a = vec![
                        KeyValue::new("hw.id", d.uuid.clone()),
                        KeyValue::new("process.pid", p.pid as i64),
                    ];
                    if let Some((e, _)) = v
                        .engines
                        .iter()
                        .find(|(_, g)| g.processes.contains_key(&p.pid))
                    {
                        a.extend(engine_attrs(&n, *e));
                    }
                    o.observe(bytes as i64, &a);
                }
            }
        })
        .build();
    let (v, n) = (view.clone(), names);
    let _ = meter
        .f64_observable_gauge("tokentap.gpu.energy_per_output_token")
        .with_unit("J/{token}")
        .with_description(
            "GPU energy of an engine's requests per output token, over the last sampling interval",
        )
        .with_callback(move |o| {
            let mut v = v.lock().unwrap_or_else(|p| p.into_inner());
            let n = n.lock().unwrap_or_else(|p| p.into_inner());
            for (pid, (tokens, joules)) in std::mem::take(&mut v.energy_since_collect).iter() {
                if *tokens <= 0.0 {
                    continue;
                }
                let mut a = engine_attrs(&n, *pid);
                let model = n
                    .get(pid)
                    .map(|x| x.1.clone())
                    .unwrap_or_else(|| "unknown".into());
                a.push(KeyValue::new("gen_ai.response.model", model));
                o.observe(joules / tokens, &a);
            }
        })
        .build();
    let v = view;
    let _ = meter
        .f64_observable_counter("tokentap.gpu.idle_energy")
        .with_unit("J")
        .with_description("GPU energy of intervals with no request in flight on the device")
        .with_callback(move |o| {
            let v = v.lock().unwrap_or_else(|p| p.into_inner());
            for (uuid, j) in &v.idle_energy_j {
                o.observe(*j, &[KeyValue::new("hw.id", uuid.clone())]);
            }
        })
        .build();
}
