//! TLS plaintext: uprobes on OpenSSL's `SSL_read`/`SSL_read_ex`/
//! `SSL_write`/`SSL_write_ex` (attached per target process by userspace).
//! Every probe hit is a trap, so a write costs one (its entry) and a read
//! two (entry and return).
//!
//! Reads: the entry saves the call's buffer; the socket read the same
//! thread makes inside the call (socket BIO) names the connection and is
//! reported by size only (it is ciphertext: `data.rs` and `btf.rs` ask
//! [`in_ssl_call`]); the return copies the plaintext through the data
//! path's `emit` as a record of syscall `SslRead` on that connection's fd.
//! A call that made no socket call (OpenSSL answered from its own buffer)
//! uses the socket its SSL object used last (`SSL_FD`).
//!
//! Writes: the plaintext is whole at the entry. An SSL object known to
//! use a memory BIO is emitted there (`SslWrite`, timed at the call); any
//! other is armed, and the first socket write the thread makes inside the
//! call emits it (`SslWriteSocket`, timed when the ciphertext left) and
//! disarms it. A socket call on another socket than the SSL object's is
//! not inside it (an armed write whose call made no socket write — an
//! error, a zero-length write — must not claim the thread's next call).
//!
//! Memory BIOs (Python's asyncio `SSLProtocol`, as under uvicorn): OpenSSL
//! makes no socket call; the event loop moves ciphertext between the
//! socket and the BIOs itself. The incoming BIO is tied to its socket by
//! content: a socket read (outside SSL calls) whose bytes start like a TLS
//! record leaves its first 16 bytes in `CIPHER_IN`; the `BIO_write` that
//! hands the same bytes to a BIO names that BIO's socket (`BIO_FD`); the
//! `BIO_read` an `SSL_read` makes from it names the SSL object's socket,
//! and writes use the socket the same SSL object last read from.

use agent_ebpf::{conn_key, stat, Syscall};
use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, generated::bpf_probe_read_user},
    macros::{map, uprobe, uretprobe},
    maps::{Array, LruHashMap},
    programs::{ProbeContext, RetProbeContext},
};

use crate::{
    ctx::bump,
    data::{emit, emit_header_only},
    maps::{Pending, CONNS, TARGETS},
};

#[repr(C)]
#[derive(Clone, Copy)]
pub struct SslCall {
    ssl: u64,
    buf: u64,
    /// Reads: `*readbytes` of `SSL_read_ex`; 0 for `SSL_read`. Writes: the
    /// byte count asked for.
    out_len: u64,
    /// The socket the call used (−1 until a socket call inside it says).
    fd: i32,
    syscall: u8,
    /// The socket came from a memory BIO (`nested_bio`).
    via_bio: u8,
    _pad: [u8; 2],
}

/// An SSL object's socket and how OpenSSL reaches it.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct SslSock {
    fd: i32,
    /// [`SOCKET_BIO`] or [`MEMORY_BIO`].
    kind: u8,
    _pad: [u8; 3],
}

const SOCKET_BIO: u8 = 1;
const MEMORY_BIO: u8 = 2;

/// SSL calls in progress, by pid_tgid. LRU: a thread that dies inside a
/// call (its return never comes) must not leave a slot taken for good.
#[map]
pub static SSL_ACTIVE: LruHashMap<u64, SslCall> = LruHashMap::with_max_entries(16384, 0);

/// The socket each SSL object used last, by (tgid, SSL pointer).
#[map]
pub static SSL_FD: LruHashMap<u128, SslSock> = LruHashMap::with_max_entries(65536, 0);

/// 1 once userspace attached the TLS programs to a library: until then
/// the data path skips every TLS lookup.
#[map]
pub static TLS_ON: Array<u32> = Array::with_max_entries(1, 0);

/// The socket each BIO carries, by (tgid, BIO pointer): memory BIOs,
/// learnt by content (`CIPHER_IN`).
#[map]
pub static BIO_FD: LruHashMap<u128, i32> = LruHashMap::with_max_entries(65536, 0);

/// Processes (tgid) with an SSL call whose socket was not known: they may
/// drive OpenSSL through memory BIOs, so userspace attaches the BIO probes
/// to them (value unused).
#[map]
pub static TLS_WANT_BIO: LruHashMap<u32, u8> = LruHashMap::with_max_entries(1024, 0);

/// The first 16 bytes of recent ciphertext socket reads (outside SSL
/// calls), with their socket: a `BIO_write` of the same bytes ties its BIO
/// to that socket.
#[map]
pub static CIPHER_IN: LruHashMap<CipherKey, i32> = LruHashMap::with_max_entries(8192, 0);

#[repr(C)]
#[derive(Clone, Copy)]
pub struct CipherKey {
    tgid: u64,
    head: [u64; 2],
}

fn ssl_key(id: u64, ssl: u64) -> u128 {
    ((id >> 32) as u128) << 64 | ssl as u128
}

#[inline(always)]
fn tls_on() -> bool {
    TLS_ON.get(0).copied() == Some(1)
}

/// The first 16 bytes at `ptr` in the traced process, when they start
/// like a TLS record (content type 20–23, major version 3).
#[inline(always)]
fn record_head(ptr: u64) -> Option<[u64; 2]> {
    let mut head = [0u64; 2];
    // SAFETY: writes exactly `head`'s 16 bytes; the source is the traced
    // process's memory, read by the helper (a bad pointer is an error).
    let rc = unsafe { bpf_probe_read_user(head.as_mut_ptr().cast(), 16, ptr as *const _) };
    let (t, v) = (head[0] as u8, (head[0] >> 8) as u8);
    (rc == 0 && (20..=23).contains(&t) && v == 3).then_some(head)
}

/// A socket read outside SSL calls (`data.rs`, `btf.rs`, after its record):
/// if it read the start of a TLS record, remember its first bytes for the
/// `BIO_write` that will hand them to OpenSSL.
#[inline(always)]
pub fn learn_cipher_in(id: u64, p: &Pending, r: i64) {
    if r < 16 || !tls_on() {
        return;
    }
    if p.syscall != Syscall::Read as u8 && p.syscall != Syscall::Recvfrom as u8 {
        return;
    }
    if let Some(head) = record_head(p.ptr) {
        let key = CipherKey {
            tgid: id >> 32,
            head,
        };
        let _ = CIPHER_IN.insert(&key, &p.fd, 0);
    }
}

/// A socket read inside an SSL call: its record without the ciphertext
/// (when and how much, for the arrival ledger).
#[inline(always)]
pub fn cipher_read(id: u64, p: &Pending, r: i64) {
    if Syscall::from_u8(p.syscall).and_then(Syscall::direction) != Some(agent_ebpf::Direction::In) {
        return;
    }
    let q = Pending {
        syscall: Syscall::TlsCipher as u8,
        ..*p
    };
    emit_header_only(id, &q, r);
}

#[inline(always)]
fn enter_read(ctx: &ProbeContext, ex: bool) -> u32 {
    let id = bpf_get_current_pid_tgid();
    // SAFETY: plain-data map value read by copy.
    if unsafe { TARGETS.get(&((id >> 32) as u32)) }.is_none() {
        return 0;
    }
    let (Some(ssl), Some(buf)) = (ctx.arg::<u64>(0), ctx.arg::<u64>(1)) else {
        return 0;
    };
    let out_len = if ex {
        ctx.arg::<u64>(3).unwrap_or(0)
    } else {
        0
    };
    let call = SslCall {
        ssl,
        buf,
        out_len,
        fd: -1,
        syscall: Syscall::SslRead as u8,
        via_bio: 0,
        _pad: [0; 2],
    };
    let _ = SSL_ACTIVE.insert(&id, &call, 0);
    0
}

#[inline(always)]
fn enter_write(ctx: &ProbeContext, ex: bool) -> u32 {
    let id = bpf_get_current_pid_tgid();
    // SAFETY: plain-data map value read by copy.
    if unsafe { TARGETS.get(&((id >> 32) as u32)) }.is_none() {
        return 0;
    }
    let (Some(ssl), Some(buf)) = (ctx.arg::<u64>(0), ctx.arg::<u64>(1)) else {
        return 0;
    };
    // `int num` / `size_t num`.
    let num = if ex {
        ctx.arg::<u64>(2).unwrap_or(0)
    } else {
        ctx.arg::<i32>(2).unwrap_or(0).max(0) as u64
    };
    if num == 0 {
        return 0;
    }
    // SAFETY: plain-data map value read by copy.
    let known = unsafe { SSL_FD.get(&ssl_key(id, ssl)) }.copied();
    if let Some(k) = known {
        if k.kind == MEMORY_BIO {
            // No socket call will follow inside: the plaintext now.
            emit_write(id, buf, num, k.fd, Syscall::SslWrite);
            return 0;
        }
    }
    let call = SslCall {
        ssl,
        buf,
        out_len: num,
        fd: -1,
        syscall: Syscall::SslWrite as u8,
        via_bio: 0,
        _pad: [0; 2],
    };
    let _ = SSL_ACTIVE.insert(&id, &call, 0);
    0
}

/// A write's plaintext on a tracked connection.
#[inline(always)]
fn emit_write(id: u64, buf: u64, num: u64, fd: i32, sc: Syscall) {
    // SAFETY: plain-data map value read by copy.
    if unsafe { CONNS.get(&conn_key((id >> 32) as u32, fd)) }.is_none() {
        return;
    }
    let p = Pending {
        ptr: buf,
        len: num,
        fd,
        syscall: sc as u8,
        armed: 0,
        server: 0,
        _pad: [0; 1],
    };
    bump(stat::TLS_CALLS);
    emit(id, &p, num as i64, core::ptr::null_mut());
}

#[uprobe]
pub fn ssl_write(ctx: ProbeContext) -> u32 {
    enter_write(&ctx, false)
}

#[uprobe]
pub fn ssl_write_ex(ctx: ProbeContext) -> u32 {
    enter_write(&ctx, true)
}

#[uprobe]
pub fn ssl_read(ctx: ProbeContext) -> u32 {
    enter_read(&ctx, false)
}

#[uprobe]
pub fn ssl_read_ex(ctx: ProbeContext) -> u32 {
    enter_read(&ctx, true)
}

/// A socket call of this thread (`fd`, its Pending `p`, its result `r`)
/// on a tracked connection: true when it is inside an SSL call, whose
/// socket it then names; its bytes are ciphertext and not captured. The
/// first socket write inside an `SSL_write` emits the call's plaintext.
#[inline(always)]
pub fn in_ssl_call(id: u64, fd: i32, p: &Pending, r: i64) -> bool {
    if !tls_on() {
        return false;
    }
    let Some(c) = SSL_ACTIVE.get_ptr_mut(&id) else {
        return false;
    };
    // SAFETY: this thread's own entry, read and written in place.
    let c = unsafe { &mut *c };
    let key = ssl_key(id, c.ssl);
    // SAFETY: plain-data map value read by copy.
    if let Some(s) = unsafe { SSL_FD.get(&key) } {
        if s.fd != fd {
            // Not this SSL object's socket: the armed call is over.
            let _ = SSL_ACTIVE.remove(&id);
            return false;
        }
    }
    c.fd = fd;
    if c.syscall == Syscall::SslWrite as u8 {
        let out = Syscall::from_u8(p.syscall).and_then(Syscall::direction)
            == Some(agent_ebpf::Direction::Out);
        if out && r > 0 {
            let sock = SslSock {
                fd,
                kind: SOCKET_BIO,
                _pad: [0; 3],
            };
            let _ = SSL_FD.insert(&key, &sock, 0);
            let (buf, num) = (c.buf, c.out_len);
            let _ = SSL_ACTIVE.remove(&id);
            emit_write(id, buf, num, fd, Syscall::SslWriteSocket);
        }
    }
    true
}

/// The return of `SSL_read`/`SSL_read_ex`.
#[uretprobe]
pub fn ssl_ret(ctx: RetProbeContext) -> u32 {
    let id = bpf_get_current_pid_tgid();
    // SAFETY: plain-data map value read by copy.
    let call = match unsafe { SSL_ACTIVE.get(&id) } {
        Some(c) => *c,
        None => return 0,
    };
    let _ = SSL_ACTIVE.remove(&id);
    if call.syscall != Syscall::SslRead as u8 {
        return 0;
    }
    let key = ssl_key(id, call.ssl);
    if call.fd >= 0 {
        let sock = SslSock {
            fd: call.fd,
            kind: if call.via_bio != 0 {
                MEMORY_BIO
            } else {
                SOCKET_BIO
            },
            _pad: [0; 3],
        };
        let _ = SSL_FD.insert(&key, &sock, 0);
    }
    // Both return a C `int`: the register's upper half is not its sign.
    let r = ctx.ret::<i64>() as i32 as i64;
    let n: i64 = if call.out_len != 0 {
        if r != 1 {
            return 0;
        }
        let mut v = 0u64;
        // SAFETY: writes `v`'s 8 bytes; the source is the traced process's
        // `size_t`, read by the helper (a bad pointer is an error).
        let rc = unsafe {
            bpf_probe_read_user((&mut v as *mut u64).cast(), 8, call.out_len as *const _)
        };
        if rc != 0 {
            return 0;
        }
        v as i64
    } else {
        r
    };
    if n <= 0 {
        return 0;
    }
    let fd = if call.fd >= 0 {
        call.fd
    } else {
        // SAFETY: plain-data map value read by copy.
        match unsafe { SSL_FD.get(&key) } {
            Some(s) => s.fd,
            None => {
                bump(stat::TLS_UNATTRIBUTED);
                let _ = TLS_WANT_BIO.insert(&((id >> 32) as u32), &1, 0);
                return 0;
            }
        }
    };
    // Only connections the capture tracks (a selected port, a target's).
    // SAFETY: as above.
    if unsafe { CONNS.get(&conn_key((id >> 32) as u32, fd)) }.is_none() {
        return 0;
    }
    let p = Pending {
        ptr: call.buf,
        len: n as u64,
        fd,
        syscall: call.syscall,
        armed: 0,
        server: 0,
        _pad: [0; 1],
    };
    bump(stat::TLS_CALLS);
    emit(id, &p, n, core::ptr::null_mut());
    0
}

/// A BIO call inside this thread's SSL call (the SSL object reading its
/// incoming BIO, writing its outgoing one): the BIO's socket, if known, is
/// the call's. True when there was an SSL call.
#[inline(always)]
fn nested_bio(id: u64, bio: u64) -> bool {
    let Some(c) = SSL_ACTIVE.get_ptr_mut(&id) else {
        return false;
    };
    // SAFETY: plain-data map value read by copy.
    if let Some(fd) = unsafe { BIO_FD.get(&ssl_key(id, bio)) } {
        // SAFETY: this thread's own entry, written in place.
        unsafe {
            if (*c).fd < 0 {
                (*c).fd = *fd;
                (*c).via_bio = 1;
            }
        }
    }
    true
}

/// `BIO_write(bio, data, len)` (libcrypto): inside an SSL call, see
/// [`nested_bio`]; outside, the event loop handing received ciphertext to
/// a memory BIO: the socket read that returned the same bytes names it.
#[uprobe]
pub fn bio_write(ctx: ProbeContext) -> u32 {
    let id = bpf_get_current_pid_tgid();
    // SAFETY: plain-data map value read by copy.
    if unsafe { TARGETS.get(&((id >> 32) as u32)) }.is_none() {
        return 0;
    }
    let (Some(bio), Some(data), Some(len)) =
        (ctx.arg::<u64>(0), ctx.arg::<u64>(1), ctx.arg::<i32>(2))
    else {
        return 0;
    };
    if nested_bio(id, bio) || len < 16 {
        return 0;
    }
    let Some(head) = record_head(data) else {
        return 0;
    };
    let key = CipherKey {
        tgid: id >> 32,
        head,
    };
    // SAFETY: plain-data map value read by copy.
    let fd = match unsafe { CIPHER_IN.get(&key) } {
        Some(fd) => *fd,
        None => return 0,
    };
    let _ = CIPHER_IN.remove(&key);
    let _ = BIO_FD.insert(&ssl_key(id, bio), &fd, 0);
    bump(stat::TLS_BIOS_LINKED);
    0
}

/// `BIO_read(bio, data, len)` (libcrypto): inside an SSL call, see
/// [`nested_bio`].
#[uprobe]
pub fn bio_read(ctx: ProbeContext) -> u32 {
    let id = bpf_get_current_pid_tgid();
    if let Some(bio) = ctx.arg::<u64>(0) {
        nested_bio(id, bio);
    }
    0
}

/// `SSL_free(ssl)`: its socket is forgotten (the pointer will be reused).
#[uprobe]
pub fn ssl_free(ctx: ProbeContext) -> u32 {
    let id = bpf_get_current_pid_tgid();
    if let Some(ssl) = ctx.arg::<u64>(0) {
        let _ = SSL_FD.remove(&ssl_key(id, ssl));
    }
    0
}
