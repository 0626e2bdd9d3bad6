//! The capture benchmark's floor tracer, a separate eBPF object (`floor`)
//! that the agent never loads: the cheapest useful tracepoint pair (one
//! hash lookup, then exit) on write enter and exit. `cargo xtask bench
//! capture` builds and attaches it itself, to report the agent's cost for
//! processes it does not target against this floor, in the same run.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]

#[cfg(target_arch = "bpf")]
mod programs {
    use aya_ebpf::{
        helpers::bpf_get_current_pid_tgid,
        macros::{map, tracepoint},
        maps::HashMap,
        programs::TracePointContext,
    };

    /// Shaped like the agent's `TARGETS` (same key, value and size), and
    /// like it empty for the untargeted workload the floor is measured on.
    #[map]
    static FLOOR_TARGETS: HashMap<u32, u8> = HashMap::with_max_entries(4096, 0);

    #[inline(always)]
    fn lookup_only() -> u32 {
        let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
        // SAFETY: the value is read by value, never through the pointer.
        if unsafe { FLOOR_TARGETS.get(&tgid) }.is_some() {
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
}

#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[cfg(target_arch = "bpf")]
#[link_section = "license"]
#[no_mangle]
static LICENSE: [u8; 4] = *b"GPL\0";

#[cfg(not(target_arch = "bpf"))]
fn main() {
    eprintln!("`floor` holds the capture benchmark's eBPF floor tracer; `cargo xtask bench capture` builds and attaches it");
}
