//! HPACK alone: header blocks cut from the input (a length byte, then the
//! block), decoded one after another by one decoder whose table size the
//! first byte sets, as a connection's blocks are. Never a panic; the table
//! never holds more than its maximum.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tokentap::decode::http2::hpack::Decoder;

fuzz_target!(|input: &[u8]| {
    let Some((&b, mut rest)) = input.split_first() else {
        return;
    };
    let mut d = if b & 1 == 0 {
        Decoder::with_max(u32::from(b) << 6)
    } else {
        Decoder::joined()
    };
    while let Some((&n, tail)) = rest.split_first() {
        let n = (n as usize).min(tail.len());
        let (block, tail) = tail.split_at(n);
        rest = tail;
        let mut fields = 0usize;
        if d.decode(block, &mut |f| {
            fields += 1;
            let _ = f.is_resolved();
        })
        .is_err()
        {
            break;
        }
        if let Some(max) = d.max_size() {
            assert!(
                d.table_size() <= max,
                "table {} over its maximum {max}",
                d.table_size()
            );
        }
        for i in 0..d.table_len() {
            let _ = d.entry(i);
        }
    }
});
