//! Downlink records in an app's store (docs/store.md, "Downlink"; docs/protocol.md 12): a row per waiting record,
//! per (sender, sequence), and per sender the next sequence to give. Queueing a push, deleting what a device has and
//! reading what waits for it happen in the app's transaction of a turn, beside its records and heard sequences (the
//! pushes first, so the turn's reads find them), so a turn that fails queues and deletes nothing.
//!
//! Nothing here is held in memory per sender: an idle device's waiting records are rows on disk, read when its
//! LISTEN asks.

use rusqlite::{OptionalExtension, Transaction, params};

use super::{AppStore, StoreError, now_ms};
use crate::proto::turn::DownRecord;

pub use crate::common::blob::{BlobError, DownBlob, MAX_BLOB};

// A piece is a downlink record: the floor's limit on a piece's size is the record limit.
const _: () = assert!(crate::common::blob::MAX_PIECE == MAX_DOWN_PAYLOAD);

/// Largest downlink payload (docs/protocol.md 12.2): it fits one node packet beside the frames ahead of it within a
/// device's default 1200-byte room.
pub const MAX_DOWN_PAYLOAD: usize = 1024;

/// The tables, made by every writer that opens a store (added to layout 2 without a new version: a node that does
/// not know them ignores them).
pub(super) const DOWNLINK_TABLES: &str = "
CREATE TABLE IF NOT EXISTS down_flows (
    sender   TEXT PRIMARY KEY,
    next_seq INTEGER NOT NULL,
    acked    INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS downlink (
    sender     TEXT NOT NULL,
    seq        INTEGER NOT NULL,
    payload    BLOB NOT NULL,
    queued_at  INTEGER NOT NULL,
    expires_at INTEGER,
    PRIMARY KEY (sender, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS down_count (
    one     INTEGER PRIMARY KEY CHECK (one = 1),
    waiting INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS down_blobs (
    id        INTEGER PRIMARY KEY AUTOINCREMENT,
    piece_len INTEGER NOT NULL,
    pieces    INTEGER NOT NULL,
    refs      INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS down_blob_bytes (
    id    INTEGER PRIMARY KEY,
    bytes BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS down_ranges (
    sender      TEXT NOT NULL,
    first_seq   INTEGER NOT NULL,
    last_seq    INTEGER NOT NULL,
    blob        INTEGER NOT NULL,
    first_piece INTEGER NOT NULL,
    queued_at   INTEGER NOT NULL,
    expires_at  INTEGER,
    PRIMARY KEY (sender, first_seq)
) WITHOUT ROWID;
";

/// Adds `delta` to the kept count of waiting records, in the transaction that changed them: a start reads one row
/// instead of counting a million (research/024: the count read the whole table at every start).
fn change_count(tx: &Transaction<'_>, delta: i64) -> rusqlite::Result<()> {
    if delta != 0 {
        tx.prepare_cached("UPDATE down_count SET waiting = MAX(waiting + ?1, 0) WHERE one = 1")?
            .execute([delta])?;
    }
    Ok(())
}

/// What one sender may have waiting (docs/apps.md, `[apps.NAME.downlink]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DownLimits {
    pub max_records: u64,
    pub max_bytes: u64,
    /// A record not delivered this long after it was queued is deleted, counted expired, never sent.
    pub expiry_ms: Option<u64>,
}

impl Default for DownLimits {
    fn default() -> Self {
        DownLimits {
            max_records: 1024,
            max_bytes: 1 << 20,
            expiry_ms: None,
        }
    }
}

impl DownLimits {
    /// When a record queued at `now` (ms since the Unix epoch) expires, if it does.
    pub fn expires_at(&self, now: i64) -> Option<i64> {
        self.expiry_ms
            .map(|e| now.saturating_add(e.min(i64::MAX as u64) as i64))
    }

    /// Whether `records` would pass a bound of one sender that has `waiting` records of `bytes` payload bytes
    /// waiting: the bound they would pass, or none.
    pub fn passed_by(&self, records: &[Vec<u8>], waiting: u64, bytes: u64) -> Option<DownRefusal> {
        let adding: u64 = records.iter().map(|p| p.len() as u64).sum();
        self.passed_by_count(records.len() as u64, adding, waiting, bytes)
    }

    /// Whether `count` records of `adding` payload bytes in all (a blob's pieces, counted as records) would pass a
    /// bound of one sender that has `waiting` records of `bytes` payload bytes waiting.
    pub fn passed_by_count(
        &self,
        count: u64,
        adding: u64,
        waiting: u64,
        bytes: u64,
    ) -> Option<DownRefusal> {
        if waiting.saturating_add(count) > self.max_records {
            Some(DownRefusal::Records {
                pushing: count,
                waiting,
                max: self.max_records,
            })
        } else if bytes.saturating_add(adding) > self.max_bytes {
            Some(DownRefusal::Bytes {
                pushing: adding,
                waiting: bytes,
                max: self.max_bytes,
            })
        } else {
            None
        }
    }
}

/// The first record of `records` larger than a downlink record may be, refused before anything is queued.
pub fn too_large(records: &[Vec<u8>]) -> Option<DownRefusal> {
    records
        .iter()
        .enumerate()
        .find(|(_, p)| p.len() > MAX_DOWN_PAYLOAD)
        .map(|(index, p)| DownRefusal::TooLarge {
            index,
            len: p.len(),
        })
}

/// Why a push was refused: nothing of it was queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DownRefusal {
    /// A record is larger than [`MAX_DOWN_PAYLOAD`].
    TooLarge { index: usize, len: usize },
    /// The sender would have more records waiting than `max_records`: the push has `pushing`, `waiting` wait.
    Records {
        pushing: u64,
        waiting: u64,
        max: u64,
    },
    /// The sender would have more bytes waiting than `max_bytes`: the push has `pushing`, `waiting` wait.
    Bytes {
        pushing: u64,
        waiting: u64,
        max: u64,
    },
}

impl std::fmt::Display for DownRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DownRefusal::TooLarge { index, len } => write!(
                f,
                "record {} is {len} bytes, above the downlink limit of {MAX_DOWN_PAYLOAD}",
                index + 1
            ),
            DownRefusal::Records {
                pushing,
                waiting,
                max,
            } => write!(
                f,
                "the push has {pushing} records and {waiting} already wait for this sender; at most {max} may \
                 (max_records)"
            ),
            DownRefusal::Bytes {
                pushing,
                waiting,
                max,
            } => write!(
                f,
                "the push has {pushing} bytes of records and {waiting} bytes already wait for this sender; at most \
                 {max} may (max_bytes)"
            ),
        }
    }
}

/// The largest `heard` a LISTEN is taken at (docs/protocol.md 12.2): a device that says more is taken as saying
/// this, so a flow's next number (one above `heard` at most, then one per record pushed) stays far below the
/// store's signed 64-bit integers (2^63 − 1) whatever a device says, and no device can fail its app's turns. No flow gets here by pushing: at a million
/// records a second it would take 146,000 years.
pub const MAX_DOWN_HEARD: u64 = (1 << 62) - 1;

/// What a push did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pushed {
    /// Every record queued, with sequences `first ..= first + count - 1`.
    Queued {
        first: u64,
        count: u64,
    },
    Refused(DownRefusal),
}

impl Pushed {
    /// How many records it queued.
    pub fn queued(&self) -> u64 {
        match self {
            Pushed::Queued { count, .. } => *count,
            Pushed::Refused(_) => 0,
        }
    }
}

/// A downlink read of a turn, for one sender of the app (from the turn's [`crate::proto::turn::DownFetch`] at
/// `index`).
#[derive(Debug, Clone)]
pub struct Fetch<'a> {
    pub index: usize,
    pub source: &'a str,
    pub heard: u64,
    /// Records are read above this, `≥ heard` (protocol.md 13.1: a validated session's records in flight are not
    /// read again); the read's `after`.
    pub from: u64,
    pub room: usize,
}

/// What a [`Fetch`] read, once committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchRead {
    pub index: usize,
    pub after: u64,
    pub last: u64,
    pub records: Vec<DownRecord>,
}

/// A [`Fetch`] owned, so that a turn's part can be handed to another thread (a fleet's store, docs/scale-out.md
/// "Downlink on a fleet").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedFetch {
    pub index: usize,
    pub source: String,
    pub heard: u64,
    pub from: u64,
    pub room: usize,
}

impl OwnedFetch {
    pub fn from_fetch(f: &Fetch<'_>) -> Self {
        OwnedFetch {
            index: f.index,
            source: f.source.to_string(),
            heard: f.heard,
            from: f.from,
            room: f.room,
        }
    }

    pub fn as_fetch(&self) -> Fetch<'_> {
        Fetch {
            index: self.index,
            source: &self.source,
            heard: self.heard,
            from: self.from,
            room: self.room,
        }
    }
}

/// The bytes of pieces `first ..= last` of a blob of `len` bytes in pieces of `piece_len`.
pub fn pieces_bytes(len: u64, piece_len: u64, first: u64, last: u64) -> u64 {
    let start = first.saturating_mul(piece_len).min(len);
    let end = last.saturating_add(1).saturating_mul(piece_len).min(len);
    end.saturating_sub(start)
}

/// A push carried by a turn's part (SQLite queues it in the part's transaction, a fleet's store in a transaction of
/// its own before the part's; either way a LISTEN of the same turn reads it): records for one sender, queued all
/// or nothing within `limits`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DownPush {
    /// The sender's name, as in the senders file (the flow's key in the store).
    pub sender: String,
    /// Its public key, which the fleet's other nodes look the sender up by when they hear of the push.
    pub key: crate::proto::crypto::PublicKeyBytes,
    pub records: Vec<Vec<u8>>,
    /// A file pushed as pieces instead of `records` (which are then empty): one range of sequences for its pieces.
    pub blob: Option<std::sync::Arc<DownBlob>>,
    pub limits: DownLimits,
}

impl DownPush {
    /// The records it would queue: its records, or its blob's pieces.
    pub fn count(&self) -> u64 {
        match &self.blob {
            Some(b) => b.pieces(),
            None => self.records.len() as u64,
        }
    }

    /// Whether it is refused for a record's size before anything of its sender is looked at.
    pub fn too_large(&self) -> Option<DownRefusal> {
        if self.blob.is_some() {
            None
        } else {
            too_large(&self.records)
        }
    }
}

/// What became of one push a turn's part carried (a fleet's pushes are transactions of their own, so their outcomes
/// are apart from the part's; on SQLite a push fails with its part).
#[derive(Debug, Clone)]
pub enum PushOutcome {
    /// Committed (and, on SQLite, synced): what it did, and how many of its sender's records expired and were
    /// deleted by it.
    Done(Pushed, u64),
    /// Not done. `maybe_queued`: the store may have committed it all the same (the connection was lost after its
    /// COMMIT was sent, or its sync failed after the commit), so the pusher must be told it may or may not be queued.
    Failed {
        error: std::sync::Arc<StoreError>,
        maybe_queued: bool,
    },
}

/// The outcomes of the `count` pushes one transaction of a turn carried ([`super::AppStore::apply_with_down`]):
/// what each did, or, if the transaction failed, that it did not, and whether it may have been kept all the same
/// (`committed`: the store committed it before the error, as [`super::AppStore::commits`] tells).
pub fn outcomes_of(
    result: &Result<super::Applied, std::sync::Arc<StoreError>>,
    count: usize,
    committed: bool,
) -> Vec<PushOutcome> {
    match result {
        Ok(applied) => applied
            .down
            .pushes
            .iter()
            .map(|(done, expired)| PushOutcome::Done(done.clone(), *expired))
            .collect(),
        Err(error) => {
            let failed = PushOutcome::Failed {
                error: error.clone(),
                maybe_queued: committed,
            };
            vec![failed; count]
        }
    }
}

impl PushOutcome {
    /// What it did, if it was done.
    pub fn done(&self) -> Option<(&Pushed, u64)> {
        match self {
            PushOutcome::Done(p, expired) => Some((p, *expired)),
            PushOutcome::Failed { .. } => None,
        }
    }
}

/// What a turn's downlink work did in one app.
#[derive(Debug, Clone, Default)]
pub struct DownApplied {
    pub reads: Vec<FetchRead>,
    pub delivered: u64,
    pub expired: u64,
    /// Records waiting in the app after this work, where the engine said it (a fleet's store returns its kept
    /// count whenever it changes it; `None`: not said).
    pub waiting: Option<u64>,
    /// The outcome of each push the transaction carried, in order: what it did, and how many of its sender's
    /// records expired and were deleted by it (on SQLite only: a fleet's pushes are transactions of their own).
    pub pushes: Vec<(Pushed, u64)>,
    /// A LISTEN said its device has more than this store numbered, so the flow's next number was raised
    /// (docs/protocol.md 12.5). The raise must be on disk before the answer goes out: a push numbered below it
    /// after a power cut would be taken by the device as a record it has.
    pub raised: bool,
}

// `CAST(?1 AS TEXT)`: with a bare `sender = ?1` beside an ORDER BY or a MAX, SQLite's planner takes the parameter for
// one the plan depends on, and prepares the statement again whenever it is bound to another value: at every read
// (research/035). The cast changes nothing else (the same search of the primary key).
const READ_SQL: &str =
    "SELECT seq, payload FROM downlink WHERE sender = CAST(?1 AS TEXT) AND seq > ?2 ORDER BY seq";
const LAST_SQL: &str = "SELECT MAX(seq) FROM downlink WHERE sender = CAST(?1 AS TEXT)";
/// A sender's ranges of a blob's pieces that wait above `heard`, with their blob's piece size.
const RANGES_SQL: &str = "SELECT r.first_seq, r.last_seq, r.blob, r.first_piece, b.piece_len
     FROM down_ranges r JOIN down_blobs b ON b.id = r.blob
     WHERE r.sender = CAST(?1 AS TEXT) AND r.last_seq > ?2 ORDER BY r.first_seq";
const RANGES_LAST_SQL: &str =
    "SELECT MAX(last_seq) FROM down_ranges WHERE sender = CAST(?1 AS TEXT)";
/// A sender's ranges that begin at or below `heard`: delivered whole, or in part.
const RANGES_HEARD_SQL: &str = "SELECT first_seq, last_seq, blob FROM down_ranges
     WHERE sender = CAST(?1 AS TEXT) AND first_seq <= ?2";
/// A sender's ranges that expired at `now`.
const RANGES_EXPIRED_SQL: &str = "SELECT first_seq, last_seq, blob FROM down_ranges
     WHERE sender = CAST(?1 AS TEXT) AND expires_at IS NOT NULL AND expires_at <= ?2";

/// Drops one reference to blob `id` (a range of it was delivered or expired); the blob goes with its last.
fn drop_ref(tx: &Transaction<'_>, id: i64) -> rusqlite::Result<()> {
    tx.prepare_cached("UPDATE down_blobs SET refs = refs - 1 WHERE id = ?1")?
        .execute([id])?;
    let gone = tx
        .prepare_cached("DELETE FROM down_blobs WHERE id = ?1 AND refs <= 0")?
        .execute([id])?;
    if gone > 0 {
        tx.prepare_cached("DELETE FROM down_blob_bytes WHERE id = ?1")?
            .execute([id])?;
    }
    Ok(())
}

/// Deletes `sender`'s expired records and ranges at `now` (a range's blob loses its reference): how many records
/// and pieces were deleted.
/// `ranges`: the store may hold ranges ([`AppStore`]'s `down_ranges`); else they are not looked for.
fn expire_sender(
    tx: &Transaction<'_>,
    sender: &str,
    now: i64,
    ranges: bool,
) -> rusqlite::Result<u64> {
    let mut n = tx
        .prepare_cached(
            "DELETE FROM downlink WHERE sender = ?1 AND expires_at IS NOT NULL AND expires_at <= ?2",
        )?
        .execute(params![sender, now])? as u64;
    if !ranges {
        return Ok(n);
    }
    let expired: Vec<(i64, i64, i64)> = tx
        .prepare_cached(RANGES_EXPIRED_SQL)?
        .query_map(params![sender, now], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })?
        .collect::<Result<_, _>>()?;
    for (first, last, blob) in expired {
        tx.prepare_cached("DELETE FROM down_ranges WHERE sender = ?1 AND first_seq = ?2")?
            .execute(params![sender, first])?;
        drop_ref(tx, blob)?;
        n += (last - first + 1).max(0) as u64;
    }
    Ok(n)
}

/// Deletes what `sender`'s device has of its ranges (`heard` and below): a range wholly at or below it is deleted
/// (its blob loses its reference), one that goes on above it begins at `heard + 1` from then on, at the piece that
/// sequence is. How many pieces were delivered.
fn deliver_ranges(tx: &Transaction<'_>, sender: &str, heard: i64) -> rusqlite::Result<u64> {
    let had: Vec<(i64, i64, i64)> = tx
        .prepare_cached(RANGES_HEARD_SQL)?
        .query_map(params![sender, heard], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })?
        .collect::<Result<_, _>>()?;
    let mut n = 0u64;
    for (first, last, blob) in had {
        if last <= heard {
            tx.prepare_cached("DELETE FROM down_ranges WHERE sender = ?1 AND first_seq = ?2")?
                .execute(params![sender, first])?;
            drop_ref(tx, blob)?;
            n += (last - first + 1).max(0) as u64;
        } else {
            tx.prepare_cached(
                "UPDATE down_ranges SET first_piece = first_piece + (?3 - first_seq), first_seq = ?3
                 WHERE sender = ?1 AND first_seq = ?2",
            )?
            .execute(params![sender, first, heard + 1])?;
            n += (heard + 1 - first).max(0) as u64;
        }
    }
    Ok(n)
}

/// A range of a blob's pieces waiting for a sender, as a read walks it.
struct RangeRead {
    /// The next sequence to read of it, and its last.
    next: i64,
    last: i64,
    blob: i64,
    /// The piece sequence `next` is.
    piece: i64,
    piece_len: i64,
}

/// Piece `piece` of blob `id` (pieces of `piece_len` bytes), read from the store without reading the rest of it.
fn read_piece(
    tx: &rusqlite::Connection,
    id: i64,
    piece: i64,
    piece_len: i64,
) -> rusqlite::Result<Vec<u8>> {
    let blob = tx.blob_open(rusqlite::MAIN_DB, "down_blob_bytes", "bytes", id, true)?;
    let len = blob.len() as i64;
    let start = piece.saturating_mul(piece_len).clamp(0, len);
    let end = start.saturating_add(piece_len).min(len);
    let mut out = vec![0u8; (end - start) as usize];
    blob.read_at_exact(&mut out, start as usize)
        .map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?;
    Ok(out)
}

/// A downlink record waiting for its device, as a tool reads it from either engine.
#[derive(Debug)]
pub struct WaitingView<'a> {
    /// The sender it waits for, by name.
    pub sender: &'a str,
    pub seq: u64,
    pub payload: &'a [u8],
    /// When it was queued, ms since the Unix epoch.
    pub queued_at_ms: i64,
    /// When it expires, if it does.
    pub expires_at_ms: Option<i64>,
    /// For a piece of a file pushed as pieces: its blob's id in the store and which piece it is (from 0).
    pub piece: Option<(i64, u64)>,
}

/// A range of a blob's pieces waiting, as a tool reads it.
struct WaitingRange {
    sender: String,
    first: i64,
    last: i64,
    blob: i64,
    first_piece: i64,
    piece_len: i64,
    queued_at: i64,
    expires_at: Option<i64>,
}

/// Runs the fetches in the app's open transaction. `swept`: senders whose expired records this transaction deleted
/// already, at the same `now` (its pushes'). `ranges_held`: the store may hold ranges of files pushed as pieces
/// (else they are not looked for).
pub(super) fn apply_fetches(
    tx: &Transaction<'_>,
    fetches: &[Fetch<'_>],
    now: i64,
    swept: &[&str],
    ranges_held: bool,
) -> rusqlite::Result<DownApplied> {
    let mut out = DownApplied::default();
    if fetches.is_empty() {
        return Ok(out);
    }
    let mut delivered =
        tx.prepare_cached("DELETE FROM downlink WHERE sender = ?1 AND seq <= ?2")?;
    // The device's heard, where the flow's next number is above it already.
    let mut ack = tx.prepare_cached(
        "UPDATE down_flows SET acked = ?2 WHERE sender = ?1 AND acked < ?2 AND next_seq > ?2",
    )?;
    // Whether the flow took this heard already, has a number above it, or must have its next number raised.
    let mut flow = tx.prepare_cached("SELECT next_seq, acked FROM down_flows WHERE sender = ?1")?;
    // A device that has more than this node knows of (the node lost its queue): later records are numbered
    // above what it has, so they are not taken as duplicates (docs/protocol.md 12.5).
    let mut raise = tx.prepare_cached(
        "INSERT INTO down_flows (sender, next_seq, acked) VALUES (?1, ?2 + 1, ?2)
         ON CONFLICT (sender) DO UPDATE SET acked = MAX(acked, excluded.acked),
             next_seq = MAX(next_seq, excluded.next_seq)",
    )?;
    let mut read = tx.prepare_cached(READ_SQL)?;
    let mut last = tx.prepare_cached(LAST_SQL)?;
    let mut ranges = tx.prepare_cached(RANGES_SQL)?;
    let mut ranges_last = tx.prepare_cached(RANGES_LAST_SQL)?;
    for f in fetches {
        let heard = f.heard.min(MAX_DOWN_HEARD) as i64;
        if heard > 0 {
            // A heard the flow has taken already (`acked`, raised only here, together with the deletions below;
            // records are numbered above `acked`, so none at or below it waits): nothing to delete. The usual case
            // of a push's turn, whose read carries the heard the device's last LISTEN brought (research/046).
            // Read first, so that this case costs one statement.
            let row: Option<(i64, i64)> = flow
                .query_row([f.source], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()?;
            let taken = match row {
                Some((next, acked)) if next > heard => {
                    if acked < heard {
                        ack.execute(params![f.source, heard])?;
                    }
                    acked >= heard
                }
                _ => {
                    raise.execute(params![f.source, heard])?;
                    out.raised = true;
                    false
                }
            };
            if !taken {
                out.delivered += delivered.execute(params![f.source, heard])? as u64;
                if ranges_held {
                    out.delivered += deliver_ranges(tx, f.source, heard)?;
                }
            }
        }
        if !swept.contains(&f.source) {
            out.expired += expire_sender(tx, f.source, now, ranges_held)?;
        }
        // Read above `from` (≥ heard): a validated session's pieces in flight are not read again.
        let from = f.from.max(f.heard).min(MAX_DOWN_HEARD) as i64;
        let mut ranges: Vec<RangeRead> = if !ranges_held {
            Vec::new()
        } else {
            ranges
                .query_map(params![f.source, from], |r| {
                    let (first, last, blob, first_piece, piece_len): (i64, i64, i64, i64, i64) =
                        (r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?);
                    let next = first.max(from + 1);
                    Ok(RangeRead {
                        next,
                        last,
                        blob,
                        piece: first_piece + (next - first),
                        piece_len,
                    })
                })?
                .collect::<Result<_, _>>()?
        };
        ranges.reverse();
        let mut records = Vec::new();
        let mut used = 0usize;
        let mut rows = read.query(params![f.source, from])?;
        let mut full = false;
        // The records and the ranges' pieces, merged in sequence order (no sequence is in both).
        let mut record: Option<(i64, Vec<u8>)> = match rows.next()? {
            Some(row) => Some((row.get(0)?, row.get(1)?)),
            None => None,
        };
        loop {
            let piece_first = match (&record, ranges.last()) {
                (None, None) => break,
                (Some(_), None) => false,
                (None, Some(_)) => true,
                (Some((seq, _)), Some(r)) => r.next < *seq,
            };
            let (seq, payload) = if piece_first {
                let Some(r) = ranges.last_mut() else { break };
                let payload = read_piece(tx, r.blob, r.piece, r.piece_len)?;
                let len = crate::proto::wire::record_len(&payload);
                if used + len > f.room {
                    full = true;
                    break;
                }
                let seq = r.next;
                r.next += 1;
                r.piece += 1;
                if r.next > r.last {
                    ranges.pop();
                }
                (seq, payload)
            } else {
                let Some((seq, payload)) = record.take() else {
                    break;
                };
                let len = crate::proto::wire::record_len(&payload);
                if used + len > f.room {
                    full = true;
                    break;
                }
                record = match rows.next()? {
                    Some(row) => Some((row.get(0)?, row.get(1)?)),
                    None => None,
                };
                (seq, payload)
            };
            used += crate::proto::wire::record_len(&payload);
            records.push(DownRecord {
                seq: seq as u64,
                payload,
            });
        }
        drop(rows);
        // Everything above `heard` was read (and nothing at or below it is left): the last record read is the last
        // waiting; only a read that filled its room asks the store.
        let last = if full {
            let last: Option<i64> = last.query_row([f.source], |r| r.get(0))?;
            let last_range: Option<i64> = if ranges_held {
                ranges_last.query_row([f.source], |r| r.get(0))?
            } else {
                None
            };
            last.max(last_range).map_or(0, |l| l as u64)
        } else {
            records.last().map_or(0, |r| r.seq)
        };
        out.reads.push(FetchRead {
            index: f.index,
            after: from as u64,
            last,
            records,
        });
    }
    change_count(tx, -((out.delivered + out.expired) as i64))?;
    Ok(out)
}

/// Queues `payloads` for `sender` in the app's open transaction, all or nothing: each gets the flow's next sequence.
/// Expired records of the sender are deleted first (the second value counts them), so they do not hold its room; a
/// refused push keeps those deletions and writes nothing else.
///
/// `ranges`: the store may hold ranges of files pushed as pieces (else they are not looked for).
pub(super) fn queue_in(
    tx: &Transaction<'_>,
    sender: &str,
    payloads: &[Vec<u8>],
    limits: &DownLimits,
    now: i64,
    ranges: bool,
) -> rusqlite::Result<(Pushed, u64)> {
    if let Some(refused) = too_large(payloads) {
        return Ok((Pushed::Refused(refused), 0));
    }
    let expired = expire_sender(tx, sender, now, ranges)?;
    let (waiting, bytes) = waiting_of(tx, sender, ranges)?;
    let refusal = limits.passed_by(payloads, waiting, bytes);
    if let Some(r) = refusal {
        change_count(tx, -(expired as i64))?;
        return Ok((Pushed::Refused(r), expired));
    }
    // The flow's next number advanced past the push and read back in one statement: the push's first is what it
    // was (1 for a new flow).
    let count = payloads.len() as i64;
    let after: i64 = tx
        .prepare_cached(
            "INSERT INTO down_flows (sender, next_seq, acked) VALUES (?1, 1 + ?2, 0)
             ON CONFLICT (sender) DO UPDATE SET next_seq = next_seq + ?2
             RETURNING next_seq",
        )?
        .query_row(params![sender, count], |r| r.get(0))?;
    let next = after - count;
    let expires = limits.expires_at(now);
    let mut put = tx.prepare_cached(
        "INSERT INTO downlink (sender, seq, payload, queued_at, expires_at) VALUES (?1, ?2, ?3, ?4, ?5)",
    )?;
    for (i, p) in payloads.iter().enumerate() {
        put.execute(params![sender, next + i as i64, p, now, expires])?;
    }
    change_count(tx, payloads.len() as i64 - expired as i64)?;
    let queued = Pushed::Queued {
        first: next as u64,
        count: payloads.len() as u64,
    };
    Ok((queued, expired))
}

/// The records and payload bytes waiting for `sender`, a blob's pieces counted as records.
/// `ranges`: the store may hold ranges (else they are not looked for).
fn waiting_of(tx: &Transaction<'_>, sender: &str, ranges: bool) -> rusqlite::Result<(u64, u64)> {
    let (mut waiting, mut bytes): (i64, i64) = tx
        .prepare_cached(
            "SELECT COUNT(*), COALESCE(SUM(LENGTH(payload)), 0) FROM downlink WHERE sender = ?1",
        )?
        .query_row([sender], |r| Ok((r.get(0)?, r.get(1)?)))?;
    if !ranges {
        return Ok((waiting.max(0) as u64, bytes.max(0) as u64));
    }
    let mut q = tx.prepare_cached(
        "SELECT r.first_seq, r.last_seq, r.first_piece, b.piece_len, LENGTH(y.bytes)
         FROM down_ranges r JOIN down_blobs b ON b.id = r.blob JOIN down_blob_bytes y ON y.id = r.blob
         WHERE r.sender = ?1",
    )?;
    let mut rows = q.query([sender])?;
    while let Some(r) = rows.next()? {
        let (first, last, first_piece, piece_len, len): (i64, i64, i64, i64, i64) =
            (r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?);
        let n = (last - first + 1).max(0);
        waiting += n;
        bytes += pieces_bytes(
            len.max(0) as u64,
            piece_len.max(1) as u64,
            first_piece.max(0) as u64,
            (first_piece + n - 1).max(0) as u64,
        ) as i64;
    }
    Ok((waiting.max(0) as u64, bytes.max(0) as u64))
}

/// Queues `blob`'s pieces for `sender` in the app's open transaction, all or nothing within `limits` (the pieces
/// counted as records, their bytes as payload bytes): a range of sequences from the flow's next, and a reference
/// to the blob, which is written if this transaction has not written it yet (`made`: the blobs it wrote or
/// referenced, by address, and their ids) and the store does not have it. Expired records and ranges of the
/// sender are deleted first, as [`queue_in`] does.
pub(super) fn queue_blob_in(
    tx: &Transaction<'_>,
    sender: &str,
    blob: &std::sync::Arc<DownBlob>,
    limits: &DownLimits,
    now: i64,
    made: &mut Vec<(std::sync::Arc<DownBlob>, i64)>,
) -> rusqlite::Result<(Pushed, u64)> {
    let expired = expire_sender(tx, sender, now, true)?;
    let (waiting, bytes) = waiting_of(tx, sender, true)?;
    let pieces = blob.pieces();
    if let Some(r) = limits.passed_by_count(pieces, blob.bytes().len() as u64, waiting, bytes) {
        change_count(tx, -(expired as i64))?;
        return Ok((Pushed::Refused(r), expired));
    }
    let known = made
        .iter()
        .find(|(b, _)| std::sync::Arc::ptr_eq(b, blob))
        .map(|(_, id)| *id)
        .or_else(|| blob.stored());
    let referenced = match known {
        Some(id) => {
            tx.prepare_cached("UPDATE down_blobs SET refs = refs + 1 WHERE id = ?1")?
                .execute([id])?
                == 1
        }
        None => false,
    };
    let id = match (referenced, known) {
        (true, Some(id)) => id,
        _ => {
            // Not written yet, or deleted since (every range of it delivered or expired): written now.
            tx.prepare_cached(
                "INSERT INTO down_blobs (piece_len, pieces, refs) VALUES (?1, ?2, 1)",
            )?
            .execute(params![blob.piece_len() as i64, pieces as i64])?;
            let id = tx.last_insert_rowid();
            tx.prepare_cached("INSERT INTO down_blob_bytes (id, bytes) VALUES (?1, ?2)")?
                .execute(params![id, blob.bytes()])?;
            id
        }
    };
    match made
        .iter_mut()
        .find(|(b, _)| std::sync::Arc::ptr_eq(b, blob))
    {
        Some(m) => m.1 = id,
        None => made.push((blob.clone(), id)),
    }
    let next: i64 = tx
        .prepare_cached("SELECT next_seq FROM down_flows WHERE sender = ?1")?
        .query_row([sender], |r| r.get(0))
        .optional()?
        .unwrap_or(1);
    let last = next + pieces as i64 - 1;
    tx.prepare_cached(
        "INSERT INTO down_ranges (sender, first_seq, last_seq, blob, first_piece, queued_at, expires_at)
         VALUES (?1, ?2, ?3, ?4, 0, ?5, ?6)",
    )?
    .execute(params![sender, next, last, id, now, limits.expires_at(now)])?;
    tx.prepare_cached(
        "INSERT INTO down_flows (sender, next_seq, acked) VALUES (?1, ?2, 0)
         ON CONFLICT (sender) DO UPDATE SET next_seq = excluded.next_seq",
    )?
    .execute(params![sender, last + 1])?;
    change_count(tx, pieces as i64 - expired as i64)?;
    Ok((
        Pushed::Queued {
            first: next as u64,
            count: pieces,
        },
        expired,
    ))
}

impl AppStore {
    /// Queues `blob`'s pieces for `sender` in a transaction of its own, as [`queue_blob_in`] says (tools and
    /// tests; a turn's pushes go in its own transaction).
    pub fn queue_blob_down(
        &mut self,
        sender: &str,
        blob: &std::sync::Arc<DownBlob>,
        limits: &DownLimits,
    ) -> Result<(Pushed, u64), StoreError> {
        let path = self.path.clone();
        let sql = |source| StoreError::Sqlite {
            path: path.clone(),
            source,
        };
        self.down_ranges = true;
        self.before_commit()?;
        let tx = self.conn.transaction().map_err(sql)?;
        let mut made = Vec::new();
        let (pushed, expired) =
            queue_blob_in(&tx, sender, blob, limits, now_ms(), &mut made).map_err(sql)?;
        tx.commit().map_err(sql)?;
        for (b, id) in made {
            b.set_stored(id);
        }
        self.commits += 1;
        self.after_commit()?;
        self.open_wal_for_sync()?;
        self.down_waiting = (self.down_waiting + pushed.queued()).saturating_sub(expired);
        Ok((pushed, expired))
    }

    /// Queues `payloads` for `sender` in a transaction of its own (the caller syncs it before it says they are
    /// queued), as [`queue_in`] says. A turn's pushes go in the turn's own transaction instead
    /// ([`AppStore::apply_with_down`]).
    pub fn queue_down(
        &mut self,
        sender: &str,
        payloads: &[Vec<u8>],
        limits: &DownLimits,
    ) -> Result<(Pushed, u64), StoreError> {
        let path = self.path.clone();
        let sql = |source| StoreError::Sqlite {
            path: path.clone(),
            source,
        };
        self.before_commit()?;
        let tx = self.conn.transaction().map_err(sql)?;
        let (pushed, expired) =
            queue_in(&tx, sender, payloads, limits, now_ms(), self.down_ranges).map_err(sql)?;
        tx.commit().map_err(sql)?;
        self.commits += 1;
        self.after_commit()?;
        self.open_wal_for_sync()?;
        self.down_waiting = (self.down_waiting + pushed.queued()).saturating_sub(expired);
        Ok((pushed, expired))
    }

    /// Downlink records waiting in this app, for all senders (kept as a count, not read per scrape).
    pub fn down_waiting(&self) -> u64 {
        self.down_waiting
    }

    /// Whether the store has the downlink tables (a store made before downlink and opened for reading has none).
    fn has_downlink_table(&self) -> rusqlite::Result<bool> {
        self.has_table("downlink")
    }

    /// Whether the store has table `name` (the blobs' tables came later than the records').
    fn has_table(&self, name: &str) -> rusqlite::Result<bool> {
        self.conn.query_row(
            "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1)",
            [name],
            |r| r.get(0),
        )
    }

    /// The ranges of blobs' pieces waiting (of `sender`, if given) and not expired at `now_ms`, by sender then
    /// sequence: (sender, first_seq, last_seq, blob, first_piece, piece_len, queued_at, expires_at).
    fn waiting_ranges(
        &self,
        sender: Option<&str>,
        now_ms: i64,
    ) -> rusqlite::Result<Vec<WaitingRange>> {
        if !self.has_table("down_ranges")? {
            return Ok(Vec::new());
        }
        let mut q = self.conn.prepare(
            "SELECT r.sender, r.first_seq, r.last_seq, r.blob, r.first_piece, b.piece_len, r.queued_at, r.expires_at
             FROM down_ranges r JOIN down_blobs b ON b.id = r.blob
             WHERE (?1 IS NULL OR r.sender = ?1) AND (r.expires_at IS NULL OR r.expires_at > ?2)
             ORDER BY r.sender, r.first_seq",
        )?;
        q.query_map(params![sender, now_ms], |r| {
            Ok(WaitingRange {
                sender: r.get(0)?,
                first: r.get(1)?,
                last: r.get(2)?,
                blob: r.get(3)?,
                first_piece: r.get(4)?,
                piece_len: r.get(5)?,
                queued_at: r.get(6)?,
                expires_at: r.get(7)?,
            })
        })?
        .collect()
    }

    /// How many downlink records wait for each sender (not expired at `now_ms`), by sender, a blob's pieces counted
    /// as records.
    pub fn waiting_by_sender(&self, now_ms: i64) -> Result<Vec<(String, u64)>, StoreError> {
        let sql = |source| StoreError::Sqlite {
            path: self.path.clone(),
            source,
        };
        let has_table = self.has_downlink_table().map_err(sql)?;
        if !has_table {
            return Ok(Vec::new());
        }
        let mut q = self
            .conn
            .prepare(
                "SELECT sender, COUNT(*) FROM downlink WHERE expires_at IS NULL OR expires_at > ?1
                 GROUP BY sender ORDER BY sender",
            )
            .map_err(sql)?;
        let rows = q
            .query_map(params![now_ms], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?.max(0) as u64))
            })
            .map_err(sql)?;
        let mut counts: std::collections::BTreeMap<String, u64> =
            rows.collect::<Result<_, _>>().map_err(sql)?;
        for r in self.waiting_ranges(None, now_ms).map_err(sql)? {
            *counts.entry(r.sender).or_default() += (r.last - r.first + 1).max(0) as u64;
        }
        Ok(counts.into_iter().collect())
    }

    /// Hands `each` the records waiting for a device (of `sender`, if given) that have not expired at `now_ms`, by
    /// sender then sequence, until it returns false (`pure-serve records --waiting`): a blob's pieces as records,
    /// each saying which piece of which blob it is. A store made before downlink has none.
    pub fn for_each_waiting(
        &self,
        sender: Option<&str>,
        now_ms: i64,
        mut each: impl FnMut(&WaitingView<'_>) -> bool,
    ) -> Result<(), StoreError> {
        let sql = |source| StoreError::Sqlite {
            path: self.path.clone(),
            source,
        };
        let has_table = self.has_downlink_table().map_err(sql)?;
        if !has_table {
            return Ok(());
        }
        let ranges = self.waiting_ranges(sender, now_ms).map_err(sql)?;
        let mut ranges = ranges.iter().peekable();
        // Hands over the pieces of the ranges that come before (`sender`, `seq`), or all of them with none.
        let mut pieces_before =
            |until: Option<(&str, i64)>, each: &mut dyn FnMut(&WaitingView<'_>) -> bool| {
                while let Some(r) = ranges
                    .next_if(|r| until.is_none_or(|(s, q)| (r.sender.as_str(), r.first) < (s, q)))
                {
                    for seq in r.first..=r.last {
                        let piece = r.first_piece + (seq - r.first);
                        let payload = read_piece(&self.conn, r.blob, piece, r.piece_len)?;
                        let view = WaitingView {
                            sender: &r.sender,
                            seq: seq as u64,
                            payload: &payload,
                            queued_at_ms: r.queued_at,
                            expires_at_ms: r.expires_at,
                            piece: Some((r.blob, piece as u64)),
                        };
                        if !each(&view) {
                            return Ok(false);
                        }
                    }
                }
                Ok::<_, rusqlite::Error>(true)
            };
        let mut q = self
            .conn
            .prepare(
                "SELECT sender, seq, payload, queued_at, expires_at FROM downlink
                 WHERE (?1 IS NULL OR sender = ?1) AND (expires_at IS NULL OR expires_at > ?2)
                 ORDER BY sender, seq",
            )
            .map_err(sql)?;
        let mut rows = q.query(params![sender, now_ms]).map_err(sql)?;
        while let Some(row) = rows.next().map_err(sql)? {
            let sender: String = row.get(0).map_err(sql)?;
            let seq: i64 = row.get(1).map_err(sql)?;
            if !pieces_before(Some((&sender, seq)), &mut each).map_err(sql)? {
                return Ok(());
            }
            let payload: Vec<u8> = row.get(2).map_err(sql)?;
            let view = WaitingView {
                sender: &sender,
                seq: seq as u64,
                payload: &payload,
                queued_at_ms: row.get(3).map_err(sql)?,
                expires_at_ms: row.get(4).map_err(sql)?,
                piece: None,
            };
            if !each(&view) {
                return Ok(());
            }
        }
        pieces_before(None, &mut each).map_err(sql)?;
        Ok(())
    }

    /// The waiting records of `sender`, in sequence order, a blob's pieces among them (for tests and `records`).
    pub fn down_records(&self, sender: &str) -> Result<Vec<DownRecord>, StoreError> {
        let mut out = Vec::new();
        self.for_each_waiting(Some(sender), i64::MIN, |w| {
            out.push(DownRecord {
                seq: w.seq,
                payload: w.payload.to_vec(),
            });
            true
        })?;
        Ok(out)
    }

    /// The kept count of waiting records; a store that has none yet (made before it was kept) is counted once and
    /// the count kept from then on.
    /// Whether the store holds any range of a file pushed as pieces (one row looked for; a store made before
    /// ranges existed has their table made at open).
    pub(super) fn may_hold_ranges(&self) -> Result<bool, StoreError> {
        if !self
            .has_table("down_ranges")
            .map_err(|source| StoreError::Sqlite {
                path: self.path.clone(),
                source,
            })?
        {
            return Ok(false);
        }
        self.conn
            .query_row("SELECT EXISTS (SELECT 1 FROM down_ranges)", [], |r| {
                r.get(0)
            })
            .map_err(|source| StoreError::Sqlite {
                path: self.path.clone(),
                source,
            })
    }

    pub(super) fn load_down_waiting(&mut self) -> Result<u64, StoreError> {
        let path = self.path.clone();
        let sql = |source| StoreError::Sqlite {
            path: path.clone(),
            source,
        };
        let kept: Option<i64> = self
            .conn
            .query_row("SELECT waiting FROM down_count WHERE one = 1", [], |r| {
                r.get(0)
            })
            .optional()
            .map_err(sql)?;
        if let Some(n) = kept {
            return Ok(n.max(0) as u64);
        }
        let tx = self.conn.transaction().map_err(sql)?;
        let n: i64 = tx
            .query_row(
                "SELECT (SELECT COUNT(*) FROM downlink)
                     + (SELECT COALESCE(SUM(last_seq - first_seq + 1), 0) FROM down_ranges)",
                [],
                |r| r.get(0),
            )
            .map_err(sql)?;
        tx.execute("INSERT INTO down_count (one, waiting) VALUES (1, ?1)", [n])
            .map_err(sql)?;
        tx.commit().map_err(sql)?;
        Ok(n as u64)
    }

    /// Counts the waiting records (for tests: the kept count must agree).
    #[cfg(test)]
    fn count_down_waiting(&self) -> u64 {
        self.conn
            .query_row(
                "SELECT (SELECT COUNT(*) FROM downlink)
                     + (SELECT COALESCE(SUM(last_seq - first_seq + 1), 0) FROM down_ranges)",
                [],
                |r| r.get::<_, i64>(0),
            )
            .unwrap() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fetch(source: &str, heard: u64, room: usize) -> Fetch<'_> {
        Fetch {
            index: 0,
            source,
            heard,
            from: heard,
            room,
        }
    }

    #[test]
    fn pushes_are_numbered_bounded_all_or_nothing_and_delivered_in_the_turns_transaction() {
        let mut s = AppStore::open_in_memory("down").unwrap();
        let limits = DownLimits {
            max_records: 3,
            max_bytes: 10,
            expiry_ms: None,
        };
        let recs = |n: usize| (0..n).map(|i| vec![b'a' + i as u8; 2]).collect::<Vec<_>>();
        assert_eq!(
            s.queue_down("dev", &recs(2), &limits).unwrap().0,
            Pushed::Queued { first: 1, count: 2 }
        );
        // Two more would make 4 records waiting: refused whole, nothing written.
        assert_eq!(
            s.queue_down("dev", &recs(2), &limits).unwrap().0,
            Pushed::Refused(DownRefusal::Records {
                pushing: 2,
                waiting: 2,
                max: 3
            })
        );
        let big = vec![vec![0u8; 7]];
        assert_eq!(
            s.queue_down("dev", &big, &limits).unwrap().0,
            Pushed::Refused(DownRefusal::Bytes {
                pushing: 7,
                waiting: 4,
                max: 10
            })
        );
        assert!(matches!(
            s.queue_down("dev", &[vec![0; MAX_DOWN_PAYLOAD + 1]], &limits)
                .unwrap()
                .0,
            Pushed::Refused(DownRefusal::TooLarge { index: 0, .. })
        ));
        assert_eq!(s.down_records("dev").unwrap().len(), 2);
        assert_eq!(s.down_waiting(), 2);
        // Another sender has its own numbering and bounds.
        assert_eq!(
            s.queue_down("other", &recs(1), &limits).unwrap().0,
            Pushed::Queued { first: 1, count: 1 }
        );
        // The device has 1: it is deleted, 2 read; room for one record only.
        let applied = s
            .apply_with_down(&mut [], &[], false, &[fetch("dev", 1, 3)], &[])
            .unwrap();
        assert_eq!(applied.down.delivered, 1);
        assert_eq!(
            applied.down.reads,
            vec![FetchRead {
                index: 0,
                after: 1,
                last: 2,
                records: vec![DownRecord {
                    seq: 2,
                    payload: b"bb".to_vec()
                }]
            }]
        );
        assert_eq!(s.down_waiting(), 2);
        // Numbering goes on after what was delivered, never reusing a sequence.
        assert_eq!(
            s.queue_down("dev", &recs(1), &limits).unwrap().0,
            Pushed::Queued { first: 3, count: 1 }
        );
        // A device that has more than this store knows of (9) moves the numbering past it.
        s.apply_with_down(&mut [], &[], false, &[fetch("dev", 9, 100)], &[])
            .unwrap();
        assert!(s.down_records("dev").unwrap().is_empty());
        assert_eq!(
            s.queue_down("dev", &recs(1), &limits).unwrap().0,
            Pushed::Queued {
                first: 10,
                count: 1
            }
        );
    }

    fn push_of(sender: &str, records: &[&[u8]], limits: DownLimits) -> DownPush {
        DownPush {
            sender: sender.to_string(),
            key: [0; 32],
            records: records.iter().map(|r| r.to_vec()).collect(),
            blob: None,
            limits,
        }
    }

    /// An outside tester's LISTEN with `heard` 2^63 − 1 made the flow's next number a REAL, and every later push
    /// and LISTEN of that device failed its app's whole turn; with 2^63 − 2 the next number stuck and a push gave it
    /// twice. A `heard` above [`MAX_DOWN_HEARD`] is taken as it.
    #[test]
    fn a_heard_past_the_largest_is_taken_as_the_largest_and_numbers_go_on_above_it() {
        let limits = DownLimits::default();
        for heard in [
            u64::MAX,
            i64::MAX as u64,
            i64::MAX as u64 - 1,
            MAX_DOWN_HEARD,
        ] {
            let mut s = AppStore::open_in_memory("down").unwrap();
            s.queue_down("dev", &[b"before".to_vec()], &limits).unwrap();
            let applied = s
                .apply_with_down(&mut [], &[], false, &[fetch("dev", heard, 1000)], &[])
                .unwrap();
            assert_eq!(applied.down.delivered, 1, "{heard}");
            assert!(applied.down.raised, "{heard}");
            let read = &applied.down.reads[0];
            assert_eq!((read.after, read.last), (MAX_DOWN_HEARD, 0), "{heard}");
            for k in 0..2u64 {
                let (pushed, _) = s.queue_down("dev", &[b"after".to_vec()], &limits).unwrap();
                assert_eq!(
                    pushed,
                    Pushed::Queued {
                        first: MAX_DOWN_HEARD + 1 + k,
                        count: 1
                    },
                    "{heard}"
                );
            }
            // The device's next LISTEN, saying the same, is taken at the largest again: the records above it are
            // read for it (a device that says it has them is not handed them), and nothing fails.
            let applied = s
                .apply_with_down(&mut [], &[], false, &[fetch("dev", heard, 1000)], &[])
                .unwrap();
            assert_eq!(applied.down.delivered, 0, "{heard}");
            let seqs: Vec<u64> = applied.down.reads[0]
                .records
                .iter()
                .map(|r| r.seq)
                .collect();
            assert_eq!(seqs, [MAX_DOWN_HEARD + 1, MAX_DOWN_HEARD + 2], "{heard}");
        }
    }

    #[test]
    fn a_push_in_the_turns_transaction_is_read_by_the_same_turns_listen() {
        let mut s = AppStore::open_in_memory("down").unwrap();
        let limits = DownLimits::default();
        // A push and the live session's read in one transaction: the read finds the pushed records.
        let push = push_of("dev", &[b"one", b"two"], limits);
        let commits = s.commits();
        let applied = s
            .apply_with_down(&mut [], &[], false, &[fetch("dev", 0, 1000)], &[&push])
            .unwrap();
        assert_eq!(s.commits(), commits + 1, "one transaction for both");
        assert_eq!(
            applied.down.pushes,
            vec![(Pushed::Queued { first: 1, count: 2 }, 0)]
        );
        let read = &applied.down.reads[0];
        assert_eq!((read.after, read.last), (0, 2));
        let seqs: Vec<u64> = read.records.iter().map(|r| r.seq).collect();
        assert_eq!(seqs, [1, 2]);
        assert_eq!(s.down_waiting(), 2);
        assert_eq!(s.count_down_waiting(), 2);
        // A read with room for one record says the last waiting from the store, not from what it read.
        let push = push_of("dev", &[b"three"], limits);
        let applied = s
            .apply_with_down(&mut [], &[], false, &[fetch("dev", 1, 5)], &[&push])
            .unwrap();
        assert_eq!(applied.down.delivered, 1);
        let read = &applied.down.reads[0];
        assert_eq!((read.after, read.last, read.records.len()), (1, 3, 1));
        assert_eq!(s.down_waiting(), 2);
        assert_eq!(s.count_down_waiting(), 2);
        // Refused pushes write nothing, and their outcome says why, in order.
        let over = push_of(
            "dev",
            &[b"x"],
            DownLimits {
                max_records: 2,
                ..limits
            },
        );
        let too_large = DownPush {
            records: vec![vec![0; MAX_DOWN_PAYLOAD + 1]],
            ..push_of("dev", &[], limits)
        };
        let applied = s
            .apply_with_down(&mut [], &[], false, &[], &[&over, &too_large])
            .unwrap();
        assert_eq!(
            applied.down.pushes[0].0,
            Pushed::Refused(DownRefusal::Records {
                pushing: 1,
                waiting: 2,
                max: 2
            })
        );
        assert!(matches!(
            applied.down.pushes[1].0,
            Pushed::Refused(DownRefusal::TooLarge { index: 0, .. })
        ));
        assert_eq!(s.count_down_waiting(), 2);
    }

    /// The statements of a read stay prepared from one turn to the next (research/035: the read was prepared again
    /// at every turn, a seventh of the loop's time under pushes to a live session).
    #[test]
    fn the_reads_statements_are_not_prepared_again_at_each_turn() {
        use rusqlite::StatementStatus;
        let mut s = AppStore::open_in_memory("reprepare").unwrap();
        let limits = DownLimits::default();
        // A range held for another sender, so that the reads look for ranges too.
        let blob = std::sync::Arc::new(DownBlob::new(vec![7; 100], 40).unwrap());
        s.queue_blob_down("other", &blob, &limits).unwrap();
        for i in 0..20 {
            let push = push_of("dev", &[b"a", b"b"], limits);
            // A room for one record of the two: the read fills it, so the last one is asked of the store too.
            s.apply_with_down(&mut [], &[], false, &[fetch("dev", i, 3)], &[&push])
                .unwrap();
        }
        for sql in [READ_SQL, LAST_SQL, RANGES_SQL, RANGES_LAST_SQL] {
            let st = s.conn.prepare_cached(sql).unwrap();
            assert_eq!(st.get_status(StatementStatus::Run), 20, "{sql}");
            assert_eq!(st.get_status(StatementStatus::RePrepare), 0, "{sql}");
        }
        for sql in [RANGES_HEARD_SQL, RANGES_EXPIRED_SQL] {
            let st = s.conn.prepare_cached(sql).unwrap();
            assert!(st.get_status(StatementStatus::Run) >= 19, "{sql}");
            assert_eq!(st.get_status(StatementStatus::RePrepare), 0, "{sql}");
        }
    }

    /// A store that holds no range of a file pushed as pieces runs none of the statements that look for them
    /// (research/046); once a file is queued, whether in a turn or alone, they run, also in a store opened again.
    #[test]
    fn ranges_are_looked_for_only_in_a_store_that_may_hold_them() {
        use rusqlite::StatementStatus;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("main.sqlite");
        let limits = DownLimits::default();
        let runs = |s: &AppStore| {
            [RANGES_SQL, RANGES_EXPIRED_SQL].map(|sql| {
                s.conn
                    .prepare_cached(sql)
                    .unwrap()
                    .get_status(StatementStatus::Run)
            })
        };
        let mut s = AppStore::open(&path).unwrap();
        for i in 0..3 {
            let push = push_of("dev", &[b"a"], limits);
            s.apply_with_down(&mut [], &[], false, &[fetch("dev", i, 100)], &[&push])
                .unwrap();
        }
        assert_eq!(runs(&s), [0, 0]);
        let blob = std::sync::Arc::new(DownBlob::new(vec![7; 100], 40).unwrap());
        let file = blob_push("dev", &blob, limits);
        let applied = s
            .apply_with_down(&mut [], &[], false, &[fetch("dev", 3, 1000)], &[&file])
            .unwrap();
        assert_eq!(runs(&s), [1, 1]);
        // The records were delivered (heard 3); the file's three pieces are read.
        let seqs: Vec<u64> = applied.down.reads[0]
            .records
            .iter()
            .map(|r| r.seq)
            .collect();
        assert_eq!(seqs, [4, 5, 6]);
        drop(s);
        let mut s = AppStore::open(&path).unwrap();
        s.apply_with_down(&mut [], &[], false, &[fetch("dev", 4, 1000)], &[])
            .unwrap();
        assert_eq!(runs(&s), [1, 1]);
        // And a store whose ranges were all delivered still looks (it is never cleared), which costs only that.
        s.apply_with_down(&mut [], &[], false, &[fetch("dev", 6, 1000)], &[])
            .unwrap();
        assert_eq!(runs(&s), [2, 2]);
    }

    /// A read whose heard the flow took already deletes nothing again, and one above it deletes what the device
    /// has: the heard is applied once, whichever turn carries it (research/046).
    #[test]
    fn a_heard_the_flow_took_already_deletes_nothing_and_a_new_one_does() {
        let mut s = AppStore::open_in_memory("taken").unwrap();
        let limits = DownLimits::default();
        s.queue_down(
            "dev",
            &[b"1".to_vec(), b"2".to_vec(), b"3".to_vec()],
            &limits,
        )
        .unwrap();
        let read = |s: &mut AppStore, heard: u64| {
            s.apply_with_down(&mut [], &[], false, &[fetch("dev", heard, 1000)], &[])
                .unwrap()
                .down
        };
        let first = read(&mut s, 2);
        assert_eq!(first.delivered, 2);
        assert_eq!(
            first.reads[0]
                .records
                .iter()
                .map(|r| r.seq)
                .collect::<Vec<_>>(),
            [3]
        );
        let again = read(&mut s, 2);
        assert_eq!((again.delivered, again.raised), (0, false));
        assert_eq!(
            again.reads[0]
                .records
                .iter()
                .map(|r| r.seq)
                .collect::<Vec<_>>(),
            [3]
        );
        // A push in the same turn as a read of the taken heard: numbered after what was queued.
        let push = push_of("dev", &[b"4"], limits);
        let turn = s
            .apply_with_down(&mut [], &[], false, &[fetch("dev", 2, 1000)], &[&push])
            .unwrap()
            .down;
        assert!(matches!(
            turn.pushes[0],
            (Pushed::Queued { first: 4, count: 1 }, 0)
        ));
        assert_eq!(
            turn.reads[0]
                .records
                .iter()
                .map(|r| r.seq)
                .collect::<Vec<_>>(),
            [3, 4]
        );
        let last = read(&mut s, 4);
        assert_eq!((last.delivered, last.raised), (2, false));
        assert_eq!(s.down_waiting(), 0);
        // A heard past the flow's next number is still taken as the device having more: the number is raised.
        let past = read(&mut s, 9);
        assert!(past.raised);
        let push = push_of("dev", &[b"10"], limits);
        let turn = s
            .apply_with_down(&mut [], &[], false, &[], &[&push])
            .unwrap()
            .down;
        assert!(matches!(
            turn.pushes[0],
            (
                Pushed::Queued {
                    first: 10,
                    count: 1
                },
                0
            )
        ));
    }

    #[test]
    fn a_record_expired_is_never_read_beside_a_push_that_was_refused_for_size() {
        // The size refusal looks at no record of its sender, so the read beside it must still delete the expired.
        let mut s = AppStore::open_in_memory("expiry").unwrap();
        let short = DownLimits {
            expiry_ms: Some(1),
            ..DownLimits::default()
        };
        s.queue_down("dev", &[b"old".to_vec()], &short).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(5));
        let too_large = DownPush {
            records: vec![vec![0; MAX_DOWN_PAYLOAD + 1]],
            ..push_of("dev", &[], DownLimits::default())
        };
        let applied = s
            .apply_with_down(&mut [], &[], false, &[fetch("dev", 0, 1000)], &[&too_large])
            .unwrap();
        assert!(applied.down.reads[0].records.is_empty());
        assert_eq!(applied.down.expired, 1);
        // A push that was taken swept its sender: the read beside it finds no expired record left to send.
        s.queue_down("dev", &[b"old".to_vec()], &short).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(5));
        let push = push_of("dev", &[b"new"], DownLimits::default());
        let applied = s
            .apply_with_down(&mut [], &[], false, &[fetch("dev", 0, 1000)], &[&push])
            .unwrap();
        assert_eq!(
            applied.down.pushes[0].1, 1,
            "the push deleted the expired record"
        );
        let payloads: Vec<&[u8]> = applied.down.reads[0]
            .records
            .iter()
            .map(|r| r.payload.as_slice())
            .collect();
        assert_eq!(payloads, [b"new".as_slice()]);
        assert_eq!(s.count_down_waiting(), 1);
        assert_eq!(s.down_waiting(), 1);
    }

    #[test]
    fn the_waiting_count_is_kept_with_the_records_and_read_back_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("main.sqlite");
        let limits = DownLimits {
            max_records: 2,
            ..DownLimits::default()
        };
        {
            let mut s = AppStore::open(&path).unwrap();
            s.queue_down("a", &[b"1".to_vec(), b"2".to_vec()], &limits)
                .unwrap();
            s.queue_down("b", &[b"3".to_vec()], &limits).unwrap();
            // Refused: nothing counted.
            s.queue_down("b", &[b"4".to_vec(), b"5".to_vec()], &limits)
                .unwrap();
            s.apply_with_down(&mut [], &[], false, &[fetch("a", 1, 100)], &[])
                .unwrap();
            assert_eq!(s.down_waiting(), 2);
            assert_eq!(s.count_down_waiting(), 2);
        }
        let s = AppStore::open(&path).unwrap();
        assert_eq!(s.down_waiting(), 2);
        // A store whose count was not kept (made before it was) is counted once at open.
        s.conn.execute("DELETE FROM down_count", []).unwrap();
        drop(s);
        let s = AppStore::open(&path).unwrap();
        assert_eq!(s.down_waiting(), 2);
        let kept: i64 = s
            .conn
            .query_row("SELECT waiting FROM down_count", [], |r| r.get(0))
            .unwrap();
        assert_eq!(kept, 2);
    }

    #[test]
    fn expired_records_are_deleted_unsent_and_counted() {
        let mut s = AppStore::open_in_memory("expiry").unwrap();
        let limits = DownLimits {
            expiry_ms: Some(1),
            ..DownLimits::default()
        };
        s.queue_down("dev", &[b"old".to_vec()], &limits).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(5));
        let applied = s
            .apply_with_down(&mut [], &[], false, &[fetch("dev", 0, 1000)], &[])
            .unwrap();
        assert_eq!(applied.down.expired, 1);
        assert_eq!(applied.down.reads[0].records, vec![]);
        assert_eq!(applied.down.reads[0].last, 0, "nothing waits");
        assert_eq!(s.down_waiting(), 0);
        // Expired records do not hold a pusher's room either.
        s.queue_down("dev", &[b"old".to_vec()], &limits).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(5));
        let (pushed, expired) = s
            .queue_down("dev", &[b"new".to_vec()], &DownLimits::default())
            .unwrap();
        assert_eq!(expired, 1);
        assert_eq!(pushed, Pushed::Queued { first: 3, count: 1 });
    }

    fn blob_push(sender: &str, blob: &std::sync::Arc<DownBlob>, limits: DownLimits) -> DownPush {
        DownPush {
            sender: sender.to_string(),
            key: [0; 32],
            records: Vec::new(),
            blob: Some(blob.clone()),
            limits,
        }
    }

    /// The blobs stored: (id, refs, bytes); a blob's bytes are stored exactly while its row is.
    fn blob_rows(s: &AppStore) -> Vec<(i64, i64, i64)> {
        let count = |table: &str| {
            s.conn
                .query_row(&format!("SELECT COUNT(*) FROM {table}"), [], |r| {
                    r.get::<_, i64>(0)
                })
                .unwrap()
        };
        assert_eq!(count("down_blobs"), count("down_blob_bytes"));
        let mut q = s
            .conn
            .prepare(
                "SELECT b.id, b.refs, LENGTH(y.bytes) FROM down_blobs b JOIN down_blob_bytes y ON y.id = b.id
                 ORDER BY b.id",
            )
            .unwrap();
        q.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }

    fn file(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    /// A file pushed to three senders is one blob row referenced three times; each sender's pieces are read in
    /// order among its records, a partial delivery moves its range up with the waiting count exact, and the blob
    /// goes with the last range delivered.
    #[test]
    fn a_blob_pushed_to_many_is_stored_once_read_in_order_and_deleted_with_its_last_range() {
        let mut s = AppStore::open_in_memory("blob").unwrap();
        let limits = DownLimits::default();
        let bytes = file(2500);
        let blob = std::sync::Arc::new(DownBlob::new(bytes.clone(), 1024).unwrap());
        assert_eq!(blob.pieces(), 3);
        s.queue_down("a", &[b"before".to_vec()], &limits).unwrap();
        let pushes: Vec<DownPush> = ["a", "b", "c"]
            .iter()
            .map(|n| blob_push(n, &blob, limits))
            .collect();
        let refs: Vec<&DownPush> = pushes.iter().collect();
        let applied = s.apply_with_down(&mut [], &[], false, &[], &refs).unwrap();
        assert_eq!(
            applied.down.pushes[0].0,
            Pushed::Queued { first: 2, count: 3 }
        );
        assert_eq!(
            applied.down.pushes[1].0,
            Pushed::Queued { first: 1, count: 3 }
        );
        assert_eq!(blob_rows(&s).len(), 1, "stored once");
        assert_eq!(blob_rows(&s)[0].1, 3, "referenced three times");
        assert_eq!(blob_rows(&s)[0].2, 2500);
        assert_eq!(s.down_waiting(), 10);
        assert_eq!(s.count_down_waiting(), 10);
        // The record and the first piece fit a room of 1100; the next piece waits, and `last` says so.
        let applied = s
            .apply_with_down(&mut [], &[], false, &[fetch("a", 0, 1100)], &[])
            .unwrap();
        let read = &applied.down.reads[0];
        assert_eq!((read.after, read.last), (0, 4));
        assert_eq!(read.records.len(), 2);
        assert_eq!(read.records[0].payload, b"before");
        assert_eq!(read.records[1].seq, 2);
        assert_eq!(read.records[1].payload, bytes[..1024]);
        // The device has 1 and 2: the range is moved up to its third sequence, at its second piece.
        let applied = s
            .apply_with_down(&mut [], &[], false, &[fetch("a", 2, 5000)], &[])
            .unwrap();
        assert_eq!(applied.down.delivered, 2);
        let read = &applied.down.reads[0];
        let got: Vec<(u64, &[u8])> = read
            .records
            .iter()
            .map(|r| (r.seq, r.payload.as_slice()))
            .collect();
        assert_eq!(got, [(3, &bytes[1024..2048]), (4, &bytes[2048..])]);
        assert_eq!(read.last, 4);
        assert_eq!(s.down_waiting(), 8);
        assert_eq!(s.count_down_waiting(), 8);
        assert_eq!(
            s.waiting_by_sender(0).unwrap(),
            [("a".into(), 2), ("b".into(), 3), ("c".into(), 3)]
        );
        // Pieces count against the bounds as records: a sender with its three waiting takes no more than max.
        let tight = DownLimits {
            max_records: 4,
            ..limits
        };
        assert_eq!(
            s.queue_down("b", &[b"x".to_vec(), b"y".to_vec()], &tight)
                .unwrap()
                .0,
            Pushed::Refused(DownRefusal::Records {
                pushing: 2,
                waiting: 3,
                max: 4
            })
        );
        let mut reassembled = Vec::new();
        for r in s.down_records("b").unwrap() {
            reassembled.extend_from_slice(&r.payload);
        }
        assert_eq!(reassembled, bytes);
        for (dev, heard) in [("a", 4), ("b", 3)] {
            s.apply_with_down(&mut [], &[], false, &[fetch(dev, heard, 5000)], &[])
                .unwrap();
        }
        assert_eq!(blob_rows(&s)[0].1, 1, "one device still waits for it");
        s.apply_with_down(&mut [], &[], false, &[fetch("c", 3, 5000)], &[])
            .unwrap();
        assert!(blob_rows(&s).is_empty(), "deleted with its last range");
        assert_eq!(s.down_waiting(), 0);
        assert_eq!(s.count_down_waiting(), 0);
        // Numbering goes on after the range.
        assert_eq!(
            s.queue_down("a", &[b"after".to_vec()], &limits).unwrap().0,
            Pushed::Queued { first: 5, count: 1 }
        );
    }

    /// One push's senders applied in several transactions (a request's batches, each a turn) store its blob once;
    /// once every range of it is gone, the same push writes it again rather than name a deleted row.
    #[test]
    fn a_blob_is_stored_once_across_transactions_and_written_again_once_deleted() {
        let mut s = AppStore::open_in_memory("blob").unwrap();
        let limits = DownLimits::default();
        let blob = std::sync::Arc::new(DownBlob::new(file(100), 40).unwrap());
        for dev in ["a", "b"] {
            let p = blob_push(dev, &blob, limits);
            s.apply_with_down(&mut [], &[], false, &[], &[&p]).unwrap();
        }
        assert_eq!(blob_rows(&s).len(), 1);
        assert_eq!(blob_rows(&s)[0].1, 2);
        let first_id = blob_rows(&s)[0].0;
        s.apply_with_down(
            &mut [],
            &[],
            false,
            &[fetch("a", 3, 5000), fetch("b", 3, 5000)],
            &[],
        )
        .unwrap();
        assert!(blob_rows(&s).is_empty());
        let p = blob_push("c", &blob, limits);
        let applied = s.apply_with_down(&mut [], &[], false, &[], &[&p]).unwrap();
        assert_eq!(
            applied.down.pushes[0].0,
            Pushed::Queued { first: 1, count: 3 }
        );
        let rows = blob_rows(&s);
        assert_eq!(rows.len(), 1);
        assert!(rows[0].0 > first_id, "ids are never given twice");
        assert_eq!(s.down_records("c").unwrap().concat_payloads(), file(100));
    }

    trait Concat {
        fn concat_payloads(&self) -> Vec<u8>;
    }

    impl Concat for Vec<DownRecord> {
        fn concat_payloads(&self) -> Vec<u8> {
            self.iter()
                .flat_map(|r| r.payload.iter().copied())
                .collect()
        }
    }

    /// A blob's pieces are refused whole by either bound, and a push refused for every sender stores nothing.
    #[test]
    fn a_blob_past_a_bound_is_refused_whole_and_stores_nothing() {
        let mut s = AppStore::open_in_memory("blob").unwrap();
        let blob = std::sync::Arc::new(DownBlob::new(file(3000), 1000).unwrap());
        let few = DownLimits {
            max_records: 2,
            ..DownLimits::default()
        };
        let small = DownLimits {
            max_bytes: 2999,
            ..DownLimits::default()
        };
        let (p, q) = (blob_push("a", &blob, few), blob_push("b", &blob, small));
        let applied = s
            .apply_with_down(&mut [], &[], false, &[], &[&p, &q])
            .unwrap();
        assert_eq!(
            applied.down.pushes[0].0,
            Pushed::Refused(DownRefusal::Records {
                pushing: 3,
                waiting: 0,
                max: 2
            })
        );
        assert_eq!(
            applied.down.pushes[1].0,
            Pushed::Refused(DownRefusal::Bytes {
                pushing: 3000,
                waiting: 0,
                max: 2999
            })
        );
        assert!(blob_rows(&s).is_empty());
        assert_eq!(s.count_down_waiting(), 0);
        assert_eq!(blob.stored(), None);
        // The waiting bytes of a range moved up are its pieces' bytes only.
        let exact = DownLimits {
            max_bytes: 3000 + 1000,
            ..DownLimits::default()
        };
        let p = blob_push("a", &blob, exact);
        s.apply_with_down(&mut [], &[], false, &[fetch("a", 2, 0)], &[&p])
            .unwrap();
        let p2 = std::sync::Arc::new(DownBlob::new(file(3000), 1000).unwrap());
        let applied = s
            .apply_with_down(&mut [], &[], false, &[], &[&blob_push("a", &p2, exact)])
            .unwrap();
        assert_eq!(
            applied.down.pushes[0].0,
            Pushed::Queued { first: 4, count: 3 }
        );
        assert_eq!(blob_rows(&s).len(), 2);
    }

    #[test]
    fn an_expired_blob_range_is_deleted_unsent_and_its_blob_with_it() {
        let mut s = AppStore::open_in_memory("blob").unwrap();
        let short = DownLimits {
            expiry_ms: Some(1),
            ..DownLimits::default()
        };
        let blob = std::sync::Arc::new(DownBlob::new(file(300), 100).unwrap());
        s.queue_blob_down("a", &blob, &short).unwrap();
        s.queue_blob_down("b", &blob, &DownLimits::default())
            .unwrap();
        assert_eq!(blob_rows(&s).len(), 1);
        std::thread::sleep(std::time::Duration::from_millis(5));
        let applied = s
            .apply_with_down(&mut [], &[], false, &[fetch("a", 0, 5000)], &[])
            .unwrap();
        assert_eq!(applied.down.expired, 3);
        assert!(applied.down.reads[0].records.is_empty());
        assert_eq!(blob_rows(&s)[0].1, 1, "b still waits for it");
        assert_eq!(s.down_waiting(), 3);
        s.queue_blob_down("b", &blob, &short).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(5));
        // b's own range never expires; the second does, when b is next pushed to.
        let (_, expired) = s
            .queue_down("b", &[b"x".to_vec()], &DownLimits::default())
            .unwrap();
        assert_eq!(expired, 3);
        s.apply_with_down(&mut [], &[], false, &[fetch("b", 3, 5000)], &[])
            .unwrap();
        assert!(blob_rows(&s).is_empty(), "deleted with its last range");
        assert_eq!(s.count_down_waiting(), 1);
        assert_eq!(s.down_waiting(), 1);
    }

    #[test]
    fn a_file_that_cannot_be_pieces_is_refused_with_why() {
        assert!(matches!(
            DownBlob::new(Vec::new(), 10),
            Err(BlobError::Empty)
        ));
        assert!(matches!(
            DownBlob::new(vec![1], MAX_DOWN_PAYLOAD + 1),
            Err(BlobError::PieceSize(1025))
        ));
        assert!(matches!(
            DownBlob::new(vec![1], 0),
            Err(BlobError::PieceSize(0))
        ));
        assert!(matches!(
            DownBlob::new(vec![0; MAX_BLOB + 1], 1024),
            Err(BlobError::TooLarge { .. })
        ));
        assert_eq!(DownBlob::new(vec![0; 2049], 1024).unwrap().pieces(), 3);
        assert_eq!(pieces_bytes(2049, 1024, 1, 2), 1025);
    }

    /// A 1 MB file pushed to 1,000 senders leaves the store's file about one copy of it, plus a row per sender
    /// (a copy per sender would be a gigabyte).
    #[test]
    fn a_megabyte_pushed_to_a_thousand_senders_is_stored_once_on_disk() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("main.sqlite");
        let mut s = AppStore::open(&path).unwrap();
        let size = 1_000_000;
        let blob = std::sync::Arc::new(DownBlob::new(file(size), 1024).unwrap());
        let names: Vec<String> = (0..1000).map(|k| format!("device-{k:04}")).collect();
        // In batches of 250 senders, each a transaction of its own, as a request's batches are turns of their own.
        for batch in names.chunks(250) {
            let pushes: Vec<DownPush> = batch
                .iter()
                .map(|n| blob_push(n, &blob, DownLimits::default()))
                .collect();
            let refs: Vec<&DownPush> = pushes.iter().collect();
            let applied = s.apply_with_down(&mut [], &[], false, &[], &refs).unwrap();
            assert!(applied.down.pushes.iter().all(|(p, _)| *p
                == Pushed::Queued {
                    first: 1,
                    count: 977
                }));
        }
        assert_eq!(blob_rows(&s).len(), 1);
        assert_eq!(blob_rows(&s)[0].1, 1000);
        assert_eq!(s.down_waiting(), 977_000);
        s.checkpoint().unwrap();
        drop(s);
        let on_disk = std::fs::metadata(&path).unwrap().len();
        let bound = size as u64 + size as u64 / 5 + 1000 * 200;
        assert!(
            on_disk < bound,
            "the store is {on_disk} bytes for a file of {size} pushed to 1,000 senders (bound {bound})"
        );
    }
}
