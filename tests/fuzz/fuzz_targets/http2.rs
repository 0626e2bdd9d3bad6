//! HTTP/2 (h2c, prior knowledge) from each connection's start: every
//! connection's first inbound bytes are the client preface, so the
//! fuzzer's bytes are frames — HEADERS/CONTINUATION through HPACK, DATA
//! into gRPC and SSE, SETTINGS, RST_STREAM, GOAWAY.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tokentap::decode::Decoder;

#[path = "events.rs"]
mod events;

const SHAPE: events::Shape = events::Shape {
    open: true,
    first_in: b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    first_out: b"",
};

fuzz_target!(|input: &[u8]| {
    let mut d = Decoder::new();
    events::run(&mut d, input, &SHAPE, |d, _| {
        assert!(
            d.buffered_bytes() <= 32 << 20,
            "decoder buffers grew to {}",
            d.buffered_bytes()
        );
    });
});
