//! llama.cpp's tokenizer for GGUF models, in Rust: the vocabulary a GGUF
//! file's metadata holds (`tokenizer.ggml.*`) and the encoding
//! llama.cpp's `llama_tokenize` gives it, id for id.
//!
//! * [`Header`]: a bounded reader of the GGUF v2/v3 header and its
//!   metadata key/values (the tensor infos and data are never read). It
//!   reads files of untrusted containers: anything malformed, truncated or
//!   over [`MAX_STRING`], [`MAX_ARRAY`], [`MAX_KVS`] is refused with an
//!   error, never a panic, and nothing is allocated beyond what the bytes
//!   given can hold.
//! * [`GgufVocab`]: the vocabulary and llama.cpp's rules for it — SPM
//!   (`llama`: score-ordered bigram merges, `▁` for spaces, the space
//!   prefix, `<0xXX>` byte fallback), BPE (`gpt2`, `gemma4`: the
//!   pre-tokenizer `tokenizer.ggml.pre` selects, GPT-2's byte-to-unicode
//!   map, rank-ordered merges, `ignore_merges`), the special-token
//!   partition (`tokenizer_st_partition`: user-defined tokens always,
//!   control tokens when `parse_special`) with the token attributes
//!   llama.cpp derives at load (its control-looking-token overrides, the
//!   Phi-3 right-strip), and BOS/EOS by `add_bos`/`add_eos`.
//!
//! What llama.cpp does that this does not, it refuses at load rather
//! than guess: a `pre` it does not know (or one whose splitter it has not
//! been checked against), and the WPM (`bert`), UGM (`t5`), RWKV and
//! PLaMo-2 tokenizers.
//!
//! Owns: parsing GGUF metadata and encoding with it. Must not: read files
//! (the caller hands it a bounded prefix of one), or keep any text it was
//! given.

use std::collections::{BinaryHeap, HashMap, HashSet};
use std::sync::OnceLock;

/// Longest string value (a chat template is tens of kB).
pub const MAX_STRING: usize = 4 << 20;
/// Most elements in one array value (vocabularies hold a few hundred
/// thousand tokens, merges as many).
pub const MAX_ARRAY: usize = 16 << 20;
/// Most metadata key/values.
pub const MAX_KVS: u64 = 1 << 16;
/// Most tensors a header may announce (only checked, never read).
pub const MAX_TENSORS: u64 = 1 << 24;

// ---------------------------------------------------------------------
// GGUF header
// ---------------------------------------------------------------------

/// One metadata value, borrowing its strings from the bytes read.
#[derive(Clone, Debug, PartialEq)]
pub enum Value<'a> {
    /// Any integer type (u8 … i64).
    Int(i128),
    /// f32 or f64.
    Float(f64),
    Bool(bool),
    Str(&'a [u8]),
    /// An array of integers (of any width).
    Ints(Vec<i64>),
    Floats(Vec<f64>),
    Bools(Vec<bool>),
    Strs(Vec<&'a [u8]>),
}

impl Value<'_> {
    fn as_int(&self) -> Option<i128> {
        match self {
            Value::Int(i) => Some(*i),
            _ => None,
        }
    }
}

/// The GGUF header's metadata: the key/values, in file order.
#[derive(Debug)]
pub struct Header<'a> {
    pub version: u32,
    pub tensor_count: u64,
    pub kvs: Vec<(&'a str, Value<'a>)>,
}

impl<'a> Header<'a> {
    pub fn get(&self, key: &str) -> Option<&Value<'a>> {
        self.kvs.iter().find(|(k, _)| *k == key).map(|(_, v)| v)
    }

    /// Parses the header from the start of a GGUF file. `bytes` may stop
    /// anywhere after the metadata; a value cut off is an error.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, String> {
        let mut r = Reader { b: bytes, pos: 0 };
        if r.take(4)? != b"GGUF" {
            return Err("not a GGUF file (bad magic)".into());
        }
        let version = r.u32()?;
        if version != 2 && version != 3 {
            return Err(format!("GGUF version {version} not supported (2 or 3)"));
        }
        let tensor_count = r.u64()?;
        if tensor_count > MAX_TENSORS {
            return Err(format!("GGUF tensor count {tensor_count} over the limit"));
        }
        let n_kv = r.u64()?;
        if n_kv > MAX_KVS {
            return Err(format!("GGUF key/value count {n_kv} over the limit"));
        }
        let mut kvs = Vec::new();
        for i in 0..n_kv {
            let key = r.string()?;
            let key = std::str::from_utf8(key).map_err(|_| format!("GGUF key {i}: not UTF-8"))?;
            let ty = r.u32()?;
            let v = r.value(ty).map_err(|e| format!("GGUF key {key}: {e}"))?;
            kvs.push((key, v));
        }
        Ok(Header {
            version,
            tensor_count,
            kvs,
        })
    }
}

struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
}

/// GGUF value types.
const T_U8: u32 = 0;
const T_I8: u32 = 1;
const T_U16: u32 = 2;
const T_I16: u32 = 3;
const T_U32: u32 = 4;
const T_I32: u32 = 5;
const T_F32: u32 = 6;
const T_BOOL: u32 = 7;
const T_STRING: u32 = 8;
const T_ARRAY: u32 = 9;
const T_U64: u32 = 10;
const T_I64: u32 = 11;
const T_F64: u32 = 12;

/// The fewest bytes one element of a type takes.
fn min_size(ty: u32) -> Option<usize> {
    Some(match ty {
        T_U8 | T_I8 | T_BOOL => 1,
        T_U16 | T_I16 => 2,
        T_U32 | T_I32 | T_F32 => 4,
        T_U64 | T_I64 | T_F64 | T_STRING => 8,
        _ => return None,
    })
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or_else(|| format!("truncated at byte {}", self.pos))?;
        let s = &self.b[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn arr<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let s = self.take(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.arr()?))
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.arr()?))
    }
    fn string(&mut self) -> Result<&'a [u8], String> {
        let n = self.u64()?;
        if n > MAX_STRING as u64 {
            return Err(format!("string of {n} bytes over the limit"));
        }
        self.take(n as usize)
    }
    fn int(&mut self, ty: u32) -> Result<i128, String> {
        Ok(match ty {
            T_U8 => self.arr::<1>()?[0] as i128,
            T_I8 => self.arr::<1>()?[0] as i8 as i128,
            T_U16 => u16::from_le_bytes(self.arr()?) as i128,
            T_I16 => i16::from_le_bytes(self.arr()?) as i128,
            T_U32 => u32::from_le_bytes(self.arr()?) as i128,
            T_I32 => i32::from_le_bytes(self.arr()?) as i128,
            T_U64 => u64::from_le_bytes(self.arr()?) as i128,
            T_I64 => i64::from_le_bytes(self.arr()?) as i128,
            _ => return Err(format!("type {ty} is not an integer")),
        })
    }
    fn float(&mut self, ty: u32) -> Result<f64, String> {
        Ok(match ty {
            T_F32 => f32::from_le_bytes(self.arr()?) as f64,
            T_F64 => f64::from_le_bytes(self.arr()?),
            _ => return Err(format!("type {ty} is not a float")),
        })
    }
    fn value(&mut self, ty: u32) -> Result<Value<'a>, String> {
        Ok(match ty {
            T_U8 | T_I8 | T_U16 | T_I16 | T_U32 | T_I32 | T_U64 | T_I64 => {
                Value::Int(self.int(ty)?)
            }
            T_F32 | T_F64 => Value::Float(self.float(ty)?),
            T_BOOL => Value::Bool(self.arr::<1>()?[0] != 0),
            T_STRING => Value::Str(self.string()?),
            T_ARRAY => {
                let ety = self.u32()?;
                let n = self.u64()?;
                let min =
                    min_size(ety).ok_or_else(|| format!("array of type {ety} not supported"))?;
                let left = (self.b.len() - self.pos) as u64;
                if n > MAX_ARRAY as u64 {
                    return Err(format!("array of {n} elements over the limit"));
                }
                if n.saturating_mul(min as u64) > left {
                    return Err(format!("array of {n} elements longer than the bytes left"));
                }
                let n = n as usize;
                match ety {
                    T_STRING => {
                        let mut v = Vec::with_capacity(n);
                        for _ in 0..n {
                            v.push(self.string()?);
                        }
                        Value::Strs(v)
                    }
                    T_F32 | T_F64 => {
                        let mut v = Vec::with_capacity(n);
                        for _ in 0..n {
                            v.push(self.float(ety)?);
                        }
                        Value::Floats(v)
                    }
                    T_BOOL => {
                        let s = self.take(n)?;
                        Value::Bools(s.iter().map(|&b| b != 0).collect())
                    }
                    _ => {
                        let mut v = Vec::with_capacity(n);
                        for _ in 0..n {
                            // i128 → i64: a u64 over i64::MAX saturates;
                            // such values are no token ids or types.
                            v.push(self.int(ety)?.clamp(i64::MIN as i128, i64::MAX as i128) as i64);
                        }
                        Value::Ints(v)
                    }
                }
            }
            _ => return Err(format!("unknown value type {ty}")),
        })
    }
}

// ---------------------------------------------------------------------
// Unicode categories (as llama.cpp's unicode_cpt_flags uses them)
// ---------------------------------------------------------------------

const C_NUMBER: u8 = 1;
const C_LETTER: u8 = 2;
const C_PUNCT: u8 = 4;
const C_MARK: u8 = 8;
const C_SYMBOL: u8 = 16;
const C_SPACE: u8 = 32;

/// General-category ranges (start, flags), from the same Unicode tables
/// fancy-regex's `\p{..}` uses, built once.
fn category_table() -> &'static [(u32, u8)] {
    static TABLE: OnceLock<Vec<(u32, u8)>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let all: String = (0..=0x10FFFFu32).filter_map(char::from_u32).collect();
        let mut flags = vec![0u8; 0x110000];
        for (flag, pat) in [
            (C_NUMBER, r"\p{N}+"),
            (C_LETTER, r"\p{L}+"),
            (C_PUNCT, r"\p{P}+"),
            (C_MARK, r"\p{M}+"),
            (C_SYMBOL, r"\p{S}+"),
        ] {
            let Ok(re) = fancy_regex::Regex::new(pat) else {
                continue;
            };
            for m in re.find_iter(&all).flatten() {
                for c in m.as_str().chars() {
                    flags[c as usize] |= flag;
                }
            }
        }
        for (cp, f) in flags.iter_mut().enumerate() {
            if char::from_u32(cp as u32).is_some_and(char::is_whitespace) {
                *f |= C_SPACE;
            }
        }
        let mut ranges: Vec<(u32, u8)> = Vec::new();
        for (cp, &f) in flags.iter().enumerate() {
            if ranges.last().is_none_or(|&(_, g)| g != f) {
                ranges.push((cp as u32, f));
            }
        }
        ranges
    })
}

fn cat(c: char) -> u8 {
    let t = category_table();
    let i = t.partition_point(|&(s, _)| s <= c as u32);
    t[i.saturating_sub(1)].1
}

// ---------------------------------------------------------------------
// Pre-tokenizers
// ---------------------------------------------------------------------

/// One step of llama.cpp's `unicode_regex_split`: each piece the previous
/// steps left is split again.
enum Split {
    /// `unicode_regex_split_custom_gpt2`.
    Gpt2,
    /// `unicode_regex_split_custom_llama3` (`digits` 3), `_qwen2` (1),
    /// `_qwen35` (1, `marks`: letter runs take combining marks).
    Llama3 { digits: usize, marks: bool },
    /// `[^\n]+|[\n]+`.
    Newlines,
    /// Any other expression, as llama.cpp's std::regex fallback runs it.
    Regex(fancy_regex::Regex),
}

/// What `tokenizer.ggml.pre` selects for a BPE vocabulary.
struct Pre {
    splits: Vec<Split>,
    ignore_merges: bool,
    /// `add_bos` before the GGUF key (llama3, …).
    add_bos: bool,
    /// No BOS token at all (chatglm).
    no_bos: bool,
    byte_encode: bool,
    escape_whitespaces: bool,
}

fn regex(pat: &str) -> Result<Split, String> {
    // llama.cpp runs expressions with unicode categories on a "collapsed"
    // text where every letter is one code (\p{Lu}, \p{Ll}, … all mean
    // \p{L} there).
    let mut p = pat.to_string();
    for sub in [r"\p{Lu}", r"\p{Ll}", r"\p{Lt}", r"\p{Lm}", r"\p{Lo}"] {
        p = p.replace(sub, r"\p{L}");
    }
    fancy_regex::Regex::new(&p)
        .map(Split::Regex)
        .map_err(|e| format!("pre-tokenizer regex {pat:?}: {e}"))
}

fn pre_for(pre: &str) -> Result<Pre, String> {
    let mut p = Pre {
        splits: Vec::new(),
        ignore_merges: false,
        add_bos: false,
        no_bos: false,
        byte_encode: true,
        escape_whitespaces: false,
    };
    let llama3 = || Split::Llama3 {
        digits: 3,
        marks: false,
    };
    match pre {
        "" | "default" => {
            p.splits = vec![
                regex(r"[\p{P}\$\+<=>\^~\|]+")?,
                Split::Gpt2,
                regex(r"\p{N}+")?,
                regex(r"[0-9][0-9][0-9]")?,
            ];
        }
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
        | "lfm2" | "jina-v5-nano" => {
            p.splits = vec![llama3()];
            p.ignore_merges = true;
            p.add_bos = true;
        }
        "dbrx" | "smaug-bpe" => p.splits = vec![llama3()],
        "chatglm-bpe" => {
            p.splits = vec![llama3()];
            p.no_bos = true;
        }
        "glm4" | "glm5" => {
            p.splits = vec![llama3()];
            p.no_bos = true;
            p.ignore_merges = true;
        }
        "deepseek-llm" => {
            p.splits = vec![
                regex(r"[\x{d}\x{a}]")?,
                regex(
                    r"\s?[A-Za-z\x{b5}\x{c0}-\x{d6}\x{d8}-\x{f6}\x{f8}-\x{1ba}\x{1bc}-\x{1bf}\x{1c4}-\x{293}\x{295}-\x{2af}\x{370}-\x{373}\x{376}\x{377}\x{37b}-\x{37d}\x{37f}\x{386}\x{388}-\x{38a}\x{38c}\x{38e}-\x{3a1}\x{3a3}-\x{3f5}\x{3f7}-\x{481}\x{48a}-\x{52f}\x{531}-\x{556}\x{10a0}-\x{10c5}\x{13a0}-\x{13f5}\x{13f8}-\x{13fd}\x{1c90}-\x{1cba}\x{1cbd}-\x{1cbf}\x{1d00}-\x{1d2b}\x{1d6b}-\x{1d77}\x{1d79}-\x{1d9a}\x{1e00}-\x{1f15}\x{1f18}-\x{1f1d}\x{1f20}-\x{1f45}\x{1f48}-\x{1f4d}\x{1f50}-\x{1f57}\x{1f59}\x{1f5b}\x{1f5d}\x{1f5f}-\x{1f7d}\x{1f80}-\x{1fb4}\x{1fb6}-\x{1fbc}\x{1fbe}\x{1fc2}-\x{1fc4}\x{1fc6}-\x{1fcc}\x{1fd0}-\x{1fd3}\x{1fd6}-\x{1fdb}\x{1fe0}-\x{1fec}\x{1ff2}-\x{1ff4}\x{1ff6}-\x{1ffc}\x{2102}\x{2107}\x{210a}-\x{2113}\x{2115}\x{2119}-\x{211d}\x{2124}\x{2126}\x{2128}\x{212a}-\x{212d}\x{212f}-\x{2134}\x{2139}\x{213c}-\x{213f}\x{2145}-\x{2149}\x{214e}\x{2183}\x{2184}\x{2c00}-\x{2c7b}\x{2c7e}-\x{2ce4}\x{2ceb}-\x{2cee}\x{2cf2}\x{2cf3}\x{a640}-\x{a66d}\x{a680}-\x{a69b}\x{a722}-\x{a76f}\x{a771}-\x{a787}\x{a78b}-\x{a78e}\x{ab70}-\x{abbf}\x{fb00}-\x{fb06}\x{fb13}-\x{fb17}\x{ff21}-\x{ff3a}\x{ff41}-\x{ff5a}\x{10400}-\x{1044f}\x{104b0}-\x{104d3}\x{104d8}-\x{104fb}\x{10c80}-\x{10cb2}\x{10cc0}-\x{10cf2}\x{118a0}-\x{118df}\x{1e900}-\x{1e943}]+",
                )?,
                regex(
                    r"\s?[!-/:-~\x{ff01}-\x{ff0f}\x{ff1a}-\x{ff5e}\x{2018}-\x{201f}\x{3000}-\x{3002}]+",
                )?,
                regex(r"\s+$")?,
                regex(r"[\x{4e00}-\x{9fa5}\x{800}-\x{4e00}\x{ac00}-\x{d7ff}]+")?,
                regex(r"\p{N}+")?,
            ];
        }
        "deepseek-coder" => {
            p.splits = vec![
                regex(r"[\x{d}\x{a}]")?,
                regex(r"\s?\p{L}+")?,
                regex(r"\s?\p{P}+")?,
                regex(r"[\x{4e00}-\x{9fa5}\x{800}-\x{4e00}\x{ac00}-\x{d7ff}]+")?,
                regex(r"\p{N}")?,
            ];
        }
        "falcon" => {
            p.splits = vec![
                regex(r"[\p{P}\$\+<=>\^~\|`]+")?,
                Split::Gpt2,
                regex(r"[0-9][0-9][0-9]")?,
            ];
        }
        "starcoder" | "refact" | "command-r" | "smollm" | "codeshell" | "exaone" | "minerva-7b"
        | "mellum2" => {
            p.splits = vec![regex(r"\p{N}")?, Split::Gpt2];
        }
        "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es" | "jina-v2-de"
        | "a.x-4.0" | "mellum" | "modern-bert" | "jina-v1-en" | "jina-v2-code" | "roberta-bpe"
        | "mpt" | "olmo" | "jais" | "trillion" | "granite-docling" | "exaone4" => {
            p.splits = vec![Split::Gpt2];
        }
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "stablelm2" | "hunyuan"
        | "solar-open" | "megrez" | "grok-2" => {
            p.splits = vec![Split::Llama3 {
                digits: 1,
                marks: false,
            }];
        }
        "qwen35" => {
            p.splits = vec![Split::Llama3 {
                digits: 1,
                marks: true,
            }];
        }
        "gemma4" | "granite-embed-multi-311m" | "sarvam-moe" => {
            p.splits = vec![Split::Newlines];
            p.byte_encode = false;
            p.escape_whitespaces = true;
        }
        other => {
            return Err(format!(
                "pre-tokenizer {other:?} is not supported (llama.cpp's splitter for it is not \
                 implemented here)"
            ))
        }
    }
    Ok(p)
}

/// A byte range of the text being split.
type Piece = (usize, usize);

fn split_text(text: &str, splits: &[Split]) -> Result<Vec<Piece>, String> {
    let mut pieces: Vec<Piece> = if text.is_empty() {
        Vec::new()
    } else {
        vec![(0, text.len())]
    };
    for s in splits {
        let mut out = Vec::with_capacity(pieces.len() * 2);
        for &(a, b) in &pieces {
            let part = &text[a..b];
            match s {
                Split::Regex(re) => {
                    let mut at = 0;
                    for m in re.find_iter(part) {
                        let m = m.map_err(|e| format!("pre-tokenizer: {e}"))?;
                        if m.start() == m.end() {
                            continue;
                        }
                        if m.start() > at {
                            out.push((a + at, a + m.start()));
                        }
                        out.push((a + m.start(), a + m.end()));
                        at = m.end();
                    }
                    if at < part.len() {
                        out.push((a + at, b));
                    }
                }
                Split::Newlines => {
                    let bytes = part.as_bytes();
                    let mut i = 0;
                    while i < bytes.len() {
                        let nl = bytes[i] == b'\n';
                        let mut j = i + 1;
                        while j < bytes.len() && (bytes[j] == b'\n') == nl {
                            j += 1;
                        }
                        out.push((a + i, a + j));
                        i = j;
                    }
                }
                Split::Gpt2 | Split::Llama3 { .. } => {
                    let cps: Vec<(usize, char)> = part.char_indices().collect();
                    let ends = match s {
                        Split::Gpt2 => split_gpt2(&cps),
                        Split::Llama3 { digits, marks } => split_llama3(&cps, *digits, *marks),
                        _ => unreachable!(),
                    };
                    let mut prev = 0;
                    for e in ends {
                        let start = cps.get(prev).map_or(part.len(), |c| c.0);
                        let end = cps.get(e).map_or(part.len(), |c| c.0);
                        out.push((a + start, a + end));
                        prev = e;
                    }
                }
            }
        }
        pieces = out;
    }
    Ok(pieces)
}

/// Flags of the code point at `i`, 0 past the piece (llama.cpp's
/// "out of range").
fn fl(cps: &[(usize, char)], i: usize) -> (u8, bool) {
    cps.get(i).map_or((0, false), |c| (cat(c.1), true))
}
fn cp(cps: &[(usize, char)], i: usize) -> Option<char> {
    cps.get(i).map(|c| c.1)
}

/// `'s|'t|'re|'ve|'m|'ll|'d` at `pos` (case-insensitive when `ci`): its
/// length.
fn contraction(cps: &[(usize, char)], pos: usize, ci: bool) -> Option<usize> {
    if cp(cps, pos) != Some('\'') {
        return None;
    }
    let low = |c: Option<char>| c.map(|c| if ci { c.to_ascii_lowercase() } else { c });
    let n1 = low(cp(cps, pos + 1))?;
    if matches!(n1, 's' | 't' | 'm' | 'd') {
        return Some(2);
    }
    let n2 = low(cp(cps, pos + 2))?;
    if matches!((n1, n2), ('r', 'e') | ('v', 'e') | ('l', 'l')) {
        return Some(3);
    }
    None
}

/// Whitespace run at `pos`: its length and where the last `\r`/`\n` in it
/// ends (0 if none).
fn spaces(cps: &[(usize, char)], pos: usize) -> (usize, usize) {
    let mut n = 0;
    let mut last_rn = 0;
    while fl(cps, pos + n).0 & C_SPACE != 0 {
        if matches!(cp(cps, pos + n), Some('\r' | '\n')) {
            last_rn = pos + n + 1;
        }
        n += 1;
    }
    (n, last_rn)
}

/// The ends (code point indices) of the words of
/// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)`.
fn split_gpt2(cps: &[(usize, char)]) -> Vec<usize> {
    let end = cps.len();
    let mut ends = Vec::new();
    let mut pos = 0;
    let other = |f: (u8, bool)| f.1 && f.0 & (C_SPACE | C_LETTER | C_NUMBER) == 0;
    while pos < end {
        if let Some(n) = contraction(cps, pos, false) {
            pos += n;
            ends.push(pos);
            continue;
        }
        let c = cp(cps, pos);
        let sp = usize::from(c == Some(' '));
        let f2 = fl(cps, pos + sp);
        if f2.0 & C_LETTER != 0 {
            pos += sp;
            while fl(cps, pos).0 & C_LETTER != 0 {
                pos += 1;
            }
            ends.push(pos);
            continue;
        }
        if f2.0 & C_NUMBER != 0 {
            pos += sp;
            while fl(cps, pos).0 & C_NUMBER != 0 {
                pos += 1;
            }
            ends.push(pos);
            continue;
        }
        if other(f2) {
            pos += sp;
            while other(fl(cps, pos)) {
                pos += 1;
            }
            ends.push(pos);
            continue;
        }
        let (n, _) = spaces(cps, pos);
        if n > 1 && pos + n < end {
            pos += n - 1;
            ends.push(pos);
            continue;
        }
        if n > 0 {
            pos += n;
            ends.push(pos);
            continue;
        }
        pos += 1;
        ends.push(pos);
    }
    ends
}

/// The ends of the words of llama3's expression
/// `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
/// ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+` — with `\p{N}` for
/// `digits` 1 (qwen2), and `[\p{L}\p{M}]` for letters when `marks`
/// (qwen35).
fn split_llama3(cps: &[(usize, char)], digits: usize, marks: bool) -> Vec<usize> {
    let end = cps.len();
    let mut ends = Vec::new();
    let letter = if marks { C_LETTER | C_MARK } else { C_LETTER };
    let mut pos = 0;
    while pos < end {
        if let Some(n) = contraction(cps, pos, true) {
            pos += n;
            ends.push(pos);
            continue;
        }
        let c = cp(cps, pos);
        let f = fl(cps, pos);
        if !(matches!(c, Some('\r' | '\n')) || f.0 & C_NUMBER != 0)
            && (f.0 & letter != 0 || fl(cps, pos + 1).0 & letter != 0)
        {
            pos += 1;
            while fl(cps, pos).0 & letter != 0 {
                pos += 1;
            }
            ends.push(pos);
            continue;
        }
        if f.0 & C_NUMBER != 0 {
            let mut ini = pos;
            while fl(cps, pos).0 & C_NUMBER != 0 {
                pos += 1;
                if pos - ini >= digits {
                    ends.push(pos);
                    ini = pos;
                }
            }
            if ends.last() != Some(&pos) {
                ends.push(pos);
            }
            continue;
        }
        let sp = usize::from(c == Some(' '));
        let f2 = if sp == 1 { fl(cps, pos + 1) } else { f };
        let other = |g: (u8, bool)| g.0 & (C_SPACE | letter | C_NUMBER) == 0;
        if other(f2) && f.1 {
            pos += sp;
            while other(fl(cps, pos)) && fl(cps, pos).1 {
                pos += 1;
            }
            while matches!(cp(cps, pos), Some('\r' | '\n')) {
                pos += 1;
            }
            ends.push(pos);
            continue;
        }
        let (n, last_rn) = spaces(cps, pos);
        if last_rn > 0 {
            pos = last_rn;
            ends.push(pos);
            continue;
        }
        if n > 1 && pos + n < end {
            pos += n - 1;
            ends.push(pos);
            continue;
        }
        if n > 0 {
            pos += n;
            ends.push(pos);
            continue;
        }
        pos += 1;
        ends.push(pos);
    }
    ends
}

/// GPT-2's byte → printable code point map.
fn byte_chars() -> &'static [char; 256] {
    static MAP: OnceLock<[char; 256]> = OnceLock::new();
    MAP.get_or_init(|| {
        let mut map = ['\0'; 256];
        let mut n = 0;
        for b in 0..256u32 {
            let printable = (0x21..=0x7E).contains(&b)
                || (0xA1..=0xAC).contains(&b)
                || (0xAE..=0xFF).contains(&b);
            map[b as usize] = if printable {
                char::from_u32(b).unwrap_or('\0')
            } else {
                n += 1;
                char::from_u32(255 + n).unwrap_or('\0')
            };
        }
        map
    })
}

// ---------------------------------------------------------------------
// The vocabulary
// ---------------------------------------------------------------------

/// Token attributes (llama.h `LLAMA_TOKEN_ATTR_*`).
const A_UNKNOWN: u16 = 1 << 0;
const A_UNUSED: u16 = 1 << 1;
const A_NORMAL: u16 = 1 << 2;
const A_CONTROL: u16 = 1 << 3;
const A_USER_DEFINED: u16 = 1 << 4;
const A_BYTE: u16 = 1 << 5;
const A_UNDEFINED: u16 = 0;
const A_LSTRIP: u16 = 1 << 7;
const A_RSTRIP: u16 = 1 << 8;

/// A special id llama.cpp finds by the token's text, and the texts.
type Detect<'a> = (&'a mut Option<u32>, &'a [&'a str]);

enum Kind {
    Spm {
        add_space_prefix: bool,
    },
    Bpe {
        pre: Pre,
        /// Interned merge parts, and (left, right) → rank.
        parts: HashMap<Box<[u8]>, u32>,
        ranks: HashMap<(u32, u32), u32>,
    },
}

/// A GGUF model's vocabulary, encoding text as llama.cpp does.
pub struct GgufVocab {
    model: String,
    pre: String,
    kind: Kind,
    tokens: Vec<Box<[u8]>>,
    scores: Vec<f32>,
    attrs: Vec<u16>,
    ids: HashMap<Box<[u8]>, u32>,
    /// Control, user-defined and unknown tokens, longest first.
    specials: Vec<u32>,
    bos: Option<u32>,
    eos: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    chat_template: Option<String>,
}

impl std::fmt::Debug for GgufVocab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufVocab")
            .field("model", &self.model)
            .field("pre", &self.pre)
            .field("tokens", &self.tokens.len())
            .finish()
    }
}

fn utf8<'a>(v: &'a [u8], what: &str) -> Result<&'a str, String> {
    std::str::from_utf8(v).map_err(|_| format!("{what}: not UTF-8"))
}

impl GgufVocab {
    /// Loads the vocabulary from the start of a GGUF file (the metadata
    /// must be whole in `bytes`). The error says what is wrong or not
    /// supported.
    pub fn from_gguf(bytes: &[u8]) -> Result<Self, String> {
        let h = Header::parse(bytes)?;
        Self::from_header(&h)
    }

    /// As [`from_gguf`](Self::from_gguf), from a parsed header.
    pub fn from_header(h: &Header<'_>) -> Result<Self, String> {
        let str_key = |k: &str| -> Result<Option<String>, String> {
            match h.get(k) {
                None => Ok(None),
                Some(Value::Str(s)) => Ok(Some(utf8(s, k)?.to_string())),
                Some(_) => Err(format!("{k}: not a string")),
            }
        };
        let bool_key = |k: &str| -> Result<Option<bool>, String> {
            match h.get(k) {
                None => Ok(None),
                Some(Value::Bool(b)) => Ok(Some(*b)),
                Some(_) => Err(format!("{k}: not a bool")),
            }
        };
        let model = str_key("tokenizer.ggml.model")?
            .ok_or("no tokenizer.ggml.model: not a GGUF with a vocabulary")?;
        let pre = str_key("tokenizer.ggml.pre")?.unwrap_or_default();
        let chat_template = str_key("tokenizer.chat_template")?;
        let name = str_key("general.name")?.unwrap_or_default();
        let arch = str_key("general.architecture")?.unwrap_or_default();

        let Some(Value::Strs(texts)) = h.get("tokenizer.ggml.tokens") else {
            return Err("tokenizer.ggml.tokens: missing or not a string array".into());
        };
        let n = texts.len();
        if n == 0 || n > u32::MAX as usize / 2 {
            return Err(format!("tokenizer.ggml.tokens: {n} tokens"));
        }
        let scores: Vec<f32> = match h.get("tokenizer.ggml.scores") {
            None => vec![0.0; n],
            Some(Value::Floats(v)) if v.len() >= n => v[..n].iter().map(|&x| x as f32).collect(),
            Some(Value::Ints(v)) if v.len() >= n => v[..n].iter().map(|&x| x as f32).collect(),
            Some(_) => return Err("tokenizer.ggml.scores: not a number array of n_tokens".into()),
        };
        let mut attrs: Vec<u16> = match h.get("tokenizer.ggml.token_type") {
            None => vec![A_NORMAL; n],
            Some(Value::Ints(v)) if v.len() >= n => v[..n]
                .iter()
                .map(|t| match t {
                    2 => A_UNKNOWN,
                    5 => A_UNUSED,
                    1 => A_NORMAL,
                    3 => A_CONTROL,
                    4 => A_USER_DEFINED,
                    6 => A_BYTE,
                    _ => A_UNDEFINED,
                })
                .collect(),
            Some(_) => return Err("tokenizer.ggml.token_type: not an int array of n_tokens".into()),
        };
        let mut tokens: Vec<Box<[u8]>> = Vec::with_capacity(n);
        let mut ids: HashMap<Box<[u8]>, u32> = HashMap::with_capacity(n);
        for (i, t) in texts.iter().enumerate() {
            let t: Box<[u8]> = if t.is_empty() {
                format!("[EMPTY_{i}]").into_bytes().into()
            } else {
                (*t).into()
            };
            ids.insert(t.clone(), i as u32);
            tokens.push(t);
        }

        // Type, its defaults, and the pre-tokenizer (llama_vocab::impl::load).
        let mut add_bos;
        let mut add_eos = false;
        let mut def_bos: Option<u32>;
        let def_eos: Option<u32>;
        let kind = match model.as_str() {
            "llama" => {
                add_bos = true;
                def_bos = Some(1);
                def_eos = Some(2);
                Kind::Spm {
                    add_space_prefix: bool_key("tokenizer.ggml.add_space_prefix")?.unwrap_or(true),
                }
            }
            "gpt2" | "gemma4" => {
                let pre_name = if model == "gemma4" {
                    "gemma4"
                } else {
                    pre.as_str()
                };
                let p = pre_for(pre_name)?;
                add_bos = p.add_bos;
                (def_bos, def_eos) = if model == "gemma4" {
                    (None, None)
                } else {
                    (Some(11), Some(11))
                };
                if p.no_bos {
                    def_bos = None;
                }
                let Some(Value::Strs(merges)) = h.get("tokenizer.ggml.merges") else {
                    return Err("tokenizer.ggml.merges: missing or not a string array".into());
                };
                let mut parts: HashMap<Box<[u8]>, u32> = HashMap::new();
                let mut ranks = HashMap::with_capacity(merges.len());
                let mut intern = |s: &[u8]| -> u32 {
                    if let Some(&i) = parts.get(s) {
                        return i;
                    }
                    let i = parts.len() as u32;
                    parts.insert(s.into(), i);
                    i
                };
                for (rank, m) in merges.iter().enumerate() {
                    let Some(sp) = m.iter().skip(1).position(|&b| b == b' ').map(|p| p + 1) else {
                        continue;
                    };
                    let (l, r) = (intern(&m[..sp]), intern(&m[sp + 1..]));
                    ranks.entry((l, r)).or_insert(rank as u32);
                }
                Kind::Bpe {
                    pre: p,
                    parts,
                    ranks,
                }
            }
            "bert" => return Err("tokenizer model \"bert\" (WPM) is not supported".into()),
            other => return Err(format!("tokenizer model {other:?} is not supported")),
        };
        let pre_name = if model == "gemma4" {
            "gemma4".to_string()
        } else {
            pre
        };

        // Special token ids: the type's defaults (disabled when out of
        // range), then the GGUF keys.
        let n32 = n as u32;
        let in_range = |x: Option<u32>| x.filter(|&i| i < n32);
        let key_id = |k: &str| -> Option<u32> {
            h.get(k)
                .and_then(Value::as_int)
                .and_then(|i| u32::try_from(i).ok())
        };
        let set = |def: Option<u32>, keys: &[&str]| -> Option<u32> {
            let mut id = in_range(def);
            for k in keys {
                if let Some(v) = key_id(k) {
                    if v < n32 {
                        id = Some(v);
                    }
                }
            }
            id
        };
        let bos = set(def_bos, &["tokenizer.ggml.bos_token_id"]);
        let eos = set(def_eos, &["tokenizer.ggml.eos_token_id"]);
        let mut eot = set(None, &["tokenizer.ggml.eot_token_id"]);
        let mut eom = set(None, &["tokenizer.ggml.eom_token_id"]);
        let mut fim_pre = set(
            None,
            &[
                "tokenizer.ggml.fim_pre_token_id",
                "tokenizer.ggml.prefix_token_id",
            ],
        );
        let mut fim_suf = set(
            None,
            &[
                "tokenizer.ggml.fim_suf_token_id",
                "tokenizer.ggml.suffix_token_id",
            ],
        );
        let mut fim_mid = set(
            None,
            &[
                "tokenizer.ggml.fim_mid_token_id",
                "tokenizer.ggml.middle_token_id",
            ],
        );
        let mut fim_pad = set(None, &["tokenizer.ggml.fim_pad_token_id"]);
        let mut fim_rep = set(None, &["tokenizer.ggml.fim_rep_token_id"]);
        let mut fim_sep = set(None, &["tokenizer.ggml.fim_sep_token_id"]);

        if let Some(b) = bool_key("tokenizer.ggml.add_bos_token")? {
            add_bos = b;
        }
        if let Some(b) = bool_key("tokenizer.ggml.add_eos_token")? {
            add_eos = b;
        }
        if pre_name == "gemma4" || pre_name == "granite-embed-multi-311m" {
            add_bos = true;
        }

        // Control-looking tokens found by text (in the vocabulary's
        // sorted order, as llama.cpp walks its std::map).
        let mut sorted: Vec<(&[u8], u32)> = ids.iter().map(|(k, &v)| (&k[..], v)).collect();
        sorted.sort_unstable();
        let is = |t: &[u8], list: &[&str]| list.iter().any(|s| s.as_bytes() == t);
        let mut detect: [Detect<'_>; 8] = [
            (
                &mut eot,
                &[
                    "<|eot_id|>",
                    "<|im_end|>",
                    "<|end|>",
                    "<end_of_turn>",
                    "<|endoftext|>",
                    "<|end_of_text|>",
                    "<EOT>",
                    "_<EOT>",
                    "[EOT]",
                    "<｜end▁of▁sentence｜>",
                    "<end_of_utterance>",
                ],
            ),
            (&mut eom, &["<|eom_id|>"]),
            (
                &mut fim_pre,
                &[
                    "<|fim_prefix|>",
                    "<fim-prefix>",
                    "<fim_prefix>",
                    "<｜fim▁begin｜>",
                    "<PRE>",
                    "▁<PRE>",
                    "<|code_prefix|>",
                    "<|prefix|>",
                ],
            ),
            (
                &mut fim_suf,
                &[
                    "<|fim_suffix|>",
                    "<fim-suffix>",
                    "<fim_suffix>",
                    "<｜fim▁hole｜>",
                    "<SUF>",
                    "▁<SUF>",
                    "<|code_suffix|>",
                    "<|suffix|>",
                ],
            ),
            (
                &mut fim_mid,
                &[
                    "<|fim_middle|>",
                    "<fim-middle>",
                    "<fim_middle>",
                    "<｜fim▁end｜>",
                    "<MID>",
                    "▁<MID>",
                    "<|code_middle|>",
                    "<|middle|>",
                ],
            ),
            (
                &mut fim_pad,
                &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"],
            ),
            (
                &mut fim_rep,
                &[
                    "<|fim_repo|>",
                    "<|repo_name|>",
                    "<fim-repo>",
                    "<REPO>",
                    "<reponame>",
                ],
            ),
            (&mut fim_sep, &["<|file_sep|>"]),
        ];
        for &(t, id) in &sorted {
            for (slot, list) in detect.iter_mut() {
                if slot.is_none() && is(t, list) {
                    **slot = Some(id);
                    attrs[id as usize] |= A_CONTROL;
                }
            }
        }
        let mut eog: HashSet<u32> = HashSet::new();
        eog.extend(fim_pad);
        eog.extend(fim_rep);
        eog.extend(fim_sep);
        const EOG: &[&str] = &[
            "<|eot_id|>",
            "<|im_end|>",
            "<|end|>",
            "<|return|>",
            "<|call|>",
            "<|flush|>",
            "<|calls|>",
            "<end_of_turn>",
            "<|endoftext|>",
            "</s>",
            "<|eom_id|>",
            "<EOT>",
            "_<EOT>",
            "[EOT]",
            "[EOS]",
            "<|end_of_text|>",
            "<end_of_utterance>",
            "<eos>",
            "<turn|>",
            "<|tool_response>",
            "<｜end▁of▁sentence｜>",
            "[e~[",
        ];
        for &(t, id) in &sorted {
            if is(t, EOG) {
                eog.insert(id);
                attrs[id as usize] |= A_CONTROL;
            }
        }
        for &(t, id) in &sorted {
            if is(
                t,
                &["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"],
            ) {
                attrs[id as usize] = A_USER_DEFINED;
            }
        }
        eog.extend(eos);
        eog.extend(eot);
        eog.extend(eom);
        let has = |s: &str| eog.iter().any(|&i| &*tokens[i as usize] == s.as_bytes());
        let find = |s: &str| {
            eog.iter()
                .copied()
                .find(|&i| &*tokens[i as usize] == s.as_bytes())
        };
        if let Some(end) = find("<|end|>") {
            let call = has("<|call|>") || has("<|calls|>");
            if call && (has("<|return|>") || has("<|flush|>")) {
                attrs[end as usize] = A_USER_DEFINED;
            }
        }
        if let Some(s) = find("</s>") {
            if has("<|tool_response>") || has("<|plamo:eos|>") {
                attrs[s as usize] = A_NORMAL;
            }
        }

        let mut specials: Vec<u32> = (0..n32)
            .filter(|&i| attrs[i as usize] & (A_CONTROL | A_USER_DEFINED | A_UNKNOWN) != 0)
            .collect();
        specials.sort_by_key(|&i| std::cmp::Reverse(tokens[i as usize].len()));

        // Per-model strip attributes.
        let lname = name.to_ascii_lowercase();
        let id_of = |s: &str| {
            ids.get(s.as_bytes())
                .copied()
                .ok_or_else(|| format!("token {s:?} missing from the vocabulary"))
        };
        if ["jina-v2-de", "jina-v2-es", "jina-v2-code"]
            .iter()
            .any(|s| pre_name.contains(s))
            || ["nomic-bert-moe", "jina-bert-v3"]
                .iter()
                .any(|s| arch.contains(s))
        {
            if let Ok(m) = id_of("<mask>") {
                attrs[m as usize] |= A_LSTRIP;
            }
        } else if lname.contains("phi-3") || lname.contains("phi3") {
            for &i in &specials {
                attrs[i as usize] |= A_RSTRIP;
            }
            attrs[id_of("</s>")? as usize] |= A_RSTRIP;
            for s in ["<unk>", "<s>", "<|endoftext|>"] {
                attrs[id_of(s)? as usize] &= !A_RSTRIP;
            }
        } else if lname.contains("modern-bert") {
            if let Ok(m) = id_of("[MASK]") {
                attrs[m as usize] |= A_LSTRIP;
            }
        }

        Ok(GgufVocab {
            model,
            pre: pre_name,
            kind,
            tokens,
            scores,
            attrs,
            ids,
            specials,
            bos,
            eos,
            add_bos,
            add_eos,
            chat_template,
        })
    }

    /// `tokenizer.chat_template`.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// `tokenizer.ggml.pre` (`gemma4` for that model; empty when absent).
    pub fn pre(&self) -> &str {
        &self.pre
    }

    /// `tokenizer.ggml.model`.
    pub fn model(&self) -> &str {
        &self.model
    }

    pub fn n_tokens(&self) -> usize {
        self.tokens.len()
    }

    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    /// `tokenizer.ggml.add_bos_token` (llama.cpp's `llama_vocab_get_add_bos`).
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// `tokenizer.ggml.add_eos_token`.
    pub fn add_eos(&self) -> bool {
        self.add_eos
    }

    /// A token's text as llama.cpp gives a chat template its `bos_token`
    /// and `eos_token` (`common_token_to_piece(…, special = true)`: the
    /// special token's text as stored).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        std::str::from_utf8(self.tokens.get(id as usize)?).ok()
    }

    /// The ids llama.cpp's `llama_tokenize(text, add_special,
    /// parse_special)` gives.
    pub fn encode(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> Result<Vec<u32>, String> {
        let frags = self.partition(text.as_bytes(), parse_special);
        let mut out = Vec::new();
        let bos = || {
            self.bos
                .ok_or_else(|| "the model adds a BOS token but has none".to_string())
        };
        match &self.kind {
            Kind::Spm { add_space_prefix } => {
                if add_special && self.add_bos {
                    out.push(bos()?);
                }
                let mut prev_special = true;
                for f in frags {
                    match f {
                        Frag::Tok(t) => {
                            out.push(t);
                            prev_special = true;
                        }
                        Frag::Text(a, b) => {
                            let mut s = Vec::with_capacity(b - a + 1);
                            if *add_space_prefix && prev_special {
                                s.push(b' ');
                            }
                            s.extend_from_slice(&text.as_bytes()[a..b]);
                            let s = escape_whitespace(&s);
                            self.spm(&s, &mut out)?;
                            prev_special = false;
                        }
                    }
                }
            }
            Kind::Bpe { pre, parts, ranks } => {
                if add_special && self.add_bos {
                    out.push(bos()?);
                }
                for f in frags {
                    match f {
                        Frag::Tok(t) => out.push(t),
                        Frag::Text(a, b) => {
                            let raw = String::from_utf8_lossy(&text.as_bytes()[a..b]);
                            let s = if pre.escape_whitespaces {
                                raw.replace(' ', "\u{2581}")
                            } else {
                                raw.into_owned()
                            };
                            self.bpe(&s, pre, parts, ranks, &mut out)?;
                        }
                    }
                }
            }
        }
        if add_special && self.add_eos {
            out.push(self.eos.ok_or("the model adds an EOS token but has none")?);
        }
        Ok(out)
    }

    /// `tokenizer_st_partition`: the text split around special tokens.
    fn partition(&self, text: &[u8], parse_special: bool) -> Vec<Frag> {
        let mut frags = if text.is_empty() {
            Vec::new()
        } else {
            vec![Frag::Text(0, text.len())]
        };
        let space = |c: u8| matches!(c, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r');
        for &id in &self.specials {
            let attr = self.attrs[id as usize];
            if !parse_special && attr & (A_CONTROL | A_UNKNOWN) != 0 {
                continue;
            }
            let tok = &self.tokens[id as usize][..];
            if !frags.iter().any(|f| matches!(f, Frag::Text(..))) {
                break;
            }
            let mut next = Vec::with_capacity(frags.len());
            for f in frags {
                let Frag::Text(mut a, b) = f else {
                    next.push(f);
                    continue;
                };
                let mut matched = false;
                while let Some(m) = find(&text[a..b], tok).map(|m| m + a) {
                    matched = true;
                    let mut le = m;
                    if attr & A_LSTRIP != 0 {
                        while le > a && space(text[le - 1]) {
                            le -= 1;
                        }
                    }
                    if le > a {
                        next.push(Frag::Text(a, le));
                    }
                    next.push(Frag::Tok(id));
                    a = m + tok.len();
                    if attr & A_RSTRIP != 0 {
                        while a < b && space(text[a]) {
                            a += 1;
                        }
                    }
                }
                if !matched || a < b {
                    next.push(Frag::Text(a, b));
                }
            }
            frags = next;
        }
        frags
    }

    fn byte_token(&self, b: u8) -> Result<u32, String> {
        let hex = format!("<0x{b:02X}>");
        self.ids
            .get(hex.as_bytes())
            .or_else(|| self.ids.get(&[b][..]))
            .copied()
            .ok_or_else(|| format!("no byte token for 0x{b:02X}"))
    }

    /// `llm_tokenizer_spm_session::tokenize`.
    fn spm(&self, text: &[u8], out: &mut Vec<u32>) -> Result<(), String> {
        #[derive(PartialEq)]
        struct Bigram {
            score: f32,
            left: usize,
            right: usize,
            size: usize,
        }
        impl Eq for Bigram {}
        impl Ord for Bigram {
            fn cmp(&self, o: &Self) -> std::cmp::Ordering {
                self.score
                    .total_cmp(&o.score)
                    .then_with(|| o.left.cmp(&self.left))
            }
        }
        impl PartialOrd for Bigram {
            fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
                Some(self.cmp(o))
            }
        }
        if text.is_empty() {
            return Ok(());
        }
        let mut syms: Vec<Sym> = Vec::new();
        push_chars(text, 0, &mut syms);
        let mut queue = BinaryHeap::new();
        let try_add = |syms: &[Sym], queue: &mut BinaryHeap<Bigram>, l: isize, r: isize| {
            if l < 0 || r < 0 {
                return;
            }
            let (l, r) = (l as usize, r as usize);
            let s = &text[syms[l].start..syms[l].start + syms[l].n + syms[r].n];
            if let Some(&id) = self.ids.get(s) {
                queue.push(Bigram {
                    score: self.scores[id as usize],
                    left: l,
                    right: r,
                    size: s.len(),
                });
            }
        };
        for i in 1..syms.len() {
            try_add(&syms, &mut queue, i as isize - 1, i as isize);
        }
        while let Some(bg) = queue.pop() {
            let (ln, rn) = (syms[bg.left].n, syms[bg.right].n);
            if ln == 0 || rn == 0 || ln + rn != bg.size {
                continue;
            }
            syms[bg.left].n += rn;
            syms[bg.right].n = 0;
            let rnext = syms[bg.right].next;
            syms[bg.left].next = rnext;
            if rnext >= 0 {
                syms[rnext as usize].prev = bg.left as isize;
            }
            let lprev = syms[bg.left].prev;
            try_add(&syms, &mut queue, lprev, bg.left as isize);
            try_add(&syms, &mut queue, bg.left as isize, rnext);
        }
        let mut i: isize = 0;
        while i != -1 {
            let s = &syms[i as usize];
            let piece = &text[s.start..s.start + s.n];
            match self.ids.get(piece) {
                Some(&id) => out.push(id),
                None => {
                    for &b in piece {
                        out.push(self.byte_token(b)?);
                    }
                }
            }
            i = s.next;
        }
        Ok(())
    }

    /// `llm_tokenizer_bpe_session::tokenize`.
    fn bpe(
        &self,
        text: &str,
        pre: &Pre,
        parts: &HashMap<Box<[u8]>, u32>,
        ranks: &HashMap<(u32, u32), u32>,
        out: &mut Vec<u32>,
    ) -> Result<(), String> {
        #[derive(PartialEq, Eq, PartialOrd, Ord)]
        struct Bigram {
            rank: std::cmp::Reverse<u32>,
            left: std::cmp::Reverse<usize>,
            right: usize,
            size: usize,
        }
        let rank = |l: &[u8], r: &[u8]| -> Option<u32> {
            ranks.get(&(*parts.get(l)?, *parts.get(r)?)).copied()
        };
        let map = byte_chars();
        for (a, b) in split_text(text, &pre.splits)? {
            let word: Vec<u8> = if pre.byte_encode {
                let mut w = String::with_capacity((b - a) * 2);
                for &c in &text.as_bytes()[a..b] {
                    w.push(map[c as usize]);
                }
                w.into_bytes()
            } else {
                text.as_bytes()[a..b].to_vec()
            };
            let mut syms: Vec<Sym> = Vec::new();
            let whole = (pre.ignore_merges && self.ids.contains_key(&word[..]))
                || (matches!(self.pre.as_str(), "gemma4" | "granite-embed-multi-311m")
                    && word.iter().all(|&c| c == b'\n')
                    && self.ids.contains_key(&word[..]));
            if whole {
                syms.push(Sym {
                    start: 0,
                    n: word.len(),
                    prev: -1,
                    next: -1,
                });
            } else {
                push_chars(&word, 0, &mut syms);
            }
            let mut queue = BinaryHeap::new();
            let add = |syms: &[Sym], queue: &mut BinaryHeap<Bigram>, l: isize, r: isize| {
                if l < 0 || r < 0 {
                    return;
                }
                let (l, r) = (l as usize, r as usize);
                let (ls, rs) = (&syms[l], &syms[r]);
                let lt = &word[ls.start..ls.start + ls.n];
                let rt = &word[rs.start..rs.start + rs.n];
                if let Some(k) = rank(lt, rt) {
                    queue.push(Bigram {
                        rank: std::cmp::Reverse(k),
                        left: std::cmp::Reverse(l),
                        right: r,
                        size: ls.n + rs.n,
                    });
                }
            };
            for i in 1..syms.len() {
                add(&syms, &mut queue, i as isize - 1, i as isize);
            }
            while let Some(bg) = queue.pop() {
                let l = bg.left.0;
                let (ln, rn) = (syms[l].n, syms[bg.right].n);
                if ln == 0 || rn == 0 || ln + rn != bg.size {
                    continue;
                }
                syms[l].n += rn;
                syms[bg.right].n = 0;
                let rnext = syms[bg.right].next;
                syms[l].next = rnext;
                if rnext >= 0 {
                    syms[rnext as usize].prev = l as isize;
                }
                let lprev = syms[l].prev;
                add(&syms, &mut queue, lprev, l as isize);
                add(&syms, &mut queue, l as isize, rnext);
            }
            for s in syms.iter().filter(|s| s.n > 0) {
                let piece = &word[s.start..s.start + s.n];
                if let Some(&id) = self.ids.get(piece) {
                    out.push(id);
                    continue;
                }
                for &c in piece {
                    let id = if pre.byte_encode {
                        self.ids.get(&[c][..])
                    } else {
                        self.ids.get(format!("<0x{c:02X}>").as_bytes())
                    };
                    out.extend(id.copied());
                }
            }
        }
        Ok(())
    }
}

/// A fragment of the text: raw bytes (a range) or a special token.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Frag {
    Text(usize, usize),
    Tok(u32),
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || needle.len() > hay.len() {
        return None;
    }
    memchr::memmem::find(hay, needle)
}

/// A run of bytes being merged, linked to its neighbours (-1: none).
struct Sym {
    start: usize,
    n: usize,
    prev: isize,
    next: isize,
}

/// One symbol per UTF-8 character of `text[from..]` (a cut character
/// keeps what bytes it has), linked in order: where merging starts.
fn push_chars(text: &[u8], from: usize, syms: &mut Vec<Sym>) {
    let mut offs = from;
    while offs < text.len() {
        let n = utf8_len(text[offs]).min(text.len() - offs);
        let i = syms.len() as isize;
        offs += n;
        syms.push(Sym {
            start: offs - n,
            n,
            prev: i - 1,
            next: if offs == text.len() { -1 } else { i + 1 },
        });
    }
}

/// llama.cpp's `unicode_len_utf8`: a sequence's length from its first
/// byte.
fn utf8_len(b: u8) -> usize {
    const L: [usize; 16] = [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4];
    L[(b >> 4) as usize]
}

fn escape_whitespace(s: &[u8]) -> Vec<u8> {
    let mut o = Vec::with_capacity(s.len() + s.len() / 4);
    for &b in s {
        if b == b' ' {
            o.extend_from_slice("\u{2581}".as_bytes());
        } else {
            o.push(b);
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(kvs: &[u8], n_kv: u64) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend_from_slice(&3u32.to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes());
        b.extend_from_slice(&n_kv.to_le_bytes());
        b.extend_from_slice(kvs);
        b
    }

    fn kv_str(key: &str, val: &str) -> Vec<u8> {
        let mut b = (key.len() as u64).to_le_bytes().to_vec();
        b.extend_from_slice(key.as_bytes());
        b.extend_from_slice(&T_STRING.to_le_bytes());
        b.extend_from_slice(&(val.len() as u64).to_le_bytes());
        b.extend_from_slice(val.as_bytes());
        b
    }

    fn kv_strs(key: &str, vals: &[&str]) -> Vec<u8> {
        let mut b = (key.len() as u64).to_le_bytes().to_vec();
        b.extend_from_slice(key.as_bytes());
        b.extend_from_slice(&T_ARRAY.to_le_bytes());
        b.extend_from_slice(&T_STRING.to_le_bytes());
        b.extend_from_slice(&(vals.len() as u64).to_le_bytes());
        for v in vals {
            b.extend_from_slice(&(v.len() as u64).to_le_bytes());
            b.extend_from_slice(v.as_bytes());
        }
        b
    }

    #[test]
    fn malformed_headers_are_refused() {
        assert!(Header::parse(b"").is_err());
        assert!(Header::parse(b"GGUF").is_err());
        assert!(Header::parse(b"GGML\x03\0\0\0").is_err());
        // Version 1 and a big-endian version.
        let mut v1 = header(&[], 0);
        v1[4] = 1;
        assert!(Header::parse(&v1).is_err());
        let mut be = header(&[], 0);
        be[4..8].copy_from_slice(&3u32.to_be_bytes());
        assert!(Header::parse(&be).is_err());
        // A huge key/value count, a huge tensor count.
        assert!(Header::parse(&header(&[], u64::MAX)).is_err());
        let mut t = header(&[], 0);
        t[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(Header::parse(&t).is_err());
        // More key/values announced than present.
        assert!(Header::parse(&header(&kv_str("a", "b"), 2)).is_err());
        // A string longer than the bytes, and over the limit.
        let mut s = kv_str("a", "b");
        s[13..21].copy_from_slice(&1000u64.to_le_bytes());
        assert!(Header::parse(&header(&s, 1)).is_err());
        s[13..21].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(Header::parse(&header(&s, 1)).is_err());
        // An array of 2^60 strings in a few bytes.
        let mut a = kv_strs("a", &["x"]);
        a[17..25].copy_from_slice(&(1u64 << 60).to_le_bytes());
        assert!(Header::parse(&header(&a, 1)).is_err());
        // An unknown value type, a nested array.
        let mut u = kv_str("a", "b");
        u[9..13].copy_from_slice(&99u32.to_le_bytes());
        assert!(Header::parse(&header(&u, 1)).is_err());
        let mut nested = kv_strs("a", &["x"]);
        nested[13..17].copy_from_slice(&T_ARRAY.to_le_bytes());
        assert!(Header::parse(&header(&nested, 1)).is_err());
        // Every truncation of a good header is refused, none panics.
        let mut kvs = kv_str("tokenizer.ggml.model", "llama");
        kvs.extend(kv_strs("tokenizer.ggml.tokens", &["<unk>", "a", "b"]));
        let good = header(&kvs, 2);
        assert!(Header::parse(&good).is_ok());
        for i in 0..good.len() {
            assert!(Header::parse(&good[..i]).is_err(), "prefix {i}");
        }
    }

    #[test]
    fn vocab_needs_a_model_and_known_pre() {
        let mut kvs = kv_str("tokenizer.ggml.model", "gpt2");
        kvs.extend(kv_str("tokenizer.ggml.pre", "no-such-pre"));
        kvs.extend(kv_strs("tokenizer.ggml.tokens", &["a", "b"]));
        kvs.extend(kv_strs("tokenizer.ggml.merges", &["a b"]));
        let e = GgufVocab::from_gguf(&header(&kvs, 4)).unwrap_err();
        assert!(e.contains("no-such-pre"), "{e}");
        let mut kvs = kv_str("tokenizer.ggml.model", "bert");
        kvs.extend(kv_strs("tokenizer.ggml.tokens", &["a", "b"]));
        assert!(GgufVocab::from_gguf(&header(&kvs, 2)).is_err());
        assert!(GgufVocab::from_gguf(&header(&[], 0)).is_err());
    }

    #[test]
    fn spm_merges_by_score_with_byte_fallback() {
        let toks = [
            "<unk>", "<s>", "</s>", "<0x21>", "▁", "a", "b", "▁a", "ab", "▁ab",
        ];
        let mut kvs = kv_str("tokenizer.ggml.model", "llama");
        kvs.extend(kv_strs("tokenizer.ggml.tokens", &toks));
        let v = GgufVocab::from_gguf(&header(&kvs, 2)).unwrap();
        // All scores 0: ties go to the leftmost pair.
        assert_eq!(v.encode("ab", false, false).unwrap(), vec![9]);
        assert_eq!(v.encode("ab!", true, false).unwrap(), vec![1, 9, 3]);
        assert!(
            v.encode("?", false, false).is_err(),
            "no byte token for '?'"
        );
    }

    #[test]
    fn categories() {
        assert_eq!(cat('a'), C_LETTER);
        assert_eq!(cat('7'), C_NUMBER);
        assert_eq!(cat('.'), C_PUNCT);
        assert_eq!(cat('+'), C_SYMBOL);
        assert_eq!(cat(' '), C_SPACE);
        assert_eq!(cat('\u{3000}'), C_SPACE);
        assert_eq!(cat('\u{301}'), C_MARK);
        assert_eq!(cat('я'), C_LETTER);
        assert_eq!(cat('\u{10FFFF}'), 0);
    }
}
