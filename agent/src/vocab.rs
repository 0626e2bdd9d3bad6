//! The shared vocabulary: values every room may write and match on, so
//! that no room imports another for a string.

/// The value of an attribute the record does not know (never omitted:
/// `gen_ai.provider.name` is required by the conventions).
pub const UNKNOWN: &str = "unknown";

/// The value unbounded attributes overflow into.
pub const OTHER: &str = "other";

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
}
