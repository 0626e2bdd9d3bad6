//! The shared vocabulary: values every room may write and match on, so
//! that no room imports another for a string.

/// The value of an attribute the record does not know (never omitted:
/// `gen_ai.provider.name` is required by the conventions).
pub const UNKNOWN: &str = "unknown";

/// The value unbounded attributes overflow into.
pub const OTHER: &str = "other";

/// Why a request failed (`error_type` in the request log, `error.type` on
/// metrics): written by the decoder, matched by the detectors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum ErrorType {
    /// The engine answered 429 Too Many Requests.
    #[serde(rename = "http_429")]
    Http429,
    /// Any other 4xx status.
    #[serde(rename = "http_4xx")]
    Http4xx,
    /// A 5xx status.
    #[serde(rename = "http_5xx")]
    Http5xx,
    /// A 200 stream that carried an error event.
    #[serde(rename = "stream_error")]
    StreamError,
    /// The client closed its connection before the answer ended.
    #[serde(rename = "client_disconnect")]
    ClientDisconnect,
    /// The engine closed or reset the connection mid-answer.
    #[serde(rename = "upstream_reset")]
    UpstreamReset,
    /// The capture ended (or lost bytes) before the answer did.
    #[serde(rename = "truncated_capture")]
    TruncatedCapture,
    /// The connection switched to a protocol the decoder does not follow.
    #[serde(rename = "unsupported_protocol")]
    UnsupportedProtocol,
    /// The bytes stopped making sense as the protocol (nothing was lost).
    #[serde(rename = "decode_error")]
    DecodeError,
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
        ] {
            assert_eq!(
                serde_json::to_string(&e).unwrap(),
                format!("\"{}\"", e.as_str())
            );
        }
    }
}
