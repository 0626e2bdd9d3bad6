//! GPU state next to request metrics: NVML sampling, the engine ↔ GPU map,
//! per-request GPU fields and energy attribution.

pub mod join;
pub mod stage;
pub mod types;
