//! The memory budget's shedding paths: the `decode` target's events
//! under a budget of 1–64 KiB (the first input byte), so nearly every
//! input sheds. What the decoder holds may pass the budget only by what
//! one event added before the cut, and never by more than a fixed slack.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tokentap::decode::Decoder;

#[path = "events.rs"]
mod events;

/// What one event may add above the budget before shedding runs (its
/// bytes, kept at most twice over, plus a connection's fixed state).
const SLACK: u64 = 96 << 10;

fuzz_target!(|input: &[u8]| {
    let Some((&b, rest)) = input.split_first() else {
        return;
    };
    let budget = (1 + (b as usize & 63)) << 10;
    let mut d = Decoder::new().with_max_memory(budget);
    let shape = if b & 0x80 != 0 {
        events::Shape {
            open: true,
            first_in: b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
            first_out: b"",
        }
    } else {
        events::ANY
    };
    events::run(&mut d, rest, &shape, |d, n| {
        let held = d.stats.held_bytes;
        assert!(
            held <= budget as u64 + SLACK + 2 * n as u64,
            "held {held} bytes under a {budget}-byte budget"
        );
    });
});
