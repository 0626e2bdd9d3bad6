//! Capture files: JSON Lines of socket events (the format is a contract,
//! see docs/architecture.md). Writing and reading both live here so the two
//! can never disagree.
//!
//! One object per line, `type` = `open` | `data` | `close`; `ts_ns` is
//! wall-clock nanoseconds; payloads are base64 in `data_b64`. Unknown keys
//! are ignored on read; a malformed line is reported with its number and
//! skipped.

use std::{
    fs::OpenOptions,
    io::{self, BufRead, BufWriter, Write},
    net::SocketAddr,
    os::unix::fs::OpenOptionsExt,
    path::Path,
};

use anyhow::{Context, Result};
use base64::{engine::general_purpose::STANDARD as B64, Engine as _};
use serde::{Deserialize, Serialize};

use crate::event::{ArrivalEvent, CloseEvent, DataEvent, Dir, OpenEvent, Role, SocketEvent};

#[derive(Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
enum Line {
    Open {
        ts_ns: u64,
        pid: u32,
        fd: i32,
        role: RoleStr,
        #[serde(default)]
        local: Option<String>,
        #[serde(default)]
        peer: Option<String>,
        /// Found already open (absent: seen accepted or connected).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        joined: bool,
    },
    Data {
        ts_ns: u64,
        pid: u32,
        #[serde(default)]
        tid: Option<u32>,
        fd: i32,
        dir: DirStr,
        ret: i64,
        #[serde(default)]
        data_b64: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        syscall: Option<String>,
    },
    Close {
        ts_ns: u64,
        pid: u32,
        fd: i32,
    },
    Arrival {
        ts_ns: u64,
        local_port: u16,
        peer: String,
        len: u32,
        /// The receiving socket's cookie (0 or absent: unknown, as in
        /// files written before it was recorded).
        #[serde(default, skip_serializing_if = "is_zero")]
        cookie: u64,
    },
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

#[derive(Serialize, Deserialize, Clone, Copy)]
#[serde(rename_all = "lowercase")]
enum RoleStr {
    Server,
    Client,
}

#[derive(Serialize, Deserialize, Clone, Copy)]
#[serde(rename_all = "lowercase")]
enum DirStr {
    In,
    Out,
}

/// Serialise one event as a JSON line (no trailing newline).
pub fn to_line(ev: &SocketEvent) -> String {
    let line = match ev {
        SocketEvent::Open(e) => Line::Open {
            ts_ns: e.ts_ns,
            pid: e.pid,
            fd: e.fd,
            role: match e.role {
                Role::Server => RoleStr::Server,
                Role::Client => RoleStr::Client,
            },
            local: e.local.map(|a| a.to_string()),
            peer: e.peer.map(|a| a.to_string()),
            joined: e.joined,
        },
        SocketEvent::Data(e) => Line::Data {
            ts_ns: e.ts_ns,
            pid: e.pid,
            tid: Some(e.tid),
            fd: e.fd,
            dir: match e.dir {
                Dir::In => DirStr::In,
                Dir::Out => DirStr::Out,
            },
            ret: e.ret,
            data_b64: B64.encode(&e.data),
            syscall: e.syscall.map(|s| s.name().to_string()),
        },
        SocketEvent::Close(e) => Line::Close {
            ts_ns: e.ts_ns,
            pid: e.pid,
            fd: e.fd,
        },
        SocketEvent::Arrival(e) => Line::Arrival {
            ts_ns: e.ts_ns,
            local_port: e.local_port,
            peer: e.peer.to_string(),
            len: e.len,
            cookie: e.cookie,
        },
    };
    // Serialising plain structs of numbers and strings cannot fail.
    serde_json::to_string(&line).unwrap_or_default()
}

/// Parse one JSON line into an event.
pub fn from_line(text: &str) -> Result<SocketEvent> {
    let line: Line = serde_json::from_str(text)?;
    let addr = |s: Option<String>| -> Result<Option<SocketAddr>> {
        match s {
            None => Ok(None),
            Some(s) if s.is_empty() => Ok(None),
            Some(s) => {
                Ok(Some(s.parse().with_context(|| {
                    format!("bad address {s:?} (want IP:PORT)")
                })?))
            }
        }
    };
    Ok(match line {
        Line::Open {
            ts_ns,
            pid,
            fd,
            role,
            local,
            peer,
            joined,
        } => SocketEvent::Open(OpenEvent {
            ts_ns,
            pid,
            fd,
            role: match role {
                RoleStr::Server => Role::Server,
                RoleStr::Client => Role::Client,
            },
            local: addr(local)?,
            peer: addr(peer)?,
            joined,
        }),
        Line::Data {
            ts_ns,
            pid,
            tid,
            fd,
            dir,
            ret,
            data_b64,
            syscall,
        } => SocketEvent::Data(DataEvent {
            ts_ns,
            pid,
            tid: tid.unwrap_or(pid),
            fd,
            dir: match dir {
                DirStr::In => Dir::In,
                DirStr::Out => Dir::Out,
            },
            ret,
            data: B64
                .decode(data_b64.as_bytes())
                .context("data_b64 is not valid base64")?,
            // A name this agent does not know is left out, not an error.
            syscall: syscall.as_deref().and_then(agent_ebpf::Syscall::from_name),
        }),
        Line::Close { ts_ns, pid, fd } => SocketEvent::Close(CloseEvent { ts_ns, pid, fd }),
        Line::Arrival {
            ts_ns,
            local_port,
            peer,
            len,
            cookie,
        } => SocketEvent::Arrival(ArrivalEvent {
            ts_ns,
            local_port,
            peer: addr(Some(peer))?.context("an arrival needs its peer")?,
            len,
            cookie,
        }),
    })
}

/// Writes events to a capture file created with mode 0600 (it holds
/// prompts and completions).
pub struct Writer {
    out: BufWriter<Box<dyn Write + Send>>,
    pub events: u64,
}

impl Writer {
    /// `-` writes to stdout.
    pub fn create(path: &Path) -> Result<Self> {
        let sink: Box<dyn Write + Send> = if path.as_os_str() == "-" {
            Box::new(io::stdout())
        } else {
            let f = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(path)
                .with_context(|| format!("cannot create capture file {}", path.display()))?;
            Box::new(f)
        };
        Ok(Self {
            out: BufWriter::with_capacity(1 << 16, sink),
            events: 0,
        })
    }

    pub fn write(&mut self, ev: &SocketEvent) -> Result<()> {
        self.out.write_all(to_line(ev).as_bytes())?;
        self.out.write_all(b"\n")?;
        self.events += 1;
        Ok(())
    }

    pub fn flush(&mut self) -> Result<()> {
        self.out.flush()?;
        Ok(())
    }
}

/// A line that could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadLine {
    pub line_no: usize,
    pub error: String,
}

/// Reads a capture file line by line; blank lines are skipped, malformed
/// ones are collected in `bad` (with their line number) and skipped.
pub struct Reader<R> {
    input: R,
    line_no: usize,
    buf: Vec<u8>,
    pub bad: Vec<BadLine>,
}

impl<R: BufRead> Reader<R> {
    pub fn new(input: R) -> Self {
        Self {
            input,
            line_no: 0,
            buf: Vec::new(),
            bad: Vec::new(),
        }
    }

    /// Appends up to `max` events to `out`; returns false at end of input.
    pub fn next_batch(&mut self, max: usize, out: &mut Vec<SocketEvent>) -> Result<bool> {
        let mut got = 0;
        while got < max {
            self.buf.clear();
            let n = self
                .input
                .read_until(b'\n', &mut self.buf)
                .context("reading capture file")?;
            if n == 0 {
                return Ok(false);
            }
            self.line_no += 1;
            let text = match std::str::from_utf8(&self.buf) {
                Ok(t) => t.trim(),
                Err(e) => {
                    self.bad.push(BadLine {
                        line_no: self.line_no,
                        error: format!("not UTF-8: {e}"),
                    });
                    continue;
                }
            };
            if text.is_empty() {
                continue;
            }
            match from_line(text) {
                Ok(ev) => {
                    out.push(ev);
                    got += 1;
                }
                Err(e) => self.bad.push(BadLine {
                    line_no: self.line_no,
                    error: format!("{e:#}"),
                }),
            }
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<SocketEvent> {
        vec![
            SocketEvent::Open(OpenEvent {
                ts_ns: 1,
                pid: 10,
                fd: 5,
                role: Role::Server,
                local: Some("127.0.0.1:8000".parse().unwrap()),
                peer: Some("[::1]:40000".parse().unwrap()),
                joined: true,
            }),
            SocketEvent::Data(DataEvent {
                ts_ns: 2,
                pid: 10,
                tid: 11,
                fd: 5,
                dir: Dir::Out,
                ret: 7,
                data: vec![0, 159, 146, 150, b'a', b'\n', 255],
                syscall: Some(agent_ebpf::Syscall::Writev),
            }),
            SocketEvent::Data(DataEvent {
                ts_ns: 3,
                pid: 10,
                tid: 10,
                fd: 5,
                dir: Dir::Out,
                ret: -32,
                data: vec![],
                syscall: None,
            }),
            SocketEvent::Arrival(ArrivalEvent {
                ts_ns: 9,
                local_port: 8000,
                peer: "[::1]:5000".parse().unwrap(),
                len: 120,
                cookie: 77,
            }),
            SocketEvent::Close(CloseEvent {
                ts_ns: 4,
                pid: 10,
                fd: 5,
            }),
        ]
    }

    #[test]
    fn every_event_kind_round_trips_through_a_line() {
        for ev in sample() {
            assert_eq!(from_line(&to_line(&ev)).unwrap(), ev);
        }
    }

    #[test]
    fn unknown_keys_are_ignored_and_tid_defaults_to_pid() {
        let ev = from_line(
            r#"{"type":"data","ts_ns":5,"pid":3,"fd":4,"dir":"in","ret":2,"data_b64":"aGk=","future":{"x":1}}"#,
        )
        .unwrap();
        match ev {
            SocketEvent::Data(d) => {
                assert_eq!(d.tid, 3);
                assert_eq!(d.data, b"hi");
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn malformed_lines_are_reported_with_their_number_and_skipped() {
        let text = format!(
            "{}\nnot json\n\n{{\"type\":\"data\",\"ts_ns\":1}}\n{{\"type\":\"open\",\"ts_ns\":1,\"pid\":1,\"fd\":1,\"role\":\"server\",\"local\":\"nope\"}}\n{}\n",
            to_line(&sample()[0]),
            to_line(&sample()[3])
        );
        let mut r = Reader::new(text.as_bytes());
        let mut good = vec![];
        while r.next_batch(1, &mut good).unwrap() {}
        assert_eq!(good.len(), 2);
        let bad: Vec<usize> = r.bad.iter().map(|b| b.line_no).collect();
        assert_eq!(bad, vec![2, 4, 5]);
    }
}
