//! The probe table: every kernel hook the agent attaches, as data —
//! program, attach kind (tracepoint, BTF tracepoint, uprobe), and when it
//! is attached (always, if the tracepoint exists, as one of the two data
//! hook sets, by this kernel's record layout) — and the one routine that
//! attaches the rows this kernel and these options select. A program's
//! name says nothing about where it attaches; its row does.
//!
//! Adding a kernel hook: a program in `agent-ebpf/src/` and its row in
//! [`PROBES`] (a unit test holds the table and the object's programs to
//! each other).
//!
//! Owns: the table and attaching. Must not: load the object (that is
//! `programs.rs`) or touch maps.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use aya::{
    programs::{uprobe::UProbeScope, BtfTracePoint, FExit, ProbeKind, TracePoint, UProbe},
    Btf, Ebpf,
};

use super::{
    layout::{self, ExitLayout, Format, Layouts},
    programs::tracefs_events,
    DataHooks,
};

/// Where a program attaches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attach {
    /// A perf tracepoint, `events/CATEGORY/NAME` under tracefs.
    Tracepoint {
        category: &'static str,
        name: &'static str,
    },
    /// A BTF-typed raw tracepoint (`tp_btf/NAME`; needs kernel BTF).
    BtfTracepoint { name: &'static str },
    /// An fexit program on kernel function `function` (a BPF trampoline;
    /// needs kernel BTF and a kernel that allows tracing programs).
    FExit { function: &'static str },
    /// A uprobe (or, with `ret`, a uretprobe) on `symbol` of `target` (a
    /// path, or a library name the loader resolves): a user-space
    /// library's functions, such as a TLS library's read and write.
    Uprobe {
        target: &'static str,
        symbol: &'static str,
        ret: bool,
    },
}

/// When a row is attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum When {
    /// Always; failing to attach fails the start.
    Required,
    /// When its tracepoint exists on this kernel (arm64 has no fork or
    /// vfork syscall); else left out, said at debug level.
    IfPresent,
    /// With the syscall-tracepoint data hooks (`--data-hooks tracepoint`,
    /// and `auto` where the BTF program is refused: its fallback).
    DataTracepoint,
    /// With the BTF data hooks (`--data-hooks btf`, and `auto` first).
    DataBtf,
    /// With the fexit data hooks (`--data-hooks fexit` only).
    DataFexit,
    /// When `sched_process_fork`'s `child_pid` is at this offset on this
    /// kernel (the program reads it there); no matching variant: children
    /// of targets are not followed in the kernel, said once.
    ForkLayout(usize),
    /// When `sched_process_exit` has this layout (`capture::layout`): the
    /// thread group's end from `group_dead`, else from the leader's exit.
    ExitLayout(ExitLayout),
    /// With request arrival times on, where `tcp:tcp_probe` has the layout
    /// the program reads (`agent_ebpf::arrival_tp`); else the agent runs
    /// without arrival times, said once.
    Arrival,
    /// Per TLS library the targets map, by the TLS source
    /// (`capture::tls`), never at start-up.
    Tls,
}

/// One row of the table.
#[derive(Clone, Copy, Debug)]
pub struct Probe {
    /// The program's name in the object.
    pub program: &'static str,
    pub attach: Attach,
    pub when: When,
}

/// A row on a perf tracepoint.
const fn tracepoint(
    program: &'static str,
    category: &'static str,
    name: &'static str,
    when: When,
) -> Probe {
    Probe {
        program,
        attach: Attach::Tracepoint { category, name },
        when,
    }
}

/// A row on a syscall tracepoint; those programs are named as their
/// tracepoint.
const fn syscall(program: &'static str, when: When) -> Probe {
    tracepoint(program, "syscalls", program, when)
}

const fn sched(program: &'static str, name: &'static str, when: When) -> Probe {
    tracepoint(program, "sched", name, when)
}

/// Every kernel hook of the agent (`agent-ebpf/src/`).
pub const PROBES: &[Probe] = &[
    // Connections (conn.rs).
    syscall("sys_enter_accept", When::Required),
    syscall("sys_exit_accept", When::Required),
    syscall("sys_enter_accept4", When::Required),
    syscall("sys_exit_accept4", When::Required),
    syscall("sys_enter_connect", When::Required),
    syscall("sys_exit_connect", When::Required),
    syscall("sys_enter_close", When::Required),
    // Processes (process.rs).
    sched("sched_process_exec", "sched_process_exec", When::Required),
    sched(
        "exit_group_dead",
        "sched_process_exit",
        When::ExitLayout(ExitLayout::GroupDead),
    ),
    sched(
        "exit_leader",
        "sched_process_exit",
        When::ExitLayout(ExitLayout::Leader),
    ),
    sched("fork_compact", "sched_process_fork", When::ForkLayout(20)),
    sched("fork_legacy", "sched_process_fork", When::ForkLayout(44)),
    syscall("sys_enter_clone", When::Required),
    syscall("sys_enter_clone3", When::Required),
    syscall("sys_enter_fork", When::IfPresent),
    syscall("sys_enter_vfork", When::IfPresent),
    syscall("sys_enter_listen", When::Required),
    // Socket data, fexit: one program per data syscall (fexit.rs).
    fexit("fexit_read", "__x64_sys_read"),
    fexit("fexit_write", "__x64_sys_write"),
    fexit("fexit_readv", "__x64_sys_readv"),
    fexit("fexit_writev", "__x64_sys_writev"),
    fexit("fexit_sendto", "__x64_sys_sendto"),
    fexit("fexit_recvfrom", "__x64_sys_recvfrom"),
    fexit("fexit_sendmsg", "__x64_sys_sendmsg"),
    fexit("fexit_recvmsg", "__x64_sys_recvmsg"),
    // Socket data, BTF: one program on every syscall's exit (btf.rs).
    Probe {
        program: "data_sys_exit",
        attach: Attach::BtfTracepoint { name: "sys_exit" },
        when: When::DataBtf,
    },
    // Socket data, syscall tracepoints (data.rs).
    syscall("sys_enter_read", When::DataTracepoint),
    syscall("sys_exit_read", When::DataTracepoint),
    syscall("sys_enter_write", When::DataTracepoint),
    syscall("sys_exit_write", When::DataTracepoint),
    syscall("sys_enter_readv", When::DataTracepoint),
    syscall("sys_exit_readv", When::DataTracepoint),
    syscall("sys_enter_writev", When::DataTracepoint),
    syscall("sys_exit_writev", When::DataTracepoint),
    syscall("sys_enter_recvfrom", When::DataTracepoint),
    syscall("sys_exit_recvfrom", When::DataTracepoint),
    syscall("sys_enter_sendto", When::DataTracepoint),
    syscall("sys_exit_sendto", When::DataTracepoint),
    syscall("sys_enter_recvmsg", When::DataTracepoint),
    syscall("sys_exit_recvmsg", When::DataTracepoint),
    syscall("sys_enter_sendmsg", When::DataTracepoint),
    syscall("sys_exit_sendmsg", When::DataTracepoint),
    // Request arrival (arrival.rs).
    tracepoint("tcp_probe", "tcp", "tcp_probe", When::Arrival),
    // TLS plaintext (tls.rs): attached per target process that maps
    // OpenSSL (`capture::tls`; the return program on every read/write
    // function of `tls::SSL_SYMBOLS`).
    tls("ssl_write", "libssl.so.3", "SSL_write", false),
    tls("ssl_write_ex", "libssl.so.3", "SSL_write_ex", false),
    tls("ssl_read", "libssl.so.3", "SSL_read", false),
    tls("ssl_read_ex", "libssl.so.3", "SSL_read_ex", false),
    tls("ssl_ret", "libssl.so.3", "SSL_read", true),
    tls("ssl_free", "libssl.so.3", "SSL_free", false),
    // Memory BIOs (asyncio): tied to their sockets by content.
    tls("bio_write", "libcrypto.so.3", "BIO_write", false),
    tls("bio_read", "libcrypto.so.3", "BIO_read", false),
];

/// An fexit data-hook row.
const fn fexit(program: &'static str, function: &'static str) -> Probe {
    Probe {
        program,
        attach: Attach::FExit { function },
        when: When::DataFexit,
    }
}

/// A TLS uprobe row (the library is each one the targets map).
const fn tls(
    program: &'static str,
    target: &'static str,
    symbol: &'static str,
    ret: bool,
) -> Probe {
    Probe {
        program,
        attach: Attach::Uprobe {
            target,
            symbol,
            ret,
        },
        when: When::Tls,
    }
}

/// What this kernel and these options select from the table.
struct Kernel {
    /// The data hooks in use (never `Auto`).
    data: DataHooks,
    /// The record layouts read from tracefs.
    layouts: Layouts,
    /// tracefs's `events` directory.
    events: PathBuf,
}

impl Kernel {
    /// Whether `p` is attached in the main pass (arrival has its own).
    fn wants(&self, p: &Probe) -> bool {
        match p.when {
            When::Required => true,
            When::IfPresent => match p.attach {
                Attach::Tracepoint { category, name } => {
                    self.events.join(category).join(name).is_dir()
                }
                _ => true,
            },
            When::DataTracepoint => self.data == DataHooks::Tracepoint,
            When::DataBtf => self.data == DataHooks::Btf,
            When::DataFexit => self.data == DataHooks::Fexit,
            When::ForkLayout(at) => self.layouts.fork_child_pid == Some(at),
            When::ExitLayout(l) => self.layouts.exit == l,
            When::Arrival | When::Tls => false,
        }
    }
}

/// Loads and attaches one row.
fn attach(ebpf: &mut Ebpf, p: &Probe) -> Result<()> {
    let name = p.program;
    let prog = ebpf.program_mut(name).with_context(|| {
        format!("the eBPF object has no program {name} (rebuild with `cargo xtask build`)")
    })?;
    match p.attach {
        Attach::Tracepoint { category, name: tp } => {
            if category == "syscalls" {
                // The programs read arguments and `ret` at fixed offsets.
                let f = Format::read(&tracefs_events(), category, tp)?;
                layout::syscall_matches(&f)?;
            }
            let prog: &mut TracePoint = prog.try_into()?;
            prog.load().map_err(|e| load_failure(name, e))?;
            prog.attach(category, tp)
                .map_err(|e| perf_refusal(anyhow::Error::new(e)))
                .with_context(|| format!("attaching {name} to {category}/{tp}"))?;
        }
        Attach::FExit { function } => {
            if !cfg!(target_arch = "x86_64") {
                bail!("{name} hooks x86_64 syscall entry points; this is another architecture");
            }
            let btf = kernel_btf()?;
            let prog: &mut FExit = prog.try_into()?;
            prog.load(function, &btf)
                .map_err(|e| load_failure(name, e))?;
            prog.attach()
                .with_context(|| format!("attaching {name} as fexit on {function}"))?;
        }
        Attach::BtfTracepoint { name: tp } => {
            if !cfg!(target_arch = "x86_64") {
                bail!("{name} reads x86_64 registers; this is another architecture");
            }
            let btf = kernel_btf()?;
            let prog: &mut BtfTracePoint = prog.try_into()?;
            prog.load(tp, &btf).map_err(|e| load_failure(name, e))?;
            prog.attach()
                .with_context(|| format!("attaching {name} to the raw {tp} tracepoint"))?;
        }
        Attach::Uprobe {
            target,
            symbol,
            ret,
        } => {
            let prog: &mut UProbe = prog.try_into()?;
            // The object's section decides entry or return; the row must
            // say the same.
            if matches!(prog.kind(), ProbeKind::Return) != ret {
                bail!("{name}: the probe table and the object disagree on uprobe vs uretprobe");
            }
            prog.load().map_err(|e| load_failure(name, e))?;
            let kind = if ret { "uretprobe" } else { "uprobe" };
            prog.attach(symbol, Path::new(target), UProbeScope::AllProcesses)
                .with_context(|| format!("attaching {name} as a {kind} on {target}:{symbol}"))?;
        }
    }
    Ok(())
}

/// The kernel's BTF (fexit and BTF tracepoint programs are typed by it).
fn kernel_btf() -> Result<Btf> {
    Btf::from_sys_fs().map_err(|e| anyhow::anyhow!(e)).context(
        "no kernel BTF (/sys/kernel/btf/vmlinux; a kernel built with CONFIG_DEBUG_INFO_BTF has it)",
    )
}

/// `kernel.perf_event_paranoid` above 2 is Debian's and Ubuntu's own
/// restriction (a distribution patch): perf events — tracepoint
/// attachments included — then open only with `CAP_SYS_ADMIN`, whatever
/// `CAP_PERFMON` says. A refused attach there says so and what to do.
fn perf_refusal(e: anyhow::Error) -> anyhow::Error {
    let text = format!("{e:#}");
    if !(text.contains("Permission denied") || text.contains("Operation not permitted")) {
        return e;
    }
    match perf_event_paranoid() {
        Some(level) if level > 2 => e.context(format!(
            "kernel.perf_event_paranoid is {level} on this node: above 2 (Debian's and Ubuntu's \
             default) the kernel opens perf events only with CAP_SYS_ADMIN, CAP_PERFMON is not \
             enough. Set it to 2 on the node (`sysctl -w kernel.perf_event_paranoid=2`, \
             docs/deploy.md \"Kernels\") or give the agent CAP_SYS_ADMIN"
        )),
        _ => e,
    }
}

/// `/proc/sys/kernel/perf_event_paranoid` (a host-wide setting).
pub fn perf_event_paranoid() -> Option<i32> {
    std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Why a program did not load. EPERM/EACCES with an empty verifier log is
/// a privilege refusal, not the verifier's judgement (which also says
/// EACCES, with its log).
fn load_failure(name: &str, e: aya::programs::ProgramError) -> anyhow::Error {
    let refused = match &e {
        aya::programs::ProgramError::LoadError {
            io_error,
            verifier_log,
        } => {
            io_error.kind() == std::io::ErrorKind::PermissionDenied
                && verifier_log.to_string().trim().is_empty()
        }
        _ => false,
    };
    let text = format!("{e:?}");
    // SAFETY: geteuid has no preconditions.
    if refused && unsafe { libc::geteuid() } == 0 {
        // Root, so not a missing capability: the kernel's own policy.
        let lockdown = std::fs::read_to_string("/sys/kernel/security/lockdown")
            .ok()
            .and_then(|l| {
                l.split_whitespace()
                    .find(|w| w.starts_with('['))
                    .map(|w| w.trim_matches(['[', ']']).to_string())
            })
            .filter(|m| m != "none");
        return anyhow::anyhow!(
            "the kernel refused to load {name} even to root: {} ({text})",
            match lockdown {
                Some(m) => format!("kernel lockdown ({m}) forbids this program type"),
                None => "a kernel policy (lockdown, an LSM) forbids this program type".into(),
            }
        );
    }
    if refused {
        return anyhow::anyhow!(
            "the kernel refused to load {name}: Operation not permitted — tracepoint programs need CAP_PERFMON (with CAP_BPF) or root ({text})"
        );
    }
    anyhow::anyhow!(text).context(format!("the kernel verifier rejected {name}"))
}

/// Unloads every row with `when` (their links go with them): what a
/// failed `attach_all` left attached.
fn detach_all(ebpf: &mut Ebpf, when: When) {
    for p in PROBES.iter().filter(|p| p.when == when) {
        if let Some(prog) = ebpf.program_mut(p.program) {
            if let Ok(f) = <&mut FExit>::try_from(prog) {
                let _ = f.unload();
            }
        }
    }
}

/// Attaches every row with `when`; the first failure is the error.
fn attach_all(ebpf: &mut Ebpf, when: When) -> Result<()> {
    for p in PROBES.iter().filter(|p| p.when == when) {
        attach(ebpf, p)?;
    }
    Ok(())
}

/// Attaches the agent's programs (all but arrival). Socket data is hooked
/// as `hooks` asks; the result says which hooks are in use (`Btf` or
/// `Tracepoint`). `Auto` falls back to the syscall tracepoints when the
/// BTF program is refused, and says why once. Without a known
/// `sched_process_fork` layout, children of targets are not followed in
/// the kernel (a warning says so); everything else works.
pub(super) fn attach_agent(ebpf: &mut Ebpf, hooks: DataHooks) -> Result<Attached> {
    let data = match hooks {
        DataHooks::Tracepoint => DataHooks::Tracepoint,
        DataHooks::Btf => {
            attach_all(ebpf, When::DataBtf).context("--data-hooks btf")?;
            DataHooks::Btf
        }
        DataHooks::Fexit => {
            if let Err(e) = attach_all(ebpf, When::DataFexit) {
                // A half-attached set must not stay behind the error.
                detach_all(ebpf, When::DataFexit);
                return Err(e.context("--data-hooks fexit"));
            }
            DataHooks::Fexit
        }
        DataHooks::Auto => match attach_all(ebpf, When::DataBtf) {
            Ok(()) => DataHooks::Btf,
            Err(e) => {
                eprintln!(
                    "tokentap: socket data through syscall tracepoints (the faster BTF tracepoint is not available: {e:#})"
                );
                DataHooks::Tracepoint
            }
        },
    };
    let events = tracefs_events();
    let layouts = Layouts::read(&events);
    let k = Kernel {
        data,
        layouts,
        events,
    };
    if !PROBES
        .iter()
        .any(|p| matches!(p.when, When::ForkLayout(_)) && k.wants(p))
    {
        log::warn!(
            "sched_process_fork has a record layout tokentap does not know: \
             child processes of targets are not followed"
        );
    }
    for p in PROBES
        .iter()
        .filter(|p| !matches!(p.when, When::DataBtf | When::DataFexit))
    {
        if k.wants(p) {
            attach(ebpf, p)?;
        } else if p.when == When::IfPresent {
            log::debug!(
                "{:?} does not exist here; {} not attached",
                p.attach,
                p.program
            );
        }
    }
    Ok(Attached { data, layouts })
}

/// What [`attach_agent`] chose on this kernel.
#[derive(Clone, Copy, Debug)]
pub struct Attached {
    /// The data hooks in use (never `Auto`).
    pub data: DataHooks,
    pub layouts: Layouts,
}

/// Attaches the arrival rows when `tcp:tcp_probe`'s record has the layout
/// they read (`agent_ebpf::arrival_tp`); an error says why not (the agent
/// then runs without arrival times).
pub(super) fn attach_arrival(ebpf: &mut Ebpf) -> Result<()> {
    let f = Format::read(&tracefs_events(), "tcp", "tcp_probe")?;
    layout::arrival_matches(&f)?;
    attach_all(ebpf, When::Arrival)
}

#[cfg(test)]
mod tests {
    use object::{Object, ObjectSection, ObjectSymbol};

    use super::super::programs::{Aligned, EBPF_OBJECT};
    use super::*;

    #[test]
    fn fork_and_exit_variants_follow_the_tracepoint_layouts() {
        let fork_programs = |layout: Option<usize>| -> Vec<&str> {
            let k = Kernel {
                data: DataHooks::Tracepoint,
                layouts: Layouts {
                    exit: ExitLayout::Leader,
                    fork_child_pid: layout,
                },
                events: PathBuf::from("/nonexistent"),
            };
            PROBES
                .iter()
                .filter(|p| matches!(p.when, When::ForkLayout(_)) && k.wants(p))
                .map(|p| p.program)
                .collect()
        };
        assert_eq!(fork_programs(Some(20)), ["fork_compact"]);
        assert_eq!(fork_programs(Some(44)), ["fork_legacy"]);
        // A layout no variant reads: no fork program (children are not
        // followed in the kernel, and the agent says so).
        assert!(fork_programs(Some(36)).is_empty());
        assert!(fork_programs(None).is_empty());
        let exit_programs = |exit| -> Vec<&str> {
            let k = Kernel {
                data: DataHooks::Tracepoint,
                layouts: Layouts {
                    exit,
                    fork_child_pid: Some(20),
                },
                events: PathBuf::from("/nonexistent"),
            };
            PROBES
                .iter()
                .filter(|p| {
                    matches!(
                        p.attach,
                        Attach::Tracepoint {
                            name: "sched_process_exit",
                            ..
                        }
                    ) && k.wants(p)
                })
                .map(|p| p.program)
                .collect()
        };
        // Exactly one program on sched_process_exit on every kernel.
        assert_eq!(exit_programs(ExitLayout::GroupDead), ["exit_group_dead"]);
        assert_eq!(exit_programs(ExitLayout::Leader), ["exit_leader"]);
    }

    #[test]
    fn one_set_of_data_hooks_is_attached_and_the_rest_always() {
        let with = |data| -> Vec<&str> {
            let k = Kernel {
                data,
                layouts: Layouts {
                    exit: ExitLayout::GroupDead,
                    fork_child_pid: Some(20),
                },
                // No tracefs here: the optional fork/vfork are left out.
                events: PathBuf::from("/nonexistent"),
            };
            PROBES
                .iter()
                .filter(|p| k.wants(p))
                .map(|p| p.program)
                .collect()
        };
        let btf = with(DataHooks::Btf);
        let tp = with(DataHooks::Tracepoint);
        assert!(btf.contains(&"data_sys_exit") && !btf.contains(&"sys_enter_write"));
        assert!(tp.contains(&"sys_enter_write") && !tp.contains(&"data_sys_exit"));
        for p in [
            "sys_enter_accept4",
            "sys_enter_close",
            "sched_process_exec",
            "fork_compact",
        ] {
            assert!(btf.contains(&p) && tp.contains(&p), "{p}");
        }
        assert!(!btf.contains(&"sys_enter_vfork") && !btf.contains(&"tcp_probe"));
    }

    #[test]
    fn every_program_has_one_row_and_every_row_a_program() {
        let mut seen = std::collections::HashSet::new();
        for p in PROBES {
            assert!(seen.insert(p.program), "{} twice in PROBES", p.program);
        }
        if !cfg!(tokentap_has_ebpf) {
            return;
        }
        let obj = Aligned::copy(EBPF_OBJECT);
        let file = object::File::parse(obj.bytes()).unwrap();
        let mut programs: Vec<String> = file
            .symbols()
            .filter(|s| s.kind() == object::SymbolKind::Text && s.is_global())
            .filter(|s| {
                s.section_index()
                    .and_then(|i| file.section_by_index(i).ok())
                    .and_then(|sec| sec.name().ok().map(|n| n != ".text"))
                    .unwrap_or(false)
            })
            .filter_map(|s| s.name().ok().map(str::to_string))
            .collect();
        programs.sort();
        let mut rows: Vec<String> = PROBES.iter().map(|p| p.program.to_string()).collect();
        rows.sort();
        assert_eq!(programs, rows, "the object's programs vs the probe table");
    }
}
