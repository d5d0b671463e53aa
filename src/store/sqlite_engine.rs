//! The SQLite engine behind [`TurnStore`]: the stores under the state directory ([`Stores`], one file per app)
//! and the `pure-sync` thread that makes their commits durable ([`Syncer`]).
//!
//! A turn is committed here, in the caller's thread — SQLite is in the process, so a commit is no round trip;
//! what waits is the disk, and the `-wal` sync runs on `pure-sync` while the caller goes on — and its outcome is
//! handed back only once that sync is done (docs/durability.md). Stores in memory (tests) have nothing to sync:
//! their outcomes are ready at once.

use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::sync::Arc;

use super::downlink::{DownPush, PushOutcome, outcomes_of};
use super::engine::{AppTurn, TurnOutcome, TurnStore};
use super::sync::{SyncFiles, Syncer};
use super::{Piece, StoreError, Stores};
use crate::proto::turn::AppIndex;

pub struct SqliteTurns {
    stores: Stores,
    /// `None` for stores in memory.
    syncer: Option<Syncer>,
    /// Committed turns waiting for their sync, oldest first.
    unsynced: VecDeque<TurnOutcome>,
    /// Turns whose outcome is ready and not returned yet.
    ready: Vec<TurnOutcome>,
}

impl SqliteTurns {
    /// Over `stores`, synced by `syncer` (`None`: stores in memory, nothing to sync).
    pub fn new(stores: Stores, syncer: Option<Syncer>) -> Self {
        SqliteTurns {
            stores,
            syncer,
            unsynced: VecDeque::new(),
            ready: Vec::new(),
        }
    }

    pub fn stores(&self) -> &Stores {
        &self.stores
    }

    pub fn stores_mut(&mut self) -> &mut Stores {
        &mut self.stores
    }

    fn finish(&mut self, done: Vec<super::sync::Synced>) {
        for synced in done {
            let Some(mut outcome) = self.unsynced.pop_front() else {
                break;
            };
            debug_assert_eq!(outcome.seq, synced.seq, "syncs finish in order");
            for (app, error) in synced.failed {
                for (a, result) in &mut outcome.apps {
                    if *a == app {
                        *result = Err(error.clone());
                    }
                }
                for (a, pushed) in &mut outcome.pushes {
                    if *a == app {
                        for p in pushed.iter_mut() {
                            *p = PushOutcome::Failed {
                                error: error.clone(),
                                maybe_queued: true,
                            };
                        }
                    }
                }
            }
            self.ready.push(outcome);
        }
    }
}

impl TurnStore for SqliteTurns {
    fn submit(&mut self, seq: u64, parts: Vec<AppTurn>) {
        let mut apps = Vec::with_capacity(parts.len());
        let mut pushes = Vec::new();
        let mut files: SyncFiles = Vec::new();
        for part in parts {
            let Some(store) = self.stores.app_mut(part.app) else {
                let closed = Arc::new(StoreError::Closed { app: part.app });
                if !part.pushes.is_empty() {
                    let failed = PushOutcome::Failed {
                        error: closed.clone(),
                        maybe_queued: false,
                    };
                    pushes.push((part.app, vec![failed; part.pushes.len()]));
                }
                apps.push((part.app, Err(closed)));
                continue;
            };
            let mut pieces: Vec<Piece<'_>> = part.pieces.iter().map(|p| p.as_piece()).collect();
            let outlets: Vec<(&str, u64)> =
                part.outlets.iter().map(|(n, a)| (n.as_str(), *a)).collect();
            let fetches: Vec<_> = part.fetches.iter().map(|f| f.as_fetch()).collect();
            // Pushes in the part's own transaction, before its fetches, so that a LISTEN of this turn reads them.
            // Their commit is not durable until the turn's sync: their outcomes are made Failed if that sync fails.
            let to_queue: Vec<&DownPush> = part.pushes.iter().collect();
            let commits = store.commits();
            let result = store
                .apply_with_down(&mut pieces, &outlets, part.keep_new, &fetches, &to_queue)
                .map_err(Arc::new);
            let pushed = outcomes_of(&result, to_queue.len(), store.commits() > commits);
            if (result.is_ok() || store.commits() > commits)
                && let Some(item) = store.sync_item(part.app)
            {
                files.push(item);
            }
            if !pushed.is_empty() {
                pushes.push((part.app, pushed));
            }
            apps.push((part.app, result));
        }
        let outcome = TurnOutcome { seq, apps, pushes };
        match &self.syncer {
            // In order: a turn with nothing to sync is ready here only when no earlier one waits.
            Some(syncer) if !files.is_empty() || !self.unsynced.is_empty() => {
                syncer.submit(seq, files);
                self.unsynced.push_back(outcome);
            }
            _ => self.ready.push(outcome),
        }
    }

    fn done(&mut self) -> Vec<TurnOutcome> {
        if let Some(syncer) = &self.syncer {
            let done = syncer.done();
            self.finish(done);
        }
        std::mem::take(&mut self.ready)
    }

    fn wait_done(&mut self) -> Vec<TurnOutcome> {
        if let Some(syncer) = &self.syncer
            && !self.unsynced.is_empty()
        {
            let done = syncer.wait_done();
            self.finish(done);
        }
        self.done()
    }

    fn wake_fd(&self) -> Option<RawFd> {
        self.syncer.as_ref().map(Syncer::wake_fd)
    }

    fn waiting(&self) -> usize {
        self.unsynced.len() + self.ready.len()
    }

    fn heard_of(&mut self, app: AppIndex, source: &str) -> Result<u64, StoreError> {
        self.stores
            .app(app)
            .ok_or(StoreError::Closed { app })?
            .heard_of(source)
    }

    fn head(&mut self, app: AppIndex) -> Result<u64, StoreError> {
        Ok(self
            .stores
            .app(app)
            .ok_or(StoreError::Closed { app })?
            .head())
    }
}
