//! Capture-file lines (`tokentap replay`'s input): each line parsed alone,
//! then the whole input read by the batch reader, which must count bad
//! lines and never panic. A parsed event written back parses to itself.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tokentap::capfile::{from_line, to_line, Reader};

fuzz_target!(|input: &[u8]| {
    let text = String::from_utf8_lossy(input);
    for line in text.lines() {
        if let Ok(ev) = from_line(line) {
            let again = to_line(&ev);
            let back = from_line(&again).expect("a written event parses");
            assert_eq!(back, ev, "{line:?} → {again:?}");
        }
    }
    let mut r = Reader::new(std::io::BufReader::new(input));
    let mut out = Vec::new();
    while let Ok(true) = r.next_batch(64, &mut out) {
        out.clear();
    }
});
