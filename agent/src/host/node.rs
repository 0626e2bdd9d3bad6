//! The node's name (`host.name` on everything the agent exports): a host
//! fact, worked out once.

/// `host.name`: the node the agent runs on, never its own container's or
/// pod's name (a DaemonSet pod's UTS hostname is the pod's name, new at
/// every rollout). In order: `NODE_NAME` (the downward API's
/// `spec.nodeName`); the host's UTS name when the agent sees the host's
/// processes (`hostPID`) but has a UTS namespace of its own; else its own
/// hostname (a plain binary on a host). Worked out once.
pub fn node_name() -> String {
    static NAME: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    NAME.get_or_init(|| {
        node_name_from(std::env::var("NODE_NAME").ok(), host_uts_name, own_hostname)
    })
    .clone()
}

/// [`node_name`]'s rule, its sources as arguments (a seam for tests).
fn node_name_from(
    node_env: Option<String>,
    host: impl FnOnce() -> Option<String>,
    own: impl FnOnce() -> String,
) -> String {
    node_env
        .map(|n| n.trim().to_string())
        .filter(|n| !n.is_empty())
        .or_else(host)
        .unwrap_or_else(own)
}

fn own_hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// The hostname of the node's UTS namespace when it is not the agent's
/// own (the agent in a container of a `hostPID` pod). The node's namespace
/// is pid 1's (the node's init), or pid 2's when pid 1 cannot be looked
/// at (kthreadd: kernel threads live in the initial namespaces; some
/// hosts' init is closed even to root). A thread of its own enters that
/// namespace (needs CAP_SYS_ADMIN) and asks; without the right, the
/// node's `/etc/hostname` through `/proc/PID/root` (CAP_SYS_PTRACE). None
/// when the namespace is the agent's own, or nothing works.
fn host_uts_name() -> Option<String> {
    let own = std::fs::read_link("/proc/self/ns/uts").ok()?;
    let (pid, ns) = [1u32, 2]
        .into_iter()
        .find_map(|p| Some((p, std::fs::read_link(format!("/proc/{p}/ns/uts")).ok()?)))?;
    if ns == own {
        return None;
    }
    let entered = std::thread::spawn(move || -> Option<String> {
        use std::os::fd::AsRawFd;
        let ns = std::fs::File::open(format!("/proc/{pid}/ns/uts")).ok()?;
        // SAFETY: setns on this short-lived thread only (a UTS namespace
        // is per thread); the fd is valid for the call.
        if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWUTS) } != 0 {
            return None;
        }
        Some(own_hostname()).filter(|n| !n.is_empty())
    })
    .join()
    .ok()
    .flatten();
    entered.or_else(|| {
        crate::host::rootfs::Root::of(std::path::Path::new("/proc"), pid)
            .ok()?
            .read(std::path::Path::new("/etc/hostname"), 4096)
            .ok()
            .map(|s| String::from_utf8_lossy(&s).trim().to_string())
            .filter(|n| !n.is_empty())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_node_name_is_node_name_then_the_hosts_uts_name_then_the_own_hostname() {
        let host = || Some("node-7".to_string());
        let none = || None;
        let own = || "pod-abc".to_string();
        assert_eq!(node_name_from(Some("node-1".into()), host, own), "node-1");
        assert_eq!(node_name_from(Some("  ".into()), host, own), "node-7");
        assert_eq!(node_name_from(None, host, own), "node-7");
        assert_eq!(node_name_from(None, none, own), "pod-abc");
    }
}
