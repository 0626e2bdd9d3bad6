//! Finding inference servers without being told: processes whose command
//! line names a known engine and that hold a listening TCP socket.
//!
//! Owns: the /proc scan (the engines' command-line patterns are the
//! catalogue's, `crate::engines`). Must not: target a process that does
//! not listen (a CLI client of the same engine, a build step).

use std::{fs, path::Path};

use super::procfs;
use crate::engines::Engine;

/// The command line of `pid` with NULs as spaces.
pub fn cmdline(proc_root: &Path, pid: u32) -> Option<String> {
    Some(procfs::proc_args(proc_root, pid)?.join(" "))
}

/// The engine `pid` runs, from its command line.
pub fn engine_of(proc_root: &Path, pid: u32) -> Option<Engine> {
    cmdline(proc_root, pid)
        .as_deref()
        .and_then(Engine::from_cmdline)
}

/// Every process that looks like an inference server and listens on TCP.
pub fn scan(proc_root: &Path) -> Vec<(u32, Engine)> {
    let me = std::process::id();
    let Ok(dir) = fs::read_dir(proc_root) else {
        return vec![];
    };
    let mut out = vec![];
    for ent in dir.flatten() {
        let Some(pid) = ent.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Some(engine) = engine_of(proc_root, pid) else {
            continue;
        };
        let owned = procfs::socket_fds(proc_root, pid);
        if owned.is_empty() {
            continue;
        }
        let table = procfs::tcp_table(proc_root, pid);
        if !procfs::listening_ports(&table, &owned).is_empty() {
            out.push((pid, engine));
        }
    }
    out.sort_unstable();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake /proc: `pid/cmdline`, `pid/fd/N` → `socket:[inode]`, and
    /// `pid/net/tcp` listing that inode as listening (or not).
    fn fake_proc(root: &Path, pid: u32, cmdline: &str, listening: bool) {
        let dir = root.join(pid.to_string());
        fs::create_dir_all(dir.join("fd")).unwrap();
        fs::create_dir_all(dir.join("net")).unwrap();
        fs::write(dir.join("cmdline"), cmdline.replace(' ', "\0")).unwrap();
        let inode = 90_000 + pid as u64;
        std::os::unix::fs::symlink(format!("socket:[{inode}]"), dir.join("fd/5")).unwrap();
        let state = if listening { "0A" } else { "01" };
        fs::write(
            dir.join("net/tcp"),
            format!(
                "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   \
                 0: 0100007F:1F90 00000000:0000 {state} 00000000:00000000 00:00000000 00000000     0        0 {inode} 1 0000000000000000 100 0 0 10 0\n"
            ),
        )
        .unwrap();
    }

    #[test]
    fn only_known_engines_that_listen_on_tcp_are_found() {
        let root = std::env::temp_dir().join(format!("tokentap-discover-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fake_proc(
            &root,
            100,
            "python3 -m vllm.entrypoints.openai.api_server",
            true,
        );
        // The same engine's CLI client: no listening socket.
        fake_proc(&root, 101, "vllm chat --url http://x", false);
        // Listens, but is not an inference server.
        fake_proc(&root, 102, "nginx: worker process", true);
        fake_proc(&root, 103, "/usr/bin/llama-server -m m.gguf", true);
        assert_eq!(
            scan(&root),
            vec![(100, Engine::Vllm), (103, Engine::LlamaCpp)]
        );
        let _ = fs::remove_dir_all(&root);
    }
}
