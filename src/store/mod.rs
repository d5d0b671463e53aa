//! The stores: one SQLite file per app holding its records and heard sequences, and the memo of derived secrets.
//!
//! Layout (docs/store.md has the why): records are kept as **chunks** — one row per run of consecutive records of
//! one source applied in one turn, the records in their wire encoding — because a row per record cannot reach a
//! million records per second (research/001). A source's heard sequence sits in its row of `sources` and is
//! updated in the same transaction as the chunk it covers, so a failed commit rolls both back and a record is
//! stored exactly once.

pub mod check;
pub mod disk;
pub mod downlink;
pub mod engine;
pub mod json;
pub mod lease;
pub mod memo;
pub mod postgres;
pub mod sqlite_engine;
pub mod state;
pub mod sync;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use rusqlite::{Connection, OptionalExtension, params};
use thiserror::Error;

use crate::proto::allow_list::AllowList;
use crate::proto::turn::{AppIndex, Committed, FlowHeard, Turn};
use crate::proto::wire::{Forwarded, RecordFormat, RecordIter};

#[derive(Debug, Error)]
pub enum StoreError {
    #[error("store {path}: {source}")]
    Sqlite {
        path: PathBuf,
        source: rusqlite::Error,
    },
    #[error("cannot create {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "cannot sync {path} to disk: {source}; nothing written to it since its last sync is acknowledged. The disk \
         under it failed to write (the kernel log, `dmesg`, says why), and a disk that lost one write may report \
         later ones done: no store on it is used again until the node is restarted. Check the disk (fsck; replace \
         a failing card), then restart the node: each store on it is checked whole before it is served"
    )]
    Sync {
        path: PathBuf,
        source: Arc<std::io::Error>,
    },
    #[error(
        "cannot copy the commits of {path}-wal into {path} (a checkpoint): {source}; nothing more is acknowledged \
         for its app. {}",
        if source.sqlite_error_code() == Some(rusqlite::ErrorCode::DiskFull) {
            "Its disk is full: free some space there and the app stores again, without a restart"
        } else if source.sqlite_error().is_some_and(|e| e.extended_code == rusqlite::ffi::SQLITE_IOERR_WRITE) {
            "The write was refused (a file made read-only or immutable? the kernel log, `dmesg`, may say why): the \
             app stores again once it can, without a restart"
        } else {
            "The disk under it failed to write (the kernel log, `dmesg`, says why), and a disk that lost one write \
             may report later ones done: no store on it is used again until the node is restarted. Check the disk \
             (fsck; replace a failing card), then restart the node: each store on it is checked whole before it is \
             served"
        }
    )]
    Checkpoint {
        path: PathBuf,
        source: Arc<rusqlite::Error>,
    },
    #[error(
        "the disk under {path} lost what a checkpoint wrote: page {page} reads back as {what} after its sync reported \
         it written. Nothing more is acknowledged for its app (every record it acknowledged is still in its -wal). \
         A disk that loses writes it reported done cannot be trusted: no store on it is used again until the node \
         is restarted. Check the disk (`dmesg`, fsck; replace a failing card), then restart the node: each store on \
         it is checked whole before it is served"
    )]
    LostWrite {
        path: PathBuf,
        page: u32,
        what: String,
    },
    #[error(
        "the filesystem under {path} is read-only now (the kernel makes it so after a disk error: `dmesg` says \
         which); nothing more is acknowledged for its app. Check the disk (fsck, or replace a failing card) and \
         restart the node"
    )]
    ReadOnly { path: PathBuf },
    #[error(
        "store {path} cannot be written by the node's user (uid {uid}): give that user the file and its directory \
         (`chown`) or write permission on them (`chmod u+w`); the app stores again without a restart"
    )]
    NotWritable { path: PathBuf, uid: u32 },
    #[error(
        "cannot read store {path} where it is: its directory may not be written (SQLite keeps there the -shm it \
         reads a store through), and its -wal holds records not yet in the file: copy the store with its -wal to a \
         directory this user may write, and read it there"
    )]
    UnreadableHere { path: PathBuf },
    #[error(
        "a write or sync of {path} failed earlier; it is not trusted again until it is reopened"
    )]
    FailedEarlier { path: PathBuf },
    #[error(
        "the disk under its store failed a write for app {app} (its error says which); nothing stored on that disk \
         is acknowledged until the node is restarted and each store on it checked whole"
    )]
    SameDisk { app: String },
    #[error(
        "store {path} was reopened after a disk fault and holds records up to position {found}, but the node had \
         acknowledged or forwarded records up to position {acked}: the disk lost {} records it had reported \
         written. Nothing more is acknowledged for its app; restore the store from a backup and restart the node \
         (or restart with --accept-lost-state to go on without them)",
        acked - found
    )]
    Lost {
        path: PathBuf,
        acked: u64,
        found: u64,
    },
    #[error(
        "cannot check store {path} after a disk fault: another process has it open (a `pure-serve records`?); \
         its app stores again once that process has closed it and the check finds every acknowledged record"
    )]
    CheckBusy { path: PathBuf },
    #[error(
        "store {path} is damaged: {}{}. Its app is not served from it. The way back: put the file back from a \
         backup, or from what the app's outlets forwarded (their far sides hold a copy of every record they \
         acknowledged: `pure-serve records` there), and restart the node; or start the node once with \
         --accept-lost-state, which moves the damaged files aside (to {path}.damaged-TIME, -wal and -shm beside it) \
         and starts the app with an empty store, whose senders then number their flows afresh",
        problems.join("; "),
        if lost.is_empty() { String::new() } else { format!(". Known to be lost: {lost}") }
    )]
    Damaged {
        path: PathBuf,
        problems: Vec<String>,
        /// What the store's own tables say it had and no longer holds (heard sequences above its chunks).
        lost: String,
    },
    #[error("{why}")]
    NotAgain { path: PathBuf, why: String },
    #[error(
        "store {path} is being checked whole before its app is served ({why}): {read_mib} of {total_mib} MiB read \
         so far"
    )]
    Checking {
        path: PathBuf,
        why: &'static str,
        read_mib: u64,
        total_mib: u64,
    },
    #[error("cannot start the thread that syncs the stores (pure-sync): {source}")]
    SyncThread { source: std::io::Error },
    #[error("cannot open {path} to sync it: {source}")]
    OpenWal {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("store {path} holds a malformed chunk for source {source_name} at sequence {seq}")]
    Corrupt {
        path: PathBuf,
        source_name: String,
        seq: u64,
    },
    #[error(
        "store {path} has layout {found}, this pure-serve knows layouts up to {known}: it was written by a newer \
         pure-serve; run that one, or move the file away to start this app afresh"
    )]
    Layout {
        path: PathBuf,
        found: i64,
        known: i64,
    },
    #[error(
        "store {path}: {free} bytes are free on its filesystem, {wanted} are wanted (for its wal-index and a \
         commit); free some space there and the app stores again, without a restart"
    )]
    NoRoom {
        path: PathBuf,
        free: u64,
        wanted: u64,
    },
    #[error(
        "store {path}: cannot allocate its wal-index {}: {source}; free some space on its filesystem",
        disk::shm_path(path).display()
    )]
    Shm {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{what}: nothing more is acknowledged for its app, and the records acknowledged into it are gone unless \
         the file is restored; restart the node once it is back (or with --accept-lost-state to start the app \
         with an empty store)"
    )]
    Gone { path: PathBuf, what: String },
    #[error(
        "the store of app #{app} is closed (it failed earlier, and is tried again with backoff): nothing is stored \
         or acknowledged for it until it is open"
    )]
    Closed { app: AppIndex },
    #[error(
        "the fleet's database {url}, {doing}: {source}; nothing of the turn in hand is acknowledged (its senders \
         send again) and the node connects again"
    )]
    Database {
        url: String,
        doing: &'static str,
        source: tokio_postgres::Error,
    },
    #[error(
        "the fleet's database {url} cannot be reached ({why}; a try to connect starts every 0.25 s): nothing is \
         acknowledged until it can be"
    )]
    DatabaseDown { url: String, why: String },
    /// A read of the fleet's database by a tool (`records`), which has no turn to lose.
    #[error(
        "the fleet's database {url}, {doing}: {source} (check --store: its host, port, database and user, and that \
         the database runs)"
    )]
    DatabaseRead {
        url: String,
        doing: &'static str,
        source: tokio_postgres::Error,
    },
    /// A wait on the fleet's database that got no answer a PostgreSQL server would give in time: nothing there
    /// answers, or what answers is not PostgreSQL.
    #[error(
        "the fleet's database {url}, {doing}: no answer as PostgreSQL within {} s (check --store: is it the address \
         of a PostgreSQL server that runs, and does the network reach it?)",
        within.as_secs()
    )]
    DatabaseSilent {
        url: String,
        doing: &'static str,
        within: std::time::Duration,
    },
    /// The fleet's database left the turn in hand without an outcome for this long (said by the host, which does
    /// not wait for the network's own timeouts to notice a database cut off: src/apps/host/shared.rs).
    #[error(
        "the fleet's database has answered nothing for {} ms while a turn waits for its outcome: taken as out of \
         reach until it answers (the records of the turns in hand are acknowledged only if their outcome comes back \
         stored)",
        waited.as_millis()
    )]
    DatabaseLate { waited: std::time::Duration },
    #[error("the fleet's database {url} is refused: {why}")]
    DatabaseRefused { url: String, why: String },
    /// What about the fleet's database its operator must change: a login refused, a database that is not there, no
    /// right to make the tables, tables of a newer layout, `synchronous_commit` off, a URL it cannot take. Trying
    /// again cannot help ([`StoreError::is_configuration`]).
    #[error("the fleet's database {url}, {doing}: {what}: {}", fault.fix())]
    DatabaseMisconfigured {
        url: String,
        doing: &'static str,
        fault: postgres::DatabaseFault,
        /// What the database (or the client) said, in its words.
        what: String,
    },
    #[error("the thread of the fleet's database {url} (pure-store) has stopped: restart the node")]
    StoreThreadGone { url: String },
    #[error("no store for app {app} in {dir} (stores there: {known})")]
    NoSuchApp {
        app: String,
        dir: PathBuf,
        known: String,
    },
    #[error(
        "no app {app} in the fleet's database {url} (apps there: {}): name one of them, or start a node whose apps \
         file has it",
        if known.is_empty() { "none yet" } else { known.as_str() }
    )]
    NoSuchDatabaseApp {
        app: String,
        url: String,
        known: String,
    },
}

/// Sequences are SQLite integers (signed 64-bit); above this a flow can go no further.
const MAX_SEQ: u64 = i64::MAX as u64;

/// The layout's version in `PRAGMA user_version` (docs/store.md).
pub const LAYOUT_VERSION: i64 = 2;

/// Prepared statements a store keeps: more than all the distinct statements its turns, downlink and checkpoints run.
const STATEMENTS_KEPT: usize = 64;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS sources (
    id    INTEGER PRIMARY KEY,
    name  TEXT NOT NULL UNIQUE,
    heard INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS chunks (
    source    INTEGER NOT NULL REFERENCES sources(id),
    first_seq INTEGER NOT NULL,
    count     INTEGER NOT NULL,
    body      BLOB NOT NULL,
    pos       INTEGER,
    stored_at INTEGER NOT NULL DEFAULT 0,
    format    INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (source, first_seq)
);
CREATE UNIQUE INDEX IF NOT EXISTS chunks_pos ON chunks(pos);
CREATE TABLE IF NOT EXISTS outlets (
    name  TEXT PRIMARY KEY,
    acked INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS outlet_starts (
    name   TEXT PRIMARY KEY,
    kind   TEXT NOT NULL,
    target TEXT NOT NULL,
    flow   TEXT,
    start  INTEGER NOT NULL
);
PRAGMA user_version = 2;
";

/// The table of outlets' starts (docs/store.md), added to layout 2 without a new version: a store of an older node
/// gets it at its first open by this one, with the row [`LEGACY_OUTLETS`] saying that its outlets were applied
/// before starts were kept (so they start from the first record, as they always did).
const OUTLET_STARTS: &str = "
CREATE TABLE outlet_starts (name TEXT PRIMARY KEY, kind TEXT NOT NULL, target TEXT NOT NULL, flow TEXT,
                            start INTEGER NOT NULL);
INSERT INTO outlet_starts VALUES ('', '', '', NULL, 1);
";

/// The name of the row of a store whose outlets were applied by a node that kept no starts.
const LEGACY_OUTLETS: &str = "";

/// The start of a link's or wire's far flow that no outlet sends to now is kept under this prefix and the flow
/// (docs/store.md): outlets' names are `[a-z0-9_-]`, so none can have it.
pub const FAR_FLOW_KEPT: &str = "(far flow) ";

/// Where an outlet started, as the store keeps it: its name, kind and target ([`crate::apps::config::OutletKind::target`]),
/// the far flow of a link or wire, and the first position it sends (docs/apps.md, `from`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutletStart {
    pub name: String,
    pub kind: String,
    pub target: String,
    pub flow: Option<String>,
    pub start: u64,
}

/// Layout 1 → 2: positions (the app's log order) for every chunk in the order they were written (rowid), the
/// commit time unknown (0), every record plain; and the outlets table. One transaction: all or nothing.
const MIGRATE_1_TO_2: &str = "
BEGIN;
ALTER TABLE chunks ADD COLUMN pos INTEGER;
ALTER TABLE chunks ADD COLUMN stored_at INTEGER NOT NULL DEFAULT 0;
ALTER TABLE chunks ADD COLUMN format INTEGER NOT NULL DEFAULT 0;
WITH ordered AS (
    SELECT rowid AS r, SUM(count) OVER (ORDER BY rowid) - count + 1 AS p FROM chunks
)
UPDATE chunks SET pos = (SELECT p FROM ordered WHERE ordered.r = chunks.rowid);
CREATE UNIQUE INDEX chunks_pos ON chunks(pos);
CREATE TABLE outlets (name TEXT PRIMARY KEY, acked INTEGER NOT NULL);
PRAGMA user_version = 2;
COMMIT;
";

/// `path` with the symbolic links it is (not its directories) followed, up to 8 deep; a link to a file not yet made
/// gives the path the file will have.
fn follow_links(path: &Path) -> PathBuf {
    let mut p = path.to_path_buf();
    for _ in 0..8 {
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() => match std::fs::read_link(&p) {
                Ok(target) if target.is_absolute() => p = target,
                Ok(target) => p = p.parent().map_or(target.clone(), |d| d.join(&target)),
                Err(_) => break,
            },
            _ => break,
        }
    }
    p
}

/// File descriptors one open app store holds, for the node's descriptor budget (`ops::fds`): past the process's
/// limit every open fails, and SQLite says so per store as "unable to open database file" (issue 14, item 3).
///
/// - SQLite's connection: the database, its `-wal` and its `-shm` (3);
/// - kept by the store for its life ([`sync::StoreFiles`], `disk::FileGuard`): the `-wal` that `pure-sync` syncs,
///   the database file synced after each checkpoint, and the `-shm` it keeps allocated (closing it would drop
///   SQLite's POSIX locks) (3);
/// - one to spare: a store being checked after a fault opens a reader of its own for a moment, after the old
///   descriptors are closed, and dropping a file's page cache opens it once more for a moment.
///
/// `tests/ops_fds.rs` measures a running node: what each app adds stays within this.
pub const FDS_PER_STORE: u64 = 7;

/// Path of an app's store under the state directory.
pub fn app_store_path(state_dir: &Path, app: &str) -> PathBuf {
    state_dir.join("apps").join(format!("{app}.sqlite"))
}

/// One app's store.
pub struct AppStore {
    conn: Connection,
    path: PathBuf,
    /// The files opened, to notice a store deleted or replaced under the node, and the `-shm` allocated ahead
    /// (`None` for stores in memory and readers).
    guard: Option<disk::FileGuard>,
    /// The descriptors the store is synced and checkpointed through, opened with the store (once its `-wal`
    /// exists) and kept, for [`sync::Syncer`] (its module doc says why). `None` for stores in memory and readers.
    files: Option<Arc<sync::StoreFiles>>,
    /// Frames in the `-wal` after the last commit (SQLite's WAL hook sets it).
    wal_frames: Arc<AtomicU32>,
    /// `wal_frames` after the last checkpoint.
    frames_at_checkpoint: u32,
    /// The position the next stored record gets: records `1 .. head` are stored (docs/store.md, positions).
    head: u64,
    /// Downlink records waiting in the store, all senders (docs/store.md, "Downlink"); 0 for readers.
    down_waiting: u64,
    /// Whether the store may hold ranges of a file pushed as pieces (`down_ranges`): false while it holds none,
    /// so that a push or a read of records alone skips the statements that look for them (research/046: a push's
    /// turn ran fifteen statements where a record's runs three). Read at open; set by a turn that queues a file,
    /// and never cleared (one rolled back leaves it set, which costs only those statements).
    down_ranges: bool,
    /// Transactions of this connection that committed: a caller that got an error tells by it whether the error
    /// came before the commit (nothing of it happened) or after (it is in the `-wal`, not yet known durable).
    commits: u64,
}

/// A store checkpoints after a commit once this many frames were added to its `-wal` since its last checkpoint
/// (SQLite's own automatic checkpoint uses the same figure: about 4 MiB of WAL with 4 KiB pages).
pub const CHECKPOINT_FRAMES: u32 = 1000;

/// Makes `conn` never checkpoint by itself: not when a commit grows the WAL (SQLite ignores the errors of those
/// checkpoints) and not when it closes (a checkpoint that wrongly thinks it succeeded would delete the `-wal`). The
/// store checkpoints itself, and checks ([`AppStore::checkpoint`], store/sync.rs).
pub(crate) fn no_checkpoints_behind_our_back(conn: &Connection) -> rusqlite::Result<()> {
    conn.pragma_update(None, "wal_autocheckpoint", 0)?;
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
        true,
    )?;
    Ok(())
}

/// One stored record, as read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredRecord {
    pub source: String,
    pub seq: u64,
    pub payload: Vec<u8>,
}

/// One stored record with everything the store knows of it, borrowed from the row being read.
#[derive(Debug, Clone, Copy)]
pub struct RecordView<'a> {
    /// The flow it came in on: a sender's name, or `app/NAME` for an inner inlet.
    pub source: &'a str,
    pub seq: u64,
    /// Its place in the app's log (1, 2, 3, … in commit order, over all sources).
    pub pos: u64,
    /// When its turn committed, milliseconds since the Unix epoch (0: stored before layout 2 kept it).
    pub stored_at_ms: i64,
    /// For a forwarded record: where it first entered a node, and its sequence there.
    pub origin: Option<(&'a str, u64)>,
    pub payload: &'a [u8],
}

/// Records of one source, consecutive in sequence and in position, as one stored chunk (or the tail of one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    pub pos: u64,
    pub source: String,
    pub first_seq: u64,
    pub count: u64,
    pub format: RecordFormat,
    pub stored_at_ms: i64,
    /// `count` records in their wire encoding (forwarded records when `format` is `Forwarded`).
    pub body: Vec<u8>,
}

impl Chunk {
    pub fn records(&self) -> RecordIter<'_> {
        RecordIter::new(&self.body)
    }

    /// The chunk's first records whose bytes add up to at most `max_bytes`, as a chunk of their own: what an
    /// outlet with that much room may take of it. `None` if not even the first record fits.
    pub fn prefix_within(&self, max_bytes: usize) -> Option<Chunk> {
        let mut it = self.records();
        let (mut count, mut end) = (0u64, 0usize);
        while it.next().is_some() {
            if it.position() > max_bytes {
                break;
            }
            count += 1;
            end = it.position();
        }
        (count > 0).then(|| Chunk {
            pos: self.pos,
            source: self.source.clone(),
            first_seq: self.first_seq,
            count,
            format: self.format,
            stored_at_ms: self.stored_at_ms,
            body: self.body[..end].to_vec(),
        })
    }

    /// The chunk's records as views, from position `from` on (a record that does not parse ends the walk).
    pub fn views(&self, from: u64) -> impl Iterator<Item = RecordView<'_>> {
        let forwarded = self.format == RecordFormat::Forwarded;
        (0u64..)
            .zip(self.records())
            .skip(from.saturating_sub(self.pos) as usize)
            .map_while(move |(k, record)| {
                let (origin, payload) = if forwarded {
                    let f = Forwarded::parse(record).ok()?;
                    (
                        Some((std::str::from_utf8(f.origin).ok()?, f.origin_seq)),
                        f.payload,
                    )
                } else {
                    (None, record)
                };
                Some(RecordView {
                    source: &self.source,
                    seq: self.first_seq + k,
                    pos: self.pos + k,
                    stored_at_ms: self.stored_at_ms,
                    origin,
                    payload,
                })
            })
    }
}

/// Records of one flow to apply, in their wire encoding: a DATA or FORWARD frame's, or an inner outlet's.
#[derive(Debug, Clone, Copy)]
pub struct Piece<'a> {
    pub source: &'a str,
    pub first_seq: u64,
    pub count: u64,
    pub format: RecordFormat,
    pub records: &'a [u8],
}

/// What one app's transaction did.
#[derive(Debug, Default, Clone)]
pub struct Applied {
    /// Heard sequence after the commit of every source the pieces named, in the pieces' sorted order.
    pub heard: Vec<(String, u64)>,
    pub stored: u64,
    pub duplicate: u64,
    pub gap: u64,
    /// The chunks this commit wrote, in position order (only when asked for: an app with outlets feeds them from
    /// here without reading the store back).
    pub new_chunks: Vec<Chunk>,
    /// What the transaction's downlink fetches deleted and read (docs/protocol.md 12.3).
    pub down: downlink::DownApplied,
    /// The app's next position after the commit, where the engine says it without a read of its own (0: not
    /// said; the SQLite store's [`AppStore::head`] is in memory).
    pub head: u64,
}

/// When a turn is stored, in milliseconds since the Unix epoch, for `stored_at`. Never 0, which the layout keeps
/// for "stored before the time was kept" (docs/store.md): a clock at or before the epoch (a Raspberry Pi without a
/// real-time clock, before NTP) stamps 1.
pub(crate) fn now_ms() -> i64 {
    stamp_ms(std::time::SystemTime::now())
}

fn stamp_ms(now: std::time::SystemTime) -> i64 {
    now.duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_millis() as i64)
        .max(1)
}

/// One chunk a flow's frames make in a turn: its first sequence, its count, its format, and its records' bytes
/// in the body buffer [`cut_flow`] filled.
pub(crate) type Segment = (u64, u64, RecordFormat, std::ops::Range<usize>);

/// Cuts one flow's frames, sorted by first sequence, against the heard sequence found in the store
/// (docs/store.md, "The invariants"), the same for every engine: a frame at or below `heard` is a duplicate, one
/// past `heard + 1` is a gap and is not written, an overlapping one loses its stored prefix. The new records go
/// into `body` (cleared first), as chunks that change with the format; returns them and the flow's heard
/// sequence after them, and counts what was stored, duplicate or cut as a gap into `applied`.
pub(crate) fn cut_flow(
    pieces: &[Piece<'_>],
    heard_before: u64,
    body: &mut Vec<u8>,
    applied: &mut Applied,
) -> (Vec<Segment>, u64) {
    let mut heard = heard_before;
    // A change of format starts a new chunk; a chunk never mixes formats.
    let mut segments: Vec<Segment> = Vec::new();
    body.clear();
    for piece in pieces {
        if piece.count == 0 {
            continue;
        }
        // Never first_seq + count - 1: the last sequence may be 2^64 - 1 (protocol.md 5.1).
        let last = piece.first_seq + (piece.count - 1);
        if last <= heard {
            applied.duplicate += piece.count;
            continue;
        }
        if piece.first_seq > heard + 1 || last > MAX_SEQ {
            applied.gap += piece.count;
            continue;
        }
        let skip = heard + 1 - piece.first_seq;
        applied.duplicate += skip;
        let mut it = RecordIter::new(piece.records);
        for _ in 0..skip {
            it.next();
        }
        let from = body.len();
        body.extend_from_slice(&piece.records[it.position()..]);
        match segments.last_mut() {
            Some((_, count, format, range)) if *format == piece.format => {
                *count += last - heard;
                range.end = body.len();
            }
            _ => segments.push((heard + 1, last - heard, piece.format, from..body.len())),
        }
        applied.stored += last - heard;
        heard = last;
    }
    (segments, heard)
}

impl AppStore {
    /// Opens (creating if needed) an app's store for writing: WAL with `synchronous=NORMAL`, so a commit is
    /// durable only once its `-wal` is synced ([`AppStore::sync`], or the [`sync::Syncer`] with
    /// [`AppStore::sync_item`]): the node acks nothing before that (research/010). SQLite never checkpoints it by
    /// itself ([`no_checkpoints_behind_our_back`]). A store of layout 1 is migrated to layout 2 in one
    /// transaction (synced before it is used).
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        // A store may be a symbolic link (an app's store on another disk): SQLite keeps its -wal and -shm beside
        // the file the link names, so the guards below must look there too.
        let real = follow_links(path);
        let path = real.as_path();
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|source| StoreError::Io {
                path: dir.to_path_buf(),
                source,
            })?;
        }
        let sql = |source| StoreError::Sqlite {
            path: path.to_path_buf(),
            source,
        };
        // SQLite's own first mapping of the wal-index, at open, is the one the store cannot allocate ahead of
        // (store/disk.rs): open only where there is room for it.
        if let Err((free, wanted)) = disk::room_to_open(path) {
            return Err(StoreError::NoRoom {
                path: path.to_path_buf(),
                free,
                wanted,
            });
        }
        // What the node builds on must be what the disk holds: a page whose write-back failed (a node that
        // died after a disk fault, restarted) stays in the page cache, clean, and would be read as stored. When
        // no other process has the store open, this connection rebuilds the wal-index from the `-wal`, so drop
        // the cached pages first and it reads the disk. (With a reader attached the wal-index is the reader's,
        // and a page dropped from under it could be read stale: then the cache is kept.)
        if !disk::open_elsewhere(path) {
            forget_cached_pages(path)?;
        }
        let mut conn = Connection::open(path).map_err(sql)?;
        // SQLite opens a file this user may not write read-only, without a word: said here, not at the first
        // record's commit ("attempt to write a readonly database").
        if conn.is_readonly("main").map_err(sql)? {
            return Err(StoreError::not_writable(path));
        }
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(sql)?;
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(sql)?;
        no_checkpoints_behind_our_back(&conn).map_err(sql)?;
        let wal_frames = Arc::new(AtomicU32::new(0));
        let frames = wal_frames.clone();
        conn.wal_hook(Some(
            move |_: &mut rusqlite::hooks::Wal, n: std::ffi::c_int| {
                frames.store(n.max(0) as u32, Ordering::Relaxed);
                Ok(())
            },
        ))
        .map_err(sql)?;
        let mut store = Self::prepare_layout(conn, path.to_path_buf())?;
        store.wal_frames = wal_frames;
        let mut guard = disk::FileGuard::new(path).map_err(|source| StoreError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let wal = guard
            .verify()
            .map_err(|disk::Gone(what)| StoreError::Gone {
                path: path.to_path_buf(),
                what,
            })?;
        guard
            .keep_shm_ahead(wal)
            .map_err(|source| StoreError::Shm {
                path: path.to_path_buf(),
                source,
            })?;
        store.guard = Some(guard);
        store.open_wal_for_sync()?;
        // What the open wrote (a new store's tables, a migration) is durable before anything is built on it.
        store.sync()?;
        Ok(store)
    }

    /// Opens the descriptors to sync through, once the `-wal` exists (SQLite makes it with the first transaction).
    fn open_wal_for_sync(&mut self) -> Result<(), StoreError> {
        if self.files.is_some() || self.guard.is_none() {
            return Ok(());
        }
        if !disk::wal_path(&self.path).exists() {
            return Ok(());
        }
        self.files = Some(Arc::new(sync::StoreFiles::open(&self.path)?));
        Ok(())
    }

    /// How many transactions of this store committed ([`AppStore::apply_with_down`] says what for).
    pub fn commits(&self) -> u64 {
        self.commits
    }

    /// What to sync for the commits made so far (`None`: nothing to sync, a store in memory).
    pub fn sync_item(&self, app: AppIndex) -> Option<(AppIndex, Arc<sync::StoreFiles>)> {
        Some((app, self.files.clone()?))
    }

    /// Whether [`CHECKPOINT_FRAMES`] were added to the `-wal` since the last checkpoint was made.
    fn checkpoint_due(&mut self) -> bool {
        let frames = self.wal_frames.load(Ordering::Relaxed);
        // Fewer frames than at the last one: the WAL was restarted after it.
        if frames < self.frames_at_checkpoint {
            self.frames_at_checkpoint = 0;
        }
        frames - self.frames_at_checkpoint >= CHECKPOINT_FRAMES
    }

    /// Copies the `-wal`'s commits into the database file (a passive checkpoint on this connection: it never waits
    /// for readers, and as the writer makes it between two commits, the next commit restarts the `-wal`), checks
    /// the result, and syncs the file through the node's own descriptor ([`sync::StoreFiles`]). Any failure marks
    /// the store failed; a checkpoint that another connection holds off is not one (the next one does it).
    pub fn checkpoint(&mut self) -> Result<(), StoreError> {
        let Some(files) = &self.files else {
            return Ok(());
        };
        if files.is_failed() {
            return Err(StoreError::FailedEarlier {
                path: self.path.clone(),
            });
        }
        let checkpointed = match self
            .conn
            .wal_checkpoint_v2(Some("main"), rusqlite::wal::CheckpointMode::PASSIVE)
        {
            Ok((_, checkpointed)) => checkpointed.max(0) as u32,
            Err(e)
                if matches!(
                    e.sqlite_error_code(),
                    Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
                ) =>
            {
                0
            }
            Err(source) => {
                files.fail();
                return Err(StoreError::Checkpoint {
                    path: self.path.clone(),
                    source: Arc::new(source),
                });
            }
        };
        files.sync_after_checkpoint()?;
        // Before the next commit may restart the -wal over them: the pages copied are on the disk (issue 34).
        if files.verify_checkpoints.load(Ordering::Relaxed) {
            files.verify_checkpoint(checkpointed)?;
        }
        self.frames_at_checkpoint = self.wal_frames.load(Ordering::Relaxed);
        Ok(())
    }

    /// At a clean stop, after [`AppStore::checkpoint`] copied and synced every frame into the file: the `-wal` cut
    /// to nothing (SQLite's TRUNCATE checkpoint, which has nothing left to copy), so that the file alone is the
    /// store. A `-wal` left with frames is read over whatever file later takes this one's name (an app renamed by
    /// renaming its file, docs/apps.md) and undoes it. Left as it is when a frame is not in the file yet (a reader
    /// in another process held it back) or a reader holds the `-wal`: nothing is lost either way.
    pub fn empty_wal(&mut self) -> Result<(), StoreError> {
        if self.files.is_none() {
            return Ok(());
        }
        let err = |source| StoreError::Checkpoint {
            path: self.path.clone(),
            source: Arc::new(source),
        };
        let busy = |e: &rusqlite::Error| {
            matches!(
                e.sqlite_error_code(),
                Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
            )
        };
        use rusqlite::wal::CheckpointMode;
        match self
            .conn
            .wal_checkpoint_v2(Some("main"), CheckpointMode::PASSIVE)
        {
            Ok((log, done)) if log == done => {}
            Ok(_) => return Ok(()),
            Err(e) if busy(&e) => return Ok(()),
            Err(e) => return Err(err(e)),
        }
        match self
            .conn
            .wal_checkpoint_v2(Some("main"), CheckpointMode::TRUNCATE)
        {
            Ok(_) => Ok(()),
            Err(e) if busy(&e) => Ok(()),
            Err(e) => Err(err(e)),
        }
    }

    /// The descriptors the store is synced through (`None` for stores in memory, or before its `-wal` exists).
    pub fn files(&self) -> Option<&Arc<sync::StoreFiles>> {
        self.files.as_ref()
    }

    /// Makes every commit so far durable, here and now (the daemon's host lets the `pure-sync` thread do it).
    pub fn sync(&self) -> Result<(), StoreError> {
        match &self.files {
            Some(f) => f.sync_wal(),
            None => Ok(()),
        }
    }

    /// Before a commit: the files are still the store's, and the wal-index is allocated ahead of what the WAL
    /// may need (store/disk.rs). Nothing is written when this fails.
    fn before_commit(&mut self) -> Result<(), StoreError> {
        let Some(guard) = &mut self.guard else {
            return Ok(());
        };
        let wal = guard
            .verify()
            .map_err(|disk::Gone(what)| StoreError::Gone {
                path: self.path.clone(),
                what,
            })?;
        guard.keep_shm_ahead(wal).map_err(|source| StoreError::Shm {
            path: self.path.clone(),
            source,
        })
    }

    /// After a commit, before anything of it is acknowledged: it went into the files at the store's path, not into
    /// one deleted or replaced meanwhile.
    fn after_commit(&mut self) -> Result<(), StoreError> {
        let Some(guard) = &mut self.guard else {
            return Ok(());
        };
        guard
            .verify()
            .map(|_| ())
            .map_err(|disk::Gone(what)| StoreError::Gone {
                path: self.path.clone(),
                what,
            })
    }

    fn prepare_layout(conn: Connection, path: PathBuf) -> Result<Self, StoreError> {
        let sql = |source| StoreError::Sqlite {
            path: path.clone(),
            source,
        };
        // Every statement a turn may run stays prepared: rusqlite keeps 16 by default, fewer than a turn of records
        // and downlink together uses, and each one evicted was parsed again at its next use (research/035).
        conn.set_prepared_statement_cache_capacity(STATEMENTS_KEPT);
        let version: i64 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .map_err(sql)?;
        match version {
            0 => conn.execute_batch(SCHEMA).map_err(sql)?,
            1 => {
                tracing::info!("store {}: migrating layout 1 to 2", path.display());
                if let Err(e) = conn.execute_batch(MIGRATE_1_TO_2) {
                    let _ = conn.execute_batch("ROLLBACK");
                    return Err(sql(e));
                }
            }
            LAYOUT_VERSION => {
                let has_starts: bool = conn
                    .query_row(
                        "SELECT COUNT(*) > 0 FROM sqlite_master WHERE name = 'outlet_starts'",
                        [],
                        |r| r.get(0),
                    )
                    .map_err(sql)?;
                if !has_starts {
                    conn.execute_batch(&format!("BEGIN;{OUTLET_STARTS}COMMIT;"))
                        .map_err(sql)?;
                }
            }
            other => {
                return Err(StoreError::Layout {
                    path,
                    found: other,
                    known: LAYOUT_VERSION,
                });
            }
        }
        // Every writer makes the downlink tables (layout 2 gained them without a new version).
        conn.execute_batch(downlink::DOWNLINK_TABLES).map_err(sql)?;
        let head: i64 = conn
            .query_row(
                "SELECT COALESCE((SELECT pos + count FROM chunks ORDER BY pos DESC LIMIT 1), 1)",
                [],
                |r| r.get(0),
            )
            .map_err(sql)?;
        let mut store = AppStore {
            conn,
            path,
            guard: None,
            files: None,
            wal_frames: Arc::new(AtomicU32::new(0)),
            frames_at_checkpoint: 0,
            head: head.max(1) as u64,
            down_waiting: 0,
            down_ranges: true,
            commits: 0,
        };
        store.down_waiting = store.load_down_waiting()?;
        store.down_ranges = store.may_hold_ranges()?;
        Ok(store)
    }

    /// An app store in memory: the same schema and code path, for the simulated-network tests.
    pub fn open_in_memory(label: &str) -> Result<Self, StoreError> {
        let path = PathBuf::from(format!(":memory:{label}"));
        let conn = Connection::open_in_memory().map_err(|source| StoreError::Sqlite {
            path: path.clone(),
            source,
        })?;
        Self::prepare_layout(conn, path)
    }

    /// Opens an existing store to read (the node may be writing it at the same time; WAL allows that).
    pub fn open_read(path: &Path) -> Result<Self, StoreError> {
        Self::open_read_with(path, false)
    }

    /// [`AppStore::open_read`]; `alone` (no node runs on the store, and its disk is full) reads with the
    /// wal-index in this process's memory instead of the mapped `-shm`, which SQLite would otherwise grow and
    /// could fault on (store/disk.rs). A node starting meanwhile finds the store locked and tries again.
    pub fn open_read_with(path: &Path, alone: bool) -> Result<Self, StoreError> {
        // SQLite reads a WAL store without a shared wal-index only on a connection that could write (a read-only
        // one cannot take the exclusive lock that needs). It writes nothing but what closing does: a checkpoint.
        let flags = if alone {
            rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX
        } else {
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX
        };
        let conn =
            Connection::open_with_flags(path, flags).map_err(|source| StoreError::Sqlite {
                path: path.to_path_buf(),
                source,
            })?;
        // A reader never writes: not even the checkpoint SQLite makes when the last connection to a store closes.
        conn.set_db_config(
            rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
            true,
        )
        .map_err(|source| StoreError::Sqlite {
            path: path.to_path_buf(),
            source,
        })?;
        if alone {
            // Alone means alone: a store another process holds is said at once, not waited for (the node checks
            // a store this way from its receive loop, Stores::retry).
            conn.busy_timeout(std::time::Duration::ZERO)
                .map_err(|source| StoreError::Sqlite {
                    path: path.to_path_buf(),
                    source,
                })?;
            conn.pragma_update(None, "locking_mode", "EXCLUSIVE")
                .map_err(|source| StoreError::Sqlite {
                    path: path.to_path_buf(),
                    source,
                })?;
        }
        let version: Result<i64, _> = conn.pragma_query_value(None, "user_version", |r| r.get(0));
        let (conn, version) = match version {
            Err(source) if !alone && cannot_open(&source) => read_immutable(path, source)?,
            version => (
                conn,
                version.map_err(|source| StoreError::Sqlite {
                    path: path.to_path_buf(),
                    source,
                })?,
            ),
        };
        if version != LAYOUT_VERSION {
            return Err(StoreError::Layout {
                path: path.to_path_buf(),
                found: version,
                known: LAYOUT_VERSION,
            });
        }
        let mut store = AppStore {
            conn,
            path: path.to_path_buf(),
            guard: None,
            files: None,
            wal_frames: Arc::new(AtomicU32::new(0)),
            frames_at_checkpoint: 0,
            down_waiting: 0,
            down_ranges: true,
            commits: 0,
            head: 1,
        };
        store.head = store.read_head()?;
        store.down_waiting = store.load_down_waiting()?;
        store.down_ranges = store.may_hold_ranges()?;
        Ok(store)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The position the next stored record will get; `head() - 1` records are stored.
    pub fn head(&self) -> u64 {
        self.head
    }

    /// Reads the head from the file (for a reader, whose view moves as the writer commits).
    pub fn read_head(&self) -> Result<u64, StoreError> {
        let head: i64 = self
            .conn
            .query_row(
                "SELECT COALESCE((SELECT pos + count FROM chunks ORDER BY pos DESC LIMIT 1), 1)",
                [],
                |r| r.get(0),
            )
            .map_err(self.err())?;
        Ok(head.max(1) as u64)
    }

    fn err(&self) -> impl Fn(rusqlite::Error) -> StoreError + '_ {
        move |source| StoreError::Sqlite {
            path: self.path.clone(),
            source,
        }
    }

    /// Applies pieces in one transaction and commits (docs/protocol.md 5.2): each flow's records after its heard
    /// sequence, in order, become chunks at the next positions, and the heard sequences move with them. Outlet
    /// progress (`outlets`: name, far side's stored position) is written in the same transaction. Nothing is
    /// changed in memory unless the commit succeeds.
    pub fn apply(
        &mut self,
        pieces: &mut [Piece<'_>],
        outlets: &[(&str, u64)],
        keep_new: bool,
    ) -> Result<Applied, StoreError> {
        self.apply_with_down(pieces, outlets, keep_new, &[], &[])
    }

    /// [`AppStore::apply`], with the turn's downlink work of this app in the same transaction: its pushes queued
    /// first, each all or nothing (their outcomes in `down.pushes`, in order), then its fetches, so a LISTEN of the
    /// same turn reads what the pushes queued: what each device has is deleted and what waits for it read
    /// (docs/protocol.md 12.3). One commit and one sync make a push durable and send it (research/032).
    pub fn apply_with_down(
        &mut self,
        pieces: &mut [Piece<'_>],
        outlets: &[(&str, u64)],
        keep_new: bool,
        fetches: &[downlink::Fetch<'_>],
        pushes: &[&downlink::DownPush],
    ) -> Result<Applied, StoreError> {
        let mut applied = Applied::default();
        if pieces.is_empty() && outlets.is_empty() && fetches.is_empty() && pushes.is_empty() {
            return Ok(applied);
        }
        // Sorting a flow's frames by first_seq makes reordering within a turn free (protocol.md 5.2, 3).
        pieces.sort_by(|a, b| (a.source, a.first_seq).cmp(&(b.source, b.first_seq)));
        let path = self.path.clone();
        let sql = |source| StoreError::Sqlite {
            path: path.clone(),
            source,
        };
        self.before_commit()?;
        let stored_at = now_ms();
        let mut head = self.head;
        // The blobs this transaction wrote or referenced, kept by their pushes once it commits (downlink.rs).
        let mut blobs_made = Vec::new();
        let tx = self.conn.transaction().map_err(sql)?;
        {
            let mut find = tx
                .prepare_cached("SELECT id, heard FROM sources WHERE name = ?1")
                .map_err(sql)?;
            let mut add = tx
                .prepare_cached("INSERT INTO sources (name, heard) VALUES (?1, ?2)")
                .map_err(sql)?;
            let mut put = tx
                .prepare_cached(
                    "INSERT INTO chunks (source, first_seq, count, body, pos, stored_at, format)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                )
                .map_err(sql)?;
            let mut set_heard = tx
                .prepare_cached("UPDATE sources SET heard = ?2 WHERE id = ?1")
                .map_err(sql)?;
            let mut body: Vec<u8> = Vec::new();
            let mut start = 0;
            while start < pieces.len() {
                let name = pieces[start].source;
                let mut end = start;
                while end < pieces.len() && pieces[end].source == name {
                    end += 1;
                }
                let found: Option<(i64, i64)> = find
                    .query_row([name], |r| Ok((r.get(0)?, r.get(1)?)))
                    .optional()
                    .map_err(sql)?;
                // A new source gets its row only when it has something stored, written once with its heard
                // sequence: a new sender costs one insert here, not an insert and an update (research/001).
                let (id, heard_before) = match found {
                    Some((id, heard)) => (Some(id), heard as u64),
                    None => (None, 0),
                };
                let (segments, heard) =
                    cut_flow(&pieces[start..end], heard_before, &mut body, &mut applied);
                if heard > heard_before {
                    let id = match id {
                        Some(id) => {
                            set_heard.execute(params![id, heard as i64]).map_err(sql)?;
                            id
                        }
                        None => {
                            add.execute(params![name, heard as i64]).map_err(sql)?;
                            tx.last_insert_rowid()
                        }
                    };
                    for (first, count, format, range) in segments {
                        let records = &body[range];
                        put.execute(params![
                            id,
                            first as i64,
                            count as i64,
                            records,
                            head as i64,
                            stored_at,
                            format as i64
                        ])
                        .map_err(sql)?;
                        if keep_new {
                            applied.new_chunks.push(Chunk {
                                pos: head,
                                source: name.to_string(),
                                first_seq: first,
                                count,
                                format,
                                stored_at_ms: stored_at,
                                body: records.to_vec(),
                            });
                        }
                        head += count;
                    }
                }
                applied.heard.push((name.to_string(), heard));
                start = end;
            }
            if !outlets.is_empty() {
                let mut set_outlet = tx
                    .prepare_cached(
                        "INSERT INTO outlets (name, acked) VALUES (?1, ?2)
                         ON CONFLICT (name) DO UPDATE SET acked = MAX(acked, excluded.acked)",
                    )
                    .map_err(sql)?;
                for (name, acked) in outlets {
                    set_outlet
                        .execute(params![name, *acked as i64])
                        .map_err(sql)?;
                }
            }
            if pushes.iter().any(|p| p.blob.is_some()) {
                self.down_ranges = true;
            }
            let ranges = self.down_ranges;
            let mut pushed = Vec::with_capacity(pushes.len());
            for p in pushes {
                let done = match &p.blob {
                    Some(blob) => downlink::queue_blob_in(
                        &tx,
                        &p.sender,
                        blob,
                        &p.limits,
                        stored_at,
                        &mut blobs_made,
                    ),
                    None => {
                        downlink::queue_in(&tx, &p.sender, &p.records, &p.limits, stored_at, ranges)
                    }
                };
                pushed.push(done.map_err(sql)?);
            }
            // A push refused for a record's size did not look at its sender's records (downlink::queue_in).
            let swept: Vec<&str> = pushes
                .iter()
                .filter(|p| p.too_large().is_none())
                .map(|p| p.sender.as_str())
                .collect();
            applied.down =
                downlink::apply_fetches(&tx, fetches, stored_at, &swept, ranges).map_err(sql)?;
            applied.down.pushes = pushed;
        }
        tx.commit().map_err(sql)?;
        for (blob, id) in blobs_made {
            blob.set_stored(id);
        }
        self.commits += 1;
        self.after_commit()?;
        self.open_wal_for_sync()?;
        self.head = head;
        let (queued, push_expired) = applied
            .down
            .pushes
            .iter()
            .fold((0, 0), |(q, e), (p, x)| (q + p.queued(), e + x));
        self.down_waiting = (self.down_waiting + queued)
            .saturating_sub(applied.down.delivered + applied.down.expired + push_expired);
        // SQLite's own checkpoint would run here, inside the commit, and ignore its errors (store/sync.rs).
        if self.checkpoint_due() {
            self.checkpoint()?;
        }
        Ok(applied)
    }

    /// Writes and commits nothing of consequence (the header's layout version, unchanged): whether this store can
    /// commit now. A host asks before it lets an app that failed take input again.
    pub fn probe_write(&mut self) -> Result<(), StoreError> {
        self.before_commit()?;
        // A commit may fit in the WAL's old space on a full disk and the next one not: an app that failed comes
        // back only when the filesystem has room again, so it does not flap.
        if self.guard.is_some()
            && let Err((free, wanted)) = disk::room_to_open(&self.path)
        {
            return Err(StoreError::NoRoom {
                path: self.path.clone(),
                free,
                wanted,
            });
        }
        self.conn
            .execute_batch("BEGIN IMMEDIATE; PRAGMA user_version = 2; COMMIT;")
            .map_err(|source| {
                let _ = self.conn.execute_batch("ROLLBACK");
                StoreError::Sqlite {
                    path: self.path.clone(),
                    source,
                }
            })?;
        self.after_commit()?;
        // The sync is part of the probe: a disk that cannot write back keeps its app stopped.
        self.open_wal_for_sync()?;
        self.sync()
    }

    /// Heard sequence of every source, by name.
    pub fn heard(&self) -> Result<HashMap<String, u64>, StoreError> {
        let mut stmt = self
            .conn
            .prepare("SELECT name, heard FROM sources")
            .map_err(self.err())?;
        let rows = stmt
            .query_map([], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)? as u64))
            })
            .map_err(self.err())?;
        rows.collect::<Result<_, _>>().map_err(self.err())
    }

    /// The heard sequence of one source (0 if it has stored nothing).
    pub fn heard_of(&self, source: &str) -> Result<u64, StoreError> {
        let heard: Option<i64> = self
            .conn
            .query_row("SELECT heard FROM sources WHERE name = ?1", [source], |r| {
                r.get(0)
            })
            .optional()
            .map_err(self.err())?;
        Ok(heard.unwrap_or(0) as u64)
    }

    /// The chunk that holds position `pos`: its first position and when it was stored (`stored_at`, ms since the
    /// Unix epoch; 0 for a chunk of layout 1). One lookup by the position index, reading no record.
    pub fn chunk_stored_at(&self, pos: u64) -> Result<Option<(u64, i64)>, StoreError> {
        let row: Option<(i64, i64)> = self
            .conn
            .prepare_cached(
                "SELECT pos, stored_at FROM chunks WHERE pos <= ?1 ORDER BY pos DESC LIMIT 1",
            )
            .and_then(|mut stmt| {
                stmt.query_row([pos as i64], |r| Ok((r.get(0)?, r.get(1)?)))
                    .optional()
            })
            .map_err(self.err())?;
        Ok(row.map(|(p, ms)| (p as u64, ms)))
    }

    /// Where each outlet started (docs/apps.md, `from`), and whether the store's outlets were applied by a node
    /// that kept no starts (they start from the first record).
    pub fn outlet_starts(&self) -> Result<(Vec<OutletStart>, bool), StoreError> {
        let has: bool = self
            .conn
            .query_row(
                "SELECT COUNT(*) > 0 FROM sqlite_master WHERE name = 'outlet_starts'",
                [],
                |r| r.get(0),
            )
            .map_err(self.err())?;
        if !has {
            // A reader of a store no node of this version opened yet.
            return Ok((Vec::new(), true));
        }
        let mut stmt = self
            .conn
            .prepare("SELECT name, kind, target, flow, start FROM outlet_starts")
            .map_err(self.err())?;
        let rows = stmt
            .query_map([], |r| {
                Ok(OutletStart {
                    name: r.get(0)?,
                    kind: r.get(1)?,
                    target: r.get(2)?,
                    flow: r.get(3)?,
                    start: r.get::<_, i64>(4)? as u64,
                })
            })
            .map_err(self.err())?;
        let all: Vec<OutletStart> = rows.collect::<Result<_, _>>().map_err(self.err())?;
        let legacy = all.iter().any(|o| o.name == LEGACY_OUTLETS);
        Ok((
            all.into_iter()
                .filter(|o| o.name != LEGACY_OUTLETS)
                .collect(),
            legacy,
        ))
    }

    /// Keeps where outlets started (replacing what was kept under their names): one commit, before any record after a start is stored. It is made
    /// durable with the next turn's sync, which every record it could concern waits for.
    pub fn set_outlet_starts(&mut self, starts: &[OutletStart]) -> Result<(), StoreError> {
        let path = self.path.clone();
        let sql = move |source| StoreError::Sqlite {
            path: path.clone(),
            source,
        };
        let tx = self.conn.transaction().map_err(&sql)?;
        {
            // An outlet moved to another far flow leaves the start of the flow it sent to under a name no outlet
            // can have, so that an outlet sent there again (moved back, or added under any name) numbers that flow
            // as its far node already does, not from a new start (an outside audit lost records that way).
            let mut keep = tx
                .prepare_cached(
                    "INSERT OR IGNORE INTO outlet_starts (name, kind, target, flow, start)
                     SELECT ?2 || o.flow, o.kind, o.target, o.flow, o.start FROM outlet_starts o
                     WHERE o.name = ?1 AND o.flow IS NOT NULL AND o.flow IS NOT ?3
                       AND NOT EXISTS (SELECT 1 FROM outlet_starts k WHERE k.flow = o.flow AND k.name <> ?1)",
                )
                .map_err(&sql)?;
            let mut put = tx
                .prepare_cached(
                    "INSERT OR REPLACE INTO outlet_starts (name, kind, target, flow, start) VALUES (?1, ?2, ?3, ?4, ?5)",
                )
                .map_err(&sql)?;
            for o in starts {
                keep.execute(params![o.name, FAR_FLOW_KEPT, o.flow])
                    .map_err(&sql)?;
                put.execute(params![o.name, o.kind, o.target, o.flow, o.start as i64])
                    .map_err(&sql)?;
            }
        }
        tx.commit().map_err(&sql)?;
        Ok(())
    }

    /// The outlets in the file at the first start of a node that keeps starts have theirs: outlets added from now
    /// on start by their `from`.
    pub fn forget_legacy_outlets(&mut self) -> Result<(), StoreError> {
        self.conn
            .execute(
                "DELETE FROM outlet_starts WHERE name = ?1",
                [LEGACY_OUTLETS],
            )
            .map_err(self.err())?;
        Ok(())
    }

    /// What each outlet's far side has stored, as last written (position; 0: nothing yet).
    pub fn outlets_acked(&self) -> Result<HashMap<String, u64>, StoreError> {
        let mut stmt = self
            .conn
            .prepare("SELECT name, acked FROM outlets")
            .map_err(self.err())?;
        let rows = stmt
            .query_map([], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)? as u64))
            })
            .map_err(self.err())?;
        rows.collect::<Result<_, _>>().map_err(self.err())
    }

    /// Reads records from position `from` on, in position order, as chunks (the first one cut to start at
    /// `from`), until about `max_records` records or `max_bytes` bytes have been read (at least one chunk).
    pub fn read_from(
        &self,
        from: u64,
        max_records: u64,
        max_bytes: usize,
    ) -> Result<Vec<Chunk>, StoreError> {
        let mut out = Vec::new();
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT c.pos, s.name, c.first_seq, c.count, c.format, c.stored_at, c.body
                 FROM chunks c JOIN sources s ON s.id = c.source
                 WHERE c.pos >= COALESCE((SELECT MAX(pos) FROM chunks WHERE pos <= ?1), 0)
                 ORDER BY c.pos",
            )
            .map_err(self.err())?;
        let mut rows = stmt.query([from as i64]).map_err(self.err())?;
        let (mut records, mut bytes) = (0u64, 0usize);
        while let Some(row) = rows.next().map_err(self.err())? {
            let pos = row.get::<_, i64>(0).map_err(self.err())? as u64;
            let source: String = row.get(1).map_err(self.err())?;
            let first_seq = row.get::<_, i64>(2).map_err(self.err())? as u64;
            let count = row.get::<_, i64>(3).map_err(self.err())? as u64;
            let format = match row.get::<_, i64>(4).map_err(self.err())? {
                1 => RecordFormat::Forwarded,
                _ => RecordFormat::Plain,
            };
            let stored_at_ms: i64 = row.get(5).map_err(self.err())?;
            let body = row.get_ref(6).map_err(self.err())?.as_blob().unwrap_or(&[]);
            let whole = StoredChunk {
                source: &source,
                first_seq,
                count,
                body,
                pos,
                stored_at_ms,
                forwarded: format == RecordFormat::Forwarded,
            };
            let Some(chunk) = whole.cut_to(from, &self.path)? else {
                continue;
            };
            records += chunk.count;
            bytes += chunk.body.len();
            out.push(chunk);
            if records >= max_records || bytes >= max_bytes {
                break;
            }
        }
        Ok(out)
    }

    /// Calls `each` for every stored record (of one source, if given), ordered by source then sequence. A
    /// forwarded record is shown with its payload only; [`AppStore::for_each_record_view`] shows its origin too.
    pub fn for_each_record(
        &self,
        source: Option<&str>,
        mut each: impl FnMut(&str, u64, &[u8]) -> bool,
    ) -> Result<(), StoreError> {
        self.for_each_record_view(source, 0, |r| each(r.source, r.seq, r.payload))
    }

    /// Calls `each(name, heard, last_stored_ms)` for every source of the app, by name: its heard sequence (the
    /// last record stored) and when its newest chunk was committed (milliseconds since the Unix epoch; 0 when it
    /// has none, or was stored by a node before commit times were kept). One index lookup per source (the chunks'
    /// key is (source, first_seq)); `each` returns false to stop.
    pub fn for_each_source_seen(
        &self,
        mut each: impl FnMut(&str, u64, i64) -> bool,
    ) -> Result<(), StoreError> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT s.name, s.heard,
                        COALESCE((SELECT c.stored_at FROM chunks c WHERE c.source = s.id
                                  ORDER BY c.first_seq DESC LIMIT 1), 0)
                 FROM sources s ORDER BY s.name",
            )
            .map_err(self.err())?;
        let mut rows = stmt.query([]).map_err(self.err())?;
        while let Some(row) = rows.next().map_err(self.err())? {
            let name = row.get_ref(0).map_err(self.err())?.as_str().unwrap_or("");
            let heard: i64 = row.get(1).map_err(self.err())?;
            let at: i64 = row.get(2).map_err(self.err())?;
            if !each(name, heard.max(0) as u64, at) {
                break;
            }
        }
        Ok(())
    }

    /// One source's heard sequence and its newest chunk's commit time (0: none), as
    /// [`AppStore::for_each_source_seen`] gives them; `None` when the app has never stored a record of it.
    pub fn source_seen(&self, name: &str) -> Result<Option<(u64, i64)>, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT s.heard,
                        COALESCE((SELECT c.stored_at FROM chunks c WHERE c.source = s.id
                                  ORDER BY c.first_seq DESC LIMIT 1), 0)
                 FROM sources s WHERE s.name = ?1",
            )
            .map_err(self.err())?;
        let mut rows = stmt.query([name]).map_err(self.err())?;
        match rows.next().map_err(self.err())? {
            Some(row) => {
                let heard: i64 = row.get(0).map_err(self.err())?;
                let at: i64 = row.get(1).map_err(self.err())?;
                Ok(Some((heard.max(0) as u64, at)))
            }
            None => Ok(None),
        }
    }

    /// Calls `each` for every stored record at position ≥ `from_pos` (of one source, if given) with all the
    /// store knows of it: ordered by source then sequence when `from_pos` is 0, else by position (a follower).
    pub fn for_each_record_view(
        &self,
        source: Option<&str>,
        from_pos: u64,
        mut each: impl FnMut(&RecordView<'_>) -> bool,
    ) -> Result<(), StoreError> {
        let order = if from_pos == 0 {
            "ORDER BY s.name, c.first_seq"
        } else {
            "ORDER BY c.pos"
        };
        let mut stmt = self
            .conn
            .prepare(&format!(
                "SELECT s.name, c.first_seq, c.count, c.body, c.pos, c.stored_at, c.format
                 FROM chunks c JOIN sources s ON s.id = c.source
                 WHERE (?1 IS NULL OR s.name = ?1)
                   AND c.pos >= COALESCE((SELECT MAX(pos) FROM chunks WHERE pos <= ?2), 0)
                 {order}"
            ))
            .map_err(self.err())?;
        let mut rows = stmt
            .query(params![source, from_pos as i64])
            .map_err(self.err())?;
        while let Some(row) = rows.next().map_err(self.err())? {
            let name: String = row.get(0).map_err(self.err())?;
            let first: i64 = row.get(1).map_err(self.err())?;
            let count: i64 = row.get(2).map_err(self.err())?;
            let body = row.get_ref(3).map_err(self.err())?.as_blob().unwrap_or(&[]);
            let pos: Option<i64> = row.get(4).map_err(self.err())?;
            let stored_at_ms: i64 = row.get(5).map_err(self.err())?;
            let forwarded = row.get::<_, i64>(6).map_err(self.err())? == 1;
            let stored = StoredChunk {
                source: &name,
                first_seq: first as u64,
                count: count as u64,
                body,
                pos: pos.unwrap_or(0) as u64,
                stored_at_ms,
                forwarded,
            };
            if !stored.each_record(&self.path, from_pos, &mut each)? {
                return Ok(());
            }
        }
        Ok(())
    }
}

/// One chunk row as a store reads it back, for [`StoredChunk::each_record`]: both engines' readers hand records
/// over through it, so `records` prints the same whichever store it reads.
pub(crate) struct StoredChunk<'a> {
    pub source: &'a str,
    pub first_seq: u64,
    pub count: u64,
    pub body: &'a [u8],
    pub pos: u64,
    pub stored_at_ms: i64,
    pub forwarded: bool,
}

impl StoredChunk<'_> {
    /// The chunk from position `from` on, as an outlet is fed it (`None` if it ends before `from`); a body that
    /// holds fewer records than it skips is [`StoreError::Corrupt`], named by `store`.
    pub(crate) fn cut_to(&self, from: u64, store: &Path) -> Result<Option<Chunk>, StoreError> {
        if self.pos + self.count <= from {
            return Ok(None);
        }
        let skip = from.saturating_sub(self.pos);
        let mut it = RecordIter::new(self.body);
        for _ in 0..skip {
            if it.next().is_none() {
                return Err(StoreError::Corrupt {
                    path: store.to_path_buf(),
                    source_name: self.source.to_string(),
                    seq: self.first_seq,
                });
            }
        }
        Ok(Some(Chunk {
            pos: self.pos + skip,
            source: self.source.to_string(),
            first_seq: self.first_seq + skip,
            count: self.count - skip,
            format: if self.forwarded {
                RecordFormat::Forwarded
            } else {
                RecordFormat::Plain
            },
            stored_at_ms: self.stored_at_ms,
            body: self.body[it.position()..].to_vec(),
        }))
    }

    /// Hands `each` the chunk's records at positions from `from_pos` on, in order; `Ok(false)` once `each` asked to
    /// stop. A body that does not hold `count` whole records is [`StoreError::Corrupt`], named by `store`.
    pub(crate) fn each_record(
        &self,
        store: &Path,
        from_pos: u64,
        each: &mut impl FnMut(&RecordView<'_>) -> bool,
    ) -> Result<bool, StoreError> {
        let corrupt = |seq| StoreError::Corrupt {
            path: store.to_path_buf(),
            source_name: self.source.to_string(),
            seq,
        };
        let mut it = RecordIter::new(self.body);
        let mut seq = self.first_seq;
        let mut n = 0;
        for (pos, record) in (self.pos..).zip(it.by_ref()) {
            let (origin, payload) = if self.forwarded {
                let f = Forwarded::parse(record).map_err(|_| corrupt(seq))?;
                let origin = std::str::from_utf8(f.origin).map_err(|_| corrupt(seq))?;
                (Some((origin, f.origin_seq)), f.payload)
            } else {
                (None, record)
            };
            if pos >= from_pos
                && !each(&RecordView {
                    source: self.source,
                    seq,
                    pos,
                    stored_at_ms: self.stored_at_ms,
                    origin,
                    payload,
                })
            {
                return Ok(false);
            }
            seq += 1;
            n += 1;
        }
        if !it.is_clean() || n != self.count {
            return Err(corrupt(seq));
        }
        Ok(true)
    }
}

/// An app's store as the node holds it: open, or closed — never opened (its disk could not), or closed after a
/// fault — and kept to try again.
enum Slot {
    /// Boxed: a store is large beside a path, and slots are moved when apps are added.
    Open(Box<AppStore>),
    Closed(ClosedStore),
}

/// A store that is not open, and what reopening it must find.
struct ClosedStore {
    path: PathBuf,
    /// Records before this position were acknowledged or forwarded: the store is used again only if it holds them.
    acked_head: u64,
    /// The descriptors of the store as it was open, while anything still holds them: it is reopened only when they
    /// are all closed, so that its first connection reads what is on the disk.
    old: std::sync::Weak<sync::StoreFiles>,
    /// Why it is never reopened while the node runs.
    never: Option<Never>,
    /// Read every page before it is served, and why (the last run did not end cleanly); cleared once a whole
    /// check has passed.
    whole: Option<&'static str>,
    /// The check in progress on its own thread, if one runs.
    check: Option<RunningCheck>,
}

/// Why a closed store is never reopened while the node runs.
#[derive(Debug, Clone)]
pub enum Never {
    /// Deleted or replaced under the node: what happened.
    Gone(String),
    /// Its disk lost a write, or it is damaged: the whole reason, said again at every try.
    Other(String),
}

/// A check of a closed store on a `pure-check` thread ([`check::reopen_checked`]).
struct RunningCheck {
    handle: std::thread::JoinHandle<Result<AppStore, StoreError>>,
    progress: Arc<check::CheckProgress>,
    whole: Option<&'static str>,
}

/// The stores of all apps of a node, by app index. A store that could not be opened (a full or read-only disk)
/// has a closed slot: its app cannot store until [`Stores::retry`] opens it.
pub struct Stores {
    apps: Vec<Slot>,
    /// A store found damaged is moved aside and its app started with an empty one (`--accept-lost-state`).
    accept_lost: bool,
}

/// What a node knows at start about how its stores' last run ended ([`state::CleanStop`]).
#[derive(Debug, Clone, Default)]
pub struct StoreStart {
    /// Apps whose stores the last run closed cleanly: not checked whole.
    pub clean: std::collections::BTreeSet<String>,
    /// `--accept-lost-state`: a store found damaged is moved aside and its app starts with an empty store.
    pub accept_lost: bool,
}

impl StoreError {
    /// [`StoreError::NotWritable`] for this process's user.
    pub(crate) fn not_writable(path: &Path) -> Self {
        // SAFETY: geteuid has no preconditions and cannot fail.
        let uid = unsafe { libc::geteuid() };
        StoreError::NotWritable {
            path: path.to_path_buf(),
            uid,
        }
    }

    /// Whether this failure means the disk under the store may have lost a write it had taken: a failed sync (of
    /// the `-wal`, or of the file in a checkpoint), a checkpoint that does not read back, a filesystem gone
    /// read-only. No store on that disk is then used again while the node runs (docs/durability.md, "On a failing
    /// disk"). A write refused when it was made (a full disk, a file made immutable: `SQLITE_FULL`,
    /// `SQLITE_IOERR_WRITE`) was never taken, and is not one: its app stores again once it can.
    pub fn lost_a_write(&self) -> bool {
        match self {
            StoreError::Sync { .. }
            | StoreError::ReadOnly { .. }
            | StoreError::SameDisk { .. }
            | StoreError::LostWrite { .. } => true,
            StoreError::Checkpoint { source, .. } => !matches!(
                source.sqlite_error(),
                Some(e) if e.code == rusqlite::ErrorCode::DiskFull
                    || e.extended_code == rusqlite::ffi::SQLITE_IOERR_WRITE
            ),
            _ => false,
        }
    }

    /// Whether the operator must change something before the store can work: a store of a newer layout, a file that
    /// is not a database ([`StoreError::is_fatal_at_open`]), or a fleet's database that refuses this node's
    /// configuration ([`StoreError::DatabaseMisconfigured`]). A process stopped by one exits with EX_CONFIG, which
    /// systemd does not restart (docs/operations.md); a database that is down or unreachable is not one.
    pub fn is_configuration(&self) -> bool {
        self.is_fatal_at_open() || matches!(self, StoreError::DatabaseMisconfigured { .. })
    }

    /// Whether this failure of a fleet's database may pass by itself: the database down, restarting or out of
    /// connections, the network to it silent, or the connection lost (SQLSTATE classes 08, 53 and 57, or the
    /// client's own errors, which carry none). A tool that follows the database (`records --follow`) connects again
    /// after one; a fault of the configuration, or a statement the database refused, is not one.
    pub fn may_pass(&self) -> bool {
        match self {
            StoreError::DatabaseDown { .. }
            | StoreError::DatabaseSilent { .. }
            | StoreError::DatabaseLate { .. }
            | StoreError::StoreThreadGone { .. } => true,
            StoreError::Database { source, .. } | StoreError::DatabaseRead { source, .. } => {
                match source.code() {
                    None => true,
                    Some(code) => matches!(&code.code()[..2], "08" | "53" | "57"),
                }
            }
            _ => false,
        }
    }

    /// Whether this error is about the store's configuration or contents (a layout from a newer pure-serve, a file
    /// that is not a database) rather than the disk under it: such a store is refused at start; a disk that fails
    /// only stops its app, which is tried again.
    pub fn is_fatal_at_open(&self) -> bool {
        match self {
            StoreError::Layout { .. } | StoreError::Corrupt { .. } | StoreError::Damaged { .. } => {
                true
            }
            StoreError::Sqlite { source, .. } => matches!(
                source.sqlite_error_code(),
                Some(rusqlite::ErrorCode::NotADatabase | rusqlite::ErrorCode::DatabaseCorrupt)
            ),
            _ => false,
        }
    }
}

impl Stores {
    pub fn open(state_dir: &Path, apps: &[String]) -> Result<Self, StoreError> {
        let apps = apps
            .iter()
            .map(|a| AppStore::open(&app_store_path(state_dir, a)).map(|s| Slot::Open(Box::new(s))))
            .collect::<Result<_, _>>()?;
        Ok(Stores {
            apps,
            accept_lost: false,
        })
    }

    /// Whether a store found damaged is moved aside and its app started with an empty one.
    pub fn set_accept_lost(&mut self, accept: bool) {
        self.accept_lost = accept;
    }

    /// In-memory stores for `apps` (tests).
    pub fn open_in_memory(apps: &[String]) -> Result<Self, StoreError> {
        let apps = apps
            .iter()
            .map(|a| AppStore::open_in_memory(a).map(|s| Slot::Open(Box::new(s))))
            .collect::<Result<_, _>>()?;
        Ok(Stores {
            apps,
            accept_lost: false,
        })
    }

    /// The store of one app, if it is open.
    pub fn app(&self, app: AppIndex) -> Option<&AppStore> {
        match self.apps.get(app as usize) {
            Some(Slot::Open(s)) => Some(s),
            _ => None,
        }
    }

    /// The store of one app, to write, if it is open.
    pub fn app_mut(&mut self, app: AppIndex) -> Option<&mut AppStore> {
        match self.apps.get_mut(app as usize) {
            Some(Slot::Open(s)) => Some(s),
            _ => None,
        }
    }

    pub fn len(&self) -> usize {
        self.apps.len()
    }

    pub fn is_empty(&self) -> bool {
        self.apps.is_empty()
    }

    /// Adds the store of a new app (a reload that added one); it gets the next app index.
    pub fn push(&mut self, store: AppStore) -> AppIndex {
        self.apps.push(Slot::Open(Box::new(store)));
        (self.apps.len() - 1) as AppIndex
    }

    /// Adds an app whose store could not be opened at `path`; [`Stores::retry`] tries again.
    pub fn push_closed(&mut self, path: PathBuf) -> AppIndex {
        self.push_closed_with(path, None)
    }

    /// Adds an app whose store is opened only once a check has read it whole ([`Stores::retry`]), because `why`.
    pub fn push_to_check(&mut self, path: PathBuf, why: &'static str) -> AppIndex {
        self.push_closed_with(path, Some(why))
    }

    fn push_closed_with(&mut self, path: PathBuf, whole: Option<&'static str>) -> AppIndex {
        self.apps.push(Slot::Closed(ClosedStore {
            path,
            acked_head: 1,
            old: std::sync::Weak::new(),
            never: None,
            whole,
            check: None,
        }));
        (self.apps.len() - 1) as AppIndex
    }

    /// Adds an app whose store is never opened while the node runs (found damaged at start), because `why`.
    pub fn push_never(&mut self, path: PathBuf, why: String) -> AppIndex {
        self.apps.push(Slot::Closed(ClosedStore {
            path,
            acked_head: 1,
            old: std::sync::Weak::new(),
            never: Some(Never::Other(why)),
            whole: None,
            check: None,
        }));
        (self.apps.len() - 1) as AppIndex
    }

    /// Closes an app's store after a fault: its descriptors are never trusted again, and [`Stores::retry`] opens it
    /// anew only once it is found to hold every record before `acked_head`. `never`: the fault is one no reopening
    /// can mend while the node runs (the file was deleted or replaced, its disk lost a write), said again at every
    /// try.
    pub fn close_failed(&mut self, app: AppIndex, acked_head: u64, never: Option<Never>) {
        let Some(slot) = self.apps.get_mut(app as usize) else {
            return;
        };
        let closed = match slot {
            Slot::Open(store) => {
                if let Some(files) = &store.files {
                    files.fail();
                }
                ClosedStore {
                    path: store.path.clone(),
                    acked_head,
                    old: store
                        .files
                        .as_ref()
                        .map_or_else(std::sync::Weak::new, Arc::downgrade),
                    never,
                    // Read whole before it is served again: a store is never served damaged (issue 34).
                    whole: Some("it failed while the node ran"),
                    check: None,
                }
            }
            Slot::Closed(c) => ClosedStore {
                path: c.path.clone(),
                acked_head: c.acked_head.max(acked_head),
                old: c.old.clone(),
                never: never.or(c.never.take()),
                whole: c.whole,
                check: c.check.take(),
            },
        };
        // Dropping the store closes its connection (which never checkpoints on close) before its descriptors.
        *slot = Slot::Closed(closed);
    }

    /// Where an app's store is, open or closed.
    pub fn path(&self, app: AppIndex) -> Option<&Path> {
        match self.apps.get(app as usize)? {
            Slot::Open(s) => Some(&s.path),
            Slot::Closed(c) => Some(&c.path),
        }
    }

    /// Whether a closed store may be opened again while the node runs (not: deleted or replaced under the node,
    /// its disk lost a write, or found damaged).
    pub fn reopenable(&self, app: AppIndex) -> bool {
        !matches!(self.apps.get(app as usize), Some(Slot::Closed(c)) if c.never.is_some())
    }

    /// Tries to open a closed store again (a store that is open is left as it is). Returns whether it is open now.
    /// A store closed after a fault is reopened only when everything that held it is closed, the page cache of its
    /// files has been dropped so that what is read comes from the disk, and a reading of it with SQLite's
    /// wal-index rebuilt from the `-wal` on the disk holds every record before the position that was acknowledged
    /// (read whole, when its last run did not end cleanly); then it is opened for writing and must commit and sync
    /// a probe (issues 14, 34). The reading runs on a `pure-check` thread: until it is done this says
    /// [`StoreError::Checking`], and the caller asks again.
    pub fn retry(&mut self, app: AppIndex) -> Result<bool, StoreError> {
        let accept_lost = self.accept_lost;
        let Some(slot) = self.apps.get_mut(app as usize) else {
            return Ok(false);
        };
        let Slot::Closed(closed) = slot else {
            return Ok(true);
        };
        match &closed.never {
            Some(Never::Gone(what)) => {
                return Err(StoreError::Gone {
                    path: closed.path.clone(),
                    what: what.clone(),
                });
            }
            Some(Never::Other(why)) => {
                return Err(StoreError::NotAgain {
                    path: closed.path.clone(),
                    why: why.clone(),
                });
            }
            None => {}
        }
        if closed.old.strong_count() > 0 {
            return Err(StoreError::FailedEarlier {
                path: closed.path.clone(),
            });
        }
        let checking = |c: &RunningCheck, path: &Path| {
            let (read_mib, total_mib) = c.progress.mib();
            StoreError::Checking {
                path: path.to_path_buf(),
                why: c
                    .whole
                    .unwrap_or("after a fault, against what was acknowledged"),
                read_mib,
                total_mib,
            }
        };
        let Some(running) = closed.check.take() else {
            let wanted = check::Wanted {
                acked_head: closed.acked_head,
                whole: closed.whole,
                accept_lost,
            };
            let progress = Arc::new(check::CheckProgress::default());
            let (path, p) = (closed.path.clone(), progress.clone());
            let handle = std::thread::Builder::new()
                .name("pure-check".into())
                .spawn(move || check::reopen_checked(&path, wanted, &p))
                .map_err(|source| StoreError::Io {
                    path: closed.path.clone(),
                    source,
                })?;
            let running = RunningCheck {
                handle,
                progress,
                whole: closed.whole,
            };
            let e = checking(&running, &closed.path);
            closed.check = Some(running);
            return Err(e);
        };
        if !running.handle.is_finished() {
            let e = checking(&running, &closed.path);
            closed.check = Some(running);
            return Err(e);
        }
        let checked = running.handle.join().unwrap_or_else(|_| {
            Err(StoreError::NotAgain {
                path: closed.path.clone(),
                why: format!(
                    "the check of store {} ended in a panic (a bug: please report it with the log)",
                    closed.path.display()
                ),
            })
        });
        let mut store = match checked {
            Ok(store) => store,
            Err(e @ (StoreError::Damaged { .. } | StoreError::NotAgain { .. })) => {
                closed.never = Some(Never::Other(e.to_string()));
                return Err(e);
            }
            Err(e) => {
                // Read whole and sound, then not opened (no room on a full disk): the next try checks it against
                // the acks alone, not by reading it all again at every try.
                if running
                    .progress
                    .sound
                    .load(std::sync::atomic::Ordering::Relaxed)
                {
                    closed.whole = None;
                }
                return Err(e);
            }
        };
        // What was read whole need not be again (a full disk's next fault is checked against the acks alone).
        closed.whole = None;
        store.probe_write()?;
        *slot = Slot::Open(Box::new(store));
        Ok(true)
    }

    /// Whether an app's store is closed only until the descriptors of its last opening are all closed.
    pub fn closing(&self, app: AppIndex) -> bool {
        matches!(self.apps.get(app as usize), Some(Slot::Closed(c)) if c.old.strong_count() > 0)
    }

    /// Applies a turn: one transaction per app it touches, in app order, each synced before the next (durable on
    /// return, as with `synchronous=FULL`). On error the failing app's transaction
    /// is rolled back and the error returned; apps before it have committed. The node's host
    /// ([`crate::apps`]) applies apps one by one instead, so one failing store stops only its app.
    pub fn apply_turn(
        &mut self,
        turn: &Turn,
        senders: &AllowList,
    ) -> Result<Committed, StoreError> {
        let mut committed = Committed {
            turn: turn.id,
            ..Committed::default()
        };
        let mut per_app = pieces_of_turn(turn, senders, self.apps.len());
        let fetches = fetches_of_turn(turn, senders, self.apps.len());
        for (i, slot) in self.apps.iter_mut().enumerate() {
            let pieces = &mut per_app[i];
            let Slot::Open(store) = slot else { continue };
            if pieces.is_empty() && fetches[i].is_empty() {
                continue;
            }
            let applied = store.apply_with_down(pieces, &[], false, &fetches[i], &[])?;
            store.sync()?;
            committed.add(i as AppIndex, &applied, turn, senders);
        }
        Ok(committed)
    }
}

fn cannot_open(e: &rusqlite::Error) -> bool {
    e.sqlite_error_code() == Some(rusqlite::ErrorCode::CannotOpen)
}

/// A store a reader cannot open where it lies: its directory may not be written (a backup on a read-only mount),
/// so SQLite cannot make the `-shm` a WAL store is read through. With no `-wal` to read (or an empty one: after a
/// clean stop the file alone holds every record) the file is read as it is, immutable; with one, the records in it
/// would be missed, and the error says to copy the store with its `-wal`.
fn read_immutable(path: &Path, source: rusqlite::Error) -> Result<(Connection, i64), StoreError> {
    use std::os::unix::ffi::OsStrExt;
    let wal_bytes = std::fs::metadata(disk::wal_path(path)).map_or(0, |m| m.len());
    if wal_bytes > 0 {
        tracing::debug!("{}: {source}", path.display());
        return Err(StoreError::UnreadableHere {
            path: path.to_path_buf(),
        });
    }
    // A URI: the characters it gives a meaning to are escaped.
    let mut uri = String::from("file:");
    for &b in path.as_os_str().as_bytes() {
        match b {
            b'%' | b'?' | b'#' => uri.push_str(&format!("%{b:02X}")),
            _ if b.is_ascii() => uri.push(b as char),
            _ => uri.push_str(&format!("%{b:02X}")),
        }
    }
    uri.push_str("?immutable=1");
    let sql = |source| StoreError::Sqlite {
        path: path.to_path_buf(),
        source,
    };
    let conn = Connection::open_with_flags(
        &uri,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY
            | rusqlite::OpenFlags::SQLITE_OPEN_URI
            | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(sql)?;
    let version = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .map_err(sql)?;
    Ok((conn, version))
}

/// Whether the filesystem holding `path` refuses writes as read-only now (a path that cannot be looked at: no).
/// Asked only after a commit failed. ext4 after a disk error with `errors=remount-ro` ("emergency_ro" on newer
/// kernels) answers every write EROFS while `statvfs` may still say it is writable, so a file made beside the store
/// (and removed at once) tells when `statvfs` does not.
pub fn filesystem_read_only(path: &Path) -> bool {
    if std::fs::File::open(path).is_ok_and(|f| sync::is_read_only(&f)) {
        return true;
    }
    let probe = path.with_extension("write-probe");
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
    {
        Ok(_) => {
            let _ = std::fs::remove_file(&probe);
            false
        }
        Err(e) => e.raw_os_error() == Some(libc::EROFS),
    }
}

/// Drops what the page cache holds of a store's file and `-wal`, so that the next reading comes from the disk: a
/// page whose write-back failed stays in the cache, clean, and a reading of it would show data the disk does not
/// have. Dirty pages are written first (a sync that is not trusted: it only makes them droppable; its failure
/// means the disk still fails).
fn forget_cached_pages(path: &Path) -> Result<(), StoreError> {
    use std::os::fd::AsRawFd;
    for p in [path.to_path_buf(), disk::wal_path(path)] {
        let file = match std::fs::File::open(&p) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(source) => return Err(StoreError::OpenWal { path: p, source }),
        };
        if sync::is_read_only(&file) {
            return Err(StoreError::ReadOnly {
                path: path.to_path_buf(),
            });
        }
        file.sync_data().map_err(|e| StoreError::Sync {
            path: p.clone(),
            source: Arc::new(e),
        })?;
        // SAFETY: posix_fadvise on a descriptor we own; it only drops clean cached pages of the file.
        let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        if rc != 0 {
            return Err(StoreError::Sync {
                path: p,
                source: Arc::new(std::io::Error::from_raw_os_error(rc)),
            });
        }
    }
    Ok(())
}

/// The turn's items as pieces to apply, per app index (`apps` of them); source names from the allow-list.
pub fn pieces_of_turn<'a>(
    turn: &'a Turn,
    senders: &'a AllowList,
    apps: usize,
) -> Vec<Vec<Piece<'a>>> {
    let mut per_app: Vec<Vec<Piece<'a>>> = (0..apps).map(|_| Vec::new()).collect();
    for item in &turn.items {
        if let Some(pieces) = per_app.get_mut(item.app as usize) {
            pieces.push(Piece {
                source: senders.name(item.sender),
                first_seq: item.first_seq,
                count: item.count,
                format: item.format,
                records: turn.records_of(item),
            });
        }
    }
    per_app
}

/// The turn's downlink fetches, per app index (`apps` of them); sender names from the allow-list.
pub fn fetches_of_turn<'a>(
    turn: &'a Turn,
    senders: &'a AllowList,
    apps: usize,
) -> Vec<Vec<downlink::Fetch<'a>>> {
    let mut per_app: Vec<Vec<downlink::Fetch<'a>>> = (0..apps).map(|_| Vec::new()).collect();
    for (index, f) in turn.fetches.iter().enumerate() {
        if let Some(list) = per_app.get_mut(f.app as usize) {
            list.push(downlink::Fetch {
                index,
                source: senders.name(f.sender),
                heard: f.heard,
                from: f.from,
                room: f.room,
            });
        }
    }
    per_app
}

impl Committed {
    /// Adds one app's commit to the turn's outcome, naming its flows by sender index again.
    pub fn add(&mut self, app: AppIndex, applied: &Applied, turn: &Turn, senders: &AllowList) {
        for read in &applied.down.reads {
            if let Some(f) = turn.fetches.get(read.index) {
                self.down.push(crate::proto::turn::DownRead {
                    session: f.session,
                    app,
                    after: read.after,
                    last: read.last,
                    records: read.records.clone(),
                });
            }
        }
        self.stored_records += applied.stored;
        self.duplicate_records += applied.duplicate;
        self.gap_records += applied.gap;
        let by_name: HashMap<&str, u64> = applied
            .heard
            .iter()
            .map(|(n, h)| (n.as_str(), *h))
            .collect();
        let mut seen = std::collections::HashSet::new();
        for item in turn.items.iter().filter(|i| i.app == app) {
            if !seen.insert(item.sender) {
                continue;
            }
            if let Some(&heard) = by_name.get(senders.name(item.sender)) {
                self.heard.push(FlowHeard {
                    sender: item.sender,
                    app,
                    heard,
                });
            }
        }
    }
}

/// Opens the store of `app` under `state_dir` to read, with a helpful error if there is none.
pub fn open_app_for_reading(state_dir: &Path, app: &str) -> Result<AppStore, StoreError> {
    let path = app_store_path(state_dir, app);
    if !path.exists() {
        return Err(StoreError::NoSuchApp {
            app: app.to_string(),
            dir: state_dir.join("apps"),
            known: list_apps(state_dir).join(", "),
        });
    }
    // A store whose node is stopped is read without the mapped wal-index when its disk is full (store/disk.rs);
    // with a node running, the node has allocated it whole and reading maps only what is there.
    let alone = state::StateLock::holder(state_dir).is_none() && disk::room_to_open(&path).is_err();
    AppStore::open_read_with(&path, alone)
}

/// Names of the apps that have a store under `state_dir`, sorted.
pub fn list_apps(state_dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(state_dir.join("apps"))
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| {
                    e.file_name()
                        .to_str()
                        .and_then(|n| n.strip_suffix(".sqlite"))
                        .map(str::to_string)
                })
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::allow_list::SenderIndex;
    use crate::proto::turn::Apply;
    use crate::proto::wire::put_record;

    fn list() -> AllowList {
        AllowList::from_unique(vec![("a".into(), [1; 32]), ("b".into(), [2; 32])])
    }

    /// A turn of frames (sender, first_seq, count); record `s` has payload "s".
    fn turn(id: u64, frames: &[(SenderIndex, u64, u64)]) -> Turn {
        let mut t = Turn {
            id,
            ..Turn::default()
        };
        for &(sender, first_seq, count) in frames {
            let start = t.arena.len();
            for s in (0..count).map(|k| first_seq + k) {
                put_record(&mut t.arena, s.to_string().as_bytes());
            }
            t.items.push(Apply {
                session: 0,
                sender,
                app: 0,
                first_seq,
                count,
                format: RecordFormat::Plain,
                records: start..t.arena.len(),
            });
            t.record_count += count;
        }
        t
    }

    #[test]
    fn a_record_stored_at_the_epoch_is_stamped_not_unknown() {
        use std::time::{Duration, UNIX_EPOCH};
        assert_eq!(stamp_ms(UNIX_EPOCH), 1);
        assert_eq!(stamp_ms(UNIX_EPOCH - Duration::from_secs(5)), 1);
        assert_eq!(stamp_ms(UNIX_EPOCH + Duration::from_millis(7)), 7);
    }

    #[test]
    fn a_store_closed_after_a_fault_is_reopened_only_when_the_disk_holds_what_was_acked() {
        let dir = tempfile::tempdir().unwrap();
        let mut stores = Stores::open(dir.path(), &["main".to_string()]).unwrap();
        stores
            .apply_turn(&turn(1, &[(0, 1, 5), (1, 1, 3)]), &list())
            .unwrap();
        let head = stores.app(0).unwrap().head();
        assert_eq!(head, 9);
        // Everything acknowledged is there: reopened, and it commits.
        stores.close_failed(0, head, None);
        assert!(stores.app(0).is_none(), "closed at once");
        assert!(retried(&mut stores, 0).unwrap());
        assert_eq!(stores.app(0).unwrap().head(), head);
        // Not while the descriptors of the last opening are held (a sync of them in flight).
        let held = stores.app(0).unwrap().files().unwrap().clone();
        stores.close_failed(0, head, None);
        assert!(held.is_failed(), "never synced through again");
        assert!(stores.closing(0));
        assert!(matches!(
            retried(&mut stores, 0),
            Err(StoreError::FailedEarlier { .. })
        ));
        drop(held);
        assert!(!stores.closing(0));
        // Not while another reader holds it: its check needs the wal-index rebuilt from the disk.
        let reader = AppStore::open_read(&app_store_path(dir.path(), "main")).unwrap();
        assert_eq!(reader.read_head().unwrap(), head);
        let busy = retried(&mut stores, 0).unwrap_err();
        assert!(matches!(busy, StoreError::CheckBusy { .. }), "{busy}");
        drop(reader);
        assert!(retried(&mut stores, 0).unwrap());
        // Records acknowledged that the disk does not hold: never used again, and said so.
        stores.close_failed(0, head + 4, None);
        let lost = retried(&mut stores, 0).unwrap_err();
        let words = lost.to_string();
        assert!(
            matches!(
                lost,
                StoreError::Lost {
                    acked: 12,
                    found: 8,
                    ..
                }
            ),
            "{words}"
        );
        assert!(words.contains("the disk lost 4 records"), "{words}");
        assert!(stores.app(0).is_none());
        // A store deleted under the node is never reopened while it runs.
        stores.close_failed(0, 1, Some(Never::Gone("it was deleted".into())));
        assert!(matches!(
            retried(&mut stores, 0),
            Err(StoreError::Gone { .. })
        ));
    }

    /// [`Stores::retry`] until its check on its own thread is done.
    fn retried(stores: &mut Stores, app: AppIndex) -> Result<bool, StoreError> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            match stores.retry(app) {
                Err(StoreError::Checking { .. }) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                other => return other,
            }
        }
    }

    /// Zeroes `pages` pages of the store's file from page `from` (1-based), as a disk that lost their writes
    /// reads them back.
    fn zero_pages(path: &Path, from: u64, pages: u64) {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
        let size = 4096u64;
        f.write_all_at(&vec![0u8; (pages * size) as usize], (from - 1) * size)
            .unwrap();
        f.sync_all().unwrap();
    }

    /// A store with `n` chunks of 4 records of 100 B from sources `s0`…`s9`, checkpointed into its file and
    /// closed: what a clean stop leaves.
    fn store_in_file(dir: &Path, n: u64) -> PathBuf {
        let path = app_store_path(dir, "main");
        let mut store = AppStore::open(&path).unwrap();
        let mut seqs = [1u64; 10];
        for k in 0..n {
            let src = (k % 10) as usize;
            let name = format!("s{src}");
            let mut body = Vec::new();
            for _ in 0..4 {
                crate::proto::wire::put_record(&mut body, &[b'x'; 100]);
            }
            let mut pieces = [Piece {
                source: &name,
                first_seq: seqs[src],
                count: 4,
                format: RecordFormat::Plain,
                records: &body,
            }];
            store.apply(&mut pieces, &[], false).unwrap();
            seqs[src] += 4;
        }
        store.sync().unwrap();
        store.checkpoint().unwrap();
        drop(store);
        path
    }

    #[test]
    fn a_whole_check_finds_a_sound_store_sound_and_zeroed_pages_damaged_with_what_they_lost() {
        let dir = tempfile::tempdir().unwrap();
        let path = store_in_file(dir.path(), 400);
        let wanted = check::Wanted {
            acked_head: 1,
            whole: Some("a test"),
            accept_lost: false,
        };
        let progress = Arc::new(check::CheckProgress::default());
        let sound = check::reopen_checked(&path, wanted, &progress).unwrap();
        assert_eq!(sound.head(), 1601);
        drop(sound);
        assert!(progress.total.load(Ordering::Relaxed) > 100 << 10);
        // A run of pages the disk lost, in the middle of the file, as an outside test found them.
        zero_pages(&path, 20, 30);
        let Err(damaged) = check::reopen_checked(&path, wanted, &progress) else {
            panic!("zeroed pages found sound");
        };
        let words = damaged.to_string();
        assert!(matches!(damaged, StoreError::Damaged { .. }), "{words}");
        assert!(words.contains(&path.display().to_string()), "{words}");
        assert!(words.contains("--accept-lost-state"), "{words}");
        assert!(words.contains("outlets forwarded"), "{words}");
        // A check against the acks alone reads only the head's pages: the whole check is what sees this.
        let acks_only = check::Wanted {
            whole: None,
            ..wanted
        };
        assert!(check::reopen_checked(&path, acks_only, &progress).is_ok());
        // Told to go on without it: the files are moved aside and the app starts empty.
        let accept = check::Wanted {
            accept_lost: true,
            ..wanted
        };
        let fresh = check::reopen_checked(&path, accept, &progress).unwrap();
        assert_eq!(fresh.head(), 1);
        let aside: Vec<String> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(".damaged-"))
            .collect();
        assert!(!aside.is_empty(), "moved aside");
    }

    #[test]
    fn a_store_whose_sources_heard_more_than_its_chunks_hold_says_how_many_records_are_lost() {
        let dir = tempfile::tempdir().unwrap();
        let path = store_in_file(dir.path(), 40);
        {
            let conn = Connection::open(&path).unwrap();
            // As if the pages of a source's last chunks were lost with the rest sound: its heard counts them.
            conn.execute(
                "DELETE FROM chunks WHERE source = (SELECT id FROM sources WHERE name = 's3') AND first_seq > 4",
                [],
            )
            .unwrap();
        }
        let wanted = check::Wanted {
            acked_head: 1,
            whole: Some("a test"),
            accept_lost: false,
        };
        let progress = Arc::new(check::CheckProgress::default());
        let Err(e) = check::reopen_checked(&path, wanted, &progress) else {
            panic!("lost chunks found sound");
        };
        let words = e.to_string();
        assert!(
            words.contains("Known to be lost: 12 records of 1 sources"),
            "{words}"
        );
        assert!(
            words.contains("s3: heard 16, its chunks hold up to 4"),
            "{words}"
        );
        assert!(words.contains("not 1 to"), "positions with a gap: {words}");
    }

    #[test]
    fn a_checkpoint_whose_pages_do_not_read_back_from_the_disk_fails_the_store_before_the_wal_restarts()
     {
        let dir = tempfile::tempdir().unwrap();
        let path = app_store_path(dir.path(), "main");
        let mut store = AppStore::open(&path).unwrap();
        let mut body = Vec::new();
        for _ in 0..200 {
            crate::proto::wire::put_record(&mut body, &[b'y'; 100]);
        }
        let batch = |store: &mut AppStore, first_seq: u64| {
            let mut pieces = [Piece {
                source: "dev",
                first_seq,
                count: 200,
                format: RecordFormat::Plain,
                records: &body,
            }];
            store.apply(&mut pieces, &[], false).unwrap();
            store.sync().unwrap();
        };
        // A checkpoint of a disk that keeps its writes is read back and found whole.
        batch(&mut store, 1);
        store.checkpoint().unwrap();
        // The next one, as SQLite makes it; then what a dying card's ext4 did (research/036): a page it copied
        // reads back as zeros although its sync said 0.
        batch(&mut store, 201);
        let (_, checkpointed) = store
            .conn
            .wal_checkpoint_v2(Some("main"), rusqlite::wal::CheckpointMode::PASSIVE)
            .unwrap();
        assert!(checkpointed > 3, "{checkpointed}");
        let files = store.files().unwrap().clone();
        files.sync_after_checkpoint().unwrap();
        zero_pages(&path, 1, 1);
        let e = files.verify_checkpoint(checkpointed as u32).unwrap_err();
        let words = e.to_string();
        assert!(
            matches!(e, StoreError::LostWrite { page: 1, .. }),
            "{words}"
        );
        assert!(words.contains("reads back as zeros"), "{words}");
        assert!(
            e.lost_a_write(),
            "as a failed sync: no store on the disk is used again"
        );
        assert!(files.is_failed(), "never synced through again");
    }

    #[test]
    fn a_store_found_damaged_by_a_retry_is_never_tried_again_while_the_node_runs() {
        let dir = tempfile::tempdir().unwrap();
        let path = store_in_file(dir.path(), 400);
        zero_pages(&path, 20, 30);
        let mut stores = Stores::open(dir.path(), &[]).unwrap();
        stores.push_to_check(path, "a test");
        assert!(stores.reopenable(0));
        let e = retried(&mut stores, 0).unwrap_err();
        assert!(matches!(e, StoreError::Damaged { .. }), "{e}");
        assert!(!stores.reopenable(0), "not read again every few seconds");
        assert!(matches!(stores.retry(0), Err(StoreError::NotAgain { .. })));
    }

    fn stored(stores: &Stores) -> Vec<(String, u64, String)> {
        let mut v = Vec::new();
        stores
            .app(0)
            .unwrap()
            .for_each_record(None, |s, seq, p| {
                v.push((s.to_string(), seq, String::from_utf8(p.to_vec()).unwrap()));
                true
            })
            .unwrap();
        v
    }

    #[test]
    fn overlaps_gaps_and_reordering_store_each_record_once() {
        let senders = list();
        let mut stores = Stores::open_in_memory(&["main".into()]).unwrap();
        // Out of order within the turn (sorted before applying), a probe, and a gap for b.
        let c = stores
            .apply_turn(
                &turn(1, &[(0, 4, 3), (0, 1, 3), (1, 0, 0), (1, 5, 2)]),
                &senders,
            )
            .unwrap();
        assert_eq!(
            (c.stored_records, c.duplicate_records, c.gap_records),
            (6, 0, 2)
        );
        assert!(c.heard.contains(&FlowHeard {
            sender: 0,
            app: 0,
            heard: 6
        }));
        assert!(c.heard.contains(&FlowHeard {
            sender: 1,
            app: 0,
            heard: 0
        }));
        // A frame that overlaps what is stored: only its new tail is stored.
        let c = stores
            .apply_turn(&turn(2, &[(0, 5, 4), (0, 1, 2)]), &senders)
            .unwrap();
        assert_eq!(
            (c.stored_records, c.duplicate_records, c.gap_records),
            (2, 4, 0)
        );
        let got = stored(&stores);
        let want: Vec<_> = (1..=8)
            .map(|s| ("a".to_string(), s, s.to_string()))
            .collect();
        assert_eq!(got, want);
        assert_eq!(stores.app(0).unwrap().heard().unwrap()["a"], 8);
    }

    #[test]
    fn sequences_past_the_signed_range_are_a_gap_up_to_the_largest_u64() {
        let senders = list();
        let mut stores = Stores::open_in_memory(&["main".into()]).unwrap();
        let c = stores
            .apply_turn(
                &turn(1, &[(0, 1, 2), (0, u64::MAX, 1), (0, u64::MAX - 1, 2)]),
                &senders,
            )
            .unwrap();
        assert_eq!(
            (c.stored_records, c.duplicate_records, c.gap_records),
            (2, 0, 3)
        );
        assert_eq!(stores.app(0).unwrap().heard().unwrap()["a"], 2);
    }
}

#[cfg(test)]
mod layout_tests {
    use super::*;

    fn plain(records: &[&str]) -> Vec<u8> {
        let mut v = Vec::new();
        for r in records {
            crate::proto::wire::put_record(&mut v, r.as_bytes());
        }
        v
    }

    fn forwarded(origin: &str, first: u64, records: &[&str]) -> Vec<u8> {
        let mut v = Vec::new();
        for (i, r) in records.iter().enumerate() {
            Forwarded::put(&mut v, origin.as_bytes(), first + i as u64, r.as_bytes());
        }
        v
    }

    #[test]
    fn positions_follow_commit_order_over_all_sources() {
        let mut s = AppStore::open_in_memory("t").unwrap();
        assert_eq!(s.head(), 1);
        let a = plain(&["a1", "a2"]);
        let b = plain(&["b1"]);
        let mut pieces = vec![
            Piece {
                source: "b",
                first_seq: 1,
                count: 1,
                format: RecordFormat::Plain,
                records: &b,
            },
            Piece {
                source: "a",
                first_seq: 1,
                count: 2,
                format: RecordFormat::Plain,
                records: &a,
            },
        ];
        let applied = s.apply(&mut pieces, &[], true).unwrap();
        assert_eq!(applied.stored, 3);
        assert_eq!(s.head(), 4);
        let got: Vec<(u64, String, u64)> = applied
            .new_chunks
            .iter()
            .map(|c| (c.pos, c.source.clone(), c.count))
            .collect();
        assert_eq!(got, vec![(1, "a".into(), 2), (3, "b".into(), 1)]);
        // Reading from the middle of a chunk cuts it.
        let read = s.read_from(2, 100, 1 << 20).unwrap();
        assert_eq!(read.len(), 2);
        assert_eq!((read[0].pos, read[0].first_seq, read[0].count), (2, 2, 1));
        assert_eq!(read[0].records().collect::<Vec<_>>(), vec![&b"a2"[..]]);
        assert_eq!(read[1].pos, 3);
        assert!(s.read_from(4, 100, 1 << 20).unwrap().is_empty());
        assert_eq!(s.read_head().unwrap(), 4);
    }

    #[test]
    fn a_change_of_format_within_a_flow_splits_the_chunk_and_keeps_heard() {
        let mut s = AppStore::open_in_memory("t").unwrap();
        let p = plain(&["x1", "x2"]);
        let f = forwarded("dev7", 40, &["y1", "y2", "y3"]);
        let mut pieces = vec![
            Piece {
                source: "node-a",
                first_seq: 3,
                count: 3,
                format: RecordFormat::Forwarded,
                records: &f,
            },
            Piece {
                source: "node-a",
                first_seq: 1,
                count: 2,
                format: RecordFormat::Plain,
                records: &p,
            },
        ];
        let applied = s.apply(&mut pieces, &[("out", 7)], true).unwrap();
        assert_eq!(applied.heard, vec![("node-a".to_string(), 5)]);
        assert_eq!(applied.new_chunks.len(), 2);
        assert_eq!(s.heard_of("node-a").unwrap(), 5);
        assert_eq!(s.outlets_acked().unwrap()["out"], 7);
        let mut seen = Vec::new();
        s.for_each_record_view(None, 0, |r| {
            seen.push((
                r.seq,
                r.pos,
                r.origin.map(|(o, q)| (o.to_string(), q)),
                String::from_utf8(r.payload.to_vec()).unwrap(),
            ));
            true
        })
        .unwrap();
        assert_eq!(
            seen,
            vec![
                (1, 1, None, "x1".into()),
                (2, 2, None, "x2".into()),
                (3, 3, Some(("dev7".into(), 40)), "y1".into()),
                (4, 4, Some(("dev7".into(), 41)), "y2".into()),
                (5, 5, Some(("dev7".into(), 42)), "y3".into()),
            ]
        );
        // Outlet progress never goes back.
        s.apply(&mut [], &[("out", 3)], false).unwrap();
        assert_eq!(s.outlets_acked().unwrap()["out"], 7);
    }

    #[test]
    fn a_layout_1_store_is_migrated_with_positions_in_write_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("apps/main.sqlite");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        {
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch(
                "CREATE TABLE sources (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, heard INTEGER NOT NULL);
                 CREATE TABLE chunks (source INTEGER NOT NULL REFERENCES sources(id), first_seq INTEGER NOT NULL,
                     count INTEGER NOT NULL, body BLOB NOT NULL, PRIMARY KEY (source, first_seq));
                 PRAGMA user_version = 1;",
            )
            .unwrap();
            conn.execute("INSERT INTO sources VALUES (1, 'b', 3), (2, 'a', 1)", [])
                .unwrap();
            // Written in this order: b 1–2, a 1, b 3.
            for (src, first, recs) in [
                (1, 1, vec!["b1", "b2"]),
                (2, 1, vec!["a1"]),
                (1, 3, vec!["b3"]),
            ] {
                conn.execute(
                    "INSERT INTO chunks VALUES (?1, ?2, ?3, ?4)",
                    params![src, first, recs.len() as i64, plain(&recs)],
                )
                .unwrap();
            }
        }
        let s = AppStore::open(&path).unwrap();
        assert_eq!(s.head(), 5);
        let mut by_pos = Vec::new();
        s.for_each_record_view(None, 1, |r| {
            by_pos.push((r.pos, String::from_utf8(r.payload.to_vec()).unwrap()));
            true
        })
        .unwrap();
        assert_eq!(
            by_pos,
            vec![
                (1, "b1".into()),
                (2, "b2".into()),
                (3, "a1".into()),
                (4, "b3".into())
            ]
        );
        drop(s);
        // Opening again does not migrate twice.
        assert_eq!(AppStore::open(&path).unwrap().head(), 5);
        assert_eq!(AppStore::open_read(&path).unwrap().head(), 5);
    }
}

#[cfg(test)]
mod guard_cost {
    use super::*;
    use std::time::Instant;

    /// research/008-full-disk: what the file guard (two stats before and two after each commit, and the `-shm`
    /// kept allocated ahead) costs a commit of one record with `synchronous=FULL`. One store, the guard switched on
    /// and off every 100 commits, so both modes meet the same disk at the same moments; prints one JSON line. Run
    /// with `cargo test --release --lib guard_cost -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn commit_cost_with_and_without_the_file_guard() {
        const BLOCKS: u64 = 40;
        const PER_BLOCK: u64 = 100;
        let dir = tempfile::tempdir().unwrap();
        let record = {
            let mut v = Vec::new();
            crate::proto::wire::put_record(&mut v, &[7u8; 100]);
            v
        };
        let path = dir.path().join("apps/guard.sqlite");
        let mut s = AppStore::open(&path).unwrap();
        let mut parked = None;
        let (mut on, mut off) = (Vec::new(), Vec::new());
        let mut seq = 0;
        for block in 0..BLOCKS {
            // GUARD_COST_ODD: the guard on in the odd blocks instead, to see any bias of the order.
            let guarded = (block % 2 == 0) != std::env::var_os("GUARD_COST_ODD").is_some();
            if guarded {
                if let Some(g) = parked.take() {
                    s.guard = Some(g);
                }
            } else {
                parked = s.guard.take();
            }
            let started = Instant::now();
            for _ in 0..PER_BLOCK {
                seq += 1;
                let mut pieces = [Piece {
                    source: "dev",
                    first_seq: seq,
                    count: 1,
                    format: RecordFormat::Plain,
                    records: &record,
                }];
                // GUARD_COST_PARTS=verify: the off blocks do the guard's two checks by hand, without its -shm
                // allocation (to tell the parts' costs apart).
                let by_hand = !guarded && std::env::var_os("GUARD_COST_PARTS").is_some();
                if by_hand && let Some(g) = parked.as_mut() {
                    let _ = g.verify();
                }
                s.apply(&mut pieces, &[], false).unwrap();
                if by_hand && let Some(g) = parked.as_mut() {
                    let _ = g.verify();
                }
            }
            let us = started.elapsed().as_secs_f64() * 1e6 / PER_BLOCK as f64;
            if guarded { on.push(us) } else { off.push(us) }
        }
        if let Some(g) = parked.take() {
            s.guard = Some(g);
        }
        let g = s.guard.as_mut().unwrap();
        let started = Instant::now();
        for _ in 0..100_000 {
            g.verify().unwrap();
        }
        let verify_ns = started.elapsed().as_secs_f64() * 1e9 / 100_000.0;
        let median = |v: &mut Vec<f64>| {
            v.sort_by(|a, b| a.total_cmp(b));
            v[v.len() / 2]
        };
        println!(
            "{{\"bench\":\"guard_cost\",\"commits_per_mode\":{},\"guarded_us_median\":{:.1},\
             \"unguarded_us_median\":{:.1},\"verify_ns\":{verify_ns:.0}}}",
            BLOCKS / 2 * PER_BLOCK,
            median(&mut on),
            median(&mut off)
        );
    }

    /// research/014-failing-disk: what each way of checkpointing and syncing costs the commit path, side by side.
    /// Four stores on one disk, fed in turns the way the host feeds them (commit on this thread, the `-wal` synced
    /// on `pure-sync`, at most four turns waiting): `sqlite_auto` (SQLite's automatic checkpoint inside the commit
    /// every 1000 frames, errors ignored: the node before issue 14), `node` (the node: its own checkpoint after the
    /// commit every 1000 frames, checked, and the file synced through its own descriptor; `fdatasync` of the
    /// `-wal`), `node_fsync` (the same with `fsync`), and `sync_thread` (the first design: checkpoints on another
    /// thread through a connection of their own, every 1000 frames, while the writer goes on). The variants take
    /// turns block by block, so they meet the disk at the same moments. Prints one JSON line per variant, turn size
    /// and round: records per second, commit time on the loop (p50, p99, max), time from commit to synced (p50,
    /// p99) and the `-wal`'s size at the end. `CHECKPOINT_COSTS_DIR` chooses the disk (default: a temporary
    /// directory), `CHECKPOINT_COSTS_ROUNDS` the rounds (default 5). Run with
    /// `cargo test --release --lib checkpoint_costs -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn checkpoint_costs() {
        use crate::store::sync::Syncer;
        use std::sync::atomic::Ordering;
        let base = std::env::var_os("CHECKPOINT_COSTS_DIR").map(PathBuf::from);
        let dir = match &base {
            Some(b) => tempfile::tempdir_in(b).unwrap(),
            None => tempfile::tempdir().unwrap(),
        };
        let rounds: usize = std::env::var("CHECKPOINT_COSTS_ROUNDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(5);
        let mut one = Vec::new();
        crate::proto::wire::put_record(&mut one, &[7u8; 100]);
        let variants = [
            "sqlite_auto",
            "node",
            "node_unverified",
            "node_fsync",
            "sync_thread",
        ];
        for turn in [256u64, 4096] {
            let records: Vec<u8> = (0..turn).flat_map(|_| one.clone()).collect();
            // About 16 MiB of records per variant and round: several checkpoints each.
            let turns = (160_000 / turn).max(8);
            let mut stores: Vec<AppStore> = Vec::new();
            // The sync_thread variant's checkpointer: its own connection on a thread, told when 1000 frames more
            // were committed.
            let mut checkpointer = None;
            for v in variants {
                let path = dir.path().join(format!("apps/{v}-{turn}.sqlite"));
                let mut s = AppStore::open(&path).unwrap();
                // The node before issue 34: its checkpoints not read back from the disk (research/036).
                s.files
                    .as_ref()
                    .unwrap()
                    .verify_checkpoints
                    .store(v != "node_unverified", Ordering::Relaxed);
                match v {
                    // SQLite's own hook again (it replaces the node's), checkpointing inside the commit.
                    "sqlite_auto" => s
                        .conn
                        .pragma_update(None, "wal_autocheckpoint", 1000)
                        .unwrap(),
                    "sync_thread" => {
                        let frames = Arc::new(AtomicU32::new(0));
                        let hook = frames.clone();
                        s.conn
                            .wal_hook(Some(
                                move |_: &mut rusqlite::hooks::Wal, n: std::ffi::c_int| {
                                    hook.store(n.max(0) as u32, Ordering::Relaxed);
                                    Ok(())
                                },
                            ))
                            .unwrap();
                        let (tx, rx) = std::sync::mpsc::channel::<()>();
                        let conn = Connection::open(&path).unwrap();
                        no_checkpoints_behind_our_back(&conn).unwrap();
                        conn.pragma_query_value(None, "user_version", |r| r.get::<_, i64>(0))
                            .unwrap();
                        let files = s.files.clone().unwrap();
                        let thread = std::thread::spawn(move || {
                            while rx.recv().is_ok() {
                                conn.wal_checkpoint_v2(
                                    Some("main"),
                                    rusqlite::wal::CheckpointMode::PASSIVE,
                                )
                                .unwrap();
                                files.sync_after_checkpoint().unwrap();
                            }
                        });
                        checkpointer = Some((frames, tx, thread));
                    }
                    _ => {}
                }
                stores.push(s);
            }
            let mut next_seq = vec![1u64; variants.len()];
            let mut asked_at = 0u32;
            for round in 0..rounds {
                for (k, variant) in variants.iter().enumerate() {
                    let s = &mut stores[k];
                    let syncer = Syncer::start().unwrap();
                    let mut commits = Vec::new();
                    let mut acks = Vec::new();
                    let mut waiting: std::collections::VecDeque<(u64, Instant)> =
                        Default::default();
                    let started = Instant::now();
                    for t in 0..turns {
                        let mut pieces = [Piece {
                            source: "dev",
                            first_seq: next_seq[k],
                            count: turn,
                            format: RecordFormat::Plain,
                            records: &records,
                        }];
                        next_seq[k] += turn;
                        let c = Instant::now();
                        s.apply(&mut pieces, &[], false).unwrap();
                        commits.push(c.elapsed().as_secs_f64() * 1e6);
                        if *variant == "sync_thread"
                            && let Some((frames, tx, _)) = &checkpointer
                        {
                            let n = frames.load(Ordering::Relaxed);
                            if n < asked_at {
                                asked_at = 0;
                            }
                            if n - asked_at >= CHECKPOINT_FRAMES {
                                asked_at = n;
                                tx.send(()).unwrap();
                            }
                        }
                        let item = s.sync_item(0).unwrap();
                        item.1
                            .full_fsync
                            .store(*variant == "node_fsync", Ordering::Relaxed);
                        syncer.submit(t, vec![item]);
                        waiting.push_back((t, c));
                        let mut done = syncer.done();
                        loop {
                            for synced in done {
                                assert!(synced.failed.is_empty());
                                let (seq, at) = waiting.pop_front().unwrap();
                                assert_eq!(seq, synced.seq);
                                acks.push(at.elapsed().as_secs_f64() * 1e6);
                            }
                            // At most four turns wait for their sync, as in the host; all are done at the end.
                            let last = t + 1 == turns;
                            if waiting.len() <= 4 && (!last || waiting.is_empty()) {
                                break;
                            }
                            done = syncer.wait_done();
                        }
                    }
                    let secs = started.elapsed().as_secs_f64();
                    drop(syncer);
                    let wal = std::fs::metadata(disk::wal_path(s.path())).map_or(0, |m| m.len());
                    let pct = |v: &mut Vec<f64>, p: usize| {
                        v.sort_by(|a, b| a.total_cmp(b));
                        v[(v.len() * p / 100).min(v.len() - 1)]
                    };
                    println!(
                        "{{\"bench\":\"checkpoint_costs\",\"variant\":\"{variant}\",\"records_per_turn\":{turn},\
                         \"round\":{round},\"turns\":{turns},\"records_per_s\":{:.0},\"commit_us_p50\":{:.0},\
                         \"commit_us_p99\":{:.0},\"commit_us_max\":{:.0},\"synced_us_p50\":{:.0},\
                         \"synced_us_p99\":{:.0},\"wal_bytes\":{wal}}}",
                        (turns * turn) as f64 / secs,
                        pct(&mut commits, 50),
                        pct(&mut commits, 99),
                        pct(&mut commits, 100),
                        pct(&mut acks, 50),
                        pct(&mut acks, 99),
                    );
                }
            }
            if let Some((_, tx, thread)) = checkpointer.take() {
                drop(tx);
                thread.join().unwrap();
            }
        }
    }

    /// docs/durability.md: what `synchronous` costs, side by side — commits of 1 and of 256 records with FULL (the
    /// node's setting: on disk before the ack, through power loss), NORMAL (a power loss may lose the last commits
    /// of WAL, a process crash none) and OFF. Prints one JSON line per setting and batch: records per second and
    /// the median and 99th-percentile commit time (the part of an ack's latency the store adds). Run with
    /// `cargo test --release --lib durability_costs -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn durability_costs() {
        let dir = tempfile::tempdir().unwrap();
        let mut one = Vec::new();
        crate::proto::wire::put_record(&mut one, &[7u8; 100]);
        for batch in [1u64, 256] {
            let records: Vec<u8> = (0..batch).flat_map(|_| one.clone()).collect();
            let commits = if batch == 1 { 2000 } else { 400 };
            for sync in ["FULL", "NORMAL", "OFF"] {
                let path = dir.path().join(format!("apps/{sync}-{batch}.sqlite"));
                let mut s = AppStore::open(&path).unwrap();
                s.conn.pragma_update(None, "synchronous", sync).unwrap();
                let mut times = Vec::with_capacity(commits);
                let started = Instant::now();
                for c in 0..commits as u64 {
                    let mut pieces = [Piece {
                        source: "dev",
                        first_seq: c * batch + 1,
                        count: batch,
                        format: RecordFormat::Plain,
                        records: &records,
                    }];
                    let t = Instant::now();
                    s.apply(&mut pieces, &[], false).unwrap();
                    times.push(t.elapsed().as_secs_f64() * 1e6);
                }
                let secs = started.elapsed().as_secs_f64();
                times.sort_by(|a, b| a.total_cmp(b));
                println!(
                    "{{\"bench\":\"durability\",\"synchronous\":\"{sync}\",\"records_per_commit\":{batch},\
                     \"commits\":{commits},\"records_per_s\":{:.0},\"commit_us_p50\":{:.0},\"commit_us_p99\":{:.0}}}",
                    (commits as u64 * batch) as f64 / secs,
                    times[times.len() / 2],
                    times[times.len() * 99 / 100]
                );
            }
        }
    }
}
