//! Every map the programs share with userspace. Sizes here are defaults;
//! userspace may resize before loading (`EbpfLoader::set_max_entries`).

use agent_ebpf::{stat, Config, ConnState, RecordHeader, CHUNK_BYTES};
use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, PerCpuArray, RingBuf},
};

/// Thread groups whose sockets are captured (value unused).
#[map]
pub static TARGETS: HashMap<u32, u8> = HashMap::with_max_entries(4096, 0);

/// Tracked TCP connections, keyed by `conn_key(tgid, fd)`.
#[map]
pub static CONNS: HashMap<u64, ConnState> = HashMap::with_max_entries(65536, 0);

/// Arguments saved at syscall enter, keyed by pid_tgid, consumed at exit.
#[map]
pub static ACTIVE: HashMap<u64, Pending> = HashMap::with_max_entries(16384, 0);

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

#[repr(C)]
#[derive(Clone, Copy)]
pub struct Pending {
    /// Buffer, iovec array, msghdr or sockaddr pointer (by syscall).
    pub ptr: u64,
    /// Buffer length or iovec count.
    pub len: u64,
    pub fd: i32,
    pub syscall: u8,
    pub _pad: [u8; 3],
}

#[repr(C)]
pub struct Scratch {
    pub hdr: RecordHeader,
    pub buf: [u8; 2 * CHUNK_BYTES],
    pub walk: crate::data::Walk,
}
