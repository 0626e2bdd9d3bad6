//! Targeting: which processes the live capture follows, kept up to date
//! while the agent runs. With `--pid` the processes (and, in the kernel,
//! their children); with `--port`, whatever listens on those ports in any
//! network namespace, now or later (the agent may start before the engine,
//! and engines restart); with neither, inference servers found by command
//! line. Also names each target's engine for the [`EngineName`] enricher,
//! and fingerprints what it serves (once per process) for [`ModelVersion`].
//!
//! Owns: when to look again, what to print about it. Must not: block the
//! data path for long (a scan reads /proc; it runs at most once per tick,
//! and a full scan at most every [`RESCAN`] while targets are alive), or
//! read an engine's files on it: they are read by the facts reader's
//! thread (`FactsReader`, through `host::rootfs`), waited for at most
//! [`FACTS_WAIT`].
//!
//! [`EngineName`]: super::enrich::EngineName
//! [`ModelVersion`]: super::enrich::ModelVersion

use std::{
    cell::RefCell,
    collections::{HashMap, HashSet, VecDeque},
    path::{Path, PathBuf},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::Result;

use super::plan::Targeting;
use crate::stage::{NodeState, ProcessInfo, Task, TaskCx};
use crate::{
    capture::{Capture, ProcEvent},
    engines::Engine,
    event::SocketEvent,
    host::{discover, procfs},
    identity::{engine_info, model_version, serving_config, tokenizer},
};

/// Full rescans while targets are alive (new replicas, new engines).
pub const RESCAN: Duration = Duration::from_secs(5);
/// How long a `--pid` tree may go without a TCP listener before a warning.
pub const NO_LISTENER_WARNING_AFTER: Duration = Duration::from_secs(10);
/// A freshly exec'd process is checked every tick for this long (an
/// engine loads its model before it listens).
pub const WATCH_NEW_PROCESS: Duration = Duration::from_secs(120);
/// New processes watched at once at most (a busy host execs a lot; the
/// full rescan still finds what falls out).
pub const WATCH_MAX: usize = 256;

/// Where a process's model version comes from when it is named.
#[derive(Clone, Copy, Debug)]
enum Version {
    /// Fingerprint it now (a new target, or one that exec'd: a new
    /// command line may serve another model).
    Compute,
    /// Keep what was computed when it was first named (computed if it was
    /// not).
    Keep,
    /// A forked child serves what its parent serves (same command line
    /// and environment): the parent's, computed if the parent is unknown.
    Inherit(u32),
}

/// How long naming a process waits for its facts (model version, engine
/// version, serving configuration) from the facts reader's thread: they
/// usually take a few milliseconds, and a record enriched before they
/// came would lack them. A slow or hung filesystem costs the pipeline at
/// most this, once per process — and nothing once the reader has been
/// busy for [`FACTS_STUCK`] (the facts land when they come).
const FACTS_WAIT: Duration = Duration::from_millis(200);
const FACTS_STUCK: Duration = Duration::from_secs(1);

/// What is read once per process from its files and command line.
#[derive(Default)]
struct Facts {
    model_version: Option<String>,
    model: Option<String>,
    engine_version: Option<String>,
    serving_config: Option<crate::identity::serving_config::ServingConfig>,
}

impl Facts {
    fn read(proc_root: &Path, pid: u32, engine: Option<Engine>) -> Facts {
        Facts {
            model_version: model_version::of_process(proc_root, pid, engine),
            model: engine.and_then(|e| model_version::served_model(proc_root, pid, e)),
            // The installed package's version until the engine's own info
            // endpoint says (`enginemetrics::info`).
            engine_version: engine
                .and_then(|e| e.spec().dist)
                .and_then(|d| engine_info::from_dist_info(proc_root, pid, d)),
            serving_config: serving_config::of_process(proc_root, pid, engine),
        }
    }
}

/// The engines' files are read on a thread of their own (through
/// `host::rootfs`), never on the pipeline's: a FIFO is refused unopened,
/// and a hung filesystem stalls only this thread.
struct FactsReader {
    jobs: mpsc::Sender<(u32, u64, Option<Engine>)>,
    done: mpsc::Receiver<(u32, u64, Facts)>,
    /// Engines' tokenizers, found after their other facts (loading one
    /// takes up to a second; the model version should not wait for it).
    tokenizers: mpsc::Receiver<(u32, u64, tokenizer::Found)>,
    next: u64,
    /// The latest job per process (older answers are dropped).
    wanted: HashMap<u32, u64>,
    /// When the oldest unanswered job was sent.
    busy_since: Option<Instant>,
}

impl FactsReader {
    /// `tokenizers`: find each engine's tokenizer too.
    fn spawn(proc_root: PathBuf, tokenizers: bool) -> Self {
        let (jobs, rx) = mpsc::channel::<(u32, u64, Option<Engine>)>();
        let (tx, done) = mpsc::channel();
        let (tok_tx, tok_rx) = mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("tokentap-facts".into())
            .spawn(move || {
                let mut loader = tokenizer::Loader::default();
                while let Ok((pid, n, engine)) = rx.recv() {
                    if tx
                        .send((pid, n, Facts::read(&proc_root, pid, engine)))
                        .is_err()
                    {
                        break;
                    }
                    if tokenizers && engine.is_some() {
                        let found = loader.find(&proc_root, pid, engine);
                        if tok_tx.send((pid, n, found)).is_err() {
                            break;
                        }
                    }
                }
            });
        if let Err(e) = spawned {
            eprintln!("tokentap: cannot start the facts reader thread ({e}): model and engine versions unknown");
        }
        FactsReader {
            jobs,
            done,
            tokenizers: tok_rx,
            next: 0,
            wanted: HashMap::new(),
            busy_since: None,
        }
    }

    fn pending(&self, pid: u32) -> bool {
        self.wanted.contains_key(&pid)
    }

    /// Asks for `pid`'s facts and waits for them at most [`FACTS_WAIT`].
    fn read(&mut self, pid: u32, engine: Option<Engine>, node: &mut NodeState) {
        self.next += 1;
        if self.jobs.send((pid, self.next, engine)).is_err() {
            return;
        }
        self.wanted.insert(pid, self.next);
        let now = Instant::now();
        let busy = *self.busy_since.get_or_insert(now);
        if now.duration_since(busy) > FACTS_STUCK {
            return;
        }
        let until = now + FACTS_WAIT;
        while self.pending(pid) {
            let left = until.saturating_duration_since(Instant::now());
            match self.done.recv_timeout(left) {
                Ok(got) => self.apply(got, node),
                Err(_) => break,
            }
        }
    }

    /// Facts that came since.
    fn drain(&mut self, node: &mut NodeState) {
        while let Ok(got) = self.done.try_recv() {
            self.apply(got, node);
        }
        while let Ok((pid, _, found)) = self.tokenizers.try_recv() {
            if let Some(p) = node.processes.get_mut(&pid) {
                let engine = p.engine.map_or("engine", Engine::name);
                match &found.tokenizer {
                    Some(_) => eprintln!(
                        "tokentap: pid {pid} ({engine}): its tokenizer loaded from {}: streamed requests without usage are counted exactly",
                        found.detail
                    ),
                    None => eprintln!(
                        "tokentap: pid {pid} ({engine}): no tokenizer ({}: {}): its requests without usage keep estimated token counts",
                        found.state.as_str(),
                        found.detail
                    ),
                }
                p.tokenizer_state = Some(found.state);
                p.tokenizer = found.tokenizer.map(crate::tokenize::Shared);
            }
        }
    }

    fn apply(&mut self, (pid, n, f): (u32, u64, Facts), node: &mut NodeState) {
        if self.wanted.get(&pid) != Some(&n) {
            return;
        }
        self.wanted.remove(&pid);
        self.busy_since = (!self.wanted.is_empty()).then(Instant::now);
        // What the engine's info endpoint said already stands.
        if let Some(p) = node.processes.get_mut(&pid) {
            p.model_version = p.model_version.take().or(f.model_version);
            p.model = p.model.take().or(f.model);
            p.engine_version = p.engine_version.take().or(f.engine_version);
            p.serving_config = p.serving_config.take().or(f.serving_config);
        }
    }
}

/// The TCP ports `pid` listens on, in its own network namespace.
fn listening(proc_root: &Path, pid: u32) -> HashSet<u16> {
    let owned = procfs::socket_fds(proc_root, pid);
    if owned.is_empty() {
        return HashSet::new();
    }
    procfs::listening_ports(&procfs::tcp_table(proc_root, pid), &owned)
}

pub struct Targeter {
    targeting: Targeting,
    proc_root: PathBuf,
    last_scan: Option<Instant>,
    started: Instant,
    /// A "waiting" line was printed and no target appeared since.
    waiting: bool,
    warned_no_listener: bool,
    /// Targets seen alive at the last tick.
    alive: HashSet<u32>,
    /// Processes that exec'd recently, checked every tick until they
    /// listen (then targeted), exit, or [`WATCH_NEW_PROCESS`] passes.
    watch: VecDeque<(u32, Instant)>,
    /// Exec events arrive (the kernel side reports them).
    exec_seen: bool,
    facts: RefCell<FactsReader>,
}

impl Targeter {
    /// `tokenizers`: also find each engine's tokenizer (`--tokenize-cpu`
    /// above 0).
    pub fn new(targeting: Targeting, proc_root: PathBuf, tokenizers: bool) -> Self {
        Self {
            targeting,
            last_scan: None,
            started: Instant::now(),
            waiting: false,
            warned_no_listener: false,
            alive: HashSet::new(),
            watch: VecDeque::new(),
            exec_seen: false,
            facts: RefCell::new(FactsReader::spawn(proc_root.clone(), tokenizers)),
            proc_root,
        }
    }

    /// First look, right after the capture attached. Returns the line that
    /// says the agent is ready (tests and users wait for `; ready`).
    pub fn start(
        &mut self,
        cap: &mut Capture,
        node: &mut NodeState,
        events: &mut Vec<SocketEvent>,
    ) -> Result<String> {
        self.started = Instant::now();
        self.scan(cap, node, events)?;
        cap.set_arrival_ports(self.arrival_ports(node));
        let found = cap.targets();
        let line = match &self.targeting {
            Targeting::Discover => format!(
                "tokentap: watching for inference servers ({}); found {}; ready",
                crate::engines::Engine::titles(),
                found.len()
            ),
            Targeting::Ports(ports) => {
                if found.is_empty() {
                    self.waiting = true;
                    format!(
                        "tokentap: waiting for a listener on port(s) {ports:?} (any network namespace); ready"
                    )
                } else {
                    format!("tokentap: running on pids {found:?} ports {ports:?}; ready")
                }
            }
            Targeting::Pids { ports, .. } => format!(
                "tokentap: running on pids {found:?}{}; ready",
                if ports.is_empty() {
                    String::new()
                } else {
                    format!(" ports {ports:?}")
                }
            ),
        };
        // "…; data hooks btf; ready": which kernel hooks capture socket data.
        let hooks = format!("; data hooks {}; ready", cap.data_hooks().name());
        Ok(line.replacen("; ready", &hooks, 1))
    }

    /// The ports whose incoming segments are timestamped: the selected
    /// ports when given, else every port a target listens on.
    fn arrival_ports(&self, node: &NodeState) -> Vec<u16> {
        match &self.targeting {
            Targeting::Ports(p) => p.clone(),
            Targeting::Pids { ports, .. } if !ports.is_empty() => ports.clone(),
            _ => node
                .processes
                .values()
                .flat_map(|p| p.listen_ports.iter().copied())
                .collect(),
        }
    }

    /// Names `pid`: its engine, its listening ports and (as `version`
    /// says) its model version — the one per-process fingerprint, read
    /// from /proc and the model files only when a process is new or
    /// exec'd, never per request.
    fn name(&self, pid: u32, node: &mut NodeState, version: Version) -> Option<Engine> {
        let engine = discover::engine_of(&self.proc_root, pid);
        let mut listen_ports: Vec<u16> = listening(&self.proc_root, pid).into_iter().collect();
        listen_ports.sort_unstable();
        // What is read once per process: kept for a target named again,
        // a forked child's from its parent, else read now.
        let known = |p: u32| {
            node.processes.get(&p).map(|i| ProcessInfo {
                model_version: i.model_version.clone(),
                model: i.model.clone(),
                engine_version: i.engine_version.clone(),
                serving_config: i.serving_config.clone(),
                info_settled: i.info_settled,
                tokenizer: i.tokenizer.clone(),
                tokenizer_state: i.tokenizer_state,
                ..ProcessInfo::default()
            })
        };
        let mut reader = self.facts.borrow_mut();
        let facts = match version {
            Version::Keep => known(pid),
            // A parent whose facts are still being read: the child's own.
            Version::Inherit(parent) if !reader.pending(parent) => known(parent),
            _ => None,
        };
        // An exec'd process is read again (a newer job supersedes an older).
        let compute =
            facts.is_none() && (matches!(version, Version::Compute) || !reader.pending(pid));
        let facts = facts.unwrap_or_default();
        node.processes.insert(
            pid,
            ProcessInfo {
                name: std::fs::read_to_string(self.proc_root.join(pid.to_string()).join("comm"))
                    .ok()
                    .map(|c| c.trim_end().to_string())
                    .filter(|c| !c.is_empty()),
                ppid: procfs::ppid(&self.proc_root, pid),
                engine,
                listen_ports,
                container: procfs::container_identity(&self.proc_root, pid),
                ..facts
            },
        );
        if compute {
            reader.read(pid, engine, node);
        }
        engine
    }

    fn scan(
        &mut self,
        cap: &mut Capture,
        node: &mut NodeState,
        events: &mut Vec<SocketEvent>,
    ) -> Result<()> {
        self.last_scan = Some(Instant::now());
        match &self.targeting {
            Targeting::Pids { .. } => {}
            Targeting::Ports(ports) => {
                let ports = ports.clone();
                for pid in procfs::pids_listening_on(&self.proc_root, &ports) {
                    if cap.add_target(pid, events)? {
                        let engine = self.name(pid, node, Version::Compute);
                        eprintln!(
                            "tokentap: found pid {pid} ({}) listening on port(s) {ports:?}",
                            engine.map_or("engine not recognised", Engine::name)
                        );
                    }
                }
            }
            Targeting::Discover => {
                for (pid, engine) in discover::scan(&self.proc_root) {
                    if cap.add_target(pid, events)? {
                        eprintln!("tokentap: found {engine} (pid {pid})");
                    }
                }
            }
        }
        // Name every target not named yet (children followed in the
        // kernel included); forget processes that are gone.
        let targets = cap.targets();
        for &pid in &targets {
            // Named once; looked at again while it listens on nothing yet
            // (an engine loads its model before it listens).
            if node
                .processes
                .get(&pid)
                .is_none_or(|p| p.listen_ports.is_empty())
            {
                self.name(pid, node, Version::Keep);
            }
        }
        node.processes
            .retain(|pid, _| self.proc_root.join(pid.to_string()).exists());
        Ok(())
    }

    fn due(&self, cap: &Capture) -> bool {
        let since = self.last_scan.map_or(Duration::MAX, |t| t.elapsed());
        match &self.targeting {
            // Nothing alive on the port: look every tick until process
            // events (exec) have told us about new processes once; from
            // then on, new processes are watched and the full scan is a
            // backstop.
            Targeting::Ports(_) if cap.targets().is_empty() && !self.exec_seen => true,
            _ => since >= RESCAN,
        }
    }

    /// `--pid` given, but nothing in its tree listens on TCP: say so, once.
    fn check_pid_tree(&mut self, cap: &Capture) {
        let Targeting::Pids { pids, .. } = &self.targeting else {
            return;
        };
        if self.warned_no_listener || self.started.elapsed() < NO_LISTENER_WARNING_AFTER {
            return;
        }
        let listens = cap
            .targets()
            .iter()
            .any(|&pid| !listening(&self.proc_root, pid).is_empty());
        if !listens {
            self.warned_no_listener = true;
            eprintln!(
                "tokentap: warning: after {}s, none of --pid {pids:?} or their child processes listens on a TCP port; \
                 nothing will be captured unless one does. Is it the inference server's pid? (`--port PORT` finds the server by its port instead)",
                NO_LISTENER_WARNING_AFTER.as_secs()
            );
        }
    }
}

impl Targeter {
    /// Process events: an exec may be a new engine (watched until it
    /// listens), or a target becoming its server (`sh -c 'exec server'`:
    /// same pid, new command line, new engine name); a listen is checked
    /// at once; a fork's child is named like any target.
    fn on_proc_events(&mut self, events: &[ProcEvent], cap: &Capture, node: &mut NodeState) {
        let targets: HashSet<u32> = cap.targets().into_iter().collect();
        for ev in events {
            match *ev {
                ProcEvent::Exec { pid, .. } => {
                    self.exec_seen = true;
                    if targets.contains(&pid) {
                        self.name(pid, node, Version::Compute);
                    } else {
                        self.watch_new(pid);
                    }
                }
                // A server became reachable: checked at once (it may also
                // have been watched since its exec).
                ProcEvent::Listen { pid, .. } if !targets.contains(&pid) => self.watch_new(pid),
                ProcEvent::Listen { .. } => {}
                ProcEvent::Fork { parent, child } => {
                    self.name(child, node, Version::Inherit(parent));
                }
                ProcEvent::Exit { .. } => {}
            }
        }
    }

    /// Watch `pid` (a new process, or one that just called listen) until it
    /// listens on a port we want; only processes that can become targets.
    fn watch_new(&mut self, pid: u32) {
        let wanted = match self.targeting {
            Targeting::Pids { .. } => false,
            // Only command lines that name an engine.
            Targeting::Discover => discover::engine_of(&self.proc_root, pid).is_some(),
            Targeting::Ports(_) => true,
        };
        if !wanted || self.watch.iter().any(|(p, _)| *p == pid) {
            return;
        }
        if self.watch.len() >= WATCH_MAX {
            self.watch.pop_front();
        }
        self.watch.push_back((pid, Instant::now()));
    }

    /// Watched new processes that listen now (on a selected port) become
    /// targets.
    fn check_watched(
        &mut self,
        cap: &mut Capture,
        node: &mut NodeState,
        events: &mut Vec<SocketEvent>,
    ) -> Result<()> {
        let mut keep = VecDeque::with_capacity(self.watch.len());
        while let Some((pid, since)) = self.watch.pop_front() {
            if since.elapsed() > WATCH_NEW_PROCESS || !self.proc_root.join(pid.to_string()).exists()
            {
                continue;
            }
            let ports = listening(&self.proc_root, pid);
            let hit = match &self.targeting {
                Targeting::Ports(want) => want.iter().any(|p| ports.contains(p)),
                _ => !ports.is_empty(),
            };
            if !hit {
                keep.push_back((pid, since));
                continue;
            }
            if cap.add_target(pid, events)? {
                let engine = self.name(pid, node, Version::Compute);
                eprintln!(
                    "tokentap: found pid {pid} ({}) listening on port(s) {:?}",
                    engine.map_or("engine not recognised", Engine::name),
                    {
                        let mut v: Vec<u16> = ports.into_iter().collect();
                        v.sort_unstable();
                        v
                    }
                );
            }
        }
        self.watch = keep;
        Ok(())
    }
}

impl Task for Targeter {
    fn tick(&mut self, cx: &mut TaskCx<'_>) -> Result<()> {
        let Some(cap) = cx.capture.as_deref_mut() else {
            return Ok(());
        };
        self.facts.borrow_mut().drain(cx.node);
        cx.node.age_departed();
        let before = self.alive.clone();
        self.on_proc_events(cx.proc_events, cap, cx.node);
        self.check_watched(cap, cx.node, cx.events)?;
        if self.due(cap) {
            self.scan(cap, cx.node, cx.events)?;
        }
        let now: HashSet<u32> = cap.targets().into_iter().collect();
        // A target that exited is forgotten now, not at the next full
        // scan (up to RESCAN later): its `engine.stop` is on time, and
        // reported at all when the agent stops first.
        for gone in before.difference(&now) {
            if !self.proc_root.join(gone.to_string()).exists() {
                cx.node.depart(*gone);
                cx.node.forwarding.remove(gone);
                cx.node.gateways.remove(gone);
            }
        }
        if let Targeting::Ports(ports) = &self.targeting {
            for gone in before.difference(&now) {
                eprintln!("tokentap: pid {gone} exited");
            }
            if now.is_empty() && !self.waiting {
                self.waiting = true;
                eprintln!(
                    "tokentap: waiting for a listener on port(s) {ports:?} (any network namespace)"
                );
            } else if !now.is_empty() {
                self.waiting = false;
            }
        }
        self.alive = now;
        self.check_pid_tree(cap);
        cap.set_arrival_ports(self.arrival_ports(cx.node));
        Ok(())
    }
}
