//! Process lifecycle: every exec (with the new comm, for discovery), every
//! listen (a new server becomes reachable), the
//! fork of a new process by a target (the child becomes a target here, in
//! the kernel, before it first runs), and the exit of targeted thread
//! groups (removed from TARGETS here, so a recycled pid is not captured).
//!
//! Must not: read `task_struct` (a kernel-memory read, refused under
//! lockdown). `sched_process_fork` fires for threads too and its context
//! has no clone flags, so the fork-family syscall enters (which have them)
//! record per thread whether the fork in progress makes a process, and
//! `sched_process_fork` (run by the parent inside that syscall) reads it.
//! A process that is not targeted pays one TARGETS lookup per clone enter
//! and one FORKING lookup per fork.

use agent_ebpf::{stat, target_slot, RecordHeader, RecordKind, CLONE_THREAD};
use aya_ebpf::{
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_ns,
        generated::bpf_probe_read_user,
    },
    macros::tracepoint,
    programs::TracePointContext,
    EbpfContext,
};

use crate::{
    ctx::{arg, bump, rare, send},
    maps::{FORKING, TARGETS, TARGET_SLOTS},
};

#[repr(C)]
struct ExecRecord {
    hdr: RecordHeader,
    comm: [u8; 16],
}

#[tracepoint]
pub fn sched_process_exec(_ctx: TracePointContext) -> u32 {
    let id = bpf_get_current_pid_tgid();
    let comm = bpf_get_current_comm().unwrap_or([0u8; 16]);
    let rec = ExecRecord {
        hdr: RecordHeader {
            // SAFETY: reads the monotonic clock; no arguments, no preconditions.
            ts_ns: unsafe { bpf_ktime_get_ns() },
            tgid: (id >> 32) as u32,
            tid: id as u32,
            fd: -1,
            cap_len: 16,
            kind: RecordKind::Exec as u8,
            ..RecordHeader::default()
        },
        comm,
    };
    send(&rec);
    0
}

/// A targeted thread group ended: out of TARGETS (so a recycled pid is
/// not captured), and userspace is told.
#[inline(always)]
fn on_group_end(id: u64) -> u32 {
    let tgid = (id >> 32) as u32;
    if TARGETS.remove(&tgid).is_ok() {
        bump(stat::TARGETS_EXITED);
    }
    let h = RecordHeader {
        // SAFETY: reads the monotonic clock; no arguments, no preconditions.
        ts_ns: unsafe { bpf_ktime_get_ns() },
        tgid,
        tid: id as u32,
        fd: -1,
        kind: RecordKind::Exit as u8,
        ..RecordHeader::default()
    };
    send(&h);
    0
}

/// `sched_process_exit` with `bool group_dead` at offset 32 (Linux 6.16
/// and later): the last thread of the group says so. Userspace attaches
/// this variant only where the tracepoint's `format` has that field there
/// (a program reading past the end of a tracepoint's record cannot
/// attach: what 6.1 and 6.12 answered to the single program before).
#[tracepoint]
pub fn exit_group_dead(ctx: TracePointContext) -> u32 {
    let id = bpf_get_current_pid_tgid();
    // SAFETY: read by value.
    if unsafe { TARGETS.get(&((id >> 32) as u32)) }.is_none() {
        return 0;
    }
    // SAFETY: constant-offset context load, inside the record on the
    // kernels this variant is attached to.
    let group_dead: u8 = unsafe { core::ptr::read((ctx.as_ptr() as *const u8).add(32)) };
    if group_dead == 0 {
        return 0;
    }
    on_group_end(id)
}

/// `sched_process_exit` without `group_dead` (Linux 6.15 and earlier):
/// the thread-group leader's exit stands for the group's end, reading
/// nothing of the record. A leader that exits before its other threads
/// (`pthread_exit` in `main`, rare in servers) ends the capture of its
/// process there (docs/deploy.md, "Kernels").
#[tracepoint]
pub fn exit_leader(_ctx: TracePointContext) -> u32 {
    let id = bpf_get_current_pid_tgid();
    if (id >> 32) as u32 != id as u32 {
        return 0;
    }
    // SAFETY: read by value.
    if unsafe { TARGETS.get(&((id >> 32) as u32)) }.is_none() {
        return 0;
    }
    on_group_end(id)
}

/// Remember whether this targeted thread's fork in progress makes a
/// process (`flags` without CLONE_THREAD).
#[inline(always)]
fn note_fork(flags: impl FnOnce() -> Option<u64>) -> u32 {
    let id = bpf_get_current_pid_tgid();
    // SAFETY: read by value.
    if unsafe { TARGETS.get(&((id >> 32) as u32)) }.is_none() {
        return 0;
    }
    let process = match flags() {
        Some(f) => (f & CLONE_THREAD == 0) as u8,
        // Unreadable clone_args: clone3 itself fails with EFAULT.
        None => 0,
    };
    if let Some(slot) = FORKING.get_ptr_mut(&id) {
        // SAFETY: this thread's own entry, written in place.
        unsafe { *slot = process };
    } else {
        let _ = FORKING.insert(&id, &process, 0);
    }
    0
}

#[tracepoint]
pub fn sys_enter_clone(ctx: TracePointContext) -> u32 {
    note_fork(|| Some(arg::<0>(&ctx)))
}

#[tracepoint]
pub fn sys_enter_clone3(ctx: TracePointContext) -> u32 {
    note_fork(|| {
        // `struct clone_args` starts with `__aligned_u64 flags`.
        let uargs = arg::<0>(&ctx);
        let mut flags = 0u64;
        // SAFETY: 8 bytes into a local; the helper checks the user pointer.
        let rc = unsafe {
            bpf_probe_read_user(
                (&mut flags as *mut u64).cast(),
                8,
                uargs as *const core::ffi::c_void,
            )
        };
        (rc == 0).then_some(flags)
    })
}

#[tracepoint]
pub fn sys_enter_fork(_ctx: TracePointContext) -> u32 {
    note_fork(|| Some(0))
}

#[tracepoint]
pub fn sys_enter_vfork(_ctx: TracePointContext) -> u32 {
    note_fork(|| Some(0))
}

/// `sched_process_fork`, run by the parent inside its clone: when
/// FORKING says this thread is making a process, the child's pid
/// (global, like every TARGETS key) joins TARGETS and userspace is told.
#[inline(always)]
fn on_fork(child_pid: u32) -> u32 {
    let id = bpf_get_current_pid_tgid();
    let Some(slot) = FORKING.get_ptr_mut(&id) else {
        return 0;
    };
    // SAFETY: this thread's own entry.
    let process = unsafe { core::ptr::replace(slot, 0) };
    if process == 0 {
        return 0;
    }
    if let Some(p) = TARGET_SLOTS.get_ptr_mut(target_slot(child_pid)) {
        // SAFETY: an array slot; only ever set to 1.
        unsafe { *p = 1 };
    }
    if TARGETS.insert(&child_pid, &1u8, 0).is_err() {
        rare(stat::TARGETS_FULL);
        return 0;
    }
    bump(stat::FORKS_FOLLOWED);
    let h = RecordHeader {
        // SAFETY: reads the monotonic clock; no arguments, no preconditions.
        ts_ns: unsafe { bpf_ktime_get_ns() },
        ret: child_pid as i64,
        tgid: (id >> 32) as u32,
        tid: id as u32,
        fd: -1,
        kind: RecordKind::Fork as u8,
        ..RecordHeader::default()
    };
    send(&h);
    0
}

/// Context load at a constant offset.
#[inline(always)]
fn ctx_u32<const OFF: usize>(ctx: &TracePointContext) -> u32 {
    // SAFETY: the verifier checks constant-offset context loads.
    unsafe { core::ptr::read((ctx.as_ptr() as *const u8).add(OFF) as *const u32) }
}

/// `sched_process_fork` where the comms are `__data_loc` strings (recent
/// kernels): `child_pid` at offset 20. Userspace attaches the variant that
/// matches the tracepoint's `format` file (a program reading past the end
/// of a tracepoint's record cannot attach).
#[tracepoint]
pub fn fork_compact(ctx: TracePointContext) -> u32 {
    on_fork(ctx_u32::<20>(&ctx))
}

/// `sched_process_fork` with inline `char[16]` comms (older kernels):
/// `child_pid` at offset 44.
#[tracepoint]
pub fn fork_legacy(ctx: TracePointContext) -> u32 {
    on_fork(ctx_u32::<44>(&ctx))
}

/// Every listen(2) on the host, so userspace can target a new server the
/// moment it becomes reachable (`--port`, discovery) instead of at its next
/// scan. listen is rare; a process pays one ring-buffer record per call.
#[tracepoint]
pub fn sys_enter_listen(ctx: TracePointContext) -> u32 {
    let id = bpf_get_current_pid_tgid();
    let h = RecordHeader {
        // SAFETY: reads the monotonic clock; no arguments, no preconditions.
        ts_ns: unsafe { bpf_ktime_get_ns() },
        tgid: (id >> 32) as u32,
        tid: id as u32,
        fd: arg::<0>(&ctx) as i32,
        kind: RecordKind::Listen as u8,
        ..RecordHeader::default()
    };
    send(&h);
    0
}
