//! Read- and write-family syscalls: read, readv, recvfrom, recvmsg, write,
//! writev, sendto, sendmsg.
//!
//! Enter: if the thread group is targeted and (tgid, fd) is a tracked
//! connection, save the buffer/iovec/msghdr pointer keyed by pid_tgid.
//! Exit: the buffer is filled (reads) and the return value is known, so the
//! payload is copied from user memory into one or more records of at most
//! `CHUNK_BYTES`, walking iovecs with a bounded loop.

use agent_ebpf::{
    conn_key, stat, ConnState, Direction, RecordKind, Syscall, CHUNK_BYTES, DEFAULT_MAX_CALL_BYTES,
    HEADER_BYTES, MAX_IOV, MAX_RECORDS_PER_CALL, ROLE_SERVER,
};
use aya_ebpf::{
    bindings::BPF_RB_AVAIL_DATA,
    helpers::{
        bpf_get_current_pid_tgid, bpf_ktime_get_ns,
        generated::{bpf_loop, bpf_probe_read_user},
    },
    macros::tracepoint,
    programs::TracePointContext,
};

use crate::{
    ctx::{arg, bump, rare, ret, send},
    maps::{arm, disarm, Pending, CONFIG, CONNS, EVENTS, SCRATCH, TARGETS},
};

pub(crate) const EAGAIN: i64 = 11;
/// `MSG_PEEK`: a receive that leaves the bytes for the next read.
pub(crate) const MSG_PEEK: u64 = 2;

/// How the saved pointer is to be read at exit.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// `ptr` is the buffer.
    Flat,
    /// `ptr` is an iovec array of `len` entries.
    Vector,
    /// `ptr` is a `struct msghdr`.
    Msg,
}

fn shape(sc: u8) -> Shape {
    if sc == Syscall::Readv as u8 || sc == Syscall::Writev as u8 {
        Shape::Vector
    } else if sc == Syscall::Recvmsg as u8 || sc == Syscall::Sendmsg as u8 {
        Shape::Msg
    } else {
        Shape::Flat
    }
}

#[inline(always)]
fn enter(fd: u64, ptr: u64, len: u64, sc: Syscall) -> u32 {
    let id = bpf_get_current_pid_tgid();
    let tgid = (id >> 32) as u32;
    // SAFETY: plain-data map values read by copy.
    if unsafe { TARGETS.get(&tgid) }.is_none() {
        return 0;
    }
    let fd = fd as i32;
    // SAFETY: as above.
    let server = match unsafe { CONNS.get(&conn_key(tgid, fd)) } {
        Some(c) => (c.role == ROLE_SERVER) as u8,
        None => return 0,
    };
    arm(id, ptr, len, fd, sc as u8, server);
    0
}

#[inline(always)]
fn exit(ctx: &TracePointContext) -> u32 {
    let id = bpf_get_current_pid_tgid();
    let p = match disarm(id) {
        Some(p) => p,
        None => return 0,
    };
    let r = ret(ctx);
    if r == -EAGAIN {
        return 0;
    }
    // Inside an SSL call: ciphertext, whose plaintext the call's return
    // reports (and this names its socket).
    if crate::tls::in_ssl_call(id, p.fd, &p, r) {
        crate::tls::cipher_read(id, &p, r);
        return 0;
    }
    // A server connection's request count (`gate`): its state, looked up
    // again here (the enter's lookup cannot be kept across the syscall).
    let conn = if p.server != 0 {
        match CONNS.get_ptr_mut(&conn_key((id >> 32) as u32, p.fd)) {
            Some(c) => c,
            None => core::ptr::null_mut(),
        }
    } else {
        core::ptr::null_mut()
    };
    emit(id, &p, r, conn);
    crate::tls::learn_cipher_in(id, &p, r);
    0
}

/// Sends the records of one call (both data paths): staged in the
/// per-CPU scratch area, copied to the ring with its exact size.
///
/// Reserving the record in the ring and copying user memory straight into
/// it was measured slower (the verifier needs a constant reserve size, so
/// records are rounded up to a size class, and the larger ring footprint
/// cost more than the saved copy: writer CPU +370 vs +200 ns per traced
/// call, medians of 8 alternating runs).
#[inline(always)]
///
/// `conn` is the call's connection state when the caller has it (null:
/// no request count is kept, nothing is held back — TLS plaintext).
pub(crate) fn emit(id: u64, p: &Pending, r: i64, conn: *mut ConnState) {
    let s = match SCRATCH.get_ptr_mut(0) {
        // SAFETY: per-CPU scratch, this program is its only user on this CPU.
        Some(s) => unsafe { &mut *s },
        None => return,
    };
    let (limit, epoch, head, ring_high) = match CONFIG.get(0) {
        Some(c) => (
            c.max_call_bytes as u64,
            c.shed_epoch,
            c.head_bytes,
            c.ring_high,
        ),
        None => (DEFAULT_MAX_CALL_BYTES as u64, 0, u32::MAX, u32::MAX),
    };
    header(s, id, p, r);
    if r <= 0 {
        s.hdr.total_len = 0;
        output(s, 0);
        return;
    }
    let mut remaining = r as u64;
    if remaining > limit {
        remaining = limit;
        bump(stat::CALLS_TRUNCATED);
    }
    if !conn.is_null() {
        // SAFETY: the connection's map value (CONNS), written in place;
        // two threads of one process on one fd may race on its counts,
        // which only moves where a request's head ends.
        let c = unsafe { &mut *conn };
        let room = gate(s, c, r, epoch, head, ring_high);
        if room < remaining {
            bump(stat::BODIES_LEFT);
            remaining = room;
        }
        if remaining == 0 {
            // Held back whole: no record now (counted in `held`).
            return;
        }
    }
    s.hdr.total_len = remaining as u32;
    emit_payload(s, p, remaining);
}

/// A server connection's request count, and how many of this call's
/// bytes to copy. Reads add to the count, writes end it (the response
/// began). The first `head` bytes of a request are always copied (its
/// line, headers and the start of its body). A read beyond them, while
/// there is pressure — userspace says so (`epoch` ≠ 0: its decoder is
/// over budget), or the ring buffer holds more than `ring_high` unread
/// bytes (asked only here, on such reads: the query reads the reader's
/// cache line) — sends no record: its length goes to `held`, reported as
/// one bytes-less read just before the connection's next recorded call
/// (its response, or a read once the pressure is over). So one client's
/// upload neither fills the ring buffer for everyone nor costs a record
/// per read, and userspace still knows the body's length.
#[inline(always)]
fn gate(
    s: &mut crate::maps::Scratch,
    c: &mut ConnState,
    r: i64,
    epoch: u32,
    head: u32,
    ring_high: u32,
) -> u64 {
    let all = r as u64;
    if c.role != ROLE_SERVER {
        return all;
    }
    let mut room = all;
    if s.hdr.dir == Direction::In as u8 {
        let before = c.in_run;
        let n = if r > u32::MAX as i64 {
            u32::MAX
        } else {
            r as u32
        };
        c.in_run = before.saturating_add(n);
        let left = head.saturating_sub(before) as u64;
        if left < all && (epoch != 0 || EVENTS.query(BPF_RB_AVAIL_DATA as u64) > ring_high as u64) {
            room = left;
        }
    } else {
        c.in_run = 0;
    }
    if room == 0 {
        c.held = c.held.saturating_add(all);
        return 0;
    }
    if c.held != 0 {
        // What was held back, as one read of that many bytes, first.
        let (ret, dir, sc) = (s.hdr.ret, s.hdr.dir, s.hdr.syscall);
        s.hdr.ret = c.held as i64;
        s.hdr.dir = Direction::In as u8;
        s.hdr.syscall = Syscall::Read as u8;
        s.hdr.total_len = 0;
        output(s, 0);
        c.held = 0;
        s.hdr.ret = ret;
        s.hdr.dir = dir;
        s.hdr.syscall = sc;
    }
    room
}

/// A record of one call without its bytes (`total_len` 0): when and how
/// many (a ciphertext read inside an SSL call).
#[inline(always)]
pub(crate) fn emit_header_only(id: u64, p: &Pending, r: i64) {
    let s = match SCRATCH.get_ptr_mut(0) {
        // SAFETY: per-CPU scratch, this program is its only user on this CPU.
        Some(s) => unsafe { &mut *s },
        None => return,
    };
    header(s, id, p, r);
    s.hdr.total_len = 0;
    output(s, 0);
}

#[inline(always)]
fn header(s: &mut crate::maps::Scratch, id: u64, p: &Pending, r: i64) {
    let dir = match Syscall::from_u8(p.syscall).and_then(Syscall::direction) {
        Some(d) => d,
        None => Direction::In,
    };
    // SAFETY: reads the monotonic clock; no arguments, no preconditions.
    s.hdr.ts_ns = unsafe { bpf_ktime_get_ns() };
    s.hdr.ret = r;
    s.hdr.tgid = (id >> 32) as u32;
    s.hdr.tid = id as u32;
    s.hdr.fd = p.fd;
    s.hdr.offset = 0;
    s.hdr.cap_len = 0;
    s.hdr.kind = RecordKind::Data as u8;
    s.hdr.dir = dir as u8;
    s.hdr.syscall = p.syscall;
    s.hdr.role = 0;
    s.hdr.family = 0;
    s.hdr.port = 0;
    s.hdr.addr = [0; 16];
}

#[inline(always)]
fn emit_payload(s: &mut crate::maps::Scratch, p: &Pending, remaining: u64) {
    // Fast path, the common case (an SSE chunk, a small request): one
    // contiguous buffer that fits one record. No loop, one copy.
    let sh = shape(p.syscall);
    if sh == Shape::Flat && remaining <= CHUNK_BYTES as u64 {
        // The mask gives the verifier a bound it can see (< 2 * CHUNK_BYTES,
        // the scratch buffer's length); the clamp makes it one record's
        // payload.
        let mut n = remaining & (2 * CHUNK_BYTES as u64 - 1);
        if n > CHUNK_BYTES as u64 {
            n = CHUNK_BYTES as u64;
        }
        // SAFETY: `n` ≤ CHUNK_BYTES < `s.buf.len()` (2 * CHUNK_BYTES), so
        // the write stays in the per-CPU scratch record; the source is the traced
        // process's memory, read by the helper (a bad pointer returns an
        // error, counted as a read fault, never a kernel fault).
        let rc = unsafe {
            bpf_probe_read_user(
                s.buf.as_mut_ptr().cast(),
                n as u32,
                p.ptr as *const core::ffi::c_void,
            )
        };
        if rc != 0 {
            rare(stat::READ_FAULTS);
            n = 0;
        }
        output(s, n);
        return;
    }

    // Current contiguous user range and the iovec array still to walk.
    let (cur_ptr, cur_left, iov_base, iov_cnt) = match sh {
        Shape::Flat => (p.ptr, remaining, 0u64, 0u64),
        Shape::Vector => (0, 0, p.ptr, p.len),
        Shape::Msg => {
            // struct msghdr: msg_iov at 16, msg_iovlen at 24.
            let mut hdr = [0u64; 4];
            // SAFETY: writes exactly `hdr`'s 32 bytes; the source is user
            // memory, read by the helper (a bad pointer is an error).
            let rc = unsafe {
                bpf_probe_read_user(
                    hdr.as_mut_ptr().cast(),
                    32,
                    p.ptr as *const core::ffi::c_void,
                )
            };
            if rc != 0 {
                rare(stat::READ_FAULTS);
                s.hdr.total_len = 0;
                output(s, 0);
                return;
            }
            (0, 0, hdr[2], hdr[3])
        }
    };

    // The walk state lives in the per-CPU scratch map, not on the stack:
    // values loaded from a map are opaque to the verifier, so the loop
    // step below is verified once instead of once per iteration.
    s.walk = Walk {
        cur_ptr,
        cur_left,
        iov_base,
        iov_cnt,
        idx: 0,
        pos: 0,
        offset: 0,
        remaining,
        emitted: 0,
    };
    // SAFETY: `step` is a static function taking no context pointer.
    unsafe {
        bpf_loop(
            MAX_RECORDS_PER_CALL + MAX_IOV,
            step as *mut core::ffi::c_void,
            core::ptr::null_mut(),
            0,
        )
    };
    let s = match SCRATCH.get_ptr_mut(0) {
        // SAFETY: as above.
        Some(s) => unsafe { &mut *s },
        None => return,
    };
    let w = s.walk;
    if w.pos > 0 {
        s.hdr.offset = w.offset as u32;
        output(s, w.pos);
    } else if w.emitted == 0 {
        // Nothing readable (fault or empty iovecs): still report the call.
        output(s, 0);
    }
}

/// State of one payload walk.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Walk {
    /// Current contiguous user range.
    pub cur_ptr: u64,
    pub cur_left: u64,
    /// iovec array still to walk (Vector/Msg shapes).
    pub iov_base: u64,
    pub iov_cnt: u64,
    pub idx: u64,
    /// Bytes staged in the scratch payload area.
    pub pos: u64,
    /// Offset of the staged bytes within the call.
    pub offset: u64,
    /// Bytes still to capture.
    pub remaining: u64,
    pub emitted: u64,
}

/// One step of the walk: load the next iovec, or copy the next piece of
/// the current range into the staged record (flushing it when full).
/// Returns 1 to stop the loop.
fn step(_i: u64, _ctx: *mut core::ffi::c_void) -> i64 {
    let s = match SCRATCH.get_ptr_mut(0) {
        // SAFETY: per-CPU scratch; bpf_loop runs on this CPU.
        Some(s) => unsafe { &mut *s },
        None => return 1,
    };
    let mut w = s.walk;
    let stop = advance(s, &mut w);
    s.walk = w;
    stop
}

#[inline(always)]
fn advance(s: &mut crate::maps::Scratch, w: &mut Walk) -> i64 {
    if w.remaining == 0 {
        return 1;
    }
    if w.cur_left == 0 {
        if w.idx >= w.iov_cnt || w.idx >= MAX_IOV as u64 {
            return 1;
        }
        let mut iov = [0u64; 2];
        // SAFETY: writes exactly `iov`'s 16 bytes (one struct iovec); the
        // source is user memory, read by the helper.
        let rc = unsafe {
            bpf_probe_read_user(
                iov.as_mut_ptr().cast(),
                16,
                (w.iov_base + w.idx * 16) as *const core::ffi::c_void,
            )
        };
        w.idx += 1;
        if rc != 0 {
            rare(stat::READ_FAULTS);
            return 1;
        }
        w.cur_ptr = iov[0];
        w.cur_left = if iov[1] < w.remaining {
            iov[1]
        } else {
            w.remaining
        };
        return 0;
    }
    let at = w.pos & (CHUNK_BYTES as u64 - 1);
    let room = CHUNK_BYTES as u64 - at;
    let n = if w.cur_left < room { w.cur_left } else { room };
    // LLVM knows `n` ≤ `room` ≤ CHUNK_BYTES and drops a plain clamp, but
    // verifiers before Linux 6.8 learn nothing from comparing two unknown
    // registers (`cur_left < room`), so the size would reach the helper
    // unbounded (6.1 refused the program). Through the stack the value is
    // opaque to LLVM, and the clamp against a constant stays for the
    // verifier to see.
    // SAFETY: a read of a local.
    let mut n = unsafe { core::ptr::read_volatile(&n) };
    if n > CHUNK_BYTES as u64 {
        n = CHUNK_BYTES as u64;
    }
    // SAFETY: `at` < CHUNK_BYTES (masked) and `n` ≤ CHUNK_BYTES, so the
    // write ends inside `s.buf` (2 * CHUNK_BYTES); the source is user
    // memory, read by the helper (a bad pointer is an error, not a fault).
    let rc = unsafe {
        bpf_probe_read_user(
            s.buf.as_mut_ptr().add(at as usize).cast(),
            n as u32,
            w.cur_ptr as *const core::ffi::c_void,
        )
    };
    if rc != 0 {
        rare(stat::READ_FAULTS);
        return 1;
    }
    w.pos = at + n;
    w.cur_ptr += n;
    w.cur_left -= n;
    w.remaining -= n;
    if w.pos >= CHUNK_BYTES as u64 || w.remaining == 0 {
        s.hdr.offset = w.offset as u32;
        w.offset += w.pos;
        output(s, w.pos);
        w.pos = 0;
        w.emitted += 1;
        if w.emitted >= MAX_RECORDS_PER_CALL as u64 {
            return 1;
        }
    }
    0
}

/// Copy header + `len` payload bytes of the scratch area to the ring buffer.
#[inline(always)]
fn output(s: &mut crate::maps::Scratch, len: u64) {
    let len = len & (2 * CHUNK_BYTES as u64 - 1);
    let len = if len > CHUNK_BYTES as u64 {
        CHUNK_BYTES as u64
    } else {
        len
    };
    s.hdr.cap_len = len as u32;
    let size = HEADER_BYTES + len as usize;
    // SAFETY: `size` is at most HEADER_BYTES + CHUNK_BYTES, inside Scratch.
    let bytes = unsafe {
        core::slice::from_raw_parts((s as *const crate::maps::Scratch).cast::<u8>(), size)
    };
    send::<[u8]>(bytes);
}

macro_rules! flat {
    ($enter:ident, $exit:ident, $sc:expr) => {
        #[tracepoint]
        pub fn $enter(ctx: TracePointContext) -> u32 {
            enter(arg::<0>(&ctx), arg::<1>(&ctx), arg::<2>(&ctx), $sc)
        }
        #[tracepoint]
        pub fn $exit(ctx: TracePointContext) -> u32 {
            exit(&ctx)
        }
    };
}

flat!(sys_enter_read, sys_exit_read, Syscall::Read);
flat!(sys_enter_write, sys_exit_write, Syscall::Write);
// recvfrom(fd, buf, len, flags, …) and recvmsg(fd, msghdr, flags): a peek
// (`MSG_PEEK`) takes nothing, its bytes are read again: not armed.
#[tracepoint]
pub fn sys_enter_recvfrom(ctx: TracePointContext) -> u32 {
    if arg::<3>(&ctx) & MSG_PEEK != 0 {
        return 0;
    }
    enter(
        arg::<0>(&ctx),
        arg::<1>(&ctx),
        arg::<2>(&ctx),
        Syscall::Recvfrom,
    )
}
#[tracepoint]
pub fn sys_exit_recvfrom(ctx: TracePointContext) -> u32 {
    exit(&ctx)
}
flat!(sys_enter_sendto, sys_exit_sendto, Syscall::Sendto);
// readv/writev(fd, iov, iovcnt): same argument positions, iovec array.
flat!(sys_enter_readv, sys_exit_readv, Syscall::Readv);
flat!(sys_enter_writev, sys_exit_writev, Syscall::Writev);
// recvmsg/sendmsg(fd, msghdr, flags).
#[tracepoint]
pub fn sys_enter_recvmsg(ctx: TracePointContext) -> u32 {
    if arg::<2>(&ctx) & MSG_PEEK != 0 {
        return 0;
    }
    enter(
        arg::<0>(&ctx),
        arg::<1>(&ctx),
        arg::<2>(&ctx),
        Syscall::Recvmsg,
    )
}
#[tracepoint]
pub fn sys_exit_recvmsg(ctx: TracePointContext) -> u32 {
    exit(&ctx)
}
flat!(sys_enter_sendmsg, sys_exit_sendmsg, Syscall::Sendmsg);
