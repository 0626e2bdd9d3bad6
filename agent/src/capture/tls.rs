//! The TLS source: OpenSSL's read and write functions, uprobed in each
//! target process that maps OpenSSL (`agent-ebpf/src/tls.rs` copies the
//! plaintext; the socket call the same thread makes inside names the
//! connection, or, for memory BIOs, the BIO the ciphertext went through).
//! Libraries are found in the targets' `/proc/PID/maps` (`libssl.so.3` /
//! `libssl.so.1.1` and their `libcrypto`) and attached through
//! `/proc/PID/root`, so an engine in another mount namespace (a container)
//! is reached the same way.
//!
//! Every probe is scoped to its process (`UProbeScope::OneProcess`): the
//! kernel writes the breakpoints into the targets' memory only, so other
//! processes using the same library file pay nothing, not even the trap.
//! A process that exits has its probes detached at the next scan.
//!
//! Each probe hit is a trap (measured on the development VM: 15–30 µs
//! each, `docs/benchmarks.md`), so the BIO probes (memory BIOs) are
//! attached only where they are needed: from the start in Python and Node
//! processes (the runtimes whose event loops drive OpenSSL through memory
//! BIOs: asyncio, uvicorn, uvloop), otherwise once the kernel reports an
//! SSL call of that process whose socket it could not tell
//! (`TLS_WANT_BIO`).

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    num::NonZeroU32,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use crate::vocab::TlsRefusal;
use anyhow::{Context, Result};
use aya::{
    maps::Array,
    programs::{
        uprobe::{UProbeLinkId, UProbeScope},
        UProbe,
    },
    Ebpf,
};

/// (program, symbol) pairs attached on libssl: writes need their entry
/// only (the plaintext is whole there), reads their return too.
pub const SSL_SYMBOLS: [(&str, &str); 7] = [
    ("ssl_write", "SSL_write"),
    ("ssl_write_ex", "SSL_write_ex"),
    ("ssl_read", "SSL_read"),
    ("ssl_read_ex", "SSL_read_ex"),
    ("ssl_ret", "SSL_read"),
    ("ssl_ret", "SSL_read_ex"),
    ("ssl_free", "SSL_free"),
];

/// (program, symbol) pairs attached on libcrypto: memory BIOs.
pub const CRYPTO_SYMBOLS: [(&str, &str); 2] =
    [("bio_write", "BIO_write"), ("bio_read", "BIO_read")];

/// Whether a mapped file's name is OpenSSL's libssl (not NSS's
/// `libssl3.so`).
pub fn is_libssl(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name == "libssl.so.3" || name == "libssl.so.1.1"
}

/// Whether a mapped file's name is OpenSSL's libcrypto.
pub fn is_libcrypto(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name == "libcrypto.so.3" || name == "libcrypto.so.1.1"
}

/// TLS stacks the source cannot read, told from a process's maps (and its
/// executable's name): said once per process, counted by stack.
pub fn unsupported_stack(maps: &str) -> Option<TlsRefusal> {
    let names = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .map(|p| p.rsplit('/').next().unwrap_or(p));
    for n in names {
        if n.starts_with("libjvm.so") {
            return Some(TlsRefusal::Java);
        }
        if n.contains("boringssl") || n.starts_with("libssl-") && n.contains("boring") {
            return Some(TlsRefusal::Boringssl);
        }
        if n.starts_with("libgnutls.so") {
            return Some(TlsRefusal::Gnutls);
        }
    }
    None
}

/// A library file a process maps: its path as the kernel shows it in
/// `/proc/PID/maps` (inside the process's mount namespace) and the address
/// range of its first mapping (`/proc/PID/map_files/<range>`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapped {
    pub path: String,
    pub range: String,
}

/// The OpenSSL files a process maps: (libssl, libcrypto).
pub fn openssl_paths(maps: &str) -> (Option<Mapped>, Option<Mapped>) {
    let mut ssl = None;
    let mut crypto = None;
    for l in maps.lines() {
        let mut f = l.split_whitespace();
        let (Some(range), Some(p)) = (f.next(), f.nth(4)) else {
            continue;
        };
        let m = || Mapped {
            path: p.to_string(),
            range: range.to_string(),
        };
        if ssl.is_none() && is_libssl(p) {
            ssl = Some(m());
        } else if crypto.is_none() && is_libcrypto(p) {
            crypto = Some(m());
        }
    }
    (ssl, crypto)
}

/// Where the agent opens a library `pid` maps: through the process's root
/// (`/proc/PID/root/<path>`: a container's own filesystem), or, when that
/// path does not lead to it (a process that `chroot`ed inside its mount
/// namespace), through the mapping itself (`/proc/PID/map_files/<range>`).
fn library_file(proc_root: &Path, pid: u32, m: &Mapped) -> PathBuf {
    let rooted = proc_root
        .join(format!("{pid}/root"))
        .join(m.path.trim_start_matches('/'));
    if rooted.exists() {
        rooted
    } else {
        proc_root.join(format!("{pid}/map_files/{}", m.range))
    }
}

/// What the TLS source did, for `tokentap.tls.*`.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct TlsStats {
    /// Library files with probes now (distinct device and inode).
    pub libraries: u64,
    /// Processes with probes now.
    pub processes: u64,
    /// Processes not attached, by reason.
    pub attach_failures: BTreeMap<TlsRefusal, u64>,
}

/// The TLS source's counters with the kernel's.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct TlsCounts {
    pub source: TlsStats,
    /// SSL calls whose plaintext was captured.
    pub calls: u64,
    /// SSL calls with plaintext on a socket not known (not captured).
    pub unattributed: u64,
    /// Memory BIOs tied to their socket by content.
    pub bios_linked: u64,
}

struct Attached {
    libs: Vec<(u64, u64)>,
    links: Vec<(&'static str, UProbeLinkId)>,
    /// libcrypto, while its BIO probes are not attached.
    crypto: Option<PathBuf>,
}

/// Whether a process's runtime drives OpenSSL through memory BIOs (its
/// event loop moves the ciphertext): Python (`_ssl`) and Node.
pub fn uses_memory_bios(maps: &str, exe: &str) -> bool {
    let name = exe.rsplit('/').next().unwrap_or(exe);
    name == "node"
        || name.starts_with("nodejs")
        || maps
            .lines()
            .filter_map(|l| l.split_whitespace().nth(5))
            .any(|p| {
                let n = p.rsplit('/').next().unwrap_or(p);
                n.starts_with("_ssl.cpython") || n.starts_with("_ssl.pypy")
            })
}

#[derive(Default)]
pub struct TlsSource {
    /// Off (`--no-tls`): nothing is attached.
    off: bool,
    loaded: bool,
    /// `TLS_ON` is set.
    on: bool,
    /// Processes with probes.
    pids: HashMap<u32, Attached>,
    /// Processes looked at and left (no OpenSSL, or it failed): not
    /// looked at again until their maps change size.
    skipped: HashMap<u32, usize>,
    /// Library files whose failure was said (once each).
    said: HashSet<(u64, u64)>,
    /// The kernel's refusal of uprobes was said.
    said_permission: bool,
    /// Processes the kernel's refusal left unread, counted once each:
    /// after the first refusal no attach is tried again (the kernel
    /// does not change its mind while the agent runs), so a process
    /// whose mappings change is not counted twice.
    refused_pids: HashSet<u32>,
    stats: TlsStats,
}

impl TlsSource {
    pub fn new(on: bool) -> Self {
        TlsSource {
            off: !on,
            ..Self::default()
        }
    }

    pub fn stats(&self) -> TlsStats {
        let mut s = self.stats.clone();
        s.processes = self.pids.len() as u64;
        let libs: HashSet<(u64, u64)> = self.pids.values().flat_map(|a| a.libs.clone()).collect();
        s.libraries = libs.len() as u64;
        s
    }

    /// Loads the TLS programs (once).
    fn load(&mut self, ebpf: &mut Ebpf) -> Result<()> {
        if self.loaded {
            return Ok(());
        }
        let mut names: Vec<&str> = SSL_SYMBOLS
            .iter()
            .chain(CRYPTO_SYMBOLS.iter())
            .map(|(p, _)| *p)
            .collect();
        names.sort_unstable();
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

    /// The data path's TLS lookups start (once a process has probes).
    fn switch_on(&mut self, ebpf: &mut Ebpf) -> Result<()> {
        if self.on {
            return Ok(());
        }
        let mut on: Array<_, u32> =
            Array::try_from(ebpf.map_mut("TLS_ON").context("TLS_ON map missing")?)?;
        on.set(0, 1, 0)?;
        self.on = true;
        Ok(())
    }

    /// Detaches the probes of processes that are not targets any more.
    pub fn retain(&mut self, ebpf: &mut Ebpf, alive: &HashSet<u32>) {
        let gone: Vec<u32> = self
            .pids
            .keys()
            .filter(|p| !alive.contains(p))
            .copied()
            .collect();
        for pid in gone {
            if let Some(a) = self.pids.remove(&pid) {
                detach(ebpf, a.links);
            }
        }
        self.skipped.retain(|p, _| alive.contains(p));
        self.refused_pids.retain(|p| alive.contains(p));
    }

    /// Attaches the TLS programs to `pid`'s OpenSSL, if it maps one and
    /// has no probes yet.
    pub fn scan(&mut self, ebpf: &mut Ebpf, proc_root: &Path, pid: u32) {
        if self.off || self.pids.contains_key(&pid) {
            return;
        }
        let Ok(maps) = std::fs::read_to_string(proc_root.join(format!("{pid}/maps"))) else {
            return;
        };
        // Python loads `_ssl` (and OpenSSL) at `import ssl`, after exec:
        // look again only when the mappings changed.
        if self.skipped.get(&pid) == Some(&maps.len()) {
            return;
        }
        let (ssl, crypto) = openssl_paths(&maps);
        let (ssl_path, crypto_path) = match ssl {
            Some(ssl) => (
                library_file(proc_root, pid, &ssl),
                crypto.as_ref().map(|m| library_file(proc_root, pid, m)),
            ),
            None => {
                if let Some(stack) = unsupported_stack(&maps) {
                    if !self.skipped.contains_key(&pid) {
                        eprintln!(
                            "tokentap: TLS: pid {pid} uses {stack}, which tokentap cannot read: its HTTPS traffic is not measured"
                        );
                        *self.stats.attach_failures.entry(stack).or_default() += 1;
                    }
                    self.skipped.insert(pid, maps.len());
                    return;
                }
                // OpenSSL linked into the executable itself (a vendored
                // build): its own `SSL_read` symbol says so. Looked at
                // once per process (and again if its mappings change).
                let exe = proc_root.join(format!("{pid}/exe"));
                if let Some(len) = self.skipped.get_mut(&pid) {
                    *len = maps.len();
                    return;
                }
                match exe_tls(&exe) {
                    ExeTls::OpenSsl => (exe.clone(), Some(exe)),
                    other => {
                        if let Some(stack) = other.unreadable() {
                            eprintln!(
                                "tokentap: TLS: pid {pid} is built with {stack}: if it serves HTTPS, tokentap cannot read it (its TLS connections count in tokentap.tls.undecoded)"
                            );
                            *self.stats.attach_failures.entry(stack).or_default() += 1;
                        }
                        self.skipped.insert(pid, maps.len());
                        return;
                    }
                }
            }
        };
        let mut libs = Vec::new();
        for p in std::iter::once(&ssl_path).chain(crypto_path.iter()) {
            match std::fs::metadata(p) {
                Ok(m) => libs.push((m.dev(), m.ino())),
                Err(e) => {
                    self.fail(
                        pid,
                        libs.first().copied(),
                        TlsRefusal::Unreadable,
                        &format!("{}: {e}", p.display()),
                    );
                    self.skipped.insert(pid, maps.len());
                    return;
                }
            }
        }
        if self.said_permission {
            self.fail(pid, None, TlsRefusal::Permission, "");
            self.skipped.insert(pid, maps.len());
            return;
        }
        let exe = std::fs::read_link(proc_root.join(format!("{pid}/exe")))
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default();
        let bio_now = uses_memory_bios(&maps, &exe);
        let bio_path = crypto_path.as_deref().filter(|_| bio_now);
        match self.attach(ebpf, pid, &ssl_path, bio_path) {
            Ok((links, memory_bios)) => {
                if let Err(e) = self.switch_on(ebpf) {
                    detach(ebpf, links);
                    self.fail(
                        pid,
                        libs.first().copied(),
                        TlsRefusal::Load,
                        &format!("{e:#}"),
                    );
                    self.skipped.insert(pid, maps.len());
                    return;
                }
                eprintln!(
                    "tokentap: TLS: {} OpenSSL probes in pid {pid} ({}{})",
                    links.len(),
                    ssl_path.display(),
                    if memory_bios { ", memory BIOs too" } else { "" }
                );
                let crypto = crypto_path.filter(|_| !memory_bios);
                self.pids.insert(
                    pid,
                    Attached {
                        libs,
                        links,
                        crypto,
                    },
                );
                self.skipped.remove(&pid);
            }
            Err((reason, e, links)) => {
                detach(ebpf, links);
                self.fail(
                    pid,
                    libs.first().copied(),
                    reason,
                    &format!("{}: {e:#}", ssl_path.display()),
                );
                self.skipped.insert(pid, maps.len());
            }
        }
    }

    /// Attaches the BIO probes to the processes the kernel asked for (an
    /// SSL call whose socket it could not tell: memory BIOs).
    pub fn want_bio(&mut self, ebpf: &mut Ebpf) {
        let pids: Vec<u32> = match ebpf.map("TLS_WANT_BIO") {
            Some(m) => match aya::maps::HashMap::<_, u32, u8>::try_from(m) {
                Ok(h) => h.keys().filter_map(|k| k.ok()).collect(),
                Err(_) => return,
            },
            None => return,
        };
        if pids.is_empty() {
            return;
        }
        if let Some(Ok(mut h)) = ebpf
            .map_mut("TLS_WANT_BIO")
            .map(aya::maps::HashMap::<_, u32, u8>::try_from)
        {
            for p in &pids {
                let _ = h.remove(p);
            }
        }
        for pid in pids {
            let Some(crypto) = self.pids.get_mut(&pid).and_then(|a| a.crypto.take()) else {
                continue;
            };
            let Some(scope) = NonZeroU32::new(pid).map(UProbeScope::OneProcess) else {
                continue;
            };
            let mut links = Vec::new();
            for (name, symbol) in CRYPTO_SYMBOLS {
                match attach_one(ebpf, name, symbol, &crypto, scope) {
                    Ok(id) => links.push((name, id)),
                    Err(e) => {
                        log::warn!("TLS: {symbol} not attached on {}: {e:#}", crypto.display());
                        *self
                            .stats
                            .attach_failures
                            .entry(TlsRefusal::MemoryBio)
                            .or_default() += 1;
                    }
                }
            }
            eprintln!(
                "tokentap: TLS: pid {pid} uses memory BIOs: {} BIO probes attached",
                links.len()
            );
            if let Some(a) = self.pids.get_mut(&pid) {
                a.links.extend(links);
            }
        }
    }

    fn fail(&mut self, pid: u32, lib: Option<(u64, u64)>, reason: TlsRefusal, why: &str) {
        if reason == TlsRefusal::Permission {
            if self.refused_pids.insert(pid) {
                *self.stats.attach_failures.entry(reason).or_default() += 1;
            }
            // The same for every process: said once.
            if !self.said_permission {
                self.said_permission = true;
                eprintln!("tokentap: TLS: uprobes refused ({why}): {PERMISSION_HELP}");
            }
            return;
        }
        *self.stats.attach_failures.entry(reason).or_default() += 1;
        if lib.is_none_or(|l| self.said.insert(l)) {
            eprintln!("tokentap: TLS: pid {pid} not attached ({reason}): {why}");
        }
    }

    /// The links made and whether memory BIOs are covered; on failure,
    /// the reason, the error and the links made so far (to detach).
    #[allow(clippy::type_complexity)]
    fn attach(
        &mut self,
        ebpf: &mut Ebpf,
        pid: u32,
        ssl: &Path,
        crypto: Option<&Path>,
    ) -> std::result::Result<
        (Vec<(&'static str, UProbeLinkId)>, bool),
        (TlsRefusal, anyhow::Error, Vec<(&'static str, UProbeLinkId)>),
    > {
        let mut links = Vec::new();
        if let Err(e) = self.load(ebpf) {
            return Err((TlsRefusal::Load, e, links));
        }
        let Some(scope) = NonZeroU32::new(pid).map(UProbeScope::OneProcess) else {
            return Err((TlsRefusal::Attach, anyhow::anyhow!("pid 0"), links));
        };
        for (name, symbol) in SSL_SYMBOLS {
            match attach_one(ebpf, name, symbol, ssl, scope) {
                Ok(id) => links.push((name, id)),
                // OpenSSL 1.1.0 has no `_ex` functions: attach what exists.
                Err(e) if symbol.ends_with("_ex") || symbol == "SSL_free" => {
                    log::debug!("{symbol} not attached on {}: {e:#}", ssl.display());
                }
                Err(e) => {
                    let reason = if refused(&e) {
                        TlsRefusal::Permission
                    } else if format!("{e:#}").contains("symbol") {
                        TlsRefusal::SymbolMissing
                    } else {
                        TlsRefusal::Attach
                    };
                    return Err((reason, e.context(symbol), links));
                }
            }
        }
        let mut memory_bios = false;
        if let Some(crypto) = crypto {
            memory_bios = true;
            for (name, symbol) in CRYPTO_SYMBOLS {
                match attach_one(ebpf, name, symbol, crypto, scope) {
                    Ok(id) => links.push((name, id)),
                    Err(e) => {
                        // Socket BIOs still work; say why memory BIOs do not.
                        log::warn!("TLS: {symbol} not attached on {}: {e:#}", crypto.display());
                        *self
                            .stats
                            .attach_failures
                            .entry(TlsRefusal::MemoryBio)
                            .or_default() += 1;
                        memory_bios = false;
                    }
                }
            }
        }
        Ok((links, memory_bios))
    }
}

/// What to do when the kernel refuses uprobes to this agent.
const PERMISSION_HELP: &str =
    "kernels with the fix for CVE-2025-38466 (Linux 6.16; 6.15.7, 6.12.39, \
6.6.99, 6.1.146, 5.15.189, 5.10.240) give uprobes only to CAP_SYS_ADMIN. HTTPS engines are not \
measured from their plaintext (counted in tokentap.tls.attach_failures{reason=\"permission\"}); \
everything else is. Grant CAP_SYS_ADMIN (Kubernetes: deploy/kubernetes/overlays/tls) or measure \
where TLS ends (a terminating proxy or sidecar)";

/// Whether an attach failed because the kernel refused the caller
/// (EACCES, EPERM).
fn refused(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::PermissionDenied)
    }) || {
        let t = format!("{e:#}");
        t.contains("Permission denied") || t.contains("Operation not permitted")
    }
}

/// What TLS an executable carries in itself.
#[derive(Debug, PartialEq, Eq)]
pub enum ExeTls {
    /// OpenSSL linked in: it defines `SSL_read`.
    OpenSsl,
    /// A Go program (`.go.buildinfo`): `crypto/tls` if it serves HTTPS.
    Go,
    /// rustls linked in (its symbols, where not stripped).
    Rustls,
    None,
}

impl ExeTls {
    /// The stack's name where tokentap cannot read it.
    fn unreadable(&self) -> Option<TlsRefusal> {
        match self {
            ExeTls::Go => Some(TlsRefusal::Go),
            ExeTls::Rustls => Some(TlsRefusal::Rustls),
            _ => None,
        }
    }
}

/// Reads the ELF file at `path` once: which TLS it carries.
pub fn exe_tls(path: &Path) -> ExeTls {
    let Ok(data) = std::fs::read(path) else {
        return ExeTls::None;
    };
    exe_tls_of(&data)
}

fn exe_tls_of(data: &[u8]) -> ExeTls {
    use object::{Object, ObjectSymbol};
    let Ok(f) = object::File::parse(data) else {
        return ExeTls::None;
    };
    let mut rustls = false;
    for s in f.dynamic_symbols().chain(f.symbols()) {
        let Ok(name) = s.name() else { continue };
        if s.is_definition() && name == "SSL_read" {
            return ExeTls::OpenSsl;
        }
        rustls |= name.contains("rustls");
    }
    if f.section_by_name(".go.buildinfo").is_some() {
        ExeTls::Go
    } else if rustls {
        ExeTls::Rustls
    } else {
        ExeTls::None
    }
}

fn attach_one(
    ebpf: &mut Ebpf,
    name: &str,
    symbol: &str,
    path: &Path,
    scope: UProbeScope,
) -> Result<UProbeLinkId> {
    let prog: &mut UProbe = ebpf
        .program_mut(name)
        .with_context(|| format!("no program {name}"))?
        .try_into()?;
    Ok(prog.attach(symbol, path, scope)?)
}

fn detach(ebpf: &mut Ebpf, links: Vec<(&'static str, UProbeLinkId)>) {
    for (name, id) in links {
        if let Some(p) = ebpf.program_mut(name) {
            if let Ok(p) = <&mut UProbe>::try_from(p) {
                let _ = p.detach(id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_counts_each_process_once() {
        // A process whose mappings change is looked at again: the
        // refusal of its uprobes must not count twice (the kernel matrix
        // saw 2 for one engine on a slow VM).
        let mut s = TlsSource::new(true);
        s.fail(7, None, TlsRefusal::Permission, "EPERM");
        s.fail(7, None, TlsRefusal::Permission, "EPERM");
        s.fail(8, None, TlsRefusal::Permission, "EPERM");
        assert_eq!(s.stats().attach_failures[&TlsRefusal::Permission], 2);
        assert!(s.said_permission);
        // Gone processes are forgotten.
        s.refused_pids.retain(|p| *p == 8);
        s.fail(7, None, TlsRefusal::Permission, "EPERM");
        assert_eq!(s.stats().attach_failures[&TlsRefusal::Permission], 3);
        s.fail(7, Some((1, 2)), TlsRefusal::Unreadable, "gone");
        s.fail(7, Some((1, 2)), TlsRefusal::Unreadable, "gone");
        assert_eq!(s.stats().attach_failures[&TlsRefusal::Unreadable], 2);
    }

    #[test]
    fn openssl_is_found_in_maps_and_nss_is_not() {
        let maps = "7f00-7f01 r-xp 00000000 08:01 1234 /usr/lib/x86_64-linux-gnu/libssl.so.3\n\
                    7f01-7f02 r--p 00000000 08:01 1234 /usr/lib/x86_64-linux-gnu/libssl.so.3\n\
                    7f02-7f03 r-xp 00000000 08:01 99 /usr/lib/x86_64-linux-gnu/libssl3.so\n\
                    7f03-7f04 r-xp 00000000 08:01 98 /usr/lib/x86_64-linux-gnu/libcrypto.so.3\n\
                    7f03-7f04 rw-p 00000000 00:00 0 \n";
        let (ssl, crypto) = openssl_paths(maps);
        assert_eq!(
            ssl,
            Some(Mapped {
                path: "/usr/lib/x86_64-linux-gnu/libssl.so.3".into(),
                range: "7f00-7f01".into()
            })
        );
        assert_eq!(
            crypto.map(|m| m.path),
            Some("/usr/lib/x86_64-linux-gnu/libcrypto.so.3".into())
        );
        assert_eq!(unsupported_stack(maps), None);
        let nss_only = "7f02-7f03 r-xp 00000000 08:01 99 /usr/lib/x86_64-linux-gnu/libssl3.so\n";
        assert_eq!(openssl_paths(nss_only), (None, None));
    }

    #[test]
    fn python_and_node_get_the_bio_probes_from_the_start() {
        let py = "7f00-7f01 r-xp 00000000 08:01 1 /usr/lib/python3.11/lib-dynload/_ssl.cpython-311-x86_64-linux-gnu.so\n";
        assert!(uses_memory_bios(py, "/usr/bin/python3.11"));
        assert!(uses_memory_bios("", "/usr/local/bin/node"));
        let cpp = "7f00-7f01 r-xp 00000000 08:01 1 /usr/lib/x86_64-linux-gnu/libssl.so.3\n";
        assert!(!uses_memory_bios(cpp, "/app/llama-server"));
    }

    #[test]
    fn executables_say_which_tls_they_carry() {
        // This test binary links rustls (the OTLP exporter's TLS).
        let me = std::env::current_exe().unwrap();
        assert_eq!(exe_tls(&me), ExeTls::Rustls);
        // coreutils: none.
        assert_eq!(exe_tls(Path::new("/bin/true")), ExeTls::None);
        assert_eq!(exe_tls_of(b"not an ELF"), ExeTls::None);
    }

    #[test]
    fn unreadable_stacks_are_named() {
        let java = "7f00-7f01 r-xp 00000000 08:01 1 /usr/lib/jvm/java-17/lib/server/libjvm.so\n";
        assert_eq!(unsupported_stack(java), Some(TlsRefusal::Java));
        let gnutls = "7f00-7f01 r-xp 00000000 08:01 1 /usr/lib/x86_64-linux-gnu/libgnutls.so.30\n";
        assert_eq!(unsupported_stack(gnutls), Some(TlsRefusal::Gnutls));
    }
}
