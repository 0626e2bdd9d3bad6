//! Coverage-guided fuzzing of the decoder with cargo-fuzz (libFuzzer),
//! installed into `.tools/` on first use. Seeds come from
//! `tests/fuzz/corpus/decode` (the golden transcripts as fuzz inputs, and
//! the HTTP/2 and gRPC captures of `tests/golden/captures` converted to the
//! target's input format: every connection joined mid-way, calls in
//! pieces of at most 255 bytes);
//! libFuzzer writes what it discovers to `target/fuzz-corpus`, never into
//! the repository.

use std::{fs, process::Command};

use anyhow::{Context, Result};

use crate::util::{self, root};

pub fn run(secs: u64) -> Result<()> {
    let tools = root().join(".tools");
    let cargo_fuzz = tools.join("bin/cargo-fuzz");
    if !cargo_fuzz.exists() {
        eprintln!("xtask: installing cargo-fuzz into .tools (once)");
        util::run(
            Command::new("cargo")
                .args(["install", "--locked", "--root"])
                .arg(&tools)
                .args(["cargo-fuzz", "--version", "=0.13.2"]),
        )
        .context("installing cargo-fuzz")?;
    }
    let work = root().join("target/fuzz-corpus/decode");
    fs::create_dir_all(&work)?;
    let seeds = root().join("tests/fuzz/corpus/decode");
    let mut cmd = Command::new("cargo");
    cmd.current_dir(root())
        .env(
            "PATH",
            format!(
                "{}:{}",
                tools.join("bin").display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        )
        .args([
            "+nightly",
            "fuzz",
            "run",
            "--fuzz-dir",
            "tests/fuzz",
            "decode",
        ])
        .arg(&work)
        .arg(&seeds)
        .arg("--")
        .arg(format!("-max_total_time={secs}"))
        .arg(format!(
            "-dict={}",
            root().join("tests/fuzz/decode.dict").display()
        ))
        .arg("-rss_limit_mb=2048")
        .arg("-max_len=65536")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO");
    util::run(&mut cmd).context("the decoder fuzzer found a crash (see tests/fuzz/artifacts)")
}
