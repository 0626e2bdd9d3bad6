//! Fuzz the request decoder with arbitrary event sequences on a few
//! connections. Input: repeated `[ctrl][len][len bytes]`; ctrl bit 0 =
//! outbound, bit 1 = close the connection after, bit 2 = failed call
//! (negative return), bit 3 = capture truncated (ret larger than the
//! bytes), bits 4-5 = which of 4 connections. The decoder must never
//! panic and must keep its buffers bounded.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tokentap::{
    decode::Decoder,
    event::{CloseEvent, DataEvent, Dir, SocketEvent},
};

fuzz_target!(|input: &[u8]| {
    let mut d = Decoder::new();
    let mut out = Vec::new();
    let mut i = 0;
    let mut ts = 1_000u64;
    while i + 2 <= input.len() {
        let ctrl = input[i];
        let len = input[i + 1] as usize * if ctrl & 0x40 != 0 { 16 } else { 1 };
        let end = (i + 2 + len).min(input.len());
        let bytes = input[i + 2..end].to_vec();
        i = end;
        ts += 1_000;
        let fd = ((ctrl >> 4) & 3) as i32;
        let ret = if ctrl & 4 != 0 {
            -32
        } else if ctrl & 8 != 0 {
            bytes.len() as i64 + 1_000
        } else {
            bytes.len() as i64
        };
        let ev = SocketEvent::Data(DataEvent {
            ts_ns: ts,
            pid: 1,
            tid: 1,
            fd,
            dir: if ctrl & 1 != 0 { Dir::Out } else { Dir::In },
            ret,
            data: bytes,
            syscall: None,
        });
        d.on_event(&ev, &mut out);
        if ctrl & 2 != 0 {
            d.on_event(&SocketEvent::Close(CloseEvent { ts_ns: ts, pid: 1, fd }), &mut out);
        }
        assert!(d.buffered_bytes() <= 32 << 20, "decoder buffers grew to {}", d.buffered_bytes());
    }
    d.finish(&mut out);
});
