//! Arrival timestamps: `tcp:tcp_probe` fires in the kernel's TCP receive
//! path (`tcp_rcv_established`) for every segment a socket receives, in
//! softirq context — when the request's bytes reach the engine's socket,
//! whether or not the engine is reading (or has even accepted the
//! connection). Only segments with data whose local port is an engine's
//! listening port (`ARRIVAL_PORTS`, kept by userspace) make a record; any
//! other TCP traffic on the host costs this program one hash lookup.
//!
//! The record (an [`RecordKind::Arrival`] header, no payload): `ts_ns`,
//! `ret` = the segment's data length, `fd` = the local port, `family`,
//! `port`, `addr` = the peer, and the socket's cookie in `tgid`/`tid`
//! (`RecordHeader::cookie`): it tells a new connection's segments from an
//! old one's with the same addresses. Everything is read from the tracepoint's own
//! record at the offsets of its format file (userspace checks them before
//! attaching); no kernel memory is read.

use agent_ebpf::{arrival_tp as tp, RecordHeader, RecordKind, AF_INET, AF_INET6};
use aya_ebpf::{
    helpers::bpf_ktime_get_ns, macros::tracepoint, programs::TracePointContext, EbpfContext,
};

use crate::{ctx::send, maps::ARRIVAL_PORTS};

#[inline(always)]
fn at<T: Copy>(ctx: &TracePointContext, off: usize) -> T {
    // SAFETY: constant offsets inside the tracepoint record; the verifier
    // checks context loads.
    unsafe { core::ptr::read_unaligned((ctx.as_ptr() as *const u8).add(off) as *const T) }
}

#[tracepoint]
pub fn tcp_probe(ctx: TracePointContext) -> u32 {
    let data_len: u16 = at(&ctx, tp::DATA_LEN);
    if data_len == 0 {
        return 0;
    }
    let sport: u16 = at(&ctx, tp::SPORT);
    // SAFETY: read by value.
    if unsafe { ARRIVAL_PORTS.get(&sport) }.is_none() {
        return 0;
    }
    let family: u16 = at(&ctx, tp::FAMILY);
    let mut h = RecordHeader {
        // SAFETY: reads the monotonic clock; no arguments, no preconditions.
        ts_ns: unsafe { bpf_ktime_get_ns() },
        ret: data_len as i64,
        fd: sport as i32,
        kind: RecordKind::Arrival as u8,
        family,
        port: at(&ctx, tp::DPORT),
        ..RecordHeader::default()
    };
    h.set_cookie(at(&ctx, tp::SOCK_COOKIE));
    // daddr: a sockaddr_in (address at +4) or sockaddr_in6 (at +8), read
    // as 32-bit words (the verifier allows constant-offset context loads,
    // not walks over the context).
    let word = |off: usize| -> [u8; 4] { at::<u32>(&ctx, off).to_ne_bytes() };
    if family == AF_INET {
        let a = word(tp::DADDR + 4);
        h.addr[..4].copy_from_slice(&a);
    } else if family == AF_INET6 {
        let (a, b, c, d) = (
            word(tp::DADDR + 8),
            word(tp::DADDR + 12),
            word(tp::DADDR + 16),
            word(tp::DADDR + 20),
        );
        h.addr = [
            a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3], c[0], c[1], c[2], c[3], d[0], d[1],
            d[2], d[3],
        ];
    } else {
        return 0;
    }
    send(&h);
    0
}
