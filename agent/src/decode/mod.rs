//! Socket events → finished requests. This module is the per-connection
//! dispatcher: it sniffs each connection's protocol from its first bytes
//! and hands every later call to that protocol's machine (`http1`, or
//! `http2` — its client preface, a server's first SETTINGS frame, frames
//! on a connection joined mid-way, or a `101` to h2c — whose gRPC streams
//! go to `grpc`). Response bodies are decoded as SSE, NDJSON or a whole
//! JSON body (`body`, `stream`), and each event is interpreted by the
//! engine format of its endpoint (`formats`).
//!
//! A served TLS connection (its first bytes are TLS records: tokentap sees
//! only ciphertext) or one switched away by `101 Switching Protocols` to
//! anything but h2c is counted once in `DecodeStats::unsupported_protocol`
//! (TLS also in `tls`, and its engine listed once in
//! [`Decoder::take_tls_servers`]) and then ignored; an outgoing TLS
//! connection counts only in `tls`. Following a new protocol is adding its
//! machine as a module and an arm of `Proto`.
//!
//! A request's t0 is when its first byte reached the engine's socket when
//! the kernel reported the arrival (`arrival`: queue time in the socket
//! counts), else when the engine read it.
//!
//! Owns: the connection table and the counters. Must not: read a clock
//! (every time comes from events), hold unbounded memory, or panic on any
//! input (hostile bytes end in a record with `error_type`, or nothing).

pub mod arrival;
pub mod body;
pub mod exchange;
pub mod formats;
pub mod gateway;
pub mod grpc;
pub mod http1;
pub mod http2;
pub mod reqscan;
pub mod stream;

use std::{collections::HashMap, sync::Arc};

use serde::Serialize;

use self::http1::Http1Conn;
use self::http2::Http2Conn;
use crate::identity::{caller::CallerConfig, request_type::Rules};
use crate::selftraffic::Marker;
use crate::{
    event::{DataEvent, Dir, Role, SocketEvent},
    record::Finished,
};

/// A request or response head larger than this is garbage.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Non-streamed response body bytes kept for JSON parsing.
pub const MAX_RESPONSE_BODY: usize = 4 << 20;
/// The decoder's memory budget by default (`--max-decode-memory`): what
/// every connection's parsing state may hold together.
pub const DEFAULT_MAX_MEMORY: usize = 64 << 20;
/// Shedding stops once what is held is back under this share of the
/// budget (eighths), so that it does not run on every call at the edge.
const SHED_TO_EIGHTHS: usize = 7;

/// Requests waiting for their response on one connection (pipelining).
pub const MAX_PIPELINE: usize = 64;

/// The HTTP/2 client connection preface (RFC 9113 §3.4).
pub const HTTP2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

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
    /// Connections speaking a protocol this decoder does not follow (a
    /// `101 Switching Protocols` to anything but h2c).
    pub unsupported_protocol: u64,
    /// Connections whose bytes are TLS records: encrypted, so not decoded.
    /// Served ones (the engine terminating TLS) also count in
    /// `unsupported_protocol`; outgoing ones (an engine's own HTTPS calls)
    /// only here.
    pub tls: u64,
    /// Served TLS connections that ended without plaintext from the TLS
    /// source (also in `unsupported_protocol`).
    pub tls_undecoded: u64,
    /// Arrival segments taken for retransmissions of bytes the socket
    /// already held (not counted in the arrival ledger).
    pub arrival_retransmissions: u64,
    /// Arrival segments of another socket than the ledger's under the same
    /// addresses (a reused client port, a namesake in another network
    /// namespace): kept apart, never dating this connection's bytes.
    pub arrival_foreign: u64,
    /// Requests whose `traceparent` header was malformed or all-zero
    /// (ignored: they start a trace of their own).
    pub invalid_traceparent: u64,
    /// Connections first seen by their data, without an accept or connect
    /// event: open before the agent started (or their open event lost).
    /// Their bytes are skipped until a request starts; whatever was in
    /// flight on them is not a decode error.
    pub joined: u64,
    /// Connections decoded as HTTP/2 (prior knowledge, or recognised by
    /// their frames when joined mid-way).
    pub http2: u64,
    /// HTTP/2 header fields that referred to a header-table entry the
    /// decoder never saw (a connection joined mid-way).
    pub unresolved_headers: u64,
    /// HTTP/2 connections dropped from decoding, by reason (also counted
    /// in `desyncs`).
    pub http2_dropped: std::collections::BTreeMap<&'static str, u64>,
    /// What the memory budget took back, by reason: `response_body` (a
    /// non-streamed body no longer read: tokens unknown), `stream_event`
    /// (the stream event being assembled), `partial_head` (an idle
    /// connection's unfinished head or header block: the connection is
    /// decoded again from its next request, as one joined mid-way),
    /// `in_flight` (a connection with requests in flight, ended as
    /// `truncated_capture`).
    pub shed: std::collections::BTreeMap<crate::vocab::ShedReason, u64>,
    /// Bytes the decoder's connections held at the last call, and the
    /// most they held (accounted per call, against the budget).
    pub held_bytes: u64,
    pub held_bytes_peak: u64,
    /// What gRPC decoding counted.
    pub grpc: grpc::GrpcCounts,
    /// What the gateway join counted.
    pub gateway: gateway::GatewayCounts,
}

impl DecodeStats {
    /// The counters with a reason, as the health copy keeps them.
    pub fn protocol_counts(&self) -> ProtocolCounts {
        use crate::vocab::GrpcSkip;
        let g = &self.grpc;
        ProtocolCounts {
            http2_dropped: self.http2_dropped.iter().map(|(r, n)| (*r, *n)).collect(),
            shed: self.shed.iter().map(|(r, n)| (*r, *n)).collect(),
            grpc_skipped: [
                (GrpcSkip::UnsupportedCompression, g.unsupported_compression),
                (GrpcSkip::Oversized, g.oversized),
                (GrpcSkip::BadMessage, g.bad_messages),
                (GrpcSkip::Unrecognised, g.unrecognised),
                (GrpcSkip::OrphanResponse, g.orphan_responses),
            ]
            .into_iter()
            .filter(|(_, n)| *n > 0)
            .collect(),
        }
    }
}

/// The decoder's counters that have a reason label.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProtocolCounts {
    /// HTTP/2 connections no longer decoded, by `http2::Drop::reason`.
    pub http2_dropped: Vec<(&'static str, u64)>,
    /// What the memory budget took back.
    pub shed: Vec<(crate::vocab::ShedReason, u64)>,
    /// gRPC messages not read.
    pub grpc_skipped: Vec<(crate::vocab::GrpcSkip, u64)>,
}

/// What the decoder keeps of each request besides its timing and sizes:
/// the tenant headers' value, the API key's id, and what request-type
/// rules look at (the values of headers they name, the presence of body
/// keys they name). Nothing else of a head or body is kept.
#[derive(Clone, Debug, Default)]
pub struct IdentityConfig {
    pub caller: CallerConfig,
    pub types: Arc<Rules>,
    /// Lowercase names of headers the rules match on.
    pub rule_headers: Vec<String>,
    /// Top-level body keys the rules ask about.
    pub rule_fields: Vec<String>,
    /// Processes whose requests' text is kept for their tokenizer
    /// (`Decoder::set_text_pids`; empty: none).
    pub text_pids: std::collections::HashSet<u32>,
}

impl IdentityConfig {
    pub fn new(caller: CallerConfig, types: Rules) -> Self {
        Self {
            caller,
            rule_headers: types.header_names(),
            rule_fields: types.json_fields(),
            types: Arc::new(types),
            text_pids: Default::default(),
        }
    }
}

/// What a connection is, as its open event said.
pub struct ConnInfo {
    pub pid: u32,
    pub role: Role,
    pub server_port: Option<u16>,
    pub client: Option<String>,
}

impl ConnInfo {
    /// The direction requests travel: `in` on servers, `out` on clients.
    pub fn request_dir(&self) -> Dir {
        match self.role {
            Role::Server => Dir::In,
            Role::Client => Dir::Out,
        }
    }
}

/// One call's bytes as a protocol machine sees them.
#[derive(Clone, Copy)]
pub struct Piece<'a> {
    pub ts_ns: u64,
    pub dir: Dir,
    /// The call's return value (bytes moved, 0 or a negative errno);
    /// `data` is shorter when the capture truncated the call.
    pub ret: i64,
    pub data: &'a [u8],
    /// When this call's request bytes reached the socket (server
    /// connections whose arrivals the kernel reported).
    pub arrival: Option<arrival::At<'a>>,
}

impl<'a> Piece<'a> {
    fn of(d: &'a DataEvent) -> Self {
        Piece {
            ts_ns: d.ts_ns,
            dir: d.dir,
            ret: d.ret,
            data: &d.data,
            arrival: None,
        }
    }
}

/// What a protocol machine says after a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    Continue,
    /// The connection switched to a protocol no machine here follows.
    Unsupported,
    /// The connection's bytes are TLS records (unsupported: ciphertext).
    Tls,
    /// `101 Switching Protocols` to `h2c`: the HTTP/1 machine holds the
    /// upgraded request and the bytes after the 101 (`Http1Conn::take_h2c`).
    H2cUpgrade,
}

/// Where machines put what they finish: the counters, the exchange
/// numbering and the records.
pub struct Out<'a> {
    pub stats: &'a mut DecodeStats,
    next_seq: &'a mut u64,
    records: &'a mut Vec<Finished>,
    self_marker: Option<&'a Marker>,
    pub identity: &'a IdentityConfig,
    tls_servers: &'a mut TlsServers,
}

/// Engines (pid, port) seen speaking TLS, each reported once.
#[derive(Default)]
struct TlsServers {
    seen: std::collections::HashSet<(u32, Option<u16>)>,
    new: Vec<(u32, Option<u16>)>,
}

/// How many TLS engines are remembered (and so named); more are counted.
const TLS_SERVERS_KEPT: usize = 256;

impl Out<'_> {
    /// A connection of `pid` (on `port`, when known) turned out to be TLS.
    fn tls_server(&mut self, pid: u32, port: Option<u16>) {
        let t = &mut *self.tls_servers;
        if t.seen.len() < TLS_SERVERS_KEPT && t.seen.insert((pid, port)) {
            t.new.push((pid, port));
        }
    }

    pub fn emit(&mut self, r: Finished) {
        self.stats.records += 1;
        self.records.push(r);
    }

    /// Whether a request's own-traffic header value is this run's token.
    pub fn is_self(&self, header: Option<&[u8]>) -> bool {
        matches!((self.self_marker, header), (Some(m), Some(v)) if m.matches(v))
    }

    /// Gives a new exchange what its request's headers say about who
    /// sent it, and the request-type rules.
    pub fn identify(&mut self, x: &mut exchange::Exchange, id: http1::head::HeadIdentity) {
        x.self_request = self.is_self(id.self_marker.as_deref());
        if self.identity.text_pids.contains(&x.pid)
            && !x.self_request
            && x.format.operation().is_some()
        {
            x.text = Some(Box::default());
        }
        match id.trace {
            Some(crate::identity::trace::TraceHeader::Valid(tp)) => x.trace = Some(tp),
            Some(crate::identity::trace::TraceHeader::Invalid) => {
                self.stats.invalid_traceparent += 1;
            }
            None => {}
        }
        x.tenant_header = id.tenant;
        x.api_key_id = id.api_key_id;
        x.rule_headers = id.rule_headers;
        if x.request_id.is_none() {
            x.request_id = id.request_id;
        }
        if !self.identity.types.is_empty() {
            x.types = Some(self.identity.types.clone());
        }
    }

    /// A new exchange's number (unique in this decoder).
    pub fn next_seq(&mut self) -> u64 {
        *self.next_seq += 1;
        *self.next_seq
    }
}

/// The first request-direction bytes of a connection, held until they
/// show whether it starts with the HTTP/2 preface (a 1-byte first read `P`
/// could be `PRI` or `POST`); and a server's first bytes while they may
/// still become its opening SETTINGS frame (a write cut short).
struct Sniff {
    held: [u8; HTTP2_PREFACE.len()],
    len: usize,
    /// When the first held byte was written.
    first_ns: u64,
    /// The server's first bytes (at most a SETTINGS frame), when they
    /// were written.
    resp: Vec<u8>,
    resp_ns: u64,
}

/// The longest opening SETTINGS frame `is_http2_settings` accepts.
const MAX_SETTINGS_FRAME: usize = 9 + 6 * 16;

/// Could `b` still grow into what `is_http2_settings` accepts (a SETTINGS
/// header on stream 0 without flags, of a length it allows, not yet whole)?
fn settings_prefix(b: &[u8]) -> bool {
    let fixed = [(3usize, 4u8), (4, 0), (5, 0), (6, 0), (7, 0), (8, 0)];
    if b.len() >= MAX_SETTINGS_FRAME || fixed.iter().any(|(i, v)| b.get(*i).is_some_and(|x| x != v))
    {
        return false;
    }
    match b.get(..3) {
        Some(l) => {
            let len = u32::from_be_bytes([0, l[0], l[1], l[2]]) as usize;
            len.is_multiple_of(6) && len <= 6 * 16 && b.len() < 9 + len
        }
        None => true,
    }
}

/// What the first bytes said.
enum Sniffed {
    /// Still a proper prefix of the HTTP/2 preface: wait for more.
    Wait,
    Http1,
    Http2,
    Tls,
}

impl Sniff {
    fn new() -> Self {
        Sniff {
            held: [0; HTTP2_PREFACE.len()],
            len: 0,
            first_ns: 0,
            resp: Vec::new(),
            resp_ns: 0,
        }
    }

    fn look(&mut self, request_dir: Dir, d: &DataEvent) -> Sniffed {
        // A ClientHello, or (a connection joined mid-way) records either
        // side wrote or read whole.
        if self.len == 0 && d.ret > 0 && looks_like_tls(&d.data) {
            return Sniffed::Tls;
        }
        if d.dir != request_dir {
            // The server speaks first: HTTP/2 servers open with SETTINGS.
            let mut all = self.resp.clone();
            all.extend_from_slice(&d.data);
            if is_http2_settings(&all) {
                return Sniffed::Http2;
            }
            if d.ret > 0 && !d.truncated() && self.len == 0 && settings_prefix(&all) {
                if self.resp.is_empty() {
                    self.resp_ns = d.ts_ns;
                }
                self.resp = all;
                return Sniffed::Wait;
            }
            return Sniffed::Http1;
        }
        if d.ret <= 0 || d.truncated() {
            return Sniffed::Http1;
        }
        let n = d.data.len().min(HTTP2_PREFACE.len() - self.len);
        if d.data[..n] != HTTP2_PREFACE[self.len..self.len + n] {
            return Sniffed::Http1;
        }
        if self.len + n == HTTP2_PREFACE.len() {
            return Sniffed::Http2;
        }
        if self.len == 0 {
            self.first_ns = d.ts_ns;
        }
        self.held[self.len..self.len + n].copy_from_slice(&d.data[..n]);
        self.len += n;
        Sniffed::Wait
    }
}

/// The connection table key of a socket's TLS plaintext (fds are below
/// 2^30).
fn tls_key(pid: u32, fd: i32) -> (u32, i32) {
    (pid, fd | 1 << 30)
}

/// A keyed hash (SipHash with this process's random key) of a request
/// body: byte-identical bodies (a client's retries) get the same value
/// within one run; the body cannot be recovered from it and the value means
/// nothing outside the process, so it is never exported.
pub fn body_fingerprint(body: &[u8]) -> u64 {
    let mut h = reqscan::BodyHash::new();
    h.update(body);
    h.finish(body.len() as u64)
}

/// Does `data` start with TLS records: at least one whole record header,
/// and every header it holds whole that of a TLS 1.0–1.3 (or SSL 3)
/// record — content type 20–24, version 3.0–3.4, a length from 1 to
/// 2^14 + 2048 — laid end to end? The last record may run past the data (a
/// read of part of what waits). HTTP/1 never starts with these bytes (they
/// are control characters), so a connection whose first call does is TLS.
pub fn looks_like_tls(data: &[u8]) -> bool {
    let mut at = 0usize;
    let mut headers = 0;
    while let Some(&[kind, major, minor, l0, l1]) = data.get(at..at + 5) {
        let len = usize::from(u16::from_be_bytes([l0, l1]));
        if !(0x14..=0x18).contains(&kind) || major != 3 || minor > 4 || len == 0 || len > 18432 {
            return false;
        }
        headers += 1;
        at += 5 + len;
    }
    headers > 0
}

/// Does `data` start with an HTTP/2 SETTINGS frame on stream 0, not an
/// ACK, whole (what an HTTP/2 server writes first, RFC 9113 §3.4)?
fn is_http2_settings(data: &[u8]) -> bool {
    let [l0, l1, l2, kind, flags, s0, s1, s2, s3, ..] = *data else {
        return false;
    };
    let len = u32::from_be_bytes([0, l0, l1, l2]) as usize;
    kind == 0x4
        && flags == 0
        && [s0 & 0x7f, s1, s2, s3] == [0; 4]
        && len.is_multiple_of(6)
        && len <= 6 * 16
        && data.len() >= 9 + len
}

/// The protocol a connection speaks, and its machine. Nearly every
/// connection ends up `Http1`, so its size is not wasted; boxing it would
/// only add an allocation per connection and an indirection per call.
#[allow(clippy::large_enum_variant)]
enum Proto {
    Sniffing(Sniff),
    Http1(Http1Conn),
    Http2(Box<Http2Conn>),
    /// Counted once, then ignored.
    Unsupported,
}

impl Proto {
    /// A decoding machine's call.
    fn on_data(&mut self, conn: &ConnInfo, out: &mut Out<'_>, p: Piece<'_>) -> Flow {
        match self {
            Proto::Http1(h) => h.on_data(conn, out, p),
            Proto::Http2(h) => h.on_data(conn, out, p),
            Proto::Sniffing(_) | Proto::Unsupported => Flow::Continue,
        }
    }

    /// The connection ended: `close` by the traced process, `abandon` (fd
    /// reused), or the input's end (`finish`).
    fn end(self, how: End, out: &mut Out<'_>) {
        match (self, how) {
            (Proto::Http1(h), End::Close(ts)) => h.close(ts, out),
            (Proto::Http1(h), End::Abandon(ts)) => h.abandon(ts, out),
            (Proto::Http1(h), End::Finish) => h.finish(out),
            (Proto::Http2(h), End::Close(ts)) => h.close(ts, out),
            (Proto::Http2(h), End::Abandon(ts)) => h.abandon(ts, out),
            (Proto::Http2(h), End::Finish) => h.finish(out),
            _ => {}
        }
    }
}

#[derive(Clone, Copy)]
enum End {
    Close(u64),
    Abandon(u64),
    Finish,
}

struct Conn {
    info: ConnInfo,
    proto: Proto,
    /// When its request bytes arrived (server connections with a known
    /// local port and peer, while the ledger covers every byte read).
    ledger: Option<arrival::Ledger>,
    /// (local port, peer) it was claimed under.
    addr: Option<(u16, std::net::SocketAddr)>,
    /// First seen by its data (no open event): it may be mid-request or
    /// mid-response, so decoding starts at the next request.
    joined: bool,
    /// Served TLS: counted as not decoded (`unsupported_protocol`, the
    /// engine named) when it ends without any plaintext from the TLS
    /// source (`plain`).
    tls_served: bool,
    plain: bool,
    /// TLS: when the ciphertext the socket read last arrived (the
    /// plaintext decrypted next came in it).
    cipher_arrival: Option<u64>,
    /// TLS plaintext whose writes are timed at the `SSL_write` call
    /// (memory BIOs), not at the socket write.
    writes_at_ssl_call: bool,
    /// Bytes this connection held when last accounted (the budget's share).
    held: usize,
    /// Its last call (shedding takes the longest idle first).
    last_ns: u64,
}

/// Records whose write times are `SSL_write` calls say so.
fn stamp_ssl_write(records: &mut [Finished]) {
    for f in records {
        if f.record.t1_source.is_some() {
            f.record.t1_source = Some(crate::vocab::T1Source::SslWrite);
        }
    }
}

impl Conn {
    /// The connection ended: a served TLS one that never showed plaintext
    /// was not measured.
    fn stamp_t1(&self, records: &mut [Finished]) {
        if self.writes_at_ssl_call {
            stamp_ssl_write(records);
        }
    }

    fn ended(&self, out: &mut Out<'_>) {
        if self.tls_served && !self.plain {
            out.stats.unsupported_protocol += 1;
            out.stats.tls_undecoded += 1;
            out.tls_server(self.info.pid, self.info.server_port);
        }
    }

    fn new(pid: u32, role: Role, server_port: Option<u16>, client: Option<String>) -> Self {
        Conn {
            info: ConnInfo {
                pid,
                role,
                server_port,
                client,
            },
            proto: Proto::Sniffing(Sniff::new()),
            ledger: None,
            addr: None,
            joined: false,
            tls_served: false,
            plain: false,
            cipher_arrival: None,
            writes_at_ssl_call: false,
            held: 0,
            last_ns: 0,
        }
    }

    /// Bytes it holds now: its own size, the protocol machine's buffers
    /// and the arrival ledger.
    fn cost(&self) -> usize {
        let proto = match &self.proto {
            Proto::Sniffing(s) => s.resp.capacity(),
            Proto::Http1(h) => h.buffered(),
            Proto::Http2(h) => std::mem::size_of::<Http2Conn>() + h.buffered(),
            Proto::Unsupported => 0,
        };
        std::mem::size_of::<Conn>()
            + self.info.client.as_ref().map_or(0, String::capacity)
            + proto
            + self.ledger.as_ref().map_or(0, arrival::Ledger::buffered)
    }
}

#[derive(Default)]
pub struct Decoder {
    conns: HashMap<(u32, i32), Conn>,
    next_seq: u64,
    pub stats: DecodeStats,
    /// Requests carrying this run's own-traffic token are marked
    /// ([`Finished::self_request`]).
    self_marker: Option<Marker>,
    identity: IdentityConfig,
    arrivals: arrival::Arrivals,
    tls_servers: TlsServers,
    gateway: gateway::Join,
    /// The memory budget (bytes; 0: the default).
    max_memory: usize,
    /// What every connection held when last accounted.
    held: usize,
}

impl Decoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// What all connections' parsing state may hold together
    /// (default [`DEFAULT_MAX_MEMORY`]); over it, the decoder sheds.
    pub fn with_max_memory(mut self, bytes: usize) -> Self {
        self.max_memory = bytes;
        self
    }

    fn budget(&self) -> usize {
        if self.max_memory == 0 {
            DEFAULT_MAX_MEMORY
        } else {
            self.max_memory
        }
    }

    /// What is held has reached the budget: the capture should leave
    /// request bodies in the kernel until it has not.
    pub fn over_budget(&self) -> bool {
        self.held_total() >= self.budget() / 8 * SHED_TO_EIGHTHS
    }

    /// What the budget counts: every connection's state and the gateway
    /// join's waiting records.
    fn held_total(&self) -> usize {
        self.held + self.gateway.buffered()
    }

    /// Marks requests carrying `m` in the own-traffic header as the agent's.
    pub fn with_self_marker(mut self, m: Marker) -> Self {
        self.self_marker = Some(m);
        self
    }

    /// Tenant headers, API-key ids and request-type rules (default: no
    /// tenant header, no API-key ids, built-in request types only).
    pub fn with_identity(mut self, id: IdentityConfig) -> Self {
        self.identity = id;
        self
    }

    /// The processes whose requests' text is kept for their tokenizer
    /// (the pipeline's tokenizer stage sets them as targeting loads
    /// tokenizers); requests already in flight keep what they had.
    pub fn set_text_pids(&mut self, pids: std::collections::HashSet<u32>) {
        self.identity.text_pids = pids;
    }

    /// Bytes held in parsing buffers across all connections (bounded by
    /// the MAX_* limits per connection; exposed for tests and health).
    pub fn buffered_bytes(&self) -> usize {
        self.conns
            .values()
            .map(|c| match &c.proto {
                Proto::Sniffing(s) => s.len,
                Proto::Http1(h) => h.buffered(),
                Proto::Http2(h) => h.buffered(),
                Proto::Unsupported => 0,
            })
            .sum()
    }

    /// Engines (pid, port when known) whose connections were found to be
    /// TLS since the last call, each once per run.
    pub fn take_tls_servers(&mut self) -> Vec<(u32, Option<u16>)> {
        std::mem::take(&mut self.tls_servers.new)
    }

    /// Requests in flight across all connections.
    pub fn in_flight(&self) -> usize {
        self.conns
            .values()
            .map(|c| match &c.proto {
                Proto::Http1(h) => h.in_flight(),
                Proto::Http2(h) => h.in_flight(),
                Proto::Sniffing(_) | Proto::Unsupported => 0,
            })
            .sum()
    }

    /// Every request in flight now (for the GPU join's energy split).
    pub fn in_flight_requests(&self, out: &mut Vec<crate::record::InFlight>) {
        for c in self.conns.values() {
            match &c.proto {
                Proto::Http1(h) => h.each_in_flight(&mut |x| out.push(x)),
                Proto::Http2(h) => h.each_in_flight(&mut |x| out.push(x)),
                _ => {}
            }
        }
    }

    pub fn on_event(&mut self, ev: &SocketEvent, records: &mut Vec<Finished>) {
        let from = records.len();
        let touched = match ev {
            SocketEvent::Open(o) => Some(((o.pid, o.fd), o.ts_ns)),
            SocketEvent::Close(c) => Some(((c.pid, c.fd), c.ts_ns)),
            SocketEvent::Data(d) => Some(((d.pid, d.fd), d.ts_ns)),
            SocketEvent::Arrival(a) => self.arrivals.peek_route(a).map(|k| (k, a.ts_ns)),
        };
        let keys = touched.map(|(k, _)| [k, tls_key(k.0, k.1)]);
        let before: usize = keys.map_or(0, |ks| {
            ks.iter()
                .filter_map(|k| self.conns.get(k))
                .map(|c| c.held)
                .sum()
        });
        self.decode_event(ev, records);
        if let (Some(ks), Some((_, ts))) = (keys, touched) {
            let mut after = 0;
            for k in ks {
                if let Some(c) = self.conns.get_mut(&k) {
                    c.held = c.cost();
                    c.last_ns = ts;
                    after += c.held;
                }
            }
            self.held = (self.held + after).saturating_sub(before);
            self.stats.held_bytes_peak = self.stats.held_bytes_peak.max(self.held_total() as u64);
        }
        let (key, ts_ns) = match (ev, touched) {
            (SocketEvent::Arrival(_), _) | (_, None) => {
                self.shed_if_over(touched.map(|t| t.1), records);
                return;
            }
            (_, Some(t)) => t,
        };
        let counts = &mut self.stats.gateway;
        self.gateway.pass(key, ts_ns, records, from, counts);
        match ev {
            SocketEvent::Open(o) => self.gateway.open(key, o.role, o.local, o.peer, ts_ns),
            SocketEvent::Close(_) => self.gateway.close(key, ts_ns),
            _ => {}
        }
        self.gateway.expire(Some(ts_ns), records, counts);
        self.shed_if_over(Some(ts_ns), records);
    }

    fn shed_if_over(&mut self, ts: Option<u64>, records: &mut Vec<Finished>) {
        if let Some(ts) = ts {
            if self.held_total() > self.budget() {
                self.shed(ts, records);
            }
        }
        self.stats.held_bytes = self.held_total() as u64;
    }

    /// Releases engine records that waited for their gateway's record
    /// longer than the join holds them (a live run's tick; `now_ns`
    /// wall-clock UNIX-epoch nanoseconds, the events' clock).
    pub fn tick(&mut self, now_ns: u64, records: &mut Vec<Finished>) {
        self.gateway
            .expire(Some(now_ns), records, &mut self.stats.gateway);
    }

    /// Releases every record the gateway join holds, as it is (a live
    /// run's shutdown: the gateway's records will not come).
    pub fn release_held(&mut self, records: &mut Vec<Finished>) {
        self.gateway.expire(None, records, &mut self.stats.gateway);
    }

    /// Records the gateway join holds (waiting for their gateway's).
    pub fn held(&self) -> usize {
        self.gateway.held()
    }

    /// Processes seen forwarding requests to a served engine (gateways).
    pub fn gateways(&self) -> &std::collections::HashSet<u32> {
        self.gateway.gateways()
    }

    fn decode_event(&mut self, ev: &SocketEvent, records: &mut Vec<Finished>) {
        self.stats.events += 1;
        let Decoder {
            conns,
            next_seq,
            stats,
            self_marker,
            identity,
            arrivals,
            tls_servers,
            gateway: _,
            max_memory: _,
            held: _,
        } = self;
        let mut out = Out {
            stats,
            next_seq,
            records,
            self_marker: self_marker.as_ref(),
            identity,
            tls_servers,
        };
        match ev {
            SocketEvent::Open(o) => {
                let key = (o.pid, o.fd);
                // A reused fd: whatever was pending on the old connection
                // ended without a close event.
                for k in [key, tls_key(o.pid, o.fd)] {
                    if let Some(old) = conns.remove(&k) {
                        old.ended(&mut out);
                        old.proto.end(End::Abandon(o.ts_ns), &mut out);
                    }
                }
                let (server_port, client) = match o.role {
                    Role::Server => (o.local.map(|a| a.port()), o.peer.map(|a| a.to_string())),
                    Role::Client => (o.peer.map(|a| a.port()), o.local.map(|a| a.to_string())),
                };
                out.stats.connections += 1;
                let mut conn = Conn::new(o.pid, o.role, server_port, client);
                if o.joined {
                    out.stats.joined += 1;
                    conn.joined = true;
                }
                if let (Role::Server, Some(local), Some(peer)) = (o.role, o.local, o.peer) {
                    conn.ledger = Some(arrivals.claim(local.port(), peer, key));
                    conn.addr = Some((local.port(), peer));
                }
                conns.insert(key, conn);
            }
            SocketEvent::Close(c) => {
                if let Some(conn) = conns.remove(&tls_key(c.pid, c.fd)) {
                    let from = out.records.len();
                    let stamp = conn.writes_at_ssl_call;
                    conn.proto.end(End::Close(c.ts_ns), &mut out);
                    if stamp {
                        stamp_ssl_write(&mut out.records[from..]);
                    }
                }
                if let Some(conn) = conns.remove(&(c.pid, c.fd)) {
                    conn.ended(&mut out);
                    if let Some((port, peer)) = conn.addr {
                        arrivals.release(port, peer, (c.pid, c.fd));
                    }
                    conn.proto.end(End::Close(c.ts_ns), &mut out);
                }
            }
            SocketEvent::Arrival(a) => {
                if let arrival::Route::Conn(k) = arrivals.route(a) {
                    if let Some(conn) = conns.get_mut(&k) {
                        if let Some(l) = &mut conn.ledger {
                            let dups = l.duplicates;
                            if !arrivals.push(l, a) {
                                conn.ledger = None;
                            } else if l.duplicates > dups {
                                out.stats.arrival_retransmissions += 1;
                            }
                        }
                    }
                }
                out.stats.arrival_foreign = arrivals.foreign;
            }
            SocketEvent::Data(d) => {
                if d.truncated() {
                    out.stats.truncated_calls += 1;
                }
                // TLS plaintext (the TLS source's records) is decoded as a
                // connection of its own beside the ciphertext one, with the
                // socket's identity.
                if d.is_tls_plaintext() {
                    let mut arrived = None;
                    let info = conns.get_mut(&(d.pid, d.fd)).map(|c| {
                        c.plain = true;
                        arrived = c.cipher_arrival;
                        (
                            c.info.role,
                            c.info.server_port,
                            c.info.client.clone(),
                            c.joined,
                        )
                    });
                    let conn = conns.entry(tls_key(d.pid, d.fd)).or_insert_with(|| {
                        let (role, port, client, joined) =
                            info.unwrap_or((Role::Server, None, None, true));
                        Conn {
                            joined,
                            ..Conn::new(d.pid, role, port, client)
                        }
                    });
                    if d.syscall == Some(agent_ebpf::Syscall::SslWrite) {
                        conn.writes_at_ssl_call = true;
                    }
                    let from = out.records.len();
                    on_data(conn, d, arrived, &mut out);
                    conn.stamp_t1(&mut out.records[from..]);
                    return;
                }
                // Data before (or without) an open event: a connection
                // open before the agent. Assume the common case, a server
                // connection, with unknown addresses, joined mid-way.
                let conn = conns.entry((d.pid, d.fd)).or_insert_with(|| {
                    out.stats.joined += 1;
                    Conn {
                        joined: true,
                        ..Conn::new(d.pid, Role::Server, None, None)
                    }
                });
                on_data(conn, d, None, &mut out);
                // The socket of a TLS connection failed or reached its end
                // (EOF, a reset): so did its plaintext (OpenSSL reports
                // these as `SSL_ERROR_*`, not as bytes).
                let gone = d.ret < 0 || (d.ret == 0 && d.dir == Dir::In);
                if gone && conn.tls_served {
                    if let Some(plain) = conns.get_mut(&tls_key(d.pid, d.fd)) {
                        let g = DataEvent {
                            syscall: Some(match d.dir {
                                Dir::In => agent_ebpf::Syscall::SslRead,
                                Dir::Out => agent_ebpf::Syscall::SslWrite,
                            }),
                            data: Vec::new(),
                            ..d.clone()
                        };
                        let from = out.records.len();
                        on_data(plain, &g, None, &mut out);
                        plain.stamp_t1(&mut out.records[from..]);
                    }
                }
            }
        }
    }

    /// Over the budget at `ts`: takes back what is least useful first
    /// until what is held is under 7/8 of it — kept response bodies and
    /// stream events being assembled (largest holders first), then the
    /// gateway join's waiting records (they leave unjoined), then idle
    /// connections' unfinished heads and header blocks (longest idle
    /// first: the connection is decoded again from its next request, as
    /// one joined mid-way), then, longest idle first, connections with
    /// requests in flight (ended as `truncated_capture`). Each counted in
    /// `DecodeStats::shed`.
    fn shed(&mut self, ts: u64, records: &mut Vec<Finished>) {
        let target = self.budget() / 8 * SHED_TO_EIGHTHS;
        let mut by_size: Vec<((u32, i32), usize)> =
            self.conns.iter().map(|(k, c)| (*k, c.held)).collect();
        by_size.sort_unstable_by_key(|(k, held)| (std::cmp::Reverse(*held), *k));
        let mut idle: Vec<((u32, i32), u64)> =
            self.conns.iter().map(|(k, c)| (*k, c.last_ns)).collect();
        idle.sort_unstable_by_key(|(k, t)| (*t, *k));
        let join = self.gateway.buffered();
        let shed = &mut self.stats.shed;
        for (k, _) in &by_size {
            if self.held + join <= target {
                break;
            }
            let Some(c) = self.conns.get_mut(k) else {
                continue;
            };
            match &mut c.proto {
                Proto::Http1(h) => h.shed_body(&mut |why| *shed.entry(why).or_default() += 1),
                Proto::Http2(h) => h.shed_bodies(&mut |why| *shed.entry(why).or_default() += 1),
                _ => {}
            }
            let now = c.cost();
            self.held = self.held.saturating_sub(c.held) + now;
            c.held = now;
        }
        // The gateway join's waiting records leave unjoined.
        if self.held_total() > target && self.gateway.held() > 0 {
            let n = self
                .gateway
                .release_waiting(records, &mut self.stats.gateway);
            *self
                .stats
                .shed
                .entry(crate::vocab::ShedReason::GatewayHeld)
                .or_default() += n;
        }
        for in_flight in [false, true] {
            for (k, _) in &idle {
                if self.held_total() <= target {
                    return;
                }
                let Some(c) = self.conns.get_mut(k) else {
                    continue;
                };
                let (partial, busy) = match &c.proto {
                    Proto::Http1(h) => (h.holds_partial_head(), h.in_flight() > 0),
                    Proto::Http2(h) => (h.holds_partial_head(), h.in_flight() > 0),
                    Proto::Sniffing(s) => (!s.resp.is_empty(), false),
                    Proto::Unsupported => (false, false),
                };
                if !in_flight && (busy || !partial) || c.held <= std::mem::size_of::<Conn>() {
                    continue;
                }
                let reason = if in_flight {
                    crate::vocab::ShedReason::InFlight
                } else {
                    crate::vocab::ShedReason::PartialHead
                };
                *self.stats.shed.entry(reason).or_default() += 1;
                let old = std::mem::replace(&mut c.proto, Proto::Sniffing(Sniff::new()));
                c.joined = true;
                // Its bytes from here are not counted against the ledger:
                // arrival times would shift, so its requests are timed at
                // the read.
                c.ledger = None;
                let mut out = Out {
                    stats: &mut self.stats,
                    next_seq: &mut self.next_seq,
                    records,
                    self_marker: self.self_marker.as_ref(),
                    identity: &self.identity,
                    tls_servers: &mut self.tls_servers,
                };
                let from = out.records.len();
                old.end(End::Abandon(ts), &mut out);
                let now = c.cost();
                self.held = self.held.saturating_sub(c.held) + now;
                c.held = now;
                // Records it ended join their gateway's as any would.
                let key = (k.0, k.1 & !(1 << 30));
                self.gateway
                    .pass(key, ts, records, from, &mut self.stats.gateway);
            }
        }
    }

    /// End of input (replay finished): requests still in flight end as
    /// `truncated_capture`.
    pub fn finish(&mut self, records: &mut Vec<Finished>) {
        let mut keys: Vec<_> = self.conns.keys().copied().collect();
        keys.sort_unstable();
        for k in keys {
            let first = records.len();
            let mut out = Out {
                stats: &mut self.stats,
                next_seq: &mut self.next_seq,
                records,
                self_marker: self.self_marker.as_ref(),
                identity: &self.identity,
                tls_servers: &mut self.tls_servers,
            };
            if let Some(c) = self.conns.remove(&k) {
                c.ended(&mut out);
                let from = out.records.len();
                let stamp = c.writes_at_ssl_call;
                c.proto.end(End::Finish, &mut out);
                if stamp {
                    stamp_ssl_write(&mut out.records[from..]);
                }
            }
            // A TLS plaintext connection shares its socket's (pid, fd).
            let key = (k.0, k.1 & !(1 << 30));
            self.gateway
                .pass(key, u64::MAX, records, first, &mut self.stats.gateway);
        }
        self.gateway.expire(None, records, &mut self.stats.gateway);
    }
}

/// One call's bytes on `conn`. `arrived`: TLS plaintext, when the
/// ciphertext that carried it arrived (from the socket's ledger).
fn on_data(conn: &mut Conn, d: &DataEvent, arrived: Option<u64>, out: &mut Out<'_>) {
    let request_in = d.dir == Dir::In && conn.info.role == Role::Server;
    if d.is_tls_cipher() || conn.tls_served {
        tls_ciphertext(conn, d, request_in, out);
        return;
    }
    let ledger = conn.ledger.as_ref().filter(|_| request_in);
    // The arrival of this call's request bytes `skip` bytes on.
    let at = |skip: usize| match arrived {
        Some(ts) if request_in => Some(arrival::At::Fixed(ts)),
        _ => ledger.map(|l| arrival::At::Ledger { ledger: l, skip }),
    };
    let piece = Piece {
        arrival: at(0),
        ..Piece::of(d)
    };
    // A connection joined mid-way that turns out to carry HTTP/2 frames
    // (a long-lived gRPC channel): decoded from its next frame boundary.
    if let Proto::Http1(h) = &conn.proto {
        if h.is_joining() && d.ret > 0 && http2::frame::find_boundary(&d.data).is_some() {
            out.stats.http2 += 1;
            conn.proto = Proto::Http2(Box::new(Http2Conn::joined()));
        }
    }
    // Request bytes the sniffer held and hands over now (read before this
    // call, not yet taken from the ledger).
    let mut replayed = 0usize;
    let flow = match &mut conn.proto {
        Proto::Http1(h) => h.on_data(&conn.info, out, piece),
        Proto::Http2(h) => h.on_data(&conn.info, out, piece),
        Proto::Unsupported => Flow::Continue,
        Proto::Sniffing(s) => match s.look(conn.info.request_dir(), d) {
            Sniffed::Wait => Flow::Continue,
            Sniffed::Tls => Flow::Tls,
            sniffed @ (Sniffed::Http1 | Sniffed::Http2) => {
                let (held, len, first_ns) = (s.held, s.len, s.first_ns);
                let (resp_held, resp_ns) = (std::mem::take(&mut s.resp), s.resp_ns);
                let joined_h2 = conn.joined
                    && len == 0
                    && d.ret > 0
                    && http2::frame::find_boundary(&d.data).is_some();
                let mut proto = if matches!(sniffed, Sniffed::Http2) || joined_h2 {
                    out.stats.http2 += 1;
                    Proto::Http2(Box::new(if joined_h2 {
                        Http2Conn::joined()
                    } else {
                        Http2Conn::new()
                    }))
                } else {
                    // A joined connection whose held bytes (`P`) and this
                    // call's start a request line together is in step
                    // already.
                    let resynced = len > 0 && {
                        let mut start = held[..len].to_vec();
                        if d.dir == conn.info.request_dir() {
                            start.extend_from_slice(&d.data[..d.data.len().min(16)]);
                        }
                        http1::head::looks_like_request(&start)
                    };
                    Proto::Http1(if conn.joined && !resynced {
                        Http1Conn::joining()
                    } else {
                        Http1Conn::default()
                    })
                };
                let mut flow = Flow::Continue;
                if !resp_held.is_empty() {
                    // The server's held first bytes, at their own time.
                    let early = Piece {
                        ts_ns: resp_ns,
                        dir: match conn.info.request_dir() {
                            Dir::In => Dir::Out,
                            Dir::Out => Dir::In,
                        },
                        ret: resp_held.len() as i64,
                        data: &resp_held,
                        arrival: None,
                    };
                    flow = proto.on_data(&conn.info, out, early);
                }
                if len > 0 && flow == Flow::Continue {
                    // The held bytes were written first, at their own time.
                    let early = Piece {
                        ts_ns: first_ns,
                        dir: conn.info.request_dir(),
                        ret: len as i64,
                        data: &held[..len],
                        // Held bytes are request bytes, whichever call
                        // settled the sniffing.
                        arrival: match arrived {
                            Some(ts) => Some(arrival::At::Fixed(ts)),
                            None => conn
                                .ledger
                                .as_ref()
                                .map(|l| arrival::At::Ledger { ledger: l, skip: 0 }),
                        },
                    };
                    flow = proto.on_data(&conn.info, out, early);
                    replayed = len;
                }
                if flow == Flow::Continue {
                    let piece = Piece {
                        arrival: at(replayed),
                        ..piece
                    };
                    flow = proto.on_data(&conn.info, out, piece);
                }
                conn.proto = proto;
                flow
            }
        },
    };
    let flow = if flow == Flow::H2cUpgrade {
        match std::mem::replace(&mut conn.proto, Proto::Unsupported) {
            Proto::Http1(mut h) => match h.take_h2c() {
                Some((x, tail, ts)) => {
                    out.stats.http2 += 1;
                    let mut h2 = Http2Conn::upgraded(x);
                    let flow = if tail.is_empty() {
                        Flow::Continue
                    } else {
                        h2.on_data(
                            &conn.info,
                            out,
                            Piece {
                                ts_ns: ts,
                                dir: d.dir,
                                ret: tail.len() as i64,
                                data: &tail,
                                arrival: None,
                            },
                        )
                    };
                    conn.proto = Proto::Http2(Box::new(h2));
                    flow
                }
                None => Flow::Unsupported,
            },
            other => {
                conn.proto = other;
                Flow::Unsupported
            }
        }
    } else {
        flow
    };
    if flow != Flow::Continue {
        conn.proto = Proto::Unsupported;
        let served = conn.info.role == Role::Server;
        // Its later bytes are never read: their arrivals need no keeping
        // (but a served TLS connection's tell when its plaintext arrived).
        if !(flow == Flow::Tls && served) {
            conn.ledger = None;
        }
        if flow == Flow::Tls {
            out.stats.tls += 1;
        }
        // An engine's own outgoing HTTPS (model downloads, usage reports)
        // is expected and not a measurement failure: only `tls` counts it.
        // A served TLS connection is decoded from its plaintext when the
        // TLS source has it; whether it was is known when it ends.
        if flow == Flow::Tls && served {
            conn.tls_served = true;
        } else if flow == Flow::Unsupported {
            out.stats.unsupported_protocol += 1;
        }
    }
    // While the sniffer still holds this call's bytes, the ledger keeps
    // them unread.
    let still_sniffing = matches!(conn.proto, Proto::Sniffing(_));
    let read = replayed as u64 + if request_in { d.ret.max(0) as u64 } else { 0 };
    if read > 0 && !still_sniffing {
        if let Some(l) = &mut conn.ledger {
            if !l.consume(read) {
                // Bytes the ledger never saw arrive (a connection open
                // before the agent, lost arrival records): stop using it.
                conn.ledger = None;
            }
        }
    }
}

/// A call on a served TLS connection (ciphertext, or a ciphertext read's
/// size and time inside an SSL call): never decoded; its request bytes'
/// arrival is kept for the plaintext the TLS source reports next.
fn tls_ciphertext(conn: &mut Conn, d: &DataEvent, request_in: bool, out: &mut Out<'_>) {
    if matches!(conn.proto, Proto::Sniffing(_)) {
        // Found open mid-connection, first seen inside an SSL call.
        conn.proto = Proto::Unsupported;
        out.stats.tls += 1;
        if conn.info.role == Role::Server {
            conn.tls_served = true;
        } else {
            conn.ledger = None;
        }
    }
    if !request_in || d.ret <= 0 {
        return;
    }
    if let Some(l) = &mut conn.ledger {
        conn.cipher_arrival = l.at(0);
        if !l.consume(d.ret as u64) {
            conn.ledger = None;
            conn.cipher_arrival = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{CloseEvent, OpenEvent};

    const T0: u64 = 1_700_000_000_000_000_000;

    fn open(role: Role) -> SocketEvent {
        SocketEvent::Open(OpenEvent {
            ts_ns: T0,
            pid: 7,
            fd: 3,
            role,
            local: Some("127.0.0.1:8000".parse().unwrap()),
            peer: Some("127.0.0.1:40000".parse().unwrap()),
            joined: false,
        })
    }

    fn data(ms: u64, dir: Dir, bytes: &[u8]) -> SocketEvent {
        SocketEvent::Data(DataEvent {
            ts_ns: T0 + ms * 1_000_000,
            pid: 7,
            tid: 7,
            fd: 3,
            dir,
            ret: bytes.len() as i64,
            data: bytes.to_vec(),
            syscall: None,
        })
    }

    fn close(ms: u64) -> SocketEvent {
        SocketEvent::Close(CloseEvent {
            ts_ns: T0 + ms * 1_000_000,
            pid: 7,
            fd: 3,
        })
    }

    fn on(fd: i32, ev: SocketEvent) -> SocketEvent {
        match ev {
            SocketEvent::Open(mut o) => {
                o.fd = fd;
                o.peer = Some(format!("127.0.0.1:{}", 20000 + fd).parse().unwrap());
                SocketEvent::Open(o)
            }
            SocketEvent::Data(mut d) => {
                d.fd = fd;
                SocketEvent::Data(d)
            }
            SocketEvent::Close(mut c) => {
                c.fd = fd;
                SocketEvent::Close(c)
            }
            e => e,
        }
    }

    /// Hostile connections that each hold what the decoder must keep
    /// (unfinished heads, big non-streamed answers) are shed once their
    /// sum passes the budget; a legit streamed chat beside them is
    /// recorded whole, and what is held never passes the budget by more
    /// than one call's growth.
    #[test]
    fn the_memory_budget_sheds_hostile_holders_and_keeps_legit_requests_whole() {
        let budget = 4 << 20;
        let mut d = Decoder::new().with_max_memory(budget);
        let mut out = Vec::new();
        let big_head = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Pad: {}",
            "a".repeat(60_000)
        );
        let chat = br#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
        let body_head = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n{{\"model\":\"m\",\"messages\":[{{\"content\":\"{}",
            "b".repeat(60_000)
        );
        let legit_fd = 5000;
        d.on_event(&on(legit_fd, open(Role::Server)), &mut out);
        let req = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nContent-Length: {}\r\n\r\n{}",
            chat.len(),
            std::str::from_utf8(chat).unwrap()
        );
        d.on_event(&on(legit_fd, data(1, Dir::In, req.as_bytes())), &mut out);
        let mut most = 0u64;
        for fd in 0..400 {
            d.on_event(&on(fd, open(Role::Server)), &mut out);
            let bytes = if fd % 2 == 0 {
                big_head.as_bytes()
            } else {
                body_head.as_bytes()
            };
            d.on_event(&on(fd, data(2, Dir::In, bytes)), &mut out);
            most = most.max(d.stats.held_bytes);
        }
        let sse = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n";
        d.on_event(&on(legit_fd, data(3, Dir::Out, sse.as_bytes())), &mut out);
        for i in 0..5u64 {
            let ev = format!("data: {{\"choices\":[{{\"delta\":{{\"content\":\"t{i}\"}}}}]}}\n\n");
            d.on_event(
                &on(legit_fd, data(4 + i, Dir::Out, ev.as_bytes())),
                &mut out,
            );
        }
        let usage = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":5}}\n\ndata: [DONE]\n\n";
        d.on_event(
            &on(legit_fd, data(10, Dir::Out, usage.as_bytes())),
            &mut out,
        );
        d.on_event(&on(legit_fd, close(11)), &mut out);
        assert!(
            most <= budget as u64 + (128 << 10),
            "held {most} of {budget}"
        );
        assert!(
            d.stats
                .shed
                .get(&crate::vocab::ShedReason::PartialHead)
                .copied()
                .unwrap_or(0)
                > 0,
            "{:?}",
            d.stats.shed
        );
        // Half of them held only a body they were uploading: nothing kept.
        let legit: Vec<_> = out
            .iter()
            .filter(|f| f.record.output_tokens == Some(5))
            .collect();
        assert_eq!(
            legit.len(),
            1,
            "{:?}",
            out.iter().map(|f| &f.record).collect::<Vec<_>>()
        );
        let r = &legit[0].record;
        assert_eq!(r.request_model.as_deref(), Some("m"));
        assert_eq!(r.input_tokens, Some(9));
        assert!(r.ttft_s.is_some() && r.error_type.is_none());
        // A non-streamed answer larger than what is left is not read, but
        // its request still gets its record with timing and status.
        let mut d = Decoder::new().with_max_memory(1 << 20);
        let mut out = Vec::new();
        d.on_event(&open(Role::Server), &mut out);
        d.on_event(&data(1, Dir::In, req.as_bytes()), &mut out);
        let body = format!("{{\"choices\":[{{\"message\":{{\"content\":\"{}\"}}}}],\"usage\":{{\"completion_tokens\":3}}}}", "c".repeat(2 << 20));
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        d.on_event(&data(2, Dir::Out, head.as_bytes()), &mut out);
        for (i, c) in body.as_bytes().chunks(64 << 10).enumerate() {
            d.on_event(&data(3 + i as u64, Dir::Out, c), &mut out);
        }
        assert_eq!(out.len(), 1);
        let r = &out[0].record;
        assert_eq!(
            (r.status, r.output_tokens, r.error_type),
            (Some(200), None, None)
        );
        assert!(
            d.stats
                .shed
                .get(&crate::vocab::ShedReason::ResponseBody)
                .copied()
                .unwrap_or(0)
                >= 1,
            "{:?}",
            d.stats.shed
        );
    }

    fn run(events: &[SocketEvent]) -> (Decoder, Vec<Finished>) {
        let mut d = Decoder::new();
        let mut out = vec![];
        for e in events {
            d.on_event(e, &mut out);
        }
        d.finish(&mut out);
        (d, out)
    }

    fn with_syscall(ev: SocketEvent, sc: agent_ebpf::Syscall, ret: Option<i64>) -> SocketEvent {
        match ev {
            SocketEvent::Data(mut d) => {
                d.syscall = Some(sc);
                if let Some(r) = ret {
                    d.ret = r;
                    d.data.clear();
                }
                SocketEvent::Data(d)
            }
            e => e,
        }
    }

    fn arrival(ms: u64, len: u32) -> SocketEvent {
        SocketEvent::Arrival(crate::event::ArrivalEvent {
            ts_ns: T0 + ms * 1_000_000,
            local_port: 8000,
            peer: "127.0.0.1:40000".parse().unwrap(),
            len,
            cookie: 1,
        })
    }

    const CLIENT_HELLO: &[u8] = b"\x16\x03\x01\x00\x05\x01\x00\x00\x01\x03";
    const REQUEST: &[u8] =
        b"POST /v1/completions HTTP/1.1\r\nContent-Length: 25\r\n\r\n{\"model\":\"m\",\"prompt\":\"\"}";
    const RESPONSE: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 77\r\n\r\n{\"choices\":[{\"text\":\"hi\"}],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}";

    /// A served TLS connection: the handshake's ciphertext, a ciphertext
    /// read inside `SSL_read` (size only: socket BIO) or a captured one
    /// (memory BIO), then the plaintext. The request's t0 is the arrival
    /// of the ciphertext that carried it.
    fn tls_conversation(socket_bio: bool) -> Vec<SocketEvent> {
        let cipher_read = if socket_bio {
            with_syscall(
                data(10, Dir::In, &[0; 90]),
                agent_ebpf::Syscall::TlsCipher,
                Some(90),
            )
        } else {
            let mut c = vec![0x17, 0x03, 0x03, 0, 85];
            c.resize(90, 0xab);
            data(10, Dir::In, &c)
        };
        vec![
            open(Role::Server),
            arrival(1, CLIENT_HELLO.len() as u32),
            data(2, Dir::In, CLIENT_HELLO),
            data(3, Dir::Out, b"\x16\x03\x03\x00\x02\x02\x00"),
            arrival(8, 90),
            cipher_read,
            with_syscall(
                data(11, Dir::In, REQUEST),
                agent_ebpf::Syscall::SslRead,
                None,
            ),
            with_syscall(
                data(20, Dir::Out, RESPONSE),
                if socket_bio {
                    agent_ebpf::Syscall::SslWriteSocket
                } else {
                    agent_ebpf::Syscall::SslWrite
                },
                None,
            ),
            close(30),
        ]
    }

    #[test]
    fn tls_plaintext_is_decoded_with_t0_at_its_ciphertext_arrival() {
        for socket_bio in [true, false] {
            let (d, out) = run(&tls_conversation(socket_bio));
            assert_eq!(out.len(), 1, "socket_bio {socket_bio}: {out:#?}");
            let r = &out[0].record;
            assert_eq!(r.status, Some(200));
            assert_eq!(r.request_model.as_deref(), Some("m"));
            assert_eq!(
                r.t0_source,
                Some(crate::vocab::T0Source::Arrival),
                "socket_bio {socket_bio}"
            );
            assert_eq!(r.t0_ns, T0 + 8_000_000, "socket_bio {socket_bio}");
            assert_eq!(
                r.t1_source,
                Some(if socket_bio {
                    crate::vocab::T1Source::Write
                } else {
                    crate::vocab::T1Source::SslWrite
                }),
                "socket_bio {socket_bio}"
            );
            assert_eq!(d.stats.tls, 1);
            assert_eq!(d.stats.tls_undecoded, 0);
            assert_eq!(d.stats.unsupported_protocol, 0);
            assert_eq!(
                d.stats.truncated_calls, 0,
                "a size-only read is not truncated"
            );
            assert_eq!(d.stats.desyncs, 0);
        }
    }

    #[test]
    fn a_tls_connection_found_open_inside_ssl_read_is_tls_from_its_first_event() {
        let mut evs = tls_conversation(true);
        // No open, no handshake: the agent started mid-connection.
        evs.drain(0..4);
        let (d, out) = run(&evs);
        assert_eq!(out.len(), 1, "{out:#?}");
        assert_eq!(
            out[0].record.t0_source,
            Some(crate::vocab::T0Source::Read),
            "no ledger on a joined connection"
        );
        assert_eq!((d.stats.tls, d.stats.desyncs), (1, 0));
    }

    #[test]
    fn a_served_tls_connection_without_plaintext_is_counted_undecoded() {
        let evs: Vec<SocketEvent> = tls_conversation(false)
            .into_iter()
            .filter(|e| !matches!(e, SocketEvent::Data(d) if d.is_tls_plaintext()))
            .collect();
        let (d, out) = run(&evs);
        assert!(out.is_empty());
        assert_eq!(
            (
                d.stats.tls,
                d.stats.tls_undecoded,
                d.stats.unsupported_protocol
            ),
            (1, 1, 1)
        );
    }

    #[test]
    fn a_requests_traceparent_is_on_its_record_and_a_bad_one_is_counted() {
        let req = |tp: &str| {
            format!(
                "POST /v1/completions HTTP/1.1\r\ntraceparent: {tp}\r\nContent-Length: 25\r\n\r\n{{\"model\":\"m\",\"prompt\":\"\"}}"
            )
        };
        let (d, out) = run(&[
            open(Role::Server),
            data(
                1,
                Dir::In,
                req("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").as_bytes(),
            ),
            data(2, Dir::Out, RESPONSE),
            data(
                3,
                Dir::In,
                req("00-00000000000000000000000000000000-00f067aa0ba902b7-01").as_bytes(),
            ),
            data(4, Dir::Out, RESPONSE),
            close(5),
        ]);
        assert_eq!(out.len(), 2, "{out:#?}");
        let r = &out[0].record;
        assert_eq!(
            r.trace_id.as_deref(),
            Some("4bf92f3577b34da6a3ce929d0e0e4736")
        );
        assert_eq!(r.parent_span_id.as_deref(), Some("00f067aa0ba902b7"));
        assert_eq!(out[1].record.trace_id, None);
        assert_eq!(d.stats.invalid_traceparent, 1);
    }

    /// An h2c prior-knowledge conversation: preface + SETTINGS, the
    /// server's SETTINGS, a `GET /` on stream 1 answered `200` (HPACK
    /// static-table fields only), then a close.
    fn http2_conversation(preface_pieces: &[&[u8]]) -> Vec<SocketEvent> {
        let mut evs = vec![open(Role::Server)];
        for (i, p) in preface_pieces.iter().enumerate() {
            evs.push(data(i as u64, Dir::In, p));
        }
        let settings = [0u8, 0, 6, 4, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 100];
        evs.push(data(50, Dir::In, &settings));
        evs.push(data(51, Dir::Out, &settings));
        // HEADERS, END_STREAM | END_HEADERS: :method GET, :path /, :scheme http.
        evs.push(data(52, Dir::In, b"\0\0\x03\x01\x05\0\0\0\x01\x82\x84\x86"));
        // SETTINGS ACK, then HEADERS :status 200 ending the stream.
        evs.push(data(
            54,
            Dir::Out,
            b"\0\0\0\x04\x01\0\0\0\0\0\0\x01\x01\x05\0\0\0\x01\x88",
        ));
        evs.push(close(60));
        evs
    }

    fn is_the_get(out: &[Finished]) -> bool {
        matches!(out, [f] if f.record.status == Some(200)
            && f.record.method == "GET"
            && f.record.path == "/"
            && f.record.protocol == Some("h2")
            && f.record.error_type.is_none())
    }

    #[test]
    fn an_http2_preface_starts_http2_decoding_and_its_stream_is_recorded() {
        let (d, out) = run(&http2_conversation(&[HTTP2_PREFACE]));
        assert!(is_the_get(&out), "{out:#?}");
        assert_eq!(d.stats.http2, 1);
        assert_eq!(d.stats.unsupported_protocol, 0);
        assert_eq!(d.stats.desyncs, 0);
        assert_eq!(d.stats.orphan_responses, 0);
        assert_eq!(d.buffered_bytes(), 0);
    }

    #[test]
    fn an_http2_preface_split_byte_by_byte_is_still_recognised() {
        let pieces: Vec<&[u8]> = HTTP2_PREFACE.chunks(1).collect();
        let (d, out) = run(&http2_conversation(&pieces));
        assert!(is_the_get(&out), "{out:#?}");
        assert_eq!((d.stats.http2, d.stats.desyncs), (1, 0));
        // Every cut in two pieces as well.
        for cut in 1..HTTP2_PREFACE.len() {
            let (a, b) = HTTP2_PREFACE.split_at(cut);
            let (d, out) = run(&http2_conversation(&[a, b]));
            assert!(is_the_get(&out), "cut {cut}: {out:#?}");
            assert_eq!((d.stats.http2, d.stats.desyncs), (1, 0), "cut {cut}");
        }
    }

    #[test]
    fn an_http2_server_speaking_first_is_recognised_by_its_settings_frame() {
        let settings = [0u8, 0, 6, 4, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 100];
        let (d, out) = run(&[
            open(Role::Server),
            data(1, Dir::Out, &settings),
            data(2, Dir::In, HTTP2_PREFACE),
            close(3),
        ]);
        assert!(out.is_empty());
        assert_eq!((d.stats.http2, d.stats.desyncs), (1, 0));
        // An ACK, or a short frame, is not a server's opening.
        assert!(!is_http2_settings(&[0, 0, 0, 4, 1, 0, 0, 0, 0]));
        assert!(!is_http2_settings(&settings[..12]));
        assert!(is_http2_settings(&[0, 0, 0, 4, 0, 0, 0, 0, 0]));
    }

    #[test]
    fn a_101_switch_ends_the_request_as_unsupported_and_later_bytes_are_ignored() {
        let (d, out) = run(&[
            open(Role::Server),
            data(
                1,
                Dir::In,
                b"GET /v1/realtime HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
            ),
            data(
                5,
                Dir::Out,
                b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n\x81\x05hello",
            ),
            data(6, Dir::In, b"\x81\x85abcd\x01\x02\x03\x04\x05"),
            data(7, Dir::In, b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 0\r\n\r\n"),
            data(8, Dir::Out, b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"),
            data(9, Dir::Out, b"\x88\x00"),
            close(10),
        ]);
        assert_eq!(out.len(), 1, "{out:#?}");
        let r = &out[0].record;
        assert_eq!(r.path, "/v1/realtime");
        assert_eq!(r.status, Some(101));
        assert_eq!(
            r.error_type,
            Some(crate::vocab::ErrorType::UnsupportedProtocol)
        );
        assert!((r.duration_s.unwrap() - 0.004).abs() < 1e-9);
        assert_eq!(d.stats.unsupported_protocol, 1);
        assert_eq!(d.stats.desyncs, 0);
        assert_eq!(d.stats.records, 1);
        assert_eq!(d.in_flight(), 0);
    }

    #[test]
    fn a_1xx_other_than_101_is_still_skipped() {
        let (d, out) = run(&[
            open(Role::Server),
            data(1, Dir::In, b"POST /v1/completions HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n"),
            data(2, Dir::Out, b"HTTP/1.1 100 Continue\r\n\r\n"),
            data(3, Dir::In, b"{}"),
            data(4, Dir::Out, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"),
        ]);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].record.status, Some(200));
        assert_eq!(out[0].record.error_type, None);
        assert_eq!(d.stats.unsupported_protocol, 0);
    }

    #[test]
    fn http1_whose_first_reads_look_like_the_preface_still_decodes() {
        let resp =
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}";
        for req in [
            &b"POST /v1/completions HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}"[..],
            b"PUT /x HTTP/1.1\r\n\r\n",
            b"PROPFIND /x HTTP/1.1\r\n\r\n",
            b"PRI /x HTTP/1.1\r\n\r\n",
        ] {
            // First read 1, 2, 3 … bytes, the rest in the next read.
            for first in 1..8 {
                let (a, b) = req.split_at(first);
                let (d, out) = run(&[
                    open(Role::Server),
                    data(1, Dir::In, a),
                    data(2, Dir::In, b),
                    data(3, Dir::Out, resp),
                ]);
                let name = String::from_utf8_lossy(&req[..first]).to_string();
                assert_eq!(out.len(), 1, "{name:?}: {out:#?}");
                let r = &out[0].record;
                assert_eq!(r.status, Some(200), "{name:?}");
                assert_eq!(r.error_type, None, "{name:?}");
                // t0 is the first byte's read, not the read that decided.
                assert_eq!(r.t0_ns, T0 + 1_000_000, "{name:?}");
                assert!((r.duration_s.unwrap() - 0.002).abs() < 1e-9, "{name:?}");
                assert_eq!((d.stats.unsupported_protocol, d.stats.desyncs), (0, 0));
            }
        }
    }

    #[test]
    fn a_client_that_hangs_up_mid_preface_leaves_nothing() {
        let mut eof = data(2, Dir::In, b"");
        if let SocketEvent::Data(d) = &mut eof {
            d.ret = 0;
        }
        let (d, out) = run(&[
            open(Role::Server),
            data(1, Dir::In, b"PRI * HT"),
            eof,
            close(3),
        ]);
        assert!(out.is_empty());
        assert_eq!(d.stats.unsupported_protocol, 0);
        assert_eq!(d.buffered_bytes(), 0);
    }

    #[test]
    fn a_connection_joined_mid_stream_is_not_a_decode_error_and_its_next_request_is_recorded() {
        let req = b"POST /v1/chat/completions HTTP/1.1\r\nHost: e\r\nContent-Type: application/json\r\nContent-Length: 27\r\n\r\n{\"model\":\"m\",\"stream\":true}";
        let head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n";
        let sse = |t: &str| {
            let ev = format!(
                "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{t}\"}}}}]}}\n\n"
            );
            format!("{:x}\r\n{ev}\r\n", ev.len()).into_bytes()
        };
        // Whichever way the agent joins: in a response's stream (the
        // engine writing), mid-way through a request's body, or right
        // after a response's head; the connection found open at start-up
        // (an open event saying so) or known only by its data.
        let found_open = SocketEvent::Open(OpenEvent {
            joined: true,
            ..match open(Role::Server) {
                SocketEvent::Open(o) => o,
                _ => unreachable!(),
            }
        });
        let firsts = [sse("mid"), b"\"stream\":true}".to_vec(), head.to_vec()];
        for (first, with_open) in firsts.iter().flat_map(|f| [(f, false), (f, true)]) {
            let dir = if first.starts_with(b"\"") {
                Dir::In
            } else {
                Dir::Out
            };
            let evs = [
                found_open.clone(),
                data(0, dir, first),
                data(1, Dir::Out, &sse("more")),
                data(2, Dir::Out, b"0\r\n\r\n"),
                // The next request on the kept-alive connection.
                data(10, Dir::In, req),
                data(11, Dir::Out, head),
                data(20, Dir::Out, &sse("a")),
                data(25, Dir::Out, &sse("b")),
                data(26, Dir::Out, b"0\r\n\r\n"),
                close(30),
            ];
            let (d, out) = run(&evs[usize::from(!with_open)..]);
            assert_eq!(d.stats.desyncs, 0, "joined at {first:?}");
            assert_eq!(d.stats.orphan_responses, 0);
            assert_eq!(d.stats.joined, 1);
            assert_eq!(out.len(), 1, "{out:#?}");
            let r = &out[0].record;
            assert_eq!(r.path, "/v1/chat/completions");
            assert_eq!(r.error_type, None);
            assert_eq!(out[0].content_events, 2);
            assert!((r.ttft_s.unwrap() - 0.010).abs() < 1e-9, "{r:?}");
        }
    }

    #[test]
    fn a_joined_connection_whose_next_request_line_starts_with_a_lone_p_is_recorded() {
        // `P` alone could begin the HTTP/2 preface, so the sniffer holds it;
        // with the next read it starts a request line.
        let found_open = SocketEvent::Open(OpenEvent {
            joined: true,
            ..match open(Role::Server) {
                SocketEvent::Open(o) => o,
                _ => unreachable!(),
            }
        });
        let (d, out) = run(&[
            found_open,
            data(1, Dir::In, b"P"),
            data(
                2,
                Dir::In,
                b"OST /v1/completions HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}",
            ),
            data(
                3,
                Dir::Out,
                b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}",
            ),
        ]);
        assert_eq!(out.len(), 1, "{out:#?}");
        assert_eq!(out[0].record.path, "/v1/completions");
        // Not "OST": the resync must not start at the second read.
        assert_eq!(out[0].record.method, "POST");
        assert_eq!(out[0].record.status, Some(200));
        assert_eq!(d.stats.desyncs, 0);
        assert_eq!(d.stats.joined, 1);
    }

    /// A TLS record of `kind` (22 handshake, 23 application data) holding
    /// `len` bytes of (pretend) ciphertext.
    fn tls_record(kind: u8, len: u16) -> Vec<u8> {
        let mut r = vec![kind, 3, 3];
        r.extend_from_slice(&len.to_be_bytes());
        r.extend((0..len).map(|i| (i as u8).wrapping_mul(151).wrapping_add(7)));
        r
    }

    #[test]
    fn tls_records_are_told_from_http() {
        let hello = [&[22u8, 3, 1, 0, 40][..], &tls_record(22, 40)[5..]].concat();
        assert!(looks_like_tls(&hello));
        // A library reading the 5-byte header first, then the body.
        assert!(looks_like_tls(&tls_record(23, 300)[..5]));
        // Several records, the last one cut short by the read.
        let two = [tls_record(23, 30), tls_record(23, 500)].concat();
        assert!(looks_like_tls(&two[..200]));
        for not in [
            &b"POST /v1/chat/completions HTTP/1.1\r\n"[..],
            b"HTTP/1.1 200 OK\r\n",
            b"data: {}\n\n",
            &HTTP2_PREFACE[..],
            &[23, 3, 3, 0],          // no whole header
            &[23, 3, 3, 0, 0],       // an empty record
            &[23, 2, 0, 0, 9],       // not version 3.x
            &[23, 3, 9, 0, 9],       // no TLS 3.9
            &[25, 3, 3, 0, 9],       // no such content type
            &[23, 3, 3, 0x48, 0x01], // longer than any record
        ] {
            assert!(!looks_like_tls(not), "{not:?}");
        }
        // The second header must be a record header too.
        let bad_next = [tls_record(23, 4), b"GET / HTTP/1.1\r\n".to_vec()].concat();
        assert!(!looks_like_tls(&bad_next));
    }

    #[test]
    fn a_tls_connection_is_unsupported_not_a_decode_error_and_its_engine_named_once() {
        let conversation = |ms: u64| {
            [
                open(Role::Server),
                data(ms, Dir::In, &tls_record(22, 200)),
                data(ms + 1, Dir::Out, &tls_record(22, 90)),
                data(ms + 2, Dir::In, &tls_record(23, 300)),
                data(ms + 3, Dir::Out, &tls_record(23, 700)),
                close(ms + 4),
            ]
        };
        let mut d = Decoder::new();
        let mut out = vec![];
        for e in conversation(0).iter().chain(&conversation(10)) {
            d.on_event(e, &mut out);
        }
        assert!(out.is_empty());
        assert_eq!(d.stats.tls, 2);
        assert_eq!(d.stats.unsupported_protocol, 2);
        assert_eq!((d.stats.desyncs, d.stats.orphan_responses), (0, 0));
        assert_eq!(d.take_tls_servers(), vec![(7, Some(8000))]);
        assert_eq!(d.take_tls_servers(), vec![], "named once");
    }

    #[test]
    fn an_engines_own_outgoing_tls_counts_only_as_tls_and_names_no_engine() {
        let (mut d, out) = run(&[
            open(Role::Client),
            data(0, Dir::Out, &tls_record(22, 200)),
            data(1, Dir::In, &tls_record(22, 90)),
            close(2),
        ]);
        assert!(out.is_empty());
        assert_eq!((d.stats.tls, d.stats.unsupported_protocol), (1, 0));
        assert_eq!(d.take_tls_servers(), vec![]);
    }

    #[test]
    fn a_desynced_plaintext_connection_is_not_taken_for_tls() {
        let req = b"POST /v1/completions HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}";
        let (d, out) = run(&[
            open(Role::Server),
            data(0, Dir::In, b"BREW coffee\x01\r\n\r\n"),
            // Body bytes that happen to look like a TLS record.
            data(1, Dir::In, &tls_record(23, 10)),
            data(2, Dir::In, req),
            data(
                3,
                Dir::Out,
                b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}",
            ),
        ]);
        assert_eq!(d.stats.desyncs, 1);
        assert_eq!((d.stats.tls, d.stats.unsupported_protocol), (0, 0));
        assert_eq!(out.len(), 1, "{out:#?}");
        assert_eq!(out[0].record.path, "/v1/completions");
    }

    #[test]
    fn a_tls_connection_joined_mid_record_is_found_at_its_next_whole_record() {
        // The agent's first sight of it is the rest of a record (no header);
        // the next call holds whole records.
        let rest = &tls_record(23, 300)[100..];
        for first_dir in [Dir::In, Dir::Out] {
            let (d, out) = run(&[
                data(0, first_dir, rest),
                data(1, Dir::Out, &tls_record(23, 500)),
                data(2, Dir::In, &tls_record(23, 80)),
            ]);
            assert!(out.is_empty());
            assert_eq!((d.stats.tls, d.stats.joined, d.stats.desyncs), (1, 1, 0));
        }
    }

    #[test]
    fn a_reused_fd_sniffs_its_new_connection_again() {
        let (d, out) = run(&[
            open(Role::Server),
            data(1, Dir::In, HTTP2_PREFACE),
            open(Role::Server),
            data(2, Dir::In, b"GET /health HTTP/1.1\r\n\r\n"),
            data(3, Dir::Out, b"HTTP/1.1 204 No Content\r\n\r\n"),
        ]);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].record.status, Some(204));
        assert_eq!(d.stats.http2, 1);
    }

    fn sse_chat_exchange(d: &mut Decoder, out: &mut Vec<Finished>, body: &str) {
        d.on_event(&open(Role::Server), out);
        let head = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        d.on_event(&data(0, Dir::In, head.as_bytes()), out);
        // The body in two reads: kept whole across them.
        let (a, b) = body.split_at(body.len() / 2);
        d.on_event(&data(1, Dir::In, a.as_bytes()), out);
        d.on_event(&data(1, Dir::In, b.as_bytes()), out);
        d.on_event(
            &data(
                5,
                Dir::Out,
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n",
            ),
            out,
        );
        let events = [
            r#"{"choices":[{"index":0,"delta":{"role":"assistant","reasoning_content":"Hmm. "}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"content":"Red, "}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"content":"green."}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"name":"f","arguments":"{\"a\""}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":": 1}"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#,
        ];
        for (i, e) in events.iter().enumerate() {
            let ev = format!("data: {e}\n\n");
            let chunk = format!("{:x}\r\n{ev}\r\n", ev.len());
            d.on_event(&data(10 + i as u64, Dir::Out, chunk.as_bytes()), out);
        }
        let done = "data: [DONE]\n\n";
        let chunk = format!("{:x}\r\n{done}\r\n0\r\n\r\n", done.len());
        d.on_event(&data(20, Dir::Out, chunk.as_bytes()), out);
        d.on_event(&close(30), out);
    }

    /// For a process with a tokenizer the request body and the generated
    /// text (content, reasoning, tool calls by index) come with the
    /// record; for any other process nothing is kept.
    #[test]
    fn text_is_kept_only_for_processes_with_a_tokenizer() {
        let body =
            r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"colours?"}]}"#;
        let mut d = Decoder::new();
        let mut out = Vec::new();
        sse_chat_exchange(&mut d, &mut out, body);
        assert_eq!(out.len(), 1);
        assert!(out[0].text.is_none());

        let mut d = Decoder::new();
        d.set_text_pids([7].into_iter().collect());
        let mut out = Vec::new();
        sse_chat_exchange(&mut d, &mut out, body);
        let t = out[0].text.as_ref().expect("kept text");
        assert_eq!(t.body.as_deref(), Some(body.as_bytes()));
        assert_eq!(t.outputs, vec!["Hmm. Red, green.".to_string()]);
        assert_eq!(t.calls, vec![("f".to_string(), r#"{"a": 1}"#.to_string())]);
        assert!(t.tool_calls && !t.output_lost);
        assert!(t.content_span_s.unwrap() > 0.0);
    }

    /// Over the memory budget, kept text goes first (counted as
    /// `tokenize_text`); the record itself stays whole.
    #[test]
    fn kept_text_is_shed_first() {
        let mut d = Decoder::new().with_max_memory(512 << 10);
        d.set_text_pids([7].into_iter().collect());
        let mut out = Vec::new();
        let big = format!(
            r#"{{"model":"m","stream":true,"messages":[{{"role":"user","content":"{}"}}]}}"#,
            "x".repeat(950_000)
        );
        sse_chat_exchange(&mut d, &mut out, &big);
        assert_eq!(out.len(), 1);
        let t = out[0].text.as_ref().expect("text");
        assert!(t.body.is_none(), "shed");
        assert!(
            d.stats
                .shed
                .get(&crate::vocab::ShedReason::TokenizeText)
                .copied()
                .unwrap_or(0)
                >= 1,
            "{:?}",
            d.stats.shed
        );
        assert_eq!(out[0].record.status, Some(200));
        assert!(out[0].record.ttft_s.is_some());
    }
}
