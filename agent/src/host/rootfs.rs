//! The one door into an engine's own files (`/proc/PID/root/…`: its
//! container's filesystem). Every path is resolved inside that root with
//! `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)` — an absolute
//! symlink or a `..` in the container resolves in the container, never in
//! the agent's filesystem — and first opened `O_PATH` (which opens nothing:
//! a FIFO cannot block, a device sees no open); only a regular file or a
//! directory is then reopened for reading, through the agent's own
//! `/proc/self/fd` (the same inode, no second lookup). Reads are bounded in
//! bytes and entries. What is refused is counted by reason
//! ([`refused`]: `not_regular`, `oversized`, `no_openat2`).
//!
//! These reads may still be slow (a hung network filesystem): callers run
//! them off the pipeline's thread (`pipeline::targets`' facts reader).
//!
//! Owns: resolving, opening and bounding. Must not: follow a path outside
//! the root, open anything but regular files and directories, or read
//! more than asked.

use std::{
    ffi::CString,
    fs::{self, File},
    io::{self, Read},
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd},
        unix::ffi::OsStrExt,
    },
    path::Path,
    sync::atomic::{AtomicU64, Ordering::Relaxed},
};

static NOT_REGULAR: AtomicU64 = AtomicU64::new(0);
static OVERSIZED: AtomicU64 = AtomicU64::new(0);
static NO_OPENAT2: AtomicU64 = AtomicU64::new(0);

/// Engine files refused since the start, by reason: `not_regular` (a
/// FIFO, socket or device where a file or directory was expected),
/// `oversized` (larger than the reader allows), `no_openat2` (the kernel
/// or a seccomp filter refuses `openat2`: nothing is read by path).
pub fn refused() -> [(&'static str, u64); 3] {
    [
        ("not_regular", NOT_REGULAR.load(Relaxed)),
        ("oversized", OVERSIZED.load(Relaxed)),
        ("no_openat2", NO_OPENAT2.load(Relaxed)),
    ]
}

/// Why a file was not read.
#[derive(Debug)]
pub enum Refused {
    /// Not there, or not readable (not counted: the normal case).
    Io(io::Error),
    /// A FIFO, socket or device.
    NotRegular,
    /// Larger than the reader's bound.
    Oversized(u64),
    /// `openat2` is not available: paths are not resolved at all.
    NoOpenat2,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::Io(e) => write!(f, "{e}"),
            Refused::NotRegular => f.write_str("not a regular file or directory"),
            Refused::Oversized(n) => write!(f, "{n} bytes: larger than allowed"),
            Refused::NoOpenat2 => f.write_str("openat2 is not available"),
        }
    }
}

/// `struct open_how` (linux/openat2.h); libc's is `non_exhaustive`.
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// A process's root directory, held open.
pub struct Root {
    fd: OwnedFd,
}

/// What a path names, once resolved inside the root.
pub enum Entry {
    File(File, fs::Metadata),
    Dir(File, fs::Metadata),
}

impl Root {
    /// The root of process `pid` under `proc_root` (`/proc`, or a fake
    /// tree in tests: any directory's `root` link or directory).
    pub fn of(proc_root: &Path, pid: u32) -> io::Result<Root> {
        Self::at(&proc_root.join(pid.to_string()).join("root"))
    }

    /// A directory as a root.
    pub fn at(dir: &Path) -> io::Result<Root> {
        let c = CString::new(dir.as_os_str().as_bytes())
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: a valid NUL-terminated path; the fd is owned below.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh fd nobody else owns.
        Ok(Root {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// `path` (as the engine sees it) resolved inside the root, opened
    /// `O_PATH` only.
    fn resolve(&self, path: &Path) -> Result<OwnedFd, Refused> {
        let c = CString::new(path.as_os_str().as_bytes())
            .map_err(|_| Refused::Io(io::Error::from(io::ErrorKind::InvalidInput)))?;
        let how = OpenHow {
            flags: (libc::O_PATH | libc::O_CLOEXEC) as u64,
            mode: 0,
            resolve: libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS,
        };
        // SAFETY: valid fd, path and open_how of the size passed.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                self.fd.as_raw_fd(),
                c.as_ptr(),
                &how as *const OpenHow,
                std::mem::size_of::<OpenHow>(),
            )
        };
        if fd >= 0 {
            // SAFETY: a fresh fd nobody else owns.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) });
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            // No openat2 (a kernel before 5.6, a seccomp filter): a plain
            // path could escape the root, so nothing is read.
            Some(libc::ENOSYS) | Some(libc::EPERM) => {
                NO_OPENAT2.fetch_add(1, Relaxed);
                Err(Refused::NoOpenat2)
            }
            _ => Err(Refused::Io(e)),
        }
    }

    /// What `path` names: a regular file or a directory, opened for
    /// reading; anything else refused (and counted) without being opened.
    pub fn open(&self, path: &Path) -> Result<Entry, Refused> {
        // An O_PATH fd: fstat works on it, reading does not.
        let p = File::from(self.resolve(path)?);
        let m = p.metadata().map_err(Refused::Io)?;
        let (flags, dir) = if m.is_file() {
            (libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY, false)
        } else if m.is_dir() {
            (libc::O_RDONLY | libc::O_DIRECTORY, true)
        } else {
            NOT_REGULAR.fetch_add(1, Relaxed);
            return Err(Refused::NotRegular);
        };
        // The same inode, reopened through the agent's own fd table.
        let c = CString::new(format!("/proc/self/fd/{}", p.as_raw_fd())).expect("no NUL");
        // SAFETY: a valid NUL-terminated path; the fd is owned below.
        let fd = unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(Refused::Io(io::Error::last_os_error()));
        }
        // SAFETY: a fresh fd nobody else owns.
        let f = unsafe { File::from_raw_fd(fd) };
        Ok(if dir {
            Entry::Dir(f, m)
        } else {
            Entry::File(f, m)
        })
    }

    /// The metadata of what `path` names (nothing is opened for reading).
    pub fn stat(&self, path: &Path) -> Result<fs::Metadata, Refused> {
        File::from(self.resolve(path)?)
            .metadata()
            .map_err(Refused::Io)
    }

    /// The whole of regular file `path`, refused when larger than `max`.
    pub fn read(&self, path: &Path, max: u64) -> Result<Vec<u8>, Refused> {
        let (f, m) = self.file(path)?;
        if m.len() > max {
            OVERSIZED.fetch_add(1, Relaxed);
            return Err(Refused::Oversized(m.len()));
        }
        let mut buf = Vec::new();
        // A file that grew since: still no more than `max`.
        f.take(max).read_to_end(&mut buf).map_err(Refused::Io)?;
        Ok(buf)
    }

    /// The first `max` bytes of regular file `path`, and its metadata.
    pub fn read_head(&self, path: &Path, max: u64) -> Result<(Vec<u8>, fs::Metadata), Refused> {
        let (f, m) = self.file(path)?;
        let mut buf = Vec::new();
        f.take(max).read_to_end(&mut buf).map_err(Refused::Io)?;
        Ok((buf, m))
    }

    fn file(&self, path: &Path) -> Result<(File, fs::Metadata), Refused> {
        match self.open(path)? {
            Entry::File(f, m) => Ok((f, m)),
            Entry::Dir(..) => Err(Refused::Io(io::Error::from_raw_os_error(libc::EISDIR))),
        }
    }

    /// The names in directory `path` (at most `max` entries looked at).
    pub fn list(&self, path: &Path, max: usize) -> Result<Vec<String>, Refused> {
        let f = match self.open(path)? {
            Entry::Dir(f, _) => f,
            Entry::File(..) => {
                return Err(Refused::Io(io::Error::from_raw_os_error(libc::ENOTDIR)))
            }
        };
        let listing =
            fs::read_dir(format!("/proc/self/fd/{}", f.as_raw_fd())).map_err(Refused::Io)?;
        Ok(listing
            .take(max)
            .flatten()
            .filter_map(|e| e.file_name().to_str().map(str::to_string))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    struct Tmp(std::path::PathBuf);
    impl Drop for Tmp {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn tree(name: &str) -> Tmp {
        let t = std::env::temp_dir().join(format!("tt-rootfs-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&t);
        fs::create_dir_all(t.join("root/etc")).unwrap();
        fs::create_dir_all(t.join("outside")).unwrap();
        Tmp(t)
    }

    fn mkfifo(p: &Path) {
        let c = CString::new(p.as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    }

    fn not_regular_now() -> u64 {
        refused()[0].1
    }

    #[test]
    fn a_fifo_is_refused_without_being_opened_even_behind_a_symlink() {
        let t = tree("fifo");
        mkfifo(&t.0.join("root/etc/METADATA"));
        symlink("/etc/METADATA", t.0.join("root/config.json")).unwrap();
        let root = Root::at(&t.0.join("root")).unwrap();
        let before = not_regular_now();
        // A plain open of a FIFO for reading would block here forever.
        assert!(matches!(
            root.read(Path::new("/etc/METADATA"), 1 << 20),
            Err(Refused::NotRegular)
        ));
        assert!(matches!(
            root.read_head(Path::new("/config.json"), 64),
            Err(Refused::NotRegular)
        ));
        assert!(not_regular_now() >= before + 2);
    }

    #[test]
    fn a_device_is_refused() {
        let t = tree("dev");
        symlink("/dev/zero", t.0.join("root/zero")).unwrap();
        // Resolved in the root: there is no /dev/zero in it.
        let root = Root::at(&t.0.join("root")).unwrap();
        assert!(matches!(
            root.read(Path::new("/zero"), 10),
            Err(Refused::Io(_))
        ));
        // The agent's own /dev as a root: the device itself is refused.
        let dev = Root::at(Path::new("/dev")).unwrap();
        assert!(matches!(
            dev.read(Path::new("/zero"), 10),
            Err(Refused::NotRegular)
        ));
    }

    #[test]
    fn symlinks_and_dotdot_resolve_inside_the_root_never_outside() {
        let t = tree("escape");
        fs::write(t.0.join("outside/secret"), "host secret").unwrap();
        fs::write(t.0.join("root/etc/hostname"), "in the container").unwrap();
        let outside = t.0.join("outside/secret");
        // An absolute link to a host path, a relative climb, and a link to
        // an absolute path the container has.
        symlink(&outside, t.0.join("root/abs")).unwrap();
        symlink(
            "../../../../../../outside/secret",
            t.0.join("root/etc/climb"),
        )
        .unwrap();
        symlink("/etc/hostname", t.0.join("root/name")).unwrap();
        let root = Root::at(&t.0.join("root")).unwrap();
        assert!(root.read(Path::new("/abs"), 100).is_err());
        assert!(root.read(Path::new("/etc/climb"), 100).is_err());
        assert!(root.read(Path::new("/../outside/secret"), 100).is_err());
        assert_eq!(
            root.read(Path::new("/name"), 100).unwrap(),
            b"in the container"
        );
        assert_eq!(root.list(Path::new("/etc"), 10).unwrap().len(), 2);
    }

    #[test]
    fn an_oversized_file_is_refused_and_a_head_is_bounded() {
        let t = tree("big");
        fs::write(t.0.join("root/big"), vec![b'x'; 10_000]).unwrap();
        let root = Root::at(&t.0.join("root")).unwrap();
        let before = refused()[1].1;
        assert!(matches!(
            root.read(Path::new("/big"), 4096),
            Err(Refused::Oversized(10_000))
        ));
        assert!(refused()[1].1 > before);
        let (head, m) = root.read_head(Path::new("/big"), 100).unwrap();
        assert_eq!((head.len(), m.len()), (100, 10_000));
    }
}
