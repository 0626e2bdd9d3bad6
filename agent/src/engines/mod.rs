//! The engine catalogue: every inference engine tokentap knows, one file
//! each, holding all it knows about that engine — how its command line
//! looks (discovery), which flags name its model (model version), which
//! Prometheus names carry its queue and KV-cache state (engine metrics
//! scrape), and what it says about itself on the wire (`Server` header).
//!
//! Adding an engine: a file here with its [`Spec`], an [`Engine`] variant
//! and its arm in [`Engine::spec`], and its golden transcript under
//! `tests/golden/`. Wire formats (how its API's bodies and streams read)
//! are `crate::decode::formats`, shared by engines that speak the same API.
//!
//! Owns: data only. Must not: import any other room (it is on the ground
//! floor), read /proc or the network.

mod llamacpp;
mod lmdeploy;
mod ollama;
mod sglang;
mod tgi;
mod triton;
mod vllm;

use std::fmt;

/// A known inference engine. Its [`name`](Engine::name) is the value of
/// `gen_ai.provider.name`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Engine {
    Vllm,
    Sglang,
    Tgi,
    LlamaCpp,
    Ollama,
    Triton,
    Lmdeploy,
}

/// Everything the agent knows about one engine.
#[derive(Debug)]
pub struct Spec {
    /// `gen_ai.provider.name`.
    pub name: &'static str,
    /// How people write its name (`vLLM`, `llama.cpp`): in help and
    /// messages.
    pub title: &'static str,
    /// Lowercase fragments of a command line that runs this engine's
    /// server (or its launcher).
    pub cmdline: &'static [&'static str],
    /// Lowercase fragments of a `Server` response header it sends.
    pub server_header: &'static [&'static str],
    /// How its command line names the model it serves; `None` when it
    /// names none (Ollama loads models per request, Triton serves a
    /// repository of many).
    pub model_flags: Option<ModelFlags>,
    /// The Prometheus names of its own `/metrics` endpoint; `None` when it
    /// serves none tokentap reads.
    pub metrics: Option<MetricNames>,
    /// Its own info endpoint (the engine's build, effective settings);
    /// `None` when it has none.
    pub info: Option<InfoEndpoint>,
    /// The Python distribution whose installed metadata (`NAME-*.dist-info`)
    /// names its version, for an engine that is one.
    pub dist: Option<&'static str>,
    /// Its flags that do not change how it serves (besides
    /// [`QUIET_FLAGS`]): left out of the serving configuration.
    pub quiet_flags: &'static [&'static str],
}

/// Flags of any engine that do not change how it serves: where it listens,
/// what it logs, where its files and certificates are. Left out of the
/// serving configuration (a moved port is not a new configuration).
pub const QUIET_FLAGS: &[&str] = &[
    "--host",
    "--port",
    "--addr",
    "--hostname",
    "--uds",
    "--log-level",
    "--uvicorn-log-level",
    "--log-file",
    "--log-format",
    "--log-disable",
    "--verbose",
    "-v",
    "--disable-log-requests",
    "--disable-log-stats",
    "--enable-log-requests",
    "--ssl-certfile",
    "--ssl-keyfile",
    "--ssl-ca-certs",
    "--ssl-cert-file",
    "--ssl-key-file",
    "--metrics-port",
    "--prometheus-port",
    "--download-dir",
];

/// Words that make a flag a secret when one is a whole word of its name
/// (split at `-` and `_`): `--api-key`, `--hf-token`, `--auth-password`,
/// but not `--max-num-batched-tokens` nor `--tokenizer`. Its value is
/// dropped before anything is hashed, kept or shown.
pub const SECRET_WORDS: &[&str] = &[
    "key",
    "keys",
    "apikey",
    "token",
    "password",
    "passwd",
    "secret",
    "secrets",
    "credential",
    "credentials",
    "auth",
];

/// An engine's own endpoint about itself: `GET path`, a JSON object.
#[derive(Debug)]
pub struct InfoEndpoint {
    pub path: &'static str,
    /// JSON pointer (RFC 6901) of its version string.
    pub version: &'static str,
    /// Effective serving settings it reports: (name in the serving
    /// configuration, JSON pointer); for a name listed twice (renamed
    /// across versions), the first present wins.
    pub settings: &'static [(&'static str, &'static str)],
}

/// How an engine's command line names what it serves.
#[derive(Debug)]
pub struct ModelFlags {
    /// Flags whose value is a model path or hub id.
    pub path_flags: &'static [&'static str],
    /// Flags whose value is a name clients use.
    pub name_flags: &'static [&'static str],
    /// `--served-model-name a b c` (vLLM: several names).
    pub names_take_many: bool,
    /// A subcommand whose first positional argument is the model
    /// (`vllm serve MODEL`, `lmdeploy serve api_server MODEL`).
    pub positional_after: Option<&'static str>,
    /// Other options that select a build (`--revision`).
    pub qualifier_flags: &'static [&'static str],
}

/// One engine's Prometheus names. Several names for one quantity are the
/// same thing across versions, newest first: the first present wins.
#[derive(Debug)]
pub struct MetricNames {
    /// Fraction 0–1 of the KV cache in use.
    pub kv_cache_usage: &'static [&'static str],
    /// Requests accepted but not yet scheduled.
    pub requests_waiting: &'static [&'static str],
    /// Requests in the running batch (or a busy slot).
    pub requests_running: &'static [&'static str],
}

impl Engine {
    /// Every known engine, in the order command lines are matched (a
    /// command line naming two engines is the first one's).
    pub const ALL: [Engine; 7] = [
        Engine::Vllm,
        Engine::Sglang,
        Engine::Tgi,
        Engine::LlamaCpp,
        Engine::Ollama,
        Engine::Triton,
        Engine::Lmdeploy,
    ];

    pub fn spec(self) -> &'static Spec {
        match self {
            Engine::Vllm => &vllm::SPEC,
            Engine::Sglang => &sglang::SPEC,
            Engine::Tgi => &tgi::SPEC,
            Engine::LlamaCpp => &llamacpp::SPEC,
            Engine::Ollama => &ollama::SPEC,
            Engine::Triton => &triton::SPEC,
            Engine::Lmdeploy => &lmdeploy::SPEC,
        }
    }

    /// `gen_ai.provider.name`.
    pub fn name(self) -> &'static str {
        self.spec().name
    }

    /// Every engine's title, in catalogue order, joined with `, ` (help
    /// texts and messages list the engines from here, never by hand).
    pub fn titles() -> String {
        Engine::ALL.map(|e| e.spec().title).join(", ")
    }

    /// The engine a name (`gen_ai.provider.name`) stands for.
    pub fn from_name(name: &str) -> Option<Engine> {
        Engine::ALL.into_iter().find(|e| e.name() == name)
    }

    /// The engine a command line runs, if any.
    pub fn from_cmdline(cmdline: &str) -> Option<Engine> {
        let c = cmdline.to_ascii_lowercase();
        Engine::ALL
            .into_iter()
            .find(|e| e.spec().cmdline.iter().any(|p| c.contains(p)))
    }

    /// The engine a `Server` response header names, if any.
    pub fn from_server_header(server: &str) -> Option<Engine> {
        let s = server.to_ascii_lowercase();
        Engine::ALL
            .into_iter()
            .find(|e| e.spec().server_header.iter().any(|p| s.contains(p)))
    }
}

impl fmt::Display for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_round_trip() {
        for e in Engine::ALL {
            assert_eq!(Engine::from_name(e.name()), Some(e));
        }
        let mut names: Vec<_> = Engine::ALL.iter().map(|e| e.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Engine::ALL.len());
        assert_eq!(Engine::from_name("nginx"), None);
    }

    #[test]
    fn patterns_are_lowercase_so_matching_is_case_blind() {
        for e in Engine::ALL {
            let s = e.spec();
            for p in s.cmdline.iter().chain(s.server_header) {
                assert_eq!(*p, p.to_ascii_lowercase(), "{e}: {p}");
            }
        }
    }

    #[test]
    fn known_engines_are_named_from_their_command_lines() {
        let cases = [
            (
                "python3 -m vllm.entrypoints.openai.api_server --model x",
                Some(Engine::Vllm),
            ),
            ("python3 -m sglang.launch_server", Some(Engine::Sglang)),
            (
                "/usr/bin/llama-server -m m.gguf --port 8080",
                Some(Engine::LlamaCpp),
            ),
            (
                "python -m llama_cpp.server --model m.gguf",
                Some(Engine::LlamaCpp),
            ),
            ("text-generation-router --port 80", Some(Engine::Tgi)),
            ("/bin/ollama serve", Some(Engine::Ollama)),
            ("tritonserver --model-repository /r", Some(Engine::Triton)),
            ("lmdeploy serve api_server m", Some(Engine::Lmdeploy)),
            ("nginx: worker process", None),
        ];
        for (cmd, want) in cases {
            assert_eq!(Engine::from_cmdline(cmd), want, "{cmd}");
        }
    }

    #[test]
    fn server_headers_name_the_engines_that_send_one() {
        assert_eq!(
            Engine::from_server_header("llama.cpp"),
            Some(Engine::LlamaCpp)
        );
        assert_eq!(
            Engine::from_server_header("Ollama/0.5"),
            Some(Engine::Ollama)
        );
        assert_eq!(
            Engine::from_server_header("text-generation-inference/2.0"),
            Some(Engine::Tgi)
        );
        assert_eq!(Engine::from_server_header("uvicorn"), None);
    }
}
