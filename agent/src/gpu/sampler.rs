//! NVML sampling: one pass over every GPU (and MIG instance) → a
//! [`GpuSample`], on its own thread every interval ([`spawn`]).
//!
//! Owns: loading NVML (nvml-wrapper, `Nvml::builder().lib_path(..)`, so
//! the library is chosen at run time and nothing links libnvidia-ml at
//! build time), saying once why it is unavailable, retrying
//! initialisation, per-call failure accounting, dropping lost GPUs.
//! Must not: panic or stop on anything NVML says, block the capture loop
//! (NVML calls can take milliseconds; only the sampler thread makes them),
//! or let NVML types out of this file (the contract is `types.rs`).
//!
//! Failure behaviour:
//! * NVML cannot be initialised (library missing, driver not loaded, no
//!   permission, library/driver mismatch, …): one line on stderr naming
//!   the cause, `sample` returns None, initialisation is retried every
//!   `retry_interval` (30 s by default); a different cause is said again,
//!   and recovery is said once.
//! * A call that fails on one device (NotSupported, NoPermission, …)
//!   leaves only that field empty and is counted per NVML function.
//! * `GPU_IS_LOST` or `UNKNOWN` on any call of a GPU (or of one of its
//!   MIG instances) drops that GPU and its instances from this sample and
//!   is said once per GPU; the others go on. When every GPU is lost, NVML
//!   is shut down and initialised again after `retry_interval`.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    ffi::OsStr,
    path::PathBuf,
    sync::{
        mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError},
        Arc, Mutex,
    },
    thread::JoinHandle,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use nvml_wrapper::{
    enum_wrappers::device::{Clock, TemperatureSensor},
    error::NvmlError,
    Device, Nvml,
};
use nvml_wrapper_sys::bindings::{
    nvmlDevice_t, nvmlProcessInfo_t, nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE,
    nvmlReturn_enum_NVML_SUCCESS, nvmlReturn_t, NVML_DEVICE_MIG_ENABLE,
};

use super::types::{DeviceSample, GpuProcess, GpuSample};

/// Environment variable naming the NVML library (`--nvml-library`).
pub const NVML_LIBRARY_ENV: &str = "TOKENTAP_NVML_LIBRARY";
/// The library NVML is loaded from when none is named.
pub const DEFAULT_NVML_LIBRARY: &str = "libnvidia-ml.so.1";
/// How often initialisation is retried while NVML is unavailable.
pub const DEFAULT_RETRY_INTERVAL: Duration = Duration::from_secs(30);

/// First buffer for a running-process list; NVML's two-call protocol
/// (`INSUFFICIENT_SIZE` + the needed count) grows it when a GPU has more.
const FIRST_PROCESS_BUFFER: u32 = 16;
/// Extra room on a retried process-list call, for processes starting in
/// between the two calls.
const PROCESS_HEADROOM: u32 = 8;
/// Tries of the process-list protocol before giving up on that list.
const PROCESS_LIST_TRIES: usize = 4;
/// `usedGpuMemory` when NVML cannot say (`NVML_VALUE_NOT_AVAILABLE`).
const VALUE_NOT_AVAILABLE: u64 = u64::MAX;
/// Samples queued between the sampler thread and its consumer.
const CHANNEL_SAMPLES: usize = 64;

#[derive(Clone, Debug)]
pub struct SamplerConfig {
    /// NVML library path; None: the system's `libnvidia-ml.so.1`.
    pub library: Option<PathBuf>,
    /// Time between passes ([`spawn`]).
    pub interval: Duration,
    /// Time between initialisation attempts while NVML is unavailable.
    pub retry_interval: Duration,
    /// One look, no retries (`gpu-check`): a failed initialisation is not
    /// printed, only kept as the status's reason, without the promise to
    /// retry (later notices, such as a GPU lost, are printed as usual).
    pub one_shot: bool,
}

impl SamplerConfig {
    /// `library` and `interval`, retrying initialisation every 30 s.
    pub fn new(library: Option<PathBuf>, interval: Duration) -> Self {
        Self {
            library,
            interval,
            retry_interval: DEFAULT_RETRY_INTERVAL,
            one_shot: false,
        }
    }
}

impl Default for SamplerConfig {
    fn default() -> Self {
        Self::new(None, Duration::from_secs(1))
    }
}

/// Whether NVML answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Availability {
    /// Initialised; `devices` GPUs and MIG instances in the last pass.
    Ok { devices: usize },
    /// Not initialised; `reason` is the line that was printed.
    Unavailable { reason: String },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SamplerStatus {
    pub availability: Availability,
    /// Initialisation attempts, successful or not.
    pub init_attempts: u64,
    /// Failed NVML calls on devices (field left empty), by NVML function
    /// and error (`nvmlDeviceGetPowerUsage: NotSupported`).
    pub call_failures: BTreeMap<String, u64>,
    /// GPUs dropped from a sample because they were lost (per pass).
    pub devices_dropped: u64,
    /// Lines printed to stderr (causes, lost GPUs, recoveries).
    pub notices: u64,
}

impl SamplerStatus {
    pub fn call_failures_total(&self) -> u64 {
        self.call_failures.values().sum()
    }
}

/// A GPU is gone for this pass (`GPU_IS_LOST`, `UNKNOWN`).
struct Lost(NvmlError);

fn is_fatal(e: &NvmlError) -> bool {
    matches!(e, NvmlError::GpuLost | NvmlError::Unknown)
}

pub struct Sampler {
    cfg: SamplerConfig,
    nvml: Option<Nvml>,
    next_init: Instant,
    reason: Option<String>,
    /// The last unavailability reason printed (said once each).
    said: Option<String>,
    /// (uuid, name) per NVML index, while this NVML instance lives.
    identities: HashMap<u32, (String, String)>,
    /// GPUs said lost (by uuid, or `index N` when the uuid is unknown).
    said_lost: HashSet<String>,
    /// Newest per-process utilisation sample seen, per device (NVML's
    /// CPU timestamp, µs).
    util_seen_us: HashMap<String, u64>,
    devices_last: usize,
    init_attempts: u64,
    call_failures: BTreeMap<String, u64>,
    devices_dropped: u64,
    notices: u64,
}

impl Sampler {
    /// Never fails: without NVML it says why once and retries every
    /// `cfg.retry_interval`.
    pub fn new(cfg: SamplerConfig) -> Self {
        let mut s = Self {
            cfg,
            nvml: None,
            next_init: Instant::now(),
            reason: None,
            said: None,
            identities: HashMap::new(),
            said_lost: HashSet::new(),
            util_seen_us: HashMap::new(),
            devices_last: 0,
            init_attempts: 0,
            call_failures: BTreeMap::new(),
            devices_dropped: 0,
            notices: 0,
        };
        s.try_init();
        s
    }

    pub fn status(&self) -> SamplerStatus {
        SamplerStatus {
            availability: match (&self.nvml, &self.reason) {
                (Some(_), _) => Availability::Ok {
                    devices: self.devices_last,
                },
                (None, reason) => Availability::Unavailable {
                    reason: reason.clone().unwrap_or_default(),
                },
            },
            init_attempts: self.init_attempts,
            call_failures: self.call_failures.clone(),
            devices_dropped: self.devices_dropped,
            notices: self.notices,
        }
    }

    fn library(&self) -> &OsStr {
        self.cfg
            .library
            .as_deref()
            .map(|p| p.as_os_str())
            .unwrap_or(OsStr::new(DEFAULT_NVML_LIBRARY))
    }

    fn notice(&mut self, line: String) {
        eprintln!("tokentap: {line}");
        self.notices += 1;
    }

    fn try_init(&mut self) {
        self.init_attempts += 1;
        let lib = self.library().to_owned();
        match Nvml::builder().lib_path(&lib).init() {
            Ok(nvml) => {
                self.nvml = Some(nvml);
                self.identities.clear();
                self.said_lost.clear();
                self.util_seen_us.clear();
                if self.said.take().is_some() {
                    self.reason = None;
                    self.notice(format!(
                        "NVML ({}) is available again: GPU metrics resume",
                        lib.to_string_lossy()
                    ));
                }
                self.reason = None;
            }
            Err(e) => {
                let cause = init_cause(&lib.to_string_lossy(), &e);
                if self.cfg.one_shot {
                    // The caller reports it (status), once, its own way.
                    self.nvml = None;
                    self.reason = Some(cause);
                    return;
                }
                self.unavailable(format!(
                    "GPU metrics off: {cause}; requests are still measured; retrying every {}",
                    humantime::format_duration(self.cfg.retry_interval)
                ));
            }
        }
    }

    fn unavailable(&mut self, reason: String) {
        self.nvml = None;
        self.devices_last = 0;
        self.next_init = Instant::now() + self.cfg.retry_interval;
        if self.said.as_deref() != Some(reason.as_str()) {
            self.notice(reason.clone());
            self.said = Some(reason.clone());
        }
        self.reason = Some(reason);
    }

    fn failed(&mut self, call: &str, e: &NvmlError) {
        *self
            .call_failures
            .entry(format!("{call}: {}", error_name(e)))
            .or_insert(0) += 1;
    }

    /// A reading: its value, None (counted) on a per-call failure, or the
    /// whole GPU lost.
    fn field<T>(&mut self, call: &str, r: Result<T, NvmlError>) -> Result<Option<T>, Lost> {
        match r {
            Ok(v) => Ok(Some(v)),
            Err(e) if is_fatal(&e) => Err(Lost(e)),
            Err(e) => {
                self.failed(call, &e);
                Ok(None)
            }
        }
    }

    /// One pass over all devices (and MIG instances where enabled); None
    /// while NVML is unavailable. `now_ns`: wall-clock UNIX-epoch ns.
    pub fn sample(&mut self, now_ns: u64) -> Option<GpuSample> {
        if self.nvml.is_none() {
            if Instant::now() < self.next_init {
                return None;
            }
            self.try_init();
        }
        let nvml = self.nvml.take()?;
        let out = self.pass(&nvml, now_ns);
        match out {
            Ok(sample) => {
                self.devices_last = sample.devices.len();
                self.nvml = Some(nvml);
                Some(sample)
            }
            Err(reason) => {
                drop(nvml); // nvmlShutdown
                self.unavailable(reason);
                None
            }
        }
    }

    /// Err: NVML as a whole stopped answering (every GPU lost, or the
    /// device count failed) — the reason to print.
    fn pass(&mut self, nvml: &Nvml, now_ns: u64) -> Result<GpuSample, String> {
        let count = match nvml.device_count() {
            Ok(c) => c,
            Err(e) => {
                return Err(format!(
                    "GPU metrics off: NVML stopped answering ({}); re-initialising in {}",
                    error_name(&e),
                    humantime::format_duration(self.cfg.retry_interval)
                ))
            }
        };
        let mut sample = GpuSample {
            ts_ns: now_ns,
            devices: Vec::with_capacity(count as usize),
        };
        let mut lost = 0;
        for index in 0..count {
            let before = sample.devices.len();
            if let Err(Lost(e)) = self.gpu(nvml, index, &mut sample.devices) {
                sample.devices.truncate(before);
                lost += 1;
                self.devices_dropped += 1;
                let who = self
                    .identities
                    .get(&index)
                    .map(|(uuid, name)| format!("{uuid} ({name})"))
                    .unwrap_or_else(|| format!("index {index}"));
                if self.said_lost.insert(who.clone()) {
                    let others = if count > 1 {
                        "; the other GPUs go on"
                    } else {
                        ""
                    };
                    self.notice(format!(
                        "GPU {who} is lost ({}): left out of GPU metrics{others}",
                        error_name(&e)
                    ));
                }
            }
        }
        if count > 0 && lost == count {
            return Err(format!(
                "GPU metrics off: every GPU is lost; NVML is re-initialised in {}",
                humantime::format_duration(self.cfg.retry_interval)
            ));
        }
        Ok(sample)
    }

    /// A GPU and, with MIG enabled, its MIG instances.
    fn gpu(&mut self, nvml: &Nvml, index: u32, out: &mut Vec<DeviceSample>) -> Result<(), Lost> {
        let Some(dev) = self.field("nvmlDeviceGetHandleByIndex_v2", nvml.device_by_index(index))?
        else {
            return Ok(());
        };
        let (uuid, name) = match self.identities.get(&index) {
            Some(id) => id.clone(),
            None => {
                let Some(uuid) = self.field("nvmlDeviceGetUUID", dev.uuid())? else {
                    return Ok(()); // no hw.id: nothing to attach readings to
                };
                let name = self
                    .field("nvmlDeviceGetName", dev.name())?
                    .unwrap_or_default();
                self.identities.insert(index, (uuid.clone(), name.clone()));
                (uuid, name)
            }
        };
        let mut ds = DeviceSample {
            index,
            uuid: uuid.clone(),
            name,
            ..DeviceSample::default()
        };
        self.readings(nvml, &dev, &mut ds)?;
        out.push(ds);

        let mig_on = self
            .field("nvmlDeviceGetMigMode", dev.mig_mode())?
            .is_some_and(|m| m.current == NVML_DEVICE_MIG_ENABLE);
        if !mig_on {
            return Ok(());
        }
        let max = self
            .field(
                "nvmlDeviceGetMaxMigDeviceCount",
                max_mig_device_count(nvml, &dev),
            )?
            .unwrap_or(0);
        for mig_index in 0..max {
            let mdev = match dev.mig_device_by_index(mig_index) {
                Ok(d) => d,
                // No instance at this index: NVML's normal answer.
                Err(NvmlError::NotFound) => continue,
                Err(e) => {
                    self.field::<()>("nvmlDeviceGetMigDeviceHandleByIndex", Err(e))?;
                    continue;
                }
            };
            let Some(muuid) = self.field("nvmlDeviceGetUUID", mdev.uuid())? else {
                continue;
            };
            let mname = self
                .field("nvmlDeviceGetName", mdev.name())?
                .unwrap_or_default();
            let mut ms = DeviceSample {
                index,
                uuid: muuid,
                name: mname,
                parent_uuid: Some(uuid.clone()),
                ..DeviceSample::default()
            };
            self.readings(nvml, &mdev, &mut ms)?;
            out.push(ms);
        }
        Ok(())
    }

    fn readings(&mut self, nvml: &Nvml, dev: &Device, ds: &mut DeviceSample) -> Result<(), Lost> {
        if let Some(u) = self.field("nvmlDeviceGetUtilizationRates", dev.utilization_rates())? {
            ds.util_gpu = Some(f64::from(u.gpu) / 100.0);
            ds.util_memory_controller = Some(f64::from(u.memory) / 100.0);
        }
        if let Some(m) = self.field("nvmlDeviceGetMemoryInfo_v2", dev.memory_info())? {
            ds.memory_used_bytes = Some(m.used);
            ds.memory_total_bytes = Some(m.total);
        }
        ds.power_w = self
            .field("nvmlDeviceGetPowerUsage", dev.power_usage())?
            .map(|mw| f64::from(mw) / 1000.0);
        ds.energy_total_mj = self.field(
            "nvmlDeviceGetTotalEnergyConsumption",
            dev.total_energy_consumption(),
        )?;
        ds.temperature_c = self
            .field(
                "nvmlDeviceGetTemperature",
                dev.temperature(TemperatureSensor::Gpu),
            )?
            .map(f64::from);
        ds.sm_clock_mhz = self.field("nvmlDeviceGetClockInfo", dev.clock_info(Clock::SM))?;
        ds.throttle_reasons = self
            .field(
                "nvmlDeviceGetCurrentClocksEventReasons",
                clocks_event_reasons(nvml, dev),
            )?
            .map(reason_names);

        let compute = self.field(
            "nvmlDeviceGetComputeRunningProcesses_v3",
            running_processes(nvml, dev, ProcessList::Compute),
        )?;
        let graphics = self.field(
            "nvmlDeviceGetGraphicsRunningProcesses_v3",
            running_processes(nvml, dev, ProcessList::Graphics),
        )?;
        ds.processes = merge_processes(
            compute
                .into_iter()
                .flatten()
                .chain(graphics.into_iter().flatten()),
        );
        if !ds.processes.is_empty() {
            let util = self.process_sm_util(dev, &ds.uuid)?;
            for p in &mut ds.processes {
                p.sm_util = util.get(&p.pid).copied();
            }
        }
        Ok(())
    }

    /// Mean SM utilisation per pid over NVML's samples since the last pass
    /// on this device. `NOT_FOUND` (no sample since then) is NVML's normal
    /// answer, not a failure.
    fn process_sm_util(&mut self, dev: &Device, uuid: &str) -> Result<HashMap<u32, f64>, Lost> {
        let since = self.util_seen_us.get(uuid).copied().unwrap_or(0);
        let samples = match dev.process_utilization_stats(since) {
            Err(NvmlError::NotFound) => return Ok(HashMap::new()),
            r => self
                .field("nvmlDeviceGetProcessUtilization", r)?
                .unwrap_or_default(),
        };
        let mut sums: HashMap<u32, (u64, u64)> = HashMap::new();
        let mut newest = since;
        for s in samples {
            newest = newest.max(s.timestamp);
            let e = sums.entry(s.pid).or_insert((0, 0));
            e.0 += u64::from(s.sm_util);
            e.1 += 1;
        }
        self.util_seen_us.insert(uuid.to_string(), newest);
        Ok(sums
            .into_iter()
            .map(|(pid, (sum, n))| (pid, sum as f64 / n as f64 / 100.0))
            .collect())
    }
}

/// One clear cause for a failed `nvmlInit`.
fn init_cause(lib: &str, e: &NvmlError) -> String {
    match e {
        NvmlError::LibloadingError(le) => format!(
            "the NVML library {lib} cannot be loaded ({le}): no NVIDIA driver on this host, \
             or name it with --nvml-library"
        ),
        NvmlError::FailedToLoadSymbol(s) => {
            format!("{lib} is not a usable NVML library (missing {s})")
        }
        NvmlError::DriverNotLoaded => {
            format!("NVML ({lib}) says the NVIDIA kernel driver is not loaded")
        }
        NvmlError::NoPermission => {
            format!("no permission to use NVML ({lib}): the agent needs access to /dev/nvidia*")
        }
        NvmlError::LibRmVersionMismatch => format!(
            "NVML ({lib}) and the loaded NVIDIA kernel driver are different versions \
             (driver updated without a reload?)"
        ),
        other => format!("NVML ({lib}) initialisation failed: {}", error_name(other)),
    }
}

/// A short, stable name for an NVML error (counters and messages).
fn error_name(e: &NvmlError) -> String {
    match e {
        NvmlError::GpuLost => "GPU_IS_LOST".into(),
        NvmlError::Unknown => "UNKNOWN".into(),
        NvmlError::NotSupported => "NOT_SUPPORTED".into(),
        NvmlError::NoPermission => "NO_PERMISSION".into(),
        NvmlError::NotFound => "NOT_FOUND".into(),
        NvmlError::Uninitialized => "UNINITIALIZED".into(),
        NvmlError::DriverNotLoaded => "DRIVER_NOT_LOADED".into(),
        NvmlError::InsufficientSize(_) => "INSUFFICIENT_SIZE".into(),
        NvmlError::Timeout => "TIMEOUT".into(),
        NvmlError::FailedToLoadSymbol(_) => "FUNCTION_NOT_FOUND".into(),
        other => other.to_string(),
    }
}

fn sym<'a, T, E: std::fmt::Display>(r: Result<&'a T, &E>) -> Result<&'a T, NvmlError> {
    r.map_err(|e| NvmlError::FailedToLoadSymbol(e.to_string()))
}

/// nvml-wrapper 0.13 has no wrapper for `nvmlDeviceGetMaxMigDeviceCount`.
fn max_mig_device_count(nvml: &Nvml, dev: &Device) -> Result<u32, NvmlError> {
    let f = sym(nvml.lib().nvmlDeviceGetMaxMigDeviceCount.as_ref())?;
    let mut count = 0;
    // SAFETY: a valid handle from this NVML instance and an out-pointer.
    let rc = unsafe { f(dev.handle(), &mut count) };
    check(rc).map(|()| count)
}

/// The current clocks event reasons (NVML ≥ 535 name), falling back to
/// the older `…ThrottleReasons` symbol on older drivers.
fn clocks_event_reasons(nvml: &Nvml, dev: &Device) -> Result<u64, NvmlError> {
    let lib = nvml.lib();
    let f = match lib.nvmlDeviceGetCurrentClocksEventReasons.as_ref() {
        Ok(f) => f,
        Err(_) => sym(lib.nvmlDeviceGetCurrentClocksThrottleReasons.as_ref())?,
    };
    let mut reasons = 0;
    // SAFETY: as above.
    let rc = unsafe { f(dev.handle(), &mut reasons) };
    check(rc).map(|()| reasons)
}

fn check(rc: nvmlReturn_t) -> Result<(), NvmlError> {
    if rc == nvmlReturn_enum_NVML_SUCCESS {
        Ok(())
    } else {
        Err(NvmlError::from(rc))
    }
}

/// NVML's clocks event reason bits, idle (bit 0) left out: idle is not
/// throttling.
const REASONS: [(u64, &str); 8] = [
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
];
const REASON_IDLE: u64 = 0x1;

/// Reason names of a bit mask; bits NVML may add later read `bit_N`.
pub fn reason_names(mask: u64) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = mask & !REASON_IDLE;
    for (bit, name) in REASONS {
        if rest & bit != 0 {
            names.push(name.to_string());
            rest &= !bit;
        }
    }
    while rest != 0 {
        let bit = rest.trailing_zeros();
        names.push(format!("bit_{bit}"));
        rest &= rest - 1;
    }
    names
}

#[derive(Clone, Copy)]
enum ProcessList {
    Compute,
    Graphics,
}

/// NVML's two-call protocol: a first buffer, then — on
/// `INSUFFICIENT_SIZE`, which writes back the needed count — one of that
/// size plus headroom, a few times if processes keep starting.
fn running_processes(
    nvml: &Nvml,
    dev: &Device,
    which: ProcessList,
) -> Result<Vec<GpuProcess>, NvmlError> {
    let lib = nvml.lib();
    let f = match which {
        ProcessList::Compute => sym(lib.nvmlDeviceGetComputeRunningProcesses_v3.as_ref())?,
        ProcessList::Graphics => sym(lib.nvmlDeviceGetGraphicsRunningProcesses_v3.as_ref())?,
    };
    // SAFETY: the handle belongs to `nvml`, which outlives this call.
    let handle: nvmlDevice_t = unsafe { dev.handle() };
    let mut room = FIRST_PROCESS_BUFFER;
    for _ in 0..PROCESS_LIST_TRIES {
        // SAFETY: nvmlProcessInfo_t is plain integers; all-zero is valid.
        let mut buf: Vec<nvmlProcessInfo_t> = vec![unsafe { std::mem::zeroed() }; room as usize];
        let mut count = room;
        // SAFETY: `buf` holds `count` entries; NVML writes at most that many.
        let rc = unsafe { f(handle, &mut count, buf.as_mut_ptr()) };
        if rc == nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE {
            room = count.max(room).saturating_add(PROCESS_HEADROOM);
            continue;
        }
        check(rc)?;
        buf.truncate((count as usize).min(room as usize));
        return Ok(buf
            .into_iter()
            .map(|p| GpuProcess {
                pid: p.pid,
                used_bytes: (p.usedGpuMemory != VALUE_NOT_AVAILABLE).then_some(p.usedGpuMemory),
                sm_util: None,
            })
            .collect());
    }
    Err(NvmlError::InsufficientSize(Some(room as usize)))
}

/// Compute and graphics lists merged by pid. A process with both contexts
/// is listed in both with its whole footprint, so the larger known value
/// is kept (a sum would count it twice).
fn merge_processes(procs: impl Iterator<Item = GpuProcess>) -> Vec<GpuProcess> {
    let mut by_pid: BTreeMap<u32, Option<u64>> = BTreeMap::new();
    for p in procs {
        let e = by_pid.entry(p.pid).or_insert(None);
        *e = match (*e, p.used_bytes) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
    }
    by_pid
        .into_iter()
        .map(|(pid, used_bytes)| GpuProcess {
            pid,
            used_bytes,
            sm_util: None,
        })
        .collect()
}

/// Wall-clock UNIX-epoch nanoseconds now.
pub fn wall_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// The sampler running on its own thread. Dropping it stops the thread
/// (at once, not after the interval) and shuts NVML down.
pub struct SamplerHandle {
    samples: Receiver<GpuSample>,
    status: Arc<Mutex<SamplerStatus>>,
    stop: Option<SyncSender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl SamplerHandle {
    /// Samples, one per pass while NVML answers. If the consumer falls
    /// more than 64 samples behind, newer ones are dropped.
    pub fn samples(&self) -> &Receiver<GpuSample> {
        &self.samples
    }

    /// The sampler's status after its last pass.
    pub fn status(&self) -> SamplerStatus {
        match self.status.lock() {
            Ok(s) => s.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }
}

impl Drop for SamplerHandle {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Runs a [`Sampler`] on its own thread, a pass every `cfg.interval`
/// (NVML initialisation happens on that thread too).
pub fn spawn(cfg: SamplerConfig) -> SamplerHandle {
    let (tx, samples) = mpsc::sync_channel(CHANNEL_SAMPLES);
    let (stop, stopped) = mpsc::sync_channel::<()>(0);
    let status = Arc::new(Mutex::new(SamplerStatus {
        availability: Availability::Unavailable {
            reason: "starting".into(),
        },
        init_attempts: 0,
        call_failures: BTreeMap::new(),
        devices_dropped: 0,
        notices: 0,
    }));
    let shared = status.clone();
    let thread = std::thread::Builder::new()
        .name("tokentap-nvml".into())
        .spawn(move || {
            let interval = cfg.interval.max(Duration::from_millis(1));
            let mut sampler = Sampler::new(cfg);
            let mut next = Instant::now();
            loop {
                if let Some(s) = sampler.sample(wall_ns()) {
                    match tx.try_send(s) {
                        Ok(()) | Err(TrySendError::Full(_)) => {}
                        Err(TrySendError::Disconnected(_)) => break,
                    }
                }
                if let Ok(mut st) = shared.lock() {
                    *st = sampler.status();
                }
                next += interval;
                let now = Instant::now();
                if next < now {
                    next = now; // a slow pass: no burst of catch-up passes
                }
                match stopped.recv_timeout(next - now) {
                    Err(RecvTimeoutError::Timeout) => {}
                    Ok(()) | Err(RecvTimeoutError::Disconnected) => break,
                }
            }
        });
    let thread = match thread {
        Ok(t) => Some(t),
        Err(e) => {
            eprintln!("tokentap: cannot start the GPU sampler thread ({e}); GPU metrics off");
            None
        }
    };
    SamplerHandle {
        samples,
        status,
        stop: Some(stop),
        thread,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reason_names_leave_out_idle_and_name_unknown_bits() {
        assert_eq!(reason_names(0), Vec::<String>::new());
        assert_eq!(reason_names(REASON_IDLE), Vec::<String>::new());
        assert_eq!(
            reason_names(0x1 | 0x4 | 0x40),
            vec!["sw_power_cap", "hw_thermal_slowdown"]
        );
        assert_eq!(reason_names(0x8 | (1 << 20)), vec!["hw_slowdown", "bit_20"]);
    }

    #[test]
    fn merged_processes_keep_the_larger_known_footprint_once_per_pid() {
        let p = |pid, used_bytes| GpuProcess {
            pid,
            used_bytes,
            sm_util: None,
        };
        let merged = merge_processes(
            [
                p(7, Some(100)),
                p(3, None),
                p(7, Some(40)),
                p(3, Some(5)),
                p(9, None),
            ]
            .into_iter(),
        );
        assert_eq!(merged, vec![p(3, Some(5)), p(7, Some(100)), p(9, None)]);
    }

    #[test]
    fn a_missing_library_is_named_and_sampling_returns_none() {
        let dir = std::env::temp_dir().join(format!("tokentap-no-nvml-{}", std::process::id()));
        let mut s = Sampler::new(SamplerConfig {
            library: Some(dir.join("libnvidia-ml.so.1")),
            interval: Duration::from_millis(10),
            retry_interval: Duration::from_secs(3600),
            one_shot: false,
        });
        assert_eq!(s.sample(1), None);
        let st = s.status();
        let Availability::Unavailable { reason } = st.availability else {
            panic!("available without a library: {st:?}");
        };
        assert!(reason.contains("cannot be loaded"), "{reason}");
        assert!(reason.contains("libnvidia-ml.so.1"), "{reason}");
        assert_eq!((st.notices, st.init_attempts), (1, 1));
    }
}
