//! A request in flight (`Exchange`) and the arithmetic that turns its
//! timestamps into a [`RequestRecord`] (docs/metrics.md). Pure: every time
//! comes from event timestamps handed in by the decoder; nothing here reads
//! a clock.

use std::sync::Arc;

use super::formats::{estimate_tokens, Content, EventInfo, Format, RequestInfo};
use super::reqscan::RequestScan;
use crate::engines::Engine;
use crate::identity::{
    caller::caller_of,
    request_type::{builtin, Endpoint, Facts, Rules},
};
use crate::record::{rfc3339, Finished, KeptText, RequestRecord};
use crate::vocab::{ErrorType, T0Source, T1Source, TokenSource, TokenSources};

fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// Microseconds as seconds.
fn us_secs(us: Option<u64>) -> Option<f64> {
    us.map(|u| u as f64 / 1e6)
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
    pub provider: Option<Engine>,
    /// The response is an event stream (SSE or NDJSON).
    pub stream: bool,
    pub last_response_byte_ns: Option<u64>,
    /// The agent's own request (`crate::selftraffic`), not LLM traffic.
    pub self_request: bool,
    /// The configured tenant header's value (bounded).
    pub tenant_header: Option<String>,
    /// The presented API key's id (never the key).
    pub api_key_id: Option<String>,
    /// Values of the headers request-type rules name.
    pub rule_headers: Vec<(String, String)>,
    /// Request-type rules (None: built-in types only).
    pub types: Option<Arc<Rules>>,
    /// Keyed hash of the request body (never the body).
    pub prompt_fp: Option<u64>,
    /// When the request's first byte reached the socket (kernel receive
    /// path), when known.
    pub t_arrival: Option<u64>,
    /// `http/1.1`, `h2` or `grpc`.
    pub protocol: &'static str,
    /// The request's id where the protocol has one: Triton's `id`, the
    /// `x-request-id` header, vLLM's/SGLang's `request_id`, else the
    /// response's OpenAI `id` (bounded).
    pub request_id: Option<String>,
    /// The response called a tool.
    tool_calls: bool,
    /// Where the time went, as the engine reported it.
    pub stages: crate::decode::formats::Stages,
    /// The caller's trace context (`traceparent`).
    pub trace: Option<crate::identity::trace::TraceParent>,
    first_content_ns: Option<u64>,
    first_reasoning_ns: Option<u64>,
    first_answer_ns: Option<u64>,
    last_content_ns: Option<u64>,
    gaps: Vec<f64>,
    content_events: u64,
    response_model: Option<String>,
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    /// Where `input_tokens`/`output_tokens` came from.
    input_source: TokenSource,
    output_source: TokenSource,
    finish_reason: Option<String>,
    stream_error: bool,
    /// The stream's own end marker was written (`data: [DONE]`, Ollama
    /// `done`, llama.cpp `stop`): the answer is complete even if the HTTP
    /// framing after it never is.
    stream_ended: bool,
    /// The request's text, kept for the engine's tokenizer (only for the
    /// processes `IdentityConfig::text_pids` names).
    pub text: Option<Box<KeptText>>,
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
            self_request: false,
            tenant_header: None,
            api_key_id: None,
            rule_headers: Vec::new(),
            types: None,
            prompt_fp: None,
            t_arrival: None,
            protocol: "http/1.1",
            request_id: None,
            tool_calls: false,
            first_content_ns: None,
            stages: crate::decode::formats::Stages::default(),
            trace: None,
            first_reasoning_ns: None,
            first_answer_ns: None,
            last_content_ns: None,
            gaps: Vec::new(),
            content_events: 0,
            response_model: None,
            input_tokens: None,
            output_tokens: None,
            input_source: TokenSource::Engine,
            output_source: TokenSource::Engine,
            finish_reason: None,
            text: None,
            stream_error: false,
            stream_ended: false,
        }
    }

    /// One stream event, carried by the write at `ts_ns`.
    /// The stream's end marker (OpenAI `data: [DONE]`).
    pub fn on_stream_end(&mut self) {
        self.stream_ended = true;
    }

    /// What the GPU join needs of a request still in flight.
    /// Whether this exchange can end as an LLM request (a `POST` of an
    /// operation the decoder knows; its status decides the rest, at the
    /// end: `Finished::non_llm_route`). Only those count as in flight and
    /// take a share of GPU energy.
    pub fn may_be_llm(&self) -> bool {
        self.format.operation().is_some() && self.method.eq_ignore_ascii_case("POST")
    }

    pub fn in_flight(&self) -> crate::record::InFlight {
        crate::record::InFlight {
            seq: self.seq,
            pid: self.pid,
            t0_ns: self.t0_ns,
            content_events: self.content_events,
        }
    }

    /// Content-bearing stream events so far.
    pub fn content_events(&self) -> u64 {
        self.content_events
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

    /// The scan of this request's body (keeping the body itself when the
    /// request's text is kept).
    pub fn request_scan(&self, fields: &[String]) -> Box<RequestScan> {
        let mut scan = Box::new(RequestScan::new(fields));
        if self.text.is_some() {
            scan.keep_body();
        }
        scan
    }

    /// The request body ended: what it said, its fingerprint, and the
    /// body itself where kept.
    pub fn read_request(&mut self, mut scan: Box<RequestScan>) {
        if scan.is_empty() {
            return;
        }
        if let Some(t) = self.text.as_mut() {
            t.body = scan.take_body();
        }
        (self.request, self.prompt_fp) = scan.finish();
    }

    /// A stream event or whole body (`json`) as written: its generated
    /// text is kept where the request's text is.
    pub fn keep_output(&mut self, json: &[u8]) {
        if let Some(t) = self.text.as_mut() {
            if !t.output_lost {
                super::formats::generated_text(self.format, json, t);
            }
        }
    }

    /// A response event could not be read whole: its text is lost.
    pub fn output_lost(&mut self) {
        if let Some(t) = self.text.as_mut() {
            t.output_lost = true;
            t.outputs = Vec::new();
        }
    }

    /// Heap bytes its kept text holds.
    pub fn text_held(&self) -> usize {
        self.text.as_ref().map_or(0, |t| t.held())
    }

    /// The memory budget takes its kept text back. Whether any was held.
    pub fn shed_text(&mut self) -> bool {
        self.text.as_mut().is_some_and(|t| t.shed())
    }

    /// A whole non-streamed body.
    pub fn on_body(&mut self, info: EventInfo<'_>) {
        self.absorb(info);
    }

    fn absorb(&mut self, info: EventInfo<'_>) {
        self.tool_calls |= info.tool_calls || info.content == Content::Tool;
        if self.request_id.is_none() {
            if let Some(id) = info.response_id {
                self.request_id = crate::identity::caller::bounded_value(id.as_bytes());
            }
        }
        if let Some(m) = info.model {
            if self.response_model.as_deref() != Some(m.as_ref()) {
                self.response_model = Some(m.into_owned());
            }
        }
        let from = |usage: bool| {
            if usage {
                TokenSource::Usage
            } else {
                TokenSource::Engine
            }
        };
        if info.input_tokens.is_some() {
            self.input_tokens = info.input_tokens;
            self.input_source = from(info.input_from_usage);
        }
        if info.output_tokens.is_some() {
            self.output_tokens = info.output_tokens;
            self.output_source = from(info.output_from_usage);
        }
        if let Some(f) = info.finish_reason {
            self.finish_reason = Some(f.into_owned());
        }
        self.stream_error |= info.error;
        self.stages.merge(&info.stages);
    }

    /// Finish the request. `end_ns`: when it ended (last byte, or the
    /// disconnect); `error`: why it failed, if the transport says so.
    pub fn finish(mut self, end_ns: u64, error: Option<ErrorType>) -> Finished {
        let error_type = match (self.status, error) {
            (_, Some(e)) => Some(e),
            (Some(429), None) => Some(ErrorType::Http429),
            (Some(s), None) if (400..500).contains(&s) => Some(ErrorType::Http4xx),
            (Some(s), None) if s >= 500 => Some(ErrorType::Http5xx),
            _ if self.stream_error => Some(ErrorType::StreamError),
            _ => None,
        };
        // t0: the arrival of the request's first byte when the kernel
        // reported it (time unread in the socket counts), else its read.
        let (t0, t0_source, queue_s) = match self.t_arrival {
            Some(a) if a <= self.t0_ns => (a, T0Source::Arrival, Some(secs(self.t0_ns - a))),
            _ => (self.t0_ns, T0Source::Read, None),
        };
        let since_t0 = |ns: u64| secs(ns.saturating_sub(t0));
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
        let source =
            |exact: Option<u64>, given: TokenSource, counted: Option<u64>| match (exact, counted) {
                (Some(_), _) => Some(given),
                (None, Some(_)) => Some(TokenSource::Estimate),
                (None, None) => None,
            };
        let tokens_source = TokenSources::of(
            source(self.input_tokens, self.input_source, in_tokens),
            source(exact_out, self.output_source, out_tokens),
        );
        // TTFT and TPOT are kept whatever happened after the first content
        // (a client that gave up, a reset, an error event): the outcome is
        // in `error_type`; dropping them would hide the slow requests users
        // abandon (survivorship bias).
        let ttft_s = if self.stream {
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
            (true, Some(t1), Some(tn), Some(n)) if n > 1 => {
                Some(secs(tn.saturating_sub(t1)) / (n - 1) as f64)
            }
            _ => None,
        };
        let reasoning_first = matches!((self.first_reasoning_ns, self.first_answer_ns), (Some(r), a) if a.is_none_or(|a| r < a));
        let last = self.last_response_byte_ns.unwrap_or(end_ns);
        let request_type = {
            let facts = Facts {
                path: &self.path,
                endpoint: endpoint(self.format),
                model: self
                    .request
                    .model
                    .as_deref()
                    .or(self.response_model.as_deref()),
                input_tokens: in_tokens,
                headers: &self.rule_headers,
                json_fields: &self.request.json_fields,
                tools_offered: self.request.tools_offered,
                tool_calls: self.tool_calls,
            };
            if let (Some(rules), Some(t)) = (&self.types, self.text.as_mut()) {
                t.types_by_input = rules.by_input_tokens(&facts);
            }
            match &self.types {
                Some(rules) => rules.classify(&facts),
                None => builtin(&facts).map(str::to_string),
            }
        };
        let caller = self.client.as_deref().and_then(caller_of);
        let text = self.text.map(|mut t| {
            if let (Some(a), Some(b)) = (self.first_content_ns, self.last_content_ns) {
                t.content_span_s = Some(secs(b.saturating_sub(a)));
            }
            t
        });
        let record = RequestRecord {
            ts: rfc3339(t0),
            pid: self.pid,
            container_id: None,
            k8s_pod_uid: None,
            k8s_pod_name: None,
            k8s_namespace: None,
            server_port: self.server_port,
            client: self.client,
            tenant: self.tenant_header.or(self.request.user),
            caller,
            api_key_id: self.api_key_id,
            request_type,
            method: self.method,
            path: self.path,
            status: self.status,
            operation: self.format.operation(),
            provider: self.provider.map(|e| e.name().to_string()),
            // Identity of the serving process: an enricher's.
            container_image: None,
            container_image_id: None,
            model_version: None,
            engine_version: None,
            serving_config_version: None,
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
            tokens_source,
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
            t0_ns: t0,
            t0_source: Some(t0_source),
            t1_source: self.last_response_byte_ns.map(|_| T1Source::Write),
            engine_queue_s: us_secs(self.stages.engine_queue_us),
            prefill_s: us_secs(self.stages.prefill_us),
            decode_s: us_secs(self.stages.decode_us),
            model_load_s: us_secs(self.stages.model_load_us),
            cached_input_tokens: self.stages.cached_input_tokens,
            stages_source: self.stages.source,
            trace_id: self.trace.map(|t| crate::identity::trace::hex(&t.trace_id)),
            parent_span_id: self
                .trace
                .map(|t| crate::identity::trace::hex(&t.parent_id)),
            span_id: None,
            role: None,
            gateway_s: None,
            gateway_return_s: None,
            gateway: None,
            gateway_pid: None,
            gateway_port: None,
            protocol: Some(self.protocol),
            request_id: self.request_id,
            queue_s,
            gpu_uuids: None,
            gpu_util_avg: None,
            gpu_mem_used_bytes: None,
            energy_j: None,
            energy_source: None,
        };
        Finished {
            record,
            self_request: self.self_request,
            seq: self.seq,
            content_events: self.content_events,
            chunk_gaps_s: self.gaps,
            prompt_fp: self.prompt_fp,
            text,
        }
    }
}

/// What an API format says a request is, for the built-in request types.
fn endpoint(f: Format) -> Endpoint {
    match f {
        Format::OpenAiChat | Format::OllamaChat | Format::OpenAiResponses => Endpoint::Chat,
        Format::OpenAiCompletions
        | Format::LlamaCppCompletion
        | Format::TgiGenerate
        | Format::OllamaGenerate
        | Format::TritonGenerate
        | Format::TritonGrpc
        | Format::VllmGrpc
        | Format::SglangGrpc => Endpoint::Completion,
        Format::OpenAiEmbeddings => Endpoint::Embedding,
        Format::Unknown => Endpoint::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let f = x.finish(1_310_000_000, None);
        let r = &f.record;
        assert!((r.ttft_s.unwrap() - 0.2).abs() < 1e-9);
        assert!((r.tpot_s.unwrap() - 0.05 / 4.0).abs() < 1e-9);
        assert!((r.duration_s.unwrap() - 0.31).abs() < 1e-9);
        assert_eq!(r.chunks, Some(3));
        assert_eq!(f.chunk_gaps_s.len(), 1);
        assert!(r.tokens_exact);
        assert_eq!(
            serde_json::to_value(r.tokens_source).unwrap(),
            serde_json::json!("engine")
        );
        assert_eq!(r.error_type, None);
    }

    #[test]
    fn failures_before_any_content_have_no_ttft_and_unknown_tokens_are_null_not_zero() {
        let mut x = Exchange::new(1, 1, None, None, "POST", "/v1/chat/completions", 0);
        x.status = Some(429);
        let r = x.finish(10, None).record;
        assert_eq!(r.error_type, Some(ErrorType::Http429));
        assert_eq!(r.ttft_s, None);
        assert_eq!(r.output_tokens, None);
        assert_eq!(r.input_tokens, None);
        assert!(!r.tokens_exact);
        assert_eq!(r.tokens_source, None, "no count, no source");
    }

    #[test]
    fn a_stream_that_fails_after_its_first_tokens_keeps_ttft_and_tpot() {
        let mut x = Exchange::new(1, 1, None, None, "POST", "/v1/chat/completions", 0);
        x.status = Some(200);
        x.stream = true;
        x.on_stream_event(100, content(Content::Answer));
        x.on_stream_event(300, content(Content::Answer));
        x.on_stream_event(500, content(Content::Answer));
        x.last_response_byte_ns = Some(500);
        let r = x.finish(600, Some(ErrorType::ClientDisconnect)).record;
        assert_eq!(r.error_type, Some(ErrorType::ClientDisconnect));
        assert_eq!(r.ttft_s, Some(100e-9));
        assert_eq!(r.tpot_s, Some(200e-9));
        assert_eq!(r.ttft_answer_s, Some(100e-9));
        assert_eq!(r.output_tokens, Some(3));
        assert_eq!(
            serde_json::to_value(r.tokens_source).unwrap(),
            serde_json::json!("estimate"),
            "three chunks counted"
        );
    }

    #[test]
    fn token_sources_are_named_per_direction_when_they_differ() {
        // The usage object names the input only; the output is counted.
        let mut x = Exchange::new(1, 1, None, None, "POST", "/v1/chat/completions", 0);
        x.status = Some(200);
        x.stream = true;
        x.on_stream_event(100, content(Content::Answer));
        x.on_stream_event(
            200,
            EventInfo {
                input_tokens: Some(7),
                input_from_usage: true,
                ..EventInfo::default()
            },
        );
        let r = x.finish(300, None).record;
        assert!(!r.tokens_exact);
        assert_eq!(
            serde_json::to_value(r.tokens_source).unwrap(),
            serde_json::json!({"input": "usage", "output": "estimate"})
        );
    }
}
