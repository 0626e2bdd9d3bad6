//! The typed socket events every later stage consumes, whether they come
//! from the live kernel capture or from a capture file.
//!
//! Owns: the event types. Must not: do I/O.

use std::net::SocketAddr;

/// Which side of the connection the traced process is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// The process accepted the connection (an inference server).
    Server,
    /// The process connected out.
    Client,
}

/// Direction of bytes as seen by the traced process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dir {
    /// The process read them (a request, for a server).
    In,
    /// The process wrote them (a response, for a server).
    Out,
}

/// A tracked TCP connection appeared (accepted, connected, or found open
/// at start-up).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenEvent {
    /// Wall-clock UNIX-epoch nanoseconds.
    pub ts_ns: u64,
    pub pid: u32,
    pub fd: i32,
    pub role: Role,
    pub local: Option<SocketAddr>,
    pub peer: Option<SocketAddr>,
    /// Found already open (at start-up, or when its process became a
    /// target), not seen accepted or connected: it may be mid-request or
    /// mid-response, so decoding starts at its next request.
    pub joined: bool,
}

/// One read- or write-family syscall on a tracked connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataEvent {
    /// Wall-clock UNIX-epoch nanoseconds at syscall exit.
    pub ts_ns: u64,
    pub pid: u32,
    pub tid: u32,
    pub fd: i32,
    pub dir: Dir,
    /// The syscall's return value: bytes moved, or a negative errno
    /// (-EPIPE, -ECONNRESET: the peer went away).
    pub ret: i64,
    /// Captured payload; shorter than `ret` when capture was truncated.
    pub data: Vec<u8>,
    /// The syscall (`write`, `writev`, …) when known.
    pub syscall: Option<agent_ebpf::Syscall>,
}

impl DataEvent {
    /// TLS plaintext (OpenSSL's `SSL_read` / `SSL_write`, from the TLS
    /// source) rather than the socket's own bytes.
    pub fn is_tls_plaintext(&self) -> bool {
        matches!(
            self.syscall,
            Some(
                agent_ebpf::Syscall::SslRead
                    | agent_ebpf::Syscall::SslWrite
                    | agent_ebpf::Syscall::SslWriteSocket
            )
        )
    }

    /// A ciphertext read inside an SSL call: its size and time, without
    /// its bytes (the plaintext comes from the TLS source).
    pub fn is_tls_cipher(&self) -> bool {
        self.syscall == Some(agent_ebpf::Syscall::TlsCipher)
    }

    /// True when fewer bytes were captured than the call moved.
    pub fn truncated(&self) -> bool {
        self.ret > 0 && (self.data.len() as i64) < self.ret && !self.is_tls_cipher()
    }
}

/// A tracked connection's fd was closed (or its process exited).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CloseEvent {
    pub ts_ns: u64,
    pub pid: u32,
    pub fd: i32,
}

/// A data segment reached a listening engine's socket in the kernel's TCP
/// receive path (before, and whether or not, the engine reads it; also
/// before `accept()` returns). Joined to its connection by the local port
/// and the peer's address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArrivalEvent {
    /// Wall-clock UNIX-epoch nanoseconds.
    pub ts_ns: u64,
    /// The engine's (local) port.
    pub local_port: u16,
    pub peer: SocketAddr,
    /// Payload bytes of the segment.
    pub len: u32,
    /// The receiving socket's cookie (`tcp_probe`'s `sock_cookie`): one
    /// value per socket for the kernel's uptime, so a segment of a new
    /// connection is told from an old one's with the same addresses. 0:
    /// unknown.
    pub cookie: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SocketEvent {
    Open(OpenEvent),
    Data(DataEvent),
    Close(CloseEvent),
    Arrival(ArrivalEvent),
}

impl SocketEvent {
    pub fn ts_ns(&self) -> u64 {
        match self {
            Self::Open(e) => e.ts_ns,
            Self::Data(e) => e.ts_ns,
            Self::Close(e) => e.ts_ns,
            Self::Arrival(e) => e.ts_ns,
        }
    }

    /// (pid, fd): the connection this event belongs to (None for an
    /// arrival, which the kernel sees before any process does).
    pub fn conn(&self) -> Option<(u32, i32)> {
        match self {
            Self::Open(e) => Some((e.pid, e.fd)),
            Self::Data(e) => Some((e.pid, e.fd)),
            Self::Close(e) => Some((e.pid, e.fd)),
            Self::Arrival(_) => None,
        }
    }
}
