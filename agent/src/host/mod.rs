//! Host facts: what the agent reads about this machine's processes and
//! pods — `/proc` (`procfs`: sockets, TCP tables, process trees, cgroups
//! and containers, network namespaces), engine discovery (`discover`:
//! which processes are inference servers listening on TCP), and the
//! Kubernetes API's pods of this node (`kube`), the node's name (`node`);
//! and the one door into an engine's own files (`rootfs`: resolved inside
//! its root, regular files and directories only, bounded).
//!
//! Owns: reading those facts. Must not: import any stage or feature (it
//! sits on the sources' floor), or hold more than the facts it returns
//! (the pod index is bounded).

/// The calling thread's CPU time, ns (`CLOCK_THREAD_CPUTIME_ID`): what a
/// budgeted worker thread has spent, and what benchmarks charge a writer.
pub fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `clock_gettime` writes one `timespec` we own.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// [`thread_cpu_ns`] in seconds.
pub fn thread_cpu_s() -> f64 {
    thread_cpu_ns() as f64 / 1e9
}

pub mod discover;
pub mod kube;
pub mod node;
pub mod procfs;
pub mod rootfs;
