//! Text Generation Inference (<https://github.com/huggingface/text-generation-inference>):
//! the launcher starts a Rust router (HTTP) and Python shards.

use super::{InfoEndpoint, MetricNames, ModelFlags, Spec};

pub(super) const SPEC: Spec = Spec {
    name: "tgi",
    title: "TGI",
    cmdline: &[
        "text-generation-router",
        "text-generation-launcher",
        "text_generation_server",
    ],
    server_header: &["text-generation-inference"],
    model_flags: Some(ModelFlags {
        path_flags: &["--model-id"],
        name_flags: &["--served-model-name"],
        names_take_many: false,
        positional_after: None,
        qualifier_flags: &["--revision"],
    }),
    metrics: Some(MetricNames {
        // TGI exports no KV-cache gauge.
        kv_cache_usage: &[],
        requests_waiting: &["tgi_queue_size"],
        requests_running: &["tgi_batch_current_size"],
    }),
    info: Some(InfoEndpoint {
        path: "/info",
        version: "/version",
        // The router's effective limits (the batch budget is computed
        // from the GPU's memory when not given).
        settings: &[
            ("max_batch_total_tokens", "/max_batch_total_tokens"),
            ("max_batch_prefill_tokens", "/max_batch_prefill_tokens"),
            ("max_concurrent_requests", "/max_concurrent_requests"),
            ("max_input_tokens", "/max_input_tokens"),
            // Before TGI 2.0.
            ("max_input_tokens", "/max_input_length"),
            ("max_total_tokens", "/max_total_tokens"),
            ("model_dtype", "/model_dtype"),
        ],
    }),
    dist: None,
    quiet_flags: &[
        "--json-output",
        "--otlp-endpoint",
        "--otlp-service-name",
        "--cors-allow-origin",
    ],
};
