//! Live kernel capture: loads and attaches the eBPF programs, owns their
//! maps, reads the ring buffer, and turns records into typed
//! [`SocketEvent`]s.
//!
//! Owns: the eBPF object's lifetime, TARGETS and CONNS from the userspace
//! side (adding targets, seeding and untracking connections), kernel→wall
//! clock conversion, reassembly of multi-record calls, drop accounting.
//! Must not: decode HTTP (that is `decode`), or block the kernel side: when
//! the consumer is slow the ring buffer fills and the kernel counts drops.

pub mod clock;
mod conns;
pub mod kernel_log;
pub mod layout;
pub mod probes;
pub mod programs;
pub mod reassemble;
mod records;
mod ring;
pub mod sockfd;
mod targets;
pub mod tls;

use std::{
    collections::{HashMap as StdHashMap, HashSet},
    os::fd::{AsFd, AsRawFd, RawFd},
    path::PathBuf,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
};

use agent_ebpf::{
    stat, Config, ConnState, RecordHeader, ABI_VERSION, CHUNK_BYTES, DEFAULT_MAX_CALL_BYTES,
    HEADER_BYTES, MAX_RECORDS_PER_CALL,
};
use anyhow::{bail, Context, Result};
use aya::{
    maps::{Array, HashMap, MapData, PerCpuArray},
    Ebpf,
};
use tokio::io::unix::AsyncFd;

use self::{clock::ClockOffset, reassemble::Reassembler, sockfd::SockFds};
pub use self::{
    programs::{ensure_tracefs, OBJECT_ENV, TRACEFS},
    records::{ProcEvent, PROC_EVENTS_CAP},
};
use crate::event::{OpenEvent, SocketEvent};
use crate::host::procfs::{self, TcpEntry};

/// How often the ring buffer is drained when the kernel has not woken us.
pub const POLL_INTERVAL: std::time::Duration = std::time::Duration::from_millis(10);

/// Map update flag: fail if the key exists.
const BPF_NOEXIST: u64 = 1;

#[derive(Clone, Debug)]
pub struct CaptureOptions {
    /// Processes to capture.
    pub pids: Vec<u32>,
    /// When non-empty, only server connections whose local port is listed;
    /// with no pids, every process listening on one of them is targeted.
    pub ports: Vec<u16>,
    /// Ring buffer size in bytes (a power of two, at least one page).
    pub ring_bytes: u32,
    /// Payload bytes captured at most per syscall.
    pub max_call_bytes: u32,
    /// Tracked connections at most (CONNS map size).
    pub max_conns: u32,
    /// Normally /proc.
    pub proc_root: PathBuf,
    /// Start even with no target (targets are added later with
    /// [`Capture::add_target`], e.g. by discovery).
    pub allow_no_targets: bool,
    /// Timestamp request bytes as they reach the engines' sockets
    /// (`tcp:tcp_probe`); off, or refused by the kernel: t0 is the read.
    pub arrival: bool,
    /// Read TLS plaintext from OpenSSL in the targets (`tls`).
    pub tls: bool,
    /// Which hooks capture socket data.
    pub data_hooks: DataHooks,
    /// The benchmark's reference capture path (`cargo xtask bench capture`
    /// measures the shipped path against it in the same run):
    /// syscall-tracepoint data hooks, the ring buffer read one record at a
    /// time (aya's reader, publishing the read position after each
    /// record), a reader wake-up every 64 records per CPU. Only in a
    /// build with the `bench-reference` feature (the bench's own build).
    #[cfg(feature = "bench-reference")]
    pub capture_reference: bool,
}

/// `--ring-buffer-bytes` by default: 16 MiB, about 2,000 records of a full
/// 8 KiB chunk and far more of the few-hundred-byte SSE writes that make
/// most records, so a slow agent pass drops nothing (the capture bench's
/// drop row, docs/benchmarks.md).
pub const DEFAULT_RING_BYTES: u32 = 16 << 20;

/// `--max-conns` by default: the size the CONNS map is compiled with
/// (`agent-ebpf/src/maps.rs`), a few bytes of kernel memory each.
pub const DEFAULT_MAX_CONNS: u32 = 65536;

impl Default for CaptureOptions {
    fn default() -> Self {
        Self {
            pids: vec![],
            ports: vec![],
            ring_bytes: DEFAULT_RING_BYTES,
            max_call_bytes: DEFAULT_MAX_CALL_BYTES,
            max_conns: DEFAULT_MAX_CONNS,
            proc_root: PathBuf::from("/proc"),
            allow_no_targets: false,
            arrival: true,
            tls: true,
            data_hooks: DataHooks::Auto,
            #[cfg(feature = "bench-reference")]
            capture_reference: false,
        }
    }
}

/// How socket reads and writes are hooked in the kernel.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum DataHooks {
    /// `btf` where the kernel allows it, else `tracepoint`.
    Auto,
    /// One fexit program on each data syscall's entry point (asked for
    /// only: it misses the calls in flight when it attaches).
    Fexit,
    /// One BTF tracepoint program on the raw `sys_exit` tracepoint.
    Btf,
    /// A perf syscall tracepoint pair per data syscall.
    Tracepoint,
}

impl DataHooks {
    pub fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Fexit => "fexit",
            Self::Btf => "btf",
            Self::Tracepoint => "tracepoint",
        }
    }
}

/// Counters of what the capture saw and lost.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct CaptureStats {
    /// Records the kernel wrote to the ring buffer.
    pub records_sent: u64,
    /// Records the kernel could not write (ring buffer full).
    pub records_dropped: u64,
    /// Calls whose payload exceeded the per-call limit.
    pub calls_truncated: u64,
    /// Calls whose user memory could not be read.
    pub read_faults: u64,
    /// Connections not tracked because CONNS was full.
    pub conns_full: u64,
    /// Records userspace read from the ring buffer.
    pub records_received: u64,
    /// Calls delivered incomplete because a follow-up record was lost.
    pub reassembly_gaps: u64,
    /// Typed events produced.
    pub events: u64,
    /// Connections untracked after /proc showed they are not TCP or not
    /// on a selected port.
    pub conns_untracked: u64,
    /// Connections currently tracked.
    pub conns_active: u64,
    /// Child processes of targets the kernel started capturing at fork.
    pub forks_followed: u64,
    /// Child processes of targets not captured because TARGETS was full.
    pub targets_full: u64,
    /// Targets whose exit the kernel saw (and removed from TARGETS).
    pub targets_exited: u64,
    /// Processes captured now (userspace's view).
    pub targets: u64,
    /// Entries of the kernel's TARGETS map now (equals `targets` once the
    /// ring buffer is drained).
    pub targets_in_kernel: u64,
    /// Process events not queued because nobody took them
    /// ([`PROC_EVENTS_CAP`]).
    pub proc_events_dropped: u64,
    /// Reports of rare conditions the kernel programs sent (aya-log; the
    /// texts are in the agent's log, `tokentap::kernel`).
    pub kernel_reports: u64,
    /// Reads of a request beyond its head whose bytes the kernel left
    /// uncopied, in whole or in part, under pressure (the ring buffer a
    /// quarter full, or the decoder over budget): their length is known.
    pub bodies_left: u64,
    /// Times the decoder's memory budget put the capture under pressure
    /// (the ring buffer's fill the kernel judges itself, per read).
    pub pressure_episodes: u64,
    /// The TLS source (`tokentap.tls.*`).
    pub tls: tls::TlsCounts,
}

/// Pressure from userspace on the kernel's request gate (agent-ebpf
/// `data.rs`, `gate`): the decoder over its memory budget. It begins
/// when the decoder says so and ends once the decoder has been back under
/// its budget for a second (so it does not flap). The kernel watches the
/// ring buffer's fill itself, on the reads it could leave unread. Each
/// episode has a number (`Config::shed_epoch`, never 0).
#[derive(Debug, Default)]
struct Pressure {
    decode: bool,
    /// The episode on now (0: none) and the last one's number.
    on: u32,
    last: u32,
    last_push: Option<std::time::Instant>,
    episodes: u64,
}

/// How long pressure outlasts its cause.
const PRESSURE_HOLD: std::time::Duration = std::time::Duration::from_secs(1);

impl Pressure {
    /// The episode number the kernel should see now (0: no pressure).
    fn next(&mut self, now: std::time::Instant) -> u32 {
        if self.decode {
            self.last_push = Some(now);
        }
        let held = self
            .last_push
            .is_some_and(|t| now.duration_since(t) < PRESSURE_HOLD);
        match (self.decode || (self.on != 0 && held), self.on != 0) {
            (true, false) => {
                self.last = self.last % u32::MAX.saturating_sub(1) + 1;
                self.on = self.last;
                self.episodes += 1;
                if self.episodes == 1 {
                    eprintln!(
                        "tokentap: the decoder is over --max-decode-memory: request bytes beyond \
                         a request's first {} KiB stay in the kernel until it is not (their length \
                         counted, their input tokens estimated); counted in tokentap.capture.bodies_left",
                        agent_ebpf::DEFAULT_HEAD_BYTES / 1024
                    );
                }
            }
            (false, true) => self.on = 0,
            _ => {}
        }
        self.on
    }
}

/// Records per CPU between forced reader wake-ups: `cap`, or fewer so
/// that a quarter of the ring buffer is never exceeded even by records of
/// the largest size (a full chunk); a power of two. Each wake-up is an
/// inter-processor interrupt the traced process pays for (a VM exit on a
/// virtual machine); the reader's 10 ms poll picks up the rest.
fn wakeup_every(ring_bytes: u32, cap: u32) -> u32 {
    let largest = (HEADER_BYTES + CHUNK_BYTES + 8) as u32;
    let fit = (ring_bytes / 4 / largest).clamp(1, cap);
    1 << (31 - fit.leading_zeros())
}

/// Forced wake-up interval cap: 256 records per CPU (the reader is woken
/// once per that many records, not per record); 64 for the benchmark's
/// reference path (`--capture-reference`).
const WAKEUP_CAP: u32 = 256;
const REFERENCE_WAKEUP_CAP: u32 = 64;

impl CaptureOptions {
    /// Whether this is the benchmark's reference path (never, in a build
    /// without the `bench-reference` feature).
    fn reference(&self) -> bool {
        #[cfg(feature = "bench-reference")]
        return self.capture_reference;
        #[cfg(not(feature = "bench-reference"))]
        false
    }
}

/// Userspace state the record handler mutates (kept apart from the ring
/// buffer so both can be borrowed at once).
struct State {
    targets: HashMap<MapData, u32, u8>,
    /// The BTF data program's pre-filter for `targets`.
    slots: Array<MapData, u8>,
    conns: HashMap<MapData, u64, ConnState>,
    stats_map: PerCpuArray<MapData, u64>,
    clock: ClockOffset,
    reasm: Reassembler,
    /// Connections we emitted an open for.
    open: StdHashMap<(u32, i32), OpenEvent>,
    /// Connections found not to be TCP / not selected: their stray
    /// records (sent before we untracked them) are dropped.
    ignored: HashSet<(u32, i32)>,
    /// Direct socket queries (pidfd_getfd).
    sockfds: SockFds,
    /// TCP tables read during the current batch, per pid (fallback).
    tables: StdHashMap<u32, Vec<TcpEntry>>,
    target_pids: HashSet<u32>,
    ports: Vec<u16>,
    proc_root: PathBuf,
    records_received: u64,
    events: u64,
    conns_untracked: u64,
    scratch: Vec<(RecordHeader, Vec<u8>)>,
    /// Process events since the last `take_proc_events`.
    proc_events: Vec<ProcEvent>,
    proc_events_dropped: u64,
}

/// The ring buffer as the agent reads it.
enum Ring {
    /// Batched reads (`ring.rs`); the map is kept for its fd.
    Batched {
        reader: ring::RingReader,
        map: MapData,
        /// Bytes of records read at most per call (the ring's size): a
        /// burst is handed to the pipeline in bounded batches.
        limit: u64,
    },
    /// aya's per-record reads (`--capture-reference`).
    #[cfg(feature = "bench-reference")]
    PerRecord(aya::maps::RingBuf<MapData>),
}

impl Ring {
    fn new(events: aya::maps::Map, opts: &CaptureOptions) -> Result<Ring> {
        #[cfg(feature = "bench-reference")]
        if opts.reference() {
            return Ok(Ring::PerRecord(aya::maps::RingBuf::try_from(events)?));
        }
        let aya::maps::Map::RingBuf(map) = events else {
            bail!("the EVENTS map is not a ring buffer");
        };
        let reader = ring::RingReader::new(map.fd().as_fd(), opts.ring_bytes)
            .context("mapping the ring buffer")?;
        Ok(Ring::Batched {
            reader,
            map,
            limit: opts.ring_bytes as u64,
        })
    }
}

/// The reader wake-up cap `opts` asks for.
fn wakeup_cap(opts: &CaptureOptions) -> u32 {
    if opts.reference() {
        REFERENCE_WAKEUP_CAP
    } else {
        WAKEUP_CAP
    }
}

impl AsRawFd for Ring {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            Ring::Batched { map, .. } => map.fd().as_fd().as_raw_fd(),
            #[cfg(feature = "bench-reference")]
            Ring::PerRecord(r) => r.as_raw_fd(),
        }
    }
}

/// Every `--pid` names a process (an argument error, said before anything
/// starts: the GPU sampler, the programs).
pub fn check_pids(opts: &CaptureOptions) -> Result<()> {
    for &pid in &opts.pids {
        if !opts.proc_root.join(pid.to_string()).exists() {
            bail!("no process with pid {pid}");
        }
    }
    Ok(())
}

/// The capabilities capturing needs that `cap_eff` (a `CapEff` mask)
/// lacks: CAP_BPF and CAP_PERFMON (CAP_SYS_ADMIN stands for both, as on
/// kernels before 5.8), CAP_SYS_PTRACE, CAP_DAC_READ_SEARCH.
pub fn missing_capabilities(cap_eff: u64) -> Vec<&'static str> {
    let has = |bit: u32| cap_eff >> bit & 1 == 1;
    let admin = has(21);
    [
        (39, "CAP_BPF", admin),
        (38, "CAP_PERFMON", admin),
        (19, "CAP_SYS_PTRACE", false),
        (2, "CAP_DAC_READ_SEARCH", false),
    ]
    .into_iter()
    .filter(|&(bit, _, covered)| !has(bit) && !covered)
    .map(|(_, name, _)| name)
    .collect()
}

/// Stops at once, naming what is missing, when this process cannot load
/// the programs (no CAP_BPF / CAP_PERFMON); warns when it can but cannot
/// look into other users' processes. Said before anything else starts.
pub fn check_privileges() -> Result<()> {
    let Some(eff) = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
    else {
        return Ok(()); // cannot tell: the kernel will say
    };
    let missing = missing_capabilities(eff);
    if missing
        .iter()
        .any(|c| *c == "CAP_BPF" || *c == "CAP_PERFMON")
    {
        bail!(
            "missing privileges: this process lacks {}; capturing needs {PRIVILEGES}",
            missing.join(", ")
        );
    }
    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !missing.is_empty() && !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
        eprintln!(
            "tokentap: warning: this process lacks {}: engines of other users cannot be looked into (their sockets, command lines); capturing needs {PRIVILEGES}",
            missing.join(", ")
        );
    }
    Ok(())
}

/// What capturing needs, in the words every message and `--help` use.
pub const PRIVILEGES: &str = "root, or CAP_BPF + CAP_PERFMON + CAP_SYS_PTRACE + \
CAP_DAC_READ_SEARCH (+ CAP_SYS_ADMIN only where tracefs is not mounted); \
docs/deploy.md, \"Privileges\"";

pub struct Capture {
    // Field order matters for drop: programs detach before maps go.
    ring: AsyncFd<Ring>,
    st: State,
    /// The engines' ports the arrival program watches (None: arrival
    /// timestamps off or refused), and what it holds now.
    arrival_ports: Option<HashMap<MapData, u16, u8>>,
    arrival_set: HashSet<u16>,
    /// The data hooks in use: `Btf` or `Tracepoint`.
    data_hooks: DataHooks,
    /// The kernel programs' reports (aya-log), read with each drain.
    kernel_log: aya_log::EbpfLogger<kernel_log::KernelLog>,
    kernel_reports: Arc<AtomicU64>,
    config: Array<MapData, Config>,
    /// What `config` holds now.
    cfg: Config,
    pressure: Pressure,
    ebpf: Ebpf,
    tls: tls::TlsSource,
    tls_scanned: std::time::Instant,
    tls_bio_checked: std::time::Instant,
}

/// The one line that says what this kernel gave the capture (the kernel
/// matrix, `cargo xtask kernels`, reads it too).
fn kernel_line(a: &probes::Attached, arrival: bool, arrival_asked: bool) -> String {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|r| r.trim().to_string())
        .unwrap_or_else(|_| "?".to_string());
    let data = match a.data {
        DataHooks::Fexit => "socket data through fexit on the data syscalls",
        DataHooks::Btf => "socket data through the BTF sys_exit tracepoint",
        _ => "socket data through syscall tracepoints",
    };
    let exits = match a.layouts.exit {
        layout::ExitLayout::GroupDead => "thread-group ends from group_dead".to_string(),
        layout::ExitLayout::Leader => {
            "thread-group ends from the leader's exit (sched_process_exit has no group_dead)"
                .to_string()
        }
    };
    let forks = match a.layouts.fork_child_pid {
        Some(at) => format!("children followed (sched_process_fork child_pid at {at})"),
        None => "children not followed in the kernel (unknown sched_process_fork layout)".into(),
    };
    let arrival = match (arrival, arrival_asked) {
        (true, _) => "arrival times on",
        (false, true) => "arrival times off (see above)",
        (false, false) => "arrival times off (--no-arrival)",
    };
    format!("tokentap: kernel {release}: {data}; {exits}; {forks}; {arrival}")
}

impl Capture {
    /// Loads and attaches the programs, registers targets, seeds
    /// connections that are already open. Needs root (CAP_BPF, CAP_PERFMON,
    /// and CAP_SYS_ADMIN to mount tracefs).
    pub fn start(opts: &CaptureOptions) -> Result<Self> {
        if !opts.ring_bytes.is_power_of_two() || opts.ring_bytes < 4096 {
            bail!(
                "--ring-buffer-bytes must be a power of two of at least 4096, got {}",
                opts.ring_bytes
            );
        }
        let max_call = opts
            .max_call_bytes
            .min(CHUNK_BYTES as u32 * MAX_RECORDS_PER_CALL);
        let mut pids = opts.pids.clone();
        if pids.is_empty() && !opts.ports.is_empty() {
            pids = procfs::pids_listening_on(&opts.proc_root, &opts.ports);
            if pids.is_empty() && !opts.allow_no_targets {
                if procfs::fds_denied() {
                    bail!(
                        "no process this agent may look into is listening on port(s) {:?}: \
                         other processes' sockets could not be read (permission denied). \
                         Capturing needs {}",
                        opts.ports,
                        PRIVILEGES
                    );
                }
                bail!(
                    "no process is listening on port(s) {:?} (in any network namespace)",
                    opts.ports
                );
            }
        }
        if pids.is_empty() && !opts.allow_no_targets {
            bail!("nothing to capture: give --pid PID or --port PORT");
        }
        check_pids(opts)?;

        let mut ebpf = programs::load_object(opts.ring_bytes, opts.max_conns)?;
        let mut config: Array<MapData, Config> =
            Array::try_from(ebpf.take_map("CONFIG").context("CONFIG map missing")?)?;
        let cfg = Config {
            max_call_bytes: max_call,
            abi_version: ABI_VERSION,
            wakeup_every: wakeup_every(opts.ring_bytes, wakeup_cap(opts)),
            ring_high: opts.ring_bytes / 4,
            ..Config::default()
        };
        config.set(0, cfg, 0)?;
        let hooks = if opts.reference() {
            DataHooks::Tracepoint
        } else {
            opts.data_hooks
        };
        let attached = probes::attach_agent(&mut ebpf, hooks)?;
        let data_hooks = attached.data;
        let arrival_ports = if opts.arrival {
            match probes::attach_arrival(&mut ebpf) {
                Ok(()) => Some(HashMap::try_from(
                    ebpf.take_map("ARRIVAL_PORTS")
                        .context("ARRIVAL_PORTS map missing")?,
                )?),
                Err(e) => {
                    eprintln!(
                        "tokentap: request arrival times off ({e:#}): t0 is the engine's first read, time unread in the socket is not measured"
                    );
                    None
                }
            }
        } else {
            None
        };
        eprintln!(
            "{}",
            kernel_line(&attached, arrival_ports.is_some(), opts.arrival)
        );

        let targets = HashMap::try_from(ebpf.take_map("TARGETS").context("TARGETS map missing")?)?;
        let slots = Array::try_from(
            ebpf.take_map("TARGET_SLOTS")
                .context("TARGET_SLOTS map missing")?,
        )?;
        let conns = HashMap::try_from(ebpf.take_map("CONNS").context("CONNS map missing")?)?;
        let stats_map =
            PerCpuArray::try_from(ebpf.take_map("STATS").context("STATS map missing")?)?;
        let events = ebpf.take_map("EVENTS").context("EVENTS map missing")?;
        // One mapping of the ring: aya's reader maps it too (and the kernel
        // maps a ring's pages at mmap time, so every mapping adds its
        // size to the agent's RSS, twice over for the wrap-around copy).
        let ring = Ring::new(events, opts)?;
        // SAFETY: the ring buffer's fd stays open for as long as the
        // AsyncFd owning it exists.
        let ring = unsafe { AsyncFd::register(ring) }.map_err(|e| {
            anyhow::anyhow!(
                "registering the ring buffer with tokio: {}",
                e.into_parts().1
            )
        })?;

        let mut st = State {
            targets,
            slots,
            conns,
            stats_map,
            clock: ClockOffset::measure(),
            reasm: Reassembler::default(),
            open: StdHashMap::new(),
            ignored: HashSet::new(),
            sockfds: SockFds::default(),
            tables: StdHashMap::new(),
            target_pids: HashSet::new(),
            ports: opts.ports.clone(),
            proc_root: opts.proc_root.clone(),
            records_received: 0,
            events: 0,
            conns_untracked: 0,
            scratch: Vec::new(),
            proc_events: Vec::new(),
            proc_events_dropped: 0,
        };
        for pid in pids {
            st.add_tree(pid)?;
        }
        let kernel_reports = Arc::new(AtomicU64::new(0));
        let kernel_log = aya_log::EbpfLogger::init_with_logger(
            &mut ebpf,
            kernel_log::KernelLog::new(kernel_reports.clone()),
        )
        .context(
            "reading the kernel programs' reports (aya-log's AYA_LOGS map; an object \
             built before them has none: rebuild with `cargo xtask build`)",
        )?;
        let mut cap = Self {
            ring,
            st,
            arrival_ports,
            arrival_set: HashSet::new(),
            data_hooks,
            kernel_log,
            kernel_reports,
            config,
            cfg,
            pressure: Pressure::default(),
            ebpf,
            tls: tls::TlsSource::new(opts.tls),
            tls_scanned: std::time::Instant::now(),
            tls_bio_checked: std::time::Instant::now(),
        };
        // --port: the engines' ports are known before any engine is.
        let ports = opts.ports.clone();
        cap.set_arrival_ports(ports.iter().copied());
        Ok(cap)
    }

    /// The hooks capturing socket data (`Btf` or `Tracepoint`, never
    /// `Auto`).
    pub fn data_hooks(&self) -> DataHooks {
        self.data_hooks
    }

    /// Whether request arrivals are timestamped in the kernel.
    pub fn arrival_on(&self) -> bool {
        self.arrival_ports.is_some()
    }

    /// The local ports whose received segments get arrival timestamps: the
    /// targeted engines' listening ports (set, not added: ports no engine
    /// listens on any more are dropped).
    pub fn set_arrival_ports(&mut self, ports: impl IntoIterator<Item = u16>) {
        let Some(map) = &mut self.arrival_ports else {
            return;
        };
        let want: HashSet<u16> = ports.into_iter().collect();
        for p in self.arrival_set.difference(&want) {
            let _ = map.remove(p);
        }
        for p in want.difference(&self.arrival_set) {
            if let Err(e) = map.insert(p, 1, 0) {
                log::warn!("arrival port {p} not watched: {e}");
            }
        }
        self.arrival_set = want;
    }

    /// Starts capturing `pid` too, and its living descendants, with open
    /// events for the connections they already hold. False when it was
    /// already a target.
    pub fn add_target(&mut self, pid: u32, out: &mut Vec<SocketEvent>) -> Result<bool> {
        if self.st.target_pids.contains(&pid) {
            return Ok(false);
        }
        for p in self.st.add_tree(pid)? {
            self.st.seed_pid(p, out);
            self.tls.scan(&mut self.ebpf, &self.st.proc_root, p);
        }
        Ok(true)
    }

    /// Moves the process events collected by `next_events` / `drain`
    /// since the last call into `out` (at most [`PROC_EVENTS_CAP`] are
    /// kept in between; the rest are counted as dropped).
    pub fn take_proc_events(&mut self, out: &mut Vec<ProcEvent>) {
        out.append(&mut self.st.proc_events);
    }

    /// The processes being captured.
    pub fn targets(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.st.target_pids.iter().copied().collect();
        v.sort_unstable();
        v
    }

    /// Open events for the TCP connections targets already hold (call once,
    /// after `start`). Attaching comes first, so a connection accepted in
    /// between is reported once, by whichever side sees it first.
    pub fn seed(&mut self, out: &mut Vec<SocketEvent>) {
        let pids: Vec<u32> = self.targets();
        for pid in pids {
            self.st.seed_pid(pid, out);
            self.tls.scan(&mut self.ebpf, &self.st.proc_root, pid);
        }
    }

    /// Waits until the kernel wakes us or the poll interval passes, then
    /// converts every record in the ring buffer. The kernel side wakes the
    /// reader only every `Config::wakeup_every` records per CPU, so the
    /// poll timer is what picks up a trickle of records.
    pub async fn next_events(&mut self, out: &mut Vec<SocketEvent>) -> Result<()> {
        // Libraries loaded after a target started (Python's `import ssl`).
        // Memory-BIO processes the kernel found (a fifth of a second at
        // most: their first calls are not attributed until then).
        if self.tls_bio_checked.elapsed() >= std::time::Duration::from_millis(200) {
            self.tls_bio_checked = std::time::Instant::now();
            self.tls.want_bio(&mut self.ebpf);
        }
        if self.tls_scanned.elapsed() >= std::time::Duration::from_secs(2) {
            self.tls_scanned = std::time::Instant::now();
            self.tls.retain(&mut self.ebpf, &self.st.target_pids);
            for pid in self.targets() {
                self.tls.scan(&mut self.ebpf, &self.st.proc_root, pid);
            }
        }
        self.update_pressure();
        match tokio::time::timeout(POLL_INTERVAL, self.ring.readable_mut()).await {
            Ok(guard) => {
                let mut guard = guard?;
                // Readiness stays set while a bounded read left records.
                if !Self::read(guard.get_inner_mut(), &mut self.st, out) {
                    guard.clear_ready();
                }
            }
            Err(_) => {
                Self::read(self.ring.get_mut(), &mut self.st, out);
            }
        }
        Ok(())
    }

    /// The decoder is over its memory budget (`on`) or back under it: then
    /// large request bodies stay in the kernel ([`Pressure`]).
    pub fn set_decode_pressure(&mut self, on: bool) {
        if self.pressure.decode != on {
            self.pressure.decode = on;
            self.update_pressure();
        }
    }

    /// Tells the kernel's request gate whether the decoder is under
    /// pressure (only when it changes: a map update).
    fn update_pressure(&mut self) {
        let epoch = self.pressure.next(std::time::Instant::now());
        if epoch != self.cfg.shed_epoch {
            self.cfg.shed_epoch = epoch;
            if let Err(e) = self.config.set(0, self.cfg, 0) {
                eprintln!("tokentap: cannot update the capture's pressure mode: {e}");
            }
        }
    }

    /// Converts whatever is in the ring buffer now, without waiting
    /// (several bounded reads when a burst is waiting).
    pub fn drain(&mut self, out: &mut Vec<SocketEvent>) {
        self.kernel_log.flush();
        for _ in 0..16 {
            if !Self::read(self.ring.get_mut(), &mut self.st, out) {
                break;
            }
        }
    }

    /// One read of the ring; true when it stopped at its size limit with
    /// more records waiting.
    fn read(ring: &mut Ring, st: &mut State, out: &mut Vec<SocketEvent>) -> bool {
        st.tables.clear();
        match ring {
            Ring::Batched { reader, limit, .. } => {
                reader.drain(*limit, |rec| st.handle(rec, out)).1
            }
            #[cfg(feature = "bench-reference")]
            Ring::PerRecord(ring) => {
                while let Some(item) = ring.next() {
                    st.handle(&item, out);
                }
                false
            }
        }
    }

    /// Delivers calls still waiting for follow-up records (at shutdown).
    pub fn finish(&mut self, out: &mut Vec<SocketEvent>) {
        self.drain(out);
        let mut done = std::mem::take(&mut self.st.scratch);
        done.clear();
        self.st.reasm.flush(&mut done);
        for (h, data) in done.drain(..) {
            self.st.emit_data(h, data, out);
        }
        self.st.scratch = done;
    }

    pub fn stats(&self) -> CaptureStats {
        let st = &self.st;
        let sum = |i: u32| -> u64 {
            st.stats_map
                .get(&i, 0)
                .map(|v| v.iter().copied().sum())
                .unwrap_or(0)
        };
        CaptureStats {
            records_sent: sum(stat::RECORDS_SENT),
            records_dropped: sum(stat::RECORDS_DROPPED),
            calls_truncated: sum(stat::CALLS_TRUNCATED),
            read_faults: sum(stat::READ_FAULTS),
            conns_full: sum(stat::CONNS_FULL),
            records_received: st.records_received,
            reassembly_gaps: st.reasm.gaps,
            events: st.events,
            conns_untracked: st.conns_untracked,
            conns_active: st.open.len() as u64,
            forks_followed: sum(stat::FORKS_FOLLOWED),
            targets_full: sum(stat::TARGETS_FULL),
            targets_exited: sum(stat::TARGETS_EXITED),
            targets: st.target_pids.len() as u64,
            targets_in_kernel: st.kernel_target_count(),
            proc_events_dropped: st.proc_events_dropped,
            kernel_reports: self.kernel_reports.load(Ordering::Relaxed),
            bodies_left: sum(stat::BODIES_LEFT),
            pressure_episodes: self.pressure.episodes,
            tls: tls::TlsCounts {
                source: self.tls.stats(),
                calls: sum(stat::TLS_CALLS),
                unattributed: sum(stat::TLS_UNATTRIBUTED),
                bios_linked: sum(stat::TLS_BIOS_LINKED),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{wakeup_every, Pressure, REFERENCE_WAKEUP_CAP, WAKEUP_CAP};
    use std::time::{Duration, Instant};

    #[test]
    fn decoder_pressure_outlasts_its_cause_by_a_second_and_numbers_its_episodes() {
        let mut p = Pressure::default();
        let t = Instant::now();
        assert_eq!(p.next(t), 0, "calm");
        p.decode = true;
        let e1 = p.next(t);
        assert_ne!(e1, 0);
        p.decode = false;
        assert_eq!(p.next(t + Duration::from_millis(500)), e1, "held a second");
        assert_eq!(p.next(t + Duration::from_millis(1500)), 0);
        p.decode = true;
        let e2 = p.next(t + Duration::from_secs(2));
        assert!(e2 != 0 && e2 != e1, "a new episode, a new number");
        assert_eq!(p.episodes, 2);
    }

    #[test]
    fn wakeup_interval_is_a_power_of_two_that_fits_small_rings() {
        assert_eq!(wakeup_every(16 << 20, WAKEUP_CAP), 256);
        assert_eq!(wakeup_every(16 << 20, REFERENCE_WAKEUP_CAP), 64);
        // 1 MiB: 31 largest records in a quarter → 16.
        assert_eq!(wakeup_every(1 << 20, WAKEUP_CAP), 16);
        assert_eq!(wakeup_every(4096, WAKEUP_CAP), 1);
        assert_eq!(wakeup_every(1 << 12 >> 1, WAKEUP_CAP), 1);
    }
}
