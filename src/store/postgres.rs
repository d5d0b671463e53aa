//! The PostgreSQL engine behind [`TurnStore`]: one database shared by the nodes of a fleet (docs/scale-out.md).
//!
//! Everything it does runs on its own thread (`pure-store`) with a current-thread tokio runtime and one
//! connection (tokio-postgres), so no loop ever waits on a database round trip: [`TurnStore::submit`] queues the
//! turn, the thread applies each app's part in a transaction of its own, and the outcome comes back through a
//! queue and an eventfd ([`TurnStore::wake_fd`]) once COMMIT has returned — what the database made durable.
//!
//! A part is applied as docs/scale-out.md specifies ("A turn: one transaction per app"): the turn's new sources
//! made beforehand, then BEGIN and the source rows locked `FOR UPDATE` in name order (one wait); the frames cut
//! under the locks against the heard sequences found there, by the same code as SQLite's ([`super::cut_flow`]);
//! then the heard sequences moved **conditionally** (`WHERE heard = old`), the app's head row updated last (so
//! positions become visible in commit order), the chunks inserted from arrays, the outlets' progress, COMMIT (one
//! wait). Every statement is prepared, BEGIN and COMMIT included: a statement given as text is prepared first, a
//! round trip of its own, and in a pipeline it then reaches the server after the prepared ones queued behind it
//! (research/017, "A negative result").
//!
//! Two shortcuts of the record path (research/047), both giving each part the outcome the steps above give it:
//! a turn whose sources this connection knows (their rows, and the heard sequences it last read or committed) is
//! cut against those and written in **one wait**, its conditional heard update the check that nothing moved them
//! ([`try_parts`]); and turns of records that queued behind the one in hand are applied **together**, each app's
//! parts in one transaction and one WAL flush ([`Worker::gather`]).
//!
//! A part refused with a serialization failure or a deadlock, or whose conditional update finds a heard sequence
//! moved, is rolled back and applied again from the start (at most [`RETRIES`] times). A broken connection fails
//! the parts in hand (never acked: their outcome may be unknown), and so does a part the database leaves
//! unanswered for [`PART_WAIT`] (a hung server, which no TCP timeout sees), whose connection is then given up. It is made again **beside the jobs, not in
//! them**: while there is none, a try to connect starts every [`RECONNECT_EVERY`] (several may be under way at once
//! against a network that drops packets, each bounded by [`NET_TIMEOUT`]), and every part that needs the database
//! fails at once, naming why the last try failed. So a turn never waits behind a connection that cannot be made,
//! the host finishes its turns and tells its senders NOT_STORED while the database is away, and the first try that
//! gets through is counted ([`TurnStore::connections`]), which has the host probe its failed apps at once.
//!
//! Downlink (docs/scale-out.md, "Downlink on a fleet"): a part of pushes and LISTENs only runs both in one
//! transaction, the pushes first ([`try_down_part`]); a part that also stores records runs its pushes in a
//! transaction of their own before the part's. Either way each statement of the pushes is sent once for all of
//! them (arrays), a push is numbered under its flow's row lock and notifies the other nodes on [`DOWN_CHANNEL`],
//! and the part's LISTENs read, acknowledge and delete in its transaction. Every connection `LISTEN`s on that channel: its
//! task hands what it hears to the worker, which keeps other nodes' pushes for the host
//! ([`TurnStore::down_notices`]) and drops its own (by the backend's pid). A file pushed as pieces is such a push
//! too: stored once per push and app (`down_blobs`, `down_blob_bytes`), a range of sequences per sender
//! (`down_ranges`), its pieces read among the records by the LISTENs' one read, and its ranges deleted or moved up
//! and its references dropped by their one delete, as on one node ([`super::downlink`]).

use std::collections::{HashMap, HashSet, VecDeque};
use std::os::fd::RawFd;
use std::str::FromStr;
use std::sync::{Arc, Condvar, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::Duration;

use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, NoTls, Statement};

pub mod leases;

use super::downlink::{
    DownApplied, DownBlob, DownPush, FetchRead, OwnedFetch, PushOutcome, Pushed, outcomes_of,
};
use super::engine::{AppTurn, DownNotice, TurnOutcome, TurnStore};
use super::{Applied, Chunk, Piece, StoreError};
use crate::common::wake::Wake;
use crate::proto::turn::AppIndex;
use crate::proto::wire::RecordFormat;

/// The layout's version in `pure_layout` (docs/scale-out.md, "The schema").
pub const LAYOUT_VERSION: i32 = 1;

/// Tries of a part refused by the database for a reason a new try can cure (a serialization failure, a deadlock,
/// a heard sequence moved under the conditional update).
pub const RETRIES: u32 = 8;

/// While there is no connection, a new try to make one starts this often (tries under way are not waited for: one
/// that a dropping network holds for [`NET_TIMEOUT`] does not delay the next).
pub const RECONNECT_EVERY: Duration = Duration::from_millis(250);

/// Tries to connect under way at once, at most (a network that drops every packet holds each for
/// [`NET_TIMEOUT`]).
const TRIES_AT_ONCE: usize = 24;

/// How long the network to the database may stay silent before a connection is given up: to connect, for sent
/// bytes to be acknowledged (TCP_USER_TIMEOUT), and idle before keepalives start.
pub const NET_TIMEOUT: Duration = Duration::from_secs(5);

/// How long one app's part of a turn may wait for the database, its statements together, before its connection is
/// given up ([`Worker::part_unanswered`]). Far above what a part takes (milliseconds; a row lock another node's
/// session holds is released within [`IDLE_IN_TRANSACTION`] of it going silent), and a bound on what a server that
/// takes the bytes and answers nothing can hold a node's turns.
pub const PART_WAIT: Duration = Duration::from_secs(10);

/// How long a tool (`records --store`) waits for any one answer of the database — a connection made and set up,
/// a page of records — before it gives up, naming --store: a server that takes the connection and says nothing,
/// or answers what is not PostgreSQL, would otherwise hold it for ever (the node bounds its own waits by
/// [`NET_TIMEOUT`] and its leases).
pub const TOOL_WAIT: Duration = Duration::from_secs(10);

/// A session of a node that stays in a transaction without sending (cut off between a turn's two waits) is ended by
/// the database after this, so that its row locks do not stop the other nodes' turns on its senders for longer.
pub const IDLE_IN_TRANSACTION: &str = "5s";

/// The tables (docs/scale-out.md, "The schema"). `chunks.source` has no foreign key: a turn inserts a chunk only for
/// a source row it has locked a statement before, and no source row is ever deleted, so PostgreSQL's check (a
/// lookup and a lock per chunk row) could never fail and cost a quarter of its CPU per row when every record is a
/// row (research/031). Tables an earlier node made keep theirs. `sources` leaves half of each page free: every stored
/// turn moves its sources' heard sequences, and with room on the page PostgreSQL writes the new row version there
/// (a HOT update) with no new index entries; on full pages each move also wrote both indexes (research/047).
/// `down_flows` likewise: every push moves its flow's next sequence, and on full pages each move wrote its index
/// too (research/043, addendum 3).
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS pure_layout (version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS apps (
    id    SERIAL PRIMARY KEY,
    name  TEXT NOT NULL UNIQUE,
    head  BIGINT NOT NULL DEFAULT 1
);
CREATE TABLE IF NOT EXISTS sources (
    id    BIGSERIAL PRIMARY KEY,
    app   INTEGER NOT NULL REFERENCES apps(id),
    name  TEXT NOT NULL,
    heard BIGINT NOT NULL DEFAULT 0,
    UNIQUE (app, name)
) WITH (fillfactor = 50);
CREATE TABLE IF NOT EXISTS chunks (
    app       INTEGER NOT NULL,
    source    BIGINT NOT NULL,
    first_seq BIGINT NOT NULL,
    count     INTEGER NOT NULL,
    body      BYTEA NOT NULL,
    pos       BIGINT NOT NULL,
    stored_at BIGINT NOT NULL,
    format    SMALLINT NOT NULL,
    PRIMARY KEY (app, source, first_seq)
);
CREATE UNIQUE INDEX IF NOT EXISTS chunks_pos ON chunks (app, pos);
CREATE TABLE IF NOT EXISTS outlets (
    app         INTEGER NOT NULL REFERENCES apps(id),
    name        TEXT NOT NULL,
    acked       BIGINT NOT NULL DEFAULT 0,
    holder      TEXT,
    lease_until TIMESTAMPTZ,
    PRIMARY KEY (app, name)
);
CREATE TABLE IF NOT EXISTS outlet_starts (
    app INTEGER NOT NULL, name TEXT NOT NULL, kind TEXT NOT NULL, target TEXT NOT NULL, flow TEXT,
    start BIGINT NOT NULL, PRIMARY KEY (app, name)
);
CREATE TABLE IF NOT EXISTS down_flows (
    app      INTEGER NOT NULL REFERENCES apps(id),
    sender   TEXT NOT NULL,
    next_seq BIGINT NOT NULL,
    acked    BIGINT NOT NULL,
    PRIMARY KEY (app, sender)
) WITH (fillfactor = 50);
CREATE TABLE IF NOT EXISTS downlink (
    app        INTEGER NOT NULL,
    sender     TEXT NOT NULL,
    seq        BIGINT NOT NULL,
    payload    BYTEA NOT NULL,
    queued_at  BIGINT NOT NULL,
    expires_at BIGINT,
    PRIMARY KEY (app, sender, seq)
);
CREATE TABLE IF NOT EXISTS down_counts (
    app     INTEGER PRIMARY KEY REFERENCES apps(id),
    waiting BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS down_blobs (
    app       INTEGER NOT NULL REFERENCES apps(id),
    id        BIGSERIAL,
    piece_len INTEGER NOT NULL,
    pieces    BIGINT NOT NULL,
    refs      BIGINT NOT NULL,
    PRIMARY KEY (app, id)
);
CREATE TABLE IF NOT EXISTS down_blob_bytes (
    app   INTEGER NOT NULL,
    id    BIGINT NOT NULL,
    bytes BYTEA NOT NULL,
    PRIMARY KEY (app, id)
);
CREATE TABLE IF NOT EXISTS down_ranges (
    app         INTEGER NOT NULL,
    sender      TEXT NOT NULL,
    first_seq   BIGINT NOT NULL,
    last_seq    BIGINT NOT NULL,
    blob        BIGINT NOT NULL,
    first_piece BIGINT NOT NULL,
    queued_at   BIGINT NOT NULL,
    expires_at  BIGINT,
    PRIMARY KEY (app, sender, first_seq)
);
";

/// Every statement of the node is a lookup by key, and its plans are made once per connection, often while the tables
/// are small: a sequential scan chosen then would read every row on every turn once they are large (research/030).
/// So the node's connections never prefer one while an index can serve.
const PLANS: &str = "SET enable_seqscan = off";

/// The channel a push notifies the fleet's other nodes on (docs/scale-out.md, "Downlink on a fleet").
const DOWN_CHANNEL: &str = "pure_downlink";

/// How a new `chunks` table keeps its bodies (docs/scale-out.md, "The schema").
const CHUNK_BODIES: &str = "ALTER TABLE chunks ALTER COLUMN body SET STORAGE EXTERNAL";

/// How a new `down_blob_bytes` table keeps a file's bytes (docs/scale-out.md, "Downlink on a fleet"): uncompressed
/// out of line, so that a piece read with `substring` fetches only the TOAST chunks it covers.
const BLOB_BYTES: &str = "ALTER TABLE down_blob_bytes ALTER COLUMN bytes SET STORAGE EXTERNAL";

/// What the operator of a fleet's database must change before a node or a tool can use it
/// ([`StoreError::DatabaseMisconfigured`]): starting again cannot help, so a node stopped by one exits with EX_CONFIG
/// and systemd does not restart it (docs/operations.md, "What the node tells systemd").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DatabaseFault {
    /// The login was refused: a wrong password, a user that does not exist, or no line of the server's
    /// `pg_hba.conf` lets it in (SQLSTATE class 28).
    Login,
    /// The server asks for a password and none was given.
    NoPassword,
    /// The database the URL names is not there (SQLSTATE 3D000).
    NoDatabase,
    /// The user may not do what the node needs: make the tables at the first start, read and write them after
    /// (SQLSTATE 42501).
    NoPermission,
    /// The tables were made by a newer pure-serve (`pure_layout.version` above [`LAYOUT_VERSION`]).
    NewerLayout,
    /// `synchronous_commit` is off: a COMMIT that returned may be lost in a crash of the database.
    Asynchronous,
    /// The URL is not one PostgreSQL's client takes.
    Url,
    /// The URL asks for TLS (`sslmode=require`), which this pure-serve's client does not speak: every try would
    /// fail its handshake, and systemd would restart the node for ever.
    NoTls,
}

impl DatabaseFault {
    /// What to do about it, said once, naming the flag.
    pub fn fix(self) -> &'static str {
        match self {
            DatabaseFault::Login => {
                "check the user in --store and the password in --store-password-file, and that the server's \
                 pg_hba.conf lets that user in from this host"
            }
            DatabaseFault::NoPassword => {
                "write the database user's password on the first line of a file (mode 0600) and name it with \
                 --store-password-file"
            }
            DatabaseFault::NoDatabase => {
                "create it (as a superuser: createdb -O USER DATABASE), or name an existing one in --store"
            }
            DatabaseFault::NoPermission => {
                "the user must be allowed to make the tables at the first start (on PostgreSQL 15 and later: GRANT \
                 CREATE ON SCHEMA public TO USER, in that database as its owner) and to read and write them after \
                 (docs/scale-out.md)"
            }
            DatabaseFault::NewerLayout => {
                "run the newer pure-serve that made them, or name another database in --store"
            }
            DatabaseFault::Asynchronous => {
                "set synchronous_commit = on (the default) for the node's user: ALTER ROLE USER SET \
                 synchronous_commit = on"
            }
            DatabaseFault::Url => {
                "give --store as postgres://USER@HOST[:PORT]/DATABASE (docs/scale-out.md)"
            }
            DatabaseFault::NoTls => {
                "give sslmode=disable (or prefer) in --store, and reach the database over a private network or a \
                 tunnel: this pure-serve connects without TLS (docs/scale-out.md)"
            }
        }
    }
}

/// The fault of the operator's that `e` shows, if it shows one, with what the database (or the client) said.
fn fault_of(e: &tokio_postgres::Error) -> Option<(DatabaseFault, String)> {
    if let Some(db) = e.as_db_error() {
        let code = db.code().code();
        let fault = if code.starts_with("28") {
            DatabaseFault::Login
        } else if *db.code() == SqlState::INVALID_CATALOG_NAME {
            DatabaseFault::NoDatabase
        } else if *db.code() == SqlState::INSUFFICIENT_PRIVILEGE {
            DatabaseFault::NoPermission
        } else {
            return None;
        };
        return Some((fault, db.message().to_string()));
    }
    // The client's own refusal to go on without a password the server asked for (tokio-postgres has no kind for
    // it but its words).
    let cause = std::error::Error::source(e)?.to_string();
    (cause == "password missing").then(|| {
        (
            DatabaseFault::NoPassword,
            "the server asks for a password and none was given".to_string(),
        )
    })
}

/// `source` as a [`StoreError`]: [`StoreError::DatabaseMisconfigured`] if it shows a fault of the operator's, else
/// what `otherwise` makes of it.
fn classified(
    url: &str,
    doing: &'static str,
    source: tokio_postgres::Error,
    otherwise: impl FnOnce(String, &'static str, tokio_postgres::Error) -> StoreError,
) -> StoreError {
    match fault_of(&source) {
        Some((fault, what)) => StoreError::DatabaseMisconfigured {
            url: url.to_string(),
            doing,
            fault,
            what,
        },
        None => otherwise(url.to_string(), doing, source),
    }
}

/// Where the database is, for connections and for messages (without a password).
#[derive(Clone)]
struct Target {
    config: tokio_postgres::Config,
    /// The URL as given, for messages.
    shown: String,
}

enum Job {
    Turn(u64, Vec<AppTurn>),
    Heard(AppIndex, String, mpsc::Sender<Result<u64, StoreError>>),
    Head(AppIndex, mpsc::Sender<Result<u64, StoreError>>),
    /// Apps added by a reload: registered now if there is a connection, and by every connection made later.
    AddApps(Vec<String>),
}

struct Done {
    outcomes: Mutex<VecDeque<TurnOutcome>>,
    /// Pushes other nodes committed, heard on the connection's `LISTEN` ([`TurnStore::down_notices`]).
    notices: Mutex<Vec<DownNotice>>,
    changed: Condvar,
    wake: Wake,
    /// The store thread has ended (it panicked, or its queue closed): nothing more will come.
    gone: std::sync::atomic::AtomicBool,
    /// Connections made so far ([`TurnStore::connections`]).
    connections: std::sync::atomic::AtomicU64,
    /// Told by the host when it takes the database as out of reach ([`TurnStore::give_up_waiting`]): wakes only a
    /// part waiting now, and leaves no permit for the next.
    give_up: tokio::sync::Notify,
}

/// Held by the store thread: when it ends, however it ends, a waiter is told rather than left waiting.
struct EndsThread(Arc<Done>);

impl Drop for EndsThread {
    fn drop(&mut self) {
        self.0.gone.store(true, std::sync::atomic::Ordering::SeqCst);
        // Under the lock, so that a waiter between its check and its wait cannot miss it.
        let _held = lock(&self.0.outcomes);
        self.0.changed.notify_all();
        self.0.wake.wake();
    }
}

/// The engine: the handle the host keeps; the work is on the `pure-store` thread.
pub struct PostgresTurns {
    jobs: Option<tokio::sync::mpsc::UnboundedSender<Job>>,
    done: Arc<Done>,
    /// Turns submitted and not returned by [`TurnStore::done`] yet, with their apps, oldest first.
    in_flight: VecDeque<(u64, Vec<AppIndex>)>,
    shown: String,
    thread: Option<JoinHandle<()>>,
}

/// The connection settings of a node's own connections (its turns, its outbox): as [`config_of`], and only ever to
/// a server that takes writes. Of several hosts in the URL (`postgres://USER@H1,H2/DB`, docs/scale-out.md,
/// "A database that fails over") each connection tries them in order and keeps the first whose
/// `transaction_read_only` is off: the primary, never a standby. A server that accepts no writes after all (a
/// standby reached otherwise, a primary fenced read-only) refuses every write, and the connection is then made
/// again ([`Worker::until_done`]): nothing is acked through it.
fn writer_config_of(
    url: &str,
    password: Option<&str>,
    application: &str,
) -> Result<tokio_postgres::Config, StoreError> {
    let mut config = config_of(url, password, application)?;
    config.target_session_attrs(tokio_postgres::config::TargetSessionAttrs::ReadWrite);
    Ok(config)
}

/// Whether `e` is the refusal of a write by a server that takes none (SQLSTATE 25006): a standby, or a primary
/// made read-only.
fn write_refused(e: &StoreError) -> bool {
    matches!(e, StoreError::Database { source, .. }
        if source.code() == Some(&SqlState::READ_ONLY_SQL_TRANSACTION))
}

/// The connection settings `url` names, with the password from its file and the name the database shows for it.
fn config_of(
    url: &str,
    password: Option<&str>,
    application: &str,
) -> Result<tokio_postgres::Config, StoreError> {
    let mut config = tokio_postgres::Config::from_str(url).map_err(|source| {
        StoreError::DatabaseMisconfigured {
            url: url.to_string(),
            doing: "reading the URL",
            fault: DatabaseFault::Url,
            what: source.to_string(),
        }
    })?;
    if config.get_ssl_mode() == tokio_postgres::config::SslMode::Require {
        return Err(StoreError::DatabaseMisconfigured {
            url: url.to_string(),
            doing: "reading the URL",
            fault: DatabaseFault::NoTls,
            what: "it asks for TLS (sslmode=require)".to_string(),
        });
    }
    if let Some(p) = password {
        config.password(p);
    }
    config.application_name(application);
    Ok(config)
}

fn db_err<'a>(
    target: &'a Target,
    doing: &'static str,
) -> impl Fn(tokio_postgres::Error) -> StoreError + 'a {
    move |source| {
        classified(&target.shown, doing, source, |url, doing, source| {
            StoreError::Database { url, doing, source }
        })
    }
}

impl PostgresTurns {
    /// Connects to the database at `url` (`postgres://…`, docs/scale-out.md), makes its tables if they are not
    /// there, registers `apps` (app index = place in the list), and starts the store thread. The first connection
    /// is made here, so that a wrong address or a refused login stops the start with its reason.
    pub fn open(url: &str, password: Option<&str>, apps: &[String]) -> Result<Self, StoreError> {
        let mut config = writer_config_of(url, password, "pure-serve")?;
        // A database cut off by a firewall that drops packets must fail the turns in hand within seconds, not after
        // the kernel's 15 minutes of retransmissions: nothing is acked meanwhile, and the node says so once they
        // fail (docs/scale-out.md, "When the database is unreachable").
        config
            .connect_timeout(NET_TIMEOUT)
            .tcp_user_timeout(NET_TIMEOUT)
            .keepalives(true)
            .keepalives_idle(NET_TIMEOUT)
            .keepalives_interval(Duration::from_secs(1))
            .keepalives_retries(3);
        let target = Target {
            config,
            shown: url.to_string(),
        };
        let done = Arc::new(Done {
            outcomes: Mutex::new(VecDeque::new()),
            notices: Mutex::new(Vec::new()),
            changed: Condvar::new(),
            wake: Wake::new().map_err(|source| StoreError::SyncThread { source })?,
            gone: std::sync::atomic::AtomicBool::new(false),
            connections: std::sync::atomic::AtomicU64::new(0),
            give_up: tokio::sync::Notify::new(),
        });
        let (jobs, rx) = tokio::sync::mpsc::unbounded_channel();
        let (started_tx, started_rx) = mpsc::channel();
        let apps = apps.to_vec();
        let worker_done = done.clone();
        let thread = std::thread::Builder::new()
            .name("pure-store".into())
            .spawn(move || {
                let _ends = EndsThread(worker_done.clone());
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(source) => {
                        let _ = started_tx.send(Err(StoreError::SyncThread { source }));
                        return;
                    }
                };
                rt.block_on(async move {
                    let lost = Arc::new(tokio::sync::Notify::new());
                    let (heard_tx, heard) = tokio::sync::mpsc::unbounded_channel();
                    let conn = match make_conn(&target, &apps, lost.clone(), heard_tx.clone(), true)
                        .await
                    {
                        Ok(conn) => conn,
                        Err(e) => {
                            let _ = started_tx.send(Err(e));
                            return;
                        }
                    };
                    worker_done
                        .connections
                        .store(1, std::sync::atomic::Ordering::SeqCst);
                    let _ = started_tx.send(Ok(()));
                    let mut worker = Worker {
                        target,
                        apps: Arc::new(apps),
                        conn: Some(conn),
                        tries: tokio::task::JoinSet::new(),
                        last_failure: None,
                        lost,
                        heard_tx,
                        heard,
                        held: None,
                        spare: None,
                        spare_try: None,
                        spare_failed: None,
                    };
                    worker.serve(rx, &worker_done).await;
                });
            })
            .map_err(|source| StoreError::SyncThread { source })?;
        match started_rx.recv() {
            Ok(Ok(())) => Ok(PostgresTurns {
                jobs: Some(jobs),
                done,
                in_flight: VecDeque::new(),
                shown: url.to_string(),
                thread: Some(thread),
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                // At a start there is no turn in hand: the fix is the address.
                Err(match e {
                    StoreError::Database { url, doing, source } => {
                        StoreError::DatabaseRead { url, doing, source }
                    }
                    e => e,
                })
            }
            Err(_) => {
                let _ = thread.join();
                Err(StoreError::StoreThreadGone {
                    url: url.to_string(),
                })
            }
        }
    }

    fn ask(
        &mut self,
        job: impl FnOnce(mpsc::Sender<Result<u64, StoreError>>) -> Job,
    ) -> Result<u64, StoreError> {
        let gone = || StoreError::StoreThreadGone {
            url: self.shown.clone(),
        };
        let (tx, rx) = mpsc::channel();
        self.jobs
            .as_ref()
            .ok_or_else(gone)?
            .send(job(tx))
            .map_err(|_| gone())?;
        rx.recv().map_err(|_| gone())?
    }
}

impl TurnStore for PostgresTurns {
    fn submit(&mut self, seq: u64, parts: Vec<AppTurn>) {
        self.in_flight
            .push_back((seq, parts.iter().map(|p| p.app).collect()));
        // A turn the thread cannot take is failed by `done`, as every turn in flight when the thread ends.
        if let Some(jobs) = &self.jobs {
            let _ = jobs.send(Job::Turn(seq, parts));
        }
    }

    fn done(&mut self) -> Vec<TurnOutcome> {
        self.done.wake.clear();
        let mut out: Vec<TurnOutcome> = lock(&self.done.outcomes).drain(..).collect();
        for o in &out {
            if self.in_flight.front().is_some_and(|(seq, _)| *seq == o.seq) {
                self.in_flight.pop_front();
            }
        }
        let thread_gone = self.done.gone.load(std::sync::atomic::Ordering::SeqCst)
            || self.jobs.as_ref().is_none_or(|j| j.is_closed());
        if thread_gone && lock(&self.done.outcomes).is_empty() {
            // Nothing more will come: the turns in hand fail, and say so (none of them is acked).
            for (seq, apps) in self.in_flight.drain(..) {
                let apps = apps
                    .into_iter()
                    .map(|app| {
                        let e = StoreError::StoreThreadGone {
                            url: self.shown.clone(),
                        };
                        (app, Err(Arc::new(e)))
                    })
                    .collect();
                out.push(TurnOutcome {
                    seq,
                    apps,
                    pushes: Vec::new(),
                });
            }
        }
        out
    }

    fn wait_done(&mut self) -> Vec<TurnOutcome> {
        {
            let mut q = lock(&self.done.outcomes);
            while q.is_empty()
                && !self.in_flight.is_empty()
                && !self.done.gone.load(std::sync::atomic::Ordering::SeqCst)
            {
                q = self.done.changed.wait(q).unwrap_or_else(|p| p.into_inner());
            }
        }
        self.done()
    }

    fn wake_fd(&self) -> Option<RawFd> {
        Some(self.done.wake.fd())
    }

    fn waiting(&self) -> usize {
        self.in_flight.len()
    }

    fn heard_of(&mut self, app: AppIndex, source: &str) -> Result<u64, StoreError> {
        let source = source.to_string();
        self.ask(|tx| Job::Heard(app, source, tx))
    }

    fn head(&mut self, app: AppIndex) -> Result<u64, StoreError> {
        self.ask(|tx| Job::Head(app, tx))
    }

    fn add_apps(&mut self, names: &[String]) {
        // Queued before any turn that carries their parts, so the thread registers them first.
        if let Some(jobs) = &self.jobs {
            let _ = jobs.send(Job::AddApps(names.to_vec()));
        }
    }

    fn connections(&self) -> u64 {
        self.done
            .connections
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    fn down_notices(&mut self) -> Vec<DownNotice> {
        std::mem::take(&mut *lock(&self.done.notices))
    }

    fn give_up_waiting(&mut self) {
        self.done.give_up.notify_waiters();
    }
}

impl Drop for PostgresTurns {
    fn drop(&mut self) {
        // Closing the queue ends the thread once it has finished what was queued.
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The statements of a connection, prepared once.
struct Prepared {
    begin: Statement,
    commit: Statement,
    rollback: Statement,
    add_sources: Statement,
    lock_sources: Statement,
    set_heard: Statement,
    take_head: Statement,
    insert_chunks: Statement,
    set_outlets: Statement,
    heard_of: Statement,
    head_of: Statement,
    down: DownStatements,
}

/// The statements of downlink (docs/scale-out.md, "Downlink on a fleet").
struct DownStatements {
    count: Statement,
    ack: Statement,
    delete: Statement,
    read: Statement,
    /// A file pushed as pieces: its row locked if it is still there (by the id a committed push kept), an id for
    /// it if it must be written, written, referenced again, and its senders' ranges.
    blob_lock: Statement,
    blob_id: Statement,
    blob_insert: Statement,
    blob_ref: Statement,
    ranges_insert: Statement,
    /// A part's pushes, each statement once for all of them (arrays, as the LISTENs' statements take): a push of
    /// many's turn was seven statements a push, and a fleet queued about 3,500 lines a second (research/043).
    /// `count` above is the app's waiting count, moved once a part.
    add_flows: Statement,
    lock_flows: Statement,
    claim_flows: Statement,
    expire: Statement,
    waiting: Statement,
    insert: Statement,
    set_next: Statement,
    notify: Statement,
}

/// The references dropped to the blobs of the ranges a statement's CTE `rg` deleted (its `blob` column), the blobs'
/// rows locked first in id order and read again there, so that two transactions dropping references to one blob
/// at once (two devices that got the same file) each count from what the other left; a blob left with none is
/// deleted with its bytes (docs/scale-out.md, "Downlink on a fleet").
macro_rules! drop_blob_refs {
    () => {
        "rb AS (SELECT blob, count(*) AS k FROM rg GROUP BY blob), \
         bl AS (SELECT b.id, b.refs, rb.k FROM down_blobs b JOIN rb ON b.app = $1 AND b.id = rb.blob \
             ORDER BY b.id FOR UPDATE OF b), \
         bu AS (UPDATE down_blobs b SET refs = b.refs - bl.k FROM bl \
             WHERE b.app = $1 AND b.id = bl.id AND bl.refs > bl.k RETURNING 1), \
         bd AS (DELETE FROM down_blobs b USING bl \
             WHERE b.app = $1 AND b.id = bl.id AND bl.refs <= bl.k RETURNING b.id), \
         yd AS (DELETE FROM down_blob_bytes y USING bd WHERE y.app = $1 AND y.id = bd.id RETURNING 1)"
    };
}

/// What waits for a sender above a sequence and has not expired, records and a blob's pieces alike (`$1` the app,
/// `$5` now; `u.s` the sender and `u.h` the sequence): its records, and its ranges' pieces cut from their blob's
/// bytes with `substring` (only the TOAST chunks a piece covers are read: the bytes are stored uncompressed), at
/// most as many of a range as `u.lim` bytes of room can hold (every piece but a blob's last is `piece_len` bytes,
/// and a record takes a byte more than its payload), all of them at most `u.lim` in sequence order.
macro_rules! waiting_above {
    () => {
        "SELECT seq, payload FROM ( \
             (SELECT seq, payload FROM downlink \
              WHERE app = $1 AND sender = u.s AND seq > u.h AND (expires_at IS NULL OR expires_at > $5::bigint) \
              ORDER BY seq LIMIT u.lim) \
             UNION ALL \
             (SELECT p.seq, substring(y.bytes FROM ((r.first_piece + p.seq - r.first_seq) * b.piece_len + 1)::int \
                  FOR b.piece_len) \
              FROM down_ranges r JOIN down_blobs b ON b.app = r.app AND b.id = r.blob \
              JOIN down_blob_bytes y ON y.app = r.app AND y.id = r.blob \
              CROSS JOIN LATERAL generate_series(GREATEST(r.first_seq, u.h + 1), \
                  LEAST(r.last_seq, GREATEST(r.first_seq, u.h + 1) + u.lim / (b.piece_len + 1))) AS p(seq) \
              WHERE r.app = $1 AND r.sender = u.s AND r.last_seq > u.h \
                AND (r.expires_at IS NULL OR r.expires_at > $5::bigint)) \
         ) w ORDER BY seq LIMIT u.lim"
    };
}

struct Conn {
    client: Client,
    st: Prepared,
    /// The database's process serving this connection: notifications it sent itself are skipped.
    pid: i32,
    /// The database's id of each app, by app index.
    app_ids: Vec<i32>,
    /// Sources known to have a row, per app index (so a turn names only new ones to make), and where this
    /// connection knows it, the row's id and the heard sequence it last read or committed there: a turn of records
    /// cut against these is written in one wait, without locking the rows first ([`try_parts`]).
    known: HashMap<(AppIndex, String), Option<(i64, u64)>>,
}

struct Worker {
    target: Target,
    apps: Arc<Vec<String>>,
    conn: Option<Conn>,
    /// Tries to connect under way (module docs), while there is no connection.
    tries: tokio::task::JoinSet<Result<Conn, StoreError>>,
    /// Why the last try to connect failed, for the parts failed meanwhile.
    last_failure: Option<String>,
    /// Told by a connection's task when it ends, so that a connection lost while idle is made again at once.
    lost: Arc<tokio::sync::Notify>,
    /// Notifications every connection's task hears (the sending process's pid and the payload), and their end.
    heard_tx: tokio::sync::mpsc::UnboundedSender<(i32, String)>,
    heard: tokio::sync::mpsc::UnboundedReceiver<(i32, String)>,
    /// A job taken from the queue while gathering turns to apply together ([`Worker::gather`]) that could not join
    /// them: served next, before anything queued behind it.
    held: Option<Job>,
    /// A second connection, which takes half of the senders of a part of many pushes while the first takes the
    /// other half, both at once ([`Worker::apply_push_only`]): on one connection the database's one process for it
    /// was the bound of a push of many (research/050). Made beside the jobs when such a part first comes, and given
    /// up whenever the first connection is, or it fails.
    spare: Option<Conn>,
    spare_try: Option<tokio::task::JoinHandle<Result<Conn, StoreError>>>,
    /// When a try to make the spare last failed (a server at its `max_connections`, say): the next waits
    /// [`SPARE_AGAIN`], rather than every part of a push of many trying, and failing, again.
    spare_failed: Option<tokio::time::Instant>,
}

/// How long after a failed try to make the spare connection the next may start ([`Worker::spare_ready`]).
const SPARE_AGAIN: Duration = Duration::from_secs(10);

/// Turns applied together at most ([`Worker::gather`]), and the records they may carry between them: a
/// transaction of 8 full turns (131,072 records) takes tens of milliseconds, far within the host's bound on a
/// database's silence (750 ms, `STORE_SILENT` in src/apps/host/shared.rs).
const GATHER_TURNS: usize = 8;
const GATHER_RECORDS: u64 = 8 * crate::proto::node::TURN_RECORDS;

/// Whether a turn's parts may be applied in one transaction with the turns queued beside it: records (and outlets'
/// progress) only. Pushes, LISTENs and probes keep a transaction of their own per turn, as they are answered apart.
fn gatherable(parts: &[AppTurn]) -> bool {
    parts
        .iter()
        .all(|p| p.pushes.is_empty() && p.fetches.is_empty() && !p.is_probe())
}

fn records_in(parts: &[AppTurn]) -> u64 {
    parts
        .iter()
        .flat_map(|p| p.pieces.iter())
        .map(|p| p.count)
        .sum()
}

/// Why a part's transaction did not commit.
enum Refused {
    /// A new try may cure it (serialization failure, deadlock, a heard sequence moved).
    Retry,
    Failed(StoreError),
    /// The connection was lost after COMMIT was sent: it may have committed (a push's outcome says so).
    Unknown(StoreError),
}

/// What a failed statement of a transaction means for it: a try again if one may cure it, else the failure.
fn refusal<'a>(
    target: &'a Target,
    doing: &'static str,
) -> impl Fn(tokio_postgres::Error) -> Refused + 'a {
    move |e| {
        if retryable(&e) {
            Refused::Retry
        } else {
            Refused::Failed(db_err(target, doing)(e))
        }
    }
}

/// What a push's `pg_notify` says (docs/scale-out.md): the app's id, the sender's public key in base64, its name.
fn notice_of(app_id: i32, push: &DownPush) -> String {
    use base64::Engine as _;
    let key = base64::engine::general_purpose::STANDARD.encode(push.key);
    format!("{app_id} {key} {}", push.sender)
}

fn retryable(e: &tokio_postgres::Error) -> bool {
    matches!(
        e.code(),
        Some(c) if *c == SqlState::T_R_SERIALIZATION_FAILURE || *c == SqlState::T_R_DEADLOCK_DETECTED
    )
}

impl Worker {
    async fn serve(&mut self, mut rx: tokio::sync::mpsc::UnboundedReceiver<Job>, done: &Done) {
        let mut pace = tokio::time::interval(RECONNECT_EVERY);
        pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            self.drop_if_lost();
            if let Some(job) = self.held.take() {
                self.serve_queued(job, &mut rx, done).await;
                continue;
            }
            let no_conn = self.conn.is_none();
            let trying = !self.tries.is_empty();
            let may_try = no_conn && self.tries.len() < TRIES_AT_ONCE;
            tokio::select! {
                biased;
                Some(tried) = self.tries.join_next(), if trying => self.tried(tried, done),
                _ = pace.tick(), if may_try => self.try_connect(),
                () = self.lost.notified() => {}
                Some((pid, payload)) = self.heard.recv() => self.notified(pid, &payload, done),
                job = rx.recv() => match job {
                    Some(job) => self.serve_queued(job, &mut rx, done).await,
                    None => break,
                },
            }
        }
    }

    /// Serves `job`; a turn of records with the turns queued behind it that may join it ([`Worker::gather`]), in
    /// one transaction per app ([`try_parts`]).
    async fn serve_queued(
        &mut self,
        job: Job,
        rx: &mut tokio::sync::mpsc::UnboundedReceiver<Job>,
        done: &Done,
    ) {
        match job {
            Job::Turn(seq, parts) => {
                if gatherable(&parts) {
                    let group = self.gather(seq, parts, rx);
                    self.serve_together(group, done).await;
                } else {
                    self.serve_job(Job::Turn(seq, parts), done).await;
                }
            }
            job => self.serve_job(job, done).await,
        }
    }

    /// Turn `seq` (records only: [`gatherable`]) and the turns already queued behind it that may be applied with it
    /// (research/047): while the database is the bottleneck a node's turns queue here (a full turn is handed over
    /// whether or not earlier ones are done), and each paid its own round trips and its own WAL flush. Applied
    /// together, per app in one transaction, they pay them once — the group commit SQLite's sync thread gives the
    /// node's own store. Only turns of records, at most [`GATHER_TURNS`] and about [`GATHER_RECORDS`]; a job that
    /// cannot join is held and served next, so the queue's order is kept.
    fn gather(
        &mut self,
        seq: u64,
        parts: Vec<AppTurn>,
        rx: &mut tokio::sync::mpsc::UnboundedReceiver<Job>,
    ) -> Vec<(u64, Vec<AppTurn>)> {
        let mut records = records_in(&parts);
        let mut group = vec![(seq, parts)];
        while group.len() < GATHER_TURNS && records < GATHER_RECORDS {
            match rx.try_recv() {
                Ok(Job::Turn(seq, parts)) if gatherable(&parts) => {
                    records += records_in(&parts);
                    group.push((seq, parts));
                }
                Ok(job) => {
                    self.held = Some(job);
                    break;
                }
                Err(_) => break,
            }
        }
        group
    }

    /// Turns gathered by [`Worker::gather`]: each app's parts of all of them in one transaction ([`try_parts`]),
    /// each part's outcome as if the turns had committed one after another; then every turn's outcome, in order.
    /// A transaction that fails fails each of its parts (nothing of them is acked), as a part alone would.
    async fn serve_together(&mut self, group: Vec<(u64, Vec<AppTurn>)>, done: &Done) {
        let mut apps: Vec<AppIndex> = Vec::new();
        for p in group.iter().flat_map(|(_, parts)| parts) {
            if !apps.contains(&p.app) {
                apps.push(p.app);
            }
        }
        type PartResult = Result<Applied, Arc<StoreError>>;
        let mut results: HashMap<AppIndex, VecDeque<PartResult>> = HashMap::new();
        for app in apps {
            let parts: Vec<&AppTurn> = group
                .iter()
                .flat_map(|(_, parts)| parts.iter().filter(|p| p.app == app))
                .collect();
            let waited = tokio::select! {
                r = tokio::time::timeout(PART_WAIT, self.apply_together(app, &parts)) => Some(r),
                () = done.give_up.notified() => None,
            };
            let failed = |e: Arc<StoreError>| parts.iter().map(|_| Err(e.clone())).collect();
            let r: VecDeque<PartResult> = match waited {
                Some(Ok(Ok(applied))) => applied.into_iter().map(Ok).collect(),
                Some(Ok(Err(e))) => failed(Arc::new(e)),
                Some(Err(_)) => {
                    failed(Arc::new(self.read_unanswered("applying a turn", PART_WAIT)))
                }
                None => failed(self.given_up()),
            };
            results.insert(app, r);
        }
        {
            let mut outcomes = lock(&done.outcomes);
            for (seq, parts) in &group {
                let apps = parts
                    .iter()
                    .map(|p| {
                        let r = results
                            .get_mut(&p.app)
                            .and_then(VecDeque::pop_front)
                            .unwrap_or_else(|| {
                                Err(Arc::new(StoreError::StoreThreadGone {
                                    url: self.target.shown.clone(),
                                }))
                            });
                        (p.app, r)
                    })
                    .collect();
                outcomes.push_back(TurnOutcome {
                    seq: *seq,
                    apps,
                    pushes: Vec::new(),
                });
            }
        }
        done.changed.notify_all();
        done.wake.wake();
    }

    async fn serve_job(&mut self, job: Job, done: &Done) {
        match job {
            Job::Turn(seq, parts) => {
                let mut apps = Vec::with_capacity(parts.len());
                let mut pushes = Vec::new();
                for part in &parts {
                    let waited = tokio::select! {
                        r = tokio::time::timeout(PART_WAIT, self.apply_part(part)) => Some(r),
                        () = done.give_up.notified() => None,
                    };
                    let (r, pushed) = match waited {
                        Some(Ok(applied)) => applied,
                        Some(Err(_)) => self.part_unanswered(part),
                        None => self.part_given_up(part),
                    };
                    if !part.pushes.is_empty() {
                        pushes.push((part.app, pushed));
                    }
                    apps.push((part.app, r));
                }
                lock(&done.outcomes).push_back(TurnOutcome { seq, apps, pushes });
                done.changed.notify_all();
                done.wake.wake();
            }
            Job::Heard(app, source, reply) => {
                // A read for starts, tests and tools, which may wait for a connection to be made.
                let read = async {
                    self.connected_or_wait(done).await?;
                    self.heard_of(app, &source).await
                };
                let r = tokio::time::timeout(TOOL_WAIT, read).await;
                let _ = reply.send(r.unwrap_or_else(|_| {
                    Err(self.read_unanswered("reading a heard sequence", TOOL_WAIT))
                }));
            }
            Job::Head(app, reply) => {
                let read = async {
                    self.connected_or_wait(done).await?;
                    self.head_of(app).await
                };
                let r = tokio::time::timeout(TOOL_WAIT, read).await;
                let _ = reply.send(r.unwrap_or_else(|_| {
                    Err(self.read_unanswered("reading an app's head", TOOL_WAIT))
                }));
            }
            Job::AddApps(names) => {
                Arc::make_mut(&mut self.apps).extend(names.iter().cloned());
                // Made for the apps before: the next one made registers them all.
                self.drop_spare();
                if let Some(conn) = &mut self.conn
                    && let Err(e) =
                        register_apps(&conn.client, &self.target, &names, &mut conn.app_ids).await
                {
                    // A connection made again registers every app, these included.
                    tracing::warn!("{e}; the connection is made again to register them");
                    self.conn = None;
                }
            }
        }
    }

    /// A part the database did not finish within [`PART_WAIT`] (a server that takes the bytes and answers nothing: a
    /// stopped or hung backend, which neither `TCP_USER_TIMEOUT` nor keepalives notice, since its kernel answers
    /// for it). Its connection is given up, so the server rolls back what the part did unless its COMMIT had gone:
    /// its outcome is unknown, nothing of it is acked, and its pushes may or may not be queued. The next part
    /// finds no connection and a new one is made beside the turns, as after a lost connection.
    fn part_unanswered(
        &mut self,
        part: &AppTurn,
    ) -> (Result<Applied, Arc<StoreError>>, Vec<PushOutcome>) {
        let e = Arc::new(self.read_unanswered("applying a turn", PART_WAIT));
        let result = Err(e);
        let pushed = outcomes_of(&result, part.pushes.len(), true);
        (result, pushed)
    }

    /// A part the host gave up waiting for ([`TurnStore::give_up_waiting`]: the database out of reach by its
    /// reckoning). As for a part left unanswered ([`Worker::part_unanswered`]): the connection is given up, the
    /// part's outcome is unknown, it fails and nothing of it is acked; the next part finds no connection, and a
    /// new one is tried at once, beside the turns.
    fn part_given_up(
        &mut self,
        part: &AppTurn,
    ) -> (Result<Applied, Arc<StoreError>>, Vec<PushOutcome>) {
        let result = Err(self.given_up());
        let pushed = outcomes_of(&result, part.pushes.len(), true);
        (result, pushed)
    }

    /// Gives up the connection of a part the host gave up waiting for, and says why.
    fn given_up(&mut self) -> Arc<StoreError> {
        self.drop_spare();
        if self.conn.take().is_some() {
            tracing::warn!(
                "the fleet's database {} left a turn without an answer until the node took it as out of reach: the \
                 connection is given up and made again; nothing of that turn is acknowledged",
                self.target.shown
            );
        }
        Arc::new(StoreError::DatabaseDown {
            url: self.target.shown.clone(),
            why: "it left a turn without an answer, and the node gave up its connection".into(),
        })
    }

    /// Gives up the connection on which `doing` got no answer `within`, and says why.
    fn read_unanswered(&mut self, doing: &'static str, within: Duration) -> StoreError {
        self.drop_spare();
        if self.conn.take().is_some() {
            tracing::warn!(
                "the fleet's database {} answered nothing for {} s while {doing}: the connection is given up and made \
                 again; nothing of what it was doing is acknowledged",
                self.target.shown,
                within.as_secs()
            );
        }
        StoreError::DatabaseSilent {
            url: self.target.shown.clone(),
            doing,
            within,
        }
    }

    /// Forgets a connection that has closed (its error was reported by the statement that found it, if any).
    fn drop_if_lost(&mut self) {
        if self.conn.as_ref().is_some_and(|c| c.client.is_closed()) {
            tracing::warn!(
                "the connection to the fleet's database {} was lost; nothing is acknowledged until it is made again",
                self.target.shown
            );
            self.conn = None;
        }
        if self.spare.as_ref().is_some_and(|c| c.client.is_closed()) {
            self.spare = None;
        }
    }

    /// Gives up the spare connection, and a try to make one ([`Worker::spare`]).
    fn drop_spare(&mut self) {
        self.spare = None;
        if let Some(t) = self.spare_try.take() {
            t.abort();
        }
    }

    /// The spare connection if it is made; if it is not, a try to make one is started (when the first connection is
    /// there, so that a database away is not tried twice over) and the part in hand goes without it.
    async fn spare_ready(&mut self) -> Option<Conn> {
        if let Some(t) = &self.spare_try
            && t.is_finished()
        {
            let t = self.spare_try.take().expect("just seen");
            // Finished, so its answer is there at once.
            match t.await {
                Ok(Ok(conn)) if conn.app_ids.len() == self.apps.len() => {
                    if self.spare_failed.take().is_some() {
                        tracing::info!(
                            "the second connection to the fleet's database {} is made: pushes to many senders \
                             go on two connections again",
                            self.target.shown
                        );
                    }
                    self.spare = Some(conn);
                }
                Ok(Err(e)) => {
                    if self.spare_failed.is_none() {
                        // What the server said ("sorry, too many clients already"), not a turn's error.
                        let e = match &e {
                            StoreError::Database { source, .. } => source
                                .as_db_error()
                                .map_or_else(|| source.to_string(), |d| d.message().to_string()),
                            e => e.to_string(),
                        };
                        tracing::warn!(
                            "a second connection to the fleet's database {} could not be made ({e}): pushes to \
                             many senders go on one connection meanwhile, more slowly (research/050), and it is \
                             tried again every {} s; if the server is at its max_connections, raise it (a node \
                             holds up to three connections, docs/scale-out.md)",
                            self.target.shown,
                            SPARE_AGAIN.as_secs()
                        );
                    }
                    self.spare_failed = Some(tokio::time::Instant::now());
                }
                _ => {}
            }
        }
        self.drop_if_lost();
        let may_try = self
            .spare_failed
            .is_none_or(|at| at.elapsed() >= SPARE_AGAIN);
        if self.spare.is_none() && self.spare_try.is_none() && self.conn.is_some() && may_try {
            let (target, apps, lost, heard) = (
                self.target.clone(),
                self.apps.clone(),
                // Its end is not news: the worker sees it by `is_closed` when it next wants it.
                Arc::new(tokio::sync::Notify::new()),
                self.heard_tx.clone(),
            );
            self.spare_try = Some(tokio::spawn(async move {
                make_conn(&target, &apps, lost, heard, false).await
            }));
        }
        self.spare.take()
    }

    /// Starts a try to connect, beside the jobs.
    fn try_connect(&mut self) {
        let (target, apps, lost, heard) = (
            self.target.clone(),
            self.apps.clone(),
            self.lost.clone(),
            self.heard_tx.clone(),
        );
        self.tries
            .spawn(async move { make_conn(&target, &apps, lost, heard, true).await });
    }

    /// A notification on [`DOWN_CHANNEL`]: another node's push committed (`APP_ID KEY SENDER`). Kept for the host
    /// if the app is one of this node's; one of this connection's own pushes, or one that does not parse, is
    /// dropped (a notification is a wake, never the queue).
    fn notified(&mut self, pid: i32, payload: &str, done: &Done) {
        let Some(conn) = &self.conn else { return };
        if pid == conn.pid || self.spare.as_ref().is_some_and(|s| s.pid == pid) {
            return;
        }
        let mut words = payload.splitn(3, ' ');
        let (Some(app_id), Some(key), Some(sender)) = (words.next(), words.next(), words.next())
        else {
            return;
        };
        let Ok(app_id) = app_id.parse::<i32>() else {
            return;
        };
        let Some(app) = conn.app_ids.iter().position(|&id| id == app_id) else {
            return;
        };
        use base64::Engine as _;
        let Ok(key) = base64::engine::general_purpose::STANDARD.decode(key) else {
            return;
        };
        let Ok(key) = <[u8; 32]>::try_from(key.as_slice()) else {
            return;
        };
        lock(&done.notices).push(DownNotice {
            app: app as AppIndex,
            key,
            sender: sender.to_string(),
        });
        done.wake.wake();
    }

    /// A try to connect ended: the first that got through is the connection, and the others are given up.
    fn tried(
        &mut self,
        tried: Result<Result<Conn, StoreError>, tokio::task::JoinError>,
        done: &Done,
    ) {
        match tried {
            // Made for the apps before a reload added some: given up, and the next try registers them all.
            Ok(Ok(conn)) if conn.app_ids.len() != self.apps.len() => drop(conn),
            Ok(Ok(conn)) if self.conn.is_none() => {
                tracing::info!("connected to the fleet's database {}", self.target.shown);
                self.conn = Some(conn);
                self.last_failure = None;
                self.tries.abort_all();
                done.connections
                    .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                // The host probes its failed apps on this news, rather than at its next retry.
                done.wake.wake();
            }
            Ok(Ok(_)) => {}
            Ok(Err(e)) => self.last_failure = Some(e.to_string()),
            // Aborted, once another got through.
            Err(_) => {}
        }
    }

    /// The connection, or why there is none: a part never waits for one to be made (module docs).
    fn connection(&mut self) -> Result<&mut Conn, StoreError> {
        self.drop_if_lost();
        match self.conn.as_mut() {
            Some(conn) => Ok(conn),
            None => Err(StoreError::DatabaseDown {
                url: self.target.shown.clone(),
                why: self
                    .last_failure
                    .clone()
                    .unwrap_or_else(|| "the connection was lost and is being made again".into()),
            }),
        }
    }

    /// Waits for a connection if there is none (a try is started at once), for reads that may wait.
    async fn connected_or_wait(&mut self, done: &Done) -> Result<(), StoreError> {
        self.drop_if_lost();
        if self.conn.is_none() && self.tries.is_empty() {
            self.try_connect();
        }
        while self.conn.is_none() {
            match self.tries.join_next().await {
                Some(tried) => self.tried(tried, done),
                None => break,
            }
        }
        self.connection().map(|_| ())
    }

    async fn heard_of(&mut self, app: AppIndex, source: &str) -> Result<u64, StoreError> {
        let target = self.target.clone();
        let conn = self.connection()?;
        let id = match conn.app_ids.get(app as usize) {
            Some(&id) if id >= 0 => id,
            _ => return Err(StoreError::Closed { app }),
        };
        let rows = conn
            .client
            .query(&conn.st.heard_of, &[&id, &source])
            .await
            .map_err(db_err(&target, "reading a heard sequence"))?;
        Ok(rows.first().map_or(0, |r| r.get::<_, i64>(0) as u64))
    }

    async fn head_of(&mut self, app: AppIndex) -> Result<u64, StoreError> {
        let target = self.target.clone();
        let conn = self.connection()?;
        let id = match conn.app_ids.get(app as usize) {
            Some(&id) if id >= 0 => id,
            _ => return Err(StoreError::Closed { app }),
        };
        let row = conn
            .client
            .query_one(&conn.st.head_of, &[&id])
            .await
            .map_err(db_err(&target, "reading an app's head"))?;
        Ok(row.get::<_, i64>(0).max(1) as u64)
    }

    /// An empty part is a probe (a host asking whether a failed app can store again): it is answered after a round
    /// trip to the database, so that a connection that looks open but leads nowhere fails it.
    async fn probe(&mut self, app: AppIndex) -> Result<Applied, StoreError> {
        let head = self.head_of(app).await?;
        Ok(Applied {
            head,
            ..Applied::default()
        })
    }

    /// A part: its pushes, each in a transaction of its own, then its records, outlets and LISTENs in one (trying
    /// again what a new try may cure); the part's result, and each push's outcome apart from it.
    async fn apply_part(
        &mut self,
        part: &AppTurn,
    ) -> (Result<Applied, Arc<StoreError>>, Vec<PushOutcome>) {
        if part.is_probe() {
            return (self.probe(part.app).await.map_err(Arc::new), Vec::new());
        }
        let pushes_alone = part.pieces.is_empty() && part.outlets.is_empty();
        if !part.pushes.is_empty() && pushes_alone && !part.fetches.is_empty() {
            // The usual part of a push: the push, and the LISTEN of the session it was made for; one transaction.
            return settled(self.apply_down_part(part).await, part.pushes.len());
        }
        if !part.pushes.is_empty() && pushes_alone {
            return self.apply_push_only(part.app, &part.pushes).await;
        }
        // A part that also stores records: its pushes first, in one transaction of their own (a push of many's
        // 2,048 beside a device's records were 2,048 transactions, seconds of a turn), then the rest in another.
        let (pushed, waiting) = if part.pushes.is_empty() {
            (Vec::new(), None)
        } else {
            let (result, pushed) = self.apply_push_only(part.app, &part.pushes).await;
            (pushed, result.ok().and_then(|a| a.down.waiting))
        };
        let result = if part.pieces.is_empty() && part.outlets.is_empty() && part.fetches.is_empty()
        {
            Ok(Applied::default())
        } else {
            self.apply_turn_part(part).await
        };
        let result = result.map(|mut applied| {
            applied.down.waiting = applied.down.waiting.or(waiting);
            applied
        });
        (result.map_err(Arc::new), pushed)
    }

    /// A part's pushes without LISTENs: in one transaction ([`Worker::apply_pushes`]); or, when they go to many
    /// senders and carry no file ([`halves`]) and the spare connection is made, half of the senders on each
    /// connection, two transactions at once (research/050). Each sender's pushes are all in one of them, in their
    /// order, so each is numbered as in one transaction, and the turns after wait for both. The part's result is
    /// the first connection's (it says whether the app can store); a half the spare could not apply is applied on
    /// the first connection after the other, unless it may have committed (its pushes then say "maybe queued", as
    /// after a connection lost once COMMIT was sent), and the spare is made again for a later part.
    async fn apply_push_only(
        &mut self,
        app: AppIndex,
        pushes: &[DownPush],
    ) -> (Result<Applied, Arc<StoreError>>, Vec<PushOutcome>) {
        let split = match halves(pushes) {
            Some(split) => self.spare_ready().await.map(|spare| (split, spare)),
            None => None,
        };
        let Some(([mine, theirs], mut spare)) = split else {
            let all: Vec<&DownPush> = pushes.iter().collect();
            return settled(self.apply_pushes(app, &all).await, pushes.len());
        };
        let first: Vec<&DownPush> = mine.iter().map(|&i| &pushes[i]).collect();
        let second: Vec<&DownPush> = theirs.iter().map(|&i| &pushes[i]).collect();
        let target = self.target.clone();
        let ((a, a_at), (b, b_at)) = tokio::join!(
            async {
                let a = self.apply_pushes(app, &first).await;
                (a, std::time::Instant::now())
            },
            async {
                let b = until_done_on(&target, &mut spare, app, PUSH_REFUSED, async |t, c, id| {
                    try_down_part(t, c, id, &second, &[]).await
                })
                .await;
                (b, std::time::Instant::now())
            },
        );
        let (b, b_at) = match b {
            Ok(applied) => {
                self.spare = Some(spare);
                (Ok(applied), b_at)
            }
            Err((e, maybe)) => {
                tracing::warn!(
                    "a spare connection to the fleet's database {} failed ({e}); it is made again{}",
                    self.target.shown,
                    if maybe {
                        ", and the half of a part's pushes it was committing may or may not be queued"
                    } else {
                        ", and the half of a part's pushes it had is queued on the first connection"
                    }
                );
                drop(spare);
                if maybe {
                    (Err((e, true)), b_at)
                } else {
                    let b = self.apply_pushes(app, &second).await;
                    (b, std::time::Instant::now())
                }
            }
        };
        let (a, a_pushed) = settled(a, first.len());
        let (b, b_pushed) = settled(b, second.len());
        let mut pushed: Vec<Option<PushOutcome>> = vec![None; pushes.len()];
        for (&i, o) in mine.iter().zip(a_pushed).chain(theirs.iter().zip(b_pushed)) {
            pushed[i] = Some(o);
        }
        let pushed: Vec<PushOutcome> = pushed.into_iter().flatten().collect();
        let result = a.map(|mut applied| {
            // The app's waiting count as the later of the two transactions left it (the second to move its row
            // waited for the first's COMMIT, and counted both): the one whose count is the other's moved by its own
            // pushes; failing that (another node moved it between them), the one that finished last.
            if let (Some(wa), Ok(other)) = (applied.down.waiting, &b)
                && let Some(wb) = other.down.waiting
            {
                let b_later = if wb as i64 == wa as i64 + moved(other) {
                    true
                } else if wa as i64 == wb as i64 + moved(&applied) {
                    false
                } else {
                    b_at > a_at
                };
                if b_later {
                    applied.down.waiting = Some(wb);
                }
            }
            let done: Vec<(Pushed, u64)> = pushed
                .iter()
                .filter_map(|o| o.done().map(|(p, e)| (p.clone(), e)))
                .collect();
            if done.len() == pushes.len() {
                applied.down.pushes = done;
            }
            applied
        });
        (result, pushed)
    }

    /// A part's pushes in one transaction ([`try_down_part`] without LISTENs), tried again as a part is; or why not,
    /// and whether they may have been committed all the same.
    async fn apply_pushes(
        &mut self,
        app: AppIndex,
        pushes: &[&DownPush],
    ) -> Result<Applied, (StoreError, bool)> {
        self.until_done(app, PUSH_REFUSED, async |t, c, id| {
            try_down_part(t, c, id, pushes, &[]).await
        })
        .await
    }

    /// A part of pushes and LISTENs in one transaction ([`try_down_part`]), tried again as a part is; or why not, and
    /// whether its pushes may have been committed all the same.
    async fn apply_down_part(&mut self, part: &AppTurn) -> Result<Applied, (StoreError, bool)> {
        let pushes: Vec<&DownPush> = part.pushes.iter().collect();
        self.until_done(part.app, PUSH_REFUSED, async |t, c, id| {
            try_down_part(t, c, id, &pushes, &part.fetches).await
        })
        .await
    }

    /// Parts of one app from several turns, records only, in one transaction ([`try_parts`]): each part's outcome.
    async fn apply_together(
        &mut self,
        app: AppIndex,
        parts: &[&AppTurn],
    ) -> Result<Vec<Applied>, StoreError> {
        let said = "the turns are not acknowledged and their senders send again";
        self.until_done(app, ("a turn", said), async |t, c, id| {
            try_parts(t, c, id, parts).await
        })
        .await
        .map_err(|(e, _)| e)
    }

    /// A part's records, outlets and LISTENs in one transaction.
    async fn apply_turn_part(&mut self, part: &AppTurn) -> Result<Applied, StoreError> {
        let said = "the turn is not acknowledged and its senders send again";
        self.until_done(part.app, ("a turn", said), async |t, c, id| {
            try_part(t, c, id, part).await
        })
        .await
        .map_err(|(e, _)| e)
    }

    /// [`until_done_on`] the connection; a write refused by a server that takes none gives the connection up.
    async fn until_done<T>(
        &mut self,
        app: AppIndex,
        refused: (&'static str, &'static str),
        attempt: impl AsyncFnMut(&Target, &mut Conn, i32) -> Result<T, Refused>,
    ) -> Result<T, (StoreError, bool)> {
        let target = self.target.clone();
        let conn = self.connection().map_err(|e| (e, false))?;
        until_done_on(&target, conn, app, refused, attempt)
            .await
            .map_err(|(e, maybe)| self.unless_read_only(e, maybe))
    }

    /// A part's failure `e`, passed on; if it is a write refused by a server that takes none, the connection is
    /// given up first, so that the next is made to the server of the URL that takes writes (a failover).
    fn unless_read_only(&mut self, e: StoreError, maybe: bool) -> (StoreError, bool) {
        if write_refused(&e) && self.conn.take().is_some() {
            tracing::warn!(
                "the fleet's database {} takes no writes on this connection (a standby, or a primary made read-only): \
                 nothing is acknowledged through it; connecting again to the one that takes writes",
                self.target.shown
            );
        }
        (e, maybe)
    }
}

/// What a push refused too often is, and what that means ([`until_done_on`]).
const PUSH_REFUSED: (&str, &str) = ("a push", "nothing of it was queued");

/// Tries `attempt` (a transaction of app `app` on `conn`) until it is done, fails, or was refused [`RETRIES`] times
/// (then `refused.0` was refused too often, and `refused.1` says what that means): what it did, or why not and
/// whether it may have committed all the same (its connection was lost after COMMIT was sent).
async fn until_done_on<T>(
    target: &Target,
    conn: &mut Conn,
    app: AppIndex,
    (what, then): (&'static str, &'static str),
    mut attempt: impl AsyncFnMut(&Target, &mut Conn, i32) -> Result<T, Refused>,
) -> Result<T, (StoreError, bool)> {
    let app_id = match conn.app_ids.get(app as usize) {
        Some(&id) if id >= 0 => id,
        _ => return Err((StoreError::Closed { app }, false)),
    };
    let mut tries = 0;
    loop {
        match attempt(target, conn, app_id).await {
            Ok(done) => return Ok(done),
            Err(Refused::Retry) => {
                if !pause_to_retry(&mut tries).await {
                    return Err((refused_too_often(target, what, then), false));
                }
            }
            Err(Refused::Failed(e)) => return Err((e, false)),
            Err(Refused::Unknown(e)) => return Err((e, true)),
        }
    }
}

/// How much a transaction of pushes moved its app's waiting count: the records it queued less those that expired.
fn moved(applied: &Applied) -> i64 {
    applied
        .down
        .pushes
        .iter()
        .map(|(p, expired)| match p {
            Pushed::Queued { count, .. } => *count as i64 - *expired as i64,
            Pushed::Refused(_) => -(*expired as i64),
        })
        .sum()
}

/// What a part's pushes came to, and each push's outcome (all failed alike if they did not commit).
fn settled(
    r: Result<Applied, (StoreError, bool)>,
    count: usize,
) -> (Result<Applied, Arc<StoreError>>, Vec<PushOutcome>) {
    let (result, maybe_queued) = match r {
        Ok(applied) => (Ok(applied), false),
        Err((e, maybe_queued)) => (Err(Arc::new(e)), maybe_queued),
    };
    let pushed = outcomes_of(&result, count, maybe_queued);
    (result, pushed)
}

/// Distinct senders a part of pushes only must have for its pushes to be split over two connections
/// ([`Worker::apply_push_only`]): below it the second connection's round trips are not worth a second process.
const SPLIT_FROM: usize = 64;

/// The indexes of `pushes` in two halves by sender, alternately as each sender first comes (each sender's pushes
/// all in one half, in their order); `None` if they go to fewer than [`SPLIT_FROM`] senders, or if one carries a
/// file pushed as pieces (its bytes are written once, by the transaction that first queues it: two at once would
/// each write them).
fn halves(pushes: &[DownPush]) -> Option<[Vec<usize>; 2]> {
    if pushes.iter().any(|p| p.blob.is_some()) {
        return None;
    }
    let mut half_of: HashMap<&str, usize> = HashMap::new();
    let mut split = [Vec::new(), Vec::new()];
    for (i, p) in pushes.iter().enumerate() {
        let next = half_of.len() % 2;
        let half = *half_of.entry(p.sender.as_str()).or_insert(next);
        split[half].push(i);
    }
    (half_of.len() >= SPLIT_FROM).then_some(split)
}

/// After a refusal a new try may cure: waits a short, varying pause (so that two nodes refused together do not
/// collide again) and says to try again, or says to stop once [`RETRIES`] tries were refused.
async fn pause_to_retry(tries: &mut u32) -> bool {
    *tries += 1;
    if *tries >= RETRIES {
        return false;
    }
    let ms = 1 + (crate::store::now_ms() as u64 % 7) * (*tries as u64);
    tokio::time::sleep(Duration::from_millis(ms)).await;
    true
}

/// [`RETRIES`] tries of `what` were refused by serialization failures or deadlocks; `so` says what follows.
fn refused_too_often(target: &Target, what: &str, so: &str) -> StoreError {
    StoreError::DatabaseRefused {
        url: target.shown.clone(),
        why: format!(
            "it refused {what} {RETRIES} times in a row (serialization failures or deadlocks), so {so}"
        ),
    }
}

/// How many hosts the URL names, in its authority (`USER@H1:P1,H2:P2`) or its `host=` parameter (`?host=/a,/b`). Not
/// the client's count: it keeps the authority's `localhost` beside a `host=` directory, where libpq takes the
/// directory alone.
fn hosts_named(url: &str) -> usize {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let (before_query, query) = rest.split_once('?').unwrap_or((rest, ""));
    let authority = before_query.split('/').next().unwrap_or("");
    let hosts = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let in_authority = if hosts.is_empty() {
        0
    } else {
        hosts.split(',').count()
    };
    let in_query = query
        .split('&')
        .filter_map(|kv| kv.strip_prefix("host="))
        .map(|v| v.split(',').count())
        .max()
        .unwrap_or(0);
    in_authority.max(in_query)
}

/// Said once a process: a URL of several hosts is a database meant to fail over, and if its commits do not wait
/// for a standby, a promoted standby may lack what was acknowledged last (docs/scale-out.md, "A database that fails
/// over").
async fn warn_if_asynchronous(client: &Client, t: &Target, sync: &str) -> Result<(), StoreError> {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let standbys: String = client
        .query_one("SHOW synchronous_standby_names", &[])
        .await
        .map_err(db_err(t, "reading synchronous_standby_names"))?
        .get(0);
    let why = if standbys.trim().is_empty() {
        "its synchronous_standby_names is empty"
    } else if sync == "local" {
        "its synchronous_commit is local for this user"
    } else {
        return Ok(());
    };
    if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
        tracing::warn!(
            "the fleet's database {} names several hosts, but {why}, so a commit does not wait for a standby: if the \
             primary is lost and a standby promoted, the records acknowledged in the last moments before may be lost \
             (docs/scale-out.md, \"A database that fails over\")",
            t.shown
        );
    }
    Ok(())
}

/// The tables and indexes [`SCHEMA`] makes, by name, read from it so that the two never differ.
fn schema_objects() -> Vec<String> {
    SCHEMA
        .split(" IF NOT EXISTS ")
        .skip(1)
        .filter_map(|rest| rest.split([' ', '(']).next())
        .map(str::to_string)
        .collect()
}

/// Refuses tables whose `pure_layout` says a newer pure-serve made them.
async fn check_layout(client: &Client, t: &Target) -> Result<(), StoreError> {
    let doing = "reading the layout's version";
    let found: Option<i32> = client
        .query_one("SELECT max(version) FROM pure_layout", &[])
        .await
        .map_err(db_err(t, doing))?
        .get(0);
    match found {
        Some(found) if found > LAYOUT_VERSION => Err(StoreError::DatabaseMisconfigured {
            url: t.shown.clone(),
            doing,
            fault: DatabaseFault::NewerLayout,
            what: format!(
                "its tables have layout {found}, this pure-serve knows layouts up to {LAYOUT_VERSION}: they were \
                 made by a newer pure-serve"
            ),
        }),
        _ => Ok(()),
    }
}

/// Makes a connection: the settings checked, the tables made if they are not there, the apps registered, every
/// statement prepared. Bounded as a whole by twice [`NET_TIMEOUT`], whatever the network does.
/// A connection made and set up: the tables made if missing, `apps` registered, every statement prepared, and, if
/// `listen`, listening for other nodes' pushes (a spare connection does not: the worker's own connection hears them
/// once).
async fn make_conn(
    t: &Target,
    apps: &[String],
    lost: Arc<tokio::sync::Notify>,
    heard: tokio::sync::mpsc::UnboundedSender<(i32, String)>,
    listen: bool,
) -> Result<Conn, StoreError> {
    let within = make_conn_within(t, apps, lost, heard, listen);
    match tokio::time::timeout(2 * NET_TIMEOUT, within).await {
        Ok(made) => made,
        Err(_) => Err(StoreError::DatabaseSilent {
            url: t.shown.clone(),
            doing: "connecting",
            within: 2 * NET_TIMEOUT,
        }),
    }
}

async fn make_conn_within(
    t: &Target,
    apps: &[String],
    lost: Arc<tokio::sync::Notify>,
    heard: tokio::sync::mpsc::UnboundedSender<(i32, String)>,
    listen: bool,
) -> Result<Conn, StoreError> {
    let (client, mut connection) = t
        .config
        .connect(NoTls)
        .await
        .map_err(db_err(t, "connecting"))?;
    tokio::spawn(async move {
        // Driving the connection, its notifications are handed to the worker. Its error is the client's too
        // (`is_closed`), and reported by the statement that finds it.
        while let Some(Ok(message)) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            if let tokio_postgres::AsyncMessage::Notification(n) = message {
                let _ = heard.send((n.process_id(), n.payload().to_string()));
            }
        }
        lost.notify_one();
    });
    client
        .batch_execute(&format!(
            "SET idle_in_transaction_session_timeout = '{IDLE_IN_TRANSACTION}'; {PLANS}"
        ))
        .await
        .map_err(db_err(t, "setting the session's parameters"))?;
    let sync: String = client
        .query_one("SHOW synchronous_commit", &[])
        .await
        .map_err(db_err(t, "reading synchronous_commit"))?
        .get(0);
    if sync == "off" {
        return Err(StoreError::DatabaseMisconfigured {
            url: t.shown.clone(),
            doing: "reading synchronous_commit",
            fault: DatabaseFault::Asynchronous,
            what: "it is off, so a COMMIT that returned may still be lost in a crash of the database, and \
                   \"stored\" would not mean stored"
                .into(),
        });
    }
    if hosts_named(&t.shown) > 1 {
        warn_if_asynchronous(&client, t, &sync).await?;
    }
    // Tables of a newer layout are refused before anything is made beside them.
    let layout_there: bool = client
        .query_one("SELECT to_regclass('pure_layout') IS NOT NULL", &[])
        .await
        .map_err(db_err(t, "looking for the tables"))?
        .get(0);
    if layout_there {
        check_layout(&client, t).await?;
    }
    let (new_tables, new_blob_bytes): (bool, bool) = {
        let row = client
            .query_one(
                "SELECT to_regclass('chunks') IS NULL, to_regclass('down_blob_bytes') IS NULL",
                &[],
            )
            .await
            .map_err(db_err(t, "looking for the tables"))?;
        (row.get(0), row.get(1))
    };
    // Every table and index there (the usual start of every node but the first): nothing is made, so a role that
    // was only granted reading and writing the tables another role made may serve (docs/scale-out.md). `CREATE …
    // IF NOT EXISTS` would need the right to create in the schema, and the owner's for the index, even then.
    let missing: i64 = client
        .query_one(
            "SELECT count(*) FROM unnest($1::text[]) AS n WHERE to_regclass(n) IS NULL",
            &[&schema_objects()],
        )
        .await
        .map_err(db_err(t, "looking for the tables"))?
        .get(0);
    // Two nodes starting at once may both make the tables: one of them then finds a name taken, and tries again.
    let mut tries = 0;
    let mut made = missing == 0;
    while !made {
        match client.batch_execute(SCHEMA).await {
            Ok(()) => made = true,
            Err(e)
                if tries < 3
                    && matches!(e.code(), Some(c) if *c == SqlState::UNIQUE_VIOLATION
                        || *c == SqlState::DUPLICATE_TABLE || *c == SqlState::DUPLICATE_OBJECT) =>
            {
                tries += 1;
            }
            Err(e) => return Err(db_err(t, "making the tables")(e)),
        }
    }
    if new_tables {
        // Bodies uncompressed, as in SQLite: PostgreSQL's default tries pglz on every value over 2 KB, and a turn's
        // chunk is one; that cost 0.41 of the records/s (research/025). Only on tables this node made, since
        // only their owner may change them.
        client
            .batch_execute(CHUNK_BODIES)
            .await
            .map_err(db_err(t, "setting how chunk bodies are stored"))?;
    }
    if new_blob_bytes {
        client
            .batch_execute(BLOB_BYTES)
            .await
            .map_err(db_err(t, "setting how files pushed as pieces are stored"))?;
    }
    client
        .batch_execute(&format!(
            "INSERT INTO pure_layout (version) SELECT {LAYOUT_VERSION} \
             WHERE NOT EXISTS (SELECT 1 FROM pure_layout)"
        ))
        .await
        .map_err(db_err(t, "writing the layout's version"))?;
    check_layout(&client, t).await?;
    let mut app_ids = Vec::new();
    register_apps(&client, t, apps, &mut app_ids).await?;
    if listen {
        client
            .batch_execute(&format!("LISTEN {DOWN_CHANNEL}"))
            .await
            .map_err(db_err(t, "listening for other nodes' pushes"))?;
    }
    let pid: i32 = client
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .map_err(db_err(t, "reading the connection's process id"))?
        .get(0);
    let p = |sql: &'static str| {
        let client = &client;
        async move {
            client
                .prepare(sql)
                .await
                .map_err(db_err(t, "preparing a statement"))
        }
    };
    let st = Prepared {
        begin: p("BEGIN ISOLATION LEVEL READ COMMITTED").await?,
        commit: p("COMMIT").await?,
        rollback: p("ROLLBACK").await?,
        add_sources: p(
            "INSERT INTO sources (app, name) SELECT $1, n FROM unnest($2::text[]) AS n \
             ON CONFLICT (app, name) DO NOTHING",
        )
        .await?,
        // One index probe per name, locked in the names' order (sorted: every node locks a turn's rows in one
        // order). A filter over the app's rows, planned while `sources` was small, compared every source with
        // every name: seconds a turn at 100k sources (research/030).
        lock_sources: p(
            "SELECT s.id, s.name, s.heard FROM unnest($2::text[]) AS n(name) \
             CROSS JOIN LATERAL (SELECT id, name, heard FROM sources \
                 WHERE app = $1 AND name = n.name FOR UPDATE) s",
        )
        .await?,
        // The heard sequences moved only where they are still what the cut was made against; if any is not,
        // the division by zero aborts the transaction before the chunks behind it can commit (COMMIT is
        // pipelined behind, and becomes a ROLLBACK), and the turn is tried again.
        set_heard: p(
            "WITH moved AS (UPDATE sources s SET heard = u.new \
             FROM unnest($1::bigint[], $2::bigint[], $3::bigint[]) AS u(id, old, new) \
             WHERE s.id = u.id AND s.heard = u.old RETURNING 1) \
             SELECT 1 / ((SELECT count(*) FROM moved) = $4)::int",
        )
        .await?,
        take_head: p("UPDATE apps SET head = head + $2 WHERE id = $1 RETURNING head").await?,
        insert_chunks: p(
            "INSERT INTO chunks (app, source, first_seq, count, body, pos, stored_at, format) \
             SELECT $1, u.s, u.f, u.c, u.b, a.head - $2 + u.o, $3, u.fm \
             FROM unnest($4::bigint[], $5::bigint[], $6::int[], $7::bytea[], $8::bigint[], $9::smallint[]) \
                  AS u(s, f, c, b, o, fm), apps a \
             WHERE a.id = $1",
        )
        .await?,
        set_outlets: p(
            "INSERT INTO outlets (app, name, acked) SELECT $1, u.n, u.a \
             FROM unnest($2::text[], $3::bigint[]) AS u(n, a) \
             ON CONFLICT (app, name) DO UPDATE SET acked = GREATEST(outlets.acked, excluded.acked)",
        )
        .await?,
        heard_of: p("SELECT heard FROM sources WHERE app = $1 AND name = $2").await?,
        head_of: p("SELECT head FROM apps WHERE id = $1").await?,
        down: DownStatements {
            count: p(
                "INSERT INTO down_counts (app, waiting) VALUES ($1, GREATEST($2::bigint, 0)) \
                 ON CONFLICT (app) DO UPDATE SET waiting = GREATEST(down_counts.waiting + $2::bigint, 0) \
                 RETURNING waiting",
            )
            .await?,
            // Writes (and locks) only flows whose acknowledged sequence moves, so that a LISTEN that acknowledges
            // nothing new leaves its transaction read-only, and its COMMIT waits for no WAL flush (research/029).
            ack: p(
                "WITH moved AS (UPDATE down_flows d SET acked = u.h, next_seq = GREATEST(d.next_seq, u.h + 1) \
                     FROM unnest($2::text[], $3::bigint[]) AS u(s, h) \
                     WHERE d.app = $1 AND d.sender = u.s AND d.acked < u.h RETURNING 1) \
                 INSERT INTO down_flows (app, sender, next_seq, acked) \
                 SELECT $1, u.s, u.h + 1, u.h FROM unnest($2::text[], $3::bigint[]) AS u(s, h) \
                 WHERE u.h > 0 AND NOT EXISTS \
                     (SELECT 1 FROM down_flows f WHERE f.app = $1 AND f.sender = u.s) \
                 ON CONFLICT (app, sender) DO UPDATE SET acked = excluded.acked, \
                     next_seq = GREATEST(down_flows.next_seq, excluded.next_seq) \
                 WHERE excluded.acked > down_flows.acked",
            )
            .await?,
            // What the devices have and what expired: records deleted, ranges wholly at or below `heard` (or
            // expired) deleted with their blobs' references, a range that goes on above `heard` moved up to begin
            // at `heard + 1`, at the piece that is.
            delete: p(concat!(
                "WITH gone AS (DELETE FROM downlink d USING unnest($2::text[], $3::bigint[]) AS u(s, h) \
                     WHERE d.app = $1 AND d.sender = u.s AND (d.seq <= u.h OR d.expires_at <= $4::bigint) \
                     RETURNING d.seq <= u.h AS delivered), \
                 rg AS (DELETE FROM down_ranges r USING unnest($2::text[], $3::bigint[]) AS u(s, h) \
                     WHERE r.app = $1 AND r.sender = u.s AND (r.last_seq <= u.h OR r.expires_at <= $4::bigint) \
                     RETURNING r.blob, r.last_seq - r.first_seq + 1 AS n, r.last_seq <= u.h AS delivered), \
                 mv AS (SELECT r.sender, r.first_seq, u.h \
                     FROM unnest($2::text[], $3::bigint[]) AS u(s, h) JOIN down_ranges r \
                         ON r.app = $1 AND r.sender = u.s AND r.first_seq <= u.h \
                     WHERE r.last_seq > u.h AND (r.expires_at IS NULL OR r.expires_at > $4::bigint)), \
                 rm AS (UPDATE down_ranges r \
                     SET first_piece = r.first_piece + (mv.h + 1 - r.first_seq), first_seq = mv.h + 1 FROM mv \
                     WHERE r.app = $1 AND r.sender = mv.sender AND r.first_seq = mv.first_seq \
                     RETURNING mv.h + 1 - mv.first_seq AS n), ",
                drop_blob_refs!(),
                ", n AS (SELECT (SELECT count(*) FILTER (WHERE delivered) FROM gone) \
                         + (SELECT COALESCE(sum(n) FILTER (WHERE delivered), 0) FROM rg)::bigint \
                         + (SELECT COALESCE(sum(n), 0) FROM rm)::bigint AS d, \
                     (SELECT count(*) FILTER (WHERE NOT delivered) FROM gone) \
                         + (SELECT COALESCE(sum(n) FILTER (WHERE NOT delivered), 0) FROM rg)::bigint AS e), \
                 c AS (UPDATE down_counts SET waiting = GREATEST(waiting - (SELECT d + e FROM n), 0) \
                     WHERE app = $1 AND (SELECT d + e FROM n) > 0 RETURNING waiting) \
                 SELECT n.d, n.e, (SELECT waiting FROM c) FROM n"
            ))
            .await?,
            // Per LISTEN, records and pieces merged in sequence order above its `from`, and the last sequence
            // waiting there (records or pieces; none: NULL).
            read: p(concat!(
                "SELECT u.i, d.seq, d.payload, m.last \
                 FROM unnest($2::text[], $3::bigint[], $4::int[]) WITH ORDINALITY AS u(s, h, lim, i) \
                 LEFT JOIN LATERAL (",
                waiting_above!(),
                ") d ON true \
                 CROSS JOIN LATERAL (SELECT GREATEST( \
                     (SELECT max(seq) FROM downlink WHERE app = $1 AND sender = u.s AND seq > u.h \
                         AND (expires_at IS NULL OR expires_at > $5::bigint)), \
                     (SELECT max(last_seq) FROM down_ranges WHERE app = $1 AND sender = u.s AND last_seq > u.h \
                         AND (expires_at IS NULL OR expires_at > $5::bigint))) AS last) m \
                 ORDER BY u.i, d.seq"
            ))
            .await?,
            blob_lock: p(
                "SELECT id FROM down_blobs WHERE app = $1 AND id = $2 AND refs > 0 FOR UPDATE",
            )
            .await?,
            blob_id: p("SELECT nextval(pg_get_serial_sequence('down_blobs', 'id'))").await?,
            blob_insert: p(
                "WITH b AS (INSERT INTO down_blobs (app, id, piece_len, pieces, refs) \
                     VALUES ($1, $2, $3::int, $4::bigint, $5::bigint)) \
                 INSERT INTO down_blob_bytes (app, id, bytes) VALUES ($1, $2, $6)",
            )
            .await?,
            blob_ref: p("UPDATE down_blobs SET refs = refs + $3::bigint WHERE app = $1 AND id = $2").await?,
            ranges_insert: p(
                "INSERT INTO down_ranges (app, sender, first_seq, last_seq, blob, first_piece, queued_at, expires_at) \
                 SELECT $1, u.s, u.f, u.l, u.b, 0, $6::bigint, u.e \
                 FROM unnest($2::text[], $3::bigint[], $4::bigint[], $5::bigint[], $7::bigint[]) AS u(s, f, l, b, e)",
            )
            .await?,
            // The flows of a part's senders (`$2`, sorted), made where missing, outside the part's transaction.
            add_flows: p(
                "INSERT INTO down_flows (app, sender, next_seq, acked) SELECT $1, u.s, 1, 0 \
                 FROM unnest($2::text[]) AS u(s) ON CONFLICT (app, sender) DO NOTHING",
            )
            .await?,
            // One index probe per sender, locked in the senders' order (sorted, as every node locks them), as
            // `lock_sources` (research/030); a flow missing is missing from the answer.
            lock_flows: p(
                "SELECT u.i, f.next_seq FROM unnest($2::text[]) WITH ORDINALITY AS u(s, i) \
                 CROSS JOIN LATERAL (SELECT next_seq FROM down_flows \
                     WHERE app = $1 AND sender = u.s FOR UPDATE) f",
            )
            .await?,
            // A part of pushes only: each pushed flow's row written once, its next sequence moved past every
            // record the part pushes to it (`$3`), and the sequence before that returned (the flow's lock and its
            // write in one; lock then write was two writes of the row a line, research/043 addendum 3). Found as
            // `expire` finds rows, and locked in `$2`'s order (sorted, as every node locks them): a row another
            // transaction wrote since the probe fails the `ctid` test again and is missing from the answer, and the
            // part is tried again. The part then writes back the next sequence of any flow whose pushes were not
            // all queued (`set_next`).
            claim_flows: p(
                "UPDATE down_flows f SET next_seq = f.next_seq + t.k FROM (SELECT x.c, u.k, u.i \
                     FROM unnest($2::text[], $3::bigint[]) WITH ORDINALITY AS u(s, k, i) CROSS JOIN LATERAL \
                     (SELECT ctid AS c FROM down_flows WHERE app = $1 AND sender = u.s OFFSET 0) x) t \
                 WHERE f.ctid = t.c RETURNING t.i, f.next_seq - t.k",
            )
            .await?,
            // The senders' expired records and ranges (a range's blob losing its reference): per sender with
            // anything expired, how many records and pieces went. Rows are found by one index probe per sender (a
            // lateral subquery the planner may not flatten, `OFFSET 0`) and deleted by their `ctid`: a join of the
            // array with the table, planned while the table was young and not yet analyzed, read every row of the
            // app's each turn (research/043, addendum 2).
            expire: p(concat!(
                "WITH gone AS (DELETE FROM downlink d USING (SELECT x.c FROM unnest($2::text[]) AS u(s) \
                     CROSS JOIN LATERAL (SELECT ctid AS c FROM downlink \
                         WHERE app = $1 AND sender = u.s AND expires_at <= $3::bigint OFFSET 0) x) t \
                     WHERE d.ctid = t.c RETURNING d.sender, 1::bigint AS n), \
                 rg AS (DELETE FROM down_ranges r USING (SELECT x.c FROM unnest($2::text[]) AS u(s) \
                     CROSS JOIN LATERAL (SELECT ctid AS c FROM down_ranges \
                         WHERE app = $1 AND sender = u.s AND expires_at <= $3::bigint OFFSET 0) x) t \
                     WHERE r.ctid = t.c RETURNING r.sender, r.blob, r.last_seq - r.first_seq + 1 AS n), ",
                drop_blob_refs!(),
                " SELECT e.s, sum(e.n)::bigint FROM \
                     (SELECT sender AS s, n FROM gone UNION ALL SELECT sender, n FROM rg) e GROUP BY e.s"
            ))
            .await?,
            // What waits for each sender, records and bytes, in `$2`'s order (one index probe each): a range's
            // pieces counted as records, their bytes as payload bytes (piece k is bytes[k * piece_len ..][.. piece_len]).
            waiting: p(
                "SELECT u.i, d.n + r.n, d.b + r.b FROM unnest($2::text[]) WITH ORDINALITY AS u(s, i) \
                 CROSS JOIN LATERAL (SELECT count(*) AS n, COALESCE(sum(length(payload)), 0)::bigint AS b \
                     FROM downlink WHERE app = $1 AND sender = u.s) d \
                 CROSS JOIN LATERAL (SELECT COALESCE(sum(r.last_seq - r.first_seq + 1), 0)::bigint AS n, \
                     COALESCE(sum(LEAST((r.first_piece + r.last_seq - r.first_seq + 1) * b.piece_len, length(y.bytes)) \
                         - LEAST(r.first_piece * b.piece_len, length(y.bytes))), 0)::bigint AS b \
                     FROM down_ranges r JOIN down_blobs b ON b.app = r.app AND b.id = r.blob \
                     JOIN down_blob_bytes y ON y.app = r.app AND y.id = r.blob \
                     WHERE r.app = $1 AND r.sender = u.s) r \
                 ORDER BY u.i",
            )
            .await?,
            // Every record of a part's pushes: its sender, sequence, payload and expiry.
            insert: p(
                "INSERT INTO downlink (app, sender, seq, payload, queued_at, expires_at) \
                 SELECT $1, u.s, u.q, u.p, $5::bigint, u.e \
                 FROM unnest($2::text[], $3::bigint[], $4::bytea[], $6::bigint[]) AS u(s, q, p, e)",
            )
            .await?,
            // Each pushed flow's next sequence, as the part counted it under the flow's lock (one row a sender).
            // Found as `expire` finds rows, and for the same reason.
            set_next: p(
                "UPDATE down_flows f SET next_seq = t.n FROM (SELECT x.c, u.n \
                     FROM unnest($2::text[], $3::bigint[]) AS u(s, n) CROSS JOIN LATERAL \
                     (SELECT ctid AS c FROM down_flows WHERE app = $1 AND sender = u.s OFFSET 0) x) t \
                 WHERE f.ctid = t.c",
            )
            .await?,
            notify: p("SELECT count(pg_notify($1, u.p)) FROM unnest($2::text[]) AS u(p)").await?,
        },
    };
    Ok(Conn {
        client,
        st,
        pid,
        app_ids,
        known: HashMap::new(),
    })
}

/// Registers `apps` (names) in the `apps` table if they are not there, and appends their ids to `app_ids` in the
/// same order (the app index is the place in the node's list).
async fn register_apps(
    client: &Client,
    t: &Target,
    apps: &[String],
    app_ids: &mut Vec<i32>,
) -> Result<(), StoreError> {
    client
        .execute(
            "INSERT INTO apps (name) SELECT unnest($1::text[]) ON CONFLICT (name) DO NOTHING",
            &[&apps],
        )
        .await
        .map_err(db_err(t, "registering the apps"))?;
    let rows = client
        .query(
            "SELECT id, name FROM apps WHERE name = ANY($1::text[])",
            &[&apps],
        )
        .await
        .map_err(db_err(t, "reading the apps"))?;
    let by_name: HashMap<String, i32> = rows.iter().map(|r| (r.get(1), r.get(0))).collect();
    app_ids.extend(apps.iter().map(|a| by_name.get(a).copied().unwrap_or(-1)));
    Ok(())
}

/// One try of a part's transaction (docs/scale-out.md, "A turn").
async fn try_part(
    target: &Target,
    conn: &mut Conn,
    app_id: i32,
    part: &AppTurn,
) -> Result<Applied, Refused> {
    let fail = |doing| refusal(target, doing);
    let mut pieces: Vec<Piece<'_>> = part.pieces.iter().map(|p| p.as_piece()).collect();
    // Sorting a flow's frames by first_seq makes reordering within a turn free (protocol.md 5.2, 3); sources in
    // name order, so that rows are made in one order by every node.
    pieces.sort_by(|a, b| (a.source, a.first_seq).cmp(&(b.source, b.first_seq)));
    let mut names: Vec<String> = pieces.iter().map(|p| p.source.to_string()).collect();
    names.dedup();
    let new: Vec<String> = names
        .iter()
        .filter(|n| !conn.known.contains_key(&(part.app, (*n).clone())))
        .cloned()
        .collect();
    let c = &conn.client;
    let st = &conn.st;
    let now = crate::store::now_ms();
    // The LISTENs, folded per sender for the flows' rows (in name order: every node locks them in one order), and
    // each as it is for the reads.
    let fetches = FetchArgs::of(&part.fetches);
    let ds = &st.down;
    let ListenArgs {
        ack: ack_args,
        delete: delete_args,
        read: read_args,
    } = fetches.args(&app_id, &now);
    if pieces.is_empty() && part.outlets.is_empty() && !part.fetches.is_empty() {
        // LISTENs only: nothing is decided between the reads and the COMMIT, so the COMMIT rides the same wait, one
        // round trip for the part (research/032). A statement that fails aborts the transaction, and the COMMIT
        // behind it then only ends it.
        let done = tokio::try_join!(
            c.execute(&st.begin, &[]),
            c.query(&ds.read, &read_args),
            c.execute(&ds.ack, &ack_args),
            c.query_one(&ds.delete, &delete_args),
            c.execute(&st.commit, &[]),
        );
        return match done {
            Ok((_, read, _, deleted, _)) => Ok(Applied {
                down: fetches.applied(&part.fetches, &deleted, &read),
                ..Applied::default()
            }),
            Err(e) => {
                let _ = c.execute(&st.rollback, &[]).await;
                Err(fail("storing a turn's LISTENs")(e))
            }
        };
    }
    let down = async {
        if part.fetches.is_empty() {
            return Ok(None);
        }
        // Read before the deletes: each LISTEN reads above its own heard, as if the turn's LISTENs ran one after
        // another as on one node (the deletes then only take what the reads passed over).
        tokio::try_join!(
            c.query(&ds.read, &read_args),
            c.execute(&ds.ack, &ack_args),
            c.query_one(&ds.delete, &delete_args),
        )
        .map(|(read, _, deleted)| Some((deleted, read)))
    };
    // First wait: the new sources' rows (autocommit, before the transaction), BEGIN, the rows locked, then the
    // LISTENs' flows acknowledged, what their devices have deleted and what waits read.
    let lock_args: [&(dyn ToSql + Sync); 2] = [&app_id, &names];
    let add_args: [&(dyn ToSql + Sync); 2] = [&app_id, &new];
    let first = if new.is_empty() {
        tokio::try_join!(
            c.execute(&st.begin, &[]),
            c.query(&st.lock_sources, &lock_args),
            down
        )
        .map(|(_, rows, down)| (rows, down))
    } else {
        tokio::try_join!(
            c.execute(&st.add_sources, &add_args),
            c.execute(&st.begin, &[]),
            c.query(&st.lock_sources, &lock_args),
            down
        )
        .map(|(_, _, rows, down)| (rows, down))
    };
    let (locked, down) = match first {
        Ok(done) => done,
        Err(e) => {
            // The statements behind the failed one were sent and ran: end the transaction BEGIN may have opened.
            let _ = c.execute(&st.rollback, &[]).await;
            return Err(fail("locking the turn's sources")(e));
        }
    };
    let found: HashMap<String, (i64, u64)> = locked
        .iter()
        .map(|r| {
            (
                r.get::<_, String>(1),
                (r.get::<_, i64>(0), r.get::<_, i64>(2) as u64),
            )
        })
        .collect();
    let stored_at = crate::store::now_ms();
    let mut applied = Applied::default();
    let (mut h_id, mut h_old, mut h_new) = (Vec::new(), Vec::new(), Vec::new());
    let (mut c_src, mut c_first, mut c_count, mut c_off, mut c_fmt) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut bodies: Vec<Vec<u8>> = Vec::new();
    let mut chunk_sources: Vec<String> = Vec::new();
    let mut n: i64 = 0;
    let mut body = Vec::new();
    let mut start = 0;
    while start < pieces.len() {
        let name = pieces[start].source;
        let mut end = start;
        while end < pieces.len() && pieces[end].source == name {
            end += 1;
        }
        let Some(&(id, heard_before)) = found.get(name) else {
            // Its row is not there though this connection made or saw it (the tables were emptied under the
            // node?): forget what it knows of rows, and try again, making them.
            let _ = c.execute(&st.rollback, &[]).await;
            conn.known.clear();
            return Err(Refused::Retry);
        };
        let (segments, heard) =
            super::cut_flow(&pieces[start..end], heard_before, &mut body, &mut applied);
        if heard > heard_before {
            h_id.push(id);
            h_old.push(heard_before as i64);
            h_new.push(heard as i64);
            for (first, count, format, range) in segments {
                c_src.push(id);
                c_first.push(first as i64);
                c_count.push(count as i32);
                c_off.push(n);
                c_fmt.push(format as i16);
                bodies.push(body[range].to_vec());
                chunk_sources.push(name.to_string());
                n += count as i64;
            }
        }
        applied.heard.push((name.to_string(), heard));
        start = end;
    }
    if let Some((deleted, read)) = &down {
        applied.down = fetches.applied(&part.fetches, deleted, read);
    }
    if n == 0 && part.outlets.is_empty() {
        if down.is_none() {
            // Nothing to write: the heard sequences read under the locks are the outcome.
            c.execute(&st.rollback, &[])
                .await
                .map_err(fail("ending a turn with nothing to store"))?;
        } else if let Err(e) = c.execute(&st.commit, &[]).await {
            // LISTENs only: what they deleted is theirs to commit, and their answers wait for it.
            let _ = c.execute(&st.rollback, &[]).await;
            return Err(fail("storing a turn")(e));
        }
        mark_known(conn, part.app, &names);
        return Ok(applied);
    }
    let o_names: Vec<&str> = part.outlets.iter().map(|(n, _)| n.as_str()).collect();
    let o_acked: Vec<i64> = part.outlets.iter().map(|(_, a)| *a as i64).collect();
    let body_refs: Vec<&[u8]> = bodies.iter().map(Vec::as_slice).collect();
    // Second wait: heard sequences (conditionally), the head last of the locks, the chunks, the outlets, COMMIT.
    let moving = h_id.len() as i64;
    let heard_args: [&(dyn ToSql + Sync); 4] = [&h_id, &h_old, &h_new, &moving];
    let head_args: [&(dyn ToSql + Sync); 2] = [&app_id, &n];
    let chunk_args: [&(dyn ToSql + Sync); 9] = [
        &app_id, &n, &stored_at, &c_src, &c_first, &c_count, &body_refs, &c_off, &c_fmt,
    ];
    let outlet_args: [&(dyn ToSql + Sync); 3] = [&app_id, &o_names, &o_acked];
    // join!, not try_join!: every response is waited for, so that the error reported is the first statement's
    // that failed (the statements behind it only say the transaction is aborted), whichever finished first.
    let result = if n > 0 {
        let (moved, head, chunks, outlets, commit) = tokio::join!(
            c.query_one(&st.set_heard, &heard_args),
            c.query_one(&st.take_head, &head_args),
            c.execute(&st.insert_chunks, &chunk_args),
            c.execute(&st.set_outlets, &outlet_args),
            c.execute(&st.commit, &[]),
        );
        moved
            .and(head)
            .and_then(|head| chunks.and(outlets).and(commit).map(|_| head))
            .map(|head| Some(head.get::<_, i64>(0)))
    } else {
        let (outlets, commit) = tokio::join!(
            c.execute(&st.set_outlets, &outlet_args),
            c.execute(&st.commit, &[]),
        );
        outlets.and(commit).map(|_| None)
    };
    let head = match result {
        Ok(r) => r,
        Err(e) => {
            // The transaction is aborted (or the connection gone): nothing of it was stored.
            let _ = c.execute(&st.rollback, &[]).await;
            if e.code() == Some(&SqlState::DIVISION_BY_ZERO) {
                // A heard sequence moved since it was read: not under READ COMMITTED with the rows locked, but on
                // an engine that locks otherwise. The cut is made again against what is there now.
                return Err(Refused::Retry);
            }
            return Err(fail("storing a turn")(e));
        }
    };
    mark_known(conn, part.app, &names);
    if let Some(head) = head {
        applied.head = head as u64;
    }
    if let Some(head) = head
        && part.keep_new
    {
        let base = (head - n) as u64;
        for (k, records) in bodies.into_iter().enumerate() {
            applied.new_chunks.push(stored_chunk(
                base + c_off[k] as u64,
                chunk_sources[k].clone(),
                (c_first[k], c_count[k], c_fmt[k]),
                stored_at,
                records,
            ));
        }
    }
    Ok(applied)
}

/// A chunk a turn stored, as the host keeps it (`keep_new`): at `pos`, from the chunk arrays' `(first_seq, count,
/// format)` written with it, by either record path.
fn stored_chunk(
    pos: u64,
    source: String,
    (first, count, format): (i64, i32, i16),
    stored_at_ms: i64,
    body: Vec<u8>,
) -> Chunk {
    Chunk {
        pos,
        source,
        first_seq: first as u64,
        count: count as u64,
        format: if format == RecordFormat::Forwarded as i16 {
            RecordFormat::Forwarded
        } else {
            RecordFormat::Plain
        },
        stored_at_ms,
        body,
    }
}

/// Several parts of one app cut against the heard sequences of their sources, in order: what they store, as the
/// arrays of the statements that write it, and each part's outcome so far.
struct Cut {
    applied: Vec<Applied>,
    /// Per part: the end of its records among all the parts', and its chunks' range in the arrays below.
    ends: Vec<(i64, std::ops::Range<usize>)>,
    c_src: Vec<i64>,
    c_first: Vec<i64>,
    c_count: Vec<i32>,
    c_off: Vec<i64>,
    c_fmt: Vec<i16>,
    bodies: Vec<Vec<u8>>,
    chunk_sources: Vec<String>,
    /// Records stored by all the parts.
    n: i64,
    /// The heard sequences that move: row id, from, to.
    h_id: Vec<i64>,
    h_old: Vec<i64>,
    h_new: Vec<i64>,
    /// Each source's row id and heard sequence once the parts are applied (what a commit leaves there).
    after: Vec<(String, i64, u64)>,
}

/// Cuts `sorted` (each part's pieces in (source, first_seq) order) against `heard` (per source name: the row's id
/// and its heard sequence before the parts), each part against what the parts before it left, by the same code as
/// every engine ([`super::cut_flow`]). `None` if a source is not in `heard`.
fn cut_parts(sorted: &[Vec<Piece<'_>>], heard: &HashMap<&str, (i64, u64)>) -> Option<Cut> {
    let mut now: HashMap<&str, (i64, u64)> = HashMap::with_capacity(heard.len());
    let mut cut = Cut {
        applied: Vec::with_capacity(sorted.len()),
        ends: Vec::with_capacity(sorted.len()),
        c_src: Vec::new(),
        c_first: Vec::new(),
        c_count: Vec::new(),
        c_off: Vec::new(),
        c_fmt: Vec::new(),
        bodies: Vec::new(),
        chunk_sources: Vec::new(),
        n: 0,
        h_id: Vec::new(),
        h_old: Vec::new(),
        h_new: Vec::new(),
        after: Vec::new(),
    };
    let mut body = Vec::new();
    for pieces in sorted {
        let mut a = Applied::default();
        let from = cut.bodies.len();
        let mut start = 0;
        while start < pieces.len() {
            let name = pieces[start].source;
            let mut end = start;
            while end < pieces.len() && pieces[end].source == name {
                end += 1;
            }
            let (id, before) = match now.get(name) {
                Some(&v) => v,
                None => *heard.get(name)?,
            };
            let (segments, h) = super::cut_flow(&pieces[start..end], before, &mut body, &mut a);
            if h > before {
                for (first, count, format, range) in segments {
                    cut.c_src.push(id);
                    cut.c_first.push(first as i64);
                    cut.c_count.push(count as i32);
                    cut.c_off.push(cut.n);
                    cut.c_fmt.push(format as i16);
                    cut.bodies.push(body[range].to_vec());
                    cut.chunk_sources.push(name.to_string());
                    cut.n += count as i64;
                }
            }
            now.insert(name, (id, h));
            a.heard.push((name.to_string(), h));
            start = end;
        }
        cut.ends.push((cut.n, from..cut.bodies.len()));
        cut.applied.push(a);
    }
    let mut moved: Vec<(&str, i64, u64)> = now
        .into_iter()
        .map(|(name, (id, h))| (name, id, h))
        .collect();
    moved.sort_unstable_by(|a, b| a.0.cmp(b.0));
    for (name, id, h) in moved {
        let before = heard.get(name).map_or(0, |v| v.1);
        if h > before {
            cut.h_id.push(id);
            cut.h_old.push(before as i64);
            cut.h_new.push(h as i64);
        }
        cut.after.push((name.to_string(), id, h));
    }
    Some(cut)
}

/// Each part's outcome once its cut committed with the app's head at `head` (None: nothing was stored).
fn finish_cut(cut: Cut, head: Option<i64>, parts: &[&AppTurn], stored_at: i64) -> Vec<Applied> {
    let Cut {
        mut applied,
        ends,
        c_first,
        c_count,
        c_off,
        c_fmt,
        bodies,
        chunk_sources,
        n,
        ..
    } = cut;
    let Some(head) = head else {
        return applied;
    };
    let base = head - n;
    let mut bodies: Vec<Option<Vec<u8>>> = bodies.into_iter().map(Some).collect();
    let mut stored_before: i64 = 0;
    for ((a, (end, chunks)), part) in applied.iter_mut().zip(ends).zip(parts) {
        // The app's head after this part, said where the part stored something (as a part alone says it).
        if end > stored_before {
            a.head = (base + end) as u64;
        }
        stored_before = end;
        if !part.keep_new {
            continue;
        }
        for k in chunks {
            a.new_chunks.push(stored_chunk(
                (base + c_off[k]) as u64,
                chunk_sources[k].clone(),
                (c_first[k], c_count[k], c_fmt[k]),
                stored_at,
                bodies[k].take().unwrap_or_default(),
            ));
        }
    }
    applied
}

/// How a cut's write ended.
enum Written {
    /// Committed: the app's head after it, if it stored records.
    Committed(Option<i64>),
    /// A heard sequence was not what the cut was made against (SQLSTATE 22012 from the conditional update): rolled
    /// back, nothing stored.
    Moved,
}

/// Writes `cut` and commits, in one wait: (BEGIN, if `begin`), the heard sequences moved conditionally, the app's
/// head last of the locks, the chunks, the outlets' progress, COMMIT. A failure rolls back.
async fn write_cut(
    conn: &Conn,
    app_id: i32,
    cut: &Cut,
    outlets: &[(&str, i64)],
    stored_at: i64,
    begin: bool,
) -> Result<Written, tokio_postgres::Error> {
    let (c, st) = (&conn.client, &conn.st);
    let o_names: Vec<&str> = outlets.iter().map(|o| o.0).collect();
    let o_acked: Vec<i64> = outlets.iter().map(|o| o.1).collect();
    let body_refs: Vec<&[u8]> = cut.bodies.iter().map(Vec::as_slice).collect();
    let moving = cut.h_id.len() as i64;
    let heard_args: [&(dyn ToSql + Sync); 4] = [&cut.h_id, &cut.h_old, &cut.h_new, &moving];
    let head_args: [&(dyn ToSql + Sync); 2] = [&app_id, &cut.n];
    let chunk_args: [&(dyn ToSql + Sync); 9] = [
        &app_id,
        &cut.n,
        &stored_at,
        &cut.c_src,
        &cut.c_first,
        &cut.c_count,
        &body_refs,
        &cut.c_off,
        &cut.c_fmt,
    ];
    let outlet_args: [&(dyn ToSql + Sync); 3] = [&app_id, &o_names, &o_acked];
    let began = async {
        if begin {
            c.execute(&st.begin, &[]).await.map(|_| ())
        } else {
            Ok(())
        }
    };
    // As in try_part: every response waited for, so that the error reported is the first that failed.
    let result = if cut.n > 0 {
        let (began, moved, head, chunks, outlets, commit) = tokio::join!(
            began,
            c.query_one(&st.set_heard, &heard_args),
            c.query_one(&st.take_head, &head_args),
            c.execute(&st.insert_chunks, &chunk_args),
            c.execute(&st.set_outlets, &outlet_args),
            c.execute(&st.commit, &[]),
        );
        began
            .and(moved)
            .and(head)
            .and_then(|head| chunks.and(outlets).and(commit).map(|_| head))
            .map(|head| Some(head.get::<_, i64>(0)))
    } else {
        let (began, outlets, commit) = tokio::join!(
            began,
            c.execute(&st.set_outlets, &outlet_args),
            c.execute(&st.commit, &[]),
        );
        began.and(outlets).and(commit).map(|_| None)
    };
    match result {
        Ok(head) => Ok(Written::Committed(head)),
        Err(e) => {
            // The transaction is aborted (or the connection gone): nothing of it was stored.
            let _ = c.execute(&st.rollback, &[]).await;
            if e.code() == Some(&SqlState::DIVISION_BY_ZERO) {
                Ok(Written::Moved)
            } else {
                Err(e)
            }
        }
    }
}

/// One try of parts of one app, records (and outlets' progress) only, in one transaction: a turn's, or several
/// turns' gathered in order ([`Worker::gather`]), so one WAL flush for all. Each part is cut, in order, against the
/// heard sequences the parts before it left, and its chunks take the positions after theirs: each part's outcome is
/// what it would have been had the parts committed one after another.
///
/// Where this connection knows every source's row and heard sequence (it read or committed them last), the parts
/// are cut against those and written in **one wait** (BEGIN, the heard sequences moved conditionally, the head,
/// the chunks, COMMIT), without locking the rows first: the conditional update is what keeps each record once (a
/// heard sequence another node moved meanwhile fails it, the transaction rolls back, and the parts are applied
/// again the other way). Otherwise, or then, as [`try_part`]: every source made and locked in one statement in
/// name order, the heard sequences read there (one wait), then the write.
async fn try_parts(
    target: &Target,
    conn: &mut Conn,
    app_id: i32,
    parts: &[&AppTurn],
) -> Result<Vec<Applied>, Refused> {
    let fail = |doing| refusal(target, doing);
    let Some(app) = parts.first().map(|p| p.app) else {
        return Ok(Vec::new());
    };
    let sorted: Vec<Vec<Piece<'_>>> = parts
        .iter()
        .map(|part| {
            let mut pieces: Vec<Piece<'_>> = part.pieces.iter().map(|p| p.as_piece()).collect();
            pieces.sort_by(|a, b| (a.source, a.first_seq).cmp(&(b.source, b.first_seq)));
            pieces
        })
        .collect();
    let mut names: Vec<&str> = sorted.iter().flatten().map(|p| p.source).collect();
    names.sort_unstable();
    names.dedup();
    // Outlets' progress, one row each (a statement may not update a row twice), the furthest the parts say.
    let mut outlets: std::collections::BTreeMap<&str, i64> = std::collections::BTreeMap::new();
    for (name, acked) in parts.iter().flat_map(|p| p.outlets.iter()) {
        let e = outlets.entry(name.as_str()).or_insert(0);
        *e = (*e).max(*acked as i64);
    }
    let outlets: Vec<(&str, i64)> = outlets.into_iter().collect();
    let remember = |conn: &mut Conn, cut: &Cut| {
        for (name, id, heard) in &cut.after {
            conn.known.insert((app, name.clone()), Some((*id, *heard)));
        }
    };
    // The fast way: every row and heard sequence known here, and something to store (a turn of duplicates only
    // reads what the database holds, below).
    let cached: Option<HashMap<&str, (i64, u64)>> = names
        .iter()
        .map(|n| {
            let v = conn.known.get(&(app, n.to_string())).copied().flatten()?;
            Some((*n, v))
        })
        .collect();
    if let Some(cut) = cached.as_ref().and_then(|h| cut_parts(&sorted, h))
        && cut.n > 0
    {
        let stored_at = crate::store::now_ms();
        match write_cut(conn, app_id, &cut, &outlets, stored_at, true).await {
            Ok(Written::Committed(head)) => {
                remember(conn, &cut);
                return Ok(finish_cut(cut, head, parts, stored_at));
            }
            // Another node moved a heard sequence: forget what this connection knew of these rows' heard
            // sequences, and lock and read them.
            Ok(Written::Moved) => mark_known_names(conn, app, &names),
            Err(e) => return Err(fail("storing a turn")(e)),
        }
    }
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let new: Vec<String> = names
        .iter()
        .filter(|n| !conn.known.contains_key(&(app, (*n).clone())))
        .cloned()
        .collect();
    let c = &conn.client;
    let st = &conn.st;
    let lock_args: [&(dyn ToSql + Sync); 2] = [&app_id, &names];
    let add_args: [&(dyn ToSql + Sync); 2] = [&app_id, &new];
    let first = if new.is_empty() {
        tokio::try_join!(
            c.execute(&st.begin, &[]),
            c.query(&st.lock_sources, &lock_args)
        )
        .map(|(_, rows)| rows)
    } else {
        tokio::try_join!(
            c.execute(&st.add_sources, &add_args),
            c.execute(&st.begin, &[]),
            c.query(&st.lock_sources, &lock_args)
        )
        .map(|(_, _, rows)| rows)
    };
    let locked = match first {
        Ok(rows) => rows,
        Err(e) => {
            let _ = c.execute(&st.rollback, &[]).await;
            return Err(fail("locking the turn's sources")(e));
        }
    };
    let rows: Vec<(String, i64, u64)> = locked
        .iter()
        .map(|r| {
            (
                r.get::<_, String>(1),
                r.get::<_, i64>(0),
                r.get::<_, i64>(2) as u64,
            )
        })
        .collect();
    let heard: HashMap<&str, (i64, u64)> = rows
        .iter()
        .map(|(name, id, h)| (name.as_str(), (*id, *h)))
        .collect();
    let Some(cut) = cut_parts(&sorted, &heard) else {
        // As in try_part: a row this connection made or saw is gone; forget what it knows, and try again.
        let _ = c.execute(&st.rollback, &[]).await;
        conn.known.clear();
        return Err(Refused::Retry);
    };
    if cut.n == 0 && outlets.is_empty() {
        // Nothing to write: the heard sequences read under the locks are the outcome.
        c.execute(&st.rollback, &[])
            .await
            .map_err(fail("ending a turn with nothing to store"))?;
        remember(conn, &cut);
        return Ok(cut.applied);
    }
    let stored_at = crate::store::now_ms();
    match write_cut(conn, app_id, &cut, &outlets, stored_at, false).await {
        Ok(Written::Committed(head)) => {
            remember(conn, &cut);
            Ok(finish_cut(cut, head, parts, stored_at))
        }
        // A heard sequence moved since it was read: not under READ COMMITTED with the rows locked, but on an engine
        // that locks otherwise. The cut is made again against what is there now.
        Ok(Written::Moved) => {
            mark_known_names(conn, app, &names);
            Err(Refused::Retry)
        }
        Err(e) => Err(fail("storing a turn")(e)),
    }
}

/// [`mark_known`] for names borrowed as `&str`.
fn mark_known_names<S: AsRef<str>>(conn: &mut Conn, app: AppIndex, names: &[S]) {
    for n in names {
        conn.known.insert((app, n.as_ref().to_string()), None);
    }
}

/// The arrays a part's LISTENs are given to the database as (docs/scale-out.md, "Downlink on a fleet").
/// The parameters of a part's three LISTEN statements (docs/scale-out.md, "A LISTEN").
struct ListenArgs<'a> {
    ack: [&'a (dyn ToSql + Sync); 3],
    delete: [&'a (dyn ToSql + Sync); 4],
    read: [&'a (dyn ToSql + Sync); 5],
}

struct FetchArgs {
    /// Per sender, in name order, the highest `heard` of the turn's LISTENs.
    senders: Vec<String>,
    heard: Vec<i64>,
    /// Per LISTEN, in the part's order: whose, from where, and at most how many rows (each record takes at least a
    /// byte of the answer's room).
    read_senders: Vec<String>,
    read_heard: Vec<i64>,
    read_limit: Vec<i32>,
}

impl FetchArgs {
    fn of(fetches: &[OwnedFetch]) -> Self {
        let heard_of = |f: &OwnedFetch| f.heard.min(super::downlink::MAX_DOWN_HEARD) as i64;
        let mut folded: Vec<(&str, i64)> = fetches
            .iter()
            .map(|f| (f.source.as_str(), heard_of(f)))
            .collect();
        folded.sort_unstable();
        // Sorted by (name, heard): the last of each name holds its highest.
        let mut senders: Vec<String> = Vec::new();
        let mut heard: Vec<i64> = Vec::new();
        for (name, h) in folded {
            if senders.last().is_some_and(|l| l == name) {
                *heard.last_mut().expect("beside its sender") = h;
            } else {
                senders.push(name.to_string());
                heard.push(h);
            }
        }
        FetchArgs {
            senders,
            heard,
            read_senders: fetches.iter().map(|f| f.source.clone()).collect(),
            read_heard: fetches
                .iter()
                .map(|f| f.from.max(f.heard).min(super::downlink::MAX_DOWN_HEARD) as i64)
                .collect(),
            read_limit: fetches
                .iter()
                .map(|f| f.room.min(i32::MAX as usize) as i32)
                .collect(),
        }
    }

    fn args<'a>(&'a self, app_id: &'a i32, now: &'a i64) -> ListenArgs<'a> {
        ListenArgs {
            ack: [app_id, &self.senders, &self.heard],
            delete: [app_id, &self.senders, &self.heard, now],
            read: [
                app_id,
                &self.read_senders,
                &self.read_heard,
                &self.read_limit,
                now,
            ],
        }
    }

    /// What the LISTENs did, from the rows of the delete and of the read: each read cut to its room as on one
    /// node ([`super::downlink`]).
    fn applied(
        &self,
        fetches: &[OwnedFetch],
        deleted: &tokio_postgres::Row,
        read: &[tokio_postgres::Row],
    ) -> DownApplied {
        let mut out = DownApplied {
            delivered: deleted.get::<_, i64>(0) as u64,
            expired: deleted.get::<_, i64>(1) as u64,
            waiting: deleted.get::<_, Option<i64>>(2).map(|w| w.max(0) as u64),
            ..DownApplied::default()
        };
        let mut rows = read.iter().peekable();
        for (k, f) in fetches.iter().enumerate() {
            let ordinal = k as i64 + 1;
            let mut records = Vec::new();
            let mut last = 0;
            let mut used = 0usize;
            let mut full = false;
            while let Some(row) = rows.next_if(|r| r.get::<_, i64>(0) == ordinal) {
                last = row.get::<_, Option<i64>>(3).unwrap_or(0).max(0) as u64;
                let (Some(seq), Some(payload)) = (
                    row.get::<_, Option<i64>>(1),
                    row.get::<_, Option<Vec<u8>>>(2),
                ) else {
                    continue;
                };
                let len = crate::proto::wire::record_len(&payload);
                if full || used + len > f.room {
                    full = true;
                    continue;
                }
                used += len;
                records.push(crate::proto::turn::DownRecord {
                    seq: seq as u64,
                    payload,
                });
            }
            out.reads.push(FetchRead {
                index: f.index,
                after: self.read_heard[k] as u64,
                last,
                records,
            });
        }
        out
    }
}

/// What one statement of a pipelined wait answered ([`in_order`]).
enum Answer {
    /// A statement that changes rows, or BEGIN or COMMIT, without rows to read.
    Done,
    Row(Option<tokio_postgres::Row>),
    Rows(Vec<tokio_postgres::Row>),
}

type Sent<'a> = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<Answer, tokio_postgres::Error>> + Send + 'a>,
>;

/// Waits for every statement of `sent`, first polled in their order (so that they are sent, and run, in that
/// order: tokio-postgres sends a statement when its future is first polled), and returns their answers in order,
/// or the first error in that order (every statement's answer is waited for first, as with `join!`).
async fn in_order(mut sent: Vec<Sent<'_>>) -> Result<Vec<Answer>, tokio_postgres::Error> {
    use std::task::Poll;
    let mut out: Vec<Option<Result<Answer, tokio_postgres::Error>>> =
        sent.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, o) in sent.iter_mut().zip(out.iter_mut()) {
            if o.is_none() {
                match f.as_mut().poll(cx) {
                    Poll::Ready(r) => *o = Some(r),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    out.into_iter()
        .map(|o| o.expect("every future was waited for"))
        .collect()
}

/// One try of a part that carries pushes and nothing to store besides LISTENs (docs/scale-out.md, "Downlink on a
/// fleet"): the pushes and the LISTENs in one transaction, the pushes first, so that the LISTENs read them; one
/// COMMIT for both. What it did, with each push's outcome in `down.pushes` in the part's order.
async fn try_down_part(
    target: &Target,
    conn: &mut Conn,
    app_id: i32,
    pushes: &[&DownPush],
    listens: &[OwnedFetch],
) -> Result<Applied, Refused> {
    let fail = |doing| refusal(target, doing);
    let c = &conn.client;
    let st = &conn.st;
    let ds = &st.down;
    let now = crate::store::now_ms();
    let mut pushing: Vec<&str> = pushes
        .iter()
        .filter(|p| p.too_large().is_none())
        .map(|p| p.sender.as_str())
        .collect();
    pushing.sort_unstable();
    pushing.dedup();
    // The files pushed as pieces, each once (a request's pushes share one), and the id a committed push of it kept.
    let mut blobs: Vec<&Arc<DownBlob>> = Vec::new();
    for p in pushes {
        if let Some(b) = &p.blob
            && !blobs.iter().any(|k| Arc::ptr_eq(k, b))
        {
            blobs.push(b);
        }
    }
    let known: Vec<Option<i64>> = blobs.iter().map(|b| b.stored()).collect();
    let fetches = FetchArgs::of(listens);
    // Every flow row the transaction writes, locked first and in name order, as every node locks them.
    let mut flows: Vec<&str> = pushing
        .iter()
        .copied()
        .chain(fetches.senders.iter().map(String::as_str))
        .collect();
    flows.sort_unstable();
    flows.dedup();
    let flows_arg: Vec<&str> = flows.clone();
    let pushing_arg: Vec<&str> = pushing.clone();
    // A part without LISTENs claims its flows (`claim_flows`): each row written once, moved past every record the
    // part pushes to it, as if all were queued; a part with LISTENs locks every flow it reads or writes first.
    let claim = listens.is_empty();
    let mut claimed: Vec<i64> = vec![0; flows.len()];
    if claim {
        for p in pushes.iter().filter(|p| p.too_large().is_none()) {
            if let Ok(k) = flows.binary_search(&p.sender.as_str()) {
                claimed[k] =
                    claimed[k].saturating_add(i64::try_from(p.count()).unwrap_or(i64::MAX));
            }
        }
    }
    let flows_args: [&(dyn ToSql + Sync); 2] = [&app_id, &flows_arg];
    let claim_args: [&(dyn ToSql + Sync); 3] = [&app_id, &flows_arg, &claimed];
    let push_args: [&(dyn ToSql + Sync); 2] = [&app_id, &pushing_arg];
    let expire_args: [&(dyn ToSql + Sync); 3] = [&app_id, &pushing_arg, &now];
    let blob_lock_args: Vec<Option<[&(dyn ToSql + Sync); 2]>> = known
        .iter()
        .map(|k| k.as_ref().map(|id| [&app_id as _, id as _]))
        .collect();
    // First wait: the pushed flows' rows (autocommit, before the transaction), BEGIN, the flows locked, the pushed
    // senders' expired records and ranges deleted and what is left counted, each statement once for all of them;
    // then each file's row locked if a push of it kept its id and it is still there (so no LISTEN deletes it under
    // this push), and an id for it in case it must be written.
    let mut first: Vec<Sent<'_>> = Vec::new();
    let any_pushed = !pushing.is_empty();
    if any_pushed {
        first.push(Box::pin(async {
            c.execute(&ds.add_flows, &push_args)
                .await
                .map(|_| Answer::Done)
        }));
    }
    first.push(Box::pin(async {
        c.execute(&st.begin, &[]).await.map(|_| Answer::Done)
    }));
    let locked_at = first.len();
    first.push(Box::pin(async {
        if claim {
            c.query(&ds.claim_flows, &claim_args)
                .await
                .map(Answer::Rows)
        } else {
            c.query(&ds.lock_flows, &flows_args).await.map(Answer::Rows)
        }
    }));
    let expired_at = first.len();
    let waiting_at = expired_at + 1;
    if any_pushed {
        first.push(Box::pin(async {
            c.query(&ds.expire, &expire_args).await.map(Answer::Rows)
        }));
        first.push(Box::pin(async {
            c.query(&ds.waiting, &push_args).await.map(Answer::Rows)
        }));
    }
    let blobs_at = first.len();
    for a in &blob_lock_args {
        if let Some(a) = a {
            first.push(Box::pin(async {
                c.query_opt(&ds.blob_lock, a).await.map(Answer::Row)
            }));
        }
        first.push(Box::pin(async {
            c.query_opt(&ds.blob_id, &[]).await.map(Answer::Row)
        }));
    }
    let answers = match in_order(first).await {
        Ok(a) => a,
        Err(e) => {
            let _ = c.execute(&st.rollback, &[]).await;
            return Err(fail("locking downlink flows")(e));
        }
    };
    let row_at = |k: usize| match &answers[k] {
        Answer::Row(Some(r)) => Some(r),
        _ => None,
    };
    let rows_at = |k: usize| match answers.get(k) {
        Some(Answer::Rows(r)) => r.as_slice(),
        _ => &[],
    };
    // Each flow's next sequence (before this part's claim), by its place in `flows` (the answer's ordinality counts
    // from 1); the pushed
    // senders' records and bytes waiting, in `pushing`'s order; what expired, by sender.
    let mut next_of: Vec<Option<i64>> = vec![None; flows.len()];
    for r in rows_at(locked_at) {
        let i = r.get::<_, i64>(0);
        if let Some(n) = usize::try_from(i - 1).ok().and_then(|k| next_of.get_mut(k)) {
            *n = Some(r.get::<_, i64>(1));
        }
    }
    let mut left_of: Vec<Option<(u64, u64)>> = vec![None; pushing.len()];
    if any_pushed {
        for r in rows_at(waiting_at) {
            let i = r.get::<_, i64>(0);
            if let Some(l) = usize::try_from(i - 1).ok().and_then(|k| left_of.get_mut(k)) {
                *l = Some((
                    r.get::<_, Option<i64>>(1).unwrap_or(0).max(0) as u64,
                    r.get::<_, Option<i64>>(2).unwrap_or(0).max(0) as u64,
                ));
            }
        }
    }
    let mut expired_of: HashMap<String, i64> = HashMap::new();
    if any_pushed {
        for r in rows_at(expired_at) {
            expired_of.insert(r.get::<_, String>(0), r.get::<_, i64>(1));
        }
    }
    // Per pushed sender: its next sequence, what expired (told by its first push), what waits (records, bytes).
    let mut state: HashMap<&str, (i64, i64, u64, u64)> = HashMap::new();
    for (k, s) in pushing.iter().enumerate() {
        let at = flows
            .binary_search(s)
            .expect("a pushed sender's flow is locked");
        let (Some(next), Some((waiting, bytes))) = (next_of[at], left_of[k]) else {
            // Its flow row is not there though it was just made (the tables emptied under the node?): again.
            let _ = c.execute(&st.rollback, &[]).await;
            return Err(Refused::Retry);
        };
        let expired = expired_of.get(*s).copied().unwrap_or(0);
        state.insert(s, (next, expired, waiting, bytes));
    }
    // Per file: its id, and whether it must be written (not kept yet, or deleted since: every range of it went).
    let mut blob_ids: Vec<(i64, bool)> = Vec::with_capacity(blobs.len());
    let mut at = blobs_at;
    for k in &known {
        let there = match k {
            Some(id) => {
                at += 1;
                row_at(at - 1).map(|_| *id)
            }
            None => None,
        };
        let Some(fresh) = row_at(at) else {
            let _ = c.execute(&st.rollback, &[]).await;
            return Err(Refused::Retry);
        };
        at += 1;
        blob_ids.push(match there {
            Some(id) => (id, false),
            None => (fresh.get::<_, i64>(0), true),
        });
    }
    // In the node: each push against its sender's bounds, after the pushes before it in the part (a file's pieces
    // count as records, their bytes as payload bytes).
    let mut outcomes: Vec<(Pushed, u64)> = Vec::with_capacity(pushes.len());
    let mut queued: Vec<(&DownPush, i64)> = Vec::new();
    // The ranges of the queued files' pieces (sender, first, last, blob), and the references each file gains.
    let (mut r_sender, mut r_first, mut r_last, mut r_blob, mut r_expires) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut blob_refs: Vec<i64> = vec![0; blobs.len()];
    let mut delta: i64 = 0;
    let mut expired_any = false;
    for p in pushes {
        if let Some(r) = p.too_large() {
            outcomes.push((Pushed::Refused(r), 0));
            continue;
        }
        let s = state
            .get_mut(p.sender.as_str())
            .expect("its sender's state");
        let expired = std::mem::take(&mut s.1);
        expired_any |= expired > 0;
        delta -= expired;
        let adding: u64 = match &p.blob {
            Some(b) => b.bytes().len() as u64,
            None => p.records.iter().map(|r| r.len() as u64).sum(),
        };
        let n = p.count();
        if let Some(r) = p.limits.passed_by_count(n, adding, s.2, s.3) {
            outcomes.push((Pushed::Refused(r), expired as u64));
            continue;
        }
        if let Some(b) = &p.blob {
            let k = blobs
                .iter()
                .position(|x| Arc::ptr_eq(x, b))
                .expect("its file is among the part's");
            r_sender.push(p.sender.as_str());
            r_first.push(s.0);
            r_last.push(s.0 + n as i64 - 1);
            r_blob.push(blob_ids[k].0);
            r_expires.push(p.limits.expires_at(now));
            blob_refs[k] += 1;
        }
        queued.push((p, s.0));
        outcomes.push((
            Pushed::Queued {
                first: s.0 as u64,
                count: n,
            },
            expired as u64,
        ));
        s.0 += n as i64;
        s.2 += n;
        s.3 += adding;
        delta += n as i64;
    }
    // Second wait: the queued pushes' records, their flows' next sequences, the files written or referenced again
    // and their ranges, the count, the other nodes told; then the LISTENs (read first, as in a part), and COMMIT.
    // Every queued record, flattened: its sender, sequence, payload and expiry (a file's pieces are its ranges).
    let (mut i_sender, mut i_seq, mut i_payload, mut i_expires) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (p, next) in queued.iter().filter(|(p, _)| p.blob.is_none()) {
        let expires = p.limits.expires_at(now);
        for (o, r) in p.records.iter().enumerate() {
            i_sender.push(p.sender.as_str());
            i_seq.push(next + o as i64);
            i_payload.push(r.as_slice());
            i_expires.push(expires);
        }
    }
    // Each sender a push was queued for, and its next sequence after the part's pushes (counted under its lock);
    // with the flows claimed, only those whose claim counted pushes that were refused, written back to what was
    // queued (no sequence is skipped).
    let queued_for: HashSet<&str> = queued.iter().map(|(p, _)| p.sender.as_str()).collect();
    let (mut n_sender, mut n_next): (Vec<&str>, Vec<i64>) = (Vec::new(), Vec::new());
    for s in &pushing {
        let next = state[s].0;
        let write = if claim {
            // Every pushed sender is among `flows`; were one not, writing its next sequence is always right.
            flows.binary_search(s).map_or(true, |at| {
                next_of[at].map(|n| n.saturating_add(claimed[at])) != Some(next)
            })
        } else {
            queued_for.contains(s)
        };
        if write {
            n_sender.push(s);
            n_next.push(next);
        }
    }
    let payloads: Vec<String> = queued.iter().map(|(p, _)| notice_of(app_id, p)).collect();
    let insert_args: [&(dyn ToSql + Sync); 6] =
        [&app_id, &i_sender, &i_seq, &i_payload, &now, &i_expires];
    let next_args: [&(dyn ToSql + Sync); 3] = [&app_id, &n_sender, &n_next];
    let notify_args: [&(dyn ToSql + Sync); 2] = [&DOWN_CHANNEL, &payloads];
    let piece_lens: Vec<i32> = blobs.iter().map(|b| b.piece_len() as i32).collect();
    let piece_counts: Vec<i64> = blobs.iter().map(|b| b.pieces() as i64).collect();
    let blob_bytes: Vec<&[u8]> = blobs.iter().map(|b| b.bytes()).collect();
    let blob_writes: Vec<(bool, Vec<&(dyn ToSql + Sync)>)> = blobs
        .iter()
        .enumerate()
        .filter(|(k, _)| blob_refs[*k] > 0)
        .map(|(k, _)| {
            let (id, write) = &blob_ids[k];
            let args: Vec<&(dyn ToSql + Sync)> = if *write {
                vec![
                    &app_id,
                    id,
                    &piece_lens[k],
                    &piece_counts[k],
                    &blob_refs[k],
                    &blob_bytes[k],
                ]
            } else {
                vec![&app_id, id, &blob_refs[k]]
            };
            (*write, args)
        })
        .collect();
    let ranges_args: [&(dyn ToSql + Sync); 7] = [
        &app_id, &r_sender, &r_first, &r_last, &r_blob, &now, &r_expires,
    ];
    let count_args: [&(dyn ToSql + Sync); 2] = [&app_id, &delta];
    let ListenArgs {
        ack: ack_args,
        delete: delete_args,
        read: read_args,
    } = fetches.args(&app_id, &now);
    let mut second: Vec<Sent<'_>> = Vec::new();
    if !i_sender.is_empty() {
        second.push(Box::pin(async {
            c.execute(&ds.insert, &insert_args)
                .await
                .map(|_| Answer::Done)
        }));
    }
    if !n_sender.is_empty() {
        second.push(Box::pin(async {
            c.execute(&ds.set_next, &next_args)
                .await
                .map(|_| Answer::Done)
        }));
    }
    for (write, a) in &blob_writes {
        let sql = if *write {
            &ds.blob_insert
        } else {
            &ds.blob_ref
        };
        second.push(Box::pin(async {
            c.execute(sql, a).await.map(|_| Answer::Done)
        }));
    }
    if !r_sender.is_empty() {
        second.push(Box::pin(async {
            c.execute(&ds.ranges_insert, &ranges_args)
                .await
                .map(|_| Answer::Done)
        }));
    }
    let counted = !queued.is_empty() || expired_any;
    let count_at = second.len();
    if counted {
        second.push(Box::pin(async {
            c.query_opt(&ds.count, &count_args).await.map(Answer::Row)
        }));
    }
    if !payloads.is_empty() {
        second.push(Box::pin(async {
            c.execute(&ds.notify, &notify_args)
                .await
                .map(|_| Answer::Done)
        }));
    }
    let listening = !listens.is_empty();
    let read_at = second.len();
    if listening {
        second.push(Box::pin(async {
            c.query(&ds.read, &read_args).await.map(Answer::Rows)
        }));
        second.push(Box::pin(async {
            c.execute(&ds.ack, &ack_args).await.map(|_| Answer::Done)
        }));
        second.push(Box::pin(async {
            c.query_one(&ds.delete, &delete_args)
                .await
                .map(|r| Answer::Row(Some(r)))
        }));
    }
    second.push(Box::pin(async {
        c.execute(&st.commit, &[]).await.map(|_| Answer::Done)
    }));
    let answers = match in_order(second).await {
        Ok(a) => a,
        Err(e) => {
            let _ = c.execute(&st.rollback, &[]).await;
            // COMMIT was sent in this wait: a connection lost now leaves it unknown whether the pushes committed.
            return Err(if e.is_closed() {
                Refused::Unknown(db_err(target, "queueing downlink records")(e))
            } else {
                fail("queueing downlink records")(e)
            });
        }
    };
    // Committed: a later transaction of the same request refers to each file written or referenced by its id.
    for (k, b) in blobs.iter().enumerate() {
        if blob_refs[k] > 0 {
            b.set_stored(blob_ids[k].0);
        }
    }
    let mut applied = Applied::default();
    let mut waiting = None;
    if counted && let Answer::Row(Some(row)) = &answers[count_at] {
        waiting = Some(row.get::<_, i64>(0).max(0) as u64);
    }
    if listening {
        let (Answer::Rows(read), Answer::Row(Some(deleted))) =
            (&answers[read_at], &answers[read_at + 2])
        else {
            unreachable!("the read answers rows and the delete one row, as their futures say");
        };
        applied.down = fetches.applied(listens, deleted, read);
    }
    applied.down.waiting = applied.down.waiting.or(waiting);
    applied.down.pushes = outcomes;
    Ok(applied)
}

/// The rows of `names` are there; what their heard sequences are now, this connection does not say (a turn of
/// [`try_part`] may have moved them).
fn mark_known(conn: &mut Conn, app: AppIndex, names: &[String]) {
    for n in names {
        conn.known.insert((app, n.clone()), None);
    }
}

/// A reader of what a fleet's database holds, for `pure-serve records --store postgres://…`: blocking calls on a
/// runtime of its own, one connection, and chunks fetched in pages so that a large app is never held whole.
pub struct PgReader {
    rt: tokio::runtime::Runtime,
    client: Client,
    /// The URL as given, naming the database in messages (and as the "store" of a corrupt record).
    shown: String,
    /// When set, every wait ends by then, answered or not (the outbox's reads, which must end before the leases
    /// they feed for run out: src/apps/host/outbox.rs).
    deadline: std::cell::Cell<Option<tokio::time::Instant>>,
    /// When set, each wait ends after this, answered or not ([`TOOL_WAIT`], for the tools).
    each_wait: Option<Duration>,
}

/// Chunk rows fetched per query by [`PgReader::for_each_record_view`].
const READ_PAGE: i64 = 512;

/// Chunk rows fetched per query by [`PgReader::read_from`]: a feed wants at most an outlet's room, and a chunk can
/// hold a whole turn of a source.
const FEED_PAGE: i64 = 32;

impl PgReader {
    /// Connects to the database at `url` (docs/scale-out.md) for a tool; tables need not be there yet. Every wait
    /// of the reader, the connection's included, gives up after [`TOOL_WAIT`].
    pub fn open(url: &str, password: Option<&str>) -> Result<Self, StoreError> {
        let mut config = config_of(url, password, "pure-serve records")?;
        config
            .connect_timeout(NET_TIMEOUT)
            .tcp_user_timeout(NET_TIMEOUT)
            .keepalives(true)
            .keepalives_idle(NET_TIMEOUT)
            .keepalives_interval(Duration::from_secs(1))
            .keepalives_retries(3);
        Self::connect(
            Target {
                config,
                shown: url.to_string(),
            },
            None,
            Some(TOOL_WAIT),
        )
    }

    /// Connects to `target`, giving up at `deadline` if one is given, and each wait after `each_wait` if given
    /// (the connection, made and set up, is one wait).
    fn connect(
        target: Target,
        deadline: Option<tokio::time::Instant>,
        each_wait: Option<Duration>,
    ) -> Result<Self, StoreError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|source| StoreError::SyncThread { source })?;
        let reader = |rt, client| PgReader {
            rt,
            client,
            shown: target.shown.clone(),
            deadline: std::cell::Cell::new(deadline),
            each_wait,
        };
        let connecting = async {
            let (client, connection) = target.config.connect(NoTls).await?;
            tokio::spawn(async move {
                let _ = connection.await;
            });
            // The feed's and the leases' statements are prepared once too (see PLANS).
            client.batch_execute(PLANS).await?;
            Ok(client)
        };
        let (at, silent) = wait_until(deadline, each_wait);
        let client = match at {
            None => rt.block_on(connecting),
            Some(at) => {
                match rt.block_on(async { tokio::time::timeout_at(at, connecting).await }) {
                    Ok(r) => r,
                    Err(_) => return Err(silent.ran_out(&target.shown, "connecting")),
                }
            }
        };
        match client {
            Ok(client) => Ok(reader(rt, client)),
            Err(source) => Err(classified(
                &target.shown,
                "connecting",
                source,
                |url, doing, source| StoreError::DatabaseRead { url, doing, source },
            )),
        }
    }

    /// Waits for `f` on this reader's runtime, until its deadline if one is set; a wait that runs out is
    /// [`StoreError::DatabaseDown`].
    fn wait_raw<T>(
        &self,
        doing: &'static str,
        f: impl std::future::Future<Output = Result<T, tokio_postgres::Error>>,
    ) -> Result<Result<T, tokio_postgres::Error>, StoreError> {
        match wait_until(self.deadline.get(), self.each_wait) {
            (None, _) => Ok(self.rt.block_on(f)),
            (Some(at), bound) => self
                .rt
                .block_on(async { tokio::time::timeout_at(at, f).await })
                .map_err(|_| bound.ran_out(&self.shown, doing)),
        }
    }

    /// As [`PgReader::wait_raw`], the database's error named by `doing`.
    fn wait<T>(
        &self,
        doing: &'static str,
        f: impl std::future::Future<Output = Result<T, tokio_postgres::Error>>,
    ) -> Result<T, StoreError> {
        self.wait_raw(doing, f)?.map_err(self.err(doing))
    }

    fn err(&self, doing: &'static str) -> impl Fn(tokio_postgres::Error) -> StoreError + '_ {
        move |source| {
            classified(&self.shown, doing, source, |url, doing, source| {
                StoreError::DatabaseRead { url, doing, source }
            })
        }
    }

    /// The apps the fleet's nodes registered, by name (none before a node made the tables).
    pub fn apps(&self) -> Result<Vec<String>, StoreError> {
        let doing = "listing the apps";
        match self.wait_raw(
            doing,
            self.client
                .query("SELECT name FROM apps ORDER BY name", &[]),
        )? {
            Ok(rows) => Ok(rows.iter().map(|r| r.get(0)).collect()),
            Err(e) if e.code() == Some(&SqlState::UNDEFINED_TABLE) => Ok(Vec::new()),
            Err(e) => Err(self.err(doing)(e)),
        }
    }

    fn app_id(&self, app: &str) -> Result<i32, StoreError> {
        let rows = self.wait_raw(
            "finding the app",
            self.client
                .query("SELECT id FROM apps WHERE name = $1", &[&app]),
        )?;
        match rows {
            Ok(rows) if !rows.is_empty() => Ok(rows[0].get(0)),
            Ok(_) => Err(StoreError::NoSuchDatabaseApp {
                app: app.to_string(),
                url: self.shown.clone(),
                known: self.apps()?.join(", "),
            }),
            Err(e) if e.code() == Some(&SqlState::UNDEFINED_TABLE) => {
                Err(StoreError::NoSuchDatabaseApp {
                    app: app.to_string(),
                    url: self.shown.clone(),
                    known: String::new(),
                })
            }
            Err(e) => Err(self.err("finding the app")(e)),
        }
    }

    /// The app's next position: records before it are stored, and every one of them is visible (docs/scale-out.md,
    /// "The order of an app's records").
    pub fn head(&self, app: &str) -> Result<u64, StoreError> {
        let id = self.app_id(app)?;
        let row = self.wait(
            "reading an app's head",
            self.client
                .query_one("SELECT head FROM apps WHERE id = $1", &[&id]),
        )?;
        Ok(row.get::<_, i64>(0).max(1) as u64)
    }

    /// As [`super::AppStore::for_each_waiting`]: the downlink records of `app` waiting for their devices (of
    /// `sender`, if given) and not expired at `now_ms`, by sender then sequence, in keyset pages.
    pub fn for_each_waiting(
        &self,
        app: &str,
        sender: Option<&str>,
        now_ms: i64,
        mut each: impl FnMut(&super::downlink::WaitingView<'_>) -> bool,
    ) -> Result<(), StoreError> {
        let id = self.app_id(app)?;
        let (mut after_sender, mut after_seq) = (String::new(), 0i64);
        loop {
            // Records and a file's pieces merged by (sender, seq), a page of each: a range has a piece at least,
            // so the page's first ranges hold its pieces, each cut to the page.
            let rows = self.wait(
                "reading waiting downlink records",
                self.client.query(
                    "SELECT * FROM ( \
                         (SELECT sender, seq, payload, queued_at, expires_at, NULL::bigint AS blob, \
                                 NULL::bigint AS piece FROM downlink \
                          WHERE app = $1 AND ($2::text IS NULL OR sender = $2) \
                            AND (expires_at IS NULL OR expires_at > $3) AND (sender, seq) > ($4, $5) \
                          ORDER BY sender, seq LIMIT $6) \
                         UNION ALL \
                         (SELECT r.sender, p.seq, \
                                 substring(y.bytes FROM ((r.first_piece + p.seq - r.first_seq) * b.piece_len + 1)::int \
                                     FOR b.piece_len), \
                                 r.queued_at, r.expires_at, r.blob, r.first_piece + p.seq - r.first_seq \
                          FROM (SELECT * FROM down_ranges \
                                WHERE app = $1 AND ($2::text IS NULL OR sender = $2) \
                                  AND (expires_at IS NULL OR expires_at > $3) \
                                  AND sender >= $4 AND (sender > $4 OR last_seq > $5) \
                                ORDER BY sender, first_seq LIMIT $6) r \
                          JOIN down_blobs b ON b.app = r.app AND b.id = r.blob \
                          JOIN down_blob_bytes y ON y.app = r.app AND y.id = r.blob \
                          CROSS JOIN LATERAL generate_series( \
                              CASE WHEN r.sender = $4 THEN GREATEST(r.first_seq, $5 + 1) ELSE r.first_seq END, \
                              LEAST(r.last_seq, \
                                  (CASE WHEN r.sender = $4 THEN GREATEST(r.first_seq, $5 + 1) ELSE r.first_seq END) \
                                  + $6 - 1)) AS p(seq)) \
                     ) w ORDER BY sender, seq LIMIT $6",
                    &[&id, &sender, &now_ms, &after_sender, &after_seq, &READ_PAGE],
                ),
            )?;
            for row in &rows {
                let name: String = row.get(0);
                let payload: Vec<u8> = row.get(2);
                let seq: i64 = row.get(1);
                let blob: Option<i64> = row.get(5);
                let piece: Option<i64> = row.get(6);
                let view = super::downlink::WaitingView {
                    sender: &name,
                    seq: seq as u64,
                    payload: &payload,
                    queued_at_ms: row.get(3),
                    expires_at_ms: row.get(4),
                    piece: blob.zip(piece).map(|(b, p)| (b, p.max(0) as u64)),
                };
                if !each(&view) {
                    return Ok(());
                }
                (after_sender, after_seq) = (name, seq);
            }
            if (rows.len() as i64) < READ_PAGE {
                return Ok(());
            }
        }
    }

    /// As [`super::AppStore::for_each_source_seen`]: every source of `app`, by name, with its heard sequence and
    /// its newest chunk's commit time (0: none), a page at a time.
    pub fn for_each_source_seen(
        &self,
        app: &str,
        mut each: impl FnMut(&str, u64, i64) -> bool,
    ) -> Result<(), StoreError> {
        let id = self.app_id(app)?;
        let mut after = String::new();
        loop {
            let rows = self.wait(
                "reading the senders' last records",
                self.client.query(
                    "SELECT s.name, s.heard, \
                            COALESCE((SELECT c.stored_at FROM chunks c WHERE c.app = s.app AND c.source = s.id \
                                      ORDER BY c.first_seq DESC LIMIT 1), 0) \
                     FROM sources s WHERE s.app = $1 AND s.name > $2 ORDER BY s.name LIMIT $3",
                    &[&id, &after, &READ_PAGE],
                ),
            )?;
            for row in &rows {
                let name: String = row.get(0);
                let heard: i64 = row.get(1);
                let at: i64 = row.get(2);
                if !each(&name, heard.max(0) as u64, at) {
                    return Ok(());
                }
                after = name;
            }
            if (rows.len() as i64) < READ_PAGE {
                return Ok(());
            }
        }
    }

    /// As [`super::AppStore::source_seen`]: one source of `app`, its heard sequence and newest chunk's commit time.
    pub fn source_seen(&self, app: &str, name: &str) -> Result<Option<(u64, i64)>, StoreError> {
        let id = self.app_id(app)?;
        let rows = self.wait(
            "reading a sender's last record",
            self.client.query(
                "SELECT s.heard, \
                        COALESCE((SELECT c.stored_at FROM chunks c WHERE c.app = s.app AND c.source = s.id \
                                  ORDER BY c.first_seq DESC LIMIT 1), 0) \
                 FROM sources s WHERE s.app = $1 AND s.name = $2",
                &[&id, &name],
            ),
        )?;
        Ok(rows.first().map(|row| {
            let heard: i64 = row.get(0);
            let at: i64 = row.get(1);
            (heard.max(0) as u64, at)
        }))
    }

    /// As [`super::AppStore::waiting_by_sender`]: how many downlink records wait for each sender of `app`.
    pub fn waiting_by_sender(
        &self,
        app: &str,
        now_ms: i64,
    ) -> Result<Vec<(String, u64)>, StoreError> {
        let id = self.app_id(app)?;
        let rows = self.wait(
            "counting waiting downlink records",
            self.client.query(
                "SELECT sender, sum(n)::bigint FROM ( \
                     SELECT sender, count(*) AS n FROM downlink \
                     WHERE app = $1 AND (expires_at IS NULL OR expires_at > $2) GROUP BY sender \
                     UNION ALL \
                     SELECT sender, sum(last_seq - first_seq + 1)::bigint FROM down_ranges \
                     WHERE app = $1 AND (expires_at IS NULL OR expires_at > $2) GROUP BY sender \
                 ) w GROUP BY sender ORDER BY sender",
                &[&id, &now_ms],
            ),
        )?;
        Ok(rows
            .iter()
            .map(|r| (r.get::<_, String>(0), r.get::<_, i64>(1).max(0) as u64))
            .collect())
    }

    /// As [`super::AppStore::for_each_record_view`]: every record of `app` at position ≥ `from_pos` (of one source,
    /// if given), by source then sequence when `from_pos` is 0, else by position.
    pub fn for_each_record_view(
        &self,
        app: &str,
        source: Option<&str>,
        from_pos: u64,
        mut each: impl FnMut(&super::RecordView<'_>) -> bool,
    ) -> Result<(), StoreError> {
        let id = self.app_id(app)?;
        let store = std::path::PathBuf::from(&self.shown);
        if from_pos == 0 {
            return self.each_by_source(id, source, &store, &mut each);
        }
        self.each_chunk_from(id, source, from_pos, READ_PAGE, |chunk| {
            chunk.each_record(&store, from_pos, &mut each)
        })
    }

    /// Hands `each` the chunks of app `id` (of one source, if given) from the one that holds `from` on, in position
    /// order, until it returns `false`. Keyset pages from the last chunk's end, starting at the chunk that holds
    /// `from`: both bounds are on the `chunks_pos` index, so a page costs the same at the start of an app and at its
    /// millionth chunk.
    fn each_chunk_from(
        &self,
        id: i32,
        source: Option<&str>,
        from: u64,
        page: i64,
        mut each: impl FnMut(&super::StoredChunk<'_>) -> Result<bool, StoreError>,
    ) -> Result<(), StoreError> {
        let mut next_pos = from as i64;
        loop {
            let rows = self.wait(
                "reading records",
                self.client.query(
                    "SELECT s.name, c.first_seq, c.count, c.body, c.pos, c.stored_at, c.format \
                     FROM chunks c JOIN sources s ON s.id = c.source \
                     WHERE c.app = $1 AND ($2::text IS NULL OR s.name = $2) \
                       AND c.pos >= (SELECT COALESCE(max(pos), 0) FROM chunks WHERE app = $1 AND pos <= $3) \
                       AND c.pos + c.count > $3 \
                     ORDER BY c.pos LIMIT $4",
                    &[&id, &source, &next_pos, &page],
                ),
            )?;
            for row in &rows {
                let name: String = row.get(0);
                let chunk = chunk_row(&name, row, 1);
                if !each(&chunk)? {
                    return Ok(());
                }
                next_pos = (chunk.pos + chunk.count) as i64;
            }
            if (rows.len() as i64) < page {
                return Ok(());
            }
        }
    }

    /// As [`super::AppStore::read_from`], for an outlet's feed: records of `app` from position `from` on, in position
    /// order, as chunks (the first cut to start at `from`), until about `max_records` records or `max_bytes` bytes
    /// (at least one chunk). Positions become visible in order (docs/scale-out.md, "The order of an app's records"),
    /// so a feed that reads on from the end of what it read never skips a chunk another node commits later.
    pub fn read_from(
        &self,
        app: &str,
        from: u64,
        max_records: u64,
        max_bytes: usize,
    ) -> Result<Vec<super::Chunk>, StoreError> {
        let id = self.app_id(app)?;
        let store = std::path::PathBuf::from(&self.shown);
        let (mut out, mut records, mut bytes) = (Vec::new(), 0u64, 0usize);
        self.each_chunk_from(id, None, from, FEED_PAGE, |whole| {
            if let Some(chunk) = whole.cut_to(from, &store)? {
                records += chunk.count;
                bytes += chunk.body.len();
                out.push(chunk);
            }
            Ok(records < max_records && bytes < max_bytes)
        })?;
        Ok(out)
    }

    /// Every record of app `id` by source name, then sequence: the sources in keyset pages by name (their unique
    /// index), and each source's chunks in pages by first sequence (the primary key), so that no page sorts the app.
    fn each_by_source(
        &self,
        id: i32,
        source: Option<&str>,
        store: &std::path::Path,
        each: &mut impl FnMut(&super::RecordView<'_>) -> bool,
    ) -> Result<(), StoreError> {
        let mut after_name = String::new();
        let mut first_page = true;
        loop {
            let sources = self.wait(
                "reading sources",
                self.client.query(
                    "SELECT id, name FROM sources \
                     WHERE app = $1 AND ($2::text IS NULL OR name = $2) AND (name > $3 OR $4) \
                     ORDER BY name LIMIT $5",
                    &[&id, &source, &after_name, &first_page, &READ_PAGE],
                ),
            )?;
            first_page = false;
            for s in &sources {
                let (sid, name): (i64, String) = (s.get(0), s.get(1));
                let mut after_first = -1i64;
                loop {
                    let rows = self.wait(
                        "reading records",
                        self.client.query(
                            "SELECT c.first_seq, c.count, c.body, c.pos, c.stored_at, c.format FROM chunks c \
                             WHERE c.app = $1 AND c.source = $2 AND c.first_seq > $3 \
                             ORDER BY c.first_seq LIMIT $4",
                            &[&id, &sid, &after_first, &READ_PAGE],
                        ),
                    )?;
                    for row in &rows {
                        let chunk = chunk_row(&name, row, 0);
                        if !chunk.each_record(store, 0, each)? {
                            return Ok(());
                        }
                        after_first = chunk.first_seq as i64;
                    }
                    if (rows.len() as i64) < READ_PAGE {
                        break;
                    }
                }
                after_name = name;
            }
            if (sources.len() as i64) < READ_PAGE {
                return Ok(());
            }
        }
    }
}

/// Which bound ends a reader's wait first: the reader's deadline (the outbox's leases) or its bound per wait (a
/// tool's).
#[derive(Clone, Copy)]
enum Bound {
    Deadline,
    EachWait(Duration),
}

impl Bound {
    /// The error of a wait `doing` that this bound ended.
    fn ran_out(self, url: &str, doing: &'static str) -> StoreError {
        match self {
            Bound::Deadline => StoreError::DatabaseDown {
                url: url.to_string(),
                why: format!("{doing}: no answer in time"),
            },
            Bound::EachWait(within) => StoreError::DatabaseSilent {
                url: url.to_string(),
                doing,
                within,
            },
        }
    }
}

/// When a wait that starts now must end (if ever), and which bound says so.
fn wait_until(
    deadline: Option<tokio::time::Instant>,
    each_wait: Option<Duration>,
) -> (Option<tokio::time::Instant>, Bound) {
    let each = each_wait.map(|d| (tokio::time::Instant::now() + d, Bound::EachWait(d)));
    match (deadline.map(|at| (at, Bound::Deadline)), each) {
        (Some(a), Some(b)) => {
            let first = if a.0 <= b.0 { a } else { b };
            (Some(first.0), first.1)
        }
        (Some((at, b)), None) | (None, Some((at, b))) => (Some(at), b),
        (None, None) => (None, Bound::Deadline),
    }
}

/// A chunk row whose columns from `at` are first_seq, count, body, pos, stored_at, format.
fn chunk_row<'a>(name: &'a str, row: &'a tokio_postgres::Row, at: usize) -> super::StoredChunk<'a> {
    super::StoredChunk {
        source: name,
        first_seq: row.get::<_, i64>(at) as u64,
        count: row.get::<_, i32>(at + 1) as u64,
        body: row.get(at + 2),
        pos: row.get::<_, i64>(at + 3) as u64,
        stored_at_ms: row.get(at + 4),
        forwarded: row.get::<_, i16>(at + 5) == RecordFormat::Forwarded as i16,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_objects_looked_for_are_every_table_and_index_the_schema_makes() {
        let names = schema_objects();
        assert_eq!(
            SCHEMA.matches("IF NOT EXISTS").count(),
            names.len(),
            "{names:?}"
        );
        for name in [
            "pure_layout",
            "sources",
            "chunks",
            "chunks_pos",
            "down_ranges",
        ] {
            assert!(names.iter().any(|n| n == name), "{name} in {names:?}");
        }
        assert!(
            names
                .iter()
                .all(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_lowercase() || c == '_')),
            "{names:?}"
        );
    }

    #[test]
    fn hosts_named_counts_the_authority_or_the_host_parameter_as_libpq_does() {
        assert_eq!(hosts_named("postgres://pure@db/fleet"), 1);
        assert_eq!(
            hosts_named("postgres://pure@db1:5432,db2:5433/fleet?target_session_attrs=read-write"),
            2
        );
        // A directory given by `host=` replaces the authority's host, as in libpq.
        assert_eq!(
            hosts_named("postgresql://postgres@localhost/postgres?host=/run/postgresql"),
            1
        );
        assert_eq!(
            hosts_named(
                "postgresql://postgres@/postgres?host=/a,/b&target_session_attrs=read-write"
            ),
            2
        );
    }
}
