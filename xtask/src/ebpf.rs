//! Compiles `agent-ebpf` for `bpfel-unknown-none` with nightly.

use std::{path::PathBuf, process::Command};

use anyhow::Result;

use crate::{
    toolchain::Toolchain,
    util::{root, run},
};

pub fn object_path() -> PathBuf {
    object_path_of("agent-ebpf")
}

fn object_path_of(bin: &str) -> PathBuf {
    root()
        .join("target/bpf/bpfel-unknown-none/release")
        .join(bin)
}

/// The agent's kernel programs.
pub fn build(tc: &Toolchain) -> Result<PathBuf> {
    build_bin(tc, "agent-ebpf")
}

/// The capture benchmark's floor tracer (`agent-ebpf/src/bin/floor.rs`),
/// an object the agent never loads.
pub fn build_floor(tc: &Toolchain) -> Result<PathBuf> {
    build_bin(tc, "floor")
}

/// Clippy on the kernel programs as they are built (nightly, the BPF
/// target), with every warning an error and `undocumented_unsafe_blocks`
/// on: each `unsafe` block in the kernel code says why it is sound.
pub fn clippy(tc: &Toolchain) -> Result<()> {
    let mut cmd = Command::new("cargo");
    cmd.current_dir(root())
        .args([
            "+nightly",
            "clippy",
            "--package",
            "agent-ebpf",
            "--bin",
            "agent-ebpf",
            "--target",
            "bpfel-unknown-none",
            "-Z",
            "build-std=core",
            "--release",
            "--target-dir",
            "target/bpf-clippy",
            "--",
            "-D",
            "warnings",
            "-W",
            "clippy::undocumented_unsafe_blocks",
        ])
        .env("CARGO_ENCODED_RUSTFLAGS", "-Cdebuginfo=2")
        .env_remove("RUSTFLAGS")
        .env_remove("RUSTC")
        .env_remove("RUSTC_WRAPPER")
        .env_remove("CARGO");
    tc.apply(&mut cmd);
    run(&mut cmd)
}

fn build_bin(tc: &Toolchain, bin: &str) -> Result<PathBuf> {
    let mut cmd = Command::new("cargo");
    cmd.current_dir(root())
        .args([
            "+nightly",
            "build",
            "--package",
            "agent-ebpf",
            "--bin",
            bin,
            "--target",
            "bpfel-unknown-none",
            "-Z",
            "build-std=core",
            "--release",
            // Whatever the workspace's release profile says: the programs
            // are linked from one fat-LTO module, as they always were.
            "--config",
            "profile.release.lto=\"fat\"",
            "--config",
            "profile.release.codegen-units=1",
            "--target-dir",
            "target/bpf",
        ])
        // BTF is required: bpf_loop callbacks need BTF func_info.
        .env(
            "CARGO_ENCODED_RUSTFLAGS",
            "-Cdebuginfo=2\x1f-Clink-arg=--btf",
        )
        .env_remove("RUSTFLAGS")
        .env_remove("RUSTC")
        .env_remove("RUSTC_WRAPPER")
        .env_remove("CARGO");
    tc.apply(&mut cmd);
    run(&mut cmd)?;
    Ok(object_path_of(bin))
}
