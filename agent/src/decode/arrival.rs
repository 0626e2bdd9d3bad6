//! Arrival times of request bytes: the kernel's TCP receive path reports
//! each data segment reaching an engine's socket ([`ArrivalEvent`]); this
//! keeps them per connection as a byte ledger, so the first byte of a
//! request at stream offset `o` arrived with the first segment whose
//! cumulative end exceeds `o` — pipelined and keep-alive requests get their
//! own bytes' arrival, not the connection's.
//!
//! Segments arrive before the connection is known (before `accept()`
//! returns): they wait in `pending` under (local port, peer) until the
//! open event claims them. The ledger is trusted only while it covers
//! every byte read: a connection found open at start-up, or one whose
//! segments were lost, reads bytes the ledger never saw and stops using
//! arrivals (its requests keep `t0_source = "read"`).
//!
//! The join key has no network namespace: two engines on the same port in
//! different namespaces, with clients at the same address and port, would
//! mix (loopback clients of look-alike pods); the ledger's coverage check
//! then usually turns arrivals off for them.

use std::{
    collections::{HashMap, VecDeque},
    net::SocketAddr,
};

use crate::event::ArrivalEvent;

/// Connections waiting to be claimed, at most.
const MAX_PENDING: usize = 4096;
/// Segments kept per connection at most (unread ones; a client that
/// floods an engine that does not read has its ledger dropped).
const MAX_SEGMENTS: usize = 4096;
/// Pending arrivals older than this are forgotten (no accept came).
const PENDING_TTL_NS: u64 = 120_000_000_000;

/// One connection's received bytes: (cumulative end offset, arrival time)
/// per segment not yet read through.
#[derive(Default, Debug)]
pub struct Ledger {
    segs: VecDeque<(u64, u64)>,
    arrived: u64,
    read: u64,
    /// Length of the newest segment.
    last_len: u32,
    /// Segments taken for retransmissions of data already here.
    pub duplicates: u64,
}

/// A segment as long as the newest one, arriving this long after it while
/// that one is still unread, is its retransmission (see [`Ledger::push`]).
const RETRANSMIT_GAP_NS: u64 = 2_000_000;

impl Ledger {
    /// A segment reached the socket. The tracepoint fires before TCP looks
    /// at the sequence number, so a retransmission of bytes the socket
    /// already holds (a tail-loss probe after the engine left them unread
    /// past the sender's timeout) is reported too: counted, its bytes
    /// would shift every later byte onto an older segment's time. The
    /// record has no sequence number; a segment of the newest one's length
    /// arriving ≥ 2 ms after it while that one is still unread is taken
    /// for its retransmission and not counted. (Two equal writes 2 ms apart
    /// that the engine leaves unread are then under-counted: the ledger
    /// sees more read than arrived and stops, and t0 falls back to the
    /// read: a lost arrival, never a wrong one.)
    fn push(&mut self, ts: u64, len: u32) -> bool {
        if let Some(&(end, t)) = self.segs.back() {
            if len == self.last_len && end > self.read && ts >= t + RETRANSMIT_GAP_NS {
                self.duplicates += 1;
                return true;
            }
        }
        self.arrived += len as u64;
        self.last_len = len;
        self.segs.push_back((self.arrived, ts));
        self.segs.len() <= MAX_SEGMENTS
    }

    /// When the byte at `off` bytes into the next read arrived.
    pub fn at(&self, off: usize) -> Option<u64> {
        let o = self.read + off as u64;
        self.segs
            .iter()
            .find(|(end, _)| *end > o)
            .map(|(_, ts)| *ts)
    }

    /// `n` bytes were read. False when the ledger did not see them arrive
    /// (then it must not be used any more).
    pub fn consume(&mut self, n: u64) -> bool {
        self.read += n;
        while self.segs.front().is_some_and(|(end, _)| *end <= self.read) {
            self.segs.pop_front();
        }
        self.read <= self.arrived
    }
}

/// When a read's bytes arrived.
#[derive(Clone, Copy)]
pub enum At<'a> {
    /// From its connection's ledger: the byte at `off` bytes into the
    /// piece lies `skip + off` bytes past what the ledger has consumed.
    Ledger { ledger: &'a Ledger, skip: usize },
    /// Every byte at once: TLS plaintext, whose bytes arrived with the
    /// ciphertext the socket read last before it was decrypted.
    Fixed(u64),
}

impl At<'_> {
    pub fn at(&self, off: usize) -> Option<u64> {
        match self {
            At::Ledger { ledger, skip } => ledger.at(skip + off),
            At::Fixed(ts) => Some(*ts),
        }
    }
}

/// The join key: the engine's port and the peer (IPv4-mapped addresses as
/// IPv4, as the capture reports peers).
pub fn key(local_port: u16, peer: SocketAddr) -> (u16, SocketAddr) {
    let ip = peer.ip().to_canonical();
    (local_port, SocketAddr::new(ip, peer.port()))
}

#[derive(Default)]
pub struct Arrivals {
    /// Segments of connections not (yet) open: key → (first seen, ledger).
    pending: HashMap<(u16, SocketAddr), (u64, Ledger)>,
    /// Open server connections by key.
    pub by_addr: HashMap<(u16, SocketAddr), (u32, i32)>,
    /// Arrival events seen (for stats).
    pub events: u64,
}

/// Where an arrival goes.
pub enum Route {
    /// To this open connection's ledger.
    Conn((u32, i32)),
    /// Held until the connection opens.
    Held,
}

impl Arrivals {
    pub fn route(&mut self, a: &ArrivalEvent) -> Route {
        self.events += 1;
        let k = key(a.local_port, a.peer);
        if let Some(c) = self.by_addr.get(&k) {
            return Route::Conn(*c);
        }
        if !self.pending.contains_key(&k) && self.pending.len() >= MAX_PENDING {
            let horizon = a.ts_ns.saturating_sub(PENDING_TTL_NS);
            self.pending.retain(|_, (t, _)| *t >= horizon);
            if self.pending.len() >= MAX_PENDING {
                return Route::Held; // dropped: the table is full of live ones
            }
        }
        let (_, l) = self
            .pending
            .entry(k)
            .or_insert_with(|| (a.ts_ns, Ledger::default()));
        if !l.push(a.ts_ns, a.len) {
            self.pending.remove(&k);
        }
        Route::Held
    }

    /// A server connection opened: its ledger (with what arrived before
    /// the accept), from now on fed directly.
    pub fn claim(&mut self, local_port: u16, peer: SocketAddr, conn: (u32, i32)) -> Ledger {
        let k = key(local_port, peer);
        self.by_addr.insert(k, conn);
        self.pending.remove(&k).map(|(_, l)| l).unwrap_or_default()
    }

    /// The connection with this key closed.
    pub fn release(&mut self, local_port: u16, peer: SocketAddr, conn: (u32, i32)) {
        let k = key(local_port, peer);
        if self.by_addr.get(&k) == Some(&conn) {
            self.by_addr.remove(&k);
        }
    }

    /// Adds a segment to an open connection's ledger; false when it
    /// overflowed (drop the ledger).
    pub fn push(l: &mut Ledger, a: &ArrivalEvent) -> bool {
        l.push(a.ts_ns, a.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retransmission_of_an_unread_segment_is_not_counted() {
        let ms = 1_000_000;
        let mut l = Ledger::default();
        l.push(100 * ms, 549); // a request head
        l.consume(549);
        l.push(105 * ms, 164); // its body, left unread while the head is parsed
        l.push(113 * ms, 164); // the sender's tail-loss probe: the same bytes
        assert_eq!(l.duplicates, 1);
        l.consume(164);
        l.push(150 * ms, 549); // the next request
        assert_eq!(l.at(0), Some(150 * ms), "not the retransmission's time");
        assert!(l.consume(549));
        // Equal segments back to back (a large body) all count.
        l.push(200 * ms, 1448);
        l.push(200 * ms + 30_000, 1448);
        assert_eq!(l.duplicates, 1);
        assert!(l.consume(2896));
        // And an equal request after the last one was read counts too.
        l.push(300 * ms, 1448);
        assert_eq!(l.duplicates, 1);
        assert_eq!(l.at(0), Some(300 * ms));
    }

    #[test]
    fn each_byte_gets_its_segments_time_and_reads_consume_the_ledger() {
        let mut l = Ledger::default();
        l.push(100, 10); // bytes 0..10
        l.push(200, 5); // bytes 10..15
        assert_eq!(l.at(0), Some(100));
        assert_eq!(l.at(9), Some(100));
        assert_eq!(l.at(10), Some(200));
        assert_eq!(l.at(15), None, "not arrived yet");
        assert!(l.consume(12));
        assert_eq!(l.at(0), Some(200), "offsets are relative to the next read");
        assert!(l.consume(3));
        assert!(
            !l.consume(1),
            "a byte that never arrived: the ledger is off"
        );
    }

    #[test]
    fn segments_before_accept_wait_for_their_connection() {
        let mut a = Arrivals::default();
        let peer: SocketAddr = "10.0.0.2:5555".parse().unwrap();
        let ev = |ts, len| ArrivalEvent {
            ts_ns: ts,
            local_port: 8000,
            peer,
            len,
        };
        assert!(matches!(a.route(&ev(1, 100)), Route::Held));
        let mapped: SocketAddr = "[::ffff:10.0.0.2]:5555".parse().unwrap();
        let l = a.claim(8000, mapped, (7, 3));
        assert_eq!(l.at(0), Some(1), "claimed across the v4-mapped spelling");
        assert!(matches!(a.route(&ev(2, 10)), Route::Conn((7, 3))));
        a.release(8000, peer, (7, 3));
        assert!(matches!(a.route(&ev(3, 10)), Route::Held));
    }
}
