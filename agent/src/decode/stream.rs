//! Incremental stream decoders for response bodies: Server-Sent Events and
//! newline-delimited JSON, both on one bounded line splitter
//! (`LineBuffer`). Input may be split at any byte; sinks are called once
//! per complete event, in order.
//!
//! Owns: partial lines and the SSE event being assembled. Must not: hold
//! more than about `MAX_EVENT_BYTES` plus one input piece per stream
//! (longer lines and events are dropped and counted), or interpret JSON.

/// An event or line larger than this is dropped (and counted).
pub const MAX_EVENT_BYTES: usize = 1 << 20;

/// Splits a byte stream into lines, whatever the input's split points.
/// Lines end at `\n` or `\r\n`, and also at a lone `\r` when built with
/// `lone_cr_ends_line` (SSE's rule); the terminator is not part of the
/// line. A line growing past `MAX_EVENT_BYTES` while buffered is skipped
/// up to its end and counted in `oversized`.
pub struct LineBuffer {
    line: Vec<u8>,
    lone_cr_ends_line: bool,
    /// The previous input ended with a line-ending '\r' (a following '\n'
    /// belongs to it).
    after_cr: bool,
    /// The current line is being discarded (too long).
    skipping: bool,
    pub oversized: u64,
}

impl LineBuffer {
    pub fn new(lone_cr_ends_line: bool) -> Self {
        Self {
            line: Vec::new(),
            lone_cr_ends_line,
            after_cr: false,
            skipping: false,
            oversized: 0,
        }
    }

    /// Heap bytes held for a partial line.
    pub fn buffered(&self) -> usize {
        self.line.capacity()
    }

    /// The memory budget wants the partial line back: it is dropped and
    /// the rest of it skipped. Whether anything was held.
    pub fn shed(&mut self) -> bool {
        let held = self.line.capacity() > 0;
        if !self.line.is_empty() {
            self.skipping = true;
        }
        self.line = Vec::new();
        held
    }

    /// Calls `on_line` for every line completed by `input`. A line that
    /// arrives whole in one piece is passed without being copied.
    #[inline]
    pub fn feed(&mut self, mut input: &[u8], on_line: &mut impl FnMut(&[u8])) {
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
            let eol = if self.lone_cr_ends_line {
                memchr::memchr2(b'\n', b'\r', input)
            } else {
                memchr::memchr(b'\n', input)
            };
            let Some(i) = eol else {
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
            };
            if self.skipping {
                self.skipping = false;
            } else if self.line.is_empty() {
                on_line(self.strip_cr(&input[..i]));
            } else {
                self.line.extend_from_slice(&input[..i]);
                let line = std::mem::take(&mut self.line);
                on_line(self.strip_cr(&line));
                self.line = line;
            }
            self.line.clear();
            let ended_by_cr = input[i] == b'\r';
            input = &input[i + 1..];
            if ended_by_cr {
                match input.first() {
                    Some(b'\n') => input = &input[1..],
                    None => self.after_cr = true,
                    _ => {}
                }
            }
        }
    }

    /// The input ended: a last line without a terminator is complete.
    pub fn finish(&mut self, on_line: &mut impl FnMut(&[u8])) {
        if !self.skipping && !self.line.is_empty() {
            let line = std::mem::take(&mut self.line);
            on_line(self.strip_cr(&line));
        }
        self.line.clear();
        self.skipping = false;
    }

    /// Without lone-CR line ends, a `\r\n` leaves its '\r' on the line.
    #[inline]
    fn strip_cr<'l>(&self, line: &'l [u8]) -> &'l [u8] {
        if self.lone_cr_ends_line {
            line
        } else {
            line.strip_suffix(b"\r").unwrap_or(line)
        }
    }
}

/// One dispatched SSE event.
pub struct SseEvent<'a> {
    /// The `event:` field, when present.
    pub event: Option<&'a str>,
    /// `data:` lines joined with '\n'.
    pub data: &'a [u8],
}

/// Server-Sent Events (`text/event-stream`).
pub struct Sse {
    lines: LineBuffer,
    event: EventFields,
}

impl Default for Sse {
    fn default() -> Self {
        Self {
            lines: LineBuffer::new(true),
            event: EventFields::default(),
        }
    }
}

/// The fields of the SSE event being assembled.
#[derive(Default)]
struct EventFields {
    data: Vec<u8>,
    has_data: bool,
    event: String,
    /// Events whose data grew past `MAX_EVENT_BYTES`.
    oversized: u64,
    /// The event being assembled was shed (memory budget): skip to its end.
    lost: bool,
}

impl Sse {
    /// Heap bytes held (partial line and event data).
    pub fn buffered(&self) -> usize {
        self.lines.buffered() + self.event.data.capacity()
    }

    /// Lines and events dropped for size.
    pub fn oversized(&self) -> u64 {
        self.lines.oversized + self.event.oversized
    }

    /// The memory budget wants the partial line and event back: the event
    /// being assembled is dropped (its remaining lines skipped up to the
    /// blank line that ends it). Whether anything was held.
    pub fn shed(&mut self) -> bool {
        let line = self.lines.shed();
        let ev = self.event.data.capacity() > 0;
        if self.event.has_data || line {
            self.event.lost = true;
        }
        self.event.data = Vec::new();
        self.event.has_data = false;
        line || ev
    }

    pub fn feed(&mut self, input: &[u8], sink: &mut dyn FnMut(SseEvent<'_>)) {
        let Sse { lines, event } = self;
        lines.feed(input, &mut |line| event.line(line, sink));
    }
}

impl EventFields {
    fn line(&mut self, line: &[u8], sink: &mut dyn FnMut(SseEvent<'_>)) {
        if self.lost {
            // The rest of an event the memory budget took.
            if line.is_empty() {
                self.lost = false;
                self.data.clear();
                self.has_data = false;
                self.event.clear();
            }
            return;
        }
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

/// Newline-delimited JSON (Ollama's streams): one object per line; blank
/// lines are skipped.
pub struct Ndjson {
    lines: LineBuffer,
}

impl Default for Ndjson {
    fn default() -> Self {
        Self {
            lines: LineBuffer::new(false),
        }
    }
}

impl Ndjson {
    pub fn buffered(&self) -> usize {
        self.lines.buffered()
    }

    /// The memory budget wants the partial line back (see [`LineBuffer::shed`]).
    pub fn shed(&mut self) -> bool {
        self.lines.shed()
    }

    /// Lines dropped for size.
    pub fn oversized(&self) -> u64 {
        self.lines.oversized
    }

    pub fn feed(&mut self, input: &[u8], sink: &mut dyn FnMut(&[u8])) {
        self.lines.feed(input, &mut |line| emit_line(line, sink));
    }

    /// A final line without a newline (the body ended).
    pub fn finish(&mut self, sink: &mut dyn FnMut(&[u8])) {
        self.lines.finish(&mut |line| emit_line(line, sink));
    }
}

fn emit_line(line: &[u8], sink: &mut dyn FnMut(&[u8])) {
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
        assert_eq!(p.oversized(), 1);
        assert!(p.buffered() <= MAX_EVENT_BYTES * 2);
    }

    fn lines_of(lone_cr: bool, pieces: &[&[u8]]) -> (Vec<Vec<u8>>, u64) {
        let mut b = LineBuffer::new(lone_cr);
        let mut out = vec![];
        for p in pieces {
            b.feed(p, &mut |l| out.push(l.to_vec()));
        }
        b.finish(&mut |l| out.push(l.to_vec()));
        (out, b.oversized)
    }

    #[test]
    fn line_buffer_splits_at_lf_crlf_and_lone_cr_only_when_asked() {
        let wire: &[u8] = b"a\r\nb\rc\n\nd";
        let sse = vec![
            b"a".to_vec(),
            b"b".to_vec(),
            b"c".to_vec(),
            vec![],
            b"d".to_vec(),
        ];
        let nd = vec![b"a".to_vec(), b"b\rc".to_vec(), vec![], b"d".to_vec()];
        for i in 0..=wire.len() {
            assert_eq!(lines_of(true, &[&wire[..i], &wire[i..]]).0, sse, "cut {i}");
            assert_eq!(lines_of(false, &[&wire[..i], &wire[i..]]).0, nd, "cut {i}");
        }
        // One byte at a time.
        let bytes: Vec<&[u8]> = wire.chunks(1).collect();
        assert_eq!(lines_of(true, &bytes).0, sse);
        assert_eq!(lines_of(false, &bytes).0, nd);
    }

    #[test]
    fn line_buffer_skips_an_oversized_line_to_its_end_and_keeps_going() {
        let big = vec![b'x'; MAX_EVENT_BYTES / 2 + 1];
        let (lines, oversized) = lines_of(false, &[b"ok\n", &big, &big, &big, b"tail\nnext\n"]);
        assert_eq!(lines, vec![b"ok".to_vec(), b"next".to_vec()]);
        assert_eq!(oversized, 1);
        let mut b = LineBuffer::new(true);
        b.feed(&big, &mut |_| {});
        b.feed(&big, &mut |_| {});
        assert!(b.buffered() <= MAX_EVENT_BYTES * 2);
    }
}
