//! Every map the programs share with userspace. Sizes here are defaults;
//! userspace may resize before loading (`EbpfLoader::set_max_entries`).

use agent_ebpf::{stat, Config, ConnState, RecordHeader, CHUNK_BYTES};
use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, LruHashMap, PerCpuArray, RingBuf},
};

/// Thread groups whose sockets are captured (value unused).
#[map]
pub static TARGETS: HashMap<u32, u8> = HashMap::with_max_entries(4096, 0);

/// Pre-filter for `TARGETS` in the BTF data program, which runs on every
/// syscall's exit: slot `target_slot(tgid)` is 1 when a target with such
/// a tgid was ever added (an array lookup, inlined by the verifier, where a
/// hash lookup costs tens of nanoseconds). Set before the `TARGETS` entry
/// by userspace and by the fork program; never cleared (clearing would
/// race with a fork setting it), so a stale slot only costs a `TARGETS`
/// lookup.
#[map]
pub static TARGET_SLOTS: Array<u8> = Array::with_max_entries(agent_ebpf::TARGET_SLOTS, 0);

/// Tracked TCP connections, keyed by `conn_key(tgid, fd)`.
#[map]
pub static CONNS: HashMap<u64, ConnState> = HashMap::with_max_entries(65536, 0);

/// Arguments saved at syscall enter, keyed by pid_tgid, consumed at exit.
/// An entry stays with its thread and is re-armed in place, so the hot
/// path does inlined lookups instead of update/delete helper calls (each a
/// locked, indirect call); LRU eviction retires entries of dead threads.
#[map]
pub static ACTIVE: LruHashMap<u64, Pending> = LruHashMap::with_max_entries(16384, 0);

/// "This thread's fork in progress makes a process" (1) or a thread (0),
/// keyed by pid_tgid; written at clone/clone3/fork/vfork enter by targeted
/// threads only, read by `sched_process_fork` inside the same syscall. A
/// stale entry (a failed clone) is overwritten by the thread's next clone
/// enter before any fork can read it; LRU eviction retires dead threads'.
#[map]
pub static FORKING: LruHashMap<u64, u8> = LruHashMap::with_max_entries(4096, 0);

/// Local ports of the engines' listening sockets: segments received on
/// them get an arrival record (value unused). Kept by userspace.
#[map]
pub static ARRIVAL_PORTS: HashMap<u16, u8> = HashMap::with_max_entries(1024, 0);

/// Records to userspace.
#[map]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(16 * 1024 * 1024, 0);

/// Per-CPU staging area for one record (payload area is twice a chunk so
/// the verifier can prove `pos + n` stays inside it).
#[map]
pub static SCRATCH: PerCpuArray<Scratch> = PerCpuArray::with_max_entries(1, 0);

#[map]
pub static CONFIG: Array<Config> = Array::with_max_entries(1, 0);

#[map]
pub static STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(stat::COUNT, 0);

/// When each rare condition (`ctx::rare`) was last reported, in
/// `bpf_ktime_get_ns` time: one slot per statistic, shared by all CPUs.
#[map]
pub static REPORTED: Array<u64> = Array::with_max_entries(stat::COUNT, 0);

#[repr(C)]
#[derive(Clone, Copy)]
pub struct Pending {
    /// Buffer, iovec array, msghdr or sockaddr pointer (by syscall).
    pub ptr: u64,
    /// Buffer length or iovec count.
    pub len: u64,
    pub fd: i32,
    pub syscall: u8,
    /// 1 between enter and exit.
    pub armed: u8,
    /// A server connection (`ROLE_SERVER`): the exit keeps its request
    /// count (`ConnState`, data.rs `gate`).
    pub server: u8,
    pub _pad: [u8; 1],
}

/// Save `p` for this thread's syscall exit.
#[inline(always)]
pub fn arm(id: u64, ptr: u64, len: u64, fd: i32, syscall: u8, server: u8) {
    if let Some(slot) = ACTIVE.get_ptr_mut(&id) {
        // SAFETY: map value owned by this thread's key; written in place.
        let slot = unsafe { &mut *slot };
        slot.ptr = ptr;
        slot.len = len;
        slot.fd = fd;
        slot.syscall = syscall;
        slot.armed = 1;
        slot.server = server;
        return;
    }
    let p = Pending {
        ptr,
        len,
        fd,
        syscall,
        armed: 1,
        server,
        _pad: [0; 1],
    };
    let _ = ACTIVE.insert(&id, &p, 0);
}

/// What this thread's syscall enter saved, if anything (disarms it).
#[inline(always)]
pub fn disarm(id: u64) -> Option<Pending> {
    let slot = ACTIVE.get_ptr_mut(&id)?;
    // SAFETY: as above.
    let slot = unsafe { &mut *slot };
    if slot.armed == 0 {
        return None;
    }
    slot.armed = 0;
    Some(*slot)
}

#[repr(C)]
pub struct Scratch {
    pub hdr: RecordHeader,
    pub buf: [u8; 2 * CHUNK_BYTES],
    pub walk: crate::data::Walk,
}
