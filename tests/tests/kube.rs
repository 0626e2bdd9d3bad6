//! `--kube-metadata` end to end against a fake Kubernetes API server
//! (`tokentap_tests::fakekube`): an engine in its own network namespace
//! and in a pod's cgroup, callers at pod IPs, the agent started while the
//! API is still down.
//!
//! Pins: records flow (with `k8s_pod_uid` from the cgroup) while the API
//! is unreachable; once it answers, the engine pod's name and namespace,
//! the calling pod's `namespace/name` and the pod label's model version
//! appear; a caller that is a pod of another node is named after one
//! on-demand lookup; a label update and a pod deletion reach later
//! records; the agent only ever asks for this node's pods (or one pod IP).

use std::{net::TcpStream, path::Path, time::Duration};

use serde_json::{json, Value};
use tokentap_tests::{
    assert_root,
    cgroups::{v2_root, Cgroups},
    fakekube::{pod, write_kubeconfig, FakeKube},
    free_port, http, interrupt, ip, read_jsonl, scratch_dir, start, Netns, RunAgent,
};

const CONTAINER: &str = "5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d";
const POD_UID: &str = "3b9c2d1e-7f60-4a8b-9c0d-1e2f3a4b5c6d";

/// A connection to `dst:port` from the local address `src`.
fn connect_from(rt: &tokio::runtime::Runtime, src: &str, dst: &str, port: u16) -> TcpStream {
    rt.block_on(async {
        let s = tokio::net::TcpSocket::new_v4().unwrap();
        s.bind(format!("{src}:0").parse().unwrap())
            .unwrap_or_else(|e| panic!("bind {src}: {e}"));
        let t = s
            .connect(format!("{dst}:{port}").parse().unwrap())
            .await
            .unwrap_or_else(|e| panic!("connect {dst}:{port} from {src}: {e}"));
        let t = t.into_std().unwrap();
        t.set_nonblocking(false).unwrap();
        t
    })
}

fn request(s: &mut TcpStream, id: u64) {
    let body = json!({"model": "llama", "stream": true,
        "sim": {"id": id, "ttft_ms": 1, "gap_ms": 1, "tokens": 2}});
    assert!(
        http::round_trip(s, "/v1/chat/completions", &body.to_string())
            .unwrap()
            .complete
    );
}

/// Sends requests from `src` until the newest record satisfies `want`
/// (or `timeout`); returns that record.
fn until(
    log: &Path,
    timeout: Duration,
    mut send: impl FnMut(),
    want: impl Fn(&Value) -> bool,
    what: &str,
) -> Value {
    let t0 = std::time::Instant::now();
    loop {
        let before = read_jsonl(log).len();
        send();
        // The record is written when the response ends; give the agent a
        // moment to read it from the ring.
        let mut recs = read_jsonl(log);
        let w = std::time::Instant::now();
        while recs.len() <= before && w.elapsed() < Duration::from_secs(3) {
            std::thread::sleep(Duration::from_millis(50));
            recs = read_jsonl(log);
        }
        if let Some(r) = recs.last().filter(|r| want(r)) {
            return r.clone();
        }
        assert!(
            t0.elapsed() < timeout,
            "{what}: not seen in {timeout:?}; last record {:?}",
            recs.last()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

#[test]
#[ignore = "needs root: loads eBPF, creates a network namespace and cgroups (cargo xtask test runs it as root)"]
fn pods_are_named_from_a_node_scoped_watch_once_the_api_answers() {
    assert_root("kube metadata");
    let v2 = v2_root().expect("a cgroup v2 hierarchy (pure or hybrid)");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let ns = Netns::create("ttk", 215);
    // A second caller address on the host side (a pod of another node, as
    // far as the fake API says), routed back from the engine's namespace.
    let remote_ip = format!("{}.5", ns.host_addr.rsplit_once('.').unwrap().0);
    ip(&[
        "addr",
        "add",
        &format!("{remote_ip}/32"),
        "dev",
        &ns.host_if,
    ]);
    ip(&[
        "-n",
        &ns.name,
        "route",
        "add",
        "default",
        "via",
        &ns.host_addr,
    ]);
    let bin = Path::new(env!("CARGO_BIN_EXE_simengine"));
    let (engine, out) = start(
        ns.command(bin).args(["--addr", &ns.ns_addr]),
        "listening",
        "simengine",
    );
    let port: u16 = out
        .recv()
        .ok()
        .and_then(|l| l.strip_prefix("listening ").and_then(|p| p.parse().ok()))
        .expect("simengine says its port");
    let mut cg = Cgroups(vec![]);
    cg.put(
        &v2,
        &format!(
            "tt-kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{CONTAINER}.scope",
            POD_UID.replace('-', "_")
        ),
        engine.0.id(),
    );

    // The API server's address is known, but nothing answers there yet.
    let dir = scratch_dir("kube");
    let log = dir.join("requests.jsonl");
    let kubeconfig = dir.join("kubeconfig");
    let api_port = free_port();
    write_kubeconfig(&kubeconfig, api_port);
    let (mut agent, aout) = RunAgent::new()
        .env("KUBECONFIG", &kubeconfig)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .no_gpu()
        .args(["--kube-metadata", "--kube-node", "node-a"])
        .pid(engine.0.id())
        .requests_log(&log)
        .events_log(&dir.join("events.jsonl"))
        .start();

    let mut id = 0u64;
    let mut local = connect_from(&rt, &ns.host_addr, &ns.ns_addr, port);
    let mut from_local = || {
        id += 1;
        request(&mut local, id)
    };
    let first = until(
        &log,
        Duration::from_secs(10),
        &mut from_local,
        |_| true,
        "a record while the API is down",
    );
    assert_eq!(first["k8s_pod_uid"], json!(POD_UID), "{first}");
    assert_eq!(first["container_id"], json!(CONTAINER));
    assert_eq!(first["k8s_pod_name"], Value::Null, "no API yet: {first}");
    assert_eq!(first["caller"], json!(ns.host_addr));
    // (null here: simengine is no engine the agent fingerprints)
    let fingerprint = first["model_version"].clone();

    // The API comes up with this node's pods (the engine, a local caller)
    // and a pod of another node at the second caller's address.
    let api = FakeKube::start(api_port);
    // The engine container's status names its image (what the runtime
    // pulled: the digest).
    let engine_pod = |version: &str, digest: &str| {
        let mut p = pod(
            POD_UID,
            "ml",
            "llm-a-0",
            "node-a",
            &ns.ns_addr,
            json!({"app": "llm", "tokentap.io/model-version": version}),
        );
        p["status"]["containerStatuses"] = json!([{
            "name": "main", "ready": true, "restartCount": 0,
            "containerID": format!("containerd://{CONTAINER}"),
            "image": "registry.local:5000/llm/engine:v1",
            "imageID": format!("registry.local:5000/llm/engine@sha256:{digest}"),
        }]);
        p
    };
    api.put(engine_pod("rel-7", "aaaa"));
    api.put(pod(
        "c0ffee00-0000-4000-8000-000000000001",
        "ml",
        "client-0",
        "node-a",
        &ns.host_addr,
        json!({"app": "client"}),
    ));
    api.put(pod(
        "c0ffee00-0000-4000-8000-000000000002",
        "apps",
        "remote-0",
        "node-b",
        &remote_ip,
        json!({}),
    ));
    let named = until(
        &log,
        Duration::from_secs(25),
        &mut from_local,
        |r| r["k8s_pod_name"] == json!("llm-a-0"),
        "the engine pod's name after the API came up",
    );
    assert_eq!(named["k8s_namespace"], json!("ml"), "{named}");
    assert_eq!(named["caller"], json!("ml/client-0"), "{named}");
    assert_eq!(named["model_version"], json!("rel-7"), "the pod label wins");
    assert_eq!(
        named["container_image"],
        json!("registry.local:5000/llm/engine:v1"),
        "{named}"
    );
    assert_eq!(named["container_image_id"], json!("sha256:aaaa"), "{named}");

    // A caller on another node: its IP at first, its pod after a lookup.
    let mut remote = connect_from(&rt, &remote_ip, &ns.ns_addr, port);
    let mut rid = 1000u64;
    let mut from_remote = || {
        rid += 1;
        request(&mut remote, rid)
    };
    let r = until(
        &log,
        Duration::from_secs(5),
        &mut from_remote,
        |_| true,
        "a remote caller's record",
    );
    assert_eq!(r["caller"], json!(remote_ip), "not looked up yet: {r}");
    until(
        &log,
        Duration::from_secs(10),
        &mut from_remote,
        |r| r["caller"] == json!("apps/remote-0"),
        "the remote caller's pod name",
    );

    // Label changed (a rollout tool relabels): later records follow. The
    // same tag, re-pushed and pulled again: another digest, an image
    // change on the timeline.
    api.put(engine_pod("rel-8", "bbbb"));
    let relabelled = until(
        &log,
        Duration::from_secs(10),
        &mut from_local,
        |r| r["model_version"] == json!("rel-8"),
        "the updated label",
    );
    assert_eq!(relabelled["container_image_id"], json!("sha256:bbbb"));
    // Pod deleted from the API: names go, the fingerprint comes back.
    api.delete(POD_UID);
    let gone = until(
        &log,
        Duration::from_secs(10),
        &mut from_local,
        |r| r["k8s_pod_name"].is_null(),
        "the deleted pod forgotten",
    );
    assert_eq!(gone["model_version"], fingerprint, "{gone}");
    assert_eq!(gone["k8s_pod_uid"], json!(POD_UID), "the cgroup still says");

    let (ok, lines) = interrupt(&mut agent, aout);
    assert!(ok, "{lines:?}");
    let images: Vec<Value> = read_jsonl(&dir.join("events.jsonl"))
        .into_iter()
        .filter(|e| e["kind"] == "engine.image.change")
        .collect();
    assert_eq!(images.len(), 1, "{images:#?}");
    assert_eq!(
        images[0]["attributes"]["oci.manifest.digest"],
        json!("sha256:bbbb")
    );
    assert_eq!(
        images[0]["attributes"]["container.image.id.previous"],
        json!("sha256:aaaa")
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("cannot watch pods on node node-a")),
        "the outage is said once: {lines:?}"
    );

    // Node-scoped: every pod request selects this node, or one pod IP.
    let reqs = api.requests();
    assert!(
        reqs.iter()
            .any(|r| r.contains("watch=true") && r.contains("fieldSelector=spec.nodeName=node-a")),
        "{reqs:#?}"
    );
    for r in &reqs {
        assert!(
            r.contains("fieldSelector=spec.nodeName=node-a")
                || r.contains("fieldSelector=status.podIP="),
            "an unscoped request: {r}"
        );
    }
    let lookups = reqs
        .iter()
        .filter(|r| r.contains(&format!("status.podIP={remote_ip}")))
        .count();
    assert_eq!(lookups, 1, "one lookup, then the cache: {reqs:#?}");
    drop(engine);
    std::thread::sleep(Duration::from_millis(200));
    drop(cg);
}
