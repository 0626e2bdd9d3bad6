//! Asking a target's socket directly what it is: `pidfd_getfd` duplicates
//! the target's fd into the agent, then getsockopt/getsockname/getpeername
//! answer exactly and atomically, in whatever network namespace the
//! socket lives (unlike /proc/PID/net/tcp, which is read page by page and
//! can skip entries while connections come and go).
//!
//! Needs ptrace-level access to the target (root / CAP_SYS_PTRACE) and
//! Linux 5.6+; when that is missing the caller falls back to /proc.

use std::{
    collections::HashMap,
    mem::{size_of, zeroed},
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
};

use crate::host::procfs::FdKind;

#[derive(Default)]
pub struct SockFds {
    pidfds: HashMap<u32, OwnedFd>,
    /// Set once pidfd_getfd proved unusable (no permission / old kernel).
    unavailable: bool,
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn sockopt(fd: i32, opt: i32) -> Option<i32> {
    let mut v: i32 = 0;
    let mut len = size_of::<i32>() as libc::socklen_t;
    // SAFETY: valid out-pointers sized for an int option.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            opt,
            (&mut v as *mut i32).cast(),
            &mut len,
        )
    };
    (rc == 0).then_some(v)
}

/// Converts a sockaddr filled by the kernel.
pub fn to_socket_addr(ss: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match ss.ss_family as i32 {
        libc::AF_INET => {
            // SAFETY: family says this is a sockaddr_in.
            let sin: &libc::sockaddr_in = unsafe { &*(ss as *const _ as *const libc::sockaddr_in) };
            let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
            Some(SocketAddr::new(IpAddr::V4(ip), u16::from_be(sin.sin_port)))
        }
        libc::AF_INET6 => {
            // SAFETY: family says this is a sockaddr_in6.
            let sin6: &libc::sockaddr_in6 =
                unsafe { &*(ss as *const _ as *const libc::sockaddr_in6) };
            let v6 = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            let ip = match v6.to_ipv4_mapped() {
                Some(v4) => IpAddr::V4(v4),
                None => IpAddr::V6(v6),
            };
            Some(SocketAddr::new(ip, u16::from_be(sin6.sin6_port)))
        }
        _ => None,
    }
}

fn name(fd: i32, peer: bool) -> Option<SocketAddr> {
    // SAFETY: zeroed storage is valid; the kernel fills at most `len`.
    let mut ss: libc::sockaddr_storage = unsafe { zeroed() };
    let mut len = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    let p = (&mut ss as *mut libc::sockaddr_storage).cast();
    // SAFETY: as above.
    let rc = unsafe {
        if peer {
            libc::getpeername(fd, p, &mut len)
        } else {
            libc::getsockname(fd, p, &mut len)
        }
    };
    if rc != 0 {
        return None;
    }
    to_socket_addr(&ss)
}

impl SockFds {
    /// What `fd` of `pid` is, or None when this method cannot tell (the
    /// caller then asks /proc).
    pub fn classify(&mut self, pid: u32, fd: i32) -> Option<FdKind> {
        if self.unavailable {
            return None;
        }
        let pidfd = match self.pidfds.get(&pid) {
            Some(p) => p.as_raw_fd(),
            None => {
                // SAFETY: plain syscall; returns a new fd or -1.
                let r = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
                if r < 0 {
                    if errno() == libc::ENOSYS || errno() == libc::EPERM {
                        self.unavailable = true;
                    }
                    return None;
                }
                // SAFETY: fresh fd we own.
                let owned = unsafe { OwnedFd::from_raw_fd(r as i32) };
                let raw = owned.as_raw_fd();
                self.pidfds.insert(pid, owned);
                raw
            }
        };
        // SAFETY: plain syscall; returns a new fd or -1.
        let r = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd, fd, 0) };
        if r < 0 {
            return match errno() {
                libc::EBADF => Some(FdKind::Unknown),
                libc::ESRCH => {
                    self.pidfds.remove(&pid);
                    Some(FdKind::Unknown)
                }
                libc::EPERM | libc::ENOSYS => {
                    self.unavailable = true;
                    None
                }
                _ => None,
            };
        }
        // SAFETY: fresh fd we own; closed on drop.
        let dup = unsafe { OwnedFd::from_raw_fd(r as i32) };
        let s = dup.as_raw_fd();
        let domain = sockopt(s, libc::SO_DOMAIN);
        let proto = sockopt(s, libc::SO_PROTOCOL);
        let tcp = matches!(domain, Some(libc::AF_INET) | Some(libc::AF_INET6))
            && proto == Some(libc::IPPROTO_TCP);
        if !tcp {
            return Some(FdKind::NotTcp);
        }
        match name(s, false) {
            Some(local) => Some(FdKind::Tcp {
                local,
                peer: name(s, true),
            }),
            None => Some(FdKind::Unknown),
        }
    }

    /// Forget a process (it exited or is no longer a target).
    pub fn forget(&mut self, pid: u32) {
        self.pidfds.remove(&pid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The agent's own process needs no privilege: ptrace access checks
    /// always allow a thread group to reach itself, so pidfd_getfd on our
    /// own pid works unprivileged on every kernel with it (5.6+; this
    /// project requires far newer). Other processes need CAP_SYS_PTRACE,
    /// which the root integration tests exercise through real targets.
    #[test]
    fn own_sockets_are_classified_exactly() {
        let mut s = SockFds::default();
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let pid = std::process::id();
        assert_eq!(
            s.classify(pid, c.as_raw_fd()),
            Some(FdKind::Tcp {
                local: c.local_addr().unwrap(),
                peer: Some(l.local_addr().unwrap()),
            })
        );
        assert_eq!(
            s.classify(pid, l.as_raw_fd()),
            Some(FdKind::Tcp {
                local: l.local_addr().unwrap(),
                peer: None,
            }),
            "a listener has no peer"
        );
        let (u1, _u2) = std::os::unix::net::UnixStream::pair().unwrap();
        assert_eq!(s.classify(pid, u1.as_raw_fd()), Some(FdKind::NotTcp));
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        assert_eq!(s.classify(pid, udp.as_raw_fd()), Some(FdKind::NotTcp));
        assert_eq!(s.classify(pid, 987_654), Some(FdKind::Unknown));
    }
}
