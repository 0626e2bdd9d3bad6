//! The NVML sampler through nvml-wrapper's real FFI path, against the
//! scripted fake `libnvidia-ml.so.1` (`tests/fakenvml`). No GPU and no
//! root needed.
//!
//! The fake keeps one scenario per process, so every test runs its body
//! in a child process of this binary ([`isolated`]); the parent checks what
//! the child printed (the sampler's stderr lines).

use std::{
    path::{Path, PathBuf},
    process::{Child, Command},
    time::{Duration, Instant},
};

use serde_json::{json, Value};
use tokentap::gpu::{
    sampler::{spawn, Availability, Sampler, SamplerConfig},
    types::{DeviceSample, GpuProcess, GpuSample},
};
use tokentap_tests::fakenvml::{fakenvml_path, install_fake_nvml, is_child, isolated};

/// A scratch directory for one child: scenario, calls file, library.
struct Scratch(PathBuf);

impl Scratch {
    fn new(test: &str) -> Self {
        let d = std::env::temp_dir().join(format!("tokentap-gpu-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("scratch dir");
        Self(d)
    }

    /// Writes `scenario` and points the fake at it and at a calls file.
    fn scenario(&self, scenario: &Value) {
        let p = self.0.join("scenario.json");
        std::fs::write(&p, serde_json::to_vec_pretty(scenario).unwrap()).unwrap();
        std::env::set_var("FAKE_NVML_SCENARIO", &p);
        std::env::set_var("FAKE_NVML_CALLS", self.calls_path());
    }

    fn calls_path(&self) -> PathBuf {
        self.0.join("calls.jsonl")
    }

    /// The fake's `init`/`shutdown` lines so far.
    fn calls(&self) -> Vec<Value> {
        std::fs::read_to_string(self.calls_path())
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("calls line"))
            .collect()
    }

    fn lib(&self) -> PathBuf {
        install_fake_nvml(&self.0)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn cfg(lib: &Path) -> SamplerConfig {
    SamplerConfig {
        library: Some(lib.to_path_buf()),
        interval: Duration::from_millis(50),
        retry_interval: Duration::from_millis(200),
        one_shot: false,
    }
}

/// A real process for the scenario's process lists; killed and reaped
/// on drop.
struct Sleeper(Child);

impl Sleeper {
    fn new() -> Self {
        Self(Command::new("sleep").arg("30").spawn().expect("sleep"))
    }

    fn id(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Sleeper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn gpu_values(util: u32, energy_mj: u64, pids: &[u32]) -> Value {
    json!({
        "util_gpu": util, "util_memory": util / 2,
        "memory_total": 85_899_345_920u64, "memory_used": 21_474_836_480u64 + u64::from(util),
        "memory_reserved": 536_870_912u64,
        "power_mw": 250_500 + util, "energy_mj": energy_mj, "temperature_c": 60 + util % 10,
        "sm_clock_mhz": 1980, "clocks_event_reasons": 0x1 | 0x4,
        "compute_processes": pids.iter().map(|p| json!({"pid": p, "used_bytes": 1_073_741_824u64})).collect::<Vec<_>>(),
    })
}

/// Two plain GPUs and one with MIG enabled (two instances).
fn three_gpus(pids: &[u32]) -> Value {
    let mut gpu0 = gpu_values(37, 1_000_000, pids);
    // Two samples of the first process, none of the second.
    gpu0["process_utilization"] = json!([
        {"pid": pids[0], "sm_util": 40, "mem_util": 3},
        {"pid": pids[0], "sm_util": 61, "mem_util": 3}
    ]);
    json!({
        "devices": [
            {"uuid": "GPU-00000000-0000-0000-0000-000000000000", "name": "NVIDIA H100 80GB HBM3"},
            {"uuid": "GPU-11111111-1111-1111-1111-111111111111", "name": "NVIDIA H100 80GB HBM3"},
            {"uuid": "GPU-22222222-2222-2222-2222-222222222222", "name": "NVIDIA A100-SXM4-40GB",
             "mig": [
                {"uuid": "MIG-aaaaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaaaa", "name": "NVIDIA A100-SXM4-40GB MIG 1g.5gb"},
                {"uuid": "MIG-bbbbbbbb-bbbb-bbbb-bbbb-bbbbbbbbbbbb", "name": "NVIDIA A100-SXM4-40GB MIG 3g.20gb"}
             ]}
        ],
        "steps": [
            {"t_ms": 0, "devices": [
                gpu0,
                {
                    "util_gpu": 0, "util_memory": 0,
                    "memory_total": 85_899_345_920u64, "memory_used": 0,
                    "power_mw": 70_000, "energy_mj": 5_000, "temperature_c": 30,
                    "sm_clock_mhz": 345, "clocks_event_reasons": 0x1,
                    "graphics_processes": [{"pid": pids[0], "used_bytes": null}]
                },
                {
                    "util_gpu": 80, "util_memory": 40,
                    "memory_total": 42_949_672_960u64, "memory_used": 10_737_418_240u64,
                    "power_mw": 300_000, "energy_mj": 9_000_000, "temperature_c": 70,
                    "sm_clock_mhz": 1410, "clocks_event_reasons": 0x40 | 0x80,
                    "mig": [
                        {"memory_total": 5_368_709_120u64, "memory_used": 1_073_741_824u64,
                         "compute_processes": [{"pid": pids[1], "used_bytes": 805_306_368u64}]},
                        {"memory_total": 21_474_836_480u64, "memory_used": 0}
                    ]
                }
            ]}
        ]
    })
}

fn own_pid() -> u32 {
    std::process::id()
}

#[test]
fn every_field_is_sampled_as_scripted_with_units_converted() {
    const NAME: &str = "every_field_is_sampled_as_scripted_with_units_converted";
    if !is_child(NAME) {
        isolated(NAME, &[]);
        return;
    }
    let s = Scratch::new(NAME);
    let child = Sleeper::new();
    let pids = [own_pid(), child.id()];
    s.scenario(&three_gpus(&pids));
    let mut sampler = Sampler::new(cfg(&s.lib()));
    let sample = sampler.sample(42).expect("a sample");
    drop(child);
    assert_eq!(sample.ts_ns, 42);
    let uuids: Vec<_> = sample.devices.iter().map(|d| d.uuid.as_str()).collect();
    assert_eq!(
        uuids,
        [
            "GPU-00000000-0000-0000-0000-000000000000",
            "GPU-11111111-1111-1111-1111-111111111111",
            "GPU-22222222-2222-2222-2222-222222222222",
            "MIG-aaaaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaaaa",
            "MIG-bbbbbbbb-bbbb-bbbb-bbbb-bbbbbbbbbbbb",
        ]
    );
    let d0 = &sample.devices[0];
    assert_eq!(
        d0,
        &DeviceSample {
            index: 0,
            uuid: "GPU-00000000-0000-0000-0000-000000000000".into(),
            name: "NVIDIA H100 80GB HBM3".into(),
            parent_uuid: None,
            util_gpu: Some(0.37),
            util_memory_controller: Some(0.18),
            memory_used_bytes: Some(21_474_836_480 + 37),
            memory_total_bytes: Some(85_899_345_920),
            power_w: Some(250.537),
            energy_total_mj: Some(1_000_000),
            temperature_c: Some(67.0),
            sm_clock_mhz: Some(1980),
            throttle_reasons: Some(vec!["sw_power_cap".into()]),
            processes: {
                let mut p: Vec<_> = pids
                    .iter()
                    .map(|&pid| GpuProcess {
                        pid,
                        used_bytes: Some(1_073_741_824),
                        sm_util: (pid == pids[0]).then_some(0.505),
                    })
                    .collect();
                p.sort_by_key(|p| p.pid);
                p
            },
        }
    );
    let d1 = &sample.devices[1];
    assert_eq!(d1.index, 1);
    assert_eq!(
        d1.throttle_reasons,
        Some(vec![]),
        "idle alone is not throttling"
    );
    assert_eq!((d1.util_gpu, d1.power_w), (Some(0.0), Some(70.0)));
    assert_eq!(
        d1.processes,
        vec![GpuProcess {
            pid: pids[0],
            used_bytes: None,
            sm_util: None,
        }],
        "graphics list; NVML_VALUE_NOT_AVAILABLE is None"
    );
    let d2 = &sample.devices[2];
    assert_eq!(
        d2.throttle_reasons,
        Some(vec![
            "hw_thermal_slowdown".to_string(),
            "hw_power_brake_slowdown".to_string()
        ])
    );
    assert_eq!((d2.util_gpu, d2.sm_clock_mhz), (Some(0.8), Some(1410)));
    assert_eq!(d2.parent_uuid, None);
    for (m, total, used) in [
        (&sample.devices[3], 5_368_709_120, 1_073_741_824),
        (&sample.devices[4], 21_474_836_480, 0),
    ] {
        assert_eq!(m.index, 2, "a MIG instance carries its parent's index");
        assert_eq!(m.parent_uuid.as_deref(), Some(d2.uuid.as_str()));
        assert!(m.name.contains("MIG"), "{}", m.name);
        assert_eq!(
            (m.memory_total_bytes, m.memory_used_bytes),
            (Some(total), Some(used))
        );
        // Readings the script leaves out are NOT_SUPPORTED, as on MIG.
        assert_eq!(
            (m.util_gpu, m.power_w, m.energy_total_mj, m.temperature_c),
            (None, None, None, None)
        );
    }
    assert_eq!(
        sample.devices[3].processes,
        vec![GpuProcess {
            pid: pids[1],
            used_bytes: Some(805_306_368),
            sm_util: None,
        }]
    );
    // A second pass in the same step: no new per-process samples
    // (NOT_FOUND), so no utilisation, and that is not a failure.
    let again = sampler.sample(43).expect("a second sample");
    assert!(again.devices[0]
        .processes
        .iter()
        .all(|p| p.sm_util.is_none()));
    assert_eq!(again.devices[0].processes.len(), 2);
    let st = sampler.status();
    assert_eq!(st.availability, Availability::Ok { devices: 5 });
    assert!(
        !st.call_failures
            .keys()
            .any(|k| k.contains("ProcessUtilization")),
        "{:?}",
        st.call_failures
    );
    assert_eq!(
        st.call_failures
            .get("nvmlDeviceGetPowerUsage: NOT_SUPPORTED"),
        Some(&4),
        "two MIG instances, two passes: {:?}",
        st.call_failures
    );
    assert_eq!(st.notices, 0);
}

#[test]
fn values_follow_the_scripted_time_steps() {
    const NAME: &str = "values_follow_the_scripted_time_steps";
    if !is_child(NAME) {
        isolated(NAME, &[]);
        return;
    }
    let s = Scratch::new(NAME);
    let pid = own_pid();
    let mut later = gpu_values(90, 1_250_000, &[pid]);
    later["process_utilization"] = json!([{"pid": pid, "sm_util": 70}]);
    s.scenario(&json!({
        "devices": [{"uuid": "GPU-0", "name": "NVIDIA L4"}],
        "steps": [
            {"t_ms": 0, "devices": [gpu_values(10, 1_000_000, &[])]},
            {"t_ms": 2500, "devices": [later]}
        ]
    }));
    // Steps 2.5 s apart: a loaded 2-core machine's pauses stay inside one.
    let started = Instant::now();
    let mut sampler = Sampler::new(cfg(&s.lib()));
    let first = sampler.sample(1).expect("first sample");
    assert!(
        started.elapsed() < Duration::from_millis(2300),
        "the first pass must land in the first step"
    );
    std::thread::sleep(Duration::from_millis(2700).saturating_sub(started.elapsed()));
    let second = sampler.sample(2).expect("second sample");
    let (a, b) = (&first.devices[0], &second.devices[0]);
    assert_eq!((a.util_gpu, b.util_gpu), (Some(0.1), Some(0.9)));
    assert_eq!(
        (a.energy_total_mj, b.energy_total_mj),
        (Some(1_000_000), Some(1_250_000))
    );
    assert_eq!((a.processes.len(), b.processes.len()), (0, 1));
    assert_eq!(b.processes[0].pid, pid);
    assert_eq!(b.processes[0].sm_util, Some(0.7));
}

#[test]
fn process_lists_longer_than_the_first_buffer_are_read_whole() {
    const NAME: &str = "process_lists_longer_than_the_first_buffer_are_read_whole";
    if !is_child(NAME) {
        isolated(NAME, &[]);
        return;
    }
    let s = Scratch::new(NAME);
    let child = Sleeper::new();
    // 40 compute processes (more than the sampler's first buffer of 16)
    // and 10 graphics ones, 5 of them in both lists.
    let mut compute: Vec<u32> = (0..38).map(|i| 100_000 + i).collect();
    compute.extend([own_pid(), child.id()]);
    let graphics: Vec<u32> = (33..43).map(|i| 100_000 + i).collect();
    s.scenario(&json!({
        "devices": [{"uuid": "GPU-0", "name": "NVIDIA H100"}],
        "steps": [{"t_ms": 0, "devices": [{
            "compute_processes": compute.iter().map(|p| json!({"pid": p, "used_bytes": u64::from(*p) * 2})).collect::<Vec<_>>(),
            "graphics_processes": graphics.iter().map(|p| json!({"pid": p, "used_bytes": u64::from(*p)})).collect::<Vec<_>>(),
        }]}]
    }));
    let mut sampler = Sampler::new(cfg(&s.lib()));
    let sample = sampler.sample(1).expect("a sample");
    drop(child);
    let procs = &sample.devices[0].processes;
    let mut want: Vec<u32> = compute.iter().chain(&graphics).copied().collect();
    want.sort_unstable();
    want.dedup();
    assert_eq!(want.len(), 45);
    assert_eq!(procs.iter().map(|p| p.pid).collect::<Vec<_>>(), want);
    for p in procs {
        let in_compute = compute.contains(&p.pid);
        let expect = if in_compute {
            u64::from(p.pid) * 2 // the larger of the two lists' values
        } else {
            u64::from(p.pid)
        };
        assert_eq!(p.used_bytes, Some(expect), "pid {}", p.pid);
    }
    drop(sampler);
    let calls = s.calls();
    let shutdown = calls
        .iter()
        .find(|c| c["event"] == "shutdown")
        .expect("shutdown line");
    assert_eq!(
        shutdown["calls"]["nvmlDeviceGetComputeRunningProcesses_v3"], 2,
        "INSUFFICIENT_SIZE, then the list: {shutdown}"
    );
    assert_eq!(
        shutdown["calls"]["nvmlDeviceGetGraphicsRunningProcesses_v3"], 1,
        "10 fit the first buffer: {shutdown}"
    );
}

#[test]
fn a_failing_call_leaves_only_its_field_empty() {
    const NAME: &str = "a_failing_call_leaves_only_its_field_empty";
    if !is_child(NAME) {
        isolated(NAME, &[]);
        return;
    }
    let s = Scratch::new(NAME);
    let mut step0 = gpu_values(50, 7_000, &[own_pid()]);
    step0["errors"] = json!({"nvmlDeviceGetTemperature": "NO_PERMISSION"});
    s.scenario(&json!({
        "devices": [
            {"uuid": "GPU-0", "name": "NVIDIA T4",
             "errors": {"nvmlDeviceGetPowerUsage": "NOT_SUPPORTED",
                        "nvmlDeviceGetComputeRunningProcesses_v3": "NOT_SUPPORTED"}},
            {"uuid": "GPU-1", "name": "NVIDIA T4"}
        ],
        "steps": [{"t_ms": 0, "devices": [gpu_values(50, 7_000, &[own_pid()]), step0]}]
    }));
    let mut sampler = Sampler::new(cfg(&s.lib()));
    for pass in 1..=3u64 {
        let sample = sampler.sample(pass).expect("a sample");
        let (d0, d1) = (&sample.devices[0], &sample.devices[1]);
        assert_eq!(d0.power_w, None);
        assert!(d0.processes.is_empty(), "the compute list failed");
        assert_eq!(d0.temperature_c, Some(60.0));
        assert_eq!(d1.temperature_c, None);
        assert_eq!(d1.power_w, Some(250.55));
        assert_eq!(d1.processes.len(), 1);
        // Everything else is there on both.
        for d in [d0, d1] {
            assert_eq!(d.util_gpu, Some(0.5));
            assert_eq!(d.energy_total_mj, Some(7_000));
            assert_eq!(d.sm_clock_mhz, Some(1980));
            assert!(d.memory_total_bytes.is_some() && d.throttle_reasons.is_some());
        }
        let st = sampler.status();
        assert_eq!(
            st.call_failures
                .get("nvmlDeviceGetPowerUsage: NOT_SUPPORTED"),
            Some(&pass)
        );
        assert_eq!(
            st.call_failures
                .get("nvmlDeviceGetTemperature: NO_PERMISSION"),
            Some(&pass)
        );
        assert_eq!(st.call_failures_total(), 3 * pass);
        assert_eq!(st.notices, 0, "per-call failures are counted, not printed");
    }
}

#[test]
fn a_gpu_lost_mid_run_is_dropped_and_the_others_go_on() {
    const NAME: &str = "a_gpu_lost_mid_run_is_dropped_and_the_others_go_on";
    if !is_child(NAME) {
        let out = isolated(NAME, &[]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let lost: Vec<_> = stderr.lines().filter(|l| l.contains("is lost")).collect();
        assert_eq!(lost.len(), 2, "one line per lost GPU, once:\n{stderr}");
        assert!(lost[0].contains("GPU-1 (NVIDIA H100)") && lost[0].contains("GPU_IS_LOST"));
        assert!(lost[1].contains("GPU-2") && lost[1].contains("UNKNOWN"));
        return;
    }
    let s = Scratch::new(NAME);
    let ok = gpu_values(20, 1_000, &[]);
    let mut lost = ok.clone();
    lost["lost"] = json!(true);
    let mut unknown = ok.clone();
    unknown["errors"] = json!({"nvmlDeviceGetUtilizationRates": "UNKNOWN"});
    s.scenario(&json!({
        "devices": [
            {"uuid": "GPU-0", "name": "NVIDIA H100"},
            {"uuid": "GPU-1", "name": "NVIDIA H100"},
            {"uuid": "GPU-2", "name": "NVIDIA H100"}
        ],
        "steps": [
            {"t_ms": 0, "devices": [ok, ok, ok]},
            {"t_ms": 2000, "devices": [ok, lost, unknown]}
        ]
    }));
    // Steps 2 s apart: a loaded 2-core machine's pauses stay inside one.
    let started = Instant::now();
    let mut sampler = Sampler::new(cfg(&s.lib()));
    assert_eq!(sampler.sample(1).expect("a sample").devices.len(), 3);
    std::thread::sleep(Duration::from_millis(2200).saturating_sub(started.elapsed()));
    for pass in 1..=3 {
        let sample = sampler.sample(2).expect("the sampler goes on");
        let uuids: Vec<_> = sample.devices.iter().map(|d| d.uuid.as_str()).collect();
        assert_eq!(uuids, ["GPU-0"]);
        assert_eq!(sample.devices[0].util_gpu, Some(0.2));
        let st = sampler.status();
        assert_eq!(st.availability, Availability::Ok { devices: 1 });
        assert_eq!(st.devices_dropped, 2 * pass);
        assert_eq!(st.notices, 2, "said once per GPU");
    }
}

#[test]
fn every_gpu_lost_reinitialises_nvml() {
    const NAME: &str = "every_gpu_lost_reinitialises_nvml";
    if !is_child(NAME) {
        isolated(NAME, &[]);
        return;
    }
    let s = Scratch::new(NAME);
    let ok = gpu_values(20, 1_000, &[]);
    let mut lost = ok.clone();
    lost["lost"] = json!(true);
    // The fake's clock restarts at each nvmlInit: after re-initialising,
    // the GPU is back (as after a driver reload).
    s.scenario(&json!({
        "devices": [{"uuid": "GPU-0", "name": "NVIDIA H100"}],
        "steps": [{"t_ms": 0, "devices": [ok]}, {"t_ms": 2000, "devices": [lost]}]
    }));
    // Steps 2 s apart: a loaded 2-core machine's pauses stay inside one.
    let started = Instant::now();
    let mut sampler = Sampler::new(cfg(&s.lib()));
    assert!(sampler.sample(1).is_some());
    std::thread::sleep(Duration::from_millis(2100).saturating_sub(started.elapsed()));
    assert_eq!(sampler.sample(2), None, "every GPU lost");
    let Availability::Unavailable { reason } = sampler.status().availability else {
        panic!("still available");
    };
    assert!(reason.contains("every GPU is lost"), "{reason}");
    let calls = s.calls();
    assert_eq!(
        calls.iter().filter(|c| c["event"] == "shutdown").count(),
        1,
        "NVML shut down: {calls:?}"
    );
    assert_eq!(sampler.sample(3), None, "not before the retry interval");
    std::thread::sleep(Duration::from_millis(250));
    let back = sampler.sample(4).expect("re-initialised");
    assert_eq!(back.devices.len(), 1);
    assert_eq!(sampler.status().init_attempts, 2);
    assert_eq!(s.calls().iter().filter(|c| c["event"] == "init").count(), 2);
}

#[test]
fn without_a_library_sampling_is_off_said_once_and_retry_finds_it() {
    const NAME: &str = "without_a_library_sampling_is_off_said_once_and_retry_finds_it";
    if !is_child(NAME) {
        let out = isolated(NAME, &[]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let off: Vec<_> = stderr
            .lines()
            .filter(|l| l.contains("GPU metrics off"))
            .collect();
        assert_eq!(off.len(), 1, "the cause once:\n{stderr}");
        assert!(
            off[0].contains("cannot be loaded") && off[0].contains("requests are still measured")
        );
        assert_eq!(
            stderr
                .lines()
                .filter(|l| l.contains("available again"))
                .count(),
            1,
            "{stderr}"
        );
        return;
    }
    let s = Scratch::new(NAME);
    s.scenario(&json!({
        "devices": [{"uuid": "GPU-0", "name": "NVIDIA L4"}],
        "steps": [{"t_ms": 0, "devices": [gpu_values(5, 1, &[])]}]
    }));
    let lib = s.0.join("libnvidia-ml.so.1");
    let mut sampler = Sampler::new(cfg(&lib));
    for t in 0..4 {
        assert_eq!(sampler.sample(t), None);
        std::thread::sleep(Duration::from_millis(100));
    }
    let st = sampler.status();
    assert!(st.init_attempts >= 2, "retried: {st:?}");
    assert_eq!(st.notices, 1);
    let Availability::Unavailable { reason } = st.availability else {
        panic!("available without a library");
    };
    assert!(reason.contains(&lib.display().to_string()), "{reason}");
    // The library appears (driver installed): the next retry finds it.
    std::fs::copy(fakenvml_path(), &lib).unwrap();
    std::thread::sleep(Duration::from_millis(250));
    let sample = sampler.sample(9).expect("NVML found on retry");
    assert_eq!(sample.devices[0].util_gpu, Some(0.05));
    assert_eq!(
        sampler.status().availability,
        Availability::Ok { devices: 1 }
    );
}

#[test]
fn driver_not_loaded_at_init_is_named() {
    const NAME: &str = "driver_not_loaded_at_init_is_named";
    if !is_child(NAME) {
        let out = isolated(NAME, &[]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            stderr
                .lines()
                .filter(|l| l.contains("kernel driver is not loaded"))
                .count(),
            1,
            "{stderr}"
        );
        return;
    }
    let s = Scratch::new(NAME);
    s.scenario(&json!({"init_error": "DRIVER_NOT_LOADED", "devices": []}));
    let mut sampler = Sampler::new(cfg(&s.lib()));
    assert_eq!(sampler.sample(1), None);
    std::thread::sleep(Duration::from_millis(250));
    assert_eq!(sampler.sample(2), None);
    let st = sampler.status();
    assert_eq!(st.init_attempts, 2);
    assert_eq!(st.notices, 1);
    assert!(
        matches!(st.availability, Availability::Unavailable { ref reason } if reason.contains("DRIVER") || reason.contains("driver"))
    );
    // The fake answered init twice with the error and was never shut down.
    let calls = s.calls();
    assert_eq!(
        calls
            .iter()
            .filter(|c| c["event"] == "init" && c["result"] == 9)
            .count(),
        2,
        "{calls:?}"
    );
    assert!(!calls.iter().any(|c| c["event"] == "shutdown"));
}

#[test]
fn the_sampler_thread_stops_and_shuts_nvml_down_on_drop() {
    const NAME: &str = "the_sampler_thread_stops_and_shuts_nvml_down_on_drop";
    if !is_child(NAME) {
        isolated(NAME, &[]);
        return;
    }
    let s = Scratch::new(NAME);
    s.scenario(&three_gpus(&[own_pid(), own_pid()]));
    let mut c = cfg(&s.lib());
    c.interval = Duration::from_millis(30);
    let handle = spawn(c);
    let samples: Vec<GpuSample> = (0..3)
        .map(|_| {
            handle
                .samples()
                .recv_timeout(Duration::from_secs(5))
                .expect("a sample from the thread")
        })
        .collect();
    assert!(samples.windows(2).all(|w| w[0].ts_ns < w[1].ts_ns));
    assert!(samples.iter().all(|s| s.devices.len() == 5));
    assert_eq!(
        handle.status().availability,
        Availability::Ok { devices: 5 }
    );
    let t = Instant::now();
    drop(handle);
    // A pass takes milliseconds; 3 s leaves a loaded machine its pauses.
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "drop waits for a pass at most ({:?})",
        t.elapsed()
    );
    let calls = s.calls();
    let shutdowns: Vec<_> = calls.iter().filter(|c| c["event"] == "shutdown").collect();
    assert_eq!(shutdowns.len(), 1, "{calls:?}");
    let passes = shutdowns[0]["calls"]["nvmlDeviceGetCount_v2"]
        .as_u64()
        .unwrap();
    assert!(passes >= 3, "{}", shutdowns[0]);

    // A slow interval: drop still returns at once.
    let handle = spawn(SamplerConfig {
        interval: Duration::from_secs(60),
        ..cfg(&s.lib())
    });
    handle
        .samples()
        .recv_timeout(Duration::from_secs(5))
        .expect("the first pass is immediate");
    let t = Instant::now();
    drop(handle);
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "drop waited for the 60 s interval ({:?})",
        t.elapsed()
    );
    assert_eq!(
        s.calls()
            .iter()
            .filter(|c| c["event"] == "shutdown")
            .count(),
        2
    );
}

/// Benchmark row: sampler CPU per pass with 8 GPUs × 64 processes each
/// (median of 50 passes). Prints `gpu-sampler-bench: …`; run with
/// `--nocapture` to see it.
#[test]
fn sampler_cpu_per_pass_with_8_gpus_and_64_processes() {
    const NAME: &str = "sampler_cpu_per_pass_with_8_gpus_and_64_processes";
    if !is_child(NAME) {
        let out = isolated(NAME, &[]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        // libtest prints "test NAME ... " before the test's own output.
        let line = stdout
            .lines()
            .find_map(|l| l.find("gpu-sampler-bench:").map(|i| &l[i..]))
            .expect("the benchmark line");
        eprintln!("{line}");
        return;
    }
    let s = Scratch::new(NAME);
    let devices: Vec<Value> = (0..8)
        .map(|i| json!({"uuid": format!("GPU-{i}"), "name": "NVIDIA H100 80GB HBM3"}))
        .collect();
    let values: Vec<Value> = (0..8u32)
        .map(|i| {
            let pids: Vec<u32> = (0..64).map(|p| 200_000 + i * 64 + p).collect();
            gpu_values(i * 10, 1_000_000, &pids)
        })
        .collect();
    s.scenario(&json!({"devices": devices, "steps": [{"t_ms": 0, "devices": values}]}));
    let mut sampler = Sampler::new(cfg(&s.lib()));
    let mut cpu_ns = Vec::with_capacity(50);
    for pass in 0..50 {
        let t0 = tokentap::host::thread_cpu_ns();
        let sample = sampler.sample(pass).expect("a sample");
        cpu_ns.push(tokentap::host::thread_cpu_ns() - t0);
        assert_eq!(sample.devices.len(), 8);
        assert!(sample.devices.iter().all(|d| d.processes.len() == 64));
    }
    cpu_ns.sort_unstable();
    let median_us = cpu_ns[25] as f64 / 1000.0;
    println!(
        "gpu-sampler-bench: 8 GPUs x 64 processes, fake NVML: median {median_us:.0} µs CPU per pass \
         (min {:.0}, max {:.0}; {} build)",
        cpu_ns[0] as f64 / 1000.0,
        cpu_ns[49] as f64 / 1000.0,
        if cfg!(debug_assertions) { "debug" } else { "release" }
    );
    assert_eq!(sampler.status().call_failures_total(), 0);
}

#[test]
fn gpu_check_prints_what_nvml_shows_or_one_line_saying_why_it_cannot() {
    let s = Scratch::new("gpu-check");
    let scenario = s.0.join("scenario.json");
    std::fs::write(
        &scenario,
        serde_json::to_vec(&json!({
            "devices": [{"uuid": "GPU-check-0", "name": "NVIDIA L4"}],
            "steps": [{"t_ms": 0, "devices": [gpu_values(42, 1_000_000, &[])]}]
        }))
        .unwrap(),
    )
    .unwrap();
    let check = |lib: &Path| {
        std::process::Command::new(tokentap_tests::tokentap_bin())
            .args(["gpu-check", "--secs", "0.5", "--interval", "0.2"])
            .arg("--nvml-library")
            .arg(lib)
            .env("FAKE_NVML_SCENARIO", &scenario)
            .env("FAKE_NVML_CALLS", s.calls_path())
            .output()
            .unwrap()
    };
    let out = check(&s.lib());
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stderr}");
    assert!(
        stdout.contains("GPU-check-0") && stdout.contains("42.0"),
        "{stdout}"
    );
    // No library: one error line naming the cause, and no promise to retry
    // (gpu-check looks once).
    let out = check(&s.0.join("missing/libnvidia-ml.so.1"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("NVML is not available") && stderr.contains("cannot be loaded"),
        "{stderr}"
    );
    assert!(!stderr.contains("retrying"), "{stderr}");
}
