//! HPACK Huffman code (RFC 7541 Appendix B).
//!
//! Decoding is table driven: a 256-state automaton (one state per internal
//! node of the code tree) consumes the input four bits at a time. Because the
//! shortest code is 5 bits long, a nibble completes at most one symbol, so each
//! table cell holds the next state, at most one output byte and two flags. The
//! table (256 x 16 cells, 12 KiB) is computed at compile time from [`CODES`].

use std::fmt;

/// Why a Huffman string was rejected (RFC 7541 §5.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HuffmanError {
    /// The EOS symbol appeared inside the string.
    Eos,
    /// The string ended with more than 7 bits of padding.
    PaddingTooLong,
    /// The string ended with padding that is not all ones (a truncated code).
    InvalidPadding,
}

impl fmt::Display for HuffmanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            HuffmanError::Eos => "EOS symbol in Huffman string",
            HuffmanError::PaddingTooLong => "Huffman padding longer than 7 bits",
            HuffmanError::InvalidPadding => "Huffman padding is not a prefix of EOS",
        })
    }
}

impl std::error::Error for HuffmanError {}

/// The Appendix B code: `CODES[sym] = (code, bit length)`, the code right
/// aligned (its last bit is bit 0). Entry 256 is EOS.
const CODES: [(u32, u8); 257] = [
    (0x1ff8, 13),     // 0
    (0x7fffd8, 23),   // 1
    (0xfffffe2, 28),  // 2
    (0xfffffe3, 28),  // 3
    (0xfffffe4, 28),  // 4
    (0xfffffe5, 28),  // 5
    (0xfffffe6, 28),  // 6
    (0xfffffe7, 28),  // 7
    (0xfffffe8, 28),  // 8
    (0xffffea, 24),   // 9
    (0x3ffffffc, 30), // 10
    (0xfffffe9, 28),  // 11
    (0xfffffea, 28),  // 12
    (0x3ffffffd, 30), // 13
    (0xfffffeb, 28),  // 14
    (0xfffffec, 28),  // 15
    (0xfffffed, 28),  // 16
    (0xfffffee, 28),  // 17
    (0xfffffef, 28),  // 18
    (0xffffff0, 28),  // 19
    (0xffffff1, 28),  // 20
    (0xffffff2, 28),  // 21
    (0x3ffffffe, 30), // 22
    (0xffffff3, 28),  // 23
    (0xffffff4, 28),  // 24
    (0xffffff5, 28),  // 25
    (0xffffff6, 28),  // 26
    (0xffffff7, 28),  // 27
    (0xffffff8, 28),  // 28
    (0xffffff9, 28),  // 29
    (0xffffffa, 28),  // 30
    (0xffffffb, 28),  // 31
    (0x14, 6),        // 32 ' '
    (0x3f8, 10),      // 33 '!'
    (0x3f9, 10),      // 34 '"'
    (0xffa, 12),      // 35 '#'
    (0x1ff9, 13),     // 36 '$'
    (0x15, 6),        // 37 '%'
    (0xf8, 8),        // 38 '&'
    (0x7fa, 11),      // 39 '\''
    (0x3fa, 10),      // 40 '('
    (0x3fb, 10),      // 41 ')'
    (0xf9, 8),        // 42 '*'
    (0x7fb, 11),      // 43 '+'
    (0xfa, 8),        // 44 ','
    (0x16, 6),        // 45 '-'
    (0x17, 6),        // 46 '.'
    (0x18, 6),        // 47 '/'
    (0x0, 5),         // 48 '0'
    (0x1, 5),         // 49 '1'
    (0x2, 5),         // 50 '2'
    (0x19, 6),        // 51 '3'
    (0x1a, 6),        // 52 '4'
    (0x1b, 6),        // 53 '5'
    (0x1c, 6),        // 54 '6'
    (0x1d, 6),        // 55 '7'
    (0x1e, 6),        // 56 '8'
    (0x1f, 6),        // 57 '9'
    (0x5c, 7),        // 58 ':'
    (0xfb, 8),        // 59 ';'
    (0x7ffc, 15),     // 60 '<'
    (0x20, 6),        // 61 '='
    (0xffb, 12),      // 62 '>'
    (0x3fc, 10),      // 63 '?'
    (0x1ffa, 13),     // 64 '@'
    (0x21, 6),        // 65 'A'
    (0x5d, 7),        // 66 'B'
    (0x5e, 7),        // 67 'C'
    (0x5f, 7),        // 68 'D'
    (0x60, 7),        // 69 'E'
    (0x61, 7),        // 70 'F'
    (0x62, 7),        // 71 'G'
    (0x63, 7),        // 72 'H'
    (0x64, 7),        // 73 'I'
    (0x65, 7),        // 74 'J'
    (0x66, 7),        // 75 'K'
    (0x67, 7),        // 76 'L'
    (0x68, 7),        // 77 'M'
    (0x69, 7),        // 78 'N'
    (0x6a, 7),        // 79 'O'
    (0x6b, 7),        // 80 'P'
    (0x6c, 7),        // 81 'Q'
    (0x6d, 7),        // 82 'R'
    (0x6e, 7),        // 83 'S'
    (0x6f, 7),        // 84 'T'
    (0x70, 7),        // 85 'U'
    (0x71, 7),        // 86 'V'
    (0x72, 7),        // 87 'W'
    (0xfc, 8),        // 88 'X'
    (0x73, 7),        // 89 'Y'
    (0xfd, 8),        // 90 'Z'
    (0x1ffb, 13),     // 91 '['
    (0x7fff0, 19),    // 92 '\\'
    (0x1ffc, 13),     // 93 ']'
    (0x3ffc, 14),     // 94 '^'
    (0x22, 6),        // 95 '_'
    (0x7ffd, 15),     // 96 '`'
    (0x3, 5),         // 97 'a'
    (0x23, 6),        // 98 'b'
    (0x4, 5),         // 99 'c'
    (0x24, 6),        // 100 'd'
    (0x5, 5),         // 101 'e'
    (0x25, 6),        // 102 'f'
    (0x26, 6),        // 103 'g'
    (0x27, 6),        // 104 'h'
    (0x6, 5),         // 105 'i'
    (0x74, 7),        // 106 'j'
    (0x75, 7),        // 107 'k'
    (0x28, 6),        // 108 'l'
    (0x29, 6),        // 109 'm'
    (0x2a, 6),        // 110 'n'
    (0x7, 5),         // 111 'o'
    (0x2b, 6),        // 112 'p'
    (0x76, 7),        // 113 'q'
    (0x2c, 6),        // 114 'r'
    (0x8, 5),         // 115 's'
    (0x9, 5),         // 116 't'
    (0x2d, 6),        // 117 'u'
    (0x77, 7),        // 118 'v'
    (0x78, 7),        // 119 'w'
    (0x79, 7),        // 120 'x'
    (0x7a, 7),        // 121 'y'
    (0x7b, 7),        // 122 'z'
    (0x7ffe, 15),     // 123 '{'
    (0x7fc, 11),      // 124 '|'
    (0x3ffd, 14),     // 125 '}'
    (0x1ffd, 13),     // 126 '~'
    (0xffffffc, 28),  // 127
    (0xfffe6, 20),    // 128
    (0x3fffd2, 22),   // 129
    (0xfffe7, 20),    // 130
    (0xfffe8, 20),    // 131
    (0x3fffd3, 22),   // 132
    (0x3fffd4, 22),   // 133
    (0x3fffd5, 22),   // 134
    (0x7fffd9, 23),   // 135
    (0x3fffd6, 22),   // 136
    (0x7fffda, 23),   // 137
    (0x7fffdb, 23),   // 138
    (0x7fffdc, 23),   // 139
    (0x7fffdd, 23),   // 140
    (0x7fffde, 23),   // 141
    (0xffffeb, 24),   // 142
    (0x7fffdf, 23),   // 143
    (0xffffec, 24),   // 144
    (0xffffed, 24),   // 145
    (0x3fffd7, 22),   // 146
    (0x7fffe0, 23),   // 147
    (0xffffee, 24),   // 148
    (0x7fffe1, 23),   // 149
    (0x7fffe2, 23),   // 150
    (0x7fffe3, 23),   // 151
    (0x7fffe4, 23),   // 152
    (0x1fffdc, 21),   // 153
    (0x3fffd8, 22),   // 154
    (0x7fffe5, 23),   // 155
    (0x3fffd9, 22),   // 156
    (0x7fffe6, 23),   // 157
    (0x7fffe7, 23),   // 158
    (0xffffef, 24),   // 159
    (0x3fffda, 22),   // 160
    (0x1fffdd, 21),   // 161
    (0xfffe9, 20),    // 162
    (0x3fffdb, 22),   // 163
    (0x3fffdc, 22),   // 164
    (0x7fffe8, 23),   // 165
    (0x7fffe9, 23),   // 166
    (0x1fffde, 21),   // 167
    (0x7fffea, 23),   // 168
    (0x3fffdd, 22),   // 169
    (0x3fffde, 22),   // 170
    (0xfffff0, 24),   // 171
    (0x1fffdf, 21),   // 172
    (0x3fffdf, 22),   // 173
    (0x7fffeb, 23),   // 174
    (0x7fffec, 23),   // 175
    (0x1fffe0, 21),   // 176
    (0x1fffe1, 21),   // 177
    (0x3fffe0, 22),   // 178
    (0x1fffe2, 21),   // 179
    (0x7fffed, 23),   // 180
    (0x3fffe1, 22),   // 181
    (0x7fffee, 23),   // 182
    (0x7fffef, 23),   // 183
    (0xfffea, 20),    // 184
    (0x3fffe2, 22),   // 185
    (0x3fffe3, 22),   // 186
    (0x3fffe4, 22),   // 187
    (0x7ffff0, 23),   // 188
    (0x3fffe5, 22),   // 189
    (0x3fffe6, 22),   // 190
    (0x7ffff1, 23),   // 191
    (0x3ffffe0, 26),  // 192
    (0x3ffffe1, 26),  // 193
    (0xfffeb, 20),    // 194
    (0x7fff1, 19),    // 195
    (0x3fffe7, 22),   // 196
    (0x7ffff2, 23),   // 197
    (0x3fffe8, 22),   // 198
    (0x1ffffec, 25),  // 199
    (0x3ffffe2, 26),  // 200
    (0x3ffffe3, 26),  // 201
    (0x3ffffe4, 26),  // 202
    (0x7ffffde, 27),  // 203
    (0x7ffffdf, 27),  // 204
    (0x3ffffe5, 26),  // 205
    (0xfffff1, 24),   // 206
    (0x1ffffed, 25),  // 207
    (0x7fff2, 19),    // 208
    (0x1fffe3, 21),   // 209
    (0x3ffffe6, 26),  // 210
    (0x7ffffe0, 27),  // 211
    (0x7ffffe1, 27),  // 212
    (0x3ffffe7, 26),  // 213
    (0x7ffffe2, 27),  // 214
    (0xfffff2, 24),   // 215
    (0x1fffe4, 21),   // 216
    (0x1fffe5, 21),   // 217
    (0x3ffffe8, 26),  // 218
    (0x3ffffe9, 26),  // 219
    (0xffffffd, 28),  // 220
    (0x7ffffe3, 27),  // 221
    (0x7ffffe4, 27),  // 222
    (0x7ffffe5, 27),  // 223
    (0xfffec, 20),    // 224
    (0xfffff3, 24),   // 225
    (0xfffed, 20),    // 226
    (0x1fffe6, 21),   // 227
    (0x3fffe9, 22),   // 228
    (0x1fffe7, 21),   // 229
    (0x1fffe8, 21),   // 230
    (0x7ffff3, 23),   // 231
    (0x3fffea, 22),   // 232
    (0x3fffeb, 22),   // 233
    (0x1ffffee, 25),  // 234
    (0x1ffffef, 25),  // 235
    (0xfffff4, 24),   // 236
    (0xfffff5, 24),   // 237
    (0x3ffffea, 26),  // 238
    (0x7ffff4, 23),   // 239
    (0x3ffffeb, 26),  // 240
    (0x7ffffe6, 27),  // 241
    (0x3ffffec, 26),  // 242
    (0x3ffffed, 26),  // 243
    (0x7ffffe7, 27),  // 244
    (0x7ffffe8, 27),  // 245
    (0x7ffffe9, 27),  // 246
    (0x7ffffea, 27),  // 247
    (0x7ffffeb, 27),  // 248
    (0xffffffe, 28),  // 249
    (0x7ffffec, 27),  // 250
    (0x7ffffed, 27),  // 251
    (0x7ffffee, 27),  // 252
    (0x7ffffef, 27),  // 253
    (0x7fffff0, 27),  // 254
    (0x3ffffee, 26),  // 255
    (0x3fffffff, 30), // 256 EOS
];

const EOS: u16 = 256;
/// Tree child tag: the child is a leaf holding the symbol in the low bits.
const LEAF: u16 = 0x8000;

/// The code tree's 256 internal nodes (node 0 is the root). A child is either
/// the index of another internal node or `LEAF | symbol`; 0 means "not yet
/// set" while building (the root is nobody's child).
const fn build_tree() -> [[u16; 2]; 256] {
    let mut tree = [[0u16; 2]; 256];
    let mut next_free = 1usize;
    let mut sym = 0usize;
    while sym < CODES.len() {
        let (code, len) = CODES[sym];
        let mut node = 0usize;
        let mut bit = len as u32;
        while bit > 1 {
            bit -= 1;
            let b = ((code >> bit) & 1) as usize;
            if tree[node][b] == 0 {
                // A table error (not prefix-free, or not complete) shows up as
                // an out-of-bounds index here: a compile-time failure.
                tree[node][b] = next_free as u16;
                next_free += 1;
            }
            assert!(tree[node][b] & LEAF == 0, "code is not prefix-free");
            node = tree[node][b] as usize;
        }
        let b = (code & 1) as usize;
        assert!(tree[node][b] == 0, "code is not prefix-free");
        tree[node][b] = LEAF | sym as u16;
        sym += 1;
    }
    // 257 leaves in a full binary tree need exactly 256 internal nodes.
    assert!(next_free == 256, "code is not complete");
    tree
}

/// Padding class of a node: on the all-ones path from the root at depth <= 7
/// (ending here is valid padding; the root itself means "no padding").
const PAD_OK: u8 = 1;
/// On the all-ones path at depth >= 8: padding longer than 7 bits.
const PAD_LONG: u8 = 2;

const fn padding_classes(tree: &[[u16; 2]; 256]) -> [u8; 256] {
    let mut class = [0u8; 256];
    let mut node = 0usize;
    let mut depth = 0usize;
    loop {
        class[node] = if depth <= 7 { PAD_OK } else { PAD_LONG };
        let child = tree[node][1];
        if child & LEAF != 0 {
            return class;
        }
        node = child as usize;
        depth += 1;
    }
}

/// One automaton transition: the state after a nibble, and what it emitted.
#[derive(Clone, Copy)]
struct Cell {
    next: u8,
    sym: u8,
    flags: u8,
}

/// The nibble completed a symbol; `sym` holds it.
const EMIT: u8 = 1;
/// The nibble completed EOS: the string is invalid.
const FAIL: u8 = 2;

const fn build_decode_table() -> [[Cell; 16]; 256] {
    let tree = build_tree();
    let mut table = [[Cell {
        next: 0,
        sym: 0,
        flags: 0,
    }; 16]; 256];
    let mut state = 0usize;
    while state < 256 {
        let mut nibble = 0usize;
        while nibble < 16 {
            let mut node = state;
            let mut cell = Cell {
                next: 0,
                sym: 0,
                flags: 0,
            };
            let mut i = 4;
            while i > 0 {
                i -= 1;
                let child = tree[node][(nibble >> i) & 1];
                if child & LEAF == 0 {
                    node = child as usize;
                    continue;
                }
                node = 0;
                let sym = child & !LEAF;
                if sym == EOS {
                    cell.flags = FAIL;
                    break;
                }
                // The shortest code has 5 bits: one symbol per nibble at most.
                assert!(cell.flags & EMIT == 0);
                cell.flags |= EMIT;
                cell.sym = sym as u8;
            }
            cell.next = node as u8;
            table[state][nibble] = cell;
            nibble += 1;
        }
        state += 1;
    }
    table
}

static DECODE: [[Cell; 16]; 256] = build_decode_table();
static PADDING: [u8; 256] = padding_classes(&build_tree());

/// Decodes RFC 7541 Appendix B Huffman `src`, appending to `dst`.
///
/// Errors: EOS symbol inside the string, padding longer than 7 bits, padding
/// that is not all ones. On error `dst` may hold part of the output.
/// The output is at most `src.len() * 8 / 5` bytes (shortest code: 5 bits).
pub fn decode(src: &[u8], dst: &mut Vec<u8>) -> Result<(), HuffmanError> {
    dst.reserve(src.len() / 5 * 8 + 8);
    let mut state = 0usize;
    for &byte in src {
        for nibble in [byte >> 4, byte & 0x0f] {
            let cell = DECODE[state][nibble as usize];
            if cell.flags != 0 {
                if cell.flags & FAIL != 0 {
                    return Err(HuffmanError::Eos);
                }
                dst.push(cell.sym);
            }
            state = cell.next as usize;
        }
    }
    match PADDING[state] {
        PAD_OK => Ok(()),
        PAD_LONG => Err(HuffmanError::PaddingTooLong),
        _ => Err(HuffmanError::InvalidPadding),
    }
}

/// Number of bytes [`encode`] produces for `src`.
pub fn encoded_len(src: &[u8]) -> usize {
    let bits: usize = src.iter().map(|&b| usize::from(CODES[b as usize].1)).sum();
    bits.div_ceil(8)
}

/// Huffman-encodes `src`, appending to `dst` (padded with ones, RFC 7541 §5.2).
pub fn encode(src: &[u8], dst: &mut Vec<u8>) {
    dst.reserve(encoded_len(src));
    // `acc` holds `bits` (< 8 between symbols) pending bits, right aligned.
    let mut acc: u64 = 0;
    let mut bits: u32 = 0;
    for &b in src {
        let (code, len) = CODES[b as usize];
        acc = (acc << len) | u64::from(code);
        bits += u32::from(len);
        while bits >= 8 {
            bits -= 8;
            dst.push((acc >> bits) as u8);
        }
        acc &= (1 << bits) - 1;
    }
    if bits > 0 {
        let pad = 8 - bits;
        dst.push(((acc << pad) | ((1 << pad) - 1)) as u8);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    fn hex(s: &str) -> Vec<u8> {
        let digits: Vec<u8> = s.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
        digits
            .chunks(2)
            .map(|p| u8::from_str_radix(std::str::from_utf8(p).unwrap(), 16).unwrap())
            .collect()
    }

    /// Bit-at-a-time reference decoder, straight from the code table.
    fn reference_decode(src: &[u8]) -> Result<Vec<u8>, HuffmanError> {
        let map: HashMap<(u8, u32), u16> = CODES
            .iter()
            .enumerate()
            .map(|(sym, &(code, len))| ((len, code), sym as u16))
            .collect();
        let mut out = Vec::new();
        let (mut code, mut len) = (0u32, 0u8);
        for &byte in src {
            for i in (0..8).rev() {
                code = (code << 1) | u32::from((byte >> i) & 1);
                len += 1;
                if let Some(&sym) = map.get(&(len, code)) {
                    if sym == EOS {
                        return Err(HuffmanError::Eos);
                    }
                    out.push(sym as u8);
                    code = 0;
                    len = 0;
                }
            }
        }
        let all_ones = code == (1u32 << len) - 1;
        match (all_ones, len <= 7) {
            (true, true) => Ok(out),
            (true, false) => Err(HuffmanError::PaddingTooLong),
            (false, _) => Err(HuffmanError::InvalidPadding),
        }
    }

    #[test]
    fn code_is_canonical() {
        // RFC 7541's code is canonical: sorted by (length, symbol), each code
        // is the previous one plus one, shifted to the new length. This checks
        // every code value against the lengths.
        let mut order: Vec<usize> = (0..257).collect();
        order.sort_by_key(|&s| (CODES[s].1, s));
        let mut code = 0u32;
        let mut prev_len = CODES[order[0]].1;
        for (k, &sym) in order.iter().enumerate() {
            let len = CODES[sym].1;
            if k > 0 {
                code = (code + 1) << (len - prev_len);
            }
            prev_len = len;
            assert_eq!(CODES[sym].0, code, "symbol {sym}");
        }
        assert_eq!(CODES[256], (0x3fff_ffff, 30));
        // Spot checks of lengths against Appendix B.
        assert_eq!(CODES[b'0' as usize], (0x0, 5));
        assert_eq!(CODES[b' ' as usize], (0x14, 6));
        assert_eq!(CODES[b':' as usize], (0x5c, 7));
        assert_eq!(CODES[b'&' as usize], (0xf8, 8));
        assert_eq!(CODES[b'\\' as usize], (0x7fff0, 19));
        assert_eq!(CODES[0], (0x1ff8, 13));
        assert_eq!(CODES[255], (0x3ffffee, 26));
    }

    #[test]
    fn rfc_vectors() {
        let cases: &[(&str, &str)] = &[
            ("www.example.com", "f1e3 c2e5 f23a 6ba0 ab90 f4ff"),
            ("no-cache", "a8eb 1064 9cbf"),
            ("custom-key", "25a8 49e9 5ba9 7d7f"),
            ("custom-value", "25a8 49e9 5bb8 e8b4 bf"),
            ("302", "6402"),
            ("307", "640e ff"),
            ("private", "aec3 771a 4b"),
            (
                "Mon, 21 Oct 2013 20:13:21 GMT",
                "d07a be94 1054 d444 a820 0595 040b 8166 e082 a62d 1bff",
            ),
            (
                "https://www.example.com",
                "9d29 ad17 1863 c78f 0b97 c8e9 ae82 ae43 d3",
            ),
            ("gzip", "9bd9 ab"),
            (
                "foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1",
                "94e7 821d d7f2 e6c7 b335 dfdf cd5b 3960 d5af 2708 7f36 72c1 ab27 0fb5 291f 9587 3160 65c0 03ed 4ee5 b106 3d50 07",
            ),
            ("", ""),
        ];
        for &(plain, coded) in cases {
            let coded = hex(coded);
            let mut enc = Vec::new();
            encode(plain.as_bytes(), &mut enc);
            assert_eq!(enc, coded, "encode {plain:?}");
            assert_eq!(encoded_len(plain.as_bytes()), coded.len());
            let mut dec = Vec::new();
            decode(&coded, &mut dec).unwrap();
            assert_eq!(dec, plain.as_bytes());
        }
    }

    #[test]
    fn rejects_bad_strings() {
        let mut out = Vec::new();
        // 30 ones = EOS (then 2 bits of padding).
        assert_eq!(decode(&[0xff; 4], &mut out), Err(HuffmanError::Eos));
        // EOS after a symbol.
        assert_eq!(
            decode(&[0x1f, 0xff, 0xff, 0xff, 0xfe], &mut out),
            Err(HuffmanError::Eos)
        );
        // 8 bits of padding alone, and 'a' (00011) + 3 + 8 bits of padding.
        assert_eq!(decode(&[0xff], &mut out), Err(HuffmanError::PaddingTooLong));
        assert_eq!(
            decode(&[0x1f, 0xff], &mut out),
            Err(HuffmanError::PaddingTooLong)
        );
        // 'a' padded with zeros.
        assert_eq!(decode(&[0x18], &mut out), Err(HuffmanError::InvalidPadding));
        // A truncated long code (first 8 bits of '\0': 11111111|11000).
        assert_eq!(decode(&[0xfe], &mut out), Err(HuffmanError::InvalidPadding));
        // 'a' + 3 bits of valid padding.
        out.clear();
        assert_eq!(decode(&[0x1f], &mut out), Ok(()));
        assert_eq!(out, b"a");
    }

    #[test]
    fn every_symbol_round_trips() {
        let all: Vec<u8> = (0..=255u8).collect();
        let mut enc = Vec::new();
        encode(&all, &mut enc);
        let mut dec = Vec::new();
        decode(&enc, &mut dec).unwrap();
        assert_eq!(dec, all);
        assert_eq!(reference_decode(&enc).unwrap(), all);
    }

    proptest! {
        #[test]
        fn round_trip(src in proptest::collection::vec(any::<u8>(), 0..200)) {
            let mut enc = Vec::new();
            encode(&src, &mut enc);
            prop_assert_eq!(enc.len(), encoded_len(&src));
            let mut dec = Vec::new();
            decode(&enc, &mut dec).unwrap();
            prop_assert_eq!(dec, src);
        }

        #[test]
        fn matches_reference_on_random_input(src in proptest::collection::vec(any::<u8>(), 0..64)) {
            let mut dec = Vec::new();
            let got = decode(&src, &mut dec).map(|()| dec);
            prop_assert_eq!(got, reference_decode(&src));
        }

        #[test]
        fn matches_reference_on_mostly_ones(src in proptest::collection::vec(
            prop_oneof![4 => Just(0xffu8), 1 => any::<u8>()], 0..16)) {
            let mut dec = Vec::new();
            let got = decode(&src, &mut dec).map(|()| dec);
            prop_assert_eq!(got, reference_decode(&src));
        }
    }
}
