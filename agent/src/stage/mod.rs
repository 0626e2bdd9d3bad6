//! The stage contracts: what every feature implements or reads, below
//! every feature and above the sources of facts. A [`Sink`] is an output,
//! a [`Task`] periodic work beside the data path, an [`Enricher`] identity
//! added to a finished record; [`NodeState`] is what tasks learnt about
//! processes and enrichers read; [`health`] the agent's own counters.
//!
//! Owns: these traits and shared state types. Must not: import a feature,
//! a sink or the pipeline (docs/architecture.md, "Rooms").

pub mod events;
pub mod gpu;
pub mod health;

use std::collections::HashMap;

use anyhow::Result;

use crate::{
    capture::{Capture, ProcEvent},
    event::SocketEvent,
    record::{Finished, RequestRecord, RouteClass},
};

use self::gpu::{GpuSample, ProcSnapshot};

/// Identity added to a finished record from what the agent knows about the
/// process that served it (`pipeline/enrich.rs` has the enrichers).
pub trait Enricher {
    fn enrich(&mut self, r: &mut RequestRecord, node: &NodeState);
}

/// An output of finished requests (and of periodic state).
pub trait Sink {
    /// One finished, enriched LLM request.
    fn record(&mut self, f: &Finished) -> Result<()>;
    /// A finished request that is not an LLM request (a probe, a scrape, a
    /// model listing, an unknown path: [`Finished::non_llm_route`]),
    /// enriched with the engine's identity. Sinks that count or log such
    /// traffic override this; nothing LLM-related may see it.
    fn other_request(&mut self, _f: &Finished, _class: RouteClass) -> Result<()> {
        Ok(())
    }
    /// One timeline event (engine, model version, caller, drift, GPU);
    /// sinks that show or export events override this.
    fn event(&mut self, _e: &events::Event) -> Result<()> {
        Ok(())
    }
    /// Periodic work: flush, redraw, publish. Called once per pipeline
    /// tick; a sink whose exports run on a thread of their own has none.
    fn tick(&mut self, _t: &Tick<'_>) -> Result<()> {
        Ok(())
    }
    /// Last chance to flush or export; called once, after the last record.
    fn shutdown(self: Box<Self>, t: &Tick<'_>) -> Result<()>;
}

/// What a sink sees at a tick.
pub struct Tick<'a> {
    /// Wall-clock nanoseconds now.
    pub now_ns: u64,
    pub health: &'a health::HealthSnapshot,
}

/// What the agent knows about processes on this node, written by tasks
/// (targeting today; container, GPU and model identity next) and read by
/// enrichers.
#[derive(Default, Debug)]
pub struct NodeState {
    pub processes: HashMap<u32, ProcessInfo>,
    /// Processes that exited, kept for [`DEPARTED_TICKS`] ticks: the
    /// records the pipeline finishes after the tick that saw the exit
    /// (its last requests, read from the ring a moment later) still get
    /// their process's facts ([`NodeState::process`]); nothing else sees
    /// them (not serving, no GPU, no engine metrics).
    pub departed: HashMap<u32, Departed>,
    /// GPU samples (with the /proc facts the join needs) not yet taken by
    /// the pipeline's GPU stage.
    pub gpu_samples: Vec<(GpuSample, ProcSnapshot)>,
    /// NVML stopped answering (every GPU lost, driver gone): the GPU stage
    /// forgets its engine map until samples come back.
    pub gpu_unavailable: bool,
    /// Targets the decoder found forwarding requests to another target (a
    /// reverse proxy in front of an engine), for as long as they live
    /// ([`NodeState::set_forwarding`]).
    pub forwarding: std::collections::HashSet<u32>,
    /// Those and their masters ([`NodeState::set_forwarding`]): not engines,
    /// so not scraped for engine metrics nor counted as serving.
    pub gateways: std::collections::HashSet<u32>,
}

/// Ticks an exited process's facts stay readable for its last records.
pub const DEPARTED_TICKS: u8 = 3;

/// An exited process's facts ([`NodeState::departed`]).
#[derive(Clone, Debug)]
pub struct Departed {
    pub info: ProcessInfo,
    pub ticks_left: u8,
}

impl NodeState {
    /// The facts of the process a record came from: a live target's, or
    /// one that exited moments ago.
    pub fn process(&self, pid: u32) -> Option<&ProcessInfo> {
        self.processes
            .get(&pid)
            .or_else(|| self.departed.get(&pid).map(|d| &d.info))
    }

    /// Forgets process `pid` (it exited), keeping its facts for its last
    /// records a few ticks.
    pub fn depart(&mut self, pid: u32) {
        if let Some(info) = self.processes.remove(&pid) {
            self.departed.insert(
                pid,
                Departed {
                    info,
                    ticks_left: DEPARTED_TICKS,
                },
            );
        }
    }

    /// A tick passed: departed facts age, the oldest go.
    pub fn age_departed(&mut self) {
        self.departed.retain(|_, d| {
            d.ticks_left = d.ticks_left.saturating_sub(1);
            d.ticks_left > 0
        });
    }

    /// Adds the targets the decoder found forwarding. A process found
    /// forwarding stays a gateway while it lives, though the decoder forgets
    /// it once its upstream connections are long closed (an engine restart
    /// closes nginx's kept-alive ones): else it would turn back into a
    /// serving target, with a second `engine.start`. Also counts as a
    /// gateway the parent of one that is a target with no engine named
    /// and listens on nothing but ports its forwarding children listen on:
    /// nginx's (or a prefork proxy's) master, which owns the listening
    /// socket its workers accept from but never accepts or forwards
    /// itself, so it would otherwise stay an engine that serves nothing.
    pub fn set_forwarding(&mut self, found: &std::collections::HashSet<u32>) {
        let processes = &self.processes;
        let alive = |p: &u32| processes.contains_key(p);
        self.forwarding.retain(alive);
        self.forwarding.extend(found.iter().filter(|p| alive(p)));
        // A master stays one too while it lives (its workers may go first).
        self.gateways.retain(alive);
        let found = &self.forwarding;
        self.gateways.extend(found);
        let mut ports_of_children: HashMap<u32, Vec<u16>> = HashMap::new();
        for pid in found {
            if let Some(p) = self.processes.get(pid) {
                if let Some(ppid) = p.ppid {
                    ports_of_children
                        .entry(ppid)
                        .or_default()
                        .extend(&p.listen_ports);
                }
            }
        }
        for (parent, ports) in ports_of_children {
            let Some(p) = self.processes.get(&parent) else {
                continue;
            };
            if p.engine.is_none()
                && !p.listen_ports.is_empty()
                && p.listen_ports.iter().all(|port| ports.contains(port))
            {
                self.gateways.insert(parent);
            }
        }
    }

    /// Targets that serve HTTP (listen on TCP): the engines requests are
    /// attributed to. Their children (GPU workers) are targets too, but
    /// belong to them.
    pub fn serving_pids(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self
            .processes
            .iter()
            .filter(|(pid, p)| !p.listen_ports.is_empty() && !self.gateways.contains(pid))
            .map(|(pid, _)| *pid)
            .collect();
        v.sort_unstable();
        v
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcessInfo {
    /// Its name (`/proc/PID/comm`): what records call a gateway process.
    pub name: Option<String>,
    /// Its parent when it was named (`/proc/PID/stat`).
    pub ppid: Option<u32>,
    /// The engine its command line names (gen_ai.provider.name).
    pub engine: Option<crate::engines::Engine>,
    /// TCP ports it listens on (in its own network namespace), sorted.
    pub listen_ports: Vec<u16>,
    /// Its container (and pod), from its cgroup.
    pub container: Option<crate::host::procfs::ContainerIdentity>,
    /// What it serves (`identity::model_version`), computed once when it
    /// is named (and again when it execs), never per request.
    pub model_version: Option<String>,
    /// The served model as its command line names it (first served name,
    /// else first model path): what timeline events call the engine's model.
    pub model: Option<String>,
    /// Its build (`identity::engine_info`): the installed package's
    /// version, replaced by what its info endpoint says once fetched.
    pub engine_version: Option<String>,
    /// Its serving parameters (`identity::serving_config`): the command
    /// line's, plus the info endpoint's effective settings once fetched.
    pub serving_config: Option<crate::identity::serving_config::ServingConfig>,
    /// The info endpoint was asked (answered, or gave up): the version and
    /// configuration are final for this process.
    pub info_settled: bool,
    /// The tokenizer it loaded (`identity::tokenizer`), shared with every
    /// process serving the same files; found after the other facts.
    pub tokenizer: Option<crate::tokenize::Shared>,
    /// How finding it ended (None: not looked for yet).
    pub tokenizer_state: Option<crate::identity::tokenizer::State>,
}

/// Engine pid → (`gen_ai.provider.name`, model) as the OTLP sink's records
/// named them: what feature instruments attribute their values with.
pub type EngineNames = std::sync::Arc<std::sync::Mutex<HashMap<u32, (String, String)>>>;

/// OTLP instruments a feature contributes beside the request instruments
/// (GPU devices, the engine ↔ GPU map, engines' own metrics). The OTLP
/// sink registers every set on its meter and keeps what `register` returns
/// for as long as the meter lives, knowing nothing of the feature.
pub trait InstrumentSet: Send {
    /// Registers this set's (observable) instruments on `meter`.
    fn register(
        &self,
        meter: &opentelemetry::metrics::Meter,
        engines: &EngineNames,
    ) -> Box<dyn std::any::Any + Send>;
}

/// Periodic work beside the data path (finding engines, sampling GPUs).
pub trait Task {
    /// Runs once per pipeline tick, and as soon as process events arrive
    /// (then possibly several times a second: keep the work proportional to
    /// what changed, and rate-limit full scans yourself).
    fn tick(&mut self, cx: &mut TaskCx<'_>) -> Result<()>;
}

/// What a task may use at a tick.
pub struct TaskCx<'a> {
    /// The live capture (None when replaying).
    pub capture: Option<&'a mut Capture>,
    pub node: &'a mut NodeState,
    /// Socket events a task produces (seeded connections of a new target)
    /// go here, into the next batch.
    pub events: &'a mut Vec<SocketEvent>,
    /// Process events (exec, fork, exit) since the last tick.
    pub proc_events: &'a [ProcEvent],
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(ppid: u32, ports: &[u16], engine: Option<crate::engines::Engine>) -> ProcessInfo {
        ProcessInfo {
            ppid: Some(ppid),
            listen_ports: ports.to_vec(),
            engine,
            ..ProcessInfo::default()
        }
    }

    #[test]
    fn a_forwarding_workers_master_is_a_gateway_and_no_other_parent_is() {
        let mut node = NodeState::default();
        // nginx: master 10 and workers 11, 12 on 8080; an engine 20 on
        // 8000 whose parent is a shell (1).
        node.processes.insert(10, target(1, &[8080], None));
        node.processes.insert(11, target(10, &[8080], None));
        node.processes.insert(12, target(10, &[8080], None));
        node.processes.insert(20, target(1, &[8000], None));
        node.set_forwarding(&[11].into_iter().collect());
        assert_eq!(node.gateways, [10, 11].into_iter().collect());
        assert_eq!(node.serving_pids(), vec![12, 20]);
        // The decoder forgets 11 (its upstream connections long closed):
        // it stays a gateway while it lives, and goes when it exits.
        node.set_forwarding(&[12].into_iter().collect());
        assert_eq!(node.gateways, [10, 11, 12].into_iter().collect());
        node.processes.remove(&11);
        node.set_forwarding(&Default::default());
        assert_eq!(node.gateways, [10, 12].into_iter().collect());
        // Workers gone first (nginx stopping): the master stays one.
        node.processes.insert(11, target(10, &[8080], None));
        node.set_forwarding(&[11].into_iter().collect());
        node.processes.remove(&11);
        node.processes.remove(&12);
        node.set_forwarding(&[11, 12].into_iter().collect());
        assert_eq!(node.gateways, [10].into_iter().collect());
        node.processes.insert(11, target(10, &[8080], None));
        node.processes.insert(12, target(10, &[8080], None));

        // A parent that also serves a port of its own, one an engine was
        // named for, and one listening on nothing stay what they were.
        for parent in [
            target(1, &[8080, 9000], None),
            target(1, &[8080], Some(crate::engines::Engine::Vllm)),
            target(1, &[], None),
        ] {
            node.processes.insert(10, parent);
            node.forwarding.clear();
            node.gateways.clear();
            node.set_forwarding(&[11, 12].into_iter().collect());
            assert_eq!(node.gateways, [11, 12].into_iter().collect());
        }
    }
}
