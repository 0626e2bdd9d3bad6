//! The OTLP exporters' one builder, for metrics and for logs (timeline
//! events): where the collector is, how to reach it (TLS with a CA and an
//! optional client certificate, headers, compression, timeout), resolved
//! once at start from the flags and the standard `OTEL_EXPORTER_OTLP_*`
//! variables — the signal's own variable first (`…_METRICS_…`, `…_LOGS_…`),
//! then the generic one — and checked there: a setting that cannot work
//! stops the agent with the reason, never at the first export.
//!
//! Owns: that resolution, the exporters' construction and the HTTP client
//! that keeps why an export failed. Must not: know instruments or log
//! records (the metrics and timeline sinks do), or print a header's value
//! anywhere (they carry credentials).

use std::{path::PathBuf, sync::Arc, time::Duration};

use anyhow::{anyhow, bail, Context as _, Result};
use opentelemetry_otlp::{
    Compression, Protocol, WithExportConfig, WithHttpConfig, WithTonicConfig,
};

use crate::sinks::otlp::{MetricsConfig, OtlpProtocol};

/// How long one export may take unless `OTEL_EXPORTER_OTLP[_SIGNAL]_TIMEOUT`
/// says (shorter than the specification's 10 s, so that a shutdown with
/// the collector away stays short).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// Which OTLP signal an exporter carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    Metrics,
    Logs,
    Traces,
}

impl Signal {
    fn env(self) -> &'static str {
        match self {
            Signal::Metrics => "METRICS",
            Signal::Logs => "LOGS",
            Signal::Traces => "TRACES",
        }
    }
    fn path(self) -> &'static str {
        match self {
            Signal::Metrics => "/v1/metrics",
            Signal::Logs => "/v1/logs",
            Signal::Traces => "/v1/traces",
        }
    }
}

/// The collector URL an exporter of `signal` sends to, resolved once here
/// (and given to the SDK explicitly) as the OTLP exporter specification
/// says: `--otlp-endpoint`, else `OTEL_EXPORTER_OTLP_{SIGNAL}_ENDPOINT`
/// (used as it is), else `OTEL_EXPORTER_OTLP_ENDPOINT`; empty values are
/// unset; over HTTP the flag's and the generic variable's URL get the
/// signal's path (`/v1/metrics`, `/v1/logs`); an endpoint without a scheme
/// is `https://` unless `OTEL_EXPORTER_OTLP[_{SIGNAL}]_INSECURE=true`.
/// None: the SDK's default (`http://localhost:4317`, or `:4318` over HTTP).
/// `var` reads the environment (a seam for tests).
pub fn collector_url(
    cfg: &MetricsConfig,
    signal: Signal,
    var: &dyn Fn(&str) -> Option<String>,
) -> Option<String> {
    let get = |k: &str| {
        var(k)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    };
    let (url, add_path) = if let Some(e) = &cfg.endpoint {
        (e.trim().to_string(), true)
    } else if let Some(e) = get(&format!("OTEL_EXPORTER_OTLP_{}_ENDPOINT", signal.env())) {
        (e, false)
    } else {
        (get("OTEL_EXPORTER_OTLP_ENDPOINT")?, true)
    };
    let url = if url.contains("://") {
        url
    } else {
        let insecure = get(&format!("OTEL_EXPORTER_OTLP_{}_INSECURE", signal.env()))
            .or_else(|| get("OTEL_EXPORTER_OTLP_INSECURE"))
            .is_some_and(|v| v.eq_ignore_ascii_case("true"));
        format!("{}://{url}", if insecure { "http" } else { "https" })
    };
    Some(if cfg.protocol == OtlpProtocol::HttpProtobuf && add_path {
        signal_url(&url, signal)
    } else {
        url
    })
}

/// An HTTP collector URL for `signal`: a bare address, or a URL of the
/// other signal's path, gets this signal's path.
fn signal_url(endpoint: &str, signal: Signal) -> String {
    let e = endpoint.trim_end_matches('/');
    let e = [Signal::Metrics, Signal::Logs]
        .iter()
        .find_map(|s| e.strip_suffix(s.path()))
        .unwrap_or(e);
    format!("{e}{}", signal.path())
}

/// `key=value` pairs, comma-separated, keys and values percent-decoded (the
/// `OTEL_EXPORTER_OTLP_HEADERS` format; `--otlp-header` gives one pair).
/// `source` names where they came from in errors, which never quote a
/// value (headers carry credentials).
pub fn parse_headers(text: &str, source: &str) -> Result<Vec<(http::HeaderName, String)>> {
    parse_header_entries(text.split(','), source)
}

/// One `key=value` pair (`--otlp-header`: a value may hold commas).
pub fn parse_header_pair(text: &str, source: &str) -> Result<(http::HeaderName, String)> {
    parse_header_entries(std::iter::once(text), source)?
        .pop()
        .ok_or_else(|| anyhow!("{source}: empty (want key=value)"))
}

fn parse_header_entries<'a>(
    entries: impl Iterator<Item = &'a str>,
    source: &str,
) -> Result<Vec<(http::HeaderName, String)>> {
    let mut out = vec![];
    for (i, entry) in entries.enumerate() {
        let entry = entry.trim();
        if entry.is_empty() {
            continue;
        }
        let Some((k, v)) = entry.split_once('=') else {
            bail!(
                "{source}: entry {} has no '=' (want key=value, comma-separated)",
                i + 1
            );
        };
        // A key that fails is never quoted: `Authorization: Bearer x=y`
        // would put the credential in the key.
        let bad_key = || {
            anyhow!(
                "{source}: entry {}: the key is not an HTTP header name (write name=value, not `Name: value`)",
                i + 1
            )
        };
        let key = percent_decode(k.trim()).ok_or_else(bad_key)?;
        let name = http::HeaderName::from_bytes(key.to_ascii_lowercase().as_bytes())
            .map_err(|_| bad_key())?;
        let value = percent_decode(v.trim()).ok_or_else(|| {
            anyhow!("{source}: the value of {name} is not valid percent-encoding")
        })?;
        if http::HeaderValue::from_str(&value).is_err() {
            bail!("{source}: the value of {name} has characters a header cannot carry");
        }
        out.push((name, value));
    }
    Ok(out)
}

/// `%XX` decoded (UTF-8); None for a broken escape or invalid UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b.get(i + 1..i + 3)?;
            if !hex.iter().all(u8::is_ascii_hexdigit) {
                return None;
            }
            out.push(u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Everything one exporter needs, resolved and checked.
pub struct Collector {
    pub signal: Signal,
    pub protocol: OtlpProtocol,
    /// None: the SDK's default endpoint.
    pub url: Option<String>,
    /// Headers sent with every export (values secret: never printed).
    headers: http::HeaderMap,
    gzip: bool,
    pub timeout: Duration,
    https: bool,
    /// CA certificates (PEM) besides the system's roots.
    ca_pem: Option<Vec<u8>>,
    /// Client certificate and key (PEM), for mutual TLS.
    identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for Collector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Collector")
            .field("signal", &self.signal)
            .field("url", &self.url)
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .field("gzip", &self.gzip)
            .field("timeout", &self.timeout)
            .field("mtls", &self.identity.is_some())
            .finish()
    }
}

impl Collector {
    /// `signal`'s exporter (logs, traces) beside the metrics', from the
    /// process environment; None, said once with `instead`, when the
    /// collector is named for metrics only
    /// (`OTEL_EXPORTER_OTLP_METRICS_ENDPOINT` alone): that signal has no
    /// place to go, rather than the SDK's localhost default and failures
    /// counted every batch.
    pub fn beside_metrics(
        cfg: &MetricsConfig,
        signal: Signal,
        what: &str,
        instead: &str,
    ) -> Result<Option<Collector>> {
        let env = |k: &str| std::env::var(k).ok();
        let metrics = Collector::resolve(cfg, Signal::Metrics, &env)?;
        let own = Collector::resolve(cfg, signal, &env)?;
        if own.url.is_none() && metrics.url.is_some() {
            eprintln!(
                "tokentap: {what} not exported over OTLP: the collector is named for metrics only (OTEL_EXPORTER_OTLP_METRICS_ENDPOINT); set OTEL_EXPORTER_OTLP_{}_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT for them{instead}",
                signal.env()
            );
            return Ok(None);
        }
        Ok(Some(own))
    }

    /// Resolves `signal`'s exporter from the flags (`cfg`) and the
    /// environment (`var`), reading the certificate files named.
    pub fn resolve(
        cfg: &MetricsConfig,
        signal: Signal,
        var: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Collector> {
        // The signal's own variable, else the generic one (empty = unset).
        let setting = |name: &str| -> Option<(String, String)> {
            [
                format!("OTEL_EXPORTER_OTLP_{}_{name}", signal.env()),
                format!("OTEL_EXPORTER_OTLP_{name}"),
            ]
            .into_iter()
            .find_map(|k| {
                var(&k)
                    .map(|v| v.trim().to_string())
                    .filter(|v| !v.is_empty())
                    .map(|v| (k, v))
            })
        };
        let url = collector_url(cfg, signal, var);
        let https = url
            .as_deref()
            .is_some_and(|u| u.to_ascii_lowercase().starts_with("https://"));

        let mut headers = http::HeaderMap::new();
        if let Some((k, v)) = setting("HEADERS") {
            for (name, value) in parse_headers(&v, &k)? {
                headers.insert(name, sensitive(&value));
            }
        }
        // The flags last: they win over the environment.
        for h in &cfg.headers {
            let (name, value) = parse_header_pair(h, "--otlp-header")?;
            headers.insert(name, sensitive(&value));
        }

        let gzip = match setting("COMPRESSION") {
            None => false,
            Some((_, v)) if v.eq_ignore_ascii_case("none") => false,
            Some((_, v)) if v.eq_ignore_ascii_case("gzip") => true,
            Some((k, v)) => bail!("{k}={v:?}: want gzip or none"),
        };
        let timeout = match setting("TIMEOUT") {
            None => DEFAULT_TIMEOUT,
            Some((k, v)) => match v.parse::<u64>() {
                Ok(ms) if ms > 0 => Duration::from_millis(ms),
                _ => bail!("{k}={v:?}: want a number of milliseconds > 0"),
            },
        };

        let read_pem = |path: &PathBuf, what: &str| -> Result<Vec<u8>> {
            std::fs::read(path)
                .with_context(|| format!("{what} {}: cannot read it", path.display()))
        };
        let ca = match &cfg.ca_file {
            Some(p) => Some(("--otlp-ca-file".to_string(), p.clone())),
            None => setting("CERTIFICATE").map(|(k, v)| (k, PathBuf::from(v))),
        };
        let ca_pem = match ca {
            None => None,
            Some((what, p)) => {
                let pem = read_pem(&p, &what)?;
                let n = reqwest::Certificate::from_pem_bundle(&pem)
                    .map(|v| v.len())
                    .unwrap_or(0);
                if n == 0 {
                    bail!(
                        "{what} {}: no PEM certificate in it (want -----BEGIN CERTIFICATE----- blocks)",
                        p.display()
                    );
                }
                Some(pem)
            }
        };
        let identity = match (setting("CLIENT_CERTIFICATE"), setting("CLIENT_KEY")) {
            (None, None) => None,
            (Some((k, _)), None) | (None, Some((k, _))) => bail!(
                "{k} is set but not its pair: mutual TLS needs both OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE and OTEL_EXPORTER_OTLP_CLIENT_KEY"
            ),
            (Some((ck, cp)), Some((kk, kp))) => {
                let cert = read_pem(&PathBuf::from(&cp), &ck)?;
                let key = read_pem(&PathBuf::from(&kp), &kk)?;
                let mut both = key.clone();
                both.push(b'\n');
                both.extend_from_slice(&cert);
                reqwest::Identity::from_pem(&both).map_err(|e| {
                    anyhow!("{ck} {cp} / {kk} {kp}: not a PEM certificate and private key ({e})")
                })?;
                Some((cert, key))
            }
        };
        if https && ca_pem.is_none() && system_roots() == 0 {
            bail!(
                "the collector {} is https:// but this system has No CA certificates to check it with; give the collector's CA with --otlp-ca-file or OTEL_EXPORTER_OTLP_CERTIFICATE",
                url.as_deref().unwrap_or("")
            );
        }
        if !https && (ca_pem.is_some() || identity.is_some()) {
            eprintln!(
                "tokentap: warning: OTLP {:?}: a CA or client certificate is given but the collector endpoint is not https://; they are not used",
                signal
            );
        }
        Ok(Collector {
            signal,
            protocol: cfg.protocol,
            url,
            headers,
            gzip,
            timeout,
            https,
            ca_pem,
            identity,
        })
    }

    /// Where exports go, for messages.
    pub fn target(&self) -> String {
        self.url
            .clone()
            .unwrap_or_else(|| "the default OTLP endpoint".into())
    }

    /// The gRPC channel's TLS settings (None: plain HTTP/2).
    fn grpc_tls(&self) -> Option<opentelemetry_otlp::tonic_types::transport::ClientTlsConfig> {
        use opentelemetry_otlp::tonic_types::transport::{Certificate, ClientTlsConfig, Identity};
        self.https.then(|| {
            let mut c = ClientTlsConfig::new().with_enabled_roots();
            if let Some(pem) = &self.ca_pem {
                c = c.ca_certificate(Certificate::from_pem(pem));
            }
            if let Some((cert, key)) = &self.identity {
                c = c.identity(Identity::from_pem(cert, key));
            }
            c
        })
    }

    /// The headers as gRPC metadata, set on every call by an interceptor
    /// (after the SDK's own reading of the environment, so the resolution
    /// here is what is sent).
    fn grpc_interceptor(&self) -> HeaderInterceptor {
        HeaderInterceptor(Arc::new(self.headers.clone()))
    }

    /// The HTTP exporter's client (TLS for https://, plain otherwise), with
    /// the timeout and headers. Built on a thread of its own: a blocking
    /// client must not be made (or dropped) inside the async runtime.
    fn http_client(&self) -> Result<ExplainingClient> {
        let certs = match &self.ca_pem {
            Some(pem) => reqwest::Certificate::from_pem_bundle(pem)?,
            None => Vec::new(),
        };
        let identity = match &self.identity {
            Some((cert, key)) => {
                let mut both = key.clone();
                both.push(b'\n');
                both.extend_from_slice(cert);
                Some(reqwest::Identity::from_pem(&both)?)
            }
            None => None,
        };
        // main() installs it; a library user may not have.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let https = self.https;
        let timeout = self.timeout;
        std::thread::spawn(move || {
            let mut b = reqwest::blocking::Client::builder().timeout(timeout);
            if let Some(id) = identity {
                b = b.identity(id);
            }
            if https {
                b.tls_certs_merge(certs).build()
            } else {
                // No TLS to do: no system roots needed (a host or image
                // without a CA bundle must still export over http://).
                b.tls_certs_only(certs).build()
            }
        })
        .join()
        .map_err(|_| anyhow!("building the OTLP/HTTP client panicked"))?
        .map(|inner| ExplainingClient {
            inner,
            headers: self.headers.clone(),
            last_cause: LastCause::default(),
        })
        .map_err(|e| anyhow!("building the OTLP/HTTP client: {:#}", anyhow::Error::new(e)))
    }

    /// A gRPC exporter builder (of either signal) with these settings.
    fn tonic_settings<B: WithExportConfig + WithTonicConfig>(&self, b: B) -> B {
        let mut b = b
            .with_timeout(self.timeout)
            .with_interceptor(self.grpc_interceptor());
        if let Some(u) = &self.url {
            b = b.with_endpoint(u.clone());
        }
        if let Some(t) = self.grpc_tls() {
            b = b.with_tls_config(t);
        }
        if self.gzip {
            b = b.with_compression(Compression::Gzip);
        }
        b
    }

    /// An HTTP exporter builder (of either signal) with these settings and
    /// its own client, and where that client keeps its last failure.
    fn http_settings<B: WithExportConfig + WithHttpConfig>(&self, b: B) -> Result<(B, LastCause)> {
        let client = self.http_client()?;
        let cause = client.last_cause.clone();
        let mut b = b
            .with_http_client(client)
            .with_protocol(Protocol::HttpBinary)
            .with_timeout(self.timeout);
        if let Some(u) = &self.url {
            b = b.with_endpoint(u.clone());
        }
        if self.gzip {
            b = b.with_compression(Compression::Gzip);
        }
        Ok((b, cause))
    }

    /// The metric exporter, and (over HTTP) where its client keeps the
    /// cause of its last failure.
    pub fn metric_exporter(
        &self,
    ) -> Result<(opentelemetry_otlp::MetricExporter, Option<LastCause>)> {
        use opentelemetry_otlp::MetricExporter as E;
        Ok(match self.protocol {
            OtlpProtocol::Grpc => (
                self.tonic_settings(E::builder().with_tonic())
                    .build()
                    .context("building the OTLP/gRPC exporter")?,
                None,
            ),
            OtlpProtocol::HttpProtobuf => {
                let (b, cause) = self.http_settings(E::builder().with_http())?;
                let e = b.build().context("building the OTLP/HTTP exporter")?;
                (e, Some(cause))
            }
        })
    }

    /// The log exporter (timeline events), as [`Self::metric_exporter`].
    pub fn log_exporter(&self) -> Result<(opentelemetry_otlp::LogExporter, Option<LastCause>)> {
        use opentelemetry_otlp::LogExporter as E;
        Ok(match self.protocol {
            OtlpProtocol::Grpc => (
                self.tonic_settings(E::builder().with_tonic())
                    .build()
                    .context("building the OTLP/gRPC log exporter")?,
                None,
            ),
            OtlpProtocol::HttpProtobuf => {
                let (b, cause) = self.http_settings(E::builder().with_http())?;
                let e = b.build().context("building the OTLP/HTTP log exporter")?;
                (e, Some(cause))
            }
        })
    }
}

impl Collector {
    /// The span exporter (request spans), as [`Self::metric_exporter`].
    pub fn span_exporter(&self) -> Result<(opentelemetry_otlp::SpanExporter, Option<LastCause>)> {
        use opentelemetry_otlp::SpanExporter as E;
        Ok(match self.protocol {
            OtlpProtocol::Grpc => (
                self.tonic_settings(E::builder().with_tonic())
                    .build()
                    .context("building the OTLP/gRPC span exporter")?,
                None,
            ),
            OtlpProtocol::HttpProtobuf => {
                let (b, cause) = self.http_settings(E::builder().with_http())?;
                let e = b.build().context("building the OTLP/HTTP span exporter")?;
                (e, Some(cause))
            }
        })
    }
}

/// One exporter's failures: counted in `tokentap.export.failures` and
/// said on stderr — every failure, or (`once`) only the first of an
/// outage — and a recovery said once. Shared by the metric, log and span
/// exporters' wrappers.
#[derive(Debug)]
pub struct FailureReport {
    health: Arc<crate::stage::health::Health>,
    failing: std::sync::atomic::AtomicBool,
    /// The HTTP client's last failure (OTLP/HTTP only).
    cause: Option<LastCause>,
    /// What failed: "to HOST:PORT", "of timeline events", ….
    what: String,
    /// What to know about it, after the cause.
    hint: &'static str,
    once: bool,
}

impl FailureReport {
    pub fn new(
        health: Arc<crate::stage::health::Health>,
        cause: Option<LastCause>,
        what: String,
        hint: &'static str,
        once: bool,
    ) -> Self {
        FailureReport {
            health,
            failing: std::sync::atomic::AtomicBool::new(false),
            cause,
            what,
            hint,
            once,
        }
    }

    /// Accounts for one export's result.
    pub fn after(&self, r: &opentelemetry_sdk::error::OTelSdkResult) {
        use std::sync::atomic::Ordering::Relaxed;
        match r {
            Ok(()) => {
                if self.failing.swap(false, Relaxed) {
                    eprintln!("tokentap: OTLP export {} works again", self.what);
                }
            }
            Err(e) => {
                self.health.export_failures.fetch_add(1, Relaxed);
                let was = self.failing.swap(true, Relaxed);
                if !(self.once && was) {
                    eprintln!(
                        "tokentap: OTLP export {} failed ({}); {}",
                        self.what,
                        failure_text(e, self.cause.as_ref()),
                        self.hint
                    );
                }
            }
        }
    }
}

/// A header value marked sensitive (kept out of `Debug` output).
fn sensitive(v: &str) -> http::HeaderValue {
    let mut h = http::HeaderValue::from_str(v).expect("checked by parse_headers");
    h.set_sensitive(true);
    h
}

/// How many root certificates the system offers (rustls' native roots;
/// `SSL_CERT_FILE` / `SSL_CERT_DIR` honoured), read once.
fn system_roots() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| rustls_native_certs::load_native_certs().certs.len())
}

/// Sets the resolved headers as metadata of every gRPC call (replacing
/// any value of the same key).
#[derive(Clone)]
struct HeaderInterceptor(Arc<http::HeaderMap>);

impl tonic::service::Interceptor for HeaderInterceptor {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        use tonic::metadata::{AsciiMetadataKey, AsciiMetadataValue};
        for (k, v) in self.0.iter() {
            if let (Ok(key), Ok(val)) = (
                AsciiMetadataKey::from_bytes(k.as_str().as_bytes()),
                AsciiMetadataValue::try_from(v.as_bytes()),
            ) {
                req.metadata_mut().insert(key, val);
            }
        }
        Ok(req)
    }
}

/// Why the last OTLP/HTTP request failed (its error chain), kept by
/// [`ExplainingClient`] for the failure line: the SDK reports every client
/// error as "network error", whatever it was (a refused connection, an
/// untrusted certificate).
pub type LastCause = Arc<std::sync::Mutex<Option<String>>>;

/// The OTLP/HTTP exporter's client: reqwest, setting the resolved headers
/// on every request and keeping the cause of its last failure in a
/// [`LastCause`].
#[derive(Debug)]
struct ExplainingClient {
    inner: reqwest::blocking::Client,
    headers: http::HeaderMap,
    last_cause: LastCause,
}

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for ExplainingClient {
    async fn send_bytes(
        &self,
        mut request: http::Request<bytes::Bytes>,
    ) -> Result<http::Response<bytes::Bytes>, opentelemetry_http::HttpError> {
        for (k, v) in &self.headers {
            request.headers_mut().insert(k.clone(), v.clone());
        }
        let r = self.inner.send_bytes(request).await;
        let cause = match &r {
            Err(e) => {
                let mut chain = e.to_string();
                let mut src = e.source();
                while let Some(s) = src {
                    let t = s.to_string();
                    if !chain.contains(&t) {
                        chain += &format!(": {t}");
                    }
                    src = s.source();
                }
                Some(chain)
            }
            // A refusal by the collector (401, 403…): the SDK says only the
            // status; the status line says it too, never a header.
            Ok(resp) if !resp.status().is_success() => Some(format!("HTTP {}", resp.status())),
            Ok(_) => None,
        };
        if cause.is_some() {
            *self.last_cause.lock().unwrap_or_else(|p| p.into_inner()) = cause;
        }
        r
    }
}

/// `{e}`, plus the HTTP client's own cause when it kept one.
pub fn failure_text(e: &dyn std::fmt::Display, cause: Option<&LastCause>) -> String {
    let kept = cause.and_then(|c| c.lock().unwrap_or_else(|p| p.into_inner()).take());
    match kept {
        Some(c) => format!("{e}: {c}"),
        None => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(endpoint: Option<&str>, protocol: OtlpProtocol) -> MetricsConfig {
        MetricsConfig {
            endpoint: endpoint.map(str::to_string),
            ca_file: None,
            headers: vec![],
            protocol,
            interval: Duration::from_secs(10),
            exponential: false,
            max_models: 64,
            max_tenants: 100,
            traces_sample: 1.0,
            traces_slow_ttft: None,
        }
    }

    fn env(vars: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k: &str| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn signal_urls_get_their_path() {
        assert_eq!(
            signal_url("http://c:4318", Signal::Metrics),
            "http://c:4318/v1/metrics"
        );
        assert_eq!(
            signal_url("http://c:4318/v1/metrics/", Signal::Metrics),
            "http://c:4318/v1/metrics"
        );
        assert_eq!(
            signal_url("http://c:4318/v1/metrics", Signal::Logs),
            "http://c:4318/v1/logs"
        );
    }

    #[test]
    fn the_collector_url_is_resolved_as_the_otlp_exporter_spec_says() {
        let (grpc, http) = (OtlpProtocol::Grpc, OtlpProtocol::HttpProtobuf);
        let both = env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://generic:4318"),
            (
                "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
                "https://m:4318/custom",
            ),
        ]);
        // The flag wins; over HTTP it gets the signal's path.
        assert_eq!(
            collector_url(&cfg(Some("http://flag:4318"), http), Signal::Logs, &both).as_deref(),
            Some("http://flag:4318/v1/logs")
        );
        // The signal's variable as it is, before the generic one (which
        // gets the path over HTTP, not over gRPC).
        assert_eq!(
            collector_url(&cfg(None, http), Signal::Metrics, &both).as_deref(),
            Some("https://m:4318/custom")
        );
        assert_eq!(
            collector_url(&cfg(None, http), Signal::Logs, &both).as_deref(),
            Some("https://generic:4318/v1/logs")
        );
        assert_eq!(
            collector_url(&cfg(None, grpc), Signal::Logs, &both).as_deref(),
            Some("https://generic:4318")
        );
        // Empty is unset; no scheme is https unless INSECURE=true.
        let bare = env(&[
            ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", ""),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4317"),
        ]);
        assert_eq!(
            collector_url(&cfg(None, grpc), Signal::Metrics, &bare).as_deref(),
            Some("https://collector:4317")
        );
        let insecure = env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4317"),
            ("OTEL_EXPORTER_OTLP_INSECURE", "TRUE"),
        ]);
        assert_eq!(
            collector_url(&cfg(None, grpc), Signal::Metrics, &insecure).as_deref(),
            Some("http://collector:4317")
        );
        assert_eq!(
            collector_url(&cfg(None, grpc), Signal::Metrics, &env(&[])),
            None
        );
    }

    #[test]
    fn headers_are_comma_separated_percent_decoded_and_errors_never_quote_a_value() {
        let h = parse_headers(
            "Authorization=Bearer%20s3cret, x-tenant = a%2Cb ,,api-key=k=v",
            "OTEL_EXPORTER_OTLP_HEADERS",
        )
        .unwrap();
        let h: Vec<(String, String)> = h.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        assert_eq!(
            h,
            [
                ("authorization".to_string(), "Bearer s3cret".to_string()),
                ("x-tenant".to_string(), "a,b".to_string()),
                ("api-key".to_string(), "k=v".to_string()),
            ]
        );
        for bad in [
            "authorization",
            "bad key=v",
            "Authorization: Basic s3cret=",
            "authorization=s3cret%zz",
            "authorization=s3cret%+9",
            "authorization=s3cret%0Ainjected",
        ] {
            let e = parse_headers(bad, "OTEL_EXPORTER_OTLP_HEADERS")
                .unwrap_err()
                .to_string();
            assert!(e.starts_with("OTEL_EXPORTER_OTLP_HEADERS"), "{e}");
            assert!(!e.contains("s3cret"), "a value was printed: {e}");
        }
    }

    #[test]
    fn per_signal_settings_win_flags_win_over_the_environment_and_bad_ones_stop_the_start() {
        let vars = env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "authorization=generic,x-a=1"),
            ("OTEL_EXPORTER_OTLP_LOGS_HEADERS", "authorization=logs"),
            ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip"),
            ("OTEL_EXPORTER_OTLP_METRICS_TIMEOUT", "2500"),
        ]);
        let mut c = cfg(None, OtlpProtocol::Grpc);
        let m = Collector::resolve(&c, Signal::Metrics, &vars).unwrap();
        assert_eq!(m.headers["authorization"], "generic");
        assert_eq!(m.headers["x-a"], "1");
        assert!(m.gzip);
        assert_eq!(m.timeout, Duration::from_millis(2500));
        let l = Collector::resolve(&c, Signal::Logs, &vars).unwrap();
        assert_eq!(l.headers["authorization"], "logs");
        assert!(
            !l.headers.contains_key("x-a"),
            "the signal's variable replaces the generic one"
        );
        assert_eq!(l.timeout, DEFAULT_TIMEOUT);
        assert!(
            !format!("{m:?}").contains("generic"),
            "Debug shows no header value: {m:?}"
        );
        c.headers = vec!["Authorization=flag,with,commas".into()];
        let f = Collector::resolve(&c, Signal::Metrics, &vars).unwrap();
        assert_eq!(f.headers["authorization"], "flag,with,commas");

        for (vars, says) in [
            (
                env(&[("OTEL_EXPORTER_OTLP_COMPRESSION", "brotli")]),
                "want gzip or none",
            ),
            (
                env(&[("OTEL_EXPORTER_OTLP_TIMEOUT", "0")]),
                "milliseconds > 0",
            ),
            (
                env(&[("OTEL_EXPORTER_OTLP_CERTIFICATE", "/nonexistent/ca.pem")]),
                "cannot read",
            ),
            (
                env(&[("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", "/x.pem")]),
                "needs both",
            ),
            (env(&[("OTEL_EXPORTER_OTLP_HEADERS", "novalue")]), "no '='"),
        ] {
            let e = Collector::resolve(&cfg(None, OtlpProtocol::Grpc), Signal::Metrics, &vars)
                .unwrap_err();
            assert!(format!("{e:#}").contains(says), "{e:#}");
        }
    }
}
