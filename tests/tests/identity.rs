//! Container and pod identity end to end: engines moved into cgroups whose
//! paths have the formats Kubernetes runtimes create (systemd driver on
//! cgroup v2; cgroupfs driver on a v1 hierarchy when the machine has one);
//! their records carry `container_id` / `k8s_pod_uid`, and their request
//! metrics arrive under an OTLP resource of their own with `container.id`
//! and `k8s.pod.uid` (what a Collector's `k8sattributes` processor
//! associates on), while the agent's own metrics keep the agent's resource.

use std::{net::TcpStream, path::Path, time::Duration};

use opentelemetry_proto::tonic::{
    collector::metrics::v1::ExportMetricsServiceRequest, common::v1::any_value::Value as Any,
};
use serde_json::json;
use tokentap_tests::{
    assert_root,
    cgroups::{v1_root, v2_root, Cgroups},
    http, interrupt,
    otlp::Receiver,
    read_jsonl, scratch_dir, start_simengine, RunAgent,
};

const ID_V2: &str = "a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90";
const POD_V2: &str = "0c1d2e3f-4a5b-4c6d-8e9f-0a1b2c3d4e5f";
const ID_V1: &str = "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100";
const POD_V1: &str = "9f8e7d6c-5b4a-4938-8271-605f4e3d2c1b";

fn resource_of(
    exports: &[ExportMetricsServiceRequest],
    metric: &str,
    key: &str,
    value: &str,
) -> bool {
    exports.iter().flat_map(|e| &e.resource_metrics).any(|rm| {
        let has_attr = rm.resource.as_ref().is_some_and(|r| {
            r.attributes.iter().any(|kv| {
                kv.key == key
                    && matches!(kv.value.as_ref().and_then(|v| v.value.as_ref()),
                        Some(Any::StringValue(s)) if s == value)
            })
        });
        has_attr
            && rm
                .scope_metrics
                .iter()
                .flat_map(|sm| &sm.metrics)
                .any(|m| m.name == metric)
    })
}

fn resource_attr(exports: &[ExportMetricsServiceRequest], id: &str, key: &str) -> Option<String> {
    exports
        .iter()
        .flat_map(|e| &e.resource_metrics)
        .filter_map(|rm| rm.resource.as_ref())
        .find(|r| {
            r.attributes.iter().any(|kv| {
                kv.key == "container.id"
                    && matches!(kv.value.as_ref().and_then(|v| v.value.as_ref()),
                        Some(Any::StringValue(s)) if s == id)
            })
        })
        .and_then(|r| r.attributes.iter().find(|kv| kv.key == key))
        .and_then(
            |kv| match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(Any::StringValue(s)) => Some(s.clone()),
                _ => None,
            },
        )
}

#[test]
#[ignore = "needs root: loads eBPF and creates cgroups (cargo xtask test runs it as root)"]
fn engines_in_pod_cgroups_are_labelled_and_exported_under_their_own_resource() {
    assert_root("container identity");
    let v2 = v2_root().expect("a cgroup v2 hierarchy (pure or hybrid)");
    let otlp = Receiver::start();
    let dir = scratch_dir("identity");
    let log = dir.join("requests.jsonl");
    let bin = Path::new(env!("CARGO_BIN_EXE_simengine"));
    let mut cg = Cgroups(vec![]);

    // Engine 1: containerd + systemd driver on cgroup v2.
    let (e1, port1, _) = start_simengine(bin, &[]);
    let pod_ = POD_V2.replace('-', "_");
    cg.put(
        &v2,
        &format!(
            "tt-kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{pod_}.slice/cri-containerd-{ID_V2}.scope"
        ),
        e1.0.id(),
    );
    // Engine 2: cgroupfs driver on a v1 hierarchy (when there is one), else
    // CRI-O's systemd-driver name on v2.
    let (e2, port2, _) = start_simengine(bin, &[]);
    let v1 = v1_root();
    match &v1 {
        Some(root) => cg.put(
            root,
            &format!("tt-kubepods/burstable/pod{POD_V1}/{ID_V1}"),
            e2.0.id(),
        ),
        None => cg.put(
            &v2,
            &format!(
                "tt-kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice/crio-{ID_V1}.scope",
                POD_V1.replace('-', "_")
            ),
            e2.0.id(),
        ),
    }
    // Engine 3: not in a container.
    let (e3, port3, _) = start_simengine(bin, &[]);

    let (mut agent, out) = RunAgent::new()
        .no_gpu()
        .pid(e1.0.id())
        .pid(e2.0.id())
        .pid(e3.0.id())
        .requests_log(&log)
        .otlp(otlp.port)
        .start();
    for (i, port) in [port1, port2, port3].into_iter().enumerate() {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        for k in 0..2 {
            let body = json!({"model": format!("m{i}"), "stream": true,
                "sim": {"id": k, "ttft_ms": 2, "gap_ms": 1, "tokens": 3}});
            assert!(
                http::round_trip(&mut s, "/v1/chat/completions", &body.to_string())
                    .unwrap()
                    .complete
            );
        }
    }
    std::thread::sleep(Duration::from_millis(1500));
    let (ok, lines) = interrupt(&mut agent, out);
    assert!(ok, "{lines:?}");

    let recs = read_jsonl(&log);
    assert_eq!(recs.len(), 6, "{lines:?}");
    for r in &recs {
        let pid = r["pid"].as_u64().unwrap() as u32;
        let (id, pod) = if pid == e1.0.id() {
            (json!(ID_V2), json!(POD_V2))
        } else if pid == e2.0.id() {
            (json!(ID_V1), json!(POD_V1))
        } else {
            (json!(null), json!(null))
        };
        assert_eq!(r["container_id"], id, "{r}");
        assert_eq!(r["k8s_pod_uid"], pod, "{r}");
    }
    let exports = otlp.metrics.exports();
    for id in [ID_V2, ID_V1] {
        assert!(
            resource_of(
                &exports,
                "gen_ai.server.request.duration",
                "container.id",
                id
            ),
            "request metrics under container {id}'s resource"
        );
    }
    assert_eq!(
        resource_attr(&exports, ID_V2, "k8s.pod.uid").as_deref(),
        Some(POD_V2)
    );
    assert_eq!(
        resource_attr(&exports, ID_V1, "k8s.pod.uid").as_deref(),
        Some(POD_V1)
    );
    // The engine outside containers, and the agent's own health, under the
    // agent's resource (no container.id).
    let agent_resource_has = |metric: &str| {
        exports.iter().flat_map(|e| &e.resource_metrics).any(|rm| {
            rm.resource
                .as_ref()
                .is_some_and(|r| !r.attributes.iter().any(|kv| kv.key == "container.id"))
                && rm
                    .scope_metrics
                    .iter()
                    .flat_map(|sm| &sm.metrics)
                    .any(|m| m.name == metric)
        })
    };
    assert!(agent_resource_has("tokentap.capture.events"));
    assert!(agent_resource_has("gen_ai.server.request.duration"));
    drop((e1, e2, e3));
    std::thread::sleep(Duration::from_millis(200));
    drop(cg);
}
