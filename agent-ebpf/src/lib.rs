//! Record layout shared by the kernel programs (`src/main.rs`, built for
//! `bpfel-unknown-none`) and the userspace agent.
//!
//! Owns: the byte layout of everything that crosses the ring buffer or a map.
//! Must not: depend on `std`, or change a field's offset without bumping
//! [`ABI_VERSION`] (the agent refuses an object built with another version).
//!
//! A ring-buffer record is a [`RecordHeader`] immediately followed by
//! `cap_len` payload bytes. One syscall that moved more than
//! [`CHUNK_BYTES`] bytes produces several records with the same `ts_ns`,
//! `tid` and `fd` and increasing `offset`; `total_len` is the number of
//! bytes the kernel side meant to capture for the whole call.
#![no_std]

/// Bumped whenever a layout below changes. The kernel object carries it in
/// its [`ABI_SECTION`] ELF section; the agent compares the two before
/// loading and refuses a mismatch.
pub const ABI_VERSION: u32 = 11;

/// ELF section of the kernel object holding [`ABI_VERSION`] as a
/// little-endian u32.
pub const ABI_SECTION: &str = "tokentap_abi";

/// Largest payload carried by one record. Larger calls continue in
/// follow-up records.
pub const CHUNK_BYTES: usize = 8192;

/// Hard upper bound on records emitted for one syscall (the kernel loop
/// bound). With [`CHUNK_BYTES`] this caps one call at 1 MiB.
pub const MAX_RECORDS_PER_CALL: u32 = 128;

/// Upper bound on the number of iovec entries walked for readv/writev/
/// recvmsg/sendmsg. Bytes in later entries are not captured (the record's
/// `ret` still says how many bytes the call moved).
pub const MAX_IOV: u32 = 64;

/// Default per-call capture limit: a 256 KiB request body plus headers.
pub const DEFAULT_MAX_CALL_BYTES: u32 = 256 * 1024 + 8 * 1024;

/// Size of [`RecordHeader`] in bytes.
pub const HEADER_BYTES: usize = core::mem::size_of::<RecordHeader>();

/// What a record describes.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordKind {
    /// Bytes moved (or an error returned) by a read- or write-family call.
    Data = 1,
    /// A tracked TCP connection appeared (accept/accept4/connect exit).
    Open = 2,
    /// A tracked connection's fd was closed.
    Close = 3,
    /// Some process called execve; payload is its 16-byte comm.
    Exec = 4,
    /// A targeted thread group exited (the kernel has already removed it
    /// from `TARGETS`).
    Exit = 5,
    /// A targeted thread group forked a new process (not a thread); the
    /// kernel has already added the child to `TARGETS`. `tgid`/`tid`: the
    /// parent; `ret`: the child's pid.
    Fork = 6,
    /// Some process on the host called listen(2) on `fd` (enter; whether it
    /// succeeded and on which port, userspace checks): the moment a new
    /// server becomes reachable.
    Listen = 7,
    /// A data segment reached an engine's socket in the kernel's TCP
    /// receive path (`tcp:tcp_probe`): `ret` is its length, `fd` the local
    /// port, `family`/`port`/`addr` the peer; `tgid` 0 (softirq context).
    Arrival = 8,
}

impl RecordKind {
    pub fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => Self::Data,
            2 => Self::Open,
            3 => Self::Close,
            4 => Self::Exec,
            5 => Self::Exit,
            6 => Self::Fork,
            7 => Self::Listen,
            8 => Self::Arrival,
            _ => return None,
        })
    }
}

/// Direction of a data record as seen from the traced process.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// The process read bytes from the socket.
    In = 1,
    /// The process wrote bytes to the socket.
    Out = 2,
}

/// Which syscall produced a record.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Syscall {
    Read = 1,
    Readv = 2,
    Recvfrom = 3,
    Recvmsg = 4,
    Write = 5,
    Writev = 6,
    Sendto = 7,
    Sendmsg = 8,
    Accept = 9,
    Accept4 = 10,
    Connect = 11,
    Close = 12,
    /// Seeded by userspace from /proc, not by a syscall.
    Seed = 13,
    /// TLS plaintext an OpenSSL `SSL_read[_ex]` returned (a uprobe, not a
    /// syscall: the bytes the socket read inside it were ciphertext).
    SslRead = 14,
    /// TLS plaintext given to OpenSSL's `SSL_write[_ex]`.
    SslWrite = 15,
    /// A socket read of ciphertext made inside an `SSL_read[_ex]`: the
    /// record says when and how many bytes (the arrival ledger), without
    /// them (the plaintext comes as `SslRead`).
    TlsCipher = 16,
    /// TLS plaintext given to OpenSSL's `SSL_write[_ex]`, timed at the
    /// socket write inside the call (socket BIOs: when the ciphertext
    /// left); `SslWrite` is timed at the call (memory BIOs).
    SslWriteSocket = 17,
}

impl Syscall {
    pub fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => Self::Read,
            2 => Self::Readv,
            3 => Self::Recvfrom,
            4 => Self::Recvmsg,
            5 => Self::Write,
            6 => Self::Writev,
            7 => Self::Sendto,
            8 => Self::Sendmsg,
            9 => Self::Accept,
            10 => Self::Accept4,
            11 => Self::Connect,
            12 => Self::Close,
            13 => Self::Seed,
            14 => Self::SslRead,
            15 => Self::SslWrite,
            16 => Self::TlsCipher,
            17 => Self::SslWriteSocket,
            _ => return None,
        })
    }

    /// The syscall a [`name`](Syscall::name) names.
    pub fn from_name(name: &str) -> Option<Self> {
        (1..=17u8)
            .filter_map(Self::from_u8)
            .find(|s| s.name() == name)
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Readv => "readv",
            Self::Recvfrom => "recvfrom",
            Self::Recvmsg => "recvmsg",
            Self::Write => "write",
            Self::Writev => "writev",
            Self::Sendto => "sendto",
            Self::Sendmsg => "sendmsg",
            Self::Accept => "accept",
            Self::Accept4 => "accept4",
            Self::Connect => "connect",
            Self::Close => "close",
            Self::Seed => "seed",
            Self::SslRead => "ssl_read",
            Self::SslWrite => "ssl_write",
            Self::TlsCipher => "tls_cipher",
            Self::SslWriteSocket => "ssl_write_socket",
        }
    }

    pub fn direction(self) -> Option<Direction> {
        match self {
            Self::Read
            | Self::Readv
            | Self::Recvfrom
            | Self::Recvmsg
            | Self::SslRead
            | Self::TlsCipher => Some(Direction::In),
            Self::Write
            | Self::Writev
            | Self::Sendto
            | Self::Sendmsg
            | Self::SslWrite
            | Self::SslWriteSocket => Some(Direction::Out),
            _ => None,
        }
    }
}

/// Connection role, from the traced process's point of view.
pub const ROLE_SERVER: u8 = 1;
pub const ROLE_CLIENT: u8 = 2;

/// Address families as the kernel numbers them (0: unknown, e.g. accept
/// with a NULL address).
pub const AF_UNSPEC: u16 = 0;
pub const AF_UNIX: u16 = 1;
pub const AF_INET: u16 = 2;
pub const AF_INET6: u16 = 10;

/// Header of every ring-buffer record (64 bytes, 8-byte aligned).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecordHeader {
    /// `bpf_ktime_get_ns()` (CLOCK_MONOTONIC) at syscall exit.
    pub ts_ns: u64,
    /// The syscall's return value (bytes moved or negative errno).
    pub ret: i64,
    /// Process and thread. Arrival records (softirq context, no process)
    /// carry the receiving socket's cookie here instead: see
    /// [`RecordHeader::cookie`].
    pub tgid: u32,
    pub tid: u32,
    pub fd: i32,
    /// Bytes the kernel side meant to capture for the whole call
    /// (min(ret, per-call limit)); 0 for non-data records.
    pub total_len: u32,
    /// Offset of this record's payload within the call's captured bytes.
    /// Open records from accept/accept4 carry the listening fd here
    /// (userspace resolves the local address through it), -1 otherwise.
    pub offset: u32,
    /// Payload bytes that follow this header.
    pub cap_len: u32,
    /// [`RecordKind`] as u8.
    pub kind: u8,
    /// [`Direction`] as u8 (0 when not a data record).
    pub dir: u8,
    /// [`Syscall`] as u8.
    pub syscall: u8,
    /// [`ROLE_SERVER`] / [`ROLE_CLIENT`] for open records.
    pub role: u8,
    /// Peer address family for open records ([`AF_UNSPEC`] when unknown).
    pub family: u16,
    /// Peer port in host byte order (open records).
    pub port: u16,
    /// Peer address: IPv4 in the first 4 bytes, or IPv6 (open records).
    pub addr: [u8; 16],
}

impl RecordHeader {
    /// An arrival record's socket cookie: low half in `tgid`, high half in
    /// `tid` (an arrival has no process; the header keeps its 64 bytes).
    pub fn cookie(&self) -> u64 {
        ((self.tid as u64) << 32) | self.tgid as u64
    }

    pub fn set_cookie(&mut self, cookie: u64) {
        self.tgid = cookie as u32;
        self.tid = (cookie >> 32) as u32;
    }
}

/// Offsets in the `tcp:tcp_probe` tracepoint record the arrival program
/// reads (Linux 5.x–6.x layout; the agent compares them with the format
/// file before attaching, and leaves the program off when they differ).
/// Offset of a syscall's first argument in `sys_enter_*` tracepoint
/// records (8-byte words from here) and of `ret` in `sys_exit_*` records,
/// as every kernel's tracefs `format` files give it (checked at load).
pub const SYSCALL_ARGS_OFFSET: usize = 16;

pub mod arrival_tp {
    /// `__u8 daddr[28]`: the peer, a sockaddr_in or sockaddr_in6.
    pub const DADDR: usize = 36;
    /// `__u16 sport`: the local port, host order.
    pub const SPORT: usize = 64;
    /// `__u16 dport`: the peer's port, host order.
    pub const DPORT: usize = 66;
    /// `__u16 family`.
    pub const FAMILY: usize = 68;
    /// `__u16 data_len`: payload bytes of the segment.
    pub const DATA_LEN: usize = 76;
    /// `__u64 sock_cookie`: the receiving socket's cookie (one per socket
    /// for the kernel's uptime; Linux 5.6 and later).
    pub const SOCK_COOKIE: usize = 112;
    /// (field name, offset, size) as the format file must say.
    pub const FIELDS: [(&str, usize, usize); 6] = [
        ("daddr", DADDR, 28),
        ("sport", SPORT, 2),
        ("dport", DPORT, 2),
        ("family", FAMILY, 2),
        ("data_len", DATA_LEN, 2),
        ("sock_cookie", SOCK_COOKIE, 8),
    ];
}

/// Per-call capture limit and switches, written by userspace into the
/// single-entry `CONFIG` array before attaching.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// Bytes captured at most per syscall (the rest is counted in `ret`).
    pub max_call_bytes: u32,
    pub abi_version: u32,
    /// Wake the reader on every Nth record of a CPU (a power of two); it
    /// also polls on a short timer. Waking per record, or asking the ring
    /// how full it is (a read of the reader's cache line), costs the traced
    /// process about a microsecond per call on the machines we measured.
    pub wakeup_every: u32,
    /// Pressure from userspace (the agent's decoder over its memory
    /// budget, or the ring buffer found filling): 0 when there is none,
    /// else the episode's number. See [`Config::head_bytes`].
    pub shed_epoch: u32,
    /// Request bytes of a server connection always captured since its
    /// last write (a request's line, headers and the start of its body,
    /// where model and stream flag are). Beyond them, a read's bytes stay
    /// in the kernel while there is pressure — `shed_epoch` ≠ 0, or more
    /// than [`Config::ring_high`] bytes unread in the ring buffer, which
    /// the kernel checks itself on those reads only — and its length is
    /// reported instead (`ConnState::held`).
    pub head_bytes: u32,
    /// Unread ring-buffer bytes above which a large request body's bytes
    /// stay in the kernel (a quarter of the ring by default).
    pub ring_high: u32,
}
/// [`Config::head_bytes`] by default: 16 KiB.
pub const DEFAULT_HEAD_BYTES: u32 = 16 * 1024;

impl Default for Config {
    fn default() -> Self {
        Self {
            max_call_bytes: DEFAULT_MAX_CALL_BYTES,
            abi_version: ABI_VERSION,
            wakeup_every: 64,
            shed_epoch: 0,
            head_bytes: DEFAULT_HEAD_BYTES,
            ring_high: 4 << 20,
        }
    }
}

/// Value of the `CONNS` map: one entry per tracked (tgid, fd).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnState {
    pub role: u8,
    pub _pad: [u8; 3],
    /// Bytes read on this connection since its last write (the request
    /// being read), counted on server connections.
    pub in_run: u32,
    /// Request bytes read under pressure beyond the head and not reported
    /// yet: no record was sent for those reads. The connection's next
    /// recorded call (its response's first write, or a read once pressure
    /// is over) is preceded by one bytes-less read record of this length,
    /// so userspace keeps the request's framing.
    pub held: u64,
}

impl ConnState {
    /// A connection's state before any call on it.
    pub const fn new(role: u8) -> Self {
        Self {
            role,
            _pad: [0; 3],
            in_run: 0,
            held: 0,
        }
    }
}

/// `CLONE_THREAD`: the new task shares its parent's thread group.
pub const CLONE_THREAD: u64 = 0x10000;

/// Entries of the `TARGET_SLOTS` pre-filter (a power of two).
pub const TARGET_SLOTS: u32 = 65536;

/// Index of `tgid` in the `TARGET_SLOTS` pre-filter.
#[inline(always)]
pub const fn target_slot(tgid: u32) -> u32 {
    tgid & (TARGET_SLOTS - 1)
}

/// Key of the `CONNS` map.
#[inline(always)]
pub const fn conn_key(tgid: u32, fd: i32) -> u64 {
    ((tgid as u64) << 32) | (fd as u32 as u64)
}

/// Indexes of the per-CPU `STATS` array.
pub mod stat {
    /// Records that did not fit in the ring buffer.
    pub const RECORDS_DROPPED: u32 = 0;
    /// Calls whose bytes exceeded the per-call limit (tail not captured).
    pub const CALLS_TRUNCATED: u32 = 1;
    /// Calls whose user memory could not be read.
    pub const READ_FAULTS: u32 = 2;
    /// Records written to the ring buffer.
    pub const RECORDS_SENT: u32 = 3;
    /// Connections not tracked because the `CONNS` map was full.
    pub const CONNS_FULL: u32 = 4;
    /// Child processes of targets added to `TARGETS` by the kernel.
    pub const FORKS_FOLLOWED: u32 = 5;
    /// Child processes of targets not followed because `TARGETS` was full.
    pub const TARGETS_FULL: u32 = 6;
    /// Exited thread groups the kernel removed from `TARGETS`.
    pub const TARGETS_EXITED: u32 = 7;
    /// TLS calls (`SSL_read`/`SSL_write`) whose plaintext was captured.
    pub const TLS_CALLS: u32 = 8;
    /// TLS calls that returned plaintext on a socket not known (no socket
    /// call inside, no earlier one for the SSL object, no memory BIO tied
    /// to one): not captured.
    pub const TLS_UNATTRIBUTED: u32 = 9;
    /// Memory BIOs tied to their socket by content (`BIO_write` of bytes a
    /// socket read returned).
    pub const TLS_BIOS_LINKED: u32 = 10;
    /// Reads of a request beyond its head left in the kernel under
    /// pressure, in whole or in part (their length reported, their bytes
    /// not copied).
    pub const BODIES_LEFT: u32 = 11;
    pub const COUNT: u32 = 12;
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: plain #[repr(C)] data with no padding holes read as garbage:
    // every bit pattern is a valid value.
    unsafe impl aya::Pod for super::Config {}
    unsafe impl aya::Pod for super::ConnState {}
    unsafe impl aya::Pod for super::RecordHeader {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_is_64_bytes_and_8_aligned() {
        assert_eq!(HEADER_BYTES, 64);
        assert_eq!(core::mem::align_of::<RecordHeader>(), 8);
    }

    #[test]
    fn conn_key_keeps_tgid_and_fd_apart() {
        assert_eq!(conn_key(1, 2), (1u64 << 32) | 2);
        assert_ne!(conn_key(1, 2), conn_key(2, 1));
    }
}
