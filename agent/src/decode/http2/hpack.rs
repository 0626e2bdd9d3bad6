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
