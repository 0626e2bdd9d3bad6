//! Build orchestration for tokentap: toolchain set-up, the eBPF object,
//! the agent, tests, benchmarks and the demo. Every step a fresh machine
//! needs is here, so `cargo xtask …` works on a clean clone with only
//! rustup (stable + nightly) installed.

mod bench;
mod demo;
mod ebpf;
mod fuzz;
mod kernels;
mod soak;
mod testrun;
mod toolchain;
mod tracebench;
mod util;

use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "tokentap build, test and bench tasks")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install what the eBPF build needs (nightly rust-src, bpf-linker
    /// built against nightly's LLVM) when missing.
    Setup,
    /// Build the eBPF object and the agent with it embedded.
    Build {
        /// Build the agent optimised (the `release` profile: what `cargo
        /// xtask run` runs; linked in about a minute on 2 cores).
        #[arg(long, conflicts_with = "dist")]
        release: bool,
        /// Build the agent fully optimised (the `dist` profile: fat LTO, one
        /// code unit; what the image and the benchmarks use).
        #[arg(long)]
        dist: bool,
    },
    /// Build (release) and run the agent as root: `cargo xtask run -- capture --port 8000 --out cap.jsonl`.
    Run {
        /// Arguments for `tokentap` (after `--`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Run the whole test suite: unit, property, golden, root eBPF
    /// integration, end-to-end, fidelity against real engines and a short
    /// fuzz run. The root tests are `#[ignore]`d: as root they run (with
    /// `--include-ignored`; the real peers are installed first when the
    /// fidelity tests are selected), otherwise they are reported as ignored
    /// and counted at the end. Under CI=true it must be root.
    Test {
        /// Extra arguments for `cargo test` (after `--`), e.g.
        /// `-- -p tokentap-tests --test live -- NAME`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// After a deliberate change to what records say: write what the
    /// decoder gives now as the expected records of every golden
    /// transcript (tests/golden/*.json, their `expect`) and capture
    /// (tests/golden/captures/*.expect.json) that differs, then print the
    /// diff written (git diff). The other golden checks still run.
    Bless,
    /// Install the real peers the fidelity test and benches drive (from
    /// PyPI, into tests/peers/: llama.cpp built from source, the openai SDK,
    /// Rotel, a generated tiny model). Idempotent.
    Peers,
    /// Show tokentap's console on a simulated engine under load (root).
    Demo {
        /// How long to run, in seconds.
        #[arg(long, default_value_t = 60)]
        secs: u64,
    },
    /// On a machine with an NVIDIA GPU: build the agent, start a small
    /// CUDA load (a PyTorch matmul loop, when `python3 -c "import torch"`
    /// works there) and print what `tokentap gpu-check` samples for SECS
    /// seconds: utilisation, memory, power, energy per pass, per-process
    /// memory, and the load's engine map.
    GpuCheck {
        #[arg(long, default_value_t = 20)]
        secs: u64,
    },
    /// Build the agent's OCI image from scratch, pulling nothing from a
    /// registry: the release agent (eBPF object embedded), the glibc pieces
    /// it and NVML need, CA certificates (deploy/container/build-image.sh,
    /// with buildah from Debian; installed first when missing, as root).
    /// The image lands in the local containers-storage (podman sees it).
    Image {
        /// Image name and tag, e.g. registry.example.com/tokentap:0.1.0.
        #[arg(long, default_value = "localhost/tokentap:dev")]
        tag: String,
        /// Push the built image to the registry its tag names (buildah
        /// push; credentials from `buildah login` / REGISTRY_AUTH_FILE).
        #[arg(long)]
        push: bool,
        /// Also write the image as an OCI archive to this file.
        #[arg(long, value_name = "FILE")]
        archive: Option<std::path::PathBuf>,
    },
    /// The kernel matrix: boot Debian's 6.1 and 6.12 kernels under qemu
    /// (fetched with apt-get; qemu, busybox-static and cpio installed when
    /// missing) with a root filesystem of the suite's own binaries, run
    /// the focused root tests in each (capture exactness on every
    /// data-hook path, TTFT against the engine's clock, discovery, arrival,
    /// HTTP/2, TLS, the DaemonSet's capabilities) and the per-syscall cost
    /// of each data-hook path, print the tables (also
    /// target/kernels/matrix.md). Root.
    /// `cargo xtask test` runs it after the host suite.
    Kernels {
        /// Only these kernels (labels: 6.1, 6.12); default all.
        kernels: Vec<String>,
    },
    /// Fuzz every decoder entry (cargo fuzz, nightly; libFuzzer): the
    /// request decoder on joined connections, HTTP/1.1 and HTTP/2 from a
    /// connection's start, the memory budget's shedding, HPACK, gRPC
    /// messages, SSE/NDJSON, capture-file lines and the config file —
    /// SECS seconds each, one after the other. Prints executions,
    /// coverage, corpus and crashes per target (also target/fuzz.md) and
    /// keeps a running total in target/fuzz-total.json; a crash fails it,
    /// its input in tests/fuzz/artifacts/TARGET/.
    Fuzz {
        /// Seconds per target.
        #[arg(long, default_value_t = 300)]
        secs: u64,
        /// Only these targets (decode, http1, http2, shed, hpack, grpc,
        /// stream, capfile, config); default all.
        targets: Vec<String>,
    },
    /// Run benchmarks and print one table (also written to
    /// target/bench-WHICH.md): `all` (default), `decode`, `capture`,
    /// `conns`, `hostile`, `engine`, `tls`, `traces`, `tokens`.
    Bench {
        /// all; decode (decoder throughput); capture (kernel capture
        /// overhead on a write-heavy SSE server, drops, agent CPU/RSS;
        /// root); conns (agent RSS with 10,000 tracked connections; root);
        /// hostile (agent peak RSS with 100, 1,000 and 5,000 connections
        /// each holding 900 KB of a declared 1 MB chat body; root);
        /// engine (real llama.cpp engines: traced vs untraced throughput,
        /// TTFT/TPOT vs the client; root, installs the peers); tls (an
        /// HTTPS SSE writer on OpenSSL: cost per SSL_write traced vs not,
        /// max rate, cost to a process the agent does not target; root,
        /// installs the peers); traces (agent CPU per 1k requests with a
        /// span each vs none; root, installs the peers); tokens (the
        /// engine's tokenizer: tokens/s per core, CPU per 1,000 chats with
        /// 2k- and 32k-token prompts with and without the prefix cache,
        /// the CPU budget at 10× its rate; installs the peers); soak (not in
        /// all: `--secs 300` or more of chats from thousands of end users
        /// and API keys: events log ceiling, named callers, the agent's RSS
        /// curve; root).
        #[arg(default_value = "all")]
        which: String,
        /// Seconds per measurement.
        #[arg(long, default_value_t = 3.0)]
        secs: f64,
        /// Rounds per condition (the median is reported).
        #[arg(long, default_value_t = 3)]
        rounds: usize,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let res = match cli.cmd {
        Cmd::Setup => toolchain::ensure().map(|_| ()),
        Cmd::Build { release, dist } => build(if dist {
            Profile::Dist
        } else if release {
            Profile::Release
        } else {
            Profile::Dev
        }),
        Cmd::Run { args } => run(args),
        Cmd::Test { args } => testrun::test(args),
        Cmd::Peers => peers(),
        Cmd::Fuzz { secs, targets } => fuzz::run(secs, &targets),
        Cmd::Bless => bless(),
        Cmd::Kernels { kernels } => kernels::run(&kernels),
        Cmd::Image { tag, push, archive } => image(&tag, push, archive.as_deref()),
        Cmd::GpuCheck { secs } => gpu_check(secs),
        Cmd::Demo { secs } => demo::run(secs),
        Cmd::Bench {
            which,
            secs,
            rounds,
        } => bench::run(&which, secs, rounds),
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// A cargo profile of the workspace's binaries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Profile {
    /// Unoptimised (the test suite).
    Dev,
    /// Optimised, linked fast: what a newcomer runs (`cargo xtask run`).
    Release,
    /// Fully optimised (fat LTO, one code unit): the image and benchmarks.
    Dist,
}

impl Profile {
    /// The profile's folder under `target/`.
    pub fn dir(self) -> &'static str {
        match self {
            Profile::Dev => "debug",
            Profile::Release => "release",
            Profile::Dist => "dist",
        }
    }

    fn args(self) -> &'static [&'static str] {
        match self {
            Profile::Dev => &[],
            Profile::Release => &["--release"],
            Profile::Dist => &["--profile", "dist"],
        }
    }
}

/// eBPF object, then the agent (and the test/peer binaries) embedding it.
pub fn build(profile: Profile) -> Result<()> {
    let tc = toolchain::ensure()?;
    let obj = ebpf::build(&tc)?;
    let mut cmd = util::cargo();
    cmd.args(["build", "--workspace", "--bins"])
        .args(profile.args());
    cmd.env("TOKENTAP_EBPF_OBJ", &obj);
    util::run(&mut cmd)
}

fn run(args: Vec<String>) -> Result<()> {
    build(Profile::Release)?;
    let bin = util::root().join("target/release/tokentap");
    let mut cmd = std::process::Command::new(bin);
    cmd.args(args);
    util::run(&mut cmd)
}

/// `cargo xtask gpu-check`: the agent's GPU sampling on a real GPU.
fn gpu_check(secs: u64) -> Result<()> {
    let mut cmd = util::cargo();
    cmd.args(["build", "--release", "-p", "tokentap", "--bin", "tokentap"]);
    util::run(&mut cmd)?;
    let torch = std::process::Command::new("python3")
        .args(["-c", "import torch; assert torch.cuda.is_available()"])
        .status()
        .is_ok_and(|s| s.success());
    let mut load = if torch {
        let code = format!(
            "import torch, time\nx = torch.randn(8192, 8192, device='cuda')\nend = time.time() + {}\n\
             while time.time() < end:\n    y = x @ x\n    torch.cuda.synchronize()\n",
            secs + 5
        );
        eprintln!("xtask: CUDA load: PyTorch 8192x8192 matmul loop");
        Some(
            std::process::Command::new("python3")
                .args(["-c", &code])
                .spawn()?,
        )
    } else {
        eprintln!(
            "xtask: no PyTorch with CUDA here: sampling an idle GPU (no load, no engine map)"
        );
        None
    };
    std::thread::sleep(std::time::Duration::from_secs(3));
    let mut check = std::process::Command::new(util::root().join("target/release/tokentap"));
    check.args(["gpu-check", "--secs", &secs.to_string(), "--interval", "1"]);
    if let Some(l) = &load {
        check.args(["--pid", &l.id().to_string()]);
    }
    let res = util::run(&mut check);
    if let Some(l) = load.as_mut() {
        let _ = l.kill();
        let _ = l.wait();
    }
    res
}

/// Installs podman, buildah and runc (Debian) and a containers set-up
/// that never pulls (deploy/container/install-tools.sh; root).
pub fn container_tools() -> Result<()> {
    let script = util::root().join("deploy/container/install-tools.sh");
    util::run(std::process::Command::new("bash").arg(script))
}

/// `cargo xtask image`: the fully optimised agent, then the scratch image.
pub fn image(tag: &str, push: bool, archive: Option<&std::path::Path>) -> Result<()> {
    let tc = toolchain::ensure()?;
    let obj = ebpf::build(&tc)?;
    let mut cmd = util::cargo();
    cmd.args(["build", "-p", "tokentap", "--bin", "tokentap"])
        .args(Profile::Dist.args());
    cmd.env("TOKENTAP_EBPF_OBJ", &obj);
    util::run(&mut cmd)?;
    let have_buildah = std::process::Command::new("buildah")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        container_tools()?;
    } else if !have_buildah {
        anyhow::bail!(
            "buildah is not installed: run `sudo cargo xtask image` once (it installs podman, buildah and runc from Debian), or install them yourself"
        );
    }
    let mut b = std::process::Command::new("bash");
    b.arg(util::root().join("deploy/container/build-image.sh"))
        .arg("--binary")
        .arg(util::root().join("target/dist/tokentap"))
        .args(["--tag", tag]);
    if let Some(a) = archive {
        b.arg("--archive").arg(a);
    }
    util::run(&mut b)?;
    if push {
        util::run(std::process::Command::new("buildah").args([
            "push",
            tag,
            &format!("docker://{tag}"),
        ]))?;
    }
    Ok(())
}

/// Installs the real peers (tests/peers/install.sh).
pub fn peers() -> Result<()> {
    let script = util::root().join("tests/peers/install.sh");
    util::run(std::process::Command::new("bash").arg(script))
}

/// `cargo xtask bless`: the golden tests and docs/usage.md's flag
/// reference with `TOKENTAP_BLESS=1`, then the diff they wrote.
fn bless() -> Result<()> {
    build(Profile::Dev)?;
    util::run(
        util::cargo()
            .args([
                "test",
                "-p",
                "tokentap-tests",
                "--test",
                "golden",
                "--test",
                "usage",
            ])
            .env("TOKENTAP_BLESS", "1")
            .env("TOKENTAP_EBPF_OBJ", ebpf::object_path()),
    )
    .context(
        "the golden tests failed even while blessing (a check that is not an expected file)",
    )?;
    let golden = util::root().join("tests/golden");
    let usage = util::root().join("docs/usage.md");
    let stat = util::output(
        std::process::Command::new("git")
            .current_dir(util::root())
            .args(["diff", "--stat", "--"])
            .arg(&golden)
            .arg(&usage),
    )?;
    if stat.trim().is_empty() {
        println!("xtask bless: every golden already says what the decoder gives; nothing written");
        return Ok(());
    }
    let diff = util::output(
        std::process::Command::new("git")
            .current_dir(util::root())
            .args(["diff", "--"])
            .arg(&golden)
            .arg(&usage),
    )?;
    println!("{diff}\n{stat}\nxtask bless: review the diff above before committing it");
    Ok(())
}
