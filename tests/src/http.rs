//! The HTTP/1.1 the test peers and test clients speak: framing a request
//! (head + Content-Length body), writing requests and responses, reading a
//! response whole (Content-Length or chunked) or until the caller has seen
//! enough of its body, and aborting a connection with a reset.
//!
//! One implementation for `simengine`, `sockpeer`, `benchpeer`, the OTLP/HTTP
//! receiver, the end-to-end tests and `cargo xtask demo` (which includes this
//! file by path: it must stay std + libc only). It is a test tool, not a
//! general HTTP parser: no trailers, no folded headers, heads are ASCII.
//! It never writes payload text anywhere but the socket it was given.

use std::{
    io::{self, Read, Write},
    net::TcpStream,
    os::fd::AsRawFd,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

/// Head of a chunked `text/event-stream` 200 response, as engines send it.
pub const SSE_HEAD: &str =
    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";

/// The chunk that ends a chunked body.
pub const LAST_CHUNK: &str = "0\r\n\r\n";

/// A parsed head: its text lower-cased, and where the body starts.
#[derive(Clone, Debug)]
pub struct Head {
    /// Start line and header lines, lower-cased, without the blank line.
    pub text: String,
    /// Offset of the first body byte in the buffer the head was read from.
    pub body_start: usize,
}

impl Head {
    /// The head at the start of `buf`, once its blank line has arrived.
    pub fn parse(buf: &[u8]) -> Option<Head> {
        let end = buf.windows(4).position(|w| w == b"\r\n\r\n")?;
        Some(Head {
            text: String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase(),
            body_start: end + 4,
        })
    }

    /// The value of header `name` (lower-case), trimmed.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.text.lines().skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim() == name).then(|| v.trim())
        })
    }

    /// Content-Length, when present and a number.
    pub fn content_length(&self) -> Option<usize> {
        self.header("content-length")?.parse().ok()
    }

    /// Whether the body is chunked.
    pub fn chunked(&self) -> bool {
        self.header("transfer-encoding")
            .is_some_and(|v| v.contains("chunked"))
    }

    /// The status code of a response head.
    pub fn status(&self) -> Option<u16> {
        self.text.split_whitespace().nth(1)?.parse().ok()
    }
}

/// One request taken off a connection.
#[derive(Clone, Debug)]
pub struct Request {
    pub head: Head,
    pub body: Vec<u8>,
}

/// Removes one whole request (head + Content-Length body; none means no
/// body) from the front of `pending`, if it has all arrived.
pub fn take_request(pending: &mut Vec<u8>) -> Option<Request> {
    let head = Head::parse(pending)?;
    let end = head.body_start + head.content_length().unwrap_or(0);
    if pending.len() < end {
        return None;
    }
    let body = pending[head.body_start..end].to_vec();
    pending.drain(..end);
    Some(Request { head, body })
}

/// Reads from `r` until a whole request is in `pending` and returns it
/// (bytes after it stay in `pending`: pipelining). `Ok(None)`: the peer
/// closed first.
pub fn read_request(r: &mut impl Read, pending: &mut Vec<u8>) -> io::Result<Option<Request>> {
    let mut buf = vec![0u8; 65536];
    loop {
        if let Some(req) = take_request(pending) {
            return Ok(Some(req));
        }
        let k = r.read(&mut buf)?;
        if k == 0 {
            return Ok(None);
        }
        pending.extend_from_slice(&buf[..k]);
    }
}

/// The bytes of `POST path` with a JSON body.
pub fn post(path: &str, host: &str, body: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// The bytes of `POST path` with a JSON body and extra header lines
/// (`(name, value)` pairs, written as given).
pub fn post_with_headers(path: &str, host: &str, headers: &[(&str, &str)], body: &str) -> String {
    let extra: String = headers
        .iter()
        .map(|(n, v)| format!("{n}: {v}\r\n"))
        .collect();
    format!(
        "POST {path} HTTP/1.1\r\nHost: {host}\r\n{extra}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// The bytes of a whole response with a Content-Length body.
pub fn response(status: u16, content_type: &str, body: &str) -> String {
    let reason = match status {
        200 => "OK",
        _ => "Error",
    };
    format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// `s` framed as one chunk of a chunked body.
pub fn chunk(s: &str) -> String {
    format!("{:x}\r\n{s}\r\n", s.len())
}

/// A response as read by [`read_response`].
#[derive(Clone, Debug)]
pub struct Response {
    pub head: Head,
    /// The body so far, chunk framing removed.
    pub body: Vec<u8>,
    /// The body ended (Content-Length reached, or the last chunk read);
    /// false when the reader stopped early.
    pub complete: bool,
}

impl Response {
    pub fn status(&self) -> Option<u16> {
        self.head.status()
    }
}

/// Body decoding state of a response being read.
enum Body {
    Length(usize),
    /// Chunked; offset of the next chunk-size line in the raw buffer.
    Chunked(usize),
    /// Neither: read until the peer closes.
    UntilClose,
}

/// Reads one whole response from `s`. Fails when the peer closes before
/// the end of the body (unless the body runs until close).
pub fn read_response(s: &mut impl Read) -> io::Result<Response> {
    read_response_until(s, |_| false)
}

/// Reads one response from `s` until its body is complete, or until
/// `enough(body so far)` says to stop (then `complete` is false and the
/// connection is mid-response: [`abort`] it or drop it).
pub fn read_response_until(
    s: &mut impl Read,
    mut enough: impl FnMut(&[u8]) -> bool,
) -> io::Result<Response> {
    let mut raw = Vec::new();
    let mut tmp = [0u8; 8192];
    let mut state: Option<(Head, Body)> = None;
    let mut body = Vec::new();
    loop {
        if state.is_none() {
            if let Some(head) = Head::parse(&raw) {
                let b = if let Some(n) = head.content_length() {
                    Body::Length(n)
                } else if head.chunked() {
                    Body::Chunked(head.body_start)
                } else {
                    Body::UntilClose
                };
                state = Some((head, b));
            }
        }
        if let Some((head, framing)) = &mut state {
            let complete = match framing {
                Body::Length(n) => {
                    let got = raw.len() - head.body_start;
                    body = raw[head.body_start..head.body_start + got.min(*n)].to_vec();
                    got >= *n
                }
                Body::Chunked(at) => dechunk(&raw, at, &mut body)?,
                Body::UntilClose => {
                    body = raw[head.body_start..].to_vec();
                    false
                }
            };
            if complete || enough(&body) {
                return Ok(Response {
                    head: head.clone(),
                    body,
                    complete,
                });
            }
        }
        let k = s.read(&mut tmp)?;
        if k == 0 {
            return match state {
                Some((head, Body::UntilClose)) => Ok(Response {
                    head,
                    body,
                    complete: true,
                }),
                _ => Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the server closed the connection mid-response",
                )),
            };
        }
        raw.extend_from_slice(&tmp[..k]);
    }
}

/// Moves every whole chunk from `raw[*at..]` into `body`; true once the
/// last chunk (size 0, then the blank line) has been read.
fn dechunk(raw: &[u8], at: &mut usize, body: &mut Vec<u8>) -> io::Result<bool> {
    let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_string());
    loop {
        let rest = &raw[*at..];
        let Some(eol) = rest.windows(2).position(|w| w == b"\r\n") else {
            return Ok(false);
        };
        let line = std::str::from_utf8(&rest[..eol]).map_err(|_| bad("chunk size not text"))?;
        let size_hex = line.split(';').next().unwrap_or("").trim();
        let size =
            usize::from_str_radix(size_hex, 16).map_err(|_| bad("chunk size not hexadecimal"))?;
        let data_start = eol + 2;
        if size == 0 {
            // No trailers: the blank line follows at once.
            return Ok(rest.len() >= data_start + 2);
        }
        if rest.len() < data_start + size + 2 {
            return Ok(false);
        }
        body.extend_from_slice(&rest[data_start..data_start + size]);
        *at += data_start + size + 2;
    }
}

/// Closes `s` with a reset instead of a FIN (SO_LINGER with a zero
/// timeout), like a client that is killed or cancels mid-stream: the
/// server's next write fails.
pub fn abort(s: TcpStream) {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: a valid socket and a correctly sized option value.
    let rc = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0, "SO_LINGER: {}", std::io::Error::last_os_error());
    drop(s);
}

/// Sends `req` on a new connection to `addr` (no Nagle delay, a 5 s read
/// timeout) and reads its whole response: a test's one request. Returns
/// it with the clock (CLOCK_REALTIME ns) read just before and just after
/// the write, which bound when the request left.
pub fn exchange(addr: &str, req: &str) -> io::Result<(Response, [u64; 2])> {
    let now = || {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    };
    let mut s = TcpStream::connect(addr)?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    let lo = now();
    s.write_all(req.as_bytes())?;
    let hi = now();
    Ok((read_response(&mut s)?, [lo, hi]))
}

/// Sends `POST path` with `body` on `s` and reads the whole response.
pub fn round_trip(s: &mut TcpStream, path: &str, body: &str) -> io::Result<Response> {
    s.write_all(post(path, "test", body).as_bytes())?;
    read_response(s)
}

/// Sends `GET path` on `s` (keep-alive) and reads the whole response.
pub fn get(s: &mut TcpStream, path: &str) -> io::Result<Response> {
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: test\r\nUser-Agent: probe\r\n\r\n").as_bytes(),
    )?;
    read_response(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader that hands out `data` in pieces of `step` bytes.
    struct Trickle<'a> {
        data: &'a [u8],
        step: usize,
    }

    /// `wire` handed out `step` bytes at a time.
    fn trickle(wire: &str, step: usize) -> Trickle<'_> {
        Trickle {
            data: wire.as_bytes(),
            step,
        }
    }

    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = self.step.min(buf.len()).min(self.data.len());
            buf[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            Ok(n)
        }
    }

    /// A whole chunked SSE response carrying `chunks`.
    fn sse(chunks: &[&str]) -> String {
        let body: String = chunks.iter().map(|c| chunk(c)).collect();
        format!("{SSE_HEAD}{body}{LAST_CHUNK}")
    }

    #[test]
    fn a_chunked_response_is_read_whole_however_it_arrives() {
        let wire = sse(&["data: a\n\n", "data: [DONE]\n\n"]);
        for step in 1..wire.len() {
            let r = read_response(&mut trickle(&wire, step)).unwrap();
            assert!(r.complete);
            assert_eq!(r.status(), Some(200));
            assert_eq!(r.body, b"data: a\n\ndata: [DONE]\n\n");
        }
    }

    #[test]
    fn a_body_containing_the_last_chunk_bytes_does_not_end_the_response_early() {
        let wire = sse(&["x0\r\n\r\n", "y"]);
        let r = read_response(&mut trickle(&wire, 3)).unwrap();
        assert_eq!(r.body, b"x0\r\n\r\ny");
    }

    #[test]
    fn reading_stops_when_the_caller_has_enough_and_says_the_body_is_incomplete() {
        let mut wire = SSE_HEAD.to_string();
        for i in 0..5 {
            wire += &chunk(&format!("data: tok{i}\n\n"));
        }
        let r = read_response_until(&mut trickle(&wire, 7), |b| {
            String::from_utf8_lossy(b).matches("tok").count() >= 3
        })
        .unwrap();
        assert!(!r.complete);
        assert_eq!(String::from_utf8_lossy(&r.body).matches("tok").count(), 3);
    }

    #[test]
    fn a_content_length_response_cut_short_is_an_error() {
        let wire = "HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc";
        let e = read_response(&mut trickle(wire, 4)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        let whole = response(429, "application/json", "{}");
        let r = read_response(&mut trickle(&whole, 5)).unwrap();
        assert_eq!(
            (r.status(), r.complete, &r.body[..]),
            (Some(429), true, &b"{}"[..])
        );
    }

    #[test]
    fn pipelined_requests_are_taken_one_at_a_time() {
        let one = post("/a", "h", "{\"x\":1}");
        let two = post("/b", "h", "");
        let wire = format!("{one}{two}");
        let mut pending = Vec::new();
        let mut r = trickle(&wire, 5);
        let a = read_request(&mut r, &mut pending).unwrap().unwrap();
        assert!(a.head.text.starts_with("post /a "));
        assert_eq!(a.body, b"{\"x\":1}");
        let b = read_request(&mut r, &mut pending).unwrap().unwrap();
        assert!(b.head.text.starts_with("post /b "));
        assert!(b.body.is_empty());
        assert!(read_request(&mut r, &mut pending).unwrap().is_none());
    }
}
