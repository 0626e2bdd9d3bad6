//! Fetching an engine's `/metrics`: one HTTP/1.1 GET over plain std TCP,
//! from inside the engine's network namespace, within a total timeout
//! (connect + request + response, 1 s by default).
//!
//! Owns: [`Scraper`] (one synchronous scrape, its failure counters and the
//! "no `/metrics` here" memory), [`ScrapeHandle`] (a background thread
//! scraping a target list every interval). Every scrape carries this run's
//! own-traffic token (`crate::selftraffic`), so the pipeline drops the
//! requests the eBPF capture sees for them.
//!
//! Network namespaces: the engine may run in a pod, where `127.0.0.1:PORT`
//! is the pod's loopback. The socket is created and connected by a
//! short-lived thread that first `setns(/proc/PID/ns/net)`s (root or
//! CAP_SYS_ADMIN; only that thread changes namespace); the connected socket
//! stays in that namespace when the thread ends. When setns is refused the
//! scrape falls back to the agent's namespace, but only for an engine
//! listening on a specific non-loopback address (loopback there would be
//! someone else's server) — reported once.
//!
//! Must not: block the capture loop (use [`ScrapeHandle`]), panic on
//! anything the network sends, or read more than the body limit.

use std::{
    collections::{HashMap, HashSet},
    fmt,
    fs::File,
    io::{self, Read, Write},
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream},
    os::fd::AsRawFd,
    path::Path,
    sync::{Arc, Condvar, Mutex},
    thread::JoinHandle,
    time::{Duration, Instant},
};

use super::{engine_state, prom, EngineState};
use crate::{
    engines::Engine,
    host::procfs,
    selftraffic::{self, Marker},
};

/// Default total time for one scrape.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);
/// How long an engine that answered 404 is left alone.
pub const NO_ENDPOINT_BACKOFF: Duration = Duration::from_secs(300);
const MAX_HEAD_BYTES: usize = 64 << 10;
/// How long a listen address read from /proc is reused.
const LISTEN_CACHE: Duration = Duration::from_secs(30);

/// Why a scrape gave nothing. Never fatal: counted in [`ScrapeStats`].
#[derive(Debug)]
pub enum ScrapeError {
    /// Connect, request or response did not finish within the timeout.
    Timeout,
    /// Connection refused, or nothing in the engine's namespace listens
    /// on the port.
    Refused,
    /// The process is gone (or /proc is unreadable).
    NoProcess,
    /// The engine is in another network namespace, setns was refused and
    /// it listens only on loopback or a wildcard: unreachable from here.
    Namespace(io::Error),
    /// Another socket error.
    Io(io::Error),
    /// The engine answered 404: it serves no `/metrics` (remembered for
    /// [`NO_ENDPOINT_BACKOFF`]).
    NoEndpoint,
    /// Skipped: this engine answered 404 recently.
    Backoff,
    /// Any other non-200 status.
    Status(u16),
    /// Not a usable HTTP response (malformed head, compressed or oversized
    /// body, framing error).
    BadResponse(&'static str),
    /// The body is not a Prometheus exposition.
    Parse(prom::ParseError),
}

impl fmt::Display for ScrapeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScrapeError::Timeout => write!(f, "timed out"),
            ScrapeError::Refused => write!(f, "connection refused (nothing listening)"),
            ScrapeError::NoProcess => write!(f, "process gone"),
            ScrapeError::Namespace(e) => write!(
                f,
                "cannot enter the engine's network namespace ({e}); it listens only on \
                 loopback or a wildcard address there: run the agent as root (CAP_SYS_ADMIN)"
            ),
            ScrapeError::Io(e) => write!(f, "{e}"),
            ScrapeError::NoEndpoint => write!(f, "no /metrics endpoint (HTTP 404)"),
            ScrapeError::Backoff => write!(f, "skipped: no /metrics endpoint at the last try"),
            ScrapeError::Status(s) => write!(f, "HTTP {s}"),
            ScrapeError::BadResponse(why) => write!(f, "bad HTTP response: {why}"),
            ScrapeError::Parse(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ScrapeError {}

/// Failure counters since the scraper started (all monotonic).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScrapeStats {
    /// Scrapes attempted (skipped ones not included).
    pub attempts: u64,
    pub ok: u64,
    pub timeouts: u64,
    /// Refused connections and ports nobody listens on.
    pub refused: u64,
    /// Non-200 answers and malformed/oversized responses.
    pub http_errors: u64,
    /// 200 answers whose body is not an exposition.
    pub parse_errors: u64,
    /// setns refused (the scrape may still have worked through the
    /// fallback).
    pub namespace_failures: u64,
    /// Process gone, other socket errors.
    pub other_errors: u64,
    /// Scrapes skipped because the engine answered 404 recently.
    pub skipped_no_endpoint: u64,
}

/// Scrapes engines one at a time, synchronously (each call returns within
/// its timeout, plus the time to read /proc).
pub struct Scraper {
    timeout: Duration,
    limits: prom::Limits,
    proc_root: &'static Path,
    /// Sent in the own-traffic header of every scrape.
    marker: Marker,
    stats: ScrapeStats,
    /// (pid, port) → until when a 404 is believed.
    no_endpoint: HashMap<(u32, u16), Instant>,
    /// (pid, port) → where it listens, and when that was read (the TCP
    /// table of a busy engine is large; it is re-read every
    /// [`LISTEN_CACHE`] and after any failed connect).
    listen_cache: HashMap<(u32, u16), (SocketAddr, Instant)>,
    setns_reported: bool,
}

impl Scraper {
    /// A scraper whose scrapes each take at most `timeout` and carry
    /// `marker` (so the agent's decoder knows them for its own).
    pub fn new(timeout: Duration, marker: Marker) -> Scraper {
        Scraper {
            timeout,
            limits: prom::Limits::default(),
            proc_root: Path::new("/proc"),
            marker,
            stats: ScrapeStats::default(),
            no_endpoint: HashMap::new(),
            listen_cache: HashMap::new(),
            setns_reported: false,
        }
    }

    pub fn stats(&self) -> &ScrapeStats {
        &self.stats
    }

    /// GET `/metrics` from the engine `pid` listening on `port` (in its own
    /// network namespace) and reduce it to an [`EngineState`]; `family` is
    /// the engine's name as discovery gives it (`vllm`, `sglang`, `tgi`,
    /// `llama.cpp`) or `None` to detect it from the metric names.
    pub fn scrape(
        &mut self,
        pid: u32,
        port: u16,
        family: Option<Engine>,
    ) -> Result<EngineState, ScrapeError> {
        let now = Instant::now();
        self.no_endpoint.retain(|_, until| *until > now);
        self.listen_cache
            .retain(|_, (_, at)| now.duration_since(*at) < LISTEN_CACHE);
        if self.no_endpoint.contains_key(&(pid, port)) {
            self.stats.skipped_no_endpoint += 1;
            return Err(ScrapeError::Backoff);
        }
        self.stats.attempts += 1;
        let fetched = self.fetch(pid, port, now + self.timeout);
        if matches!(
            fetched,
            Err(ScrapeError::Timeout
                | ScrapeError::Refused
                | ScrapeError::NoProcess
                | ScrapeError::Io(_)
                | ScrapeError::Namespace(_))
        ) {
            self.listen_cache.remove(&(pid, port));
        }
        let res = fetched
            .and_then(|body| engine_state(&body, family, &self.limits).map_err(ScrapeError::Parse));
        let s = &mut self.stats;
        match &res {
            Ok(_) => s.ok += 1,
            Err(ScrapeError::Timeout) => s.timeouts += 1,
            Err(ScrapeError::Refused) => s.refused += 1,
            Err(ScrapeError::NoEndpoint | ScrapeError::Status(_) | ScrapeError::BadResponse(_)) => {
                s.http_errors += 1
            }
            Err(ScrapeError::Parse(_)) => s.parse_errors += 1,
            Err(ScrapeError::Namespace(_)) => {} // counted where setns failed
            Err(ScrapeError::NoProcess | ScrapeError::Io(_) | ScrapeError::Backoff) => {
                s.other_errors += 1
            }
        }
        if matches!(res, Err(ScrapeError::NoEndpoint)) {
            self.no_endpoint
                .insert((pid, port), now + NO_ENDPOINT_BACKOFF);
        }
        res
    }

    /// The 200 body of `GET path` from the engine `pid` listening on
    /// `port` (in its own network namespace), within the scraper's timeout:
    /// an engine's info endpoint. Not counted in the scrape stats.
    pub fn get(&mut self, pid: u32, port: u16, path: &str) -> Result<Vec<u8>, ScrapeError> {
        let deadline = Instant::now() + self.timeout;
        self.fetch_path(pid, port, path, deadline)
    }

    /// The response body of `GET /metrics`, status 200.
    fn fetch(&mut self, pid: u32, port: u16, deadline: Instant) -> Result<Vec<u8>, ScrapeError> {
        self.fetch_path(pid, port, "/metrics", deadline)
    }

    fn fetch_path(
        &mut self,
        pid: u32,
        port: u16,
        path: &str,
        deadline: Instant,
    ) -> Result<Vec<u8>, ScrapeError> {
        let their_ns = procfs::netns_inode(self.proc_root, pid).ok_or(ScrapeError::NoProcess)?;
        let dest = match self.listen_cache.get(&(pid, port)) {
            Some((dest, at)) if at.elapsed() < LISTEN_CACHE => *dest,
            _ => {
                let dest = listen_target(&procfs::tcp_table(self.proc_root, pid), port)
                    .ok_or(ScrapeError::Refused)?;
                self.listen_cache
                    .insert((pid, port), (dest, Instant::now()));
                dest
            }
        };
        let same_ns = procfs::netns_inode(self.proc_root, std::process::id()) == Some(their_ns);
        let mut stream = if same_ns {
            connect(dest, deadline)?
        } else {
            match connect_in_netns(self.proc_root, pid, dest, deadline) {
                Ok(s) => s,
                Err(NsConnect::Connect(e)) => return Err(e),
                Err(NsConnect::Setns(e)) => {
                    self.stats.namespace_failures += 1;
                    if !self.setns_reported {
                        self.setns_reported = true;
                        log::warn!(
                            "engine metrics: cannot enter the network namespace of pid {pid} \
                             ({e}); scraping from the agent's namespace where the engine listens \
                             on a routable address, skipping it otherwise (run as root or with \
                             CAP_SYS_ADMIN to reach engines in pods). Reported once."
                        );
                    }
                    if dest.ip().is_loopback() {
                        return Err(ScrapeError::Namespace(e));
                    }
                    connect(dest, deadline)?
                }
            }
        };
        http_get(
            &mut stream,
            path,
            dest,
            deadline,
            self.limits.max_body_bytes,
            &self.marker,
        )
    }
}

/// Where to connect for `port`, from the engine namespace's TCP table:
/// a wildcard listener is reached on loopback (IPv4 preferred), a
/// specific address as it is. `None`: nobody listens on `port` there.
fn listen_target(table: &[procfs::TcpEntry], port: u16) -> Option<SocketAddr> {
    let listeners: Vec<IpAddr> = table
        .iter()
        .filter(|e| e.state == procfs::TCP_LISTEN && e.local.port() == port)
        .map(|e| e.local.ip())
        .collect();
    let rank = |ip: &IpAddr| match ip {
        IpAddr::V4(v4) if v4.is_loopback() || v4.is_unspecified() => 0,
        IpAddr::V6(v6) if v6.is_loopback() || v6.is_unspecified() => 1,
        IpAddr::V4(_) => 2,
        IpAddr::V6(_) => 3,
    };
    let ip = listeners.iter().min_by_key(|ip| rank(ip))?;
    let ip = match ip {
        IpAddr::V4(v4) if v4.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(v6) if v6.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        other => *other,
    };
    Some(SocketAddr::new(ip, port))
}

fn remaining(deadline: Instant) -> Result<Duration, ScrapeError> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        Err(ScrapeError::Timeout)
    } else {
        Ok(left)
    }
}

fn io_error(e: io::Error) -> ScrapeError {
    match e.kind() {
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => ScrapeError::Timeout,
        io::ErrorKind::ConnectionRefused => ScrapeError::Refused,
        _ => ScrapeError::Io(e),
    }
}

fn connect(dest: SocketAddr, deadline: Instant) -> Result<TcpStream, ScrapeError> {
    TcpStream::connect_timeout(&dest, remaining(deadline)?).map_err(io_error)
}

enum NsConnect {
    Setns(io::Error),
    Connect(ScrapeError),
}

/// Connects to `dest` from inside `pid`'s network namespace: a thread of
/// its own enters the namespace (setns affects only the calling thread)
/// and ends after connecting; the socket keeps the namespace.
fn connect_in_netns(
    proc_root: &Path,
    pid: u32,
    dest: SocketAddr,
    deadline: Instant,
) -> Result<TcpStream, NsConnect> {
    let ns = File::open(proc_root.join(format!("{pid}/ns/net")))
        .map_err(|e| NsConnect::Connect(io_error(e)))?;
    let worker = std::thread::Builder::new()
        .name("tt-scrape-ns".into())
        .stack_size(64 << 10)
        .spawn(move || {
            // SAFETY: `ns` is an open namespace fd; setns changes only this
            // thread's network namespace, and the thread ends right after.
            let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
            if rc != 0 {
                return Err(NsConnect::Setns(io::Error::last_os_error()));
            }
            connect(dest, deadline).map_err(NsConnect::Connect)
        })
        .map_err(|e| NsConnect::Connect(ScrapeError::Io(e)))?;
    worker.join().unwrap_or_else(|_| {
        Err(NsConnect::Connect(ScrapeError::Io(io::Error::other(
            "namespace thread panicked",
        ))))
    })
}

/// Reads into `buf` until the deadline; `Ok(0)` is EOF.
fn read_some(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
    deadline: Instant,
) -> Result<usize, ScrapeError> {
    stream
        .set_read_timeout(Some(remaining(deadline)?))
        .map_err(ScrapeError::Io)?;
    let mut chunk = [0u8; 16 << 10];
    loop {
        match stream.read(&mut chunk) {
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                return Ok(n);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io_error(e)),
        }
    }
}

/// One `GET /metrics` with `Connection: close`; the 200 body (decoded
/// from chunked transfer when needed).
fn http_get(
    stream: &mut TcpStream,
    path: &str,
    dest: SocketAddr,
    deadline: Instant,
    max_body_bytes: usize,
    marker: &Marker,
) -> Result<Vec<u8>, ScrapeError> {
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {dest}\r\nUser-Agent: tokentap\r\n{}: {}\r\n\
         Accept: text/plain;version=0.0.4;q=1,*/*;q=0.1\r\nAccept-Encoding: identity\r\n\
         Connection: close\r\n\r\n",
        selftraffic::HEADER,
        marker.as_str()
    );
    stream
        .set_write_timeout(Some(remaining(deadline)?))
        .map_err(ScrapeError::Io)?;
    stream.write_all(req.as_bytes()).map_err(io_error)?;

    let mut buf = Vec::with_capacity(16 << 10);
    let (status, framing, head_len) = loop {
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut resp = httparse::Response::new(&mut headers);
        match resp.parse(&buf) {
            Ok(httparse::Status::Complete(len)) => {
                let code = resp.code.unwrap_or(0);
                if (100..200).contains(&code) {
                    // An interim response (100 Continue): drop it, read on.
                    buf.drain(..len);
                    continue;
                }
                break (code, framing_of(resp.headers)?, len);
            }
            Ok(httparse::Status::Partial) => {
                if buf.len() > MAX_HEAD_BYTES {
                    return Err(ScrapeError::BadResponse("response head over 64 KiB"));
                }
                if read_some(stream, &mut buf, deadline)? == 0 {
                    return Err(ScrapeError::BadResponse("closed before the response head"));
                }
            }
            Err(_) => return Err(ScrapeError::BadResponse("malformed response head")),
        }
    };
    match status {
        200 => {}
        404 => return Err(ScrapeError::NoEndpoint),
        s => return Err(ScrapeError::Status(s)),
    }
    buf.drain(..head_len);
    match framing {
        Framing::Length(n) => {
            if n > max_body_bytes {
                return Err(ScrapeError::BadResponse("body over the size limit"));
            }
            while buf.len() < n {
                if read_some(stream, &mut buf, deadline)? == 0 {
                    return Err(ScrapeError::BadResponse("closed inside the body"));
                }
            }
            buf.truncate(n);
            Ok(buf)
        }
        Framing::Chunked => {
            let mut dec = Dechunker::default();
            let mut body = Vec::new();
            loop {
                // The decoder consumes everything it is fed.
                if dec.feed(&buf, &mut body)? {
                    return Ok(body);
                }
                buf.clear();
                if body.len() > max_body_bytes {
                    return Err(ScrapeError::BadResponse("body over the size limit"));
                }
                if read_some(stream, &mut buf, deadline)? == 0 {
                    return Err(ScrapeError::BadResponse("closed inside a chunked body"));
                }
            }
        }
        Framing::Close => loop {
            if buf.len() > max_body_bytes {
                return Err(ScrapeError::BadResponse("body over the size limit"));
            }
            if read_some(stream, &mut buf, deadline)? == 0 {
                return Ok(buf);
            }
        },
    }
}

#[derive(Debug, PartialEq)]
enum Framing {
    Length(usize),
    Chunked,
    Close,
}

fn framing_of(headers: &[httparse::Header<'_>]) -> Result<Framing, ScrapeError> {
    let mut framing = Framing::Close;
    for h in headers {
        let value = std::str::from_utf8(h.value).unwrap_or("").trim();
        if h.name.eq_ignore_ascii_case("transfer-encoding") {
            if value.to_ascii_lowercase().ends_with("chunked") {
                framing = Framing::Chunked;
            } else {
                return Err(ScrapeError::BadResponse("unsupported transfer-encoding"));
            }
        } else if h.name.eq_ignore_ascii_case("content-length") && framing != Framing::Chunked {
            let n = value
                .parse::<usize>()
                .map_err(|_| ScrapeError::BadResponse("bad content-length"))?;
            framing = Framing::Length(n);
        } else if h.name.eq_ignore_ascii_case("content-encoding")
            && !value.eq_ignore_ascii_case("identity")
            && !value.is_empty()
        {
            return Err(ScrapeError::BadResponse("compressed body"));
        }
    }
    Ok(framing)
}

/// Incremental chunked-transfer decoder: every byte fed is consumed.
#[derive(Debug, Default)]
struct Dechunker {
    state: ChunkState,
    /// The size line (or trailer line) read so far.
    line: Vec<u8>,
    left_bytes: usize,
}

#[derive(Debug, Default, PartialEq)]
enum ChunkState {
    #[default]
    Size,
    Data,
    DataEnd,
    Trailer,
    Done,
}

impl Dechunker {
    /// Feeds bytes; true once the last chunk and trailers have been read.
    fn feed(&mut self, mut input: &[u8], body: &mut Vec<u8>) -> Result<bool, ScrapeError> {
        const MAX_LINE_BYTES: usize = 4096;
        while !input.is_empty() && self.state != ChunkState::Done {
            match self.state {
                ChunkState::Size | ChunkState::Trailer | ChunkState::DataEnd => {
                    let nl = input.iter().position(|&b| b == b'\n');
                    let take = nl.map_or(input.len(), |i| i + 1);
                    self.line.extend_from_slice(&input[..take]);
                    input = &input[take..];
                    if self.line.len() > MAX_LINE_BYTES {
                        return Err(ScrapeError::BadResponse("chunk line too long"));
                    }
                    if nl.is_none() {
                        continue;
                    }
                    let line = std::mem::take(&mut self.line);
                    let text = std::str::from_utf8(&line)
                        .map_err(|_| ScrapeError::BadResponse("bad chunk size"))?
                        .trim();
                    self.state = match self.state {
                        ChunkState::DataEnd if text.is_empty() => ChunkState::Size,
                        ChunkState::DataEnd => {
                            return Err(ScrapeError::BadResponse("chunk data overran its size"))
                        }
                        ChunkState::Trailer if text.is_empty() => ChunkState::Done,
                        ChunkState::Trailer => ChunkState::Trailer,
                        _ => {
                            let hex = text.split(';').next().unwrap_or("").trim();
                            let n = usize::from_str_radix(hex, 16)
                                .map_err(|_| ScrapeError::BadResponse("bad chunk size"))?;
                            if n == 0 {
                                ChunkState::Trailer
                            } else {
                                self.left_bytes = n;
                                ChunkState::Data
                            }
                        }
                    };
                }
                ChunkState::Data => {
                    let take = self.left_bytes.min(input.len());
                    body.extend_from_slice(&input[..take]);
                    input = &input[take..];
                    self.left_bytes -= take;
                    if self.left_bytes == 0 {
                        self.state = ChunkState::DataEnd;
                    }
                }
                ChunkState::Done => {}
            }
        }
        Ok(self.state == ChunkState::Done)
    }
}

/// One engine to scrape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub pid: u32,
    /// The engine's listening (serving) port.
    pub port: u16,
    /// The engine as discovery named it; `None` to detect.
    pub engine: Option<Engine>,
}

#[derive(Default)]
struct RunnerState {
    targets: Vec<Target>,
    targets_changed: bool,
    latest: HashMap<u32, EngineState>,
    stats: ScrapeStats,
    stop: bool,
}

struct Shared {
    state: Mutex<RunnerState>,
    wake: Condvar,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, RunnerState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A scraper on a thread of its own: every `interval` it scrapes each
/// target in turn (a hung engine costs the cycle one timeout). Dropping
/// the handle stops the thread (waiting for at most one scrape).
pub struct ScrapeHandle {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// Starts a background scraper with the default 1 s timeout, its scrapes
/// carrying `marker`.
pub fn spawn(interval: Duration, marker: Marker) -> io::Result<ScrapeHandle> {
    spawn_with(Scraper::new(DEFAULT_TIMEOUT, marker), interval)
}

/// Starts `scraper` on a background thread, scraping every `interval`.
pub fn spawn_with(mut scraper: Scraper, interval: Duration) -> io::Result<ScrapeHandle> {
    let shared = Arc::new(Shared {
        state: Mutex::new(RunnerState::default()),
        wake: Condvar::new(),
    });
    let sh = shared.clone();
    let thread = std::thread::Builder::new()
        .name("tt-enginemetrics".into())
        .spawn(move || {
            let mut next = Instant::now();
            loop {
                let targets = {
                    let mut st = sh.lock();
                    loop {
                        if st.stop {
                            return;
                        }
                        if st.targets_changed || Instant::now() >= next {
                            break;
                        }
                        let wait = next.saturating_duration_since(Instant::now());
                        st = sh
                            .wake
                            .wait_timeout(st, wait)
                            .unwrap_or_else(|e| e.into_inner())
                            .0;
                    }
                    st.targets_changed = false;
                    st.targets.clone()
                };
                next = Instant::now() + interval;
                let mut results = Vec::with_capacity(targets.len());
                for t in &targets {
                    if sh.lock().stop {
                        return;
                    }
                    let r = scraper.scrape(t.pid, t.port, t.engine);
                    if let Err(e) = &r {
                        log::debug!("engine metrics: pid {} port {}: {e}", t.pid, t.port);
                    }
                    results.push((t.pid, r.ok()));
                }
                let mut st = sh.lock();
                for (pid, r) in results {
                    match r {
                        Some(state) => st.latest.insert(pid, state),
                        // No stale values: a failed scrape removes the pid.
                        None => st.latest.remove(&pid),
                    };
                }
                let live: HashSet<u32> = st.targets.iter().map(|t| t.pid).collect();
                st.latest.retain(|pid, _| live.contains(pid));
                st.stats = scraper.stats().clone();
            }
        })?;
    Ok(ScrapeHandle {
        shared,
        thread: Some(thread),
    })
}

impl ScrapeHandle {
    /// Replaces the target list (one entry per pid; a later duplicate
    /// wins). Scraping starts at once; states of pids no longer listed are
    /// dropped after the next cycle.
    pub fn set_targets(&self, targets: Vec<Target>) {
        let mut by_pid: Vec<Target> = Vec::with_capacity(targets.len());
        for t in targets {
            match by_pid.iter_mut().find(|o| o.pid == t.pid) {
                Some(o) => *o = t,
                None => by_pid.push(t),
            }
        }
        let mut st = self.shared.lock();
        if st.targets != by_pid {
            st.targets = by_pid;
            st.targets_changed = true;
            self.shared.wake.notify_all();
        }
    }

    /// The last successful scrape of each target, by pid (a target whose
    /// last scrape failed is absent).
    pub fn latest(&self) -> HashMap<u32, EngineState> {
        self.shared.lock().latest.clone()
    }

    /// Counters as of the last finished cycle.
    pub fn stats(&self) -> ScrapeStats {
        self.shared.lock().stats.clone()
    }
}

impl Drop for ScrapeHandle {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.wake.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use procfs::TcpEntry;

    fn entry(local: &str, state: u8) -> TcpEntry {
        TcpEntry {
            local: local.parse().expect("addr"),
            peer: "0.0.0.0:0".parse().expect("addr"),
            state,
            inode: 1,
        }
    }

    #[test]
    fn wildcard_listeners_are_reached_on_loopback_ipv4_first() {
        let t = [
            entry("[::]:8000", procfs::TCP_LISTEN),
            entry("0.0.0.0:8000", procfs::TCP_LISTEN),
        ];
        assert_eq!(
            listen_target(&t, 8000),
            Some("127.0.0.1:8000".parse().unwrap())
        );
        let t6 = [entry("[::]:8000", procfs::TCP_LISTEN)];
        assert_eq!(
            listen_target(&t6, 8000),
            Some("[::1]:8000".parse().unwrap())
        );
    }

    #[test]
    fn a_specific_listen_address_is_used_as_is() {
        let t = [entry("10.1.2.3:8000", procfs::TCP_LISTEN)];
        assert_eq!(
            listen_target(&t, 8000),
            Some("10.1.2.3:8000".parse().unwrap())
        );
    }

    #[test]
    fn no_listener_on_the_port_means_nothing_to_connect_to() {
        let t = [
            entry("127.0.0.1:8000", procfs::TCP_ESTABLISHED),
            entry("127.0.0.1:9000", procfs::TCP_LISTEN),
        ];
        assert_eq!(listen_target(&t, 8000), None);
    }

    fn dechunk_all(parts: &[&[u8]]) -> Result<(bool, Vec<u8>), ScrapeError> {
        let mut d = Dechunker::default();
        let mut body = vec![];
        let mut done = false;
        for p in parts {
            done = d.feed(p, &mut body)?;
        }
        Ok((done, body))
    }

    #[test]
    fn chunked_bodies_decode_across_any_split() {
        let wire: &[u8] = b"5;ext=1\r\nhello\r\n7\r\n, world\r\n0\r\nX-Trailer: y\r\n\r\n";
        for cut in 0..=wire.len() {
            let (a, b) = wire.split_at(cut);
            let (done, body) = dechunk_all(&[a, b]).expect("decode");
            assert!(done, "cut {cut}");
            assert_eq!(body, b"hello, world", "cut {cut}");
        }
        let (done, _) = dechunk_all(&[b"5\r\nhel"]).expect("partial");
        assert!(!done);
    }

    #[test]
    fn malformed_chunks_are_errors_not_panics() {
        assert!(dechunk_all(&[b"zz\r\n"]).is_err());
        assert!(dechunk_all(&[b"2\r\nabc\r\n"]).is_err());
        assert!(dechunk_all(&[&[b'1'; 5000][..]]).is_err());
        assert!(dechunk_all(&[b"ffffffffffffffffffff\r\n"]).is_err());
    }

    #[test]
    fn framing_prefers_chunked_and_refuses_compression() {
        let h = |n: &'static str, v: &'static [u8]| httparse::Header { name: n, value: v };
        assert_eq!(
            framing_of(&[h("Content-Length", b"12")]).unwrap(),
            Framing::Length(12)
        );
        assert_eq!(
            framing_of(&[
                h("Transfer-Encoding", b"chunked"),
                h("Content-Length", b"5")
            ])
            .unwrap(),
            Framing::Chunked
        );
        assert_eq!(framing_of(&[]).unwrap(), Framing::Close);
        assert!(framing_of(&[h("Content-Encoding", b"gzip")]).is_err());
        assert!(framing_of(&[h("Content-Length", b"-1")]).is_err());
    }
}
