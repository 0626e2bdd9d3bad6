//! Enrichers: identity added to a finished record from what the agent
//! knows about the process that served it ([`NodeState`]): the engine
//! named by the process's command line, its container and pod, and the
//! model version it serves. (The GPU join is a stage of its own: it must
//! wait for samples; tenant, caller and request type come from the
//! request itself, in the decoder.)
//!
//! Owns: the rules for filling identity fields. Must not: change timing or
//! token fields (those are the decoder's arithmetic).

use crate::{
    host::kube,
    record::RequestRecord,
    stage::{Enricher, NodeState},
};

/// `provider` (gen_ai.provider.name) from the serving process's command
/// line, when the wire did not already say (an API only one engine speaks,
/// or a `Server` header naming the engine).
pub struct EngineName;

impl Enricher for EngineName {
    fn enrich(&mut self, r: &mut RequestRecord, node: &NodeState) {
        if r.provider.is_none() {
            r.provider = node
                .process(r.pid)
                .and_then(|p| p.engine)
                .map(|e| e.name().to_string());
        }
        // A joined gateway (the decoder knows its pid): its process name.
        if let Some(g) = r.gateway_pid {
            r.gateway = Some(
                node.process(g)
                    .and_then(|p| p.name.clone())
                    .unwrap_or_else(|| format!("pid {g}")),
            );
        }
    }
}

/// `container_id` and `k8s_pod_uid` of the serving process's container
/// (from its cgroup, read when the process was targeted).
pub struct Container;

impl Enricher for Container {
    fn enrich(&mut self, r: &mut RequestRecord, node: &NodeState) {
        if let Some(c) = node.process(r.pid).and_then(|p| p.container.as_ref()) {
            r.container_id = Some(c.id.clone());
            r.k8s_pod_uid = c.pod_uid.clone();
        }
    }
}

/// `model_version`, `engine_version` and `serving_config_version` from
/// what targeting (and the info task) learnt about the serving process
/// (once per process, see `identity::{model_version, engine_info,
/// serving_config}`); null for a process the agent does not know (a
/// replay).
pub struct ModelVersion;

impl Enricher for ModelVersion {
    fn enrich(&mut self, r: &mut RequestRecord, node: &NodeState) {
        let p = node.process(r.pid);
        r.model_version = p.and_then(|p| p.model_version.clone());
        // The engine's build and serving configuration: versioned apart
        // from the model, learnt the same way (once per process).
        r.engine_version = p.and_then(|p| p.engine_version.clone());
        r.serving_config_version = p
            .and_then(|p| p.serving_config.as_ref())
            .map(|c| c.version.clone());
    }
}

/// Pod names on records: `k8s_pod_name` / `k8s_namespace` of the engine's
/// pod (by the UID its cgroup gave), `caller` as the calling pod's
/// `namespace/name` when the peer is a pod, and the model version from the
/// engine pod's `tokentap.io/model-version` label when it has one (the
/// label wins over the engine's environment and the fingerprint: it is set
/// deliberately, per deployment).
pub struct KubePods(pub kube::KubeMeta);

impl Enricher for KubePods {
    fn enrich(&mut self, r: &mut RequestRecord, _node: &NodeState) {
        if let Some(pod) = r.k8s_pod_uid.as_deref().and_then(|u| self.0.pod(u)) {
            r.k8s_pod_name = Some(pod.name.clone());
            r.k8s_namespace = Some(pod.namespace.clone());
            // The engine container's image, from the pod's status.
            if let Some((image, id)) = r.container_id.as_deref().and_then(|c| pod.images.get(c)) {
                r.container_image = Some(image.clone());
                r.container_image_id = (!id.is_empty()).then(|| kube::image_digest(id).to_string());
            }
            if let Some(v) = pod.labels.get(kube::MODEL_VERSION_LABEL) {
                if !v.is_empty() {
                    r.model_version = Some(v.clone());
                }
            }
        }
        if let Some(ip) = r
            .caller
            .as_deref()
            .and_then(|c| c.parse::<std::net::IpAddr>().ok())
        {
            if let Some(pod) = self.0.caller_pod(ip) {
                r.caller = Some(pod.qualified());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stage::ProcessInfo;

    fn rec(pid: u32, provider: Option<&str>) -> RequestRecord {
        RequestRecord {
            pid,
            method: "POST".into(),
            path: "/v1/chat/completions".into(),
            status: Some(200),
            operation: Some(crate::vocab::Operation::Chat),
            provider: provider.map(str::to_string),
            stream: true,
            ..Default::default()
        }
    }

    #[test]
    fn the_processs_engine_fills_an_unknown_provider_only() {
        let mut node = NodeState::default();
        node.processes.insert(
            7,
            ProcessInfo {
                engine: Some(crate::engines::Engine::Vllm),
                ..Default::default()
            },
        );
        let mut r = rec(7, None);
        EngineName.enrich(&mut r, &node);
        assert_eq!(r.provider.as_deref(), Some("vllm"));
        let mut r = rec(7, Some("tgi"));
        EngineName.enrich(&mut r, &node);
        assert_eq!(r.provider.as_deref(), Some("tgi"), "the wire said so");
        let mut r = rec(8, None);
        EngineName.enrich(&mut r, &node);
        assert_eq!(r.provider, None, "unknown process");
    }

    #[test]
    fn the_serving_processs_model_version_goes_on_its_records_only() {
        let mut node = NodeState::default();
        node.processes.insert(
            7,
            ProcessInfo {
                engine: Some(crate::engines::Engine::LlamaCpp),
                model_version: Some("0123456789ab".into()),
                ..Default::default()
            },
        );
        node.processes.insert(8, ProcessInfo::default());
        let mut r = rec(7, None);
        ModelVersion.enrich(&mut r, &node);
        assert_eq!(r.model_version.as_deref(), Some("0123456789ab"));
        let mut r = rec(8, None);
        ModelVersion.enrich(&mut r, &node);
        assert_eq!(r.model_version, None, "known process, no version");
        let mut r = rec(9, None);
        ModelVersion.enrich(&mut r, &node);
        assert_eq!(r.model_version, None, "unknown process");
    }

    /// An engine's last requests, read from the ring after the tick that
    /// saw it exit, keep its facts; a few ticks later they are gone.
    #[test]
    fn an_exited_engines_last_records_keep_its_facts_a_few_ticks() {
        let mut node = NodeState::default();
        node.processes.insert(
            7,
            ProcessInfo {
                engine: Some(crate::engines::Engine::LlamaCpp),
                model_version: Some("0123456789ab".into()),
                listen_ports: vec![8080],
                ..Default::default()
            },
        );
        node.depart(7);
        assert!(node.serving_pids().is_empty(), "not serving once gone");
        for _ in 0..crate::stage::DEPARTED_TICKS - 1 {
            node.age_departed();
            let mut r = rec(7, None);
            EngineName.enrich(&mut r, &node);
            ModelVersion.enrich(&mut r, &node);
            assert_eq!(r.provider.as_deref(), Some("llama.cpp"));
            assert_eq!(r.model_version.as_deref(), Some("0123456789ab"));
        }
        node.age_departed();
        let mut r = rec(7, None);
        ModelVersion.enrich(&mut r, &node);
        assert_eq!(r.model_version, None, "forgotten");
        assert!(node.departed.is_empty());
    }
}
