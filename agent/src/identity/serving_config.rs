//! Serving configuration: what an engine process was told about how to
//! serve — its command-line flags, normalised, plus the effective settings
//! its info endpoint reports (`engine_info`) — and a short version of it.
//!
//! Normalising a command line (the program's own arguments, after a Python
//! interpreter and its `-m MODULE`):
//! * `--flag value`, `--flag=value`, `-f value`: the key is the flag without
//!   its dashes, `_` read as `-`, lowercase (`--max_num_seqs` =
//!   `--max-num-seqs`); a flag without a value is `true`; a repeated flag's
//!   values are joined by `,` in order;
//! * positional arguments are not flags (the model, `serve`);
//! * left out: the flags that name the model (its version covers them),
//!   flags that do not change serving ([`QUIET_FLAGS`] and the engine's
//!   own: listen address, logging, certificates), and **secrets**: a flag
//!   with a word of [`SECRET_WORDS`] in its name (`--api-key`,
//!   `--hf-token`) is dropped with its value before anything is hashed,
//!   kept or shown.
//!
//! The version: the first 12 hex digits of SHA-256 over the sorted
//! `key=value` lines. Nothing per process goes in (no pid, port or path of
//! a log), so a restart with the same flags keeps the version.
//!
//! Owns: the normalisation and the version. Must not: keep a secret's value
//! anywhere, even briefly in a map.

use std::{collections::BTreeMap, path::Path};

use sha2::{Digest as _, Sha256};

use crate::engines::{Engine, QUIET_FLAGS, SECRET_WORDS};

/// Hex characters of the SHA-256 kept as the version.
pub const VERSION_HEX_CHARS: usize = 12;
/// Longest value kept (a longer one is cut and ends with `…`).
pub const MAX_VALUE_CHARS: usize = 256;
/// Flags kept at most (a command line of thousands of flags is cut).
pub const MAX_PARAMS: usize = 256;

/// An engine process's serving parameters and their version.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServingConfig {
    /// Normalised key → value (`max-num-seqs` → `64`; info endpoint
    /// settings as `info.NAME`).
    pub params: BTreeMap<String, String>,
    /// [`version_of`] `params`.
    pub version: String,
}

impl ServingConfig {
    pub fn new(params: BTreeMap<String, String>) -> Self {
        let version = version_of(&params);
        Self { params, version }
    }

    /// Adds the effective settings an info endpoint reported (`info.NAME`)
    /// and recomputes the version.
    pub fn with_settings(mut self, settings: &BTreeMap<String, String>) -> Self {
        for (k, v) in settings {
            if !is_secret(k) {
                self.params.insert(format!("info.{k}"), bounded(v));
            }
        }
        Self::new(self.params)
    }
}

/// Whether a flag (or setting) name is a secret's: one of its words (split
/// at `-`, `_` and `.`) is in [`SECRET_WORDS`].
pub fn is_secret(name: &str) -> bool {
    name.trim_start_matches('-')
        .split(['-', '_', '.'])
        .any(|w| SECRET_WORDS.contains(&w.to_ascii_lowercase().as_str()))
}

fn key_of(flag: &str) -> String {
    flag.trim_start_matches('-')
        .replace('_', "-")
        .to_ascii_lowercase()
}

fn bounded(v: &str) -> String {
    if v.chars().count() <= MAX_VALUE_CHARS {
        return v.to_string();
    }
    let mut cut: String = v.chars().take(MAX_VALUE_CHARS).collect();
    cut.push('…');
    cut
}

/// Credentials a value carries under a flag name that does not say so:
/// the user information of a URL (`https://user:pass@host/…` →
/// `https://***@host/…`) and API-key-shaped words (`sk-…`, `hf_…`,
/// `ghp_…`, `xoxb-…`, a JWT's `eyJ…`), each replaced by `***`.
pub fn redacted(v: &str) -> String {
    const KEY_PREFIXES: [&str; 6] = ["sk-", "hf_", "ghp_", "gho_", "xoxb-", "eyJ"];
    let mut out = String::with_capacity(v.len());
    let mut rest = v;
    while let Some(i) = rest.find("://") {
        let (head, tail) = rest.split_at(i + 3);
        out.push_str(head);
        let end = tail.find(['/', '?', '#', ' ', ',']).unwrap_or(tail.len());
        match tail[..end].rfind('@') {
            Some(at) => {
                out.push_str("***");
                out.push_str(&tail[at..end]);
            }
            None => out.push_str(&tail[..end]),
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    out.split_inclusive([' ', ',', '=', ':', ';'])
        .map(|w| {
            let word = w.trim_end_matches([' ', ',', '=', ':', ';']);
            let long = word.len() >= 16;
            if long && KEY_PREFIXES.iter().any(|p| word.starts_with(p)) {
                format!("***{}", &w[word.len()..])
            } else {
                w.to_string()
            }
        })
        .collect()
}

/// A value after a flag: not another flag (a negative number is a value).
fn is_value(a: &str) -> bool {
    !a.starts_with('-') || a[1..].starts_with(|c: char| c.is_ascii_digit() || c == '.')
}

/// The serving parameters `engine`'s command line (`args`, argv split at
/// NULs) sets.
pub fn params_from_args(engine: Engine, args: &[String]) -> BTreeMap<String, String> {
    let spec = engine.spec();
    let model_flags: Vec<&str> = spec
        .model_flags
        .as_ref()
        .map(|m| {
            m.path_flags
                .iter()
                .chain(m.name_flags)
                .chain(m.qualifier_flags)
                .copied()
                .collect()
        })
        .unwrap_or_default();
    let skipped: Vec<String> = model_flags
        .iter()
        .chain(QUIET_FLAGS)
        .chain(spec.quiet_flags)
        .map(|f| key_of(f))
        .collect();
    let takes_many = spec.model_flags.as_ref().is_some_and(|m| m.names_take_many);
    let names: Vec<String> = spec
        .model_flags
        .as_ref()
        .map(|m| m.name_flags.iter().map(|f| key_of(f)).collect())
        .unwrap_or_default();
    let args = super::model_version::program_args(args);
    let mut out: BTreeMap<String, String> = BTreeMap::new();
    let mut i = 0;
    while i < args.len() {
        let a = args[i].as_str();
        i += 1;
        if !a.starts_with('-') || a == "-" || a == "--" {
            continue;
        }
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) => (f, Some(v.to_string())),
            None => (a, None),
        };
        let key = key_of(flag);
        let value = match inline {
            Some(v) => v,
            None => match args.get(i).filter(|v| is_value(v)) {
                Some(v) => {
                    i += 1;
                    v.clone()
                }
                None => "true".to_string(),
            },
        };
        // `--served-model-name a b c`: the names after the first too.
        if takes_many && names.contains(&key) {
            while args.get(i).is_some_and(|v| !v.starts_with('-')) {
                i += 1;
            }
        }
        if key.is_empty() || is_secret(&key) || skipped.contains(&key) {
            continue;
        }
        if out.len() >= MAX_PARAMS && !out.contains_key(&key) {
            continue;
        }
        let value = bounded(&redacted(&value));
        out.entry(key)
            .and_modify(|v| {
                v.push(',');
                v.push_str(&value);
            })
            .or_insert(value);
    }
    out
}

/// The version of a parameter set (12 hex digits).
pub fn version_of(params: &BTreeMap<String, String>) -> String {
    let mut h = Sha256::new();
    for (k, v) in params {
        h.update(k.as_bytes());
        h.update(b"=");
        h.update(v.as_bytes());
        h.update(b"\n");
    }
    let d = h.finalize();
    d.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<String>()
        .chars()
        .take(VERSION_HEX_CHARS)
        .collect()
}

/// A serving process's configuration from its command line
/// (`/proc/PID/cmdline`); `None` for an unknown engine or process.
pub fn of_process(proc_root: &Path, pid: u32, engine: Option<Engine>) -> Option<ServingConfig> {
    let engine = engine?;
    let args = crate::host::procfs::proc_args(proc_root, pid)?;
    Some(ServingConfig::new(params_from_args(engine, &args)))
}

/// One changed parameter: (key, old value, new value); a key only one side
/// has is `None` on the other.
pub type Change = (String, Option<String>, Option<String>);

/// What changed from `old` to `new`, sorted by key.
pub fn changes(old: &BTreeMap<String, String>, new: &BTreeMap<String, String>) -> Vec<Change> {
    let mut keys: Vec<&String> = old.keys().chain(new.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter(|k| old.get(*k) != new.get(*k))
        .map(|k| ((*k).clone(), old.get(k).cloned(), new.get(k).cloned()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split(' ').map(String::from).collect()
    }

    fn params(e: Engine, s: &str) -> BTreeMap<String, String> {
        params_from_args(e, &args(s))
    }

    #[test]
    fn vllm_flags_are_normalised_and_the_model_host_and_port_left_out() {
        let p = params(
            Engine::Vllm,
            "/opt/venv/bin/python3 -m vllm.entrypoints.openai.api_server --model /m/llama \
             --served-model-name a b --host 0.0.0.0 --port 8000 --max_num_seqs 64 \
             --kv-cache-dtype=fp8 --enable-prefix-caching --gpu-memory-utilization 0.9 \
             --uvicorn-log-level warning",
        );
        let want: BTreeMap<String, String> = [
            ("enable-prefix-caching", "true"),
            ("gpu-memory-utilization", "0.9"),
            ("kv-cache-dtype", "fp8"),
            ("max-num-seqs", "64"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(p, want);
    }

    #[test]
    fn secrets_are_dropped_with_their_values_and_counts_named_tokens_are_not() {
        let p = params(
            Engine::Vllm,
            "vllm serve m --api-key sk-SECRET1 --hf-token=hf_SECRET2 --max-num-batched-tokens 8192 \
             --tokenizer /t --auth-password SECRET3 --ssl-keyfile /k.pem",
        );
        let all = format!("{p:?}");
        for s in [
            "SECRET1", "SECRET2", "SECRET3", "api-key", "hf-token", "/k.pem",
        ] {
            assert!(!all.contains(s), "{s} in {all}");
        }
        assert_eq!(
            p.get("max-num-batched-tokens").map(String::as_str),
            Some("8192")
        );
        assert_eq!(p.get("tokenizer").map(String::as_str), Some("/t"));
        // The secret does not enter the version either: the same flags
        // without it give the same version.
        let without = params(
            Engine::Vllm,
            "vllm serve m --max-num-batched-tokens 8192 --tokenizer /t",
        );
        assert_eq!(version_of(&p), version_of(&without));
    }

    #[test]
    fn credentials_in_values_of_innocent_flags_are_redacted() {
        let p = params(
            Engine::Vllm,
            "vllm serve m --lora-modules a=https://bob:SECRET4@hub.local/a,b=/b \
             --otlp-traces-endpoint http://collector:4317 \
             --extra hf_abcdefghijklmnopqrstuvwxyz",
        );
        let all = format!("{p:?}");
        assert!(!all.contains("SECRET4") && !all.contains("bob"), "{all}");
        assert!(!all.contains("hf_abcdefghijklmnop"), "{all}");
        assert_eq!(p["lora-modules"], "a=https://***@hub.local/a,b=/b");
        assert_eq!(p["otlp-traces-endpoint"], "http://collector:4317");
        assert_eq!(p["extra"], "***");
        // A short word with such a prefix is no key.
        assert_eq!(redacted("sk-1"), "sk-1");
    }

    #[test]
    fn llama_cpp_short_flags_and_negative_values_are_parameters() {
        let p = params(
            Engine::LlamaCpp,
            "/usr/bin/llama-server -m /m.gguf -a tiny -c 4096 -np 4 -ngl 99 --temp -1 --port 8080 --cont-batching",
        );
        assert_eq!(p.get("c").map(String::as_str), Some("4096"));
        assert_eq!(p.get("np").map(String::as_str), Some("4"));
        assert_eq!(p.get("temp").map(String::as_str), Some("-1"));
        assert_eq!(p.get("cont-batching").map(String::as_str), Some("true"));
        assert!(!p.contains_key("m") && !p.contains_key("a") && !p.contains_key("port"));
    }

    #[test]
    fn the_version_follows_the_parameters_not_their_order_or_the_process() {
        let a = params(
            Engine::Sglang,
            "python -m sglang.launch_server --model-path m --tp 2 --mem-fraction-static 0.8",
        );
        let b = params(Engine::Sglang, "python3 -m sglang.launch_server --mem-fraction-static 0.8 --port 30001 --tp 2 --model-path m");
        assert_eq!(version_of(&a), version_of(&b));
        assert_eq!(version_of(&a).len(), VERSION_HEX_CHARS);
        let c = params(
            Engine::Sglang,
            "python -m sglang.launch_server --model-path m --tp 4 --mem-fraction-static 0.8",
        );
        assert_ne!(version_of(&a), version_of(&c));
        assert_eq!(
            changes(&a, &c),
            vec![(
                "tp".to_string(),
                Some("2".to_string()),
                Some("4".to_string())
            )]
        );
    }

    #[test]
    fn info_settings_join_the_set_and_a_secret_setting_does_not() {
        let c = ServingConfig::new(params(Engine::Tgi, "text-generation-launcher --model-id m"));
        let s: BTreeMap<String, String> = [("max_batch_total_tokens", "16000"), ("api_key", "x")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let d = c.clone().with_settings(&s);
        assert_eq!(
            d.params
                .get("info.max_batch_total_tokens")
                .map(String::as_str),
            Some("16000")
        );
        assert!(!format!("{d:?}").contains("api_key"));
        assert_ne!(c.version, d.version);
    }

    #[test]
    fn repeated_flags_join_and_long_values_are_cut() {
        let long = "x".repeat(MAX_VALUE_CHARS + 10);
        let p = params(
            Engine::Vllm,
            &format!("vllm serve m --lora-modules a=/a --lora-modules b=/b --chat-template {long}"),
        );
        assert_eq!(p.get("lora-modules").map(String::as_str), Some("a=/a,b=/b"));
        assert_eq!(p["chat-template"].chars().count(), MAX_VALUE_CHARS + 1);
    }
}
