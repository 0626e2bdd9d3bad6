//! `cargo xtask kernels`: the kernel matrix. Boots the kernels GPU nodes
//! run — Debian's 6.1 (bookworm) and 6.12 (bookworm's LTS line), from
//! Debian's own packages — under qemu, each with a root filesystem built
//! here (an initramfs: busybox, the agent and the suite's own test
//! binaries at their paths on this machine, with their libraries, and
//! what the focused tests drive: iproute2, Python 3 for the TLS engine),
//! and runs a focused set of the root tests inside each: the capture's
//! exactness on both data-hook paths, a live agent against a streaming
//! engine checked against the engine's own clock, discovery of an engine
//! started after the agent, arrival time, HTTP/2, the TLS attach path.
//! Prints a table (kernel × data hooks × exits × arrival × TLS × tests)
//! and fails naming the kernel whose test failed.
//!
//! Software emulation (no KVM on these machines), one vCPU: a kernel boots
//! in ~3 s and the focused set takes about a minute and a half; the tests'
//! bounds are orderings of clocks (the engine's, the agent's, the
//! client's), which emulation slows but does not reorder.
//!
//! Owns: fetching the kernels (`apt-get download`), the root filesystem,
//! qemu, the table. Must not: decide a test's outcome (the test binary's
//! exit status inside the VM does).

use std::{
    collections::BTreeSet,
    io::{BufRead, BufReader, Read, Write},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use crate::util;

/// A kernel of the matrix: its label and the Debian meta-package whose
/// dependency names the newest image of that line.
struct KernelLine {
    label: &'static str,
    meta: &'static str,
}

const KERNELS: [KernelLine; 2] = [
    KernelLine {
        label: "6.1",
        meta: "linux-image-cloud-amd64",
    },
    KernelLine {
        label: "6.12",
        meta: "linux-image-6.12-cloud-amd64",
    },
];

/// The focused set: (test binary, test name). Each runs alone, as root,
/// with `CI=true` (so a test that cannot load eBPF fails). HTTP/1.1 TTFT
/// against the server's clock is the capture replay test; arrival time is
/// asserted on every stream of the HTTP/2 test (fresh connections).
/// `live::two_hundred_scripted_requests…` and `arrival::ttft_from_arrival…`
/// are left out: on 6.1 and 6.12 a client port reused right after an
/// abort loses the arrival of that connection's requests (t0 = read, 2 to
/// 22 of 200 under qemu), and the arrival test's p99 tolerance against the
/// client's clock is a timing bound emulation does not keep
/// (docs/deploy.md, "Kernels").
pub const FOCUSED: &[(&str, &str)] = &[
    (
        "capture",
        "every_read_and_write_syscall_is_captured_in_order_and_nothing_else",
    ),
    (
        "capture",
        "the_syscall_tracepoint_data_hooks_capture_the_same",
    ),
    (
        "capture",
        "the_fexit_data_hooks_capture_the_same_where_the_kernel_allows_them",
    ),
    (
        "capture",
        "a_captured_sse_stream_replays_into_a_request_record_matching_the_servers_clock",
    ),
    (
        "live",
        "an_engine_started_after_the_agent_is_found_from_its_exec_within_seconds",
    ),
    (
        "http2",
        "streams_multiplexed_on_one_h2c_connection_match_the_engines_clock",
    ),
    (
        "tls",
        "an_engine_terminating_tls_is_decoded_from_its_plaintext",
    ),
    (
        "tls",
        "with_the_daemonsets_capabilities_a_kernel_refusing_uprobes_is_said_once",
    ),
    // Again as an operator of such a node sets it (docs/deploy.md).
    (
        "paranoid=2 tls",
        "with_the_daemonsets_capabilities_a_kernel_refusing_uprobes_is_said_once",
    ),
];

/// The executable of test target `bin`.
fn test_exe<'a>(tests: &'a [(String, PathBuf)], bin: &str) -> Result<&'a PathBuf> {
    tests
        .iter()
        .find(|(n, _)| n == bin)
        .map(|(_, p)| p)
        .with_context(|| format!("no test binary {bin} was built"))
}

/// A focused entry's binary and the node setting it runs under
/// (`paranoid=2 BIN`: `kernel.perf_event_paranoid` set to 2 first).
fn entry(bin: &str) -> (Option<&str>, &str) {
    match bin.split_once(' ') {
        Some((setting, b)) => (Some(setting), b),
        None => (None, bin),
    }
}

/// Host programs the focused tests start (besides the suite's binaries).
const HOST_PROGRAMS: &[&str] = &["/usr/bin/ip", "/usr/bin/setpriv", "/usr/bin/python3.11"];

/// Kernel modules the tests need that Debian's cloud kernels build as
/// modules (veth for the tests' network namespaces), in load order.
const MODULES: &[&str] = &["drivers/net/veth.ko"];

/// How many of a failed focused test's last lines the matrix shows.
const TAIL_LINES: usize = 60;

/// How long one kernel's whole run may take.
const VM_TIMEOUT: Duration = Duration::from_secs(1500);

/// One kernel's outcome.
struct Row {
    kernel: String,
    data: String,
    exits: String,
    forks: String,
    arrival: String,
    tls: String,
    tls_base: String,
    tls_base2: String,
    passed: usize,
    failed: Vec<String>,
    secs: f64,
    /// The running kernel, whose tests were the whole suite's.
    suite: bool,
    /// (path, workload) → CPU ns per call of each round.
    costs: Vec<(String, String, f64)>,
    /// Agents of the cost phase that did not stop on SIGINT (killed).
    stuck: Vec<String>,
    /// Data-hook paths this kernel refused in the cost phase.
    refused: Vec<String>,
}

impl Row {
    fn new(kernel: &str) -> Row {
        Row {
            kernel: kernel.to_string(),
            data: "?".into(),
            exits: "?".into(),
            forks: "?".into(),
            arrival: "?".into(),
            tls: "?".into(),
            tls_base: "?".into(),
            tls_base2: "?".into(),
            passed: 0,
            failed: Vec::new(),
            secs: 0.0,
            suite: false,
            costs: Vec::new(),
            stuck: Vec::new(),
            refused: Vec::new(),
        }
    }
}

/// The running kernel's row: its kernel line, and the focused tests run
/// here (or, after the whole suite, those it ran).
fn host_row(tests: &[(String, PathBuf)], run_tests: bool) -> Result<Row> {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")?;
    let mut row = Row::new(&format!("{} (this host)", release.trim()));
    let started = Instant::now();
    let out = Command::new(util::root().join("target/debug/tokentap"))
        .args([
            "run",
            "--port",
            "9",
            "--no-console",
            "--no-gpu",
            "--duration",
            "1",
        ])
        .stdin(Stdio::null())
        .output()
        .context("running the agent for its kernel line")?;
    let text = String::from_utf8_lossy(&out.stderr);
    let mut done = false;
    if let Some(l) = text.lines().find(|l| l.starts_with("tokentap: kernel ")) {
        read_mark(&format!("line {l}"), &mut row, &mut done);
    }
    if !run_tests {
        row.suite = true;
        row.tls = "(whole suite)".into();
        row.tls_base = "(whole suite)".into();
        row.tls_base2 = "(whole suite)".into();
        return Ok(row);
    }
    for (entry_bin, name) in FOCUSED {
        let (setting, bin) = entry(entry_bin);
        let exe = test_exe(tests, bin)?;
        let paranoid = "/proc/sys/kernel/perf_event_paranoid";
        let before = std::fs::read_to_string(paranoid).unwrap_or_default();
        if setting == Some("paranoid=2") {
            std::fs::write(paranoid, "2")?;
        }
        let out = Command::new(exe)
            .args([
                "--exact",
                name,
                "--include-ignored",
                "--test-threads=1",
                "--nocapture",
            ])
            .env("CI", "true")
            .stdin(Stdio::null())
            .output();
        if setting.is_some() {
            std::fs::write(paranoid, before.trim())?;
        }
        let out = out?;
        let text = String::from_utf8_lossy(&out.stderr).into_owned()
            + &String::from_utf8_lossy(&out.stdout);
        for l in text.lines() {
            read_tls_line(l, &mut row);
        }
        let rc = out.status.code().unwrap_or(-1);
        eprintln!("xtask: kernels: host: end {entry_bin}::{name} rc={rc}");
        read_mark(&format!("end {bin}::{name} rc={rc} "), &mut row, &mut done);
    }
    let out = Command::new("sh")
        .arg("-c")
        .arg(cost_script(COST_ROUNDS))
        .stdin(Stdio::null())
        .output()
        .context("the per-syscall cost phase")?;
    for l in String::from_utf8_lossy(&out.stdout).lines() {
        if let Some(rest) = l.find(MARK).map(|i| &l[i + MARK.len()..]) {
            read_mark(rest.trim(), &mut row, &mut done);
        }
    }
    row.secs = started.elapsed().as_secs_f64();
    Ok(row)
}

/// `cargo xtask kernels [LABEL...]`: builds the suite (dev), then runs the
/// matrix on the labelled kernels (default: all).
pub fn run(only: &[String]) -> Result<()> {
    crate::build(crate::Profile::Dev)?;
    let tests = test_binaries()?;
    matrix(only, &tests, true, COST_ROUNDS)
}

/// The matrix over already built test binaries (`cargo xtask test` calls
/// this after the host suite, with `host_tests` false: the running kernel
/// ran every test already, and its row says so).
pub fn matrix(
    only: &[String],
    tests: &[(String, PathBuf)],
    host_tests: bool,
    rounds: usize,
) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the kernel matrix needs root (it installs qemu and runs eBPF tests in the VMs)");
    }
    for l in only {
        if !KERNELS.iter().any(|k| k.label == l) {
            bail!(
                "no kernel {l} in the matrix (known: {})",
                KERNELS.map(|k| k.label).join(", ")
            );
        }
    }
    ensure_tools()?;
    let dir = util::root().join("target/kernels");
    std::fs::create_dir_all(&dir)?;
    let started = Instant::now();
    let rootfs = build_rootfs(&dir, tests, rounds)?;
    eprintln!(
        "xtask: kernels: root filesystem {} ({:.1} MiB) in {:.0} s",
        rootfs.display(),
        std::fs::metadata(&rootfs)?.len() as f64 / 1048576.0,
        started.elapsed().as_secs_f64()
    );
    let mut rows = vec![host_row(tests, host_tests)?];
    for k in KERNELS
        .iter()
        .filter(|k| only.is_empty() || only.iter().any(|l| l == k.label))
    {
        let image = fetch_kernel(&dir, k)?;
        rows.push(boot(&dir, k, &image, &rootfs)?);
    }
    let table = format!(
        "{}\nPer-syscall CPU cost on a process the agent does not target (median of {rounds} rounds; emulated time in the VMs: compare within a row):\n\n{}",
        table(&rows),
        cost_table(&rows)
    );
    println!("{table}");
    std::fs::write(dir.join("matrix.md"), &table)?;
    let failed: Vec<String> = rows
        .iter()
        .filter(|r| !r.failed.is_empty() || (r.passed != FOCUSED.len() && !r.suite))
        .map(|r| {
            format!(
                "kernel {}: {} of {} focused tests passed{}",
                r.kernel,
                r.passed,
                FOCUSED.len(),
                if r.failed.is_empty() {
                    String::new()
                } else {
                    format!("; failed: {}", r.failed.join(", "))
                }
            )
        })
        .collect();
    if !failed.is_empty() {
        bail!(
            "the kernel matrix failed: {} (logs: target/kernels/KERNEL.log)",
            failed.join(" | ")
        );
    }
    Ok(())
}

/// The suite's test executables by target name (`cargo test --no-run`; a
/// no-op build after the suite ran).
pub fn test_binaries() -> Result<Vec<(String, PathBuf)>> {
    let mut cmd = util::cargo();
    cmd.args([
        "test",
        "--workspace",
        "--no-run",
        "--message-format=json-render-diagnostics",
    ])
    .env("TOKENTAP_EBPF_OBJ", crate::ebpf::object_path())
    .stderr(Stdio::inherit());
    let out = util::output(&mut cmd)?;
    let mut found = Vec::new();
    for line in out.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let (Some(exe), Some(name)) = (v["executable"].as_str(), v["target"]["name"].as_str())
        else {
            continue;
        };
        if v["target"]["kind"]
            .as_array()
            .is_some_and(|k| k.iter().any(|x| x == "test"))
        {
            found.push((name.to_string(), PathBuf::from(exe)));
        }
    }
    Ok(found)
}

/// qemu, busybox (static), cpio, from Debian's packages when missing.
fn ensure_tools() -> Result<()> {
    let need: Vec<&str> = [
        ("qemu-system-x86_64", "qemu-system-x86"),
        ("cpio", "cpio"),
        ("xz", "xz-utils"),
    ]
    .iter()
    .filter(|(bin, _)| !on_path(bin))
    .map(|(_, pkg)| *pkg)
    .chain(static_busybox().is_none().then_some("busybox-static"))
    .collect();
    if need.is_empty() {
        return Ok(());
    }
    apt_install(&need)
}

fn on_path(bin: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {bin}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A statically linked busybox (busybox-static's), if installed.
fn static_busybox() -> Option<PathBuf> {
    ["/bin/busybox", "/usr/bin/busybox"]
        .iter()
        .map(PathBuf::from)
        .find(|p| {
            Command::new("ldd").arg(p).output().is_ok_and(|o| {
                let both = [o.stdout, o.stderr].concat();
                String::from_utf8_lossy(&both).contains("not a dynamic")
            })
        })
}

fn apt_install(pkgs: &[&str]) -> Result<()> {
    eprintln!("xtask: kernels: installing {} (Debian)", pkgs.join(" "));
    let install = || {
        Command::new("apt-get")
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(pkgs)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdin(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if install() {
        return Ok(());
    }
    util::run(Command::new("apt-get").args(["update", "-q"]))?;
    if !install() {
        bail!("apt-get install {} failed", pkgs.join(" "));
    }
    Ok(())
}

/// The newest image package of a kernel line (the meta-package's
/// dependency), refreshing apt's lists once if it is unknown.
fn image_package(meta: &str) -> Result<String> {
    let ask = || -> Option<String> {
        let out = Command::new("apt-cache")
            .args(["depends", "--no-recommends", "--no-suggests", meta])
            .output()
            .ok()?;
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.trim().strip_prefix("Depends: "))
            .find(|d| d.starts_with("linux-image-"))
            .map(str::to_string)
    };
    if let Some(p) = ask() {
        return Ok(p);
    }
    util::run(Command::new("apt-get").args(["update", "-q"]))?;
    ask().with_context(|| format!("Debian's archive has no {meta} (apt-cache depends {meta})"))
}

/// A kernel image and the modules the tests need, under
/// `target/kernels/PKG/`; downloaded once per package version.
struct Image {
    package: String,
    vmlinuz: PathBuf,
    modules: Vec<PathBuf>,
}

fn fetch_kernel(dir: &Path, k: &KernelLine) -> Result<Image> {
    let package = image_package(k.meta)?;
    let tree = dir.join(&package);
    if !tree.join("boot").is_dir() {
        let debs = dir.join("debs");
        std::fs::create_dir_all(&debs)?;
        let have = |d: &Path| -> Option<PathBuf> {
            std::fs::read_dir(d)
                .ok()?
                .flatten()
                .map(|e| e.path())
                .find(|p| {
                    p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                        n.starts_with(&format!("{package}_")) && n.ends_with(".deb")
                    })
                })
        };
        if have(&debs).is_none() {
            eprintln!("xtask: kernels: downloading {package} (Debian)");
            util::run(
                Command::new("apt-get")
                    .args(["download", &package])
                    .current_dir(&debs),
            )?;
        }
        let deb =
            have(&debs).with_context(|| format!("apt-get download {package} left no .deb"))?;
        let tmp = dir.join(format!("{package}.partial"));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp)?;
        util::run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&tmp))?;
        std::fs::rename(&tmp, &tree)?;
    }
    let vmlinuz = std::fs::read_dir(tree.join("boot"))?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("vmlinuz-"))
        })
        .with_context(|| format!("{package} has no boot/vmlinuz-*"))?;
    let release = vmlinuz
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("vmlinuz-"))
        .unwrap_or_default()
        .to_string();
    let kernel_dir = tree.join("lib/modules").join(&release).join("kernel");
    let mut modules = Vec::new();
    for m in MODULES {
        let plain = kernel_dir.join(m);
        let xz = kernel_dir.join(format!("{m}.xz"));
        let zst = kernel_dir.join(format!("{m}.zst"));
        if plain.is_file() {
            modules.push(plain);
        } else if xz.is_file() {
            // busybox's insmod takes plain modules: unpacked here.
            let out = tree.join(plain.file_name().unwrap());
            if !out.is_file() {
                let raw = Command::new("xz").arg("-dc").arg(&xz).output()?;
                if !raw.status.success() {
                    bail!("xz -dc {} failed", xz.display());
                }
                std::fs::write(&out, raw.stdout)?;
            }
            modules.push(out);
        } else if zst.is_file() {
            bail!(
                "{} is zstd-compressed; unpacking it is not supported yet",
                zst.display()
            );
        }
        // A module built into the kernel has no file: nothing to load.
    }
    Ok(Image {
        package,
        vmlinuz,
        modules,
    })
}

/// The initramfs: busybox, the focused tests' binaries and what they run,
/// each at its path on this machine with its shared libraries.
fn build_rootfs(dir: &Path, tests: &[(String, PathBuf)], rounds: usize) -> Result<PathBuf> {
    let root = dir.join("rootfs");
    let _ = std::fs::remove_dir_all(&root);
    for d in [
        "bin", "dev", "proc", "sys", "tmp", "run", "etc", "root", "var", "modules",
    ] {
        std::fs::create_dir_all(root.join(d))?;
    }
    std::os::unix::fs::symlink("../run", root.join("var/run"))?;
    let busybox = static_busybox().context("no static busybox (busybox-static)")?;
    std::fs::copy(&busybox, root.join("bin/busybox"))?;
    std::fs::write(root.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n")?;
    std::fs::write(root.join("etc/group"), "root:x:0:\n")?;
    std::fs::write(root.join("etc/hosts"), "127.0.0.1 localhost\n")?;

    let target = util::root().join("target/debug");
    let mut programs: Vec<PathBuf> = ["tokentap", "simengine", "sockpeer", "h2engine", "benchpeer"]
        .iter()
        .map(|b| target.join(b))
        .collect();
    let wanted: BTreeSet<&str> = FOCUSED.iter().map(|(b, _)| entry(b).1).collect();
    for b in &wanted {
        programs.push(test_exe(tests, b)?.clone());
    }
    programs.extend(HOST_PROGRAMS.iter().map(PathBuf::from));
    let mut libs = BTreeSet::new();
    for p in &programs {
        copy_stripped(p, &root)?;
        libs.extend(shared_libraries(p)?);
    }
    // Python's standard library, without what the tests never import.
    let stdlib = Path::new("/usr/lib/python3.11");
    copy_tree(
        stdlib,
        &root,
        &[
            "test",
            "idlelib",
            "tkinter",
            "ensurepip",
            "lib2to3",
            "pydoc_data",
            "turtledemo",
            "site-packages",
            "dist-packages",
            "config-3.11-x86_64-linux-gnu",
        ],
    )?;
    for e in std::fs::read_dir(stdlib.join("lib-dynload"))?.flatten() {
        libs.extend(shared_libraries(&e.path())?);
    }
    std::os::unix::fs::symlink("python3.11", root.join("usr/bin/python3"))?;
    for l in &libs {
        copy_file(l, &root)?;
    }
    std::fs::write(root.join("init"), init_script(tests, rounds)?)?;
    std::fs::set_permissions(
        root.join("init"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )?;
    let cpio = dir.join("rootfs.cpio");
    let st = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "cd '{}' && find . | cpio -o -H newc --quiet > '{}'",
            root.display(),
            cpio.display()
        ))
        .status()?;
    if !st.success() {
        bail!("cpio failed");
    }
    Ok(cpio)
}

/// `path` at the same path under `root`: ELF files without their debug
/// sections (the tests' binaries are a few hundred MiB with them).
fn copy_stripped(path: &Path, root: &Path) -> Result<()> {
    let dst = under(root, path);
    std::fs::create_dir_all(dst.parent().unwrap())?;
    let st = Command::new("strip")
        .arg("--strip-debug")
        .arg("-o")
        .arg(&dst)
        .arg(path)
        .status()
        .context("strip (binutils)")?;
    if !st.success() {
        bail!("strip {} failed", path.display());
    }
    Ok(())
}

fn under(root: &Path, path: &Path) -> PathBuf {
    root.join(path.strip_prefix("/").unwrap_or(path))
}

/// A file at its path under `root`, symlinks followed (the link's own
/// path gets the target's bytes).
fn copy_file(path: &Path, root: &Path) -> Result<()> {
    let dst = under(root, path);
    if dst.exists() {
        return Ok(());
    }
    std::fs::create_dir_all(dst.parent().unwrap())?;
    std::fs::copy(path, &dst).with_context(|| format!("copying {}", path.display()))?;
    Ok(())
}

fn copy_tree(src: &Path, root: &Path, skip: &[&str]) -> Result<()> {
    for e in std::fs::read_dir(src)?.flatten() {
        let p = e.path();
        let name = e.file_name();
        if skip.iter().any(|s| name == *s) {
            continue;
        }
        let ft = e.file_type()?;
        if ft.is_dir() {
            copy_tree(&p, root, &[])?;
        } else if (ft.is_file() || ft.is_symlink()) && p.exists() {
            copy_file(&p, root)?;
        }
    }
    Ok(())
}

/// The shared libraries `ldd` lists for an ELF file (none for a script or
/// a static executable).
fn shared_libraries(path: &Path) -> Result<Vec<PathBuf>> {
    let out = Command::new("ldd").arg(path).output().context("ldd")?;
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let p = match l.split_once("=>") {
                Some((_, right)) => right.split_whitespace().next()?,
                None => l.split_whitespace().next()?,
            };
            p.starts_with('/').then(|| PathBuf::from(p))
        })
        .collect())
}

/// Rounds of the per-syscall cost phase (the median is reported) for
/// `cargo xtask kernels`; `cargo xtask test` runs one (a pass/fail run:
/// the figures in docs come from `cargo xtask kernels`).
pub const COST_ROUNDS: usize = 3;

/// The per-syscall cost on a process the agent does not target, for each
/// data-hook path this kernel runs: `benchpeer sys` (getppid, a syscall
/// no program is for: the BTF program still runs at its exit) and
/// `benchpeer pipe` (16-byte pipe writes: a data syscall of a process
/// that is not a target), without the agent, then with it under
/// `--data-hooks tracepoint`, `btf` and `fexit` (refused: said),
/// alternating, `rounds`
/// rounds. Shell, run as is on the host and in each VM; each line
/// `MARK cost PATH WORKLOAD {json}`.
fn cost_script(rounds: usize) -> String {
    let target = util::root().join("target/debug");
    let (agent, peer) = (target.join("tokentap"), target.join("benchpeer"));
    format!(
        r#"for round in $(seq {rounds}); do
  for path in none tracepoint btf fexit; do
    A=
    if [ $path != none ]; then
      {agent} run --port 9 --no-console --no-gpu --no-engine-metrics --no-engine-info --data-hooks $path > /tmp/cost-agent.out 2>&1 &
      A=$!
      i=0; until grep -q '; ready' /tmp/cost-agent.out || [ $i -ge 600 ]; do
        kill -0 $A 2>/dev/null || break
        sleep 0.1; i=$((i+1))
      done
      if ! kill -0 $A 2>/dev/null; then
        # This kernel refuses the path (fexit here): said, not measured.
        echo "{MARK} refused $path: $(grep -m1 'error' /tmp/cost-agent.out | cut -c1-200)"
        wait $A
        continue
      fi
    fi
    for w in sys pipe; do
      echo "{MARK} cost $path $w $(echo go | {peer} $w 1.5 | tail -1)"
    done
    if [ -n "$A" ]; then
      kill -INT $A
      i=0; while kill -0 $A 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
      if kill -0 $A 2>/dev/null; then
        echo "{MARK} stuck $path: the agent did not stop within 10 s of SIGINT (killed); its last lines:"
        tail -3 /tmp/cost-agent.out
        kill -9 $A
      fi
      wait $A
    fi
  done
done
"#,
        agent = agent.display(),
        peer = peer.display()
    )
}

/// Marker lines the init script prints and [`boot`] reads.
const MARK: &str = "@@tokentap-kernels";

fn init_script(tests: &[(String, PathBuf)], rounds: usize) -> Result<String> {
    let mut s = String::from(
        r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
# Debian's kernels allow fexit: the fexit capture test must capture.
export PATH=/usr/bin:/usr/sbin:/bin HOME=/root CI=true RUST_BACKTRACE=1 TOKENTAP_EXPECT_FEXIT=1
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mkdir -p /dev/pts /dev/shm; mount -t devpts devpts /dev/pts; mount -t tmpfs shm /dev/shm
chmod 1777 /tmp
mount -t tmpfs run /run
mount -t tracefs tracefs /sys/kernel/tracing
mount -t cgroup2 cgroup2 /sys/fs/cgroup 2>/dev/null
mount -t bpf bpf /sys/fs/bpf 2>/dev/null
for m in /modules/*.ko; do [ -f "$m" ] && insmod "$m"; done
ip link set lo up
"#,
    );
    s.push_str(&format!("echo \"{MARK} kernel $(uname -r)\"\n"));
    let agent = util::root().join("target/debug/tokentap");
    s.push_str(&format!(
        "{} run --port 9 --no-console --no-gpu --duration 1 2>&1 | grep '^tokentap: kernel ' | sed 's/^/{MARK} line /'\n",
        agent.display()
    ));
    for (entry_bin, name) in FOCUSED {
        let (setting, bin) = entry(entry_bin);
        let exe = test_exe(tests, bin)?;
        if setting == Some("paranoid=2") {
            s.push_str("echo 2 > /proc/sys/kernel/perf_event_paranoid\n");
        }
        s.push_str(&format!(
            "echo \"{MARK} begin {bin}::{name}\"\n\
             t0=$(cut -d' ' -f1 /proc/uptime)\n\
             {} --exact {name} --include-ignored --test-threads=1 --nocapture 2>&1\n\
             rc=$?\n\
             echo \"{MARK} end {bin}::{name} rc=$rc start=$t0 stop=$(cut -d' ' -f1 /proc/uptime)\"\n",
            exe.display()
        ));
    }
    s.push_str(&cost_script(rounds));
    s.push_str(&format!("echo \"{MARK} done\"\npoweroff -f\n"));
    Ok(s)
}

/// Boots one kernel and reads its run from the serial console.
fn boot(dir: &Path, k: &KernelLine, img: &Image, rootfs: &Path) -> Result<Row> {
    let log_path = dir.join(format!("{}.log", k.label));
    // The modules go into a second initramfs appended to the first (the
    // kernel unpacks both), so one root filesystem serves every kernel.
    let mods = dir.join(format!("{}-modules", k.label));
    let _ = std::fs::remove_dir_all(&mods);
    std::fs::create_dir_all(mods.join("modules"))?;
    for m in &img.modules {
        std::fs::copy(m, mods.join("modules").join(m.file_name().unwrap()))?;
    }
    let initrd = dir.join(format!("{}-initrd.cpio", k.label));
    let st = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "cp '{}' '{}' && cd '{}' && find . | cpio -o -H newc --quiet >> '{}'",
            rootfs.display(),
            initrd.display(),
            mods.display(),
            initrd.display()
        ))
        .status()?;
    if !st.success() {
        bail!("building {}'s initramfs failed", k.label);
    }
    eprintln!(
        "xtask: kernels: booting {} ({}) under qemu",
        k.label, img.package
    );
    // KVM only when asked: on these VMs /dev/kvm opens but qemu aborts on
    // its first MSR write (nested virtualisation is not offered).
    let kvm = std::env::var("TOKENTAP_KERNELS_KVM").is_ok_and(|v| v == "1");
    let mut cmd = Command::new("qemu-system-x86_64");
    // One vCPU: with two, the emulated vCPUs (threads on a 2-core host)
    // fall tens of ms apart, and a loopback data segment can overtake the
    // handshake's last ACK and complete it — a path with no tcp_probe, so
    // that connection's requests honestly get t0 = read (2 of 200 in the
    // live test with two vCPUs, 0 with one). Ordering across CPUs is the
    // host suite's to test.
    cmd.args(["-m", "3072", "-smp", "1", "-nographic", "-no-reboot"]);
    if kvm {
        cmd.args(["-enable-kvm", "-cpu", "host"]);
    } else {
        cmd.args(["-accel", "tcg", "-cpu", "max"]);
    }
    cmd.arg("-kernel")
        .arg(&img.vmlinuz)
        .arg("-initrd")
        .arg(&initrd)
        .args(["-append", "console=ttyS0 panic=-1 quiet loglevel=3"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let started = Instant::now();
    let mut child = cmd.spawn().context("starting qemu-system-x86_64")?;
    let stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut log = String::new();
    // Written as the VM prints, so a run killed from outside still leaves
    // what the guest said.
    let mut log_file = std::fs::File::create(&log_path)?;
    // The current focused test's output: shown when it fails, so a CI log
    // says why without the guest's log file.
    let mut test_lines: Vec<String> = Vec::new();
    let mut row = Row::new(k.label);
    let mut done = false;
    while started.elapsed() < VM_TIMEOUT {
        match rx.recv_timeout(Duration::from_secs(5)) {
            Ok(line) => {
                let line = line.replace('\r', "");
                log.push_str(&line);
                log.push('\n');
                let _ = writeln!(log_file, "{line}");
                read_tls_line(&line, &mut row);
                if let Some(rest) = line.find(MARK).map(|i| &line[i + MARK.len()..]) {
                    let rest = rest.trim();
                    read_mark(rest, &mut row, &mut done);
                    if rest.starts_with("end ") || rest.starts_with("kernel ") {
                        eprintln!("xtask: kernels: {}: {rest}", k.label);
                    }
                    if rest.starts_with("end ") && !rest.contains(" rc=0 ") {
                        let from = test_lines.len().saturating_sub(TAIL_LINES);
                        for l in &test_lines[from..] {
                            eprintln!("xtask: kernels: {}: | {l}", k.label);
                        }
                    }
                    if rest.starts_with("begin ") || rest.starts_with("end ") {
                        test_lines.clear();
                    }
                } else {
                    test_lines.push(line);
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                if child.try_wait()?.is_some() {
                    break;
                }
            }
            Err(_) => break,
        }
        if done {
            break;
        }
    }
    if child.try_wait()?.is_none() {
        if !done {
            log.push_str("xtask: the VM did not finish in time: killed\n");
        }
        // poweroff -f ends it at once; give it a moment, then kill.
        std::thread::sleep(Duration::from_secs(2));
        let _ = child.kill();
    }
    let _ = child.wait();
    let mut err = String::new();
    let _ = stderr.read_to_string(&mut err);
    log.push_str(&err);
    if !done && !test_lines.is_empty() {
        // The test the VM was in when it stopped printing.
        let from = test_lines.len().saturating_sub(TAIL_LINES);
        for l in &test_lines[from..] {
            eprintln!("xtask: kernels: {}: | {l}", k.label);
        }
    }
    std::fs::write(&log_path, &log)?;
    row.secs = started.elapsed().as_secs_f64();
    if !done {
        row.failed.push(format!(
            "the VM did not finish ({:.0} s; log {})",
            row.secs,
            log_path.display()
        ));
    }
    Ok(row)
}

/// The TLS test's line at the DaemonSet's capabilities: the first run is
/// at the node's own `perf_event_paranoid`, the second at 2.
fn read_tls_line(line: &str, row: &mut Row) {
    if let Some(t) = line.split("tls at the DaemonSet's capabilities: ").nth(1) {
        let t = t.trim().to_string();
        if row.tls_base == "?" {
            row.tls_base = t;
        } else {
            row.tls_base2 = t;
        }
    }
}

fn read_mark(rest: &str, row: &mut Row, done: &mut bool) {
    if let Some(r) = rest.strip_prefix("kernel ") {
        row.kernel = r.trim().to_string();
    } else if let Some(l) = rest.strip_prefix("line ") {
        row.data = if l.contains("through fexit") {
            "fexit".into()
        } else if l.contains("BTF sys_exit") {
            "btf".into()
        } else {
            "tracepoint".into()
        };
        row.exits = if l.contains("from group_dead") {
            "group_dead".into()
        } else {
            "leader".into()
        };
        row.forks = l
            .split("child_pid at ")
            .nth(1)
            .and_then(|x| x.split(')').next())
            .map(|o| format!("child_pid@{o}"))
            .unwrap_or_else(|| "not followed".into());
        row.arrival = if l.contains("arrival times on") {
            "on".into()
        } else {
            "off".into()
        };
    } else if let Some(e) = rest.strip_prefix("end ") {
        let name = e.split_whitespace().next().unwrap_or_default().to_string();
        let ok = e.contains(" rc=0 ");
        if name.starts_with("tls::an_engine") {
            row.tls = if ok { "decoded (root)" } else { "failed" }.into();
        }
        if ok {
            row.passed += 1;
        } else {
            row.failed.push(name);
        }
    } else if let Some(p) = rest.strip_prefix("refused ") {
        if let Some((path, _)) = p.split_once(':') {
            if !row.refused.iter().any(|x| x == path) {
                row.refused.push(path.to_string());
            }
        }
    } else if let Some(p) = rest.strip_prefix("stuck ") {
        row.stuck
            .push(p.split(':').next().unwrap_or_default().to_string());
    } else if let Some(c) = rest.strip_prefix("cost ") {
        let mut it = c.splitn(3, ' ');
        let (Some(path), Some(w), Some(json)) = (it.next(), it.next(), it.next()) else {
            return;
        };
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(json) {
            let (n, cpu) = (v["writes"].as_f64(), v["cpu_s"].as_f64());
            if let (Some(n), Some(cpu)) = (n, cpu) {
                if n > 0.0 {
                    row.costs.push((path.into(), w.into(), cpu * 1e9 / n));
                }
            }
        }
    } else if rest == "done" {
        *done = true;
    }
}

/// Median of a path's rounds for one workload.
fn median_cost(r: &Row, path: &str, w: &str) -> Option<f64> {
    let mut v: Vec<f64> = r
        .costs
        .iter()
        .filter(|(p, x, _)| p == path && x == w)
        .map(|(_, _, ns)| *ns)
        .collect();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied()
}

/// The per-syscall cost table: CPU ns per call of a process the agent does
/// not target, and what each data-hook path adds (one run per kernel; in
/// the VMs the time is emulated, so compare paths within a row).
fn cost_table(rows: &[Row]) -> String {
    let mut t = String::from(
        "| kernel | getppid() untraced | + tracepoint | + BTF | + fexit | 16-byte pipe write() untraced | + tracepoint | + BTF | + fexit |\n\
         |---|---|---|---|---|---|---|---|---|\n"
    );
    for r in rows.iter().filter(|r| !r.costs.is_empty()) {
        let cell = |w: &str| -> [String; 4] {
            let base = median_cost(r, "none", w);
            let add = |p: &str| match (base, median_cost(r, p, w)) {
                (Some(b), Some(x)) => format!("{:+.0} ns", x - b),
                _ if r.refused.iter().any(|x| x == p) => "refused".into(),
                _ => "?".into(),
            };
            [
                base.map_or("?".into(), |b| format!("{b:.0} ns")),
                add("tracepoint"),
                add("btf"),
                add("fexit"),
            ]
        };
        let (a, b) = (cell("sys"), cell("pipe"));
        let stuck = if r.stuck.is_empty() {
            String::new()
        } else {
            format!(
                " (agent did not stop on SIGINT in 10 s, killed: {})",
                r.stuck.join(", ")
            )
        };
        t.push_str(&format!(
            "| {}{stuck} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r.kernel, a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]
        ));
    }
    t
}

fn table(rows: &[Row]) -> String {
    let mut t = String::from(
        "| kernel | data hooks | thread-group end | forks | arrival | TLS, root | DaemonSet capabilities, the node's perf_event_paranoid | DaemonSet capabilities, perf_event_paranoid 2 | focused tests | s |\n\
         |---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        t.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.0} |\n",
            r.kernel,
            r.data,
            r.exits,
            r.forks,
            r.arrival,
            r.tls,
            r.tls_base,
            r.tls_base2,
            if r.suite {
                "the whole suite (above)".to_string()
            } else {
                format!(
                    "{}/{} passed{}",
                    r.passed,
                    FOCUSED.len(),
                    if r.failed.is_empty() {
                        String::new()
                    } else {
                        format!(" (failed: {})", r.failed.join(", "))
                    }
                )
            },
            r.secs
        ));
    }
    t
}
