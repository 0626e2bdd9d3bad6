//! `tokentap explain`: the chain of evidence per engine and served model,
//! as a person reads it — the changes, the shifts with their causes, the
//! impact of each change, the callers involved, and the numbers per model
//! version — from an events log (`--events-log`) and, optionally, a
//! requests log (`--requests-log`). Text for the on-call engineer,
//! `--json` for machines.
//!
//! Owns: reading the two logs (a malformed line is counted and skipped,
//! never fatal), grouping, the report. Must not: need root, the network
//! or the agent running.

use std::collections::BTreeMap;
use std::io::BufRead;
use std::time::SystemTime;

use anyhow::Result;
use serde::Serialize;
use serde_json::Value;

use crate::timeline::shifts::quantile;

/// What to report on.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    pub since: Option<SystemTime>,
    pub until: Option<SystemTime>,
    pub engine: Option<String>,
    pub model: Option<String>,
}

/// Event kinds the chain shows (the rest — new callers, folded counts — is
/// in the events log).
const SHOWN: &[&str] = &[
    "engine.start",
    "engine.stop",
    "engine.version.change",
    "engine.config.change",
    "engine.image.change",
    "model_version.new",
    "model_version.rollout",
    "model_version.rollback",
    "caller.surge",
    "caller.error_burst",
    "caller.retry_storm",
    "tokens.drift",
    "latency.shift",
    "errors.shift",
    "tokens.shift",
    "change.impact",
    "gpu.throttle.start",
    "gpu.throttle.stop",
    "gpu.memory.high",
];

/// One model version's numbers from the requests log.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Version {
    pub version: String,
    pub requests: u64,
    pub first: String,
    pub last: String,
    pub ttft_p50_s: Option<f64>,
    pub ttft_p95_s: Option<f64>,
    pub tpot_p50_s: Option<f64>,
    pub input_tokens_p50: Option<f64>,
    pub error_rate: f64,
}

/// One engine and served model.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Group {
    pub engine: String,
    pub model: String,
    /// The events of the chain, in time order, as the events log has them.
    pub events: Vec<Value>,
    pub versions: Vec<Version>,
    /// Tenants (else callers) by requests, most first (at most 10).
    pub callers: Vec<(String, u64)>,
    /// The shifts' answers in one line each: "KIND METRIC: CAUSE".
    pub answers: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Report {
    pub groups: Vec<Group>,
    /// Lines that were not JSON objects of the expected shape.
    pub skipped_lines: u64,
}

#[derive(Default)]
struct Acc {
    events: Vec<Value>,
    versions: BTreeMap<String, VersionAcc>,
    callers: BTreeMap<String, u64>,
}

#[derive(Default)]
struct VersionAcc {
    n: u64,
    errors: u64,
    first: String,
    last: String,
    ttft: Vec<f32>,
    tpot: Vec<f32>,
    input: Vec<f32>,
}

/// An RFC 3339 time as the logs write it (and `--since` takes it).
pub fn parse_time(ts: &str) -> Result<SystemTime, humantime::TimestampError> {
    humantime::parse_rfc3339_weak(ts.trim_end_matches('Z'))
}

/// A quantile of values kept as `f32`, to the microsecond (the logs'
/// precision).
fn q(v: &mut [f32], at: f64) -> Option<f64> {
    quantile(v, at).map(|x| (x * 1e6).round() / 1e6)
}

fn time_of(ts: &str) -> Option<SystemTime> {
    parse_time(ts).ok()
}

fn inside(f: &Filter, ts: &str) -> bool {
    let Some(t) = time_of(ts) else {
        return false;
    };
    f.since.is_none_or(|s| t >= s) && f.until.is_none_or(|u| t <= u)
}

fn wanted(f: &Filter, engine: &str, model: &str) -> bool {
    f.engine.as_deref().is_none_or(|e| e == engine) && f.model.as_deref().is_none_or(|m| m == model)
}

/// The JSON values of a log's lines: blank lines left out, lines that are
/// not JSON counted in `skipped`.
fn json_lines<'a>(
    r: impl BufRead + 'a,
    what: &'static str,
    skipped: &'a std::cell::Cell<u64>,
) -> impl Iterator<Item = Result<Value>> + 'a {
    r.lines().filter_map(move |line| match line {
        Err(e) => Some(Err(
            anyhow::Error::new(e).context(format!("reading the {what} log"))
        )),
        Ok(l) if l.trim().is_empty() => None,
        Ok(l) => match serde_json::from_str::<Value>(&l) {
            Ok(v) => Some(Ok(v)),
            Err(_) => {
                skipped.set(skipped.get() + 1);
                None
            }
        },
    })
}

/// Reads the logs and groups what they say.
pub fn explain(
    events: impl BufRead,
    requests: Option<Box<dyn BufRead>>,
    f: &Filter,
) -> Result<Report> {
    let mut groups: BTreeMap<(String, String), Acc> = BTreeMap::new();
    let mut gpu: Vec<Value> = Vec::new();
    let skipped = std::cell::Cell::new(0u64);
    for e in json_lines(events, "events", &skipped) {
        let e = e?;
        let (Some(kind), Some(ts)) = (e["kind"].as_str(), e["ts"].as_str()) else {
            skipped.set(skipped.get() + 1);
            continue;
        };
        if !SHOWN.contains(&kind) || !inside(f, ts) {
            continue;
        }
        let a = &e["attributes"];
        if kind.starts_with("gpu.") {
            gpu.push(e.clone());
            continue;
        }
        let (Some(engine), Some(model)) = (
            a["gen_ai.provider.name"].as_str(),
            a["gen_ai.request.model"].as_str(),
        ) else {
            continue;
        };
        if !wanted(f, engine, model) {
            continue;
        }
        groups
            .entry((engine.to_string(), model.to_string()))
            .or_default()
            .events
            .push(e.clone());
    }
    if let Some(r) = requests {
        for r in json_lines(r, "requests", &skipped) {
            let r = r?;
            let Some(ts) = r["ts"].as_str() else {
                skipped.set(skipped.get() + 1);
                continue;
            };
            if r["operation"].is_null() || !inside(f, ts) {
                continue;
            }
            let engine = r["provider"].as_str().unwrap_or("unknown");
            let model = r["response_model"]
                .as_str()
                .or(r["request_model"].as_str())
                .unwrap_or("unknown");
            if !wanted(f, engine, model) {
                continue;
            }
            let g = groups
                .entry((engine.to_string(), model.to_string()))
                .or_default();
            let v = g
                .versions
                .entry(r["model_version"].as_str().unwrap_or("unknown").to_string())
                .or_default();
            v.n += 1;
            if v.first.is_empty() || ts < v.first.as_str() {
                v.first = ts.to_string();
            }
            if ts > v.last.as_str() {
                v.last = ts.to_string();
            }
            if !r["error_type"].is_null() {
                v.errors += 1;
            } else {
                if let Some(x) = r["ttft_s"].as_f64() {
                    v.ttft.push(x as f32);
                }
                if let Some(x) = r["tpot_s"].as_f64() {
                    v.tpot.push(x as f32);
                }
            }
            if let Some(x) = r["input_tokens"].as_f64() {
                v.input.push(x as f32);
            }
            if let Some(who) = r["tenant"].as_str().or(r["caller"].as_str()) {
                *g.callers.entry(who.to_string()).or_default() += 1;
            }
        }
    }
    let mut out = Report {
        groups: Vec::new(),
        skipped_lines: skipped.get(),
    };
    for ((engine, model), mut acc) in groups {
        // A GPU event belongs to the groups of the engines on that GPU.
        for e in &gpu {
            let on = e["attributes"]["engines"].as_array().is_some_and(|a| {
                a.iter().any(|x| {
                    x.as_str()
                        .is_some_and(|s| s.starts_with(&format!("{engine} (")))
                })
            });
            if on {
                acc.events.push(e.clone());
            }
        }
        acc.events.sort_by(|a, b| {
            a["ts"]
                .as_str()
                .unwrap_or("")
                .cmp(b["ts"].as_str().unwrap_or(""))
        });
        let mut versions: Vec<Version> = acc
            .versions
            .into_iter()
            .map(|(version, mut v)| Version {
                version,
                requests: v.n,
                first: v.first,
                last: v.last,
                ttft_p50_s: q(&mut v.ttft, 0.5),
                ttft_p95_s: q(&mut v.ttft, 0.95),
                tpot_p50_s: q(&mut v.tpot, 0.5),
                input_tokens_p50: q(&mut v.input, 0.5),
                error_rate: v.errors as f64 / v.n.max(1) as f64,
            })
            .collect();
        versions.sort_by(|a, b| a.first.cmp(&b.first));
        let mut callers: Vec<(String, u64)> = acc.callers.into_iter().collect();
        callers.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        callers.truncate(10);
        let answers = acc
            .events
            .iter()
            .filter_map(|e| {
                let k = e["kind"].as_str()?;
                let a = &e["attributes"];
                match k {
                    "latency.shift" | "errors.shift" | "tokens.shift" => Some(format!(
                        "{k} {} {}: {}{}",
                        a["error.class"]
                            .as_str()
                            .or(a["metric"].as_str())
                            .unwrap_or("?"),
                        a["direction"].as_str().unwrap_or(""),
                        a["cause"].as_str().unwrap_or("unknown"),
                        a["cause_event"]
                            .as_str()
                            .map_or(String::new(), |c| format!(" ({c})"))
                    )),
                    "change.impact" => Some(format!(
                        "change.impact of {}: {}",
                        a["change"].as_str().unwrap_or("?"),
                        a["verdict"].as_str().unwrap_or("?")
                    )),
                    _ => None,
                }
            })
            .collect();
        out.groups.push(Group {
            engine,
            model,
            events: acc.events,
            versions,
            callers,
            answers,
        });
    }
    Ok(out)
}

fn ms(x: Option<f64>) -> String {
    x.map_or("-".into(), |x| format!("{:.1} ms", x * 1e3))
}

/// The report for a person.
pub fn render(r: &Report) -> String {
    let mut s = String::new();
    if r.groups.is_empty() {
        s.push_str("nothing to explain: no event or request of an engine in the logs (and filters) given\n");
    }
    for g in &r.groups {
        s.push_str(&format!("== {} / {} ==\n", g.engine, g.model));
        if !g.versions.is_empty() {
            s.push_str("versions (requests log):\n");
            for v in &g.versions {
                s.push_str(&format!(
                    "  {:<14} {:>7} requests  {} … {}  TTFT p50 {} p95 {}  TPOT p50 {}  input p50 {}  errors {:.1} %\n",
                    v.version,
                    v.requests,
                    v.first,
                    v.last,
                    ms(v.ttft_p50_s),
                    ms(v.ttft_p95_s),
                    ms(v.tpot_p50_s),
                    v.input_tokens_p50.map_or("-".into(), |x| format!("{x:.0}")),
                    v.error_rate * 100.0
                ));
            }
        }
        if !g.callers.is_empty() {
            let c: Vec<String> = g.callers.iter().map(|(n, k)| format!("{n} {k}")).collect();
            s.push_str(&format!("callers: {}\n", c.join(", ")));
        }
        if !g.events.is_empty() {
            s.push_str("timeline:\n");
        }
        for e in &g.events {
            let kind = e["kind"].as_str().unwrap_or("?");
            s.push_str(&format!(
                "  {}  {:<22} {}\n",
                e["ts"].as_str().unwrap_or("?"),
                kind,
                e["message"].as_str().unwrap_or("")
            ));
            let a = &e["attributes"];
            if let Some(causes) = a["causes"].as_array() {
                for c in causes {
                    s.push_str(&format!(
                        "      cause {} (score {}): {}\n",
                        c["cause"].as_str().unwrap_or("?"),
                        c["score"],
                        c["reason"].as_str().unwrap_or("")
                    ));
                }
                if causes.is_empty() {
                    s.push_str(
                        "      cause unknown: no change, traffic or resource event explains it\n",
                    );
                }
                let list = |k: &str| -> Option<String> {
                    let v: Vec<&str> = a[k].as_array()?.iter().filter_map(Value::as_str).collect();
                    (!v.is_empty()).then(|| v.join(", "))
                };
                if let Some(m) = list("moved") {
                    s.push_str(&format!(
                        "      in the requests of: {m}{}\n",
                        list("steady").map_or(String::new(), |x| format!(" (steady: {x})"))
                    ));
                }
            }
        }
        if !g.answers.is_empty() {
            s.push_str("answers:\n");
            for a in &g.answers {
                s.push_str(&format!("  {a}\n"));
            }
        }
        s.push('\n');
    }
    if r.skipped_lines > 0 {
        s.push_str(&format!("({} malformed lines skipped)\n", r.skipped_lines));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    const EVENTS: &str = r#"{"ts":"2027-01-15T08:00:00.300000Z","kind":"model_version.new","message":"llama: version v1 first seen","attributes":{"gen_ai.provider.name":"vllm","gen_ai.request.model":"llama","tokentap.model.version":"v1"}}
{"ts":"2027-01-15T08:00:01.000000Z","kind":"caller.new","message":"tenant a: first request","attributes":{"tokentap.tenant":"a"}}
{"ts":"2027-01-15T08:20:00.300000Z","kind":"model_version.rollout","message":"llama: version v2 replaces v1","attributes":{"gen_ai.provider.name":"vllm","gen_ai.request.model":"llama","tokentap.model.version":"v2"}}
not json
{"ts":"2027-01-15T08:21:00.000000Z","kind":"gpu.throttle.start","message":"GPU 0 throttled","attributes":{"engines":["vllm (pid 100)"]}}
{"ts":"2027-01-15T08:22:00.000000Z","kind":"latency.shift","message":"vllm/llama: ttft p50 60.0 ms → 160.0 ms","attributes":{"gen_ai.provider.name":"vllm","gen_ai.request.model":"llama","metric":"ttft","direction":"up","cause":"model","cause_event":"model_version.rollout","causes":[{"cause":"model","score":3,"reason":"model_version.rollout at 2027-01-15T08:20:00.300000Z","event":"model_version.rollout"}],"moved":["a","b"],"steady":[]}}
{"ts":"2027-01-15T08:24:00.000000Z","kind":"change.impact","message":"vllm/llama: after model_version.rollout: regressed","attributes":{"gen_ai.provider.name":"vllm","gen_ai.request.model":"llama","change":"model_version.rollout","verdict":"regressed"}}
{"ts":"2027-01-15T08:25:00.000000Z","kind":"latency.shift","message":"tgi/other: ttft up","attributes":{"gen_ai.provider.name":"tgi","gen_ai.request.model":"other","metric":"ttft","direction":"up","cause":"unknown","causes":[]}}
"#;

    const REQUESTS: &str = r#"{"ts":"2027-01-15T08:10:00.000000Z","operation":"chat","provider":"vllm","response_model":"llama","model_version":"v1","tenant":"a","ttft_s":0.06,"tpot_s":0.01,"input_tokens":300,"error_type":null}
{"ts":"2027-01-15T08:11:00.000000Z","operation":"chat","provider":"vllm","response_model":"llama","model_version":"v1","tenant":"b","ttft_s":0.07,"tpot_s":0.01,"input_tokens":310,"error_type":"http_5xx"}
{"ts":"2027-01-15T08:21:00.000000Z","operation":"chat","provider":"vllm","response_model":"llama","model_version":"v2","tenant":"a","ttft_s":0.16,"tpot_s":0.01,"input_tokens":300,"error_type":null}
{"ts":"2027-01-15T08:21:30.000000Z","operation":null,"provider":"vllm","path":"/health"}
"#;

    fn run(f: &Filter) -> Report {
        explain(
            std::io::Cursor::new(EVENTS),
            Some(Box::new(std::io::Cursor::new(REQUESTS))),
            f,
        )
        .unwrap()
    }

    #[test]
    fn the_chain_is_grouped_per_engine_and_model_with_its_numbers() {
        let r = run(&Filter::default());
        assert_eq!(r.skipped_lines, 1);
        assert_eq!(r.groups.len(), 2);
        let g = &r.groups[1];
        assert_eq!((g.engine.as_str(), g.model.as_str()), ("vllm", "llama"));
        let kinds: Vec<&str> = g
            .events
            .iter()
            .map(|e| e["kind"].as_str().unwrap())
            .collect();
        assert_eq!(
            kinds,
            [
                "model_version.new",
                "model_version.rollout",
                "gpu.throttle.start",
                "latency.shift",
                "change.impact"
            ]
        );
        assert_eq!(
            g.answers,
            [
                "latency.shift ttft up: model (model_version.rollout)",
                "change.impact of model_version.rollout: regressed"
            ]
        );
        assert_eq!(g.versions.len(), 2);
        assert_eq!(g.versions[0].version, "v1");
        assert_eq!(g.versions[0].requests, 2);
        assert_eq!(g.versions[0].error_rate, 0.5);
        assert_eq!(g.versions[0].ttft_p50_s, Some(0.06));
        assert_eq!(g.versions[1].ttft_p50_s, Some(0.16));
        assert_eq!(g.callers, [("a".to_string(), 2), ("b".to_string(), 1)]);
        let text = render(&r);
        assert!(text.contains("== vllm / llama =="), "{text}");
        assert!(
            text.contains("cause model (score 3): model_version.rollout at"),
            "{text}"
        );
        assert!(text.contains("in the requests of: a, b"), "{text}");
        assert!(text.contains("cause unknown: no change"), "{text}");
        assert!(text.contains("(1 malformed lines skipped)"), "{text}");
    }

    #[test]
    fn filters_keep_the_engine_model_and_time_asked_for() {
        let f = Filter {
            engine: Some("vllm".into()),
            since: time_of("2027-01-15T08:20:00Z"),
            until: time_of("2027-01-15T08:22:30Z"),
            ..Filter::default()
        };
        let r = run(&f);
        assert_eq!(r.groups.len(), 1);
        let kinds: Vec<&str> = r.groups[0]
            .events
            .iter()
            .map(|e| e["kind"].as_str().unwrap())
            .collect();
        assert_eq!(
            kinds,
            [
                "model_version.rollout",
                "gpu.throttle.start",
                "latency.shift"
            ]
        );
        assert_eq!(r.groups[0].versions.len(), 1);
        assert_eq!(r.groups[0].versions[0].version, "v2");
        let empty = run(&Filter {
            model: Some("nope".into()),
            ..Filter::default()
        });
        assert!(empty.groups.is_empty());
        assert!(render(&empty).starts_with("nothing to explain"));
    }
}
