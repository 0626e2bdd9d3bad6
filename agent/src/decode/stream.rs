//! Incremental stream decoders for response bodies: Server-Sent Events and
//! newline-delimited JSON. Both accept input split at any byte and call the
//! sink once per complete event, in order. Memory per stream is bounded.

/// An event or line larger than this is dropped (and counted).
pub const MAX_EVENT_BYTES: usize = 1 << 20;

/// One dispatched SSE event.
pub struct SseEvent<'a> {
    /// The `event:` field, when present.
    pub event: Option<&'a str>,
    /// `data:` lines joined with '\n'.
    pub data: &'a [u8],
}

#[derive(Default)]
pub struct Sse {
    line: Vec<u8>,
    data: Vec<u8>,
    has_data: bool,
    event: String,
    /// The previous input ended with '\r' (a following '\n' belongs to it).
    after_cr: bool,
    /// The current line is being discarded (too long).
    skipping: bool,
    pub oversized: u64,
}

impl Sse {
    pub fn buffered(&self) -> usize {
        self.line.capacity() + self.data.capacity()
    }

    pub fn feed(&mut self, mut input: &[u8], sink: &mut dyn FnMut(SseEvent<'_>)) {
        if input.is_empty() {
            return;
        }
        if self.after_cr {
            self.after_cr = false;
            if input.first() == Some(&b'\n') {
                input = &input[1..];
            }
        }
        while !input.is_empty() {
            match memchr::memchr2(b'\n', b'\r', input) {
                None => {
                    if !self.skipping {
                        if self.line.len() + input.len() > MAX_EVENT_BYTES {
                            self.skipping = true;
                            self.oversized += 1;
                            self.line.clear();
                        } else {
                            self.line.extend_from_slice(input);
                        }
                    }
                    return;
                }
                Some(i) => {
                    let eol = input[i];
                    if self.skipping {
                        self.skipping = false;
                        self.line.clear();
                    } else if self.line.is_empty() {
                        self.line_done(&input[..i], sink);
                    } else {
                        self.line.extend_from_slice(&input[..i]);
                        let line = std::mem::take(&mut self.line);
                        self.line_done(&line, sink);
                        self.line = line;
                        self.line.clear();
                    }
                    input = &input[i + 1..];
                    if eol == b'\r' {
                        match input.first() {
                            Some(b'\n') => input = &input[1..],
                            None => self.after_cr = true,
                            _ => {}
                        }
                    }
                }
            }
        }
    }

    fn line_done(&mut self, line: &[u8], sink: &mut dyn FnMut(SseEvent<'_>)) {
        if line.is_empty() {
            if self.has_data {
                let ev = if self.event.is_empty() {
                    None
                } else {
                    Some(self.event.as_str())
                };
                sink(SseEvent {
                    event: ev,
                    data: &self.data,
                });
            }
            self.data.clear();
            self.has_data = false;
            self.event.clear();
            return;
        }
        if line[0] == b':' {
            return; // comment / keep-alive
        }
        let (field, value) = match memchr::memchr(b':', line) {
            Some(c) => {
                let v = &line[c + 1..];
                (&line[..c], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &b""[..]),
        };
        match field {
            b"data" => {
                if self.data.len() + value.len() + 1 > MAX_EVENT_BYTES {
                    self.oversized += 1;
                    self.data.clear();
                    self.has_data = false;
                    return;
                }
                if self.has_data {
                    self.data.push(b'\n');
                }
                self.data.extend_from_slice(value);
                self.has_data = true;
            }
            b"event" => {
                self.event.clear();
                self.event.push_str(&String::from_utf8_lossy(value));
            }
            _ => {} // id, retry, unknown fields
        }
    }
}

/// Newline-delimited JSON (Ollama's streams): one object per line.
#[derive(Default)]
pub struct Ndjson {
    line: Vec<u8>,
    skipping: bool,
    pub oversized: u64,
}

impl Ndjson {
    pub fn buffered(&self) -> usize {
        self.line.capacity()
    }

    pub fn feed(&mut self, mut input: &[u8], sink: &mut dyn FnMut(&[u8])) {
        while !input.is_empty() {
            match memchr::memchr(b'\n', input) {
                None => {
                    if !self.skipping {
                        if self.line.len() + input.len() > MAX_EVENT_BYTES {
                            self.skipping = true;
                            self.oversized += 1;
                            self.line.clear();
                        } else {
                            self.line.extend_from_slice(input);
                        }
                    }
                    return;
                }
                Some(i) => {
                    if self.skipping {
                        self.skipping = false;
                    } else if self.line.is_empty() {
                        emit_line(&input[..i], sink);
                    } else {
                        self.line.extend_from_slice(&input[..i]);
                        emit_line(&self.line, sink);
                    }
                    self.line.clear();
                    input = &input[i + 1..];
                }
            }
        }
    }

    /// A final line without a newline (the body ended).
    pub fn finish(&mut self, sink: &mut dyn FnMut(&[u8])) {
        if !self.skipping && !self.line.is_empty() {
            emit_line(&self.line, sink);
        }
        self.line.clear();
    }
}

fn emit_line(line: &[u8], sink: &mut dyn FnMut(&[u8])) {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.iter().any(|b| !b.is_ascii_whitespace()) {
        sink(line);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sse_all(pieces: &[&[u8]]) -> Vec<(Option<String>, Vec<u8>)> {
        let mut p = Sse::default();
        let mut out = vec![];
        for piece in pieces {
            p.feed(piece, &mut |e| {
                out.push((e.event.map(str::to_string), e.data.to_vec()))
            });
        }
        out
    }

    #[test]
    fn sse_events_split_anywhere_decode_the_same() {
        let wire: &[u8] = b": keep-alive\r\nevent: delta\r\ndata: {\"a\":1}\r\n\r\ndata: x\ndata: y\n\n\rdata:z\r\r";
        let whole = sse_all(&[wire]);
        assert_eq!(
            whole,
            vec![
                (Some("delta".into()), b"{\"a\":1}".to_vec()),
                (None, b"x\ny".to_vec()),
                (None, b"z".to_vec()),
            ]
        );
        for i in 0..wire.len() {
            for j in i..wire.len() {
                assert_eq!(
                    sse_all(&[&wire[..i], &wire[i..j], &wire[j..]]),
                    whole,
                    "cuts {i} {j}"
                );
            }
        }
    }

    #[test]
    fn ndjson_lines_split_anywhere_decode_the_same() {
        let wire: &[u8] = b"{\"a\":1}\n\n{\"b\":2}\r\n{\"c\":3}";
        for i in 0..wire.len() {
            let mut p = Ndjson::default();
            let mut out: Vec<Vec<u8>> = vec![];
            p.feed(&wire[..i], &mut |l| out.push(l.to_vec()));
            p.feed(&wire[i..], &mut |l| out.push(l.to_vec()));
            p.finish(&mut |l| out.push(l.to_vec()));
            assert_eq!(
                out,
                vec![
                    b"{\"a\":1}".to_vec(),
                    b"{\"b\":2}".to_vec(),
                    b"{\"c\":3}".to_vec()
                ]
            );
        }
    }

    #[test]
    fn oversized_events_are_dropped_with_bounded_memory() {
        let mut p = Sse::default();
        let big = vec![b'x'; MAX_EVENT_BYTES + 10];
        let mut n = 0;
        p.feed(b"data: ", &mut |_| n += 1);
        p.feed(&big, &mut |_| n += 1);
        p.feed(b"\n\ndata: ok\n\n", &mut |_| n += 1);
        assert_eq!(n, 1);
        assert_eq!(p.oversized, 1);
        assert!(p.line.capacity() <= MAX_EVENT_BYTES * 2);
    }
}
