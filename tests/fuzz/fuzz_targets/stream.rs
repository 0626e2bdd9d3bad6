//! Response streams alone: SSE (lone CR ends a line) and NDJSON fed the
//! same bytes in pieces the first byte sizes, with the memory budget's
//! shed between pieces when the second byte's bit says. Bounded buffers,
//! no panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tokentap::decode::stream::{Ndjson, Sse};

fuzz_target!(|input: &[u8]| {
    let [cut, shed, rest @ ..] = input else {
        return;
    };
    let step = 1 + *cut as usize;
    let mut sse = Sse::default();
    let mut nd = Ndjson::default();
    let mut events = 0usize;
    for (i, piece) in rest.chunks(step).enumerate() {
        sse.feed(piece, &mut |e| {
            events += 1;
            let _ = (e.event, e.data.len());
        });
        nd.feed(piece, &mut |l| {
            let _ = serde_json::from_slice::<serde_json::Value>(l);
        });
        if shed & (1 << (i % 8)) != 0 {
            sse.shed();
            nd.shed();
        }
        assert!(sse.buffered() <= 4 << 20, "SSE held {}", sse.buffered());
        assert!(nd.buffered() <= 4 << 20, "NDJSON held {}", nd.buffered());
    }
    nd.finish(&mut |_| {});
});
