//! Embeds the eBPF object that `cargo xtask build` compiled (or the one
//! named by `TOKENTAP_EBPF_OBJ`). Without one the agent still builds (so
//! `cargo check`, clippy and pure unit tests need no nightly toolchain), and
//! says at run time how to get a capture-capable binary.
//!
//! Never embeds a stale object silently: an object that is missing, older
//! than a file under `agent-ebpf/src/`, or built for another record layout
//! than `agent-ebpf/src/lib.rs`'s `ABI_VERSION` is a `cargo:warning`, and a
//! build error when `TOKENTAP_EBPF_OBJ` was set explicitly (as xtask does).
use std::{
    env, fs,
    path::{Path, PathBuf},
    time::SystemTime,
};

/// Must match `agent_ebpf::ABI_SECTION`.
const ABI_SECTION: &str = "tokentap_abi";

fn main() {
    println!("cargo::rustc-check-cfg=cfg(tokentap_has_ebpf)");
    println!("cargo:rerun-if-env-changed=TOKENTAP_EBPF_OBJ");
    let manifest =
        PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let ebpf_src = manifest.join("../agent-ebpf/src");
    println!("cargo:rerun-if-changed={}", ebpf_src.display());
    let default = manifest.join("../target/bpf/bpfel-unknown-none/release/agent-ebpf");
    let explicit = env::var_os("TOKENTAP_EBPF_OBJ").map(PathBuf::from);
    let src = explicit.clone().unwrap_or(default);
    println!("cargo:rerun-if-changed={}", src.display());
    let out =
        PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("tokentap-ebpf.o");

    let bytes = fs::read(&src).unwrap_or_default();
    let problem = if bytes.is_empty() {
        Some(format!(
            "no eBPF object at {}: this tokentap cannot capture (build it with `cargo xtask build`)",
            src.display()
        ))
    } else {
        stale(&src, &bytes, &ebpf_src)
    };
    match (problem, explicit.is_some()) {
        (Some(p), true) => {
            // Leave no object behind that a later build could pick up.
            let _ = fs::write(&out, b"");
            panic!("TOKENTAP_EBPF_OBJ: {p}");
        }
        (Some(p), false) => {
            println!("cargo:warning={p}");
            fs::write(&out, b"").expect("write empty eBPF placeholder");
        }
        (None, _) => {
            fs::write(&out, bytes).expect("write embedded eBPF object");
            println!("cargo:rustc-cfg=tokentap_has_ebpf");
        }
    }
}

/// Why the object at `path` must not be embedded, if it must not.
fn stale(path: &Path, elf: &[u8], ebpf_src: &Path) -> Option<String> {
    let want = source_abi_version(&ebpf_src.join("lib.rs"));
    let found = elf_section(elf, ABI_SECTION)
        .and_then(|d| d.get(..4))
        .and_then(|b| <[u8; 4]>::try_from(b).ok())
        .map(u32::from_le_bytes);
    match (found, want) {
        (Some(f), Some(w)) if f != w => {
            return Some(format!(
                "the eBPF object {} was built for record layout v{f}, agent-ebpf/src/lib.rs says v{w}: \
                 rebuild it with `cargo xtask build`",
                path.display()
            ))
        }
        (None, _) => {
            return Some(format!(
                "the eBPF object {} carries no record-layout version: rebuild it with `cargo xtask build`",
                path.display()
            ))
        }
        _ => {}
    }
    let built = fs::metadata(path).and_then(|m| m.modified()).ok()?;
    let newest = newest_mtime(ebpf_src)?;
    (newest > built).then(|| {
        format!(
            "the eBPF object {} is older than agent-ebpf/src: rebuild it with `cargo xtask build`",
            path.display()
        )
    })
}

/// `N` in `pub const ABI_VERSION: u32 = N;`.
fn source_abi_version(lib_rs: &Path) -> Option<u32> {
    let text = fs::read_to_string(lib_rs).ok()?;
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with("pub const ABI_VERSION: u32"))?;
    line.split('=')
        .nth(1)?
        .trim()
        .trim_end_matches(';')
        .trim()
        .parse()
        .ok()
}

/// Latest modification time of the files under `dir`.
fn newest_mtime(dir: &Path) -> Option<SystemTime> {
    let mut newest: Option<SystemTime> = None;
    for ent in fs::read_dir(dir).ok()?.flatten() {
        let path = ent.path();
        let t = if path.is_dir() {
            newest_mtime(&path)
        } else {
            ent.metadata().and_then(|m| m.modified()).ok()
        };
        newest = newest.max(t);
    }
    newest
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<usize> {
    usize::try_from(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?)).ok()
}

/// The contents of section `name` of a 64-bit little-endian ELF file (the
/// eBPF object), read by hand so the build script needs no dependency.
fn elf_section<'a>(elf: &'a [u8], name: &str) -> Option<&'a [u8]> {
    if elf.get(..4)? != b"\x7fELF" || *elf.get(4)? != 2 || *elf.get(5)? != 1 {
        return None;
    }
    let shoff = u64_at(elf, 0x28)?;
    let shentsize = u16_at(elf, 0x3a)? as usize;
    let shnum = u16_at(elf, 0x3c)? as usize;
    let shstrndx = u16_at(elf, 0x3e)? as usize;
    let header = |i: usize| -> Option<(u32, usize, usize)> {
        let h = shoff.checked_add(i.checked_mul(shentsize)?)?;
        Some((
            u32_at(elf, h)?,
            u64_at(elf, h + 0x18)?,
            u64_at(elf, h + 0x20)?,
        ))
    };
    let (_, stroff, strsize) = header(shstrndx)?;
    let strtab = elf.get(stroff..stroff.checked_add(strsize)?)?;
    (0..shnum).find_map(|i| {
        let (name_off, off, size) = header(i)?;
        let rest = strtab.get(name_off as usize..)?;
        let end = rest.iter().position(|&c| c == 0)?;
        if &rest[..end] != name.as_bytes() {
            return None;
        }
        elf.get(off..off.checked_add(size)?)
    })
}
