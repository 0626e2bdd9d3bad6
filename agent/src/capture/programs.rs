//! The eBPF object: which object (embedded, or `TOKENTAP_EBPF_OBJECT` for
//! tests), the kernel/user ABI check, tracefs, loading. Where each of its
//! programs attaches is the probe table (`probes.rs`).
//!
//! Owns: the ABI contract check and loading. Must not: touch maps beyond
//! sizing them at load (that is `Capture`'s job), or load an object whose
//! record layout differs from `agent_ebpf::ABI_VERSION`.

use std::path::{Path, PathBuf};

use agent_ebpf::{ABI_SECTION, ABI_VERSION};
use anyhow::{bail, Context, Result};
use aya::{Ebpf, EbpfLoader};
use object::{Object, ObjectSection};

/// The compiled kernel programs (empty when built without `cargo xtask`).
pub(super) static EBPF_OBJECT: &[u8] =
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
pub(super) fn tracefs_events() -> PathBuf {
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
pub(super) fn object_bytes() -> Result<Aligned> {
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
pub(super) struct Aligned {
    words: Vec<u64>,
    len: usize,
}

impl Aligned {
    pub(super) fn copy(bytes: &[u8]) -> Self {
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

    pub(super) fn bytes(&self) -> &[u8] {
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
}
