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
//! Addresses alone do not name a connection for long: a client port is
//! reused, and the join key has no network namespace (two engines on one
//! port in different namespaces, with loopback clients at the same port).
//! A segment that reaches no open connection — one arriving after its
//! connection closed, or one of a socket that is not a target's — would
//! wait under its key and be claimed by the next connection with those
//! addresses, dating that connection's first request by the old segment
//! (a fidelity run saw a request 5.46 s early). So every segment carries
//! its socket's cookie (`tcp_probe`'s `sock_cookie`, one per socket), and
//! a ledger holds one socket's segments: another socket's segment starts
//! a fresh pending ledger, or, on a claimed ledger that nothing has been
//! read from yet (it was claimed stale), replaces it; a foreign segment
//! on a connection that has read is set aside under the key
//! (`arrival_foreign` in the decode stats).

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
/// Pending arrivals are swept this often (event time).
const SWEEP_EVERY_NS: u64 = 10_000_000_000;

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
    /// The socket these segments reached (0: not known yet).
    cookie: u64,
}

/// A segment as long as the newest one, arriving this long after it while
/// that one is still unread, is its retransmission (see [`Ledger::push`]).
const RETRANSMIT_GAP_NS: u64 = 2_000_000;

impl Ledger {
    /// Heap bytes held (its segments).
    pub fn buffered(&self) -> usize {
        self.segs.capacity() * std::mem::size_of::<(u64, u64)>()
    }

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
    /// Segments of another socket than the ledger's under the same key
    /// (a stale ledger replaced, or a foreign segment set aside).
    pub foreign: u64,
    /// Event time of the last sweep of `pending`.
    swept_ns: u64,
}

/// Where an arrival goes.
pub enum Route {
    /// To this open connection's ledger.
    Conn((u32, i32)),
    /// Held until the connection opens.
    Held,
}

impl Arrivals {
    /// The open connection `a` belongs to, if one claimed its addresses.
    pub fn peek_route(&self, a: &ArrivalEvent) -> Option<(u32, i32)> {
        self.by_addr.get(&key(a.local_port, a.peer)).copied()
    }

    pub fn route(&mut self, a: &ArrivalEvent) -> Route {
        self.events += 1;
        let k = key(a.local_port, a.peer);
        if let Some(c) = self.by_addr.get(&k) {
            return Route::Conn(*c);
        }
        self.hold(k, a);
        Route::Held
    }

    /// Keeps a segment under its key until a connection claims it.
    fn hold(&mut self, k: (u16, SocketAddr), a: &ArrivalEvent) {
        if a.ts_ns >= self.swept_ns + SWEEP_EVERY_NS {
            self.swept_ns = a.ts_ns;
            let horizon = a.ts_ns.saturating_sub(PENDING_TTL_NS);
            self.pending.retain(|_, (t, _)| *t >= horizon);
        }
        if let Some((_, l)) = self.pending.get(&k) {
            if !l.same_socket(a.cookie) {
                // An older socket's segments under these addresses: never
                // the new connection's.
                self.foreign += 1;
                self.pending.remove(&k);
            }
        }
        if !self.pending.contains_key(&k) && self.pending.len() >= MAX_PENDING {
            return; // dropped: the table is full of live ones
        }
        let (_, l) = self
            .pending
            .entry(k)
            .or_insert_with(|| (a.ts_ns, Ledger::default()));
        l.cookie = a.cookie;
        if !l.push(a.ts_ns, a.len) {
            self.pending.remove(&k);
        }
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
    /// overflowed (drop the ledger). A segment of another socket than the
    /// ledger's replaces a ledger nothing was read from (claimed stale:
    /// the connection's own bytes start here), and is otherwise held
    /// under its key as if no connection had those addresses.
    pub fn push(&mut self, l: &mut Ledger, a: &ArrivalEvent) -> bool {
        if !l.same_socket(a.cookie) {
            self.foreign += 1;
            if l.read > 0 {
                self.hold(key(a.local_port, a.peer), a);
                return true;
            }
            *l = Ledger::default();
        }
        if a.cookie != 0 {
            l.cookie = a.cookie;
        }
        l.push(a.ts_ns, a.len)
    }
}

impl Ledger {
    /// Whether a segment reaching socket `cookie` belongs with this
    /// ledger's (either unknown: assumed so).
    fn same_socket(&self, cookie: u64) -> bool {
        self.cookie == 0 || cookie == 0 || self.cookie == cookie
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
            cookie: 1,
        };
        assert!(matches!(a.route(&ev(1, 100)), Route::Held));
        let mapped: SocketAddr = "[::ffff:10.0.0.2]:5555".parse().unwrap();
        let l = a.claim(8000, mapped, (7, 3));
        assert_eq!(l.at(0), Some(1), "claimed across the v4-mapped spelling");
        assert!(matches!(a.route(&ev(2, 10)), Route::Conn((7, 3))));
        a.release(8000, peer, (7, 3));
        assert!(matches!(a.route(&ev(3, 10)), Route::Held));
    }

    #[test]
    fn a_segment_that_reached_no_connection_is_never_a_later_connections() {
        let s = 1_000_000_000;
        let mut a = Arrivals::default();
        let peer: SocketAddr = "127.0.0.1:41000".parse().unwrap();
        let ev = |ts, len, cookie| ArrivalEvent {
            ts_ns: ts,
            local_port: 8000,
            peer,
            len,
            cookie,
        };
        // A connection's last segment comes after its close was handled:
        // it waits under the connection's addresses.
        let mut old = a.claim(8000, peer, (7, 3));
        assert!(matches!(a.route(&ev(s, 100, 11)), Route::Conn((7, 3))));
        assert!(a.push(&mut old, &ev(s, 100, 11)));
        assert!(old.consume(100));
        a.release(8000, peer, (7, 3));
        assert!(matches!(a.route(&ev(2 * s, 50, 11)), Route::Held));

        // The client port is reused 5 s later: the new connection is
        // accepted before it sends (the stale segment is claimed) …
        let mut new = a.claim(8000, peer, (7, 4));
        assert_eq!(new.at(0), Some(2 * s), "claimed stale, as addresses say");
        // … and its own first segment replaces what was claimed.
        assert!(matches!(a.route(&ev(7 * s, 300, 12)), Route::Conn((7, 4))));
        assert!(a.push(&mut new, &ev(7 * s, 300, 12)));
        assert_eq!(new.at(0), Some(7 * s), "its request arrived now");
        assert!(new.consume(300), "and the ledger covers what it reads");
        assert_eq!(a.foreign, 1);

        // Its data arrives before the accept, behind a stale segment.
        a.release(8000, peer, (7, 4));
        assert!(matches!(a.route(&ev(8 * s, 40, 12)), Route::Held));
        assert!(matches!(a.route(&ev(9 * s, 200, 13)), Route::Held));
        let l = a.claim(8000, peer, (7, 5));
        assert_eq!(l.at(0), Some(9 * s), "only the new socket's bytes");
        assert_eq!(a.foreign, 2);

        // A namesake socket's segment on a connection that has read (one
        // in another network namespace): set aside, the ledger unchanged.
        let mut l = l;
        assert!(l.consume(100));
        assert!(a.push(&mut l, &ev(10 * s, 64, 99)));
        assert_eq!(l.at(0), Some(9 * s));
        assert!(l.consume(100));
        assert!(!l.consume(1), "the namesake's bytes are not this one's");
        assert_eq!(a.foreign, 3);
    }

    #[test]
    fn pending_segments_no_connection_claims_are_swept() {
        let s = 1_000_000_000;
        let mut a = Arrivals::default();
        for i in 0..50u16 {
            let peer = SocketAddr::new("10.0.0.9".parse().unwrap(), 30000 + i);
            a.route(&ArrivalEvent {
                ts_ns: s + i as u64,
                local_port: 8000,
                peer,
                len: 10,
                cookie: 100 + i as u64,
            });
        }
        assert_eq!(a.pending.len(), 50);
        a.route(&ArrivalEvent {
            ts_ns: s + PENDING_TTL_NS + SWEEP_EVERY_NS,
            local_port: 8000,
            peer: "10.0.0.9:40000".parse().unwrap(),
            len: 10,
            cookie: 7,
        });
        assert_eq!(a.pending.len(), 1, "the old ones are gone");
    }
}
