//! A scripted stand-in for `libnvidia-ml.so.1`, so the GPU sampler is
//! tested through nvml-wrapper's real FFI path (libloading, symbols by
//! name, C structs) on machines without a GPU.
//!
//! Owns: the NVML entry points the sampler calls, with NVML's C signatures
//! (types from `nvml-wrapper-sys`, the bindings nvml-wrapper itself uses)
//! and NVML's calling protocols: versioned structs (`nvmlMemory_v2_t`'s
//! `version` is checked), the two-call process-list protocol
//! (`INSUFFICIENT_SIZE` and the needed count), `NOT_FOUND` for process
//! utilisation with no sample since the caller's timestamp, MIG handles
//! (`NOT_FOUND` past the last instance), reference-counted init/shutdown. Must not:
//! pretend anything the scenario did not script; panic across the C ABI
//! (every entry point catches and answers `NVML_ERROR_UNKNOWN`).
//!
//! nvml-wrapper looks every symbol up when it loads the library but keeps
//! a missing one as an error that surfaces only when that function is
//! called, so only the functions the sampler uses are exported; anything
//! else reads as `FailedToLoadSymbol` in the caller — a loud failure, not
//! a silent default.
//!
//! The scenario (JSON, at `FAKE_NVML_SCENARIO`, read at every successful
//! or failing `nvmlInit_v2`) — one per process, the state is global:
//!
//! ```json
//! {
//!   "init_error": "DRIVER_NOT_LOADED",            // optional: nvmlInit fails so
//!   "driver_version": "550.54.15",                // optional
//!   "devices": [                                  // static identity, by index
//!     { "uuid": "GPU-…", "name": "NVIDIA H100",
//!       "errors": { "nvmlDeviceGetPowerUsage": "NOT_SUPPORTED" },   // every step
//!       "mig": [ { "uuid": "MIG-…", "name": "NVIDIA H100 MIG 1g.10gb" } ] }
//!   ],
//!   "steps": [                                    // served: the last with t_ms <= ms since init
//!     { "t_ms": 0, "devices": [                   // by index, like "devices"
//!       { "util_gpu": 37, "util_memory": 12,      // percent
//!         "memory_total": 85899345920, "memory_used": 1073741824, "memory_reserved": 0,
//!         "power_mw": 250000, "energy_mj": 123456789, "temperature_c": 61,
//!         "sm_clock_mhz": 1980, "clocks_event_reasons": 4,   // NVML bit mask
//!         "compute_processes": [ { "pid": 1234, "used_bytes": 1048576 } ],
//!         "graphics_processes": [ { "pid": 1234, "used_bytes": null } ],  // null: NVML_VALUE_NOT_AVAILABLE
//!         "process_utilization": [ { "pid": 1234, "sm_util": 40, "mem_util": 5 } ],  // none: NOT_FOUND
//!         "errors": { "nvmlDeviceGetTemperature": "NO_PERMISSION" },
//!         "lost": false,                          // true: GPU_IS_LOST on every call
//!         "mig": [ { …the same keys, per MIG instance… } ] } ] }
//!   ]
//! }
//! ```
//!
//! A value left out of a step makes its call answer `NOT_SUPPORTED`.
//! With `FAKE_NVML_CALLS=path`, each `nvmlInit_v2` appends
//! `{"event":"init","result":N}` and each `nvmlShutdown` appends
//! `{"event":"shutdown","calls":{name:count,…}}` (calls since that init).

#![allow(non_snake_case, non_upper_case_globals)]

use std::{
    collections::BTreeMap,
    ffi::{c_char, c_uint, c_ulonglong},
    io::Write,
    panic::{catch_unwind, AssertUnwindSafe},
    sync::Mutex,
    time::Instant,
};

use nvml_wrapper_sys::bindings::*;
use serde::Deserialize;

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Scenario {
    #[serde(default)]
    init_error: Option<String>,
    #[serde(default)]
    driver_version: Option<String>,
    #[serde(default)]
    devices: Vec<DeviceIdentity>,
    #[serde(default)]
    steps: Vec<Step>,
}

#[derive(Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
struct DeviceIdentity {
    uuid: String,
    name: String,
    #[serde(default)]
    errors: BTreeMap<String, String>,
    #[serde(default)]
    mig: Vec<DeviceIdentity>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Step {
    t_ms: u64,
    #[serde(default)]
    devices: Vec<Values>,
}

#[derive(Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
struct Values {
    util_gpu: Option<u32>,
    util_memory: Option<u32>,
    memory_total: Option<u64>,
    memory_used: Option<u64>,
    memory_reserved: Option<u64>,
    power_mw: Option<u32>,
    energy_mj: Option<u64>,
    temperature_c: Option<u32>,
    sm_clock_mhz: Option<u32>,
    clocks_event_reasons: Option<u64>,
    #[serde(default)]
    compute_processes: Vec<Proc>,
    #[serde(default)]
    graphics_processes: Vec<Proc>,
    #[serde(default)]
    process_utilization: Vec<ProcUtil>,
    #[serde(default)]
    errors: BTreeMap<String, String>,
    #[serde(default)]
    lost: bool,
    #[serde(default)]
    mig: Vec<Values>,
}

/// A device the current step says nothing about: every reading
/// `NOT_SUPPORTED`, no processes.
static NO_VALUES: Values = Values {
    util_gpu: None,
    util_memory: None,
    memory_total: None,
    memory_used: None,
    memory_reserved: None,
    power_mw: None,
    energy_mj: None,
    temperature_c: None,
    sm_clock_mhz: None,
    clocks_event_reasons: None,
    compute_processes: Vec::new(),
    graphics_processes: Vec::new(),
    process_utilization: Vec::new(),
    errors: BTreeMap::new(),
    lost: false,
    mig: Vec::new(),
};

#[derive(Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
struct Proc {
    pid: u32,
    used_bytes: Option<u64>,
}

#[derive(Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
struct ProcUtil {
    pid: u32,
    sm_util: u32,
    #[serde(default)]
    mem_util: u32,
}

struct State {
    scenario: Scenario,
    init_at: Instant,
    /// nvmlInit calls not yet matched by nvmlShutdown (NVML counts them).
    refs: u32,
    calls: BTreeMap<&'static str, u64>,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);

/// Runs `f` with the state locked, counting the call; a panic inside
/// (a bug in the fake) becomes `NVML_ERROR_UNKNOWN`, never an unwind into C.
fn entry(name: &'static str, f: impl FnOnce(&mut State) -> nvmlReturn_t) -> nvmlReturn_t {
    catch_unwind(AssertUnwindSafe(|| {
        let mut guard = match STATE.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        match guard.as_mut() {
            Some(st) if st.refs > 0 => {
                *st.calls.entry(name).or_insert(0) += 1;
                f(st)
            }
            _ => nvmlReturn_enum_NVML_ERROR_UNINITIALIZED,
        }
    }))
    .unwrap_or(nvmlReturn_enum_NVML_ERROR_UNKNOWN)
}

fn code(name: &str) -> nvmlReturn_t {
    match name {
        "SUCCESS" => nvmlReturn_enum_NVML_SUCCESS,
        "UNINITIALIZED" => nvmlReturn_enum_NVML_ERROR_UNINITIALIZED,
        "INVALID_ARGUMENT" => nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT,
        "NOT_SUPPORTED" => nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED,
        "NO_PERMISSION" => nvmlReturn_enum_NVML_ERROR_NO_PERMISSION,
        "NOT_FOUND" => nvmlReturn_enum_NVML_ERROR_NOT_FOUND,
        "INSUFFICIENT_SIZE" => nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE,
        "DRIVER_NOT_LOADED" => nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED,
        "TIMEOUT" => nvmlReturn_enum_NVML_ERROR_TIMEOUT,
        "GPU_IS_LOST" => nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST,
        "LIB_RM_VERSION_MISMATCH" => nvmlReturn_enum_NVML_ERROR_LIB_RM_VERSION_MISMATCH,
        "ARGUMENT_VERSION_MISMATCH" => nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
        "UNKNOWN" => nvmlReturn_enum_NVML_ERROR_UNKNOWN,
        other => other
            .parse::<nvmlReturn_t>()
            .unwrap_or(nvmlReturn_enum_NVML_ERROR_UNKNOWN),
    }
}

fn append_calls_line(line: &str) {
    if let Some(path) = std::env::var_os("FAKE_NVML_CALLS") {
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = writeln!(f, "{line}");
        }
    }
}

fn load_scenario() -> Result<Scenario, String> {
    let path = std::env::var_os("FAKE_NVML_SCENARIO")
        .ok_or_else(|| "FAKE_NVML_SCENARIO is not set".to_string())?;
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("cannot read {}: {e}", path.to_string_lossy()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.to_string_lossy()))
}

// Device handles are opaque pointers to NVML's callers: (gpu index + 1)
// in the high bits, (MIG instance + 1) in the low 16 bits, 0 for a GPU.
fn handle(gpu: usize, mig: Option<usize>) -> nvmlDevice_t {
    (((gpu + 1) << 16) | mig.map_or(0, |m| m + 1)) as nvmlDevice_t
}

fn unhandle(h: nvmlDevice_t) -> Option<(usize, Option<usize>)> {
    let v = h as usize;
    let gpu = (v >> 16).checked_sub(1)?;
    let mig = (v & 0xffff).checked_sub(1);
    Some((gpu, mig))
}

impl State {
    fn identity(&self, gpu: usize, mig: Option<usize>) -> Option<&DeviceIdentity> {
        let d = self.scenario.devices.get(gpu)?;
        match mig {
            None => Some(d),
            Some(m) => d.mig.get(m),
        }
    }

    /// The current step's start, ms since init (0 before the first step).
    fn step_t_ms(&self) -> u64 {
        let elapsed_ms = self.init_at.elapsed().as_millis() as u64;
        self.scenario
            .steps
            .iter()
            .map(|s| s.t_ms)
            .filter(|&t| t <= elapsed_ms)
            .max()
            .unwrap_or(0)
    }

    /// The scripted values of a device now, or the error its call `name`
    /// must answer.
    fn values(&self, name: &str, h: nvmlDevice_t) -> Result<&Values, nvmlReturn_t> {
        let (gpu, mig) = unhandle(h).ok_or(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT)?;
        let ident = self
            .identity(gpu, mig)
            .ok_or(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT)?;
        let elapsed_ms = self.init_at.elapsed().as_millis() as u64;
        let step = self
            .scenario
            .steps
            .iter()
            .filter(|s| s.t_ms <= elapsed_ms)
            .max_by_key(|s| s.t_ms);
        let parent = step.and_then(|s| s.devices.get(gpu));
        let vals = match mig {
            None => parent,
            Some(m) => parent.and_then(|p| p.mig.get(m)),
        }
        .unwrap_or(&NO_VALUES);
        // A lost parent GPU takes its MIG instances with it.
        if vals.lost || (mig.is_some() && parent.is_some_and(|p| p.lost)) {
            return Err(nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST);
        }
        if let Some(e) = vals.errors.get(name).or_else(|| ident.errors.get(name)) {
            return Err(code(e));
        }
        Ok(vals)
    }
}

fn answer<T>(out: *mut T, v: Option<T>) -> nvmlReturn_t {
    if out.is_null() {
        return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
    }
    match v {
        Some(v) => {
            // SAFETY: checked non-null; the caller passes a valid out-pointer.
            unsafe { out.write(v) };
            nvmlReturn_enum_NVML_SUCCESS
        }
        None => nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED,
    }
}

fn device_call<T>(
    name: &'static str,
    dev: nvmlDevice_t,
    out: *mut T,
    pick: impl FnOnce(&Values) -> Option<T>,
) -> nvmlReturn_t {
    entry(name, |st| match st.values(name, dev) {
        Ok(v) => answer(out, pick(v)),
        Err(e) => e,
    })
}

fn write_str(buf: *mut c_char, len: c_uint, s: &str) -> nvmlReturn_t {
    if buf.is_null() {
        return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
    }
    let bytes = s.as_bytes();
    if bytes.len() + 1 > len as usize {
        return nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE;
    }
    // SAFETY: the caller's buffer holds `len` bytes, checked above.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf.cast::<u8>(), bytes.len());
        buf.add(bytes.len()).write(0);
    }
    nvmlReturn_enum_NVML_SUCCESS
}

#[no_mangle]
pub extern "C" fn nvmlInit_v2() -> nvmlReturn_t {
    catch_unwind(|| {
        let mut guard = match STATE.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        let rc = match load_scenario() {
            Err(e) => {
                eprintln!("fakenvml: {e}");
                nvmlReturn_enum_NVML_ERROR_UNKNOWN
            }
            Ok(sc) => match sc.init_error.as_deref().map(code) {
                Some(rc) => rc,
                None => {
                    match guard.as_mut() {
                        Some(st) if st.refs > 0 => st.refs += 1,
                        _ => {
                            *guard = Some(State {
                                scenario: sc,
                                init_at: Instant::now(),
                                refs: 1,
                                calls: BTreeMap::new(),
                            })
                        }
                    }
                    nvmlReturn_enum_NVML_SUCCESS
                }
            },
        };
        append_calls_line(&format!("{{\"event\":\"init\",\"result\":{rc}}}"));
        rc
    })
    .unwrap_or(nvmlReturn_enum_NVML_ERROR_UNKNOWN)
}

#[no_mangle]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> nvmlReturn_t {
    nvmlInit_v2()
}

#[no_mangle]
pub extern "C" fn nvmlShutdown() -> nvmlReturn_t {
    catch_unwind(|| {
        let mut guard = match STATE.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        let Some(st) = guard.as_mut().filter(|st| st.refs > 0) else {
            return nvmlReturn_enum_NVML_ERROR_UNINITIALIZED;
        };
        st.refs -= 1;
        if st.refs == 0 {
            let calls = serde_json::to_string(&st.calls).unwrap_or_default();
            append_calls_line(&format!("{{\"event\":\"shutdown\",\"calls\":{calls}}}"));
        }
        nvmlReturn_enum_NVML_SUCCESS
    })
    .unwrap_or(nvmlReturn_enum_NVML_ERROR_UNKNOWN)
}

#[no_mangle]
pub extern "C" fn nvmlErrorString(result: nvmlReturn_t) -> *const c_char {
    let s: &'static [u8] = match result {
        nvmlReturn_enum_NVML_SUCCESS => b"Success\0",
        nvmlReturn_enum_NVML_ERROR_UNINITIALIZED => b"Uninitialized\0",
        nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED => b"Not Supported\0",
        nvmlReturn_enum_NVML_ERROR_NO_PERMISSION => b"Insufficient Permissions\0",
        nvmlReturn_enum_NVML_ERROR_NOT_FOUND => b"Not Found\0",
        nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE => b"Insufficient Size\0",
        nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED => b"Driver Not Loaded\0",
        nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST => b"GPU is lost\0",
        _ => b"Unknown Error\0",
    };
    s.as_ptr().cast()
}

#[no_mangle]
pub extern "C" fn nvmlSystemGetDriverVersion(version: *mut c_char, length: c_uint) -> nvmlReturn_t {
    entry("nvmlSystemGetDriverVersion", |st| {
        let v = st.scenario.driver_version.as_deref().unwrap_or("550.54.15");
        write_str(version, length, v)
    })
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> nvmlReturn_t {
    entry("nvmlDeviceGetCount_v2", |st| {
        answer(count, Some(st.scenario.devices.len() as c_uint))
    })
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    entry("nvmlDeviceGetHandleByIndex_v2", |st| {
        let i = index as usize;
        if i >= st.scenario.devices.len() {
            return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
        }
        let h = handle(i, None);
        match st.values("nvmlDeviceGetHandleByIndex_v2", h) {
            Ok(_) => answer(device, Some(h)),
            Err(e) => e,
        }
    })
}

fn identity_string(
    name: &'static str,
    dev: nvmlDevice_t,
    buf: *mut c_char,
    len: c_uint,
    pick: fn(&DeviceIdentity) -> &str,
) -> nvmlReturn_t {
    entry(name, |st| {
        if let Err(e) = st.values(name, dev) {
            return e;
        }
        let Some((gpu, mig)) = unhandle(dev) else {
            return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
        };
        match st.identity(gpu, mig) {
            Some(id) => write_str(buf, len, pick(id)),
            None => nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT,
        }
    })
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetUUID(
    device: nvmlDevice_t,
    uuid: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    identity_string("nvmlDeviceGetUUID", device, uuid, length, |d| &d.uuid)
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetName(
    device: nvmlDevice_t,
    name: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    identity_string("nvmlDeviceGetName", device, name, length, |d| &d.name)
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetIndex(device: nvmlDevice_t, index: *mut c_uint) -> nvmlReturn_t {
    device_call("nvmlDeviceGetIndex", device, index, |_| {
        unhandle(device).map(|(gpu, _)| gpu as c_uint)
    })
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetUtilizationRates(
    device: nvmlDevice_t,
    utilization: *mut nvmlUtilization_t,
) -> nvmlReturn_t {
    device_call("nvmlDeviceGetUtilizationRates", device, utilization, |v| {
        Some(nvmlUtilization_t {
            gpu: v.util_gpu?,
            memory: v.util_memory?,
        })
    })
}

/// # Safety
/// `memory` is null or points to an `nvmlMemory_v2_t` whose `version` the
/// caller set (NVML's contract).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_v2_t,
) -> nvmlReturn_t {
    let expected = (std::mem::size_of::<nvmlMemory_v2_t>() | (2 << 24)) as c_uint;
    if memory.is_null() {
        return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: non-null, and valid by this function's contract.
    let version = unsafe { (*memory).version };
    entry("nvmlDeviceGetMemoryInfo_v2", |st| {
        if version != expected {
            return nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
        }
        match st.values("nvmlDeviceGetMemoryInfo_v2", device) {
            Err(e) => e,
            Ok(v) => {
                let (Some(total), Some(used)) = (v.memory_total, v.memory_used) else {
                    return nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;
                };
                let reserved = v.memory_reserved.unwrap_or(0);
                answer(
                    memory,
                    Some(nvmlMemory_v2_t {
                        version,
                        total,
                        reserved,
                        free: total.saturating_sub(used).saturating_sub(reserved),
                        used,
                    }),
                )
            }
        }
    })
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetPowerUsage(
    device: nvmlDevice_t,
    power: *mut c_uint,
) -> nvmlReturn_t {
    device_call("nvmlDeviceGetPowerUsage", device, power, |v| v.power_mw)
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetTotalEnergyConsumption(
    device: nvmlDevice_t,
    energy: *mut c_ulonglong,
) -> nvmlReturn_t {
    device_call("nvmlDeviceGetTotalEnergyConsumption", device, energy, |v| {
        v.energy_mj
    })
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetTemperature(
    device: nvmlDevice_t,
    sensor: nvmlTemperatureSensors_t,
    temp: *mut c_uint,
) -> nvmlReturn_t {
    if sensor != nvmlTemperatureSensors_enum_NVML_TEMPERATURE_GPU {
        return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
    }
    device_call("nvmlDeviceGetTemperature", device, temp, |v| {
        v.temperature_c
    })
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetClockInfo(
    device: nvmlDevice_t,
    clock_type: nvmlClockType_t,
    clock: *mut c_uint,
) -> nvmlReturn_t {
    device_call("nvmlDeviceGetClockInfo", device, clock, |v| {
        (clock_type == nvmlClockType_enum_NVML_CLOCK_SM)
            .then_some(v.sm_clock_mhz)
            .flatten()
    })
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetCurrentClocksEventReasons(
    device: nvmlDevice_t,
    reasons: *mut c_ulonglong,
) -> nvmlReturn_t {
    device_call(
        "nvmlDeviceGetCurrentClocksEventReasons",
        device,
        reasons,
        |v| v.clocks_event_reasons,
    )
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetCurrentClocksThrottleReasons(
    device: nvmlDevice_t,
    reasons: *mut c_ulonglong,
) -> nvmlReturn_t {
    device_call(
        "nvmlDeviceGetCurrentClocksThrottleReasons",
        device,
        reasons,
        |v| v.clocks_event_reasons,
    )
}

/// NVML's two-call protocol: a count smaller than the list (or a null
/// buffer) answers `INSUFFICIENT_SIZE` with the needed count written back.
fn process_list(
    name: &'static str,
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
    pick: fn(&Values) -> &Vec<Proc>,
) -> nvmlReturn_t {
    entry(name, |st| {
        let v = match st.values(name, device) {
            Ok(v) => v,
            Err(e) => return e,
        };
        if count.is_null() {
            return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
        }
        let list = pick(v);
        // SAFETY: non-null in/out count from the caller.
        let room = unsafe { *count } as usize;
        // SAFETY: as above.
        unsafe { *count = list.len() as c_uint };
        if list.is_empty() {
            return nvmlReturn_enum_NVML_SUCCESS;
        }
        if infos.is_null() || room < list.len() {
            return nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE;
        }
        let (gi, ci) = match unhandle(device) {
            Some((_, Some(m))) => (m as c_uint + 1, 0),
            _ => (c_uint::MAX, c_uint::MAX),
        };
        for (i, p) in list.iter().enumerate() {
            // SAFETY: the caller's buffer holds `room` >= list.len() entries.
            unsafe {
                infos.add(i).write(nvmlProcessInfo_t {
                    pid: p.pid,
                    usedGpuMemory: p.used_bytes.unwrap_or(c_ulonglong::MAX),
                    gpuInstanceId: gi,
                    computeInstanceId: ci,
                })
            };
        }
        nvmlReturn_enum_NVML_SUCCESS
    })
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    process_list(
        "nvmlDeviceGetComputeRunningProcesses_v3",
        device,
        count,
        infos,
        |v| &v.compute_processes,
    )
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v3(
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    process_list(
        "nvmlDeviceGetGraphicsRunningProcesses_v3",
        device,
        count,
        infos,
        |v| &v.graphics_processes,
    )
}

/// Per-process utilisation samples newer than `last_seen` (µs). The
/// scripted samples of a step are stamped `t_ms * 1000 + k + 1` (k: their
/// position), so a second call in the same step with the newest stamp gets
/// `NOT_FOUND`, as NVML answers when nothing was sampled since. A null
/// buffer or too small a count: `INSUFFICIENT_SIZE` and the needed count.
///
/// # Safety
/// `count` is null or valid; `utilization` is null or holds `*count`
/// entries (NVML's contract).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetProcessUtilization(
    device: nvmlDevice_t,
    utilization: *mut nvmlProcessUtilizationSample_t,
    count: *mut c_uint,
    last_seen: c_ulonglong,
) -> nvmlReturn_t {
    entry("nvmlDeviceGetProcessUtilization", |st| {
        let v = match st.values("nvmlDeviceGetProcessUtilization", device) {
            Ok(v) => v,
            Err(e) => return e,
        };
        if count.is_null() {
            return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
        }
        let base_us = st.step_t_ms() * 1000;
        let fresh: Vec<nvmlProcessUtilizationSample_t> = v
            .process_utilization
            .iter()
            .enumerate()
            .map(|(k, u)| nvmlProcessUtilizationSample_t {
                pid: u.pid,
                timeStamp: base_us + k as u64 + 1,
                smUtil: u.sm_util,
                memUtil: u.mem_util,
                encUtil: 0,
                decUtil: 0,
            })
            .filter(|s| s.timeStamp > last_seen)
            .collect();
        if fresh.is_empty() {
            return nvmlReturn_enum_NVML_ERROR_NOT_FOUND;
        }
        // SAFETY: non-null in/out count from the caller.
        let room = unsafe { *count } as usize;
        // SAFETY: as above.
        unsafe { *count = fresh.len() as c_uint };
        if utilization.is_null() || room < fresh.len() {
            return nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE;
        }
        for (i, s) in fresh.into_iter().enumerate() {
            // SAFETY: the caller's buffer holds `room` >= fresh.len() entries.
            unsafe { utilization.add(i).write(s) };
        }
        nvmlReturn_enum_NVML_SUCCESS
    })
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetMigMode(
    device: nvmlDevice_t,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> nvmlReturn_t {
    entry("nvmlDeviceGetMigMode", |st| {
        if let Err(e) = st.values("nvmlDeviceGetMigMode", device) {
            return e;
        }
        let Some((gpu, None)) = unhandle(device) else {
            return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
        };
        let enabled = st.identity(gpu, None).is_some_and(|d| !d.mig.is_empty());
        let mode = if enabled {
            NVML_DEVICE_MIG_ENABLE
        } else {
            NVML_DEVICE_MIG_DISABLE
        };
        match answer(current, Some(mode)) {
            nvmlReturn_enum_NVML_SUCCESS => answer(pending, Some(mode)),
            e => e,
        }
    })
}

/// The most MIG devices an H100/A100 can be split into.
const MAX_MIG_DEVICES: c_uint = 7;

#[no_mangle]
pub extern "C" fn nvmlDeviceGetMaxMigDeviceCount(
    device: nvmlDevice_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    device_call("nvmlDeviceGetMaxMigDeviceCount", device, count, |_| {
        Some(MAX_MIG_DEVICES)
    })
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    device: nvmlDevice_t,
    index: c_uint,
    mig_device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    entry("nvmlDeviceGetMigDeviceHandleByIndex", |st| {
        if let Err(e) = st.values("nvmlDeviceGetMigDeviceHandleByIndex", device) {
            return e;
        }
        let Some((gpu, None)) = unhandle(device) else {
            return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
        };
        if index >= MAX_MIG_DEVICES {
            return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
        }
        let m = index as usize;
        match st.identity(gpu, Some(m)) {
            Some(_) => answer(mig_device, Some(handle(gpu, Some(m)))),
            None => nvmlReturn_enum_NVML_ERROR_NOT_FOUND,
        }
    })
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
    mig_device: nvmlDevice_t,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    entry(
        "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
        |_| match unhandle(mig_device) {
            Some((gpu, Some(_))) => answer(device, Some(handle(gpu, None))),
            _ => nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT,
        },
    )
}

#[no_mangle]
pub extern "C" fn nvmlDeviceIsMigDeviceHandle(
    device: nvmlDevice_t,
    is_mig: *mut c_uint,
) -> nvmlReturn_t {
    entry("nvmlDeviceIsMigDeviceHandle", |_| match unhandle(device) {
        Some((_, mig)) => answer(is_mig, Some(mig.is_some() as c_uint)),
        None => nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT,
    })
}
