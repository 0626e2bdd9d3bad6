//! Reference programs for the capture benchmark: the cheapest useful
//! tracepoint pair (one map lookup, then exit) on write enter/exit. Never
//! attached by the agent; `tokentap floor` attaches them so
//! `cargo xtask bench capture` can report the agent's cost for processes
//! it does not target against this floor, measured in the same run.

use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid, macros::tracepoint, programs::TracePointContext,
};

use crate::maps::TARGETS;

#[inline(always)]
fn lookup_only() -> u32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    // SAFETY: read by value.
    if unsafe { TARGETS.get(&tgid) }.is_some() {
        return 1;
    }
    0
}

#[tracepoint]
pub fn floor_sys_enter_write(_ctx: TracePointContext) -> u32 {
    lookup_only()
}

#[tracepoint]
pub fn floor_sys_exit_write(_ctx: TracePointContext) -> u32 {
    lookup_only()
}
