//! `engine.start` / `engine.stop` from the targeted processes, and
//! `model_version.new` / `.rollout` / `.rollback` from the versions on the
//! records (where a pod label may have overridden the fingerprint).

use std::collections::{HashMap, HashSet};

use super::{kind, round4, Config, Event};
use crate::{
    record::Finished,
    stage::{
        events::{Detector, RecordCx},
        NodeState, ProcessInfo,
    },
};

/// The engines serving HTTP at the last tick, and what they were.
#[derive(Default)]
pub struct Engines {
    known: HashMap<u32, ProcessInfo>,
    /// The first tick has run (engines found then were already running
    /// when the agent started).
    primed: bool,
    /// Engine processes whose build and configuration were compared.
    compared: HashSet<u32>,
    /// The last build and configuration (final ones: `info_settled`) per
    /// served model on the node (`engine/model`).
    environment: HashMap<String, Environment>,
    /// The last container image per served model (from records).
    images: HashMap<String, String>,
}

struct Environment {
    version: Option<String>,
    config: Option<crate::identity::serving_config::ServingConfig>,
    pid: u32,
}

/// What "one served model on the node" is keyed by.
fn served_key(engine: Option<&str>, model: Option<&str>) -> String {
    format!("{}/{}", engine.unwrap_or("engine"), model.unwrap_or("?"))
}

fn engine_event(k: &'static str, ts: u64, pid: u32, p: &ProcessInfo, what: &str) -> Event {
    let engine = p.engine.map_or("engine", |e| e.name());
    let serving = p
        .model
        .as_deref()
        .map(|m| format!(" serving {m}"))
        .unwrap_or_default();
    let version = p.model_version.as_deref().unwrap_or("unknown");
    let ports: Vec<String> = p.listen_ports.iter().map(|p| p.to_string()).collect();
    let c = p.container.as_ref();
    Event::new(
        ts,
        k,
        format!(
            "{engine} (pid {pid}){serving}, model version {version}, port {} {what}",
            ports.join(",")
        ),
    )
    .with("gen_ai.provider.name", p.engine.map(|e| e.name()))
    .with("process.pid", pid)
    .with("gen_ai.request.model", p.model.clone())
    .with("tokentap.model.version", p.model_version.clone())
    .with(
        "server.port",
        p.listen_ports.iter().map(|&p| p as u32).collect::<Vec<_>>(),
    )
    .with("container.id", c.map(|c| c.id.clone()))
    .with("k8s.pod.uid", c.and_then(|c| c.pod_uid.clone()))
}

impl Engines {
    pub fn on_tick(&mut self, now_ns: u64, node: &NodeState, out: &mut Vec<Event>) {
        let serving: HashSet<u32> = node.serving_pids().into_iter().collect();
        let mut started: Vec<u32> = serving
            .iter()
            .copied()
            .filter(|p| !self.known.contains_key(p))
            .collect();
        started.sort_unstable();
        // A target found forwarding requests to an engine (a gateway) was
        // never an engine: it leaves without an `engine.stop`.
        self.known.retain(|p, _| !node.gateways.contains(p));
        let mut stopped: Vec<u32> = self
            .known
            .keys()
            .copied()
            .filter(|p| !serving.contains(p))
            .collect();
        stopped.sort_unstable();
        for pid in stopped {
            if let Some(p) = self.known.remove(&pid) {
                out.push(engine_event(kind::ENGINE_STOP, now_ns, pid, &p, "stopped"));
            }
        }
        for pid in started {
            let p = node.processes[&pid].clone();
            let what = if self.primed {
                "started"
            } else {
                "was running when the agent started"
            };
            out.push(
                engine_event(kind::ENGINE_START, now_ns, pid, &p, what)
                    .with("tokentap.already_running", !self.primed),
            );
            self.known.insert(pid, p);
        }
        // Engine processes whose build and configuration are final now:
        // against the last ones of the model they serve.
        let mut settled: Vec<u32> = serving
            .iter()
            .copied()
            .filter(|pid| !self.compared.contains(pid) && node.processes[pid].info_settled)
            .collect();
        settled.sort_unstable();
        for pid in settled {
            self.compared.insert(pid);
            self.environment_of(now_ns, pid, &node.processes[&pid], out);
        }
        self.compared.retain(|p| serving.contains(p));
        // A process that stayed but changed (exec'd into another model).
        for pid in serving {
            if let (Some(old), Some(new)) = (self.known.get_mut(&pid), node.processes.get(&pid)) {
                if old.model_version != new.model_version || old.engine != new.engine {
                    *old = new.clone();
                }
            }
        }
        self.primed = true;
    }
}

impl Engines {
    /// `engine.version.change` / `engine.config.change` when the process
    /// `pid` serves its model with another build or configuration than the
    /// last process that served it on this node (the first one sets what
    /// later ones are compared with). Never a model version event: the
    /// model version leaves both out.
    fn environment_of(&mut self, ts: u64, pid: u32, p: &ProcessInfo, out: &mut Vec<Event>) {
        let engine = p.engine.map(|e| e.name());
        let key = served_key(engine, p.model.as_deref());
        let new = Environment {
            version: p.engine_version.clone(),
            config: p.serving_config.clone(),
            pid,
        };
        let Some(old) = self.environment.get(&key) else {
            if self.environment.len() < MAX_SERVED {
                self.environment.insert(key, new);
            }
            return;
        };
        let shown = p.model.as_deref().unwrap_or("?");
        let name = engine.unwrap_or("engine");
        let base = |k: &'static str, msg: String| {
            Event::new(ts, k, msg)
                .with("gen_ai.provider.name", engine)
                .with("gen_ai.request.model", p.model.clone())
                .with("tokentap.model.version", p.model_version.clone())
                .with("tokentap.engine.version", p.engine_version.clone())
                .with(CONFIG, p.serving_config.as_ref().map(|c| c.version.clone()))
                .with("process.pid", pid)
                .with("process.pid.previous", old.pid)
                .with("container.id", p.container.as_ref().map(|c| c.id.clone()))
                .with(
                    "k8s.pod.uid",
                    p.container.as_ref().and_then(|c| c.pod_uid.clone()),
                )
        };
        if let (Some(a), Some(b)) = (&old.version, &new.version) {
            if a != b {
                out.push(
                    base(
                        kind::ENGINE_VERSION_CHANGE,
                        format!("{name} serving {shown}: build {a} → {b} (pid {pid})"),
                    )
                    .with("tokentap.engine.version.previous", a.clone()),
                );
            }
        }
        if let (Some(a), Some(b)) = (&old.config, &new.config) {
            if a.version != b.version {
                let changes = crate::identity::serving_config::changes(&a.params, &b.params);
                let said: Vec<String> = changes
                    .iter()
                    .map(|(k, o, n)| {
                        format!(
                            "{k} {} → {}",
                            o.as_deref().unwrap_or("(unset)"),
                            n.as_deref().unwrap_or("(unset)")
                        )
                    })
                    .collect();
                let side =
                    |pick: fn(&crate::identity::serving_config::Change) -> &Option<String>| {
                        serde_json::Value::Object(
                            changes
                                .iter()
                                .filter_map(|c| Some((c.0.clone(), pick(c).clone()?.into())))
                                .collect(),
                        )
                    };
                out.push(
                    base(
                        kind::ENGINE_CONFIG_CHANGE,
                        format!(
                            "{name} serving {shown}: serving configuration {} → {}: {} (pid {pid})",
                            a.version,
                            b.version,
                            said.join(", ")
                        ),
                    )
                    .with(PREVIOUS_CONFIG, a.version.clone())
                    .with(
                        "changed",
                        changes.iter().map(|c| c.0.clone()).collect::<Vec<_>>(),
                    )
                    .with("previous", side(|c| &c.1))
                    .with("current", side(|c| &c.2))
                    // The whole new set (secrets were never in it).
                    .with(
                        "serving_config",
                        serde_json::Value::Object(
                            b.params
                                .iter()
                                .map(|(k, v)| (k.clone(), v.clone().into()))
                                .collect(),
                        ),
                    ),
                );
            }
        }
        // What is known replaces what was (an unknown build keeps the last
        // known one to compare with).
        let slot = self.environment.get_mut(&key).expect("present");
        if new.version.is_some() {
            slot.version = new.version;
        }
        if new.config.is_some() {
            slot.config = new.config;
        }
        slot.pid = pid;
    }

    /// `engine.image.change`: a record of a served model from a container
    /// whose image (the pod's status, `--kube-metadata`) differs from the
    /// last one seen serving it.
    pub fn on_record(&mut self, f: &Finished, t: u64, out: &mut Vec<Event>) {
        let Some(image) = f.container_image.as_deref() else {
            return;
        };
        let id = f.container_image_id.as_deref().unwrap_or(image);
        let model = f.response_model.as_deref().or(f.request_model.as_deref());
        let key = served_key(f.provider.as_deref(), model);
        match self.images.get(&key) {
            Some(last) if last == id => {}
            Some(last) => {
                let previous = last.clone();
                out.push(
                    Event::new(
                        t,
                        kind::ENGINE_IMAGE_CHANGE,
                        format!(
                            "{} serving {}: image {image} ({id}), was {previous}",
                            f.provider.as_deref().unwrap_or("engine"),
                            model.unwrap_or("?")
                        ),
                    )
                    .with("gen_ai.provider.name", f.provider.clone())
                    .with("gen_ai.request.model", model)
                    .with("container.image.name", image)
                    .with("oci.manifest.digest", f.container_image_id.clone())
                    .with("container.image.id.previous", previous)
                    .with("process.pid", f.pid)
                    .with("container.id", f.container_id.clone())
                    .with("k8s.pod.name", f.k8s_pod_name.clone())
                    .with("k8s.namespace.name", f.k8s_namespace.clone()),
                );
                self.images.insert(key, id.to_string());
            }
            None if self.images.len() < MAX_SERVED => {
                self.images.insert(key, id.to_string());
            }
            None => {}
        }
    }
}

/// The event attributes naming the serving configuration's version, and
/// the one a change replaced.
const CONFIG: &str = "tokentap.serving_config.version";
const PREVIOUS_CONFIG: &str = "tokentap.serving_config.version.previous";

/// Served models whose build, configuration and image are kept at most.
const MAX_SERVED: usize = 1024;

struct VersionState {
    last_seen_ns: u64,
    /// Another version took over from it.
    replaced: bool,
}

/// What one served model name has been served as.
struct ModelTrack {
    current: String,
    versions: HashMap<String, VersionState>,
}

impl Detector for Engines {
    fn kinds(&self) -> &'static [&'static str] {
        &[
            kind::ENGINE_START,
            kind::ENGINE_STOP,
            kind::ENGINE_VERSION_CHANGE,
            kind::ENGINE_CONFIG_CHANGE,
            kind::ENGINE_IMAGE_CHANGE,
        ]
    }

    fn record(&mut self, f: &Finished, cx: &RecordCx<'_>, out: &mut Vec<Event>) {
        self.on_record(f, cx.end_ns, out);
    }

    fn tick(&mut self, now_ns: u64, node: &NodeState, out: &mut Vec<Event>) {
        self.on_tick(now_ns, node, out);
    }
}

impl Detector for Models {
    fn kinds(&self) -> &'static [&'static str] {
        &[
            kind::MODEL_VERSION_NEW,
            kind::MODEL_VERSION_ROLLOUT,
            kind::MODEL_VERSION_ROLLBACK,
        ]
    }

    fn record(&mut self, f: &Finished, cx: &RecordCx<'_>, out: &mut Vec<Event>) {
        self.on_record(f, cx.end_ns, out);
    }
}

/// Model versions per served model name.
pub struct Models {
    seen: HashSet<String>,
    by_model: HashMap<String, ModelTrack>,
    rollback_idle_ns: u64,
    max: usize,
}

impl Models {
    pub fn new(cfg: &Config) -> Self {
        Self {
            seen: HashSet::new(),
            by_model: HashMap::new(),
            rollback_idle_ns: (cfg.rollback_idle_s * 1e9) as u64,
            max: cfg.max_callers,
        }
    }

    pub fn on_record(&mut self, f: &Finished, t: u64, out: &mut Vec<Event>) {
        let Some(v) = f.model_version.as_deref() else {
            return;
        };
        let model = f
            .response_model
            .as_deref()
            .or(f.request_model.as_deref())
            .unwrap_or("");
        let base = |k: &'static str, msg: String| {
            Event::new(t, k, msg)
                .with("gen_ai.provider.name", f.provider.clone())
                .with("gen_ai.request.model", (!model.is_empty()).then_some(model))
                .with("tokentap.model.version", v)
                .with("process.pid", f.pid)
                .with("container.id", f.container_id.clone())
                .with("k8s.pod.uid", f.k8s_pod_uid.clone())
                .with("k8s.pod.name", f.k8s_pod_name.clone())
                .with("k8s.namespace.name", f.k8s_namespace.clone())
        };
        let shown = if model.is_empty() { "?" } else { model };
        if !self.seen.contains(v) && self.seen.len() < self.max {
            self.seen.insert(v.to_string());
            out.push(base(
                kind::MODEL_VERSION_NEW,
                format!("model version {v} first seen on this node, serving {shown}"),
            ));
        }
        let Some(track) = self.by_model.get_mut(model) else {
            if self.by_model.len() < self.max {
                let mut versions = HashMap::new();
                versions.insert(
                    v.to_string(),
                    VersionState {
                        last_seen_ns: t,
                        replaced: false,
                    },
                );
                self.by_model.insert(
                    model.to_string(),
                    ModelTrack {
                        current: v.to_string(),
                        versions,
                    },
                );
            }
            return;
        };
        if track.current == v {
            if let Some(s) = track.versions.get_mut(v) {
                s.last_seen_ns = s.last_seen_ns.max(t);
            }
            return;
        }
        let previous = track.current.clone();
        match track.versions.get_mut(v) {
            None => {
                if let Some(p) = track.versions.get_mut(&previous) {
                    p.replaced = true;
                }
                track.versions.insert(
                    v.to_string(),
                    VersionState {
                        last_seen_ns: t,
                        replaced: false,
                    },
                );
                track.current = v.to_string();
                out.push(
                    base(
                        kind::MODEL_VERSION_ROLLOUT,
                        format!("{shown}: version {v} replaces {previous}"),
                    )
                    .with("tokentap.model.version.previous", previous),
                );
            }
            Some(s) => {
                let idle = t.saturating_sub(s.last_seen_ns);
                let back = s.replaced && idle >= self.rollback_idle_ns;
                s.last_seen_ns = s.last_seen_ns.max(t);
                if back {
                    s.replaced = false;
                    if let Some(p) = track.versions.get_mut(&previous) {
                        p.replaced = true;
                    }
                    track.current = v.to_string();
                    out.push(
                        base(
                            kind::MODEL_VERSION_ROLLBACK,
                            format!(
                                "{shown}: version {v} is back, replacing {previous} (it last served {:.0} s before)",
                                idle as f64 / 1e9
                            ),
                        )
                        .with("tokentap.model.version.previous", previous)
                        .with("idle_s", round4(idle as f64 / 1e9)),
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::RequestRecord;

    fn rec(t_s: u64, model: &str, v: &str) -> Finished {
        Finished {
            record: RequestRecord {
                response_model: Some(model.into()),
                model_version: Some(v.into()),
                t0_ns: t_s * 1_000_000_000,
                ..Default::default()
            },
            seq: 0,
            content_events: 0,
            self_request: false,
            chunk_gaps_s: vec![],
            prompt_fp: None,
            text: None,
        }
    }

    fn kinds(m: &mut Models, recs: &[(u64, &str, &str)]) -> Vec<(String, String)> {
        let mut out = vec![];
        for (t, model, v) in recs {
            m.on_record(&rec(*t, model, v), t * 1_000_000_000, &mut out);
        }
        out.into_iter()
            .map(|e| {
                (
                    e.kind.to_string(),
                    e.attr("tokentap.model.version")
                        .and_then(|v| v.as_str())
                        .unwrap_or("")
                        .to_string(),
                )
            })
            .collect()
    }

    #[test]
    fn a_target_found_to_be_a_gateway_leaves_without_an_engine_stop() {
        let mut e = Engines::default();
        let mut node = NodeState::default();
        node.processes.insert(
            5,
            ProcessInfo {
                listen_ports: vec![8088],
                ..Default::default()
            },
        );
        let mut out = vec![];
        e.on_tick(1, &node, &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].kind, kind::ENGINE_START);
        node.gateways.insert(5);
        out.clear();
        e.on_tick(2, &node, &mut out);
        assert!(out.is_empty(), "{out:?}");
        // Gone for good: still nothing.
        node.processes.clear();
        e.on_tick(3, &node, &mut out);
        assert!(out.is_empty(), "{out:?}");
    }

    fn settled(version: &str, seqs: &str) -> ProcessInfo {
        let params = [("max-num-seqs".to_string(), seqs.to_string())].into();
        ProcessInfo {
            engine: Some(crate::engines::Engine::Vllm),
            model: Some("m".into()),
            listen_ports: vec![8000],
            engine_version: Some(version.into()),
            serving_config: Some(crate::identity::serving_config::ServingConfig::new(params)),
            info_settled: true,
            ..Default::default()
        }
    }

    #[test]
    fn a_restart_with_other_flags_or_build_says_which_moved() {
        let mut e = Engines::default();
        let mut node = NodeState::default();
        let mut kinds = vec![];
        for (pid, (v, s)) in [
            ("0.6.1", "64"),
            ("0.6.1", "256"),
            ("0.6.2", "256"),
            ("0.6.2", "256"),
        ]
        .into_iter()
        .enumerate()
        {
            node.processes.clear();
            node.processes.insert(pid as u32 + 10, settled(v, s));
            let mut out = vec![];
            e.on_tick(pid as u64, &node, &mut out);
            kinds.extend(
                out.iter()
                    .filter(|x| x.kind != kind::ENGINE_START && x.kind != kind::ENGINE_STOP)
                    .map(|x| x.kind),
            );
        }
        assert_eq!(
            kinds,
            vec![kind::ENGINE_CONFIG_CHANGE, kind::ENGINE_VERSION_CHANGE]
        );
    }

    #[test]
    fn launch_rollout_canary_and_rollback() {
        let mut m = Models::new(&Config::default());
        let e = kinds(
            &mut m,
            &[
                (0, "llama", "va"),
                (1, "llama", "va"),
                (95, "llama", "va"),
                (99, "llama", "va"),
                // vb launched beside va (a canary): one rollout, and va
                // still serving is no rollback.
                (100, "llama", "vb"),
                (101, "llama", "va"),
                (102, "llama", "vb"),
                (103, "llama", "va"),
                (104, "llama", "vb"),
                // va stops at 103; 60 s later only va serves again.
                (170, "llama", "va"),
                (171, "llama", "va"),
                // Another model's versions are its own.
                (172, "qwen", "vq"),
            ],
        );
        let want: Vec<(String, String)> = [
            ("model_version.new", "va"),
            ("model_version.new", "vb"),
            ("model_version.rollout", "vb"),
            ("model_version.rollback", "va"),
            ("model_version.new", "vq"),
        ]
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
        assert_eq!(e, want);
    }
}
