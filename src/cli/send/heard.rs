//! `send --heard-file`: the downlink heard sequence kept across runs (docs/protocol.md 12.5), so a device command
//! run again prints nothing it printed before.
//!
//! The file holds one decimal number and a newline: the sequence of the last downlink record printed. It is
//! replaced whole (a temporary file beside it, synced, renamed over it, the directory synced), so a crash leaves
//! the old number or the new one, never a torn one. It is written only after the records are printed and standard
//! output flushed: a kill between the two prints those records again on the next run, and never skips one.
//!
//! A run holds `FILE.lock` (an exclusive `flock`) while it uses the file: two runs on one heard file (a scheduled
//! wake that overlaps the last) would both be given the same records and print them twice, so the second is
//! refused before it asks. The file is made at the start of a run if missing, so a path that cannot be written
//! stops the run before anything is acknowledged.

use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use thiserror::Error;

#[derive(Debug, Error)]
pub enum HeardError {
    #[error(
        "{path} line 1: expected the downlink heard sequence, a decimal number such as 0, found {found:?}; \
         fix the number or delete the file (then the node sends again everything still waiting for this device)"
    )]
    Bad { path: PathBuf, found: String },
    #[error("cannot read the heard file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "the heard file {path} is in use by another `pure-serve send --listen` (it holds {path}.lock): two runs \
         on one heard file would print the same records twice; let the other run end (a timer's wakes must not \
         overlap), or give each run a heard file of its own"
    )]
    Busy { path: PathBuf },
    #[error(
        "cannot lock the heard file {path} (through {path}.lock): {source}; is its directory there and writable?"
    )]
    Lock {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "cannot write the heard file {path}: {source}; the records printed may be printed again next run"
    )]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The heard file of one downlink flow.
pub struct HeardFile {
    path: PathBuf,
    /// The number the file holds now.
    kept: u64,
    /// `FILE.lock`, locked while this run uses the file (the lock goes with the descriptor).
    _lock: File,
}

impl HeardFile {
    /// Locks `path` for this run and reads it; a file that does not exist yet is made, holding 0 (nothing handed
    /// over).
    pub fn open(path: &Path) -> Result<Self, HeardError> {
        let lock = lock(path)?;
        let kept = match fs::read(path) {
            Ok(bytes) => parse(&bytes).ok_or_else(|| HeardError::Bad {
                path: path.to_path_buf(),
                found: String::from_utf8_lossy(&bytes[..bytes.len().min(40)]).into_owned(),
            })?,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                replace(path, 0).map_err(|source| HeardError::Write {
                    path: path.to_path_buf(),
                    source,
                })?;
                0
            }
            Err(source) => {
                return Err(HeardError::Read {
                    path: path.to_path_buf(),
                    source,
                });
            }
        };
        Ok(HeardFile {
            path: path.to_path_buf(),
            kept,
            _lock: lock,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn kept(&self) -> u64 {
        self.kept
    }

    /// Keeps `heard` durably; nothing is written when it is what the file holds.
    pub fn keep(&mut self, heard: u64) -> Result<(), HeardError> {
        if heard == self.kept {
            return Ok(());
        }
        replace(&self.path, heard).map_err(|source| HeardError::Write {
            path: self.path.clone(),
            source,
        })?;
        self.kept = heard;
        Ok(())
    }
}

/// `path` with `suffix` added to its file name.
fn beside(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(suffix);
    path.with_file_name(name)
}

/// Takes `FILE.lock` for this run, or says another run has it.
fn lock(path: &Path) -> Result<File, HeardError> {
    let failed = |source| HeardError::Lock {
        path: path.to_path_buf(),
        source,
    };
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(beside(path, ".lock"))
        .map_err(failed)?;
    // SAFETY: flock on a descriptor this function owns.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() == ErrorKind::WouldBlock {
            return Err(HeardError::Busy {
                path: path.to_path_buf(),
            });
        }
        return Err(failed(e));
    }
    Ok(file)
}

/// Replaces `path` whole with `heard`: a temporary file beside it, synced, renamed over it, the directory synced.
fn replace(path: &Path, heard: u64) -> std::io::Result<()> {
    let tmp = beside(path, ".tmp");
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)?;
    writeln!(f, "{heard}")?;
    f.sync_all()?;
    fs::rename(&tmp, path)?;
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    File::open(dir)?.sync_all()
}

/// One decimal number, an optional newline, nothing else.
fn parse(bytes: &[u8]) -> Option<u64> {
    let digits = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_file_is_zero_and_keeping_writes_it_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("heard");
        let mut h = HeardFile::open(&path).unwrap();
        assert_eq!(h.kept(), 0);
        assert_eq!(fs::read_to_string(&path).unwrap(), "0\n", "made at once");
        h.keep(42).unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), "42\n");
        drop(h);
        assert_eq!(HeardFile::open(&path).unwrap().kept(), 42);
        assert!(!dir.path().join("heard.tmp").exists());
    }

    #[test]
    fn a_second_run_on_one_heard_file_is_refused_until_the_first_ends() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("heard");
        let first = HeardFile::open(&path).unwrap();
        let e = HeardFile::open(&path).err().expect("refused").to_string();
        assert!(e.contains("in use by another"), "{e}");
        assert!(e.contains(&path.display().to_string()), "{e}");
        drop(first);
        HeardFile::open(&path).unwrap();
    }

    #[test]
    fn a_heard_file_in_a_missing_directory_is_an_error_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("no-such-dir").join("heard");
        let e = HeardFile::open(&path).err().expect("refused").to_string();
        assert!(e.contains(&path.display().to_string()), "{e}");
    }

    #[test]
    fn a_bad_file_names_itself_and_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("heard");
        for bad in [
            "",
            "\n",
            "12x\n",
            "-1\n",
            "1 2\n",
            "99999999999999999999999\n",
        ] {
            fs::write(&path, bad).unwrap();
            let e = HeardFile::open(&path).err().expect(bad).to_string();
            assert!(e.contains(&format!("{} line 1", path.display())), "{e}");
            assert!(e.contains("delete the file"), "{e}");
        }
        fs::write(&path, "7").unwrap();
        assert_eq!(HeardFile::open(&path).unwrap().kept(), 7);
    }
}
