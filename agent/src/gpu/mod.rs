//! GPU state next to request metrics: NVML sampling, the engine ↔ GPU map,
//! per-request GPU fields and energy attribution.

pub mod engine_instruments;
pub mod join;
pub mod stage;
pub mod task;
pub mod types;
