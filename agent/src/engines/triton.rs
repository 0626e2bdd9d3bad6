//! NVIDIA Triton Inference Server (`tritonserver`): the KServe v2
//! `generate` / `generate_stream` extension over HTTP.

use super::{InfoEndpoint, Spec};

pub(super) const SPEC: Spec = Spec {
    name: "triton",
    title: "Triton",
    cmdline: &["tritonserver"],
    server_header: &[],
    // A model repository holds many models; the request names one.
    model_flags: None,
    // Its metrics (port 8002) carry no queue/KV names tokentap reads yet.
    metrics: None,
    info: Some(InfoEndpoint {
        path: "/v2",
        version: "/version",
        settings: &[],
    }),
    dist: None,
    quiet_flags: &[
        "--http-port",
        "--grpc-port",
        "--metrics-port",
        "--log-verbose",
        "--log-info",
        "--log-warning",
        "--log-error",
    ],
};
