//! The eBPF toolchain: nightly's `rust-src` (for `-Z build-std=core`) and
//! a `bpf-linker` built against the nightly toolchain's own libLLVM (so the
//! LLVM that compiled the bitcode is the one that links it). Installed into
//! `.tools/` inside the repository when missing or stale; nothing outside
//! the checkout is touched except rustup's nightly components.

use std::{fs, os::unix::fs::symlink, path::PathBuf, process::Command};

use anyhow::{bail, Context, Result};

use crate::util::{output, root, run};

/// The bpf-linker release known to work with this nightly (LLVM 22).
const BPF_LINKER_VERSION: &str = "=0.13.0";

pub struct Toolchain {
    /// Directory holding `bpf-linker`.
    pub bin_dir: PathBuf,
    /// Nightly's lib directory (libLLVM lives there).
    pub llvm_lib_dir: PathBuf,
}

impl Toolchain {
    /// PATH with bpf-linker first, and LD_LIBRARY_PATH with nightly's
    /// libLLVM, for commands that run the linker.
    pub fn apply(&self, cmd: &mut Command) {
        let path = std::env::var("PATH").unwrap_or_default();
        cmd.env("PATH", format!("{}:{path}", self.bin_dir.display()));
        let ld = std::env::var("LD_LIBRARY_PATH").unwrap_or_default();
        cmd.env(
            "LD_LIBRARY_PATH",
            format!("{}:{ld}", self.llvm_lib_dir.display()),
        );
    }
}

pub fn ensure() -> Result<Toolchain> {
    let vv = output(Command::new("rustc").args(["+nightly", "-vV"])).context(
        "the nightly toolchain is needed to build the eBPF programs: install it with \
         `rustup toolchain install nightly`",
    )?;
    let llvm_major = vv
        .lines()
        .find_map(|l| l.strip_prefix("LLVM version: "))
        .and_then(|v| v.split('.').next())
        .context("cannot read nightly's LLVM version from `rustc +nightly -vV`")?
        .to_string();
    let commit = vv
        .lines()
        .find_map(|l| l.strip_prefix("commit-hash: "))
        .unwrap_or("unknown")
        .to_string();

    let sysroot = PathBuf::from(
        output(Command::new("rustc").args(["+nightly", "--print", "sysroot"]))?.trim(),
    );
    if !sysroot.join("lib/rustlib/src/rust/library/core").is_dir() {
        eprintln!("xtask: installing rust-src for nightly");
        run(Command::new("rustup").args([
            "component",
            "add",
            "rust-src",
            "--toolchain",
            "nightly",
        ]))?;
    }

    let lib_dir = sysroot.join("lib");
    let libllvm = fs::read_dir(&lib_dir)?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                n.starts_with("libLLVM.so.") || (n.starts_with("libLLVM-") && n.ends_with(".so"))
            })
        })
        .with_context(|| format!("no libLLVM shared library in {}", lib_dir.display()))?;

    let tools = root().join(".tools");
    let bin_dir = tools.join("bin");
    let linker = bin_dir.join("bpf-linker");
    let stamp = tools.join("bpf-linker.stamp");
    let want = format!("nightly {commit} llvm {llvm_major} bpf-linker {BPF_LINKER_VERSION}");
    let tc = Toolchain {
        bin_dir: bin_dir.clone(),
        llvm_lib_dir: lib_dir.clone(),
    };
    let fresh = linker.exists()
        && fs::read_to_string(&stamp)
            .map(|s| s == want)
            .unwrap_or(false);
    if fresh {
        return Ok(tc);
    }
    eprintln!(
        "xtask: building bpf-linker against nightly's LLVM {llvm_major} (about 2 minutes, once)"
    );
    let prefix = tools.join("llvm");
    fs::create_dir_all(prefix.join("lib"))?;
    let link = prefix.join("lib/libLLVM.so");
    let _ = fs::remove_file(&link);
    symlink(&libllvm, &link).with_context(|| format!("linking {}", libllvm.display()))?;
    let mut cmd = Command::new("cargo");
    cmd.args(["install", "--locked", "--force", "--root"])
        .arg(&tools)
        .args([
            "bpf-linker",
            "--version",
            BPF_LINKER_VERSION,
            "--no-default-features",
            "--features",
        ])
        .arg(format!("llvm-{llvm_major}"))
        .env("LLVM_PREFIX", &prefix);
    if let Err(e) = run(&mut cmd) {
        bail!("building bpf-linker failed: {e:#}");
    }
    fs::write(&stamp, want)?;
    Ok(tc)
}
