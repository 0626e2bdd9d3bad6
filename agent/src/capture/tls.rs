//! The TLS source: OpenSSL's read and write functions, uprobed per library
//! file (`agent-ebpf/src/tls.rs` copies the plaintext; the socket call the
//! same thread makes inside names the connection). Libraries are found in
//! the targets' `/proc/PID/maps` (`libssl.so.3`, `libssl.so.1.1`) and
//! attached once per file (device, inode) through `/proc/PID/root`, so an
//! engine in another mount namespace (a container) is reached the same
//! way; the programs filter by target in the kernel, so other processes
//! using the same file pay the uprobe trap only.
//!
//! Work in progress (issue 24): socket BIOs only (a thread that calls
//! `SSL_read`/`SSL_write` makes the socket call itself: threaded servers,
//! llama.cpp's); memory BIOs (asyncio/uvicorn) are not attributed yet.

use std::{
    collections::{HashMap, HashSet},
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result};
use aya::{
    programs::{uprobe::UProbeScope, UProbe},
    Ebpf,
};

/// (program, library symbol) pairs attached per library; the return
/// program serves all four functions.
pub const TLS_SYMBOLS: [(&str, &str); 8] = [
    ("ssl_write", "SSL_write"),
    ("ssl_write_ex", "SSL_write_ex"),
    ("ssl_read", "SSL_read"),
    ("ssl_read_ex", "SSL_read_ex"),
    ("ssl_ret", "SSL_write"),
    ("ssl_ret", "SSL_write_ex"),
    ("ssl_ret", "SSL_read"),
    ("ssl_ret", "SSL_read_ex"),
];

/// Whether a mapped file's name is OpenSSL's libssl (not NSS's
/// `libssl3.so`).
pub fn is_libssl(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name == "libssl.so.3" || name == "libssl.so.1.1"
}

/// The libssl files a process maps (paths as the process sees them).
pub fn libssl_paths(maps: &str) -> Vec<String> {
    let mut v: Vec<String> = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .filter(|p| is_libssl(p))
        .map(str::to_string)
        .collect();
    v.sort();
    v.dedup();
    v
}

#[derive(Default)]
pub struct TlsSource {
    /// Off (`--no-tls`): nothing is attached.
    off: bool,
    loaded: bool,
    /// Library files attached, by (device, inode).
    attached: HashSet<(u64, u64)>,
    /// Files that failed, with why (said once).
    failed: HashMap<(u64, u64), String>,
    pub libraries: u64,
}

impl TlsSource {
    pub fn new(on: bool) -> Self {
        TlsSource {
            off: !on,
            ..Self::default()
        }
    }

    /// Loads the TLS programs (once); false when the object has none or
    /// the kernel refused them (said once).
    fn load(&mut self, ebpf: &mut Ebpf) -> Result<()> {
        if self.loaded {
            return Ok(());
        }
        let mut names: Vec<&str> = TLS_SYMBOLS.iter().map(|(p, _)| *p).collect();
        names.dedup();
        for name in names {
            let prog: &mut UProbe = ebpf
                .program_mut(name)
                .with_context(|| format!("the eBPF object has no program {name}"))?
                .try_into()?;
            prog.load().with_context(|| format!("loading {name}"))?;
        }
        self.loaded = true;
        Ok(())
    }

    /// Attaches the TLS programs to every libssl `pid` maps that is not
    /// attached yet.
    pub fn scan(&mut self, ebpf: &mut Ebpf, proc_root: &Path, pid: u32) {
        if self.off {
            return;
        }
        let Ok(maps) = std::fs::read_to_string(proc_root.join(format!("{pid}/maps"))) else {
            return;
        };
        for lib in libssl_paths(&maps) {
            let path: PathBuf = proc_root
                .join(format!("{pid}/root"))
                .join(lib.trim_start_matches('/'));
            let Ok(meta) = std::fs::metadata(&path) else {
                continue;
            };
            let key = (meta.dev(), meta.ino());
            if self.attached.contains(&key) || self.failed.contains_key(&key) {
                continue;
            }
            match self.attach(ebpf, &path) {
                Ok(n) => {
                    self.attached.insert(key);
                    self.libraries += 1;
                    eprintln!(
                        "tokentap: TLS: {} OpenSSL probes on {} (pid {pid})",
                        n,
                        path.display()
                    );
                }
                Err(e) => {
                    eprintln!("tokentap: TLS: not attached to {}: {e:#}", path.display());
                    self.failed.insert(key, format!("{e:#}"));
                }
            }
        }
    }

    fn attach(&mut self, ebpf: &mut Ebpf, path: &Path) -> Result<usize> {
        self.load(ebpf)?;
        let mut n = 0;
        for (name, symbol) in TLS_SYMBOLS {
            let prog: &mut UProbe = ebpf
                .program_mut(name)
                .with_context(|| format!("no program {name}"))?
                .try_into()?;
            match prog.attach(symbol, path, UProbeScope::AllProcesses) {
                Ok(_) => n += 1,
                // OpenSSL 1.1.0 has no `_ex` functions: attach what exists.
                Err(e) if symbol.ends_with("_ex") => {
                    log::debug!("{symbol} not attached on {}: {e}", path.display());
                }
                Err(e) => return Err(e).context(symbol),
            }
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libssl_is_found_in_maps_and_nss_is_not() {
        let maps = "7f00-7f01 r-xp 00000000 08:01 1234 /usr/lib/x86_64-linux-gnu/libssl.so.3\n\
                    7f01-7f02 r--p 00000000 08:01 1234 /usr/lib/x86_64-linux-gnu/libssl.so.3\n\
                    7f02-7f03 r-xp 00000000 08:01 99 /usr/lib/x86_64-linux-gnu/libssl3.so\n\
                    7f03-7f04 rw-p 00000000 00:00 0 \n";
        assert_eq!(
            libssl_paths(maps),
            vec!["/usr/lib/x86_64-linux-gnu/libssl.so.3"]
        );
    }
}
