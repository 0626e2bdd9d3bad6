//! Enrichers: identity added to a finished record from what the agent
//! knows about the process that served it ([`NodeState`]): the engine
//! named by the process's command line, its container and pod. (The GPU
//! join is a stage of its own: it must wait for samples.)
//!
//! Owns: the rules for filling identity fields. Must not: change timing or
//! token fields (those are the decoder's arithmetic).

use super::NodeState;
use crate::record::RequestRecord;

pub trait Enricher {
    fn enrich(&mut self, r: &mut RequestRecord, node: &NodeState);
}

/// `provider` (gen_ai.provider.name) from the serving process's command
/// line, when the wire did not already say (an API only one engine speaks,
/// or a `Server` header naming the engine).
pub struct EngineName;

impl Enricher for EngineName {
    fn enrich(&mut self, r: &mut RequestRecord, node: &NodeState) {
        if r.provider.is_none() {
            r.provider = node.processes.get(&r.pid).and_then(|p| p.engine.clone());
        }
    }
}

/// `container_id` and `k8s_pod_uid` of the serving process's container
/// (from its cgroup, read when the process was targeted).
pub struct Container;

impl Enricher for Container {
    fn enrich(&mut self, r: &mut RequestRecord, node: &NodeState) {
        if let Some(c) = node
            .processes
            .get(&r.pid)
            .and_then(|p| p.container.as_ref())
        {
            r.container_id = Some(c.id.clone());
            r.k8s_pod_uid = c.pod_uid.clone();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::ProcessInfo;

    fn rec(pid: u32, provider: Option<&str>) -> RequestRecord {
        RequestRecord {
            pid,
            method: "POST".into(),
            path: "/v1/chat/completions".into(),
            status: Some(200),
            operation: Some("chat"),
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
                engine: Some("vllm".into()),
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
}
