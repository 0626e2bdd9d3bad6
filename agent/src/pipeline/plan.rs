//! `tokentap run` options → a [`RunPlan`]: what to capture, which sinks to
//! build and how. Everything that depends on the environment (a terminal on
//! stdout, `OTEL_*` variables) is decided here, once, by [`resolve`], so it
//! is tested without starting anything; the config file's options are
//! merged into the flags before (`super::config`).
//!
//! Owns: the `run` flags (clap and serde: one structure for the command
//! line and the config file), their defaults and checks, and the
//! resolution rules. Must not: start capture, open files or sockets.

use std::{path::PathBuf, time::Duration};

use anyhow::{bail, Result};
use clap::Args;
use serde::{Deserialize, Serialize};

use crate::{
    capture::{CaptureOptions, DataHooks, DEFAULT_MAX_CONNS, DEFAULT_RING_BYTES},
    identity::request_type::Rules,
    sinks::{
        console::ConsolePlan,
        otlp::{MetricsConfig, OtlpProtocol},
    },
};

/// `tokentap run`'s options: the command line (clap) and the config file's
/// flat keys (serde, by the same long names: `tokentap run --help`) read
/// into this one structure, with the same checks (`checked`).
#[derive(Args, Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case")]
pub struct RunFlags {
    /// Read options from a TOML file: keys are the long option names
    /// (`requests-log = "/var/log/tokentap.jsonl"`, `pid = [1234]`,
    /// `no-console = true`, `otlp-endpoint = "http://collector:4317"`).
    /// Options given on the command line win; lists are joined. The file
    /// may also define request types as `[[request_type]]` tables (`name`
    /// plus any of `path`, `header`, `model`, `input_tokens`, `json_field`;
    /// see docs/metrics.md); an invalid rule stops the agent at start; and
    /// the timeline detectors' thresholds as an `[events]` table
    /// (`window_s`, `surge_factor`, …; docs/metrics.md, "Timeline events").
    #[arg(help_heading = "Running", long, value_name = "FILE")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// Capture this inference-server process and the processes it starts
    /// (repeatable). A launcher (shell wrapper, `uv run`, a supervisor)
    /// works: its children are followed.
    #[arg(help_heading = "Targets", long = "pid", value_name = "PID", value_parser = clap::value_parser!(u32).range(1..))]
    #[serde(rename = "pid", deserialize_with = "checked::ids")]
    pub pids: Vec<u32>,
    /// Only server connections on this local port (repeatable). Without
    /// --pid, every process listening on it is captured, in any network
    /// namespace (containers, pods); when nothing listens yet, tokentap
    /// waits for it, and follows an engine that restarts on the port.
    /// A target's outgoing connections to one of these ports are captured
    /// too: give a reverse proxy's port and its engine's, and the two
    /// records of one request are joined (`gateway_s`, docs/metrics.md).
    #[arg(help_heading = "Targets", long = "port", value_name = "PORT", value_parser = clap::value_parser!(u16).range(1..))]
    #[serde(rename = "port", deserialize_with = "checked::ids")]
    pub ports: Vec<u16>,
    /// Append one JSON object per finished request to PATH ("-" for
    /// stdout; the console then goes to stderr). No prompt or completion
    /// text is written. Keys: docs/metrics.md.
    #[arg(help_heading = "Outputs", long, value_name = "PATH")]
    pub requests_log: Option<PathBuf>,
    /// Also write requests that are not LLM requests to the request log
    /// (probes, /metrics scrapes, /v1/models, unknown paths), with
    /// `operation: null`. Without it they are only counted
    /// (tokentap.http.requests by route class).
    #[arg(help_heading = "Outputs", long)]
    pub log_all_requests: bool,
    // The help lists the kinds from their declaration.
    #[arg(help_heading = "Events", long, value_name = "PATH", help = events_log_help())]
    pub events_log: Option<PathBuf>,
    /// Do not show the console view.
    #[arg(help_heading = "Outputs", long)]
    pub no_console: bool,
    /// Sliding window of the console view, in seconds.
    #[arg(help_heading = "Outputs", long, value_name = "SECS", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    #[serde(deserialize_with = "checked::at_least_one")]
    pub console_window: u64,
    /// Seconds between console updates, at least 0.1 (default: 1 on a
    /// terminal, 10 as plain lines otherwise).
    #[arg(help_heading = "Outputs", long, value_name = "SECS", value_parser = secs_at_least_tenth)]
    #[serde(deserialize_with = "checked::some_interval")]
    pub console_interval: Option<f64>,
    /// Stop after this many seconds, ≥ 0 (default: until Ctrl-C / SIGTERM).
    #[arg(help_heading = "Running", long, value_name = "SECS", value_parser = secs_at_least_zero)]
    #[serde(deserialize_with = "checked::some_duration")]
    pub duration: Option<f64>,
    /// Export OTLP metrics to this collector (e.g. http://127.0.0.1:4317
    /// for gRPC, http://127.0.0.1:4318 for HTTP; https:// for TLS, checked
    /// against the system's roots and --otlp-ca-file). Without it, metrics
    /// are exported only when OTEL_EXPORTER_OTLP_ENDPOINT (or
    /// OTEL_EXPORTER_OTLP_METRICS_ENDPOINT) is set.
    #[arg(help_heading = "OTLP export", long, value_name = "URL")]
    pub otlp_endpoint: Option<String>,
    /// CA certificate(s), PEM, that an https:// collector's certificate
    /// is checked against, besides the system's roots (e.g. a cluster's
    /// own CA). Default: OTEL_EXPORTER_OTLP_[METRICS_|LOGS_]CERTIFICATE.
    /// Mutual TLS: OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE and
    /// OTEL_EXPORTER_OTLP_CLIENT_KEY (PEM files). Also honoured:
    /// OTEL_EXPORTER_OTLP_COMPRESSION=gzip, OTEL_EXPORTER_OTLP_TIMEOUT
    /// (ms, default 5000), each with its _METRICS_/_LOGS_ form first.
    #[arg(help_heading = "OTLP export", long, value_name = "PEM")]
    pub otlp_ca_file: Option<PathBuf>,
    /// A header sent with every export, KEY=VALUE (repeatable; value
    /// percent-decoded), e.g. `authorization=Bearer%20TOKEN`; over the
    /// same key in OTEL_EXPORTER_OTLP_HEADERS (comma-separated pairs).
    /// Values are never printed.
    #[arg(
        help_heading = "OTLP export",
        long = "otlp-header",
        value_name = "KEY=VALUE"
    )]
    #[serde(rename = "otlp-header", deserialize_with = "checked::one_or_many")]
    pub otlp_headers: Vec<String>,
    /// OTLP transport: grpc or http/protobuf (default: OTEL_EXPORTER_OTLP_PROTOCOL, else grpc).
    #[arg(help_heading = "OTLP export", long, value_name = "PROTO")]
    pub otlp_protocol: Option<String>,
    /// Seconds between metric exports, at least 0.1.
    #[arg(help_heading = "OTLP export", long, value_name = "SECS", default_value_t = 10.0, value_parser = secs_at_least_tenth)]
    #[serde(deserialize_with = "checked::interval")]
    pub export_interval: f64,
    /// Export base-2 exponential histograms instead of the semantic
    /// conventions' explicit buckets.
    #[arg(help_heading = "OTLP export", long)]
    pub exponential_histograms: bool,
    /// Share of LLM requests exported as OTLP trace spans (one SERVER span
    /// per request, joining the caller's trace when the request carries a
    /// W3C `traceparent`), 0 to 1. Requests that failed, and those slower
    /// to their first token than --traces-slow-ttft, are always exported.
    /// Spans go to the same collector as metrics
    /// (`OTEL_EXPORTER_OTLP_TRACES_*` honoured).
    #[arg(help_heading = "OTLP export", long, value_name = "RATIO", default_value_t = 1.0, value_parser = ratio)]
    #[serde(deserialize_with = "checked::ratio")]
    pub traces_sample: f64,
    /// Always export the span of a request whose TTFT exceeds this many
    /// seconds, whatever --traces-sample says.
    #[arg(help_heading = "OTLP export", long, value_name = "SECS", value_parser = secs_at_least_zero)]
    #[serde(deserialize_with = "checked::some_duration")]
    pub traces_slow_ttft: Option<f64>,
    /// Distinct model names used as metric attribute values; later ones
    /// are exported as "other" (cardinality cap; the overflow is counted in
    /// tokentap.metrics.attribute_overflow).
    #[arg(help_heading = "Limits", long, value_name = "N", default_value_t = 64,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    #[serde(deserialize_with = "checked::at_least_one")]
    pub max_models: usize,
    /// Take the request's tenant from this header (repeatable; the first
    /// one present wins; any case). Without one, or when none is present,
    /// the tenant is the OpenAI `user` field of the body. No other header
    /// value is kept.
    #[arg(help_heading = "Identity", long = "tenant-header", value_name = "NAME")]
    #[serde(rename = "tenant-header", deserialize_with = "checked::one_or_many")]
    pub tenant_headers: Vec<String>,
    /// Distinct tenants, and separately distinct callers (peer IPs), used
    /// as metric attribute values; later ones are exported as "other"
    /// (counted in tokentap.metrics.attribute_overflow). The request log
    /// keeps every value.
    #[arg(help_heading = "Limits", long, value_name = "N", default_value_t = 100,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    #[serde(deserialize_with = "checked::at_least_one")]
    pub max_tenants: usize,
    /// Memory the decoder's connections may hold together: parsing
    /// buffers (response bodies kept for reading, heads, header blocks,
    /// stream events), HTTP/2 header tables, arrival ledgers and
    /// per-connection state, the gateway join's waiting records. Request
    /// bodies are read as they pass and never kept. Over it the decoder
    /// sheds, least useful first (counted in tokentap.decode.shed), and
    /// the kernel leaves request bodies beyond their first 16 KiB unread
    /// until it is back under (their length counted, their input tokens
    /// estimated: tokentap.capture.bodies_left; it does so too while the
    /// ring buffer is over a quarter full). Bytes, or with a KiB/MiB/GiB suffix; at
    /// least 1MiB. The default leaves the base DaemonSet's 256 MiB limit
    /// room for the ring buffer, maps and the agent itself.
    #[arg(help_heading = "Limits", long, value_name = "BYTES", default_value = "64MiB", value_parser = byte_size)]
    #[serde(deserialize_with = "checked::byte_size")]
    pub max_decode_memory: u64,
    /// CPU the engines' own tokenizers may use, in cores (0.25: a quarter
    /// of one core). A request whose response carries no token counts (the
    /// openai SDK's stream=True without include_usage, against vLLM,
    /// SGLang, TGI's OpenAI route, LMDeploy) is counted with the tokenizer
    /// its engine loaded — tokenizer.json, the chat template, found through
    /// the engine's command line and HF cache, inside its container —
    /// (tokens_source "tokenizer"), on a thread of its own. Past the
    /// budget, requests keep the estimate, counted in
    /// tokentap.tokens.tokenize_failed{reason="budget"}. 0 turns it off
    /// (no tokenizer is loaded, no request text kept).
    #[arg(help_heading = "Tokens", long, value_name = "CORES", default_value_t = 0.25, value_parser = cores)]
    #[serde(deserialize_with = "checked::cores")]
    pub tokenize_cpu: f64,
    /// Share of the requests that carry the engine's own counts also
    /// counted with its tokenizer, to check the tokenizer path against the
    /// engine (tokentap.tokens.agreement{engine, result}), 0 to 1.
    #[arg(help_heading = "Tokens", long, value_name = "RATIO", default_value_t = 0.05, value_parser = ratio)]
    #[serde(deserialize_with = "checked::ratio")]
    pub tokenize_check_ratio: f64,
    /// Key for `api_key_id` (HMAC-SHA256 of the request's API key; the key
    /// itself is never kept): the bytes of this file. Default: a random
    /// key made on first use in /var/lib/tokentap/api-key-salt (mode 0600);
    /// give the same file to every agent for ids that agree across nodes.
    #[arg(help_heading = "Identity", long, value_name = "PATH")]
    pub api_key_salt_file: Option<PathBuf>,
    /// Do not scrape the engines' own Prometheus metrics (KV-cache use,
    /// queued and running requests; scraped at each export interval from
    /// each captured engine's port, when OTLP export is on).
    #[arg(help_heading = "Engines and GPUs", long)]
    pub no_engine_metrics: bool,
    /// Do not ask engines' own info endpoints (vLLM /version, TGI /info,
    /// llama.cpp /props, …: one GET per engine process, from inside its
    /// network namespace). Without them `engine_version` comes from the
    /// engine's installed package metadata only, and the serving
    /// configuration from its command line only.
    #[arg(help_heading = "Engines and GPUs", long)]
    pub no_engine_info: bool,
    /// Do not sample GPUs (NVML).
    #[arg(help_heading = "Engines and GPUs", long)]
    pub no_gpu: bool,
    /// Seconds between GPU samples, at least 0.1 (fractional; also the
    /// granularity of per-request GPU utilisation and energy).
    #[arg(help_heading = "Engines and GPUs", long, value_name = "SECS", default_value_t = 1.0, value_parser = secs_at_least_tenth)]
    #[serde(deserialize_with = "checked::interval")]
    pub gpu_interval: f64,
    /// The NVML library to load (default: the system's libnvidia-ml.so.1).
    #[arg(
        help_heading = "Engines and GPUs",
        long,
        value_name = "PATH",
        env = "TOKENTAP_NVML_LIBRARY"
    )]
    pub nvml_library: Option<PathBuf>,
    /// Name pods from the Kubernetes API: the engine's pod name and
    /// namespace on each request (`k8s_pod_name`, `k8s_namespace`), the
    /// calling pod's `namespace/name` as `caller`, and a pod label
    /// `tokentap.io/model-version` as the model version. Watches only this
    /// node's pods (get/list/watch on pods; in-cluster service account or
    /// KUBECONFIG). Off by default: a Collector's `k8sattributes` processor
    /// does the same from `k8s.pod.uid` (docs/deploy.md)
    #[arg(help_heading = "Identity", long)]
    pub kube_metadata: bool,
    /// This node's name, for --kube-metadata (in a DaemonSet: NODE_NAME
    /// from the downward API, `spec.nodeName`)
    #[arg(
        help_heading = "Identity",
        long,
        value_name = "NAME",
        env = "NODE_NAME"
    )]
    pub kube_node: Option<String>,
    /// Serve `GET /healthz` (200 while the agent's loop runs) and
    /// `GET /readyz` (200 once the eBPF programs are attached; 503 with the
    /// reason before, or when attaching failed: the agent then keeps
    /// running and retries, so a node whose kernel refuses the programs
    /// shows as not ready instead of exiting in a loop). E.g. 0.0.0.0:9477
    #[arg(help_heading = "Running", long, value_name = "HOST:PORT")]
    pub health_addr: Option<std::net::SocketAddr>,
    #[command(flatten)]
    #[serde(flatten)]
    pub kernel: KernelFlags,
}

/// The most payload bytes one syscall's records can carry.
const MAX_CALL_BYTES_CAP: i64 =
    agent_ebpf::CHUNK_BYTES as i64 * agent_ebpf::MAX_RECORDS_PER_CALL as i64;

/// A number of seconds ≥ `min` (finite), for clap: the error names the
/// range (clap adds the flag, for the command line and the config file
/// alike).
fn secs_at_least(s: &str, min: f64) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("want a number of seconds ≥ {min}"))?;
    if !v.is_finite() || v < min || Duration::try_from_secs_f64(v).is_err() {
        return Err(format!("want a number of seconds ≥ {min}"));
    }
    Ok(v)
}

/// A share, 0 to 1.
fn ratio(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .parse()
        .map_err(|e| format!("{e} (want a number from 0 to 1)"))?;
    if (0.0..=1.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("{v} is not in 0..=1"))
    }
}

/// A CPU share in cores: 0 (off) to 64.
fn cores(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .parse()
        .map_err(|e| format!("{e} (want a number of cores, e.g. 0.25)"))?;
    if (0.0..=64.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("{v} is not in 0..=64 cores"))
    }
}

/// Intervals: at least 0.1 s (a faster pace only costs).
fn secs_at_least_tenth(s: &str) -> Result<f64, String> {
    secs_at_least(s, 0.1)
}

pub fn secs_at_least_zero(s: &str) -> Result<f64, String> {
    secs_at_least(s, 0.0)
}

/// A size in bytes: a number, optionally with a `KiB`, `MiB` or `GiB`
/// suffix; at least 1 MiB.
pub fn byte_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, mult) = [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)]
        .iter()
        .find_map(|(suf, m)| t.strip_suffix(suf).map(|n| (n.trim(), *m)))
        .unwrap_or((t, 1));
    let n: u64 = num.parse().map_err(|_| {
        format!("{s:?} is not a size (want bytes, or a number with KiB, MiB or GiB)")
    })?;
    let bytes = n
        .checked_mul(mult)
        .ok_or_else(|| format!("{s:?} is too large"))?;
    if bytes < 1 << 20 {
        return Err(format!("{s} is less than 1MiB"));
    }
    Ok(bytes)
}

/// `--ring-buffer-bytes`: a power of two, at least a page.
fn ring_bytes(s: &str) -> Result<u32, String> {
    let n: u32 = s
        .parse()
        .map_err(|e| format!("{e} (want a number of bytes)"))?;
    ring_bytes_ok(n)
}

fn ring_bytes_ok(n: u32) -> Result<u32, String> {
    if !n.is_power_of_two() || n < 4096 {
        return Err(format!("{n} is not a power of two of at least 4096"));
    }
    Ok(n)
}

/// The config file's checks of the values clap checks on the command line
/// (the same bounds, the same functions where clap's are not built in).
mod checked {
    use serde::{
        de::{Error, IntoDeserializer, SeqAccess, Visitor},
        Deserialize, Deserializer,
    };

    /// One value, or a list of them (`pid = 1` and `pid = [1, 2]`); a
    /// bad element is refused with the element type's own error.
    pub fn one_or_many<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
        d: D,
    ) -> Result<Vec<T>, D::Error> {
        struct OneOrMany<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for OneOrMany<T> {
            type Value = Vec<T>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a value or a list of values")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Vec<T>, A::Error> {
                let mut v = Vec::new();
                while let Some(x) = a.next_element()? {
                    v.push(x);
                }
                Ok(v)
            }
            fn visit_i64<E: Error>(self, x: i64) -> Result<Vec<T>, E> {
                T::deserialize(x.into_deserializer()).map(|x| vec![x])
            }
            fn visit_u64<E: Error>(self, x: u64) -> Result<Vec<T>, E> {
                T::deserialize(x.into_deserializer()).map(|x| vec![x])
            }
            fn visit_f64<E: Error>(self, x: f64) -> Result<Vec<T>, E> {
                T::deserialize(x.into_deserializer()).map(|x| vec![x])
            }
            fn visit_bool<E: Error>(self, x: bool) -> Result<Vec<T>, E> {
                T::deserialize(x.into_deserializer()).map(|x| vec![x])
            }
            fn visit_str<E: Error>(self, x: &str) -> Result<Vec<T>, E> {
                T::deserialize(x.into_deserializer()).map(|x| vec![x])
            }
        }
        d.deserialize_any(OneOrMany(std::marker::PhantomData))
    }

    /// Process ids and ports: one or many, each at least 1.
    pub fn ids<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
    where
        D: Deserializer<'de>,
        T: Deserialize<'de> + PartialOrd + From<u8> + std::fmt::Display,
    {
        let v: Vec<T> = one_or_many(d)?;
        match v.iter().find(|x| **x < T::from(1)) {
            Some(x) => Err(D::Error::custom(format!(
                "{x} is not in 1..: want at least 1"
            ))),
            None => Ok(v),
        }
    }

    /// A size as `--max-decode-memory` takes it: a number of bytes, or a
    /// string with a suffix.
    pub fn byte_size<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Size {
            N(u64),
            S(String),
        }
        match Size::deserialize(d)? {
            Size::N(n) => super::byte_size(&n.to_string()),
            Size::S(s) => super::byte_size(&s),
        }
        .map_err(D::Error::custom)
    }

    pub fn at_least_one<'de, D, T>(d: D) -> Result<T, D::Error>
    where
        D: Deserializer<'de>,
        T: Deserialize<'de> + PartialOrd + From<u8> + std::fmt::Display,
    {
        let v = T::deserialize(d)?;
        if v < T::from(1) {
            return Err(D::Error::custom(format!(
                "{v} is not in 1..: want at least 1"
            )));
        }
        Ok(v)
    }

    fn secs<'de, D: Deserializer<'de>>(d: D, min: f64) -> Result<f64, D::Error> {
        let v = f64::deserialize(d)?;
        super::secs_at_least(&v.to_string(), min).map_err(D::Error::custom)
    }

    pub fn interval<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        secs(d, 0.1)
    }

    pub fn cores<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        let v = f64::deserialize(d)?;
        super::cores(&v.to_string()).map_err(D::Error::custom)
    }

    pub fn ratio<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        let v = f64::deserialize(d)?;
        super::ratio(&v.to_string()).map_err(D::Error::custom)
    }

    pub fn some_interval<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
        secs(d, 0.1).map(Some)
    }

    pub fn some_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
        secs(d, 0.0).map(Some)
    }

    pub fn ring_bytes<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
        super::ring_bytes_ok(u32::deserialize(d)?).map_err(D::Error::custom)
    }

    pub fn max_call_bytes<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
        let v = u32::deserialize(d)?;
        if v < 1 || i64::from(v) > super::MAX_CALL_BYTES_CAP {
            return Err(D::Error::custom(format!(
                "{v} is not in 1..={}",
                super::MAX_CALL_BYTES_CAP
            )));
        }
        Ok(v)
    }
}

/// Kernel-side capture settings (shared by `run` and `capture`).
#[derive(Args, Clone, Debug, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case")]
pub struct KernelFlags {
    /// Ring buffer between kernel and agent, in bytes (a power of two,
    /// ≥ 4096). When it is full the kernel drops records and counts them;
    /// traced processes never wait. Over a quarter full, request bodies
    /// beyond their first 16 KiB stay in the kernel (their length
    /// reported), so one client's uploads cannot fill it for everyone.
    #[arg(help_heading = "Limits", long, value_name = "BYTES", default_value_t = DEFAULT_RING_BYTES, value_parser = ring_bytes)]
    #[serde(deserialize_with = "checked::ring_bytes")]
    pub ring_buffer_bytes: u32,
    /// Payload bytes captured per syscall at most (the rest is counted in
    /// the event's `ret`, not captured); 1 to 1048576 (1 MiB).
    #[arg(help_heading = "Limits", long, value_name = "BYTES", default_value_t = agent_ebpf::DEFAULT_MAX_CALL_BYTES,
          value_parser = clap::value_parser!(u32).range(1..=MAX_CALL_BYTES_CAP))]
    #[serde(deserialize_with = "checked::max_call_bytes")]
    pub max_call_bytes: u32,
    /// Connections tracked at once at most (≥ 1; each costs the kernel a
    /// few bytes of map space).
    #[arg(help_heading = "Limits", long, value_name = "N", default_value_t = DEFAULT_MAX_CONNS, value_parser = clap::value_parser!(u32).range(1..))]
    #[serde(deserialize_with = "checked::at_least_one")]
    pub max_conns: u32,
    /// Do not timestamp request arrival in the kernel's TCP receive path
    /// (`tcp:tcp_probe`): t0 is then the engine's first read of a request,
    /// and time a request waits unread in the socket is not measured
    /// (`t0_source` "read", no `queue_s`).
    #[arg(help_heading = "Capture", long)]
    pub no_arrival_time: bool,
    /// Do not read TLS plaintext from OpenSSL (uprobes on `SSL_read` /
    /// `SSL_write` of every libssl the targets map): an engine serving
    /// HTTPS itself is then seen as ciphertext only and not measured.
    #[arg(help_heading = "Capture", long)]
    pub no_tls: bool,
    /// How socket reads and writes are hooked. `btf`: one BTF tracepoint
    /// program on the raw `sys_exit` tracepoint (x86_64, kernel BTF, Linux
    /// 5.5+; about half the cost per traced call of `tracepoint`, but it
    /// runs at the exit of every syscall of every process). `tracepoint`:
    /// a perf tracepoint pair per syscall (any kernel with syscall
    /// tracepoints). `fexit`: one fexit program per data syscall (x86_64,
    /// kernel BTF, a kernel that allows BPF trampolines — Debian's 6.1 and
    /// 6.12 do): other syscalls no longer run a program, but a call
    /// already in progress when it attaches (an idle kept-alive
    /// connection's read) is not seen, so the first request on such a
    /// connection is lost at start; asked for only. `auto` tries `btf` and
    /// falls back to `tracepoint`, saying why (docs/deploy.md, "Kernels").
    #[arg(help_heading = "Capture", long, value_enum, value_name = "HOOKS", default_value_t = DataHooks::Auto)]
    pub data_hooks: DataHooks,
    /// Benchmark reference only: the capture path as it was before the
    /// cheaper one (syscall-tracepoint data hooks, per-record ring reads,
    /// a reader wake-up every 64 records). `cargo xtask bench capture`
    /// compares against it in the same run, with its own build (the
    /// `bench-reference` feature); the shipped binary has no such flag.
    #[cfg(feature = "bench-reference")]
    #[arg(long, hide = true)]
    #[serde(skip)]
    pub capture_reference: bool,
}

impl Default for KernelFlags {
    fn default() -> Self {
        Self {
            ring_buffer_bytes: DEFAULT_RING_BYTES,
            max_call_bytes: agent_ebpf::DEFAULT_MAX_CALL_BYTES,
            max_conns: DEFAULT_MAX_CONNS,
            no_arrival_time: false,
            no_tls: false,
            data_hooks: DataHooks::Auto,
            #[cfg(feature = "bench-reference")]
            capture_reference: false,
        }
    }
}

impl KernelFlags {
    /// Capture options for these targets with these kernel settings.
    pub fn options(&self, pids: &[u32], ports: &[u16]) -> CaptureOptions {
        CaptureOptions {
            pids: pids.to_vec(),
            ports: ports.to_vec(),
            ring_bytes: self.ring_buffer_bytes,
            max_call_bytes: self.max_call_bytes,
            max_conns: self.max_conns,
            arrival: !self.no_arrival_time,
            tls: !self.no_tls,
            data_hooks: self.data_hooks,
            #[cfg(feature = "bench-reference")]
            capture_reference: self.capture_reference,
            ..CaptureOptions::default()
        }
    }
}

/// `--events-log`'s help: the kinds from their declaration
/// (`stage::events::kind::ALL`).
fn events_log_help() -> String {
    format!(
        "Append one JSON object per timeline event to PATH (\"-\" for stdout). Kinds: {} \
         (docs/metrics.md, \"Timeline events\"). Events are also exported as OTLP log records \
         and counted in tokentap.events, and the console shows the latest. Thresholds: the \
         config file's `[events]` table.",
        crate::stage::events::kind::names()
    )
}

/// Which processes to capture.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Targeting {
    /// These processes and their descendants (optionally only `ports`).
    Pids { pids: Vec<u32>, ports: Vec<u16> },
    /// Whatever listens on these ports, now or later, in any namespace.
    Ports(Vec<u16>),
    /// Inference servers found by command line, now or later.
    Discover,
}

/// Everything `run` needs, decided.
#[derive(Clone, Debug)]
pub struct RunPlan {
    pub targeting: Targeting,
    pub capture: CaptureOptions,
    pub requests_log: Option<PathBuf>,
    /// `--log-all-requests`.
    pub log_all_requests: bool,
    /// `--max-tenants`: also the callers the timeline names one by one.
    pub max_tenants: usize,
    /// `--max-decode-memory`, bytes.
    pub max_decode_memory: u64,
    /// `--tokenize-cpu` (cores; 0: off) and `--tokenize-check-ratio`.
    pub tokenize_cpu: f64,
    pub tokenize_check_ratio: f64,
    pub events_log: Option<PathBuf>,
    pub console: Option<ConsolePlan>,
    pub metrics: Option<MetricsConfig>,
    pub duration: Option<Duration>,
    /// GPU sampling (None: --no-gpu).
    pub gpu: Option<GpuPlan>,
    /// Scrape engines' /metrics at this interval (None: off, or no OTLP
    /// export to carry the values).
    pub engine_metrics: Option<Duration>,
    /// Ask each engine process's info endpoint once (off: --no-engine-info).
    pub engine_info: bool,
    pub identity: IdentityPlan,
    /// The config file's `[[request_type]]` rules (none without a file).
    pub request_types: Rules,
    /// The config file's `[events]` thresholds (the defaults without one).
    pub events: crate::timeline::Config,
    /// `--kube-metadata`: this node's name.
    pub kube_node: Option<String>,
    pub health_addr: Option<std::net::SocketAddr>,
}

/// Tenant, API-key id and request-type settings (read and checked by the
/// run driver before anything starts).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct IdentityPlan {
    /// Tenant header names, lowercase, in order.
    pub tenant_headers: Vec<String>,
    pub api_key_salt_file: Option<PathBuf>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct GpuPlan {
    /// None: the system's libnvidia-ml.so.1.
    pub library: Option<PathBuf>,
    pub interval: Duration,
}

/// The environment `resolve` reads (a seam for tests).
pub trait Env {
    fn var(&self, key: &str) -> Option<String>;
    fn stdout_is_terminal(&self) -> bool;
}

/// The real process environment.
pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn var(&self, key: &str) -> Option<String> {
        std::env::var(key).ok()
    }
    fn stdout_is_terminal(&self) -> bool {
        // SAFETY: isatty has no preconditions.
        unsafe { libc::isatty(1) == 1 }
    }
}

/// An interval flag's value (clap checked it: ≥ 0.1 s); checked again for
/// a `RunFlags` built by hand.
fn interval(name: &str, v: f64) -> Result<Duration> {
    if !v.is_finite() || v < 0.1 {
        bail!("--{name} must be a number of seconds ≥ 0.1, got {v}");
    }
    Ok(Duration::from_secs_f64(v))
}

/// `--tenant-header` values as the decoder wants them: checked to be HTTP
/// header names, lowercase, first occurrence kept.
pub fn tenant_header_names(given: &[String]) -> Result<Vec<String>> {
    let mut out: Vec<String> = vec![];
    for h in given {
        let n = h.trim();
        if n.is_empty()
            || !n
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
        {
            bail!("--tenant-header {h:?} is not an HTTP header name");
        }
        let n = n.to_ascii_lowercase();
        if !out.contains(&n) {
            out.push(n);
        }
    }
    Ok(out)
}

/// Decides what `run` does from its flags and the environment.
pub fn resolve(f: &RunFlags, env: &dyn Env) -> Result<RunPlan> {
    let targeting = match (f.pids.is_empty(), f.ports.is_empty()) {
        (true, true) => Targeting::Discover,
        (true, false) => Targeting::Ports(f.ports.clone()),
        (false, _) => Targeting::Pids {
            pids: f.pids.clone(),
            ports: f.ports.clone(),
        },
    };
    let mut capture = f.kernel.options(&f.pids, &f.ports);
    // Discovery and --port start with nothing to capture and add targets
    // as engines appear; explicit pids must exist now.
    capture.allow_no_targets = !matches!(targeting, Targeting::Pids { .. });
    let log_on_stdout = f
        .requests_log
        .as_deref()
        .is_some_and(|p| p.as_os_str() == "-");
    let table = env.stdout_is_terminal() && !log_on_stdout;
    let console = (!f.no_console)
        .then(|| -> Result<ConsolePlan> {
            Ok(ConsolePlan {
                table,
                to_stderr: log_on_stdout,
                every: interval(
                    "console-interval",
                    f.console_interval.unwrap_or(if table { 1.0 } else { 10.0 }),
                )?,
                window_s: f.console_window,
            })
        })
        .transpose()?;
    // One protocol for metrics and events: the flag, else the variable
    // (empty = unset, as for the endpoints).
    let protocol = match &f.otlp_protocol {
        Some(p) => p.parse::<OtlpProtocol>().map_err(anyhow::Error::msg)?,
        None => match env
            .var("OTEL_EXPORTER_OTLP_PROTOCOL")
            .filter(|p| !p.trim().is_empty())
        {
            Some(p) => p
                .trim()
                .parse::<OtlpProtocol>()
                .map_err(|e| anyhow::anyhow!("OTEL_EXPORTER_OTLP_PROTOCOL: {e}"))?,
            None => OtlpProtocol::Grpc,
        },
    };
    // Exporting is on when a collector is named: the flag, or the standard
    // variables (empty ones are unset, as the OTLP exporter spec says).
    let named = |k: &str| env.var(k).is_some_and(|v| !v.trim().is_empty());
    let export = f.otlp_endpoint.is_some()
        || named("OTEL_EXPORTER_OTLP_ENDPOINT")
        || named("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT");
    if !export && named("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT") {
        eprintln!(
            "tokentap: warning: OTEL_EXPORTER_OTLP_LOGS_ENDPOINT alone exports nothing: name the collector with --otlp-endpoint, OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"
        );
    }
    let metrics = export
        .then(|| -> Result<MetricsConfig> {
            Ok(MetricsConfig {
                endpoint: f.otlp_endpoint.clone(),
                ca_file: f.otlp_ca_file.clone(),
                headers: f.otlp_headers.clone(),
                protocol,
                interval: interval("export-interval", f.export_interval)?,
                exponential: f.exponential_histograms,
                max_models: f.max_models,
                max_tenants: f.max_tenants,
                traces_sample: f.traces_sample,
                traces_slow_ttft: f.traces_slow_ttft,
            })
        })
        .transpose()?;
    let duration = f
        .duration
        .map(|s| {
            if s.is_finite() && s >= 0.0 {
                Ok(Duration::from_secs_f64(s))
            } else {
                Err(anyhow::anyhow!(
                    "--duration must be a number of seconds ≥ 0, got {s}"
                ))
            }
        })
        .transpose()?;
    let gpu = (!f.no_gpu)
        .then(|| -> Result<GpuPlan> {
            Ok(GpuPlan {
                library: f.nvml_library.clone(),
                interval: interval("gpu-interval", f.gpu_interval)?,
            })
        })
        .transpose()?;
    let engine_metrics = metrics
        .as_ref()
        .filter(|_| !f.no_engine_metrics)
        .map(|m| m.interval.max(Duration::from_secs(1)));
    let tenant_headers = tenant_header_names(&f.tenant_headers)?;
    let kube_node = if f.kube_metadata {
        match f.kube_node.as_deref().map(str::trim) {
            Some(n) if !n.is_empty() => Some(n.to_string()),
            _ => bail!(
                "--kube-metadata needs this node's name: set NODE_NAME (downward API: fieldRef spec.nodeName) or --kube-node"
            ),
        }
    } else {
        None
    };
    let identity = IdentityPlan {
        tenant_headers,
        api_key_salt_file: f.api_key_salt_file.clone(),
    };
    Ok(RunPlan {
        kube_node,
        health_addr: f.health_addr,
        identity,
        request_types: Rules::default(),
        events: crate::timeline::Config::default(),
        gpu,
        engine_metrics,
        engine_info: !f.no_engine_info,
        targeting,
        capture,
        requests_log: f.requests_log.clone(),
        log_all_requests: f.log_all_requests,
        max_tenants: f.max_tenants,
        max_decode_memory: f.max_decode_memory,
        tokenize_cpu: f.tokenize_cpu,
        tokenize_check_ratio: f.tokenize_check_ratio,
        events_log: f.events_log.clone(),
        console,
        metrics,
        duration,
    })
}

/// A command line with `run` alone, for the plan's and the config file's
/// tests.
#[cfg(test)]
pub(super) mod test_cli {
    use super::RunFlags;

    #[derive(clap::Parser)]
    #[command(args_override_self = true)]
    pub struct Cli {
        #[command(subcommand)]
        pub cmd: Sub,
    }
    #[derive(clap::Subcommand)]
    pub enum Sub {
        Run(RunFlags),
    }
}

#[cfg(test)]
mod tests {
    use super::test_cli::{Cli, Sub};
    use super::*;
    use clap::Parser;
    use std::{collections::HashMap, path::Path};

    struct FakeEnv {
        vars: HashMap<&'static str, &'static str>,
        tty: bool,
    }
    impl Env for FakeEnv {
        fn var(&self, key: &str) -> Option<String> {
            self.vars.get(key).map(|s| s.to_string())
        }
        fn stdout_is_terminal(&self) -> bool {
            self.tty
        }
    }
    fn env(vars: &[(&'static str, &'static str)], tty: bool) -> FakeEnv {
        FakeEnv {
            vars: vars.iter().copied().collect(),
            tty,
        }
    }
    fn flags(args: &[&str]) -> RunFlags {
        let mut v = vec!["tokentap", "run"];
        v.extend_from_slice(args);
        let Sub::Run(f) = Cli::try_parse_from(v).unwrap().cmd;
        f
    }

    #[test]
    fn numbers_that_cannot_work_are_refused_when_parsed_naming_the_flag_and_range() {
        let err = |args: &[&str]| {
            let mut v = vec!["tokentap", "run"];
            v.extend_from_slice(args);
            match Cli::try_parse_from(v) {
                Ok(_) => panic!("{args:?} accepted"),
                Err(e) => e.to_string(),
            }
        };
        for (args, says) in [
            (&["--port", "0"][..], "--port <PORT>"),
            (&["--port", "70000"], "--port <PORT>"),
            (&["--pid", "0"], "--pid <PID>"),
            (&["--max-call-bytes", "0"], "1..=1048576"),
            (&["--max-call-bytes", "2000000"], "1..=1048576"),
            (&["--max-conns", "0"], "--max-conns <N>"),
            (&["--console-window", "0"], "--console-window <SECS>"),
            (&["--ring-buffer-bytes", "5000"], "not a power of two"),
            (&["--ring-buffer-bytes", "2048"], "at least 4096"),
            (&["--export-interval", "0"], "--export-interval <SECS>"),
            (&["--export-interval", "0.05"], "≥ 0.1"),
            (&["--export-interval=-1"], "≥ 0.1"),
            (&["--export-interval", "NaN"], "≥ 0.1"),
            (&["--gpu-interval", "0"], "--gpu-interval <SECS>"),
            (&["--gpu-interval=-2"], "≥ 0.1"),
            (&["--console-interval", "0"], "--console-interval <SECS>"),
            (&["--console-window=-1"], "--console-window <SECS>"),
            (&["--duration=-1"], "≥ 0"),
            (&["--duration", "1e20"], "≥ 0"),
            (&["--export-interval", "inf"], "≥ 0.1"),
            (&["--max-tenants", "0"], "--max-tenants <N>"),
            (&["--max-models", "0"], "--max-models <N>"),
        ] {
            let e = err(args);
            assert!(e.contains(says), "{args:?}: {e}");
        }
        // The edges that work.
        let f = flags(&[
            "--port",
            "65535",
            "--max-call-bytes",
            "1048576",
            "--max-conns",
            "1",
            "--console-window",
            "1",
            "--ring-buffer-bytes",
            "4096",
        ]);
        assert_eq!(
            (f.ports[0], f.kernel.max_call_bytes, f.kernel.max_conns),
            (65535, 1 << 20, 1)
        );
    }

    #[test]
    fn kube_metadata_needs_the_node_name_and_probes_are_off_by_default() {
        let p = resolve(&flags(&[]), &env(&[], false)).unwrap();
        assert_eq!((p.kube_node, p.health_addr), (None, None));
        let e = resolve(
            &flags(&["--kube-metadata", "--kube-node", " "]),
            &env(&[], false),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("NODE_NAME"), "{e}");
        let p = resolve(
            &flags(&[
                "--kube-metadata",
                "--kube-node",
                "gpu-7",
                "--health-addr",
                "0.0.0.0:9477",
            ]),
            &env(&[], false),
        )
        .unwrap();
        assert_eq!(p.kube_node.as_deref(), Some("gpu-7"));
        assert_eq!(p.health_addr, Some("0.0.0.0:9477".parse().unwrap()));
        // A node name alone turns nothing on.
        let p = resolve(&flags(&["--kube-node", "gpu-7"]), &env(&[], false)).unwrap();
        assert_eq!(p.kube_node, None);
    }

    #[test]
    fn tenant_headers_are_checked_and_the_cap_defaults_to_100() {
        let p = resolve(&flags(&[]), &env(&[], false)).unwrap();
        assert_eq!(p.identity, IdentityPlan::default());
        let m = resolve(
            &flags(&["--otlp-endpoint", "http://c:4317"]),
            &env(&[], false),
        )
        .unwrap()
        .metrics
        .unwrap();
        assert_eq!(m.max_tenants, 100);
        let p = resolve(
            &flags(&[
                "--tenant-header",
                "X-Tenant-ID",
                "--tenant-header",
                "x-tenant-id",
                "--api-key-salt-file",
                "/etc/salt",
            ]),
            &env(&[], false),
        )
        .unwrap();
        assert_eq!(p.identity.tenant_headers, vec!["x-tenant-id"]);
        assert_eq!(
            p.identity.api_key_salt_file.as_deref(),
            Some(Path::new("/etc/salt"))
        );
        let err = resolve(&flags(&["--tenant-header", "X Tenant"]), &env(&[], false)).unwrap_err();
        assert!(format!("{err}").contains("not an HTTP header name"));
    }

    #[test]
    fn targeting_follows_pid_and_port_flags() {
        let p = resolve(&flags(&[]), &env(&[], false)).unwrap();
        assert_eq!(p.targeting, Targeting::Discover);
        assert!(p.capture.allow_no_targets);
        let p = resolve(&flags(&["--port", "8000"]), &env(&[], false)).unwrap();
        assert_eq!(p.targeting, Targeting::Ports(vec![8000]));
        assert!(p.capture.allow_no_targets, "--port waits for a listener");
        let p = resolve(&flags(&["--pid", "7", "--port", "80"]), &env(&[], false)).unwrap();
        assert_eq!(
            p.targeting,
            Targeting::Pids {
                pids: vec![7],
                ports: vec![80]
            }
        );
        assert!(!p.capture.allow_no_targets, "an explicit pid must exist");
    }

    #[test]
    fn gpu_sampling_is_on_by_default_and_its_flags_are_checked() {
        let g = resolve(&flags(&[]), &env(&[], false)).unwrap().gpu.unwrap();
        assert_eq!(g.interval, Duration::from_secs(1));
        assert_eq!(g.library, None);
        let g = resolve(
            &flags(&[
                "--gpu-interval",
                "0.25",
                "--nvml-library",
                "/x/libnvidia-ml.so.1",
            ]),
            &env(&[], false),
        )
        .unwrap()
        .gpu
        .unwrap();
        assert_eq!(g.interval, Duration::from_millis(250));
        assert_eq!(
            g.library.as_deref(),
            Some(Path::new("/x/libnvidia-ml.so.1"))
        );
        assert!(resolve(&flags(&["--no-gpu"]), &env(&[], false))
            .unwrap()
            .gpu
            .is_none());
        // Refused when parsed (numbers_that_cannot_work_…), and by resolve
        // for flags built by hand.
        let bad = RunFlags {
            gpu_interval: 0.0,
            ..flags(&[])
        };
        assert!(resolve(&bad, &env(&[], false)).is_err());
    }

    #[test]
    fn engines_are_scraped_at_the_export_interval_only_when_exporting() {
        let p = resolve(&flags(&[]), &env(&[], false)).unwrap();
        assert_eq!(p.engine_metrics, None, "nothing would carry the values");
        let p = resolve(
            &flags(&["--otlp-endpoint", "http://c:4317", "--export-interval", "5"]),
            &env(&[], false),
        )
        .unwrap();
        assert_eq!(p.engine_metrics, Some(Duration::from_secs(5)));
        let p = resolve(
            &flags(&["--otlp-endpoint", "http://c:4317", "--no-engine-metrics"]),
            &env(&[], false),
        )
        .unwrap();
        assert_eq!(p.engine_metrics, None);
    }

    #[test]
    fn console_is_a_table_on_a_terminal_and_lines_elsewhere() {
        let c = resolve(&flags(&[]), &env(&[], true))
            .unwrap()
            .console
            .unwrap();
        assert!(c.table && !c.to_stderr);
        assert_eq!(c.every, Duration::from_secs(1));
        let c = resolve(&flags(&[]), &env(&[], false))
            .unwrap()
            .console
            .unwrap();
        assert!(!c.table);
        assert_eq!(c.every, Duration::from_secs(10));
        // The request log on stdout pushes the console to stderr, as lines.
        let c = resolve(&flags(&["--requests-log", "-"]), &env(&[], true))
            .unwrap()
            .console
            .unwrap();
        assert!(!c.table && c.to_stderr);
        assert!(resolve(&flags(&["--no-console"]), &env(&[], true))
            .unwrap()
            .console
            .is_none());
        let bad = RunFlags {
            console_interval: Some(0.0),
            ..flags(&[])
        };
        assert!(resolve(&bad, &env(&[], true)).is_err());
    }

    #[test]
    fn otlp_export_follows_flags_then_the_standard_environment() {
        assert!(resolve(&flags(&[]), &env(&[], false))
            .unwrap()
            .metrics
            .is_none());
        let m = resolve(
            &flags(&[]),
            &env(
                &[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                    ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
                ],
                false,
            ),
        )
        .unwrap()
        .metrics
        .unwrap();
        assert_eq!(m.protocol, OtlpProtocol::HttpProtobuf);
        assert_eq!(
            m.endpoint, None,
            "resolved with the signal's variables by metrics.rs"
        );
        // The metrics signal's own variable names a collector too; an
        // empty variable does not.
        let on = |vars: &[(&'static str, &'static str)]| {
            resolve(&flags(&[]), &env(vars, false))
                .unwrap()
                .metrics
                .is_some()
        };
        assert!(on(&[(
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
            "http://m:4317"
        )]));
        assert!(!on(&[("OTEL_EXPORTER_OTLP_ENDPOINT", " ")]));
        let m = resolve(
            &flags(&[
                "--otlp-endpoint",
                "http://x:4317",
                "--otlp-protocol",
                "grpc",
            ]),
            &env(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")], false),
        )
        .unwrap()
        .metrics
        .unwrap();
        assert_eq!(m.protocol, OtlpProtocol::Grpc, "the flag wins");
        assert_eq!(m.endpoint.as_deref(), Some("http://x:4317"));
        let err = resolve(
            &flags(&["--otlp-endpoint", "http://x:4317"]),
            &env(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "carrier-pigeon")], false),
        )
        .unwrap_err();
        assert!(format!("{err}").contains("OTEL_EXPORTER_OTLP_PROTOCOL"));
        let bad = RunFlags {
            export_interval: -1.0,
            ..flags(&["--otlp-endpoint", "http://x"])
        };
        assert!(resolve(&bad, &env(&[], false)).is_err());
    }
}
