//! HTTP/1.x message heads, both directions: bytes are accumulated (bounded
//! by `MAX_HEAD_BYTES`) until a blank line, parsed by `httparse`, and the
//! body's framing is read from the headers. One `HeadBuf` serves requests
//! and responses; what differs is the `Head` type parsed out of it.
//!
//! Must not: keep more than `MAX_HEAD_BYTES + 1` bytes, or keep header
//! values other than those the records need (the configured tenant
//! headers and those request-type rules name, bounded; an API key only as
//! its hash, computed here from the borrowed value).

use super::chunked::Chunked;
use crate::decode::{IdentityConfig, MAX_HEAD_BYTES};
use crate::identity::caller::{api_token, bounded_value};

const MAX_HEADERS: usize = 96;

/// How a message's body ends.
pub enum Framing {
    None,
    Length(u64),
    Chunked(Chunked),
    UntilClose,
}

/// The bytes stopped making sense as an HTTP/1 head.
#[derive(Debug, PartialEq, Eq)]
pub struct NotHttp;

/// A head type `HeadBuf` can parse: the request line or the status line,
/// plus what the machine keeps of the headers.
pub trait Head: Sized {
    /// `Ok(None)`: `buf` is not a complete head yet. `Ok(Some((head, n)))`:
    /// the head is the first `n` bytes of `buf`. `id` says which header
    /// values a request keeps.
    fn parse(buf: &[u8], id: &IdentityConfig) -> Result<Option<(Self, usize)>, NotHttp>;
}

pub struct RequestHead {
    pub method: String,
    pub path: String,
    pub identity: HeadIdentity,
    /// `None`: no body (neither Content-Length nor chunked).
    pub framing: Option<Framing>,
}

/// What a request's headers say about who sent it, whatever protocol
/// carried them (HTTP/1 heads, HTTP/2 header blocks).
#[derive(Clone, Debug, Default)]
pub struct HeadIdentity {
    /// The value of the agent's own-traffic header, if present
    /// (`crate::selftraffic`).
    pub self_marker: Option<Vec<u8>>,
    /// The first configured tenant header present (bounded).
    pub tenant: Option<String>,
    /// The API key's id (`identity::caller::ApiKeyHasher`); the key itself
    /// is never kept.
    pub api_key_id: Option<String>,
    /// (lowercase name, bounded value) of headers request-type rules name.
    pub rule_headers: Vec<(String, String)>,
    /// The `x-request-id` header (bounded).
    pub request_id: Option<String>,
    /// The W3C `traceparent` header, when present.
    pub trace: Option<crate::identity::trace::TraceHeader>,
}

impl HeadIdentity {
    /// Reads the headers through `get` (a case-insensitive lookup by
    /// lowercase name).
    pub fn read<'a>(get: &dyn Fn(&str) -> Option<&'a [u8]>, id: &IdentityConfig) -> Self {
        HeadIdentity {
            self_marker: get(crate::selftraffic::HEADER).map(<[u8]>::to_vec),
            tenant: id
                .caller
                .tenant_headers
                .iter()
                .find_map(|n| get(n).and_then(bounded_value)),
            api_key_id: id
                .caller
                .api_keys
                .as_ref()
                .and_then(|k| api_token(get).map(|t| k.id(t))),
            rule_headers: id
                .rule_headers
                .iter()
                .filter_map(|n| get(n).and_then(bounded_value).map(|v| (n.clone(), v)))
                .collect(),
            request_id: get("x-request-id").and_then(bounded_value),
            trace: get("traceparent").map(crate::identity::trace::parse),
        }
    }
}

pub struct ResponseHead {
    pub status: u16,
    /// Lowercase; empty when absent.
    pub content_type: String,
    pub server: Option<String>,
    /// The `Upgrade` header, lowercase (`h2c` on a switch to HTTP/2).
    pub upgrade: Option<String>,
    /// `None`: the body runs until the connection closes.
    pub framing: Option<Framing>,
    /// TGI's timing headers (`x-queue-time`).
    pub stages: crate::decode::formats::Stages,
}

impl Head for RequestHead {
    fn parse(buf: &[u8], id: &IdentityConfig) -> Result<Option<(Self, usize)>, NotHttp> {
        let mut hdrs = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut req = httparse::Request::new(&mut hdrs);
        let n = match req.parse(buf) {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(_) => return Err(NotHttp),
        };
        let headers = &*req.headers;
        let head = RequestHead {
            method: req.method.unwrap_or("").to_string(),
            path: req.path.unwrap_or("").to_string(),
            identity: HeadIdentity::read(&|n| header(headers, n), id),
            framing: framing_of(headers)?,
        };
        Ok(Some((head, n)))
    }
}

impl Head for ResponseHead {
    fn parse(buf: &[u8], _: &IdentityConfig) -> Result<Option<(Self, usize)>, NotHttp> {
        let mut hdrs = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut resp = httparse::Response::new(&mut hdrs);
        let n = match resp.parse(buf) {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(_) => return Err(NotHttp),
        };
        let status = resp.code.unwrap_or(0);
        // Interim responses carry no framing worth reading (and a 101's
        // headers describe the next protocol).
        let framing = if status < 200 {
            None
        } else {
            framing_of(resp.headers)?
        };
        let head = ResponseHead {
            status,
            content_type: header_str(resp.headers, "content-type")
                .unwrap_or_default()
                .to_ascii_lowercase(),
            server: header_str(resp.headers, "server"),
            upgrade: header_str(resp.headers, "upgrade").map(|u| u.to_ascii_lowercase()),
            framing,
            stages: crate::decode::formats::tgi_header_stages(&|n| header_str(resp.headers, n)),
        };
        Ok(Some((head, n)))
    }
}

/// Accumulates one head. A fresh one per message (its buffer is freed with
/// it, so an idle connection holds nothing).
#[derive(Default)]
pub struct HeadBuf {
    buf: Vec<u8>,
    /// When the head's first byte was written.
    first_byte_ns: Option<u64>,
    /// When it reached the socket (kernel receive path), when known.
    first_arrival_ns: Option<u64>,
}

impl HeadBuf {
    /// Heap bytes held.
    pub fn buffered(&self) -> usize {
        self.buf.capacity()
    }

    /// Takes head bytes, written at `ts`, from the front of `data`
    /// (advancing it past what was used). `Ok(Some((head, first_byte_ns,
    /// first_arrival_ns)))` once the head is complete: `data` then starts at
    /// the body. `arrival` says when the front of `data` reached the socket
    /// (None: unknown). Blank lines before a head are skipped (RFC 9112
    /// §2.2).
    pub fn feed<H: Head>(
        &mut self,
        data: &mut &[u8],
        ts: u64,
        arrival: Option<u64>,
        id: &IdentityConfig,
    ) -> Result<Option<(H, u64, Option<u64>)>, NotHttp> {
        if self.buf.is_empty() {
            let skip = data
                .iter()
                .take_while(|b| **b == b'\r' || **b == b'\n')
                .count();
            *data = &data[skip..];
            if data.is_empty() {
                return Ok(None);
            }
        }
        if self.first_byte_ns.is_none() {
            self.first_arrival_ns = arrival;
        }
        let first_byte_ns = *self.first_byte_ns.get_or_insert(ts);
        let from = self.buf.len();
        // Never more than one byte past the limit, so a 1 MiB header line
        // costs 64 KiB.
        let take = data
            .len()
            .min(MAX_HEAD_BYTES + 1 - from.min(MAX_HEAD_BYTES));
        self.buf.extend_from_slice(&data[..take]);
        if !has_head_end(&self.buf, from) {
            if self.buf.len() > MAX_HEAD_BYTES {
                return Err(NotHttp);
            }
            *data = &data[take..];
            return Ok(None);
        }
        match H::parse(&self.buf, id)? {
            None => {
                *data = &data[take..];
                Ok(None)
            }
            Some((head, n)) => {
                // Bytes of this piece that belonged to the head.
                let used = n - from;
                *data = &data[used.min(data.len())..];
                self.buf = Vec::new();
                self.first_byte_ns = None;
                Ok(Some((head, first_byte_ns, self.first_arrival_ns.take())))
            }
        }
    }
}

/// Is there a complete head (blank line) in `buf`, looking only at bytes
/// from `from` on (minus 3 for a terminator split across appends)?
fn has_head_end(buf: &[u8], from: usize) -> bool {
    let start = from.saturating_sub(3);
    memchr::memmem::find(&buf[start..], b"\n\r\n").is_some()
        || memchr::memmem::find(&buf[start..], b"\n\n").is_some()
}

fn header<'a>(headers: &[httparse::Header<'a>], name: &str) -> Option<&'a [u8]> {
    headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case(name))
        .map(|h| h.value)
}

fn header_str(headers: &[httparse::Header<'_>], name: &str) -> Option<String> {
    header(headers, name).map(|v| String::from_utf8_lossy(v).trim().to_string())
}

/// Chunked transfer coding wins over Content-Length (RFC 9112 §6.3); a
/// Content-Length that is not a number is not HTTP we can follow.
fn framing_of(headers: &[httparse::Header<'_>]) -> Result<Option<Framing>, NotHttp> {
    if let Some(te) = header(headers, "transfer-encoding") {
        if String::from_utf8_lossy(te)
            .to_ascii_lowercase()
            .contains("chunked")
        {
            return Ok(Some(Framing::Chunked(Chunked::default())));
        }
    }
    match header(headers, "content-length") {
        Some(v) => std::str::from_utf8(v)
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .map(|n| Some(Framing::Length(n)))
            .ok_or(NotHttp),
        None => Ok(None),
    }
}

/// Does `data` start like an HTTP request line (`METHOD /…`)?
pub fn looks_like_request(data: &[u8]) -> bool {
    let n = data.iter().take(16).position(|&b| b == b' ');
    match n {
        Some(n) if n > 0 => {
            data[..n].iter().all(|b| b.is_ascii_uppercase())
                && matches!(data.get(n + 1), Some(b'/') | Some(b'*') | Some(b'h'))
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed_all<H: Head>(pieces: &[&[u8]]) -> (Option<(H, u64)>, Vec<u8>) {
        let mut h = HeadBuf::default();
        for (i, p) in pieces.iter().enumerate() {
            let mut data = *p;
            if let Some(done) = h
                .feed::<H>(&mut data, i as u64 + 1, None, &IdentityConfig::default())
                .unwrap()
            {
                let rest = [&[data], &pieces[i + 1..]].concat().concat();
                return (Some((done.0, done.1)), rest);
            }
            assert!(data.is_empty());
        }
        (None, vec![])
    }

    #[test]
    fn one_head_parser_reads_requests_and_responses_split_anywhere() {
        let req: &[u8] = b"\r\nPOST /v1/completions HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}";
        let resp: &[u8] = b"HTTP/1.1 200 OK\r\nServer: llama.cpp\r\nContent-Type: Text/Event-Stream\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n";
        for cut in 0..req.len() {
            let (head, rest) = feed_all::<RequestHead>(&[&req[..cut], &req[cut..]]);
            let (h, first) = head.unwrap();
            assert_eq!(
                (h.method.as_str(), h.path.as_str()),
                ("POST", "/v1/completions")
            );
            assert!(matches!(h.framing, Some(Framing::Length(2))));
            assert_eq!(rest, b"{}");
            // The first byte after the blank line dates the request.
            assert_eq!(first, if cut <= 2 { 2 } else { 1 }, "cut {cut}");
        }
        for cut in 0..resp.len() {
            let (head, rest) = feed_all::<ResponseHead>(&[&resp[..cut], &resp[cut..]]);
            let (h, _) = head.unwrap();
            assert_eq!(h.status, 200);
            assert_eq!(h.content_type, "text/event-stream");
            assert_eq!(h.server.as_deref(), Some("llama.cpp"));
            assert!(matches!(h.framing, Some(Framing::Chunked(_))));
            assert_eq!(rest, b"0\r\n\r\n");
        }
    }

    #[test]
    fn bad_lengths_garbage_and_endless_heads_are_not_http() {
        let mut h = HeadBuf::default();
        let mut d: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n";
        assert_eq!(
            h.feed::<ResponseHead>(&mut d, 1, None, &IdentityConfig::default())
                .err(),
            Some(NotHttp)
        );
        let mut h = HeadBuf::default();
        let mut d: &[u8] = b"\x16\x03\x01 hello\r\n\r\n";
        assert_eq!(
            h.feed::<RequestHead>(&mut d, 1, None, &IdentityConfig::default())
                .err(),
            Some(NotHttp)
        );
        let mut h = HeadBuf::default();
        let big = vec![b'a'; MAX_HEAD_BYTES + 10];
        let mut d: &[u8] = &big;
        assert_eq!(
            h.feed::<RequestHead>(&mut d, 1, None, &IdentityConfig::default())
                .err(),
            Some(NotHttp)
        );
        assert!(h.buffered() <= 2 * MAX_HEAD_BYTES);
    }

    #[test]
    fn only_configured_identity_headers_are_kept_and_the_api_key_only_as_its_id() {
        use crate::identity::{
            caller::{ApiKeyHasher, CallerConfig},
            request_type::Rules,
        };
        let rules =
            Rules::parse("[[request_type]]\nname = \"summ\"\nheader = \"X-Task=summarize\"\n")
                .unwrap();
        let hasher = ApiKeyHasher::new(b"k").unwrap();
        let id = IdentityConfig::new(
            CallerConfig::new(
                &["X-Org".to_string(), "X-Tenant-ID".to_string()],
                Some(hasher.clone()),
            ),
            rules,
        );
        let req = b"POST /v1/chat/completions HTTP/1.1\r\nx-tenant-id: t-2\r\nX-ORG:  org-1 \r\nAuthorization: Bearer sk-secret-123\r\nX-Task: summarize\r\nCookie: session=abc\r\nContent-Length: 2\r\n\r\n{}";
        let mut h = HeadBuf::default();
        let mut d: &[u8] = req;
        let (head, _, _) = h
            .feed::<RequestHead>(&mut d, 1, None, &id)
            .unwrap()
            .unwrap();
        assert_eq!(
            head.identity.tenant.as_deref(),
            Some("org-1"),
            "first configured header wins"
        );
        assert_eq!(head.identity.api_key_id, Some(hasher.id(b"sk-secret-123")));
        assert_eq!(
            head.identity.rule_headers,
            vec![("x-task".to_string(), "summarize".to_string())]
        );
        // An empty first header falls through to the next one.
        let req2 = b"GET / HTTP/1.1\r\nX-Org: \r\nX-Tenant-ID: t-2\r\n\r\n";
        let mut h = HeadBuf::default();
        let mut d: &[u8] = req2;
        let (head, _, _) = h
            .feed::<RequestHead>(&mut d, 1, None, &id)
            .unwrap()
            .unwrap();
        assert_eq!(head.identity.tenant.as_deref(), Some("t-2"));
        assert_eq!(head.identity.api_key_id, None);
        // Nothing configured: nothing kept.
        let mut h = HeadBuf::default();
        let mut d: &[u8] = req;
        let (head, _, _) = h
            .feed::<RequestHead>(&mut d, 1, None, &IdentityConfig::default())
            .unwrap()
            .unwrap();
        assert_eq!(head.identity.tenant, None);
        assert_eq!(head.identity.api_key_id, None);
        assert!(head.identity.rule_headers.is_empty());
    }
}
