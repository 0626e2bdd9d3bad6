//! The caller's trace context: a request's W3C `traceparent` header
//! (<https://www.w3.org/TR/trace-context/>), so the span tokentap makes for
//! the request joins the caller's trace. A malformed or all-zero value is
//! ignored (the request starts a trace of its own) and counted, never an
//! error.

use std::fmt::Write;

/// A parsed `traceparent`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceParent {
    pub trace_id: [u8; 16],
    /// The caller's span: the parent of tokentap's.
    pub parent_id: [u8; 8],
    /// Trace flags (bit 0: sampled by the caller).
    pub flags: u8,
}

/// What a request's `traceparent` header said.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TraceHeader {
    Valid(TraceParent),
    /// Present but not a usable trace context (counted).
    Invalid,
}

fn hex_nibble(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

/// Lowercase hex only (the specification's `HEXDIGLC`).
fn hex_into(s: &[u8], out: &mut [u8]) -> Option<()> {
    if s.len() != out.len() * 2 {
        return None;
    }
    for (i, pair) in s.chunks(2).enumerate() {
        out[i] = hex_nibble(pair[0])? << 4 | hex_nibble(pair[1])?;
    }
    Some(())
}

/// Parses a `traceparent` value: `version-traceid-parentid-flags`. Version
/// `ff` is invalid; version `00` has exactly these four fields; a later
/// version may add fields after them (read as version 00). All-zero ids
/// are invalid.
pub fn parse(value: &[u8]) -> TraceHeader {
    parse_valid(value.trim_ascii())
        .map(TraceHeader::Valid)
        .unwrap_or(TraceHeader::Invalid)
}

fn parse_valid(v: &[u8]) -> Option<TraceParent> {
    if v.len() < 55 {
        return None;
    }
    let mut version = [0u8; 1];
    hex_into(&v[0..2], &mut version)?;
    if version[0] == 0xff || v[2] != b'-' || v[35] != b'-' || v[52] != b'-' {
        return None;
    }
    if version[0] == 0 && v.len() != 55 {
        return None;
    }
    if version[0] != 0 && v.len() > 55 && v[55] != b'-' {
        return None;
    }
    let mut tp = TraceParent {
        trace_id: [0; 16],
        parent_id: [0; 8],
        flags: 0,
    };
    hex_into(&v[3..35], &mut tp.trace_id)?;
    hex_into(&v[36..52], &mut tp.parent_id)?;
    let mut flags = [0u8; 1];
    hex_into(&v[53..55], &mut flags)?;
    tp.flags = flags[0];
    if tp.trace_id == [0; 16] || tp.parent_id == [0; 8] {
        return None;
    }
    Some(tp)
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &[u8] = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn the_specifications_example_parses() {
        let TraceHeader::Valid(tp) = parse(GOOD) else {
            panic!("valid")
        };
        assert_eq!(hex(&tp.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(hex(&tp.parent_id), "00f067aa0ba902b7");
        assert_eq!(tp.flags, 1);
        assert_eq!(
            parse(b" 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00 "),
            TraceHeader::Valid(TraceParent { flags: 0, ..tp })
        );
    }

    #[test]
    fn malformed_and_all_zero_values_are_invalid() {
        for bad in [
            &b""[..],
            b"00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            b"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            b"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            b"00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            b"zz-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(
                parse(bad),
                TraceHeader::Invalid,
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        // A later version may carry more fields.
        assert!(matches!(
            parse(b"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-ever"),
            TraceHeader::Valid(_)
        ));
    }
}
