//! `tokentap.engine.*`: the OTLP instruments of what engines report about
//! themselves (the scrape's [`EngineState`]s), registered on the OTLP
//! sink's meter through `stage::InstrumentSet`.
//!
//! Owns: these instruments' names, units and attributes. Must not: block
//! (callbacks read the shared states under a short lock).

use opentelemetry::{metrics::Meter, KeyValue};

use super::{task::SharedEngineStates, EngineState};
use crate::stage::{EngineNames, InstrumentSet};

/// The engine-state gauges, from the scrape task's shared states.
pub struct EngineStateInstruments(pub SharedEngineStates);

impl InstrumentSet for EngineStateInstruments {
    fn register(&self, meter: &Meter, _engines: &EngineNames) -> Box<dyn std::any::Any + Send> {
        register(meter, self.0.clone());
        Box::new(())
    }
}

/// `tokentap.engine.*`: what engines report about themselves on their
/// own /metrics (KV-cache use, queued and running requests), per engine.
fn register(meter: &Meter, states: SharedEngineStates) {
    type Pick = fn(&EngineState) -> Option<f64>;
    let gauges: [(&'static str, &'static str, &'static str, Pick); 3] = [
        (
            "tokentap.engine.kv_cache.usage",
            "1",
            "KV-cache use the engine reports (fraction 0-1)",
            |s| s.kv_cache_usage,
        ),
        (
            "tokentap.engine.requests.waiting",
            "{request}",
            "Requests queued in the engine, as it reports them",
            |s| s.requests_waiting,
        ),
        (
            "tokentap.engine.requests.running",
            "{request}",
            "Requests the engine is running, as it reports them",
            |s| s.requests_running,
        ),
    ];
    for (name, unit, desc, pick) in gauges {
        let st = states.clone();
        let _ = meter
            .f64_observable_gauge(name)
            .with_unit(unit)
            .with_description(desc)
            .with_callback(move |o| {
                let st = st.lock().unwrap_or_else(|p| p.into_inner());
                for (pid, (engine, port, s)) in st.iter() {
                    if let Some(v) = pick(s) {
                        o.observe(
                            v,
                            &[
                                KeyValue::new("gen_ai.provider.name", engine.clone()),
                                KeyValue::new("tokentap.engine.pid", *pid as i64),
                                KeyValue::new("server.port", *port as i64),
                            ],
                        );
                    }
                }
            })
            .build();
    }
}
