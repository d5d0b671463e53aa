//! The memo of derived secrets: sender public key → X25519 shared secret, on disk.
//!
//! It is what makes "X25519 operations for a known sender after a restart: 0" true (BRIEF.md). It is as sensitive
//! as the node's key file (docs/protocol.md 9), so it is created with mode 0600. Losing it costs only X25519s, so
//! it is written with `synchronous=NORMAL`, and in batches: it is given only the secrets of packets that
//! authenticated (the node core keeps no others), which wait in memory, where lookups find them, and are written
//! in one transaction once [`BATCH_SECRETS`] wait or the oldest has waited [`BATCH_EVERY`], and when the memo is
//! closed. A transaction per turn wrote a B-tree page or two per secret, ~5 KB of disk writes each (research/016);
//! a batch shares its pages. A crash loses at most the batch waiting: an X25519 per sender in it, later.
//!
//! A lookup that finds nothing costs a SQLite query (a few µs), and a flood of forged first packets makes one per
//! packet for keys the memo does not have (research/007). So the memo keeps a [`KeyFilter`] of the keys it holds
//! (1 MiB, built on a helper thread at start so a large memo does not delay serving): a key the filter has never
//! seen is not in the memo, and costs no query.

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, TryRecvError};
use std::time::{Duration, Instant};

use rusqlite::{Connection, OpenFlags, OptionalExtension};

use super::StoreError;
use crate::proto::crypto::PublicKeyBytes;
use crate::proto::node::SecretMemo;

/// New secrets are written once this many wait (a batch: ~100 KB of memory at most)...
pub const BATCH_SECRETS: usize = 1024;
/// ... or once the oldest has waited this long: what a crash may lose, at an X25519 each.
pub const BATCH_EVERY: Duration = Duration::from_secs(10);

/// Bits of the filter: 2^23 (1 MiB). With two positions per key, a key not in the memo passes it with a chance of
/// about 4% at a million keys (about 0.3% at a hundred thousand).
const FILTER_BITS: u32 = 23;

/// A Bloom filter over public keys (two positions per key, taken from the key's bytes: public keys are uniformly
/// random, and a forger can only name listed senders' keys, not choose them). No false negatives: a key inserted is
/// always reported.
pub struct KeyFilter {
    bits: Vec<u64>,
}

impl Default for KeyFilter {
    fn default() -> Self {
        KeyFilter {
            bits: vec![0; (1 << FILTER_BITS) / 64],
        }
    }
}

impl KeyFilter {
    fn positions(key: &[u8; 32]) -> [u32; 2] {
        let word = |i: usize| u32::from_le_bytes([key[i], key[i + 1], key[i + 2], key[i + 3]]);
        let mask = (1u32 << FILTER_BITS) - 1;
        // Bytes 8.. : not the key id (bytes 0..4), which many keys may share.
        [word(8) & mask, word(12) & mask]
    }
    pub fn insert(&mut self, key: &[u8; 32]) {
        for p in Self::positions(key) {
            self.bits[(p / 64) as usize] |= 1 << (p % 64);
        }
    }
    pub fn may_contain(&self, key: &[u8; 32]) -> bool {
        Self::positions(key)
            .iter()
            .all(|&p| self.bits[(p / 64) as usize] & (1 << (p % 64)) != 0)
    }
}

/// Reads every key of the memo at `path` into a filter (on its own connection, so it can run on a helper thread).
fn load_filter(path: &Path) -> Option<KeyFilter> {
    let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY).ok()?;
    let mut filter = KeyFilter::default();
    let mut stmt = conn.prepare("SELECT public FROM secrets").ok()?;
    let mut rows = stmt.query([]).ok()?;
    while let Ok(Some(row)) = rows.next() {
        if let Ok(bytes) = row.get::<_, Vec<u8>>(0)
            && let Ok(key) = <[u8; 32]>::try_from(bytes.as_slice())
        {
            filter.insert(&key);
        }
    }
    Some(filter)
}

/// The filter: being built on a helper thread (with the keys put meanwhile, to add when it comes), ready, or off
/// (the helper failed: every lookup asks SQLite, as before).
enum Filter {
    Loading {
        result: Receiver<Option<KeyFilter>>,
        put_meanwhile: Vec<[u8; 32]>,
    },
    Ready(Box<KeyFilter>),
    Off,
}

pub struct Memo {
    /// `None`: the memo could not be opened (a full or read-only disk); the node runs without it, which costs an
    /// X25519 per new run of a sender and nothing else.
    conn: Option<Connection>,
    /// Its `-shm`, allocated whole at open and kept open after the connection (store/disk.rs, `open_shm`).
    _shm: Option<std::fs::File>,
    path: PathBuf,
    filter: Filter,
    /// Secrets not written yet (found by lookups all the same), and when the oldest of them came.
    waiting: HashMap<PublicKeyBytes, [u8; 32]>,
    waiting_since: Option<Instant>,
    /// Lookup errors are counted, not fatal: a failed lookup only costs an X25519.
    pub lookup_errors: u64,
    /// Lookups the filter answered without a query (the key is not in the memo).
    pub filtered: u64,
    /// Batches written.
    pub batches: u64,
}

impl Memo {
    /// Opens the memo, or, when the disk under it cannot take it, a memo that remembers nothing (said in the log).
    pub fn open_or_none(path: &Path) -> Self {
        match Self::open(path) {
            Ok(m) => m,
            Err(e) => {
                let why = match &e {
                    StoreError::NoRoom { free, .. } => {
                        format!("{}: {free} bytes free on its filesystem", path.display())
                    }
                    other => other.to_string(),
                };
                tracing::warn!(
                    "running without the memo of derived secrets ({why}): each new run of a sender costs an \
                     X25519 until a restart with room for it"
                );
                Memo {
                    conn: None,
                    _shm: None,
                    path: path.to_path_buf(),
                    filter: Filter::Off,
                    waiting: HashMap::new(),
                    waiting_since: None,
                    lookup_errors: 0,
                    filtered: 0,
                    batches: 0,
                }
            }
        }
    }

    pub fn open(path: &Path) -> Result<Self, StoreError> {
        // The same guard as an app's store: SQLite's first mapping of the wal-index must not meet a full disk.
        if let Err((free, wanted)) = super::disk::room_to_open(path) {
            return Err(StoreError::NoRoom {
                path: path.to_path_buf(),
                free,
                wanted,
            });
        }
        // Make the file private before SQLite writes a secret into it.
        OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(path)
            .map_err(|source| StoreError::Io {
                path: path.to_path_buf(),
                source,
            })?;
        let sql = |source| StoreError::Sqlite {
            path: path.to_path_buf(),
            source,
        };
        let conn = Connection::open(path).map_err(sql)?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(sql)?;
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(sql)?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS secrets (public BLOB PRIMARY KEY, shared BLOB NOT NULL) WITHOUT ROWID;",
        )
        .map_err(sql)?;
        let shm = super::disk::open_shm(path)
            .and_then(|f| super::disk::reserve_shm(&f, 4 * super::disk::SHM_REGION).map(|_| f))
            .map_err(|source| StoreError::Shm {
                path: path.to_path_buf(),
                source,
            })?;
        let (tx, rx) = mpsc::channel();
        let load_path = path.to_path_buf();
        let filter = match std::thread::Builder::new()
            .name("pure-memo-filter".into())
            .spawn(move || {
                // The memo may be gone by the time it is done (a stop); then nobody wants the filter.
                let _ = tx.send(load_filter(&load_path));
            }) {
            Ok(_) => Filter::Loading {
                result: rx,
                put_meanwhile: Vec::new(),
            },
            Err(_) => Filter::Off,
        };
        Ok(Memo {
            conn: Some(conn),
            _shm: Some(shm),
            path: path.to_path_buf(),
            filter,
            waiting: HashMap::new(),
            waiting_since: None,
            lookup_errors: 0,
            filtered: 0,
            batches: 0,
        })
    }

    /// Takes the filter from the helper thread once it is built; whether it is in use.
    fn filter_ready(&mut self) -> bool {
        if let Filter::Loading {
            result,
            put_meanwhile,
        } = &mut self.filter
        {
            self.filter = match result.try_recv() {
                Ok(Some(mut f)) => {
                    for k in put_meanwhile.iter() {
                        f.insert(k);
                    }
                    Filter::Ready(Box::new(f))
                }
                Ok(None) | Err(TryRecvError::Disconnected) => Filter::Off,
                Err(TryRecvError::Empty) => return false,
            };
        }
        matches!(self.filter, Filter::Ready(_))
    }

    /// Waits until the filter is in use (for tests and benches that want it from the first lookup).
    pub fn wait_for_filter(&mut self) {
        while matches!(self.filter, Filter::Loading { .. }) {
            self.filter_ready();
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// Takes new secrets (of packets that authenticated) at `now`: found by lookups at once, written with the
    /// batch they join when it is due ([`Memo::write_due`], which this calls too).
    pub fn put_all(
        &mut self,
        now: Instant,
        secrets: &[(PublicKeyBytes, [u8; 32])],
    ) -> Result<(), StoreError> {
        if self.conn.is_some() && !secrets.is_empty() {
            // Into the filter first, so it never hides a key the memo has.
            match &mut self.filter {
                Filter::Loading { put_meanwhile, .. } => {
                    put_meanwhile.extend(secrets.iter().map(|(k, _)| *k))
                }
                Filter::Ready(f) => secrets.iter().for_each(|(k, _)| f.insert(k)),
                Filter::Off => {}
            }
            self.waiting.extend(secrets.iter().copied());
            self.waiting_since.get_or_insert(now);
        }
        self.write_due(now)
    }

    /// When the waiting batch is due to be written, if one waits (for the receive loop's sleep).
    pub fn next_write(&self) -> Option<Instant> {
        self.waiting_since.map(|t| t + BATCH_EVERY)
    }

    /// Writes the waiting batch if [`BATCH_SECRETS`] wait or the oldest has waited [`BATCH_EVERY`] at `now`.
    pub fn write_due(&mut self, now: Instant) -> Result<(), StoreError> {
        let due =
            self.waiting.len() >= BATCH_SECRETS || self.next_write().is_some_and(|t| now >= t);
        if due { self.write() } else { Ok(()) }
    }

    /// Writes every secret waiting, in one transaction, in key order. On an error the batch is given up (the
    /// filter still reports its keys: a lookup then costs a query that finds nothing, and the X25519 is done
    /// again); the memo saves work, it holds nothing that must survive.
    pub fn write(&mut self) -> Result<(), StoreError> {
        self.waiting_since = None;
        if self.waiting.is_empty() {
            return Ok(());
        }
        let mut batch: Vec<(PublicKeyBytes, [u8; 32])> =
            std::mem::take(&mut self.waiting).into_iter().collect();
        batch.sort_unstable_by_key(|s| s.0);
        let Some(conn) = &mut self.conn else {
            return Ok(());
        };
        let path = self.path.clone();
        let sql = |source| StoreError::Sqlite {
            path: path.clone(),
            source,
        };
        let tx = conn.transaction().map_err(sql)?;
        {
            let mut put = tx
                .prepare_cached("INSERT OR REPLACE INTO secrets (public, shared) VALUES (?1, ?2)")
                .map_err(sql)?;
            for (public, shared) in &batch {
                put.execute((&public[..], &shared[..])).map_err(sql)?;
            }
        }
        tx.commit().map_err(sql)?;
        self.batches += 1;
        Ok(())
    }

    /// Secrets waiting to be written.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Secrets in the memo: written, and waiting.
    pub fn len(&self) -> u64 {
        let Some(conn) = &self.conn else { return 0 };
        conn.query_row("SELECT count(*) FROM secrets", [], |r| r.get::<_, i64>(0))
            .map(|n| n as u64)
            .unwrap_or(0)
            + self.waiting.len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A memo closed with secrets waiting writes them (a clean stop; the receive loop also writes them itself as it
/// stops, and says so if that fails).
impl Drop for Memo {
    fn drop(&mut self) {
        if let Err(e) = self.write() {
            tracing::warn!(
                "memo: the last secrets were not written ({e}); each costs an X25519 later"
            );
        }
    }
}

impl SecretMemo for Memo {
    fn get(&mut self, sender: &PublicKeyBytes) -> Option<[u8; 32]> {
        if self.filter_ready()
            && let Filter::Ready(f) = &self.filter
            && !f.may_contain(sender)
        {
            self.filtered += 1;
            return None;
        }
        if let Some(secret) = self.waiting.get(sender) {
            return Some(*secret);
        }
        let conn = self.conn.as_ref()?;
        let found: Result<Option<Vec<u8>>, _> = conn
            .prepare_cached("SELECT shared FROM secrets WHERE public = ?1")
            .and_then(|mut s| s.query_row([&sender[..]], |r| r.get(0)).optional());
        match found {
            Ok(Some(bytes)) => bytes.as_slice().try_into().ok(),
            Ok(None) => None,
            Err(_) => {
                self.lookup_errors += 1;
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::crypto::random_array;

    #[test]
    fn the_filter_never_hides_a_key_and_turns_most_strangers_away() {
        let mut f = KeyFilter::default();
        let keys: Vec<[u8; 32]> = (0..100_000).map(|_| random_array()).collect();
        for k in &keys {
            f.insert(k);
        }
        assert!(keys.iter().all(|k| f.may_contain(k)));
        let strangers = (0..100_000)
            .filter(|_| f.may_contain(&random_array()))
            .count();
        assert!(strangers < 1_000, "{strangers} of 100,000 passed");
    }

    #[test]
    fn secrets_put_before_and_after_the_filter_is_built_are_found() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("memo.sqlite");
        let before: Vec<([u8; 32], [u8; 32])> =
            (0..50).map(|_| (random_array(), random_array())).collect();
        {
            let mut m = Memo::open(&path).unwrap();
            m.put_all(Instant::now(), &before).unwrap();
        }
        // A new process: the filter is built from the file while secrets are put and looked up.
        let mut m = Memo::open(&path).unwrap();
        let during: Vec<([u8; 32], [u8; 32])> =
            (0..50).map(|_| (random_array(), random_array())).collect();
        m.put_all(Instant::now(), &during).unwrap();
        for (k, v) in before.iter().chain(&during) {
            assert_eq!(m.get(k), Some(*v));
        }
        m.wait_for_filter();
        assert!(matches!(m.filter, Filter::Ready(_)));
        let after: Vec<([u8; 32], [u8; 32])> =
            (0..50).map(|_| (random_array(), random_array())).collect();
        m.put_all(Instant::now(), &after).unwrap();
        for (k, v) in before.iter().chain(&during).chain(&after) {
            assert_eq!(m.get(k), Some(*v));
        }
        for _ in 0..100 {
            assert_eq!(m.get(&random_array()), None);
        }
        assert!(m.filtered >= 95, "{}", m.filtered);
    }

    fn secrets(n: usize) -> Vec<([u8; 32], [u8; 32])> {
        (0..n).map(|_| (random_array(), random_array())).collect()
    }

    /// Rows in the memo file as another process would read it now: what a crash would leave.
    fn rows_on_disk(path: &Path) -> u64 {
        let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
        conn.query_row("SELECT count(*) FROM secrets", [], |r| r.get::<_, i64>(0))
            .unwrap() as u64
    }

    /// New secrets wait in memory, found by lookups, and are written in one transaction once BATCH_EVERY has
    /// passed since the first of them, or once BATCH_SECRETS wait; a memo opened after that finds them all.
    #[test]
    fn secrets_are_written_in_batches_and_found_after_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("memo.sqlite");
        let t0 = Instant::now();
        let mut m = Memo::open(&path).unwrap();
        m.wait_for_filter();
        let first = secrets(10);
        for (i, s) in first.iter().enumerate() {
            // One a second, as turns would bring them.
            m.put_all(
                t0 + Duration::from_secs(i as u64 / 2),
                std::slice::from_ref(s),
            )
            .unwrap();
        }
        assert_eq!(m.batches, 0, "nothing written before BATCH_EVERY");
        assert_eq!(rows_on_disk(&path), 0);
        assert_eq!(m.waiting(), 10);
        for (k, v) in &first {
            assert_eq!(m.get(k), Some(*v), "a waiting secret is found");
        }
        assert_eq!(m.next_write(), Some(t0 + BATCH_EVERY));
        m.write_due(t0 + BATCH_EVERY - Duration::from_millis(1))
            .unwrap();
        assert_eq!(m.batches, 0);
        m.write_due(t0 + BATCH_EVERY).unwrap();
        assert_eq!((m.batches, m.waiting(), m.next_write()), (1, 0, None));
        assert_eq!(rows_on_disk(&path), 10, "one transaction with all ten");
        // A full batch is written at once, whatever the time.
        let t1 = t0 + BATCH_EVERY * 2;
        let full = secrets(BATCH_SECRETS);
        m.put_all(t1, &full[..BATCH_SECRETS - 1]).unwrap();
        assert_eq!(m.batches, 1);
        m.put_all(t1, &full[BATCH_SECRETS - 1..]).unwrap();
        assert_eq!(m.batches, 2);
        assert_eq!(rows_on_disk(&path), 10 + BATCH_SECRETS as u64);
        drop(m);
        let mut m = Memo::open(&path).unwrap();
        m.wait_for_filter();
        for (k, v) in first.iter().chain(&full) {
            assert_eq!(m.get(k), Some(*v));
        }
        assert_eq!(m.len(), 10 + BATCH_SECRETS as u64);
    }

    /// A clean stop writes what waits; a crash (the process gone without closing the memo) loses only the batch
    /// that was waiting, and what was written before it is all there.
    #[test]
    fn a_stop_writes_the_waiting_batch_and_a_crash_loses_only_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("memo.sqlite");
        let t0 = Instant::now();
        let written = secrets(5);
        let waiting = secrets(3);
        {
            let mut m = Memo::open(&path).unwrap();
            m.put_all(t0, &written).unwrap();
            m.write().unwrap();
            m.put_all(t0, &waiting).unwrap();
            assert_eq!(m.waiting(), 3);
            // A crash: the memo's memory is gone and nothing closes it.
            std::mem::forget(m);
        }
        let mut m = Memo::open(&path).unwrap();
        m.wait_for_filter();
        for (k, v) in &written {
            assert_eq!(m.get(k), Some(*v));
        }
        for (k, _) in &waiting {
            assert_eq!(
                m.get(k),
                None,
                "the batch waiting is lost: one X25519 each, later"
            );
        }
        // A clean stop (the memo dropped) writes its batch.
        m.put_all(t0, &waiting).unwrap();
        drop(m);
        assert_eq!(rows_on_disk(&path), 8);
        let mut m = Memo::open(&path).unwrap();
        for (k, v) in &waiting {
            assert_eq!(m.get(k), Some(*v));
        }
    }
}
