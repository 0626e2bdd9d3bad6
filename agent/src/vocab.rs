//! The shared vocabulary: values every room may write and match on, so
//! that no room imports another for a string.

/// The value of an attribute the record does not know (never omitted:
/// `gen_ai.provider.name` is required by the conventions).
pub const UNKNOWN: &str = "unknown";

/// The value unbounded attributes overflow into.
pub const OTHER: &str = "other";
