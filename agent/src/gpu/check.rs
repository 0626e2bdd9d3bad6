//! `tokentap gpu-check`: samples the GPUs through NVML for a while and
//! prints what the agent would see — per pass and device: utilisation,
//! memory, power, energy since the previous pass, per-process GPU memory —
//! and, for `--pid`, which GPUs that process tree uses (the engine ↔ GPU
//! map the request join relies on). For checking a GPU node by hand and
//! for `cargo xtask gpu-check`.
//!
//! Owns: the table. Must not: need eBPF or root beyond NVML's own rules.

use std::{path::PathBuf, time::Duration};

use anyhow::{bail, Result};

use super::{
    join::{device_energy_j, engine_gpus},
    sampler::{wall_ns, Availability, Sampler, SamplerConfig},
    task::snapshot,
    types::GpuSample,
};

pub fn run(
    library: Option<PathBuf>,
    interval: Duration,
    secs: f64,
    pid: Option<u32>,
) -> Result<()> {
    let mut sampler = Sampler::new(SamplerConfig {
        one_shot: true,
        ..SamplerConfig::new(library, interval)
    });
    if let Availability::Unavailable { reason } = sampler.status().availability {
        bail!("NVML is not available: {reason}");
    }
    println!(
        "{:>6} {:<42} {:>6} {:>6} {:>14} {:>8} {:>10} {:>6}  processes (pid:MiB)",
        "t_s", "GPU", "util", "mctl", "mem used/total", "power_W", "energy_J", "temp"
    );
    let start = std::time::Instant::now();
    let mut prev: Option<GpuSample> = None;
    let proc_root = PathBuf::from("/proc");
    let mut passes = 0;
    while start.elapsed().as_secs_f64() < secs {
        let Some(s) = sampler.sample(wall_ns()) else {
            bail!(
                "NVML stopped answering: {:?}",
                sampler.status().availability
            );
        };
        passes += 1;
        let t = start.elapsed().as_secs_f64();
        let f = |v: Option<f64>, scale: f64| {
            v.map(|x| format!("{:.1}", x * scale))
                .unwrap_or_else(|| "-".into())
        };
        for d in &s.devices {
            let energy = prev
                .as_ref()
                .and_then(|p| {
                    p.devices
                        .iter()
                        .find(|x| x.uuid == d.uuid)
                        .and_then(|pd| device_energy_j(pd, p.ts_ns, d, s.ts_ns))
                })
                .map(|(j, src)| format!("{j:.1}{}", if src.as_str() == "power" { "p" } else { "" }))
                .unwrap_or_else(|| "-".into());
            let mem = match (d.memory_used_bytes, d.memory_total_bytes) {
                (Some(u), Some(t)) => format!("{}/{} MiB", u >> 20, t >> 20),
                _ => "-".into(),
            };
            let procs: Vec<String> = d
                .processes
                .iter()
                .map(|p| {
                    format!(
                        "{}:{}",
                        p.pid,
                        p.used_bytes
                            .map(|b| (b >> 20).to_string())
                            .unwrap_or("-".into())
                    )
                })
                .collect();
            println!(
                "{t:>6.1} {:<42} {:>6} {:>6} {:>14} {:>8} {:>10} {:>6}  {}",
                d.uuid,
                f(d.util_gpu, 100.0),
                f(d.util_memory_controller, 100.0),
                mem,
                f(d.power_w, 1.0),
                energy,
                f(d.temperature_c, 1.0),
                procs.join(" ")
            );
        }
        if let Some(pid) = pid {
            let snap = snapshot(&proc_root, &s, &[pid]);
            let map = engine_gpus(&[pid], &s, &snap);
            match map.get(&pid) {
                Some(g) => println!(
                    "       engine map: pid {pid} -> {:?} (its processes on them: {:?})",
                    g.uuids,
                    g.processes.keys().collect::<Vec<_>>()
                ),
                None => println!("       engine map: pid {pid} -> no GPU (no process of its tree or container on one)"),
            }
        }
        prev = Some(s);
        std::thread::sleep(interval);
    }
    let st = sampler.status();
    println!(
        "{passes} passes; call failures: {}",
        if st.call_failures.is_empty() {
            "none".to_string()
        } else {
            format!("{:?}", st.call_failures)
        }
    );
    Ok(())
}
