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
    programs::{uprobe::UProbeScope, BtfTracePoint, ProbeKind, TracePoint, UProbe},
    Btf, Ebpf,
};

use super::{programs::tracefs_events, DataHooks};

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
    /// When `sched_process_fork`'s `child_pid` is at this offset on this
    /// kernel (the program reads it there); no matching variant: children
    /// of targets are not followed in the kernel, said once.
    ForkLayout(usize),
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
    sched("sched_process_exit", "sched_process_exit", When::Required),
    sched("fork_compact", "sched_process_fork", When::ForkLayout(20)),
    sched("fork_legacy", "sched_process_fork", When::ForkLayout(44)),
    syscall("sys_enter_clone", When::Required),
    syscall("sys_enter_clone3", When::Required),
    syscall("sys_enter_fork", When::IfPresent),
    syscall("sys_enter_vfork", When::IfPresent),
    syscall("sys_enter_listen", When::Required),
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
    /// `sched_process_fork`'s `child_pid` offset, if its format was read.
    fork_layout: Option<usize>,
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
            When::ForkLayout(at) => self.fork_layout == Some(at),
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
            let prog: &mut TracePoint = prog.try_into()?;
            prog.load().map_err(|e| load_failure(name, e))?;
            prog.attach(category, tp)
                .with_context(|| format!("attaching {name} to {category}/{tp}"))?;
        }
        Attach::BtfTracepoint { name: tp } => {
            if !cfg!(target_arch = "x86_64") {
                bail!("{name} reads x86_64 registers; this is another architecture");
            }
            let btf = Btf::from_sys_fs().map_err(|e| anyhow::anyhow!(e)).context(
                "no kernel BTF (/sys/kernel/btf/vmlinux; a kernel built with CONFIG_DEBUG_INFO_BTF has it)",
            )?;
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
    if refused {
        return anyhow::anyhow!(
            "the kernel refused to load {name}: Operation not permitted — tracepoint programs need CAP_PERFMON (with CAP_BPF) or root ({text})"
        );
    }
    anyhow::anyhow!(text).context(format!("the kernel verifier rejected {name}"))
}

/// Attaches every row with `when`; the first failure is the error.
fn attach_all(ebpf: &mut Ebpf, when: When) -> Result<()> {
    for p in PROBES.iter().filter(|p| p.when == when) {
        attach(ebpf, p)?;
    }
    Ok(())
}

/// `sched_process_fork`'s `child_pid` offset on this kernel.
fn fork_layout(events: &Path) -> Option<usize> {
    let text = std::fs::read_to_string(events.join("sched/sched_process_fork/format")).ok()?;
    child_pid_offset(&text)
}

/// The `child_pid` offset a `sched_process_fork` format file gives.
pub fn child_pid_offset(format: &str) -> Option<usize> {
    let line = format
        .lines()
        .find(|l| l.contains(" child_pid;") || l.contains("\tchild_pid;"))?;
    format_number(line, "offset:")
}

/// The number after `key` (`offset:`, `size:`) in a tracefs format line.
fn format_number(line: &str, key: &str) -> Option<usize> {
    line.split(key)
        .nth(1)?
        .split(';')
        .next()?
        .trim()
        .parse()
        .ok()
}

/// Attaches the agent's programs (all but arrival). Socket data is hooked
/// as `hooks` asks; the result says which hooks are in use (`Btf` or
/// `Tracepoint`). `Auto` falls back to the syscall tracepoints when the
/// BTF program is refused, and says why once. Without a known
/// `sched_process_fork` layout, children of targets are not followed in
/// the kernel (a warning says so); everything else works.
pub(super) fn attach_agent(ebpf: &mut Ebpf, hooks: DataHooks) -> Result<DataHooks> {
    let data = match hooks {
        DataHooks::Tracepoint => DataHooks::Tracepoint,
        DataHooks::Btf => {
            attach_all(ebpf, When::DataBtf).context("--data-hooks btf")?;
            DataHooks::Btf
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
    let fork_layout = fork_layout(&events);
    let k = Kernel {
        data,
        fork_layout,
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
    for p in PROBES.iter().filter(|p| p.when != When::DataBtf) {
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
    Ok(data)
}

/// Attaches the arrival rows when `tcp:tcp_probe`'s record has the layout
/// they read (`agent_ebpf::arrival_tp`); an error says why not (the agent
/// then runs without arrival times).
pub(super) fn attach_arrival(ebpf: &mut Ebpf) -> Result<()> {
    let format = tracefs_events().join("tcp/tcp_probe/format");
    let text = std::fs::read_to_string(&format)
        .with_context(|| format!("no tcp:tcp_probe tracepoint ({})", format.display()))?;
    arrival_layout_matches(&text)?;
    attach_all(ebpf, When::Arrival)
}

/// Checks a `tcp_probe` format file against the offsets the program reads.
pub fn arrival_layout_matches(format: &str) -> Result<()> {
    for (field, offset, size) in agent_ebpf::arrival_tp::FIELDS {
        let line = format
            .lines()
            .find(|l| {
                l.split(';').next().is_some_and(|d| {
                    d.ends_with(&format!(" {field}")) || d.ends_with(&format!(" {field}[28]"))
                })
            })
            .with_context(|| format!("tcp_probe has no field {field}"))?;
        if format_number(line, "offset:") != Some(offset)
            || format_number(line, "size:") != Some(size)
        {
            bail!(
                "tcp_probe's {field} is not at offset {offset} (size {size}) on this kernel: {}",
                line.trim()
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use object::{Object, ObjectSection, ObjectSymbol};

    use super::super::programs::{Aligned, EBPF_OBJECT};
    use super::*;

    /// `tcp:tcp_probe`'s fields on Linux 6.18 (this repository's VM).
    const TCP_PROBE_6_18: &str = "\tfield:__u8 saddr[28];\toffset:8;\tsize:28;\tsigned:0;\n\tfield:__u8 daddr[28];\toffset:36;\tsize:28;\tsigned:0;\n\tfield:__u16 sport;\toffset:64;\tsize:2;\tsigned:0;\n\tfield:__u16 dport;\toffset:66;\tsize:2;\tsigned:0;\n\tfield:__u16 family;\toffset:68;\tsize:2;\tsigned:0;\n\tfield:__u32 mark;\toffset:72;\tsize:4;\tsigned:0;\n\tfield:__u16 data_len;\toffset:76;\tsize:2;\tsigned:0;\n\tfield:__u32 snd_nxt;\toffset:80;\tsize:4;\tsigned:0;\n\tfield:__u32 snd_una;\toffset:84;\tsize:4;\tsigned:0;\n\tfield:__u32 snd_cwnd;\toffset:88;\tsize:4;\tsigned:0;\n\tfield:__u32 ssthresh;\toffset:92;\tsize:4;\tsigned:0;\n\tfield:__u32 snd_wnd;\toffset:96;\tsize:4;\tsigned:0;\n\tfield:__u32 srtt;\toffset:100;\tsize:4;\tsigned:0;\n\tfield:__u32 rcv_wnd;\toffset:104;\tsize:4;\tsigned:0;\n\tfield:__u64 sock_cookie;\toffset:112;\tsize:8;\tsigned:0;\n\tfield:const void * skbaddr;\toffset:120;\tsize:8;\tsigned:0;\n\tfield:const void * skaddr;\toffset:128;\tsize:8;\tsigned:0;";

    #[test]
    fn the_arrival_program_attaches_only_where_tcp_probe_has_its_layout() {
        arrival_layout_matches(TCP_PROBE_6_18).unwrap();
        // A kernel without `family` before `mark` (fields shifted).
        let shifted = TCP_PROBE_6_18.replace("data_len;\toffset:76;", "data_len;\toffset:72;");
        let e = arrival_layout_matches(&shifted).unwrap_err().to_string();
        assert!(e.contains("data_len is not at offset 76"), "{e}");
        // A kernel whose record has no socket cookie (before Linux 5.6):
        // segments could not be told apart by socket.
        let e = arrival_layout_matches(&TCP_PROBE_6_18.replace("sock_cookie", "other"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("no field sock_cookie"), "{e}");
        let e = arrival_layout_matches("format:\n").unwrap_err().to_string();
        assert!(e.contains("no field daddr"), "{e}");
    }

    #[test]
    fn fork_variant_follows_the_tracepoint_layout() {
        let compact = "\tfield:__data_loc char[] parent_comm;\toffset:8;\tsize:4;\tsigned:0;\n\
                       \tfield:pid_t parent_pid;\toffset:12;\tsize:4;\tsigned:1;\n\
                       \tfield:__data_loc char[] child_comm;\toffset:16;\tsize:4;\tsigned:0;\n\
                       \tfield:pid_t child_pid;\toffset:20;\tsize:4;\tsigned:1;\n";
        let legacy = "\tfield:char parent_comm[16];\toffset:8;\tsize:16;\tsigned:0;\n\
                      \tfield:pid_t parent_pid;\toffset:24;\tsize:4;\tsigned:1;\n\
                      \tfield:char child_comm[16];\toffset:28;\tsize:16;\tsigned:0;\n\
                      \tfield:pid_t child_pid;\toffset:44;\tsize:4;\tsigned:1;\n";
        assert_eq!(child_pid_offset(compact), Some(20));
        assert_eq!(child_pid_offset(legacy), Some(44));
        assert_eq!(child_pid_offset(""), None);
        let fork_programs = |layout: Option<usize>| -> Vec<&str> {
            let k = Kernel {
                data: DataHooks::Tracepoint,
                fork_layout: layout,
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
    }

    #[test]
    fn one_set_of_data_hooks_is_attached_and_the_rest_always() {
        let with = |data| -> Vec<&str> {
            let k = Kernel {
                data,
                fork_layout: Some(20),
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
