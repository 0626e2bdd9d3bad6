//! The fake NVML library (`tests/fakenvml`) for GPU tests: building it,
//! installing it as `libnvidia-ml.so.1`, and running each scenario in its
//! own process (the fake keeps one scenario per process).

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
    sync::OnceLock,
};

/// Set in a child started by [`isolated`]: the test it must run.
pub const CHILD_ENV: &str = "FAKENVML_TEST_CHILD";
/// Set in a child started by [`isolated`]: the fake library's path.
pub const LIB_ENV: &str = "FAKENVML_LIB";

fn workspace_root() -> PathBuf {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    here.parent().map(Path::to_path_buf).unwrap_or(here)
}

/// `libfakenvml.so`, built once per test process. `cargo build
/// --workspace --bins` does not build cdylibs, so the tests build it
/// themselves, in a target directory of its own (`target/fakenvml`): the
/// workspace's is locked by the `cargo test` that runs us.
pub fn fakenvml_path() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            if let Some(p) = std::env::var_os(LIB_ENV) {
                return PathBuf::from(p);
            }
            let root = workspace_root();
            let target = root.join("target/fakenvml");
            let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
            let out = Command::new(cargo)
                .args(["build", "-p", "fakenvml", "--target-dir"])
                .arg(&target)
                .current_dir(&root)
                .output()
                .expect("cannot run cargo to build tests/fakenvml");
            assert!(
                out.status.success(),
                "building tests/fakenvml failed:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let lib = target.join("debug/libfakenvml.so");
            assert!(lib.exists(), "{} missing after the build", lib.display());
            lib
        })
        .clone()
}

/// Copies the fake into `dir` as `libnvidia-ml.so.1`; returns that path.
pub fn install_fake_nvml(dir: &Path) -> PathBuf {
    let dst = dir.join("libnvidia-ml.so.1");
    std::fs::copy(fakenvml_path(), &dst).expect("copying the fake NVML library");
    dst
}

/// Whether this process is the child [`isolated`] started for `test`.
pub fn is_child(test: &str) -> bool {
    std::env::var(CHILD_ENV).is_ok_and(|t| t == test)
}

/// Runs test `test` of the current test binary again, alone, in a child
/// process with `envs` (the scenario, the calls file) and the fake's path
/// in [`LIB_ENV`]; fails unless it passes. Returns its output (stderr
/// holds the sampler's lines: the child runs with `--nocapture`).
pub fn isolated(test: &str, envs: &[(&str, &Path)]) -> Output {
    let lib = fakenvml_path();
    let exe = std::env::current_exe().expect("current test binary");
    let mut cmd = Command::new(exe);
    cmd.args([test, "--exact", "--nocapture", "--test-threads=1"])
        .arg("--include-ignored")
        .env(CHILD_ENV, test)
        .env(LIB_ENV, &lib);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("starting the test binary again");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "{test} failed in its own process ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        out.status
    );
    out
}
