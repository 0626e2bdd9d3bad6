//! `--kube-metadata`: names for the pods the agent sees, from the
//! Kubernetes API, for users without a Collector `k8sattributes`
//! processor.
//!
//! A background task watches the pods **of this node** (`spec.nodeName`
//! field selector; `NODE_NAME` from the downward API) and keeps an index:
//! pod UID → name, namespace, labels; pod IP → pod (for callers on this
//! node). A caller whose IP is not a pod of this node is looked up once,
//! on demand (`list pods` with a `status.podIP` field selector), and the
//! answer (pod or "not a pod") cached for a while. Only get/list/watch on
//! pods is used.
//!
//! The API may be down when the agent starts, or later: records flow
//! without names meanwhile (nothing waits on the API), and names appear
//! once the watch lists the pods. The `KubePods` enricher
//! (`pipeline::enrich`) reads the index synchronously; a lookup it asks
//! for is answered for later records.
//!
//! Owns: the watch, the index, the caller lookups. Must not: block the
//! pipeline, or keep anything but names, namespaces, labels and IPs.

use std::{
    collections::{BTreeMap, HashMap},
    net::IpAddr,
    sync::{Arc, RwLock},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::{
    api::{Api, ListParams},
    runtime::watcher,
    Client,
};
use tokio::sync::mpsc;

/// The pod label that overrides an engine's model version
/// (`identity::model_version`), e.g. set by a rollout tool.
pub const MODEL_VERSION_LABEL: &str = "tokentap.io/model-version";

/// How long a caller lookup's answer is kept: a pod IP is reused only
/// after its pod is gone, and "not a pod" (a node, a load balancer) rarely
/// changes.
const REMOTE_POD_TTL: Duration = Duration::from_secs(300);
const REMOTE_NOT_POD_TTL: Duration = Duration::from_secs(60);
/// Cached caller lookups (one entry per distinct peer IP).
const MAX_REMOTE: usize = 4096;
/// Lookups waiting: more are dropped (and asked again by a later record).
const LOOKUP_QUEUE: usize = 256;
/// Between two attempts of a failed watch or list.
const RETRY: Duration = Duration::from_secs(1);
const MAX_RETRY: Duration = Duration::from_secs(10);

/// What the agent keeps of a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodMeta {
    pub name: String,
    pub namespace: String,
    pub labels: BTreeMap<String, String>,
    /// Its containers' images from its status: container id (the
    /// runtime's, without its `containerd://` scheme) → (image as the pod
    /// names it, image id the runtime reports).
    pub images: BTreeMap<String, (String, String)>,
}

/// `oci.manifest.digest` of a runtime's image id
/// (`docker.io/vllm/vllm-openai@sha256:…` → `sha256:…`; an id that is a
/// bare digest stays as it is).
pub fn image_digest(image_id: &str) -> &str {
    image_id.rsplit_once('@').map_or(image_id, |(_, d)| d)
}

/// An image reference's name and tag (`vllm/vllm-openai:v0.6.1` →
/// (`vllm/vllm-openai`, `v0.6.1`); a port in the registry is no tag).
pub fn image_name_tag(image: &str) -> (&str, Option<&str>) {
    let image = image.split_once('@').map_or(image, |(n, _)| n);
    match image.rsplit_once(':') {
        Some((n, t)) if !t.contains('/') => (n, Some(t)),
        _ => (image, None),
    }
}

impl PodMeta {
    /// `namespace/name`, the caller's name.
    pub fn qualified(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

#[derive(Default, Debug)]
struct Index {
    by_uid: HashMap<String, Arc<PodMeta>>,
    /// Pods of this node by IP (not `hostNetwork` pods: their IP is the
    /// node's).
    by_ip: HashMap<IpAddr, Arc<PodMeta>>,
    /// Callers that are not pods of this node: the lookup's answer.
    remote: HashMap<IpAddr, (Option<Arc<PodMeta>>, Instant)>,
    /// The initial list of the current watch has completed.
    synced: bool,
}

impl Index {
    fn replace(&mut self, pods: Vec<Pod>) {
        self.by_uid.clear();
        self.by_ip.clear();
        for p in pods {
            self.apply(p);
        }
    }

    fn apply(&mut self, p: Pod) {
        let Some((uid, meta, ips)) = summarise(&p) else {
            return;
        };
        self.remove_uid(&uid);
        let meta = Arc::new(meta);
        for ip in ips {
            self.by_ip.insert(ip, meta.clone());
        }
        self.by_uid.insert(uid, meta);
    }

    fn delete(&mut self, p: &Pod) {
        if let Some(uid) = p.metadata.uid.as_deref() {
            self.remove_uid(uid);
        }
    }

    fn remove_uid(&mut self, uid: &str) {
        if let Some(old) = self.by_uid.remove(uid) {
            self.by_ip.retain(|_, m| !Arc::ptr_eq(m, &old));
        }
    }
}

/// A pod's UID, what is kept of it, and its IPs (none for `hostNetwork`).
fn summarise(p: &Pod) -> Option<(String, PodMeta, Vec<IpAddr>)> {
    let uid = p.metadata.uid.clone()?;
    let meta = PodMeta {
        name: p.metadata.name.clone()?,
        namespace: p.metadata.namespace.clone().unwrap_or_default(),
        labels: p.metadata.labels.clone().unwrap_or_default(),
        images: p
            .status
            .iter()
            .flat_map(|st| st.container_statuses.iter().flatten())
            .filter_map(|c| {
                let id = c.container_id.as_deref()?;
                let id = id.split_once("://").map_or(id, |(_, id)| id);
                Some((id.to_string(), (c.image.clone(), c.image_id.clone())))
            })
            .collect(),
    };
    let host_network = p
        .spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false);
    let mut ips = Vec::new();
    if !host_network {
        if let Some(st) = &p.status {
            for ip in st.pod_ips.iter().flatten() {
                if let Ok(a) = ip.ip.parse() {
                    ips.push(a);
                }
            }
            if let Some(a) = st.pod_ip.as_deref().and_then(|s| s.parse().ok()) {
                if !ips.contains(&a) {
                    ips.push(a);
                }
            }
        }
    }
    Some((uid, meta, ips))
}

/// The shared index and the way to ask for a caller lookup. Cheap to clone.
#[derive(Clone)]
pub struct KubeMeta {
    index: Arc<RwLock<Index>>,
    lookups: mpsc::Sender<IpAddr>,
}

impl KubeMeta {
    /// Starts the watch and the lookup worker on the current tokio
    /// runtime. Fails only when no API configuration can be found at all
    /// (not in a cluster, no kubeconfig); an unreachable API is retried in
    /// the background.
    pub async fn start(node: &str) -> Result<Self> {
        let client = Client::try_default().await.context(
            "--kube-metadata: no Kubernetes API configuration (in-cluster service account or KUBECONFIG)",
        )?;
        let index = Arc::new(RwLock::new(Index::default()));
        let (tx, rx) = mpsc::channel(LOOKUP_QUEUE);
        tokio::spawn(watch(client.clone(), node.to_string(), index.clone()));
        tokio::spawn(lookups(client, rx, index.clone()));
        Ok(Self { index, lookups: tx })
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Index> {
        self.index.read().unwrap_or_else(|p| p.into_inner())
    }

    /// The pod with this UID, if it is one of this node's.
    pub fn pod(&self, uid: &str) -> Option<Arc<PodMeta>> {
        self.read().by_uid.get(uid).cloned()
    }

    /// The pod with this IP: this node's pods from the watch, others from a
    /// cached lookup. `None` now (and a lookup queued) when not known yet.
    pub fn caller_pod(&self, ip: IpAddr) -> Option<Arc<PodMeta>> {
        {
            let ix = self.read();
            if let Some(p) = ix.by_ip.get(&ip) {
                return Some(p.clone());
            }
            if !ix.synced {
                // Until this node's pods are listed, a local caller would
                // be looked up as a remote one for nothing.
                return None;
            }
            if let Some(hit) = ix.remote.get(&ip).filter(|h| fresh(h)) {
                return hit.0.clone();
            }
        }
        // Full queue: a later record asks again.
        let _ = self.lookups.try_send(ip);
        None
    }
}

/// A cached caller lookup still to be trusted.
fn fresh((pod, at): &(Option<Arc<PodMeta>>, Instant)) -> bool {
    let ttl = if pod.is_some() {
        REMOTE_POD_TTL
    } else {
        REMOTE_NOT_POD_TTL
    };
    at.elapsed() < ttl
}

/// Keeps the index equal to this node's pods, through API outages.
async fn watch(client: Client, node: String, index: Arc<RwLock<Index>>) {
    let api: Api<Pod> = Api::all(client);
    let cfg = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let mut stream = watcher(api, cfg).boxed();
    let mut pending: Vec<Pod> = Vec::new();
    let mut delay = RETRY;
    let mut failing = false;
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(ev) => {
                if failing {
                    eprintln!(
                        "tokentap: Kubernetes API reachable again; watching pods on node {node}"
                    );
                    failing = false;
                }
                delay = RETRY;
                let mut ix = index.write().unwrap_or_else(|p| p.into_inner());
                match ev {
                    watcher::Event::Init => pending.clear(),
                    watcher::Event::InitApply(p) => pending.push(p),
                    watcher::Event::InitDone => {
                        ix.replace(std::mem::take(&mut pending));
                        ix.synced = true;
                    }
                    watcher::Event::Apply(p) => ix.apply(p),
                    watcher::Event::Delete(p) => ix.delete(&p),
                }
            }
            Err(e) => {
                if !failing {
                    eprintln!(
                        "tokentap: cannot watch pods on node {node} ({e}); requests are recorded without pod names until the API answers (retrying)"
                    );
                    failing = true;
                }
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(MAX_RETRY);
            }
        }
    }
}

/// Answers caller lookups, one at a time (they are rare: once per new
/// peer IP per TTL).
async fn lookups(client: Client, mut rx: mpsc::Receiver<IpAddr>, index: Arc<RwLock<Index>>) {
    let api: Api<Pod> = Api::all(client);
    while let Some(ip) = rx.recv().await {
        {
            let ix = index.read().unwrap_or_else(|p| p.into_inner());
            if ix.by_ip.contains_key(&ip) {
                continue;
            }
            // Asked several times before the first answer came back.
            if ix.remote.get(&ip).is_some_and(fresh) {
                continue;
            }
        }
        let lp = ListParams::default().fields(&format!("status.podIP={ip}"));
        let answer = match api.list(&lp).await {
            Ok(list) => list
                .items
                .iter()
                .filter(|p| {
                    !p.spec
                        .as_ref()
                        .and_then(|s| s.host_network)
                        .unwrap_or(false)
                })
                .filter_map(summarise)
                .map(|(_, m, _)| Arc::new(m))
                .next(),
            // Unanswered: not cached, asked again by a later record.
            Err(_) => {
                tokio::time::sleep(RETRY).await;
                continue;
            }
        };
        let mut ix = index.write().unwrap_or_else(|p| p.into_inner());
        if ix.remote.len() >= MAX_REMOTE {
            ix.remote.retain(|_, hit| fresh(hit));
        }
        if ix.remote.len() < MAX_REMOTE {
            ix.remote.insert(ip, (answer, Instant::now()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodIP, PodSpec, PodStatus};
    use kube::api::ObjectMeta;

    fn pod(uid: &str, name: &str, ip: Option<&str>, host_network: bool) -> Pod {
        Pod {
            metadata: ObjectMeta {
                uid: Some(uid.into()),
                name: Some(name.into()),
                namespace: Some("ml".into()),
                labels: Some([("app".to_string(), name.to_string())].into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                host_network: Some(host_network),
                ..Default::default()
            }),
            status: Some(PodStatus {
                pod_ip: ip.map(str::to_string),
                pod_ips: ip.map(|i| vec![PodIP { ip: i.to_string() }]),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn a_pods_container_images_are_kept_by_container_id() {
        use k8s_openapi::api::core::v1::ContainerStatus;
        let mut p = pod("u1", "engine-a", Some("10.0.0.5"), false);
        p.status.as_mut().unwrap().container_statuses = Some(vec![ContainerStatus {
            name: "vllm".into(),
            container_id: Some("containerd://0123abcd".into()),
            image: "docker.io/vllm/vllm-openai:v0.6.1".into(),
            image_id: "docker.io/vllm/vllm-openai@sha256:feed".into(),
            ..Default::default()
        }]);
        let (_, meta, _) = summarise(&p).unwrap();
        let (image, id) = &meta.images["0123abcd"];
        assert_eq!(
            image_name_tag(image),
            ("docker.io/vllm/vllm-openai", Some("v0.6.1"))
        );
        assert_eq!(image_digest(id), "sha256:feed");
        assert_eq!(
            image_name_tag("registry:5000/engine"),
            ("registry:5000/engine", None)
        );
        assert_eq!(image_name_tag("engine@sha256:ab"), ("engine", None));
    }

    #[test]
    fn an_updated_pod_replaces_its_old_name_and_ip_and_a_deleted_one_is_forgotten() {
        let mut ix = Index::default();
        ix.replace(vec![pod("u1", "engine-a", Some("10.0.0.5"), false)]);
        let ip: IpAddr = "10.0.0.5".parse().unwrap();
        assert_eq!(ix.by_uid["u1"].name, "engine-a");
        assert_eq!(ix.by_ip[&ip].name, "engine-a");
        ix.apply(pod("u1", "engine-a", Some("10.0.0.6"), false));
        assert!(!ix.by_ip.contains_key(&ip), "the old IP is gone");
        assert_eq!(ix.by_ip[&"10.0.0.6".parse().unwrap()].name, "engine-a");
        ix.delete(&pod("u1", "engine-a", None, false));
        assert!(ix.by_uid.is_empty() && ix.by_ip.is_empty());
    }

    #[test]
    fn a_host_network_pod_is_named_by_uid_but_never_by_the_nodes_ip() {
        let mut ix = Index::default();
        ix.apply(pod("u2", "node-exporter", Some("192.168.1.10"), true));
        assert!(ix.by_uid.contains_key("u2"));
        assert!(ix.by_ip.is_empty());
    }

    #[test]
    fn a_relist_drops_pods_that_are_gone() {
        let mut ix = Index::default();
        ix.apply(pod("u1", "a", Some("10.0.0.1"), false));
        ix.replace(vec![pod("u2", "b", Some("10.0.0.2"), false)]);
        assert!(!ix.by_uid.contains_key("u1"));
        assert_eq!(ix.by_ip.len(), 1);
    }
}
