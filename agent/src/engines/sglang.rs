//! SGLang (<https://github.com/sgl-project/sglang>):
//! `python -m sglang.launch_server --model-path M`.

use super::{InfoEndpoint, MetricNames, ModelFlags, Spec};

pub(super) const SPEC: Spec = Spec {
    name: "sglang",
    title: "SGLang",
    cmdline: &["sglang"],
    server_header: &[],
    model_flags: Some(ModelFlags {
        path_flags: &["--model-path", "--model"],
        name_flags: &["--served-model-name"],
        names_take_many: false,
        positional_after: None,
        qualifier_flags: &["--revision"],
    }),
    metrics: Some(MetricNames {
        kv_cache_usage: &["sglang:token_usage"],
        requests_waiting: &["sglang:num_queue_reqs"],
        requests_running: &["sglang:num_running_reqs"],
    }),
    info: Some(InfoEndpoint {
        path: "/get_server_info",
        version: "/version",
        // What the scheduler settled on (computed from the GPU's memory
        // when not given).
        settings: &[
            ("max_total_num_tokens", "/max_total_num_tokens"),
            ("max_running_requests", "/max_running_requests"),
        ],
    }),
    dist: Some("sglang"),
    quiet_flags: &[],
};
