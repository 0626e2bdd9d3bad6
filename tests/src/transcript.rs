//! Golden transcripts: a compact JSON description of one connection's
//! HTTP exchange (requests, response heads, stream events, errors, each at
//! a time offset) turned into the socket events the agent would capture.
//! The framing (Content-Length, chunk sizes, SSE `data:` lines) is
//! generated, so transcripts hold only what an engine's documentation
//! shows, and the expected request records sit beside them.
//!
//! Step kinds (one key besides `t_ms` per step):
//! `request` {method, path, headers, json | body}, `response` {status,
//! headers, chunked, json | body}, `sse` (JSON event → `data: …\n\n`),
//! `sse_raw` (verbatim SSE text), `ndjson` (JSON → one line), `end` (last
//! chunk), `raw_in` / `raw_out` (verbatim bytes), `write_error` (errno as a
//! negative return), `read_eof`, `close`, `arrival` {requests: N}: the
//! bytes of the next N `request` steps reached the socket at `t_ms` in one
//! segment (the kernel's arrival event; the requests' own steps say when
//! the engine read them).

use std::net::SocketAddr;

use serde::Deserialize;
use serde_json::{Map, Value};
use tokentap::event::{ArrivalEvent, CloseEvent, DataEvent, Dir, OpenEvent, Role, SocketEvent};

/// t = 0 of every transcript: 2027-01-15T08:00:00Z.
pub const BASE_NS: u64 = 1_800_000_000_000_000_000;

#[derive(Deserialize)]
pub struct Transcript {
    #[serde(default)]
    pub about: String,
    #[serde(default)]
    pub local: Option<String>,
    #[serde(default)]
    pub peer: Option<String>,
    pub steps: Vec<Map<String, Value>>,
    pub expect: Vec<Value>,
}

pub const PID: u32 = 4242;
pub const FD: i32 = 9;

fn head(first: &str, headers: Option<&Value>, extra: &[(String, String)]) -> String {
    let mut s = format!("{first}\r\n");
    if let Some(Value::Object(h)) = headers {
        for (k, v) in h {
            s += &format!(
                "{k}: {}\r\n",
                v.as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| v.to_string())
            );
        }
    }
    for (k, v) in extra {
        s += &format!("{k}: {v}\r\n");
    }
    s + "\r\n"
}

fn body_of(o: &Map<String, Value>) -> Option<String> {
    if let Some(j) = o.get("json") {
        return Some(j.to_string());
    }
    o.get("body").and_then(Value::as_str).map(str::to_string)
}

/// Socket events for a transcript, in order.
pub fn events(t: &Transcript) -> Vec<SocketEvent> {
    let mut out = vec![SocketEvent::Open(OpenEvent {
        ts_ns: BASE_NS,
        pid: PID,
        fd: FD,
        role: Role::Server,
        local: Some(
            t.local
                .as_deref()
                .unwrap_or("127.0.0.1:8000")
                .parse::<SocketAddr>()
                .unwrap(),
        ),
        peer: Some(
            t.peer
                .as_deref()
                .unwrap_or("127.0.0.1:50000")
                .parse::<SocketAddr>()
                .unwrap(),
        ),
        joined: false,
    })];
    let mut chunked = false;
    let data = |ts: u64, dir: Dir, bytes: Vec<u8>, ret: Option<i64>| {
        SocketEvent::Data(DataEvent {
            ts_ns: ts,
            pid: PID,
            tid: PID,
            fd: FD,
            dir,
            ret: ret.unwrap_or(bytes.len() as i64),
            data: bytes,
            syscall: None,
        })
    };
    let frame = |chunked: bool, s: String| -> Vec<u8> {
        if chunked {
            format!("{:x}\r\n{s}\r\n", s.len()).into_bytes()
        } else {
            s.into_bytes()
        }
    };
    let request_bytes = |o: &Map<String, Value>| -> Vec<u8> {
        let body = body_of(o);
        let mut extra = vec![];
        if let Some(b) = &body {
            extra.push(("Content-Length".to_string(), b.len().to_string()));
        }
        let line = format!(
            "{} {} HTTP/1.1",
            o.get("method").and_then(Value::as_str).unwrap_or("POST"),
            o.get("path").and_then(Value::as_str).expect("request path")
        );
        let mut bytes = head(&line, o.get("headers"), &extra).into_bytes();
        bytes.extend(body.unwrap_or_default().into_bytes());
        bytes
    };
    let (local, peer) = match &out[0] {
        SocketEvent::Open(o) => (o.local.unwrap(), o.peer.unwrap()),
        _ => unreachable!(),
    };
    for (i, step) in t.steps.iter().enumerate() {
        let t_ms = step
            .get("t_ms")
            .and_then(Value::as_f64)
            .expect("every step has t_ms");
        let ts = BASE_NS + (t_ms * 1e6).round() as u64;
        let (kind, v) = step
            .iter()
            .find(|(k, _)| k.as_str() != "t_ms")
            .expect("every step has a kind");
        match kind.as_str() {
            "request" => {
                let o = v.as_object().expect("request object");
                out.push(data(ts, Dir::In, request_bytes(o), None));
            }
            "arrival" => {
                let n = v
                    .get("requests")
                    .and_then(Value::as_u64)
                    .expect("arrival {requests: N}") as usize;
                let len: usize = t.steps[i + 1..]
                    .iter()
                    .filter_map(|s| s.get("request").and_then(Value::as_object))
                    .take(n)
                    .map(|o| request_bytes(o).len())
                    .sum();
                out.push(SocketEvent::Arrival(ArrivalEvent {
                    ts_ns: ts,
                    local_port: local.port(),
                    peer,
                    len: len as u32,
                    cookie: 0,
                }));
            }
            "response" => {
                let o = v.as_object().expect("response object");
                chunked = o.get("chunked").and_then(Value::as_bool).unwrap_or(false);
                let body = body_of(o);
                let mut extra = vec![];
                if chunked {
                    extra.push(("Transfer-Encoding".to_string(), "chunked".to_string()));
                } else if let Some(b) = &body {
                    extra.push(("Content-Length".to_string(), b.len().to_string()));
                }
                let line = format!(
                    "HTTP/1.1 {} X",
                    o.get("status").and_then(Value::as_u64).unwrap_or(200)
                );
                let mut bytes = head(&line, o.get("headers"), &extra).into_bytes();
                bytes.extend(body.unwrap_or_default().into_bytes());
                out.push(data(ts, Dir::Out, bytes, None));
            }
            "sse" => out.push(data(
                ts,
                Dir::Out,
                frame(chunked, format!("data: {v}\n\n")),
                None,
            )),
            "sse_raw" => out.push(data(
                ts,
                Dir::Out,
                frame(chunked, v.as_str().expect("sse_raw text").to_string()),
                None,
            )),
            "ndjson" => out.push(data(ts, Dir::Out, frame(chunked, format!("{v}\n")), None)),
            "end" => out.push(data(ts, Dir::Out, b"0\r\n\r\n".to_vec(), None)),
            "raw_in" => out.push(data(
                ts,
                Dir::In,
                v.as_str().expect("raw_in text").as_bytes().to_vec(),
                None,
            )),
            "raw_out" => out.push(data(
                ts,
                Dir::Out,
                v.as_str().expect("raw_out text").as_bytes().to_vec(),
                None,
            )),
            "write_error" => out.push(data(ts, Dir::Out, vec![], Some(v.as_i64().expect("errno")))),
            "read_eof" => out.push(data(ts, Dir::In, vec![], Some(0))),
            "close" => out.push(SocketEvent::Close(CloseEvent {
                ts_ns: ts,
                pid: PID,
                fd: FD,
            })),
            other => panic!("unknown step kind {other:?}"),
        }
    }
    out
}
