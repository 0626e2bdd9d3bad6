//! HPACK (RFC 7541) header block decoder that tolerates joining a connection
//! mid-way.
//!
//! An observer that starts watching a long-lived HTTP/2 connection has missed
//! the header blocks that filled the encoder's dynamic table. Every HPACK
//! representation is self-delimiting, so decoding can still go on:
//!
//! * an index past the entries the decoder knows is reported as an unknown
//!   field (`Field { name: None, value: None }`) instead of an error;
//! * a literal with incremental indexing whose *name* is such an unknown index
//!   still inserts an entry (a placeholder: value known, name unknown) so that
//!   the index arithmetic of later blocks stays exact.
//!
//! The decoder only ever holds a suffix of the encoder's insertion history,
//! with the newest entries at the same indices as in the encoder's table; it
//! may hold *more* old entries than the encoder (they are never referenced) but
//! drops entries only when the encoder's table has also dropped them, as long
//! as the encoder's maximum size is at most [`MAX_TABLE_BYTES`]. So a resolved
//! field is always the right one; a field it cannot resolve comes out unknown.

use std::collections::VecDeque;
use std::fmt;

use super::huffman;

/// Most bytes of dynamic-table entries (RFC 7541 §4.1 sizes) a decoder keeps.
pub const MAX_TABLE_BYTES: usize = 65536;
/// Longest string literal accepted, both as sent and after Huffman decoding.
pub const MAX_STRING: usize = 65536;

/// Largest integer accepted (RFC 7541 §5.1 leaves the limit to implementations).
const MAX_INT: u64 = 1 << 28;
/// Most continuation bytes of one integer (5 × 7 bits cover `MAX_INT`).
const MAX_INT_CONTINUATIONS: usize = 5;
/// Per-entry overhead counted in an entry's size (RFC 7541 §4.1).
const ENTRY_OVERHEAD: usize = 32;
/// SETTINGS_HEADER_TABLE_SIZE initial value (RFC 7540 §6.5.2).
const DEFAULT_TABLE_SIZE: u32 = 4096;
/// Capacity of the Huffman scratch buffer kept between blocks.
const SCRATCH_KEEP: usize = 4096;
/// `Entry::name_len` of a placeholder whose name is unknown.
const NAME_UNKNOWN: u32 = u32::MAX;

/// RFC 7541 Appendix A.
static STATIC_TABLE: [(&[u8], &[u8]); 61] = [
    (b":authority", b""),
    (b":method", b"GET"),
    (b":method", b"POST"),
    (b":path", b"/"),
    (b":path", b"/index.html"),
    (b":scheme", b"http"),
    (b":scheme", b"https"),
    (b":status", b"200"),
    (b":status", b"204"),
    (b":status", b"206"),
    (b":status", b"304"),
    (b":status", b"400"),
    (b":status", b"404"),
    (b":status", b"500"),
    (b"accept-charset", b""),
    (b"accept-encoding", b"gzip, deflate"),
    (b"accept-language", b""),
    (b"accept-ranges", b""),
    (b"accept", b""),
    (b"access-control-allow-origin", b""),
    (b"age", b""),
    (b"allow", b""),
    (b"authorization", b""),
    (b"cache-control", b""),
    (b"content-disposition", b""),
    (b"content-encoding", b""),
    (b"content-language", b""),
    (b"content-length", b""),
    (b"content-location", b""),
    (b"content-range", b""),
    (b"content-type", b""),
    (b"cookie", b""),
    (b"date", b""),
    (b"etag", b""),
    (b"expect", b""),
    (b"expires", b""),
    (b"from", b""),
    (b"host", b""),
    (b"if-match", b""),
    (b"if-modified-since", b""),
    (b"if-none-match", b""),
    (b"if-range", b""),
    (b"if-unmodified-since", b""),
    (b"last-modified", b""),
    (b"link", b""),
    (b"location", b""),
    (b"max-forwards", b""),
    (b"proxy-authenticate", b""),
    (b"proxy-authorization", b""),
    (b"range", b""),
    (b"referer", b""),
    (b"refresh", b""),
    (b"retry-after", b""),
    (b"server", b""),
    (b"set-cookie", b""),
    (b"strict-transport-security", b""),
    (b"transfer-encoding", b""),
    (b"user-agent", b""),
    (b"vary", b""),
    (b"via", b""),
    (b"www-authenticate", b""),
];

/// One header field as decoded. `name`/`value` are `None` when the field
/// referred to a dynamic-table entry the decoder never saw (joined
/// mid-connection). The slices borrow the block or the decoder's buffers and
/// live only for the callback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field<'a> {
    pub name: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
}

impl Field<'_> {
    /// Whether both name and value are known.
    pub fn is_resolved(&self) -> bool {
        self.name.is_some() && self.value.is_some()
    }
}

/// Why a header block could not be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// A representation runs past the end of the block.
    Truncated,
    /// An integer above 2^28, or with more than 5 continuation bytes.
    IntegerOverflow,
    /// A Huffman string with EOS, over-long padding or padding not all ones.
    Huffman,
    /// Index 0 (RFC 7541 §6.1).
    IndexZero,
    /// An index beyond a dynamic table known from the connection's start.
    BadIndex,
    /// A dynamic table size update above SETTINGS_HEADER_TABLE_SIZE.
    SizeUpdateTooLarge,
    /// A dynamic table size update after a header field (RFC 7541 §4.2).
    SizeUpdateMisplaced,
    /// A string literal longer than [`MAX_STRING`].
    StringTooLong,
}

impl Error {
    /// Snake-case label for counters.
    pub fn reason(self) -> &'static str {
        match self {
            Error::Truncated => "hpack_truncated",
            Error::IntegerOverflow => "hpack_integer_overflow",
            Error::Huffman => "hpack_huffman",
            Error::IndexZero => "hpack_index_zero",
            Error::BadIndex => "hpack_bad_index",
            Error::SizeUpdateTooLarge => "hpack_size_update_too_large",
            Error::SizeUpdateMisplaced => "hpack_size_update_misplaced",
            Error::StringTooLong => "hpack_string_too_long",
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.reason())
    }
}

impl std::error::Error for Error {}

/// Where a decoded string lives while a field is being decoded.
#[derive(Debug, Clone, Copy)]
enum Src {
    Static(&'static [u8]),
    /// Range of the header block (a plain string literal).
    Block(usize, usize),
    /// Range of the Huffman scratch buffer.
    Scratch(usize, usize),
    /// Range of the dynamic table's byte arena.
    Arena(usize, usize),
    /// Part of an entry the decoder never saw.
    Unknown,
}

impl Src {
    fn len(self) -> usize {
        match self {
            Src::Static(s) => s.len(),
            Src::Block(a, b) | Src::Scratch(a, b) | Src::Arena(a, b) => b - a,
            Src::Unknown => 0,
        }
    }
}

/// A dynamic-table entry: its name then its value, contiguous in the arena.
#[derive(Debug, Clone, Copy)]
struct Entry {
    off: u32,
    /// `NAME_UNKNOWN` for a placeholder (no name bytes stored).
    name_len: u32,
    value_len: u32,
}

impl Entry {
    fn name_bytes(&self) -> usize {
        if self.name_len == NAME_UNKNOWN {
            0
        } else {
            self.name_len as usize
        }
    }

    /// Size as counted for eviction; for a placeholder the name counts as 0.
    fn size(&self) -> usize {
        self.name_bytes() + self.value_len as usize + ENTRY_OVERHEAD
    }

    fn name_src(&self) -> Src {
        if self.name_len == NAME_UNKNOWN {
            Src::Unknown
        } else {
            let a = self.off as usize;
            Src::Arena(a, a + self.name_len as usize)
        }
    }

    fn value_src(&self) -> Src {
        let a = self.off as usize + self.name_bytes();
        Src::Arena(a, a + self.value_len as usize)
    }
}

enum Inserted {
    Stored {
        evicted: bool,
    },
    /// Larger than the limit: the table was emptied (RFC 7541 §4.4).
    TooLarge,
}

/// The known part of the dynamic table. Entry bytes are appended to one arena;
/// evicted entries leave dead bytes at the arena's front, dropped by
/// compaction when the arena would pass twice the size limit.
#[derive(Debug, Default)]
struct Table {
    arena: Vec<u8>,
    /// Oldest at the front.
    entries: VecDeque<Entry>,
    /// Sum of `Entry::size`.
    size: usize,
}

impl Table {
    /// `i` = 0 is the newest entry (HPACK index 62).
    fn get(&self, i: usize) -> Option<&Entry> {
        let n = self.entries.len();
        if i < n {
            self.entries.get(n - 1 - i)
        } else {
            None
        }
    }

    fn clear(&mut self) {
        self.entries.clear();
        self.arena.clear();
        self.size = 0;
    }

    /// Evicts oldest entries until the size is at most `limit`.
    fn evict_to(&mut self, limit: usize) -> bool {
        let mut evicted = false;
        while self.size > limit {
            match self.entries.pop_front() {
                Some(e) => {
                    self.size -= e.size();
                    evicted = true;
                }
                None => {
                    self.size = 0;
                    break;
                }
            }
        }
        evicted
    }

    /// Drops the dead bytes before the oldest entry; returns how many.
    fn compact(&mut self) -> usize {
        let dead = self
            .entries
            .front()
            .map_or(self.arena.len(), |e| e.off as usize);
        if dead > 0 {
            self.arena.drain(..dead);
            for e in self.entries.iter_mut() {
                e.off -= dead as u32;
            }
        }
        dead
    }

    /// After the limit changed: releases memory beyond what `limit` needs.
    fn shrink(&mut self, limit: usize) {
        if self.entries.is_empty() {
            self.arena.clear();
            self.entries = VecDeque::new();
        }
        if self.arena.capacity() > 2 * limit {
            self.compact();
            self.arena.shrink_to(2 * limit);
        }
    }

    /// Inserts `name`/`value` as the newest entry, evicting to fit `limit`.
    /// `name` may point into the arena at an entry that this insertion evicts
    /// (RFC 7541 §4.4): bytes are copied before any eviction.
    fn insert(
        &mut self,
        name: Src,
        value: Src,
        block: &[u8],
        scratch: &[u8],
        limit: usize,
    ) -> Inserted {
        let bytes = name.len() + value.len();
        let size = bytes + ENTRY_OVERHEAD;
        if size > limit {
            self.clear();
            return Inserted::TooLarge;
        }
        // Live bytes are at most `limit - 32 * entries`, so after compaction
        // the arena plus this entry fits in `2 * limit`.
        let mut shift = 0;
        if self.arena.len() + bytes > 2 * limit {
            shift = self.compact();
        }
        let need = self.arena.len() + bytes;
        if need > self.arena.capacity() {
            let cap = (self.arena.capacity() * 2).clamp(need, (2 * limit).max(need));
            self.arena.reserve_exact(cap - self.arena.len());
        }
        let off = self.arena.len();
        for src in [name, value] {
            match src {
                Src::Static(s) => self.arena.extend_from_slice(s),
                Src::Block(a, b) => self.arena.extend_from_slice(&block[a..b]),
                Src::Scratch(a, b) => self.arena.extend_from_slice(&scratch[a..b]),
                Src::Arena(a, b) => self.arena.extend_from_within(a - shift..b - shift),
                Src::Unknown => {}
            }
        }
        let evicted = self.evict_to(limit - size);
        self.entries.push_back(Entry {
            off: off as u32,
            name_len: match name {
                Src::Unknown => NAME_UNKNOWN,
                _ => name.len() as u32,
            },
            value_len: value.len() as u32,
        });
        self.size += size;
        Inserted::Stored { evicted }
    }
}

/// Reads an RFC 7541 §5.1 integer with an N-bit prefix (1 ≤ N ≤ 8) at `*pos`.
fn read_int(buf: &[u8], pos: &mut usize, prefix_bits: u32) -> Result<usize, Error> {
    let mask = ((1u32 << prefix_bits) - 1) as u8;
    let first = *buf.get(*pos).ok_or(Error::Truncated)?;
    *pos += 1;
    let mut value = u64::from(first & mask);
    if value < u64::from(mask) {
        return Ok(value as usize);
    }
    let mut shift = 0;
    for _ in 0..MAX_INT_CONTINUATIONS {
        let b = *buf.get(*pos).ok_or(Error::Truncated)?;
        *pos += 1;
        value += u64::from(b & 0x7f) << shift;
        if value > MAX_INT {
            return Err(Error::IntegerOverflow);
        }
        if b & 0x80 == 0 {
            return Ok(value as usize);
        }
        shift += 7;
    }
    Err(Error::IntegerOverflow)
}

/// HPACK decoder for one direction of one connection.
///
/// Memory bound (all heap, reported by [`Decoder::buffered`]):
/// * entry bytes: at most `2 * MAX_TABLE_BYTES` (128 KiB), usually about
///   twice the current table size or less;
/// * entry index: 12 bytes per entry, at most `MAX_TABLE_BYTES / 32` = 2048
///   entries (24 KiB);
/// * Huffman scratch: at most 4 KiB kept between blocks; while a block with
///   Huffman strings near [`MAX_STRING`] is decoded it may briefly hold about
///   `MAX_STRING * (1 + 8/5)` bytes (≈ 170 KiB, ≈ 205 KiB of capacity).
///
/// So at most ≈ 156 KiB between blocks, ≈ 360 KiB worst case during a block.
#[derive(Debug)]
pub struct Decoder {
    table: Table,
    scratch: Vec<u8>,
    /// The table's maximum size: the last size update, initially the
    /// SETTINGS value. `None`: unknown (joined, no size update seen yet).
    max_size: Option<usize>,
    /// SETTINGS_HEADER_TABLE_SIZE bound on size updates; `None`: unknown.
    max_allowed: Option<usize>,
    /// The known entries are all of the encoder's table (fresh decoder whose
    /// storage was never clamped below the encoder's maximum).
    complete: bool,
    uncertain: bool,
}

impl Default for Decoder {
    fn default() -> Self {
        Self::new()
    }
}

impl Decoder {
    /// Table known from the connection's start (max size 4096, the
    /// SETTINGS_HEADER_TABLE_SIZE default).
    pub fn new() -> Self {
        Self::with_max(DEFAULT_TABLE_SIZE)
    }

    /// Table known from the connection's start, with SETTINGS_HEADER_TABLE_SIZE
    /// `n` already in effect: both the initial maximum table size and the bound
    /// on size updates are `n` (RFC 7541 §4.2). Storage is capped at
    /// [`MAX_TABLE_BYTES`]; if the encoder uses more, entries it still holds
    /// may be dropped here and references to them come out unknown.
    pub fn with_max(n: u32) -> Self {
        Decoder {
            table: Table::default(),
            scratch: Vec::new(),
            max_size: Some(n as usize),
            max_allowed: Some(n as usize),
            complete: true,
            uncertain: false,
        }
    }

    /// Joined mid-connection: entries older than what we see are unknown;
    /// references to them are reported as unknown fields instead of errors.
    ///
    /// The table's maximum size and the SETTINGS bound are unknown: until a
    /// size update is seen the decoder keeps up to [`MAX_TABLE_BYTES`] of
    /// entries (keeping more than the encoder is harmless), and any size
    /// update up to 2^28 is accepted unless [`Decoder::set_max_allowed`] is
    /// called. Storage never exceeds [`MAX_TABLE_BYTES`] of entries.
    pub fn joined() -> Self {
        Decoder {
            table: Table::default(),
            scratch: Vec::new(),
            max_size: None,
            max_allowed: None,
            complete: false,
            uncertain: false,
        }
    }

    /// The decoding side's SETTINGS_HEADER_TABLE_SIZE: the largest size update
    /// the encoder may send. Default 4096 (unknown for [`Decoder::joined`]).
    /// Values above [`MAX_TABLE_BYTES`] are accepted as the bound, but storage
    /// stays clamped to [`MAX_TABLE_BYTES`].
    ///
    /// This does not change the current maximum table size: per RFC 7541 §4.2
    /// that changes only with a size update, which the encoder must send after
    /// a reduced setting is acknowledged. (Use [`Decoder::with_max`] when the
    /// setting was in effect from the connection's start.)
    pub fn set_max_allowed(&mut self, n: u32) {
        self.max_allowed = Some(n as usize);
    }

    /// Decodes one complete header block (HEADERS + CONTINUATION payloads
    /// joined), calling `f` per field in order. Returns how many fields were
    /// unresolved (name or value unknown). On `Err` the decoder's table may be
    /// out of step: the caller stops decoding that connection.
    pub fn decode(&mut self, block: &[u8], f: &mut dyn FnMut(Field<'_>)) -> Result<usize, Error> {
        let result = self.decode_block(block, f);
        if self.scratch.capacity() > SCRATCH_KEEP {
            self.scratch.clear();
            self.scratch.shrink_to(SCRATCH_KEEP);
        }
        result
    }

    /// Heap bytes held (table entries + scratch buffers), for memory accounting.
    pub fn buffered(&self) -> usize {
        self.table.arena.capacity()
            + self.table.entries.capacity() * std::mem::size_of::<Entry>()
            + self.scratch.capacity()
    }

    /// Whether the table may be inexact: placeholders of unknown size were
    /// inserted, so eviction may lag the encoder's. (Lagging only keeps extra
    /// old entries, which the encoder never references.)
    pub fn uncertain(&self) -> bool {
        self.uncertain
    }

    /// Whether every entry of the encoder's table is known, so that an index
    /// past the known entries is an error rather than an unknown field.
    pub fn complete(&self) -> bool {
        self.complete
    }

    /// The current maximum table size, if known.
    pub fn max_size(&self) -> Option<usize> {
        self.max_size
    }

    /// Number of dynamic-table entries held.
    pub fn table_len(&self) -> usize {
        self.table.entries.len()
    }

    /// Size of the held entries (RFC 7541 §4.1; placeholders count their
    /// value and overhead only).
    pub fn table_size(&self) -> usize {
        self.table.size
    }

    /// Dynamic-table entry `i`, 0 being the newest (HPACK index 62 + i).
    pub fn entry(&self, i: usize) -> Option<Field<'_>> {
        let e = self.table.get(i)?;
        Some(Field {
            name: self.resolve(e.name_src(), &[]),
            value: self.resolve(e.value_src(), &[]),
        })
    }

    /// Bytes of the dynamic table kept: the maximum size, capped.
    fn limit(&self) -> usize {
        self.max_size
            .map_or(MAX_TABLE_BYTES, |m| m.min(MAX_TABLE_BYTES))
    }

    /// Whether the kept bytes may be fewer than the encoder's table holds.
    fn clamped(&self) -> bool {
        match self.max_size {
            Some(m) => m > MAX_TABLE_BYTES,
            None => true,
        }
    }

    fn decode_block(&mut self, block: &[u8], f: &mut dyn FnMut(Field<'_>)) -> Result<usize, Error> {
        let mut pos = 0;
        let mut unresolved = 0;
        let mut at_start = true;
        while let Some(&b) = block.get(pos) {
            if b & 0x80 != 0 {
                // Indexed header field (§6.1).
                at_start = false;
                let index = read_int(block, &mut pos, 7)?;
                let (name, value) = self.lookup(index)?;
                unresolved += self.emit(name, value, block, f);
            } else if b & 0x40 != 0 {
                // Literal with incremental indexing (§6.2.1).
                at_start = false;
                unresolved += self.literal(block, &mut pos, 6, true, f)?;
            } else if b & 0x20 != 0 {
                // Dynamic table size update (§6.3).
                if !at_start {
                    return Err(Error::SizeUpdateMisplaced);
                }
                let n = read_int(block, &mut pos, 5)?;
                self.size_update(n)?;
            } else {
                // Literal without indexing (0000) or never indexed (0001).
                at_start = false;
                unresolved += self.literal(block, &mut pos, 4, false, f)?;
            }
        }
        Ok(unresolved)
    }

    fn lookup(&self, index: usize) -> Result<(Src, Src), Error> {
        if index == 0 {
            return Err(Error::IndexZero);
        }
        if let Some(&(name, value)) = STATIC_TABLE.get(index - 1) {
            return Ok((Src::Static(name), Src::Static(value)));
        }
        match self.table.get(index - STATIC_TABLE.len() - 1) {
            Some(e) => Ok((e.name_src(), e.value_src())),
            None if self.complete => Err(Error::BadIndex),
            None => Ok((Src::Unknown, Src::Unknown)),
        }
    }

    fn literal(
        &mut self,
        block: &[u8],
        pos: &mut usize,
        prefix_bits: u32,
        indexing: bool,
        f: &mut dyn FnMut(Field<'_>),
    ) -> Result<usize, Error> {
        let index = read_int(block, pos, prefix_bits)?;
        self.scratch.clear();
        let name = if index == 0 {
            self.read_string(block, pos)?
        } else {
            self.lookup(index)?.0
        };
        let value = self.read_string(block, pos)?;
        let unresolved = self.emit(name, value, block, f);
        if indexing {
            self.insert(name, value, block);
        }
        Ok(unresolved)
    }

    fn read_string(&mut self, block: &[u8], pos: &mut usize) -> Result<Src, Error> {
        let huffman = block.get(*pos).ok_or(Error::Truncated)? & 0x80 != 0;
        let len = read_int(block, pos, 7)?;
        let start = *pos;
        if len > block.len() - start {
            return Err(Error::Truncated);
        }
        if len > MAX_STRING {
            return Err(Error::StringTooLong);
        }
        *pos += len;
        if !huffman {
            return Ok(Src::Block(start, start + len));
        }
        let from = self.scratch.len();
        huffman::decode(&block[start..start + len], &mut self.scratch)
            .map_err(|_| Error::Huffman)?;
        if self.scratch.len() - from > MAX_STRING {
            return Err(Error::StringTooLong);
        }
        Ok(Src::Scratch(from, self.scratch.len()))
    }

    fn resolve<'a>(&'a self, src: Src, block: &'a [u8]) -> Option<&'a [u8]> {
        match src {
            Src::Static(s) => Some(s),
            Src::Block(a, b) => Some(&block[a..b]),
            Src::Scratch(a, b) => Some(&self.scratch[a..b]),
            Src::Arena(a, b) => Some(&self.table.arena[a..b]),
            Src::Unknown => None,
        }
    }

    /// Calls `f` with the field; returns 1 if it is unresolved, else 0.
    fn emit(&self, name: Src, value: Src, block: &[u8], f: &mut dyn FnMut(Field<'_>)) -> usize {
        let field = Field {
            name: self.resolve(name, block),
            value: self.resolve(value, block),
        };
        f(field);
        usize::from(!field.is_resolved())
    }

    fn insert(&mut self, name: Src, value: Src, block: &[u8]) {
        let limit = self.limit();
        let clamped = self.clamped();
        match self.table.insert(name, value, block, &self.scratch, limit) {
            Inserted::Stored { evicted } => {
                if evicted && clamped {
                    self.complete = false;
                }
                if matches!(name, Src::Unknown) {
                    self.uncertain = true;
                }
            }
            Inserted::TooLarge => {
                if clamped {
                    self.complete = false;
                }
            }
        }
    }

    fn size_update(&mut self, n: usize) -> Result<(), Error> {
        if self.max_allowed.is_some_and(|allowed| n > allowed) {
            return Err(Error::SizeUpdateTooLarge);
        }
        self.max_size = Some(n);
        let limit = self.limit();
        if self.table.evict_to(limit) && self.clamped() {
            self.complete = false;
        }
        self.table.shrink(limit);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    type Owned = (Option<Vec<u8>>, Option<Vec<u8>>);

    fn hex(s: &str) -> Vec<u8> {
        let digits: Vec<u8> = s.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
        digits
            .chunks(2)
            .map(|p| u8::from_str_radix(std::str::from_utf8(p).unwrap(), 16).unwrap())
            .collect()
    }

    fn run(d: &mut Decoder, block: &[u8]) -> Result<(Vec<Owned>, usize), Error> {
        let mut out = Vec::new();
        let n = d.decode(block, &mut |f: Field<'_>| {
            out.push((f.name.map(<[u8]>::to_vec), f.value.map(<[u8]>::to_vec)))
        })?;
        Ok((out, n))
    }

    fn known(pairs: &[(&str, &str)]) -> Vec<Owned> {
        pairs
            .iter()
            .map(|(n, v)| (Some(n.as_bytes().to_vec()), Some(v.as_bytes().to_vec())))
            .collect()
    }

    fn unknown() -> Owned {
        (None, None)
    }

    fn table(d: &Decoder) -> Vec<Owned> {
        (0..d.table_len())
            .map(|i| {
                let f = d.entry(i).unwrap();
                (f.name.map(<[u8]>::to_vec), f.value.map(<[u8]>::to_vec))
            })
            .collect()
    }

    /// Decodes `block`, checks fields, then the table (newest first) and size.
    fn step(
        d: &mut Decoder,
        block: &str,
        fields: &[(&str, &str)],
        tbl: &[(&str, &str)],
        size: usize,
    ) {
        let (got, unresolved) = run(d, &hex(block)).unwrap();
        assert_eq!(got, known(fields));
        assert_eq!(unresolved, 0);
        assert_eq!(table(d), known(tbl));
        assert_eq!(d.table_size(), size);
    }

    fn write_int(out: &mut Vec<u8>, flags: u8, prefix_bits: u32, v: usize) {
        let mask = ((1u32 << prefix_bits) - 1) as usize;
        if v < mask {
            out.push(flags | v as u8);
            return;
        }
        out.push(flags | mask as u8);
        let mut rest = v - mask;
        while rest >= 0x80 {
            out.push(0x80 | (rest & 0x7f) as u8);
            rest >>= 7;
        }
        out.push(rest as u8);
    }

    fn write_str(out: &mut Vec<u8>, s: &[u8], huffman: bool) {
        if huffman {
            write_int(out, 0x80, 7, huffman::encoded_len(s));
            huffman::encode(s, out);
        } else {
            write_int(out, 0, 7, s.len());
            out.extend_from_slice(s);
        }
    }

    // ---- RFC 7541 Appendix C ----

    #[test]
    fn c1_integers() {
        let mut pos = 0;
        assert_eq!(read_int(&[0x0a], &mut pos, 5), Ok(10));
        pos = 0;
        // Flag bits above the prefix are ignored.
        assert_eq!(read_int(&[0xea], &mut pos, 5), Ok(10));
        pos = 0;
        assert_eq!(read_int(&[0x1f, 0x9a, 0x0a], &mut pos, 5), Ok(1337));
        assert_eq!(pos, 3);
        pos = 0;
        assert_eq!(read_int(&[0x2a], &mut pos, 8), Ok(42));
        let mut buf = Vec::new();
        write_int(&mut buf, 0, 5, 1337);
        assert_eq!(buf, [0x1f, 0x9a, 0x0a]);
        for v in [0, 30, 31, 32, 127, 128, 1 << 20, MAX_INT as usize] {
            for bits in 1..=8 {
                buf.clear();
                write_int(&mut buf, 0, bits, v);
                pos = 0;
                assert_eq!(read_int(&buf, &mut pos, bits), Ok(v));
                assert_eq!(pos, buf.len());
            }
        }
    }

    #[test]
    fn c2_literals_and_indexed() {
        let mut d = Decoder::new();
        step(
            &mut d,
            "400a 6375 7374 6f6d 2d6b 6579 0d63 7573 746f 6d2d 6865 6164 6572",
            &[("custom-key", "custom-header")],
            &[("custom-key", "custom-header")],
            55,
        );
        let mut d = Decoder::new();
        step(
            &mut d,
            "040c 2f73 616d 706c 652f 7061 7468",
            &[(":path", "/sample/path")],
            &[],
            0,
        );
        let mut d = Decoder::new();
        step(
            &mut d,
            "1008 7061 7373 776f 7264 0673 6563 7265 74",
            &[("password", "secret")],
            &[],
            0,
        );
        let mut d = Decoder::new();
        step(&mut d, "82", &[(":method", "GET")], &[], 0);
    }

    const C3: [&str; 3] = [
        "8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d",
        "8286 84be 5808 6e6f 2d63 6163 6865",
        "8287 85bf 400a 6375 7374 6f6d 2d6b 6579 0c63 7573 746f 6d2d 7661 6c75 65",
    ];
    const C4: [&str; 3] = [
        "8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff",
        "8286 84be 5886 a8eb 1064 9cbf",
        "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf",
    ];

    fn requests(blocks: [&str; 3]) {
        let mut d = Decoder::new();
        let r1 = [
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            (":authority", "www.example.com"),
        ];
        step(
            &mut d,
            blocks[0],
            &r1,
            &[(":authority", "www.example.com")],
            57,
        );
        let mut r2 = r1.to_vec();
        r2.push(("cache-control", "no-cache"));
        step(
            &mut d,
            blocks[1],
            &r2,
            &[
                ("cache-control", "no-cache"),
                (":authority", "www.example.com"),
            ],
            110,
        );
        step(
            &mut d,
            blocks[2],
            &[
                (":method", "GET"),
                (":scheme", "https"),
                (":path", "/index.html"),
                (":authority", "www.example.com"),
                ("custom-key", "custom-value"),
            ],
            &[
                ("custom-key", "custom-value"),
                ("cache-control", "no-cache"),
                (":authority", "www.example.com"),
            ],
            164,
        );
        assert!(d.complete() && !d.uncertain());
    }

    #[test]
    fn c3_requests_plain() {
        requests(C3);
    }

    #[test]
    fn c4_requests_huffman() {
        requests(C4);
    }

    const DATE1: &str = "Mon, 21 Oct 2013 20:13:21 GMT";
    const DATE2: &str = "Mon, 21 Oct 2013 20:13:22 GMT";
    const LOC: &str = "https://www.example.com";
    const COOKIE: &str = "foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1";

    const C5: [&str; 3] = [
        "4803 3330 3258 0770 7269 7661 7465 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133 \
         2032 303a 3133 3a32 3120 474d 546e 1768 7474 7073 3a2f 2f77 7777 2e65 7861 6d70 \
         6c65 2e63 6f6d",
        "4803 3330 37c1 c0bf",
        "88c1 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133 2032 303a 3133 3a32 3220 474d \
         54c0 5a04 677a 6970 7738 666f 6f3d 4153 444a 4b48 514b 425a 584f 5157 454f 5049 \
         5541 5851 5745 4f49 553b 206d 6178 2d61 6765 3d33 3630 303b 2076 6572 7369 6f6e \
         3d31",
    ];
    const C6: [&str; 3] = [
        "4882 6402 5885 aec3 771a 4b61 96d0 7abe 9410 54d4 44a8 2005 9504 0b81 66e0 82a6 \
         2d1b ff6e 919d 29ad 1718 63c7 8f0b 97c8 e9ae 82ae 43d3",
        "4883 640e ffc1 c0bf",
        "88c1 6196 d07a be94 1054 d444 a820 0595 040b 8166 e084 a62d 1bff c05a 839b d9ab \
         77ad 94e7 821d d7f2 e6c7 b335 dfdf cd5b 3960 d5af 2708 7f36 72c1 ab27 0fb5 291f \
         9587 3160 65c0 03ed 4ee5 b106 3d50 07",
    ];

    fn responses(blocks: [&str; 3]) {
        let mut d = Decoder::with_max(256);
        step(
            &mut d,
            blocks[0],
            &[
                (":status", "302"),
                ("cache-control", "private"),
                ("date", DATE1),
                ("location", LOC),
            ],
            &[
                ("location", LOC),
                ("date", DATE1),
                ("cache-control", "private"),
                (":status", "302"),
            ],
            222,
        );
        step(
            &mut d,
            blocks[1],
            &[
                (":status", "307"),
                ("cache-control", "private"),
                ("date", DATE1),
                ("location", LOC),
            ],
            &[
                (":status", "307"),
                ("location", LOC),
                ("date", DATE1),
                ("cache-control", "private"),
            ],
            222,
        );
        step(
            &mut d,
            blocks[2],
            &[
                (":status", "200"),
                ("cache-control", "private"),
                ("date", DATE2),
                ("location", LOC),
                ("content-encoding", "gzip"),
                ("set-cookie", COOKIE),
            ],
            &[
                ("set-cookie", COOKIE),
                ("content-encoding", "gzip"),
                ("date", DATE2),
            ],
            215,
        );
        assert!(d.complete() && !d.uncertain());
        // Evicted entries are out of range for a fresh decoder.
        assert_eq!(run(&mut d, &[0xc1]), Err(Error::BadIndex));
    }

    #[test]
    fn c5_responses_plain() {
        responses(C5);
    }

    #[test]
    fn c6_responses_huffman() {
        responses(C6);
    }

    // ---- Joining mid-connection ----

    fn late_join_request(block: &str) {
        let mut d = Decoder::joined();
        let (got, unresolved) = run(&mut d, &hex(block)).unwrap();
        let mut want = known(&[
            (":method", "GET"),
            (":scheme", "https"),
            (":path", "/index.html"),
        ]);
        want.push(unknown()); // index 63: :authority from block 1
        want.extend(known(&[("custom-key", "custom-value")]));
        assert_eq!(got, want);
        assert_eq!(unresolved, 1);
        assert_eq!(table(&d), known(&[("custom-key", "custom-value")]));
        assert_eq!(d.table_size(), 54);
        assert!(!d.uncertain());
        // A later block referencing the new entry (62) resolves; older ones
        // (63, 64) stay unknown.
        let (got, unresolved) = run(&mut d, &[0x82, 0xbe, 0xbf, 0xc0]).unwrap();
        assert_eq!(
            got,
            vec![
                known(&[(":method", "GET")])[0].clone(),
                known(&[("custom-key", "custom-value")])[0].clone(),
                unknown(),
                unknown(),
            ]
        );
        assert_eq!(unresolved, 2);
    }

    #[test]
    fn late_join_c3_c4() {
        late_join_request(C3[2]);
        late_join_request(C4[2]);
    }

    fn late_join_response(blocks: [&str; 3]) {
        let mut d = Decoder::joined();
        let (got, unresolved) = run(&mut d, &hex(blocks[2])).unwrap();
        let mut want = known(&[(":status", "200")]);
        want.push(unknown()); // 65: cache-control: private
        want.extend(known(&[("date", DATE2)]));
        want.push(unknown()); // 64: location (only `date` is known here)
        want.extend(known(&[
            ("content-encoding", "gzip"),
            ("set-cookie", COOKIE),
        ]));
        assert_eq!(got, want);
        assert_eq!(unresolved, 2);
        assert_eq!(
            table(&d),
            known(&[
                ("set-cookie", COOKIE),
                ("content-encoding", "gzip"),
                ("date", DATE2),
            ])
        );
        assert_eq!(d.table_size(), 215);
        // Another response reusing the known entries.
        let (got, unresolved) = run(&mut d, &[0x88, 0xbe, 0xbf, 0xc0, 0xc1]).unwrap();
        let mut want = known(&[
            (":status", "200"),
            ("set-cookie", COOKIE),
            ("content-encoding", "gzip"),
            ("date", DATE2),
        ]);
        want.push(unknown());
        assert_eq!(got, want);
        assert_eq!(unresolved, 1);
    }

    #[test]
    fn late_join_c5_c6() {
        late_join_response(C5);
        late_join_response(C6);
    }

    #[test]
    fn late_join_learns_size_and_evicts() {
        // Joined decoder sees the encoder shrink its table to 256 and then the
        // C.5 responses (re-encoded by the test encoder's rules: the RFC's
        // blocks start from an empty table, which is what a size update to 0
        // then 256 guarantees).
        let mut d = Decoder::joined();
        for i in 0..10 {
            let mut b = vec![0x40];
            write_str(&mut b, format!("old-{i}").as_bytes(), false);
            write_str(&mut b, b"v", false);
            run(&mut d, &b).unwrap();
        }
        assert_eq!(d.table_len(), 10);
        let mut first = vec![0x20];
        write_int(&mut first, 0x20, 5, 256);
        first.extend(hex(C5[0]));
        run(&mut d, &first).unwrap();
        assert_eq!(d.max_size(), Some(256));
        run(&mut d, &hex(C5[1])).unwrap();
        let (_, unresolved) = run(&mut d, &hex(C5[2])).unwrap();
        assert_eq!(unresolved, 0);
        assert_eq!(d.table_size(), 215);
        assert_eq!(d.table_len(), 3);
    }

    #[test]
    fn placeholder_entries() {
        let mut d = Decoder::joined();
        // Literal with incremental indexing, name index 70 (unknown).
        let mut b = Vec::new();
        write_int(&mut b, 0x40, 6, 70);
        write_str(&mut b, b"v1", false);
        let (got, unresolved) = run(&mut d, &b).unwrap();
        assert_eq!(got, vec![(None, Some(b"v1".to_vec()))]);
        assert_eq!(unresolved, 1);
        assert!(d.uncertain());
        assert_eq!(d.table_len(), 1);
        assert_eq!(d.table_size(), 2 + 32);
        // Indexed reference: name unknown, value known.
        let (got, unresolved) = run(&mut d, &[0xbe]).unwrap();
        assert_eq!(got, vec![(None, Some(b"v1".to_vec()))]);
        assert_eq!(unresolved, 1);
        // A literal naming the placeholder by index makes another placeholder;
        // a literal without indexing naming it inserts nothing.
        let mut b = Vec::new();
        write_int(&mut b, 0x40, 6, 62);
        write_str(&mut b, b"v2", true);
        write_int(&mut b, 0x00, 4, 63);
        write_str(&mut b, b"v3", false);
        let (got, unresolved) = run(&mut d, &b).unwrap();
        assert_eq!(
            got,
            vec![(None, Some(b"v2".to_vec())), (None, Some(b"v3".to_vec()))]
        );
        assert_eq!(unresolved, 2);
        let (got, _) = run(&mut d, &[0xbe, 0xbf, 0xc0]).unwrap();
        assert_eq!(
            got,
            vec![
                (None, Some(b"v2".to_vec())),
                (None, Some(b"v1".to_vec())),
                unknown()
            ]
        );
    }

    #[test]
    fn name_of_evicted_entry_survives_insertion() {
        // RFC 7541 §4.4: the new entry names the entry its insertion evicts.
        let mut d = Decoder::with_max(100);
        let mut b = vec![0x40];
        write_str(&mut b, b"long-header-name", false);
        write_str(&mut b, b"value-one-value-one", false);
        // 16 + 19 + 32 = 67; the next one (16 + 19 + 32) forces eviction.
        write_int(&mut b, 0x40, 6, 62);
        write_str(&mut b, b"value-two-value-two", false);
        run(&mut d, &b).unwrap();
        assert_eq!(
            table(&d),
            known(&[("long-header-name", "value-two-value-two")])
        );
        assert_eq!(d.table_size(), 67);
    }

    #[test]
    fn entry_larger_than_table_empties_it() {
        let mut d = Decoder::with_max(64);
        let mut b = vec![0x40];
        write_str(&mut b, b"a", false);
        write_str(&mut b, b"b", false);
        b.push(0x40);
        write_str(&mut b, b"0123456789", false);
        write_str(&mut b, b"01234567890123456789012", false); // 10 + 23 + 32 = 65
        let (got, _) = run(&mut d, &b).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(d.table_len(), 0);
        assert_eq!(d.table_size(), 0);
        assert_eq!(run(&mut d, &[0xbe]), Err(Error::BadIndex));
    }

    #[test]
    fn storage_clamped_above_max_table_bytes() {
        // The encoder may use a 1 MiB table; the decoder keeps 64 KiB and
        // reports what it dropped as unknown rather than as an error.
        let mut d = Decoder::new();
        d.set_max_allowed(1 << 20);
        let mut b = Vec::new();
        write_int(&mut b, 0x20, 5, 1 << 20);
        let big = vec![b'x'; 40_000];
        for name in [&b"first"[..], b"second"] {
            b.push(0x40);
            write_str(&mut b, name, false);
            write_str(&mut b, &big, false);
        }
        b.push(0xbe);
        b.push(0xbf);
        let (got, unresolved) = run(&mut d, &b).unwrap();
        assert_eq!(got[2].0.as_deref(), Some(&b"second"[..]));
        assert_eq!(got[3], unknown());
        assert_eq!(unresolved, 1);
        assert!(!d.complete());
        assert!(d.buffered() <= 2 * MAX_TABLE_BYTES + 2048 * 12 + SCRATCH_KEEP);
    }

    #[test]
    fn size_updates() {
        let mut d = Decoder::new();
        for (k, v) in [("a", "1"), ("b", "2")] {
            let mut b = vec![0x40];
            write_str(&mut b, k.as_bytes(), false);
            write_str(&mut b, v.as_bytes(), false);
            run(&mut d, &b).unwrap();
        }
        assert_eq!(d.table_len(), 2);
        // Two updates at the start (0 then 4096) clear the table.
        let (got, _) = run(&mut d, &[0x20, 0x3f, 0xe1, 0x1f, 0x82]).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(d.table_len(), 0);
        assert_eq!(d.max_size(), Some(4096));
        assert_eq!(d.buffered(), 0);
        // An update to exactly the allowed maximum is fine; one above is not.
        let mut b = Vec::new();
        write_int(&mut b, 0x20, 5, 4096);
        assert!(run(&mut d, &b).is_ok());
        b.clear();
        write_int(&mut b, 0x20, 5, 4097);
        assert_eq!(run(&mut d, &b), Err(Error::SizeUpdateTooLarge));
        // A lowered SETTINGS bound applies to later updates.
        let mut d = Decoder::new();
        d.set_max_allowed(100);
        assert_eq!(d.max_size(), Some(4096));
        b.clear();
        write_int(&mut b, 0x20, 5, 101);
        assert_eq!(run(&mut d, &b), Err(Error::SizeUpdateTooLarge));
        // Joined: anything up to 2^28 is accepted, storage stays capped.
        let mut d = Decoder::joined();
        b.clear();
        write_int(&mut b, 0x20, 5, 1 << 28);
        assert!(run(&mut d, &b).is_ok());
        assert_eq!(d.max_size(), Some(1 << 28));
        assert_eq!(d.limit(), MAX_TABLE_BYTES);
        // ... unless the caller learned the setting.
        let mut d = Decoder::joined();
        d.set_max_allowed(4096);
        b.clear();
        write_int(&mut b, 0x20, 5, 8192);
        assert_eq!(run(&mut d, &b), Err(Error::SizeUpdateTooLarge));
    }

    // ---- Hostile input ----

    #[test]
    fn hostile_inputs() {
        let cases: Vec<(&str, Vec<u8>, Error)> = vec![
            ("truncated integer", vec![0x3f], Error::Truncated),
            ("truncated index", vec![0xff], Error::Truncated),
            ("truncated continuation", vec![0xff, 0x80], Error::Truncated),
            ("empty literal", vec![0x40], Error::Truncated),
            ("missing value", vec![0x44], Error::Truncated),
            (
                "2^32 integer",
                vec![0xff, 0x81, 0x80, 0x80, 0x80, 0x10],
                Error::IntegerOverflow,
            ),
            (
                "six continuation bytes",
                vec![0xff, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00],
                Error::IntegerOverflow,
            ),
            (
                "huffman EOS",
                vec![0x00, 0x84, 0xff, 0xff, 0xff, 0xff, 0x00],
                Error::Huffman,
            ),
            (
                "padding of 8+ bits",
                vec![0x00, 0x82, 0x1f, 0xff, 0x00],
                Error::Huffman,
            ),
            ("zero padding", vec![0x00, 0x81, 0x18, 0x00], Error::Huffman),
            (
                "string past end",
                vec![0x00, 0x05, b'a', b'b'],
                Error::Truncated,
            ),
            (
                "value past end",
                vec![0x04, 0x03, b'a', b'b'],
                Error::Truncated,
            ),
            (
                "size update after field",
                vec![0x82, 0x20],
                Error::SizeUpdateMisplaced,
            ),
            ("index 0", vec![0x80], Error::IndexZero),
            ("index out of range", vec![0xbe], Error::BadIndex),
            (
                "name index out of range",
                vec![0x7e, 0x01, b'x'],
                Error::BadIndex,
            ),
        ];
        for (what, block, err) in cases {
            let mut d = Decoder::new();
            assert_eq!(run(&mut d, &block), Err(err), "{what}");
            assert!(!err.reason().is_empty());
        }
        let mut too_big = Vec::new();
        write_int(&mut too_big, 0x20, 5, 4097);
        assert_eq!(
            run(&mut Decoder::new(), &too_big),
            Err(Error::SizeUpdateTooLarge)
        );
        let mut long = vec![0x00];
        write_str(&mut long, b"n", false);
        write_str(&mut long, &vec![b'a'; MAX_STRING + 1], false);
        assert_eq!(run(&mut Decoder::new(), &long), Err(Error::StringTooLong));
        // Huffman that decodes past MAX_STRING ('0' is 5 bits).
        let mut long = vec![0x00];
        write_str(&mut long, b"n", false);
        write_str(&mut long, &vec![b'0'; MAX_STRING + 8], true);
        let mut d = Decoder::new();
        assert_eq!(run(&mut d, &long), Err(Error::StringTooLong));
        assert!(d.buffered() <= SCRATCH_KEEP);
        // Exactly MAX_STRING is fine.
        let mut ok = vec![0x00];
        write_str(&mut ok, b"n", false);
        write_str(&mut ok, &vec![b'0'; MAX_STRING], true);
        assert_eq!(run(&mut d, &ok).map(|(f, _)| f.len()), Ok(1));
        // Joined: out-of-range indices are unknown fields, index 0 still an error.
        let mut d = Decoder::joined();
        assert_eq!(
            run(&mut d, &[0xbe, 0xff, 0x80, 0x01]),
            Ok((vec![unknown(); 2], 2))
        );
        assert_eq!(run(&mut d, &[0x80]), Err(Error::IndexZero));
    }

    #[test]
    fn reasons_are_distinct() {
        let all = [
            Error::Truncated,
            Error::IntegerOverflow,
            Error::Huffman,
            Error::IndexZero,
            Error::BadIndex,
            Error::SizeUpdateTooLarge,
            Error::SizeUpdateMisplaced,
            Error::StringTooLong,
        ];
        let mut seen = std::collections::HashSet::new();
        for e in all {
            assert!(e.reason().starts_with("hpack_"));
            assert!(seen.insert(e.reason()));
        }
        assert_eq!(Error::Huffman.reason(), "hpack_huffman");
    }

    #[test]
    fn steady_state_does_not_grow() {
        // Repeated blocks of Huffman literals reuse the scratch buffer and the
        // arena: the held memory stops growing.
        let mut d = Decoder::new();
        let mut block = Vec::new();
        for i in 0..8 {
            block.push(0x40);
            write_str(&mut block, format!("x-header-{i}").as_bytes(), true);
            write_str(&mut block, format!("value number {i}").as_bytes(), true);
        }
        for _ in 0..50 {
            run(&mut d, &block).unwrap();
        }
        let held = d.buffered();
        for _ in 0..500 {
            run(&mut d, &block).unwrap();
        }
        assert_eq!(d.buffered(), held);
        assert!(held <= 2 * 4096 + 256 * 12 + SCRATCH_KEEP);
    }

    // ---- Property tests ----

    /// An encoder table snapshot, newest first.
    type EncTable = Vec<(Vec<u8>, Vec<u8>)>;

    /// Reference encoder: newest entry at the front.
    struct Encoder {
        table: VecDeque<(Vec<u8>, Vec<u8>)>,
        size: usize,
        max: usize,
    }

    #[derive(Debug, Clone)]
    struct Header {
        name: Vec<u8>,
        value: Vec<u8>,
        /// Representation choice: bits 0-1 kind, bit 2 name by index.
        kind: u8,
        huff_name: bool,
        huff_value: bool,
    }

    #[derive(Debug, Clone)]
    struct Block {
        updates: Vec<u16>,
        headers: Vec<Header>,
    }

    impl Encoder {
        fn new(max: usize) -> Self {
            Encoder {
                table: VecDeque::new(),
                size: 0,
                max,
            }
        }

        fn evict(&mut self) {
            while self.size > self.max {
                let (n, v) = self.table.pop_back().unwrap();
                self.size -= n.len() + v.len() + 32;
            }
        }

        fn add(&mut self, name: &[u8], value: &[u8]) {
            let size = name.len() + value.len() + 32;
            if size > self.max {
                self.table.clear();
                self.size = 0;
                return;
            }
            self.table.push_front((name.to_vec(), value.to_vec()));
            self.size += size;
            self.evict();
        }

        fn find(&self, name: &[u8], value: &[u8]) -> (Option<usize>, Option<usize>) {
            let all = STATIC_TABLE
                .iter()
                .map(|&(n, v)| (n, v))
                .chain(self.table.iter().map(|(n, v)| (&n[..], &v[..])));
            let mut full = None;
            let mut by_name = None;
            for (i, (n, v)) in all.enumerate() {
                if n == name {
                    by_name.get_or_insert(i + 1);
                    if v == value {
                        full.get_or_insert(i + 1);
                    }
                }
            }
            (full, by_name)
        }

        fn encode(&mut self, block: &Block, settings: usize, out: &mut Vec<u8>) {
            for &u in &block.updates {
                let n = usize::from(u) % (settings + 1);
                write_int(out, 0x20, 5, n);
                self.max = n;
                self.evict();
            }
            for h in &block.headers {
                let (full, by_name) = self.find(&h.name, &h.value);
                let name_index = by_name.filter(|_| h.kind & 4 != 0);
                let (flags, bits) = match (h.kind & 3, full) {
                    (0, Some(i)) => {
                        write_int(out, 0x80, 7, i);
                        continue;
                    }
                    (0 | 1, _) => (0x40, 6),
                    (2, _) => (0x00, 4),
                    _ => (0x10, 4),
                };
                match name_index {
                    Some(i) => write_int(out, flags, bits, i),
                    None => {
                        write_int(out, flags, bits, 0);
                        write_str(out, &h.name, h.huff_name);
                    }
                }
                write_str(out, &h.value, h.huff_value);
                if flags == 0x40 {
                    self.add(&h.name, &h.value);
                }
            }
        }
    }

    fn name_strategy() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            3 => prop::sample::select(vec![
                ":status", ":path", "content-type", "grpc-status", "grpc-message",
                "x-a", "x-b", "x-c", "date", "",
            ])
            .prop_map(|s| s.as_bytes().to_vec()),
            1 => prop::collection::vec(any::<u8>(), 0..24),
        ]
    }

    fn value_strategy() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            3 => prop::sample::select(vec!["200", "0", "application/grpc", "", "v", "/x.Y/Z"])
                .prop_map(|s| s.as_bytes().to_vec()),
            1 => prop::collection::vec(any::<u8>(), 0..48),
        ]
    }

    fn block_strategy() -> impl Strategy<Value = Block> {
        let header = (
            name_strategy(),
            value_strategy(),
            any::<u8>(),
            any::<bool>(),
            any::<bool>(),
        )
            .prop_map(|(name, value, kind, huff_name, huff_value)| Header {
                name,
                value,
                kind,
                huff_name,
                huff_value,
            });
        (
            prop_oneof![
                6 => Just(vec![]),
                2 => prop::collection::vec(any::<u16>(), 1..2),
                1 => prop::collection::vec(any::<u16>(), 2..3),
            ],
            prop::collection::vec(header, 0..12),
        )
            .prop_map(|(updates, headers)| Block { updates, headers })
    }

    fn stream_strategy() -> impl Strategy<Value = (usize, Vec<Block>)> {
        (
            prop::sample::select(vec![0usize, 64, 100, 256, 512, 4096]),
            prop::collection::vec(block_strategy(), 1..8),
        )
    }

    fn encode_stream(settings: usize, blocks: &[Block]) -> (Vec<Vec<u8>>, Vec<EncTable>) {
        let mut enc = Encoder::new(settings);
        let mut wire = Vec::new();
        let mut tables = Vec::new();
        for b in blocks {
            let mut out = Vec::new();
            enc.encode(b, settings, &mut out);
            wire.push(out);
            tables.push(enc.table.iter().cloned().collect());
        }
        (wire, tables)
    }

    const BOUND: usize = 2 * MAX_TABLE_BYTES + 2048 * 12 + SCRATCH_KEEP;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn encoded_streams_decode_exactly((settings, blocks) in stream_strategy()) {
            let (wire, tables) = encode_stream(settings, &blocks);
            let mut d = Decoder::with_max(settings as u32);
            for ((b, bytes), tbl) in blocks.iter().zip(&wire).zip(&tables) {
                let (got, unresolved) = run(&mut d, bytes).unwrap();
                let want: Vec<Owned> = b
                    .headers
                    .iter()
                    .map(|h| (Some(h.name.clone()), Some(h.value.clone())))
                    .collect();
                prop_assert_eq!(got, want);
                prop_assert_eq!(unresolved, 0);
                let want_table: Vec<Owned> =
                    tbl.iter().map(|(n, v)| (Some(n.clone()), Some(v.clone()))).collect();
                prop_assert_eq!(table(&d), want_table);
                let size: usize = tbl.iter().map(|(n, v)| n.len() + v.len() + 32).sum();
                prop_assert_eq!(d.table_size(), size);
                prop_assert!(d.complete() && !d.uncertain());
                prop_assert!(d.buffered() <= BOUND);
            }
        }

        #[test]
        fn joined_decoders_are_right_or_unknown((settings, blocks) in stream_strategy()) {
            let (wire, tables) = encode_stream(settings, &blocks);
            for start in 1..blocks.len() {
                let mut d = Decoder::joined();
                for k in start..blocks.len() {
                    let (got, unresolved) = run(&mut d, &wire[k]).unwrap();
                    prop_assert_eq!(got.len(), blocks[k].headers.len());
                    let mut missing = 0;
                    for (g, h) in got.iter().zip(&blocks[k].headers) {
                        if let Some(n) = &g.0 {
                            prop_assert_eq!(n, &h.name);
                        }
                        if let Some(v) = &g.1 {
                            prop_assert_eq!(v, &h.value);
                        }
                        missing += usize::from(g.0.is_none() || g.1.is_none());
                    }
                    prop_assert_eq!(unresolved, missing);
                    // The newest entries line up with the encoder's table.
                    for (i, (n, v)) in tables[k].iter().enumerate().take(d.table_len()) {
                        let e = d.entry(i).unwrap();
                        if let Some(name) = e.name {
                            prop_assert_eq!(name, &n[..]);
                        }
                        prop_assert_eq!(e.value, Some(&v[..]));
                    }
                    prop_assert!(d.buffered() <= BOUND);
                }
            }
        }

        #[test]
        fn random_bytes_never_panic(blocks in prop::collection::vec(
            prop::collection::vec(any::<u8>(), 0..96), 1..6)) {
            let mut fresh = Decoder::new();
            let mut joined = Decoder::joined();
            for b in &blocks {
                // Keep decoding after errors too: no panics even out of step.
                let _ = run(&mut fresh, b);
                let _ = run(&mut joined, b);
                prop_assert!(fresh.buffered() <= BOUND);
                prop_assert!(joined.buffered() <= BOUND);
            }
        }

        #[test]
        fn mutated_streams_never_panic(
            (settings, blocks) in stream_strategy(),
            edits in prop::collection::vec((any::<usize>(), any::<u8>()), 1..6),
            cut in any::<usize>(),
        ) {
            let (mut wire, _) = encode_stream(settings, &blocks);
            for (i, (at, x)) in edits.into_iter().enumerate() {
                let b = &mut wire[i % blocks.len()];
                if !b.is_empty() {
                    let n = b.len();
                    b[at % n] ^= x;
                }
            }
            let last = wire.len() - 1;
            let n = wire[last].len();
            wire[last].truncate(cut % (n + 1));
            let mut fresh = Decoder::with_max(settings as u32);
            let mut joined = Decoder::joined();
            for b in &wire {
                let _ = run(&mut fresh, b);
                let _ = run(&mut joined, b);
                prop_assert!(fresh.buffered() <= BOUND);
                prop_assert!(joined.buffered() <= BOUND);
            }
        }
    }
}
