//! Engine metrics scrape (`tokentap::enginemetrics`) against real
//! expositions: a vLLM exposition reconstructed from vLLM's documented
//! metrics (`tests/fixtures/vllm-v1-metrics.prom`, served by an in-test
//! HTTP server in every body framing), a recorded llama-server exposition,
//! and a real `llama-server --metrics` from the peers set-up — on the host
//! and in a network namespace of its own, reached through setns.
//!
//! The in-test servers run in this process, so their pid is ours: the
//! scraper finds their listener in `/proc/self/net/tcp` like an engine's.

use std::{
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::Command,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use tokentap::{
    enginemetrics::{
        engine_state,
        prom::{self, Limits, MetricType},
        scrape, EngineState, ScrapeError, Scraper, Target,
    },
    engines::Engine as EngineKind,
    selftraffic::{self, Marker},
};
use tokentap_tests::{
    assert_root, free_port,
    http::round_trip,
    peers::{die_with_parent, Engine, Peers},
    start, Netns,
};

fn fixture(name: &str) -> Vec<u8> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// What the in-test server answers.
#[derive(Clone, Copy)]
enum Reply {
    /// 200 with a Content-Length body.
    Length,
    /// 200, chunked, in chunks of 1, 7, 4096 … bytes.
    Chunked,
    /// 200 with neither: the body ends when the server closes.
    Close,
    /// This status with a short body.
    Status(u16),
    /// Accept, read the request, never answer.
    Silent,
}

/// A server on 127.0.0.1 answering every connection with `reply` and
/// `body`; returns its port and the peer address of every connection it
/// accepted (as the engine would see the scraper).
/// Whether a request head carries `m` in the own-traffic header.
fn carries(head: &str, m: &Marker) -> bool {
    head.lines().any(|l| {
        l.split_once(':').is_some_and(|(k, v)| {
            k.trim().eq_ignore_ascii_case(selftraffic::HEADER) && m.matches(v.as_bytes())
        })
    })
}

fn serve(reply: Reply, body: Vec<u8>) -> (u16, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let peers = Arc::new(Mutex::new(vec![]));
    let seen = peers.clone();
    std::thread::spawn(move || {
        let mut held = vec![];
        for conn in listener.incoming() {
            let Ok(mut s) = conn else { continue };
            s.set_read_timeout(Some(Duration::from_secs(5))).ok();
            let mut req = vec![];
            let mut b = [0u8; 1024];
            while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut b) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => req.extend_from_slice(&b[..n]),
                }
            }
            assert!(
                req.starts_with(b"GET /metrics HTTP/1.1\r\n"),
                "{}",
                String::from_utf8_lossy(&req)
            );
            seen.lock()
                .unwrap()
                .push(String::from_utf8_lossy(&req).into_owned());
            let head = |extra: &str| {
                format!("HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n{extra}\r\n")
            };
            let _ = match reply {
                Reply::Length => s
                    .write_all(head(&format!("Content-Length: {}\r\n", body.len())).as_bytes())
                    .and_then(|_| s.write_all(&body)),
                Reply::Chunked => (|| {
                    s.write_all(head("Transfer-Encoding: chunked\r\n").as_bytes())?;
                    let mut rest = &body[..];
                    for size in [1usize, 7, 4096].iter().cycle() {
                        if rest.is_empty() {
                            break;
                        }
                        let (c, r) = rest.split_at((*size).min(rest.len()));
                        s.write_all(format!("{:x}\r\n", c.len()).as_bytes())?;
                        s.write_all(c)?;
                        s.write_all(b"\r\n")?;
                        rest = r;
                    }
                    s.write_all(b"0\r\n\r\n")
                })(),
                Reply::Close => s
                    .write_all(head("Connection: close\r\n").as_bytes())
                    .and_then(|_| s.write_all(&body)),
                Reply::Status(code) => s.write_all(
                    format!(
                        "HTTP/1.1 {code} Nope\r\nContent-Type: application/json\r\nContent-Length: 21\r\n\r\n{{\"error\":\"not found\"}}"
                    )
                    .as_bytes(),
                ),
                Reply::Silent => {
                    held.push(s);
                    continue;
                }
            };
        }
    });
    (port, peers)
}

/// The fixture's series: two data-parallel engine cores (`engine="0"`,
/// `"1"`) with 7+5 running, 2+1 waiting, KV cache 0.4137 and 0.3862.
fn vllm_fixture_state() -> EngineState {
    EngineState {
        kv_cache_usage: Some(0.4137),
        requests_waiting: Some(3.0),
        requests_running: Some(12.0),
        family: Some(EngineKind::Vllm),
    }
}

#[test]
fn vllm_fixture_parses_with_types_help_and_histograms() {
    let body = fixture("vllm-v1-metrics.prom");
    let e = prom::parse(&body, &Limits::default()).expect("parse");
    assert_eq!(e.summary.bad_lines, 0);
    assert!(!e.summary.truncated);
    assert_eq!(e.samples.len(), 142, "every non-comment line (grep -vc ^#)");
    assert_eq!(
        e.types.get("vllm:kv_cache_usage_perc"),
        Some(&MetricType::Gauge)
    );
    assert_eq!(
        e.types.get("vllm:time_to_first_token_seconds"),
        Some(&MetricType::Histogram)
    );
    assert_eq!(
        e.help.get("vllm:num_requests_waiting").map(String::as_str),
        Some("Number of requests waiting to be processed.")
    );
    // Both engines' TTFT histograms summed: 512 + 492 requests.
    let h = e
        .histogram("vllm:time_to_first_token_seconds")
        .expect("ttft");
    assert_eq!(h.count, 1004.0);
    assert_eq!(h.buckets.last(), Some(&(f64::INFINITY, 1004.0)));
    assert_eq!(h.buckets.len(), 23);
    assert!((h.sum - 61.734 * 1.96).abs() < 1e-9, "{}", h.sum);
    assert_eq!(
        e.family_of("vllm:e2e_request_latency_seconds_count"),
        "vllm:e2e_request_latency_seconds"
    );
    let info = e.get("vllm:cache_config_info").next().expect("info");
    assert_eq!(info.label("num_gpu_blocks"), Some("29463"));
}

#[test]
fn vllm_fixture_reduces_to_summed_counts_and_the_fullest_kv_cache() {
    let body = fixture("vllm-v1-metrics.prom");
    for engine in [Some(EngineKind::Vllm), None] {
        assert_eq!(
            engine_state(&body, engine, &Limits::default()).expect("state"),
            vllm_fixture_state(),
            "engine {engine:?}"
        );
    }
}

#[test]
fn recorded_llama_server_exposition_has_counts_but_no_kv_gauge() {
    // Recorded from the peers' llama-server (0.5.0-dev, commit 0c1e570)
    // after one completion: llama.cpp no longer exports
    // llamacpp:kv_cache_usage_ratio.
    let body = fixture("llama-server-metrics.prom");
    let e = prom::parse(&body, &Limits::default()).expect("parse");
    assert_eq!(e.summary.bad_lines, 0);
    assert_eq!(e.samples.len(), 15);
    assert_eq!(
        engine_state(&body, Some(EngineKind::LlamaCpp), &Limits::default()).expect("state"),
        EngineState {
            kv_cache_usage: None,
            requests_waiting: Some(0.0),
            requests_running: Some(0.0),
            family: Some(EngineKind::LlamaCpp),
        }
    );
}

#[test]
fn scrape_reads_every_body_framing_and_marks_its_requests_as_the_agents() {
    let marker = Marker::new();
    let mut scraper = Scraper::new(Duration::from_secs(1), marker.clone());
    for reply in [Reply::Length, Reply::Chunked, Reply::Close] {
        let (port, heads) = serve(reply, fixture("vllm-v1-metrics.prom"));
        let state = scraper
            .scrape(std::process::id(), port, Some(EngineKind::Vllm))
            .expect("scrape");
        assert_eq!(state, vllm_fixture_state());
        let heads = heads.lock().unwrap().clone();
        assert_eq!(heads.len(), 1);
        assert!(
            carries(&heads[0], &marker),
            "the request carries this run's own-traffic token: {}",
            heads[0]
        );
    }
    assert_eq!(scraper.stats().ok, 3);
    assert_eq!(scraper.stats().attempts, 3);
}

#[test]
fn an_engine_that_accepts_and_never_answers_times_out_within_the_limit() {
    let (port, peers) = serve(Reply::Silent, vec![]);
    let mut scraper = Scraper::new(Duration::from_secs(1), Marker::new());
    let t = Instant::now();
    let err = scraper
        .scrape(std::process::id(), port, None)
        .expect_err("no answer");
    let took = t.elapsed();
    assert!(matches!(err, ScrapeError::Timeout), "{err:?}");
    // The 1 s limit, not another: at least its length, and short of
    // twice it (a loaded 2-core machine adds scheduling delay, not a
    // second).
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_millis(1950),
        "timed out after {took:?}"
    );
    assert_eq!(peers.lock().unwrap().len(), 1, "it did connect");
    assert_eq!(scraper.stats().timeouts, 1);
}

#[test]
fn a_404_is_remembered_and_the_engine_is_not_asked_again() {
    let (port, peers) = serve(Reply::Status(404), vec![]);
    let mut scraper = Scraper::new(Duration::from_secs(1), Marker::new());
    let pid = std::process::id();
    assert!(matches!(
        scraper.scrape(pid, port, None),
        Err(ScrapeError::NoEndpoint)
    ));
    assert!(matches!(
        scraper.scrape(pid, port, None),
        Err(ScrapeError::Backoff)
    ));
    assert_eq!(peers.lock().unwrap().len(), 1, "one connection only");
    let st = scraper.stats();
    assert_eq!(
        (st.attempts, st.http_errors, st.skipped_no_endpoint),
        (1, 1, 1)
    );
}

#[test]
fn errors_are_counted_by_kind_and_never_fatal() {
    let pid = std::process::id();
    let mut scraper = Scraper::new(Duration::from_secs(1), Marker::new());
    let (p500, _) = serve(Reply::Status(500), vec![]);
    assert!(matches!(
        scraper.scrape(pid, p500, None),
        Err(ScrapeError::Status(500))
    ));
    let (html, _) = serve(
        Reply::Length,
        b"<html><body>metrics are elsewhere</body></html>\n".to_vec(),
    );
    assert!(matches!(
        scraper.scrape(pid, html, None),
        Err(ScrapeError::Parse(_))
    ));
    // Nothing listens on this port: refused without even connecting.
    assert!(matches!(
        scraper.scrape(pid, free_port(), None),
        Err(ScrapeError::Refused)
    ));
    // A pid that does not exist.
    assert!(matches!(
        scraper.scrape(u32::MAX - 1, p500, None),
        Err(ScrapeError::NoProcess)
    ));
    let st = scraper.stats();
    assert_eq!(
        (
            st.http_errors,
            st.parse_errors,
            st.refused,
            st.other_errors,
            st.ok
        ),
        (1, 1, 1, 1, 0)
    );
    // And the scraper still works afterwards.
    let (ok, _) = serve(Reply::Length, fixture("vllm-v1-metrics.prom"));
    assert_eq!(
        scraper.scrape(pid, ok, None).expect("scrape"),
        vllm_fixture_state()
    );
}

#[test]
fn background_runner_publishes_states_by_pid_and_forgets_removed_targets() {
    let (port, peers) = serve(Reply::Length, fixture("vllm-v1-metrics.prom"));
    let marker = Marker::new();
    let handle = scrape::spawn(Duration::from_millis(100), marker.clone()).expect("spawn");
    let pid = std::process::id();
    handle.set_targets(vec![Target {
        pid,
        port,
        engine: Some(EngineKind::Vllm),
    }]);
    let deadline = Instant::now() + Duration::from_secs(5);
    while handle.latest().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(handle.latest().get(&pid), Some(&vllm_fixture_state()));
    // It keeps scraping every interval: three more come, and no faster
    // than the interval allows (counted against the time it took, not
    // a fixed sleep, so a loaded machine's pauses do not fail it).
    let (t, before) = (Instant::now(), peers.lock().unwrap().len());
    while peers.lock().unwrap().len() < before + 3 && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let (n, took) = (peers.lock().unwrap().len() - before, t.elapsed());
    assert!(n >= 3, "{n} scrapes in {took:?} at 100 ms");
    assert!(
        n as u128 <= took.as_millis() / 100 + 2,
        "{n} scrapes in {took:?}: faster than every 100 ms"
    );
    assert!(peers.lock().unwrap().iter().all(|h| carries(h, &marker)));
    assert!(handle.stats().ok >= 3);

    handle.set_targets(vec![]);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !handle.latest().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(handle.latest().is_empty());
    let t = Instant::now();
    drop(handle);
    // Promptly: within a scrape's 1 s timeout and a loaded machine's
    // delay, not after the thread's next long wait.
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "drop stops the thread promptly ({:?})",
        t.elapsed()
    );
}

fn llama_dir(peers: &Peers) -> PathBuf {
    peers.dir.join(".build/llama.cpp/bin")
}

/// `POST /completion` generating exactly `n` tokens.
fn complete(port: u16, n: u32) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect llama-server");
    let body = format!(
        r#"{{"prompt":"Once upon a time","n_predict":{n},"ignore_eos":true,"cache_prompt":false}}"#
    );
    let r = round_trip(&mut s, "/completion", &body).expect("completion");
    assert_eq!(r.status(), Some(200));
}

/// Scrapes until `want` holds (or 20 s pass); returns the last state.
fn scrape_until(
    scraper: &mut Scraper,
    pid: u32,
    port: u16,
    want: impl Fn(&EngineState) -> bool,
) -> EngineState {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let s = scraper
            .scrape(pid, port, Some(EngineKind::LlamaCpp))
            .expect("scrape llama-server");
        if want(&s) || Instant::now() > deadline {
            return s;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
#[ignore = "needs the real peers (cargo xtask peers; cargo xtask test runs it)"]
fn real_llama_server_reports_running_and_deferred_requests() {
    let peers = Peers::installed("enginemetrics llama-server");
    let port = free_port();
    // One slot: a second concurrent request waits (is "deferred").
    let (engine, _out) = peers.start_engine(Engine::Native, port, 1);
    let pid = engine.0.id();
    let mut scraper = Scraper::new(Duration::from_secs(1), Marker::new());
    complete(port, 8);
    complete(port, 8);
    let idle = scraper
        .scrape(pid, port, Some(EngineKind::LlamaCpp))
        .expect("scrape");
    assert_eq!(idle.family, Some(EngineKind::LlamaCpp));
    assert_eq!(idle.requests_running, Some(0.0));
    assert_eq!(idle.requests_waiting, Some(0.0));
    // This build exports no KV-cache gauge; an older one would, in 0–1.
    assert!(
        idle.kv_cache_usage.is_none_or(|u| (0.0..=1.0).contains(&u)),
        "{idle:?}"
    );

    let long: Vec<_> = (0..2)
        .map(|_| std::thread::spawn(move || complete(port, 1500)))
        .collect();
    let busy = scrape_until(&mut scraper, pid, port, |s| {
        s.requests_running == Some(1.0) && s.requests_waiting == Some(1.0)
    });
    assert_eq!(
        (busy.requests_running, busy.requests_waiting),
        (Some(1.0), Some(1.0)),
        "one request in the slot, one deferred"
    );
    for t in long {
        t.join().expect("long completion");
    }
    let after = scrape_until(&mut scraper, pid, port, |s| s.requests_running == Some(0.0));
    assert_eq!(after.requests_running, Some(0.0));
    assert_eq!(after.requests_waiting, Some(0.0));
    assert_eq!(scraper.stats().timeouts, 0);
}

#[test]
#[ignore = "needs root: network namespaces and the real peers (cargo xtask test runs it as root)"]
fn llama_server_in_its_own_network_namespace_is_scraped_through_setns() {
    assert_root("enginemetrics netns");
    let peers = Peers::installed("enginemetrics netns");
    let port = free_port();
    let lib = llama_dir(&peers);
    // `unshare --net` execs in place: the shell, then llama-server, keep
    // its pid; inside, 127.0.0.1:port is the namespace's own loopback.
    let mut cmd = Command::new("unshare");
    cmd.args([
        "--net",
        "sh",
        "-c",
        "ip link set lo up && exec \"$0\" \"$@\"",
    ])
    .arg(lib.join("llama-server"))
    .arg("-m")
    .arg(peers.model())
    .args(["--host", "127.0.0.1", "--port", &port.to_string()])
    .args(["-t", "1", "-tb", "1", "-c", "2048", "-np", "1", "--metrics"])
    .env("LD_LIBRARY_PATH", &lib);
    let (engine, _out) = start(
        die_with_parent(&mut cmd),
        "listening on http",
        "llama-server in a network namespace",
    );
    let pid = engine.0.id();
    assert_ne!(
        std::fs::read_link(format!("/proc/{pid}/ns/net")).expect("ns"),
        std::fs::read_link("/proc/self/ns/net").expect("own ns"),
        "llama-server must be in another network namespace"
    );
    // From the host's namespace its port is not reachable at all.
    assert!(TcpStream::connect(("127.0.0.1", port)).is_err());

    let mut scraper = Scraper::new(Duration::from_secs(1), Marker::new());
    let state = scraper
        .scrape(pid, port, Some(EngineKind::LlamaCpp))
        .expect("scrape through setns");
    assert_eq!(state.family, Some(EngineKind::LlamaCpp));
    assert_eq!(state.requests_running, Some(0.0));
    assert_eq!(state.requests_waiting, Some(0.0));
    let st = scraper.stats();
    assert_eq!((st.ok, st.namespace_failures), (1, 0));
}

/// A static HTTP server inside `ns` on `addr:port` serving `dir` (so `GET
/// /metrics` is the file `dir/metrics`).
fn serve_dir(ns: &Netns, addr: &str, port: u16, dir: &Path) -> tokentap_tests::Running {
    let mut cmd = ns.command("python3");
    cmd.args([
        "-m",
        "http.server",
        "--bind",
        addr,
        &port.to_string(),
        "--directory",
    ])
    .arg(dir)
    .env("PYTHONUNBUFFERED", "1");
    start(
        die_with_parent(&mut cmd),
        "Serving HTTP",
        "python http.server",
    )
    .0
}

/// Runs `f` on a thread without CAP_SYS_ADMIN in its effective set (so
/// setns is refused to it and to the threads it starts).
fn without_sys_admin<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(move || {
        #[repr(C)]
        struct Header {
            version: u32,
            pid: i32,
        }
        #[repr(C)]
        #[derive(Clone, Copy, Default)]
        struct Data {
            effective: u32,
            permitted: u32,
            inheritable: u32,
        }
        const V3: u32 = 0x2008_0522;
        let mut h = Header {
            version: V3,
            pid: 0,
        };
        let mut d = [Data::default(); 2];
        // SAFETY: capget/capset with a v3 header and two data words, on
        // this thread only (pid 0).
        unsafe {
            assert_eq!(libc::syscall(libc::SYS_capget, &mut h, d.as_mut_ptr()), 0);
            const CAP_SYS_ADMIN: u32 = 21;
            d[0].effective &= !(1 << CAP_SYS_ADMIN);
            assert_eq!(libc::syscall(libc::SYS_capset, &mut h, d.as_ptr()), 0);
        }
        f()
    })
    .join()
    .expect("thread without CAP_SYS_ADMIN")
}

#[test]
#[ignore = "needs root: network namespaces (cargo xtask test runs it as root)"]
fn setns_refused_falls_back_only_to_a_routable_listen_address() {
    assert_root("enginemetrics setns fallback");
    let ns = Netns::create("ttm", 214);
    let dir = tokentap_tests::scratch_dir("enginemetrics-static");
    std::fs::write(dir.join("metrics"), fixture("vllm-v1-metrics.prom")).expect("write");
    // Two different ports: were they the same (two ephemeral binds can
    // return one port), the routed server's port would have a loopback
    // listener in its namespace too, which the scraper rightly prefers —
    // and refuses without setns (the flake seen in a CI run).
    let lo_port = free_port();
    let routed_port = loop {
        let p = free_port();
        if p != lo_port {
            break p;
        }
    };
    let lo = serve_dir(&ns, "127.0.0.1", lo_port, &dir);
    let routed = serve_dir(&ns, &ns.ns_addr, routed_port, &dir);
    let (lo_pid, routed_pid) = (lo.0.id(), routed.0.id());

    // With the right to enter the namespace both are reached.
    let mut scraper = Scraper::new(Duration::from_secs(1), Marker::new());
    assert_eq!(
        scraper.scrape(lo_pid, lo_port, None).expect("lo via setns"),
        vllm_fixture_state()
    );
    assert_eq!(scraper.stats().namespace_failures, 0);

    // Without it: the loopback-only server cannot be reached (and is not
    // confused with whatever listens on the host's loopback); the one on
    // the veth address is scraped from the agent's namespace.
    let scraper = without_sys_admin(move || {
        let lo_res = scraper.scrape(lo_pid, lo_port, None);
        assert!(
            matches!(lo_res, Err(ScrapeError::Namespace(_))),
            "{lo_res:?}"
        );
        let routed_res = scraper.scrape(routed_pid, routed_port, None);
        assert_eq!(routed_res.expect("fallback"), vllm_fixture_state());
        scraper
    });
    let st = scraper.stats();
    assert_eq!((st.ok, st.namespace_failures), (2, 2), "{st:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
