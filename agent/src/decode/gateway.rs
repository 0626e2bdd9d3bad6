//! The gateway join: one user request seen at two hops, a reverse proxy
//! (nginx, Envoy, LiteLLM, …) and the engine behind it, both targets.
//!
//! The proxy's upstream connection is an outgoing connection of a target
//! (local address L, peer E); the engine's accepted connection has peer L.
//! So an engine record whose peer is the local address of a target's
//! outgoing connection came through a gateway. It is held (bounded in time)
//! until three records meet, in whatever order they come (on one node the
//! proxy may read and pass on the engine's last bytes before the engine's
//! write call returns, so the proxy's records can be reported first):
//! - E, the engine's request (finishes first: at the engine's last write);
//! - U, the proxy's own client-side view of the same request on L
//!   (finishes when the proxy reads that last write): requests on one
//!   HTTP/1.1 connection are in order, so U is the earliest held E on L
//!   that arrived after U's first write. U is consumed, never a record;
//! - P, the proxy's inbound request (finishes at the proxy's last write
//!   downstream): the earliest U of the same process, with the same body
//!   fingerprint, written after P arrived.
//!
//! Then both records get `gateway_s` (P's arrival → E's), `gateway_return_s`
//! (E's first content write → P's), the gateway's pid and port, `role`
//! (`gateway` on P, `engine` on E), and P's span becomes E's parent (E's
//! trace id is P's). An engine record whose gateway record does not come
//! within [`HOLD_NS`] leaves as it came.
//!
//! Owns: the join. Must not: do I/O or read a clock (times come in).

use std::{
    collections::{HashMap, HashSet},
    net::SocketAddr,
};

use serde::Serialize;

use crate::event::Role;
use crate::record::Finished;
use crate::vocab::ServingRole;

/// What a waiting record's strings (models, ids, names) are taken to hold,
/// for the memory budget: records are not walked field by field.
pub const RECORD_HEAP_BYTES: usize = 512;

/// How long an engine record waits for its gateway's (after it finished;
/// the gateway's record normally follows within milliseconds).
pub const HOLD_NS: u64 = 5_000_000_000;
/// How much earlier than the proxy's upstream write (its syscall's exit)
/// the engine's arrival may be: on one node the segment reaches the
/// engine's socket inside the proxy's write call. Requests on one
/// connection are sequential, so this only has to exclude a stale record.
const WRITE_SLACK_NS: u64 = 100_000_000;
/// How often (event time) closed connections' addresses are swept.
const GC_EVERY_NS: u64 = 1_000_000_000;
/// How long the address of a closed connection is remembered (a proxy
/// that closes its upstream connection before its records are joined).
const REMEMBER_NS: u64 = 10_000_000_000;

/// What the join counted.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct GatewayCounts {
    /// Gateway and engine records joined.
    pub joined: u64,
    /// Proxies' client-side views of requests the engine's record shows
    /// (consumed, never records).
    pub upstream: u64,
    /// Engine records behind a gateway that left without a gateway record
    /// (the proxy's record never came within the hold time).
    pub unjoined: u64,
}

#[derive(Clone, Copy)]
struct Ends {
    role: Role,
    local: Option<SocketAddr>,
    peer: Option<SocketAddr>,
}

/// An address of a connection, while open and a while after.
#[derive(Clone, Copy)]
struct Seen {
    pid: u32,
    open: u32,
    closed_ns: Option<u64>,
}

struct Up {
    pid: u32,
    t0_ns: u64,
    fp: Option<u64>,
}

/// A proxy's view of a forwarded request, not yet tied to the engine's.
struct View {
    local: SocketAddr,
    up: Up,
    since_ns: u64,
}

/// A gateway's inbound request waiting for its engine's record.
struct Inbound {
    f: Finished,
    pid: u32,
    since_ns: u64,
}

struct Held {
    f: Finished,
    /// The engine connection's peer: the proxy's upstream local address.
    peer: SocketAddr,
    since_ns: u64,
    up: Option<Up>,
}

#[derive(Default)]
pub struct Join {
    ends: HashMap<(u32, i32), Ends>,
    /// Local addresses of targets' outgoing connections.
    uplinks: HashMap<SocketAddr, Seen>,
    /// Peers of targets' accepted connections.
    served_peers: HashMap<SocketAddr, Seen>,
    /// Processes with outgoing connections to a served engine.
    gateways: HashSet<u32>,
    held: Vec<Held>,
    views: Vec<View>,
    inbound: Vec<Inbound>,
    /// When the address tables were last swept of closed connections.
    last_gc_ns: u64,
}

fn remember(m: &mut HashMap<SocketAddr, Seen>, a: SocketAddr, pid: u32) {
    let s = m.entry(a).or_insert(Seen {
        pid,
        open: 0,
        closed_ns: None,
    });
    s.pid = pid;
    s.open += 1;
    s.closed_ns = None;
}

fn forget(m: &mut HashMap<SocketAddr, Seen>, a: SocketAddr, ts_ns: u64) {
    if let Some(s) = m.get_mut(&a) {
        s.open = s.open.saturating_sub(1);
        if s.open == 0 {
            s.closed_ns = Some(ts_ns);
        }
    }
}

impl Join {
    /// A connection opened (accepted, connected).
    pub fn open(
        &mut self,
        key: (u32, i32),
        role: Role,
        local: Option<SocketAddr>,
        peer: Option<SocketAddr>,
        ts_ns: u64,
    ) {
        self.close(key, ts_ns);
        self.ends.insert(key, Ends { role, local, peer });
        match (role, local, peer) {
            (Role::Client, Some(l), _) => remember(&mut self.uplinks, l, key.0),
            (Role::Server, _, Some(p)) => remember(&mut self.served_peers, p, key.0),
            _ => {}
        }
    }

    /// A connection closed (after its last records went through
    /// [`Join::pass`]).
    pub fn close(&mut self, key: (u32, i32), ts_ns: u64) {
        if let Some(e) = self.ends.remove(&key) {
            match (e.role, e.local, e.peer) {
                (Role::Client, Some(l), _) => forget(&mut self.uplinks, l, ts_ns),
                (Role::Server, _, Some(p)) => forget(&mut self.served_peers, p, ts_ns),
                _ => {}
            }
        }
    }

    /// Takes the records from `from` on (all of connection `key`, made at
    /// `ts_ns`): holds, joins, consumes or leaves each. The three records
    /// of one proxied request may come in any order: on one node the
    /// proxy reads the engine's last bytes (and writes them on) while the
    /// engine's write call has not yet returned, so its view or its
    /// inbound record can be reported before the engine's record.
    pub fn pass(
        &mut self,
        key: (u32, i32),
        ts_ns: u64,
        records: &mut Vec<Finished>,
        from: usize,
        counts: &mut GatewayCounts,
    ) {
        if records.len() <= from {
            return;
        }
        let Some(ends) = self.ends.get(&key).copied() else {
            return;
        };
        let fresh: Vec<Finished> = records.drain(from..).collect();
        let mut waiting = false;
        for f in fresh {
            match (ends.role, ends.local, ends.peer) {
                // The proxy's own view of a request it forwarded to an
                // engine the agent serves: that engine's record is the
                // measurement.
                (Role::Client, Some(l), _) if self.served_peers.contains_key(&l) => {
                    self.gateways.insert(key.0);
                    counts.upstream += 1;
                    self.views.push(View {
                        local: l,
                        up: Up {
                            pid: key.0,
                            t0_ns: f.record.t0_ns,
                            fp: f.prompt_fp,
                        },
                        since_ns: ts_ns,
                    });
                    waiting = true;
                }
                // An engine's request from a target's outgoing connection.
                (Role::Server, _, Some(p)) if self.uplinks.contains_key(&p) => {
                    if let Some(s) = self.uplinks.get(&p) {
                        self.gateways.insert(s.pid);
                    }
                    self.held.push(Held {
                        f,
                        peer: p,
                        since_ns: ts_ns,
                        up: None,
                    });
                    waiting = true;
                }
                // A gateway's inbound request: waits for its engine's.
                (Role::Server, _, _) if self.is_gateway(key.0) => {
                    self.inbound.push(Inbound {
                        f,
                        pid: key.0,
                        since_ns: ts_ns,
                    });
                    waiting = true;
                }
                _ => records.push(f),
            }
        }
        if waiting {
            self.settle(records, counts);
        }
    }

    /// A process that forwarded a request to a served engine, or holds an
    /// outgoing connection to a selected port.
    fn is_gateway(&self, pid: u32) -> bool {
        self.gateways.contains(&pid)
            || (!self.uplinks.is_empty()
                && self.uplinks.values().any(|s| s.pid == pid && s.open > 0))
    }

    /// Joins what can be joined: each proxy view to its engine record (the
    /// earliest unjoined one on its connection), then each inbound request
    /// to the engine record whose view is its (same process, same body,
    /// written after it arrived); a joined pair leaves, engine first.
    fn settle(&mut self, records: &mut Vec<Finished>, counts: &mut GatewayCounts) {
        self.views.sort_by_key(|v| v.up.t0_ns);
        let mut i = 0;
        while i < self.views.len() {
            let v = &self.views[i];
            let found = self
                .held
                .iter_mut()
                .filter(|h| {
                    h.peer == v.local
                        && h.up.is_none()
                        && h.f.record.t0_ns + WRITE_SLACK_NS >= v.up.t0_ns
                })
                .min_by_key(|h| h.f.record.t0_ns);
            match found {
                Some(h) => {
                    h.up = Some(self.views.remove(i).up);
                }
                None => i += 1,
            }
        }
        self.inbound.sort_by_key(|p| p.f.record.t0_ns);
        let mut i = 0;
        while i < self.inbound.len() {
            let p = &self.inbound[i];
            let found = self
                .held
                .iter()
                .enumerate()
                .filter(|(_, h)| {
                    h.up.as_ref().is_some_and(|u| {
                        u.pid == p.pid && u.fp == p.f.prompt_fp && u.t0_ns >= p.f.record.t0_ns
                    })
                })
                .min_by_key(|(_, h)| h.up.as_ref().map(|u| u.t0_ns))
                .map(|(j, _)| j);
            match found {
                Some(j) => {
                    let mut e = self.held.remove(j).f;
                    let mut g = self.inbound.remove(i).f;
                    link(&mut g, &mut e);
                    counts.joined += 1;
                    records.push(e);
                    records.push(g);
                }
                None => i += 1,
            }
        }
    }

    /// Releases engine records held longer than [`HOLD_NS`] at `now_ns`
    /// (all with `None`: the end of input), and forgets closed addresses.
    pub fn expire(
        &mut self,
        now_ns: Option<u64>,
        records: &mut Vec<Finished>,
        counts: &mut GatewayCounts,
    ) {
        // Called for every socket event: nothing to do unless something
        // waits, or the address tables are due (once a second of event
        // time; they hold one entry per open connection).
        let gc_due = now_ns.is_some_and(|n| n.saturating_sub(self.last_gc_ns) >= GC_EVERY_NS);
        if self.held.is_empty()
            && self.inbound.is_empty()
            && self.views.is_empty()
            && !gc_due
            && now_ns.is_some()
        {
            return;
        }
        let due = |since: u64| now_ns.is_none_or(|n| n.saturating_sub(since) > HOLD_NS);
        let mut i = 0;
        while i < self.held.len() {
            if due(self.held[i].since_ns) {
                counts.unjoined += 1;
                records.push(self.held.remove(i).f);
            } else {
                i += 1;
            }
        }
        // A gateway's requests whose engine record never came (an upstream
        // that is no target, a request it answered itself) leave as they
        // are; views whose engine record never came are dropped.
        let mut i = 0;
        while i < self.inbound.len() {
            if due(self.inbound[i].since_ns) {
                records.push(self.inbound.remove(i).f);
            } else {
                i += 1;
            }
        }
        self.views.retain(|v| !due(v.since_ns));
        if let Some(n) = now_ns.filter(|_| gc_due) {
            self.last_gc_ns = n;
            let keep = |s: &mut Seen| {
                s.closed_ns
                    .is_none_or(|c| n.saturating_sub(c) < REMEMBER_NS)
            };
            self.uplinks.retain(|_, s| keep(s));
            self.served_peers.retain(|_, s| keep(s));
            let live: HashSet<u32> = self.uplinks.values().map(|s| s.pid).collect();
            self.gateways.retain(|p| live.contains(p));
        }
    }

    /// Processes seen forwarding requests to a served engine.
    pub fn gateways(&self) -> &HashSet<u32> {
        &self.gateways
    }

    /// Bytes the join holds: each waiting record (its struct, and an
    /// allowance of [`RECORD_HEAP_BYTES`] for its strings), each view,
    /// and the address tables' entries (part of the decoder's memory
    /// budget).
    pub fn buffered(&self) -> usize {
        (self.held.len() + self.inbound.len()) * (std::mem::size_of::<Held>() + RECORD_HEAP_BYTES)
            + self.views.len() * std::mem::size_of::<View>()
            + (self.uplinks.len() + self.served_peers.len())
                * (std::mem::size_of::<(SocketAddr, Seen)>() + 16)
            + self.ends.len() * (std::mem::size_of::<((u32, i32), Ends)>() + 16)
    }

    /// The memory budget wants the waiting records back: every engine and
    /// gateway record waiting for its other half leaves now, unjoined (as
    /// when [`HOLD_NS`] passes). Returns how many left.
    pub fn release_waiting(
        &mut self,
        records: &mut Vec<Finished>,
        counts: &mut GatewayCounts,
    ) -> u64 {
        let n = (self.held.len() + self.inbound.len()) as u64;
        counts.unjoined += self.held.len() as u64;
        records.extend(self.held.drain(..).map(|h| h.f));
        records.extend(self.inbound.drain(..).map(|i| i.f));
        self.views.clear();
        n
    }

    /// Records held now (engines' and gateways').
    pub fn held(&self) -> usize {
        self.held.len() + self.inbound.len()
    }
}

/// A 64-bit mix (splitmix64's finaliser): ids that are reproducible from
/// the records (a replay gives the same), distinct for distinct inputs.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Joins the gateway's record `g` and the engine's record `e`.
fn link(g: &mut Finished, e: &mut Finished) {
    let (gr, er) = (&mut g.record, &mut e.record);
    let gateway_s = er.t0_ns.saturating_sub(gr.t0_ns) as f64 / 1e9;
    // (first token at the gateway) − (first token at the engine), from
    // the t0 difference in integer ns (epoch ns do not fit an f64 exactly).
    let gateway_return_s = match (gr.ttft_s, er.ttft_s) {
        (Some(g), Some(e)) => Some((g - e - gateway_s).max(0.0)),
        _ => None,
    };
    let seed = mix(g.seq ^ mix(gr.t0_ns ^ mix(u64::from(gr.pid))));
    let span = format!("{:016x}", seed.max(1));
    let trace = gr
        .trace_id
        .clone()
        .unwrap_or_else(|| format!("{:016x}{:016x}", mix(seed), mix(seed ^ 1)));
    gr.span_id = Some(span.clone());
    gr.trace_id = Some(trace.clone());
    er.trace_id = Some(trace);
    er.parent_span_id = Some(span);
    // The engine's peer is the gateway: its caller is the gateway's.
    if gr.caller.is_some() {
        er.caller = gr.caller.clone();
    }
    gr.role = Some(ServingRole::Gateway);
    er.role = Some(ServingRole::Engine);
    for r in [&mut *gr, &mut *er] {
        r.gateway_s = Some(gateway_s);
        r.gateway_return_s = gateway_return_s;
    }
    let (pid, port) = (gr.pid, gr.server_port);
    for r in [gr, er] {
        r.gateway_pid = Some(pid);
        r.gateway_port = port;
    }
}

#[cfg(test)]
mod tests {
    use crate::decode::Decoder;
    use crate::event::{CloseEvent, DataEvent, Dir, OpenEvent, Role, SocketEvent};
    use crate::record::Finished;
    use crate::vocab::ServingRole;

    const T0: u64 = 1_700_000_000_000_000_000;
    const PROXY: u32 = 10;
    const ENGINE: u32 = 20;
    /// (pid, fd, role, local, peer) of the three connections.
    const INBOUND: (u32, i32, Role, &str, &str) =
        (PROXY, 5, Role::Server, "10.0.0.1:8080", "10.9.0.1:5555");
    const UPSTREAM: (u32, i32, Role, &str, &str) =
        (PROXY, 6, Role::Client, "10.0.1.1:40000", "10.0.2.2:9000");
    const SERVED: (u32, i32, Role, &str, &str) =
        (ENGINE, 7, Role::Server, "10.0.2.2:9000", "10.0.1.1:40000");

    fn at(us: u64) -> u64 {
        T0 + us * 1_000
    }

    fn open(c: (u32, i32, Role, &str, &str), us: u64) -> SocketEvent {
        SocketEvent::Open(OpenEvent {
            ts_ns: at(us),
            pid: c.0,
            fd: c.1,
            role: c.2,
            local: Some(c.3.parse().unwrap()),
            peer: Some(c.4.parse().unwrap()),
            joined: false,
        })
    }

    fn data(c: (u32, i32, Role, &str, &str), us: u64, dir: Dir, bytes: &[u8]) -> SocketEvent {
        SocketEvent::Data(DataEvent {
            ts_ns: at(us),
            pid: c.0,
            tid: c.0,
            fd: c.1,
            dir,
            ret: bytes.len() as i64,
            data: bytes.to_vec(),
            syscall: None,
        })
    }

    fn close(c: (u32, i32, Role, &str, &str), us: u64) -> SocketEvent {
        SocketEvent::Close(CloseEvent {
            ts_ns: at(us),
            pid: c.0,
            fd: c.1,
        })
    }

    fn request(model: &str) -> Vec<u8> {
        let body = format!("{{\"model\":\"{model}\",\"stream\":true}}");
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: e\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
    }

    const HEAD: &[u8] =
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n";

    fn sse(t: &str) -> Vec<u8> {
        let ev = format!(
            "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{t}\"}}}}]}}\n\n"
        );
        format!("{:x}\r\n{ev}\r\n", ev.len()).into_bytes()
    }

    /// One request through the proxy, `start` µs on: the proxy reads it at
    /// +0, writes it upstream (its call returns at +504), the engine reads
    /// it at +500, writes
    /// its head and first token at +2000 (the proxy forwards each write
    /// 100 µs later), the end at +5000.
    fn proxied(model: &str, start: u64, evs: &mut Vec<SocketEvent>) {
        let req = request(model);
        let last = sse("b");
        let end = b"0\r\n\r\n".to_vec();
        let steps: Vec<(u64, Dir, Vec<u8>)> = vec![
            (2000, Dir::Out, [HEAD, &sse("a")].concat()),
            (5000, Dir::Out, [last, end].concat()),
        ];
        evs.push(data(INBOUND, start, Dir::In, &req));
        // On one node the segment reaches the engine's socket inside the
        // proxy's write: the engine's arrival precedes the write's exit.
        evs.push(data(UPSTREAM, start + 504, Dir::Out, &req));
        evs.push(data(SERVED, start + 500, Dir::In, &req));
        for (t, _, bytes) in &steps {
            evs.push(data(SERVED, start + t, Dir::Out, bytes));
            evs.push(data(UPSTREAM, start + t + 50, Dir::In, bytes));
            evs.push(data(INBOUND, start + t + 100, Dir::Out, bytes));
        }
    }

    fn run(evs: &[SocketEvent]) -> (Decoder, Vec<Finished>) {
        let mut d = Decoder::new();
        let mut out = vec![];
        for e in evs {
            d.on_event(e, &mut out);
        }
        (d, out)
    }

    #[test]
    fn the_gateways_request_and_the_engines_are_joined_and_the_upstream_view_consumed() {
        let mut evs = vec![open(INBOUND, 0), open(UPSTREAM, 200), open(SERVED, 400)];
        proxied("m1", 1000, &mut evs);
        // A second request on the kept-alive connections.
        proxied("m2", 10_000, &mut evs);
        let (d, out) = run(&evs);
        assert_eq!(d.held(), 0, "nothing left waiting");
        assert_eq!(out.len(), 4, "{out:#?}");
        assert_eq!(d.stats.gateway.joined, 2);
        assert_eq!(d.stats.gateway.upstream, 2);
        for (i, model) in ["m1", "m2"].iter().enumerate() {
            let (e, g) = (&out[2 * i].record, &out[2 * i + 1].record);
            assert_eq!(e.request_model.as_deref(), Some(*model));
            assert_eq!(g.request_model.as_deref(), Some(*model));
            assert_eq!((e.pid, e.role), (ENGINE, Some(ServingRole::Engine)));
            assert_eq!((g.pid, g.role), (PROXY, Some(ServingRole::Gateway)));
            for r in [e, g] {
                // Proxy arrival (its read) → engine's read: 500 µs.
                assert!((r.gateway_s.unwrap() - 500e-6).abs() < 1e-9, "{r:?}");
                // Engine's first token → the proxy's: 100 µs.
                assert!((r.gateway_return_s.unwrap() - 100e-6).abs() < 1e-9, "{r:?}");
                assert_eq!(r.gateway_pid, Some(PROXY));
                assert_eq!(r.gateway_port, Some(8080));
            }
            // The engine's span is the gateway span's child, in its trace.
            assert_eq!(e.trace_id, g.trace_id);
            assert!(g.span_id.is_some());
            assert_eq!(e.parent_span_id, g.span_id);
            // The engine's caller is the gateway's (the proxy is its peer).
            assert_eq!(e.caller.as_deref(), Some("10.9.0.1"));
        }
        assert_ne!(out[1].record.span_id, out[3].record.span_id);
    }

    #[test]
    fn the_proxys_records_reported_before_the_engines_are_joined_all_the_same() {
        let mut evs = vec![open(INBOUND, 0), open(UPSTREAM, 200), open(SERVED, 400)];
        proxied("m1", 1000, &mut evs);
        proxied("m2", 10_000, &mut evs);
        // The engine's last write is reported after the proxy read and
        // passed it on (its call returned late): move each request's
        // last engine write behind the proxy's two events.
        for last in [at(1000 + 5000), at(10_000 + 5000)] {
            let i = evs
                .iter()
                .position(
                    |e| matches!(e, SocketEvent::Data(d) if d.fd == SERVED.1 && d.ts_ns == last),
                )
                .unwrap();
            let e = evs.remove(i);
            evs.insert(i + 2, e);
        }
        let (d, out) = run(&evs);
        assert_eq!(d.stats.gateway.joined, 2, "{out:#?}");
        assert_eq!(d.held(), 0);
        let roles: Vec<_> = out
            .iter()
            .map(|f| {
                (
                    f.record.request_model.clone(),
                    f.record.role.map(|r| r.as_str()),
                )
            })
            .collect();
        assert_eq!(
            roles,
            [
                ("m1", "engine"),
                ("m1", "gateway"),
                ("m2", "engine"),
                ("m2", "gateway")
            ]
            .map(|(m, r)| (Some(m.to_string()), Some(r)))
        );
        for f in &out {
            assert!((f.record.gateway_s.unwrap() - 500e-6).abs() < 1e-9);
        }
    }

    #[test]
    fn a_gateways_request_it_answers_itself_leaves_after_the_hold() {
        // The proxy has an upstream connection, but answers this one
        // itself (no engine record will come).
        let mut evs = vec![open(INBOUND, 0), open(UPSTREAM, 200), open(SERVED, 400)];
        evs.push(data(INBOUND, 1000, Dir::In, &request("own")));
        evs.push(data(
            INBOUND,
            1200,
            Dir::Out,
            &[HEAD, &sse("a"), b"0\r\n\r\n"].concat(),
        ));
        let (mut d, mut out) = run(&evs);
        assert!(out.is_empty());
        d.tick(at(1200) + super::HOLD_NS + 1, &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].record.role, None);
        assert_eq!(d.held(), 0);
    }

    #[test]
    fn a_gateways_trace_context_is_kept_and_given_to_the_engine() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let with_tp = |r: Vec<u8>| {
            let s = String::from_utf8(r).unwrap();
            s.replacen(
                "Host: e\r\n",
                &format!("Host: e\r\ntraceparent: {tp}\r\n"),
                1,
            )
            .into_bytes()
        };
        let mut evs = vec![open(INBOUND, 0), open(UPSTREAM, 200), open(SERVED, 400)];
        proxied("m", 1000, &mut evs);
        for e in &mut evs {
            if let SocketEvent::Data(d) = e {
                if d.data.starts_with(b"POST") {
                    d.data = with_tp(std::mem::take(&mut d.data));
                    d.ret = d.data.len() as i64;
                }
            }
        }
        let (_, out) = run(&evs);
        let (e, g) = (&out[0].record, &out[1].record);
        assert_eq!(
            g.trace_id.as_deref(),
            Some("4bf92f3577b34da6a3ce929d0e0e4736")
        );
        assert_eq!(g.parent_span_id.as_deref(), Some("00f067aa0ba902b7"));
        assert_eq!(e.trace_id, g.trace_id);
        assert_eq!(e.parent_span_id, g.span_id);
    }

    #[test]
    fn concurrent_requests_through_two_upstream_connections_join_by_body() {
        // Two inbound requests read before either goes upstream; the
        // second is forwarded first, on its own upstream connection.
        const INBOUND2: (u32, i32, Role, &str, &str) =
            (PROXY, 8, Role::Server, "10.0.0.1:8080", "10.9.0.2:6666");
        const UPSTREAM2: (u32, i32, Role, &str, &str) =
            (PROXY, 9, Role::Client, "10.0.1.1:40001", "10.0.2.2:9000");
        const SERVED2: (u32, i32, Role, &str, &str) =
            (ENGINE, 11, Role::Server, "10.0.2.2:9000", "10.0.1.1:40001");
        let (a, b) = (request("a"), request("b"));
        let mut evs = vec![
            open(INBOUND, 0),
            open(INBOUND2, 0),
            open(UPSTREAM, 200),
            open(SERVED, 200),
            open(UPSTREAM2, 200),
            open(SERVED2, 200),
            data(INBOUND, 1000, Dir::In, &a),
            data(INBOUND2, 1100, Dir::In, &b),
            data(UPSTREAM2, 1200, Dir::Out, &b),
            data(SERVED2, 1300, Dir::In, &b),
            data(UPSTREAM, 1400, Dir::Out, &a),
            data(SERVED, 1700, Dir::In, &a),
        ];
        let end = [sse("x"), b"0\r\n\r\n".to_vec()].concat();
        let resp = [HEAD.to_vec(), end].concat();
        for (s, u, i, t) in [
            (SERVED2, UPSTREAM2, INBOUND2, 3000),
            (SERVED, UPSTREAM, INBOUND, 4000),
        ] {
            evs.push(data(s, t, Dir::Out, &resp));
            evs.push(data(u, t + 10, Dir::In, &resp));
            evs.push(data(i, t + 20, Dir::Out, &resp));
        }
        let (d, out) = run(&evs);
        assert_eq!(d.stats.gateway.joined, 2, "{out:#?}");
        for f in &out {
            let r = &f.record;
            let want = if r.request_model.as_deref() == Some("a") {
                700e-6
            } else {
                200e-6
            };
            assert!((r.gateway_s.unwrap() - want).abs() < 1e-9, "{r:?}");
        }
    }

    #[test]
    fn an_engine_record_whose_gateway_record_never_comes_leaves_after_the_hold() {
        let mut evs = vec![open(INBOUND, 0), open(UPSTREAM, 200), open(SERVED, 400)];
        proxied("m", 1000, &mut evs);
        // The proxy's inbound side is lost (its last write never seen).
        evs.retain(
            |e| !matches!(e, SocketEvent::Data(d) if d.fd == INBOUND.1 && d.dir == Dir::Out),
        );
        let (mut d, mut out) = run(&evs);
        assert!(out.is_empty(), "held: {out:#?}");
        assert_eq!(d.held(), 1);
        d.tick(at(7000) + super::HOLD_NS / 2, &mut out);
        assert!(out.is_empty());
        d.tick(at(7000) + super::HOLD_NS + 1, &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].record.pid, ENGINE);
        assert_eq!(out[0].record.role, None);
        assert_eq!(d.stats.gateway.unjoined, 1);
    }

    #[test]
    fn over_the_memory_budget_a_waiting_engine_record_leaves_unjoined_at_once() {
        let mut evs = vec![open(INBOUND, 0), open(UPSTREAM, 200), open(SERVED, 400)];
        proxied("m", 1000, &mut evs);
        evs.retain(
            |e| !matches!(e, SocketEvent::Data(d) if d.fd == INBOUND.1 && d.dir == Dir::Out),
        );
        // Unbounded, it waits (counted in what the decoder holds).
        let (d, out) = run(&evs);
        assert!(out.is_empty());
        assert!(d.stats.held_bytes >= super::RECORD_HEAP_BYTES as u64);
        // Over a budget it cannot fit: it leaves at once, unjoined, shed.
        let mut d = Decoder::new().with_max_memory(1);
        let mut out = vec![];
        for e in &evs {
            d.on_event(e, &mut out);
        }
        // (A 1-byte budget also ends the proxy's own request in flight.)
        let engine: Vec<_> = out.iter().filter(|f| f.record.pid == ENGINE).collect();
        assert_eq!(engine.len(), 1, "{out:#?}");
        assert_eq!(engine[0].record.role, None, "unjoined");
        assert_eq!(d.held(), 0);
        assert!(d
            .stats
            .shed
            .get(&crate::vocab::ShedReason::GatewayHeld)
            .is_some_and(|n| *n >= 1));
        assert!(d.stats.gateway.unjoined >= 1);
    }

    #[test]
    fn a_targets_outgoing_requests_to_an_unserved_peer_are_records_as_before() {
        // No engine side: a client process calling out.
        let mut evs = vec![open(UPSTREAM, 200)];
        evs.push(data(UPSTREAM, 300, Dir::Out, &request("m")));
        evs.push(data(
            UPSTREAM,
            900,
            Dir::In,
            &[HEAD, &sse("a"), b"0\r\n\r\n"].concat(),
        ));
        evs.push(close(UPSTREAM, 1000));
        let (d, out) = run(&evs);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].record.role, None);
        assert_eq!(d.stats.gateway.upstream, 0);
    }

    #[test]
    fn a_proxy_closing_its_upstream_connection_per_request_is_joined() {
        let mut evs = vec![open(INBOUND, 0), open(UPSTREAM, 200), open(SERVED, 400)];
        proxied("m", 1000, &mut evs);
        // The engine closes first (Connection: close), then the proxy.
        let i = evs
            .iter()
            .position(
                |e| matches!(e, SocketEvent::Data(d) if d.fd == UPSTREAM.1 && d.ts_ns == at(6050)),
            )
            .unwrap();
        evs.insert(i, close(SERVED, 6010));
        evs.insert(i + 2, close(UPSTREAM, 6060));
        let (d, out) = run(&evs);
        assert_eq!(d.stats.gateway.joined, 1, "{out:#?}");
        assert_eq!(out.len(), 2);
    }
}
