//! HTTP/1.1 from each connection's start: every connection opened as a
//! server's, its first request beginning with a chat POST's request line
//! and its first response with a status line, so the fuzzer's bytes go to
//! the HTTP/1.1 head, body, chunked framing and SSE/NDJSON paths.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tokentap::decode::Decoder;

#[path = "events.rs"]
mod events;

const SHAPE: events::Shape = events::Shape {
    open: true,
    first_in: b"POST /v1/chat/completions HTTP/1.1\r\n",
    first_out: b"HTTP/1.1 200 OK\r\n",
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
