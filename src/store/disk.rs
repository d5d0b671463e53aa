//! What a store checks of the filesystem under it, so that a fault of the disk is an error the host can handle and
//! never a lost ack or a signal (issue 8; research/008-full-disk.md has the measurements behind each choice).
//!
//! - **The file is still the file.** [`FileGuard`] remembers the device and inode of the store and of its `-wal`
//!   when it was opened, and compares them with what the paths name now after every commit, before anything is
//!   acknowledged. A store deleted (or the state directory with it) or replaced under a running node is an error
//!   from then on: committing into an unlinked file would ack records a restart cannot find.
//! - **The wal-index never faults.** SQLite maps `STORE-shm` and grows it by writing one byte at the end of each
//!   new 4 KiB page. On a filesystem whose blocks are smaller than a page (ext4 with 1 KiB blocks, the default
//!   below 512 MiB) that leaves holes, and the first store into a hole of a mapped page on a full disk is SIGBUS.
//!   So the store allocates the whole `-shm` itself, with `posix_fallocate`, ahead of what the WAL needs
//!   ([`reserve_shm`]), where a full disk is an `ENOSPC` it can report; and it opens a store only when there is room
//!   for the wal-index its WAL needs ([`room_to_open`]), because SQLite's own first mapping at open is the one
//!   moment the store cannot allocate ahead.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Bytes of wal-index per region (SQLite's `WALINDEX_PGSZ`): a region indexes [`FRAMES_PER_REGION`] WAL frames.
pub const SHM_REGION: u64 = 32 * 1024;
/// WAL frames indexed by one region of the wal-index (`HASHTABLE_NPAGE`).
pub const FRAMES_PER_REGION: u64 = 4096;
/// The smallest page SQLite has: frame counts are estimated from the WAL's size with it, so they are never low.
const MIN_FRAME: u64 = 512 + 24;
/// Regions kept allocated beyond what the WAL needs now: 2 regions are 8192 frames, 32 MiB of WAL at 4 KiB pages,
/// far more than one turn writes, so a commit never needs a region that is not there.
pub const SHM_AHEAD: u64 = 2;
/// Free bytes wanted beside the wal-index before a store is opened: room for the header writes of the open and the
/// first commit's frames.
pub const OPEN_MARGIN: u64 = 256 * 1024;

/// The `-wal` and `-shm` files of a store.
pub fn wal_path(path: &Path) -> PathBuf {
    sibling(path, "-wal")
}

pub fn shm_path(path: &Path) -> PathBuf {
    sibling(path, "-shm")
}

fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_os_string();
    s.push(suffix);
    PathBuf::from(s)
}

/// Bytes of wal-index a WAL of `wal_bytes` needs, counting at least one region.
pub fn shm_needed(wal_bytes: u64) -> u64 {
    let frames = wal_bytes.saturating_sub(32) / MIN_FRAME + 1;
    frames.div_ceil(FRAMES_PER_REGION).max(1) * SHM_REGION
}

/// Bytes the current user may still write on the filesystem holding `path` (`f_bavail`: root's reserve not
/// counted, so a node running as root stops a little early rather than late).
pub fn free_bytes(path: &Path) -> std::io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid NUL-terminated path and a statvfs struct to fill.
    if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(s.f_bavail as u64 * s.f_frsize as u64)
}

/// Whether a store at `path` can be opened without SQLite faulting on its wal-index: `Err` says how many bytes are
/// free and how many are wanted.
pub fn room_to_open(path: &Path) -> Result<(), (u64, u64)> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let wal = std::fs::metadata(wal_path(path)).map_or(0, |m| m.len());
    let shm_have = std::fs::metadata(shm_path(path)).map_or(0, |m| m.blocks() * 512);
    let wanted = shm_needed(wal).saturating_sub(shm_have) + OPEN_MARGIN;
    match free_bytes(dir) {
        Ok(free) if free < wanted => Err((free, wanted)),
        // A filesystem that cannot say is given the benefit of the doubt; SQLite will tell.
        _ => Ok(()),
    }
}

/// Opens a store's `-shm` to allocate it. The descriptor must be kept until SQLite's connection is closed:
/// closing any descriptor of a file drops every POSIX lock the process holds on it, and SQLite's locks on the
/// `-shm` are what keep readers in other processes from resetting the wal-index under the writer.
pub fn open_shm(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open(shm_path(path))
}

/// Makes sure the `-shm` open as `file` has `bytes` allocated (blocks, not holes) from its start; returns the size
/// now allocated.
pub fn reserve_shm(file: &File, bytes: u64) -> std::io::Result<u64> {
    let len = file.metadata()?.len();
    // Whole regions: SQLite maps the file region by region.
    let want = bytes.max(len).div_ceil(SHM_REGION) * SHM_REGION;
    // SAFETY: posix_fallocate on a descriptor we own; it only allocates blocks of the file (and extends it).
    let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, want as libc::off_t) };
    if rc != 0 {
        return Err(std::io::Error::from_raw_os_error(rc));
    }
    Ok(want)
}

/// The byte of the `-shm` on which every SQLite connection to a WAL store holds a shared lock while it is open
/// (its "dead man switch", `UNIX_SHM_DMS`: 120 + 8; sqlite.org/walformat.html, "the wal-index locks"). The first
/// connection to find it unlocked rebuilds the wal-index from the `-wal` on the disk.
const SHM_DMS_BYTE: libc::off_t = 128;

/// Whether a process other than this one has the store at `path` open now (it holds SQLite's lock on the
/// `-shm`). When none has, the next connection rebuilds the wal-index from the `-wal` itself.
pub fn open_elsewhere(path: &Path) -> bool {
    let Ok(shm) = OpenOptions::new().read(true).open(shm_path(path)) else {
        return false;
    };
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = libc::F_WRLCK as _;
    lock.l_whence = libc::SEEK_SET as _;
    lock.l_start = SHM_DMS_BYTE;
    lock.l_len = 1;
    // SAFETY: F_GETLK on a descriptor we own, with a flock struct to fill; it takes no lock.
    let rc = unsafe { libc::fcntl(shm.as_raw_fd(), libc::F_GETLK, &mut lock) };
    // Closing `shm` would drop this process's POSIX locks on the file: only call this before opening the store.
    rc == 0 && i32::from(lock.l_type) != libc::F_UNLCK
}

/// A file's identity: device and inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileId {
    dev: u64,
    ino: u64,
}

fn file_id(path: &Path) -> std::io::Result<(FileId, u64)> {
    let m = std::fs::metadata(path)?;
    Ok((
        FileId {
            dev: m.dev(),
            ino: m.ino(),
        },
        m.len(),
    ))
}

/// What changed under a store: its words name the file and what happened to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gone(pub String);

/// The identity of a store's files when it was opened, to compare with what its paths name now.
#[derive(Debug)]
pub struct FileGuard {
    path: PathBuf,
    db: FileId,
    wal: Option<FileId>,
    /// Bytes of `-shm` allocated by [`reserve_shm`] so far.
    pub shm_reserved: u64,
    /// The `-shm`, opened once and kept ([`open_shm`] says why). Declared after nothing that SQLite owns: the
    /// store drops its connection before its guard.
    shm: Option<File>,
}

impl FileGuard {
    /// Remembers the files at `path` (the store, opened just now) and its `-wal`, if it exists yet.
    pub fn new(path: &Path) -> std::io::Result<Self> {
        let (db, _) = file_id(path)?;
        let wal = file_id(&wal_path(path)).ok().map(|(id, _)| id);
        Ok(FileGuard {
            path: path.to_path_buf(),
            db,
            wal,
            shm_reserved: 0,
            shm: None,
        })
    }

    /// Whether the paths still name the files that were opened; returns the `-wal`'s size. A missing `-wal`
    /// that existed, or one of another inode, is a change: the commits went into a file nobody will read.
    pub fn verify(&mut self) -> Result<u64, Gone> {
        let what = |p: &Path, e: std::io::Error| {
            if e.kind() == std::io::ErrorKind::NotFound {
                let dir = self
                    .path
                    .parent()
                    .and_then(Path::parent)
                    .filter(|d| !d.exists());
                match dir {
                    Some(d) => Gone(format!(
                        "the state directory {} was deleted while the node was writing {}",
                        d.display(),
                        p.display()
                    )),
                    None => Gone(format!(
                        "{} was deleted while the node was writing it",
                        p.display()
                    )),
                }
            } else {
                Gone(format!("cannot look at {}: {e}", p.display()))
            }
        };
        let replaced = |p: &Path| {
            Gone(format!(
                "{} was replaced by another file while the node was writing it",
                p.display()
            ))
        };
        let (db, _) = file_id(&self.path).map_err(|e| what(&self.path, e))?;
        if db != self.db {
            return Err(replaced(&self.path));
        }
        let wal_p = wal_path(&self.path);
        match (file_id(&wal_p), self.wal) {
            (Ok((id, len)), Some(was)) if id == was => Ok(len),
            (Ok(_), Some(_)) => Err(replaced(&wal_p)),
            (Ok((id, len)), None) => {
                self.wal = Some(id);
                Ok(len)
            }
            (Err(e), Some(_)) => Err(what(&wal_p, e)),
            (Err(_), None) => Ok(0),
        }
    }

    /// Allocates the `-shm` ahead of a WAL of `wal_bytes` when what is allocated is not [`SHM_AHEAD`] regions
    /// beyond what it needs.
    pub fn keep_shm_ahead(&mut self, wal_bytes: u64) -> std::io::Result<()> {
        let need = shm_needed(wal_bytes);
        if self.shm_reserved >= need + SHM_AHEAD * SHM_REGION {
            return Ok(());
        }
        let want = need + (SHM_AHEAD + 2) * SHM_REGION;
        if self.shm.is_none() {
            self.shm = Some(open_shm(&self.path)?);
        }
        if let Some(file) = &self.shm {
            self.shm_reserved = reserve_shm(file, want)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wal_index_needed_is_never_less_than_sqlite_uses() {
        assert_eq!(shm_needed(0), SHM_REGION);
        // 4096 frames of 4 KiB pages: one region (estimated with the smallest page, so more).
        let wal = 32 + 4096 * (4096 + 24);
        assert!(shm_needed(wal) >= SHM_REGION);
        assert!(shm_needed(wal * 3) >= 3 * SHM_REGION);
    }

    #[test]
    fn a_deleted_or_replaced_file_is_noticed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("apps/s.sqlite");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, b"x").unwrap();
        let mut g = FileGuard::new(&path).unwrap();
        assert_eq!(g.verify(), Ok(0));
        std::fs::write(wal_path(&path), b"12345").unwrap();
        assert_eq!(g.verify(), Ok(5));
        std::fs::remove_file(wal_path(&path)).unwrap();
        let Gone(why) = g.verify().unwrap_err();
        assert!(why.contains("s.sqlite-wal was deleted"), "{why}");
        let mut g = FileGuard::new(&path).unwrap();
        std::fs::write(path.with_extension("new"), b"y").unwrap();
        std::fs::rename(path.with_extension("new"), &path).unwrap();
        let Gone(why) = g.verify().unwrap_err();
        assert!(why.contains("replaced by another file"), "{why}");
        let mut g = FileGuard::new(&path).unwrap();
        std::fs::remove_dir_all(dir.path()).unwrap();
        let Gone(why) = g.verify().unwrap_err();
        assert!(why.contains("the state directory"), "{why}");
    }

    #[test]
    fn the_shm_is_allocated_in_whole_regions() {
        let dir = tempfile::tempdir().unwrap();
        let shm = dir.path().join("s-shm");
        std::fs::write(&shm, b"abc").unwrap();
        let file = open_shm(&dir.path().join("s")).unwrap();
        assert_eq!(reserve_shm(&file, 1).unwrap(), SHM_REGION);
        let m = std::fs::metadata(&shm).unwrap();
        assert_eq!(m.len(), SHM_REGION);
        assert!(m.blocks() * 512 >= SHM_REGION, "allocated, not a hole");
        assert_eq!(std::fs::read(&shm).unwrap()[..3], *b"abc");
    }
}
