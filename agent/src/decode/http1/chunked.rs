//! Incremental decoder for HTTP/1.1 chunked transfer coding. Feeds body
//! bytes to a sink and stops exactly at the end of the message (after the
//! trailer), leaving the next message's bytes unconsumed.

/// A chunk-size line or trailer line longer than this is garbage.
const MAX_LINE: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum St {
    Size,
    Data,
    DataCr,
    DataLf,
    Trailer,
    Done,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkedError(pub &'static str);

#[derive(Debug, Clone)]
pub struct Chunked {
    st: St,
    left: u64,
    line: Vec<u8>,
}

impl Default for Chunked {
    fn default() -> Self {
        Self {
            st: St::Size,
            left: 0,
            line: Vec::new(),
        }
    }
}

fn parse_size(line: &[u8]) -> Result<u64, ChunkedError> {
    let line = match line.iter().position(|&b| b == b';') {
        Some(i) => &line[..i],
        None => line,
    };
    let s = std::str::from_utf8(line).map_err(|_| ChunkedError("chunk size is not ASCII"))?;
    let s = s.trim();
    if s.is_empty() || s.len() > 16 {
        return Err(ChunkedError("bad chunk size"));
    }
    u64::from_str_radix(s, 16).map_err(|_| ChunkedError("bad chunk size"))
}

impl Chunked {
    pub fn is_done(&self) -> bool {
        self.st == St::Done
    }

    /// Skip `n` body bytes that were not captured (a truncated call).
    /// Returns false when the gap is not inside chunk data, so the stream
    /// cannot be followed any more.
    pub fn skip(&mut self, n: u64) -> bool {
        if self.st == St::Data && n <= self.left {
            self.left -= n;
            if self.left == 0 {
                self.st = St::DataCr;
            }
            true
        } else {
            n == 0
        }
    }

    /// Consumes from `input`, passing chunk payload to `sink`. Returns how
    /// many bytes were consumed (less than `input.len()` only when the
    /// message ended).
    pub fn feed(
        &mut self,
        input: &[u8],
        sink: &mut dyn FnMut(&[u8]),
    ) -> Result<usize, ChunkedError> {
        let mut i = 0;
        while i < input.len() {
            match self.st {
                St::Done => return Ok(i),
                St::Size | St::Trailer => {
                    let rest = &input[i..];
                    match memchr::memchr(b'\n', rest) {
                        None => {
                            if self.line.len() + rest.len() > MAX_LINE {
                                return Err(ChunkedError("chunk line too long"));
                            }
                            self.line.extend_from_slice(rest);
                            i = input.len();
                        }
                        Some(nl) => {
                            if self.line.len() + nl > MAX_LINE {
                                return Err(ChunkedError("chunk line too long"));
                            }
                            self.line.extend_from_slice(&rest[..nl]);
                            i += nl + 1;
                            if self.line.last() == Some(&b'\r') {
                                self.line.pop();
                            }
                            if self.st == St::Size {
                                let size = parse_size(&self.line)?;
                                self.line.clear();
                                if size == 0 {
                                    self.st = St::Trailer;
                                } else {
                                    self.left = size;
                                    self.st = St::Data;
                                }
                            } else {
                                let empty = self.line.is_empty();
                                self.line.clear();
                                if empty {
                                    self.st = St::Done;
                                    return Ok(i);
                                }
                            }
                        }
                    }
                }
                St::Data => {
                    let n = (input.len() - i).min(self.left.min(usize::MAX as u64) as usize);
                    sink(&input[i..i + n]);
                    i += n;
                    self.left -= n as u64;
                    if self.left == 0 {
                        self.st = St::DataCr;
                    }
                }
                St::DataCr => {
                    match input[i] {
                        b'\r' => self.st = St::DataLf,
                        b'\n' => self.st = St::Size,
                        _ => return Err(ChunkedError("missing CRLF after chunk")),
                    }
                    i += 1;
                }
                St::DataLf => {
                    if input[i] != b'\n' {
                        return Err(ChunkedError("missing LF after chunk"));
                    }
                    self.st = St::Size;
                    i += 1;
                }
            }
        }
        Ok(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_split(wire: &[u8], cuts: &[usize]) -> (Vec<u8>, usize, bool) {
        let mut c = Chunked::default();
        let mut body = Vec::new();
        let mut consumed = 0;
        let mut last = 0;
        for &cut in cuts.iter().chain(std::iter::once(&wire.len())) {
            let piece = &wire[last..cut];
            let n = c.feed(piece, &mut |b| body.extend_from_slice(b)).unwrap();
            consumed += n;
            last = cut;
            if c.is_done() {
                break;
            }
        }
        (body, consumed, c.is_done())
    }

    #[test]
    fn decodes_across_every_split_point_and_stops_at_the_end() {
        let wire = b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: 1\r\n\r\nNEXT";
        for cut in 0..wire.len() {
            let (body, consumed, done) = decode_split(wire, &[cut]);
            assert!(done, "cut {cut}");
            assert_eq!(body, b"hello world", "cut {cut}");
            assert_eq!(consumed, wire.len() - 4, "cut {cut}");
        }
    }

    #[test]
    fn garbage_sizes_and_endless_lines_are_errors() {
        let mut c = Chunked::default();
        assert!(c.feed(b"zz\r\n", &mut |_| {}).is_err());
        let mut c = Chunked::default();
        assert!(c.feed(&vec![b'1'; 10_000], &mut |_| {}).is_err());
        let mut c = Chunked::default();
        assert!(c.feed(b"2\r\nabX", &mut |_| {}).is_err());
    }
}
