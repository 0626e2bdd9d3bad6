//! Reading syscall tracepoint context and small shared helpers.
//!
//! `TracePointContext::read_at` uses `bpf_probe_read_kernel`, which kernels
//! in lockdown refuse; the context is read here with direct loads at
//! constant offsets, which the verifier allows for tracepoint programs.

use agent_ebpf::stat;
use aya_ebpf::{programs::TracePointContext, EbpfContext};

use crate::maps::{EVENTS, STATS};

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

/// Copy `v` to the ring buffer, counting it as sent or dropped. Never waits.
#[inline(always)]
pub fn send<T: ?Sized>(v: &T) {
    if EVENTS.output::<T>(v, 0).is_ok() {
        bump(stat::RECORDS_SENT);
    } else {
        bump(stat::RECORDS_DROPPED);
    }
}
