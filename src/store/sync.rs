//! Making commits durable off the receive loop: the `pure-sync` thread (research/010), and the descriptors and
//! checks that keep a failing disk from being trusted (research/014).
//!
//! App stores commit with `synchronous=NORMAL`. In WAL mode, SQLite's `FULL` is exactly `NORMAL` plus one sync of
//! the `-wal` file after each commit; that sync is what this thread does, so the receive loop can read, open and
//! apply the next turns while the disk syncs instead of waiting inside `COMMIT`. A turn's commits are **durable
//! only when its sync is done**: nothing of a turn is acked, forwarded or read by an inner outlet before
//! ([`crate::apps::host`] holds it until then).
//!
//! - **Group commit.** The thread takes every job queued when it wakes and syncs each file once for all of them:
//!   `fdatasync` of a `-wal` makes everything written to it so far durable, so later turns' frames ride on an
//!   earlier turn's sync.
//! - **In order.** Jobs finish in the order they were submitted; [`Syncer::done`] hands them back so.
//! - **Checkpoints are checked.** SQLite's automatic checkpoint runs inside a commit and **ignores its own
//!   errors**; a checkpoint whose writes of the database file failed, followed by one whose sync returned 0 (the
//!   kernel reports a write-back error once per descriptor), lets SQLite restart the `-wal` over records that were
//!   never written anywhere else: acknowledged records lost (issue 14, research/014). So stores commit with
//!   `wal_autocheckpoint=0`, the store checkpoints itself after a commit that grew the `-wal` enough and checks the
//!   result ([`super::AppStore::apply`]), and then syncs the database file once more through a descriptor kept
//!   here, opened with the store: Linux reports a write-back error to every descriptor that was open when it
//!   happened, so an error that SQLite's descriptor already reported is still seen. (Checkpointing on this thread
//!   instead was measured and dropped: a writer that never pauses never lets the `-wal` restart; research/014.)
//! - **A failure is final for the descriptors.** A store whose sync or checkpoint failed once is marked failed
//!   and never synced or checkpointed again through them ("never retry an fsync and trust its success"): the
//!   host closes it, and only reopens it once what it acknowledged is found on the disk
//!   ([`super::Stores::retry`]).
//! - **A read-only filesystem is a failure.** ext4 turns a filesystem read-only after some errors (its journal
//!   aborted) while syncs of data already in place may still return 0; after each sync the thread asks the
//!   filesystem (`fstatvfs`) and a read-only one fails the store.
//!
//! One thread, whatever the number of apps: the thread count does not grow with apps (ARCHITECTURE.md).

use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use super::StoreError;
use crate::common::wake::Wake;
use crate::proto::turn::AppIndex;

/// The descriptors one open store is synced through, opened with the store and kept (the module doc says why).
/// Shared by the store and the sync jobs that name it; closed when the last of them goes, after the store's
/// connection (closing a descriptor drops every POSIX lock this process holds on the file, SQLite's included).
pub struct StoreFiles {
    /// The store's file.
    path: PathBuf,
    wal: File,
    db: File,
    /// The filesystem's device, to find the stores that share a disk.
    device: u64,
    /// Set at the first failed sync, checkpoint or check; nothing is synced through these descriptors after.
    failed: AtomicBool,
    /// Sync the `-wal` with `fsync` instead of `fdatasync`: for research/014's comparison only, never set by the
    /// node.
    pub(crate) full_fsync: AtomicBool,
    /// Read each checkpoint back from the disk ([`StoreFiles::verify_checkpoint`]); cleared only by research/036's
    /// comparison, never by the node.
    pub(crate) verify_checkpoints: AtomicBool,
    /// The `-wal`'s salts and how many of its first frames a checkpoint has read back already.
    verified: Mutex<([u8; 8], u32)>,
}

impl std::fmt::Debug for StoreFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreFiles")
            .field("path", &self.path)
            .field("failed", &self.is_failed())
            .finish()
    }
}

impl StoreFiles {
    /// Opens the descriptors of the store at `path` (its `-wal` must exist), and makes the directory entries of both
    /// files durable (a new store's, or a `-wal` SQLite made just now).
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let wal_path = super::disk::wal_path(path);
        let open = |p: &Path| {
            File::open(p).map_err(|source| StoreError::OpenWal {
                path: p.to_path_buf(),
                source,
            })
        };
        let wal = open(&wal_path)?;
        let db = open(path)?;
        let device = db.metadata().map(|m| m.dev()).unwrap_or(0);
        if let Some(dir) = path.parent() {
            File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(|source| StoreError::Sync {
                    path: dir.to_path_buf(),
                    source: Arc::new(source),
                })?;
        }
        Ok(StoreFiles {
            path: path.to_path_buf(),
            wal,
            db,
            device,
            failed: AtomicBool::new(false),
            full_fsync: AtomicBool::new(false),
            verify_checkpoints: AtomicBool::new(true),
            verified: Mutex::new(([0; 8], 0)),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn device(&self) -> u64 {
        self.device
    }

    pub fn is_failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    /// Marks the store failed: nothing is synced or checkpointed through these descriptors again.
    pub fn fail(&self) {
        self.failed.store(true, Ordering::Release);
    }

    /// Makes every commit written to the `-wal` so far durable. A failure marks the store failed.
    pub fn sync_wal(&self) -> Result<(), StoreError> {
        if self.is_failed() {
            return Err(StoreError::FailedEarlier {
                path: self.path.clone(),
            });
        }
        let synced = if self.full_fsync.load(Ordering::Relaxed) {
            self.wal.sync_all()
        } else {
            self.wal.sync_data()
        };
        let result = synced
            .map_err(|e| StoreError::Sync {
                path: super::disk::wal_path(&self.path),
                source: Arc::new(e),
            })
            .and_then(|()| self.writable());
        if result.is_err() {
            self.fail();
        }
        result
    }

    /// After a checkpoint SQLite made (and reported done): syncs the database file through this descriptor, which
    /// sees a write-back error even if SQLite's descriptor reported it already. A failure marks the store failed.
    pub fn sync_after_checkpoint(&self) -> Result<(), StoreError> {
        if self.is_failed() {
            return Err(StoreError::FailedEarlier {
                path: self.path.clone(),
            });
        }
        let result = self
            .db
            .sync_data()
            .map_err(|e| StoreError::Sync {
                path: self.path.clone(),
                source: Arc::new(e),
            })
            .and_then(|()| self.writable());
        if result.is_err() {
            self.fail();
        }
        result
    }

    /// After a checkpoint SQLite made and this node synced: reads back, from the disk itself, every page the
    /// checkpoint copied from the `-wal`'s first `checkpointed` frames into the database file, and compares it with
    /// the frame it came from. A disk may report such writes done and have lost them: a dying card's ext4 did, for
    /// pages written into newly allocated blocks while other writes were failing (issue 34, research/036), and the
    /// next commit would then have restarted the `-wal` over their only copy. It runs before that commit can; a
    /// page that differs fails the store as a failed sync does, with the `-wal` still whole.
    pub fn verify_checkpoint(&self, checkpointed: u32) -> Result<(), StoreError> {
        use std::os::unix::fs::FileExt;
        if self.is_failed() {
            return Err(StoreError::FailedEarlier {
                path: self.path.clone(),
            });
        }
        let lost = |page: u32, what: String| {
            self.fail();
            StoreError::LostWrite {
                path: self.path.clone(),
                page,
                what,
            }
        };
        let io_err = |e: io::Error| {
            self.fail();
            StoreError::Sync {
                path: self.path.clone(),
                source: Arc::new(e),
            }
        };
        // No frame copied, or a -wal with no header yet (emptied by the last clean stop, and nothing committed
        // since): nothing to read back.
        if checkpointed == 0 {
            return Ok(());
        }
        let mut header = [0u8; 32];
        if read_up_to(&self.wal, &mut header, 0).map_err(io_err)? < header.len() {
            return Ok(());
        }
        let word =
            |b: &[u8], at: usize| u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        let page_size = match word(&header, 8) {
            1 => 65536,
            n if n.is_power_of_two() && (512..=32768).contains(&n) => n,
            // Not a WAL this node can read back (SQLite keeps its own format): nothing to compare with.
            _ => return Ok(()),
        } as u64;
        let salts: [u8; 8] = header[16..24].try_into().expect("8 bytes");
        // Frames of this -wal's run that an earlier checkpoint read back already need not be again.
        let mut verified = self.verified.lock().unwrap_or_else(|p| p.into_inner());
        let from = if verified.0 == salts { verified.1 } else { 0 };
        // The latest of the checkpointed frames of each page, from their headers (read from the page cache: they
        // were written and synced before), a window at a time.
        let frame_size = 24 + page_size;
        let mut latest: std::collections::BTreeMap<u32, u64> = std::collections::BTreeMap::new();
        const WINDOW: u64 = 1024;
        let mut window = Vec::new();
        let mut frame = 0u64;
        'frames: while frame < checkpointed as u64 {
            let n = (checkpointed as u64 - frame).min(WINDOW);
            window.resize((n * frame_size) as usize, 0);
            let got =
                read_up_to(&self.wal, &mut window, 32 + frame * frame_size).map_err(io_err)?;
            for (k, header) in window[..got].chunks_exact(frame_size as usize).enumerate() {
                if header[8..16] != salts {
                    break 'frames;
                }
                let index = frame + k as u64;
                if index >= from as u64 {
                    latest.insert(word(header, 0), 32 + index * frame_size + 24);
                } else {
                    latest.remove(&word(header, 0));
                }
            }
            frame += n;
        }
        let db_len = self.db.metadata().map_err(io_err)?.len();
        // Read the database file from the disk, not from the pages this process just wrote (they are clean: the
        // checkpoint's syncs wrote them).
        // SAFETY: posix_fadvise on a descriptor we own; it only drops clean cached pages of the file.
        let rc =
            unsafe { libc::posix_fadvise(self.db.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        if rc != 0 {
            return Err(io_err(io::Error::from_raw_os_error(rc)));
        }
        // Runs of consecutive pages (a checkpoint mostly writes where the file grew), each in one read.
        let ps = page_size as usize;
        let pages: Vec<u32> = latest
            .keys()
            .copied()
            .filter(|&p| p > 0 && (p as u64) * page_size <= db_len)
            .collect();
        let mut on_disk = Vec::new();
        let mut want = vec![0u8; ps];
        let mut i = 0;
        while i < pages.len() {
            let mut j = i + 1;
            while j < pages.len() && pages[j] == pages[j - 1] + 1 && j - i < 256 {
                j += 1;
            }
            on_disk.resize((j - i) * ps, 0);
            self.db
                .read_exact_at(&mut on_disk, (pages[i] as u64 - 1) * page_size)
                .map_err(io_err)?;
            for (k, &page) in pages[i..j].iter().enumerate() {
                self.wal
                    .read_exact_at(&mut want, latest[&page])
                    .map_err(io_err)?;
                let found = &on_disk[k * ps..(k + 1) * ps];
                if want[..] != *found {
                    let what = if found.iter().all(|b| *b == 0) {
                        "zeros"
                    } else {
                        "other bytes"
                    };
                    return Err(lost(page, what.to_string()));
                }
            }
            i = j;
        }
        *verified = (salts, checkpointed.max(from));
        Ok(())
    }

    /// Errors if the filesystem under the store is read-only now.
    fn writable(&self) -> Result<(), StoreError> {
        if is_read_only(&self.wal) {
            return Err(StoreError::ReadOnly {
                path: self.path.clone(),
            });
        }
        Ok(())
    }
}

/// Reads into `buf` from `at` until it is full or the file ends; returns how many bytes were read.
fn read_up_to(file: &File, buf: &mut [u8], at: u64) -> io::Result<usize> {
    use std::os::unix::fs::FileExt;
    let mut got = 0;
    while got < buf.len() {
        match file.read_at(&mut buf[got..], at + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// Whether the filesystem holding `file` is mounted read-only now (`ST_RDONLY`; a filesystem that cannot say is
/// taken as writable: the next write tells).
pub fn is_read_only(file: &File) -> bool {
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: fstatvfs on a descriptor we own, into a struct of the right type.
    let rc = unsafe { libc::fstatvfs(file.as_raw_fd(), &mut s) };
    rc == 0 && s.f_flag & libc::ST_RDONLY != 0
}

/// One turn's stores to sync: the app each belongs to and its descriptors.
pub type SyncFiles = Vec<(AppIndex, Arc<StoreFiles>)>;

/// A finished job: its sequence number and the apps whose sync failed, with why.
#[derive(Debug)]
pub struct Synced {
    pub seq: u64,
    pub failed: Vec<(AppIndex, Arc<StoreError>)>,
}

#[derive(Default)]
struct Shared {
    queue: VecDeque<(u64, SyncFiles)>,
    done: VecDeque<Synced>,
    /// The thread took jobs off the queue and has not put their outcomes in `done` yet: a waiter waits for them.
    busy: bool,
    stop: bool,
}

struct Inner {
    state: Mutex<Shared>,
    /// Syncs of a store's `-wal` made so far (one per store per group of jobs), for `pure_store_syncs_total`.
    syncs: std::sync::atomic::AtomicU64,
    /// Signals the thread that a job was queued (or to stop), and a waiter that a job finished.
    changed: Condvar,
    wake: Wake,
    /// Held by a test to keep the thread from syncing the jobs it took (a sync that takes long, on demand).
    #[cfg(test)]
    hold: Mutex<()>,
}

/// The `pure-sync` thread and its queues.
pub struct Syncer {
    inner: Arc<Inner>,
    thread: Option<JoinHandle<()>>,
}

impl Syncer {
    pub fn start() -> io::Result<Self> {
        let inner = Arc::new(Inner {
            state: Mutex::new(Shared::default()),
            syncs: std::sync::atomic::AtomicU64::new(0),
            changed: Condvar::new(),
            wake: Wake::new()?,
            #[cfg(test)]
            hold: Mutex::new(()),
        });
        let worker = inner.clone();
        let thread = std::thread::Builder::new()
            .name("pure-sync".into())
            .spawn(move || run(&worker))?;
        Ok(Syncer {
            inner,
            thread: Some(thread),
        })
    }

    /// Queues a turn's files. Jobs finish in the order of their `seq`.
    pub fn submit(&self, seq: u64, files: SyncFiles) {
        let mut s = lock(&self.inner.state);
        s.queue.push_back((seq, files));
        drop(s);
        self.inner.changed.notify_all();
    }

    /// Finished jobs, oldest first; empty if none finished since the last call. Clears the wake first, so a job
    /// that finishes meanwhile leaves it set for the next poll.
    pub fn done(&self) -> Vec<Synced> {
        self.inner.wake.clear();
        lock(&self.inner.state).done.drain(..).collect()
    }

    /// Blocks until at least one job is finished (or none is queued or being synced), then returns the finished
    /// ones.
    pub fn wait_done(&self) -> Vec<Synced> {
        let mut s = lock(&self.inner.state);
        while s.done.is_empty() && (!s.queue.is_empty() || s.busy) {
            s = self
                .inner
                .changed
                .wait(s)
                .unwrap_or_else(|p| p.into_inner());
        }
        drop(s);
        self.done()
    }

    /// Syncs of a store's `-wal` made so far.
    pub fn syncs(&self) -> u64 {
        self.inner.syncs.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Readable when a job finished: the receive loop polls it beside its socket.
    pub fn wake_fd(&self) -> RawFd {
        self.inner.wake.fd()
    }
}

impl Drop for Syncer {
    fn drop(&mut self) {
        lock(&self.inner.state).stop = true;
        self.inner.changed.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn lock(m: &Mutex<Shared>) -> std::sync::MutexGuard<'_, Shared> {
    // A panic on the thread cannot leave the queues half-changed (each change is one push or drain).
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn run(inner: &Inner) {
    loop {
        let jobs: Vec<(u64, SyncFiles)> = {
            let mut s = lock(&inner.state);
            while s.queue.is_empty() && !s.stop {
                s = inner.changed.wait(s).unwrap_or_else(|p| p.into_inner());
            }
            if s.queue.is_empty() {
                return;
            }
            s.busy = true;
            s.queue.drain(..).collect()
        };
        #[cfg(test)]
        drop(inner.hold.lock());
        // Each distinct store once, for every job taken (group commit).
        let mut failed: Vec<(*const StoreFiles, Arc<StoreError>)> = Vec::new();
        let mut synced: Vec<*const StoreFiles> = Vec::new();
        for (_, items) in &jobs {
            for (_, files) in items {
                let key = Arc::as_ptr(files);
                if synced.contains(&key) {
                    continue;
                }
                synced.push(key);
                inner
                    .syncs
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if let Err(e) = files.sync_wal() {
                    failed.push((key, Arc::new(e)));
                }
            }
        }
        let mut s = lock(&inner.state);
        for (seq, items) in jobs {
            let failed_here = items
                .iter()
                .filter_map(|(app, files)| {
                    let key = Arc::as_ptr(files);
                    let (_, e) = failed.iter().find(|(k, _)| *k == key)?;
                    Some((*app, e.clone()))
                })
                .collect();
            s.done.push_back(Synced {
                seq,
                failed: failed_here,
            });
        }
        s.busy = false;
        drop(s);
        inner.changed.notify_all();
        inner.wake.wake();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A real store of one table with a `-wal`, and its files.
    fn store(dir: &Path, name: &str) -> (rusqlite::Connection, Arc<StoreFiles>) {
        let path = dir.join(name);
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.pragma_update(None, "journal_mode", "WAL").unwrap();
        super::super::no_checkpoints_behind_our_back(&conn).unwrap();
        conn.execute_batch("CREATE TABLE t (x BLOB)").unwrap();
        let files = Arc::new(StoreFiles::open(&path).unwrap());
        (conn, files)
    }

    fn item(app: AppIndex, files: &Arc<StoreFiles>) -> (AppIndex, Arc<StoreFiles>) {
        (app, files.clone())
    }

    fn wait_all(syncer: &Syncer, n: usize) -> Vec<Synced> {
        let mut all = Vec::new();
        while all.len() < n {
            all.extend(syncer.wait_done());
        }
        all
    }

    /// A waiter waits for the jobs the thread took off the queue and has not finished syncing, rather than being
    /// told at once that nothing finished (it was, and `Host::drain` spun until the sync ended).
    #[test]
    fn a_waiter_waits_for_jobs_the_thread_is_syncing() {
        let dir = tempfile::tempdir().unwrap();
        let (_conn, a) = store(dir.path(), "a");
        let syncer = Arc::new(Syncer::start().unwrap());
        let held = syncer.inner.hold.lock().unwrap();
        syncer.submit(1, vec![item(0, &a)]);
        // Until the thread has taken the job: it is then syncing it, held.
        while !lock(&syncer.inner.state).queue.is_empty() {
            std::thread::yield_now();
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let waiting = syncer.clone();
        let waiter = std::thread::spawn(move || tx.send(waiting.wait_done()).unwrap());
        assert!(
            rx.recv_timeout(std::time::Duration::from_millis(300))
                .is_err(),
            "the waiter was answered while the job was being synced"
        );
        drop(held);
        let done = rx.recv_timeout(std::time::Duration::from_secs(30)).unwrap();
        assert_eq!(done.iter().map(|d| d.seq).collect::<Vec<_>>(), vec![1]);
        waiter.join().unwrap();
    }

    #[test]
    fn jobs_finish_in_order_and_wake_the_loop() {
        let dir = tempfile::tempdir().unwrap();
        let (_a_conn, a) = store(dir.path(), "a");
        let (_b_conn, b) = store(dir.path(), "b");
        let syncer = Syncer::start().unwrap();
        syncer.submit(1, vec![item(0, &a)]);
        syncer.submit(2, vec![item(0, &a), item(1, &b)]);
        syncer.submit(3, Vec::new());
        let seqs: Vec<u64> = wait_all(&syncer, 3)
            .iter()
            .inspect(|s| assert!(s.failed.is_empty(), "{s:?}"))
            .map(|s| s.seq)
            .collect();
        assert_eq!(seqs, [1, 2, 3]);
        assert!(syncer.done().is_empty());
        assert!(syncer.wait_done().is_empty(), "nothing queued: no wait");
    }

    #[test]
    fn a_failed_sync_fails_its_app_then_and_in_every_later_job() {
        let dir = tempfile::tempdir().unwrap();
        let (_bad_conn, bad) = store(dir.path(), "bad");
        let (_good_conn, good) = store(dir.path(), "good");
        // fdatasync of a pipe fails (EINVAL): a real failure of the call, without a broken disk.
        let (r, _w) = std::io::pipe().unwrap();
        let pipe = File::from(std::os::fd::OwnedFd::from(r));
        // SAFETY: dup2 onto the descriptor the store syncs through, which `bad` owns; both stay open.
        assert!(unsafe { libc::dup2(pipe.as_raw_fd(), bad.wal.as_raw_fd()) } >= 0);
        let syncer = Syncer::start().unwrap();
        syncer.submit(7, vec![item(3, &bad), item(4, &good)]);
        syncer.submit(8, vec![item(4, &good)]);
        let all = wait_all(&syncer, 2);
        assert_eq!(all[0].seq, 7);
        assert_eq!(all[0].failed.iter().map(|f| f.0).collect::<Vec<_>>(), [3]);
        assert!(all[1].failed.is_empty(), "app 4 synced: {:?}", all[1]);
        assert!(bad.is_failed());
        // Never synced again and trusted: a later job of the failed store fails without a sync.
        syncer.submit(9, vec![item(3, &bad)]);
        let later = wait_all(&syncer, 1);
        let why = later[0].failed[0].1.to_string();
        assert!(why.contains("failed earlier"), "{why}");
    }
}
