//! Engine-reported state, zero-code: the Prometheus metrics an inference
//! engine already serves on its own port (vLLM, SGLang, TGI, llama.cpp's
//! server with `--metrics`), scraped and reduced to what request metrics
//! cannot say — KV-cache usage and the waiting/running request counts.
//!
//! Owns: the reduction of one exposition to an [`EngineState`] (the metric
//! names are each engine's, in the catalogue `crate::engines`, checked
//! against the engines' sources and docs, see docs/metrics.md). [`prom`] parses, [`scrape`] fetches
//! (in the engine's network namespace, on its own thread).
//!
//! Must not: export anything (the pipeline maps [`EngineState`] to
//! `tokentap.engine.*`), block the capture loop, or let a scrape become an
//! LLM request record (scrapes carry the own-traffic token,
//! `crate::selftraffic`).

pub mod info;
pub mod instruments;
pub mod prom;
pub mod scrape;
pub mod task;

use crate::engines::{Engine, MetricNames};

pub use scrape::{ScrapeError, ScrapeHandle, ScrapeStats, Scraper, Target};

/// What one engine reported at one scrape. `None`: the engine does not
/// expose that quantity (TGI has no KV-cache gauge; current llama.cpp
/// servers dropped theirs) or the value was unusable (NaN, out of range).
///
/// An engine serving several label sets (vLLM's `engine` label with data
/// parallelism, one `model_name` per served model) is reduced to one state
/// per process: request counts are **summed** over label sets; KV-cache
/// usage is the **maximum** (each engine core has its own cache, and the
/// fullest one is the one that queues requests; a sum would leave 0–1).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EngineState {
    /// Fraction 0–1 of the KV cache in use.
    pub kv_cache_usage: Option<f64>,
    /// Requests accepted but not yet scheduled (queued).
    pub requests_waiting: Option<f64>,
    /// Requests being processed (in the running batch / a busy slot).
    pub requests_running: Option<f64>,
    /// The engine whose names matched; `None` when no known name was in
    /// the exposition.
    pub family: Option<Engine>,
}

/// The engines whose Prometheus names the catalogue knows, each with
/// its names.
fn families() -> impl Iterator<Item = (Engine, &'static MetricNames)> {
    Engine::ALL
        .into_iter()
        .filter_map(|e| e.spec().metrics.as_ref().map(|m| (e, m)))
}

/// Reduces an exposition to an [`EngineState`]. `engine` (as discovery
/// named the process) picks its names; `None` or an engine without known
/// names tries every engine's and keeps the first that matches any name.
pub fn engine_state(
    body: &[u8],
    engine: Option<Engine>,
    limits: &prom::Limits,
) -> Result<EngineState, prom::ParseError> {
    let candidates: Vec<(Engine, &'static MetricNames)> =
        match engine.and_then(|e| e.spec().metrics.as_ref().map(|m| (e, m))) {
            Some(f) => vec![f],
            None => families().collect(),
        };
    // Per family and quantity: which name (index into its list) was seen
    // first-choice-wise, and the aggregate over that name's label sets.
    #[derive(Clone, Copy, Default)]
    struct Acc {
        rank: Option<usize>,
        value: Option<f64>,
    }
    let mut acc = vec![[Acc::default(); 3]; candidates.len()];
    prom::parse_with(
        body,
        limits,
        |s| {
            for (fi, (_, fam)) in candidates.iter().enumerate() {
                let lists = [
                    fam.kv_cache_usage,
                    fam.requests_waiting,
                    fam.requests_running,
                ];
                for (q, names) in lists.iter().enumerate() {
                    let Some(rank) = names.iter().position(|n| *n == s.name) else {
                        continue;
                    };
                    let a = &mut acc[fi][q];
                    if a.rank.is_some_and(|r| r < rank) {
                        continue; // a preferred name is already in
                    }
                    if a.rank != Some(rank) {
                        *a = Acc {
                            rank: Some(rank),
                            value: None,
                        };
                    }
                    let v = s.value;
                    let usable = if q == 0 {
                        v.is_finite() && (0.0..=1.0).contains(&v)
                    } else {
                        v.is_finite() && v >= 0.0
                    };
                    if !usable {
                        continue;
                    }
                    a.value = Some(match (a.value, q) {
                        (None, _) => v,
                        (Some(old), 0) => old.max(v),
                        (Some(old), _) => old + v,
                    });
                }
            }
        },
        |_, _| {},
    )?;
    for (fi, (engine, _)) in candidates.iter().enumerate() {
        let [kv, waiting, running] = acc[fi];
        if kv.rank.is_none() && waiting.rank.is_none() && running.rank.is_none() {
            continue;
        }
        return Ok(EngineState {
            kv_cache_usage: kv.value,
            requests_waiting: waiting.value,
            requests_running: running.value,
            family: Some(*engine),
        });
    }
    Ok(EngineState::default())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(body: &str, engine: Option<Engine>) -> EngineState {
        engine_state(body.as_bytes(), engine, &prom::Limits::default()).expect("parse")
    }

    #[test]
    fn vllm_counts_sum_over_engines_and_kv_usage_is_the_fullest_cache() {
        let body = r#"
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
vllm:num_requests_waiting{engine="1",model_name="m"} 0.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.75
"#;
        assert_eq!(
            state(body, Some(Engine::Vllm)),
            EngineState {
                kv_cache_usage: Some(0.75),
                requests_waiting: Some(1.0),
                requests_running: Some(5.0),
                family: Some(Engine::Vllm),
            }
        );
    }

    #[test]
    fn vllm_newer_kv_name_wins_over_the_old_one_in_either_order() {
        let old_first = "vllm:gpu_cache_usage_perc 0.9\nvllm:kv_cache_usage_perc 0.1\n";
        let new_first = "vllm:kv_cache_usage_perc 0.1\nvllm:gpu_cache_usage_perc 0.9\n";
        assert_eq!(
            state(old_first, Some(Engine::Vllm)).kv_cache_usage,
            Some(0.1)
        );
        assert_eq!(
            state(new_first, Some(Engine::Vllm)).kv_cache_usage,
            Some(0.1)
        );
        // A v0 engine: only the old name.
        assert_eq!(
            state("vllm:gpu_cache_usage_perc{model_name=\"m\"} 0.4\n", None).kv_cache_usage,
            Some(0.4)
        );
    }

    #[test]
    fn family_is_detected_from_names_when_the_engine_is_unknown() {
        let sglang = "sglang:token_usage{model_name=\"m\"} 0.28\nsglang:num_queue_reqs{model_name=\"m\"} 4\nsglang:num_running_reqs{model_name=\"m\"} 12\n";
        assert_eq!(
            state(sglang, None),
            EngineState {
                kv_cache_usage: Some(0.28),
                requests_waiting: Some(4.0),
                requests_running: Some(12.0),
                family: Some(Engine::Sglang),
            }
        );
        let tgi = "tgi_queue_size 7\ntgi_batch_current_size 4\n";
        assert_eq!(
            state(tgi, Some(Engine::Ollama)),
            EngineState {
                kv_cache_usage: None,
                requests_waiting: Some(7.0),
                requests_running: Some(4.0),
                family: Some(Engine::Tgi),
            }
        );
    }

    #[test]
    fn llama_cpp_without_the_kv_gauge_reports_counts_only() {
        let body = "llamacpp:requests_processing 1\nllamacpp:requests_deferred 2\n";
        assert_eq!(
            state(body, Some(Engine::LlamaCpp)),
            EngineState {
                kv_cache_usage: None,
                requests_waiting: Some(2.0),
                requests_running: Some(1.0),
                family: Some(Engine::LlamaCpp),
            }
        );
        let older = "llamacpp:kv_cache_usage_ratio 0.5\nllamacpp:requests_processing 0\n";
        assert_eq!(state(older, None).kv_cache_usage, Some(0.5));
    }

    #[test]
    fn unusable_values_leave_the_field_empty() {
        let body = "vllm:kv_cache_usage_perc NaN\nvllm:num_requests_waiting -1\nvllm:num_requests_running +Inf\n";
        assert_eq!(
            state(body, Some(Engine::Vllm)),
            EngineState {
                family: Some(Engine::Vllm),
                ..EngineState::default()
            }
        );
        // A percentage (0–100) is not silently taken as a fraction.
        assert_eq!(state("sglang:token_usage 28\n", None).kv_cache_usage, None);
    }

    #[test]
    fn a_named_engine_ignores_other_families_names() {
        let body = "tgi_queue_size 7\n";
        assert_eq!(state(body, Some(Engine::Vllm)), EngineState::default());
    }

    #[test]
    fn an_exposition_without_known_names_is_an_empty_state() {
        assert_eq!(
            state("process_cpu_seconds_total 12\n", None),
            EngineState::default()
        );
    }
}
