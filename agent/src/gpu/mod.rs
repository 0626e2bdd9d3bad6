//! GPU state next to request metrics: NVML sampling, the engine ↔ GPU map,
//! per-request GPU fields and energy attribution.

pub mod instruments;
pub mod sampler;
pub mod types;
