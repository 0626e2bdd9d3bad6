//! The cheapest socket-data path, where the kernel allows it: one fexit
//! program on each data syscall's x86_64 entry point (`__x64_sys_read`,
//! `__x64_sys_write`, …), instead of the BTF program on the raw
//! `sys_exit` tracepoint (`btf.rs`), which runs at the exit of every
//! syscall of every process (+150 ns on a getppid() here). With fexit only
//! the eight data syscalls pay; every other syscall of the host pays
//! nothing. The body is `btf::data_exit`: the syscall entry point's
//! argument is the same `struct pt_regs *` of the user registers, and
//! fexit hands the program the function's return value after its
//! arguments.
//!
//! Kernels without BPF trampolines for tracing (fentry/fexit: no BTF, no
//! `CONFIG_DYNAMIC_FTRACE_WITH_DIRECT_CALLS`, or refused, as on this
//! repository's VM) get the BTF tracepoint or the syscall tracepoints
//! (userspace chooses and says why). Syscall entry points are x86_64's;
//! the agent only tries these programs there.

use agent_ebpf::Syscall;
use aya_ebpf::{macros::fexit, programs::FExitContext};

use crate::btf::data_exit;

macro_rules! data_fexit {
    ($prog:ident, $func:literal, $sc:expr) => {
        #[fexit(function = $func)]
        pub fn $prog(ctx: FExitContext) -> i32 {
            let regs: *const u64 = ctx.arg(0);
            data_exit(regs, $sc, || ctx.arg(1))
        }
    };
}

data_fexit!(fexit_read, "__x64_sys_read", Syscall::Read);
data_fexit!(fexit_write, "__x64_sys_write", Syscall::Write);
data_fexit!(fexit_readv, "__x64_sys_readv", Syscall::Readv);
data_fexit!(fexit_writev, "__x64_sys_writev", Syscall::Writev);
data_fexit!(fexit_sendto, "__x64_sys_sendto", Syscall::Sendto);
data_fexit!(fexit_recvfrom, "__x64_sys_recvfrom", Syscall::Recvfrom);
data_fexit!(fexit_sendmsg, "__x64_sys_sendmsg", Syscall::Sendmsg);
data_fexit!(fexit_recvmsg, "__x64_sys_recvmsg", Syscall::Recvmsg);
