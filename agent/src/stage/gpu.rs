//! What a GPU sample says: the contract between the NVML sampler
//! (`gpu/sampler.rs`), the engine ↔ GPU join (`gpu/join.rs`) and the OTLP
//! GPU instruments. Plain data: no NVML types leak past the sampler.
//!
//! Owns: the sample types and their units, and the /proc facts the join
//! needs with a sample (`ProcSnapshot`): plain data the pipeline's
//! `NodeState` carries from the GPU task to the GPU stage. Must not: call
//! NVML. (Here, below the features, so that `stage` imports no feature.)

use std::collections::HashMap;

/// One sampling pass over every GPU (and MIG instance) NVML shows.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuSample {
    /// Wall-clock UNIX-epoch nanoseconds when the pass started.
    pub ts_ns: u64,
    pub devices: Vec<DeviceSample>,
}

/// One device at one instant. Every reading is optional: a call that
/// failed or is not supported on this device leaves only its field empty.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DeviceSample {
    /// NVML index (of the parent GPU for a MIG instance).
    pub index: u32,
    /// `GPU-…` UUID (`MIG-…` for a MIG instance): `hw.id`.
    pub uuid: String,
    /// Product name: `hw.name`.
    pub name: String,
    /// The parent GPU's UUID for a MIG instance: `hw.parent`.
    pub parent_uuid: Option<String>,
    /// GPU utilisation over NVML's last sample period, fraction 0–1.
    pub util_gpu: Option<f64>,
    /// Memory-controller utilisation, fraction 0–1.
    pub util_memory_controller: Option<f64>,
    pub memory_used_bytes: Option<u64>,
    pub memory_total_bytes: Option<u64>,
    pub power_w: Option<f64>,
    /// Total energy since the driver loaded, in millijoules (a counter; it
    /// resets when the driver reloads).
    pub energy_total_mj: Option<u64>,
    pub temperature_c: Option<f64>,
    pub sm_clock_mhz: Option<u32>,
    /// Active clock throttle / event reasons other than idle, as names
    /// (`sw_power_cap`, `hw_slowdown`, `sw_thermal_slowdown`,
    /// `hw_thermal_slowdown`, `hw_power_brake_slowdown`, `sync_boost`,
    /// `applications_clocks_setting`, `display_clock_setting`, …); empty:
    /// not throttled; None: unknown.
    pub throttle_reasons: Option<Vec<String>>,
    /// Processes with a context on this device (compute and graphics lists
    /// merged by pid), host PIDs.
    pub processes: Vec<GpuProcess>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuProcess {
    pub pid: u32,
    /// GPU memory the process holds on this device; None when NVML cannot
    /// say (e.g. under some virtualisation / MIG set-ups).
    pub used_bytes: Option<u64>,
    /// The process's SM utilisation, fraction 0-1: the mean of NVML's
    /// per-process samples since the previous pass. None when NVML has no
    /// sample for it in that window (`NOT_FOUND`: nothing new; NVML only
    /// reports processes with non-zero use) or cannot say.
    pub sm_util: Option<f64>,
}

/// What the join needs to know about processes (built from /proc by the
/// GPU task).
#[derive(Clone, Debug, Default)]
pub struct ProcSnapshot {
    /// Ancestors of each GPU process, nearest first (parent, grandparent, …).
    pub ancestors: HashMap<u32, Vec<u32>>,
    /// Container scope (the cgroup path of a container: kubepods, docker,
    /// containerd, CRI-O, podman) of GPU processes and engines; absent for
    /// processes outside a container (a shared system or user slice is not
    /// a container).
    pub container: HashMap<u32, String>,
}
