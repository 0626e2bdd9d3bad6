//! Targeting: which processes the live capture follows, kept up to date
//! while the agent runs. With `--pid` the processes (and, in the kernel,
//! their children); with `--port`, whatever listens on those ports in any
//! network namespace, now or later (the agent may start before the engine,
//! and engines restart); with neither, inference servers found by command
//! line. Also names each target's engine for the [`EngineName`] enricher.
//!
//! Owns: when to look again, what to print about it. Must not: block the
//! data path for long (a scan reads /proc; it runs at most once per tick,
//! and a full scan at most every [`RESCAN`] while targets are alive).
//!
//! [`EngineName`]: super::enrich::EngineName

use std::{
    collections::HashSet,
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::Result;

use super::{plan::Targeting, NodeState, ProcessInfo, Task};
use crate::{
    capture::{procfs, Capture},
    discover,
    event::SocketEvent,
};

/// Full rescans while targets are alive (new replicas, new engines).
pub const RESCAN: Duration = Duration::from_secs(5);
/// How long a `--pid` tree may go without a TCP listener before a warning.
pub const NO_LISTENER_WARNING_AFTER: Duration = Duration::from_secs(10);

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
}

impl Targeter {
    pub fn new(targeting: Targeting, proc_root: PathBuf) -> Self {
        Self {
            targeting,
            proc_root,
            last_scan: None,
            started: Instant::now(),
            waiting: false,
            warned_no_listener: false,
            alive: HashSet::new(),
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
        let found = cap.targets();
        Ok(match &self.targeting {
            Targeting::Discover => format!(
                "tokentap: watching for inference servers (vLLM, SGLang, TGI, llama.cpp, Ollama, Triton, LMDeploy); found {}; ready",
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
        })
    }

    fn name(&self, pid: u32, node: &mut NodeState) -> Option<String> {
        let engine = discover::engine_of(&self.proc_root, pid).map(str::to_string);
        node.processes.insert(
            pid,
            ProcessInfo {
                engine: engine.clone(),
            },
        );
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
                        let engine = self.name(pid, node);
                        eprintln!(
                            "tokentap: found pid {pid} ({}) listening on port(s) {ports:?}",
                            engine.as_deref().unwrap_or("engine not recognised")
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
            if !node.processes.contains_key(&pid) {
                self.name(pid, node);
            }
        }
        node.processes
            .retain(|pid, _| self.proc_root.join(pid.to_string()).exists());
        Ok(())
    }

    fn due(&self, cap: &Capture) -> bool {
        let since = self.last_scan.map_or(Duration::MAX, |t| t.elapsed());
        match &self.targeting {
            // Nothing alive on the port: look every tick.
            Targeting::Ports(_) if cap.targets().is_empty() => true,
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
        let listens = cap.targets().iter().any(|&pid| {
            let owned = procfs::socket_fds(&self.proc_root, pid);
            !owned.is_empty()
                && !procfs::listening_ports(&procfs::tcp_table(&self.proc_root, pid), &owned)
                    .is_empty()
        });
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

impl Task for Targeter {
    fn tick(
        &mut self,
        capture: Option<&mut Capture>,
        node: &mut NodeState,
        events: &mut Vec<SocketEvent>,
    ) -> Result<()> {
        let Some(cap) = capture else {
            return Ok(());
        };
        let before = self.alive.clone();
        if self.due(cap) {
            self.scan(cap, node, events)?;
        }
        let now: HashSet<u32> = cap.targets().into_iter().collect();
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
        Ok(())
    }
}
