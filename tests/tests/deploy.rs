//! The deployment material, checked as CI must: every Kustomize overlay
//! renders, validates offline against the Kubernetes schemas, keeps the
//! agent's security invariants, and the invariant checker itself catches
//! each deliberate breakage (`deploy/check.py`; its tools are pinned and
//! installed from PyPI on first use).

use std::{
    io::{Read, Write},
    net::TcpStream,
    os::fd::AsRawFd,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use serde_json::{json, Value};
use tokentap_tests::{assert_root, http, ip, read_jsonl, scratch_dir, start};

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

/// The DaemonSet agent container's privileges, as `deploy/check.py
/// --emit-container-spec` reads them from the rendered base.
fn container_spec() -> Value {
    let path = scratch_dir("deploy-spec").join("spec.json");
    let (ok, out) = check(&["--emit-container-spec", path.to_str().unwrap()]);
    assert!(ok, "--emit-container-spec failed:\n{out}");
    serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap()
}

/// The image `cargo xtask test` builds with `cargo xtask image` before the
/// root tests (the one build path).
pub const TEST_IMAGE: &str = "localhost/tokentap:test";

fn podman(args: &[&str]) -> (bool, String) {
    let out = Command::new("podman")
        .args(args)
        .output()
        .expect("run podman (deploy/container/install-tools.sh installs it)");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// `podman run` arguments reproducing the spec's privileges, mounts and
/// environment, minus the capabilities named in `without`.
fn podman_run_args(
    spec: &Value,
    name: &str,
    config_dir: &Path,
    out_dir: &Path,
    without: &[&str],
) -> Vec<String> {
    let mut a: Vec<String> = vec!["run".into(), "-d".into(), "--name".into(), name.into()];
    if spec["host_pid"] == json!(true) {
        a.push("--pid=host".into());
    }
    assert_eq!(
        spec["host_network"],
        json!(false),
        "the manifest keeps the pod's own network namespace"
    );
    assert_eq!(spec["privileged"], json!(false));
    for c in spec["capabilities_drop"].as_array().unwrap() {
        a.push(format!("--cap-drop={}", c.as_str().unwrap()));
    }
    let add: Vec<&str> = spec["capabilities_add"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .filter(|c| !without.contains(c))
        .collect();
    if !add.is_empty() {
        a.push(format!("--cap-add={}", add.join(",")));
    }
    match spec["seccomp"].as_str().unwrap() {
        "Unconfined" => a.extend(["--security-opt".into(), "seccomp=unconfined".into()]),
        "RuntimeDefault" => {}
        other => {
            let p = other.strip_prefix("Localhost:").expect("seccomp kind");
            a.extend(["--security-opt".into(), format!("seccomp={p}")]);
        }
    }
    if spec["read_only_root"] == json!(true) {
        // As Kubernetes' readOnlyRootFilesystem: no tmpfs of podman's own.
        a.extend(["--read-only".into(), "--read-only-tmpfs=false".into()]);
    }
    for m in spec["host_paths"].as_array().unwrap() {
        let ro = if m["read_only"] == json!(true) {
            ":ro"
        } else {
            ""
        };
        a.extend([
            "-v".into(),
            format!(
                "{}:{}{ro}",
                m["host"].as_str().unwrap(),
                m["container"].as_str().unwrap()
            ),
        ]);
    }
    for p in spec["writable_paths"].as_array().unwrap() {
        a.extend([
            "--mount".into(),
            format!(
                "type=tmpfs,destination={},tmpfs-mode=0700",
                p.as_str().unwrap()
            ),
        ]);
    }
    a.extend(["--user".into(), spec["run_as_user"].to_string()]);
    for (k, v) in spec["env"].as_object().unwrap() {
        let v = match v {
            Value::String(s) => s.clone(),
            // The downward API, as a kubelet would fill it.
            _ if v["fieldRef"] == json!("spec.nodeName") => "test-node".into(),
            _ => "00000000-0000-4000-8000-000000000000".into(),
        };
        a.extend(["-e".into(), format!("{k}={v}")]);
    }
    for (i, (path, text)) in spec["config_files"].as_object().unwrap().iter().enumerate() {
        let f = config_dir.join(format!("config-{i}"));
        std::fs::write(&f, text.as_str().unwrap()).unwrap();
        a.extend(["-v".into(), format!("{}:{path}:ro", f.display())]);
    }
    a.extend(["-v".into(), format!("{}:/out", out_dir.display())]);
    a.push(TEST_IMAGE.into());
    for x in spec["args"].as_array().unwrap() {
        a.push(x.as_str().unwrap().into());
    }
    a.extend(["--requests-log".into(), "/out/requests.jsonl".into()]);
    a
}

/// GET http://ip:port/path → (status, body).
fn get(ip: &str, port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect_timeout(
        &format!("{ip}:{port}").parse().ok()?,
        Duration::from_secs(1),
    )
    .ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let code = out.split(' ').nth(1)?.parse().ok()?;
    Some((
        code,
        out.split("\r\n\r\n")
            .nth(1)
            .unwrap_or("")
            .trim()
            .to_string(),
    ))
}

/// A connection from inside network namespace `ns` (setns on a thread of
/// its own, so the test's other threads stay where they are).
fn connect_in(ns: &str, port: u16) -> TcpStream {
    let ns = ns.to_string();
    std::thread::spawn(move || {
        let f = std::fs::File::open(format!("/run/netns/{ns}")).unwrap();
        // SAFETY: a valid namespace fd; only this thread moves.
        let rc = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns {ns}");
        TcpStream::connect(("127.0.0.1", port)).unwrap()
    })
    .join()
    .unwrap()
}

struct Container(String);

impl Drop for Container {
    fn drop(&mut self) {
        let _ = podman(&["rm", "-f", "-t", "2", &self.0]);
    }
}

/// Polls `/readyz` of the container until `want` holds (or `secs`).
fn readyz_until(name: &str, port: u16, secs: u64, want: impl Fn(u16) -> bool) -> (u16, String) {
    let t0 = std::time::Instant::now();
    let mut last = (0, String::new());
    while t0.elapsed() < Duration::from_secs(secs) {
        let (_, ip) = podman(&["inspect", "-f", "{{.NetworkSettings.IPAddress}}", name]);
        if let Some(r) = get(ip.trim(), port, "/readyz") {
            if want(r.0) {
                return r;
            }
            last = r;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    last
}

#[test]
#[ignore = "needs root: podman + runc, eBPF and a network namespace (cargo xtask test builds the image and runs it as root)"]
fn the_image_measures_an_engine_with_exactly_the_daemonsets_privileges() {
    assert_root("container test");
    let (exists, _) = podman(&["image", "exists", TEST_IMAGE]);
    assert!(
        exists,
        "image {TEST_IMAGE} missing: cargo xtask test builds it (cargo xtask image --tag {TEST_IMAGE})"
    );
    let spec = container_spec();
    let port = spec["health_port"].as_u64().unwrap() as u16;
    if !Path::new("/sys/kernel/tracing/events").exists() {
        let _ = Command::new("mount")
            .args(["-t", "tracefs", "tracefs", "/sys/kernel/tracing"])
            .status();
    }

    // The engine as a pod runs it: its own network namespace, listening on
    // its loopback; "vllm-sim" on its command line is what discovery sees.
    let ns = format!("ttc-{}", std::process::id());
    ip(&["netns", "add", &ns]);
    struct Ns(String);
    impl Drop for Ns {
        fn drop(&mut self) {
            let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
        }
    }
    let _ns = Ns(ns.clone());
    ip(&["-n", &ns, "link", "set", "lo", "up"]);
    let bin = Path::new(env!("CARGO_BIN_EXE_simengine"));
    let (engine, out) = start(
        Command::new("ip")
            .args(["netns", "exec", &ns])
            .arg(bin)
            .args(["--addr", "127.0.0.1", "vllm-sim"]),
        "listening",
        "simengine",
    );
    let eport: u16 = out
        .recv()
        .ok()
        .and_then(|l| l.strip_prefix("listening ").and_then(|p| p.parse().ok()))
        .expect("simengine says its port");

    let dir = scratch_dir("container");
    let out_dir = dir.join("out");
    std::fs::create_dir_all(&out_dir).unwrap();
    let name = format!("tokentap-test-{}", std::process::id());
    let args = podman_run_args(&spec, &name, &dir, &out_dir, &[]);
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let (ok, msg) = podman(&argv);
    assert!(ok, "podman {}: {msg}", args.join(" "));
    let c = Container(name.clone());
    let (code, body) = readyz_until(&name, port, 60, |c| c == 200);
    assert_eq!(
        code,
        200,
        "/readyz: {body}; logs: {}",
        podman(&["logs", &name]).1
    );

    let mut s = connect_in(&ns, eport);
    for i in 0..5u64 {
        let body = json!({"model": "sim-a", "stream": true,
            "sim": {"id": i, "ttft_ms": 20, "gap_ms": 2, "tokens": 4}});
        assert!(
            http::round_trip(&mut s, "/v1/chat/completions", &body.to_string())
                .unwrap()
                .complete
        );
    }
    drop(s);
    std::thread::sleep(Duration::from_millis(1500));
    let (ok, msg) = podman(&["stop", "-t", "10", &name]);
    assert!(ok, "{msg}");
    let logs = podman(&["logs", &name]).1;
    // The manifest's privileges are enough for the faster data path too
    // (this kernel has BTF): no fallback to the syscall tracepoints.
    let ready = logs.lines().find(|l| l.ends_with("; ready")).unwrap_or("");
    eprintln!("in the container: {ready}");
    assert!(
        ready.contains("data hooks btf"),
        "with the DaemonSet's privileges the BTF data program must attach: {logs}"
    );
    let recs = read_jsonl(&out_dir.join("requests.jsonl"));
    assert_eq!(
        recs.len(),
        5,
        "the agent in its container recorded the engine's requests; records:\n{}\nlogs:\n{logs}",
        recs.iter()
            .map(|r| r.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    );
    for r in &recs {
        assert_eq!(r["pid"], json!(engine.0.id()), "{r}");
        assert_eq!(r["provider"], json!("vllm"), "discovered by itself: {r}");
        let ttft = r["ttft_s"].as_f64().unwrap();
        assert!((0.019..0.1).contains(&ttft), "{r}");
    }
    drop(c);

    // Without CAP_BPF: the documented error, alive and not ready.
    let name2 = format!("{name}-nobpf");
    let out2 = dir.join("out2");
    std::fs::create_dir_all(&out2).unwrap();
    let args = podman_run_args(&spec, &name2, &dir, &out2, &["BPF"]);
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let (ok, msg) = podman(&argv);
    assert!(ok, "{msg}");
    let _c2 = Container(name2.clone());
    let (code, body) = readyz_until(&name2, port, 30, |c| c == 503);
    assert_eq!(code, 503, "{body}");
    std::thread::sleep(Duration::from_secs(3));
    let (code, body) = readyz_until(&name2, port, 10, |c| c != 0);
    let logs = podman(&["logs", &name2]).1;
    assert_eq!(code, 503, "stays not ready: {body}; logs: {logs}");
    eprintln!("without CAP_BPF: /readyz {code} {body}\nlogs: {logs}");
    assert!(
        body.contains(DOCUMENTED_NO_BPF)
            && body.contains("failed to create map")
            && body.contains(DOCUMENTED_NO_BPF_CAUSE),
        "/readyz says why: {body}"
    );
    assert!(logs.contains(DOCUMENTED_NO_BPF), "{logs}");
    drop(engine);
}

/// What the agent says when the kernel refuses its programs for want of
/// CAP_BPF (docs/deploy.md, "Privileges").
/// (The map named first varies from run to run.)
const DOCUMENTED_NO_BPF: &str = "loading the eBPF object failed";
const DOCUMENTED_NO_BPF_CAUSE: &str = "Operation not permitted (os error 1)";
