//! Connection tracking: accept/accept4 and connect add (tgid, fd) to CONNS
//! at exit and emit an open record with the peer address when the process
//! passed one; close removes it and emits a close record.
//!
//! accept with a NULL address (cpp-httplib does this) leaves the family
//! unknown: the connection is tracked anyway and userspace resolves it via
//! /proc, untracking anything that is not TCP.

use agent_ebpf::{
    conn_key, stat, ConnState, RecordHeader, RecordKind, Syscall, AF_INET, AF_INET6, AF_UNSPEC,
    ROLE_CLIENT, ROLE_SERVER,
};
use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns, generated::bpf_probe_read_user},
    macros::tracepoint,
    programs::TracePointContext,
};

use crate::{
    ctx::{arg, rare, ret, send},
    maps::{arm, disarm, CONNS, TARGETS},
};

const EINPROGRESS: i64 = 115;

#[inline(always)]
fn targeted(tgid: u32) -> bool {
    // SAFETY: read by value.
    unsafe { TARGETS.get(&tgid) }.is_some()
}

#[inline(always)]
fn save(fd: u64, addr: u64, sc: Syscall) -> u32 {
    let id = bpf_get_current_pid_tgid();
    if !targeted((id >> 32) as u32) {
        return 0;
    }
    arm(id, addr, 0, fd as i32, sc as u8, 0);
    0
}

/// Emit an open record for `fd` and start tracking it, unless the address
/// says it is not an internet socket.
#[inline(always)]
fn track(id: u64, fd: i32, listen_fd: i32, addr_ptr: u64, role: u8, sc: u8) {
    let mut h = RecordHeader {
        // SAFETY: reads the monotonic clock; no arguments, no preconditions.
        ts_ns: unsafe { bpf_ktime_get_ns() },
        ret: fd as i64,
        tgid: (id >> 32) as u32,
        tid: id as u32,
        fd,
        offset: listen_fd as u32,
        kind: RecordKind::Open as u8,
        syscall: sc,
        role,
        family: AF_UNSPEC,
        ..RecordHeader::default()
    };
    if addr_ptr != 0 {
        // struct sockaddr_in / sockaddr_in6: family u16, port be16, then
        // the IPv4 address at 4 or flowinfo at 4 and the IPv6 address at 8.
        let mut sa = [0u8; 24];
        // SAFETY: writes exactly `sa`'s 24 bytes; the source is the traced
        // process's memory, read by the helper (a bad pointer is an error).
        let rc = unsafe { bpf_probe_read_user(sa.as_mut_ptr().cast(), 24, addr_ptr as *const _) };
        if rc == 0 {
            let family = u16::from_ne_bytes([sa[0], sa[1]]);
            if family != AF_INET && family != AF_INET6 {
                return;
            }
            h.family = family;
            h.port = u16::from_be_bytes([sa[2], sa[3]]);
            if family == AF_INET {
                h.addr[0] = sa[4];
                h.addr[1] = sa[5];
                h.addr[2] = sa[6];
                h.addr[3] = sa[7];
            } else {
                let mut i = 0;
                while i < 16 {
                    h.addr[i] = sa[8 + i];
                    i += 1;
                }
            }
        }
    }
    let st = ConnState::new(role);
    if CONNS.insert(&conn_key(h.tgid, fd), &st, 0).is_err() {
        rare(stat::CONNS_FULL);
        return;
    }
    send(&h);
}

#[tracepoint]
pub fn sys_enter_accept(ctx: TracePointContext) -> u32 {
    save(arg::<0>(&ctx), arg::<1>(&ctx), Syscall::Accept)
}

#[tracepoint]
pub fn sys_enter_accept4(ctx: TracePointContext) -> u32 {
    save(arg::<0>(&ctx), arg::<1>(&ctx), Syscall::Accept4)
}

#[inline(always)]
fn accept_exit(ctx: &TracePointContext, sc: Syscall) -> u32 {
    let id = bpf_get_current_pid_tgid();
    let (listen_fd, addr) = match disarm(id) {
        Some(p) => (p.fd, p.ptr),
        // A server blocks in accept: the call was already in progress when
        // the programs were attached, so its enter was not seen. Track the
        // new connection anyway, without an address (userspace resolves
        // it and untracks it if it is not TCP).
        None if targeted((id >> 32) as u32) => (-1, 0),
        None => return 0,
    };
    let r = ret(ctx);
    if r < 0 {
        return 0;
    }
    track(id, r as i32, listen_fd, addr, ROLE_SERVER, sc as u8);
    0
}

#[tracepoint]
pub fn sys_exit_accept(ctx: TracePointContext) -> u32 {
    accept_exit(&ctx, Syscall::Accept)
}

#[tracepoint]
pub fn sys_exit_accept4(ctx: TracePointContext) -> u32 {
    accept_exit(&ctx, Syscall::Accept4)
}

#[tracepoint]
pub fn sys_enter_connect(ctx: TracePointContext) -> u32 {
    save(arg::<0>(&ctx), arg::<1>(&ctx), Syscall::Connect)
}

#[tracepoint]
pub fn sys_exit_connect(ctx: TracePointContext) -> u32 {
    let id = bpf_get_current_pid_tgid();
    let p = match disarm(id) {
        Some(p) => p,
        None => return 0,
    };
    let r = ret(&ctx);
    if r != 0 && r != -EINPROGRESS {
        return 0;
    }
    // connect with a NULL address fails, so a zero pointer cannot get here
    // with success; an unreadable one leaves the family unknown.
    if p.ptr == 0 {
        return 0;
    }
    track(id, p.fd, -1, p.ptr, ROLE_CLIENT, p.syscall);
    0
}

#[tracepoint]
pub fn sys_enter_close(ctx: TracePointContext) -> u32 {
    let id = bpf_get_current_pid_tgid();
    let tgid = (id >> 32) as u32;
    if !targeted(tgid) {
        return 0;
    }
    let fd = arg::<0>(&ctx) as i32;
    let key = conn_key(tgid, fd);
    // SAFETY: read by value.
    if unsafe { CONNS.get(&key) }.is_none() {
        return 0;
    }
    let _ = CONNS.remove(&key);
    let h = RecordHeader {
        // SAFETY: reads the monotonic clock; no arguments, no preconditions.
        ts_ns: unsafe { bpf_ktime_get_ns() },
        tgid,
        tid: id as u32,
        fd,
        kind: RecordKind::Close as u8,
        syscall: Syscall::Close as u8,
        ..RecordHeader::default()
    };
    send(&h);
    0
}
