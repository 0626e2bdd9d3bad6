//! Ollama (<https://github.com/ollama/ollama>): `ollama serve`, its own
//! `/api/chat` and `/api/generate` besides the OpenAI-compatible API.

use super::{InfoEndpoint, Spec};

pub(super) const SPEC: Spec = Spec {
    name: "ollama",
    title: "Ollama",
    cmdline: &["ollama"],
    server_header: &["ollama"],
    // Models are loaded per request; the command line names none.
    model_flags: None,
    // No Prometheus endpoint.
    metrics: None,
    info: Some(InfoEndpoint {
        path: "/api/version",
        version: "/version",
        settings: &[],
    }),
    dist: None,
    quiet_flags: &[],
};
