//! A request body read as it streams past, never kept: one pass over the
//! JSON learns what [`RequestInfo`] says (model, stream flag, prompt
//! characters, `user`, tools offered, the top-level keys request-type
//! rules ask about) and the body's fingerprint, holding a few hundred
//! bytes whatever the body's size — a 1 MB prompt costs what a 1 KB one
//! does.
//!
//! It agrees with [`request_info_with`] on every JSON object without
//! duplicate keys below the top level (a property test holds it to that);
//! the differences are where the scan cannot afford the whole document: a
//! duplicated key inside a message counts every copy's text (serde keeps
//! the last), and a number beyond f64's range is accepted (serde refuses
//! the body). Anything that is not a JSON object gives the default, as the
//! parser does.
//!
//! Owns: the scan state of one body. Must not: keep body bytes beyond the
//! small values it reads (model, user, keys), or allocate per byte.
//!
//! [`request_info_with`]: super::formats::request_info_with

use super::formats::RequestInfo;

/// Top-level keys whose text is the prompt (as `request_info_with` reads).
const PROMPT_KEYS: [&str; 5] = ["messages", "prompt", "input", "inputs", "text_input"];
/// Object keys below a prompt key whose text counts.
const TEXT_KEYS: [&str; 6] = ["content", "text", "prompt", "input", "inputs", "text_input"];
/// Deepest nesting accepted (serde_json's recursion limit).
const MAX_DEPTH: usize = 128;
/// Longest `model` or `user` value read (longer: not read).
const MAX_VALUE: usize = 1024;
/// Longest key compared (a longer one matches no name).
const MAX_KEY: usize = 256;

/// Which top-level key a value belongs to.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Top {
    None,
    Model,
    Stream,
    User,
    Tools(usize),
    Prompt(usize),
    Other,
}

#[derive(Clone, Copy, Debug)]
struct Frame {
    obj: bool,
    /// Strings directly in this container count as prompt text (arrays);
    /// values of text keys do (objects).
    count: bool,
    /// The tools slot whose array this is (non-empty once an element starts).
    tools: Option<usize>,
    /// The top-level key this container is the value of (depth 1 only).
    top: Top,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Num {
    Minus,
    Zero,
    Int,
    Dot,
    Frac,
    Exp,
    ExpSign,
    ExpDigits,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Esc {
    None,
    Backslash,
    /// Hex digits of a `\u` escape read so far, and their value.
    Hex(u8, u32),
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum St {
    /// Before the root value.
    Start,
    /// A value is expected (after `:` or `,` in an array, or `[`).
    Value,
    /// After `[`: a value or `]`.
    ArrOpen,
    /// After `{`: a key or `}`.
    ObjOpen,
    /// After `,` in an object: a key.
    Key,
    /// After a key: `:`.
    Colon,
    /// After a value: `,`, a closing bracket, or (at the root) the end.
    After,
    Str,
    Num(Num),
    Lit(&'static [u8], u8),
    /// The root object ended: only whitespace may follow.
    Done,
    Invalid,
}

/// The scan of one request body.
pub struct RequestScan {
    st: St,
    stack: Vec<Frame>,
    /// The string being read is a key.
    in_key: bool,
    /// Count the string being read as prompt text.
    counting: bool,
    /// Keep the string being read (a key, `model`, `user`) up to `cap`.
    small: Vec<u8>,
    cap: usize,
    keep: bool,
    over: bool,
    esc: Esc,
    /// A high surrogate waits for its low half.
    high: Option<u32>,
    /// UTF-8 continuation bytes still due, and the range the next must be in.
    utf8_left: u8,
    utf8_lo: u8,
    utf8_hi: u8,
    /// The value about to start: its context.
    next_count: bool,
    next_top: Top,
    /// The last key read (decoded, bounded).
    key: Vec<u8>,
    key_over: bool,
    // What the body says (the last occurrence of a top-level key wins).
    model: Option<String>,
    stream: Option<bool>,
    user: Option<String>,
    tools: [bool; 2],
    prompt: [u64; PROMPT_KEYS.len()],
    field_names: Vec<String>,
    fields: Vec<bool>,
    /// The prompt slot the string being read counts toward.
    slot: usize,
    /// The document is not JSON (as far as it was seen).
    broken: bool,
    /// Bytes were lost (the capture cut the body): the prompt is then
    /// estimated, not counted. Body bytes seen when the first loss came,
    /// and bytes lost in all.
    gap: bool,
    gap_at: u64,
    lost: u64,
    bytes: u64,
    hash: BodyHash,
    /// The body itself, kept for the engine's tokenizer
    /// ([`RequestScan::keep_body`]); None once it would pass
    /// `KeptText::MAX_BYTES` or bytes were lost.
    body: Option<Vec<u8>>,
}

/// The streamed form of [`super::body_fingerprint`]: the same value for
/// the same bytes, however they were split.
pub struct BodyHash(std::collections::hash_map::DefaultHasher);

impl BodyHash {
    pub fn new() -> Self {
        use std::hash::BuildHasher;
        static KEY: std::sync::OnceLock<std::collections::hash_map::RandomState> =
            std::sync::OnceLock::new();
        BodyHash(
            KEY.get_or_init(std::collections::hash_map::RandomState::new)
                .build_hasher(),
        )
    }

    pub fn update(&mut self, b: &[u8]) {
        use std::hash::Hasher;
        self.0.write(b);
    }

    pub fn finish(&self, len: u64) -> u64 {
        use std::hash::Hasher;
        let mut h = self.0.clone();
        h.write_u64(len);
        h.finish()
    }
}

impl Default for BodyHash {
    fn default() -> Self {
        Self::new()
    }
}

impl RequestScan {
    /// A scan noting which of the top-level keys `fields` the body has.
    pub fn new(fields: &[String]) -> Self {
        RequestScan {
            st: St::Start,
            stack: Vec::new(),
            in_key: false,
            counting: false,
            small: Vec::new(),
            cap: 0,
            keep: false,
            over: false,
            esc: Esc::None,
            high: None,
            utf8_left: 0,
            utf8_lo: 0,
            utf8_hi: 0,
            next_count: false,
            next_top: Top::None,
            key: Vec::new(),
            key_over: false,
            model: None,
            stream: None,
            user: None,
            tools: [false; 2],
            prompt: [0; PROMPT_KEYS.len()],
            field_names: Vec::new(),
            fields: Vec::new(),
            slot: 0,
            broken: false,
            gap: false,
            gap_at: 0,
            lost: 0,
            bytes: 0,
            hash: BodyHash::new(),
            body: None,
        }
        .with_fields(fields)
    }

    fn with_fields(mut self, fields: &[String]) -> Self {
        self.fields = vec![false; fields.len()];
        self.field_names = fields.to_vec();
        self
    }

    /// Body bytes seen.
    pub fn len(&self) -> u64 {
        self.bytes
    }

    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    /// Keep the body's bytes too (at most `KeptText::MAX_BYTES`), for the
    /// engine's tokenizer.
    pub fn keep_body(&mut self) {
        if self.bytes == 0 {
            self.body = Some(Vec::new());
        }
    }

    /// The memory budget takes the kept body back. Whether one was held.
    pub fn shed_body(&mut self) -> bool {
        self.body.take().is_some_and(|b| b.capacity() > 0)
    }

    /// The whole body, when it was kept and is a complete JSON document.
    pub fn take_body(&mut self) -> Option<Vec<u8>> {
        let body = self.body.take()?;
        (self.st == St::Done && !self.gap && !self.broken).then_some(body)
    }

    /// Heap bytes held (bounded: keys and small values, the nesting, the
    /// kept body).
    pub fn buffered(&self) -> usize {
        self.body.as_ref().map_or(0, Vec::capacity)
            + self.small.capacity()
            + self.key.capacity()
            + self.stack.capacity() * std::mem::size_of::<Frame>()
    }

    /// `n` body bytes were lost (the capture cut the call, or left it in
    /// the kernel under pressure): what came before still says model and
    /// flags; the prompt's size becomes an estimate — the prompt text
    /// read before the loss, plus every byte after it, lost or read
    /// unparsed (in a body too large to capture whole, the prompt is what
    /// makes it large).
    pub fn gap(&mut self, n: u64) {
        if !self.gap {
            self.gap = true;
            self.gap_at = self.bytes;
        }
        self.lost = self.lost.saturating_add(n);
        self.st = St::Invalid;
        self.body = None;
    }

    /// The next piece of body.
    pub fn feed(&mut self, bytes: &[u8]) {
        self.bytes += bytes.len() as u64;
        self.hash.update(bytes);
        if let Some(b) = &mut self.body {
            if b.len() + bytes.len() > crate::record::KeptText::MAX_BYTES {
                self.body = None;
            } else {
                b.extend_from_slice(bytes);
            }
        }
        for &b in bytes {
            if self.st == St::Invalid {
                return;
            }
            self.byte(b);
        }
    }

    /// What the whole body said, and its fingerprint (None for an empty
    /// body).
    pub fn finish(self) -> (RequestInfo, Option<u64>) {
        let fp = (self.bytes > 0).then(|| self.hash.finish(self.bytes));
        let whole = self.st == St::Done && !self.gap;
        // A body cut by the capture still said what its head said; an
        // invalid or unfinished document says nothing.
        if self.broken || (!whole && !self.gap) {
            return (RequestInfo::default(), fp);
        }
        let mut prompt: u64 = self.prompt.iter().sum();
        if self.gap {
            prompt = prompt
                .saturating_add(self.bytes - self.gap_at)
                .saturating_add(self.lost);
        }
        let info = RequestInfo {
            model: self.model,
            stream: self.stream,
            prompt_chars: (prompt > 0).then_some(prompt),
            user: self.user,
            tools_offered: self.tools.iter().any(|t| *t),
            json_fields: self
                .field_names
                .iter()
                .zip(&self.fields)
                .filter(|(_, had)| **had)
                .map(|(f, _)| f.clone())
                .collect(),
        };
        (info, fp)
    }

    fn fail(&mut self) {
        self.st = St::Invalid;
        self.broken = true;
    }

    fn byte(&mut self, b: u8) {
        let ws = matches!(b, b' ' | b'\t' | b'\n' | b'\r');
        match self.st {
            St::Start => {
                if ws {
                } else if b == b'{' {
                    self.open(true);
                } else {
                    self.fail();
                }
            }
            St::Value | St::ArrOpen => {
                if ws {
                } else if b == b']' && self.st == St::ArrOpen {
                    self.close(false);
                } else {
                    self.value(b);
                }
            }
            St::ObjOpen | St::Key => {
                if ws {
                } else if b == b'"' {
                    self.start_string(true);
                } else if b == b'}' && self.st == St::ObjOpen {
                    self.close(true);
                } else {
                    self.fail();
                }
            }
            St::Colon => {
                if ws {
                } else if b == b':' {
                    self.after_key();
                    self.st = St::Value;
                } else {
                    self.fail();
                }
            }
            St::After => self.after(b, ws),
            St::Str => self.string_byte(b),
            St::Num(n) => self.number(n, b),
            St::Lit(word, at) => {
                if word.get(at as usize) == Some(&b) {
                    if at as usize + 1 == word.len() {
                        if word == b"true" || word == b"false" {
                            self.scalar_end(Some(word == b"true"));
                        } else {
                            self.scalar_end(None);
                        }
                    } else {
                        self.st = St::Lit(word, at + 1);
                    }
                } else {
                    self.fail();
                }
            }
            St::Done => {
                if !ws {
                    self.fail();
                }
            }
            St::Invalid => {}
        }
    }

    /// The context of the value a key introduces.
    fn after_key(&mut self) {
        let key: &[u8] = if self.key_over { b"" } else { &self.key };
        if self.stack.len() == 1 {
            let top = match key {
                b"model" => Top::Model,
                b"stream" => Top::Stream,
                b"user" => Top::User,
                b"tools" => Top::Tools(0),
                b"functions" => Top::Tools(1),
                _ => PROMPT_KEYS
                    .iter()
                    .position(|k| k.as_bytes() == key)
                    .map_or(Top::Other, Top::Prompt),
            };
            for (i, f) in self.field_names.iter().enumerate() {
                if !self.key_over && f.as_bytes() == key {
                    self.fields[i] = true;
                }
            }
            // The last occurrence of a key is the one that holds.
            match top {
                Top::Model => self.model = None,
                Top::Stream => self.stream = None,
                Top::User => self.user = None,
                Top::Tools(i) => self.tools[i] = false,
                Top::Prompt(i) => self.prompt[i] = 0,
                _ => {}
            }
            self.next_count = matches!(top, Top::Prompt(_));
            self.next_top = top;
        } else {
            let parent = self.stack.last().is_some_and(|f| f.count);
            self.next_count = parent && TEXT_KEYS.iter().any(|k| k.as_bytes() == key);
            self.next_top = Top::None;
        }
    }

    fn value(&mut self, b: u8) {
        // An element of an array: its context is the array's.
        if let Some(f) = self.stack.last().copied() {
            if !f.obj {
                self.next_count = f.count;
                self.next_top = Top::None;
                if let Some(i) = f.tools {
                    self.tools[i] = true;
                }
            }
        }
        match b {
            b'"' => self.start_string(false),
            b'{' => self.open(true),
            b'[' => self.open(false),
            b't' => self.st = St::Lit(b"true", 1),
            b'f' => self.st = St::Lit(b"false", 1),
            b'n' => self.st = St::Lit(b"null", 1),
            b'-' => self.st = St::Num(Num::Minus),
            b'0' => self.st = St::Num(Num::Zero),
            b'1'..=b'9' => self.st = St::Num(Num::Int),
            _ => self.fail(),
        }
    }

    fn open(&mut self, obj: bool) {
        if self.stack.len() >= MAX_DEPTH {
            return self.fail();
        }
        let (count, top) = if self.stack.is_empty() {
            (false, Top::None)
        } else {
            (self.next_count, self.next_top)
        };
        let tools = match top {
            Top::Tools(i) if !obj => Some(i),
            _ => None,
        };
        self.stack.push(Frame {
            obj,
            count,
            tools,
            top,
        });
        self.st = if obj { St::ObjOpen } else { St::ArrOpen };
    }

    fn close(&mut self, obj: bool) {
        match self.stack.pop() {
            Some(f) if f.obj == obj => {}
            _ => return self.fail(),
        }
        self.st = if self.stack.is_empty() {
            St::Done
        } else {
            St::After
        };
    }

    fn after(&mut self, b: u8, ws: bool) {
        if ws {
            return;
        }
        let Some(f) = self.stack.last() else {
            return self.fail();
        };
        match (b, f.obj) {
            (b',', true) => self.st = St::Key,
            (b',', false) => self.st = St::Value,
            (b'}', true) => self.close(true),
            (b']', false) => self.close(false),
            _ => self.fail(),
        }
    }

    /// A number, literal or string value ended; `flag` is a boolean's.
    fn scalar_end(&mut self, flag: Option<bool>) {
        if self.stack.len() == 1 && self.next_top == Top::Stream {
            self.stream = flag;
        }
        self.st = St::After;
    }

    fn start_string(&mut self, key: bool) {
        self.in_key = key;
        self.esc = Esc::None;
        self.high = None;
        self.over = false;
        self.small.clear();
        if key {
            self.keep = true;
            // Below the top level only text keys matter: 16 bytes tell.
            self.cap = if self.stack.len() == 1 { MAX_KEY } else { 16 };
            self.counting = false;
        } else {
            let top = if self.stack.len() == 1 {
                self.next_top
            } else {
                Top::None
            };
            self.keep = matches!(top, Top::Model | Top::User);
            // `user` as the tenant reader sees it: a longer one is cut.
            self.cap = if top == Top::User {
                crate::identity::caller::LOOK_BYTES + 1
            } else {
                MAX_VALUE
            };
            // The prompt key this text is under: the value's own key at
            // the top level, else the key of the container at depth 1.
            let under = if self.stack.len() == 1 {
                self.next_top
            } else {
                self.stack.get(1).map_or(Top::None, |f| f.top)
            };
            match under {
                Top::Prompt(i) => {
                    self.slot = i;
                    self.counting = self.next_count;
                }
                _ => self.counting = false,
            }
        }
        self.st = St::Str;
    }

    #[inline]
    fn keep_bytes(&mut self, b: &[u8]) {
        if !self.keep || self.over {
            return;
        }
        let room = self.cap - self.small.len();
        if b.len() > room {
            // What fits is kept (a `user` is read cut, as its reader would).
            self.small.extend_from_slice(&b[..room]);
            self.over = true;
            return;
        }
        self.small.extend_from_slice(b);
    }

    #[inline]
    fn char_counted(&mut self) {
        if self.counting {
            self.prompt[self.slot] += 1;
        }
    }

    fn push_code_point(&mut self, cp: u32) {
        match char::from_u32(cp) {
            Some(c) => {
                let mut buf = [0u8; 4];
                let n = c.encode_utf8(&mut buf).len();
                self.keep_bytes(&buf[..n]);
                self.char_counted();
            }
            None => self.fail(),
        }
    }

    fn string_byte(&mut self, b: u8) {
        if self.utf8_left > 0 {
            if b < self.utf8_lo || b > self.utf8_hi {
                return self.fail();
            }
            self.utf8_left -= 1;
            self.utf8_lo = 0x80;
            self.utf8_hi = 0xBF;
            self.keep_bytes(&[b]);
            return;
        }
        match self.esc {
            Esc::Backslash => {
                let c = match b {
                    b'"' => b'"',
                    b'\\' => b'\\',
                    b'/' => b'/',
                    b'b' => 8,
                    b'f' => 12,
                    b'n' => b'\n',
                    b'r' => b'\r',
                    b't' => b'\t',
                    b'u' => {
                        self.esc = Esc::Hex(0, 0);
                        return;
                    }
                    _ => return self.fail(),
                };
                self.esc = Esc::None;
                if self.high.is_some() {
                    return self.fail();
                }
                self.keep_bytes(&[c]);
                self.char_counted();
                return;
            }
            Esc::Hex(n, v) => {
                let d = match b {
                    b'0'..=b'9' => b - b'0',
                    b'a'..=b'f' => b - b'a' + 10,
                    b'A'..=b'F' => b - b'A' + 10,
                    _ => return self.fail(),
                };
                let v = v << 4 | u32::from(d);
                if n < 3 {
                    self.esc = Esc::Hex(n + 1, v);
                    return;
                }
                self.esc = Esc::None;
                match (self.high.take(), v) {
                    (None, 0xD800..=0xDBFF) => self.high = Some(v),
                    (None, 0xDC00..=0xDFFF) => self.fail(),
                    (None, v) => self.push_code_point(v),
                    (Some(h), 0xDC00..=0xDFFF) => {
                        self.push_code_point(0x10000 + ((h - 0xD800) << 10) + (v - 0xDC00))
                    }
                    (Some(_), _) => self.fail(),
                }
                return;
            }
            Esc::None => {}
        }
        if self.high.is_some() && b != b'\\' {
            // A lone high surrogate.
            return self.fail();
        }
        match b {
            b'"' => self.string_end(),
            b'\\' => self.esc = Esc::Backslash,
            0..=0x1F => self.fail(),
            0x20..=0x7F => {
                self.keep_bytes(&[b]);
                self.char_counted();
            }
            _ => {
                let (left, lo, hi) = match b {
                    0xC2..=0xDF => (1, 0x80, 0xBF),
                    0xE0 => (2, 0xA0, 0xBF),
                    0xE1..=0xEC | 0xEE..=0xEF => (2, 0x80, 0xBF),
                    0xED => (2, 0x80, 0x9F),
                    0xF0 => (3, 0x90, 0xBF),
                    0xF1..=0xF3 => (3, 0x80, 0xBF),
                    0xF4 => (3, 0x80, 0x8F),
                    _ => return self.fail(),
                };
                self.utf8_left = left;
                self.utf8_lo = lo;
                self.utf8_hi = hi;
                self.keep_bytes(&[b]);
                self.char_counted();
            }
        }
    }

    fn string_end(&mut self) {
        if self.in_key {
            self.key_over = self.over;
            std::mem::swap(&mut self.key, &mut self.small);
            self.st = St::Colon;
            return;
        }
        if self.stack.len() == 1 {
            match self.next_top {
                Top::Model if !self.over => self.model = String::from_utf8(self.small.clone()).ok(),
                Top::User => {
                    self.user = crate::identity::caller::bounded_value(&self.small);
                }
                _ => {}
            }
        }
        self.scalar_end(None);
    }

    fn number(&mut self, n: Num, b: u8) {
        let digit = b.is_ascii_digit();
        let next = match (n, b) {
            (Num::Minus, b'0') => Some(Num::Zero),
            (Num::Minus, _) if digit => Some(Num::Int),
            (Num::Int, _) if digit => Some(Num::Int),
            (Num::Zero | Num::Int, b'.') => Some(Num::Dot),
            (Num::Zero | Num::Int | Num::Frac, b'e' | b'E') => Some(Num::Exp),
            (Num::Dot | Num::Frac, _) if digit => Some(Num::Frac),
            (Num::Exp, b'+' | b'-') => Some(Num::ExpSign),
            (Num::Exp | Num::ExpSign | Num::ExpDigits, _) if digit => Some(Num::ExpDigits),
            _ => None,
        };
        if let Some(n) = next {
            self.st = St::Num(n);
            return;
        }
        // The number ended before this byte: complete only in these states.
        if !matches!(n, Num::Zero | Num::Int | Num::Frac | Num::ExpDigits) {
            return self.fail();
        }
        self.scalar_end(None);
        self.byte(b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::formats::request_info_with;
    use proptest::prelude::*;
    use serde_json::{json, Map, Value};

    fn fields() -> Vec<String> {
        vec!["tools".into(), "response_format".into(), "x".into()]
    }

    /// The scan of `body` fed in pieces cut at `cuts`.
    fn scan(body: &[u8], cuts: &[usize]) -> (RequestInfo, Option<u64>) {
        let mut s = RequestScan::new(&fields());
        let mut at = 0;
        for &c in cuts {
            let c = c.min(body.len()).max(at);
            s.feed(&body[at..c]);
            at = c;
        }
        s.feed(&body[at..]);
        s.finish()
    }

    fn leaf() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            (-1e12f64..1e12).prop_map(|f| json!(f)),
            ".{0,12}".prop_map(Value::String),
            "[a-z\"\\\\\u{e9}\u{1f600}\n\t]{0,8}".prop_map(Value::String),
        ]
    }

    fn value() -> impl Strategy<Value = Value> {
        leaf().prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                prop::collection::btree_map(
                    prop_oneof![
                        Just("content".to_string()),
                        Just("text".to_string()),
                        Just("role".to_string()),
                        Just("input".to_string()),
                        "[a-z]{1,6}"
                    ],
                    inner,
                    0..4
                )
                .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    fn body() -> impl Strategy<Value = Map<String, Value>> {
        prop::collection::btree_map(
            prop_oneof![
                Just("model".to_string()),
                Just("stream".to_string()),
                Just("user".to_string()),
                Just("tools".to_string()),
                Just("functions".to_string()),
                Just("messages".to_string()),
                Just("prompt".to_string()),
                Just("inputs".to_string()),
                Just("response_format".to_string()),
                "[a-z_]{1,8}"
            ],
            value(),
            0..7,
        )
        .prop_map(|m| m.into_iter().collect())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        /// On any JSON object, however it is split, the scan says what the
        /// parser says, and the fingerprint is the whole body's.
        #[test]
        fn the_scan_agrees_with_the_parser(
            m in body(),
            pretty in any::<bool>(),
            cuts in prop::collection::vec(0usize..400, 0..6),
        ) {
            let v = Value::Object(m);
            let text = if pretty { serde_json::to_vec_pretty(&v) } else { serde_json::to_vec(&v) }.unwrap();
            let mut cuts = cuts;
            cuts.sort_unstable();
            let (info, fp) = scan(&text, &cuts);
            prop_assert_eq!(info, request_info_with(&text, &fields()));
            prop_assert_eq!(fp, Some(crate::decode::body_fingerprint(&text)));
        }

        /// Arbitrary bytes: never a panic, and whatever is not a JSON
        /// object says nothing.
        #[test]
        fn bytes_that_are_not_json_say_nothing(b in prop::collection::vec(any::<u8>(), 0..200)) {
            let (info, _) = scan(&b, &[b.len() / 2]);
            if serde_json::from_slice::<Value>(&b).map_or(true, |v| !v.is_object()) {
                prop_assert_eq!(info, RequestInfo::default());
            }
        }
    }

    #[test]
    fn escapes_surrogates_and_duplicate_top_level_keys_read_as_the_parser_reads_them() {
        for body in [
            r#"{"mod\u0065l":"a\u00e9\ud83d\ude00","messages":[{"content":"x\ud83d\ude00y\n"}]}"#,
            r#"{"model":"a","model":"b","stream":true,"stream":1,"prompt":"abc","prompt":"d"}"#,
            r#"{"messages":[{"role":"user","content":[{"type":"text","text":"hé"}]}],"tools":[{}]}"#,
            r#" {"tools":[],"functions":[1],"user":"  u\t1 "} "#,
        ] {
            let (info, _) = scan(body.as_bytes(), &[3, 9, 17]);
            assert_eq!(
                info,
                request_info_with(body.as_bytes(), &fields()),
                "{body}"
            );
        }
        for bad in [
            r#"{"model":"\ud83d"}"#,
            r#"{"model":"a"} x"#,
            r#"{"model":01}"#,
            r#"{"model":"a",}"#,
            "{\"model\":\"a\u{1}\"}",
            r#"["model"]"#,
            r#"{"model":"a""#,
        ] {
            assert_eq!(scan(bad.as_bytes(), &[]).0, RequestInfo::default(), "{bad}");
        }
    }

    #[test]
    fn a_megabyte_prompt_is_counted_holding_a_few_hundred_bytes() {
        let prompt = "word ".repeat(200_000);
        let body = serde_json::to_vec(&json!({
            "messages": [{"role": "user", "content": prompt}],
            "model": "m", "stream": true, "user": "u".repeat(5000),
        }))
        .unwrap();
        let mut s = RequestScan::new(&[]);
        let mut most = 0;
        for c in body.chunks(4096) {
            s.feed(c);
            most = most.max(s.buffered());
        }
        assert!(most < 2048, "held {most} bytes");
        let (info, _) = s.finish();
        assert_eq!(info, request_info_with(&body, &[]));
        assert_eq!(info.prompt_chars, Some(1_000_000));
        assert!(info.user.unwrap().len() <= crate::identity::caller::MAX_TENANT_BYTES);
    }

    #[test]
    fn a_body_the_capture_cut_keeps_what_its_head_said_and_estimates_the_prompt_from_its_length() {
        let mut s = RequestScan::new(&[]);
        s.feed(br#"{"model":"m","stream":true,"messages":[{"content":"abc"#);
        s.gap(1000);
        s.feed(br#"def"}]}"#);
        s.gap(10);
        let (info, fp) = s.finish();
        assert_eq!(info.model.as_deref(), Some("m"));
        assert_eq!(info.stream, Some(true));
        // "abc" read, 1,010 bytes lost, 7 read after the loss unparsed.
        assert_eq!(info.prompt_chars, Some(3 + 1010 + 7));
        assert!(fp.is_some());
        // Unfinished without a gap (the body said it was whole): nothing.
        let mut s = RequestScan::new(&[]);
        s.feed(br#"{"model":"m""#);
        assert_eq!(s.finish().0, RequestInfo::default());
    }
}
