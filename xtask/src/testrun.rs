//! `cargo xtask test`: runs the suite so that root tests are never
//! reported as passed when they did not run.
//!
//! Tests that need root (eBPF, end to end, real peers) are `#[ignore]`d
//! with a reason. As root (or under `CI=true`, which must be root) the
//! suite runs with `--include-ignored`; not root, they stay ignored and the
//! summary says how many did not run. Which tests are the root ones comes
//! from `cargo test -- --list --ignored` (per test binary), and the run's
//! own output says which of them ran and passed.
//!
//! It owns the argument plumbing (`cargo test [cargo args] -- [harness
//! args]`) and the counting; it never decides a test's outcome itself.

use std::{
    collections::{BTreeMap, BTreeSet},
    io::{BufRead, BufReader, Write},
    process::{Command, Stdio},
};

use anyhow::{bail, Context, Result};

use crate::{build, ebpf, fuzz, peers, util};

/// Seconds of fuzzing per target in `cargo xtask test` (9 targets).
const FUZZ_SECS_IN_TEST: u64 = 6;

/// `cargo fmt --check` and `cargo clippy -D warnings` over the workspace
/// (the fuzz crate too: it is a workspace of its own), and clippy on the
/// kernel programs as the BPF target builds them.
fn style() -> Result<()> {
    let obj = ebpf::object_path();
    util::run(util::cargo().args(["fmt", "--all", "--check"]))
        .context("the code is not formatted: run `cargo fmt --all`")?;
    util::run(
        util::cargo()
            .args(["fmt", "--all", "--check", "--manifest-path", "tests/fuzz/Cargo.toml"]),
    )
    .context("the fuzz targets are not formatted: run `cargo fmt --all --manifest-path tests/fuzz/Cargo.toml`")?;
    util::run(
        util::cargo()
            .args([
                "clippy",
                "--workspace",
                "--all-targets",
                "--",
                "-D",
                "warnings",
            ])
            .env("TOKENTAP_EBPF_OBJ", &obj),
    )
    .context("clippy found warnings (`cargo clippy --workspace --all-targets -- -D warnings`)")?;
    ebpf::clippy(&crate::toolchain::ensure()?).context(
        "clippy found warnings in the kernel programs (nightly, bpfel-unknown-none, with clippy::undocumented_unsafe_blocks)",
    )
}

pub fn test(args: Vec<String>) -> Result<()> {
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if ci && !root {
        bail!(
            "CI=true but not running as root: the root tests (eBPF capture, end to end, \
             fidelity) cannot run, and CI must not report them as passed. Run it as root \
             (`sudo -E cargo xtask test`)"
        );
    }
    let (cargo_args, harness_args) = split_args(&args);
    if root && selects_peer_tests(&args) {
        peers()?;
    } else if !root {
        eprintln!(
            "xtask: not root: the root tests will be reported as ignored; peers not installed"
        );
    }
    build(crate::Profile::Dev)?;
    if args.is_empty() {
        // The whole suite: the code is formatted and lint-clean too (the
        // guide's `cargo fmt` and `cargo clippy -- -D warnings`).
        style()?;
    }
    if root && selects_container_test(&args) {
        // The container test runs the image exactly as `cargo xtask image`
        // builds it.
        crate::image(CONTAINER_TEST_IMAGE, false, None)?;
    }
    let obj = ebpf::object_path();
    let cargo_test = || {
        let mut cmd = util::cargo();
        cmd.args(["test", "--workspace"]).args(cargo_args);
        cmd.env("TOKENTAP_EBPF_OBJ", &obj);
        cmd
    };

    let mut list = cargo_test();
    list.arg("--")
        .args(harness_args)
        .args(["--list", "--ignored"]);
    let (listed_ok, list_output) = merged(&mut list, false)?;
    if !listed_ok {
        bail!("listing the root tests failed:\n{list_output}");
    }
    let listed = root_tests(&list_output);
    let n_root: usize = listed.values().map(BTreeSet::len).sum();

    // Every test binary runs even when one fails, so the tally covers all.
    let mut run = cargo_test();
    run.arg("--no-fail-fast").arg("--").args(harness_args);
    if root {
        run.arg("--include-ignored");
    }
    let (ok, output) = merged(&mut run, true)?;
    if !ok {
        // A log shown by its head and tail (CI's) loses the middle, where
        // cargo prints why a test failed: say it again last.
        for p in panics(&output) {
            eprintln!("xtask: failed: {p}");
        }
    }
    if root {
        let tally = tally(&listed, &output);
        eprintln!(
            "xtask: root tests: {} ran, {} passed (of {n_root} selected)",
            tally.ran, tally.passed
        );
        if ok && tally.ran != n_root {
            bail!(
                "{} of the {n_root} root tests did not report a result",
                n_root - tally.ran
            );
        }
    } else {
        eprintln!(
            "xtask: root tests: {n_root} not run (need root) — reported as ignored; \
             run `sudo cargo xtask test` to run them"
        );
    }
    if !ok {
        bail!("cargo test failed");
    }
    if args.is_empty() {
        // The capture bench's own build (the reference path behind the
        // `bench-reference` feature): its unit tests, so the code the
        // shipped binary leaves out keeps compiling and keeps its flags.
        // The whole workspace's libraries, so dependencies keep the
        // features the suite built them with (nothing but the agent is
        // rebuilt).
        let mut bench_build = util::cargo();
        bench_build
            .args(["test", "--workspace", "--lib"])
            .args(["--features", "tokentap/bench-reference"])
            .env("TOKENTAP_EBPF_OBJ", &obj);
        util::run(&mut bench_build).context("the bench-reference build's unit tests")?;
        // A short coverage-guided run of every fuzz target is part of the
        // suite (it replays each target's seeds, every past crash among
        // them, first).
        fuzz::run(FUZZ_SECS_IN_TEST, &[])?;
        // The kernels GPU nodes run, under qemu: the focused root tests in
        // each (the host kernel ran the whole suite above).
        if root {
            let started = std::time::Instant::now();
            crate::kernels::matrix(&[], &crate::kernels::test_binaries()?, false, 1)?;
            eprintln!(
                "xtask: kernel matrix passed in {:.0} s",
                started.elapsed().as_secs_f64()
            );
        } else {
            eprintln!("xtask: kernel matrix not run (needs root: qemu and eBPF in the VMs)");
        }
    }
    Ok(())
}

/// `cargo xtask test -- ARGS`: the part for cargo and the part after its
/// own `--`, for the test harness.
fn split_args(args: &[String]) -> (&[String], &[String]) {
    match args.iter().position(|a| a == "--") {
        Some(i) => (&args[..i], &args[i + 1..]),
        None => (args, &[]),
    }
}

/// Must match `TEST_IMAGE` in tests/tests/deploy.rs.
const CONTAINER_TEST_IMAGE: &str = "localhost/tokentap:test";

/// Whether the selection includes the container test (which needs the
/// image built): the whole suite, or a selection naming tests/deploy.rs.
fn selects_container_test(args: &[String]) -> bool {
    args.is_empty() || args.iter().any(|a| a == "deploy")
}

/// Whether a run with `args` may include the tests that need the real
/// peers installed: the whole suite, or a selection naming them.
fn selects_peer_tests(args: &[String]) -> bool {
    // Test binaries that drive the real peers (llama.cpp, the openai SDK,
    // tritonclient's gRPC server and client, Hypercorn, Debian's nginx).
    const PEER_TESTS: [&str; 10] = [
        "fidelity",
        "enginemetrics",
        "grpc",
        "tls",
        "stages",
        "gateway",
        "promptcache",
        "tokenizers",
        "tokens",
        "gguf_vocab",
    ];
    args.is_empty()
        || args
            .iter()
            .any(|a| PEER_TESTS.iter().any(|t| a.contains(t)))
}

/// The test binary a `Running …` line of cargo starts, by its path (the
/// unique part: `unittests src/lib.rs` is printed for several crates).
fn binary_of(line: &str) -> Option<&str> {
    let rest = line.trim_start().strip_prefix("Running ")?;
    let (_, path) = rest.rsplit_once(" (")?;
    path.strip_suffix(')')
}

/// Per test binary, the names `--list --ignored` printed (`NAME: test`).
fn root_tests(list_output: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut current = None;
    for line in list_output.lines() {
        if let Some(b) = binary_of(line) {
            current = Some(b.to_string());
        } else if line.trim_start().starts_with("Doc-tests ") {
            current = None;
        } else if let (Some(b), Some(name)) = (&current, line.strip_suffix(": test")) {
            out.entry(b.clone()).or_default().insert(name.to_string());
        }
    }
    out
}

#[derive(Debug, PartialEq)]
struct Tally {
    ran: usize,
    passed: usize,
}

/// How many of the `listed` root tests have a result line in a run's
/// output (`test NAME ... ok|FAILED`), and how many of those passed.
fn tally(listed: &BTreeMap<String, BTreeSet<String>>, run_output: &str) -> Tally {
    let mut t = Tally { ran: 0, passed: 0 };
    let mut current: Option<&BTreeSet<String>> = None;
    for line in run_output.lines() {
        if let Some(b) = binary_of(line) {
            current = listed.get(b);
            continue;
        }
        if line.trim_start().starts_with("Doc-tests ") {
            current = None;
            continue;
        }
        let Some(root) = current else { continue };
        let Some((name, result)) = line
            .strip_prefix("test ")
            .and_then(|l| l.split_once(" ... "))
        else {
            continue;
        };
        if !root.contains(name) {
            continue;
        }
        match result.trim() {
            "ok" => {
                t.ran += 1;
                t.passed += 1;
            }
            "FAILED" => t.ran += 1,
            _ => {}
        }
    }
    t
}

/// Longest excerpt of one panic message repeated in the digest.
const PANIC_EXCERPT_CHARS: usize = 3000;

/// Each test panic in `output`: its `thread '…' panicked at …` line and
/// the message under it (to the next blank or `note:` line), shortened.
fn panics(output: &str) -> Vec<String> {
    let mut found = vec![];
    let mut lines = output.lines();
    while let Some(line) = lines.next() {
        // `thread 'NAME' panicked at …`, or `thread 'NAME' (TID) panicked
        // at …` (Rust 1.92 on).
        if !(line.starts_with("thread '") && line.contains(" panicked at ")) {
            continue;
        }
        let mut text = line.to_string();
        for l in lines.by_ref() {
            if l.trim().is_empty() || l.starts_with("note: ") || l.starts_with("stack backtrace:") {
                break;
            }
            text.push('\n');
            text.push_str(l);
        }
        if text.chars().count() > PANIC_EXCERPT_CHARS {
            text = text.chars().take(PANIC_EXCERPT_CHARS).collect::<String>() + " […]";
        }
        found.push(text);
    }
    found
}

/// Runs `cmd` with its stdout and stderr merged in one pipe (so cargo's
/// `Running …` lines stay in order with the harness output), echoing
/// everything to stderr when `echo`; returns whether it succeeded and what
/// it printed.
fn merged(cmd: &mut Command, echo: bool) -> Result<(bool, String)> {
    eprintln!("xtask: running {cmd:?}");
    let (reader, writer) = std::io::pipe().context("pipe")?;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(writer.try_clone().context("pipe")?)
        .stderr(writer)
        .spawn()
        .with_context(|| format!("cannot start {:?}", cmd.get_program()))?;
    // `cmd` still holds the write end: replace it, or EOF never arrives.
    cmd.stdout(Stdio::null()).stderr(Stdio::null());
    let mut all = String::new();
    let mut err = std::io::stderr();
    for line in BufReader::new(reader).lines() {
        let line = line.context("reading cargo test output")?;
        if echo {
            let _ = writeln!(err, "{line}");
        }
        all.push_str(&line);
        all.push('\n');
    }
    let st = child.wait().context("waiting for cargo test")?;
    Ok((st.success(), all))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIST: &str = "\
     Running unittests src/lib.rs (target/debug/deps/tokentap-1111)
0 tests, 0 benchmarks
     Running tests/live.rs (target/debug/deps/live-2222)
two_hundred: test
discovery: test

2 tests, 0 benchmarks
     Running unittests src/lib.rs (target/debug/deps/tokentap_tests-3333)
0 tests, 0 benchmarks
     Running tests/otlp.rs (target/debug/deps/otlp-4444)
export: test
";

    #[test]
    fn root_tests_are_listed_per_binary() {
        let l = root_tests(LIST);
        assert_eq!(l.len(), 2);
        assert_eq!(l["target/debug/deps/live-2222"].len(), 2);
        assert!(l["target/debug/deps/otlp-4444"].contains("export"));
    }

    #[test]
    fn only_root_tests_with_a_result_count_and_a_same_named_plain_test_does_not() {
        let run = "\
     Running tests/live.rs (target/debug/deps/live-2222)
running 3 tests
test plain ... ok
test two_hundred ... ok
test discovery ... FAILED
     Running unittests src/lib.rs (target/debug/deps/tokentap-1111)
test export ... ok
     Running tests/otlp.rs (target/debug/deps/otlp-4444)
test export ... ignored, needs root: loads eBPF
";
        assert_eq!(tally(&root_tests(LIST), run), Tally { ran: 2, passed: 1 });
    }

    #[test]
    fn a_failed_tests_panic_message_is_found_for_the_digest() {
        let out = "\
test a ... FAILED

failures:

---- a stdout ----
table row
thread 'a' panicked at tests/tests/a.rs:10:5:
assertion `left == right` failed: the reason
  left: 1
 right: 2
note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace

thread 'b' (29072) panicked at tests/tests/b.rs:3:1:
TTFT vs client p99 3.184 ms
stack backtrace:
   0: __rustc::rust_begin_unwind
";
        let p = panics(out);
        assert_eq!(p.len(), 2);
        assert_eq!(
            p[0],
            "thread 'a' panicked at tests/tests/a.rs:10:5:\nassertion `left == right` failed: \
             the reason\n  left: 1\n right: 2"
        );
        assert_eq!(
            p[1],
            "thread 'b' (29072) panicked at tests/tests/b.rs:3:1:\nTTFT vs client p99 3.184 ms"
        );
        let long = format!("thread 'c' panicked at x:\n{}\n", "y".repeat(5000));
        assert!(panics(&long)[0].ends_with(" […]"));
    }

    #[test]
    fn harness_args_are_those_after_the_users_own_double_dash() {
        let a: Vec<String> = ["-p", "x", "--", "name", "--nocapture"]
            .map(String::from)
            .to_vec();
        let (c, h) = split_args(&a);
        assert_eq!(c, ["-p", "x"]);
        assert_eq!(h, ["name", "--nocapture"]);
        let b: Vec<String> = ["--test", "live"].map(String::from).to_vec();
        assert_eq!(split_args(&b), (&b[..], &[][..]));
    }

    #[test]
    fn peers_are_needed_for_the_whole_suite_or_a_selection_of_peer_tests() {
        assert!(selects_peer_tests(&[]));
        assert!(selects_peer_tests(&["--test".into(), "fidelity".into()]));
        assert!(!selects_peer_tests(&["--test".into(), "live".into()]));
        assert!(selects_peer_tests(&[
            "--test".into(),
            "enginemetrics".into()
        ]));
    }
}
