//! Model version: a short, stable fingerprint of what an engine process
//! serves — the engine, the served model name(s) and model path(s) on its
//! command line, and the identity of the model files those paths name. Two
//! builds of "llama-3-8b" served one after the other get different versions;
//! serving the earlier build again gives the earlier version back, because
//! nothing per process (pid, start time) goes in.
//!
//! * A file (GGUF): its size, mtime and the SHA-256 of its first
//!   [`READ_BUDGET_BYTES`] (the GGUF header and metadata).
//! * A directory (Hugging Face layout): the content hash of `config.json`,
//!   `generation_config.json` and `tokenizer_config.json` (those present),
//!   plus the name, size and mtime of every `*.safetensors`, `*.bin` and
//!   `*.gguf` in it (sorted by name, at most [`MAX_WEIGHT_FILES`]).
//! * A path that does not resolve (a hub id such as `meta-llama/Llama-3-8B`):
//!   its string only.
//!
//! `TOKENTAP_MODEL_VERSION` in the engine's environment wins verbatim.
//! Paths are resolved inside the engine's mount namespace
//! (`/proc/PID/root`, symlinks kept inside it; relative paths against its
//! working directory).
//!
//! Owns: the per-engine command-line rules and the fingerprint. Must not:
//! read more than [`READ_BUDGET_BYTES`] of file content per process, run per
//! request, or put anything per process into the fingerprint.

use std::{
    fs,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
};

use sha2::{Digest as _, Sha256};

use crate::engines::Engine;
use crate::host::{procfs, rootfs::Root};

/// The engine's environment variable that sets the version verbatim.
pub const OVERRIDE_ENV: &str = "TOKENTAP_MODEL_VERSION";
/// File content read per process at most (the first MiB of a GGUF file
/// holds its header and metadata).
pub const READ_BUDGET_BYTES: u64 = 1 << 20;
/// Weight files of a model directory that enter the fingerprint at most.
pub const MAX_WEIGHT_FILES: usize = 256;
/// Directory entries looked at at most (a huge directory is not listed
/// whole).
pub const MAX_DIR_ENTRIES: usize = 10_000;
/// Hex characters of the SHA-256 kept as the version.
pub const VERSION_HEX_CHARS: usize = 12;
/// Config files of a Hugging Face model directory whose content counts.
pub const CONFIG_FILES: [&str; 3] = [
    "config.json",
    "generation_config.json",
    "tokenizer_config.json",
];
/// Weight file suffixes of a model directory whose size and mtime count.
pub const WEIGHT_SUFFIXES: [&str; 3] = [".safetensors", ".bin", ".gguf"];

/// What a command line says is served.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Served {
    /// Names clients use (`--served-model-name`, llama.cpp `--alias`),
    /// sorted, without duplicates.
    pub names: Vec<String>,
    /// Model paths or hub ids, in command-line order.
    pub paths: Vec<String>,
    /// Other options that select a build (`--revision`).
    pub qualifiers: Vec<String>,
}

/// The value of `--flag value` or `--flag=value` at `args[i]`, with the
/// index of the last argument it used.
fn flag_value<'a>(args: &'a [String], i: usize, flag: &str) -> Option<(&'a str, usize)> {
    let a = args[i].as_str();
    if a == flag {
        return args
            .get(i + 1)
            .filter(|v| !v.starts_with('-'))
            .map(|v| (v.as_str(), i + 1));
    }
    a.strip_prefix(flag)
        .and_then(|rest| rest.strip_prefix('='))
        .filter(|v| !v.is_empty())
        .map(|v| (v, i))
}

/// The program's own arguments: after argv[0], and for a Python
/// interpreter after its options and the script or `-m MODULE` (whose `-m`
/// is not llama.cpp's).
pub(crate) fn program_args(args: &[String]) -> &[String] {
    let Some(argv0) = args.first() else {
        return args;
    };
    let base = argv0.rsplit('/').next().unwrap_or(argv0);
    if !(base.starts_with("python") || base.starts_with("pypy")) {
        return &args[1..];
    }
    let mut i = 1;
    while let Some(a) = args.get(i) {
        match a.as_str() {
            "-m" | "-c" => return args.get(i + 2..).unwrap_or(&[]),
            // Interpreter options with a value.
            "-X" | "-W" | "--check-hash-based-pycs" => i += 2,
            o if o.starts_with('-') => i += 1,
            // The script.
            _ => return &args[i + 1..],
        }
    }
    &[]
}

/// What `engine`'s command line (`args`, argv split at NULs) serves.
pub fn served_from_args(engine: Engine, args: &[String]) -> Served {
    let mut s = Served::default();
    let Some(r) = &engine.spec().model_flags else {
        return s;
    };
    let args = program_args(args);
    let mut i = 0;
    while i < args.len() {
        let mut used = None;
        for f in r.path_flags {
            if let Some((v, end)) = flag_value(args, i, f) {
                s.paths.push(v.to_string());
                used = Some(end);
            }
        }
        for f in r.name_flags {
            if let Some((v, mut end)) = flag_value(args, i, f) {
                s.names.push(v.to_string());
                if r.names_take_many && end > i {
                    while let Some(more) = args.get(end + 1).filter(|a| !a.starts_with('-')) {
                        s.names.push(more.clone());
                        end += 1;
                    }
                }
                used = Some(end);
            }
        }
        for f in r.qualifier_flags {
            if let Some((v, end)) = flag_value(args, i, f) {
                s.qualifiers.push(format!("{f}={v}"));
                used = Some(end);
            }
        }
        if used.is_none() && r.positional_after == Some(args[i].as_str()) {
            if let Some(m) = args.get(i + 1).filter(|a| !a.starts_with('-')) {
                s.paths.push(m.clone());
                used = Some(i + 1);
            }
        }
        i = used.unwrap_or(i) + 1;
    }
    s.names.sort();
    s.names.dedup();
    s
}

/// What a model path turned out to be on the engine's filesystem.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelFiles {
    /// A file: size, mtime and the hash of its first bytes.
    File {
        size_bytes: u64,
        mtime_ns: i128,
        head_sha256: [u8; 32],
    },
    /// A model directory: config files by name (size and content hash of
    /// what the budget allowed to read), then weight files by name.
    Dir {
        configs: Vec<(String, u64, [u8; 32])>,
        weights: Vec<WeightFile>,
    },
    /// Nothing at that path (a hub id): the string alone counts.
    Unresolved,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WeightFile {
    pub name: String,
    pub size_bytes: u64,
    pub mtime_ns: i128,
}

/// One model path from the command line and what it named.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelPath {
    pub path: String,
    pub files: ModelFiles,
}

/// Feeds one length-prefixed, tagged field (so no two different inputs
/// hash the same bytes).
fn put(h: &mut Sha256, tag: &str, bytes: &[u8]) {
    h.update((tag.len() as u64).to_le_bytes());
    h.update(tag.as_bytes());
    h.update((bytes.len() as u64).to_le_bytes());
    h.update(bytes);
}

/// The model process `pid` (running `engine`) serves, as its command line
/// names it: the first served name, else the first model path or hub id.
pub fn served_model(proc_root: &Path, pid: u32, engine: Engine) -> Option<String> {
    let args = crate::host::procfs::proc_args(proc_root, pid)?;
    let s = served_from_args(engine, &args);
    s.names
        .into_iter()
        .next()
        .or_else(|| s.paths.into_iter().next())
}

/// The version of `engine` serving `served` from `models`: the first
/// [`VERSION_HEX_CHARS`] hex characters of a SHA-256 over all of it.
pub fn fingerprint(engine: Engine, served: &Served, models: &[ModelPath]) -> String {
    let mut h = Sha256::new();
    put(&mut h, "tokentap.model.version", b"1");
    put(&mut h, "engine", engine.name().as_bytes());
    for n in &served.names {
        put(&mut h, "name", n.as_bytes());
    }
    for q in &served.qualifiers {
        put(&mut h, "qualifier", q.as_bytes());
    }
    for m in models {
        put(&mut h, "path", m.path.as_bytes());
        match &m.files {
            ModelFiles::File {
                size_bytes,
                mtime_ns,
                head_sha256,
            } => {
                put(&mut h, "file.size", &size_bytes.to_le_bytes());
                put(&mut h, "file.mtime", &mtime_ns.to_le_bytes());
                put(&mut h, "file.head", head_sha256);
            }
            ModelFiles::Dir { configs, weights } => {
                for (name, size, sha) in configs {
                    put(&mut h, "config", name.as_bytes());
                    put(&mut h, "config.size", &size.to_le_bytes());
                    put(&mut h, "config.sha256", sha);
                }
                for w in weights {
                    put(&mut h, "weight", w.name.as_bytes());
                    put(&mut h, "weight.size", &w.size_bytes.to_le_bytes());
                    put(&mut h, "weight.mtime", &w.mtime_ns.to_le_bytes());
                }
            }
            ModelFiles::Unresolved => put(&mut h, "unresolved", b""),
        }
    }
    let digest = h.finalize();
    let mut out = String::with_capacity(VERSION_HEX_CHARS);
    for b in digest.iter().take(VERSION_HEX_CHARS.div_ceil(2)) {
        out.push_str(&format!("{b:02x}"));
    }
    out.truncate(VERSION_HEX_CHARS);
    out
}

/// The override in an environment block (`/proc/PID/environ`: NUL-separated
/// `KEY=VALUE`), when set and not empty.
pub fn override_in_environ(environ: &[u8]) -> Option<String> {
    let prefix = format!("{OVERRIDE_ENV}=");
    environ
        .split(|&b| b == 0)
        .find_map(|kv| kv.strip_prefix(prefix.as_bytes()))
        .filter(|v| !v.is_empty())
        .map(|v| String::from_utf8_lossy(v).into_owned())
}

/// The model version of process `pid` running `engine` (as
/// [`crate::host::discover`] named it), read under `proc_root` (`/proc`, or a
/// fake tree in tests). None when the engine is not known and the
/// environment sets no override, or the process is gone.
pub fn of_process(proc_root: &Path, pid: u32, engine: Option<Engine>) -> Option<String> {
    let dir = proc_root.join(pid.to_string());
    if let Some(v) = procfs::proc_environ(proc_root, pid).and_then(|e| override_in_environ(&e)) {
        return Some(v);
    }
    let engine = engine?;
    let args = procfs::proc_args(proc_root, pid)?;
    let served = served_from_args(engine, &args);
    let root = Root::of(proc_root, pid).ok();
    let cwd = fs::read_link(dir.join("cwd")).ok();
    let mut budget = Budget(READ_BUDGET_BYTES);
    let models: Vec<ModelPath> = served
        .paths
        .iter()
        .map(|p| ModelPath {
            path: p.clone(),
            files: root
                .as_ref()
                .and_then(|r| {
                    let in_root = if p.starts_with('/') {
                        PathBuf::from(p)
                    } else {
                        cwd.as_ref()?.join(p)
                    };
                    identify(r, &in_root, &mut budget)
                })
                .unwrap_or(ModelFiles::Unresolved),
        })
        .collect();
    Some(fingerprint(engine, &served, &models))
}

/// File content bytes still allowed to be read.
struct Budget(u64);

impl Budget {
    /// The SHA-256 of up to `max` bytes of `path` (fewer when the budget
    /// is short), and the file's metadata.
    fn hash_head(
        &mut self,
        root: &Root,
        path: &Path,
        max: u64,
    ) -> Option<([u8; 32], fs::Metadata)> {
        let (buf, m) = root.read_head(path, max.min(self.0)).ok()?;
        self.0 -= buf.len() as u64;
        Some((Sha256::digest(&buf).into(), m))
    }
}

fn mtime_ns(m: &fs::Metadata) -> i128 {
    m.mtime() as i128 * 1_000_000_000 + m.mtime_nsec() as i128
}

/// What `in_root` (a path as the engine sees it) names in the engine's
/// root, reading at most what `budget` allows. None when it does not
/// resolve, or is neither a file nor a directory (a FIFO, a device:
/// refused by `host::rootfs` without being opened).
fn identify(root: &Root, in_root: &Path, budget: &mut Budget) -> Option<ModelFiles> {
    let m = root.stat(in_root).ok()?;
    if m.is_file() {
        let (sha, m) = budget.hash_head(root, in_root, READ_BUDGET_BYTES)?;
        return Some(ModelFiles::File {
            size_bytes: m.len(),
            mtime_ns: mtime_ns(&m),
            head_sha256: sha,
        });
    }
    if !m.is_dir() {
        return None;
    }
    let mut configs = Vec::new();
    for name in CONFIG_FILES {
        // A FIFO or device here is refused unopened (and counted).
        if let Some((sha, cm)) = budget.hash_head(root, &in_root.join(name), u64::MAX) {
            configs.push((name.to_string(), cm.len(), sha));
        }
    }
    let mut names: Vec<String> = root
        .list(in_root, MAX_DIR_ENTRIES)
        .ok()?
        .into_iter()
        .filter(|n| WEIGHT_SUFFIXES.iter().any(|s| n.ends_with(s)))
        .collect();
    names.sort();
    names.truncate(MAX_WEIGHT_FILES);
    let weights = names
        .into_iter()
        .filter_map(|name| {
            let wm = root.stat(&in_root.join(&name)).ok()?;
            wm.is_file().then(|| WeightFile {
                name,
                size_bytes: wm.len(),
                mtime_ns: mtime_ns(&wm),
            })
        })
        .collect();
    Some(ModelFiles::Dir { configs, weights })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    fn served(names: &[&str], paths: &[&str]) -> Served {
        Served {
            names: names.iter().map(|s| s.to_string()).collect(),
            paths: paths.iter().map(|s| s.to_string()).collect(),
            qualifiers: vec![],
        }
    }

    #[test]
    fn vllm_serve_takes_the_positional_model_and_every_served_name() {
        assert_eq!(
            served_from_args(
                Engine::Vllm,
                &args("/usr/bin/python3 /usr/local/bin/vllm serve /models/x --served-model-name b a --port 8000")
            ),
            served(&["a", "b"], &["/models/x"])
        );
    }

    #[test]
    fn vllm_api_server_takes_the_model_flag() {
        assert_eq!(
            served_from_args(
                Engine::Vllm,
                &args("python -m vllm.entrypoints.openai.api_server --model /m --port 8000")
            ),
            served(&[], &["/m"])
        );
        assert_eq!(
            served_from_args(
                Engine::Vllm,
                &args("python -m vllm.entrypoints.openai.api_server --model=/m --revision=abc")
            ),
            Served {
                qualifiers: vec!["--revision=abc".into()],
                ..served(&[], &["/m"])
            }
        );
    }

    #[test]
    fn sglang_takes_the_model_path_flag() {
        assert_eq!(
            served_from_args(
                Engine::Sglang,
                &args("python3 -m sglang.launch_server --model-path meta-llama/Llama-3-8B --served-model-name l3 --port 30000")
            ),
            served(&["l3"], &["meta-llama/Llama-3-8B"])
        );
    }

    #[test]
    fn llama_cpp_takes_short_and_long_model_flags_and_the_alias() {
        assert_eq!(
            served_from_args(
                Engine::LlamaCpp,
                &args("/usr/bin/llama-server -m /m/a.gguf --port 8080")
            ),
            served(&[], &["/m/a.gguf"])
        );
        assert_eq!(
            served_from_args(
                Engine::LlamaCpp,
                &args("llama-server --model m.gguf --alias chat -c 4096")
            ),
            served(&["chat"], &["m.gguf"])
        );
        assert_eq!(
            served_from_args(
                Engine::LlamaCpp,
                &args("python -m llama_cpp.server --model /m.gguf --model_alias x")
            ),
            served(&["x"], &["/m.gguf"])
        );
    }

    #[test]
    fn tgi_takes_the_model_id() {
        assert_eq!(
            served_from_args(
                Engine::Tgi,
                &args("text-generation-launcher --model-id bigscience/bloom-560m --revision main --port 80")
            ),
            Served {
                qualifiers: vec!["--revision=main".into()],
                ..served(&[], &["bigscience/bloom-560m"])
            }
        );
    }

    #[test]
    fn ollama_and_unknown_engines_name_no_model_files() {
        assert_eq!(
            served_from_args(Engine::Ollama, &args("/bin/ollama serve")),
            Served::default()
        );
        assert_eq!(
            served_from_args(Engine::Triton, &args("tritonserver --model-repository /r")),
            Served::default()
        );
    }

    #[test]
    fn a_flag_without_a_value_names_nothing() {
        assert_eq!(
            served_from_args(Engine::LlamaCpp, &args("llama-server -m --port 8080")),
            Served::default()
        );
    }

    fn gguf(size: u64, mtime: i128, head: u8) -> Vec<ModelPath> {
        vec![ModelPath {
            path: "/m/a.gguf".into(),
            files: ModelFiles::File {
                size_bytes: size,
                mtime_ns: mtime,
                head_sha256: [head; 32],
            },
        }]
    }

    #[test]
    fn the_same_inputs_give_the_same_short_hex_version() {
        let s = served(&["a"], &["/m/a.gguf"]);
        let v = fingerprint(Engine::LlamaCpp, &s, &gguf(10, 5, 1));
        assert_eq!(v.len(), VERSION_HEX_CHARS);
        assert!(v
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        assert_eq!(v, fingerprint(Engine::LlamaCpp, &s, &gguf(10, 5, 1)));
    }

    #[test]
    fn size_mtime_header_name_and_engine_each_change_the_version() {
        let s = served(&["a"], &["/m/a.gguf"]);
        let v = fingerprint(Engine::LlamaCpp, &s, &gguf(10, 5, 1));
        for other in [
            fingerprint(Engine::LlamaCpp, &s, &gguf(11, 5, 1)),
            fingerprint(Engine::LlamaCpp, &s, &gguf(10, 6, 1)),
            fingerprint(Engine::LlamaCpp, &s, &gguf(10, 5, 2)),
            fingerprint(
                Engine::LlamaCpp,
                &served(&["b"], &["/m/a.gguf"]),
                &gguf(10, 5, 1),
            ),
            fingerprint(Engine::Vllm, &s, &gguf(10, 5, 1)),
        ] {
            assert_ne!(v, other);
        }
    }

    #[test]
    fn a_directory_models_weights_and_configs_count() {
        let dir = |cfg: u8, size: u64| {
            vec![ModelPath {
                path: "/models/x".into(),
                files: ModelFiles::Dir {
                    configs: vec![("config.json".into(), 100, [cfg; 32])],
                    weights: vec![WeightFile {
                        name: "model.safetensors".into(),
                        size_bytes: size,
                        mtime_ns: 1,
                    }],
                },
            }]
        };
        let s = served(&[], &["/models/x"]);
        let v = fingerprint(Engine::Vllm, &s, &dir(1, 10));
        assert_eq!(v, fingerprint(Engine::Vllm, &s, &dir(1, 10)));
        assert_ne!(v, fingerprint(Engine::Vllm, &s, &dir(2, 10)));
        assert_ne!(v, fingerprint(Engine::Vllm, &s, &dir(1, 11)));
    }

    #[test]
    fn the_override_in_the_environment_is_taken_verbatim() {
        assert_eq!(
            override_in_environ(b"PATH=/bin\0TOKENTAP_MODEL_VERSION=release-7 b\0HOME=/"),
            Some("release-7 b".into())
        );
        assert_eq!(override_in_environ(b"TOKENTAP_MODEL_VERSION=\0X=1"), None);
        assert_eq!(override_in_environ(b"XTOKENTAP_MODEL_VERSION=1"), None);
    }

    /// A fake `/proc/PID/{cmdline,environ,root,cwd}`: `root` is a real
    /// directory holding the engine's files, `cwd` a link whose target is
    /// the working directory as the engine sees it (like the real one).
    fn fake_proc(proc_root: &Path, pid: u32, cmdline: &str, environ: &str, cwd: &str) {
        let d = proc_root.join(pid.to_string());
        fs::create_dir_all(&d).unwrap();
        fs::write(d.join("cmdline"), cmdline.replace(' ', "\0")).unwrap();
        fs::write(d.join("environ"), environ.replace(' ', "\0")).unwrap();
        let _ = fs::remove_file(d.join("root"));
        let _ = fs::remove_file(d.join("cwd"));
        std::os::unix::fs::symlink(proc_root.join("fs"), d.join("root")).unwrap();
        std::os::unix::fs::symlink(cwd, d.join("cwd")).unwrap();
    }

    fn set_mtime(p: &Path, secs: i64) {
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs as u64);
        fs::File::options()
            .write(true)
            .open(p)
            .unwrap()
            .set_modified(t)
            .unwrap();
    }

    #[test]
    fn a_gguf_file_under_the_engines_root_is_fingerprinted_without_the_pid() {
        let tmp = tempfile::tempdir().unwrap();
        let proc_root = tmp.path();
        let fsroot = proc_root.join("fs");
        fs::create_dir_all(fsroot.join("srv/models")).unwrap();
        let model = fsroot.join("srv/models/a.gguf");
        let mut content = vec![7u8; 2 << 20];
        content[..4].copy_from_slice(b"GGUF");
        fs::write(&model, &content).unwrap();
        set_mtime(&model, 1_700_000_000);
        // Same model, two processes, one relative to its cwd.
        fake_proc(
            proc_root,
            10,
            "llama-server -m /srv/models/a.gguf",
            "",
            "/srv",
        );
        fake_proc(proc_root, 11, "llama-server -m /srv/models/a.gguf", "", "/");
        let v = of_process(proc_root, 10, Some(Engine::LlamaCpp)).unwrap();
        assert_eq!(
            of_process(proc_root, 11, Some(Engine::LlamaCpp)),
            Some(v.clone())
        );
        fake_proc(proc_root, 12, "llama-server -m models/a.gguf", "", "/srv");
        let rel = of_process(proc_root, 12, Some(Engine::LlamaCpp)).unwrap();
        assert_ne!(
            rel,
            fingerprint(
                Engine::LlamaCpp,
                &served(&[], &["models/a.gguf"]),
                &[ModelPath {
                    path: "models/a.gguf".into(),
                    files: ModelFiles::Unresolved
                }]
            ),
            "a relative path resolves against the engine's cwd"
        );

        // A header byte changes (same size, same mtime): a new version.
        content[100] = 8;
        fs::write(&model, &content).unwrap();
        set_mtime(&model, 1_700_000_000);
        let changed = of_process(proc_root, 10, Some(Engine::LlamaCpp)).unwrap();
        assert_ne!(v, changed);
        // A byte past the first MiB changes nothing but the mtime counts.
        content[100] = 7;
        content[(1 << 20) + 5] = 9;
        fs::write(&model, &content).unwrap();
        set_mtime(&model, 1_700_000_000);
        assert_eq!(
            of_process(proc_root, 10, Some(Engine::LlamaCpp)),
            Some(v.clone())
        );
        set_mtime(&model, 1_700_000_001);
        assert_ne!(
            of_process(proc_root, 10, Some(Engine::LlamaCpp)),
            Some(v.clone())
        );

        // The environment's override wins, for any engine.
        fake_proc(
            proc_root,
            13,
            "llama-server -m /srv/models/a.gguf",
            "A=1 TOKENTAP_MODEL_VERSION=v2026.11",
            "/",
        );
        assert_eq!(of_process(proc_root, 13, None), Some("v2026.11".into()));
        // Unknown engine, no override: no version.
        assert_eq!(of_process(proc_root, 10, None), None);
        // Gone process: none.
        assert_eq!(of_process(proc_root, 99, Some(Engine::LlamaCpp)), None);
    }

    #[test]
    fn an_absolute_symlink_resolves_inside_the_engines_root() {
        let tmp = tempfile::tempdir().unwrap();
        let proc_root = tmp.path();
        let fsroot = proc_root.join("fs");
        fs::create_dir_all(fsroot.join("blobs")).unwrap();
        fs::create_dir_all(fsroot.join("m")).unwrap();
        fs::write(fsroot.join("blobs/x"), b"GGUF-one").unwrap();
        // Absolute as the engine sees it: /blobs/x inside its root.
        std::os::unix::fs::symlink("/blobs/x", fsroot.join("m/a.gguf")).unwrap();
        fake_proc(proc_root, 20, "llama-server -m /m/a.gguf", "", "/");
        let v = of_process(proc_root, 20, Some(Engine::LlamaCpp)).unwrap();
        let unresolved = fingerprint(
            Engine::LlamaCpp,
            &served(&[], &["/m/a.gguf"]),
            &[ModelPath {
                path: "/m/a.gguf".into(),
                files: ModelFiles::Unresolved,
            }],
        );
        assert_ne!(v, unresolved, "the link was followed inside the root");
        fs::write(fsroot.join("blobs/x"), b"GGUF-two").unwrap();
        assert_ne!(of_process(proc_root, 20, Some(Engine::LlamaCpp)), Some(v));
    }

    #[test]
    fn a_hf_directory_counts_configs_and_weights_and_a_hub_id_its_name() {
        let tmp = tempfile::tempdir().unwrap();
        let proc_root = tmp.path();
        let m = proc_root.join("fs/models/x");
        fs::create_dir_all(&m).unwrap();
        fs::write(m.join("config.json"), br#"{"hidden_size":8}"#).unwrap();
        fs::write(m.join("model-00001.safetensors"), vec![0u8; 4096]).unwrap();
        fs::write(m.join("README.md"), b"ignored").unwrap();
        set_mtime(&m.join("model-00001.safetensors"), 1_600_000_000);
        fake_proc(
            proc_root,
            30,
            "vllm serve /models/x --served-model-name x",
            "",
            "/",
        );
        let v = of_process(proc_root, 30, Some(Engine::Vllm)).unwrap();
        fs::write(m.join("README.md"), b"changed, still ignored").unwrap();
        assert_eq!(
            of_process(proc_root, 30, Some(Engine::Vllm)),
            Some(v.clone())
        );
        fs::write(m.join("config.json"), br#"{"hidden_size":9}"#).unwrap();
        let v2 = of_process(proc_root, 30, Some(Engine::Vllm)).unwrap();
        assert_ne!(v, v2, "config.json content");
        fs::write(m.join("model-00001.safetensors"), vec![0u8; 4097]).unwrap();
        set_mtime(&m.join("model-00001.safetensors"), 1_600_000_000);
        assert_ne!(
            of_process(proc_root, 30, Some(Engine::Vllm)),
            Some(v2),
            "weights size"
        );

        fake_proc(proc_root, 31, "vllm serve meta-llama/Llama-3-8B", "", "/");
        assert_eq!(
            of_process(proc_root, 31, Some(Engine::Vllm)),
            Some(fingerprint(
                Engine::Vllm,
                &served(&[], &["meta-llama/Llama-3-8B"]),
                &[ModelPath {
                    path: "meta-llama/Llama-3-8B".into(),
                    files: ModelFiles::Unresolved
                }]
            ))
        );
    }

    #[test]
    fn at_most_the_budget_is_read_per_process() {
        let mut b = Budget(10);
        let tmp = tempfile::tempdir().unwrap();
        fs::write(tmp.path().join("w"), vec![1u8; 100]).unwrap();
        let root = Root::at(tmp.path()).unwrap();
        let (h, _) = b.hash_head(&root, Path::new("/w"), 1000).unwrap();
        assert_eq!(h, <[u8; 32]>::from(Sha256::digest([1u8; 10])));
        assert_eq!(b.0, 0);
        let (h0, _) = b.hash_head(&root, Path::new("/w"), 1000).unwrap();
        assert_eq!(h0, <[u8; 32]>::from(Sha256::digest([])));
    }
}
