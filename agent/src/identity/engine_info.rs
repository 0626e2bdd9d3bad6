//! An engine's build: its version string, from its own info endpoint
//! (the catalogue's `InfoEndpoint`: vLLM `/version`, SGLang
//! `/get_server_info`, TGI `/info`, llama.cpp `/props`, Ollama
//! `/api/version`, Triton `/v2`) — which also reports effective serving
//! settings — else from the installed package's metadata in the engine's
//! filesystem (`NAME-VERSION.dist-info/METADATA` of the catalogue's `dist`).
//!
//! Owns: reading those answers and files. Must not: keep anything of an
//! answer but the version and the listed settings (an info answer may hold
//! the engine's API key: SGLang's server args do).

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
};

use serde_json::Value;

use crate::engines::Engine;
use crate::host::{procfs, rootfs::Root};

/// Longest version string kept.
pub const MAX_VERSION_CHARS: usize = 64;
/// Directory entries looked at per site-packages directory at most.
const MAX_DIR_ENTRIES: usize = 20_000;
/// Bytes of a METADATA file read at most (the version is in its head).
const METADATA_HEAD: u64 = 8 << 10;

/// What an engine's info endpoint said.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EngineInfo {
    pub version: Option<String>,
    /// The catalogue's settings it reported (name → value as text).
    pub settings: BTreeMap<String, String>,
}

fn text(v: &Value) -> Option<String> {
    let s = match v {
        Value::String(s) => s.trim().to_string(),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        _ => return None,
    };
    (!s.is_empty()).then(|| s.chars().take(MAX_VERSION_CHARS).collect())
}

/// Reads `engine`'s info answer (a JSON object); `None` when it is not
/// one, or says neither a version nor a setting.
pub fn parse(engine: Engine, body: &[u8]) -> Option<EngineInfo> {
    let ep = engine.spec().info.as_ref()?;
    let v: Value = serde_json::from_slice(body).ok()?;
    if !v.is_object() {
        return None;
    }
    let mut settings = BTreeMap::new();
    for (name, ptr) in ep.settings {
        if settings.contains_key(*name) {
            continue;
        }
        if let Some(t) = v.pointer(ptr).and_then(text) {
            settings.insert(name.to_string(), t);
        }
    }
    let info = EngineInfo {
        version: v.pointer(ep.version).and_then(text),
        settings,
    };
    (info.version.is_some() || !info.settings.is_empty()).then_some(info)
}

/// `name` as wheel file names spell it (`llama-cpp-python` →
/// `llama_cpp_python`), lowercase.
fn normalised(name: &str) -> String {
    name.replace(['-', '.'], "_").to_ascii_lowercase()
}

/// The Python prefixes a process may run from: its interpreter's (argv[0]
/// when absolute — a virtualenv's `bin/python` is a symlink `exe` would
/// resolve past — and `exe`), `VIRTUAL_ENV`, `/usr/local`, `/usr`.
fn prefixes(proc_root: &Path, pid: u32) -> Vec<PathBuf> {
    let dir = proc_root.join(pid.to_string());
    let mut out = Vec::new();
    let mut add = |p: PathBuf| {
        if !out.contains(&p) {
            out.push(p);
        }
    };
    let parent2 = |p: &Path| p.parent().and_then(Path::parent).map(Path::to_path_buf);
    if let Some(a0) = procfs::proc_args(proc_root, pid).and_then(|a| a.into_iter().next()) {
        let a0 = PathBuf::from(a0);
        if a0.is_absolute() {
            if let Some(p) = parent2(&a0) {
                add(p);
            }
        }
    }
    if let Ok(exe) = fs::read_link(dir.join("exe")) {
        if let Some(p) = parent2(&exe) {
            add(p);
        }
    }
    if let Some(env) = procfs::proc_environ(proc_root, pid) {
        for kv in env.split(|b| *b == 0) {
            if let Some(v) = kv.strip_prefix(b"VIRTUAL_ENV=") {
                add(PathBuf::from(String::from_utf8_lossy(v).into_owned()));
            }
        }
    }
    add(PathBuf::from("/usr/local"));
    add(PathBuf::from("/usr"));
    out
}

/// The version of distribution `dist` installed where process `pid`'s
/// Python finds it, read inside the process's root (`/proc/PID/root`,
/// through `host::rootfs`: paths resolve in the container, a FIFO or
/// device where METADATA should be is refused unopened).
pub fn from_dist_info(proc_root: &Path, pid: u32, dist: &str) -> Option<String> {
    let root = Root::of(proc_root, pid).ok()?;
    let want = normalised(dist);
    for prefix in prefixes(proc_root, pid) {
        let lib = prefix.join("lib");
        let Ok(pys) = root.list(&lib, MAX_DIR_ENTRIES) else {
            continue;
        };
        let mut sites: Vec<PathBuf> = pys
            .iter()
            .filter(|n| n.starts_with("python3"))
            .flat_map(|n| ["site-packages", "dist-packages"].map(|s| lib.join(n).join(s)))
            .collect();
        sites.sort();
        for site in sites {
            let Ok(entries) = root.list(&site, MAX_DIR_ENTRIES) else {
                continue;
            };
            for name in entries {
                // NAME-VERSION.dist-info (NAME without `-` in wheels).
                let named = name
                    .strip_suffix(".dist-info")
                    .and_then(|n| n.split_once('-'))
                    .is_some_and(|(n, _)| normalised(n) == want);
                if !named {
                    continue;
                }
                if let Some(v) = metadata_version(&root, &site.join(&name).join("METADATA")) {
                    return Some(v);
                }
            }
        }
    }
    None
}

/// `Version:` of a METADATA file (its head).
fn metadata_version(root: &Root, path: &Path) -> Option<String> {
    let (head, _) = root.read_head(path, METADATA_HEAD).ok()?;
    let head = String::from_utf8_lossy(&head);
    head.lines()
        .take_while(|l| !l.is_empty())
        .find_map(|l| l.strip_prefix("Version:"))
        .map(|v| v.trim().chars().take(MAX_VERSION_CHARS).collect::<String>())
        .filter(|v| !v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_metadata_version_is_found_in_the_engines_root_through_its_virtualenv() {
        let t = std::env::temp_dir().join(format!("tt-einfo-{}", std::process::id()));
        let _ = fs::remove_dir_all(&t);
        let proc = t.join("proc");
        let d = proc.join("42");
        fs::create_dir_all(&d).unwrap();
        // The engine's root is a directory of its own (a container).
        let root = t.join("rootfs");
        let site = root.join("opt/venv/lib/python3.11/site-packages");
        fs::create_dir_all(site.join("vllm-0.6.1.post1.dist-info")).unwrap();
        fs::create_dir_all(site.join("vllm_flash_attn-2.6.1.dist-info")).unwrap();
        fs::write(
            site.join("vllm-0.6.1.post1.dist-info/METADATA"),
            "Metadata-Version: 2.1\nName: vllm\nVersion: 0.6.1.post1\n\nVersion: not this\n",
        )
        .unwrap();
        std::os::unix::fs::symlink(&root, d.join("root")).unwrap();
        fs::write(
            d.join("cmdline"),
            b"/opt/venv/bin/python3\0-m\0vllm.entrypoints.openai.api_server\0",
        )
        .unwrap();
        assert_eq!(
            from_dist_info(&proc, 42, "vllm").as_deref(),
            Some("0.6.1.post1")
        );
        assert_eq!(from_dist_info(&proc, 42, "sglang"), None);
        let _ = fs::remove_dir_all(&t);
    }
}
