//! Cgroups made by tests, in the formats Kubernetes runtimes create, and
//! removed again.

use std::path::{Path, PathBuf};

/// Cgroup directories made for the test, removed (deepest first) on drop,
/// after moving their processes back to the hierarchy's root.
pub struct Cgroups(pub Vec<(PathBuf, PathBuf)>); // (root of the hierarchy, leaf)

impl Cgroups {
    /// Creates `rel` under `root` and moves `pid` into it.
    pub fn put(&mut self, root: &Path, rel: &str, pid: u32) {
        let leaf = root.join(rel);
        std::fs::create_dir_all(&leaf).unwrap_or_else(|e| panic!("mkdir {}: {e}", leaf.display()));
        self.0.push((root.to_path_buf(), leaf.clone()));
        let procs = if leaf.join("cgroup.procs").exists() {
            leaf.join("cgroup.procs")
        } else {
            leaf.join("tasks")
        };
        std::fs::write(&procs, pid.to_string())
            .unwrap_or_else(|e| panic!("moving {pid} into {}: {e}", leaf.display()));
    }
}

impl Drop for Cgroups {
    fn drop(&mut self) {
        for (root, leaf) in self.0.drain(..).rev() {
            if let Ok(pids) = std::fs::read_to_string(leaf.join("cgroup.procs")) {
                for p in pids.lines() {
                    let _ = std::fs::write(root.join("cgroup.procs"), p);
                }
            }
            let mut d = leaf.as_path();
            while d != root {
                if std::fs::remove_dir(d).is_err() {
                    break;
                }
                d = d.parent().unwrap();
            }
        }
    }
}

/// The cgroup v2 mount (pure v2, or the `unified` one of a hybrid layout).
pub fn v2_root() -> Option<PathBuf> {
    ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.join("cgroup.controllers").exists())
}

/// A cgroup v1 hierarchy (the pids controller), when the machine has one.
pub fn v1_root() -> Option<PathBuf> {
    let p = PathBuf::from("/sys/fs/cgroup/pids");
    p.join("tasks").exists().then_some(p)
}
