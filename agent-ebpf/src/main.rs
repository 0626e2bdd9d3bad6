//! tokentap kernel programs: syscall tracepoints that copy the socket traffic
//! of targeted processes into a ring buffer.
//!
//! Owns: in-kernel filtering (TARGETS, CONNS), per-call payload capture and
//! the drop/truncation counters. Must not: read kernel memory (lockdown
//! forbids it; only tracepoint context and user memory are read), block or
//! slow the traced process beyond a map lookup when it is not targeted.
//!
//! One file per hook family: `data.rs` (read/write family, syscall
//! tracepoints), `btf.rs` (the same calls from one `tp_btf/sys_exit`
//! program), `fexit.rs` (the same from fexit programs on the data
//! syscalls alone, preferred where the kernel allows it), `conn.rs`
//! (accept/connect/close), `process.rs` (exec/fork/exit), `arrival.rs`
//! (`tcp:tcp_probe`: when a request's bytes reach an engine's socket). Maps live in
//! `maps.rs`. The object carries the record-layout version in its
//! `tokentap_abi` section; the agent checks it before loading.
// Map keys are passed by reference (`MAP.get(&key)`), as aya-ebpf's own
// examples do: the key's stack slot stays explicit for the verifier.
#![allow(clippy::needless_borrows_for_generic_args)]
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]

#[cfg(target_arch = "bpf")]
mod arrival;
#[cfg(target_arch = "bpf")]
mod btf;
#[cfg(target_arch = "bpf")]
mod conn;
#[cfg(target_arch = "bpf")]
mod ctx;
#[cfg(target_arch = "bpf")]
mod data;
#[cfg(target_arch = "bpf")]
mod fexit;
#[cfg(target_arch = "bpf")]
mod maps;
#[cfg(target_arch = "bpf")]
mod process;
#[cfg(target_arch = "bpf")]
mod tls;

#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

/// bpf_probe_read_user is a GPL-only helper.
#[cfg(target_arch = "bpf")]
#[link_section = "license"]
#[no_mangle]
static LICENSE: [u8; 4] = *b"GPL\0";

/// The record layout this object was built for (`agent_ebpf::ABI_VERSION`),
/// read by the agent from the ELF before loading.
#[cfg(target_arch = "bpf")]
#[link_section = "tokentap_abi"]
#[no_mangle]
#[used]
static TOKENTAP_ABI_VERSION: u32 = agent_ebpf::ABI_VERSION;

#[cfg(not(target_arch = "bpf"))]
fn main() {
    eprintln!(
        "agent-ebpf holds eBPF programs; `cargo xtask build` compiles it for bpfel-unknown-none"
    );
}
