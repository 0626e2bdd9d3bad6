//! HTTP/2 frames (RFC 9113 §4): one direction's bytes cut into frames.
//! DATA payloads are handed on in pieces as they arrive (never buffered,
//! padding removed, each piece with its offset in the call that carried
//! it); every other frame is buffered whole, bounded by
//! [`MAX_CONTROL_PAYLOAD`].
//!
//! Must not: allocate per DATA frame, keep more than one control frame's
//! payload, or panic on any input.

use crate::decode::MAX_HEAD_BYTES;

pub const HEADER_LEN: usize = 9;

pub const DATA: u8 = 0x0;
pub const HEADERS: u8 = 0x1;
pub const PRIORITY: u8 = 0x2;
pub const RST_STREAM: u8 = 0x3;
pub const SETTINGS: u8 = 0x4;
pub const PUSH_PROMISE: u8 = 0x5;
pub const PING: u8 = 0x6;
pub const GOAWAY: u8 = 0x7;
pub const WINDOW_UPDATE: u8 = 0x8;
pub const CONTINUATION: u8 = 0x9;

pub const END_STREAM: u8 = 0x1;
pub const ACK: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;
pub const PADDED: u8 = 0x8;
pub const PRIORITY_FLAG: u8 = 0x20;

/// The largest frame payload any peer may announce (2^24 − 1).
pub const MAX_FRAME_PAYLOAD: u32 = (1 << 24) - 1;
/// Payload bytes of a non-DATA frame kept at most: a header block
/// fragment larger than a whole head is garbage.
pub const MAX_CONTROL_PAYLOAD: usize = MAX_HEAD_BYTES;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub len: u32,
    pub kind: u8,
    pub flags: u8,
    pub stream: u32,
}

impl Header {
    pub fn parse(b: &[u8; HEADER_LEN]) -> Header {
        Header {
            len: u32::from_be_bytes([0, b[0], b[1], b[2]]),
            kind: b[3],
            flags: b[4],
            stream: u32::from_be_bytes([b[5] & 0x7f, b[6], b[7], b[8]]),
        }
    }

    /// Whether this could be a frame header of a conversation: a known
    /// type on the kind of stream it belongs to, a length its type allows.
    /// Used to find frame boundaries on a connection joined mid-way.
    pub fn plausible(&self) -> bool {
        let on_zero = self.stream == 0;
        // Flags a sender may set on each type (others are ignored by
        // receivers, but no implementation sets them).
        let allowed = match self.kind {
            DATA => END_STREAM | PADDED,
            HEADERS => END_STREAM | END_HEADERS | PADDED | PRIORITY_FLAG,
            CONTINUATION => END_HEADERS,
            PUSH_PROMISE => END_HEADERS | PADDED,
            SETTINGS | PING => ACK,
            _ => 0,
        };
        if self.flags & !allowed != 0 {
            return false;
        }
        match self.kind {
            DATA | HEADERS | CONTINUATION => !on_zero && self.len <= MAX_FRAME_PAYLOAD,
            PRIORITY => !on_zero && self.len == 5,
            RST_STREAM => !on_zero && self.len == 4,
            SETTINGS => on_zero && self.len.is_multiple_of(6) && self.len <= 6 * 32,
            PUSH_PROMISE => !on_zero && self.len >= 4,
            PING => on_zero && self.len == 8,
            GOAWAY => on_zero && self.len >= 8 && self.len as usize <= MAX_CONTROL_PAYLOAD,
            WINDOW_UPDATE => self.len == 4,
            _ => false,
        }
    }
}

/// Why a direction's bytes stopped being HTTP/2 frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameError {
    /// A non-DATA frame longer than [`MAX_CONTROL_PAYLOAD`].
    ControlTooLarge,
    /// Padding longer than the frame (RFC 9113 §6.1).
    BadPadding,
}

/// What the reader found in a call's bytes.
pub enum Event<'a> {
    /// DATA payload bytes of `stream`, padding removed; `off` is where
    /// they start in the call's bytes.
    Data {
        stream: u32,
        bytes: &'a [u8],
        off: usize,
        /// These are the frame's first payload bytes.
        first: bool,
    },
    /// A DATA frame ended (its last payload byte was in this call).
    DataEnd { stream: u32, end_stream: bool },
    /// A whole non-DATA frame; `off` is where its header started in this
    /// call (0 when it started in an earlier call).
    Frame {
        h: Header,
        payload: &'a [u8],
        off: usize,
    },
}

enum Cur {
    /// Reading a frame header.
    Head,
    /// Inside a DATA frame: `left` payload bytes to go, of which the last
    /// `pad` are padding; `pad_len_next`: the pad-length byte comes next.
    Data {
        h: Header,
        left: u32,
        pad: u32,
        pad_len_next: bool,
        /// No payload byte handed on yet.
        fresh: bool,
    },
    /// Inside another frame: `left` bytes to collect into `buf`.
    Other { h: Header, left: u32, start: usize },
}

pub struct Reader {
    hdr: [u8; HEADER_LEN],
    hlen: usize,
    cur: Cur,
    buf: Vec<u8>,
}

impl Default for Reader {
    fn default() -> Self {
        Reader {
            hdr: [0; HEADER_LEN],
            hlen: 0,
            cur: Cur::Head,
            buf: Vec::new(),
        }
    }
}

impl Reader {
    /// Heap bytes held (a control frame in progress).
    pub fn buffered(&self) -> usize {
        self.buf.capacity()
    }

    /// Whether the reader sits at a frame boundary.
    pub fn at_boundary(&self) -> bool {
        matches!(self.cur, Cur::Head) && self.hlen == 0
    }

    /// Cuts `data` into frames, calling `f` for each event in order.
    pub fn feed(&mut self, data: &[u8], f: &mut dyn FnMut(Event<'_>)) -> Result<(), FrameError> {
        let mut at = 0usize;
        while at < data.len() {
            match &mut self.cur {
                Cur::Head => {
                    let n = (HEADER_LEN - self.hlen).min(data.len() - at);
                    self.hdr[self.hlen..self.hlen + n].copy_from_slice(&data[at..at + n]);
                    self.hlen += n;
                    at += n;
                    if self.hlen < HEADER_LEN {
                        break;
                    }
                    self.hlen = 0;
                    let h = Header::parse(&self.hdr);
                    let start = at.saturating_sub(HEADER_LEN);
                    if h.kind == DATA {
                        let padded = h.flags & PADDED != 0;
                        if padded && h.len == 0 {
                            return Err(FrameError::BadPadding);
                        }
                        self.cur = Cur::Data {
                            h,
                            left: h.len,
                            pad: 0,
                            pad_len_next: padded,
                            fresh: true,
                        };
                        if h.len == 0 {
                            self.cur = Cur::Head;
                            f(Event::DataEnd {
                                stream: h.stream,
                                end_stream: h.flags & END_STREAM != 0,
                            });
                        }
                    } else {
                        if h.len as usize > MAX_CONTROL_PAYLOAD {
                            return Err(FrameError::ControlTooLarge);
                        }
                        self.buf.clear();
                        self.cur = Cur::Other {
                            h,
                            left: h.len,
                            start,
                        };
                        if h.len == 0 {
                            self.cur = Cur::Head;
                            f(Event::Frame {
                                h,
                                payload: &[],
                                off: start,
                            });
                        }
                    }
                }
                Cur::Data {
                    h,
                    left,
                    pad,
                    pad_len_next,
                    fresh,
                } => {
                    if *pad_len_next {
                        *pad = u32::from(data[at]);
                        *left -= 1;
                        at += 1;
                        *pad_len_next = false;
                        if *pad > *left {
                            return Err(FrameError::BadPadding);
                        }
                    }
                    let take = (*left as usize).min(data.len() - at);
                    // Payload bytes before the padding.
                    let content_left = left.saturating_sub(*pad) as usize;
                    let content = take.min(content_left);
                    let h = *h;
                    *left -= take as u32;
                    let done = *left == 0;
                    if content > 0 {
                        let first = std::mem::replace(fresh, false);
                        f(Event::Data {
                            stream: h.stream,
                            bytes: &data[at..at + content],
                            off: at,
                            first,
                        });
                    }
                    at += take;
                    if done {
                        self.cur = Cur::Head;
                        f(Event::DataEnd {
                            stream: h.stream,
                            end_stream: h.flags & END_STREAM != 0,
                        });
                    }
                }
                Cur::Other { h, left, start } => {
                    let take = (*left as usize).min(data.len() - at);
                    let h = *h;
                    let start = *start;
                    *left -= take as u32;
                    let done = *left == 0;
                    if done && self.buf.is_empty() && take == h.len as usize {
                        // Whole in this call: no copy.
                        self.cur = Cur::Head;
                        f(Event::Frame {
                            h,
                            payload: &data[at..at + take],
                            off: start,
                        });
                    } else {
                        self.buf.extend_from_slice(&data[at..at + take]);
                        if done {
                            self.cur = Cur::Head;
                            let payload = std::mem::take(&mut self.buf);
                            f(Event::Frame {
                                h,
                                payload: &payload,
                                off: 0,
                            });
                            self.buf = payload;
                            self.buf.clear();
                            if self.buf.capacity() > 4096 {
                                self.buf = Vec::new();
                            }
                        } else if let Cur::Other { start, .. } = &mut self.cur {
                            *start = 0;
                        }
                    }
                    at += take;
                }
            }
        }
        // A frame still open goes on in a later call: its start is not in it.
        if let Cur::Other { start, .. } = &mut self.cur {
            *start = 0;
        }
        Ok(())
    }
}

/// Where frames start in `data`, a call on a connection joined mid-way:
/// the first offset from which plausible frame headers chain to the end
/// of `data` (the last frame may run past it), with at least one whole
/// frame. Offsets past one maximum-size control frame are not tried.
pub fn find_boundary(data: &[u8]) -> Option<usize> {
    let limit = data.len().min(16_384 + HEADER_LEN);
    (0..limit).find(|&start| chains(&data[start..], start == 0))
}

/// Whether `data` is a chain of plausible frames (at least `min` whole
/// ones: two when the chain starts mid-call, since one header can be
/// look-alike bytes).
fn chains(data: &[u8], first: bool) -> bool {
    // Enough evidence (and a bound on the work a crafted call can cause:
    // at most this many headers per offset tried).
    const ENOUGH: usize = 64;
    let mut at = 0usize;
    let mut whole = 0;
    while let Some(b) = data.get(at..at + HEADER_LEN) {
        if whole == ENOUGH {
            break;
        }
        let h = Header::parse(b.try_into().expect("9 bytes"));
        if !h.plausible() {
            return false;
        }
        let end = at + HEADER_LEN + h.len as usize;
        if end > data.len() {
            break;
        }
        whole += 1;
        at = end;
    }
    // What is left is a frame (or a header) the next call completes.
    whole >= if first { 1 } else { 2 }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = payload.len() as u32;
        let mut v = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
        v.extend_from_slice(&stream.to_be_bytes());
        v.extend_from_slice(payload);
        v
    }

    #[derive(Debug, PartialEq)]
    enum Seen {
        Data(u32, Vec<u8>),
        End(u32, bool),
        Frame(u8, u32, Vec<u8>),
    }

    fn read(r: &mut Reader, data: &[u8], seen: &mut Vec<Seen>) -> Result<(), FrameError> {
        r.feed(data, &mut |e| match e {
            Event::Data { stream, bytes, .. } => match seen.last_mut() {
                Some(Seen::Data(s, b)) if *s == stream => b.extend_from_slice(bytes),
                _ => seen.push(Seen::Data(stream, bytes.to_vec())),
            },
            Event::DataEnd { stream, end_stream } => seen.push(Seen::End(stream, end_stream)),
            Event::Frame { h, payload, .. } => {
                seen.push(Seen::Frame(h.kind, h.stream, payload.to_vec()))
            }
        })
    }

    fn sample() -> Vec<u8> {
        let mut v = frame(SETTINGS, 0, 0, &[0, 3, 0, 0, 0, 100]);
        v.extend(frame(HEADERS, END_HEADERS, 1, b"\x82\x86"));
        v.extend(frame(DATA, PADDED, 1, b"\x03hello\0\0\0"));
        v.extend(frame(DATA, END_STREAM, 1, b"world"));
        v.extend(frame(DATA, 0, 3, b""));
        v
    }

    #[test]
    fn frames_split_at_every_byte_read_the_same_as_whole() {
        let all = sample();
        let mut whole = vec![];
        read(&mut Reader::default(), &all, &mut whole).unwrap();
        assert_eq!(
            whole,
            vec![
                Seen::Frame(SETTINGS, 0, vec![0, 3, 0, 0, 0, 100]),
                Seen::Frame(HEADERS, 1, b"\x82\x86".to_vec()),
                Seen::Data(1, b"hello".to_vec()),
                Seen::End(1, false),
                Seen::Data(1, b"world".to_vec()),
                Seen::End(1, true),
                Seen::End(3, false),
            ]
        );
        for cut in 0..all.len() {
            let mut r = Reader::default();
            let mut seen = vec![];
            read(&mut r, &all[..cut], &mut seen).unwrap();
            read(&mut r, &all[cut..], &mut seen).unwrap();
            assert_eq!(seen, whole, "cut at {cut}");
        }
        let mut r = Reader::default();
        let mut seen = vec![];
        for b in &all {
            read(&mut r, std::slice::from_ref(b), &mut seen).unwrap();
        }
        assert_eq!(seen, whole, "byte by byte");
    }

    #[test]
    fn bad_padding_and_huge_control_frames_are_errors() {
        let mut r = Reader::default();
        let f = frame(DATA, PADDED, 1, b"\x09abc");
        assert_eq!(r.feed(&f, &mut |_| {}), Err(FrameError::BadPadding));
        let mut r = Reader::default();
        let mut h = frame(HEADERS, 0, 1, b"");
        h[0] = 0x10; // 1 MiB header block fragment
        assert_eq!(r.feed(&h, &mut |_| {}), Err(FrameError::ControlTooLarge));
    }

    #[test]
    fn boundaries_are_found_in_a_call_that_starts_mid_frame() {
        let all = sample();
        assert_eq!(find_boundary(&all), Some(0));
        // Starting inside the SETTINGS payload: the next frame is found.
        let from = 9 + 6; // the HEADERS frame
        assert_eq!(find_boundary(&all[3..]), Some(from - 3));
        assert_eq!(find_boundary(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"), None);
        assert_eq!(find_boundary(b""), None);
    }
}
