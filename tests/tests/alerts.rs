//! The Prometheus alert rules, their unit tests and the Grafana dashboard,
//! checked as CI must (`deploy/prometheus/check.sh --self-test`): promtool
//! from Debian's `prometheus` package runs `check rules` (the rules and
//! every dashboard and runbook query) and `test rules` (a firing and a
//! quiet case per alert); `lint.py` checks every queried metric against
//! the instruments the agent's source builds, the runbook anchors, the
//! dashboard's variables, and that each quiet case fires once its alert is
//! loosened.

use std::{path::PathBuf, process::Command};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

#[test]
fn alert_rules_pass_their_unit_tests_and_every_query_names_an_exported_metric() {
    let out = Command::new("bash")
        .arg(repo().join("deploy/prometheus/check.sh"))
        .arg("--self-test")
        .current_dir(repo())
        .output()
        .expect("run bash deploy/prometheus/check.sh");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{text}");
    assert!(
        out.status.success(),
        "deploy/prometheus/check.sh failed:\n{text}"
    );
    assert!(text.contains("check.sh: all checks passed"), "{text}");
    assert!(text.contains("0 without teeth"), "{text}");
}
