//! Ring-buffer records to typed output: socket events (data, open, close)
//! for the pipeline, and process events (exec, fork, exit) for discovery.
//!
//! Owns: parsing a record's header (never trusting its lengths), the
//! bounded process-event queue, and keeping the userspace target set in
//! step with the kernel's fork/exit records. Must not: block, or keep
//! payload bytes beyond the event they belong to.

use agent_ebpf::{conn_key, Direction, RecordHeader, RecordKind, Syscall, HEADER_BYTES};

use super::State;
use crate::event::{ArrivalEvent, CloseEvent, DataEvent, Dir, SocketEvent};

/// Process events kept between two `Capture::take_proc_events` calls at
/// most; later ones are counted in `CaptureStats::proc_events_dropped`.
pub const PROC_EVENTS_CAP: usize = 4096;

/// A process-lifecycle event seen by the kernel programs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProcEvent {
    /// Some process on the host (targeted or not) called execve; `comm` is
    /// its new command name (at most 15 bytes, lossily decoded).
    Exec { pid: u32, comm: String },
    /// A target forked a new process, which the kernel now captures too.
    Fork { parent: u32, child: u32 },
    /// A target's last thread exited; it is no longer captured.
    Exit { pid: u32 },
    /// Some process on the host called listen(2) on `fd` (it may have
    /// failed: check the process's sockets).
    Listen { pid: u32, fd: i32 },
}

/// The command name in an exec record's 16-byte payload.
fn comm_of(payload: &[u8]) -> String {
    let raw = &payload[..payload.len().min(16)];
    let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
    String::from_utf8_lossy(&raw[..end]).into_owned()
}

impl State {
    pub(super) fn handle(&mut self, bytes: &[u8], out: &mut Vec<SocketEvent>) {
        self.records_received += 1;
        if bytes.len() < HEADER_BYTES {
            return;
        }
        // SAFETY: length checked; RecordHeader is plain data, read unaligned.
        let h: RecordHeader = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) };
        let payload = &bytes[HEADER_BYTES..];
        let payload = &payload[..(h.cap_len as usize).min(payload.len())];
        match RecordKind::from_u8(h.kind) {
            Some(RecordKind::Data) => {
                let mut done = std::mem::take(&mut self.scratch);
                self.reasm.push(h, payload, &mut done);
                for (h, data) in done.drain(..) {
                    self.emit_data(h, data, out);
                }
                self.scratch = done;
            }
            Some(RecordKind::Open) => self.on_open(&h, out),
            Some(RecordKind::Close) => {
                let key = (h.tgid, h.fd);
                if self.ignored.remove(&key) {
                    return;
                }
                self.open.remove(&key);
                self.events += 1;
                out.push(SocketEvent::Close(CloseEvent {
                    ts_ns: self.clock.to_wall_ns(h.ts_ns),
                    pid: h.tgid,
                    fd: h.fd,
                }));
            }
            Some(RecordKind::Exit) => self.on_exit(&h, out),
            Some(RecordKind::Fork) => self.on_fork(&h),
            Some(RecordKind::Exec) => self.push_proc(ProcEvent::Exec {
                pid: h.tgid,
                comm: comm_of(payload),
            }),
            Some(RecordKind::Listen) => self.push_proc(ProcEvent::Listen {
                pid: h.tgid,
                fd: h.fd,
            }),
            Some(RecordKind::Arrival) => {
                if let Some(peer) = super::conns::peer_from_header(&h) {
                    self.events += 1;
                    out.push(SocketEvent::Arrival(ArrivalEvent {
                        ts_ns: self.clock.to_wall_ns(h.ts_ns),
                        local_port: h.fd as u16,
                        peer,
                        len: h.ret.max(0) as u32,
                        cookie: h.cookie(),
                    }));
                }
            }
            None => {}
        }
    }

    /// Queues a process event, or counts it when the queue is full.
    pub(super) fn push_proc(&mut self, ev: ProcEvent) {
        if self.proc_events.len() < PROC_EVENTS_CAP {
            self.proc_events.push(ev);
        } else {
            self.proc_events_dropped += 1;
        }
    }

    pub(super) fn emit_data(&mut self, h: RecordHeader, data: Vec<u8>, out: &mut Vec<SocketEvent>) {
        if self.ignored.contains(&(h.tgid, h.fd)) {
            return;
        }
        let dir = if h.dir == Direction::Out as u8 {
            Dir::Out
        } else {
            Dir::In
        };
        self.events += 1;
        out.push(SocketEvent::Data(DataEvent {
            ts_ns: self.clock.to_wall_ns(h.ts_ns),
            pid: h.tgid,
            tid: h.tid,
            fd: h.fd,
            dir,
            ret: h.ret,
            data,
            syscall: Syscall::from_u8(h.syscall),
        }));
    }

    /// The kernel already put the child in TARGETS. Its connections are
    /// the ones it opens from now on (accept/connect in the kernel);
    /// sockets inherited from the parent stay the parent's.
    fn on_fork(&mut self, h: &RecordHeader) {
        let Ok(child) = u32::try_from(h.ret) else {
            return;
        };
        if child == 0 || !self.target_pids.insert(child) {
            return;
        }
        self.push_proc(ProcEvent::Fork {
            parent: h.tgid,
            child,
        });
    }

    /// The kernel already removed the process from TARGETS (so a recycled
    /// pid is not captured); close what it had open.
    fn on_exit(&mut self, h: &RecordHeader, out: &mut Vec<SocketEvent>) {
        let pid = h.tgid;
        if self.target_pids.remove(&pid) {
            self.push_proc(ProcEvent::Exit { pid });
        }
        self.sockfds.forget(pid);
        let mut fds: Vec<i32> = self
            .open
            .keys()
            .filter(|(p, _)| *p == pid)
            .map(|(_, fd)| *fd)
            .collect();
        fds.sort_unstable();
        let ts_ns = self.clock.to_wall_ns(h.ts_ns);
        for fd in fds {
            let _ = self.conns.remove(&conn_key(pid, fd));
            self.open.remove(&(pid, fd));
            self.events += 1;
            out.push(SocketEvent::Close(CloseEvent { ts_ns, pid, fd }));
        }
        self.ignored.retain(|(p, _)| *p != pid);
    }
}

#[cfg(test)]
mod tests {
    use super::comm_of;

    #[test]
    fn comm_stops_at_the_first_nul_and_never_reads_past_16_bytes() {
        assert_eq!(comm_of(b"llama-server\0\0\0\0"), "llama-server");
        assert_eq!(comm_of(b"0123456789abcdefXYZ"), "0123456789abcdef");
        assert_eq!(comm_of(b""), "");
        assert_eq!(comm_of(b"a\xffb\0"), "a\u{fffd}b");
    }
}
