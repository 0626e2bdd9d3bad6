//! End to end, as root: `tokentap run --otlp-endpoint` against the
//! simulated engine, with an OTLP/gRPC receiver in the test. The exported
//! histograms' counts and sums must equal what the request log implies,
//! with the GenAI semantic conventions' names and units.

use std::{
    net::TcpStream,
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use serde_json::Value;
use tokentap_tests::{
    assert_root, http, interrupt,
    otlp::{
        assert_exports_match_log, counter, exponential_histograms, gauge_points,
        start_http_receiver, start_https_receiver, start_receiver, start_tls_receiver,
        sum_point_attributes, TestCa,
    },
    read_jsonl, scratch_dir, start, start_simengine, RunAgent,
};

/// Sends one request with `body` and reads its whole response.
fn request(s: &mut TcpStream, body: &serde_json::Value) {
    let r = http::round_trip(s, "/v1/chat/completions", &body.to_string()).expect("round trip");
    assert!(r.complete);
}

fn one_request(s: &mut TcpStream, i: u64) {
    request(
        s,
        &serde_json::json!({"model": "sim", "stream": true, "stream_options": {"include_usage": true},
            "sim": {"id": i, "ttft_ms": 2, "gap_ms": 1, "tokens": 3}}),
    );
}

#[test]
#[ignore = "needs root: loads eBPF (cargo xtask test runs it as root)"]
fn a_collector_that_is_down_at_start_gets_the_metrics_once_it_is_up() {
    assert_root("OTLP collector down then up");
    let rt = tokentap_tests::otlp::runtime();
    // A free port with nothing listening on it (yet).
    let otlp_port = tokentap_tests::free_port();
    let (engine, port, _) = start_simengine(Path::new(env!("CARGO_BIN_EXE_simengine")), &[]);
    let (mut agent, out) = RunAgent::new()
        .pid(engine.0.id())
        .otlp(otlp_port)
        .arg("--exponential-histograms")
        .start();
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    for i in 0..5 {
        one_request(&mut s, i);
    }
    // Several export intervals against a dead collector.
    std::thread::sleep(Duration::from_millis(2500));
    assert!(
        agent.0.try_wait().unwrap().is_none(),
        "the agent must keep running without a collector"
    );
    let (sink, _) = start_receiver(&rt, otlp_port);
    for i in 5..10 {
        one_request(&mut s, i);
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let exports = sink.exports();
        if counter(&exports, "tokentap.requests") == Some(10)
            && counter(&exports, "tokentap.export.failures").unwrap_or(0) > 0
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "metrics did not arrive after the collector came up"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let expo = exponential_histograms(&sink.0.lock().unwrap());
    assert!(
        expo.iter()
            .any(|n| n == "gen_ai.server.time_to_first_token"),
        "--exponential-histograms exports base-2 exponential histograms: {expo:?}"
    );
    let (ok, lines) = interrupt(&mut agent, out);
    let stderr = lines.join("\n");
    assert!(ok, "tokentap run failed: {stderr}");
    drop(engine);
    assert!(
        stderr.contains("OTLP export to") && stderr.contains("failed"),
        "the failure is reported: {stderr}"
    );
    assert!(
        stderr.contains("works again"),
        "the recovery is reported: {stderr}"
    );
    // Reported once per interval, not per record: a handful of lines.
    let lines = stderr.lines().filter(|l| l.contains("failed")).count();
    assert!(
        lines <= 10,
        "{lines} failure lines for ~3 intervals: {stderr}"
    );
}

#[test]
#[ignore = "needs root: loads eBPF (cargo xtask test runs it as root)"]
fn exported_histograms_agree_with_the_request_log() {
    check_export("grpc", false);
}

#[test]
#[ignore = "needs root: loads eBPF (cargo xtask test runs it as root)"]
fn http_protobuf_export_agrees_with_the_request_log_too() {
    check_export("http/protobuf", false);
}

#[test]
#[ignore = "needs root: loads eBPF (cargo xtask test runs it as root)"]
fn grpc_export_to_an_https_collector_checks_its_certificate_against_the_ca_file() {
    check_export("grpc", true);
}

#[test]
#[ignore = "needs root: loads eBPF (cargo xtask test runs it as root)"]
fn http_protobuf_export_to_an_https_collector_checks_its_certificate_too() {
    check_export("http/protobuf", true);
}

/// `tls`: the collector serves a certificate signed by a CA of the test's
/// own; the agent is given that CA (`--otlp-ca-file`). First, without it,
/// the certificate must be refused: nothing arrives and the failure says
/// so.
fn check_export(protocol: &str, tls: bool) {
    assert_root("OTLP export");
    let rt = tokentap_tests::otlp::runtime();
    let ca = tls.then(TestCa::new);
    let (sink, otlp_port) = match (protocol, &ca) {
        ("grpc", None) => start_receiver(&rt, 0),
        ("grpc", Some(ca)) => {
            let (s, _, p) = start_tls_receiver(&rt, ca);
            (s, p)
        }
        (_, None) => start_http_receiver(0),
        (_, Some(ca)) => start_https_receiver(ca),
    };

    let dir = scratch_dir(&format!(
        "otlp-{}{}",
        protocol.replace('/', "-"),
        if tls { "-tls" } else { "" }
    ));
    let log = dir.join("requests.jsonl");
    let (engine, port, _) = start_simengine(Path::new(env!("CARGO_BIN_EXE_simengine")), &[]);
    let mut extra = vec![
        "--otlp-protocol".to_string(),
        protocol.to_string(),
        "--requests-log".to_string(),
        log.to_str().expect("scratch paths are UTF-8").to_string(),
    ];
    if let Some(ca) = &ca {
        let https = format!("https://127.0.0.1:{otlp_port}");
        // Without the CA: the collector's certificate is not trusted.
        let (mut agent, out) = RunAgent::new()
            .pid(engine.0.id())
            .otlp(otlp_port)
            .args(["--otlp-protocol", protocol, "--otlp-endpoint", &https])
            .start();
        std::thread::sleep(Duration::from_millis(2500));
        let (ok, lines) = interrupt(&mut agent, out);
        let stderr = lines.join("\n");
        assert!(ok, "{stderr}");
        assert!(
            sink.0.lock().unwrap().is_empty(),
            "an untrusted certificate was accepted"
        );
        assert!(
            stderr.contains(&format!("OTLP export to {https}"))
                && stderr.contains("failed (")
                && stderr.contains("UnknownIssuer"),
            "the failure is reported with its cause: {stderr}"
        );
        let ca_file = dir.join("ca.pem");
        std::fs::write(&ca_file, &ca.ca_pem).unwrap();
        extra.extend([
            "--otlp-endpoint".to_string(),
            https,
            "--otlp-ca-file".to_string(),
            ca_file.to_str().unwrap().to_string(),
        ]);
    }
    let (mut agent, out) = RunAgent::new()
        .pid(engine.0.id())
        .otlp(otlp_port)
        .args(&extra)
        .start();

    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    for i in 0..40u64 {
        let (stream, status) = match i % 8 {
            0 => (false, 200),
            1 => (true, 429),
            _ => (true, 200),
        };
        request(
            &mut s,
            &serde_json::json!({"model": "sim-otlp", "stream": stream, "stream_options": {"include_usage": i % 2 == 0},
                "sim": {"id": i, "status": status, "ttft_ms": 3 + i % 5, "gap_ms": 1, "tokens": 2 + i % 6}}),
        );
    }
    std::thread::sleep(Duration::from_millis(300));
    let (ok, lines) = interrupt(&mut agent, out);
    let stderr = lines.join("\n");
    assert!(ok, "tokentap run failed: {stderr}");
    drop(engine);

    let recs = read_jsonl(&log);
    assert_eq!(recs.len(), 40, "{stderr}");
    let exports = sink.exports();
    assert!(!exports.is_empty(), "no OTLP export arrived: {stderr}");
    assert_exports_match_log(&exports, &recs);
    let resource = &exports.last().unwrap().resource_metrics[0].resource;
    let service = resource
        .as_ref()
        .and_then(|r| r.attributes.iter().find(|a| a.key == "service.name"))
        .and_then(|a| a.value.as_ref())
        .map(|v| format!("{:?}", v.value));
    assert!(
        service.is_some_and(|s| s.contains("tokentap")),
        "service.name missing"
    );
    let errors: Vec<&Value> = recs
        .iter()
        .filter(|r| r["error_type"] == "http_429")
        .collect();
    assert_eq!(errors.len(), 5);
    // Attributes as DESIGN §4: failures carry error.type; every point the
    // operation, model, engine and port.
    let points = sum_point_attributes(&exports, "tokentap.requests");
    assert!(!points.is_empty());
    let has =
        |p: &Vec<(String, String)>, k: &str, v: &str| p.iter().any(|(pk, pv)| pk == k && pv == v);
    for p in &points {
        assert!(has(p, "gen_ai.operation.name", "chat"), "{p:?}");
        assert!(has(p, "gen_ai.request.model", "sim-otlp"), "{p:?}");
        assert!(p.iter().any(|(k, _)| k == "gen_ai.provider.name"), "{p:?}");
        assert!(has(p, "server.port", &port.to_string()), "{p:?}");
    }
    assert!(
        points.iter().any(|p| has(p, "error.type", "http_429")),
        "{points:?}"
    );
}

#[test]
#[ignore = "needs root: loads eBPF (cargo xtask test runs it as root)"]
fn the_engines_own_metrics_are_exported_and_the_agents_scrapes_are_not_requests() {
    assert_root("engine metrics");
    let rt = tokentap_tests::otlp::runtime();
    let (sink, otlp_port) = start_receiver(&rt, 0);
    let dir = scratch_dir("engine-metrics");
    let log = dir.join("requests.jsonl");
    // simengine answers GET /metrics in llama.cpp server's names, with
    // llamacpp:requests_processing = requests being answered now.
    let (engine, port, _) = start_simengine(Path::new(env!("CARGO_BIN_EXE_simengine")), &[]);
    let (mut agent, out) = RunAgent::new()
        .pid(engine.0.id())
        .otlp(otlp_port)
        .args(["--requests-log", log.to_str().expect("UTF-8 path")])
        .start();
    // One slow stream (60 tokens 50 ms apart: 3 s) spans several scrapes.
    let slow = std::thread::spawn(move || {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        request(
            &mut s,
            &serde_json::json!({"model": "sim-scraped", "stream": true,
                "sim": {"id": 1, "ttft_ms": 5, "gap_ms": 50, "tokens": 60}}),
        );
    });
    slow.join().unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let (ok, lines) = interrupt(&mut agent, out);
    let stderr = lines.join("\n");
    assert!(ok, "tokentap run failed: {stderr}");
    let exports = sink.exports();
    let running = gauge_points(&exports, "tokentap.engine.requests.running");
    assert!(
        running.iter().any(|(_, v)| *v == 1.0),
        "the scrape during the stream saw it running: {running:?}\n{stderr}"
    );
    assert!(
        running.iter().any(|(_, v)| *v == 0.0),
        "and idle after: {running:?}"
    );
    let (attrs, _) = &running[0];
    let get = |k: &str| attrs.iter().find(|(a, _)| a == k).map(|(_, v)| v.clone());
    assert_eq!(get("gen_ai.provider.name").as_deref(), Some("llama.cpp"));
    assert_eq!(get("tokentap.engine.pid"), Some(engine.0.id().to_string()));
    assert_eq!(get("server.port"), Some(port.to_string()));
    assert!(!gauge_points(&exports, "tokentap.engine.requests.waiting").is_empty());
    // The scrapes went through the captured engine's sockets, but only the
    // LLM request is a record.
    let recs = read_jsonl(&log);
    assert_eq!(recs.len(), 1, "{recs:?}");
    assert_eq!(recs[0]["path"], "/v1/chat/completions");
    let own = counter(&exports, "tokentap.self_requests").unwrap_or(0);
    assert!(own >= 2, "scrapes seen and dropped: {own}");
    assert_eq!(
        counter(&exports, "tokentap.engine.scrape.failures"),
        Some(0)
    );
}

#[test]
fn plain_http_export_needs_no_system_certificates_and_https_says_what_it_needs() {
    // A host (or image) without a CA bundle: rustls finds no system roots.
    let run = |endpoint: &str, extra: &[&str]| {
        let out = RunAgent::new()
            .pid(999_999_999)
            .no_gpu()
            // Probes on: the privilege check waits for the kernel's word,
            // so this runs as any user up to the made-up pid.
            .args(["--health-addr", "127.0.0.1:0"])
            .args([
                "--otlp-protocol",
                "http/protobuf",
                "--otlp-endpoint",
                endpoint,
            ])
            .args(extra)
            .env("SSL_CERT_FILE", "/dev/null")
            .env("SSL_CERT_DIR", "/nonexistent")
            .command()
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    // Past the exporter, stopped by the made-up pid.
    let err = run("http://127.0.0.1:9", &[]);
    assert!(err.contains("no process with pid"), "{err}");
    let err = run("https://127.0.0.1:9", &[]);
    assert!(
        err.contains("No CA certificates") && err.contains("--otlp-ca-file"),
        "{err}"
    );
    // With a CA file the system's roots are not needed.
    let dir = scratch_dir("otlp-no-roots");
    let ca = dir.join("ca.pem");
    std::fs::write(&ca, TestCa::new().ca_pem).unwrap();
    let err = run(
        "https://127.0.0.1:9",
        &["--otlp-ca-file", ca.to_str().unwrap()],
    );
    assert!(err.contains("no process with pid"), "{err}");
}

/// `host.name` on the resource of the newest export.
fn exported_host_name(
    exports: &[opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest],
) -> Option<String> {
    use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
    exports
        .iter()
        .rev()
        .flat_map(|e| &e.resource_metrics)
        .filter_map(|rm| rm.resource.as_ref())
        .flat_map(|r| &r.attributes)
        .find(|a| a.key == "host.name")
        .and_then(|a| match a.value.as_ref()?.value.as_ref()? {
            Any::StringValue(s) => Some(s.clone()),
            _ => None,
        })
}

#[test]
#[ignore = "needs root: loads eBPF and makes a UTS namespace (cargo xtask test runs it as root)"]
fn host_name_is_the_node_not_the_agents_own_uts_hostname() {
    assert_root("host.name in a UTS namespace");
    let rt = tokentap_tests::otlp::runtime();
    let node = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap()
        .trim()
        .to_string();
    let (engine, _, _) = start_simengine(Path::new(env!("CARGO_BIN_EXE_simengine")), &[]);
    // The agent as a DaemonSet pod runs it: a UTS namespace of its own whose
    // hostname is the pod's name; with NODE_NAME from the downward API, and
    // without it (then the host's name, read through pid 1's namespace).
    for node_env in [Some("node-from-downward-api"), None] {
        let (sink, otlp_port) = start_receiver(&rt, 0);
        let mut unshare = Command::new("unshare");
        unshare.args([
            "--uts",
            "sh",
            "-c",
            "hostname tokentap-pod-x7k2q && exec \"$@\"",
            "sh",
        ]);
        let mut run = RunAgent::exporting(engine.0.id(), otlp_port).env_remove("NODE_NAME");
        if let Some(n) = node_env {
            run = run.env("NODE_NAME", n);
        }
        let (mut agent, out) = start(
            &mut run.wrapped(unshare),
            "; ready",
            "tokentap run in a UTS namespace",
        );
        std::thread::sleep(Duration::from_millis(2500));
        let (ok, lines) = interrupt(&mut agent, out);
        assert!(ok, "{lines:?}");
        let exports = sink.exports();
        let got = exported_host_name(&exports);
        assert_eq!(
            got.as_deref(),
            Some(node_env.unwrap_or(&node)),
            "NODE_NAME {node_env:?}; the pod's hostname must not be host.name"
        );
    }
}

/// One run of the agent against a TLS collector that checks an
/// authorization header: `env` and `args` configure the export; returns the
/// receiver's sink and the agent's output.
fn export_to_guarded_collector(
    protocol: &str,
    mtls: bool,
    env: &[(&str, String)],
    args: &[&str],
) -> (tokentap_tests::otlp::Sink, String) {
    use tokentap_tests::otlp::{start_https_receiver_with, start_tls_receiver_with, Gate};
    let rt = tokentap_tests::otlp::runtime();
    let ca = CA.get_or_init(TestCa::new);
    let gate = Gate::requiring("Bearer s3cret-token");
    let (sink, port) = match protocol {
        "grpc" => start_tls_receiver_with(&rt, ca, gate, mtls),
        _ => start_https_receiver_with(ca, gate),
    };
    let (engine, eport, _) = start_simengine(Path::new(env!("CARGO_BIN_EXE_simengine")), &[]);
    let mut run = RunAgent::new()
        .pid(engine.0.id())
        .no_gpu()
        .args(["--export-interval", "1", "--no-engine-metrics"])
        .args(["--otlp-endpoint", &format!("https://127.0.0.1:{port}")])
        .args(["--otlp-protocol", protocol])
        .args(args);
    for (k, v) in env {
        run = run.env(k, v);
    }
    let (mut agent, out) = start(
        &mut run.command(),
        "; ready",
        "tokentap run to a TLS collector",
    );
    let mut s = TcpStream::connect(("127.0.0.1", eport)).unwrap();
    for i in 0..3 {
        one_request(&mut s, i);
    }
    std::thread::sleep(Duration::from_millis(2500));
    let (ok, lines) = interrupt(&mut agent, out);
    let stderr = lines.join("\n");
    assert!(ok, "{stderr}");
    drop(rt);
    (sink, stderr)
}

static CA: std::sync::OnceLock<TestCa> = std::sync::OnceLock::new();

/// The files a TLS export test gives the agent: the CA, and the client's
/// certificate and key.
fn tls_files() -> (String, String, String) {
    let ca = CA.get_or_init(TestCa::new);
    let dir = scratch_dir("otlp-guarded");
    let write = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p.to_str().unwrap().to_string()
    };
    (
        write("ca.pem", &ca.ca_pem),
        write("client.pem", &ca.client_cert_pem),
        write("client.key", &ca.client_key_pem),
    )
}

#[test]
#[ignore = "needs root: loads eBPF (cargo xtask test runs it as root)"]
fn tls_collectors_that_check_a_header_get_metrics_over_grpc_and_http_and_mutual_tls() {
    assert_root("OTLP to guarded TLS collectors");
    let (ca, client_cert, client_key) = tls_files();
    let std_env = |headers: &str| {
        vec![
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", ca.clone()),
            ("OTEL_EXPORTER_OTLP_HEADERS", headers.to_string()),
        ]
    };
    // gRPC and http/protobuf (gzip): the CA and the header from the
    // standard variables.
    for protocol in ["grpc", "http/protobuf"] {
        let mut env = std_env("authorization=Bearer%20s3cret-token,x-scope=team-a");
        env.push(("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip".into()));
        let (sink, stderr) = export_to_guarded_collector(protocol, false, &env, &[]);
        let exports = sink.exports();
        assert!(!exports.is_empty(), "{protocol}: nothing arrived: {stderr}");
        assert_eq!(sink.1.refused(), 0, "{protocol}: {stderr}");
        assert!(sink.1.gzipped() > 0, "{protocol}: not compressed");
        assert_eq!(counter(&exports, "tokentap.requests"), Some(3));
        assert!(
            !stderr.contains("s3cret"),
            "a header value was printed: {stderr}"
        );
        // A wrong token: refused, counted, said, never printed.
        let env = std_env("authorization=Bearer%20wr0ng-token");
        let (sink, stderr) = export_to_guarded_collector(protocol, false, &env, &[]);
        assert!(sink.0.lock().unwrap().is_empty(), "{protocol}");
        assert!(sink.1.refused() > 0, "{protocol}: {stderr}");
        assert!(
            stderr.contains("OTLP export to https://127.0.0.1:") && stderr.contains("failed"),
            "{stderr}"
        );
        assert!(
            !stderr.contains("wr0ng"),
            "a header value was printed: {stderr}"
        );
    }
    // Mutual TLS: without the client certificate the collector lets
    // nothing in; with it (and the header from the flag), it does.
    let (sink, stderr) = export_to_guarded_collector(
        "grpc",
        true,
        &std_env(""),
        &["--otlp-header", "authorization=Bearer%20s3cret-token"],
    );
    assert!(
        sink.0.lock().unwrap().is_empty(),
        "no client certificate, yet in: {stderr}"
    );
    let mut env = std_env("authorization=Bearer%20wr0ng-token");
    env.push(("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", client_cert.clone()));
    env.push(("OTEL_EXPORTER_OTLP_CLIENT_KEY", client_key.clone()));
    let (sink, stderr) = export_to_guarded_collector(
        "grpc",
        true,
        &env,
        &["--otlp-header", "authorization=Bearer%20s3cret-token"],
    );
    let exports = sink.exports();
    assert_eq!(counter(&exports, "tokentap.requests"), Some(3), "{stderr}");
    assert_eq!(
        sink.1.refused(),
        0,
        "the flag's header wins over the variable's"
    );
}

#[test]
fn export_settings_that_cannot_work_stop_the_agent_at_start_with_the_reason() {
    let run = |env: &[(&str, &str)], extra: &[&str]| {
        let mut run = RunAgent::new()
            .pid(999_999_999)
            .no_gpu()
            .args(["--health-addr", "127.0.0.1:0"])
            .args(["--otlp-endpoint", "https://127.0.0.1:9"])
            .args(extra);
        for (k, v) in env {
            run = run.env(k, v);
        }
        let out = run.command().output().unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    for (env, extra, says) in [
        (
            &[("OTEL_EXPORTER_OTLP_HEADERS", "authorization")][..],
            &[][..],
            "no '='",
        ),
        (
            &[],
            &["--otlp-header", "bad key=s3cret"],
            "not an HTTP header name",
        ),
        (
            &[("OTEL_EXPORTER_OTLP_CERTIFICATE", "/nonexistent/ca.pem")],
            &[],
            "cannot read it",
        ),
        (
            &[],
            &["--otlp-ca-file", "/etc/hostname"],
            "no PEM certificate",
        ),
        (
            &[("OTEL_EXPORTER_OTLP_METRICS_COMPRESSION", "lz4")],
            &[],
            "want gzip or none",
        ),
        (
            &[("OTEL_EXPORTER_OTLP_CLIENT_KEY", "/tmp/k.pem")],
            &[],
            "needs both",
        ),
    ] {
        let err = run(env, extra);
        assert!(err.contains(says), "{env:?} {extra:?}: {err}");
        assert!(
            !err.contains("no process with pid"),
            "refused only later: {err}"
        );
        assert!(!err.contains("s3cret"), "a value was printed: {err}");
    }
}
