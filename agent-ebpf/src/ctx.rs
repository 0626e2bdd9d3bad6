//! Reading syscall tracepoint context and small shared helpers.
//!
//! `TracePointContext::read_at` uses `bpf_probe_read_kernel`, which kernels
//! in lockdown refuse; the context is read here with direct loads at
//! constant offsets, which the verifier allows for tracepoint programs.

use agent_ebpf::stat;
use aya_ebpf::{
    bindings::{BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    programs::TracePointContext,
    EbpfContext,
};
use aya_log_ebpf::warn;

use crate::maps::{CONFIG, EVENTS, REPORTED, STATS};

/// Offset of the first syscall argument in `sys_enter_*` records and of
/// `ret` in `sys_exit_*` records (userspace checks the tracefs `format`
/// files before attaching).
const ARGS_OFFSET: usize = agent_ebpf::SYSCALL_ARGS_OFFSET;

/// Syscall argument `N` of a `sys_enter_*` tracepoint.
#[inline(always)]
pub fn arg<const N: usize>(ctx: &TracePointContext) -> u64 {
    // SAFETY: the verifier checks that constant-offset context loads stay
    // inside the tracepoint record.
    unsafe { core::ptr::read((ctx.as_ptr() as *const u8).add(ARGS_OFFSET + 8 * N) as *const u64) }
}

/// Return value of a `sys_exit_*` tracepoint.
#[inline(always)]
pub fn ret(ctx: &TracePointContext) -> i64 {
    // SAFETY: as above.
    unsafe { core::ptr::read((ctx.as_ptr() as *const u8).add(ARGS_OFFSET) as *const i64) }
}

#[inline(always)]
pub fn bump(index: u32) {
    if let Some(p) = STATS.get_ptr_mut(index) {
        // SAFETY: per-CPU slot, no concurrent writer on this CPU.
        unsafe { *p += 1 };
    }
}

/// A rare condition: counted like any statistic, and reported through
/// aya-log (into the agent's log) at most once per [`REPORT_EVERY_NS`] per
/// condition across all CPUs. Only failure paths call it: a call that
/// succeeds never reaches it. Not inlined, so each program carries one
/// copy of the logging code, reached by a call.
#[inline(never)]
pub fn rare(index: u32) {
    bump(index);
    // SAFETY: a helper with no arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    let Some(last) = REPORTED.get_ptr_mut(index) else {
        return;
    };
    // SAFETY: one u64 slot of a global array; two CPUs racing here may
    // both report, which the agent's own per-message limit absorbs.
    unsafe {
        if *last != 0 && now.wrapping_sub(*last) < REPORT_EVERY_NS {
            return;
        }
        *last = now;
    }
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    // One logging call (its code is large); the text is chosen here.
    let what: &str = match index {
        stat::RECORDS_DROPPED => {
            "ring buffer full: a record was dropped (records_dropped; raise --ring-buffer-bytes)"
        }
        stat::READ_FAULTS => {
            "user memory could not be read: a call's bytes are missing (read_faults)"
        }
        stat::CONNS_FULL => {
            "the CONNS map is full: a connection is not tracked (conns_full; raise --max-conns)"
        }
        stat::TARGETS_FULL => {
            "the TARGETS map is full: a child process is not followed (targets_full)"
        }
        _ => "unexpected state",
    };
    warn!(&(), "{} (pid {})", what, tgid);
}

/// At most one report per condition in this many nanoseconds (1 s).
const REPORT_EVERY_NS: u64 = 1_000_000_000;

/// Ring-buffer flag: wake the reader on every `Config::wakeup_every`th
/// record of this CPU, otherwise not (the reader's poll timer picks records
/// up). Uses only per-CPU state: nothing here touches a cache line the
/// reader writes.
#[inline(always)]
fn wakeup_flag() -> u64 {
    let every = match CONFIG.get(0) {
        Some(c) => c.wakeup_every as u64,
        None => 1,
    };
    let sent = match STATS.get(stat::RECORDS_SENT) {
        Some(v) => *v,
        None => 0,
    };
    if every <= 1 || sent & (every - 1) == every - 1 {
        BPF_RB_FORCE_WAKEUP as u64
    } else {
        BPF_RB_NO_WAKEUP as u64
    }
}

/// Copy `v` to the ring buffer, counting it as sent or dropped. Never waits.
#[inline(always)]
pub fn send<T: ?Sized>(v: &T) {
    if EVENTS.output::<T>(v, wakeup_flag()).is_ok() {
        bump(stat::RECORDS_SENT);
    } else {
        rare(stat::RECORDS_DROPPED);
    }
}
