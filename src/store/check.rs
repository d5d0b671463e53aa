//! Checking a store before its app is served from it (issue 34; docs/durability.md, "A damaged store is never
//! served").
//!
//! Two checks, both made on a connection of their own that reads the disk: the page cache of the store's files is
//! dropped first, and the wal-index is rebuilt from the `-wal` in this process's memory (`locking_mode=EXCLUSIVE`),
//! so nothing the kernel kept of a failed write is taken for what the disk holds.
//!
//! - **Against what was acknowledged**, after a fault the node recovers from (a full disk): the store must hold
//!   every position the node acknowledged or forwarded. One query.
//! - **Whole**, at a start after a run that did not end cleanly (`STATE/clean-stop` does not name the app): every
//!   page is read (SQLite's `quick_check`: each b-tree, page and overflow chain well formed), each source's heard
//!   sequence must be covered by its chunks, and positions must run from 1 without a gap. A store that fails is
//!   *damaged*: its app is not served, and the error says what the store itself says it lost and the way back.
//!   The files are read front to back first, so the disk reads in order (research/036 measured what that saves).
//!
//! The checks run off the receive loop, on a short-lived `pure-check` thread ([`super::Stores::retry`]), except
//! for small stores at start, which are checked before the node is ready ([`SYNC_CHECK_MAX`]).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::{AppStore, StoreError, disk, forget_cached_pages};

/// A store of at most this many bytes (file and `-wal`) is checked whole at start before the node is ready; a
/// larger one on a thread of its own while the node serves the other apps (a tenth of a second on this project's
/// VM, one or two on an SD card: research/036).
pub const SYNC_CHECK_MAX: u64 = 64 << 20;

/// Why a store is checked whole at a start after a run that did not end cleanly (a kill, a crash, a power cut),
/// with no fault of the disk seen: such a check may read beside another process that has the store open.
pub const UNCLEAN: &str = "the last run of the node did not end cleanly";

/// How often a long check says how far it is.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// How far a check has read, for the app's status while it runs.
#[derive(Debug, Default)]
pub struct CheckProgress {
    pub read: AtomicU64,
    pub total: AtomicU64,
    /// The store was read whole and found sound (what came after, opening it for writing, may still have failed:
    /// a full disk). It need not be read whole again for the same fault.
    pub sound: std::sync::atomic::AtomicBool,
}

impl CheckProgress {
    /// (MiB read, MiB to read).
    pub fn mib(&self) -> (u64, u64) {
        (
            self.read.load(Ordering::Relaxed) >> 20,
            self.total.load(Ordering::Relaxed) >> 20,
        )
    }
}

/// What a check must find before a store is opened again.
#[derive(Debug, Clone, Copy)]
pub struct Wanted {
    /// Records before this position were acknowledged or forwarded (1: none).
    pub acked_head: u64,
    /// Read every page and check what the tables say (`Some(why)`, for the messages).
    pub whole: Option<&'static str>,
    /// A damaged store is moved aside and the app started with an empty one (`--accept-lost-state`).
    pub accept_lost: bool,
}

/// The bytes of a store's file and `-wal` on disk.
pub fn store_bytes(path: &Path) -> u64 {
    [path.to_path_buf(), disk::wal_path(path)]
        .iter()
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .sum()
}

/// Opens the store at `path` for writing once it holds what `wanted` says, read from the disk itself.
pub fn reopen_checked(
    path: &Path,
    wanted: Wanted,
    progress: &Arc<CheckProgress>,
) -> Result<AppStore, StoreError> {
    let exists = path.exists();
    if exists && !writable(path) {
        // Said here: read with this user's rights, such a store fails its check as "disk I/O error".
        return Err(StoreError::not_writable(path));
    }
    if exists && (wanted.acked_head > 1 || wanted.whole.is_some()) {
        forget_cached_pages(path)?;
        match read_back(path, wanted, progress) {
            Ok(()) => progress
                .sound
                .store(wanted.whole.is_some(), Ordering::Relaxed),
            Err(e @ StoreError::Damaged { .. }) if wanted.accept_lost => {
                let aside = move_aside(path)?;
                tracing::error!(
                    "{}: {e}; the damaged files were moved aside to {} and the app starts with an empty store",
                    super::state::ACCEPT_FLAG,
                    aside.display()
                );
            }
            Err(e) => return Err(e),
        }
    }
    AppStore::open(path)
}

/// Whether this process's user may write the file (its effective rights), asked without opening it: closing a
/// descriptor of a store would drop the locks SQLite holds on it in this process.
fn writable(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return true;
    };
    // SAFETY: `c` is a valid NUL-terminated path; faccessat only reads it.
    unsafe { libc::faccessat(libc::AT_FDCWD, c.as_ptr(), libc::W_OK, libc::AT_EACCESS) == 0 }
}

/// Reads the store back from the disk and checks it as `wanted` says.
fn read_back(path: &Path, wanted: Wanted, progress: &Arc<CheckProgress>) -> Result<(), StoreError> {
    let mut reader = match AppStore::open_read_with(path, true) {
        Ok(r) => r,
        Err(StoreError::Sqlite { source, .. })
            if matches!(
                source.sqlite_error_code(),
                Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
            ) =>
        {
            // After a kill or a crash, with no fault of the disk seen, nothing the kernel holds of the store is in
            // doubt: a reader another process has open (`pure-serve records --follow`) is read beside, through the
            // wal-index they share, rather than waited for. After a fault of the disk, the wal-index is rebuilt from
            // the disk in this process alone, and the check waits for the other process to close the store.
            if wanted.whole != Some(UNCLEAN) {
                return Err(StoreError::CheckBusy {
                    path: path.to_path_buf(),
                });
            }
            tracing::info!(
                "store {}: another process has it open (a `pure-serve records`?): checked beside it",
                path.display()
            );
            AppStore::open_read_with(path, false)?
        }
        Err(StoreError::Sqlite { source, .. }) if wanted.whole.is_some() && is_damage(&source) => {
            return Err(StoreError::Damaged {
                path: path.to_path_buf(),
                problems: vec![source.to_string()],
                lost: String::new(),
            });
        }
        Err(e) => return Err(e),
    };
    if let Some(why) = wanted.whole {
        check_whole(&mut reader, why, progress)?;
    }
    if reader.head < wanted.acked_head {
        return Err(StoreError::Lost {
            path: path.to_path_buf(),
            acked: wanted.acked_head - 1,
            found: reader.head - 1,
        });
    }
    Ok(())
}

fn is_damage(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::NotADatabase | rusqlite::ErrorCode::DatabaseCorrupt)
    )
}

/// Reads every page of the store and checks what its tables say; says how far it is every few seconds.
fn check_whole(
    reader: &mut AppStore,
    why: &'static str,
    progress: &Arc<CheckProgress>,
) -> Result<(), StoreError> {
    let path = reader.path.clone();
    let total = store_bytes(&path);
    progress.total.store(total, Ordering::Relaxed);
    progress.read.store(0, Ordering::Relaxed);
    let started = Instant::now();
    // The files front to back first: the disk reads in order what quick_check would ask for a page at a time in
    // b-tree order, and the pages it checks are then the ones just read from the disk (research/036: a 1 GiB
    // store read whole in 26 s page by page, against a few seconds in order).
    read_in_order(&path, why, progress)?;
    let base = thread_read_bytes().unwrap_or(0);
    let (p, shown) = (progress.clone(), path.clone());
    let mut last_look = Instant::now();
    let mut last_said = Instant::now();
    // Every few thousand SQLite instructions: how many bytes this thread has read from the disk since (pages the
    // reading in order did not keep), looked up at most every 0.2 s, and said every few seconds.
    let _ = reader.conn.progress_handler(
        10_000,
        Some(move || {
            if last_look.elapsed() >= Duration::from_millis(200) {
                last_look = Instant::now();
                if last_said.elapsed() >= PROGRESS_EVERY {
                    last_said = Instant::now();
                    let again = thread_read_bytes().map_or(0, |now| now.saturating_sub(base));
                    tracing::info!(
                        "checking store {} whole ({why}): all {} MiB read, checking its pages ({} MiB read again)",
                        shown.display(),
                        p.mib().1,
                        again >> 20
                    );
                }
            }
            false
        }),
    );
    let result = find_damage(reader);
    let _ = reader.conn.progress_handler(0, None::<fn() -> bool>);
    let (problems, lost) = result;
    if !problems.is_empty() {
        return Err(StoreError::Damaged {
            path,
            problems,
            lost,
        });
    }
    tracing::info!(
        "store {} checked whole ({why}): {} MiB read in {:.1} s, nothing damaged",
        path.display(),
        total >> 20,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Reads the store's file and `-wal` front to back (their page cache was dropped), counting the bytes into
/// `progress` and saying how far it is every few seconds.
fn read_in_order(
    path: &Path,
    why: &'static str,
    progress: &CheckProgress,
) -> Result<(), StoreError> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; 1 << 20];
    let mut done = 0u64;
    let mut last_said = Instant::now();
    for p in [path.to_path_buf(), disk::wal_path(path)] {
        let file = match std::fs::File::open(&p) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(source) => return Err(StoreError::Io { path: p, source }),
        };
        let mut at = 0u64;
        loop {
            let n = file
                .read_at(&mut buf, at)
                .map_err(|source| StoreError::Io {
                    path: p.clone(),
                    source,
                })?;
            if n == 0 {
                break;
            }
            at += n as u64;
            done += n as u64;
            progress.read.store(done, Ordering::Relaxed);
            if last_said.elapsed() >= PROGRESS_EVERY {
                last_said = Instant::now();
                let (read, total) = progress.mib();
                tracing::info!(
                    "checking store {} whole ({why}): {read} of {total} MiB read",
                    path.display()
                );
            }
        }
    }
    Ok(())
}

/// What is wrong with the store (empty: nothing), and what its own tables say it lost.
fn find_damage(reader: &AppStore) -> (Vec<String>, String) {
    let mut problems = Vec::new();
    match quick_check(&reader.conn) {
        Ok(found) => problems.extend(found),
        Err(e) => problems.push(format!("its pages cannot be read whole: {e}")),
    }
    let lost = match lost_by_source(&reader.conn) {
        Ok(lost) => lost,
        Err(e) => {
            problems.push(format!("its sources and chunks cannot be read: {e}"));
            String::new()
        }
    };
    if !lost.is_empty() && problems.is_empty() {
        problems.push("its chunks do not hold every record its heard sequences count".to_string());
    }
    match positions(&reader.conn) {
        Ok(Some(gap)) => problems.push(gap),
        Ok(None) => {}
        Err(e) => problems.push(format!("its positions cannot be read: {e}")),
    }
    problems.dedup();
    (problems, lost)
}

/// SQLite's `quick_check`: its first few findings and how many there were, or nothing if it says `ok`.
fn quick_check(conn: &rusqlite::Connection) -> rusqlite::Result<Vec<String>> {
    let mut stmt = conn.prepare("PRAGMA quick_check(100)")?;
    let rows: Vec<String> = stmt
        .query_map([], |r| r.get::<_, String>(0))?
        .collect::<Result<_, _>>()?;
    if rows.len() == 1 && rows[0] == "ok" {
        return Ok(Vec::new());
    }
    let mut found: Vec<String> = rows.iter().take(3).cloned().collect();
    if rows.len() > 3 {
        found.push(format!(
            "{} findings of SQLite's quick_check in all{}",
            rows.len(),
            if rows.len() >= 100 { " or more" } else { "" }
        ));
    }
    Ok(found)
}

/// Sources whose heard sequence is above what their chunks hold: "N records of M sources (e.g. dev3: heard 31256,
/// its chunks hold up to 19558)", or empty.
fn lost_by_source(conn: &rusqlite::Connection) -> rusqlite::Result<String> {
    let mut stmt = conn.prepare(
        "SELECT name, heard, held FROM (
             SELECT s.name AS name, s.heard AS heard,
                    COALESCE((SELECT MAX(c.first_seq + c.count - 1) FROM chunks c WHERE c.source = s.id), 0) AS held
             FROM sources s)
         WHERE heard > held",
    )?;
    let mut sources = 0u64;
    let mut records = 0u64;
    let mut examples = Vec::new();
    let mut rows = stmt.query([])?;
    while let Some(r) = rows.next()? {
        let (name, heard, held): (String, i64, i64) = (r.get(0)?, r.get(1)?, r.get(2)?);
        sources += 1;
        records += (heard - held).max(0) as u64;
        if examples.len() < 3 {
            examples.push(format!(
                "{name}: heard {heard}, its chunks hold up to {held}"
            ));
        }
    }
    if sources == 0 {
        return Ok(String::new());
    }
    Ok(format!(
        "{records} records of {sources} sources that were told they are stored (e.g. {})",
        examples.join("; ")
    ))
}

/// Whether positions run from 1 without a gap: `Some(what is wrong)` if not.
fn positions(conn: &rusqlite::Connection) -> rusqlite::Result<Option<String>> {
    let (first, end, records): (Option<i64>, Option<i64>, Option<i64>) = conn.query_row(
        "SELECT MIN(pos), MAX(pos + count), SUM(count) FROM chunks",
        [],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    )?;
    Ok(match (first, end, records) {
        (Some(first), Some(end), Some(records)) if first != 1 || end - 1 != records => {
            Some(format!(
                "its chunks hold {records} records at positions {first} to {}, not 1 to {records} without a gap",
                end - 1
            ))
        }
        _ => None,
    })
}

/// Bytes this thread has read through system calls (`rchar` of `/proc/thread-self/io`), if the kernel says.
fn thread_read_bytes() -> Option<u64> {
    let mut text = String::new();
    std::fs::File::open("/proc/thread-self/io")
        .ok()?
        .read_to_string(&mut text)
        .ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("rchar:"))
        .and_then(|v| v.trim().parse().ok())
}

/// Moves a damaged store's files aside (`PATH.damaged-SECONDS`, its `-wal` and `-shm` beside it) and syncs the
/// directory; returns where the file went.
fn move_aside(path: &Path) -> Result<PathBuf, StoreError> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let aside = PathBuf::from(format!("{}.damaged-{secs}", path.display()));
    for suffix in ["", "-wal", "-shm"] {
        let from = PathBuf::from(format!("{}{suffix}", path.display()));
        let to = PathBuf::from(format!("{}{suffix}", aside.display()));
        match std::fs::rename(&from, &to) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(StoreError::Io { path: from, source }),
        }
    }
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|source| StoreError::Io {
                path: dir.to_path_buf(),
                source,
            })?;
    }
    Ok(aside)
}
