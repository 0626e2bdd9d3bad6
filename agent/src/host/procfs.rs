//! What /proc says about sockets: fd → socket inode, TCP tables, listening
//! ports, network namespaces, the process tree. Used to resolve connections
//! the kernel side could not describe (accept with a NULL address), to seed
//! connections that were open before the agent started, to find processes
//! listening on a port in any network namespace, and to find the existing
//! descendants of a new target.
//!
//! Must not: cache across calls (fds are reused; every answer is fresh).

use std::{
    collections::{HashMap, HashSet},
    fs,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    path::Path,
};

/// TCP states as /proc/net/tcp numbers them.
pub const TCP_ESTABLISHED: u8 = 0x01;
pub const TCP_LISTEN: u8 = 0x0A;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TcpEntry {
    pub local: SocketAddr,
    pub peer: SocketAddr,
    pub state: u8,
    pub inode: u64,
}

/// The inode of `fd` when it is a socket.
pub fn socket_inode(proc_root: &Path, pid: u32, fd: i32) -> Option<u64> {
    let link = fs::read_link(proc_root.join(format!("{pid}/fd/{fd}"))).ok()?;
    parse_socket_link(link.to_str()?)
}

fn parse_socket_link(s: &str) -> Option<u64> {
    s.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
}

/// Socket inode → fd for every socket fd of `pid`.
pub fn socket_fds(proc_root: &Path, pid: u32) -> HashMap<u64, i32> {
    let mut out = HashMap::new();
    let dir = match fs::read_dir(proc_root.join(format!("{pid}/fd"))) {
        Ok(d) => d,
        Err(e) => {
            if e.kind() == std::io::ErrorKind::PermissionDenied {
                warn_fd_denied(pid);
            }
            return out;
        }
    };
    for ent in dir.flatten() {
        let Some(fd) = ent.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if let Some(inode) = fs::read_link(ent.path())
            .ok()
            .and_then(|l| l.to_str().and_then(parse_socket_link))
        {
            out.insert(inode, fd);
        }
    }
    out
}

/// Some process's sockets could not be read (permission denied).
static FD_DENIED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether some process's sockets could not be read so far: "nothing
/// listens" may then mean "nothing this agent may see listens".
pub fn fds_denied() -> bool {
    FD_DENIED.load(std::sync::atomic::Ordering::Relaxed)
}

/// Says once that another process's sockets cannot be read: without it,
/// an agent short of privileges would report "found 0" and look healthy.
fn warn_fd_denied(pid: u32) {
    if !FD_DENIED.swap(true, std::sync::atomic::Ordering::Relaxed) {
        eprintln!(
            "tokentap: warning: cannot read /proc/{pid}/fd (permission denied): engines whose sockets cannot be read are not found or resolved. The agent needs CAP_SYS_PTRACE (engines holding capabilities it lacks) and CAP_DAC_READ_SEARCH (engines of another user); see docs/deploy.md. Said once"
        );
    }
}

/// TCP sockets (v4 and v6) in `pid`'s network namespace.
pub fn tcp_table(proc_root: &Path, pid: u32) -> Vec<TcpEntry> {
    let mut out = Vec::new();
    for (file, v6) in [("tcp", false), ("tcp6", true)] {
        if let Ok(text) = fs::read_to_string(proc_root.join(format!("{pid}/net/{file}"))) {
            out.extend(parse_tcp_table(&text, v6));
        }
    }
    out
}

/// Parse the text of /proc/net/tcp or tcp6; bad lines are skipped.
pub fn parse_tcp_table(text: &str, v6: bool) -> Vec<TcpEntry> {
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 10 {
                return None;
            }
            Some(TcpEntry {
                local: parse_addr(f[1], v6)?,
                peer: parse_addr(f[2], v6)?,
                state: u8::from_str_radix(f[3], 16).ok()?,
                inode: f[9].parse().ok()?,
            })
        })
        .collect()
}

/// "0100007F:1F90" (v4) or 32 hex digits ":PORT" (v6); the address is
/// printed as native-endian 32-bit words.
fn parse_addr(s: &str, v6: bool) -> Option<SocketAddr> {
    let (a, p) = s.split_once(':')?;
    let port = u16::from_str_radix(p, 16).ok()?;
    let ip = if v6 {
        if a.len() != 32 {
            return None;
        }
        let mut bytes = [0u8; 16];
        for w in 0..4 {
            let word = u32::from_str_radix(&a[w * 8..w * 8 + 8], 16).ok()?;
            bytes[w * 4..w * 4 + 4].copy_from_slice(&word.to_ne_bytes());
        }
        let v6 = Ipv6Addr::from(bytes);
        match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        }
    } else {
        if a.len() != 8 {
            return None;
        }
        let word = u32::from_str_radix(a, 16).ok()?;
        IpAddr::V4(Ipv4Addr::from(word.to_ne_bytes()))
    };
    Some(SocketAddr::new(ip, port))
}

/// What /proc knows about one fd of a process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FdKind {
    /// A TCP socket with these addresses (no peer: a listener).
    Tcp {
        local: SocketAddr,
        peer: Option<SocketAddr>,
    },
    /// A socket that is not TCP (unix, UDP, netlink …), or not a socket.
    NotTcp,
    /// The fd is gone (closed before we looked) or /proc is unreadable.
    Unknown,
}

/// Resolve `fd` of `pid` to a TCP entry, given that process's TCP table.
pub fn classify_fd(proc_root: &Path, pid: u32, fd: i32, table: &[TcpEntry]) -> FdKind {
    let fd_path = proc_root.join(format!("{pid}/fd/{fd}"));
    let Ok(link) = fs::read_link(&fd_path) else {
        return FdKind::Unknown;
    };
    let Some(inode) = link.to_str().and_then(parse_socket_link) else {
        return FdKind::NotTcp;
    };
    match table.iter().find(|e| e.inode == inode) {
        Some(e) => FdKind::Tcp {
            local: e.local,
            peer: (e.state != TCP_LISTEN).then_some(e.peer),
        },
        None => FdKind::NotTcp,
    }
}

/// Local ports on which `pid` itself holds a listening socket.
pub fn listening_ports(table: &[TcpEntry], owned: &HashMap<u64, i32>) -> HashSet<u16> {
    table
        .iter()
        .filter(|e| e.state == TCP_LISTEN && owned.contains_key(&e.inode))
        .map(|e| e.local.port())
        .collect()
}

/// Numeric entries of the proc root (processes; threads are not listed
/// at the top level).
fn pids(proc_root: &Path) -> Vec<u32> {
    let Ok(dir) = fs::read_dir(proc_root) else {
        return vec![];
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()))
        .collect()
}

/// The inode of `pid`'s network namespace (`/proc/PID/ns/net` links to
/// `net:[INODE]`).
pub fn netns_inode(proc_root: &Path, pid: u32) -> Option<u64> {
    let link = fs::read_link(proc_root.join(format!("{pid}/ns/net"))).ok()?;
    link.to_str()?
        .strip_prefix("net:[")?
        .strip_suffix(']')?
        .parse()
        .ok()
}

/// Processes holding a listening TCP socket on one of `ports`, in any
/// network namespace (a pod, `ip netns exec`): each namespace's TCP tables
/// are read once, through one of its processes, then only the processes
/// of namespaces with such a listener have their fds scanned.
pub fn pids_listening_on(proc_root: &Path, ports: &[u16]) -> Vec<u32> {
    // netns inode -> its processes (pids whose namespace is unreadable
    // form their own group, keyed by nothing).
    let mut by_ns: HashMap<Option<u64>, Vec<u32>> = HashMap::new();
    for pid in pids(proc_root) {
        by_ns
            .entry(netns_inode(proc_root, pid))
            .or_default()
            .push(pid);
    }
    let mut out = Vec::new();
    for (ns, members) in by_ns {
        // Unknown namespace: each process's own view, one by one.
        let readers: Vec<&[u32]> = match ns {
            Some(_) => vec![&members[..]],
            None => members.chunks(1).collect(),
        };
        for group in readers {
            // Any member can show the namespace's tables; the first may
            // exit meanwhile, so try until one answers.
            let listen: HashSet<u64> = group
                .iter()
                .find_map(|&pid| tcp_table_if_readable(proc_root, pid))
                .unwrap_or_default()
                .into_iter()
                .filter(|e| e.state == TCP_LISTEN && ports.contains(&e.local.port()))
                .map(|e| e.inode)
                .collect();
            if listen.is_empty() {
                continue;
            }
            for &pid in group {
                if socket_fds(proc_root, pid)
                    .keys()
                    .any(|i| listen.contains(i))
                {
                    out.push(pid);
                }
            }
        }
    }
    out.sort_unstable();
    out
}

/// `tcp_table` when at least one of the two files could be read.
fn tcp_table_if_readable(proc_root: &Path, pid: u32) -> Option<Vec<TcpEntry>> {
    let base = proc_root.join(format!("{pid}/net"));
    if !base.join("tcp").exists() && !base.join("tcp6").exists() {
        return None;
    }
    Some(tcp_table(proc_root, pid))
}

/// Command-line bytes read at most (`/proc/PID/cmdline`; a longer one is
/// cut there).
pub const MAX_CMDLINE: u64 = 128 << 10;
/// Environment bytes read at most (`/proc/PID/environ`).
pub const MAX_ENVIRON: u64 = 256 << 10;

/// `/proc/PID/{name}`, at most `max` bytes (a kernel file: never a FIFO).
fn proc_file(proc_root: &Path, pid: u32, name: &str, max: u64) -> Option<Vec<u8>> {
    use std::io::Read as _;
    let mut buf = Vec::new();
    fs::File::open(proc_root.join(pid.to_string()).join(name))
        .ok()?
        .take(max)
        .read_to_end(&mut buf)
        .ok()?;
    Some(buf)
}

/// The arguments of process `pid` (`/proc/PID/cmdline`, at most
/// [`MAX_CMDLINE`] bytes, split at NULs, empty ones dropped, lossy UTF-8):
/// the one reader of command lines. None when the process is gone.
pub fn proc_args(proc_root: &Path, pid: u32) -> Option<Vec<String>> {
    let raw = proc_file(proc_root, pid, "cmdline", MAX_CMDLINE)?;
    Some(
        raw.split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect(),
    )
}

/// The environment of process `pid` (`/proc/PID/environ`, at most
/// [`MAX_ENVIRON`] bytes): `KEY=value` entries, NUL-separated.
pub fn proc_environ(proc_root: &Path, pid: u32) -> Option<Vec<u8>> {
    proc_file(proc_root, pid, "environ", MAX_ENVIRON)
}

/// The parent pid in the text of `/proc/PID/stat` (the field after the
/// parenthesised comm, which may itself contain spaces and parentheses).
pub fn parse_stat_ppid(stat: &str) -> Option<u32> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut f = rest.split_whitespace();
    let _state = f.next()?;
    f.next()?.parse().ok()
}

/// `pid`'s parent pid (`/proc/PID/stat`), None once it is gone.
pub fn ppid(proc_root: &Path, pid: u32) -> Option<u32> {
    fs::read_to_string(proc_root.join(format!("{pid}/stat")))
        .ok()
        .as_deref()
        .and_then(parse_stat_ppid)
}

/// Every living descendant process of `root_pid` (children, their
/// children, …), from one pass over `/proc/*/stat`; `root_pid` excluded.
pub fn descendants(proc_root: &Path, root_pid: u32) -> Vec<u32> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    for pid in pids(proc_root) {
        if let Some(ppid) = fs::read_to_string(proc_root.join(format!("{pid}/stat")))
            .ok()
            .as_deref()
            .and_then(parse_stat_ppid)
        {
            children.entry(ppid).or_default().push(pid);
        }
    }
    let mut out = Vec::new();
    let mut seen = HashSet::from([root_pid]);
    let mut todo = vec![root_pid];
    while let Some(p) = todo.pop() {
        for &c in children.get(&p).map(Vec::as_slice).unwrap_or(&[]) {
            if seen.insert(c) {
                out.push(c);
                todo.push(c);
            }
        }
    }
    out.sort_unstable();
    out
}

/// The ancestors of `pid`, nearest first (parent, grandparent, … up to
/// pid 1), from `/proc/*/stat`; bounded at 64 levels.
pub fn ancestors(proc_root: &Path, pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let mut p = pid;
    while out.len() < 64 {
        let Some(ppid) = ppid(proc_root, p) else {
            break;
        };
        if ppid == 0 || out.contains(&ppid) {
            break;
        }
        out.push(ppid);
        p = ppid;
    }
    out
}

/// The container `pid` runs in, as the cgroup path of its container
/// (Kubernetes pods, Docker, containerd, CRI-O, podman; cgroup v1 or v2),
/// or None outside a container (a system or user slice is shared by
/// unrelated processes, so it is not an identity).
pub fn container_scope(proc_root: &Path, pid: u32) -> Option<String> {
    let text = fs::read_to_string(proc_root.join(format!("{pid}/cgroup"))).ok()?;
    container_scope_of(&text)
}

/// [`container_scope`] of the text of `/proc/PID/cgroup`.
pub fn container_scope_of(cgroup: &str) -> Option<String> {
    const MARKERS: [&str; 6] = [
        "kubepods",
        "docker",
        "containerd",
        "crio",
        "libpod",
        "cri-o",
    ];
    // v2 (`0::/path`) first, else the first v1 hierarchy naming a container.
    let mut paths: Vec<&str> = cgroup
        .lines()
        .filter_map(|l| l.splitn(3, ':').nth(2))
        .collect();
    paths.sort_by_key(|p| !cgroup.contains(&format!("0::{p}")));
    paths
        .into_iter()
        .find(|p| MARKERS.iter().any(|m| p.contains(m)))
        .map(str::to_string)
}

/// A container's identity as its cgroup path says it: the runtime's
/// 64-hex container id and, under Kubernetes, the pod's UID.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerIdentity {
    /// `container.id`: 64 lowercase hex digits.
    pub id: String,
    /// `k8s.pod.uid` (with dashes), when the path is a Kubernetes pod's.
    pub pod_uid: Option<String>,
}

/// The container identity of `pid` (None outside a container).
pub fn container_identity(proc_root: &Path, pid: u32) -> Option<ContainerIdentity> {
    let text = fs::read_to_string(proc_root.join(format!("{pid}/cgroup"))).ok()?;
    container_identity_of(&text)
}

/// [`container_identity`] of the text of `/proc/PID/cgroup`, for every
/// runtime and layout we know: cgroup v2 (`0::/…`) or v1 (any hierarchy);
/// the systemd cgroup driver (`…/kubepods-burstable-pod<uid_with_underscores>.slice/
/// cri-containerd-<id>.scope`, `crio-<id>.scope`, `docker-<id>.scope`,
/// `libpod-<id>.scope`) and the cgroupfs driver (`/kubepods/burstable/pod<uid>/<id>`,
/// `/kubepods/pod<uid>/<id>`, `/docker/<id>`); v2 wins when both name one.
pub fn container_identity_of(cgroup: &str) -> Option<ContainerIdentity> {
    let mut paths: Vec<&str> = cgroup
        .lines()
        .filter_map(|l| l.splitn(3, ':').nth(2))
        .collect();
    paths.sort_by_key(|p| !cgroup.contains(&format!("0::{p}")));
    paths.into_iter().find_map(identity_of_path)
}

fn is_id(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

fn identity_of_path(path: &str) -> Option<ContainerIdentity> {
    let mut id = None;
    let mut pod_uid = None;
    for seg in path.split('/') {
        // systemd driver: `<prefix>-<id>.scope`; cgroupfs: the bare id.
        let core = seg.strip_suffix(".scope").unwrap_or(seg);
        let candidate = core.rsplit('-').next().unwrap_or(core);
        // podman with the cgroupfs manager: `libpod-<id>` with no suffix
        // (its `libpod-conmon-<id>` is the monitor's, not the container's).
        let runtime_prefix = core
            .strip_suffix(candidate)
            .is_some_and(|p| matches!(p, "libpod-" | "docker-" | "crio-" | "cri-containerd-"));
        if is_id(candidate) && (core == candidate || seg.ends_with(".scope") || runtime_prefix) {
            id = Some(candidate.to_ascii_lowercase());
        }
        // Pod: `pod<uid>` (cgroupfs) or `kubepods-<qos>-pod<uid_>.slice`.
        let slice = seg.strip_suffix(".slice").unwrap_or(seg);
        if let Some(at) = slice.rfind("pod") {
            let uid = slice[at + 3..].replace('_', "-");
            let ok = uid.len() == 36
                && uid.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
                && uid.matches('-').count() == 4;
            if ok && (at == 0 || slice[..at].ends_with('-')) {
                pod_uid = Some(uid.to_ascii_lowercase());
            }
        }
    }
    id.map(|id| ContainerIdentity { id, pod_uid })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TCP: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 12345 1 0000000000000000 100 0 0 10 0
   1: 0100007F:1F90 0100007F:D2F0 01 00000000:00000000 00:00000000 00000000     0        0 12346 1 0000000000000000 20 4 30 10 -1
   2: garbage
";
    const TCP6: &str = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000001000000:1F91 00000000000000000000000001000000:A000 01 00000000:00000000 00:00000000 00000000     0        0 777 1 0000000000000000 20 4 30 10 -1
   1: 0000000000000000FFFF00000100007F:1F92 0000000000000000FFFF00000100007F:A001 01 00000000:00000000 00:00000000 00000000     0        0 778 1 0000000000000000 20 4 30 10 -1
";

    #[test]
    fn parses_v4_table_and_skips_bad_lines() {
        let t = parse_tcp_table(TCP, false);
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].local, "127.0.0.1:8080".parse().unwrap());
        assert_eq!(t[0].state, TCP_LISTEN);
        assert_eq!(t[1].peer, "127.0.0.1:54000".parse().unwrap());
        assert_eq!(t[1].inode, 12346);
    }

    #[test]
    fn parses_v6_and_unmaps_v4_mapped_addresses() {
        let t = parse_tcp_table(TCP6, true);
        assert_eq!(t[0].local, "[::1]:8081".parse().unwrap());
        assert_eq!(t[1].local, "127.0.0.1:8082".parse().unwrap());
    }

    #[test]
    fn listening_ports_only_counts_sockets_the_process_owns() {
        let t = parse_tcp_table(TCP, false);
        let owned: HashMap<u64, i32> = [(12345, 3)].into();
        assert_eq!(listening_ports(&t, &owned), [8080].into());
        assert!(listening_ports(&t, &HashMap::new()).is_empty());
    }

    /// A fake proc root: each process has a netns link, socket fd links
    /// and the TCP tables of its namespace.
    struct FakeProc(tempfile::TempDir);

    impl FakeProc {
        fn new() -> Self {
            Self(tempfile::tempdir().unwrap())
        }

        fn process(&self, pid: u32, ppid: u32, netns: u64, sockets: &[u64], tcp: &str) {
            let d = self.0.path().join(pid.to_string());
            fs::create_dir_all(d.join("fd")).unwrap();
            fs::create_dir_all(d.join("ns")).unwrap();
            fs::create_dir_all(d.join("net")).unwrap();
            std::os::unix::fs::symlink(format!("net:[{netns}]"), d.join("ns/net")).unwrap();
            for (fd, inode) in sockets.iter().enumerate() {
                std::os::unix::fs::symlink(
                    format!("socket:[{inode}]"),
                    d.join(format!("fd/{}", fd + 3)),
                )
                .unwrap();
            }
            fs::write(d.join("net/tcp"), tcp).unwrap();
            fs::write(
                d.join("stat"),
                format!("{pid} (a (weird) name) S {ppid} 1 1 0 -1 4194560"),
            )
            .unwrap();
        }

        fn root(&self) -> &Path {
            self.0.path()
        }
    }

    fn listen_line(port: u16, inode: u64) -> String {
        format!(
            "  sl  local_address rem_address   st\n   0: 00000000:{port:04X} 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 {inode} 1 0\n"
        )
    }

    #[test]
    fn listeners_are_found_in_every_network_namespace_not_only_the_agents() {
        let p = FakeProc::new();
        // The agent's own namespace (1): nothing listens on 8000 there
        // (its view, /proc/net/tcp, shows only port 22).
        fs::create_dir_all(p.root().join("net")).unwrap();
        fs::write(p.root().join("net/tcp"), listen_line(22, 500)).unwrap();
        p.process(10, 1, 1, &[], &listen_line(22, 500));
        // A pod (namespace 2): pid 20 listens on 8000; 21 shares the
        // namespace but not the socket.
        p.process(20, 1, 2, &[900], &listen_line(8000, 900));
        p.process(21, 1, 2, &[], &listen_line(8000, 900));
        // Another pod (3) with its own listener on the same port number.
        p.process(30, 1, 3, &[901], &listen_line(8000, 901));
        assert_eq!(pids_listening_on(p.root(), &[8000]), vec![20, 30]);
        assert_eq!(pids_listening_on(p.root(), &[22]), Vec::<u32>::new());
        assert_eq!(pids_listening_on(p.root(), &[9999]), Vec::<u32>::new());
    }

    #[test]
    fn each_network_namespace_table_is_read_once_through_any_member() {
        let p = FakeProc::new();
        // Only the second member of namespace 2 shows the table (the
        // first one's files are gone: it is exiting).
        p.process(20, 1, 2, &[], "");
        fs::remove_file(p.root().join("20/net/tcp")).unwrap();
        p.process(21, 1, 2, &[], &listen_line(8000, 900));
        p.process(22, 1, 2, &[900], "");
        assert_eq!(pids_listening_on(p.root(), &[8000]), vec![22]);
    }

    #[test]
    fn descendants_include_grandchildren_but_not_the_root_or_strangers() {
        let p = FakeProc::new();
        p.process(100, 1, 1, &[], "");
        p.process(101, 100, 1, &[], "");
        p.process(102, 101, 1, &[], "");
        p.process(103, 100, 1, &[], "");
        p.process(200, 1, 1, &[], "");
        assert_eq!(descendants(p.root(), 100), vec![101, 102, 103]);
        assert_eq!(descendants(p.root(), 102), Vec::<u32>::new());
        assert_eq!(
            parse_stat_ppid("7 (sh) (x) S 42 7 7 0"),
            Some(42),
            "comm with parentheses and spaces"
        );
        assert_eq!(parse_stat_ppid("garbage"), None);
    }

    #[test]
    fn container_ids_and_pod_uids_from_every_runtime_and_layout() {
        let id = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        let uid = "8d5a2f3e-1b2c-4d5e-9f00-112233445566";
        let uid_ = uid.replace('-', "_");
        let want = |pod: bool| {
            Some(ContainerIdentity {
                id: id.into(),
                pod_uid: pod.then(|| uid.to_string()),
            })
        };
        for (text, pod) in [
            // v2, systemd driver: containerd, CRI-O, docker (cri-dockerd)
            (format!("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice/cri-containerd-{id}.scope\n"), true),
            (format!("0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid_}.slice/crio-{id}.scope\n"), true),
            (format!("0::/kubepods.slice/kubepods-pod{uid_}.slice/docker-{id}.scope\n"), true),
            // v2, cgroupfs driver
            (format!("0::/kubepods/burstable/pod{uid}/{id}\n"), true),
            // v1 (hybrid or legacy), cgroupfs and systemd drivers
            (format!("12:pids:/kubepods/pod{uid}/{id}\n1:name=systemd:/kubepods/pod{uid}/{id}\n0::/\n"), true),
            (format!("4:memory:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice/cri-containerd-{id}.scope\n0::/\n"), true),
            // plain Docker and podman, no pod
            (format!("0::/system.slice/docker-{id}.scope\n"), false),
            (format!("8:pids:/docker/{id}\n"), false),
            (format!("0::/machine.slice/libpod-{id}.scope/container\n"), false),
            // podman, cgroupfs manager (v1 hierarchies)
            (format!("12:pids:/libpod_parent/libpod-{id}\n0::/\n"), false),
        ] {
            assert_eq!(container_identity_of(&text), want(pod), "{text}");
        }
        // Not containers.
        for text in [
            "0::/user.slice/user-0.slice/session-3.scope\n",
            "0::/\n",
            "0::/system.slice/sshd.service\n",
            "9:name=systemd:/\n4:memory:/process_api/63f072a98dec9eee8b0a1cf1bc5b7f02\n0::/\n",
            "garbage",
        ] {
            assert_eq!(container_identity_of(text), None, "{text}");
        }
    }

    #[test]
    fn containers_are_recognised_and_shared_slices_are_not() {
        let k8s = "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234.slice/cri-containerd-abcd.scope\n";
        assert_eq!(
            container_scope_of(k8s).as_deref(),
            Some("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234.slice/cri-containerd-abcd.scope")
        );
        let v1 = "12:pids:/kubepods/burstable/pod1234/abcd\n1:name=systemd:/kubepods/burstable/pod1234/abcd\n";
        assert_eq!(
            container_scope_of(v1).as_deref(),
            Some("/kubepods/burstable/pod1234/abcd")
        );
        assert_eq!(
            container_scope_of("0::/system.slice/docker-0123.scope\n").as_deref(),
            Some("/system.slice/docker-0123.scope")
        );
        assert_eq!(
            container_scope_of("0::/user.slice/user-0.slice/session-3.scope\n"),
            None
        );
        assert_eq!(container_scope_of("garbage"), None);
    }

    #[test]
    fn socket_link_parsing() {
        assert_eq!(parse_socket_link("socket:[42]"), Some(42));
        assert_eq!(parse_socket_link("pipe:[42]"), None);
        assert_eq!(parse_socket_link("/dev/null"), None);
    }
}
