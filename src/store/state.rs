//! The state directory as a whole: who is using it, and whose it is.
//!
//! - **`STATE/lock`** is held with `flock(2)` by the one node that serves from the directory, and holds its pid. A
//!   second node on the same state refuses to start and names the first one's pid, instead of both writing the
//!   same stores and fighting over SQLite's locks (issue 8, item 4). The kernel drops the lock when the process
//!   ends, however it ends, so a killed node never leaves a stale lock behind.
//! - **`STATE/identity`** names the node's public key and the apps whose stores it made. At start the node compares
//!   it with what is there: a key that went missing beside its stores (a new key would lock out every sender), a
//!   different key, or the store of an app that once existed and is gone, all look like lost data, and the node
//!   refuses to start on them unless told with `--accept-lost-state` (docs/durability.md).
//! - **`STATE/clean-stop`** names the apps whose stores the last run closed cleanly: stopped by a signal, every
//!   turn synced, and no disk fault under the store in that run. It is taken (read and removed) at start before any
//!   store is opened, so a run that ends any other way leaves none, and each store it does not name is checked whole
//!   before its app is served (issue 34; docs/durability.md, "A damaged store is never served").

use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use thiserror::Error;

/// The lock file under the state directory.
pub const LOCK_FILE: &str = "lock";
/// The identity file under the state directory.
pub const IDENTITY_FILE: &str = "identity";
/// The file naming the apps whose stores the last run closed cleanly.
pub const CLEAN_STOP_FILE: &str = "clean-stop";
/// The flag that lets a node start on a state that looks like lost data.
pub const ACCEPT_FLAG: &str = "--accept-lost-state";

#[derive(Debug, Error)]
pub enum StateError {
    #[error(
        "state directory {dir} is in use by another pure-serve (pid {pid}, which holds {lock}); stop that node \
         first, or give this one its own --state"
    )]
    InUse {
        dir: PathBuf,
        pid: String,
        lock: PathBuf,
    },
    #[error("cannot lock {path}: {source}")]
    Lock {
        path: PathBuf,
        source: std::io::Error,
    },
    /// `STATE/identity` that is not a regular file, too big, or unreadable (crate::files).
    #[error(transparent)]
    Read(#[from] crate::files::FileError),
    #[error("cannot write {path}: {source}{}", crate::files::write_fix(source))]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{path}:{line}: {what}; the file is written by the node, so restore it from a backup or remove it"
    )]
    Bad {
        path: PathBuf,
        line: usize,
        what: String,
    },
    #[error(
        "the state directory {dir} looks like it lost data, so the node does not start:\n  {}\n  if this is \
         meant (a new key, a store removed on purpose), start once with {ACCEPT_FLAG}: what is missing is made \
         anew; otherwise put back what is missing (from a backup) and start again",
        problems.join("\n  ")
    )]
    LooksLost { dir: PathBuf, problems: Vec<String> },
}

/// The held lock on a state directory; dropped (or the process ended), the directory is free again.
#[derive(Debug)]
pub struct StateLock {
    _file: File,
    pub path: PathBuf,
}

impl StateLock {
    /// Takes the lock of `dir` (which must exist) without waiting, and writes this process's pid into it.
    pub fn acquire(dir: &Path) -> Result<Self, StateError> {
        let path = dir.join(LOCK_FILE);
        let lock_err = |source| StateError::Lock {
            path: path.clone(),
            source,
        };
        // A lock that is not a regular file is refused before it is opened, and after (a FIFO swapped in between
        // opens at once with O_NONBLOCK): a second node reading a FIFO's "pid" blocked for ever, deaf to SIGTERM
        // (an outside audit), and the first one started with a lock that named no one.
        if let Err(e) = crate::files::open(&path, &crate::files::STATE_LOCK)
            && !matches!(&e, crate::files::FileError::Read { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
        {
            return Err(e.into());
        }
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
            .open(&path)
            .map_err(lock_err)?;
        if !file.metadata().map_err(lock_err)?.is_file() {
            return Err(crate::files::open(&path, &crate::files::STATE_LOCK)
                .err()
                .map_or_else(
                    || lock_err(std::io::Error::other("not a regular file")),
                    StateError::from,
                ));
        }
        // SAFETY: flock on a descriptor we own; it has no memory effects.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                let mut text = String::new();
                let _ = file.read_to_string(&mut text);
                let pid = text.trim();
                return Err(StateError::InUse {
                    dir: dir.to_path_buf(),
                    pid: if pid.is_empty() {
                        "unknown".to_string()
                    } else {
                        pid.chars().take(20).collect()
                    },
                    lock: path,
                });
            }
            return Err(lock_err(e));
        }
        // The pid is written over the old one in place, padded to a fixed width, so that on a full disk (where
        // a new block cannot be had) the lock still works; only the pid it shows may then be stale.
        let pid = format!("{:<20}\n", std::process::id());
        if let Err(e) = file.rewind().and_then(|_| file.write_all(pid.as_bytes())) {
            tracing::warn!(
                "cannot write this node's pid into {} ({e}); the lock holds all the same",
                path.display()
            );
        }
        Ok(StateLock { _file: file, path })
    }

    /// The pid of the node holding `dir`'s lock, if one does (for `check` and for readers).
    pub fn holder(dir: &Path) -> Option<String> {
        let path = dir.join(LOCK_FILE);
        // Through crate::files: `check` calls this, and must not hang on a lock that is a FIFO.
        let file = crate::files::open(&path, &crate::files::STATE_LOCK).ok()?;
        // A shared lock that cannot be had means a node holds the exclusive one.
        let fd = file.as_raw_fd();
        // SAFETY: as above.
        let free = unsafe { libc::flock(fd, libc::LOCK_SH | libc::LOCK_NB) } == 0;
        if free {
            // SAFETY: as above; releases the shared lock just taken.
            unsafe { libc::flock(fd, libc::LOCK_UN) };
            return None;
        }
        let text = file.read_all().unwrap_or_default();
        Some(
            String::from_utf8_lossy(&text)
                .trim()
                .chars()
                .take(20)
                .collect(),
        )
    }
}

/// What `STATE/identity` says: whose state this is, and which apps' stores it made.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Identity {
    pub public_key: [u8; 32],
    pub apps: BTreeSet<String>,
}

const HEADER: &str = "# pure-serve state identity: the node this state directory belongs to and the apps whose \
stores it made.\n# Written by the node; see docs/durability.md. Do not edit.\n";

impl Identity {
    pub fn path(dir: &Path) -> PathBuf {
        dir.join(IDENTITY_FILE)
    }

    /// Reads `dir/identity`; `None` if there is none.
    pub fn read(dir: &Path) -> Result<Option<Self>, StateError> {
        let path = Self::path(dir);
        let text = match crate::files::read(&path, &crate::files::STATE_IDENTITY) {
            Ok(t) => t,
            Err(crate::files::FileError::Read { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                return Ok(None);
            }
            Err(e) => return Err(e.into()),
        };
        Self::parse(&path, &text).map(Some)
    }

    /// Parses the text of an identity file; `path` only names it in messages.
    pub fn parse(path: &Path, text: &[u8]) -> Result<Self, StateError> {
        let bad = |line, what: String| StateError::Bad {
            path: path.to_path_buf(),
            line,
            what,
        };
        let text = std::str::from_utf8(text).map_err(|_| bad(1, "is not UTF-8 text".into()))?;
        let mut key = None;
        let mut apps = BTreeSet::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (word, value) = line.split_once(' ').unwrap_or((line, ""));
            match word {
                "public_key" => {
                    let k = crate::keys::decode_key(value.trim())
                        .map_err(|e| bad(i + 1, format!("public_key: {e}")))?;
                    key = Some(k);
                }
                "app" if !value.trim().is_empty() => {
                    apps.insert(value.trim().to_string());
                }
                _ => {
                    let shown: String = line.chars().take(40).collect();
                    return Err(bad(
                        i + 1,
                        format!("expected `public_key KEY` or `app NAME`, found {shown:?}"),
                    ));
                }
            }
        }
        let public_key = key.ok_or_else(|| bad(1, "has no `public_key` line".into()))?;
        Ok(Identity { public_key, apps })
    }

    fn render(&self) -> String {
        let mut s = String::from(HEADER);
        s.push_str(&format!(
            "public_key {}\n",
            crate::keys::encode_key(&self.public_key)
        ));
        for a in &self.apps {
            s.push_str(&format!("app {a}\n"));
        }
        s
    }

    /// Writes `dir/identity` whole: beside its name, synced, renamed over it, and the directory synced, so a crash
    /// leaves the old file or the new one.
    pub fn write(&self, dir: &Path) -> Result<(), StateError> {
        write_whole(dir, IDENTITY_FILE, &self.render())
    }
}

/// Writes `dir/name` whole: beside its name, synced, renamed over it, and the directory synced, so a crash leaves
/// the old file or the new one.
fn write_whole(dir: &Path, name: &str, text: &str) -> Result<(), StateError> {
    let path = dir.join(name);
    let tmp = dir.join(format!("{name}.tmp"));
    let write_err = |source| StateError::Write {
        path: path.clone(),
        source,
    };
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .open(&tmp)
        .map_err(write_err)?;
    file.write_all(text.as_bytes())
        .and_then(|_| file.sync_all())
        .map_err(write_err)?;
    drop(file);
    std::fs::rename(&tmp, &path).map_err(write_err)?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(write_err)
}

const CLEAN_STOP_HEADER: &str = "# pure-serve: the apps whose stores the last run of the node closed cleanly; \
their stores are not checked whole at the next start.\n# Written by the node at a clean stop and removed at its start; \
see docs/durability.md. Do not edit.\n";

/// `STATE/clean-stop`: the apps whose stores the last run closed cleanly ([`crate::store::state`]).
pub struct CleanStop;

impl CleanStop {
    pub fn path(dir: &Path) -> PathBuf {
        dir.join(CLEAN_STOP_FILE)
    }

    /// Reads and removes the file, then syncs the directory, so that a run which does not end cleanly leaves no
    /// file behind: the apps the last run closed cleanly (none if there is no file, or it cannot be read, which
    /// only costs a check). A file that cannot be removed is an error: the next start would trust it.
    pub fn take(dir: &Path) -> Result<BTreeSet<String>, StateError> {
        let path = Self::path(dir);
        let apps = match crate::files::read(&path, &crate::files::STATE_CLEAN_STOP) {
            Ok(text) => String::from_utf8_lossy(&text)
                .lines()
                .filter_map(|l| l.trim().strip_prefix("app "))
                .filter_map(|l| {
                    let mut words = l.split_whitespace();
                    let app = words.next()?.to_string();
                    let said: Vec<&str> = words.collect();
                    match (said.as_slice(), fingerprint(dir, &app)) {
                        // Written by a node before stores were fingerprinted: trusted as it says.
                        ([], _) => Some(app),
                        (&[bytes, time], Some(now)) if format!("{bytes} {time}") == now => Some(app),
                        (_, now) => {
                            tracing::warn!(
                                "store {} was {} since the node's last clean stop: it is read whole before it is \
                                 served",
                                crate::store::app_store_path(dir, &app).display(),
                                if now.is_some() { "changed" } else { "removed" }
                            );
                            None
                        }
                    }
                })
                .collect(),
            Err(crate::files::FileError::Read { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                return Ok(BTreeSet::new());
            }
            Err(e) => {
                tracing::warn!("{e}: every store is checked whole at this start");
                BTreeSet::new()
            }
        };
        let remove_err = |source| StateError::Write {
            path: path.clone(),
            source,
        };
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(remove_err(e)),
        }
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(remove_err)?;
        Ok(apps)
    }

    /// Writes the file whole (beside its name, synced, renamed, the directory synced), naming `apps`.
    pub fn write(dir: &Path, apps: &BTreeSet<String>) -> Result<(), StateError> {
        let mut text = String::from(CLEAN_STOP_HEADER);
        for a in apps {
            // Each store's size and time of change as the stop left them: a store changed while the node was
            // stopped (damaged, replaced by hand, put back from a backup) is read whole at the next start.
            match fingerprint(dir, a) {
                Some(f) => text.push_str(&format!("app {a} {f}\n")),
                None => continue,
            }
        }
        write_whole(dir, CLEAN_STOP_FILE, &text)
    }
}

/// An app's store file as `STATE/clean-stop` says it: its size in bytes and its time of last change in
/// nanoseconds since the Unix epoch, or `None` when it cannot be looked at.
fn fingerprint(dir: &Path, app: &str) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(crate::store::app_store_path(dir, app)).ok()?;
    let ns = i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec());
    Some(format!("{} {ns}", m.len()))
}

/// What is on disk at start, for [`judge`].
#[derive(Debug)]
pub struct Found<'a> {
    pub dir: &'a Path,
    pub identity: Option<&'a Identity>,
    pub key_file: &'a Path,
    /// The public key of the key file, if there is one.
    pub key: Option<[u8; 32]>,
    /// Apps that have a store file now.
    pub stores: &'a [String],
    /// Apps the node is configured to host.
    pub apps: &'a [String],
}

/// The ways the state looks like it lost data (empty: it does not). Each says what is missing and what it means.
pub fn judge(f: &Found<'_>) -> Vec<String> {
    let mut problems = Vec::new();
    let key_text = |k: &[u8; 32]| crate::keys::encode_key(k);
    let stores_list = || f.stores.join(", ");
    match (f.identity, f.key) {
        (Some(id), None) => problems.push(format!(
            "the key file {} is missing, but {} says this state belongs to node {}: a new key would lock out every \
             sender (they know the old public key)",
            f.key_file.display(),
            Identity::path(f.dir).display(),
            key_text(&id.public_key)
        )),
        (Some(id), Some(k)) if id.public_key != k => problems.push(format!(
            "the key file {} is node {}, but {} says this state belongs to node {}",
            f.key_file.display(),
            key_text(&k),
            Identity::path(f.dir).display(),
            key_text(&id.public_key)
        )),
        (None, None) if !f.stores.is_empty() => problems.push(format!(
            "the key file {} is missing beside the stores of {} in {}: a new key would lock out every sender \
             (they know the old public key)",
            f.key_file.display(),
            stores_list(),
            f.dir.join("apps").display()
        )),
        // A key with neither stores nor an identity file is a first start with a key made beforehand (with
        // `keygen`, in the state directory or elsewhere): nothing says data was there.
        _ => {}
    }
    if let Some(id) = f.identity {
        for app in f.apps {
            if id.apps.contains(app) && !f.stores.contains(app) {
                problems.push(format!(
                    "the store of app {app} ({}) is missing, but {} says it was made: its records are gone, and \
                     its senders' flows would start again from 0",
                    crate::store::app_store_path(f.dir, app).display(),
                    Identity::path(f.dir).display()
                ));
            }
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_names_the_first_holder() {
        let dir = tempfile::tempdir().unwrap();
        let first = StateLock::acquire(dir.path()).unwrap();
        assert_eq!(
            StateLock::holder(dir.path()),
            Some(std::process::id().to_string())
        );
        // flock locks belong to the open file description, so a second open in this process conflicts too.
        let err = StateLock::acquire(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains(&format!("pid {}", std::process::id())),
            "{err}"
        );
        drop(first);
        assert_eq!(StateLock::holder(dir.path()), None);
        StateLock::acquire(dir.path()).unwrap();
    }

    #[test]
    fn identity_round_trips_and_bad_text_names_its_line() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(Identity::read(dir.path()).unwrap(), None);
        let id = Identity {
            public_key: [9; 32],
            apps: ["main".to_string(), "b".to_string()].into(),
        };
        id.write(dir.path()).unwrap();
        assert_eq!(Identity::read(dir.path()).unwrap(), Some(id));
        let err = Identity::parse(Path::new("identity"), b"public_key AAAA\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("identity:1: public_key"), "{err}");
        let err = Identity::parse(Path::new("identity"), b"# c\nwhat ever\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("identity:2: expected"), "{err}");
    }

    #[test]
    fn lost_data_shapes_are_named() {
        let dir = Path::new("/s");
        let key_file = dir.join("node.key");
        let id = Identity {
            public_key: [1; 32],
            apps: ["main".to_string()].into(),
        };
        let main = vec!["main".to_string()];
        let none: Vec<String> = Vec::new();
        let f = |identity, key, stores: &'static [&'static str]| -> Vec<String> {
            let stores: Vec<String> = stores.iter().map(|s| s.to_string()).collect();
            judge(&Found {
                dir,
                identity,
                key_file: &key_file,
                key,
                stores: &stores,
                apps: &main,
            })
        };
        // Fresh, an upgrade from before the identity file, and the normal case.
        assert!(f(None, None, &[]).is_empty());
        assert!(f(None, Some([1; 32]), &["main"]).is_empty());
        assert!(f(Some(&id), Some([1; 32]), &["main"]).is_empty());
        let p = f(Some(&id), None, &["main"]);
        assert!(p[0].contains("node.key is missing"), "{p:?}");
        let p = f(Some(&id), Some([2; 32]), &["main"]);
        assert!(p[0].contains("says this state belongs to node"), "{p:?}");
        let p = f(None, None, &["main"]);
        assert!(p[0].contains("missing beside the stores of main"), "{p:?}");
        // A key made beforehand, first start.
        assert!(f(None, Some([1; 32]), &[]).is_empty());
        let p = f(Some(&id), Some([1; 32]), &[]);
        assert!(p[0].contains("store of app main"), "{p:?}");
        // A key kept outside the state directory, first start: fine.
        let outside = Path::new("/etc/node.key");
        assert!(
            judge(&Found {
                dir,
                identity: None,
                key_file: outside,
                key: Some([1; 32]),
                stores: &none,
                apps: &main,
            })
            .is_empty()
        );
    }
}
