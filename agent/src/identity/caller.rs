//! Who sent a request: `tenant` (a configured header, else the OpenAI
//! `user` field of the body), `caller` (the peer's IP address) and
//! `api_key_id` (a keyed hash of the API key the request presents).
//!
//! Owns: the bounds on attacker-controlled values (a tenant is at most
//! [`MAX_TENANT_BYTES`]), the API-key hash and its key (the salt file, or a
//! per-install key in [`INSTALL_KEY_PATH`]). Must not: keep or print an API
//! key (it is hashed where the header is parsed, borrowed, and never
//! copied), keep header values other than the configured tenant headers,
//! or read files anywhere but [`load_key`] (the decoder calls the rest).

use std::{
    io::Write as _,
    net::{IpAddr, SocketAddr},
    os::unix::fs::OpenOptionsExt as _,
    path::{Path, PathBuf},
};

use anyhow::{bail, Context, Result};
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Longest tenant (or `user`) value kept, in bytes, marker included.
pub const MAX_TENANT_BYTES: usize = 128;
/// Ends a value that was cut to [`MAX_TENANT_BYTES`].
pub const TRUNCATED: char = '…';
/// Hex digits of an `api_key_id` (48 bits of the HMAC).
pub const API_KEY_ID_HEX: usize = 12;
/// Where the per-install API-key hashing key lives when no
/// `--api-key-salt-file` is given.
pub const INSTALL_KEY_PATH: &str = "/var/lib/tokentap/api-key-salt";
/// Bytes of a generated key.
const KEY_BYTES: usize = 32;

/// What the decoder keeps of a request's identity headers.
#[derive(Clone, Debug, Default)]
pub struct CallerConfig {
    /// Tenant header names, lowercase, in order of preference (the first
    /// one present wins).
    pub tenant_headers: Vec<String>,
    /// Hashes API keys into `api_key_id` (None: ids are not computed).
    pub api_keys: Option<ApiKeyHasher>,
}

impl CallerConfig {
    /// `names` as given on the command line (any case).
    pub fn new(names: &[String], api_keys: Option<ApiKeyHasher>) -> Self {
        Self {
            tenant_headers: names
                .iter()
                .map(|n| n.trim().to_ascii_lowercase())
                .collect(),
            api_keys,
        }
    }
}

/// Bytes of a value [`bounded_value`] looks at: never more are converted
/// (a 64 KiB header costs 512 bytes).
pub const LOOK_BYTES: usize = 4 * MAX_TENANT_BYTES;

/// A header or body value as an attribute may carry it: lossy UTF-8,
/// trimmed, control characters replaced, at most [`MAX_TENANT_BYTES`]
/// (cut at a character boundary and ended with [`TRUNCATED`]). None when
/// nothing is left.
pub fn bounded_value(raw: &[u8]) -> Option<String> {
    let s = String::from_utf8_lossy(&raw[..raw.len().min(LOOK_BYTES)]);
    let s: String = s
        .trim()
        .chars()
        .map(|c| if c.is_control() { '\u{fffd}' } else { c })
        .collect();
    if s.is_empty() {
        return None;
    }
    if s.len() <= MAX_TENANT_BYTES && raw.len() <= LOOK_BYTES {
        return Some(s);
    }
    let room = MAX_TENANT_BYTES - TRUNCATED.len_utf8();
    let mut cut = room.min(s.len());
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    let mut out = s[..cut].trim_end().to_string();
    out.push(TRUNCATED);
    Some(out)
}

/// The peer's IP address (no port) of a `client` address (`IP:PORT`,
/// `[IPv6]:PORT`, or a bare IP); IPv4-mapped IPv6 reads as IPv4.
pub fn caller_of(client: &str) -> Option<String> {
    let ip = match client.parse::<SocketAddr>() {
        Ok(a) => a.ip(),
        Err(_) => client.parse::<IpAddr>().ok()?,
    };
    Some(ip.to_canonical().to_string())
}

/// The API key a request presents, borrowed from its head: the token of
/// `Authorization: Bearer …` (scheme in any case), else the value of the
/// `api-key` or `x-api-key` header. `header` looks a header up by its
/// lowercase name.
pub fn api_token<'a>(header: impl Fn(&str) -> Option<&'a [u8]>) -> Option<&'a [u8]> {
    let bearer = header("authorization").and_then(|v| {
        let v = v.trim_ascii();
        let sp = v.iter().position(|b| b.is_ascii_whitespace())?;
        let (scheme, token) = v.split_at(sp);
        let token = token.trim_ascii();
        (scheme.eq_ignore_ascii_case(b"bearer") && !token.is_empty()).then_some(token)
    });
    bearer.or_else(|| {
        ["api-key", "x-api-key"]
            .iter()
            .filter_map(|n| header(n))
            .map(<[u8]>::trim_ascii)
            .find(|v| !v.is_empty())
    })
}

/// HMAC-SHA256 keyed by the install's key; an id is the first
/// [`API_KEY_ID_HEX`] hex digits. Holds the keyed MAC state, not the key.
#[derive(Clone)]
pub struct ApiKeyHasher {
    mac: Hmac<Sha256>,
}

impl std::fmt::Debug for ApiKeyHasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKeyHasher(..)")
    }
}

impl ApiKeyHasher {
    pub fn new(key: &[u8]) -> Result<Self> {
        if key.is_empty() {
            bail!("the API-key hashing key is empty");
        }
        let mac = Hmac::<Sha256>::new_from_slice(key)
            .map_err(|e| anyhow::anyhow!("HMAC key rejected: {e}"))?;
        Ok(Self { mac })
    }

    /// The id of `token`: same key and token → same id; the token cannot
    /// be recovered from it.
    pub fn id(&self, token: &[u8]) -> String {
        let mut m = self.mac.clone();
        m.update(token);
        let digest = m.finalize().into_bytes();
        let mut out = String::with_capacity(API_KEY_ID_HEX);
        for b in digest.iter().take(API_KEY_ID_HEX / 2) {
            out.push_str(&format!("{b:02x}"));
        }
        out
    }
}

/// Where the API-key hashing key came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyOrigin {
    /// `--api-key-salt-file`.
    SaltFile(PathBuf),
    /// The per-install key file (created now, or found).
    Installed { path: PathBuf, created: bool },
    /// A random key for this run only: the install key could not be kept
    /// (`why`); ids change across restarts.
    Ephemeral { why: String },
}

impl KeyOrigin {
    /// The one line to say at start, when there is something to say.
    pub fn notice(&self) -> Option<String> {
        match self {
            KeyOrigin::Ephemeral { why } => Some(format!(
                "tokentap: api_key_id uses a random key for this run ({why}): ids will change across restarts; give --api-key-salt-file PATH to keep them stable"
            )),
            _ => None,
        }
    }
}

/// The API-key hashing key: the bytes of `salt_file` when given (an
/// unreadable or empty file is an error: the user asked for it), else the
/// per-install key at `install_path`, created with mode 0600 on first use;
/// when it cannot be read or created, a random key for this run.
pub fn load_key(salt_file: Option<&Path>, install_path: &Path) -> Result<(Vec<u8>, KeyOrigin)> {
    if let Some(p) = salt_file {
        let key = std::fs::read(p)
            .with_context(|| format!("cannot read --api-key-salt-file {}", p.display()))?;
        if key.is_empty() {
            bail!(
                "--api-key-salt-file {} is empty: put at least 16 random bytes in it (e.g. `head -c 32 /dev/urandom > {}`)",
                p.display(),
                p.display()
            );
        }
        return Ok((key, KeyOrigin::SaltFile(p.to_path_buf())));
    }
    match installed_key(install_path) {
        Ok((key, created)) => Ok((
            key,
            KeyOrigin::Installed {
                path: install_path.to_path_buf(),
                created,
            },
        )),
        Err(e) => Ok((
            random_bytes()?,
            KeyOrigin::Ephemeral {
                why: format!("{e:#}"),
            },
        )),
    }
}

/// The key a replay hashes API keys with: `salt_file` when given; else
/// this node's install key when there is one (read, never made: then the
/// ids are those this node's agent exported); else a random key for this
/// replay (ids consistent within it only). Says which on stderr.
pub fn replay_key(salt_file: Option<&Path>, install_path: &Path) -> Result<Vec<u8>> {
    if salt_file.is_some() {
        return load_key(salt_file, install_path).map(|(k, _)| k);
    }
    match std::fs::read(install_path) {
        Ok(k) if !k.is_empty() => {
            eprintln!(
                "tokentap: api_key_id from this node's install key {} (the ids this node's agent exported)",
                install_path.display()
            );
            Ok(k)
        }
        _ => {
            eprintln!(
                "tokentap: api_key_id with a random key for this replay (no --api-key-salt-file, no install key at {}): ids agree within this replay only",
                install_path.display()
            );
            random_bytes()
        }
    }
}

/// Reads the install key, creating it first when missing. Creation is
/// atomic (written to a private temporary file, then linked into place),
/// so two agents starting together end with the same key.
fn installed_key(path: &Path) -> Result<(Vec<u8>, bool)> {
    match std::fs::read(path) {
        Ok(k) if !k.is_empty() => return Ok((k, false)),
        Ok(_) => bail!("{} is empty", path.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
    let dir = path
        .parent()
        .with_context(|| format!("{} has no directory", path.display()))?;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let tmp = dir.join(format!(".api-key-salt.{}.tmp", std::process::id()));
    let key = random_bytes()?;
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(&key)?;
        f.sync_all()?;
        std::fs::hard_link(&tmp, path)
    };
    let res = write();
    let _ = std::fs::remove_file(&tmp);
    match res {
        Ok(()) => Ok((key, true)),
        // Another agent created it meanwhile: use theirs.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let k =
                std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
            if k.is_empty() {
                bail!("{} is empty", path.display());
            }
            Ok((k, false))
        }
        Err(e) => Err(e).with_context(|| format!("cannot write {}", path.display())),
    }
}

fn random_bytes() -> Result<Vec<u8>> {
    let mut b = vec![0u8; KEY_BYTES];
    // SAFETY: writes at most b.len() bytes into b.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n != b.len() as isize {
        bail!(
            "no randomness for the API-key hashing key: {}",
            std::io::Error::last_os_error()
        );
    }
    Ok(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    #[test]
    fn tenant_values_are_trimmed_cleaned_and_bounded_with_a_marker() {
        assert_eq!(bounded_value(b"  acme \r"), Some("acme".into()));
        assert_eq!(bounded_value(b"   "), None);
        assert_eq!(bounded_value(b"a\x01b"), Some("a\u{fffd}b".into()));
        let exact = "x".repeat(MAX_TENANT_BYTES);
        assert_eq!(bounded_value(exact.as_bytes()), Some(exact.clone()));
        let long = "é".repeat(1000); // 2 bytes each: the cut must not split one
        let b = bounded_value(long.as_bytes()).unwrap();
        assert!(b.len() <= MAX_TENANT_BYTES, "{}", b.len());
        assert!(b.ends_with(TRUNCATED));
        assert!(b.starts_with("éé"));
        let huge = vec![b'a'; 64 * 1024];
        let b = bounded_value(&huge).unwrap();
        assert!(b.len() <= MAX_TENANT_BYTES && b.ends_with(TRUNCATED));
    }

    #[test]
    fn caller_is_the_peer_ip_without_its_port() {
        assert_eq!(caller_of("10.1.2.3:5555").as_deref(), Some("10.1.2.3"));
        assert_eq!(caller_of("[fd00::7]:80").as_deref(), Some("fd00::7"));
        assert_eq!(
            caller_of("[::ffff:10.0.0.9]:80").as_deref(),
            Some("10.0.0.9")
        );
        assert_eq!(caller_of("192.168.0.1").as_deref(), Some("192.168.0.1"));
        assert_eq!(caller_of("not an address"), None);
    }

    #[test]
    fn the_api_key_comes_from_a_bearer_token_or_an_api_key_header() {
        fn token(pairs: &[(&'static str, &'static str)]) -> Option<&'static str> {
            api_token(|n| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == n)
                    .map(|&(_, v)| v.as_bytes())
            })
            .map(|t| std::str::from_utf8(t).unwrap())
        }
        assert_eq!(
            token(&[("authorization", "Bearer sk-abc ")]),
            Some("sk-abc")
        );
        assert_eq!(token(&[("authorization", "bearer  sk-x")]), Some("sk-x"));
        // Another scheme is not an API key; the api-key headers are.
        assert_eq!(
            token(&[("authorization", "Basic dXNlcjpwdw=="), ("x-api-key", "k2")]),
            Some("k2")
        );
        assert_eq!(token(&[("api-key", "k1")]), Some("k1"));
        assert_eq!(token(&[("authorization", "Bearer ")]), None);
        assert_eq!(token(&[]), None);
    }

    #[test]
    fn same_key_same_id_different_key_different_id_and_no_token_text() {
        let a = ApiKeyHasher::new(b"key one").unwrap();
        let a2 = ApiKeyHasher::new(b"key one").unwrap();
        let b = ApiKeyHasher::new(b"key two").unwrap();
        let token = b"sk-live-0123456789abcdef";
        let id = a.id(token);
        assert_eq!(id.len(), API_KEY_ID_HEX);
        assert!(id.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(id, a2.id(token), "same key, same token: same id");
        assert_ne!(id, b.id(token), "another key gives another id");
        assert_ne!(id, a.id(b"sk-live-other"), "another token, another id");
        // RFC 4231 test case 2 ("Jefe"): the hash is HMAC-SHA256.
        let jefe = ApiKeyHasher::new(b"Jefe").unwrap();
        assert_eq!(jefe.id(b"what do ya want for nothing?"), "5bdcc146bf60");
        assert!(!format!("{a:?}").contains("key one"));
        assert!(ApiKeyHasher::new(b"").is_err());
    }

    #[test]
    fn the_install_key_is_created_once_with_mode_0600_and_reused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lib/tokentap/api-key-salt");
        let (k1, o1) = load_key(None, &path).unwrap();
        assert_eq!(
            o1,
            KeyOrigin::Installed {
                path: path.clone(),
                created: true
            }
        );
        assert_eq!(k1.len(), KEY_BYTES);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let (k2, o2) = load_key(None, &path).unwrap();
        assert_eq!(k1, k2, "a restart keeps the key (and the ids)");
        assert!(matches!(o2, KeyOrigin::Installed { created: false, .. }));
        assert!(o2.notice().is_none());
        // No temporary file is left behind.
        let left: Vec<_> = std::fs::read_dir(path.parent().unwrap()).unwrap().collect();
        assert_eq!(left.len(), 1);
    }

    #[test]
    fn a_salt_file_wins_and_an_empty_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let salt = dir.path().join("salt");
        std::fs::write(&salt, b"my salt bytes").unwrap();
        let install = dir.path().join("install/key");
        let (k, o) = load_key(Some(&salt), &install).unwrap();
        assert_eq!(k, b"my salt bytes");
        assert_eq!(o, KeyOrigin::SaltFile(salt.clone()));
        assert!(!install.exists(), "the install key is not made");
        std::fs::write(&salt, b"").unwrap();
        let e = load_key(Some(&salt), &install).unwrap_err();
        assert!(format!("{e:#}").contains("is empty"), "{e:#}");
        let e = load_key(Some(&dir.path().join("missing")), &install).unwrap_err();
        assert!(format!("{e:#}").contains("cannot read --api-key-salt-file"));
    }

    #[test]
    fn an_unwritable_install_directory_gives_a_random_key_for_this_run() {
        let dir = tempfile::tempdir().unwrap();
        // A file where the directory should be: creating it fails (also
        // as root, unlike a permission bit).
        let blocker = dir.path().join("blocker");
        std::fs::write(&blocker, b"x").unwrap();
        let path = blocker.join("tokentap/api-key-salt");
        let (k1, o1) = load_key(None, &path).unwrap();
        let (k2, _) = load_key(None, &path).unwrap();
        assert_eq!(k1.len(), KEY_BYTES);
        assert_ne!(k1, k2, "a fresh key each run");
        let notice = o1.notice().expect("said once at start");
        assert!(
            notice.contains("ids will change across restarts"),
            "{notice}"
        );
    }
}
