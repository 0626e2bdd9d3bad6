//! GPU state next to request metrics: NVML sampling (`sampler`, on its own
//! thread), the device instruments (`instruments`), the engine ↔ GPU map
//! and per-request arithmetic (`join`), the pipeline stage that joins GPU
//! state into records (`stage`), the task that feeds it (`task`), and the
//! engine-level instruments (`engine_instruments`). `types` is the contract
//! between them.

pub mod check;
pub mod engine_instruments;
pub mod instruments;
pub mod join;
pub mod sampler;
pub mod stage;
pub mod task;
pub mod types {
    //! The sample contract, defined with the stage contracts
    //! (`stage::gpu`) so that they import no feature.
    pub use crate::stage::gpu::*;
}
