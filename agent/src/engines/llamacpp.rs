//! llama.cpp's server (`llama-server`, <https://github.com/ggml-org/llama.cpp>)
//! and llama-cpp-python's (`python -m llama_cpp.server`).

use super::{InfoEndpoint, MetricNames, ModelFlags, Spec};

pub(super) const SPEC: Spec = Spec {
    name: "llama.cpp",
    title: "llama.cpp",
    cmdline: &["llama-server", "llama_cpp.server", "llama-cpp-python"],
    server_header: &["llama.cpp"],
    model_flags: Some(ModelFlags {
        // llama-server: -m/--model, -hf/--hf-repo, -a/--alias;
        // llama-cpp-python: --model, --model_alias.
        path_flags: &["-m", "--model", "-hf", "-hfr", "--hf-repo"],
        name_flags: &["-a", "--alias", "--model_alias"],
        names_take_many: false,
        positional_after: None,
        qualifier_flags: &[],
    }),
    metrics: Some(MetricNames {
        // Removed from llama-server in 2025 (the test peers' build has
        // none); older servers still export it.
        kv_cache_usage: &["llamacpp:kv_cache_usage_ratio"],
        requests_waiting: &["llamacpp:requests_deferred"],
        requests_running: &["llamacpp:requests_processing"],
    }),
    info: Some(InfoEndpoint {
        path: "/props",
        version: "/build_info",
        settings: &[
            ("n_ctx", "/default_generation_settings/n_ctx"),
            ("total_slots", "/total_slots"),
        ],
    }),
    dist: Some("llama_cpp_python"),
    quiet_flags: &["--no-webui", "--slot-save-path", "--metrics", "--props"],
};
