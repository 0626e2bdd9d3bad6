//! Request lifecycle → one [`RequestRecord`] per request: the arithmetic
//! of the metric definitions (docs/metrics.md). Pure: every time comes from
//! event timestamps handed in by `decode`; nothing here reads a clock.

use std::time::{Duration, UNIX_EPOCH};

use serde::Serialize;

use crate::decode::engines::{estimate_tokens, Content, EventInfo, Format, RequestInfo};

/// One finished request: the request log's line (keys are a contract).
/// `None` serialises as `null` and means unknown / not applicable.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RequestRecord {
    /// RFC 3339 UTC time of t0 (the first request byte read).
    pub ts: String,
    pub pid: u32,
    pub server_port: Option<u16>,
    pub client: Option<String>,
    pub method: String,
    pub path: String,
    pub status: Option<u16>,
    pub operation: Option<&'static str>,
    pub provider: Option<&'static str>,
    pub request_model: Option<String>,
    pub response_model: Option<String>,
    pub stream: bool,
    pub ttft_s: Option<f64>,
    pub tpot_s: Option<f64>,
    pub duration_s: Option<f64>,
    /// Content-bearing stream events (streams only).
    pub chunks: Option<u64>,
    pub input_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
    /// Both token counts came from the server's own report.
    pub tokens_exact: bool,
    pub finish_reason: Option<String>,
    pub error_type: Option<String>,
    /// Time to the first reasoning token, when reasoning preceded answer
    /// content (then `ttft_s` is the same instant, and `ttft_answer_s` says
    /// when the answer began).
    pub ttft_reasoning_s: Option<f64>,
    /// Time to the first non-reasoning content (answer or tool call).
    pub ttft_answer_s: Option<f64>,
    /// Nanosecond t0, for joins and replays.
    pub t0_ns: u64,
    /// Gaps between consecutive content-bearing writes, in seconds (for
    /// the metrics stage; not written to the request log).
    #[serde(skip)]
    pub chunk_gaps_s: Vec<f64>,
}

/// Writes the request log: JSON Lines, one [`RequestRecord`] per line.
/// It holds no prompt or completion text, only metadata and numbers.
pub struct RequestLog {
    out: std::io::BufWriter<Box<dyn std::io::Write + Send>>,
    pub records: u64,
}

impl RequestLog {
    /// `-` writes to stdout; a path is appended to (a log survives restarts).
    pub fn create(path: &std::path::Path) -> anyhow::Result<Self> {
        use anyhow::Context as _;
        let sink: Box<dyn std::io::Write + Send> = if path.as_os_str() == "-" {
            Box::new(std::io::stdout())
        } else {
            Box::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .with_context(|| format!("cannot open request log {}", path.display()))?,
            )
        };
        Ok(Self {
            out: std::io::BufWriter::new(sink),
            records: 0,
        })
    }

    pub fn write(&mut self, r: &RequestRecord) -> anyhow::Result<()> {
        use std::io::Write as _;
        serde_json::to_writer(&mut self.out, r)?;
        self.out.write_all(b"\n")?;
        self.records += 1;
        Ok(())
    }

    pub fn flush(&mut self) -> anyhow::Result<()> {
        use std::io::Write as _;
        self.out.flush()?;
        Ok(())
    }
}

/// RFC 3339 UTC with microseconds.
pub fn rfc3339(ns: u64) -> String {
    humantime::format_rfc3339_micros(UNIX_EPOCH + Duration::from_nanos(ns)).to_string()
}

fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// Where a request is in its life; built by `decode`, finished into a
/// record exactly once.
#[derive(Clone, Debug)]
pub struct Exchange {
    pub seq: u64,
    pub pid: u32,
    pub server_port: Option<u16>,
    pub client: Option<String>,
    pub method: String,
    pub path: String,
    pub format: Format,
    pub t0_ns: u64,
    pub request: RequestInfo,
    pub status: Option<u16>,
    pub provider: Option<&'static str>,
    /// The response is an event stream (SSE or NDJSON).
    pub stream: bool,
    pub last_response_byte_ns: Option<u64>,
    first_content_ns: Option<u64>,
    first_reasoning_ns: Option<u64>,
    first_answer_ns: Option<u64>,
    last_content_ns: Option<u64>,
    gaps: Vec<f64>,
    content_events: u64,
    response_model: Option<String>,
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    finish_reason: Option<String>,
    stream_error: bool,
    /// The stream's own end marker was written (`data: [DONE]`, Ollama
    /// `done`, llama.cpp `stop`): the answer is complete even if the HTTP
    /// framing after it never is.
    stream_ended: bool,
}

impl Exchange {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        seq: u64,
        pid: u32,
        server_port: Option<u16>,
        client: Option<String>,
        method: &str,
        path: &str,
        t0_ns: u64,
    ) -> Self {
        let format = Format::from_path(path);
        Self {
            seq,
            pid,
            server_port,
            client,
            method: method.to_string(),
            path: path.to_string(),
            format,
            t0_ns,
            request: RequestInfo::default(),
            status: None,
            provider: format.provider(),
            stream: false,
            last_response_byte_ns: None,
            first_content_ns: None,
            first_reasoning_ns: None,
            first_answer_ns: None,
            last_content_ns: None,
            gaps: Vec::new(),
            content_events: 0,
            response_model: None,
            input_tokens: None,
            output_tokens: None,
            finish_reason: None,
            stream_error: false,
            stream_ended: false,
        }
    }

    /// One stream event, carried by the write at `ts_ns`.
    /// The stream's end marker (OpenAI `data: [DONE]`).
    pub fn on_stream_end(&mut self) {
        self.stream_ended = true;
    }

    /// Whether the stream's end marker has been written.
    pub fn stream_ended(&self) -> bool {
        self.stream_ended
    }

    pub fn on_stream_event(&mut self, ts_ns: u64, info: EventInfo<'_>) {
        self.stream_ended |= info.end_of_stream;
        if info.content != Content::None {
            if self.first_content_ns.is_none() {
                self.first_content_ns = Some(ts_ns);
            }
            match info.content {
                Content::Reasoning => {
                    self.first_reasoning_ns.get_or_insert(ts_ns);
                }
                _ => {
                    self.first_answer_ns.get_or_insert(ts_ns);
                }
            }
            // Gaps are per write: several events in one write are one chunk
            // arrival for the client.
            if let Some(last) = self.last_content_ns {
                if ts_ns != last {
                    self.gaps.push(secs(ts_ns.saturating_sub(last)));
                }
            }
            self.last_content_ns = Some(ts_ns);
            self.content_events += info.content_parts.max(1) as u64;
        }
        self.absorb(info);
    }

    /// A whole non-streamed body.
    pub fn on_body(&mut self, info: EventInfo<'_>) {
        self.absorb(info);
    }

    fn absorb(&mut self, info: EventInfo<'_>) {
        if let Some(m) = info.model {
            if self.response_model.as_deref() != Some(m.as_ref()) {
                self.response_model = Some(m.into_owned());
            }
        }
        if info.input_tokens.is_some() {
            self.input_tokens = info.input_tokens;
        }
        if info.output_tokens.is_some() {
            self.output_tokens = info.output_tokens;
        }
        if let Some(f) = info.finish_reason {
            self.finish_reason = Some(f.into_owned());
        }
        self.stream_error |= info.error;
    }

    /// Finish the request. `end_ns`: when it ended (last byte, or the
    /// disconnect); `error`: why it failed, if the transport says so.
    pub fn finish(self, end_ns: u64, error: Option<&str>) -> RequestRecord {
        let error_type = match (self.status, error) {
            (_, Some(e)) => Some(e.to_string()),
            (Some(429), None) => Some("http_429".to_string()),
            (Some(s), None) if (400..500).contains(&s) => Some("http_4xx".to_string()),
            (Some(s), None) if s >= 500 => Some("http_5xx".to_string()),
            _ if self.stream_error => Some("stream_error".to_string()),
            _ => None,
        };
        let ok = error_type.is_none() && self.status.is_some_and(|s| (200..300).contains(&s));
        let since_t0 = |ns: u64| secs(ns.saturating_sub(self.t0_ns));
        let exact_out = self.output_tokens;
        let out_tokens = match self.format {
            Format::OpenAiEmbeddings => None,
            Format::Unknown => exact_out,
            _ if exact_out.is_some() => exact_out,
            _ if self.stream && self.content_events > 0 => Some(self.content_events),
            _ => None,
        };
        let in_tokens = self.input_tokens.or_else(|| {
            (self.format != Format::Unknown)
                .then_some(self.request.prompt_chars.map(estimate_tokens))
                .flatten()
        });
        let tokens_exact = self.input_tokens.is_some()
            && (exact_out.is_some() || self.format == Format::OpenAiEmbeddings);
        let ttft_s = if self.stream && ok {
            self.first_content_ns.map(since_t0)
        } else {
            None
        };
        let tpot_s = match (
            self.stream,
            self.first_content_ns,
            self.last_content_ns,
            out_tokens,
        ) {
            (true, Some(t1), Some(tn), Some(n)) if n > 1 && ok => {
                Some(secs(tn.saturating_sub(t1)) / (n - 1) as f64)
            }
            _ => None,
        };
        let reasoning_first = matches!((self.first_reasoning_ns, self.first_answer_ns), (Some(r), a) if a.is_none_or(|a| r < a));
        let last = self.last_response_byte_ns.unwrap_or(end_ns);
        RequestRecord {
            ts: rfc3339(self.t0_ns),
            pid: self.pid,
            server_port: self.server_port,
            client: self.client,
            method: self.method,
            path: self.path,
            status: self.status,
            operation: self.format.operation(),
            provider: self.provider,
            request_model: self.request.model,
            response_model: self.response_model,
            stream: self.stream,
            ttft_s,
            tpot_s,
            duration_s: Some(since_t0(last)),
            chunks: self.stream.then_some(self.content_events),
            input_tokens: in_tokens,
            output_tokens: out_tokens,
            tokens_exact,
            finish_reason: self.finish_reason,
            error_type,
            ttft_reasoning_s: if ttft_s.is_some() && reasoning_first {
                self.first_reasoning_ns.map(since_t0)
            } else {
                None
            },
            ttft_answer_s: if ttft_s.is_some() {
                self.first_answer_ns.map(since_t0)
            } else {
                None
            },
            t0_ns: self.t0_ns,
            chunk_gaps_s: self.gaps,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_is_utc_with_micros() {
        assert_eq!(
            rfc3339(1_700_000_000_123_456_789),
            "2023-11-14T22:13:20.123456Z"
        );
    }

    fn content(c: Content) -> EventInfo<'static> {
        EventInfo {
            content: c,
            content_parts: 1,
            ..EventInfo::default()
        }
    }

    #[test]
    fn ttft_tpot_and_gaps_follow_the_definitions() {
        let mut x = Exchange::new(
            1,
            1,
            Some(80),
            None,
            "POST",
            "/v1/chat/completions",
            1_000_000_000,
        );
        x.status = Some(200);
        x.stream = true;
        x.on_stream_event(1_100_000_000, content(Content::None)); // role-only
        x.on_stream_event(1_200_000_000, content(Content::Answer));
        x.on_stream_event(1_200_000_000, content(Content::Answer)); // same write
        x.on_stream_event(1_250_000_000, content(Content::Answer));
        x.on_stream_event(
            1_300_000_000,
            EventInfo {
                input_tokens: Some(5),
                output_tokens: Some(5),
                ..EventInfo::default()
            },
        );
        x.last_response_byte_ns = Some(1_310_000_000);
        let r = x.finish(1_310_000_000, None);
        assert!((r.ttft_s.unwrap() - 0.2).abs() < 1e-9);
        assert!((r.tpot_s.unwrap() - 0.05 / 4.0).abs() < 1e-9);
        assert!((r.duration_s.unwrap() - 0.31).abs() < 1e-9);
        assert_eq!(r.chunks, Some(3));
        assert_eq!(r.chunk_gaps_s.len(), 1);
        assert!(r.tokens_exact);
        assert_eq!(r.error_type, None);
    }

    #[test]
    fn failures_have_no_ttft_and_unknown_tokens_are_null_not_zero() {
        let mut x = Exchange::new(1, 1, None, None, "POST", "/v1/chat/completions", 0);
        x.status = Some(429);
        let r = x.finish(10, None);
        assert_eq!(r.error_type.as_deref(), Some("http_429"));
        assert_eq!(r.ttft_s, None);
        assert_eq!(r.output_tokens, None);
        assert_eq!(r.input_tokens, None);
        assert!(!r.tokens_exact);
    }
}
