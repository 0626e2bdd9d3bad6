//! LMDeploy (<https://github.com/InternLM/lmdeploy>):
//! `lmdeploy serve api_server MODEL`, OpenAI-compatible.

use super::{ModelFlags, Spec};

pub(super) const SPEC: Spec = Spec {
    name: "lmdeploy",
    title: "LMDeploy",
    cmdline: &["lmdeploy"],
    server_header: &[],
    model_flags: Some(ModelFlags {
        path_flags: &[],
        name_flags: &["--model-name"],
        names_take_many: false,
        positional_after: Some("api_server"),
        qualifier_flags: &["--revision"],
    }),
    metrics: None,
    info: None,
    dist: Some("lmdeploy"),
    quiet_flags: &["--server-name", "--server-port"],
};
