//! The HTTP/1.1 connection machine: requests and responses framed by
//! Content-Length, chunked transfer or connection close; keep-alive,
//! pipelining (a FIFO of exchanges), `100 Continue`, HEAD/204/304 without
//! bodies. Response bodies go to `decode::body`.
//!
//! Owns: one connection's HTTP/1 parsing state and its bounds. Must not:
//! read a clock, hold unbounded memory, or panic on any input (bytes that
//! stop being HTTP end the in-flight requests with an `error_type` and the
//! connection waits for a request line). A `101 Switching Protocols` ends
//! its part: the dispatcher (`decode`) stops feeding it.

pub mod chunked;
pub mod head;

use std::collections::VecDeque;

use self::head::{looks_like_request, Framing, HeadBuf, NotHttp, RequestHead, ResponseHead};
use super::{
    arrival::At, body::Body, exchange::Exchange, reqscan::RequestScan, ConnInfo, Flow, Out, Piece,
    MAX_PIPELINE,
};
use crate::engines::Engine;
use crate::event::{Dir, Role};
use crate::vocab::ErrorType;

enum ReqState {
    Head(HeadBuf),
    Body {
        seq: u64,
        framing: Framing,
        /// The body read as it passes (never kept).
        scan: Box<RequestScan>,
        complete: bool,
    },
}

enum RespState {
    Head(HeadBuf),
    Body {
        framing: Framing,
        body: Body,
        head_request: bool,
    },
}

pub struct Http1Conn {
    req: ReqState,
    resp: RespState,
    /// Requests in arrival order; the front one is being answered.
    queue: VecDeque<Exchange>,
    /// Ignore bytes until a plausible request line starts a request-side
    /// event.
    broken: bool,
    /// Joined mid-way and not yet in step: its bytes may turn out to be
    /// TLS records (a desynced connection's are not tested: it was HTTP).
    joining: bool,
    /// HEAD requests in flight, by exchange seq (their responses have no body).
    heads: Vec<u64>,
    /// After a `101` to h2c: the upgraded request (stream 1 of the HTTP/2
    /// connection), the response bytes after the 101's head, their time.
    h2c: Option<(Exchange, Vec<u8>, u64)>,
}

impl Default for Http1Conn {
    fn default() -> Self {
        Self {
            req: ReqState::Head(HeadBuf::default()),
            resp: RespState::Head(HeadBuf::default()),
            queue: VecDeque::new(),
            broken: false,
            joining: false,
            heads: Vec::new(),
            h2c: None,
        }
    }
}

impl Http1Conn {
    /// A connection joined mid-way (open before the agent): its bytes are
    /// skipped until a request starts, without counting a decode error.
    pub fn joining() -> Self {
        Self {
            broken: true,
            joining: true,
            ..Self::default()
        }
    }

    /// The request a `101` switched to HTTP/2 (h2c upgrade), the bytes
    /// that followed the 101 in its write, and that write's time.
    pub fn take_h2c(&mut self) -> Option<(Exchange, Vec<u8>, u64)> {
        self.h2c.take()
    }

    /// Joined mid-way and still waiting for a request to start.
    pub fn is_joining(&self) -> bool {
        self.joining && self.broken
    }

    /// Heap bytes held in parsing buffers.
    pub fn buffered(&self) -> usize {
        let req = match &self.req {
            ReqState::Head(h) => h.buffered(),
            ReqState::Body { scan, .. } => std::mem::size_of::<RequestScan>() + scan.buffered(),
        };
        let resp = match &self.resp {
            RespState::Head(h) => h.buffered(),
            RespState::Body { body, .. } => body.buffered(),
        };
        req + resp
            + self.queue.len() * std::mem::size_of::<Exchange>()
            + self.queue.iter().map(Exchange::text_held).sum::<usize>()
    }

    /// The memory budget's first cut: the text kept for the tokenizer,
    /// and the response body kept for reading (or the stream event being
    /// assembled), are let go. Each reason counted once, when anything
    /// was held.
    pub fn shed_body(&mut self, counted: &mut dyn FnMut(crate::vocab::ShedReason)) {
        let mut text = false;
        for x in self.queue.iter_mut() {
            text |= x.shed_text();
        }
        if let ReqState::Body { scan, .. } = &mut self.req {
            text |= scan.shed_body();
        }
        if text {
            counted(crate::vocab::ShedReason::TokenizeText);
        }
        if let RespState::Body { body, .. } = &mut self.resp {
            if let Some(why) = body.shed() {
                if let Some(x) = self.queue.front_mut() {
                    x.output_lost();
                }
                counted(why);
            }
        }
    }

    /// Part of a request or response head is held (nothing else of a
    /// connection grows with what its peer sends).
    pub fn holds_partial_head(&self) -> bool {
        matches!(&self.req, ReqState::Head(h) if h.buffered() > 0)
            || matches!(&self.resp, RespState::Head(h) if h.buffered() > 0)
    }

    /// Requests waiting for (the end of) their response.
    /// LLM requests in flight (probes and scrapes are not counted: see
    /// `Exchange::may_be_llm`).
    pub fn in_flight(&self) -> usize {
        self.queue.iter().filter(|x| x.may_be_llm()).count()
    }

    /// Each request in flight.
    pub fn each_in_flight(&self, f: &mut dyn FnMut(crate::record::InFlight)) {
        for x in self.queue.iter().filter(|x| x.may_be_llm()) {
            f(x.in_flight());
        }
    }

    /// End of input (replay finished): requests still in flight end as
    /// `truncated_capture`.
    pub fn finish(mut self, out: &mut Out<'_>) {
        let end = self
            .queue
            .iter()
            .filter_map(|x| x.last_response_byte_ns)
            .max()
            .unwrap_or(0);
        while let Some(x) = self.queue.pop_front() {
            let end = x.last_response_byte_ns.unwrap_or(end.max(x.t0_ns));
            out.emit(x.finish(end, Some(ErrorType::TruncatedCapture)));
        }
    }

    /// The connection was closed by the traced process.
    pub fn close(mut self, ts: u64, out: &mut Out<'_>) {
        // A body delimited by the close is complete now.
        if let RespState::Body {
            framing: Framing::UntilClose,
            ..
        } = self.resp
        {
            if !self.queue.is_empty() {
                self.end_response(ts, out);
            }
        }
        // Anything still pending was cut off by the traced process itself
        // (a client going away shows up earlier, as EOF or a failed write)
        // — unless its stream's end marker was written: a server that sees
        // its client hang up after `[DONE]` may close without the framing's
        // last chunk (llama-server over TLS does), and the answer was whole.
        while let Some(x) = self.queue.pop_front() {
            let end = x.last_response_byte_ns.unwrap_or(ts);
            let err = (!x.stream_ended()).then_some(ErrorType::UpstreamReset);
            out.emit(x.finish(end, err));
        }
    }

    /// The fd was reused without a close event.
    pub fn abandon(mut self, ts: u64, out: &mut Out<'_>) {
        self.fail_all(ts, ErrorType::TruncatedCapture, out);
    }

    fn fail_all(&mut self, ts: u64, why: ErrorType, out: &mut Out<'_>) {
        while let Some(x) = self.queue.pop_front() {
            let end = x.last_response_byte_ns.unwrap_or(ts);
            out.emit(x.finish(end, Some(why)));
        }
    }

    /// One call's bytes (or its failure) on this connection.
    pub fn on_data(&mut self, conn: &ConnInfo, out: &mut Out<'_>, p: Piece<'_>) -> Flow {
        let is_request = p.dir == conn.request_dir();
        if p.ret < 0 || (p.ret == 0 && p.dir == Dir::In) {
            self.on_gone(conn, out, p, is_request);
            return Flow::Continue;
        }
        if self.broken {
            // A connection joined mid-way whose first call was part of a TLS
            // record: later calls show the records whole.
            if self.joining && crate::decode::looks_like_tls(p.data) {
                self.fail_all(p.ts_ns, ErrorType::UnsupportedProtocol, out);
                return Flow::Tls;
            }
            if is_request && looks_like_request(p.data) {
                self.broken = false;
                self.joining = false;
                self.reset();
            } else {
                return Flow::Continue;
            }
        }
        let missing = (p.ret as u64).saturating_sub(p.data.len() as u64);
        let step = if is_request {
            self.request_bytes(conn, out, p.ts_ns, p.data, p.arrival)
                .and_then(|()| self.request_gap(missing))
                .map(|()| Flow::Continue)
        } else {
            self.response_bytes(out, p.ts_ns, p.data)
                .and_then(|flow| self.response_gap(missing).map(|()| flow))
        };
        match step {
            Ok(flow) => flow,
            Err(NotHttp) => {
                let why = if missing > 0 {
                    ErrorType::TruncatedCapture
                } else {
                    ErrorType::DecodeError
                };
                out.stats.desyncs += 1;
                self.fail_all(p.ts_ns, why, out);
                self.reset();
                self.broken = true;
                Flow::Continue
            }
        }
    }

    /// A failed write or read, or end of file on a read: the peer is gone
    /// (server role) or the upstream is (client role).
    fn on_gone(&mut self, conn: &ConnInfo, out: &mut Out<'_>, p: Piece<'_>, is_request: bool) {
        let gone = if conn.role == Role::Server {
            ErrorType::ClientDisconnect
        } else {
            ErrorType::UpstreamReset
        };
        if !is_request && p.ret == 0 {
            // Client role: a response delimited by the close is done.
            if let RespState::Body {
                framing: Framing::UntilClose,
                ..
            } = self.resp
            {
                self.end_response(p.ts_ns, out);
            }
        }
        while let Some(x) = self.queue.pop_front() {
            let end = x.last_response_byte_ns.unwrap_or(p.ts_ns);
            // A client that hangs up after the stream's end marker but
            // before the HTTP framing's end (uvicorn writes the last chunk
            // after `[DONE]`; the openai SDK closes on `[DONE]`) got its
            // whole answer.
            let err = (!x.stream_ended()).then_some(gone);
            out.emit(x.finish(end, err));
        }
        self.reset();
        self.broken = true;
    }

    fn reset(&mut self) {
        self.req = ReqState::Head(HeadBuf::default());
        self.resp = RespState::Head(HeadBuf::default());
        self.heads.clear();
    }

    /// Bytes of the request direction.
    fn request_bytes(
        &mut self,
        conn: &ConnInfo,
        out: &mut Out<'_>,
        ts: u64,
        mut data: &[u8],
        arrival: Option<At<'_>>,
    ) -> Result<(), NotHttp> {
        let total = data.len();
        while !data.is_empty() {
            match &mut self.req {
                ReqState::Head(h) => {
                    let at = arrival.and_then(|l| l.at(total - data.len()));
                    let Some((head, t0, t_arrival)) =
                        h.feed::<RequestHead>(&mut data, ts, at, out.identity)?
                    else {
                        continue;
                    };
                    if self.queue.len() >= MAX_PIPELINE {
                        return Err(NotHttp);
                    }
                    let seq = out.next_seq();
                    let mut x = Exchange::new(
                        seq,
                        conn.pid,
                        conn.server_port,
                        conn.client.clone(),
                        &head.method,
                        &head.path,
                        t0,
                    );
                    x.t_arrival = t_arrival;
                    out.identify(&mut x, head.identity);
                    if head.method == "HEAD" {
                        self.heads.push(seq);
                    }
                    let scan = x.request_scan(&out.identity.rule_fields);
                    self.queue.push_back(x);
                    let framing = head.framing.unwrap_or(Framing::None);
                    let complete = matches!(framing, Framing::None | Framing::Length(0));
                    self.req = ReqState::Body {
                        seq,
                        complete,
                        framing,
                        scan,
                    };
                    if complete {
                        self.request_done();
                    }
                }
                ReqState::Body { framing, scan, .. } => {
                    let (used, done) = match framing {
                        Framing::Length(left) => {
                            let n = (*left).min(data.len() as u64) as usize;
                            scan.feed(&data[..n]);
                            *left -= n as u64;
                            (n, *left == 0)
                        }
                        Framing::Chunked(c) => {
                            let mut sink = |b: &[u8]| scan.feed(b);
                            match c.feed(data, &mut sink) {
                                Ok(n) => (n, c.is_done()),
                                Err(_) => return Err(NotHttp),
                            }
                        }
                        Framing::None | Framing::UntilClose => (0, true),
                    };
                    data = &data[used..];
                    if done {
                        self.request_done();
                    }
                }
            }
        }
        Ok(())
    }

    /// Capture dropped `missing` request bytes at the end of the last call.
    fn request_gap(&mut self, missing: u64) -> Result<(), NotHttp> {
        if missing == 0 {
            return Ok(());
        }
        match &mut self.req {
            ReqState::Body {
                framing: Framing::Length(left),
                complete,
                scan,
                ..
            } if missing <= *left => {
                *left -= missing;
                *complete = false; // the body JSON is incomplete
                scan.gap(missing);
                if *left == 0 {
                    self.request_done();
                }
                Ok(())
            }
            ReqState::Body {
                framing: Framing::Chunked(c),
                complete,
                scan,
                ..
            } => {
                *complete = false;
                scan.gap(missing);
                if c.skip(missing) {
                    Ok(())
                } else {
                    Err(NotHttp)
                }
            }
            _ => Err(NotHttp),
        }
    }

    /// The request body is complete: read what it says (and which of the
    /// body keys `fields` it has), expect the next head.
    fn request_done(&mut self) {
        let state = std::mem::replace(&mut self.req, ReqState::Head(HeadBuf::default()));
        if let ReqState::Body { seq, scan, .. } = state {
            if let Some(x) = self.queue.iter_mut().find(|x| x.seq == seq) {
                x.read_request(scan);
            }
        }
    }

    /// Bytes of the response direction.
    fn response_bytes(
        &mut self,
        out: &mut Out<'_>,
        ts: u64,
        mut data: &[u8],
    ) -> Result<Flow, NotHttp> {
        if let Some(x) = self.queue.front_mut() {
            x.last_response_byte_ns = Some(ts);
        }
        while !data.is_empty() {
            match &mut self.resp {
                RespState::Head(h) => {
                    let Some((head, _, _)) =
                        h.feed::<ResponseHead>(&mut data, ts, None, out.identity)?
                    else {
                        continue;
                    };
                    if head.status == 101 && head.upgrade.as_deref() == Some("h2c") {
                        // HTTP/2 from here (RFC 7540 §3.2): the request is
                        // stream 1, answered in HTTP/2 frames.
                        if let Some(x) = self.queue.pop_front() {
                            self.fail_all(ts, ErrorType::UnsupportedProtocol, out);
                            self.h2c = Some((x, data.to_vec(), ts));
                            return Ok(Flow::H2cUpgrade);
                        }
                    }
                    if head.status == 101 {
                        // The connection now speaks another protocol (a
                        // websocket): what was asked ends here.
                        if let Some(x) = self.queue.front_mut() {
                            x.status = Some(101);
                        }
                        self.fail_all(ts, ErrorType::UnsupportedProtocol, out);
                        return Ok(Flow::Unsupported);
                    }
                    if (100..200).contains(&head.status) {
                        self.resp = RespState::Head(HeadBuf::default());
                        continue;
                    }
                    let Some(x) = self.queue.front_mut() else {
                        out.stats.orphan_responses += 1;
                        return Err(NotHttp);
                    };
                    let head_request = self.heads.first() == Some(&x.seq);
                    x.status = Some(head.status);
                    x.last_response_byte_ns = Some(ts);
                    x.stages.merge(&head.stages);
                    if x.provider.is_none() {
                        x.provider = head.server.as_deref().and_then(Engine::from_server_header);
                    }
                    let body = Body::for_content_type(&head.content_type, x);
                    let no_body = head_request || head.status == 204 || head.status == 304;
                    let framing = if no_body {
                        Framing::None
                    } else {
                        head.framing.unwrap_or(Framing::UntilClose)
                    };
                    let empty = matches!(framing, Framing::None | Framing::Length(0));
                    self.resp = RespState::Body {
                        framing,
                        body,
                        head_request,
                    };
                    if empty {
                        self.end_response(ts, out);
                    }
                }
                RespState::Body { framing, body, .. } => {
                    let Some(x) = self.queue.front_mut() else {
                        return Err(NotHttp);
                    };
                    let mut sink = |b: &[u8]| body.feed(x, ts, b);
                    let (used, done) = match framing {
                        Framing::Length(left) => {
                            let n = (*left).min(data.len() as u64) as usize;
                            sink(&data[..n]);
                            *left -= n as u64;
                            (n, *left == 0)
                        }
                        Framing::Chunked(c) => match c.feed(data, &mut sink) {
                            Ok(n) => (n, c.is_done()),
                            Err(_) => return Err(NotHttp),
                        },
                        Framing::UntilClose => {
                            sink(data);
                            (data.len(), false)
                        }
                        Framing::None => (0, true),
                    };
                    data = &data[used..];
                    if done {
                        self.end_response(ts, out);
                    }
                }
            }
        }
        Ok(Flow::Continue)
    }

    fn response_gap(&mut self, missing: u64) -> Result<(), NotHttp> {
        if missing == 0 {
            return Ok(());
        }
        match &mut self.resp {
            RespState::Body {
                framing: Framing::Length(left),
                body: Body::Plain { complete, .. },
                ..
            } if missing <= *left => {
                *left -= missing;
                *complete = false;
                Ok(())
            }
            _ => Err(NotHttp),
        }
    }

    /// The front exchange's response is complete at `ts`.
    fn end_response(&mut self, ts: u64, out: &mut Out<'_>) {
        let state = std::mem::replace(&mut self.resp, RespState::Head(HeadBuf::default()));
        let Some(mut x) = self.queue.pop_front() else {
            return;
        };
        if let RespState::Body {
            body, head_request, ..
        } = state
        {
            if head_request {
                self.heads.retain(|s| *s != x.seq);
            }
            out.stats.oversized += body.finish(&mut x, ts);
        }
        let end = x.last_response_byte_ns.unwrap_or(ts);
        out.emit(x.finish(end, None));
    }
}
