//! gRPC over HTTP/2 streams: length-prefixed messages (gzip decoded),
//! the engines' services (`proto`), and one record per inference request.
//!
//! - **Triton** `ModelInfer` (unary): one record per call.
//!   `ModelStreamInfer` (bidirectional): many requests on one stream, each
//!   with its own `id`; responses are matched by `id` (an empty `id` by
//!   order), one record per request. t0 is that request message's first
//!   byte; a response counts as content when it carries outputs (their
//!   elements are its tokens: `output_ids`-like integer tensors exactly,
//!   `text_output` elements as chunks); the request ends at the response
//!   whose `triton_final_response` parameter is true, at an
//!   `error_message`, or with the stream.
//! - **vLLM / SGLang** `Generate` (server streaming): one record per call;
//!   token ids counted exactly, usage (`prompt_tokens`,
//!   `completion_tokens`) from the chunks and the completion.
//! - Anything else (health, metadata, unknown services): one record per
//!   call, never an LLM request (`record::RouteClass`).
//!
//! A stream whose method is unknown (opened before the agent started, or
//! whose `:path` referred to a header-table entry never seen) gets its
//! service from its first request message's shape (`proto::request_shape`).
//!
//! Owns: the calls of one connection's gRPC streams. Must not: keep more
//! than [`MAX_KEPT`] bytes of a message, read a clock, or panic.

pub mod proto;

use std::collections::VecDeque;
use std::io::Read;

use prost::Message;

use super::exchange::Exchange;
use super::formats::{Content, EventInfo, Format};
use super::http1::head::HeadIdentity;
use super::{ConnInfo, Out};
use crate::vocab::ErrorType;

/// A message length past this is not gRPC (hostile or out of step): the
/// connection is dropped from decoding.
pub const MAX_MESSAGE: u32 = 64 << 20;
/// Bytes of one message kept (and, compressed, inflated) at most; a longer
/// message is read from its whole leading fields (`whole_fields`).
pub const MAX_KEPT: usize = 16 << 10;
/// Requests in flight on one Triton stream at most (like HTTP/1
/// pipelining).
pub const MAX_STREAM_REQUESTS: usize = super::MAX_PIPELINE;

/// Why a stream's bytes stopped being gRPC.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GrpcError {
    /// A length prefix over [`MAX_MESSAGE`].
    Length,
    /// A compressed-flag byte other than 0 or 1.
    Flag,
}

impl GrpcError {
    pub fn reason(self) -> &'static str {
        match self {
            GrpcError::Length => "grpc_length",
            GrpcError::Flag => "grpc_flag",
        }
    }
}

/// One whole message (or its kept prefix).
pub struct Msg<'a> {
    pub data: &'a [u8],
    /// The message's length on the wire (`data` is shorter when it was
    /// longer than [`MAX_KEPT`]).
    pub len: u32,
    pub compressed: bool,
    /// When its first byte was written (or read).
    pub ts: u64,
    /// When its first byte reached the socket (request direction).
    pub arrival: Option<u64>,
}

/// One direction's messages on a stream.
#[derive(Default)]
pub struct Framer {
    prefix: [u8; 5],
    plen: usize,
    /// Message bytes to go.
    left: u32,
    len: u32,
    compressed: bool,
    buf: Vec<u8>,
    first: (u64, Option<u64>),
}

impl Framer {
    pub fn buffered(&self) -> usize {
        self.buf.capacity()
    }

    /// Cuts `bytes` (written at `ts`; `arrival(i)` says when byte `i`
    /// reached the socket) into messages.
    pub fn feed(
        &mut self,
        mut bytes: &[u8],
        ts: u64,
        arrival: &dyn Fn(usize) -> Option<u64>,
        f: &mut dyn FnMut(Msg<'_>),
    ) -> Result<(), GrpcError> {
        let total = bytes.len();
        while !bytes.is_empty() {
            let at = total - bytes.len();
            if self.plen < 5 {
                if self.plen == 0 {
                    self.first = (ts, arrival(at));
                    // Fast path: a whole message in this piece, no copy.
                    if let Some(&[flag, a, b, c, d]) = bytes.get(..5) {
                        let len = u32::from_be_bytes([a, b, c, d]);
                        if flag <= 1 && len <= MAX_MESSAGE && bytes.len() >= 5 + len as usize {
                            let end = 5 + len as usize;
                            let data = &bytes[5..end];
                            f(Msg {
                                data: &data[..data.len().min(MAX_KEPT)],
                                len,
                                compressed: flag == 1,
                                ts,
                                arrival: self.first.1,
                            });
                            bytes = &bytes[end..];
                            continue;
                        }
                    }
                }
                let n = (5 - self.plen).min(bytes.len());
                self.prefix[self.plen..self.plen + n].copy_from_slice(&bytes[..n]);
                self.plen += n;
                bytes = &bytes[n..];
                if self.plen < 5 {
                    break;
                }
                let [flag, a, b, c, d] = self.prefix;
                if flag > 1 {
                    return Err(GrpcError::Flag);
                }
                self.len = u32::from_be_bytes([a, b, c, d]);
                if self.len > MAX_MESSAGE {
                    return Err(GrpcError::Length);
                }
                self.compressed = flag == 1;
                self.left = self.len;
                self.buf.clear();
            }
            let n = (self.left as usize).min(bytes.len());
            let room = MAX_KEPT.saturating_sub(self.buf.len());
            self.buf.extend_from_slice(&bytes[..n.min(room)]);
            self.left -= n as u32;
            bytes = &bytes[n..];
            if self.left == 0 {
                f(Msg {
                    data: &self.buf,
                    len: self.len,
                    compressed: self.compressed,
                    ts: self.first.0,
                    arrival: self.first.1,
                });
                self.plen = 0;
                if self.buf.capacity() > 4096 {
                    self.buf = Vec::new();
                }
            }
        }
        Ok(())
    }
}

/// The length of the leading whole top-level fields of a protobuf message
/// cut short (a message longer than [`MAX_KEPT`]): prost then decodes
/// those, so a request's model name and id survive a long prompt.
pub fn whole_fields(buf: &[u8]) -> usize {
    fn varint(b: &[u8], at: &mut usize) -> Option<u64> {
        let mut v = 0u64;
        for i in 0..10 {
            let byte = *b.get(*at)?;
            *at += 1;
            v |= u64::from(byte & 0x7f) << (7 * i);
            if byte < 0x80 {
                return Some(v);
            }
        }
        None
    }
    let mut at = 0usize;
    let mut good = 0usize;
    while at < buf.len() {
        let Some(key) = varint(buf, &mut at) else {
            break;
        };
        let end = match key & 7 {
            0 => varint(buf, &mut at).map(|_| at),
            1 => at.checked_add(8),
            2 => varint(buf, &mut at).and_then(|l| at.checked_add(usize::try_from(l).ok()?)),
            5 => at.checked_add(4),
            _ => None,
        };
        match end {
            Some(e) if e <= buf.len() => {
                at = e;
                good = e;
            }
            _ => break,
        }
    }
    good
}

/// Inflates a gzip message into `out`, at most [`MAX_KEPT`] bytes of it.
/// False when the bytes are not gzip.
fn gunzip(data: &[u8], out: &mut Vec<u8>) -> bool {
    out.clear();
    let mut d = flate2::read::GzDecoder::new(data).take(MAX_KEPT as u64);
    d.read_to_end(out).is_ok() || !out.is_empty()
}

/// What a call is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Service {
    TritonInfer,
    TritonStream,
    Vllm,
    Sglang,
    /// vLLM's or SGLang's `Generate`, recognised by its request's shape;
    /// the first response says which.
    Generate,
    /// Health, metadata, anything else: not an LLM request.
    Other,
    /// Not known yet: the stream's method was never seen.
    Unknown,
}

impl Service {
    pub fn of_path(path: &str) -> Service {
        match path {
            "/inference.GRPCInferenceService/ModelInfer" => Service::TritonInfer,
            "/inference.GRPCInferenceService/ModelStreamInfer" => Service::TritonStream,
            "/vllm.grpc.engine.VllmEngine/Generate" => Service::Vllm,
            "/sglang.grpc.scheduler.SglangScheduler/Generate" => Service::Sglang,
            _ => Service::Other,
        }
    }

    fn path(self) -> Option<&'static str> {
        Some(match self {
            Service::TritonInfer => "/inference.GRPCInferenceService/ModelInfer",
            Service::TritonStream => "/inference.GRPCInferenceService/ModelStreamInfer",
            Service::Vllm => "/vllm.grpc.engine.VllmEngine/Generate",
            Service::Sglang => "/sglang.grpc.scheduler.SglangScheduler/Generate",
            _ => return None,
        })
    }

    fn streams(self) -> bool {
        matches!(
            self,
            Service::TritonStream | Service::Vllm | Service::Sglang | Service::Generate
        )
    }
}

/// What the connection counts about gRPC (merged into `DecodeStats`).
#[derive(Default, Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct GrpcCounts {
    /// Messages compressed with an encoding other than gzip (skipped).
    pub unsupported_compression: u64,
    /// Messages longer than [`MAX_KEPT`] (read from their leading fields).
    pub oversized: u64,
    /// Messages that did not decode as their service's protobuf.
    pub bad_messages: u64,
    /// Streams whose method was unknown and whose messages matched no
    /// known service's shape.
    pub unrecognised: u64,
    /// Responses whose request was not seen (joined mid-request).
    pub orphan_responses: u64,
}

/// One gRPC stream.
pub struct Call {
    service: Service,
    path: String,
    identity: HeadIdentity,
    req: Framer,
    resp: Framer,
    /// `grpc-encoding` of each direction is gzip (else compressed messages
    /// are counted and skipped).
    req_gzip: bool,
    resp_gzip: bool,
    /// The call's exchange (unary and server streaming), or the Triton
    /// stream's requests in flight, oldest first.
    xs: VecDeque<Exchange>,
    /// The service was recognised from a message's shape, not named by
    /// the path: a Triton call may still turn out unary.
    guessed: bool,
    scratch: Vec<u8>,
}

impl Call {
    /// A call whose request HEADERS said `path` (empty: unknown).
    pub fn new(
        path: &str,
        identity: HeadIdentity,
        req_gzip: bool,
        t0: (u64, Option<u64>),
        conn: &ConnInfo,
        out: &mut Out<'_>,
    ) -> Call {
        let service = if path.is_empty() {
            Service::Unknown
        } else {
            Service::of_path(path)
        };
        let mut c = Call {
            service,
            path: path.to_string(),
            identity,
            req: Framer::default(),
            resp: Framer::default(),
            req_gzip,
            resp_gzip: false,
            xs: VecDeque::new(),
            guessed: false,
            scratch: Vec::new(),
        };
        if !matches!(service, Service::TritonStream | Service::Unknown) {
            c.open(t0, conn, out);
        }
        c
    }

    /// A stream first seen by its DATA (opened before the agent): its
    /// method and headers are unknown.
    pub fn joined() -> Call {
        Call {
            service: Service::Unknown,
            path: String::new(),
            identity: HeadIdentity::default(),
            req: Framer::default(),
            resp: Framer::default(),
            req_gzip: false,
            resp_gzip: false,
            xs: VecDeque::new(),
            guessed: false,
            scratch: Vec::new(),
        }
    }

    pub fn buffered(&self) -> usize {
        self.req.buffered() + self.resp.buffered() + self.scratch.capacity()
    }

    /// Nothing open on it: a stream seen mid-way that carried no request.
    pub fn is_idle(&self) -> bool {
        self.xs.is_empty()
    }

    /// One direction's messages lost step (a joined stream): start again
    /// at the next message the caller finds.
    pub fn resync(&mut self, request: bool) {
        if request {
            self.req = Framer::default();
        } else {
            self.resp = Framer::default();
        }
    }

    /// LLM requests in flight on this stream.
    pub fn each_in_flight(&self, f: &mut dyn FnMut(crate::record::InFlight)) {
        for x in self.xs.iter().filter(|x| x.may_be_llm()) {
            f(x.in_flight());
        }
    }

    /// Starts an exchange at `t` (HEADERS or a request message).
    fn open(&mut self, t: (u64, Option<u64>), conn: &ConnInfo, out: &mut Out<'_>) -> &mut Exchange {
        let path = self.service.path().unwrap_or(&self.path);
        let mut x = Exchange::new(
            out.next_seq(),
            conn.pid,
            conn.server_port,
            conn.client.clone(),
            "POST",
            path,
            t.0,
        );
        x.t_arrival = t.1;
        x.protocol = "grpc";
        x.stream = self.service.streams();
        x.status = Some(200);
        out.identify(&mut x, self.identity.clone());
        self.xs.push_back(x);
        self.xs.back_mut().expect("just pushed")
    }

    /// The response HEADERS: `grpc-encoding` gzip or not, and the HTTP
    /// status (a non-200 ends nothing yet: trailers or the end do).
    pub fn on_response_headers(&mut self, status: Option<u16>, gzip: bool) {
        self.resp_gzip = gzip;
        if let Some(s) = status {
            for x in &mut self.xs {
                x.status = Some(s);
            }
        }
    }

    /// Request-direction DATA bytes.
    pub fn on_request_data(
        &mut self,
        bytes: &[u8],
        ts: u64,
        arrival: &dyn Fn(usize) -> Option<u64>,
        conn: &ConnInfo,
        out: &mut Out<'_>,
        counts: &mut GrpcCounts,
    ) -> Result<(), GrpcError> {
        let mut req = std::mem::take(&mut self.req);
        let r = req.feed(bytes, ts, arrival, &mut |m| {
            self.on_request(m, conn, out, counts)
        });
        self.req = req;
        r
    }

    /// Response-direction DATA bytes, written at `ts`.
    pub fn on_response_data(
        &mut self,
        bytes: &[u8],
        ts: u64,
        out: &mut Out<'_>,
        counts: &mut GrpcCounts,
    ) -> Result<(), GrpcError> {
        // On a Triton stream a response is its own request's (by id).
        if self.service != Service::TritonStream {
            for x in &mut self.xs {
                x.last_response_byte_ns = Some(ts);
            }
        }
        let mut resp = std::mem::take(&mut self.resp);
        let r = resp.feed(bytes, ts, &|_| None, &mut |m| {
            self.on_response(m, ts, out, counts)
        });
        self.resp = resp;
        r
    }

    /// The message's bytes, inflated when compressed; None when they
    /// cannot be read (counted).
    fn payload<'m>(
        scratch: &'m mut Vec<u8>,
        m: &Msg<'m>,
        gzip: bool,
        counts: &mut GrpcCounts,
    ) -> Option<&'m [u8]> {
        if m.len as usize > m.data.len() {
            counts.oversized += 1;
        }
        if !m.compressed {
            let n = if m.len as usize > m.data.len() {
                whole_fields(m.data)
            } else {
                m.data.len()
            };
            return Some(&m.data[..n]);
        }
        if !gzip || m.len as usize > m.data.len() {
            counts.unsupported_compression += u64::from(!gzip);
            return None;
        }
        if !gunzip(m.data, scratch) {
            counts.bad_messages += 1;
            return None;
        }
        let n = if scratch.len() >= MAX_KEPT {
            whole_fields(scratch)
        } else {
            scratch.len()
        };
        Some(&scratch[..n])
    }

    fn on_request(
        &mut self,
        m: Msg<'_>,
        conn: &ConnInfo,
        out: &mut Out<'_>,
        counts: &mut GrpcCounts,
    ) {
        let mut scratch = std::mem::take(&mut self.scratch);
        if let Some(data) = Self::payload(&mut scratch, &m, self.req_gzip, counts) {
            if self.service == Service::Unknown {
                self.guessed = true;
                self.service = match proto::request_shape(data) {
                    Some(proto::Shape::TritonInfer) => Service::TritonStream,
                    Some(proto::Shape::Generate) => Service::Generate,
                    None => {
                        counts.unrecognised += 1;
                        Service::Other
                    }
                };
                if self.service != Service::TritonStream {
                    self.open((m.ts, m.arrival), conn, out);
                }
            }
            self.read_request(data, &m, conn, out, counts);
        }
        self.scratch = scratch;
    }

    fn read_request(
        &mut self,
        data: &[u8],
        m: &Msg<'_>,
        conn: &ConnInfo,
        out: &mut Out<'_>,
        counts: &mut GrpcCounts,
    ) {
        match self.service {
            Service::TritonStream | Service::TritonInfer => {
                let Ok(r) = proto::ModelInferRequest::decode(data) else {
                    counts.bad_messages += 1;
                    return;
                };
                let x = if self.service == Service::TritonStream {
                    if self.xs.len() >= MAX_STREAM_REQUESTS {
                        // A stream whose responses never come: the oldest
                        // request is given up as cut off.
                        if let Some(old) = self.xs.pop_front() {
                            let end = old.last_response_byte_ns.unwrap_or(m.ts);
                            out.emit(old.finish(end, Some(ErrorType::TruncatedCapture)));
                        }
                    }
                    self.open((m.ts, m.arrival), conn, out)
                } else {
                    match self.xs.back_mut() {
                        Some(x) => x,
                        None => return,
                    }
                };
                x.request.model = (!r.model_name.is_empty()).then(|| r.model_name.clone());
                x.request_id = (!r.id.is_empty()).then(|| bounded(&r.id));
                let mut chars = 0u64;
                let mut tokens = None;
                for (i, input) in r.inputs.iter().enumerate() {
                    if is_token_ids(&input.name, &input.datatype) {
                        *tokens.get_or_insert(0) += proto::elements(&input.shape);
                    } else if input.datatype == "BYTES" {
                        if let Some(raw) = r.raw_input_contents.get(i) {
                            chars += proto::bytes_tensor_len(raw).unwrap_or(0);
                        }
                    }
                }
                x.request.prompt_chars = (chars > 0).then_some(chars);
                if let Some(t) = tokens {
                    x.on_body(EventInfo {
                        input_tokens: Some(t),
                        ..EventInfo::default()
                    });
                }
            }
            Service::Vllm | Service::Sglang | Service::Generate => {
                let Some(x) = self.xs.back_mut() else { return };
                let Ok((id, tokenized, text)) =
                    proto::generate_request(data, self.service == Service::Sglang)
                else {
                    counts.bad_messages += 1;
                    return;
                };
                x.request_id = (!id.is_empty()).then(|| bounded(&id));
                if let Some(t) = text {
                    x.request.prompt_chars = Some(t.chars().count() as u64);
                }
                if let Some(t) = tokenized.filter(|t| !t.input_ids.is_empty()) {
                    x.on_body(EventInfo {
                        input_tokens: Some(t.input_ids.len() as u64),
                        ..EventInfo::default()
                    });
                }
            }
            Service::Other | Service::Unknown => {}
        }
    }

    fn on_response(&mut self, m: Msg<'_>, ts: u64, out: &mut Out<'_>, counts: &mut GrpcCounts) {
        let mut scratch = std::mem::take(&mut self.scratch);
        if let Some(data) = Self::payload(&mut scratch, &m, self.resp_gzip, counts) {
            self.read_response(data, ts, out, counts);
        }
        self.scratch = scratch;
    }

    fn read_response(&mut self, data: &[u8], ts: u64, out: &mut Out<'_>, counts: &mut GrpcCounts) {
        match self.service {
            Service::TritonStream if self.guessed && proto::is_unary_triton_response(data) => {
                // A unary `ModelInfer` whose path was not seen.
                self.service = Service::TritonInfer;
                for x in &mut self.xs {
                    x.stream = false;
                    x.path = Service::TritonInfer.path().unwrap_or_default().to_string();
                }
                self.read_response(data, ts, out, counts);
            }
            Service::TritonStream => {
                let Ok(r) = proto::ModelStreamInferResponse::decode(data) else {
                    counts.bad_messages += 1;
                    return;
                };
                let resp = r.infer_response.unwrap_or_default();
                let Some(i) = self.find(&resp.id) else {
                    counts.orphan_responses += 1;
                    return;
                };
                let x = &mut self.xs[i];
                x.last_response_byte_ns = Some(ts);
                let failed = !r.error_message.is_empty();
                let mut info = triton_outputs(&resp, true);
                info.error = failed;
                x.on_stream_event(ts, info);
                if failed || final_flag(&resp) {
                    let x = self.xs.remove(i).expect("found");
                    out.emit(x.finish(ts, None));
                }
            }
            Service::TritonInfer => {
                let Ok(resp) = proto::ModelInferResponse::decode(data) else {
                    counts.bad_messages += 1;
                    return;
                };
                if let Some(x) = self.xs.back_mut() {
                    x.on_body(triton_outputs(&resp, false));
                }
            }
            Service::Generate => {
                self.service = if proto::is_sglang_response(data) {
                    Service::Sglang
                } else {
                    Service::Vllm
                };
                if let Some(x) = self.xs.back_mut() {
                    let format = if self.service == Service::Sglang {
                        Format::SglangGrpc
                    } else {
                        Format::VllmGrpc
                    };
                    x.format = format;
                    x.provider = format.provider();
                    x.path = self.service.path().unwrap_or_default().to_string();
                }
                self.read_response(data, ts, out, counts);
            }
            Service::Vllm | Service::Sglang => {
                let Some(x) = self.xs.back_mut() else {
                    counts.orphan_responses += 1;
                    return;
                };
                let Ok((chunk, complete)) =
                    proto::generate_response(data, self.service == Service::Sglang)
                else {
                    counts.bad_messages += 1;
                    return;
                };
                let nonzero = |n: u32| (n > 0).then_some(u64::from(n));
                if let Some(c) = chunk {
                    let parts = c.token_ids.len() as u32;
                    x.on_stream_event(
                        ts,
                        EventInfo {
                            content: if parts > 0 {
                                Content::Answer
                            } else {
                                Content::None
                            },
                            content_parts: parts,
                            input_tokens: nonzero(c.prompt_tokens),
                            output_tokens: nonzero(c.completion_tokens),
                            ..EventInfo::default()
                        },
                    );
                }
                if let Some(c) = complete {
                    let streamed = x.stream && x.content_events() > 0;
                    let parts = if streamed {
                        0
                    } else {
                        c.output_ids.len() as u32
                    };
                    let info = EventInfo {
                        content: if parts > 0 {
                            Content::Answer
                        } else {
                            Content::None
                        },
                        content_parts: parts,
                        input_tokens: nonzero(c.prompt_tokens),
                        output_tokens: nonzero(c.completion_tokens)
                            .or_else(|| (!streamed).then_some(c.output_ids.len() as u64)),
                        finish_reason: (!c.finish_reason.is_empty())
                            .then(|| std::borrow::Cow::Owned(c.finish_reason.clone())),
                        end_of_stream: true,
                        ..EventInfo::default()
                    };
                    x.on_stream_event(ts, info);
                }
            }
            Service::Other | Service::Unknown => {}
        }
    }

    /// The request a Triton response answers: by id, an empty id by order.
    fn find(&self, id: &str) -> Option<usize> {
        if id.is_empty() {
            return self.xs.iter().position(|x| x.request_id.is_none());
        }
        self.xs
            .iter()
            .position(|x| x.request_id.as_deref() == Some(id))
            .or_else(|| {
                // A bounded id was cut: match on its kept prefix.
                let b = bounded(id);
                self.xs
                    .iter()
                    .position(|x| x.request_id.as_deref() == Some(b.as_str()))
            })
    }

    /// The stream ended: trailers with `grpc-status` (None: none seen), at
    /// `ts`. Every request still open ends.
    pub fn on_end(&mut self, grpc_status: Option<u32>, ts: u64, out: &mut Out<'_>) {
        let err = match grpc_status {
            None | Some(0) => None,
            Some(1) => Some(ErrorType::ClientDisconnect),
            Some(c) => Some(ErrorType::Grpc(u8::try_from(c).unwrap_or(u8::MAX))),
        };
        while let Some(x) = self.xs.pop_front() {
            let end = x.last_response_byte_ns.unwrap_or(ts);
            out.emit(x.finish(end, err));
        }
    }

    /// The stream was reset, the connection closed or the capture ended:
    /// what is open ends with `why`.
    pub fn abort(&mut self, ts: u64, why: ErrorType, out: &mut Out<'_>) {
        while let Some(x) = self.xs.pop_front() {
            let end = x.last_response_byte_ns.unwrap_or(ts).max(x.t0_ns);
            let err = (!x.stream_ended()).then_some(why);
            out.emit(x.finish(end, err));
        }
    }
}

/// Whether a Triton tensor holds token ids (counted exactly).
fn is_token_ids(name: &str, datatype: &str) -> bool {
    matches!(datatype, "INT32" | "INT64" | "UINT32" | "UINT64")
        && (name.ends_with("_ids") || name.ends_with("token_ids") || name == "tokens")
}

/// What a Triton response's outputs say: output token ids count exactly;
/// other outputs' elements are content chunks.
fn triton_outputs(r: &proto::ModelInferResponse, streamed: bool) -> EventInfo<'static> {
    let mut ids = None;
    let mut elements = 0u64;
    for o in &r.outputs {
        let n = proto::elements(&o.shape);
        if is_token_ids(&o.name, &o.datatype) {
            *ids.get_or_insert(0) += n;
        } else {
            elements += n;
        }
    }
    let parts = ids.unwrap_or(elements);
    EventInfo {
        content: if parts > 0 {
            Content::Answer
        } else {
            Content::None
        },
        content_parts: u32::try_from(parts).unwrap_or(u32::MAX),
        model: (!r.model_name.is_empty()).then(|| std::borrow::Cow::Owned(r.model_name.clone())),
        output_tokens: if streamed { None } else { ids },
        ..EventInfo::default()
    }
}

fn final_flag(r: &proto::ModelInferResponse) -> bool {
    matches!(
        r.parameters
            .get("triton_final_response")
            .and_then(|p| p.choice.as_ref()),
        Some(proto::ParameterChoice::BoolParam(true))
    )
}

fn bounded(s: &str) -> String {
    crate::identity::caller::bounded_value(s.as_bytes()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(flag: u8, msg: &[u8]) -> Vec<u8> {
        let mut v = vec![flag];
        v.extend_from_slice(&(msg.len() as u32).to_be_bytes());
        v.extend_from_slice(msg);
        v
    }

    fn messages(f: &mut Framer, bytes: &[u8]) -> Result<Vec<(Vec<u8>, u32)>, GrpcError> {
        let mut got = vec![];
        f.feed(bytes, 1, &|_| None, &mut |m| {
            got.push((m.data.to_vec(), m.len))
        })?;
        Ok(got)
    }

    #[test]
    fn messages_split_anywhere_read_the_same() {
        let mut all = frame(0, b"hello");
        all.extend(frame(0, b""));
        all.extend(frame(0, &vec![7u8; 300]));
        let whole = messages(&mut Framer::default(), &all).unwrap();
        assert_eq!(whole.len(), 3);
        for cut in 0..all.len() {
            let mut f = Framer::default();
            let mut got = messages(&mut f, &all[..cut]).unwrap();
            got.extend(messages(&mut f, &all[cut..]).unwrap());
            assert_eq!(got, whole, "cut at {cut}");
        }
    }

    #[test]
    fn a_4_gib_length_prefix_and_a_bad_flag_are_errors_and_long_messages_are_cut() {
        let mut f = Framer::default();
        assert_eq!(
            messages(&mut f, b"\0\xff\xff\xff\xffxx"),
            Err(GrpcError::Length)
        );
        assert_eq!(
            messages(&mut Framer::default(), b"\x07\0\0\0\x01x"),
            Err(GrpcError::Flag)
        );
        let long = frame(0, &vec![1u8; MAX_KEPT + 10]);
        let mut f = Framer::default();
        let mut got = messages(&mut f, &long[..100]).unwrap();
        got.extend(messages(&mut f, &long[100..]).unwrap());
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0.len(), MAX_KEPT);
        assert_eq!(got[0].1 as usize, MAX_KEPT + 10);
        assert!(f.buffered() <= 4096, "the long message's buffer is freed");
    }

    #[test]
    fn whole_fields_stop_before_a_cut_field() {
        let r = proto::ModelInferRequest {
            model_name: "llm".into(),
            id: "r7".into(),
            raw_input_contents: vec![vec![0u8; 1000]],
            ..Default::default()
        };
        let b = r.encode_to_vec();
        let n = whole_fields(&b[..500]);
        let got = proto::ModelInferRequest::decode(&b[..n]).unwrap();
        assert_eq!((got.model_name.as_str(), got.id.as_str()), ("llm", "r7"));
        assert_eq!(whole_fields(&b), b.len());
        assert_eq!(whole_fields(&[0xff; 20]), 0);
    }
}
