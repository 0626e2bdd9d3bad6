//! The target set from the userspace side: adding a process together with
//! the descendants it already has (a launcher — shell wrapper, `uv run`, a
//! supervisor — may have forked the server before the agent started), and
//! counting what the kernel holds.
//!
//! Owns: TARGETS (and TARGET_SLOTS) writes by userspace (the kernel adds forked children and
//! removes exited thread groups itself; `records.rs` mirrors that in
//! `target_pids`). Must not: remove targets (the kernel does at exit), or
//! follow anything but the process tree.

use agent_ebpf::target_slot;
use anyhow::{Context, Result};

use super::State;
use crate::host::procfs;

impl State {
    /// Puts `pid` and its living descendants in TARGETS; returns those
    /// that were not targets yet (`pid` first when new). `pid` goes in
    /// before the process tree is read, so a child forked meanwhile is
    /// either followed by the kernel or found in /proc (both at worst).
    pub(super) fn add_tree(&mut self, pid: u32) -> Result<Vec<u32>> {
        let mut added = Vec::new();
        if self.target_pids.insert(pid) {
            self.mark_slot(pid)?;
            self.targets
                .insert(pid, 1u8, 0)
                .with_context(|| format!("adding pid {pid} to TARGETS"))?;
            added.push(pid);
        }
        for child in procfs::descendants(&self.proc_root, pid) {
            if self.target_pids.insert(child) {
                // A full TARGETS map is not fatal for a descendant: the
                // target itself is captured.
                self.mark_slot(child)?;
                if let Err(e) = self.targets.insert(child, 1u8, 0) {
                    log::warn!("descendant {child} of target {pid} not captured: {e}");
                    self.target_pids.remove(&child);
                    continue;
                }
                added.push(child);
            }
        }
        Ok(added)
    }

    /// Sets `pid`'s slot in the kernel's `TARGET_SLOTS` pre-filter (before
    /// its TARGETS entry; slots are never cleared).
    fn mark_slot(&mut self, pid: u32) -> Result<()> {
        self.slots
            .set(target_slot(pid), 1u8, 0)
            .with_context(|| format!("marking pid {pid} in TARGET_SLOTS"))
    }

    /// Entries in the kernel's TARGETS map now.
    pub(super) fn kernel_target_count(&self) -> u64 {
        self.targets.keys().filter(|k| k.is_ok()).count() as u64
    }
}
