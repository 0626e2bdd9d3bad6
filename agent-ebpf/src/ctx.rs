//! Reading syscall tracepoint context and small shared helpers.
//!
//! `TracePointContext::read_at` uses `bpf_probe_read_kernel`, which kernels
//! in lockdown refuse; the context is read here with direct loads at
//! constant offsets, which the verifier allows for tracepoint programs.

use agent_ebpf::stat;
use aya_ebpf::{programs::TracePointContext, EbpfContext};

use aya_ebpf::bindings::{BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP};

use crate::maps::{CONFIG, EVENTS, STATS};

/// Offset of the first syscall argument in `sys_enter_*` records and of
/// `ret` in `sys_exit_*` records (see the tracefs `format` files).
const ARGS_OFFSET: usize = 16;

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
        bump(stat::RECORDS_DROPPED);
    }
}
