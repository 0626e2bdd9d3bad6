//! TLS plaintext: uprobes on OpenSSL's `SSL_read`/`SSL_read_ex`/
//! `SSL_write`/`SSL_write_ex` (attached per library by userspace, one
//! return program for all four). The entry saves the call's buffer; the
//! socket read or write the same thread makes inside the call (socket BIO)
//! names the connection and is not captured (it is ciphertext: `data.rs`
//! and `btf.rs` ask [`in_ssl_call`]); the return copies the plaintext
//! through the data path's `emit` as a record of syscall `SslRead` /
//! `SslWrite` on that connection's fd. A call that made no socket call
//! (OpenSSL answered from its own buffer) uses the fd its SSL object had
//! last time.

use agent_ebpf::{conn_key, Syscall};
use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, generated::bpf_probe_read_user},
    macros::{map, uprobe, uretprobe},
    maps::LruHashMap,
    programs::{ProbeContext, RetProbeContext},
};

use crate::{
    data::emit,
    maps::{Pending, CONNS, TARGETS},
};

#[repr(C)]
#[derive(Clone, Copy)]
pub struct SslCall {
    ssl: u64,
    buf: u64,
    /// `*written` / `*readbytes` of the `_ex` forms; 0 for the plain ones.
    out_len: u64,
    /// The socket the call used (−1 until a socket call inside it says).
    fd: i32,
    syscall: u8,
    _pad: [u8; 3],
}

/// SSL calls in progress, by pid_tgid. LRU: a thread that dies inside a
/// call (its return never comes) must not leave a slot taken for good.
#[map]
pub static SSL_ACTIVE: LruHashMap<u64, SslCall> = LruHashMap::with_max_entries(16384, 0);

/// The socket each SSL object used last, by (tgid, SSL pointer).
#[map]
pub static SSL_FD: LruHashMap<u128, i32> = LruHashMap::with_max_entries(65536, 0);

fn ssl_key(id: u64, ssl: u64) -> u128 {
    ((id >> 32) as u128) << 64 | ssl as u128
}

#[inline(always)]
fn enter(ctx: &ProbeContext, sc: Syscall, ex: bool) -> u32 {
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
        syscall: sc as u8,
        _pad: [0; 3],
    };
    let _ = SSL_ACTIVE.insert(&id, &call, 0);
    0
}

#[uprobe]
pub fn ssl_write(ctx: ProbeContext) -> u32 {
    enter(&ctx, Syscall::SslWrite, false)
}

#[uprobe]
pub fn ssl_write_ex(ctx: ProbeContext) -> u32 {
    enter(&ctx, Syscall::SslWrite, true)
}

#[uprobe]
pub fn ssl_read(ctx: ProbeContext) -> u32 {
    enter(&ctx, Syscall::SslRead, false)
}

#[uprobe]
pub fn ssl_read_ex(ctx: ProbeContext) -> u32 {
    enter(&ctx, Syscall::SslRead, true)
}

/// A socket call of this thread inside an SSL call: the SSL call's socket
/// is `fd`, and the call's bytes (ciphertext) are not captured.
#[inline(always)]
pub fn in_ssl_call(id: u64, fd: i32) -> bool {
    match SSL_ACTIVE.get_ptr_mut(&id) {
        Some(c) => {
            // SAFETY: this thread's own entry, written in place.
            unsafe { (*c).fd = fd };
            true
        }
        None => false,
    }
}

#[uretprobe]
pub fn ssl_ret(ctx: RetProbeContext) -> u32 {
    let id = bpf_get_current_pid_tgid();
    // SAFETY: plain-data map value read by copy.
    let call = match unsafe { SSL_ACTIVE.get(&id) } {
        Some(c) => *c,
        None => return 0,
    };
    let _ = SSL_ACTIVE.remove(&id);
    let r: i64 = ctx.ret();
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
    let key = ssl_key(id, call.ssl);
    let fd = if call.fd >= 0 {
        let _ = SSL_FD.insert(&key, &call.fd, 0);
        call.fd
    } else {
        // SAFETY: plain-data map value read by copy.
        match unsafe { SSL_FD.get(&key) } {
            Some(fd) => *fd,
            None => return 0,
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
        _pad: [0; 2],
    };
    emit(id, &p, n);
    0
}
