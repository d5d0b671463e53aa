//! Making commits durable off the receive loop: the `pure-sync` thread (research/010).
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
//! - **Errors are seen.** Each store's `-wal` is synced through a descriptor opened with the store and kept
//!   ([`super::AppStore::wal_for_sync`]): Linux reports a write-back error to every descriptor that was open when
//!   it happened, once, but not to one opened afterwards. A failed sync fails that app in the jobs it was synced
//!   for; the host then stops the app (its frames since the last good sync cannot be trusted to be on disk) and
//!   acks nothing of it.
//!
//! One thread, whatever the number of apps: the thread count does not grow with apps (ARCHITECTURE.md).

use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::fd::RawFd;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use crate::ops::wake::Wake;
use crate::proto::turn::AppIndex;

/// One turn's files to sync: the app each belongs to and its `-wal`.
pub type SyncFiles = Vec<(AppIndex, Arc<File>)>;

/// A finished job: its sequence number and the apps whose sync failed, with why.
#[derive(Debug)]
pub struct Synced {
    pub seq: u64,
    pub failed: Vec<(AppIndex, Arc<io::Error>)>,
}

#[derive(Default)]
struct Shared {
    queue: VecDeque<(u64, SyncFiles)>,
    done: VecDeque<Synced>,
    stop: bool,
}

struct Inner {
    state: Mutex<Shared>,
    /// Signals the thread that a job was queued (or to stop), and a waiter that a job finished.
    changed: Condvar,
    wake: Wake,
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
            changed: Condvar::new(),
            wake: Wake::new()?,
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

    /// Blocks until at least one job is finished (or none is queued), then returns the finished ones.
    pub fn wait_done(&self) -> Vec<Synced> {
        let mut s = lock(&self.inner.state);
        while s.done.is_empty() && !s.queue.is_empty() {
            s = self
                .inner
                .changed
                .wait(s)
                .unwrap_or_else(|p| p.into_inner());
        }
        drop(s);
        self.done()
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
            s.queue.drain(..).collect()
        };
        // Each distinct file once, for every job taken (group commit).
        let mut failed: Vec<(AppIndex, Arc<io::Error>)> = Vec::new();
        let mut synced: Vec<*const File> = Vec::new();
        for (_, files) in &jobs {
            for (app, file) in files {
                let key = Arc::as_ptr(file);
                if synced.contains(&key) {
                    continue;
                }
                synced.push(key);
                if let Err(e) = file.sync_data() {
                    failed.push((*app, Arc::new(e)));
                }
            }
        }
        let mut s = lock(&inner.state);
        for (seq, files) in jobs {
            let failed_here = failed
                .iter()
                .filter(|(app, _)| files.iter().any(|(a, _)| a == app))
                .cloned()
                .collect();
            s.done.push_back(Synced {
                seq,
                failed: failed_here,
            });
        }
        drop(s);
        inner.changed.notify_all();
        inner.wake.wake();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_finish_in_order_and_wake_the_loop() {
        let dir = tempfile::tempdir().unwrap();
        let a = Arc::new(File::create(dir.path().join("a-wal")).unwrap());
        let b = Arc::new(File::create(dir.path().join("b-wal")).unwrap());
        let syncer = Syncer::start().unwrap();
        syncer.submit(1, vec![(0, a.clone())]);
        syncer.submit(2, vec![(0, a.clone()), (1, b.clone())]);
        syncer.submit(3, Vec::new());
        let mut seqs = Vec::new();
        while seqs.len() < 3 {
            for s in syncer.wait_done() {
                assert!(s.failed.is_empty(), "{s:?}");
                seqs.push(s.seq);
            }
        }
        assert_eq!(seqs, [1, 2, 3]);
        assert!(syncer.done().is_empty());
        assert!(syncer.wait_done().is_empty(), "nothing queued: no wait");
    }

    #[test]
    fn a_failed_sync_fails_its_app_in_the_jobs_synced_with_it() {
        // fdatasync of a pipe fails (EINVAL): a real failure of the call, without a broken disk.
        let (r, _w) = std::io::pipe().unwrap();
        let pipe = Arc::new(File::from(std::os::fd::OwnedFd::from(r)));
        let dir = tempfile::tempdir().unwrap();
        let good = Arc::new(File::create(dir.path().join("good-wal")).unwrap());
        let syncer = Syncer::start().unwrap();
        syncer.submit(7, vec![(3, pipe.clone()), (4, good.clone())]);
        syncer.submit(8, vec![(4, good.clone())]);
        let mut all = Vec::new();
        while all.len() < 2 {
            all.extend(syncer.wait_done());
        }
        assert_eq!(all[0].seq, 7);
        assert_eq!(all[0].failed.iter().map(|f| f.0).collect::<Vec<_>>(), [3]);
        assert!(all[1].failed.is_empty(), "app 4 synced: {:?}", all[1]);
    }
}
