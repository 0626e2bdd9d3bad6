//! Text Generation Inference (<https://github.com/huggingface/text-generation-inference>):
//! the launcher starts a Rust router (HTTP) and Python shards.

use super::{MetricNames, ModelFlags, Spec};

pub(super) const SPEC: Spec = Spec {
    name: "tgi",
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
};
