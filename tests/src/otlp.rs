//! A tiny OTLP/gRPC metrics receiver for tests, and readers for what it
//! received.

use std::sync::{Arc, Mutex};

use serde_json::Value;

use crate::http;

use opentelemetry_proto::tonic::{
    collector::logs::v1::{
        logs_service_server::{LogsService, LogsServiceServer},
        ExportLogsServiceRequest, ExportLogsServiceResponse,
    },
    collector::metrics::v1::{
        metrics_service_server::{MetricsService, MetricsServiceServer},
        ExportMetricsServiceRequest, ExportMetricsServiceResponse,
    },
    collector::trace::v1::{
        trace_service_server::{TraceService, TraceServiceServer},
        ExportTraceServiceRequest, ExportTraceServiceResponse,
    },
    metrics::v1::{metric::Data, number_data_point::Value as Num, Metric},
};

/// Metric exports received, and what the receiver checks of each.
#[derive(Clone, Default)]
pub struct Sink(pub Arc<Mutex<Vec<ExportMetricsServiceRequest>>>, pub Gate);

impl Sink {
    /// Every export received so far.
    pub fn exports(&self) -> Vec<ExportMetricsServiceRequest> {
        self.0.lock().unwrap().clone()
    }
}

/// What a receiver demands: an `authorization` header of this value
/// (exports without it are refused: 401 / UNAUTHENTICATED, and counted).
/// It also counts gzip-compressed exports.
#[derive(Clone, Default)]
pub struct Gate {
    pub authorization: Option<String>,
    pub refused: Arc<std::sync::atomic::AtomicU64>,
    pub gzipped: Arc<std::sync::atomic::AtomicU64>,
}

impl Gate {
    pub fn requiring(authorization: &str) -> Gate {
        Gate {
            authorization: Some(authorization.to_string()),
            ..Gate::default()
        }
    }

    /// Whether an export carrying `got` as its authorization passes.
    fn admits(&self, got: Option<&str>) -> bool {
        let ok = match &self.authorization {
            None => true,
            Some(want) => got.is_some_and(|g| g.eq_ignore_ascii_case(want)),
        };
        if !ok {
            self.refused
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        ok
    }

    pub fn refused(&self) -> u64 {
        self.refused.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn gzipped(&self) -> u64 {
        self.gzipped.load(std::sync::atomic::Ordering::Relaxed)
    }
}

#[tonic::async_trait]
impl MetricsService for Sink {
    async fn export(
        &self,
        req: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        let auth = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        if !self.1.admits(auth) {
            return Err(tonic::Status::unauthenticated("wrong or no authorization"));
        }
        if req
            .metadata()
            .get("grpc-encoding")
            .is_some_and(|v| v == "gzip")
        {
            self.1
                .gzipped
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        self.0.lock().unwrap().push(req.into_inner());
        Ok(tonic::Response::new(ExportMetricsServiceResponse::default()))
    }
}

/// Serves OTLP/gRPC metrics on 127.0.0.1:`port` on `rt` (0: any free
/// port, bound at once so nothing can take it first); returns the port.
pub fn start_receiver(rt: &tokio::runtime::Runtime, port: u16) -> (Sink, u16) {
    let (sink, _, port) = start_receiver_with_logs(rt, port);
    (sink, port)
}

/// A received log record: event name, body text, attributes (key, value
/// as text).
pub type LogRecord = (String, String, Vec<(String, String)>);

/// OTLP/gRPC log records received (timeline events).
#[derive(Clone, Default)]
pub struct LogSink(pub Arc<Mutex<Vec<ExportLogsServiceRequest>>>);

#[tonic::async_trait]
impl LogsService for LogSink {
    async fn export(
        &self,
        req: tonic::Request<ExportLogsServiceRequest>,
    ) -> Result<tonic::Response<ExportLogsServiceResponse>, tonic::Status> {
        self.0.lock().unwrap().push(req.into_inner());
        Ok(tonic::Response::new(ExportLogsServiceResponse::default()))
    }
}

impl LogSink {
    /// Every log record received: (event name, body text, attributes as
    /// key → value text).
    pub fn records(&self) -> Vec<LogRecord> {
        use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
        let text = |v: Option<&Any>| match v {
            Some(Any::StringValue(s)) => s.clone(),
            Some(Any::IntValue(i)) => i.to_string(),
            Some(Any::BoolValue(b)) => b.to_string(),
            Some(Any::DoubleValue(d)) => d.to_string(),
            other => format!("{other:?}"),
        };
        let mut out = vec![];
        for e in self.0.lock().unwrap().iter() {
            for rl in &e.resource_logs {
                for sl in &rl.scope_logs {
                    for r in &sl.log_records {
                        out.push((
                            r.event_name.clone(),
                            text(r.body.as_ref().and_then(|b| b.value.as_ref())),
                            r.attributes
                                .iter()
                                .map(|kv| {
                                    (
                                        kv.key.clone(),
                                        text(kv.value.as_ref().and_then(|v| v.value.as_ref())),
                                    )
                                })
                                .collect(),
                        ));
                    }
                }
            }
        }
        out
    }
}

/// Like [`start_receiver`], also receiving OTLP logs.
pub fn start_receiver_with_logs(rt: &tokio::runtime::Runtime, port: u16) -> (Sink, LogSink, u16) {
    start_grpc(rt, port, None, Gate::default(), false)
}

/// OTLP/gRPC spans received (every receiver takes them; this one keeps
/// them).
#[derive(Clone, Default)]
pub struct TraceSink(pub Arc<Mutex<Vec<ExportTraceServiceRequest>>>);

#[tonic::async_trait]
impl TraceService for TraceSink {
    async fn export(
        &self,
        req: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.0.lock().unwrap().push(req.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

impl TraceSink {
    /// Every span received.
    pub fn spans(&self) -> Vec<opentelemetry_proto::tonic::trace::v1::Span> {
        let mut out = vec![];
        for e in self.0.lock().unwrap().iter() {
            for rs in &e.resource_spans {
                for ss in &rs.scope_spans {
                    out.extend(ss.spans.iter().cloned());
                }
            }
        }
        out
    }
}

/// Like [`start_receiver_with_logs`], also keeping the spans.
pub fn start_receiver_with_traces(
    rt: &tokio::runtime::Runtime,
    port: u16,
) -> (Sink, LogSink, TraceSink, u16) {
    start_grpc_all(rt, port, None, Gate::default(), false)
}

/// A test certificate authority and a server certificate it signed for
/// `127.0.0.1` (and `localhost`): what a collector behind TLS with a
/// cluster's own CA looks like.
pub struct TestCa {
    /// The CA's certificate (what `--otlp-ca-file` is given).
    pub ca_pem: String,
    pub cert_pem: String,
    pub cert_der: Vec<u8>,
    pub key_pem: String,
    pub key_der: Vec<u8>,
    /// A client certificate the CA signed, and its key (mutual TLS).
    pub client_cert_pem: String,
    pub client_key_pem: String,
}

impl TestCa {
    pub fn new() -> Self {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "tokentap test CA");
        let ca_key = KeyPair::generate().unwrap();
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca, ca_key);
        let mut leaf =
            CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
        leaf.distinguished_name
            .push(DnType::CommonName, "collector");
        let key = KeyPair::generate().unwrap();
        let cert = leaf.signed_by(&key, &issuer).unwrap();
        let mut client = CertificateParams::new(vec!["tokentap-agent".to_string()]).unwrap();
        client
            .distinguished_name
            .push(DnType::CommonName, "tokentap agent");
        let client_key = KeyPair::generate().unwrap();
        let client_cert = client.signed_by(&client_key, &issuer).unwrap();
        TestCa {
            client_cert_pem: client_cert.pem(),
            client_key_pem: client_key.serialize_pem(),
            ca_pem: ca_cert.pem(),
            cert_pem: cert.pem(),
            cert_der: cert.der().to_vec(),
            key_pem: key.serialize_pem(),
            key_der: key.serialize_der(),
        }
    }
}

impl Default for TestCa {
    fn default() -> Self {
        Self::new()
    }
}

/// Serves OTLP/gRPC metrics and logs over TLS (the certificate `ca`
/// signed) on 127.0.0.1, any free port.
pub fn start_tls_receiver(rt: &tokio::runtime::Runtime, ca: &TestCa) -> (Sink, LogSink, u16) {
    start_grpc(rt, 0, Some(ca), Gate::default(), false)
}

/// [`start_tls_receiver`] with a `gate` (a required authorization), and
/// with `mtls`: only clients with a certificate the CA signed get in.
pub fn start_tls_receiver_with(
    rt: &tokio::runtime::Runtime,
    ca: &TestCa,
    gate: Gate,
    mtls: bool,
) -> (Sink, u16) {
    let (s, _, p) = start_grpc(rt, 0, Some(ca), gate, mtls);
    (s, p)
}

fn start_grpc(
    rt: &tokio::runtime::Runtime,
    port: u16,
    tls: Option<&TestCa>,
    gate: Gate,
    mtls: bool,
) -> (Sink, LogSink, u16) {
    let (sink, logs, _, port) = start_grpc_all(rt, port, tls, gate, mtls);
    (sink, logs, port)
}

fn start_grpc_all(
    rt: &tokio::runtime::Runtime,
    port: u16,
    tls: Option<&TestCa>,
    gate: Gate,
    mtls: bool,
) -> (Sink, LogSink, TraceSink, u16) {
    let sink = Sink(Arc::default(), gate);
    let logs = LogSink::default();
    let traces = TraceSink::default();
    let tsvc = traces.clone();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind(("127.0.0.1", port)))
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    let svc = sink.clone();
    let lsvc = logs.clone();
    let mut server = tonic::transport::Server::builder();
    if let Some(ca) = tls {
        let mut c = tonic::transport::ServerTlsConfig::new().identity(
            tonic::transport::Identity::from_pem(&ca.cert_pem, &ca.key_pem),
        );
        if mtls {
            c = c.client_ca_root(tonic::transport::Certificate::from_pem(&ca.ca_pem));
        }
        server = server.tls_config(c).expect("server TLS");
    }
    rt.spawn(async move {
        server
            .add_service(
                MetricsServiceServer::new(svc)
                    .accept_compressed(tonic::codec::CompressionEncoding::Gzip),
            )
            .add_service(LogsServiceServer::new(lsvc))
            .add_service(TraceServiceServer::new(tsvc))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
            .await
    });
    (sink, logs, traces, port)
}

/// Data-point counts of histogram `name` in the last export that has it,
/// summed per value of attribute `attr`.
pub fn histogram_counts_by(
    exports: &[ExportMetricsServiceRequest],
    name: &str,
    attr: &str,
) -> std::collections::BTreeMap<String, u64> {
    use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
    let mut out = std::collections::BTreeMap::new();
    for e in exports.iter().rev() {
        let mut found = false;
        for rm in &e.resource_metrics {
            for sm in &rm.scope_metrics {
                for m in &sm.metrics {
                    if m.name != name {
                        continue;
                    }
                    if let Some(Data::Histogram(h)) = &m.data {
                        found = true;
                        for p in &h.data_points {
                            let v = p
                                .attributes
                                .iter()
                                .find(|kv| kv.key == attr)
                                .and_then(|kv| kv.value.as_ref().and_then(|v| v.value.as_ref()))
                                .map(|v| match v {
                                    Any::StringValue(s) => s.clone(),
                                    other => format!("{other:?}"),
                                })
                                .unwrap_or_default();
                            *out.entry(v).or_insert(0) += p.count;
                        }
                    }
                }
            }
        }
        if found {
            return out;
        }
    }
    out
}

/// Cumulative (sum of counts, sum of sums) of a histogram in the last
/// export that has it.
pub fn histogram(
    exports: &[ExportMetricsServiceRequest],
    name: &str,
) -> Option<(u64, f64, String)> {
    last_metric(exports, name, |m| match &m.data {
        Some(Data::Histogram(h)) => {
            let c = h.data_points.iter().map(|p| p.count).sum();
            let s = h.data_points.iter().map(|p| p.sum.unwrap_or(0.0)).sum();
            Some((c, s, m.unit.clone()))
        }
        _ => None,
    })
}

/// The summed data points of counter `name` in the newest export that has it.
pub fn counter(exports: &[ExportMetricsServiceRequest], name: &str) -> Option<u64> {
    last_metric(exports, name, |m| match &m.data {
        Some(Data::Sum(s)) => Some(
            s.data_points
                .iter()
                .map(|p| match p.value {
                    Some(Num::AsInt(i)) => i as u64,
                    Some(Num::AsDouble(d)) => d as u64,
                    None => 0,
                })
                .sum(),
        ),
        _ => None,
    })
}

/// `read` applied to the newest metric called `name` it accepts.
fn last_metric<T>(
    exports: &[ExportMetricsServiceRequest],
    name: &str,
    read: impl Fn(&Metric) -> Option<T>,
) -> Option<T> {
    exports
        .iter()
        .rev()
        .flat_map(|e| &e.resource_metrics)
        .flat_map(|rm| &rm.scope_metrics)
        .flat_map(|sm| &sm.metrics)
        .filter(|m| m.name == name)
        .find_map(read)
}

/// Asserts that the exported request histograms say what the request log
/// says: for TTFT, TPOT and duration the same count and sum (unit `s`),
/// the token-usage histogram the sum of input and output tokens (unit
/// `{token}`), and `tokentap.requests` the number of records.
pub fn assert_exports_match_log(exports: &[ExportMetricsServiceRequest], records: &[Value]) {
    for (metric, key) in [
        ("gen_ai.server.time_to_first_token", "ttft_s"),
        ("gen_ai.server.time_per_output_token", "tpot_s"),
        ("gen_ai.server.request.duration", "duration_s"),
    ] {
        let (count, sum, unit) = histogram(exports, metric)
            .unwrap_or_else(|| panic!("{metric} not exported ({} exports)", exports.len()));
        let v: Vec<f64> = records.iter().filter_map(|r| r[key].as_f64()).collect();
        assert_eq!(unit, "s", "{metric}");
        assert_eq!(count, v.len() as u64, "{metric} count");
        let want: f64 = v.iter().sum();
        assert!(
            (sum - want).abs() < 1e-6 * want.max(1.0),
            "{metric} sum {sum} vs {want}"
        );
    }
    let tokens: f64 = records
        .iter()
        .map(|r| {
            r["input_tokens"].as_f64().unwrap_or(0.0) + r["output_tokens"].as_f64().unwrap_or(0.0)
        })
        .sum();
    let (_, tsum, tunit) = histogram(exports, "gen_ai.server.token.usage")
        .expect("gen_ai.server.token.usage exported");
    assert_eq!(tunit, "{token}");
    assert!((tsum - tokens).abs() < 1e-6, "token sum {tsum} vs {tokens}");
    assert_eq!(
        counter(exports, "tokentap.requests"),
        Some(records.len() as u64)
    );
}

/// Names of the metrics with an exponential histogram in the last export.
pub fn exponential_histograms(exports: &[ExportMetricsServiceRequest]) -> Vec<String> {
    let mut out = vec![];
    if let Some(e) = exports.last() {
        for rm in &e.resource_metrics {
            for sm in &rm.scope_metrics {
                for m in &sm.metrics {
                    if let Some(Data::ExponentialHistogram(_)) = &m.data {
                        out.push(m.name.clone());
                    }
                }
            }
        }
    }
    out
}

/// Serves OTLP/HTTP protobuf (`POST /v1/metrics`) on 127.0.0.1:`port`
/// (0: any free port) from a plain thread; returns the port.
pub fn start_http_receiver(port: u16) -> (Sink, u16) {
    start_http(port, None, Gate::default())
}

/// [`start_http_receiver`] over TLS (the certificate `ca` signed), any
/// free port.
pub fn start_https_receiver(ca: &TestCa) -> (Sink, u16) {
    start_http(0, Some(ca), Gate::default())
}

/// [`start_https_receiver`] with a `gate` (a required authorization);
/// gzip-encoded bodies are decoded.
pub fn start_https_receiver_with(ca: &TestCa, gate: Gate) -> (Sink, u16) {
    start_http(0, Some(ca), gate)
}

fn start_http(port: u16, tls: Option<&TestCa>, gate: Gate) -> (Sink, u16) {
    use std::io::{Read, Write};
    let sink = Sink(Arc::default(), gate);
    let listener = std::net::TcpListener::bind(("127.0.0.1", port)).expect("bind OTLP/HTTP");
    let port = listener.local_addr().expect("local addr").port();
    let out = sink.clone();
    let config = tls.map(|ca| {
        std::sync::Arc::new(
            rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![ca.cert_der.clone().into()],
                rustls::pki_types::PrivatePkcs8KeyDer::from(ca.key_der.clone()).into(),
            )
            .expect("server certificate"),
        )
    });
    fn serve(conn: &mut (impl Read + Write), out: &Sink) {
        let mut status = "200 OK";
        if let Ok(Some(req)) = http::read_request(conn, &mut Vec::new()) {
            if !out.1.admits(req.head.header("authorization")) {
                status = "401 Unauthorized";
            } else if req.head.text.starts_with("post /v1/metrics") {
                let body = if req.head.header("content-encoding") == Some("gzip") {
                    out.1
                        .gzipped
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let mut d = Vec::new();
                    let _ = flate2::read::GzDecoder::new(&req.body[..]).read_to_end(&mut d);
                    d
                } else {
                    req.body
                };
                if let Ok(m) = <ExportMetricsServiceRequest as prost::Message>::decode(&body[..]) {
                    out.0.lock().unwrap().push(m);
                }
            }
        }
        let _ = conn.write_all(format!("HTTP/1.1 {status}\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").as_bytes());
        let _ = conn.flush();
    }
    std::thread::spawn(move || {
        for mut conn in listener.incoming().flatten() {
            match &config {
                None => serve(&mut conn, &out),
                Some(c) => {
                    let Ok(tls) = rustls::ServerConnection::new(c.clone()) else {
                        continue;
                    };
                    let mut s = rustls::StreamOwned::new(tls, conn);
                    serve(&mut s, &out);
                    s.conn.send_close_notify();
                    let _ = s.flush();
                }
            }
        }
    });
    (sink, port)
}

/// Attributes (key → value as text) of every data point of a sum metric in
/// the last export that has it.
pub fn sum_point_attributes(
    exports: &[ExportMetricsServiceRequest],
    name: &str,
) -> Vec<Vec<(String, String)>> {
    sum_points(exports, name)
        .into_iter()
        .map(|(a, _)| a)
        .collect()
}

/// A data point's attributes, key → value as text.
fn attributes_text(
    kvs: &[opentelemetry_proto::tonic::common::v1::KeyValue],
) -> Vec<(String, String)> {
    use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
    kvs.iter()
        .map(|kv| {
            let v = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(Any::StringValue(s)) => s.clone(),
                Some(Any::IntValue(i)) => i.to_string(),
                Some(Any::BoolValue(b)) => b.to_string(),
                Some(Any::DoubleValue(d)) => d.to_string(),
                other => format!("{other:?}"),
            };
            (kv.key.clone(), v)
        })
        .collect()
}

/// A two-worker runtime for a test's in-process receivers.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// A real OTLP receiver (gRPC: metrics and logs) on a runtime of its own:
/// what the end-to-end tests start with. Keep it for the whole test.
pub struct Receiver {
    _rt: tokio::runtime::Runtime,
    pub metrics: Sink,
    pub logs: LogSink,
    pub port: u16,
}

impl Receiver {
    pub fn start() -> Receiver {
        let rt = runtime();
        let (metrics, logs, port) = start_receiver_with_logs(&rt, 0);
        Receiver {
            _rt: rt,
            metrics,
            logs,
            port,
        }
    }

    /// The `--otlp-endpoint` for it.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

/// Every data point of sum metric `name` in the last export that has it:
/// its attributes (key → value as text) and value, across resources.
pub fn sum_points(
    exports: &[ExportMetricsServiceRequest],
    name: &str,
) -> Vec<(Vec<(String, String)>, u64)> {
    for e in exports.iter().rev() {
        let mut out = vec![];
        let mut found = false;
        for m in e
            .resource_metrics
            .iter()
            .flat_map(|rm| &rm.scope_metrics)
            .flat_map(|sm| &sm.metrics)
            .filter(|m| m.name == name)
        {
            let Some(Data::Sum(s)) = &m.data else {
                continue;
            };
            found = true;
            for p in &s.data_points {
                let attrs = attributes_text(&p.attributes);
                let v = match p.value {
                    Some(Num::AsInt(i)) => i as u64,
                    Some(Num::AsDouble(d)) => d as u64,
                    None => 0,
                };
                out.push((attrs, v));
            }
        }
        if found {
            return out;
        }
    }
    vec![]
}

/// Every data point of gauge `name` across all exports, in order: its
/// attributes (key → value as text) and value.
pub fn gauge_points(
    exports: &[ExportMetricsServiceRequest],
    name: &str,
) -> Vec<(Vec<(String, String)>, f64)> {
    let mut out = vec![];
    for m in metrics_named(exports, name) {
        let Some(Data::Gauge(g)) = &m.data else {
            continue;
        };
        for p in &g.data_points {
            let attrs = attributes_text(&p.attributes);
            let v = match p.value {
                Some(Num::AsInt(i)) => i as f64,
                Some(Num::AsDouble(d)) => d,
                None => f64::NAN,
            };
            out.push((attrs, v));
        }
    }
    out
}

/// Every metric called `name`, across exports, resources and scopes.
pub fn metrics_named<'a>(
    exports: &'a [ExportMetricsServiceRequest],
    name: &'a str,
) -> impl Iterator<Item = &'a opentelemetry_proto::tonic::metrics::v1::Metric> {
    exports
        .iter()
        .flat_map(|e| &e.resource_metrics)
        .flat_map(|rm| &rm.scope_metrics)
        .flat_map(|sm| &sm.metrics)
        .filter(move |m| m.name == name)
}

/// Every data point of gauge or sum `name` across all exports.
pub fn number_points(
    exports: &[ExportMetricsServiceRequest],
    name: &str,
) -> Vec<opentelemetry_proto::tonic::metrics::v1::NumberDataPoint> {
    let mut out = vec![];
    for m in metrics_named(exports, name) {
        match &m.data {
            Some(Data::Gauge(g)) => out.extend(g.data_points.clone()),
            Some(Data::Sum(s)) => out.extend(s.data_points.clone()),
            _ => {}
        }
    }
    out
}
