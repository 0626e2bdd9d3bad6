//! The request record: the output contract of decoding, one per finished
//! request (the request log's line; keys are a contract, see
//! docs/metrics.md), and the pipeline's message to enrichers and sinks.
//!
//! Owns: the record's fields and their serialisation, what counts as an
//! LLM request (`RouteClass`). Must not: depend on `decode` (the decoder
//! builds records; records know nothing of how) or on any stage or sink
//! (`sinks::requests_log` writes records), or carry prompt or completion
//! text.

use std::time::{Duration, UNIX_EPOCH};

use serde::Serialize;

use crate::vocab::ErrorType;

/// One finished request: the request log's line (keys are a contract).
/// `None` serialises as `null` and means unknown / not applicable.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RequestRecord {
    /// RFC 3339 UTC time of t0: when the request's first byte reached the
    /// engine's socket (`t0_source` "arrival"), else when the engine read
    /// it ("read").
    pub ts: String,
    pub pid: u32,
    /// `container.id` of the engine's container (64 hex), from its cgroup;
    /// null outside a container or when the process is unknown (replay).
    pub container_id: Option<String>,
    /// `k8s.pod.uid` of the engine's pod, from its cgroup path.
    pub k8s_pod_uid: Option<String>,
    /// The engine container's image as its pod's status names it
    /// (`container.image.name`, with its tag) and the image's id there
    /// (`oci.manifest.digest`: the digest the runtime pulled); with
    /// `--kube-metadata` only, else null.
    pub container_image: Option<String>,
    pub container_image_id: Option<String>,
    /// The engine pod's name and namespace, from the Kubernetes API with
    /// `--kube-metadata`; null without it, or until the API has answered.
    pub k8s_pod_name: Option<String>,
    pub k8s_namespace: Option<String>,
    pub server_port: Option<u16>,
    pub client: Option<String>,
    /// Who the request is for: the first configured tenant header present
    /// (`--tenant-header`), else the body's OpenAI `user` field; at most
    /// 128 bytes (longer values end with `…`).
    pub tenant: Option<String>,
    /// The peer's IP address (`client` without its port); with
    /// `--kube-metadata`, the calling pod's `namespace/name` when the peer
    /// is a pod of the cluster.
    pub caller: Option<String>,
    /// The first 12 hex digits of HMAC-SHA256(install key, API key) of the
    /// bearer token or `api-key` / `x-api-key` header; never the key.
    pub api_key_id: Option<String>,
    /// The first matching config rule's type, else a built-in (`chat`,
    /// `completion`, `embedding`, `tool_call`, `batch`); null for an API
    /// the decoder does not know.
    pub request_type: Option<String>,
    pub method: String,
    pub path: String,
    pub status: Option<u16>,
    pub operation: Option<crate::vocab::Operation>,
    /// The engine (gen_ai.provider.name): from the API, the `Server`
    /// header, or the process's command line (an enricher). Owned: identity
    /// is known only at run time.
    pub provider: Option<String>,
    /// What the engine serves, as a short stable fingerprint (engine,
    /// served model names, model paths and files; or the engine's
    /// `TOKENTAP_MODEL_VERSION`), from the `ModelVersion` enricher; null
    /// when the serving process is unknown to the agent (e.g. in replay).
    pub model_version: Option<String>,
    /// The engine's build (its version string): from its info endpoint,
    /// else its installed package's metadata; null when neither says (or
    /// the serving process is unknown to the agent).
    pub engine_version: Option<String>,
    /// The serving process's configuration, as a short version (12 hex):
    /// its command-line flags that change serving (secrets never in it)
    /// and the effective settings its info endpoint reports.
    pub serving_config_version: Option<String>,
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
    /// Where the counts came from: `usage`, `engine` (another report of
    /// the engine's own) or `estimate`; per direction when they differ.
    pub tokens_source: Option<crate::vocab::TokenSources>,
    pub finish_reason: Option<String>,
    pub error_type: Option<ErrorType>,
    /// Time to the first reasoning token, when reasoning preceded answer
    /// content (then `ttft_s` is the same instant, and `ttft_answer_s` says
    /// when the answer began).
    pub ttft_reasoning_s: Option<f64>,
    /// Time to the first non-reasoning content (answer or tool call).
    pub ttft_answer_s: Option<f64>,
    /// Nanosecond t0, for joins and replays.
    pub t0_ns: u64,
    /// What t0 is: `arrival` (the first request byte reached the engine's
    /// socket, from the kernel's TCP receive path: `ttft_s` and
    /// `duration_s` include the time it waited unread) or `read` (the
    /// engine's first read of it: arrival unknown — a connection open
    /// before the agent started, arrival tracing off, a replay of a capture
    /// without arrivals).
    pub t0_source: Option<crate::vocab::T0Source>,
    /// What the response's write times (the first token's, the last
    /// byte's) are: `write`
    /// (the engine's socket write: plaintext, or the ciphertext's write
    /// inside OpenSSL's `SSL_write` over a socket BIO) or `ssl_write` (the
    /// `SSL_write` call of an engine whose event loop sends the ciphertext
    /// itself a few microseconds later: asyncio/uvicorn's memory BIOs).
    /// `null` when nothing of a response was written.
    pub t1_source: Option<crate::vocab::T1Source>,
    /// The engine's own report of where the time went (its clocks, read
    /// from what it puts on the wire; `null` when it does not say):
    /// waiting in its scheduler (`engine_queue_s`), prompt processing up to
    /// the first token (`prefill_s`), generating the rest (`decode_s`),
    /// loading the model (`model_load_s`, Ollama), prompt tokens served
    /// from its prefix cache (`cached_input_tokens`), and which engine
    /// field said so (`stages_source`: `llamacpp_timings`, `ollama`,
    /// `openai_usage`, `tgi_headers`, `vllm_metrics`, or several joined by
    /// `+`).
    pub engine_queue_s: Option<f64>,
    pub prefill_s: Option<f64>,
    pub decode_s: Option<f64>,
    pub model_load_s: Option<f64>,
    pub cached_input_tokens: Option<u64>,
    pub stages_source: Option<crate::vocab::StagesSource>,
    /// The caller's W3C trace context (`traceparent`): its trace id and
    /// span (the parent of the request's span). `null` without a valid
    /// header.
    pub trace_id: Option<String>,
    pub parent_span_id: Option<String>,
    /// The id of this request's span, set when another record's span is
    /// its child (a gateway's request, whose engine request it forwarded).
    /// `null` otherwise: the span exporter then picks one.
    pub span_id: Option<String>,
    /// `gateway`: a reverse proxy's request whose forwarded request the
    /// engine's record also shows (one user request seen at two hops: the
    /// LLM counters, tokens and timeline count the engine's only);
    /// `engine`: that engine's record. `null` when no gateway was joined.
    pub role: Option<crate::vocab::ServingRole>,
    /// Through a gateway that is a target too (both records carry these):
    /// the gateway's request arrival → the engine's (`gateway_s`), the
    /// engine's first content write → the gateway's (`gateway_return_s`),
    /// the gateway process (`gateway`: its name, `gateway_pid`) and the
    /// port it served the request on (`gateway_port`).
    pub gateway_s: Option<f64>,
    pub gateway_return_s: Option<f64>,
    pub gateway: Option<String>,
    pub gateway_pid: Option<u32>,
    pub gateway_port: Option<u16>,
    /// Time the request waited in the socket before the engine read its
    /// first byte (s): first read − arrival. Null when t0 is the read.
    pub queue_s: Option<f64>,
    /// The protocol the request came in: `http/1.1`, `h2` (HTTP/2, any
    /// API but gRPC) or `grpc`.
    pub protocol: Option<&'static str>,
    /// The request's own id where the protocol carries one: Triton's `id`,
    /// vLLM's and SGLang's gRPC `request_id`, the `x-request-id` header,
    /// else the OpenAI response `id` (bounded to 128 bytes).
    pub request_id: Option<String>,
    /// The serving engine's GPUs (UUIDs), from the GPU join; null when GPU
    /// sampling is off or the engine has no process on a GPU.
    pub gpu_uuids: Option<Vec<String>>,
    /// Mean GPU utilisation (0–1) of those GPUs over the request's
    /// lifetime, time-weighted over the samples inside it; null if none.
    pub gpu_util_avg: Option<f64>,
    /// GPU memory held by the engine's processes at the request's end.
    pub gpu_mem_used_bytes: Option<u64>,
    /// The request's share of its engine's GPU energy (docs/metrics.md).
    pub energy_j: Option<f64>,
    /// Where `energy_j` came from: `counter` (the GPUs' energy counters) or
    /// `power` (power × time, where a counter is unsupported or reset).
    pub energy_source: Option<String>,
}

/// A finished request as the pipeline carries it: the record (what the log
/// writes) plus data only the metrics use, which is not part of the log
/// schema.
#[derive(Clone, Debug, PartialEq)]
pub struct Finished {
    pub record: RequestRecord,
    /// The decoder's id of this request (unique per run), joining it to
    /// what was observed while it was in flight ([`InFlight`]).
    pub seq: u64,
    /// Content-bearing stream events written (0 for a non-streamed body).
    pub content_events: u64,
    /// The agent made this request itself (`crate::selftraffic`): counted,
    /// never written or exported as a request.
    pub self_request: bool,
    /// Gaps between consecutive content-bearing writes, in seconds.
    pub chunk_gaps_s: Vec<f64>,
    /// A keyed hash of the request body (`decode::body_fingerprint`): equal
    /// for byte-identical bodies within this process, meaningless outside
    /// it; never written or exported. The retry-storm detector's input.
    pub prompt_fp: Option<u64>,
    /// The request's text, kept only for a process whose tokenizer the
    /// agent holds and only until the tokenizer stage counted it; never
    /// written or exported.
    pub text: Option<Box<KeptText>>,
}

/// What the engine's tokenizer needs of one request (`pipeline::tokens`):
/// the request body as sent, and the generated text per choice. Within the
/// decoder's memory budget, which sheds it first (`tokenize_text`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KeptText {
    /// The whole request body; None when it was not kept whole (cut by
    /// the capture, larger than [`KeptText::MAX_BYTES`], or shed).
    pub body: Option<Vec<u8>>,
    /// The generated text (content, reasoning, tool-call names and
    /// arguments), per choice index.
    pub outputs: Vec<String>,
    /// Part of the output was not kept (larger than the bound, shed, a
    /// stream event that was not read): its count stays the estimate.
    pub output_lost: bool,
    /// Seconds from the first content write to the last (TPOT's span).
    pub content_span_s: Option<f64>,
    /// The output called a tool: the wire carries the call's name and
    /// arguments, not the model's own markup around them (which the
    /// tokenizer stage has the chat template write back).
    pub tool_calls: bool,
    /// The first choice's tool calls as streamed: (name, arguments), by
    /// the call's index; empty when another choice called one.
    pub calls: Vec<(String, String)>,
    /// The request's type by its input tokens, when a configured rule
    /// looks at them: classified again with the exact count.
    pub types_by_input: Option<TypesByInput>,
}

/// A request's `request_type` as a function of its input tokens: the
/// first `(min, max, type)` whose inclusive range holds the count
/// (`identity::request_type::Rules::by_input_tokens`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TypesByInput(pub Vec<(u64, u64, Option<String>)>);

impl TypesByInput {
    pub fn pick(&self, n: u64) -> Option<String> {
        self.0
            .iter()
            .find(|(lo, hi, _)| (*lo..=*hi).contains(&n))
            .and_then(|(_, _, t)| t.clone())
    }
}

impl KeptText {
    /// Bytes of one direction kept at most (a 100k-token prompt is about
    /// 400 kB of JSON).
    pub const MAX_BYTES: usize = 1 << 20;
    /// Choices whose text is kept (n > 1).
    pub const MAX_CHOICES: usize = 16;

    /// Heap bytes held.
    pub fn held(&self) -> usize {
        self.body.as_ref().map_or(0, Vec::capacity)
            + self.outputs.iter().map(String::capacity).sum::<usize>()
            + self
                .calls
                .iter()
                .map(|(n, a)| n.capacity() + a.capacity())
                .sum::<usize>()
    }

    /// Appends generated `text` of choice `index`, within the bounds.
    pub fn push_output(&mut self, index: usize, text: &str) {
        if self.output_lost || text.is_empty() {
            return;
        }
        let total: usize = self.outputs.iter().map(String::len).sum();
        if index >= Self::MAX_CHOICES || total + text.len() > Self::MAX_BYTES {
            self.output_lost = true;
            self.outputs = Vec::new();
            return;
        }
        if self.outputs.len() <= index {
            self.outputs.resize(index + 1, String::new());
        }
        self.outputs[index].push_str(text);
    }

    /// A tool call's piece (`index` of the calls of `choice`): its name
    /// when given, an arguments fragment to append.
    pub fn push_call(
        &mut self,
        choice: usize,
        index: usize,
        name: Option<&str>,
        args: Option<&str>,
    ) {
        if self.output_lost {
            return;
        }
        self.tool_calls = true;
        let total: usize = self
            .calls
            .iter()
            .map(|(n, a)| n.len() + a.len())
            .sum::<usize>()
            + name.map_or(0, str::len)
            + args.map_or(0, str::len);
        if choice != 0 || index >= Self::MAX_CHOICES || total > Self::MAX_BYTES {
            self.output_lost = true;
            self.calls = Vec::new();
            return;
        }
        if self.calls.len() <= index {
            self.calls.resize(index + 1, Default::default());
        }
        let c = &mut self.calls[index];
        if let Some(n) = name {
            c.0.push_str(n);
        }
        if let Some(a) = args {
            c.1.push_str(a);
        }
    }

    /// The memory budget took it back. Whether anything was held.
    pub fn shed(&mut self) -> bool {
        let held = self.held() > 0;
        self.body = None;
        self.outputs = Vec::new();
        self.calls = Vec::new();
        self.output_lost = true;
        held
    }
}

/// What a request that is not an LLM request was, for
/// `tokentap.http.requests` (`tokentap.http.route_class`): a bounded set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RouteClass {
    /// Liveness/readiness probes: `/health`, `/healthz`, `/ready`,
    /// `/readyz`, `/livez`, `/ping`, `/v2/health/*` (Triton),
    /// `/api/health`.
    Health,
    /// Prometheus scrapes: `/metrics`.
    Metrics,
    /// Model listings: `/v1/models[/*]`, `/models`, `/api/tags` (Ollama),
    /// `/v2/models/*` metadata (Triton).
    Models,
    /// Everything else: `/version`, `/tokenize`, admin endpoints, an unknown
    /// path, a failed route (404/405 on an LLM path: a misrouted client).
    Other,
}

impl RouteClass {
    pub fn as_str(self) -> &'static str {
        match self {
            RouteClass::Health => "health",
            RouteClass::Metrics => "metrics",
            RouteClass::Models => "models",
            RouteClass::Other => "other",
        }
    }

    /// The class of a request path (query and trailing `/` ignored).
    pub fn of_path(path: &str) -> RouteClass {
        let p = path.split(['?', '#']).next().unwrap_or("");
        let p = p.trim_end_matches('/');
        match p {
            "/health" | "/healthz" | "/ready" | "/readyz" | "/livez" | "/live" | "/ping"
            | "/api/health" | "/v1/health" => RouteClass::Health,
            _ if p.starts_with("/v2/health/") => RouteClass::Health,
            // gRPC health and metadata methods (Triton, vLLM/SGLang via
            // smg, the standard health service).
            "/grpc.health.v1.Health/Check"
            | "/grpc.health.v1.Health/Watch"
            | "/inference.GRPCInferenceService/ServerLive"
            | "/inference.GRPCInferenceService/ServerReady"
            | "/inference.GRPCInferenceService/ModelReady"
            | "/vllm.grpc.engine.VllmEngine/HealthCheck"
            | "/sglang.grpc.scheduler.SglangScheduler/HealthCheck" => RouteClass::Health,
            "/inference.GRPCInferenceService/ServerMetadata"
            | "/inference.GRPCInferenceService/ModelMetadata"
            | "/inference.GRPCInferenceService/ModelConfig"
            | "/inference.GRPCInferenceService/RepositoryIndex"
            | "/vllm.grpc.engine.VllmEngine/GetModelInfo"
            | "/vllm.grpc.engine.VllmEngine/GetServerInfo"
            | "/sglang.grpc.scheduler.SglangScheduler/GetModelInfo"
            | "/sglang.grpc.scheduler.SglangScheduler/GetServerInfo" => RouteClass::Models,
            "/metrics" => RouteClass::Metrics,
            "/v1/models" | "/models" | "/api/tags" | "/v2/models" => RouteClass::Models,
            _ if p.starts_with("/v1/models/") || p.starts_with("/v2/models/") => RouteClass::Models,
            _ => RouteClass::Other,
        }
    }
}

impl Finished {
    /// None for an LLM request; else the route class it is counted under.
    ///
    /// An LLM request is a `POST` whose operation the decoder recognised
    /// (chat, completion, responses, embeddings, generate) and whose route
    /// exists (not 404/405). Everything else on an engine's port — probes,
    /// scrapes, model listings, `/version`, `/tokenize`, unknown paths, a
    /// 404 on `/v1/chat/completions` — is not: counted in
    /// `tokentap.http.requests` by route class, kept out of every LLM
    /// instrument, caller state and timeline event.
    pub fn non_llm_route(&self) -> Option<RouteClass> {
        let r = &self.record;
        let llm = r.operation.is_some()
            && r.method.eq_ignore_ascii_case("POST")
            && !matches!(r.status, Some(404 | 405));
        if llm {
            return None;
        }
        Some(match RouteClass::of_path(&r.path) {
            // A POST on a listing path is no listing.
            RouteClass::Models if !r.method.eq_ignore_ascii_case("GET") => RouteClass::Other,
            c => c,
        })
    }
}

/// A request still in flight, as the GPU join sees it at a sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InFlight {
    pub seq: u64,
    pub pid: u32,
    pub t0_ns: u64,
    /// Content-bearing events written so far.
    pub content_events: u64,
}

impl std::ops::Deref for Finished {
    type Target = RequestRecord;
    fn deref(&self) -> &RequestRecord {
        &self.record
    }
}

/// RFC 3339 UTC with microseconds.
pub fn rfc3339(ns: u64) -> String {
    humantime::format_rfc3339_micros(UNIX_EPOCH + Duration::from_nanos(ns)).to_string()
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
}
