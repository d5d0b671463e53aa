//! `send --heard-file`: the downlink heard sequence kept across runs (docs/protocol.md 12.5), so a device command
//! run again prints nothing it printed before.
//!
//! The file holds one decimal number and a newline: the sequence of the last downlink record printed. It is
//! replaced whole (a temporary file beside it, synced, renamed over it, the directory synced), so a crash leaves
//! the old number or the new one, never a torn one. It is written only after the records are printed and standard
//! output flushed: a kill between the two prints those records again on the next run, and never skips one.

use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Write};
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
}

impl HeardFile {
    /// Reads `path`; a file that does not exist yet holds 0 (nothing handed over).
    pub fn open(path: &Path) -> Result<Self, HeardError> {
        let kept = match fs::read(path) {
            Ok(bytes) => parse(&bytes).ok_or_else(|| HeardError::Bad {
                path: path.to_path_buf(),
                found: String::from_utf8_lossy(&bytes[..bytes.len().min(40)]).into_owned(),
            })?,
            Err(e) if e.kind() == ErrorKind::NotFound => 0,
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
        self.replace(heard).map_err(|source| HeardError::Write {
            path: self.path.clone(),
            source,
        })?;
        self.kept = heard;
        Ok(())
    }

    fn replace(&self, heard: u64) -> std::io::Result<()> {
        let mut tmp_name = self.path.file_name().unwrap_or_default().to_os_string();
        tmp_name.push(".tmp");
        let tmp = self.path.with_file_name(tmp_name);
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)?;
        writeln!(f, "{heard}")?;
        f.sync_all()?;
        fs::rename(&tmp, &self.path)?;
        let dir = match self.path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        File::open(dir)?.sync_all()
    }
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
        h.keep(0).unwrap();
        assert!(!path.exists(), "keeping what it holds writes nothing");
        h.keep(42).unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), "42\n");
        assert_eq!(HeardFile::open(&path).unwrap().kept(), 42);
        assert!(!dir.path().join("heard.tmp").exists());
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
