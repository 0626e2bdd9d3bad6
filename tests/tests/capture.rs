//! Root integration tests of the kernel capture against real sockets: a
//! `sockpeer` server process moves known bytes through every read and
//! write syscall family while `tokentap capture` records it.

use std::{
    io::{Read, Write},
    net::TcpStream,
    os::unix::fs::PermissionsExt,
    path::Path,
    process::Command,
    time::Duration,
};

use serde_json::Value;
use tokentap_tests::{
    assert_root, exchange_script, http, payload, play_exchange_client, scratch_dir, tokentap_bin,
    Agent, Peer, READERS, WRITERS,
};

fn peer() -> Peer {
    Peer::spawn(Path::new(env!("CARGO_BIN_EXE_sockpeer")))
}

fn accepted_fd(reply: &str) -> i64 {
    reply
        .strip_prefix("accepted ")
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad accept reply {reply:?}"))
}

/// The client side of the `exchange` script.
fn client_exchange(p: &mut Peer, s: &mut TcpStream) {
    p.send("exchange");
    play_exchange_client(s);
    assert_eq!(p.line(Duration::from_secs(30)), "done");
}

fn of_type<'a>(evs: &'a [Value], t: &str) -> Vec<&'a Value> {
    evs.iter().filter(|e| e["type"] == t).collect()
}

fn data(evs: &[Value], fd: i64, dir: &str) -> Vec<Value> {
    evs.iter()
        .filter(|e| e["type"] == "data" && e["fd"] == fd && e["dir"] == dir)
        .cloned()
        .collect()
}

fn concat(evs: &[Value]) -> Vec<u8> {
    evs.iter().flat_map(payload).collect()
}

/// Which syscall (capture name) each byte range must have used.
fn check_syscalls(evs: &[Value], lens: &[usize], names: &[&str]) {
    let mut bounds = vec![];
    let mut at = 0;
    for (len, name) in lens.iter().zip(names) {
        bounds.push((at, at + len, *name));
        at += len;
    }
    let mut off = 0usize;
    for ev in evs {
        let n = payload(ev).len();
        if let Some((_, _, name)) = bounds.iter().find(|(s, e, _)| off >= *s && off < *e) {
            assert_eq!(
                ev["syscall"], *name,
                "bytes at offset {off} moved by the wrong syscall: {ev}"
            );
        }
        off += n;
    }
}

fn assert_monotonic_per_conn(evs: &[Value]) {
    let mut last = std::collections::HashMap::new();
    for e in evs {
        let key = (e["pid"].as_u64(), e["fd"].as_i64());
        let ts = e["ts_ns"].as_u64().expect("ts_ns");
        if let Some(prev) = last.insert(key, ts) {
            assert!(
                ts >= prev,
                "timestamps went backwards on {key:?}: {prev} then {ts}"
            );
        }
    }
}

#[test]
#[ignore = "needs root: loads eBPF (cargo xtask test runs it as root)"]
fn every_read_and_write_syscall_is_captured_in_order_and_nothing_else() {
    assert_root("capture exchange");
    // The default (auto) on every kernel tested: the BTF program.
    let cap = exchange(Command::new(tokentap_bin()), &[], "exchange");
    assert_ready_with(&cap, "data hooks btf; ready");
}

/// `--data-hooks fexit`: the same exact capture where the kernel allows
/// fexit programs; elsewhere the agent refuses to start and says why
/// (the kernel's own answer), never a silent fallback.
#[test]
#[ignore = "needs root: loads eBPF (cargo xtask test runs it as root)"]
fn the_fexit_data_hooks_capture_the_same_where_the_kernel_allows_them() {
    assert_root("capture exchange, fexit hooks");
    let dir = scratch_dir("fexit-probe");
    let a = peer();
    let out = Command::new(tokentap_bin())
        .args([
            "capture",
            "--pid",
            &a.pid.to_string(),
            "--data-hooks",
            "fexit",
        ])
        .args(["--duration", "1"])
        .arg("--out")
        .arg(dir.join("cap.jsonl"))
        .output()
        .unwrap();
    drop(a);
    let err = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        // The kernel matrix sets this in its VMs: Debian's kernels allow
        // fexit, so a refusal there is a defect, not a kernel's answer.
        assert!(
            std::env::var("TOKENTAP_EXPECT_FEXIT").as_deref() != Ok("1"),
            "fexit was expected to work on this kernel: {err}"
        );
        assert!(
            err.contains("--data-hooks fexit") && err.contains("fexit_"),
            "a refusal names the option and the program: {err}"
        );
        eprintln!("fexit data hooks: refused by this kernel");
        return;
    }
    let cap = exchange(
        Command::new(tokentap_bin()),
        &["--data-hooks", "fexit"],
        "exchange-fexit",
    );
    assert_ready_with(&cap, "data hooks fexit; ready");
    eprintln!("fexit data hooks: captured");
}

#[test]
#[ignore = "needs root: loads eBPF (cargo xtask test runs it as root)"]
fn the_syscall_tracepoint_data_hooks_capture_the_same() {
    assert_root("capture exchange, tracepoint hooks");
    let cap = exchange(
        Command::new(tokentap_bin()),
        &["--data-hooks", "tracepoint"],
        "exchange-tp",
    );
    assert_ready_with(&cap, "data hooks tracepoint; ready");
}

/// A kernel without BTF (here: /sys/kernel/btf/vmlinux hidden in the
/// agent's own mount namespace): `auto` falls back to the syscall
/// tracepoints, says why, and captures the same; `btf` refuses to start.
#[test]
#[ignore = "needs root: loads eBPF (cargo xtask test runs it as root)"]
fn without_kernel_btf_auto_falls_back_to_syscall_tracepoints_and_btf_refuses() {
    assert_root("capture exchange without BTF");
    let cap = exchange(without_btf(), &[], "exchange-nobtf");
    assert_ready_with(&cap, "data hooks tracepoint; ready");
    assert!(
        cap.stderr.iter().any(|l| l.contains(
            "socket data through syscall tracepoints (the faster BTF tracepoint is not available: no kernel BTF"
        )),
        "the fallback must say why: {:?}",
        cap.stderr
    );

    let dir = scratch_dir("nobtf-refused");
    let a = peer();
    let out = without_btf()
        .args([
            "capture",
            "--pid",
            &a.pid.to_string(),
            "--data-hooks",
            "btf",
        ])
        .arg("--out")
        .arg(dir.join("cap.jsonl"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "--data-hooks btf without BTF must fail"
    );
    assert!(
        err.contains("--data-hooks btf") && err.contains("no kernel BTF"),
        "{err}"
    );
}

/// The tokentap binary run in a private mount namespace where the
/// kernel's BTF file reads as empty.
fn without_btf() -> Command {
    let mut c = Command::new("unshare");
    c.args([
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        "mount --bind /dev/null /sys/kernel/btf/vmlinux && exec \"$0\" \"$@\"",
    ])
    .arg(tokentap_bin());
    c
}

fn assert_ready_with(cap: &tokentap_tests::Captured, want: &str) {
    assert!(
        cap.stderr.iter().any(|l| l.ends_with(want)),
        "no line ending with {want:?}: {:?}",
        cap.stderr
    );
}

/// Every read and write syscall family through a targeted peer (one
/// connection, the exchange script, a 256 KiB body in one read), the same
/// through an untargeted one; asserts the capture is exact and complete.
fn exchange(cmd: Command, extra: &[&str], name: &str) -> tokentap_tests::Captured {
    let dir = scratch_dir(name);
    let cap_path = dir.join("cap.jsonl");
    let mut a = peer();
    let mut b = peer();
    let pid = a.pid.to_string();
    let mut args = vec!["--pid", pid.as_str()];
    args.extend_from_slice(extra);
    let agent = Agent::capture_via(cmd, &args, &cap_path);

    let mut ca = TcpStream::connect(("127.0.0.1", a.port)).unwrap();
    let fd = accepted_fd(&a.cmd("accept"));
    client_exchange(&mut a, &mut ca);
    assert_eq!(a.cmd("noise"), "done");

    let body: Vec<u8> = (0..256 * 1024).map(|i| (i * 31 % 251) as u8).collect();
    a.send(&format!("big {}", body.len()));
    ca.write_all(&body).unwrap();
    let mut ok = [0u8; 2];
    ca.read_exact(&mut ok).unwrap();
    assert_eq!(
        a.line(Duration::from_secs(30)),
        format!("done {}", body.len())
    );

    // The same traffic from a process that is not targeted.
    let mut cb = TcpStream::connect(("127.0.0.1", b.port)).unwrap();
    b.cmd("accept");
    client_exchange(&mut b, &mut cb);
    assert_eq!(b.cmd("noise"), "done");

    assert_eq!(a.cmd("close"), "done");
    std::thread::sleep(Duration::from_millis(200));
    let cap = agent.stop();
    assert!(cap.exit_ok, "agent failed: {:?}", cap.stderr);
    let evs = &cap.events;

    for e in evs {
        assert_eq!(
            e["pid"].as_u64(),
            Some(a.pid as u64),
            "captured another process: {e}"
        );
    }
    let opens = of_type(evs, "open");
    assert_eq!(
        opens.len(),
        1,
        "exactly the one TCP connection is tracked: {opens:?}"
    );
    let open = opens[0];
    assert_eq!(open["fd"], fd);
    assert_eq!(open["role"], "server");
    assert_eq!(open["peer"], ca.local_addr().unwrap().to_string());
    assert_eq!(open["local"], format!("127.0.0.1:{}", a.port));
    for e in of_type(evs, "data") {
        assert_eq!(
            e["fd"], fd,
            "data on an fd that is not the TCP connection: {e}"
        );
    }

    let script = exchange_script();
    let ins = data(evs, fd, "in");
    let outs = data(evs, fd, "out");
    let mut want_in: Vec<u8> = script.iter().flat_map(|s| s.req.clone()).collect();
    want_in.extend_from_slice(&body);
    let mut want_out: Vec<u8> = script.iter().flat_map(|s| s.resp.clone()).collect();
    want_out.extend_from_slice(b"ok");
    assert_eq!(concat(&ins).len(), want_in.len());
    assert!(concat(&ins) == want_in, "inbound bytes differ");
    assert!(concat(&outs) == want_out, "outbound bytes differ");
    for e in ins.iter().chain(outs.iter()) {
        assert_eq!(
            e["ret"].as_u64(),
            Some(payload(e).len() as u64),
            "short capture: {e}"
        );
    }

    let lens: Vec<usize> = script.iter().map(|s| s.req.len()).collect();
    let names: Vec<&str> = READERS.iter().map(|r| r.1).collect();
    check_syscalls(&ins, &lens, &names);
    let lens: Vec<usize> = script.iter().map(|s| s.resp.len()).collect();
    let names: Vec<&str> = WRITERS.iter().map(|w| w.1).collect();
    check_syscalls(&outs, &lens, &names);
    for (_, name) in READERS.iter().chain(WRITERS.iter()) {
        assert!(
            evs.iter().any(|e| e["syscall"] == *name),
            "no event from {name}"
        );
    }

    // The 256 KiB body came in one MSG_WAITALL call: many records, one event.
    let biggest = ins.iter().map(|e| payload(e).len()).max().unwrap_or(0);
    assert_eq!(
        biggest,
        body.len(),
        "the 256 KiB read was not reassembled whole"
    );

    let closes = of_type(evs, "close");
    assert_eq!(closes.len(), 1);
    assert_eq!(closes[0]["fd"], fd);
    assert_eq!(evs.last().unwrap()["type"], "close");
    assert_monotonic_per_conn(evs);
    assert_eq!(cap.stats["records_dropped"], 0, "{:?}", cap.stats);
    assert_eq!(cap.stats["reassembly_gaps"], 0, "{:?}", cap.stats);
    assert!(
        cap.stats["conns_untracked"].as_u64() >= Some(1),
        "the NULL-address unix accept must be untracked: {:?}",
        cap.stats
    );

    let mode = std::fs::metadata(&cap_path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "capture files hold prompts: mode must be 0600");

    // capture → replay round trip.
    let replayed = dir.join("replayed.jsonl");
    let st = Command::new(tokentap_bin())
        .arg("replay")
        .arg(&cap_path)
        .arg("--events")
        .arg(&replayed)
        .status()
        .unwrap();
    assert!(st.success());
    assert_eq!(&tokentap_tests::read_jsonl(&replayed), evs);
    cap
}

#[test]
#[ignore = "needs root: loads eBPF (cargo xtask test runs it as root)"]
fn connections_open_before_start_and_null_address_accepts_are_captured_by_port() {
    assert_root("capture preexisting");
    let dir = scratch_dir("preexisting");
    let mut a = peer();
    let mut early = TcpStream::connect(("127.0.0.1", a.port)).unwrap();
    let early_fd = accepted_fd(&a.cmd("accept"));

    // --port alone selects the process listening there.
    let agent = Agent::capture(&["--port", &a.port.to_string()], &dir.join("cap.jsonl"));
    client_exchange(&mut a, &mut early);

    let mut late = TcpStream::connect(("127.0.0.1", a.port)).unwrap();
    let late_fd = accepted_fd(&a.cmd("accept-null"));
    client_exchange(&mut a, &mut late);
    std::thread::sleep(Duration::from_millis(200));
    let cap = agent.stop();
    let evs = &cap.events;

    let opens = of_type(evs, "open");
    assert_eq!(opens.len(), 2, "{opens:?}");
    for (o, fd, client) in [(opens[0], early_fd, &early), (opens[1], late_fd, &late)] {
        assert_eq!(o["fd"], fd);
        assert_eq!(o["role"], "server");
        assert_eq!(o["local"], format!("127.0.0.1:{}", a.port));
        assert_eq!(o["peer"], client.local_addr().unwrap().to_string());
    }
    let want: Vec<u8> = exchange_script()
        .iter()
        .flat_map(|s| s.req.clone())
        .collect();
    assert!(concat(&data(evs, early_fd, "in")) == want);
    assert!(concat(&data(evs, late_fd, "in")) == want);
}

#[test]
#[ignore = "needs root: loads eBPF (cargo xtask test runs it as root)"]
fn a_tiny_ring_buffer_counts_drops_instead_of_hanging() {
    assert_root("capture tiny ring");
    let dir = scratch_dir("tiny-ring");
    let mut a = peer();
    let agent = Agent::capture(
        &["--pid", &a.pid.to_string(), "--ring-buffer-bytes", "4096"],
        &dir.join("cap.jsonl"),
    );
    let mut c = TcpStream::connect(("127.0.0.1", a.port)).unwrap();
    a.cmd("accept");
    let n = 20_000usize;
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0u8; 1 << 16];
        let mut got = 0usize;
        while got < n * 300 {
            match c.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(k) => got += k,
            }
        }
        got
    });
    assert_eq!(a.cmd(&format!("flood {n} 300")), format!("done {n} 0"));
    assert_eq!(reader.join().unwrap(), n * 300);
    let cap = agent.stop();
    assert!(cap.exit_ok);
    let dropped = cap.stats["records_dropped"].as_u64().unwrap();
    let sent = cap.stats["records_sent"].as_u64().unwrap();
    assert!(
        dropped > 0,
        "a 4 KiB ring must overflow under {n} writes: {:?}",
        cap.stats
    );
    assert!(sent + dropped >= n as u64, "{:?}", cap.stats);
    let events = of_type(&cap.events, "data").len() as u64;
    assert!(events <= sent, "more events than records sent");
    // The kernel reported the condition through aya-log (at most once a
    // second), and the agent said it once (its own limit: once a minute
    // per text), never once per dropped record.
    let reports = cap.stats["kernel_reports"].as_u64().unwrap();
    assert!(
        reports >= 1 && reports < dropped,
        "kernel reports {reports} for {dropped} drops"
    );
    let said: Vec<&String> = cap
        .stderr
        .iter()
        .filter(|l| l.contains("kernel: ring buffer full: a record was dropped"))
        .collect();
    assert_eq!(said.len(), 1, "said once: {said:?}\n{:?}", cap.stderr);
    assert!(said[0].contains(&format!("(pid {})", a.pid)), "{}", said[0]);
}

#[test]
#[ignore = "needs root: loads eBPF (cargo xtask test runs it as root)"]
fn a_client_that_disconnects_mid_stream_shows_the_negative_return_value() {
    assert_root("capture disconnect");
    let dir = scratch_dir("disconnect");
    let mut a = peer();
    let agent = Agent::capture(&["--pid", &a.pid.to_string()], &dir.join("cap.jsonl"));
    let mut c = TcpStream::connect(("127.0.0.1", a.port)).unwrap();
    let fd = accepted_fd(&a.cmd("accept"));
    a.send("stream 2");
    let mut buf = [0u8; 2048];
    let mut got = 0;
    while got < 1500 {
        got += c.read(&mut buf).unwrap();
    }
    // Abortive close: RST, so the server's next write fails.
    http::abort(c);
    let reply = a.line(Duration::from_secs(30));
    let errno: i64 = reply.strip_prefix("done ").unwrap().parse().unwrap();
    assert!(errno == 32 || errno == 104, "unexpected errno {errno}");
    std::thread::sleep(Duration::from_millis(100));
    let cap = agent.stop();
    let outs = data(&cap.events, fd, "out");
    let last = outs.last().unwrap_or_else(|| {
        panic!(
            "no stream writes captured: stats {:?}, events {:?}, stderr {:?}",
            cap.stats, cap.events, cap.stderr
        )
    });
    assert_eq!(last["ret"].as_i64(), Some(-errno), "{last}");
    assert!(payload(last).is_empty());
    assert!(outs.len() >= 5);
}

#[test]
fn capture_without_targets_explains_what_to_give() {
    let out = Command::new(tokentap_bin())
        .args(["capture", "--out", "/dev/null"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--pid") && err.contains("--port"), "{err}");
}

#[test]
#[ignore = "needs root: loads eBPF (cargo xtask test runs it as root)"]
fn a_captured_sse_stream_replays_into_a_request_record_matching_the_servers_clock() {
    assert_root("capture to request record");
    let dir = scratch_dir("sse-record");
    let cap_path = dir.join("cap.jsonl");
    let mut a = peer();
    let agent = Agent::capture(&["--pid", &a.pid.to_string()], &cap_path);
    let mut c = TcpStream::connect(("127.0.0.1", a.port)).unwrap();
    a.cmd("accept");
    let n = 8;
    a.send(&format!("serve-sse {n} 15"));
    let body = r#"{"model":"sim","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hello"}]}"#;
    let resp = http::round_trip(&mut c, "/v1/chat/completions", body).expect("SSE response");
    assert!(resp.complete);
    let reply = a.line(Duration::from_secs(30));
    let truth: Value = serde_json::from_str(reply.strip_prefix("done ").unwrap()).unwrap();
    a.cmd("close");
    std::thread::sleep(Duration::from_millis(100));
    let cap = agent.stop();
    assert!(cap.exit_ok);

    let log = dir.join("requests.jsonl");
    let st = Command::new(tokentap_bin())
        .arg("replay")
        .arg(&cap_path)
        .arg("--requests-log")
        .arg(&log)
        .status()
        .unwrap();
    assert!(st.success());
    let recs = tokentap_tests::read_jsonl(&log);
    assert_eq!(recs.len(), 1, "{recs:?}");
    let r = &recs[0];
    let br = |v: &Value| {
        (
            v[0].as_u64().unwrap() as f64 / 1e9,
            v[1].as_u64().unwrap() as f64 / 1e9,
        )
    };
    let (read_lo, read_hi) = br(&truth["read"]);
    let writes: Vec<(f64, f64)> = truth["writes"].as_array().unwrap().iter().map(br).collect();
    let (f_lo, f_hi) = writes[0];
    let (l_lo, l_hi) = writes[n - 1];
    let ttft = r["ttft_s"].as_f64().unwrap();
    let tpot = r["tpot_s"].as_f64().unwrap();
    let k = (n - 1) as f64;
    // The kernel's timestamps lie inside the server's clock brackets (its
    // clock just before and just after each call), so the agent's numbers
    // lie inside the derived intervals; 200 µs covers clock conversion.
    let slack = 200e-6;
    eprintln!(
        "ttft agent {ttft:.6} s, server bracket [{:.6}, {:.6}]; tpot agent {tpot:.6} s, server bracket [{:.6}, {:.6}]",
        f_lo - read_hi,
        f_hi - read_lo,
        (l_lo - f_hi) / k,
        (l_hi - f_lo) / k
    );
    assert!(
        ttft >= f_lo - read_hi - slack && ttft <= f_hi - read_lo + slack,
        "ttft {ttft} outside the server's bracket"
    );
    assert!(
        tpot >= (l_lo - f_hi) / k - slack && tpot <= (l_hi - f_lo) / k + slack,
        "tpot {tpot} outside the server's bracket"
    );
    assert_eq!(r["chunks"], n as u64);
    assert_eq!(r["output_tokens"], n as u64);
    assert_eq!(r["input_tokens"], 7);
    assert_eq!(r["tokens_exact"], true);
    assert_eq!(r["status"], 200);
    assert_eq!(r["request_model"], "sim");
    assert_eq!(r["response_model"], "sim");
    assert_eq!(r["server_port"], a.port);
    assert_eq!(r["client"], c.local_addr().unwrap().to_string());
    assert_eq!(r["error_type"], Value::Null);
}

/// A connection's records come from whichever CPU its thread runs on: a
/// connection whose writes hop from CPU to CPU and whose close comes from
/// another CPU than its last write must still read as open, every write in
/// order, close — no write lost, none after its close. (Guards the capture
/// path against per-CPU staging of records: a trial of per-CPU batches
/// failed exactly this until userspace re-sorted records by timestamp; see
/// docs/benchmarks.md.)
#[test]
#[ignore = "needs root: loads eBPF (cargo xtask test runs it as root)"]
fn writes_from_every_cpu_come_before_a_close_from_another_cpu() {
    assert_root("capture across CPUs");
    let dir = scratch_dir("cpu-hop");
    let cap_path = dir.join("cap.jsonl");
    let mut a = peer();
    let pid = a.pid.to_string();
    let agent = Agent::capture_via(Command::new(tokentap_bin()), &["--pid", &pid], &cap_path);
    const CONNS: usize = 30;
    const WRITES: usize = 9;
    for _ in 0..CONNS {
        let mut c = TcpStream::connect(("127.0.0.1", a.port)).unwrap();
        accepted_fd(&a.cmd("accept"));
        a.send(&format!("hop {WRITES}"));
        let mut got = Vec::new();
        c.read_to_end(&mut got).unwrap();
        assert_eq!(got.len(), WRITES * 100);
        // "done ALLOWED USED CLOSE_ELSEWHERE": with two CPUs or more, the
        // writes must really have hopped and the close come from another
        // CPU, or this test proves nothing.
        let reply = a.line(Duration::from_secs(30));
        let n: Vec<usize> = reply
            .split_whitespace()
            .skip(1)
            .map(|w| w.parse().expect("number"))
            .collect();
        assert_eq!(n.len(), 3, "bad hop reply {reply:?}");
        if n[0] >= 2 {
            assert!(
                n[1] >= 2 && n[2] == 1,
                "the writes did not hop CPUs: {reply:?}"
            );
        } else {
            eprintln!("one CPU allowed: nothing hops here ({reply:?})");
        }
    }
    std::thread::sleep(Duration::from_millis(200));
    let cap = agent.stop();
    assert!(cap.exit_ok, "agent failed: {:?}", cap.stderr);
    assert_ready_with(&cap, "data hooks btf; ready");

    // Walk the events in the order the agent handled them.
    let mut open: std::collections::HashMap<i64, Vec<String>> = Default::default();
    let mut closed = Vec::new();
    for e in &cap.events {
        let fd = e["fd"].as_i64().unwrap_or(-1);
        match e["type"].as_str() {
            Some("open") => {
                assert!(open.insert(fd, vec![]).is_none(), "open of an open fd: {e}");
            }
            Some("data") => {
                let msgs = open
                    .get_mut(&fd)
                    .unwrap_or_else(|| panic!("data on fd {fd} after its close: {e}"));
                let text = String::from_utf8(payload(e)).unwrap();
                msgs.push(text.trim_end().to_string());
            }
            Some("close") => {
                let msgs = open
                    .remove(&fd)
                    .unwrap_or_else(|| panic!("close of fd {fd} that is not open: {e}"));
                closed.push(msgs);
            }
            _ => {}
        }
    }
    assert_eq!(closed.len(), CONNS, "every connection opened and closed");
    let want: Vec<String> = (0..WRITES).map(|i| format!("hop {i}")).collect();
    for (i, msgs) in closed.iter().enumerate() {
        assert_eq!(
            msgs, &want,
            "connection {i}: every write, in order, before the close"
        );
    }
}

#[test]
#[ignore = "needs root: switches to an unprivileged user with setpriv (cargo xtask test runs it as root)"]
fn without_privileges_the_errors_say_what_is_missing_and_no_capture_file_is_left() {
    assert_root("unprivileged diagnostics");
    // An unprivileged user (nobody) runs a copy of the binary it can reach,
    // writing into a directory it may write.
    let dir = scratch_dir("unprivileged");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let bin = dir.join("tokentap");
    std::fs::copy(tokentap_bin(), &bin).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    // A listener of root's: nobody cannot read its sockets.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port().to_string();
    let as_nobody = |args: &[&str]| {
        let out = Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(&bin)
            .args(args)
            .current_dir(&dir)
            .output()
            .expect("setpriv (util-linux)");
        assert!(!out.status.success(), "{args:?} succeeded unprivileged");
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    let cap_file = dir.join("cap.jsonl");
    let cap_arg = cap_file.to_str().unwrap();
    let pid = std::process::id().to_string();
    // capture by port and by pid, run: at once, the missing privileges
    // named, first (no NVML, install-key or tracefs notice before it).
    for args in [
        &[
            "capture",
            "--port",
            &port,
            "--out",
            cap_arg,
            "--duration",
            "1",
        ][..],
        &[
            "capture",
            "--pid",
            &pid,
            "--out",
            cap_arg,
            "--duration",
            "1",
        ],
        &["run", "--port", &port, "--no-console"],
        &[
            "run",
            "--pid",
            &pid,
            "--no-console",
            "--otlp-endpoint",
            "http://127.0.0.1:9",
        ],
    ] {
        let t = std::time::Instant::now();
        let err = as_nobody(args);
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "{args:?}: not at once"
        );
        let first = err.lines().next().unwrap_or_default();
        assert!(
            first.starts_with("tokentap: error: missing privileges: this process lacks CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE, CAP_DAC_READ_SEARCH")
                && first.contains("docs/deploy.md"),
            "{args:?}: {err}"
        );
        assert_eq!(err.trim_end().lines().count(), 1, "that line alone: {err}");
        assert!(!cap_file.exists(), "a failed capture leaves no file");
    }
    drop(listener);
}
