//! Coverage-guided fuzzing (cargo-fuzz, libFuzzer) of every decoder
//! entry: the request decoder on joined connections (`decode`), HTTP/1.1
//! and HTTP/2 from a connection's start (`http1`, `http2`), the memory
//! budget's shedding (`shed`), HPACK, gRPC messages, SSE/NDJSON streams,
//! capture-file lines and the config file — `tests/fuzz/fuzz_targets`.
//!
//! cargo-fuzz is installed into `.tools/` on first use. The targets are
//! built once (release, debug assertions on: an overflow is a crash;
//! no sanitizer: the agent's code is safe Rust, and a sanitizer would
//! cost two thirds of the executions), then each runs for its share of
//! the time, one after the other (two cores: one fuzzer at a time).
//! Seeds are in the repository (`tests/fuzz/corpus/SEEDS`: the golden
//! transcripts and captures as inputs, for the decoder targets, and small
//! hand-made ones for the rest); what libFuzzer discovers goes to
//! `target/fuzz-corpus/TARGET`, never into the repository. A crash leaves
//! its input in `tests/fuzz/artifacts/TARGET/` and fails the run: copy it
//! into the target's seeds and fix the decoder (it is then a regression
//! test every run replays).
//!
//! Each run prints one table — executions, coverage (libFuzzer's `cov`
//! edges and `ft` features), corpus size and crashes per target — and
//! adds its executions to `target/fuzz-total.json`, so the cumulative
//! count across runs on a machine is known.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{bail, Context, Result};

use crate::util::{self, root};

/// Each target, the seed folder under `tests/fuzz/corpus` and whether the
/// HTTP dictionary helps it.
pub const TARGETS: [(&str, &str, bool); 9] = [
    ("decode", "decode", true),
    ("http1", "decode", true),
    ("http2", "decode", true),
    ("shed", "decode", true),
    ("hpack", "hpack", false),
    ("grpc", "grpc", false),
    ("stream", "stream", true),
    ("capfile", "capfile", false),
    ("config", "config", false),
];

/// One target's run, from libFuzzer's final statistics.
#[derive(Debug, Default)]
struct Outcome {
    runs: u64,
    cov: u64,
    ft: u64,
    corpus: u64,
    crashed: bool,
    secs: f64,
}

/// Runs `only` (default all) targets for `secs` seconds each.
pub fn run(secs: u64, only: &[String]) -> Result<()> {
    for t in only {
        if !TARGETS.iter().any(|(n, _, _)| n == t) {
            bail!(
                "unknown fuzz target {t:?}: the targets are {}",
                TARGETS.map(|t| t.0).join(", ")
            );
        }
    }
    let targets: Vec<_> = TARGETS
        .iter()
        .filter(|(n, _, _)| only.is_empty() || only.iter().any(|o| o == n))
        .collect();
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
    let path = format!(
        "{}:{}",
        tools.join("bin").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    // One build of every target (they share the agent's library), or of
    // the ones asked for.
    let mut build = Command::new("cargo");
    build
        .current_dir(root())
        .env("PATH", &path)
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO")
        .args([
            "+nightly",
            "fuzz",
            "build",
            "--fuzz-dir",
            "tests/fuzz",
            "--sanitizer",
            "none",
            "--debug-assertions",
        ]);
    if only.len() == 1 {
        build.arg(&only[0]);
    }
    util::run(&mut build).context("building the fuzz targets")?;
    let bins = root().join("tests/fuzz/target/x86_64-unknown-linux-gnu/release");
    let mut rows = Vec::new();
    for (name, seeds, dict) in &targets {
        let o = one_target(&bins.join(name), name, seeds, *dict, secs)?;
        rows.push((name.to_string(), o));
    }
    let total: u64 = rows.iter().map(|(_, o)| o.runs).sum();
    let cumulative = add_to_total(&rows)?;
    let mut table = String::from(
        "| target | executions | seconds | exec/s | cov | ft | corpus | crashes |\n|---|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for (n, o) in &rows {
        table += &format!(
            "| {n} | {} | {:.0} | {:.0} | {} | {} | {} | {} |\n",
            o.runs,
            o.secs,
            o.runs as f64 / o.secs.max(0.001),
            o.cov,
            o.ft,
            o.corpus,
            u8::from(o.crashed)
        );
    }
    table += &format!(
        "\n{total} executions in this run; {cumulative} in all runs recorded in target/fuzz-total.json\n"
    );
    println!("{table}");
    let _ = fs::write(root().join("target/fuzz.md"), &table);
    let crashed: Vec<_> = rows
        .iter()
        .filter(|(_, o)| o.crashed)
        .map(|(n, _)| n.as_str())
        .collect();
    if !crashed.is_empty() {
        bail!(
            "fuzzing found a crash in {} (inputs in tests/fuzz/artifacts/TARGET/; add each to the target's seeds and fix it)",
            crashed.join(", ")
        );
    }
    Ok(())
}

fn one_target(bin: &Path, name: &str, seeds: &str, dict: bool, secs: u64) -> Result<Outcome> {
    let work = root().join("target/fuzz-corpus").join(name);
    let artifacts = root().join("tests/fuzz/artifacts").join(name);
    fs::create_dir_all(&work)?;
    fs::create_dir_all(&artifacts)?;
    let mut cmd = Command::new(bin);
    cmd.current_dir(root())
        .arg(&work)
        .arg(root().join("tests/fuzz/corpus").join(seeds))
        .arg(format!("-max_total_time={secs}"))
        .arg(format!("-artifact_prefix={}/", artifacts.display()))
        .args([
            "-print_final_stats=1",
            "-rss_limit_mb=2048",
            "-max_len=65536",
            "-timeout=10",
        ]);
    if dict {
        cmd.arg(format!(
            "-dict={}",
            root().join("tests/fuzz/decode.dict").display()
        ));
    }
    eprintln!("xtask: fuzzing {name} for {secs} s");
    let start = Instant::now();
    let out = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .with_context(|| format!("cannot start {}", bin.display()))?;
    let log = String::from_utf8_lossy(&out.stderr);
    let mut o = parse(&log);
    o.secs = start.elapsed().as_secs_f64();
    o.crashed = !out.status.success();
    if o.crashed {
        // The fuzzer's own report: what crashed, and where the input is.
        let tail: Vec<&str> = log.lines().rev().take(40).collect();
        for l in tail.iter().rev() {
            eprintln!("{name}: {l}");
        }
    }
    Ok(o)
}

/// Reads libFuzzer's last status line (`#N … cov: C ft: F corp: K/…`)
/// and its final statistics (`stat::number_of_executed_units: N`).
fn parse(log: &str) -> Outcome {
    let mut o = Outcome::default();
    let after = |l: &str, key: &str| -> Option<u64> {
        let rest = l.split(key).nth(1)?;
        let n: String = rest
            .trim_start()
            .chars()
            .take_while(|c| c.is_ascii_digit())
            .collect();
        n.parse().ok()
    };
    for l in log.lines() {
        if l.starts_with('#') && l.contains("cov: ") {
            o.cov = after(l, "cov:").unwrap_or(o.cov);
            o.ft = after(l, "ft:").unwrap_or(o.ft);
            o.corpus = after(l, "corp:").unwrap_or(o.corpus);
            o.runs = after(l, "#").unwrap_or(o.runs);
        }
        if let Some(n) = after(l, "stat::number_of_executed_units:") {
            o.runs = n;
        }
    }
    o
}

/// Adds this run's executions per target to `target/fuzz-total.json`;
/// returns the total over every run recorded there.
fn add_to_total(rows: &[(String, Outcome)]) -> Result<u64> {
    let path: PathBuf = root().join("target/fuzz-total.json");
    let mut totals: serde_json::Map<String, serde_json::Value> = fs::read(&path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    for (n, o) in rows {
        let had = totals.get(n).and_then(|v| v.as_u64()).unwrap_or(0);
        totals.insert(n.clone(), (had + o.runs).into());
    }
    fs::create_dir_all(root().join("target"))?;
    fs::write(&path, serde_json::to_vec_pretty(&totals)?)?;
    Ok(totals.values().filter_map(|v| v.as_u64()).sum())
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn libfuzzers_last_status_and_final_stats_are_read() {
        let log = "#2\tINITED cov: 10 ft: 11 corp: 1/1b exec/s: 0 rss: 30Mb\n\
                   #524288\tpulse  cov: 2301 ft: 9120 corp: 812/96Kb lim: 4096 exec/s: 17476 rss: 412Mb\n\
                   #600000\tDONE   cov: 2310 ft: 9188 corp: 820/97Kb lim: 4096 exec/s: 17000 rss: 420Mb\n\
                   Done 600000 runs in 35 second(s)\n\
                   stat::number_of_executed_units: 600123\n\
                   stat::peak_rss_mb:              420\n";
        let o = parse(log);
        assert_eq!((o.runs, o.cov, o.ft, o.corpus), (600_123, 2310, 9188, 820));
    }
}
