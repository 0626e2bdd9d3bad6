//! vLLM (<https://github.com/vllm-project/vllm>): OpenAI-compatible server
//! (`vllm serve MODEL`, `python -m vllm.entrypoints.openai.api_server`).

use super::{InfoEndpoint, MetricNames, ModelFlags, Spec};

pub(super) const SPEC: Spec = Spec {
    name: "vllm",
    title: "vLLM",
    cmdline: &["vllm"],
    // uvicorn's own `Server: uvicorn` says nothing about the engine.
    server_header: &[],
    model_flags: Some(ModelFlags {
        path_flags: &["--model"],
        name_flags: &["--served-model-name"],
        names_take_many: true,
        positional_after: Some("serve"),
        qualifier_flags: &["--revision"],
    }),
    metrics: Some(MetricNames {
        // The V1 engine (0.7+) renamed gpu_cache_usage_perc; both are 0–1.
        kv_cache_usage: &["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"],
        requests_waiting: &["vllm:num_requests_waiting"],
        requests_running: &["vllm:num_requests_running"],
    }),
    info: Some(InfoEndpoint {
        path: "/version",
        version: "/version",
        settings: &[],
    }),
    dist: Some("vllm"),
    quiet_flags: &["--served-model-name-prefix"],
};
