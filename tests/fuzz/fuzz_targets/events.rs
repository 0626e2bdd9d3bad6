//! The event-stream input shared by the decoder targets: repeated
//! `[ctrl][len][len bytes]`; ctrl bit 0 = outbound, bit 1 = close the
//! connection after, bit 2 = failed call (negative return), bit 3 =
//! capture truncated (ret larger than the bytes), bits 4-5 = which of 4
//! connections, bit 6 = `len` counts 16-byte units.

use tokentap::{
    decode::Decoder,
    event::{CloseEvent, DataEvent, Dir, OpenEvent, Role, SocketEvent},
};

/// How a target shapes the connections before the fuzzer's bytes.
pub struct Shape {
    /// Each connection is opened (server role, seen from its start) and
    /// its first inbound and outbound calls begin with these bytes, so
    /// the sniffer's choice is fixed and the fuzzer works on what follows.
    pub open: bool,
    pub first_in: &'static [u8],
    pub first_out: &'static [u8],
}

/// Any bytes on connections joined mid-way (the `decode` target).
#[allow(dead_code)] // not every target uses it
pub const ANY: Shape = Shape {
    open: false,
    first_in: b"",
    first_out: b"",
};

/// Feeds `input` to `d` as events; `check` runs after each.
pub fn run(d: &mut Decoder, input: &[u8], shape: &Shape, mut check: impl FnMut(&Decoder, usize)) {
    let mut out = Vec::new();
    let mut started = [[false; 2]; 4];
    if shape.open {
        for fd in 0..4 {
            d.on_event(
                &SocketEvent::Open(OpenEvent {
                    ts_ns: 500,
                    pid: 1,
                    fd,
                    role: Role::Server,
                    local: None,
                    peer: None,
                    joined: false,
                }),
                &mut out,
            );
        }
    }
    let mut i = 0;
    let mut ts = 1_000u64;
    while i + 2 <= input.len() {
        let ctrl = input[i];
        let len = input[i + 1] as usize * if ctrl & 0x40 != 0 { 16 } else { 1 };
        let end = (i + 2 + len).min(input.len());
        let mut bytes = Vec::new();
        let fd = ((ctrl >> 4) & 3) as i32;
        let out_dir = ctrl & 1 != 0;
        let first = &mut started[fd as usize][out_dir as usize];
        if !*first {
            *first = true;
            bytes.extend_from_slice(if out_dir {
                shape.first_out
            } else {
                shape.first_in
            });
        }
        bytes.extend_from_slice(&input[i + 2..end]);
        i = end;
        ts += 1_000;
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
            dir: if out_dir { Dir::Out } else { Dir::In },
            ret,
            data: bytes,
            syscall: None,
        });
        let n = match &ev {
            SocketEvent::Data(d) => d.data.len(),
            _ => 0,
        };
        d.on_event(&ev, &mut out);
        if ctrl & 2 != 0 {
            d.on_event(
                &SocketEvent::Close(CloseEvent {
                    ts_ns: ts,
                    pid: 1,
                    fd,
                }),
                &mut out,
            );
            started[fd as usize] = [false; 2];
        }
        check(d, n);
        out.clear();
    }
    d.finish(&mut out);
}
