//! The HTTP/2 connection machine (RFC 9113): cleartext HTTP/2 with prior
//! knowledge (the preface, sniffed by `decode`), each direction cut into
//! frames (`frame`), header blocks (HEADERS + CONTINUATION, PUSH_PROMISE)
//! decoded in wire order by one HPACK decoder per direction (`hpack`), and
//! every stream its own exchange: gRPC streams go to `decode::grpc` (which
//! may carry many requests per stream), any other API to the same body
//! decoding as HTTP/1.1 (`decode::body`: SSE in DATA frames).
//!
//! **Joining mid-connection** (open before the agent): each direction is
//! decoded from the first call in which frame headers chain
//! (`frame::find_boundary`); the HPACK tables' older entries are unknown
//! (fields naming them are counted in `DecodeStats::unresolved_headers`,
//! later insertions are learnt); a stream first seen by its DATA is taken
//! as gRPC when a DATA frame starts with a message prefix, and its service
//! is recognised from its messages (`grpc::proto::request_shape`).
//!
//! **Bounds** (per connection): [`MAX_STREAMS`] streams at once; request
//! bodies are read as they pass, never kept (`reqscan`); non-streamed
//! response bodies share [`MAX_CONN_BODY`] bytes; a header
//! block at most `MAX_HEAD_BYTES` (64 KiB); each HPACK table at most
//! `hpack::MAX_TABLE_BYTES` (64 KiB); a gRPC message kept at most
//! `grpc::MAX_KEPT` (16 KiB) per stream and direction. Worst case about
//! 8 MiB + 2 × 128 KiB + 100 × 2 × 16 KiB ≈ 11.5 MiB; an idle connection
//! holds a few hundred bytes.
//!
//! Hostile or broken input (a frame error, a header block that never
//! ends, an HPACK error, a gRPC length over `grpc::MAX_MESSAGE`, a reused
//! stream id, too many streams) ends every open stream with
//! `decode_error`, is counted by reason (`DecodeStats::http2_dropped`) and
//! drops the connection from decoding. Must not: read a clock or panic.

pub mod frame;
pub mod hpack;
pub mod huffman;
#[cfg(test)]
mod tests;

use std::collections::HashMap;

use self::frame::{Event, Header};
use super::body::Body;
use super::exchange::Exchange;
use super::grpc::{Call, GrpcCounts};
use super::http1::head::HeadIdentity;
use super::{reqscan::RequestScan, ConnInfo, Flow, Out, Piece, HTTP2_PREFACE};
use crate::engines::Engine;
use crate::event::{Dir, Role};
use crate::vocab::ErrorType;

/// Streams decoded at once on one connection (servers commonly allow 100
/// or 128 concurrent streams; more is a flood).
pub const MAX_STREAMS: usize = 128;
/// Request and non-streamed response body bytes kept across a
/// connection's streams.
pub const MAX_CONN_BODY: usize = 8 << 20;

/// Why a connection was dropped from HTTP/2 decoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Drop {
    Frame(frame::FrameError),
    Hpack(hpack::Error),
    Grpc(super::grpc::GrpcError),
    /// CONTINUATION without a block open, or another frame inside a block.
    Continuation,
    /// A header block past `MAX_HEAD_BYTES` (one that never ends).
    HeadersTooLarge,
    /// HEADERS opening a stream id at or below one already used.
    StreamReused,
    TooManyStreams,
    /// The client's first bytes were not the connection preface.
    Preface,
}

impl Drop {
    pub fn reason(self) -> &'static str {
        match self {
            Drop::Frame(frame::FrameError::ControlTooLarge) => "frame_too_large",
            Drop::Frame(frame::FrameError::BadPadding) => "frame_padding",
            Drop::Hpack(e) => e.reason(),
            Drop::Grpc(e) => e.reason(),
            Drop::Continuation => "continuation",
            Drop::HeadersTooLarge => "headers_too_large",
            Drop::StreamReused => "stream_reused",
            Drop::TooManyStreams => "too_many_streams",
            Drop::Preface => "preface",
        }
    }
}

/// A header block being collected.
struct Block {
    stream: u32,
    end_stream: bool,
    /// PUSH_PROMISE blocks are decoded for the table only.
    promise: bool,
    buf: Vec<u8>,
    ts: u64,
    arrival: Option<u64>,
}

/// One direction of the connection.
struct Side {
    frames: frame::Reader,
    hpack: hpack::Decoder,
    block: Option<Block>,
    /// Frame boundaries found (always, unless joined mid-way).
    synced: bool,
}

impl Side {
    fn new(joined: bool) -> Side {
        Side {
            frames: frame::Reader::default(),
            hpack: if joined {
                hpack::Decoder::joined()
            } else {
                hpack::Decoder::new()
            },
            block: None,
            synced: !joined,
        }
    }

    fn buffered(&self) -> usize {
        self.frames.buffered()
            + self.hpack.buffered()
            + self.block.as_ref().map_or(0, |b| b.buf.capacity())
    }
}

/// A stream carrying a non-gRPC API (OpenAI over HTTP/2).
struct HttpStream {
    x: Exchange,
    /// The request body, read as it passes (never kept).
    req_scan: Option<Box<RequestScan>>,
    body: Option<Body>,
    /// Body bytes this stream holds of the connection's budget.
    held: usize,
}

enum Stream {
    Http(Box<HttpStream>),
    Grpc {
        call: Box<Call>,
        /// Joined streams: each direction's messages are taken from the
        /// first DATA frame that starts with a message prefix.
        req_synced: bool,
        resp_synced: bool,
        /// First seen by its DATA (opened before the agent).
        joined: bool,
    },
    /// Seen mid-way and not gRPC: ignored until it ends.
    Ignored,
}

pub struct Http2Conn {
    req: Side,
    resp: Side,
    streams: HashMap<u32, Stream>,
    /// Highest client stream id opened by a HEADERS.
    max_opened: u32,
    /// Preface bytes the client has still to send.
    preface_left: usize,
    joined: bool,
    broken: bool,
    /// Body bytes left to keep across streams.
    budget: usize,
    grpc: GrpcCounts,
    /// Stream ids ended lately (bounded): late frames on them (queued
    /// DATA after a reset, request trailers) are not new streams.
    closed: std::collections::VecDeque<u32>,
}

/// Ended stream ids remembered.
const CLOSED_KEPT: usize = 256;

/// A header block's fields the decoder keeps: (lowercase name, value).
type Fields = Vec<(Vec<u8>, Vec<u8>)>;

fn get<'a>(fields: &'a Fields, name: &str) -> Option<&'a [u8]> {
    fields
        .iter()
        .find(|(n, _)| n.as_slice() == name.as_bytes())
        .map(|(_, v)| v.as_slice())
}

fn get_str(fields: &Fields, name: &str) -> Option<String> {
    get(fields, name).map(|v| String::from_utf8_lossy(v).trim().to_string())
}

impl Http2Conn {
    /// A connection seen from its start (the preface, or the server's
    /// first SETTINGS).
    pub fn new() -> Self {
        Self::build(false)
    }

    /// A connection switched from HTTP/1.1 by `Upgrade: h2c`: `x`, the
    /// upgraded request, is stream 1 (its request side complete); the
    /// client's preface comes next.
    pub fn upgraded(mut x: Exchange) -> Self {
        let mut c = Self::build(false);
        x.protocol = "h2";
        x.status = None;
        c.streams.insert(
            1,
            Stream::Http(Box::new(HttpStream {
                x,
                req_scan: None,
                body: None,
                held: 0,
            })),
        );
        c.max_opened = 1;
        c
    }

    /// A connection open before the agent: decoded from its next frame
    /// boundary, its header tables' older entries unknown.
    pub fn joined() -> Self {
        Self::build(true)
    }

    fn build(joined: bool) -> Self {
        Http2Conn {
            req: Side::new(joined),
            resp: Side::new(joined),
            streams: HashMap::new(),
            max_opened: 0,
            preface_left: if joined { 0 } else { HTTP2_PREFACE.len() },
            joined,
            broken: false,
            budget: MAX_CONN_BODY,
            grpc: GrpcCounts::default(),
            closed: std::collections::VecDeque::new(),
        }
    }

    pub fn buffered(&self) -> usize {
        let streams: usize = self
            .streams
            .values()
            .map(|s| match s {
                Stream::Http(h) => {
                    h.req_scan
                        .as_ref()
                        .map_or(0, |r| std::mem::size_of::<RequestScan>() + r.buffered())
                        + h.body.as_ref().map_or(0, Body::buffered)
                        + h.x.text_held()
                }
                Stream::Grpc { call, .. } => call.buffered(),
                Stream::Ignored => 0,
            })
            .sum();
        self.req.buffered() + self.resp.buffered() + streams
    }

    /// The memory budget's first cut: kept response bodies and stream
    /// events being assembled are let go (see `Body::shed`). The reasons
    /// counted, one per stream that held anything.
    pub fn shed_bodies(&mut self, counted: &mut dyn FnMut(crate::vocab::ShedReason)) {
        for s in self.streams.values_mut() {
            if let Stream::Http(h) = s {
                let text = h.x.shed_text() | h.req_scan.as_mut().is_some_and(|r| r.shed_body());
                if text {
                    counted(crate::vocab::ShedReason::TokenizeText);
                }
                if let Some(why) = h.body.as_mut().and_then(Body::shed) {
                    h.x.output_lost();
                    counted(why);
                }
                self.budget += h.held;
                h.held = 0;
            }
        }
    }

    /// Part of a frame or header block is held.
    pub fn holds_partial_head(&self) -> bool {
        [&self.req, &self.resp]
            .iter()
            .any(|s| s.block.is_some() || s.frames.buffered() > 0)
    }

    pub fn in_flight(&self) -> usize {
        let mut n = 0;
        self.each_in_flight(&mut |_| n += 1);
        n
    }

    pub fn each_in_flight(&self, f: &mut dyn FnMut(crate::record::InFlight)) {
        for s in self.streams.values() {
            match s {
                Stream::Http(h) if h.x.may_be_llm() => f(h.x.in_flight()),
                Stream::Grpc { call, .. } => call.each_in_flight(f),
                _ => {}
            }
        }
    }

    /// End of input: what is open ends as `truncated_capture`.
    pub fn finish(mut self, out: &mut Out<'_>) {
        self.end_all(0, ErrorType::TruncatedCapture, out);
    }

    /// The traced process closed the connection.
    pub fn close(mut self, ts: u64, out: &mut Out<'_>) {
        self.end_all(ts, ErrorType::UpstreamReset, out);
    }

    /// The fd was reused without a close event.
    pub fn abandon(mut self, ts: u64, out: &mut Out<'_>) {
        self.end_all(ts, ErrorType::TruncatedCapture, out);
    }

    fn end_all(&mut self, ts: u64, why: ErrorType, out: &mut Out<'_>) {
        let mut ids: Vec<u32> = self.streams.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            self.end_stream(id, ts, why, out);
        }
    }

    /// Ends stream `id` early (reset, close, GOAWAY): what it has open
    /// ends with `why` unless its answer was complete.
    fn end_stream(&mut self, id: u32, ts: u64, why: ErrorType, out: &mut Out<'_>) {
        self.remember_closed(id);
        match self.streams.remove(&id) {
            Some(Stream::Http(mut h)) => {
                self.budget += h.held;
                let ended = h.x.stream_ended();
                if let Some(body) = h.body.take() {
                    out.stats.oversized += body.finish(&mut h.x, ts);
                }
                let end = h.x.last_response_byte_ns.unwrap_or(ts).max(h.x.t0_ns);
                out.emit(h.x.finish(end, (!ended).then_some(why)));
            }
            Some(Stream::Grpc { mut call, .. }) => call.abort(ts, why, out),
            Some(Stream::Ignored) | None => {}
        }
    }

    fn remember_closed(&mut self, id: u32) {
        if self.closed.len() == CLOSED_KEPT {
            self.closed.pop_front();
        }
        self.closed.push_back(id);
    }

    /// Makes room for a new stream: streams seen mid-way that never became
    /// a request (ignored ones, gRPC ones with nothing open) go first.
    fn evict_idle(&mut self) -> bool {
        let idle = self
            .streams
            .iter()
            .filter_map(|(id, s)| match s {
                Stream::Ignored => Some(*id),
                Stream::Grpc {
                    call, joined: true, ..
                } if call.is_idle() => Some(*id),
                _ => None,
            })
            .min();
        match idle {
            Some(id) => {
                self.streams.remove(&id);
                self.remember_closed(id);
                true
            }
            None => false,
        }
    }

    /// Stops decoding this connection: open streams end as decode errors.
    fn drop_conn(&mut self, why: Drop, ts: u64, out: &mut Out<'_>) {
        self.broken = true;
        out.stats.desyncs += 1;
        *out.stats.http2_dropped.entry(why.reason()).or_default() += 1;
        self.end_all(ts, ErrorType::DecodeError, out);
        self.req = Side::new(true);
        self.resp = Side::new(true);
    }

    /// Moves what gRPC counted into the decoder's counters.
    fn flush_counts(&mut self, out: &mut Out<'_>) {
        let g = std::mem::take(&mut self.grpc);
        let s = &mut out.stats.grpc;
        s.unsupported_compression += g.unsupported_compression;
        s.oversized += g.oversized;
        s.bad_messages += g.bad_messages;
        s.unrecognised += g.unrecognised;
        s.orphan_responses += g.orphan_responses;
    }

    /// One call's bytes (or its failure) on this connection.
    pub fn on_data(&mut self, conn: &ConnInfo, out: &mut Out<'_>, p: Piece<'_>) -> Flow {
        let is_request = p.dir == conn.request_dir();
        if p.ret < 0 || (p.ret == 0 && p.dir == Dir::In) {
            // The peer went away (the engine's failed call or EOF).
            self.end_all(p.ts_ns, gone(conn, true), out);
            return Flow::Continue;
        }
        if self.broken {
            return Flow::Continue;
        }
        let mut data = p.data;
        let mut skip = 0usize;
        if is_request && self.preface_left > 0 {
            let done = HTTP2_PREFACE.len() - self.preface_left;
            let n = self.preface_left.min(data.len());
            if data[..n] != HTTP2_PREFACE[done..done + n] {
                self.drop_conn(Drop::Preface, p.ts_ns, out);
                return Flow::Continue;
            }
            self.preface_left -= n;
            data = &data[n..];
            skip = n;
        }
        let side = if is_request {
            &mut self.req
        } else {
            &mut self.resp
        };
        if !side.synced {
            match frame::find_boundary(data) {
                Some(k) => {
                    side.synced = true;
                    data = &data[k..];
                    skip += k;
                }
                None => return Flow::Continue,
            }
        }
        let result = self.frames(conn, out, p, data, skip, is_request);
        if let Err(why) = result {
            self.drop_conn(why, p.ts_ns, out);
        } else if (p.ret as u64) > p.data.len() as u64 {
            // The capture cut this call: the rest of it is lost, so this
            // direction is out of step. Resynchronise at the next call.
            let side = if is_request {
                &mut self.req
            } else {
                &mut self.resp
            };
            *side = Side::new(true);
            self.joined = true;
            let mut open: Vec<u32> = self.streams.keys().copied().collect();
            open.sort_unstable();
            for id in open {
                self.end_stream(id, p.ts_ns, ErrorType::TruncatedCapture, out);
            }
        }
        self.flush_counts(out);
        Flow::Continue
    }

    fn frames(
        &mut self,
        conn: &ConnInfo,
        out: &mut Out<'_>,
        p: Piece<'_>,
        data: &[u8],
        skip: usize,
        is_request: bool,
    ) -> Result<(), Drop> {
        let arrival = p.arrival.filter(|_| is_request);
        let at = |off: usize| arrival.and_then(|a| a.at(skip + off));
        let mut reader = std::mem::take(if is_request {
            &mut self.req.frames
        } else {
            &mut self.resp.frames
        });
        let mut err = None;
        let r = reader.feed(data, &mut |ev| {
            if err.is_some() {
                return;
            }
            if let Err(e) = self.event(conn, out, p.ts_ns, &at, ev, is_request) {
                err = Some(e);
            }
        });
        if is_request {
            self.req.frames = reader;
        } else {
            self.resp.frames = reader;
        }
        r.map_err(Drop::Frame)?;
        err.map_or(Ok(()), Err)
    }

    fn event(
        &mut self,
        conn: &ConnInfo,
        out: &mut Out<'_>,
        ts: u64,
        at: &dyn Fn(usize) -> Option<u64>,
        ev: Event<'_>,
        is_request: bool,
    ) -> Result<(), Drop> {
        let side = if is_request {
            &mut self.req
        } else {
            &mut self.resp
        };
        match ev {
            Event::Frame { h, .. } if h.kind == frame::CONTINUATION => {
                let Some(b) = side.block.as_mut().filter(|b| b.stream == h.stream) else {
                    // Joined inside a header block: its start was before
                    // the agent (the table knows nothing of it either).
                    if side.block.is_none() && self.joined {
                        return Ok(());
                    }
                    return Err(Drop::Continuation);
                };
                let Event::Frame { payload, .. } = ev else {
                    unreachable!()
                };
                if b.buf.len() + payload.len() > super::MAX_HEAD_BYTES {
                    return Err(Drop::HeadersTooLarge);
                }
                b.buf.extend_from_slice(payload);
                if h.flags & frame::END_HEADERS != 0 {
                    let b = side.block.take().expect("open");
                    self.block(conn, out, b, is_request)?;
                }
                Ok(())
            }
            _ if side.block.is_some() => Err(Drop::Continuation),
            Event::Frame { h, payload, off } => {
                self.control(conn, out, ts, at(off), h, payload, is_request)
            }
            Event::Data {
                stream,
                bytes,
                off,
                first,
            } => self.data(
                conn,
                out,
                ts,
                stream,
                bytes,
                &|i| at(off + i),
                first,
                is_request,
            ),
            Event::DataEnd { stream, end_stream } => {
                if end_stream {
                    self.half_close(stream, ts, is_request, None, out);
                }
                Ok(())
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn control(
        &mut self,
        conn: &ConnInfo,
        out: &mut Out<'_>,
        ts: u64,
        arrival: Option<u64>,
        h: Header,
        payload: &[u8],
        is_request: bool,
    ) -> Result<(), Drop> {
        match h.kind {
            frame::HEADERS | frame::PUSH_PROMISE => {
                let mut frag = payload;
                if h.flags & frame::PADDED != 0 {
                    let pad = usize::from(
                        *frag
                            .first()
                            .ok_or(Drop::Frame(frame::FrameError::BadPadding))?,
                    );
                    frag = &frag[1..];
                    if pad > frag.len() {
                        return Err(Drop::Frame(frame::FrameError::BadPadding));
                    }
                    frag = &frag[..frag.len() - pad];
                }
                let skip = match h.kind {
                    frame::PUSH_PROMISE => 4,
                    _ if h.flags & frame::PRIORITY_FLAG != 0 => 5,
                    _ => 0,
                };
                let frag = frag
                    .get(skip..)
                    .ok_or(Drop::Frame(frame::FrameError::BadPadding))?;
                let b = Block {
                    stream: h.stream,
                    end_stream: h.kind == frame::HEADERS && h.flags & frame::END_STREAM != 0,
                    promise: h.kind == frame::PUSH_PROMISE,
                    buf: frag.to_vec(),
                    ts,
                    arrival,
                };
                if h.flags & frame::END_HEADERS != 0 {
                    self.block(conn, out, b, is_request)
                } else {
                    let side = if is_request {
                        &mut self.req
                    } else {
                        &mut self.resp
                    };
                    side.block = Some(b);
                    Ok(())
                }
            }
            frame::RST_STREAM => {
                let why = gone(conn, is_request);
                self.end_stream(h.stream, ts, why, out);
                Ok(())
            }
            frame::SETTINGS if h.flags & frame::ACK == 0 => {
                for s in payload.chunks_exact(6) {
                    let id = u16::from_be_bytes([s[0], s[1]]);
                    let v = u32::from_be_bytes([s[2], s[3], s[4], s[5]]);
                    if id == 1 {
                        // The sender's decoder table: bounds the other
                        // direction's encoder.
                        let other = if is_request {
                            &mut self.resp
                        } else {
                            &mut self.req
                        };
                        other.hpack.set_max_allowed(v);
                    }
                }
                Ok(())
            }
            // A GOAWAY's last id counts streams its receiver opened: only
            // the server's speaks of the client's requests.
            frame::GOAWAY if is_request != (conn.role == Role::Server) => {
                if let Some(b) = payload.get(..4) {
                    let last = u32::from_be_bytes([b[0] & 0x7f, b[1], b[2], b[3]]);
                    let why = gone(conn, is_request);
                    // Streams past the last one the sender processed were
                    // never answered.
                    let late: Vec<u32> =
                        self.streams.keys().copied().filter(|s| *s > last).collect();
                    for id in late {
                        self.end_stream(id, ts, why, out);
                    }
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// A whole header block: decoded (always, for the table), then given
    /// to its stream.
    fn block(
        &mut self,
        conn: &ConnInfo,
        out: &mut Out<'_>,
        b: Block,
        is_request: bool,
    ) -> Result<(), Drop> {
        let side = if is_request {
            &mut self.req
        } else {
            &mut self.resp
        };
        let mut fields: Fields = Vec::new();
        let wanted = |name: &[u8]| keep_header(name, is_request, out.identity);
        let unresolved = side
            .hpack
            .decode(&b.buf, &mut |f| {
                if let (Some(n), Some(v)) = (f.name, f.value) {
                    if wanted(n) {
                        fields.push((n.to_ascii_lowercase(), v.to_vec()));
                    }
                } else if let (Some(n), None) = (f.name, f.value) {
                    // Name known, value not: note the name (`:path` unknown).
                    if n == b":path" {
                        fields.push((b":path?".to_vec(), Vec::new()));
                    }
                }
            })
            .map_err(Drop::Hpack)?;
        out.stats.unresolved_headers += unresolved as u64;
        if b.promise {
            return Ok(());
        }
        if is_request {
            self.request_headers(conn, out, b, fields, unresolved > 0)
        } else {
            self.response_headers(out, b, &fields);
            Ok(())
        }
    }

    fn request_headers(
        &mut self,
        conn: &ConnInfo,
        out: &mut Out<'_>,
        b: Block,
        fields: Fields,
        unresolved: bool,
    ) -> Result<(), Drop> {
        if self.streams.contains_key(&b.stream) {
            // Request trailers.
            if b.end_stream {
                self.half_close(b.stream, b.ts, true, None, out);
            }
            return Ok(());
        }
        if self.closed.contains(&b.stream) {
            // Trailers of a stream already ended (reset, or answered).
            return Ok(());
        }
        if b.stream <= self.max_opened {
            return Err(Drop::StreamReused);
        }
        if self.streams.len() >= MAX_STREAMS && !self.evict_idle() {
            return Err(Drop::TooManyStreams);
        }
        self.max_opened = b.stream;
        let path = get_str(&fields, ":path").unwrap_or_default();
        let method = get_str(&fields, ":method");
        let ct = get_str(&fields, "content-type").map(|c| c.to_ascii_lowercase());
        let identity = HeadIdentity::read(&|n| get(&fields, n), out.identity);
        let grpc = match &ct {
            Some(c) => c.starts_with("application/grpc"),
            // Neither the type nor the path could be read (indexed before
            // the agent joined): gRPC is what long-lived HTTP/2 channels
            // carry; its messages decide the service, or it is no LLM call.
            None => path.is_empty() && unresolved,
        };
        let t0 = (b.ts, b.arrival);
        let stream = if grpc {
            let gzip = get(&fields, "grpc-encoding") == Some(b"gzip");
            let call = Call::new(&path, identity, gzip, t0, conn, out);
            Stream::Grpc {
                call: Box::new(call),
                req_synced: true,
                resp_synced: true,
                joined: false,
            }
        } else {
            let mut x = Exchange::new(
                out.next_seq(),
                conn.pid,
                conn.server_port,
                conn.client.clone(),
                method
                    .as_deref()
                    .unwrap_or(if unresolved { "POST" } else { "GET" }),
                &path,
                b.ts,
            );
            x.t_arrival = b.arrival;
            x.protocol = "h2";
            out.identify(&mut x, identity);
            Stream::Http(Box::new(HttpStream {
                x,
                req_scan: None,
                body: None,
                held: 0,
            }))
        };
        self.streams.insert(b.stream, stream);
        if b.end_stream {
            self.half_close(b.stream, b.ts, true, None, out);
        }
        Ok(())
    }

    fn response_headers(&mut self, out: &mut Out<'_>, b: Block, fields: &Fields) {
        let status = get_str(fields, ":status").and_then(|s| s.parse::<u16>().ok());
        let grpc_status = get_str(fields, "grpc-status").and_then(|s| s.parse::<u32>().ok());
        match self.streams.get_mut(&b.stream) {
            Some(Stream::Http(h)) => {
                if let Some(s) = status {
                    if (100..200).contains(&s) {
                        return;
                    }
                    h.x.status = Some(s);
                    h.x.last_response_byte_ns = Some(b.ts);
                    h.x.stages
                        .merge(&crate::decode::formats::tgi_header_stages(&|n| {
                            get_str(fields, n)
                        }));
                    if h.x.provider.is_none() {
                        h.x.provider = get_str(fields, "server")
                            .as_deref()
                            .and_then(Engine::from_server_header);
                    }
                    let ct = get_str(fields, "content-type")
                        .unwrap_or_default()
                        .to_ascii_lowercase();
                    h.body = Some(Body::for_content_type(&ct, &mut h.x));
                }
            }
            Some(Stream::Grpc { call, .. }) if status.is_some() => {
                call.on_response_headers(status, get(fields, "grpc-encoding") == Some(b"gzip"));
            }
            _ => {}
        }
        if b.end_stream {
            self.half_close(b.stream, b.ts, false, grpc_status, out);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn data(
        &mut self,
        conn: &ConnInfo,
        out: &mut Out<'_>,
        ts: u64,
        id: u32,
        bytes: &[u8],
        at: &dyn Fn(usize) -> Option<u64>,
        first: bool,
        is_request: bool,
    ) -> Result<(), Drop> {
        if !self.streams.contains_key(&id) {
            // A stream opened before the agent: gRPC when a DATA frame
            // starts with a message prefix. Not one that ended since.
            if !self.joined || !first || self.closed.contains(&id) {
                return Ok(());
            }
            if self.streams.len() >= MAX_STREAMS && !self.evict_idle() {
                return Ok(());
            }
            let s = if looks_like_message(bytes) {
                Stream::Grpc {
                    call: Box::new(Call::joined()),
                    req_synced: false,
                    resp_synced: false,
                    joined: true,
                }
            } else {
                Stream::Ignored
            };
            self.streams.insert(id, s);
        }
        let budget = &mut self.budget;
        match self.streams.get_mut(&id) {
            Some(Stream::Http(h)) => {
                if is_request {
                    let x = &h.x;
                    h.req_scan
                        .get_or_insert_with(|| x.request_scan(&out.identity.rule_fields))
                        .feed(bytes);
                } else if let Some(body) = h.body.as_mut() {
                    h.x.last_response_byte_ns = Some(ts);
                    let before = body.kept();
                    // A plain body keeps its bytes: within the budget.
                    let n = if body.is_plain() {
                        bytes.len().min(*budget)
                    } else {
                        bytes.len()
                    };
                    body.feed(&mut h.x, ts, &bytes[..n]);
                    if n < bytes.len() {
                        body.cut();
                    }
                    let grew = body.kept().saturating_sub(before).min(*budget);
                    h.held += grew;
                    *budget -= grew;
                }
            }
            Some(Stream::Grpc {
                call,
                req_synced,
                resp_synced,
                joined,
            }) => {
                let synced = if is_request { req_synced } else { resp_synced };
                if !*synced {
                    if !(first && looks_like_message(bytes)) {
                        return Ok(());
                    }
                    *synced = true;
                }
                let r = if is_request {
                    call.on_request_data(bytes, ts, at, conn, out, &mut self.grpc)
                } else {
                    call.on_response_data(bytes, ts, out, &mut self.grpc)
                };
                if let Err(e) = r {
                    if !*joined {
                        return Err(Drop::Grpc(e));
                    }
                    // A stream joined mid-way was taken in step at a frame
                    // that only looked like a message start: find the next.
                    self.grpc.bad_messages += 1;
                    *synced = false;
                    call.resync(is_request);
                }
            }
            Some(Stream::Ignored) | None => {}
        }
        Ok(())
    }

    /// One side of stream `id` ended (END_STREAM). The response side's end
    /// ends the stream (with its trailers' `grpc-status`, if any).
    fn half_close(
        &mut self,
        id: u32,
        ts: u64,
        is_request: bool,
        grpc_status: Option<u32>,
        out: &mut Out<'_>,
    ) {
        if is_request {
            if let Some(Stream::Http(h)) = self.streams.get_mut(&id) {
                if let Some(scan) = h.req_scan.take() {
                    h.x.read_request(scan);
                }
            }
            return;
        }
        self.remember_closed(id);
        match self.streams.remove(&id) {
            Some(Stream::Http(mut h)) => {
                self.budget += h.held;
                if let Some(body) = h.body.take() {
                    out.stats.oversized += body.finish(&mut h.x, ts);
                }
                let end = h.x.last_response_byte_ns.unwrap_or(ts);
                out.emit(h.x.finish(end, None));
            }
            Some(Stream::Grpc { mut call, .. }) => call.on_end(grpc_status, ts, out),
            Some(Stream::Ignored) | None => {}
        }
    }
}

impl Default for Http2Conn {
    fn default() -> Self {
        Self::new()
    }
}

/// What ending a stream means when a frame of the client (`is_request`
/// on a server connection) or of the engine ended it.
fn gone(conn: &ConnInfo, is_request: bool) -> ErrorType {
    if is_request == (conn.role == Role::Server) {
        ErrorType::ClientDisconnect
    } else {
        ErrorType::UpstreamReset
    }
}

/// Does a DATA frame's payload start like a gRPC message (flag 0 or 1,
/// a length no longer than a message may be)?
fn looks_like_message(b: &[u8]) -> bool {
    match b {
        [flag, a, b2, c, d, ..] => {
            *flag <= 1 && u32::from_be_bytes([*a, *b2, *c, *d]) <= super::grpc::MAX_MESSAGE
        }
        _ => false,
    }
}

/// Header fields worth keeping of a block: pseudo-headers, the content
/// type and encodings, gRPC status, `server`, `x-request-id`, and the
/// identity headers the configuration names.
fn keep_header(name: &[u8], is_request: bool, id: &super::IdentityConfig) -> bool {
    if name.first() == Some(&b':') {
        return true;
    }
    let lower = |s: &str| name.eq_ignore_ascii_case(s.as_bytes());
    if lower("content-type") || lower("grpc-encoding") || lower("x-request-id") {
        return true;
    }
    if !is_request {
        return lower("grpc-status") || lower("server");
    }
    lower(crate::selftraffic::HEADER)
        || lower("authorization")
        || lower("api-key")
        || lower("x-api-key")
        || id.caller.tenant_headers.iter().any(|h| lower(h))
        || id.rule_headers.iter().any(|h| lower(h))
}
