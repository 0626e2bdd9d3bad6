//! The eBPF object and its programs: which object (embedded, or
//! `TOKENTAP_EBPF_OBJECT` for tests), the kernel/user ABI check, tracefs,
//! loading, and where each program attaches (syscall and sched
//! tracepoints today; another attach kind, e.g. uprobes, goes in the same
//! table).
//!
//! Owns: the program table and the ABI contract check. Must not: touch
//! maps beyond sizing them at load (that is `Capture`'s job), or load an
//! object whose record layout differs from `agent_ebpf::ABI_VERSION`.

use std::path::{Path, PathBuf};

use agent_ebpf::{ABI_SECTION, ABI_VERSION};
use anyhow::{bail, Context, Result};
use aya::{
    programs::{BtfTracePoint, TracePoint},
    Btf, Ebpf, EbpfLoader,
};

use super::DataHooks;
use object::{Object, ObjectSection};

/// The compiled kernel programs (empty when built without `cargo xtask`).
static EBPF_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/tokentap-ebpf.o"));

/// Environment variable naming an eBPF object file to load instead of the
/// embedded one (for tests and for trying a rebuilt object).
pub const OBJECT_ENV: &str = "TOKENTAP_EBPF_OBJECT";

/// Where tracepoints are attached from.
pub const TRACEFS: &str = "/sys/kernel/tracing";

/// Mounts tracefs at /sys/kernel/tracing when it is missing.
pub fn ensure_tracefs() -> Result<()> {
    let events = Path::new(TRACEFS).join("events");
    if events.is_dir() || Path::new("/sys/kernel/debug/tracing/events").is_dir() {
        return Ok(());
    }
    // Mounted but closed to this user (tracefs is mode 0700, root's):
    // mounting again would not help, and "not mounted" would mislead.
    if let Err(e) = std::fs::metadata(&events) {
        if e.kind() == std::io::ErrorKind::PermissionDenied {
            bail!(
                "cannot read tracefs at {TRACEFS} (permission denied): capturing needs {}",
                super::PRIVILEGES
            );
        }
    }
    let src = c"tracefs";
    let dst = c"/sys/kernel/tracing";
    // SAFETY: valid NUL-terminated strings; no data argument.
    let rc = unsafe {
        libc::mount(
            src.as_ptr(),
            dst.as_ptr(),
            src.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        let err = std::io::Error::last_os_error();
        bail!(
            "tracefs is not mounted and mounting it failed ({err}).\n\
             Mount it first:  mount -t tracefs tracefs {TRACEFS}\n\
             (or run the agent as root / with CAP_SYS_ADMIN so it can mount it itself)"
        );
    }
    log::info!("mounted tracefs at {TRACEFS}");
    Ok(())
}

/// The tracefs `events` directory in use.
fn tracefs_events() -> PathBuf {
    let main = Path::new(TRACEFS).join("events");
    if main.is_dir() {
        main
    } else {
        PathBuf::from("/sys/kernel/debug/tracing/events")
    }
}

fn raise_memlock() {
    let lim = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: plain struct argument. Failure only matters on old kernels
    // that charge maps to RLIMIT_MEMLOCK; loading then reports it.
    unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim) };
}

/// The record-layout version an eBPF object was built for (its
/// `tokentap_abi` section, a little-endian u32).
pub fn object_abi_version(elf: &[u8]) -> Result<u32> {
    let file = object::File::parse(elf).context("the eBPF object is not a valid ELF file")?;
    let Some(section) = file.section_by_name(ABI_SECTION) else {
        bail!(
            "the eBPF object has no `{ABI_SECTION}` section (built before the record layout \
             was versioned in the object?), this agent expects v{ABI_VERSION}: rebuild with \
             `cargo xtask build`"
        );
    };
    let data = section.data().context("reading the ABI section")?;
    let Some(bytes) = data.get(..4).and_then(|b| <[u8; 4]>::try_from(b).ok()) else {
        bail!(
            "the eBPF object's `{ABI_SECTION}` section is {} bytes, not 4",
            data.len()
        );
    };
    Ok(u32::from_le_bytes(bytes))
}

/// Refuses an object built for another record layout.
pub fn check_abi(elf: &[u8]) -> Result<()> {
    let found = object_abi_version(elf)?;
    if found != ABI_VERSION {
        bail!(
            "eBPF object built for record layout v{found}, this agent expects v{ABI_VERSION}: \
             rebuild with `cargo xtask build`"
        );
    }
    Ok(())
}

/// The object bytes: from `TOKENTAP_EBPF_OBJECT` when set, else the
/// embedded ones.
fn object_bytes() -> Result<Aligned> {
    if let Some(path) = std::env::var_os(OBJECT_ENV) {
        let path = PathBuf::from(path);
        let bytes = std::fs::read(&path)
            .with_context(|| format!("reading {OBJECT_ENV}={}", path.display()))?;
        log::info!("loading the eBPF object from {}", path.display());
        return Ok(Aligned::copy(&bytes));
    }
    if EBPF_OBJECT.is_empty() {
        bail!(
            "this tokentap binary was built without its eBPF programs.\n\
             Build it with `cargo xtask build` (or run it with `cargo xtask run -- …`)."
        );
    }
    Ok(Aligned::copy(EBPF_OBJECT))
}

/// Bytes at an 8-byte-aligned address (the ELF parser reads structs in
/// place and refuses misaligned data).
struct Aligned {
    words: Vec<u64>,
    len: usize,
}

impl Aligned {
    fn copy(bytes: &[u8]) -> Self {
        let mut words = vec![0u64; bytes.len().div_ceil(8)];
        for (w, chunk) in words.iter_mut().zip(bytes.chunks(8)) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            *w = u64::from_ne_bytes(b);
        }
        Self {
            words,
            len: bytes.len(),
        }
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: `words` holds at least `len` initialised bytes; u8 has
        // no alignment requirement.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr().cast::<u8>(), self.len) }
    }
}

/// Checks the object's ABI version, mounts tracefs if needed, loads it.
pub(super) fn load_object(ring_bytes: u32, max_conns: u32) -> Result<Ebpf> {
    let obj = object_bytes()?;
    let obj = obj.bytes();
    check_abi(obj)?;
    ensure_tracefs()?;
    raise_memlock();
    EbpfLoader::new()
        .map_max_entries("EVENTS", ring_bytes)
        .map_max_entries("CONNS", max_conns)
        .load(obj)
        .map_err(|e| anyhow::anyhow!(e))
        .context(
            "loading the eBPF object failed: tokentap needs root \
             (or CAP_BPF + CAP_PERFMON) and Linux 5.17+ (ring buffers, bpf_loop)",
        )
}

/// Layout of `sched_process_fork`'s record on this kernel: which program
/// variant reads `child_pid` at the right offset.
fn fork_program() -> Option<&'static str> {
    let format = tracefs_events().join("sched/sched_process_fork/format");
    let text = std::fs::read_to_string(&format).ok()?;
    fork_program_for(&text)
}

/// `fork_compact` (child_pid at 20) or `fork_legacy` (at 44) for a
/// `sched_process_fork` format file; None for a layout we do not know.
pub fn fork_program_for(format: &str) -> Option<&'static str> {
    let line = format
        .lines()
        .find(|l| l.contains(" child_pid;") || l.contains("\tchild_pid;"))?;
    let offset: usize = line
        .split("offset:")
        .nth(1)?
        .split(';')
        .next()?
        .trim()
        .parse()
        .ok()?;
    match offset {
        20 => Some("fork_compact"),
        44 => Some("fork_legacy"),
        _ => None,
    }
}

/// Where the agent's programs attach: (category, tracepoint), or None for
/// programs it does not attach (the benchmark's `floor_*`, the fork
/// variant this kernel's layout does not match).
pub(super) fn agent_attach_point(name: &str, fork: Option<&str>) -> Option<(&'static str, String)> {
    if name.starts_with("sys_enter_") || name.starts_with("sys_exit_") {
        Some(("syscalls", name.to_string()))
    } else if name.starts_with("sched_") {
        Some(("sched", name.to_string()))
    } else if name.starts_with("fork_") && fork == Some(name) {
        Some(("sched", "sched_process_fork".to_string()))
    } else {
        // `tcp_probe` too: attach_arrival attaches it, when wanted and
        // possible.
        None
    }
}

/// Loads and attaches every program `place` gives an attach point.
fn attach_programs(
    ebpf: &mut Ebpf,
    place: impl Fn(&str) -> Option<(&'static str, String)>,
) -> Result<()> {
    let names: Vec<String> = ebpf.programs().map(|(n, _)| n.to_string()).collect();
    for name in &names {
        let Some((category, tp)) = place(name) else {
            continue;
        };
        let prog: &mut TracePoint = ebpf
            .program_mut(name)
            .context("program vanished")?
            .try_into()?;
        prog.load().map_err(|e| load_failure(name, e))?;
        prog.attach(category, &tp)
            .with_context(|| format!("attaching {name} to {category}/{tp}"))?;
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

/// The data syscalls' perf tracepoint programs (`data.rs`), which the BTF
/// program replaces when it is attached.
pub fn is_data_tracepoint_program(name: &str) -> bool {
    const DATA: [&str; 8] = [
        "read", "write", "readv", "writev", "recvfrom", "sendto", "recvmsg", "sendmsg",
    ];
    name.strip_prefix("sys_enter_")
        .or_else(|| name.strip_prefix("sys_exit_"))
        .is_some_and(|call| DATA.contains(&call))
}

/// The BTF tracepoint program for socket data (`btf.rs`) on the raw
/// `sys_exit` tracepoint.
pub const BTF_DATA_PROGRAM: &str = "data_sys_exit";

/// Loads and attaches the BTF data program; an error says why the kernel
/// (or this build) does not allow it.
fn attach_btf_data(ebpf: &mut Ebpf) -> Result<()> {
    if !cfg!(target_arch = "x86_64") {
        bail!("the BTF data program reads x86_64 registers; this is another architecture");
    }
    let btf = Btf::from_sys_fs().map_err(|e| anyhow::anyhow!(e)).context(
        "no kernel BTF (/sys/kernel/btf/vmlinux; a kernel built with CONFIG_DEBUG_INFO_BTF has it)",
    )?;
    let prog: &mut BtfTracePoint = ebpf
        .program_mut(BTF_DATA_PROGRAM)
        .context("the eBPF object has no BTF data program (rebuild with `cargo xtask build`)")?
        .try_into()?;
    prog.load("sys_exit", &btf)
        .map_err(|e| load_failure(BTF_DATA_PROGRAM, e))?;
    prog.attach()
        .context("attaching the BTF data program to the raw sys_exit tracepoint")?;
    Ok(())
}

/// Attaches every program of the agent. Without a known
/// `sched_process_fork` layout, children of targets are not followed in
/// the kernel (a warning says so); everything else works.
///
/// Socket data is hooked as `hooks` asks; the result says which hooks are
/// in use (`Btf` or `Tracepoint`). `Auto` falls back to the syscall
/// tracepoints when the BTF program is refused, and says why once.
pub(super) fn attach_agent(ebpf: &mut Ebpf, hooks: DataHooks) -> Result<DataHooks> {
    let used = match hooks {
        DataHooks::Tracepoint => DataHooks::Tracepoint,
        DataHooks::Btf => {
            attach_btf_data(ebpf).context("--data-hooks btf")?;
            DataHooks::Btf
        }
        DataHooks::Auto => match attach_btf_data(ebpf) {
            Ok(()) => DataHooks::Btf,
            Err(e) => {
                eprintln!(
                    "tokentap: socket data through syscall tracepoints (the faster BTF tracepoint is not available: {e:#})"
                );
                DataHooks::Tracepoint
            }
        },
    };
    let fork = fork_program();
    if fork.is_none() {
        log::warn!(
            "sched_process_fork has a record layout tokentap does not know: \
             child processes of targets are not followed"
        );
    }
    let events = tracefs_events();
    attach_programs(ebpf, |name| {
        if used == DataHooks::Btf && is_data_tracepoint_program(name) {
            return None;
        }
        let (category, tp) = agent_attach_point(name, fork)?;
        // fork and vfork are not syscalls on every architecture (arm64
        // has only clone/clone3); elsewhere a missing tracepoint is an
        // error worth reporting.
        if OPTIONAL_TRACEPOINTS.contains(&tp.as_str()) && !events.join(category).join(&tp).is_dir()
        {
            log::debug!("{category}/{tp} does not exist here; {name} not attached");
            return None;
        }
        Some((category, tp))
    })?;
    Ok(used)
}

/// Attaches the arrival program to `tcp:tcp_probe` when the tracepoint's
/// record has the layout it reads (`agent_ebpf::arrival_tp`); an error
/// says why not (the agent then runs without arrival times).
pub(super) fn attach_arrival(ebpf: &mut Ebpf) -> Result<()> {
    let format = tracefs_events().join("tcp/tcp_probe/format");
    let text = std::fs::read_to_string(&format)
        .with_context(|| format!("no tcp:tcp_probe tracepoint ({})", format.display()))?;
    arrival_layout_matches(&text)?;
    attach_programs(ebpf, |name| {
        (name == "tcp_probe").then(|| ("tcp", "tcp_probe".to_string()))
    })
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
        let num = |key: &str| -> Option<usize> {
            line.split(key)
                .nth(1)?
                .split(';')
                .next()?
                .trim()
                .parse()
                .ok()
        };
        if num("offset:") != Some(offset) || num("size:") != Some(size) {
            anyhow::bail!(
                "tcp_probe's {field} is not at offset {offset} (size {size}) on this kernel: {}",
                line.trim()
            );
        }
    }
    Ok(())
}

/// Tracepoints some architectures lack.
const OPTIONAL_TRACEPOINTS: [&str; 2] = ["sys_enter_fork", "sys_enter_vfork"];

/// Attaches only the benchmark's reference programs (one map lookup on
/// write enter/exit). Keep the returned object alive while measuring.
pub fn attach_floor() -> Result<Ebpf> {
    let mut ebpf = load_object(4096, 1024)?;
    attach_programs(&mut ebpf, |name| {
        name.strip_prefix("floor_")
            .map(|tp| ("syscalls", tp.to_string()))
    })?;
    Ok(ebpf)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal ELF64 little-endian relocatable with one section named
    /// `name` holding `data` (plus the null section and .shstrtab).
    fn elf_with_section(name: &str, data: &[u8]) -> Vec<u8> {
        use object::write::Object as W;
        let mut o = W::new(
            object::BinaryFormat::Elf,
            object::Architecture::Bpf,
            object::Endianness::Little,
        );
        let id = o.add_section(vec![], name.as_bytes().to_vec(), object::SectionKind::Data);
        o.append_section_data(id, data, 4);
        o.write().expect("write ELF")
    }

    #[test]
    fn an_object_of_this_layout_version_passes_the_check() {
        let elf = elf_with_section(ABI_SECTION, &ABI_VERSION.to_le_bytes());
        assert_eq!(
            object_abi_version(Aligned::copy(&elf).bytes()).unwrap(),
            ABI_VERSION
        );
        check_abi(Aligned::copy(&elf).bytes()).unwrap();
    }

    #[test]
    fn an_object_of_another_layout_version_is_refused_with_what_to_do() {
        let elf = elf_with_section(ABI_SECTION, &(ABI_VERSION + 1).to_le_bytes());
        let err = check_abi(Aligned::copy(&elf).bytes())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&format!(
                "built for record layout v{}, this agent expects v{ABI_VERSION}",
                ABI_VERSION + 1
            )) && err.contains("cargo xtask build"),
            "{err}"
        );
    }

    #[test]
    fn an_object_without_a_version_or_not_elf_is_refused() {
        let elf = elf_with_section("other", &[1, 2, 3, 4]);
        assert!(check_abi(Aligned::copy(&elf).bytes()).is_err());
        assert!(check_abi(b"not an ELF file at all").is_err());
        let short = elf_with_section(ABI_SECTION, &[4, 0]);
        assert!(check_abi(Aligned::copy(&short).bytes()).is_err());
    }

    #[test]
    fn the_embedded_object_if_any_carries_this_agents_version() {
        // build.rs embeds either nothing (and says so) or a checked object.
        assert_eq!(EBPF_OBJECT.is_empty(), !cfg!(tokentap_has_ebpf));
        if !EBPF_OBJECT.is_empty() {
            let obj = Aligned::copy(EBPF_OBJECT);
            assert_eq!(object_abi_version(obj.bytes()).unwrap(), ABI_VERSION);
        }
    }

    /// `tcp:tcp_probe`'s fields on Linux 6.18 (this repository's VM).
    const TCP_PROBE_6_18: &str = "\tfield:__u8 saddr[28];\toffset:8;\tsize:28;\tsigned:0;\n\tfield:__u8 daddr[28];\toffset:36;\tsize:28;\tsigned:0;\n\tfield:__u16 sport;\toffset:64;\tsize:2;\tsigned:0;\n\tfield:__u16 dport;\toffset:66;\tsize:2;\tsigned:0;\n\tfield:__u16 family;\toffset:68;\tsize:2;\tsigned:0;\n\tfield:__u32 mark;\toffset:72;\tsize:4;\tsigned:0;\n\tfield:__u16 data_len;\toffset:76;\tsize:2;\tsigned:0;\n\tfield:__u32 snd_nxt;\toffset:80;\tsize:4;\tsigned:0;\n\tfield:__u32 snd_una;\toffset:84;\tsize:4;\tsigned:0;\n\tfield:__u32 snd_cwnd;\toffset:88;\tsize:4;\tsigned:0;\n\tfield:__u32 ssthresh;\toffset:92;\tsize:4;\tsigned:0;\n\tfield:__u32 snd_wnd;\toffset:96;\tsize:4;\tsigned:0;\n\tfield:__u32 srtt;\toffset:100;\tsize:4;\tsigned:0;\n\tfield:__u32 rcv_wnd;\toffset:104;\tsize:4;\tsigned:0;\n\tfield:__u64 sock_cookie;\toffset:112;\tsize:8;\tsigned:0;\n\tfield:const void * skbaddr;\toffset:120;\tsize:8;\tsigned:0;\n\tfield:const void * skaddr;\toffset:128;\tsize:8;\tsigned:0;";

    #[test]
    fn the_arrival_program_attaches_only_where_tcp_probe_has_its_layout() {
        arrival_layout_matches(TCP_PROBE_6_18).unwrap();
        // A kernel without `family` before `mark` (fields shifted).
        let shifted = TCP_PROBE_6_18.replace("data_len;\toffset:76;", "data_len;\toffset:72;");
        let e = arrival_layout_matches(&shifted).unwrap_err().to_string();
        assert!(e.contains("data_len is not at offset 76"), "{e}");
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
        assert_eq!(fork_program_for(compact), Some("fork_compact"));
        assert_eq!(fork_program_for(legacy), Some("fork_legacy"));
        assert_eq!(
            fork_program_for("\tfield:pid_t child_pid;\toffset:36;\tsize:4;"),
            None
        );
        assert_eq!(fork_program_for(""), None);
        assert_eq!(
            agent_attach_point("fork_compact", Some("fork_compact")),
            Some(("sched", "sched_process_fork".to_string()))
        );
        assert_eq!(
            agent_attach_point("fork_legacy", Some("fork_compact")),
            None
        );
        assert_eq!(agent_attach_point("floor_sys_enter_write", None), None);
    }
}
