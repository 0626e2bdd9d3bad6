//! Connection tracking from userspace: classifying what the kernel reported
//! as opened (TCP or not, local/peer address, selected `--port` or not),
//! untracking the rest, and seeding connections that existed before a
//! process became a target.
//!
//! Owns: CONNS from the userspace side and the per-connection `open` /
//! `ignored` sets. Must not: read payload bytes, or trust the agent's own
//! network namespace for a target's sockets (pidfd_getfd, else the
//! target's own `/proc/PID/net/tcp`).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use agent_ebpf::{
    conn_key, ConnState, RecordHeader, Syscall, AF_INET, AF_INET6, ROLE_CLIENT, ROLE_SERVER,
};

use super::{clock, State, BPF_NOEXIST};
use crate::{
    event::{OpenEvent, Role, SocketEvent},
    host::procfs::{self, FdKind, TcpEntry},
};

pub(super) fn peer_from_header(h: &RecordHeader) -> Option<SocketAddr> {
    let ip = match h.family {
        AF_INET => IpAddr::V4(Ipv4Addr::new(h.addr[0], h.addr[1], h.addr[2], h.addr[3])),
        AF_INET6 => {
            let v6 = Ipv6Addr::from(h.addr);
            match v6.to_ipv4_mapped() {
                Some(v4) => IpAddr::V4(v4),
                None => IpAddr::V6(v6),
            }
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, h.port))
}

/// Whether two peer addresses are the same (IPv4-mapped IPv6 as IPv4).
fn same_peer(a: Option<SocketAddr>, b: Option<SocketAddr>) -> bool {
    let canon = |s: SocketAddr| SocketAddr::new(s.ip().to_canonical(), s.port());
    matches!((a, b), (Some(a), Some(b)) if canon(a) == canon(b))
}

impl State {
    fn table(&mut self, pid: u32, reload: bool) -> &[TcpEntry] {
        if reload || !self.tables.contains_key(&pid) {
            let t = procfs::tcp_table(&self.proc_root, pid);
            self.tables.insert(pid, t);
        }
        self.tables.get(&pid).map(Vec::as_slice).unwrap_or(&[])
    }

    fn classify(&mut self, pid: u32, fd: i32) -> FdKind {
        if let Some(kind) = self.sockfds.classify(pid, fd) {
            return kind;
        }
        let root = self.proc_root.clone();
        let kind = procfs::classify_fd(&root, pid, fd, self.table(pid, false));
        if kind == FdKind::NotTcp {
            // The cached table may predate this connection: look again.
            return procfs::classify_fd(&root, pid, fd, self.table(pid, true));
        }
        kind
    }

    /// What the listening fd of an accept-born connection is, if any.
    /// An accept the thread entered before the agent attached has no
    /// saved arguments (`listen_fd` −1): then the process's only listening
    /// port (or the only one of them the capture selects) is its port.
    fn listener(&mut self, pid: u32, listen_fd: i32, sc: u8) -> Option<FdKind> {
        let accepted = sc == Syscall::Accept as u8 || sc == Syscall::Accept4 as u8;
        if !accepted {
            return None;
        }
        if listen_fd >= 0 {
            return Some(self.classify(pid, listen_fd));
        }
        let owned = procfs::socket_fds(&self.proc_root.clone(), pid);
        let mut ports = procfs::listening_ports(self.table(pid, false), &owned);
        if ports.len() > 1 && !self.ports.is_empty() {
            ports.retain(|p| self.ports.contains(p));
        }
        let mut only = ports.into_iter();
        match (only.next(), only.next()) {
            (Some(port), None) => Some(FdKind::Tcp {
                local: SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port),
                peer: None,
            }),
            _ => None,
        }
    }

    pub(super) fn untrack(&mut self, pid: u32, fd: i32) {
        let _ = self.conns.remove(&conn_key(pid, fd));
        self.ignored.insert((pid, fd));
        self.open.remove(&(pid, fd));
        self.conns_untracked += 1;
    }

    /// With `--port`: a target's accepted connections on those ports, and
    /// its outgoing ones to those ports (a gateway's upstream connections
    /// to an engine, for the gateway join); nothing else.
    fn selected(&self, role: Role, local: Option<SocketAddr>, peer: Option<SocketAddr>) -> bool {
        if self.ports.is_empty() {
            return true;
        }
        match (role, local, peer) {
            (Role::Server, Some(l), _) => self.ports.contains(&l.port()),
            // Unknown local address (fd already closed): keep rather than
            // lose a connection we cannot judge.
            (Role::Server, None, _) => true,
            (Role::Client, _, Some(p)) => self.ports.contains(&p.port()),
            (Role::Client, _, None) => false,
        }
    }

    pub(super) fn on_open(&mut self, h: &RecordHeader, out: &mut Vec<SocketEvent>) {
        let (pid, fd) = (h.tgid, h.fd);
        self.ignored.remove(&(pid, fd));
        let role = if h.role == ROLE_CLIENT {
            Role::Client
        } else {
            Role::Server
        };
        let from_header = peer_from_header(h);
        let (local, peer) = match self.classify(pid, fd) {
            // The same connection (its peer is the one accept/connect
            // reported, or none was reported).
            FdKind::Tcp { local, peer }
                if from_header.is_none() || peer.is_none() || same_peer(peer, from_header) =>
            {
                (Some(local), peer.or(from_header))
            }
            // The fd is already something else: the connection closed
            // before we looked, and its number was reused (a short-lived
            // probe: its data is already on its way). An accepted one is
            // still judged by its listening socket, which outlives it: an
            // accept on a TCP listener yields a TCP connection on its port.
            other => match self.listener(pid, h.offset as i32, h.syscall) {
                Some(FdKind::Tcp { local, .. }) => (Some(local), from_header),
                Some(FdKind::NotTcp) => {
                    self.untrack(pid, fd);
                    return;
                }
                _ => match other {
                    FdKind::NotTcp => {
                        self.untrack(pid, fd);
                        return;
                    }
                    FdKind::Tcp { local, .. } => (Some(local), from_header),
                    FdKind::Unknown => (None, from_header),
                },
            },
        };
        if !self.selected(role, local, peer) {
            self.untrack(pid, fd);
            return;
        }
        let ev = OpenEvent {
            ts_ns: self.clock.to_wall_ns(h.ts_ns),
            pid,
            fd,
            role,
            local,
            peer,
            joined: false,
        };
        self.open.insert((pid, fd), ev.clone());
        self.events += 1;
        out.push(SocketEvent::Open(ev));
    }

    pub(super) fn seed_pid(&mut self, pid: u32, out: &mut Vec<SocketEvent>) {
        let owned = procfs::socket_fds(&self.proc_root, pid);
        let table = procfs::tcp_table(&self.proc_root, pid);
        let listening = procfs::listening_ports(&table, &owned);
        let now = clock::monotonic_ns();
        for e in &table {
            if e.state == procfs::TCP_LISTEN {
                continue;
            }
            let Some(&fd) = owned.get(&e.inode) else {
                continue;
            };
            let role = if listening.contains(&e.local.port()) {
                Role::Server
            } else {
                Role::Client
            };
            if !self.selected(role, Some(e.local), Some(e.peer)) {
                continue;
            }
            let st = ConnState::new(if role == Role::Server {
                ROLE_SERVER
            } else {
                ROLE_CLIENT
            });
            // NOEXIST: the kernel may have seen this connection already.
            if self
                .conns
                .insert(conn_key(pid, fd), st, BPF_NOEXIST)
                .is_err()
            {
                continue;
            }
            let ev = OpenEvent {
                ts_ns: self.clock.to_wall_ns(now),
                pid,
                fd,
                role,
                local: Some(e.local),
                peer: Some(e.peer),
                joined: true,
            };
            self.open.insert((pid, fd), ev.clone());
            self.events += 1;
            out.push(SocketEvent::Open(ev));
        }
    }
}
