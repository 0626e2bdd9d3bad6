//! The fast socket-data path: one BTF tracepoint program on the raw
//! `sys_exit` tracepoint (`tp_btf/sys_exit`) replaces the sixteen
//! per-syscall perf tracepoints of `data.rs` (which stay as the fallback
//! and the benchmark's reference).
//!
//! Why it is cheaper, per call:
//! - No enter program. At syscall exit the user registers saved at entry
//!   still hold the arguments (`regs->di/si/dx`), so fd, buffer and length
//!   are read there, next to the return value — no per-thread state is
//!   saved at enter and looked up at exit (`ACTIVE`).
//! - No perf-event record: a raw tracepoint hands the program the kernel's
//!   arguments directly; a perf syscall tracepoint first builds a trace
//!   record in a per-CPU buffer and copies the arguments into it.
//! - The exit program of `data.rs` then does the same work (the record is
//!   staged per CPU and copied to the ring with its exact size).
//!
//! The raw tracepoint fires on every syscall of every process; the first
//! test is the syscall number (a register load and a compare), so
//! syscalls other than the eight data calls return at once; data calls of
//! processes that are not targeted return after one array load
//! (`TARGET_SLOTS`), before the `TARGETS` hash lookup.
//!
//! Lockdown: `regs` is a BTF-typed pointer; loads through it are checked
//! by the verifier against the kernel's `struct pt_regs` and need no
//! `bpf_probe_read_kernel`. Kernels that refuse the program (no BTF, no
//! `tp_btf`, another architecture) get the fallback (userspace decides).
//!
//! Syscall numbers and `pt_regs` offsets are x86_64's; the agent only tries
//! this program there.

use agent_ebpf::{conn_key, target_slot, Syscall};
use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid, macros::btf_tracepoint, programs::BtfTracePointContext,
};

use crate::{
    data::{emit, EAGAIN},
    maps::{Pending, CONNS, TARGETS, TARGET_SLOTS},
};

/// `struct pt_regs` on x86_64, in u64 words: `r10` (7, a syscall's fourth
/// argument), `dx` (12), `si` (13), `di` (14), `orig_ax` (15, the syscall
/// number).
const R10: usize = 7;
const DX: usize = 12;
const SI: usize = 13;
const DI: usize = 14;
const ORIG_AX: usize = 15;

/// The data syscalls by x86_64 number.
#[inline(always)]
fn data_syscall(nr: u64) -> Option<Syscall> {
    Some(match nr {
        0 => Syscall::Read,
        1 => Syscall::Write,
        19 => Syscall::Readv,
        20 => Syscall::Writev,
        44 => Syscall::Sendto,
        45 => Syscall::Recvfrom,
        46 => Syscall::Sendmsg,
        47 => Syscall::Recvmsg,
        _ => return None,
    })
}

#[inline(always)]
fn reg(regs: *const u64, word: usize) -> u64 {
    // SAFETY: `regs` is the tracepoint's BTF-typed `struct pt_regs *`;
    // the verifier checks the offset against the kernel's type.
    unsafe { core::ptr::read_volatile(regs.add(word)) }
}

#[btf_tracepoint(function = "sys_exit")]
pub fn data_sys_exit(ctx: BtfTracePointContext) -> i32 {
    let regs: *const u64 = ctx.arg(0);
    let sc = match data_syscall(reg(regs, ORIG_AX)) {
        Some(sc) => sc,
        None => return 0,
    };
    data_exit(regs, sc, || ctx.arg(1))
}

/// One data syscall's exit, from its saved user registers (`regs`, a
/// BTF-typed `struct pt_regs *`) and its return value: the BTF
/// `sys_exit` program's body, and every fexit program's (`fexit.rs`).
#[inline(always)]
pub(crate) fn data_exit(regs: *const u64, sc: Syscall, ret: impl FnOnce() -> i64) -> i32 {
    let id = bpf_get_current_pid_tgid();
    let tgid = (id >> 32) as u32;
    // The array pre-filter first: a process that is not targeted returns
    // here without a hash lookup (unless its slot is shared).
    if TARGET_SLOTS.get(target_slot(tgid)).copied() != Some(1) {
        return 0;
    }
    // SAFETY: plain-data map values read by copy.
    if unsafe { TARGETS.get(&tgid) }.is_none() {
        return 0;
    }
    let r: i64 = ret();
    if r == -EAGAIN {
        return 0;
    }
    // A peek (`MSG_PEEK`: recvfrom's fourth argument, recvmsg's third)
    // takes nothing: the bytes are read again.
    let flags = match sc {
        Syscall::Recvfrom => reg(regs, R10),
        Syscall::Recvmsg => reg(regs, DX),
        _ => 0,
    };
    if flags & crate::data::MSG_PEEK != 0 {
        return 0;
    }
    let fd = reg(regs, DI) as i32;
    let Some(conn) = CONNS.get_ptr_mut(&conn_key(tgid, fd)) else {
        return 0;
    };
    let p = Pending {
        ptr: reg(regs, SI),
        len: reg(regs, DX),
        fd,
        syscall: sc as u8,
        armed: 0,
        server: 0,
        _pad: [0; 1],
    };
    if crate::tls::in_ssl_call(id, fd, &p, r) {
        crate::tls::cipher_read(id, &p, r);
        return 0;
    }
    emit(id, &p, r, conn);
    crate::tls::learn_cipher_in(id, &p, r);
    0
}
