//! Process lifecycle for discovery: every exec (with the new comm) and the
//! exit of targeted thread groups.

use agent_ebpf::{RecordHeader, RecordKind};
use aya_ebpf::{
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::tracepoint,
    programs::TracePointContext,
    EbpfContext,
};

use crate::{ctx::send, maps::TARGETS};

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

#[tracepoint]
pub fn sched_process_exit(ctx: TracePointContext) -> u32 {
    let id = bpf_get_current_pid_tgid();
    let tgid = (id >> 32) as u32;
    // SAFETY: read by value.
    if unsafe { TARGETS.get(&tgid) }.is_none() {
        return 0;
    }
    // group_dead (bool) at offset 32 of sched_process_exit.
    // SAFETY: constant-offset context load.
    let group_dead = unsafe { core::ptr::read((ctx.as_ptr() as *const u8).add(32)) };
    if group_dead == 0 {
        return 0;
    }
    let h = RecordHeader {
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
