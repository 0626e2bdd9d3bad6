//! The shared vocabulary: values every room may write and match on, so
//! that no room imports another for a string.

/// The value of an attribute the record does not know (never omitted:
/// `gen_ai.provider.name` is required by the conventions).
pub const UNKNOWN: &str = "unknown";

/// The value unbounded attributes overflow into.
pub const OTHER: &str = "other";

/// What a record's t0 is (`t0_source`): the first request byte reaching
/// the engine's socket (`arrival`), or the engine's first read of it
/// (`read`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum T0Source {
    Arrival,
    Read,
}

/// What a record's response write times are (`t1_source`): the engine's
/// socket write (`write`), or its `SSL_write` call when its event loop
/// sends the ciphertext itself (`ssl_write`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum T1Source {
    Write,
    SslWrite,
}

/// A record's side of a gateway ↔ engine join (`role`,
/// `tokentap.role`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ServingRole {
    Gateway,
    Engine,
}

impl ServingRole {
    pub fn as_str(self) -> &'static str {
        match self {
            ServingRole::Gateway => "gateway",
            ServingRole::Engine => "engine",
        }
    }
}

/// What an LLM request asks for (`operation`, `gen_ai.operation.name`),
/// by the API its path names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Operation {
    Chat,
    TextCompletion,
    Embeddings,
    Responses,
    Generate,
}

impl Operation {
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Chat => "chat",
            Operation::TextCompletion => "text_completion",
            Operation::Embeddings => "embeddings",
            Operation::Responses => "responses",
            Operation::Generate => "generate",
        }
    }
}

/// What the decoder's memory budget took back (`tokentap.decode.shed`'s
/// `reason`; docs/metrics.md, "Bounds", has the order it is taken in).
/// Variants in the order of their names (maps of them serialise sorted).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ShedReason {
    /// The gateway join's waiting records, released unjoined.
    GatewayHeld,
    /// A connection's requests in flight, ended as `truncated_capture`.
    InFlight,
    /// An idle connection's unfinished head or header block.
    PartialHead,
    /// A non-streamed response body not read (its tokens unknown).
    ResponseBody,
    /// A stream event being assembled.
    StreamEvent,
    /// A request's text kept for the engine's tokenizer (its counts fall
    /// back to the estimate).
    TokenizeText,
}

impl ShedReason {
    pub fn as_str(self) -> &'static str {
        match self {
            ShedReason::ResponseBody => "response_body",
            ShedReason::StreamEvent => "stream_event",
            ShedReason::GatewayHeld => "gateway_held",
            ShedReason::PartialHead => "partial_head",
            ShedReason::InFlight => "in_flight",
            ShedReason::TokenizeText => "tokenize_text",
        }
    }
}

/// Why gRPC messages were not read (`tokentap.decode.grpc.skipped`'s
/// `reason`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum GrpcSkip {
    UnsupportedCompression,
    Oversized,
    BadMessage,
    Unrecognised,
    OrphanResponse,
}

impl GrpcSkip {
    pub fn as_str(self) -> &'static str {
        match self {
            GrpcSkip::UnsupportedCompression => "unsupported_compression",
            GrpcSkip::Oversized => "oversized",
            GrpcSkip::BadMessage => "bad_message",
            GrpcSkip::Unrecognised => "unrecognised",
            GrpcSkip::OrphanResponse => "orphan_response",
        }
    }
}

/// Why a target's TLS is not read (`tokentap.tls.attach_failures`'s
/// `reason`): a stack tokentap cannot read, or what went wrong attaching.
/// Variants in the order of their names (maps of them serialise sorted).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TlsRefusal {
    /// A uprobe did not attach.
    Attach,
    Boringssl,
    Gnutls,
    Go,
    Java,
    /// The TLS programs did not load.
    Load,
    /// Memory BIOs' probes did not attach (socket BIOs still work).
    MemoryBio,
    /// The kernel refuses uprobes without CAP_SYS_ADMIN.
    Permission,
    Rustls,
    /// A symbol the probes need is not in the library.
    SymbolMissing,
    /// The library file could not be read.
    Unreadable,
}

impl TlsRefusal {
    pub fn as_str(self) -> &'static str {
        match self {
            TlsRefusal::Attach => "attach",
            TlsRefusal::Boringssl => "boringssl",
            TlsRefusal::Gnutls => "gnutls",
            TlsRefusal::Go => "go",
            TlsRefusal::Java => "java",
            TlsRefusal::Load => "load",
            TlsRefusal::MemoryBio => "memory_bio",
            TlsRefusal::Permission => "permission",
            TlsRefusal::Rustls => "rustls",
            TlsRefusal::SymbolMissing => "symbol_missing",
            TlsRefusal::Unreadable => "unreadable",
        }
    }
}

impl std::fmt::Display for TlsRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a token count came from (`tokens_source`): the response's OpenAI
/// `usage` object; another report of the engine's own (llama.cpp
/// `timings` or `tokens_evaluated`/`tokens_predicted`, Ollama's counts,
/// TGI's `details`, gRPC token ids and counts); the engine's own
/// tokenizer run by tokentap on the request's text (`tokenize`); or
/// tokentap's estimate (input: prompt characters / 4; output: content
/// chunks).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenSource {
    Usage,
    Engine,
    Tokenizer,
    Estimate,
}

/// Where a record's two counts came from: one name when they agree (or
/// only one is known), `{"input": …, "output": …}` when they differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TokenSources {
    pub input: Option<TokenSource>,
    pub output: Option<TokenSource>,
}

impl TokenSources {
    /// None when neither count is known.
    pub fn of(input: Option<TokenSource>, output: Option<TokenSource>) -> Option<Self> {
        (input.is_some() || output.is_some()).then_some(Self { input, output })
    }

    /// Both known counts are exact: the engine's own (`usage` or another
    /// report) or its tokenizer's.
    pub fn exact(self) -> bool {
        [self.input, self.output]
            .into_iter()
            .flatten()
            .all(|s| s != TokenSource::Estimate)
    }
}

impl serde::Serialize for TokenSources {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        match (self.input, self.output) {
            (Some(a), Some(b)) if a != b => {
                let mut m = s.serialize_map(Some(2))?;
                m.serialize_entry("input", &a)?;
                m.serialize_entry("output", &b)?;
                m.end()
            }
            (Some(a), _) | (None, Some(a)) => a.serialize(s),
            (None, None) => s.serialize_none(),
        }
    }
}

/// Whom a timeline event is about: a request's tenant, else its caller
/// (never both: a tenant names the caller's organisation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Subject {
    Tenant,
    Caller,
}

impl Subject {
    /// The subject of a request with this tenant and caller, with its name.
    pub fn of<'a>(tenant: Option<&'a str>, caller: Option<&'a str>) -> Option<(Subject, &'a str)> {
        match (tenant, caller) {
            (Some(t), _) => Some((Subject::Tenant, t)),
            (None, Some(c)) => Some((Subject::Caller, c)),
            (None, None) => None,
        }
    }

    /// The metric attribute that carries it.
    pub fn attr(self) -> &'static str {
        match self {
            Subject::Tenant => "tokentap.tenant",
            Subject::Caller => "tokentap.caller",
        }
    }

    /// `tenant NAME` / `caller NAME`, for messages.
    pub fn who(self, name: &str) -> String {
        match self {
            Subject::Tenant => format!("tenant {name}"),
            Subject::Caller => format!("caller {name}"),
        }
    }
}

/// Which engine fields reported a request's stages (`stages_source`): a
/// set, written as its names in one order joined by `+`
/// (`openai_usage+vllm_metrics`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct StagesSource(u8);

impl StagesSource {
    pub const LLAMACPP_TIMINGS: Self = Self(1);
    pub const OLLAMA: Self = Self(1 << 1);
    pub const OPENAI_USAGE: Self = Self(1 << 2);
    pub const TGI_HEADERS: Self = Self(1 << 3);
    pub const VLLM_METRICS: Self = Self(1 << 4);
    /// The names, bit by bit (the order they are written in).
    const NAMES: [&'static str; 5] = [
        "llamacpp_timings",
        "ollama",
        "openai_usage",
        "tgi_headers",
        "vllm_metrics",
    ];

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The names in the set, in their one order.
    pub fn names(self) -> impl Iterator<Item = &'static str> {
        (0..Self::NAMES.len())
            .filter(move |i| self.0 & 1 << i != 0)
            .map(|i| Self::NAMES[i])
    }
}

impl std::ops::BitOr for StagesSource {
    type Output = Self;
    fn bitor(self, o: Self) -> Self {
        Self(self.0 | o.0)
    }
}

impl std::ops::BitOrAssign for StagesSource {
    fn bitor_assign(&mut self, o: Self) {
        self.0 |= o.0;
    }
}

impl std::fmt::Display for StagesSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, n) in self.names().enumerate() {
            if i > 0 {
                f.write_str("+")?;
            }
            f.write_str(n)?;
        }
        Ok(())
    }
}

impl serde::Serialize for StagesSource {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Why a request failed (`error_type` in the request log, `error.type` on
/// metrics): written by the decoder, matched by the detectors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorType {
    /// The engine answered 429 Too Many Requests.
    Http429,
    /// Any other 4xx status.
    Http4xx,
    /// A 5xx status.
    Http5xx,
    /// A 200 stream that carried an error event.
    StreamError,
    /// The client closed its connection before the answer ended.
    ClientDisconnect,
    /// The engine closed or reset the connection mid-answer.
    UpstreamReset,
    /// The capture ended (or lost bytes) before the answer did.
    TruncatedCapture,
    /// The connection switched to a protocol the decoder does not follow.
    UnsupportedProtocol,
    /// The bytes stopped making sense as the protocol (nothing was lost).
    DecodeError,
    /// A gRPC call ended with this non-zero `grpc-status` (CANCELLED by
    /// the client is `client_disconnect`): `grpc_<code name>`, lowercase.
    Grpc(u8),
}

/// gRPC status code names (grpc/doc/statuscodes.md), lowercase, 0–16.
const GRPC_CODES: [&str; 17] = [
    "grpc_ok",
    "grpc_cancelled",
    "grpc_unknown",
    "grpc_invalid_argument",
    "grpc_deadline_exceeded",
    "grpc_not_found",
    "grpc_already_exists",
    "grpc_permission_denied",
    "grpc_resource_exhausted",
    "grpc_failed_precondition",
    "grpc_aborted",
    "grpc_out_of_range",
    "grpc_unimplemented",
    "grpc_internal",
    "grpc_unavailable",
    "grpc_data_loss",
    "grpc_unauthenticated",
];

impl serde::Serialize for ErrorType {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl ErrorType {
    /// The value as written in records and on metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorType::Http429 => "http_429",
            ErrorType::Http4xx => "http_4xx",
            ErrorType::Http5xx => "http_5xx",
            ErrorType::StreamError => "stream_error",
            ErrorType::ClientDisconnect => "client_disconnect",
            ErrorType::UpstreamReset => "upstream_reset",
            ErrorType::TruncatedCapture => "truncated_capture",
            ErrorType::UnsupportedProtocol => "unsupported_protocol",
            ErrorType::DecodeError => "decode_error",
            // Codes past 16 are not gRPC's: one bucket.
            ErrorType::Grpc(c) => GRPC_CODES.get(usize::from(c)).unwrap_or(&"grpc_unknown"),
        }
    }
}

impl std::fmt::Display for ErrorType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::ErrorType;

    #[test]
    fn error_types_serialise_as_their_names() {
        for e in [
            ErrorType::Http429,
            ErrorType::Http4xx,
            ErrorType::Http5xx,
            ErrorType::StreamError,
            ErrorType::ClientDisconnect,
            ErrorType::UpstreamReset,
            ErrorType::TruncatedCapture,
            ErrorType::UnsupportedProtocol,
            ErrorType::DecodeError,
            ErrorType::Grpc(5),
        ] {
            assert_eq!(
                serde_json::to_string(&e).unwrap(),
                format!("\"{}\"", e.as_str())
            );
        }
        assert_eq!(ErrorType::Grpc(14).as_str(), "grpc_unavailable");
        assert_eq!(ErrorType::Grpc(99).as_str(), "grpc_unknown");
    }

    #[test]
    fn closed_sets_serialise_as_the_record_wrote_them_before() {
        fn j<T: serde::Serialize>(v: &T) -> String {
            serde_json::to_string(v).unwrap()
        }
        assert_eq!(j(&super::T0Source::Arrival), "\"arrival\"");
        assert_eq!(j(&super::T1Source::SslWrite), "\"ssl_write\"");
        assert_eq!(j(&super::ServingRole::Gateway), "\"gateway\"");
        use super::StagesSource as S;
        assert_eq!(
            j(&(S::VLLM_METRICS | S::OPENAI_USAGE)),
            "\"openai_usage+vllm_metrics\""
        );
        assert_eq!(
            (S::TGI_HEADERS | S::OLLAMA | S::OPENAI_USAGE | S::OLLAMA).to_string(),
            "ollama+openai_usage+tgi_headers",
            "one order whatever order they came in"
        );
        assert!(S::default().is_empty());
    }
}
