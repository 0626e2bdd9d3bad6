//! Socket events → finished requests. One HTTP/1.1 state machine per
//! connection (requests and responses framed by Content-Length, chunked
//! transfer or connection close; keep-alive, pipelining, `100 Continue`),
//! response bodies decoded as SSE, NDJSON or a whole JSON body, and each
//! event interpreted by the engine format of its endpoint (`engines`).
//!
//! Owns: per-connection parsing state and its bounds. Must not: read a
//! clock (every time comes from events), hold unbounded memory, or panic on
//! any input (hostile bytes end in a record with `error_type`, or nothing).

pub mod chunked;
pub mod engines;
pub mod exchange;
pub mod stream;

use std::collections::{HashMap, VecDeque};

use serde::Serialize;

use self::{
    chunked::Chunked,
    engines::{interpret, provider_from_server_header, request_info, Format},
    exchange::Exchange,
    stream::{Ndjson, Sse},
};
use crate::{
    event::{DataEvent, Dir, Role, SocketEvent},
    record::Finished,
};

/// A request or response head larger than this is garbage.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Request body bytes kept for JSON parsing (model, stream flag, prompt).
pub const MAX_REQUEST_BODY: usize = 1 << 20;
/// Non-streamed response body bytes kept for JSON parsing.
pub const MAX_RESPONSE_BODY: usize = 4 << 20;
/// Requests waiting for their response on one connection (pipelining).
pub const MAX_PIPELINE: usize = 64;
const MAX_HEADERS: usize = 96;

/// Counters of what decoding saw; exported as the agent's health.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DecodeStats {
    pub records: u64,
    pub events: u64,
    /// Connections whose bytes stopped making sense as HTTP.
    pub desyncs: u64,
    /// Responses that matched no request.
    pub orphan_responses: u64,
    /// Stream events or bodies too large to keep.
    pub oversized: u64,
    /// Calls that arrived shorter than they were (capture truncated).
    pub truncated_calls: u64,
    pub connections: u64,
    /// Connections speaking a protocol this decoder does not follow
    /// (HTTP/2 preface, a `101 Switching Protocols` upgrade).
    pub unsupported_protocol: u64,
}

enum Framing {
    None,
    Length(u64),
    Chunked(Chunked),
    UntilClose,
}

enum Body {
    Sse(Sse),
    Ndjson(Ndjson),
    Plain { buf: Vec<u8>, complete: bool },
}

enum ReqState {
    Head {
        buf: Vec<u8>,
        start_ns: Option<u64>,
    },
    Body {
        seq: u64,
        framing: Framing,
        buf: Vec<u8>,
        complete: bool,
    },
}

enum RespState {
    Head {
        buf: Vec<u8>,
    },
    Body {
        framing: Framing,
        body: Body,
        head_request: bool,
    },
}

struct Conn {
    pid: u32,
    role: Role,
    server_port: Option<u16>,
    client: Option<String>,
    req: ReqState,
    resp: RespState,
    /// Requests in arrival order; the front one is being answered.
    queue: VecDeque<Exchange>,
    /// Ignore bytes until a plausible request line starts an inbound event.
    broken: bool,
    /// HEAD requests in flight, by exchange seq (their responses have no body).
    heads: Vec<u64>,
}

impl Conn {
    fn new(pid: u32, role: Role, server_port: Option<u16>, client: Option<String>) -> Self {
        Conn {
            pid,
            role,
            server_port,
            client,
            req: ReqState::Head {
                buf: Vec::new(),
                start_ns: None,
            },
            resp: RespState::Head { buf: Vec::new() },
            queue: VecDeque::new(),
            broken: false,
            heads: Vec::new(),
        }
    }

    fn request_dir(&self) -> Dir {
        match self.role {
            Role::Server => Dir::In,
            Role::Client => Dir::Out,
        }
    }
}

#[derive(Default)]
pub struct Decoder {
    conns: HashMap<(u32, i32), Conn>,
    next_seq: u64,
    pub stats: DecodeStats,
}

fn header<'a>(headers: &'a [httparse::Header<'_>], name: &str) -> Option<&'a [u8]> {
    headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case(name))
        .map(|h| h.value)
}

fn header_str(headers: &[httparse::Header<'_>], name: &str) -> Option<String> {
    header(headers, name).map(|v| String::from_utf8_lossy(v).trim().to_string())
}

fn framing_of(headers: &[httparse::Header<'_>]) -> Result<Option<Framing>, ()> {
    if let Some(te) = header(headers, "transfer-encoding") {
        if String::from_utf8_lossy(te)
            .to_ascii_lowercase()
            .contains("chunked")
        {
            return Ok(Some(Framing::Chunked(Chunked::default())));
        }
    }
    match header(headers, "content-length") {
        Some(v) => std::str::from_utf8(v)
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .map(|n| Some(Framing::Length(n)))
            .ok_or(()),
        None => Ok(None),
    }
}

/// Does `data` start like an HTTP request line (`METHOD /…`)?
fn looks_like_request(data: &[u8]) -> bool {
    let n = data.iter().take(16).position(|&b| b == b' ');
    match n {
        Some(n) if n > 0 => {
            data[..n].iter().all(|b| b.is_ascii_uppercase())
                && matches!(data.get(n + 1), Some(b'/') | Some(b'*') | Some(b'h'))
        }
        _ => false,
    }
}

/// What appending to a head buffer found.
enum HeadFill {
    /// No blank line yet; this many bytes were taken.
    More(usize),
    /// A blank line may end the head now; this many bytes were taken.
    Ended(usize),
    /// The head grew past MAX_HEAD_BYTES: not HTTP we can follow.
    TooLarge,
}

/// Appends head bytes from `data` to `buf` (never more than one byte past
/// the limit, so a 1 MiB header line costs 64 KiB).
fn push_head(buf: &mut Vec<u8>, data: &[u8]) -> HeadFill {
    let from = buf.len();
    let take = data
        .len()
        .min(MAX_HEAD_BYTES + 1 - from.min(MAX_HEAD_BYTES));
    buf.extend_from_slice(&data[..take]);
    if has_head_end(buf, from) {
        HeadFill::Ended(take)
    } else if buf.len() > MAX_HEAD_BYTES {
        HeadFill::TooLarge
    } else {
        HeadFill::More(take)
    }
}

/// Is there a complete head (blank line) in `buf`, looking only at bytes
/// from `from` on (minus 3 for a terminator split across appends)?
fn has_head_end(buf: &[u8], from: usize) -> bool {
    let start = from.saturating_sub(3);
    memchr::memmem::find(&buf[start..], b"\n\r\n").is_some()
        || memchr::memmem::find(&buf[start..], b"\n\n").is_some()
}

impl Decoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Bytes held in parsing buffers across all connections (bounded by
    /// the MAX_* limits per connection; exposed for tests and health).
    pub fn buffered_bytes(&self) -> usize {
        self.conns
            .values()
            .map(|c| {
                let req = match &c.req {
                    ReqState::Head { buf, .. } => buf.capacity(),
                    ReqState::Body { buf, .. } => buf.capacity(),
                };
                let resp = match &c.resp {
                    RespState::Head { buf } => buf.capacity(),
                    RespState::Body {
                        body: Body::Plain { buf, .. },
                        ..
                    } => buf.capacity(),
                    RespState::Body {
                        body: Body::Sse(s), ..
                    } => s.buffered(),
                    RespState::Body {
                        body: Body::Ndjson(n),
                        ..
                    } => n.buffered(),
                };
                req + resp
            })
            .sum()
    }

    /// Requests in flight across all connections.
    pub fn in_flight(&self) -> usize {
        self.conns.values().map(|c| c.queue.len()).sum()
    }

    pub fn on_event(&mut self, ev: &SocketEvent, out: &mut Vec<Finished>) {
        self.stats.events += 1;
        match ev {
            SocketEvent::Open(o) => {
                let key = (o.pid, o.fd);
                // A reused fd: whatever was pending on the old connection
                // ended without a close event.
                if let Some(old) = self.conns.remove(&key) {
                    self.abandon(old, o.ts_ns, out);
                }
                let (server_port, client) = match o.role {
                    Role::Server => (o.local.map(|a| a.port()), o.peer.map(|a| a.to_string())),
                    Role::Client => (o.peer.map(|a| a.port()), o.local.map(|a| a.to_string())),
                };
                self.stats.connections += 1;
                self.conns
                    .insert(key, Conn::new(o.pid, o.role, server_port, client));
            }
            SocketEvent::Close(c) => {
                if let Some(conn) = self.conns.remove(&(c.pid, c.fd)) {
                    self.close(conn, c.ts_ns, out);
                }
            }
            SocketEvent::Data(d) => self.on_data(d, out),
        }
    }

    /// End of input (replay finished): requests still in flight end as
    /// `truncated_capture`.
    pub fn finish(&mut self, out: &mut Vec<Finished>) {
        let mut keys: Vec<_> = self.conns.keys().copied().collect();
        keys.sort_unstable();
        for k in keys {
            if let Some(mut conn) = self.conns.remove(&k) {
                let end = conn
                    .queue
                    .iter()
                    .filter_map(|x| x.last_response_byte_ns)
                    .max()
                    .unwrap_or(0);
                while let Some(x) = conn.queue.pop_front() {
                    let end = x.last_response_byte_ns.unwrap_or(end.max(x.t0_ns));
                    self.emit(x.finish(end, Some("truncated_capture")), out);
                }
            }
        }
    }

    fn emit(&mut self, r: Finished, out: &mut Vec<Finished>) {
        self.stats.records += 1;
        out.push(r);
    }

    /// The connection was closed by the traced process.
    fn close(&mut self, mut conn: Conn, ts: u64, out: &mut Vec<Finished>) {
        // A body delimited by the close is complete now.
        if let RespState::Body {
            framing: Framing::UntilClose,
            ..
        } = conn.resp
        {
            if !conn.queue.is_empty() {
                self.end_response(&mut conn, ts, out);
            }
        }
        // Anything still pending was cut off by the traced process itself
        // (a client going away shows up earlier, as EOF or a failed write).
        while let Some(x) = conn.queue.pop_front() {
            let end = x.last_response_byte_ns.unwrap_or(ts);
            self.emit(x.finish(end, Some("upstream_reset")), out);
        }
    }

    fn abandon(&mut self, mut conn: Conn, ts: u64, out: &mut Vec<Finished>) {
        while let Some(x) = conn.queue.pop_front() {
            let end = x.last_response_byte_ns.unwrap_or(ts);
            self.emit(x.finish(end, Some("truncated_capture")), out);
        }
    }

    fn on_data(&mut self, d: &DataEvent, out: &mut Vec<Finished>) {
        // The map is moved out for the call (a pointer swap) so the
        // connection can be borrowed next to the rest of `self`.
        let mut conns = std::mem::take(&mut self.conns);
        // Data before (or without) an open event: assume the common case,
        // a server connection, with unknown addresses.
        let conn = conns
            .entry((d.pid, d.fd))
            .or_insert_with(|| Conn::new(d.pid, Role::Server, None, None));
        self.on_data_conn(conn, d, out);
        self.conns = conns;
    }

    fn on_data_conn(&mut self, conn: &mut Conn, d: &DataEvent, out: &mut Vec<Finished>) {
        let is_request = d.dir == conn.request_dir();
        if d.ret < 0 || (d.ret == 0 && d.dir == Dir::In) {
            // A failed write or read, or end of file on a read: the peer is
            // gone (server role) or the upstream is (client role).
            let gone = if conn.role == Role::Server {
                "client_disconnect"
            } else {
                "upstream_reset"
            };
            if !is_request && d.ret == 0 {
                // Client role: a response delimited by the close is done.
                if let RespState::Body {
                    framing: Framing::UntilClose,
                    ..
                } = conn.resp
                {
                    self.end_response(conn, d.ts_ns, out);
                }
            }
            while let Some(x) = conn.queue.pop_front() {
                let end = x.last_response_byte_ns.unwrap_or(d.ts_ns);
                // A client that hangs up after the stream's end marker but
                // before the HTTP framing's end (uvicorn writes the last
                // chunk after `[DONE]`; the openai SDK closes on `[DONE]`)
                // got its whole answer.
                let err = (!x.stream_ended()).then_some(gone);
                self.emit(x.finish(end, err), out);
            }
            self.reset(conn);
            conn.broken = true;
            return;
        }
        if d.truncated() {
            self.stats.truncated_calls += 1;
        }
        if conn.broken {
            if is_request && looks_like_request(&d.data) {
                conn.broken = false;
                self.reset(conn);
            } else {
                return;
            }
        }
        let missing = (d.ret as u64).saturating_sub(d.data.len() as u64);
        let ok = if is_request {
            self.request_bytes(conn, d.ts_ns, &d.data, out) && self.request_gap(conn, missing)
        } else {
            self.response_bytes(conn, d.ts_ns, &d.data, out) && self.response_gap(conn, missing)
        };
        if !ok {
            self.desync(
                conn,
                d.ts_ns,
                if missing > 0 {
                    "truncated_capture"
                } else {
                    "decode_error"
                },
                out,
            );
        }
    }

    fn reset(&mut self, conn: &mut Conn) {
        conn.req = ReqState::Head {
            buf: Vec::new(),
            start_ns: None,
        };
        conn.resp = RespState::Head { buf: Vec::new() };
        conn.heads.clear();
    }

    fn desync(&mut self, conn: &mut Conn, ts: u64, why: &str, out: &mut Vec<Finished>) {
        self.stats.desyncs += 1;
        while let Some(x) = conn.queue.pop_front() {
            let end = x.last_response_byte_ns.unwrap_or(ts);
            self.emit(x.finish(end, Some(why)), out);
        }
        self.reset(conn);
        conn.broken = true;
    }

    /// Bytes of the request direction. False: not HTTP any more.
    fn request_bytes(
        &mut self,
        conn: &mut Conn,
        ts: u64,
        mut data: &[u8],
        out: &mut Vec<Finished>,
    ) -> bool {
        while !data.is_empty() {
            match &mut conn.req {
                ReqState::Head { buf, start_ns } => {
                    if buf.is_empty() {
                        // Tolerate blank lines between requests (RFC 9112 §2.2).
                        let skip = data
                            .iter()
                            .take_while(|b| **b == b'\r' || **b == b'\n')
                            .count();
                        data = &data[skip..];
                        if data.is_empty() {
                            return true;
                        }
                    }
                    start_ns.get_or_insert(ts);
                    let from = buf.len();
                    let take = match push_head(buf, data) {
                        HeadFill::More(n) => {
                            data = &data[n..];
                            continue;
                        }
                        HeadFill::Ended(n) => n,
                        HeadFill::TooLarge => return false,
                    };
                    let mut hdrs = [httparse::EMPTY_HEADER; MAX_HEADERS];
                    let mut req = httparse::Request::new(&mut hdrs);
                    let n = match req.parse(buf) {
                        Ok(httparse::Status::Complete(n)) => n,
                        Ok(httparse::Status::Partial) => {
                            data = &data[take..];
                            continue;
                        }
                        Err(_) => return false,
                    };
                    let method = req.method.unwrap_or("").to_string();
                    let path = req.path.unwrap_or("").to_string();
                    let framing = match framing_of(req.headers) {
                        Ok(f) => f.unwrap_or(Framing::None),
                        Err(()) => return false,
                    };
                    // Bytes of this event after the head.
                    let used_from_data = n - from;
                    let t0 = start_ns.unwrap_or(ts);
                    if conn.queue.len() >= MAX_PIPELINE {
                        return false;
                    }
                    self.next_seq += 1;
                    let seq = self.next_seq;
                    let x = Exchange::new(
                        seq,
                        conn.pid,
                        conn.server_port,
                        conn.client.clone(),
                        &method,
                        &path,
                        t0,
                    );
                    if method == "HEAD" {
                        conn.heads.push(seq);
                    }
                    conn.queue.push_back(x);
                    data = &data[used_from_data.min(data.len())..];
                    conn.req = ReqState::Body {
                        seq,
                        complete: matches!(framing, Framing::None | Framing::Length(0)),
                        framing,
                        buf: Vec::new(),
                    };
                    if let ReqState::Body { complete: true, .. } = conn.req {
                        self.request_done(conn);
                    }
                }
                ReqState::Body { framing, buf, .. } => {
                    let keep = |b: &[u8], buf: &mut Vec<u8>| {
                        let room = MAX_REQUEST_BODY.saturating_sub(buf.len());
                        buf.extend_from_slice(&b[..b.len().min(room)]);
                    };
                    let (used, done) = match framing {
                        Framing::Length(left) => {
                            let n = (*left).min(data.len() as u64) as usize;
                            keep(&data[..n], buf);
                            *left -= n as u64;
                            (n, *left == 0)
                        }
                        Framing::Chunked(c) => {
                            let mut sink = |b: &[u8]| keep(b, buf);
                            match c.feed(data, &mut sink) {
                                Ok(n) => (n, c.is_done()),
                                Err(_) => return false,
                            }
                        }
                        Framing::None | Framing::UntilClose => (0, true),
                    };
                    data = &data[used..];
                    if done {
                        self.request_done(conn);
                    }
                }
            }
        }
        let _ = out;
        true
    }

    /// Capture dropped `missing` request bytes at the end of the last call.
    fn request_gap(&mut self, conn: &mut Conn, missing: u64) -> bool {
        if missing == 0 {
            return true;
        }
        match &mut conn.req {
            ReqState::Body {
                framing: Framing::Length(left),
                complete,
                ..
            } if missing <= *left => {
                *left -= missing;
                *complete = false; // the body JSON is incomplete
                if *left == 0 {
                    self.request_done(conn);
                }
                true
            }
            ReqState::Body {
                framing: Framing::Chunked(c),
                complete,
                ..
            } => {
                *complete = false;
                c.skip(missing)
            }
            _ => false,
        }
    }

    /// The request body is complete: read what it says, expect the next head.
    fn request_done(&mut self, conn: &mut Conn) {
        let state = std::mem::replace(
            &mut conn.req,
            ReqState::Head {
                buf: Vec::new(),
                start_ns: None,
            },
        );
        if let ReqState::Body { seq, buf, .. } = state {
            if let Some(x) = conn.queue.iter_mut().find(|x| x.seq == seq) {
                if !buf.is_empty() {
                    x.request = request_info(&buf);
                }
            }
        }
    }

    /// Bytes of the response direction. False: not HTTP any more.
    fn response_bytes(
        &mut self,
        conn: &mut Conn,
        ts: u64,
        mut data: &[u8],
        out: &mut Vec<Finished>,
    ) -> bool {
        if let Some(x) = conn.queue.front_mut() {
            x.last_response_byte_ns = Some(ts);
        }
        while !data.is_empty() {
            match &mut conn.resp {
                RespState::Head { buf } => {
                    if buf.is_empty() {
                        let skip = data
                            .iter()
                            .take_while(|b| **b == b'\r' || **b == b'\n')
                            .count();
                        data = &data[skip..];
                        if data.is_empty() {
                            return true;
                        }
                    }
                    let from = buf.len();
                    let take = match push_head(buf, data) {
                        HeadFill::More(n) => {
                            data = &data[n..];
                            continue;
                        }
                        HeadFill::Ended(n) => n,
                        HeadFill::TooLarge => return false,
                    };
                    let mut hdrs = [httparse::EMPTY_HEADER; MAX_HEADERS];
                    let mut resp = httparse::Response::new(&mut hdrs);
                    let n = match resp.parse(buf) {
                        Ok(httparse::Status::Complete(n)) => n,
                        Ok(httparse::Status::Partial) => {
                            data = &data[take..];
                            continue;
                        }
                        Err(_) => return false,
                    };
                    let status = resp.code.unwrap_or(0);
                    let used_from_data = n - from;
                    data = &data[used_from_data.min(data.len())..];
                    if (100..200).contains(&status) {
                        if status == 101 {
                            return false; // protocol switch: not HTTP any more
                        }
                        conn.resp = RespState::Head { buf: Vec::new() };
                        continue;
                    }
                    let ctype = header_str(resp.headers, "content-type")
                        .unwrap_or_default()
                        .to_ascii_lowercase();
                    let server = header_str(resp.headers, "server");
                    let framing = match framing_of(resp.headers) {
                        Ok(f) => f,
                        Err(()) => return false,
                    };
                    let Some(x) = conn.queue.front_mut() else {
                        self.stats.orphan_responses += 1;
                        return false;
                    };
                    let head_request = conn.heads.first() == Some(&x.seq);
                    x.status = Some(status);
                    x.last_response_byte_ns = Some(ts);
                    if x.provider.is_none() {
                        x.provider = server.as_deref().and_then(provider_from_server_header);
                    }
                    let ndjson = ctype.starts_with("application/x-ndjson")
                        || ctype.starts_with("application/jsonl")
                        || ctype.starts_with("application/json-seq");
                    let body = if ctype.starts_with("text/event-stream") {
                        x.stream = true;
                        Body::Sse(Sse::default())
                    } else if ndjson {
                        x.stream = true;
                        Body::Ndjson(Ndjson::default())
                    } else {
                        Body::Plain {
                            buf: Vec::new(),
                            complete: true,
                        }
                    };
                    let no_body = head_request || status == 204 || status == 304;
                    let framing = if no_body {
                        Framing::None
                    } else {
                        framing.unwrap_or(Framing::UntilClose)
                    };
                    let empty = matches!(framing, Framing::None | Framing::Length(0));
                    conn.resp = RespState::Body {
                        framing,
                        body,
                        head_request,
                    };
                    if empty {
                        self.end_response(conn, ts, out);
                    }
                }
                RespState::Body { framing, body, .. } => {
                    let Some(x) = conn.queue.front_mut() else {
                        return false;
                    };
                    let format = x.format;
                    let mut sink = |b: &[u8]| feed_body(body, format, x, ts, b);
                    let (used, done) = match framing {
                        Framing::Length(left) => {
                            let n = (*left).min(data.len() as u64) as usize;
                            sink(&data[..n]);
                            *left -= n as u64;
                            (n, *left == 0)
                        }
                        Framing::Chunked(c) => match c.feed(data, &mut sink) {
                            Ok(n) => (n, c.is_done()),
                            Err(_) => return false,
                        },
                        Framing::UntilClose => {
                            sink(data);
                            (data.len(), false)
                        }
                        Framing::None => (0, true),
                    };
                    data = &data[used..];
                    if done {
                        self.end_response(conn, ts, out);
                    }
                }
            }
        }
        true
    }

    fn response_gap(&mut self, conn: &mut Conn, missing: u64) -> bool {
        if missing == 0 {
            return true;
        }
        match &mut conn.resp {
            RespState::Body {
                framing: Framing::Length(left),
                body: Body::Plain { complete, .. },
                ..
            } if missing <= *left => {
                *left -= missing;
                *complete = false;
                true
            }
            _ => false,
        }
    }

    /// The front exchange's response is complete at `ts`.
    fn end_response(&mut self, conn: &mut Conn, ts: u64, out: &mut Vec<Finished>) {
        let state = std::mem::replace(&mut conn.resp, RespState::Head { buf: Vec::new() });
        let Some(mut x) = conn.queue.pop_front() else {
            return;
        };
        if let RespState::Body {
            body, head_request, ..
        } = state
        {
            if head_request {
                conn.heads.retain(|s| *s != x.seq);
            }
            match body {
                Body::Plain { buf, complete } => {
                    if complete && !buf.is_empty() {
                        if let Some(info) = interpret(x.format, &buf) {
                            x.on_body(info);
                        }
                    }
                    if buf.len() >= MAX_RESPONSE_BODY {
                        self.stats.oversized += 1;
                    }
                }
                Body::Ndjson(mut nd) => {
                    let format = x.format;
                    nd.finish(&mut |line| feed_event(format, &mut x, ts, line));
                    self.stats.oversized += nd.oversized;
                }
                Body::Sse(sse) => self.stats.oversized += sse.oversized,
            }
        }
        let end = x.last_response_byte_ns.unwrap_or(ts);
        self.emit(x.finish(end, None), out);
    }
}

/// One piece of response body, written at `ts`.
fn feed_body(body: &mut Body, format: Format, x: &mut Exchange, ts: u64, bytes: &[u8]) {
    match body {
        Body::Sse(sse) => sse.feed(bytes, &mut |ev| {
            if ev.data == b"[DONE]" {
                x.on_stream_end();
                return;
            }
            feed_event(format, x, ts, ev.data);
        }),
        Body::Ndjson(nd) => nd.feed(bytes, &mut |line| feed_event(format, x, ts, line)),
        Body::Plain { buf, .. } => {
            let room = MAX_RESPONSE_BODY.saturating_sub(buf.len());
            buf.extend_from_slice(&bytes[..bytes.len().min(room)]);
        }
    }
}

/// One stream event (SSE data or NDJSON line).
fn feed_event(format: Format, x: &mut Exchange, ts: u64, data: &[u8]) {
    match interpret(format, data) {
        Some(info) => x.on_stream_event(ts, info),
        None if format == Format::Unknown => {
            // Not JSON, unknown API: still a chunk with a time.
            x.on_stream_event(
                ts,
                engines::EventInfo {
                    content: engines::Content::Answer,
                    content_parts: 1,
                    ..Default::default()
                },
            )
        }
        None => {}
    }
}
