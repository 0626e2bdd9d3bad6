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
pub mod procfs;
pub mod reassemble;
pub mod sockfd;

use std::{
    collections::{HashMap as StdHashMap, HashSet},
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    path::{Path, PathBuf},
};

use agent_ebpf::{
    conn_key, stat, Config, ConnState, Direction, RecordHeader, RecordKind, Syscall, ABI_VERSION,
    AF_INET, AF_INET6, CHUNK_BYTES, DEFAULT_MAX_CALL_BYTES, HEADER_BYTES, MAX_RECORDS_PER_CALL,
    ROLE_CLIENT, ROLE_SERVER,
};
use anyhow::{bail, Context, Result};
use aya::{
    maps::{Array, HashMap, MapData, PerCpuArray, RingBuf},
    programs::TracePoint,
    Ebpf, EbpfLoader,
};
use tokio::io::unix::AsyncFd;

use self::{
    clock::ClockOffset,
    procfs::{FdKind, TcpEntry},
    reassemble::Reassembler,
    sockfd::SockFds,
};
use crate::event::{CloseEvent, DataEvent, Dir, OpenEvent, Role, SocketEvent};

/// The compiled kernel programs (empty when built without `cargo xtask`).
static EBPF_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/tokentap-ebpf.o"));

/// How often the ring buffer is drained when the kernel has not woken us.
pub const POLL_INTERVAL: std::time::Duration = std::time::Duration::from_millis(10);

/// Map update flag: fail if the key exists.
const BPF_NOEXIST: u64 = 1;

/// Where tracepoints are attached from.
pub const TRACEFS: &str = "/sys/kernel/tracing";

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
}

impl Default for CaptureOptions {
    fn default() -> Self {
        Self {
            pids: vec![],
            ports: vec![],
            ring_bytes: 16 << 20,
            max_call_bytes: DEFAULT_MAX_CALL_BYTES,
            max_conns: 65536,
            proc_root: PathBuf::from("/proc"),
            allow_no_targets: false,
        }
    }
}

/// Counters of what the capture saw and lost.
#[cfg(test)]
mod tests {
    use super::wakeup_every;

    #[test]
    fn wakeup_interval_is_a_power_of_two_that_fits_small_rings() {
        assert_eq!(wakeup_every(16 << 20), 64);
        assert_eq!(wakeup_every(4096), 2);
        assert_eq!(wakeup_every(8192), 4);
        assert_eq!(wakeup_every(1 << 12 >> 1), 1);
    }
}

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
}

/// Mounts tracefs at /sys/kernel/tracing when it is missing.
pub fn ensure_tracefs() -> Result<()> {
    let events = Path::new(TRACEFS).join("events");
    if events.is_dir() || Path::new("/sys/kernel/debug/tracing/events").is_dir() {
        return Ok(());
    }
    let src = c"tracefs";
    let dst = c"/sys/kernel/tracing";
    // SAFETY: valid NUL-terminated strings; no data argument.
    let rc = unsafe {
        libc::mount(
            src.as_ptr(),
            dst.as_ptr(),
            src.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        let err = std::io::Error::last_os_error();
        bail!(
            "tracefs is not mounted and mounting it failed ({err}).\n\
             Mount it first:  mount -t tracefs tracefs {TRACEFS}\n\
             (or run the agent as root / with CAP_SYS_ADMIN so it can mount it itself)"
        );
    }
    log::info!("mounted tracefs at {TRACEFS}");
    Ok(())
}

fn raise_memlock() {
    let lim = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: plain struct argument. Failure only matters on old kernels
    // that charge maps to RLIMIT_MEMLOCK; loading then reports it.
    unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim) };
}

/// Where each program attaches: (program name, category, tracepoint).
fn attach_point(name: &str) -> Option<(&'static str, &str)> {
    if name.starts_with("sys_enter_") || name.starts_with("sys_exit_") {
        Some(("syscalls", name))
    } else if name.starts_with("sched_") {
        Some(("sched", name))
    } else {
        None
    }
}

/// Records per CPU between forced reader wake-ups: 64, or fewer so that
/// a quarter of a small ring buffer is never exceeded by SSE-sized records.
fn wakeup_every(ring_bytes: u32) -> u32 {
    let fit = (ring_bytes / 4 / 512).clamp(1, 64);
    1 << (31 - fit.leading_zeros())
}

/// Checks the embedded object, mounts tracefs if needed, loads the object.
fn load_object(ring_bytes: u32, max_conns: u32) -> Result<Ebpf> {
    if EBPF_OBJECT.is_empty() {
        bail!(
            "this tokentap binary was built without its eBPF programs.\n\
             Build it with `cargo xtask build` (or run it with `cargo xtask run -- …`)."
        );
    }
    ensure_tracefs()?;
    raise_memlock();
    EbpfLoader::new()
        .map_max_entries("EVENTS", ring_bytes)
        .map_max_entries("CONNS", max_conns)
        .load(EBPF_OBJECT)
        .map_err(|e| anyhow::anyhow!(e))
        .context(
            "loading the eBPF object failed: tokentap needs root \
             (or CAP_BPF + CAP_PERFMON) and a kernel with BTF and ring buffers (5.8+)",
        )
}

/// Loads and attaches every program `place` gives an attach point.
fn attach_programs(
    ebpf: &mut Ebpf,
    place: impl Fn(&str) -> Option<(&'static str, &str)>,
) -> Result<()> {
    let names: Vec<String> = ebpf.programs().map(|(n, _)| n.to_string()).collect();
    for name in &names {
        let Some((category, tp)) = place(name) else {
            continue;
        };
        let prog: &mut TracePoint = ebpf
            .program_mut(name)
            .context("program vanished")?
            .try_into()?;
        prog.load()
            .map_err(|e| anyhow::anyhow!("{e:?}"))
            .with_context(|| format!("the kernel verifier rejected {name}"))?;
        prog.attach(category, tp)
            .with_context(|| format!("attaching {name} to {category}/{tp}"))?;
    }
    Ok(())
}

/// Attaches only the benchmark's reference programs (one map lookup on
/// write enter/exit). Keep the returned object alive while measuring.
pub fn attach_floor() -> Result<Ebpf> {
    let mut ebpf = load_object(4096, 1024)?;
    attach_programs(&mut ebpf, |name| {
        name.strip_prefix("floor_").map(|tp| ("syscalls", tp))
    })?;
    Ok(ebpf)
}

/// Userspace state the record handler mutates (kept apart from the ring
/// buffer so both can be borrowed at once).
struct State {
    targets: HashMap<MapData, u32, u8>,
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
}

pub struct Capture {
    // Field order matters for drop: programs detach before maps go.
    ring: AsyncFd<RingBuf<MapData>>,
    st: State,
    _config: Array<MapData, Config>,
    _ebpf: Ebpf,
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
                bail!("no process is listening on port(s) {:?}", opts.ports);
            }
        }
        if pids.is_empty() && !opts.allow_no_targets {
            bail!("nothing to capture: give --pid PID or --port PORT");
        }
        for &pid in &pids {
            if !opts.proc_root.join(pid.to_string()).exists() {
                bail!("no process with pid {pid}");
            }
        }

        let mut ebpf = load_object(opts.ring_bytes, opts.max_conns)?;
        let mut config: Array<MapData, Config> =
            Array::try_from(ebpf.take_map("CONFIG").context("CONFIG map missing")?)?;
        config.set(
            0,
            Config {
                max_call_bytes: max_call,
                abi_version: ABI_VERSION,
                wakeup_every: wakeup_every(opts.ring_bytes),
                _pad: 0,
            },
            0,
        )?;
        attach_programs(&mut ebpf, attach_point)?;

        let targets = HashMap::try_from(ebpf.take_map("TARGETS").context("TARGETS map missing")?)?;
        let conns = HashMap::try_from(ebpf.take_map("CONNS").context("CONNS map missing")?)?;
        let stats_map =
            PerCpuArray::try_from(ebpf.take_map("STATS").context("STATS map missing")?)?;
        let ring = RingBuf::try_from(ebpf.take_map("EVENTS").context("EVENTS map missing")?)?;
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
        };
        for pid in pids {
            st.targets.insert(pid, 1u8, 0)?;
            st.target_pids.insert(pid);
        }
        Ok(Self {
            ring,
            st,
            _config: config,
            _ebpf: ebpf,
        })
    }

    /// Starts capturing `pid` too, with open events for the connections it
    /// already holds. False when it was already a target.
    pub fn add_target(&mut self, pid: u32, out: &mut Vec<SocketEvent>) -> Result<bool> {
        if self.st.target_pids.contains(&pid) {
            return Ok(false);
        }
        self.st.targets.insert(pid, 1u8, 0)?;
        self.st.target_pids.insert(pid);
        self.st.seed_pid(pid, out);
        Ok(true)
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
        }
    }

    /// Waits until the kernel wakes us or the poll interval passes, then
    /// converts every record in the ring buffer. The kernel side wakes the
    /// reader only every `Config::wakeup_every` records per CPU, so the
    /// poll timer is what picks up a trickle of records.
    pub async fn next_events(&mut self, out: &mut Vec<SocketEvent>) -> Result<()> {
        match tokio::time::timeout(POLL_INTERVAL, self.ring.readable_mut()).await {
            Ok(guard) => {
                let mut guard = guard?;
                let ring = guard.get_inner_mut();
                self.st.tables.clear();
                while let Some(item) = ring.next() {
                    self.st.handle(&item, out);
                }
                guard.clear_ready();
            }
            Err(_) => self.drain(out),
        }
        Ok(())
    }

    /// Converts whatever is in the ring buffer now, without waiting.
    pub fn drain(&mut self, out: &mut Vec<SocketEvent>) {
        let ring = self.ring.get_mut();
        self.st.tables.clear();
        while let Some(item) = ring.next() {
            self.st.handle(&item, out);
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
        }
    }
}

fn peer_from_header(h: &RecordHeader) -> Option<SocketAddr> {
    let ip = match h.family {
        AF_INET => IpAddr::V4(Ipv4Addr::new(h.addr[0], h.addr[1], h.addr[2], h.addr[3])),
        AF_INET6 => {
            let v6 = Ipv6Addr::from(h.addr);
            match v6.to_ipv4_mapped() {
                Some(v4) => IpAddr::V4(v4),
                None => IpAddr::V6(v6),
            }
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, h.port))
}

impl State {
    fn handle(&mut self, bytes: &[u8], out: &mut Vec<SocketEvent>) {
        self.records_received += 1;
        if bytes.len() < HEADER_BYTES {
            return;
        }
        // SAFETY: length checked; RecordHeader is plain data, read unaligned.
        let h: RecordHeader = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) };
        let payload = &bytes[HEADER_BYTES..];
        let payload = &payload[..(h.cap_len as usize).min(payload.len())];
        match RecordKind::from_u8(h.kind) {
            Some(RecordKind::Data) => {
                let mut done = std::mem::take(&mut self.scratch);
                self.reasm.push(h, payload, &mut done);
                for (h, data) in done.drain(..) {
                    self.emit_data(h, data, out);
                }
                self.scratch = done;
            }
            Some(RecordKind::Open) => self.on_open(&h, out),
            Some(RecordKind::Close) => {
                let key = (h.tgid, h.fd);
                if self.ignored.remove(&key) {
                    return;
                }
                self.open.remove(&key);
                self.events += 1;
                out.push(SocketEvent::Close(CloseEvent {
                    ts_ns: self.clock.to_wall_ns(h.ts_ns),
                    pid: h.tgid,
                    fd: h.fd,
                }));
            }
            Some(RecordKind::Exit) => self.on_exit(&h, out),
            Some(RecordKind::Exec) | None => {}
        }
    }

    fn emit_data(&mut self, h: RecordHeader, data: Vec<u8>, out: &mut Vec<SocketEvent>) {
        if self.ignored.contains(&(h.tgid, h.fd)) {
            return;
        }
        let dir = if h.dir == Direction::Out as u8 {
            Dir::Out
        } else {
            Dir::In
        };
        self.events += 1;
        out.push(SocketEvent::Data(DataEvent {
            ts_ns: self.clock.to_wall_ns(h.ts_ns),
            pid: h.tgid,
            tid: h.tid,
            fd: h.fd,
            dir,
            ret: h.ret,
            data,
            syscall: Syscall::from_u8(h.syscall).map(|s| s.name().to_string()),
        }));
    }

    fn table(&mut self, pid: u32, reload: bool) -> &[TcpEntry] {
        if reload || !self.tables.contains_key(&pid) {
            let t = procfs::tcp_table(&self.proc_root, pid);
            self.tables.insert(pid, t);
        }
        self.tables.get(&pid).map(Vec::as_slice).unwrap_or(&[])
    }

    fn classify(&mut self, pid: u32, fd: i32) -> FdKind {
        if let Some(kind) = self.sockfds.classify(pid, fd) {
            return kind;
        }
        let root = self.proc_root.clone();
        let kind = procfs::classify_fd(&root, pid, fd, self.table(pid, false));
        if kind == FdKind::NotTcp {
            // The cached table may predate this connection: look again.
            return procfs::classify_fd(&root, pid, fd, self.table(pid, true));
        }
        kind
    }

    /// What the listening fd of an accept-born connection is, if any.
    fn listener(&mut self, pid: u32, listen_fd: i32, sc: u8) -> Option<FdKind> {
        let accepted = sc == Syscall::Accept as u8 || sc == Syscall::Accept4 as u8;
        if !accepted || listen_fd < 0 {
            return None;
        }
        Some(self.classify(pid, listen_fd))
    }

    fn untrack(&mut self, pid: u32, fd: i32) {
        let _ = self.conns.remove(&conn_key(pid, fd));
        self.ignored.insert((pid, fd));
        self.open.remove(&(pid, fd));
        self.conns_untracked += 1;
    }

    fn selected(&self, role: Role, local: Option<SocketAddr>) -> bool {
        if self.ports.is_empty() {
            return true;
        }
        match (role, local) {
            (Role::Server, Some(l)) => self.ports.contains(&l.port()),
            // Unknown local address (fd already closed): keep rather than
            // lose a connection we cannot judge.
            (Role::Server, None) => true,
            (Role::Client, _) => false,
        }
    }

    fn on_open(&mut self, h: &RecordHeader, out: &mut Vec<SocketEvent>) {
        let (pid, fd) = (h.tgid, h.fd);
        self.ignored.remove(&(pid, fd));
        let role = if h.role == ROLE_CLIENT {
            Role::Client
        } else {
            Role::Server
        };
        let (local, peer) = match self.classify(pid, fd) {
            FdKind::Tcp { local, peer } => (Some(local), peer.or_else(|| peer_from_header(h))),
            FdKind::NotTcp => {
                self.untrack(pid, fd);
                return;
            }
            // The connection closed before we looked. An accepted one can
            // still be judged by its listening socket, which outlives it.
            FdKind::Unknown => match self.listener(pid, h.offset as i32, h.syscall) {
                Some(FdKind::Tcp { local, .. }) => (Some(local), peer_from_header(h)),
                Some(FdKind::NotTcp) => {
                    self.untrack(pid, fd);
                    return;
                }
                _ => (None, peer_from_header(h)),
            },
        };
        if !self.selected(role, local) {
            self.untrack(pid, fd);
            return;
        }
        let ev = OpenEvent {
            ts_ns: self.clock.to_wall_ns(h.ts_ns),
            pid,
            fd,
            role,
            local,
            peer,
        };
        self.open.insert((pid, fd), ev.clone());
        self.events += 1;
        out.push(SocketEvent::Open(ev));
    }

    fn on_exit(&mut self, h: &RecordHeader, out: &mut Vec<SocketEvent>) {
        let pid = h.tgid;
        let _ = self.targets.remove(&pid);
        self.target_pids.remove(&pid);
        self.sockfds.forget(pid);
        let mut fds: Vec<i32> = self
            .open
            .keys()
            .filter(|(p, _)| *p == pid)
            .map(|(_, fd)| *fd)
            .collect();
        fds.sort_unstable();
        let ts_ns = self.clock.to_wall_ns(h.ts_ns);
        for fd in fds {
            let _ = self.conns.remove(&conn_key(pid, fd));
            self.open.remove(&(pid, fd));
            self.events += 1;
            out.push(SocketEvent::Close(CloseEvent { ts_ns, pid, fd }));
        }
        self.ignored.retain(|(p, _)| *p != pid);
    }

    fn seed_pid(&mut self, pid: u32, out: &mut Vec<SocketEvent>) {
        let owned = procfs::socket_fds(&self.proc_root, pid);
        let table = procfs::tcp_table(&self.proc_root, pid);
        let listening = procfs::listening_ports(&table, &owned);
        let now = clock::monotonic_ns();
        for e in &table {
            if e.state == procfs::TCP_LISTEN {
                continue;
            }
            let Some(&fd) = owned.get(&e.inode) else {
                continue;
            };
            let role = if listening.contains(&e.local.port()) {
                Role::Server
            } else {
                Role::Client
            };
            if !self.selected(role, Some(e.local)) {
                continue;
            }
            let st = ConnState {
                role: if role == Role::Server {
                    ROLE_SERVER
                } else {
                    ROLE_CLIENT
                },
                _pad: [0; 7],
            };
            // NOEXIST: the kernel may have seen this connection already.
            if self
                .conns
                .insert(conn_key(pid, fd), st, BPF_NOEXIST)
                .is_err()
            {
                continue;
            }
            let ev = OpenEvent {
                ts_ns: self.clock.to_wall_ns(now),
                pid,
                fd,
                role,
                local: Some(e.local),
                peer: Some(e.peer),
            };
            self.open.insert((pid, fd), ev.clone());
            self.events += 1;
            out.push(SocketEvent::Open(ev));
        }
    }
}
