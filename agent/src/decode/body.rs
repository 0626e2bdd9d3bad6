//! Response bodies, whatever protocol framed them: the content type picks
//! SSE, NDJSON or a whole (bounded) JSON body, and every event is handed to
//! the exchange as its endpoint's engine format reads it.
//!
//! Owns: the body decoder of one response. Must not: know about framing
//! (Content-Length, chunks, frames), read a clock, or hold more than
//! `MAX_RESPONSE_BODY` of a plain body.

use super::{
    exchange::Exchange,
    formats::{self, interpret, Format},
    stream::{Ndjson, Sse},
    MAX_RESPONSE_BODY,
};
use crate::vocab::ShedReason;

pub enum Body {
    Sse(Sse),
    Ndjson(Ndjson),
    Plain { buf: Vec<u8>, complete: bool },
}

impl Body {
    /// The decoder for a response of `content_type` (lowercase); marks the
    /// exchange as streamed when it is an event stream.
    pub fn for_content_type(content_type: &str, x: &mut Exchange) -> Body {
        let ndjson = content_type.starts_with("application/x-ndjson")
            || content_type.starts_with("application/jsonl")
            || content_type.starts_with("application/json-seq");
        if content_type.starts_with("text/event-stream") {
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
        }
    }

    /// Whether this is a whole (non-stream) body, kept to be read at its end.
    pub fn is_plain(&self) -> bool {
        matches!(self, Body::Plain { .. })
    }

    /// Bytes a plain body keeps (0 for streams: they keep a partial line).
    pub fn kept(&self) -> usize {
        match self {
            Body::Plain { buf, .. } => buf.len(),
            _ => 0,
        }
    }

    /// Bytes of a plain body were not kept: it is not read at its end.
    pub fn cut(&mut self) {
        if let Body::Plain { complete, .. } = self {
            *complete = false;
        }
    }

    /// The memory budget wants this body's bytes back: a plain body is
    /// no longer read at its end (its record keeps timing and status,
    /// tokens unknown), a stream drops the event being assembled. The
    /// reason to count, when anything was held.
    pub fn shed(&mut self) -> Option<ShedReason> {
        match self {
            Body::Plain { buf, complete } => {
                let held = buf.capacity() > 0;
                *buf = Vec::new();
                *complete = false;
                held.then_some(ShedReason::ResponseBody)
            }
            Body::Sse(s) => s.shed().then_some(ShedReason::StreamEvent),
            Body::Ndjson(n) => n.shed().then_some(ShedReason::StreamEvent),
        }
    }

    /// Heap bytes held.
    pub fn buffered(&self) -> usize {
        match self {
            Body::Sse(s) => s.buffered(),
            Body::Ndjson(n) => n.buffered(),
            Body::Plain { buf, .. } => buf.capacity(),
        }
    }

    /// One piece of body, written at `ts`.
    #[inline]
    pub fn feed(&mut self, x: &mut Exchange, ts: u64, bytes: &[u8]) {
        let format = x.format;
        match self {
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

    /// The body ended at `ts`: read a whole body, flush a last NDJSON line.
    /// Returns how many events or bodies were too large to keep.
    pub fn finish(self, x: &mut Exchange, ts: u64) -> u64 {
        let oversized = match self {
            Body::Plain { buf, complete } => {
                if complete && !buf.is_empty() {
                    if let Some(info) = interpret(x.format, &buf) {
                        x.on_body(info);
                        x.keep_output(&buf);
                    }
                } else {
                    x.output_lost();
                }
                u64::from(buf.len() >= MAX_RESPONSE_BODY)
            }
            Body::Ndjson(mut nd) => {
                let format = x.format;
                nd.finish(&mut |line| feed_event(format, x, ts, line));
                nd.oversized()
            }
            Body::Sse(sse) => sse.oversized(),
        };
        if oversized > 0 {
            x.output_lost();
        }
        oversized
    }
}

/// One stream event (SSE data or NDJSON line).
fn feed_event(format: Format, x: &mut Exchange, ts: u64, data: &[u8]) {
    match interpret(format, data) {
        Some(info) => {
            x.on_stream_event(ts, info);
            x.keep_output(data);
        }
        None if format == Format::Unknown => {
            // Not JSON, unknown API: still a chunk with a time.
            x.on_stream_event(
                ts,
                formats::EventInfo {
                    content: formats::Content::Answer,
                    content_parts: 1,
                    ..Default::default()
                },
            )
        }
        None => {}
    }
}
