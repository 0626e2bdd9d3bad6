//! Which tokenizer an engine process loaded, found as the engine finds it
//! and read from the engine's own files (`host::rootfs`, under
//! `/proc/PID/root`): the model or tokenizer its command line names — a
//! local directory, or a hub id resolved through the Hugging Face cache as
//! `huggingface_hub` does (`HF_HUB_CACHE`, `HUGGINGFACE_HUB_CACHE`,
//! `HF_HOME`/hub, `XDG_CACHE_HOME`/huggingface/hub, else the engine
//! user's `~/.cache/huggingface/hub`, from `/proc/PID/environ`;
//! `models--ORG--NAME/refs/REV` → `snapshots/HASH/`) — and its
//! `tokenizer.json`, `tokenizer_config.json`, `chat_template.jinja` and
//! the engine's `--chat-template` file.
//!
//! Loaded tokenizers are shared ([`Loader`]): keyed by the files' device,
//! inode, size and modification time (and the template), so eight engines
//! serving one model load it once.
//!
//! Owns: the per-engine flags that name a tokenizer, the cache lookup,
//! the bounds on what is read. Must not: run on the pipeline's thread
//! (the targeting task's facts reader calls it), or read outside the
//! engine's root.

use std::{
    collections::HashMap,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    sync::Arc,
};

use crate::engines::Engine;
use crate::host::{procfs, rootfs::Root};
use crate::tokenize::{gguf, HfFiles, Tokenizer};

/// `tokenizer.json` read at most (the largest public ones are ~35 MB).
pub const MAX_TOKENIZER_JSON: u64 = 64 << 20;
/// `tokenizer_config.json` and a chat template read at most.
pub const MAX_CONFIG: u64 = 4 << 20;
/// A GGUF model's head read at most for its metadata (vocabularies of
/// 256k tokens with merges take ~15 MB; the tensors after it are never
/// read).
pub const MAX_GGUF_HEAD: u64 = 64 << 20;
/// Tokenizers kept loaded at most (distinct files on the node).
pub const MAX_LOADED: usize = 16;

/// How finding an engine's tokenizer ended:
/// `tokentap.tokens.tokenizer`'s `state`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum State {
    /// Loaded (or shared with another engine that loaded the same files).
    Loaded,
    /// The command line names no model, or its files are not there (a
    /// hub id not in the cache, a directory without `tokenizer.json`).
    NotFound,
    /// The engine reads a format this agent does not tokenize (Ollama,
    /// which serves many models from one process; Triton's backends;
    /// llama-server started with a model from `-hf`).
    Unsupported,
    /// The files are there but the tokenizer or its chat template does
    /// not build, or a file is larger than allowed.
    Invalid,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Loaded => "loaded",
            State::NotFound => "not_found",
            State::Unsupported => "unsupported",
            State::Invalid => "invalid",
        }
    }
}

/// What was found for one engine process.
#[derive(Clone)]
pub struct Found {
    pub state: State,
    pub tokenizer: Option<Arc<Tokenizer>>,
    /// Where it came from, or why not (one line, for the operator).
    pub detail: String,
}

impl Found {
    fn not(state: State, detail: impl Into<String>) -> Found {
        Found {
            state,
            tokenizer: None,
            detail: detail.into(),
        }
    }
}

/// What an engine's command line says about its tokenizer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Wanted {
    /// A directory or hub id.
    pub source: Option<String>,
    /// A hub revision (branch, tag or commit).
    pub revision: Option<String>,
    /// A hub cache directory the engine was told to use.
    pub cache_dir: Option<String>,
    /// A chat template: a file, or (vLLM) the template itself.
    pub chat_template: Option<String>,
}

/// The value of `--flag v` / `--flag=v` anywhere in `args` (the last wins).
fn flag(args: &[String], names: &[&str]) -> Option<String> {
    let mut found = None;
    for (i, a) in args.iter().enumerate() {
        for n in names {
            if a == n {
                if let Some(v) = args.get(i + 1).filter(|v| !v.starts_with('-')) {
                    found = Some(v.clone());
                }
            } else if let Some(v) = a.strip_prefix(n).and_then(|r| r.strip_prefix('=')) {
                found = Some(v.to_string());
            }
        }
    }
    found
}

/// The tokenizer `engine`'s command line (`args`) and environment name.
pub fn wanted(engine: Engine, args: &[String], environ: &[u8]) -> Wanted {
    let served = super::model_version::served_from_args(engine, args);
    let args = super::model_version::program_args(args);
    let model = served.paths.first().cloned();
    let env = |k: &str| env_value(environ, k);
    match engine {
        Engine::Vllm => Wanted {
            source: flag(args, &["--tokenizer"]).or(model),
            revision: flag(args, &["--tokenizer-revision"]).or_else(|| flag(args, &["--revision"])),
            cache_dir: flag(args, &["--download-dir"]),
            chat_template: flag(args, &["--chat-template"]),
        },
        Engine::Sglang => Wanted {
            source: flag(args, &["--tokenizer-path"]).or(model),
            revision: flag(args, &["--revision"]),
            cache_dir: flag(args, &["--download-dir"]),
            chat_template: flag(args, &["--chat-template"]),
        },
        Engine::Tgi => Wanted {
            source: flag(args, &["--tokenizer-name"])
                .or(model)
                .or_else(|| env("MODEL_ID")),
            revision: flag(args, &["--revision"]).or_else(|| env("REVISION")),
            cache_dir: flag(args, &["--huggingface-hub-cache"]),
            chat_template: None,
        },
        Engine::Lmdeploy => Wanted {
            source: model,
            revision: flag(args, &["--revision"]),
            cache_dir: flag(args, &["--download-dir"]),
            chat_template: None,
        },
        // llama-server: `-m`/`--model` (or `LLAMA_ARG_MODEL`), a GGUF
        // file; `--chat-template-file` (a file) wins over
        // `--chat-template` (a template, or a built-in's name).
        Engine::LlamaCpp => Wanted {
            source: model.or_else(|| env("LLAMA_ARG_MODEL")),
            revision: None,
            cache_dir: None,
            chat_template: flag(args, &["--chat-template-file"])
                .or_else(|| env("LLAMA_ARG_CHAT_TEMPLATE_FILE"))
                .or_else(|| flag(args, &["--chat-template"]).map(|t| format!("{INLINE}{t}")))
                .or_else(|| env("LLAMA_ARG_CHAT_TEMPLATE").map(|t| format!("{INLINE}{t}"))),
        },
        _ => Wanted::default(),
    }
}

fn env_value(environ: &[u8], key: &str) -> Option<String> {
    let prefix = format!("{key}=");
    environ
        .split(|&b| b == 0)
        .find_map(|kv| kv.strip_prefix(prefix.as_bytes()))
        .filter(|v| !v.is_empty())
        .map(|v| String::from_utf8_lossy(v).into_owned())
}

/// The hub caches to look in, in `huggingface_hub`'s order of precedence
/// (an engine's own `--download-dir` first).
pub fn hub_caches(w: &Wanted, environ: &[u8]) -> Vec<PathBuf> {
    let env = |k: &str| env_value(environ, k);
    let mut out = Vec::new();
    if let Some(d) = &w.cache_dir {
        out.push(PathBuf::from(d));
    }
    if let Some(d) = env("HF_HUB_CACHE").or_else(|| env("HUGGINGFACE_HUB_CACHE")) {
        out.push(PathBuf::from(d));
    } else if let Some(h) = env("HF_HOME") {
        out.push(Path::new(&h).join("hub"));
    } else {
        let base = env("XDG_CACHE_HOME").map(PathBuf::from).unwrap_or_else(|| {
            Path::new(&env("HOME").unwrap_or_else(|| "/root".into())).join(".cache")
        });
        out.push(base.join("huggingface").join("hub"));
    }
    out
}

/// Whether `s` is a hub id (`org/name` or `name`), not a path.
fn hub_id(s: &str) -> bool {
    !s.starts_with('/')
        && !s.starts_with('.')
        && !s.starts_with('~')
        && s.split('/').count() <= 2
        && !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

/// The snapshot directory of hub id `id` at `revision` in `cache`.
fn snapshot(root: &Root, cache: &Path, id: &str, revision: Option<&str>) -> Option<PathBuf> {
    let repo = cache.join(format!("models--{}", id.replace('/', "--")));
    let rev = revision.unwrap_or("main");
    let is_commit = rev.len() == 40 && rev.bytes().all(|b| b.is_ascii_hexdigit());
    let hash = if is_commit {
        rev.to_string()
    } else {
        let r = root.read(&repo.join("refs").join(rev), 256).ok()?;
        String::from_utf8_lossy(&r).trim().to_string()
    };
    if hash.is_empty() || hash.contains('/') || hash.contains("..") {
        return None;
    }
    let dir = repo.join("snapshots").join(hash);
    root.stat(&dir).ok()?.is_dir().then_some(dir)
}

/// The key a loaded tokenizer is shared by.
type Key = (u64, u64, u64, i64, u64);

/// Loads tokenizers once per distinct set of files.
#[derive(Default)]
pub struct Loader {
    loaded: HashMap<Key, Arc<Tokenizer>>,
    order: Vec<Key>,
}

impl Loader {
    /// The tokenizer of process `pid` (under `proc_root`) running `engine`.
    pub fn find(&mut self, proc_root: &Path, pid: u32, engine: Option<Engine>) -> Found {
        let Some(engine) = engine else {
            return Found::not(State::NotFound, "no engine named");
        };
        match engine {
            Engine::Ollama => {
                return Found::not(
                    State::Unsupported,
                    "Ollama serves many models from one process (a tokenizer per request's model is not built yet)",
                )
            }
            Engine::Triton => {
                return Found::not(
                    State::Unsupported,
                    "Triton's backends load their own tokenizers: not read",
                )
            }
            _ => {}
        }
        let Some(args) = procfs::proc_args(proc_root, pid) else {
            return Found::not(State::NotFound, "process gone");
        };
        let environ = procfs::proc_environ(proc_root, pid).unwrap_or_default();
        let w = wanted(engine, &args, &environ);
        let Some(source) = w.source.clone() else {
            return Found::not(State::NotFound, "the command line names no model");
        };
        let root = match Root::of(proc_root, pid) {
            Ok(r) => r,
            Err(e) => return Found::not(State::NotFound, format!("its root: {e}")),
        };
        let cwd = std::fs::read_link(proc_root.join(pid.to_string()).join("cwd")).ok();
        let local = if source.starts_with('/') {
            Some(PathBuf::from(&source))
        } else {
            cwd.as_ref().map(|c| c.join(&source))
        };
        if engine == Engine::LlamaCpp {
            return match local {
                Some(f) => self.load_gguf(&root, &f, &w, cwd.as_deref()),
                None => Found::not(State::NotFound, format!("{source}: no model file")),
            };
        }
        let dir = match local.filter(|d| root.stat(d).is_ok_and(|m| m.is_dir())) {
            Some(d) => d,
            None if hub_id(&source) => {
                let caches = hub_caches(&w, &environ);
                match caches
                    .iter()
                    .find_map(|c| snapshot(&root, c, &source, w.revision.as_deref()))
                {
                    Some(d) => d,
                    None => {
                        return Found::not(
                            State::NotFound,
                            format!(
                                "{source}: not a directory, and not in the hub cache ({})",
                                caches
                                    .iter()
                                    .map(|c| c.display().to_string())
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            ),
                        )
                    }
                }
            }
            None => return Found::not(State::NotFound, format!("{source}: no such directory")),
        };
        self.load_dir(&root, &dir, &w, cwd.as_deref())
    }

    /// The tokenizer of GGUF model `file` (as llama-server sees it): the
    /// vocabulary and chat template from its metadata, never more than
    /// [`MAX_GGUF_HEAD`] bytes of it.
    pub fn load_gguf(&mut self, root: &Root, file: &Path, w: &Wanted, cwd: Option<&Path>) -> Found {
        let m = match root.stat(file) {
            Ok(m) if m.is_file() => m,
            Ok(_) => return Found::not(State::NotFound, format!("{}: not a file", file.display())),
            Err(e) => return Found::not(State::NotFound, format!("{}: {e}", file.display())),
        };
        let template = match w.chat_template.as_deref() {
            Some(t) => match t.strip_prefix(INLINE) {
                Some(inline) => Some(inline.to_string()),
                None => match root.read(&relative(t, cwd), MAX_CONFIG) {
                    Ok(b) => Some(String::from_utf8_lossy(&b).into_owned()),
                    Err(e) => {
                        return Found::not(State::Invalid, format!("--chat-template-file {t}: {e}"))
                    }
                },
            },
            None => None,
        };
        if let Some(t) = template
            .as_deref()
            .filter(|t| !is_template(t) && *t != "chatml")
        {
            // A built-in template's name: llama.cpp's own C++ renderer,
            // which this agent does not reproduce.
            return Found::not(
                State::Unsupported,
                format!("--chat-template {t}: a llama.cpp built-in template, not rendered here"),
            );
        }
        let key: Key = (
            m.dev(),
            m.ino(),
            m.size(),
            m.mtime(),
            template.as_deref().map_or(0, fnv),
        );
        let named = match w.chat_template.as_deref() {
            Some(t) if t.starts_with(INLINE) => {
                format!("{} with its --chat-template", file.display())
            }
            Some(t) => format!("{} with the chat template {t}", file.display()),
            None => file.display().to_string(),
        };
        if let Some(t) = self.loaded.get(&key) {
            return Found {
                state: State::Loaded,
                tokenizer: Some(t.clone()),
                detail: format!("{named} (shared)"),
            };
        }
        // The metadata's size is not known before it is parsed: 4 MiB
        // holds most vocabularies, larger ones are read again up to the
        // bound (a model's gigabytes of tensors never are).
        let mut want = 4 << 20;
        let built = loop {
            let (head, m) = match root.read_head(file, want) {
                Ok(h) => h,
                Err(e) => return Found::not(State::Invalid, format!("{}: {e}", file.display())),
            };
            match gguf::GgufVocab::from_gguf(&head) {
                Err(_) if want < MAX_GGUF_HEAD && (head.len() as u64) < m.len() => want *= 4,
                v => break v.and_then(|v| Tokenizer::from_gguf(v, template.as_deref())),
            }
        };
        match built {
            Ok(t) => Found {
                state: State::Loaded,
                tokenizer: Some(self.keep(key, t)),
                detail: named,
            },
            Err(e) => Found::not(State::Invalid, format!("{}: {e}", file.display())),
        }
    }

    /// Keeps a loaded tokenizer under `key` (the oldest goes past
    /// [`MAX_LOADED`]).
    fn keep(&mut self, key: Key, t: Tokenizer) -> Arc<Tokenizer> {
        let t = Arc::new(t);
        if self.order.len() >= MAX_LOADED {
            let old = self.order.remove(0);
            self.loaded.remove(&old);
        }
        self.order.push(key);
        self.loaded.insert(key, t.clone());
        t
    }

    /// The tokenizer in model directory `dir` (as the engine sees it).
    pub fn load_dir(&mut self, root: &Root, dir: &Path, w: &Wanted, cwd: Option<&Path>) -> Found {
        let tj = dir.join("tokenizer.json");
        let m = match root.stat(&tj) {
            Ok(m) if m.is_file() => m,
            _ => {
                return Found::not(
                    State::NotFound,
                    format!("{}: no tokenizer.json", dir.display()),
                )
            }
        };
        // --chat-template: a file (read from the engine's root), else
        // (vLLM) the template itself.
        let template = match &w.chat_template {
            Some(t) if is_template(t) => Some(t.clone()),
            Some(t) => {
                match root.read(&relative(t, cwd), MAX_CONFIG) {
                    Ok(b) => Some(String::from_utf8_lossy(&b).into_owned()),
                    // A named built-in template (SGLang's): the model's own.
                    Err(_) => None,
                }
            }
            None => root
                .read(&dir.join("chat_template.jinja"), MAX_CONFIG)
                .ok()
                .map(|b| String::from_utf8_lossy(&b).into_owned()),
        };
        let key: Key = (
            m.dev(),
            m.ino(),
            m.size(),
            m.mtime(),
            template.as_deref().map_or(0, fnv),
        );
        if let Some(t) = self.loaded.get(&key) {
            return Found {
                state: State::Loaded,
                tokenizer: Some(t.clone()),
                detail: format!("{} (shared)", dir.display()),
            };
        }
        let tokenizer_json = match root.read(&tj, MAX_TOKENIZER_JSON) {
            Ok(b) => b,
            Err(e) => return Found::not(State::Invalid, format!("{}: {e}", tj.display())),
        };
        let files = HfFiles {
            tokenizer_json,
            config: root
                .read(&dir.join("tokenizer_config.json"), MAX_CONFIG)
                .ok(),
            template,
        };
        match Tokenizer::from_hf(&files) {
            Ok(t) => Found {
                state: State::Loaded,
                tokenizer: Some(self.keep(key, t)),
                detail: dir.display().to_string(),
            },
            Err(e) => Found::not(State::Invalid, format!("{}: {e}", dir.display())),
        }
    }
}

/// What marks [`Wanted::chat_template`] as the template (or a built-in's
/// name) given on the command line, not a file.
const INLINE: &str = "inline:";

/// Whether `t` is a Jinja template rather than a file or a name.
fn is_template(t: &str) -> bool {
    t.contains("{{") || t.contains("{%")
}

/// `p` as the engine opens it: relative to its working directory.
fn relative(p: &str, cwd: Option<&Path>) -> PathBuf {
    match cwd {
        Some(c) if !p.starts_with('/') => c.join(p),
        _ => PathBuf::from(p),
    }
}

/// FNV-1a of a template (the cache key's part for it).
fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn each_engine_names_its_tokenizer() {
        let w = wanted(
            Engine::Vllm,
            &args("/usr/bin/python3 /usr/local/bin/vllm serve Qwen/Qwen3-8B --tokenizer-revision v2 --download-dir /data --chat-template /t.jinja"),
            b"",
        );
        assert_eq!(w.source.as_deref(), Some("Qwen/Qwen3-8B"));
        assert_eq!(w.revision.as_deref(), Some("v2"));
        assert_eq!(w.cache_dir.as_deref(), Some("/data"));
        assert_eq!(w.chat_template.as_deref(), Some("/t.jinja"));
        let w = wanted(
            Engine::Vllm,
            &args("python -m vllm.entrypoints.openai.api_server --model /m --tokenizer=/tok"),
            b"",
        );
        assert_eq!(w.source.as_deref(), Some("/tok"));
        let w = wanted(
            Engine::Sglang,
            &args("python3 -m sglang.launch_server --model-path /m --tokenizer-path /t"),
            b"",
        );
        assert_eq!(w.source.as_deref(), Some("/t"));
        let w = wanted(
            Engine::Tgi,
            &args("text-generation-launcher --port 80"),
            b"MODEL_ID=org/m\0REVISION=abc\0",
        );
        assert_eq!(w.source.as_deref(), Some("org/m"));
        assert_eq!(w.revision.as_deref(), Some("abc"));
        let w = wanted(
            Engine::LlamaCpp,
            &args("/app/llama-server -m /models/q.gguf --chat-template-file t.jinja --chat-template chatml"),
            b"",
        );
        assert_eq!(w.source.as_deref(), Some("/models/q.gguf"));
        assert_eq!(w.chat_template.as_deref(), Some("t.jinja"));
        let w = wanted(
            Engine::LlamaCpp,
            &args("llama-server --port 8080"),
            b"LLAMA_ARG_MODEL=/m.gguf\0LLAMA_ARG_CHAT_TEMPLATE=llama3\0",
        );
        assert_eq!(w.source.as_deref(), Some("/m.gguf"));
        assert_eq!(w.chat_template.as_deref(), Some("inline:llama3"));
    }

    #[test]
    fn hub_caches_follow_huggingface_hub() {
        let w = Wanted::default();
        assert_eq!(
            hub_caches(&w, b"HOME=/home/u\0"),
            vec![PathBuf::from("/home/u/.cache/huggingface/hub")]
        );
        assert_eq!(
            hub_caches(&w, b"HF_HOME=/hf\0HOME=/home/u\0"),
            vec![PathBuf::from("/hf/hub")]
        );
        assert_eq!(
            hub_caches(&w, b"HF_HOME=/hf\0HUGGINGFACE_HUB_CACHE=/c\0"),
            vec![PathBuf::from("/c")]
        );
        assert_eq!(
            hub_caches(&w, b"HF_HUB_CACHE=/a\0HUGGINGFACE_HUB_CACHE=/c\0"),
            vec![PathBuf::from("/a")]
        );
        assert_eq!(
            hub_caches(&w, b""),
            vec![PathBuf::from("/root/.cache/huggingface/hub")]
        );
    }

    #[test]
    fn hub_ids_are_not_paths() {
        assert!(hub_id("Qwen/Qwen3-8B"));
        assert!(hub_id("gpt2"));
        assert!(!hub_id("/models/x"));
        assert!(!hub_id("./x"));
        assert!(!hub_id("a/b/c"));
    }
}
