//! Fuzz the request decoder with arbitrary event sequences on four
//! connections joined mid-way (input format: `events.rs`). The decoder
//! must never panic and must keep its buffers bounded.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tokentap::decode::Decoder;

#[path = "events.rs"]
mod events;

fuzz_target!(|input: &[u8]| {
    let mut d = Decoder::new();
    events::run(&mut d, input, &events::ANY, |d, _| {
        assert!(
            d.buffered_bytes() <= 32 << 20,
            "decoder buffers grew to {}",
            d.buffered_bytes()
        );
    });
});
