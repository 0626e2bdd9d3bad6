//! What /proc says about sockets: fd → socket inode, TCP tables, listening
//! ports. Used to resolve connections the kernel side could not describe
//! (accept with a NULL address), to seed connections that were open before
//! the agent started, and to find processes listening on a port.
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
    let Ok(dir) = fs::read_dir(proc_root.join(format!("{pid}/fd"))) else {
        return out;
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

/// Processes (in the agent's network namespace view) holding a listening
/// TCP socket on one of `ports`.
pub fn pids_listening_on(proc_root: &Path, ports: &[u16]) -> Vec<u32> {
    let mut listen_inodes = HashSet::new();
    for (file, v6) in [("net/tcp", false), ("net/tcp6", true)] {
        if let Ok(text) = fs::read_to_string(proc_root.join(file)) {
            for e in parse_tcp_table(&text, v6) {
                if e.state == TCP_LISTEN && ports.contains(&e.local.port()) {
                    listen_inodes.insert(e.inode);
                }
            }
        }
    }
    let mut pids = Vec::new();
    if listen_inodes.is_empty() {
        return pids;
    }
    let Ok(dir) = fs::read_dir(proc_root) else {
        return pids;
    };
    for ent in dir.flatten() {
        let Some(pid) = ent.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if socket_fds(proc_root, pid)
            .keys()
            .any(|i| listen_inodes.contains(i))
        {
            pids.push(pid);
        }
    }
    pids.sort_unstable();
    pids
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

    #[test]
    fn socket_link_parsing() {
        assert_eq!(parse_socket_link("socket:[42]"), Some(42));
        assert_eq!(parse_socket_link("pipe:[42]"), None);
        assert_eq!(parse_socket_link("/dev/null"), None);
    }
}
