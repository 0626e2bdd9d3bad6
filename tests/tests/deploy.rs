//! The deployment material, checked as CI must: every Kustomize overlay
//! renders, validates offline against the Kubernetes schemas, keeps the
//! agent's security invariants, and the invariant checker itself catches
//! each deliberate breakage (`deploy/check.py`; its tools are pinned and
//! installed from PyPI on first use).

use std::{path::PathBuf, process::Command};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn check(args: &[&str]) -> (bool, String) {
    let out = Command::new("python3")
        .arg(repo().join("deploy/check.py"))
        .args(args)
        .current_dir(repo())
        .output()
        .expect("run python3 deploy/check.py");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// One test, in order: the first run installs the tools the second uses.
#[test]
fn manifests_render_validate_and_keep_their_security_invariants() {
    let (ok, out) = check(&[]);
    eprintln!("{out}");
    assert!(ok, "deploy/check.py failed:\n{out}");
    assert!(out.contains("all checks passed"), "{out}");
    let (ok, out) = check(&["--self-test"]);
    eprintln!("{out}");
    assert!(ok, "deploy/check.py --self-test failed:\n{out}");
}
