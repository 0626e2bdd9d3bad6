//! NVIDIA Triton Inference Server (`tritonserver`): the KServe v2
//! `generate` / `generate_stream` extension over HTTP.

use super::Spec;

pub(super) const SPEC: Spec = Spec {
    name: "triton",
    cmdline: &["tritonserver"],
    server_header: &[],
    // A model repository holds many models; the request names one.
    model_flags: None,
    // Its metrics (port 8002) carry no queue/KV names tokentap reads yet.
    metrics: None,
};
