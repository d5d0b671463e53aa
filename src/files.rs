//! Opening and reading the files an operator names: the senders file, the apps file, key files, and PEM files
//! (the TLS certificate and key of `--http-port`, the CA files of outlets).
//!
//! What this module owns: that every one of those reads is of a regular file of a sane size, and never blocks.
//! Any such path may name something that is not a file — a FIFO (whose open blocks until a writer comes, and whose
//! reads block after), a device such as `/dev/zero` or `/dev/urandom` (endless), a directory, a socket — directly
//! or through a symbolic link, and a regular file may be far larger than any useful one. Issue 14 (item 2) found
//! the node, `check` and reloads hanging or reading without bound on each, so every reader goes through here:
//!
//! - the path is `stat`ed, and anything but a regular file is refused without being opened (opening a device can
//!   do something by itself: a watchdog device starts counting);
//! - it is then opened with `O_NONBLOCK` and `O_NOCTTY`, so a FIFO swapped in meanwhile opens at once instead of
//!   blocking, and the descriptor is `fstat`ed: what is read is what was checked, through the same descriptor;
//! - a file larger than its kind's limit ([`FileSpec::max_bytes`]) is refused before anything is read, and at most
//!   limit + 1 bytes are ever read, so a file that grows while it is read is refused too.
//!
//! [`FileError`] says what is wrong once, names the file and the flag that gave it, and says the fix.

use std::fs::{File, Metadata};
use std::io::{self, Read, Take};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use thiserror::Error;

/// One kind of file the node reads: how messages name it, and how large a useful one can be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileSpec {
    /// What the file is, as messages name it ("senders file").
    pub what: &'static str,
    /// Where its path comes from, as the fix names it ("--senders", "`ca_file`").
    pub flag: &'static str,
    /// The largest file taken; a larger one is refused before it is read.
    pub max_bytes: u64,
    /// What the limit is sized for, said when a file passes it.
    pub sized_for: &'static str,
    /// The fix when the operator does not name the file (the node's own files under `--state`); `None`: point
    /// `flag` at the right file.
    pub fix: Option<&'static str>,
}

impl FileSpec {
    /// The fix of a file that is not what it should be: point the flag at `file`, unless the kind has its own.
    fn fix(&self, file: &str) -> String {
        match self.fix {
            Some(fix) => fix.to_string(),
            None => format!("point {} at {file}", self.flag),
        }
    }
}

/// The senders file: 10 million senders of the longest line the format takes without a comment (a 64-byte name,
/// a separator, a 44-character key and CRLF: 111 bytes, 1.11 GB in all), with room for about as much again of
/// comments and indentation.
pub const SENDERS: FileSpec = FileSpec {
    what: "senders file",
    flag: "--senders",
    max_bytes: 2 << 30,
    sized_for: "10 million senders of the longest names, with comments",
    fix: None,
};

/// The apps file: about 10,000 apps with an outlet each at ~400 bytes of TOML. Beyond it is not an apps file.
pub const APPS: FileSpec = FileSpec {
    what: "apps file",
    flag: "--apps",
    max_bytes: 4 << 20,
    sized_for: "about 10,000 apps with an outlet each",
    fix: None,
};

/// A key file: 44 characters of base64 and a newline; the rest is room for whitespace and CRLF, not another file.
pub const KEY: FileSpec = FileSpec {
    what: "key file",
    flag: "--key",
    max_bytes: 512,
    sized_for: "one line of 44 characters of base64",
    fix: None,
};

/// PEM files are sized from the largest one useful: a CA bundle (the system's whole bundle is ~220 KB); a
/// certificate chain or a private key is a few KB.
const MAX_PEM_BYTES: u64 = 4 << 20;
const PEM_SIZED_FOR: &str = "a whole CA bundle is ~220 KB";

/// `--tls-cert`: the PEM certificate chain of the HTTPS port.
pub const TLS_CERT: FileSpec = FileSpec {
    what: "PEM certificate file",
    flag: "--tls-cert",
    max_bytes: MAX_PEM_BYTES,
    sized_for: PEM_SIZED_FOR,
    fix: None,
};

/// `--tls-key`: the PEM private key of `--tls-cert`.
pub const TLS_KEY: FileSpec = FileSpec {
    what: "PEM private key file",
    flag: "--tls-key",
    max_bytes: MAX_PEM_BYTES,
    sized_for: PEM_SIZED_FOR,
    fix: None,
};

/// An outlet's `ca_file` (docs/apps.md): the PEM certificates a wire or webhook trusts.
pub const CA_FILE: FileSpec = FileSpec {
    what: "CA file",
    flag: "`ca_file` in the apps file",
    max_bytes: MAX_PEM_BYTES,
    sized_for: PEM_SIZED_FOR,
    fix: None,
};

/// The fix for the state directory's files below: the operator names the directory, never the file.
const NOT_OURS: &str =
    "give --state the node's own state directory (the node writes this file itself)";

/// `STATE/identity` (store/state.rs): a public key and a line per app, ~40 bytes each.
pub const STATE_IDENTITY: FileSpec = FileSpec {
    what: "state identity file",
    flag: "--state",
    max_bytes: 1 << 20,
    sized_for: "a key and some 25,000 app names",
    fix: Some(NOT_OURS),
};

/// `STATE/clean-stop` (store/state.rs): a line per app whose store the last run closed cleanly, ~40 bytes each.
pub const STATE_CLEAN_STOP: FileSpec = FileSpec {
    what: "state's clean-stop file",
    flag: "--state",
    max_bytes: 1 << 20,
    sized_for: "some 25,000 app names",
    fix: Some(NOT_OURS),
};

/// `STATE/lock`, read for the pid of the node that holds it: 20 characters and a newline.
pub const STATE_LOCK: FileSpec = FileSpec {
    what: "state lock file",
    flag: "--state",
    max_bytes: 64,
    sized_for: "a process id",
    fix: Some(NOT_OURS),
};

/// The password of the fleet's database user: its first line.
pub const STORE_PASSWORD: FileSpec = FileSpec {
    what: "store password file",
    flag: "--store-password-file",
    max_bytes: 4096,
    sized_for: "one line of a password",
    fix: None,
};

/// Whether a write failed for the disk (full, over quota, an I/O error, read-only) rather than for anything the
/// configuration says: a start that fails so is worth trying again once the disk is fixed, so it is not EX_CONFIG
/// (systemd restarts the unit).
pub fn disk_refused(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::StorageFull
            | io::ErrorKind::QuotaExceeded
            | io::ErrorKind::ReadOnlyFilesystem
    ) || e.raw_os_error() == Some(libc::EIO)
}

/// The fix for a write the disk refused, after its error; nothing for other errors (their words say it).
pub fn write_fix(e: &io::Error) -> &'static str {
    if disk_refused(e) {
        "; free space on its filesystem (or fix the disk: `dmesg` says why); the node starts once it can write \
         there (under systemd it is restarted)"
    } else {
        ""
    }
}

#[derive(Debug, Error)]
pub enum FileError {
    /// The OS refused to open or read it (missing, no permission, an I/O error): its error, said once.
    #[error("cannot read {} {}: {source}", spec.what, path.display())]
    Read {
        spec: &'static FileSpec,
        path: PathBuf,
        source: io::Error,
    },
    #[error(
        "{} {}{} is {kind}, not a regular file: {}",
        spec.what,
        path.display(),
        Through(target),
        spec.fix("a regular file")
    )]
    NotRegular {
        spec: &'static FileSpec,
        path: PathBuf,
        /// What a symbolic link at `path` ends at.
        target: Option<PathBuf>,
        kind: &'static str,
    },
    #[error(
        "{} {} is {size} bytes, more than any useful one (at most {} bytes: {}): {}",
        spec.what,
        path.display(),
        spec.max_bytes,
        spec.sized_for,
        spec.fix("the right file")
    )]
    TooBig {
        spec: &'static FileSpec,
        path: PathBuf,
        size: u64,
    },
    #[error(
        "{} {} grew past {} bytes while it was read ({}): write the file beside its name and rename it into \
         place, or {}",
        spec.what,
        path.display(),
        spec.max_bytes,
        spec.sized_for,
        spec.fix("the right file")
    )]
    Grew {
        spec: &'static FileSpec,
        path: PathBuf,
    },
}

/// " (a symbolic link to T)" when the path was one.
struct Through<'a>(&'a Option<PathBuf>);

impl std::fmt::Display for Through<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(t) => write!(f, " (a symbolic link to {})", t.display()),
            None => Ok(()),
        }
    }
}

/// What a file that is not a regular one is, in words; `None` for a regular file.
fn not_regular(meta: &Metadata) -> Option<&'static str> {
    let t = meta.file_type();
    if t.is_file() {
        None
    } else if t.is_dir() {
        Some("a directory")
    } else if t.is_fifo() {
        Some("a FIFO (named pipe)")
    } else if t.is_char_device() {
        Some("a character device")
    } else if t.is_block_device() {
        Some("a block device")
    } else if t.is_socket() {
        Some("a socket")
    } else {
        Some("of a kind that cannot be read")
    }
}

/// A regular file of a sane size, open for reading through the descriptor that was checked.
#[derive(Debug)]
pub struct Opened {
    file: File,
    meta: Metadata,
    path: PathBuf,
    spec: &'static FileSpec,
}

/// Opens `path` as a file of kind `spec`: refuses what is not a regular file (also through a symbolic link) and
/// what is larger than the kind's limit, without blocking and without reading anything.
pub fn open(path: &Path, spec: &'static FileSpec) -> Result<Opened, FileError> {
    let read_err = |source| FileError::Read {
        spec,
        path: path.to_path_buf(),
        source,
    };
    let refuse = |meta: &Metadata| match not_regular(meta) {
        Some(kind) => Err(FileError::NotRegular {
            spec,
            path: path.to_path_buf(),
            target: std::fs::symlink_metadata(path)
                .is_ok_and(|m| m.file_type().is_symlink())
                .then(|| std::fs::canonicalize(path).ok())
                .flatten(),
            kind,
        }),
        None => Ok(()),
    };
    // Before the open: opening a device may act by itself, and a socket cannot be opened at all (ENXIO, which
    // would say nothing useful).
    refuse(&std::fs::metadata(path).map_err(read_err)?)?;
    // O_NONBLOCK: should a FIFO be swapped in after the stat, its open returns at once (and the fstat below
    // refuses it) instead of waiting for a writer. On a regular file it changes nothing.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(read_err)?;
    let meta = file.metadata().map_err(read_err)?;
    refuse(&meta)?;
    if meta.len() > spec.max_bytes {
        return Err(FileError::TooBig {
            spec,
            path: path.to_path_buf(),
            size: meta.len(),
        });
    }
    Ok(Opened {
        file,
        meta,
        path: path.to_path_buf(),
        spec,
    })
}

/// Reads the whole of a file of kind `spec` ([`open`], then [`Opened::read_all`]).
pub fn read(path: &Path, spec: &'static FileSpec) -> Result<Vec<u8>, FileError> {
    open(path, spec)?.read_all()
}

impl std::os::fd::AsRawFd for Opened {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.file.as_raw_fd()
    }
}

impl Opened {
    /// The file as it was when opened (through its descriptor).
    pub fn metadata(&self) -> &Metadata {
        &self.meta
    }

    /// The checked descriptor, for reads by position (`pread`) that leave the readers' places alone.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Reads the file whole: at most its limit, or [`FileError::Grew`].
    pub fn read_all(self) -> Result<Vec<u8>, FileError> {
        let want = self.meta.len().min(self.spec.max_bytes) as usize;
        let mut bytes = Vec::with_capacity(want + 1);
        let mut reader = self.reader();
        reader
            .read_to_end(&mut bytes)
            .map_err(|e| reader.error(e))?;
        reader.finish()?;
        Ok(bytes)
    }

    /// A reader of the file that stops after its limit + 1 bytes; [`Bounded::finish`] then says whether the file
    /// grew past the limit while it was read.
    pub fn reader(self) -> Bounded {
        let limit = self.spec.max_bytes.saturating_add(1);
        Bounded {
            inner: At {
                file: self.file,
                at: 0,
            }
            .take(limit),
            path: self.path,
            spec: self.spec,
        }
    }

    /// A second reader of the same file from byte `from` on, through its own descriptor of the same open file (so
    /// it reads what the checked descriptor reads), sharing the limit: it stops after the limit + 1 - `from` bytes.
    /// It lets two threads read the two halves of one file (crate::senders).
    pub fn reader_from(&self, from: u64) -> io::Result<Bounded> {
        let limit = self.spec.max_bytes.saturating_add(1).saturating_sub(from);
        Ok(Bounded {
            inner: At {
                file: self.file.try_clone()?,
                at: from,
            }
            .take(limit),
            path: self.path.clone(),
            spec: self.spec,
        })
    }
}

/// Reads by position (`pread`), not through the descriptor's shared offset, so two duplicated descriptors of one
/// file can be read at once from two places.
#[derive(Debug)]
struct At {
    file: File,
    at: u64,
}

impl Read for At {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        use std::os::unix::fs::FileExt;
        let n = self.file.read_at(buf, self.at)?;
        self.at += n as u64;
        Ok(n)
    }
}

/// A file being read, at most its kind's limit + 1 bytes.
#[derive(Debug)]
pub struct Bounded {
    inner: Take<At>,
    path: PathBuf,
    spec: &'static FileSpec,
}

impl Read for Bounded {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.inner.read(buf)
    }
}

impl Bounded {
    /// At the end of what [`Read`] gave: whether the file stayed within its limit.
    pub fn finish(&self) -> Result<(), FileError> {
        if self.inner.limit() == 0 {
            return Err(FileError::Grew {
                spec: self.spec,
                path: self.path.clone(),
            });
        }
        Ok(())
    }

    /// A read error of this file, named.
    pub fn error(&self, source: io::Error) -> FileError {
        FileError::Read {
            spec: self.spec,
            path: self.path.clone(),
            source,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::sync::mpsc;
    use std::time::Duration;

    const SMALL: FileSpec = FileSpec {
        what: "test file",
        flag: "--test",
        max_bytes: 10,
        sized_for: "ten bytes",
        fix: None,
    };

    /// Runs `f` on a thread and fails the test (rather than hanging it) when it does not return within 10 s.
    fn within_seconds<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(Duration::from_secs(10))
            .expect("blocked: did not return within 10 s")
    }

    fn err_of(path: &Path) -> String {
        let path = path.to_path_buf();
        within_seconds(move || read(&path, &SMALL))
            .unwrap_err()
            .to_string()
    }

    fn mkfifo(path: &Path) {
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    }

    #[test]
    fn a_fifo_is_refused_without_blocking_also_through_a_link() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("pipe");
        mkfifo(&fifo);
        let e = err_of(&fifo);
        assert_eq!(
            e,
            format!(
                "test file {} is a FIFO (named pipe), not a regular file: point --test at a regular file",
                fifo.display()
            )
        );
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&fifo, &link).unwrap();
        let e = err_of(&link);
        assert!(
            e.contains(&format!(
                "{} (a symbolic link to {}) is a FIFO",
                link.display(),
                fifo.canonicalize().unwrap().display()
            )),
            "{e}"
        );
    }

    #[test]
    fn devices_directories_and_sockets_are_named_for_what_they_are() {
        let dir = tempfile::tempdir().unwrap();
        assert!(
            err_of(Path::new("/dev/zero"))
                .contains("/dev/zero is a character device, not a regular file")
        );
        let link = dir.path().join("zero");
        std::os::unix::fs::symlink("/dev/urandom", &link).unwrap();
        assert!(err_of(&link).contains("(a symbolic link to /dev/urandom) is a character device"));
        assert!(err_of(dir.path()).contains("is a directory, not a regular file"));
        let sock = dir.path().join("sock");
        let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        assert!(err_of(&sock).contains("sock is a socket, not a regular file"));
    }

    #[test]
    fn a_missing_file_gives_the_os_error() {
        let dir = tempfile::tempdir().unwrap();
        let e = err_of(&dir.path().join("nope"));
        assert!(e.starts_with("cannot read test file "), "{e}");
        assert_eq!(e.matches("No such file or directory").count(), 1, "{e}");
    }

    #[test]
    fn the_limit_holds_before_the_read_and_while_it_reads() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"0123456789").unwrap();
        assert_eq!(read(&path, &SMALL).unwrap(), b"0123456789");
        // Sparse: a size past the limit costs no disk, and nothing of it is read.
        File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(1 << 40)
            .unwrap();
        let e = err_of(&path);
        assert!(
            e.contains(
                "is 1099511627776 bytes, more than any useful one (at most 10 bytes: ten bytes)"
            ),
            "{e}"
        );
        // Within the limit when opened, past it by the time it is read.
        std::fs::write(&path, b"01234").unwrap();
        let opened = open(&path, &SMALL).unwrap();
        File::options()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(b"56789abcdef")
            .unwrap();
        let e = opened.read_all().unwrap_err().to_string();
        assert!(e.contains("grew past 10 bytes while it was read"), "{e}");
    }
}
