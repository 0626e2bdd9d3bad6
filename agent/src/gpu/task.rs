//! The GPU task: takes samples from the sampler's thread and, for each,
//! reads what the join needs from /proc (ancestors and containers of the
//! processes on GPUs and of the engines), then queues both in
//! [`NodeState`] for the pipeline's GPU stage.
//!
//! Owns: the /proc reads of the join. Must not: call NVML (the sampler's
//! thread does) or block for long.

use std::path::PathBuf;

use anyhow::Result;

use super::{
    instruments::SharedGpu,
    join::ProcSnapshot,
    sampler::{Availability, SamplerHandle},
    types::GpuSample,
};
use crate::{
    host::procfs,
    stage::{Task, TaskCx},
};

pub struct GpuTask {
    sampler: SamplerHandle,
    /// The latest sample for the device instruments (`hw.*`).
    devices: SharedGpu,
    proc_root: PathBuf,
}

impl GpuTask {
    pub fn new(sampler: SamplerHandle, devices: SharedGpu, proc_root: PathBuf) -> Self {
        Self {
            sampler,
            devices,
            proc_root,
        }
    }
}

/// What the join needs of /proc for `sample` and these engines.
pub fn snapshot(proc_root: &std::path::Path, sample: &GpuSample, engines: &[u32]) -> ProcSnapshot {
    let mut snap = ProcSnapshot::default();
    for dev in &sample.devices {
        for p in &dev.processes {
            if snap.ancestors.contains_key(&p.pid) {
                continue;
            }
            snap.ancestors
                .insert(p.pid, procfs::ancestors(proc_root, p.pid));
            if let Some(c) = procfs::container_scope(proc_root, p.pid) {
                snap.container.insert(p.pid, c);
            }
        }
    }
    for &e in engines {
        if let Some(c) = procfs::container_scope(proc_root, e) {
            snap.container.insert(e, c);
        }
    }
    snap
}

impl Task for GpuTask {
    fn tick(&mut self, cx: &mut TaskCx<'_>) -> Result<()> {
        let mut got = false;
        while let Ok(sample) = self.sampler.samples().try_recv() {
            got = true;
            self.devices
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .update(sample.clone());
            let engines = cx.node.serving_pids();
            let snap = snapshot(&self.proc_root, &sample, &engines);
            cx.node.gpu_samples.push((sample, snap));
        }
        if !got
            && matches!(
                self.sampler.status().availability,
                Availability::Unavailable { .. }
            )
        {
            // No stale GPU gauges while NVML is gone, and no stale engine
            // map for the join.
            self.devices
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clear();
            cx.node.gpu_unavailable = true;
        }
        Ok(())
    }
}
