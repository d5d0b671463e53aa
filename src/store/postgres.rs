//! The PostgreSQL engine behind [`TurnStore`]: one database shared by the nodes of a fleet (docs/scale-out.md).
//!
//! Everything it does runs on its own thread (`pure-store`) with a current-thread tokio runtime and one
//! connection (tokio-postgres), so no loop ever waits on a database round trip: [`TurnStore::submit`] queues the
//! turn, the thread applies each app's part in a transaction of its own, and the outcome comes back through a
//! queue and an eventfd ([`TurnStore::wake_fd`]) once COMMIT has returned — what the database made durable.
//!
//! A part is applied as docs/scale-out.md specifies ("A turn: one transaction per app"): the turn's new sources
//! made beforehand, then BEGIN and the source rows locked `FOR UPDATE` in id order (one wait); the frames cut
//! under the locks against the heard sequences found there, by the same code as SQLite's ([`super::cut_flow`]);
//! then the heard sequences moved **conditionally** (`WHERE heard = old`), the app's head row updated last (so
//! positions become visible in commit order), the chunks inserted from arrays, the outlets' progress, COMMIT (one
//! wait). Every statement is prepared, BEGIN and COMMIT included: a statement given as text is prepared first, a
//! round trip of its own, and in a pipeline it then reaches the server after the prepared ones queued behind it
//! (research/017, "A negative result").
//!
//! A part refused with a serialization failure or a deadlock, or whose conditional update finds a heard sequence
//! moved, is rolled back and applied again from the start (at most [`RETRIES`] times). A broken connection fails
//! the parts in hand (never acked: their outcome may be unknown). It is made again **beside the jobs, not in
//! them**: while there is none, a try to connect starts every [`RECONNECT_EVERY`] (several may be under way at once
//! against a network that drops packets, each bounded by [`NET_TIMEOUT`]), and every part that needs the database
//! fails at once, naming why the last try failed. So a turn never waits behind a connection that cannot be made,
//! the host finishes its turns and tells its senders NOT_STORED while the database is away, and the first try that
//! gets through is counted ([`TurnStore::connections`]), which has the host probe its failed apps at once.

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

use super::engine::{AppTurn, TurnOutcome, TurnStore};
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

/// A session of a node that stays in a transaction without sending (cut off between a turn's two waits) is ended by
/// the database after this, so that its row locks do not stop the other nodes' turns on its senders for longer.
pub const IDLE_IN_TRANSACTION: &str = "5s";

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
);
CREATE TABLE IF NOT EXISTS chunks (
    app       INTEGER NOT NULL,
    source    BIGINT NOT NULL REFERENCES sources(id),
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
";

/// How a new `chunks` table keeps its bodies (docs/scale-out.md, "The schema").
const CHUNK_BODIES: &str = "ALTER TABLE chunks ALTER COLUMN body SET STORAGE EXTERNAL";

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
    changed: Condvar,
    wake: Wake,
    /// The store thread has ended (it panicked, or its queue closed): nothing more will come.
    gone: std::sync::atomic::AtomicBool,
    /// Connections made so far ([`TurnStore::connections`]).
    connections: std::sync::atomic::AtomicU64,
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

/// The connection settings `url` names, with the password from its file and the name the database shows for it.
fn config_of(
    url: &str,
    password: Option<&str>,
    application: &str,
) -> Result<tokio_postgres::Config, StoreError> {
    let mut config =
        tokio_postgres::Config::from_str(url).map_err(|source| StoreError::Database {
            url: url.to_string(),
            doing: "reading the URL",
            source,
        })?;
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
    move |source| StoreError::Database {
        url: target.shown.clone(),
        doing,
        source,
    }
}

impl PostgresTurns {
    /// Connects to the database at `url` (`postgres://…`, docs/scale-out.md), makes its tables if they are not
    /// there, registers `apps` (app index = place in the list), and starts the store thread. The first connection
    /// is made here, so that a wrong address or a refused login stops the start with its reason.
    pub fn open(url: &str, password: Option<&str>, apps: &[String]) -> Result<Self, StoreError> {
        let mut config = config_of(url, password, "pure-serve")?;
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
            changed: Condvar::new(),
            wake: Wake::new().map_err(|source| StoreError::SyncThread { source })?,
            gone: std::sync::atomic::AtomicBool::new(false),
            connections: std::sync::atomic::AtomicU64::new(0),
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
                    let conn = match make_conn(&target, &apps, lost.clone()).await {
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
                out.push(TurnOutcome { seq, apps });
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
}

struct Conn {
    client: Client,
    st: Prepared,
    /// The database's id of each app, by app index.
    app_ids: Vec<i32>,
    /// Sources known to have a row, per app index (so a turn names only new ones to make).
    known: HashSet<(AppIndex, String)>,
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
}

/// Why a part's transaction did not commit.
enum Refused {
    /// A new try may cure it (serialization failure, deadlock, a heard sequence moved).
    Retry,
    Failed(StoreError),
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
            let no_conn = self.conn.is_none();
            let trying = !self.tries.is_empty();
            let may_try = no_conn && self.tries.len() < TRIES_AT_ONCE;
            tokio::select! {
                biased;
                Some(tried) = self.tries.join_next(), if trying => self.tried(tried, done),
                _ = pace.tick(), if may_try => self.try_connect(),
                () = self.lost.notified() => {}
                job = rx.recv() => match job {
                    Some(job) => self.serve_job(job, done).await,
                    None => break,
                },
            }
        }
    }

    async fn serve_job(&mut self, job: Job, done: &Done) {
        match job {
            Job::Turn(seq, parts) => {
                let mut apps = Vec::with_capacity(parts.len());
                for part in &parts {
                    let r = self.apply_part(part).await.map_err(Arc::new);
                    apps.push((part.app, r));
                }
                lock(&done.outcomes).push_back(TurnOutcome { seq, apps });
                done.changed.notify_all();
                done.wake.wake();
            }
            Job::Heard(app, source, reply) => {
                // A read for starts, tests and tools, which may wait for a connection to be made.
                let r = match self.connected_or_wait(done).await {
                    Ok(()) => self.heard_of(app, &source).await,
                    Err(e) => Err(e),
                };
                let _ = reply.send(r);
            }
            Job::Head(app, reply) => {
                let r = match self.connected_or_wait(done).await {
                    Ok(()) => self.head_of(app).await,
                    Err(e) => Err(e),
                };
                let _ = reply.send(r);
            }
            Job::AddApps(names) => {
                Arc::make_mut(&mut self.apps).extend(names.iter().cloned());
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

    /// Forgets a connection that has closed (its error was reported by the statement that found it, if any).
    fn drop_if_lost(&mut self) {
        if self.conn.as_ref().is_some_and(|c| c.client.is_closed()) {
            tracing::warn!(
                "the connection to the fleet's database {} was lost; nothing is acknowledged until it is made again",
                self.target.shown
            );
            self.conn = None;
        }
    }

    /// Starts a try to connect, beside the jobs.
    fn try_connect(&mut self) {
        let (target, apps, lost) = (self.target.clone(), self.apps.clone(), self.lost.clone());
        self.tries
            .spawn(async move { make_conn(&target, &apps, lost).await });
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

    /// Applies one app's part of a turn in one transaction, trying again what a new try may cure.
    async fn apply_part(&mut self, part: &AppTurn) -> Result<Applied, StoreError> {
        if part.pieces.is_empty() && part.outlets.is_empty() {
            return self.probe(part.app).await;
        }
        let mut tries = 0;
        loop {
            let target = self.target.clone();
            let conn = self.connection()?;
            let app_id = match conn.app_ids.get(part.app as usize) {
                Some(&id) if id >= 0 => id,
                _ => return Err(StoreError::Closed { app: part.app }),
            };
            match try_part(&target, conn, app_id, part).await {
                Ok(applied) => return Ok(applied),
                Err(Refused::Retry) if tries + 1 < RETRIES => {
                    tries += 1;
                    // A short, varying pause, so that two nodes refused together do not collide again.
                    let ms = 1 + (crate::store::now_ms() as u64 % 7) * (tries as u64);
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                }
                Err(Refused::Retry) => {
                    return Err(StoreError::DatabaseRefused {
                        url: target.shown.clone(),
                        why: format!(
                            "it refused a turn {RETRIES} times in a row (serialization failures or deadlocks), so \
                             the turn is not acknowledged and its senders send again"
                        ),
                    });
                }
                Err(Refused::Failed(e)) => return Err(e),
            }
        }
    }
}

/// Makes a connection: the settings checked, the tables made if they are not there, the apps registered, every
/// statement prepared. Bounded as a whole by twice [`NET_TIMEOUT`], whatever the network does.
async fn make_conn(
    t: &Target,
    apps: &[String],
    lost: Arc<tokio::sync::Notify>,
) -> Result<Conn, StoreError> {
    match tokio::time::timeout(2 * NET_TIMEOUT, make_conn_within(t, apps, lost)).await {
        Ok(made) => made,
        Err(_) => Err(StoreError::DatabaseDown {
            url: t.shown.clone(),
            why: format!(
                "connecting took more than {} s",
                (2 * NET_TIMEOUT).as_secs()
            ),
        }),
    }
}

async fn make_conn_within(
    t: &Target,
    apps: &[String],
    lost: Arc<tokio::sync::Notify>,
) -> Result<Conn, StoreError> {
    let (client, connection) = t
        .config
        .connect(NoTls)
        .await
        .map_err(db_err(t, "connecting"))?;
    tokio::spawn(async move {
        // Its error is the client's too (`is_closed`), and reported by the statement that finds it.
        let _ = connection.await;
        lost.notify_one();
    });
    client
        .batch_execute(&format!(
            "SET idle_in_transaction_session_timeout = '{IDLE_IN_TRANSACTION}'"
        ))
        .await
        .map_err(db_err(t, "setting idle_in_transaction_session_timeout"))?;
    let sync: String = client
        .query_one("SHOW synchronous_commit", &[])
        .await
        .map_err(db_err(t, "reading synchronous_commit"))?
        .get(0);
    if sync == "off" {
        return Err(StoreError::DatabaseRefused {
            url: t.shown.clone(),
            why: "its synchronous_commit is off, so a COMMIT that returned may still be lost in a crash of the \
                  database, and \"stored\" would not mean stored: set synchronous_commit = on (the default) for \
                  the node's user (ALTER ROLE … SET synchronous_commit = on)"
                .into(),
        });
    }
    let new_tables: bool = client
        .query_one("SELECT to_regclass('chunks') IS NULL", &[])
        .await
        .map_err(db_err(t, "looking for the tables"))?
        .get(0);
    // Two nodes starting at once may both make the tables: one of them then finds a name taken, and tries again.
    let mut tries = 0;
    loop {
        match client.batch_execute(SCHEMA).await {
            Ok(()) => break,
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
    client
        .batch_execute(&format!(
            "INSERT INTO pure_layout (version) SELECT {LAYOUT_VERSION} \
             WHERE NOT EXISTS (SELECT 1 FROM pure_layout)"
        ))
        .await
        .map_err(db_err(t, "writing the layout's version"))?;
    let found: i32 = client
        .query_one("SELECT max(version) FROM pure_layout", &[])
        .await
        .map_err(db_err(t, "reading the layout's version"))?
        .get(0);
    if found > LAYOUT_VERSION {
        return Err(StoreError::DatabaseRefused {
            url: t.shown.clone(),
            why: format!(
                "its tables have layout {found}, this pure-serve knows layouts up to {LAYOUT_VERSION}: they were \
                 made by a newer pure-serve; run that one"
            ),
        });
    }
    let mut app_ids = Vec::new();
    register_apps(&client, t, apps, &mut app_ids).await?;
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
        lock_sources: p(
            "SELECT id, name, heard FROM sources WHERE app = $1 AND name = ANY($2::text[]) \
             ORDER BY id FOR UPDATE",
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
    };
    Ok(Conn {
        client,
        st,
        app_ids,
        known: HashSet::new(),
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
    let fail = |doing: &'static str| {
        move |e: tokio_postgres::Error| {
            if retryable(&e) {
                Refused::Retry
            } else {
                Refused::Failed(db_err(target, doing)(e))
            }
        }
    };
    let mut pieces: Vec<Piece<'_>> = part.pieces.iter().map(|p| p.as_piece()).collect();
    // Sorting a flow's frames by first_seq makes reordering within a turn free (protocol.md 5.2, 3); sources in
    // name order, so that rows are made in one order by every node.
    pieces.sort_by(|a, b| (a.source, a.first_seq).cmp(&(b.source, b.first_seq)));
    let mut names: Vec<String> = pieces.iter().map(|p| p.source.to_string()).collect();
    names.dedup();
    let new: Vec<String> = names
        .iter()
        .filter(|n| !conn.known.contains(&(part.app, (*n).clone())))
        .cloned()
        .collect();
    let c = &conn.client;
    let st = &conn.st;
    // First wait: the new sources' rows (autocommit, before the transaction), BEGIN, the rows locked.
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
    if n == 0 && part.outlets.is_empty() {
        // Nothing to write: the heard sequences read under the locks are the outcome.
        c.execute(&st.rollback, &[])
            .await
            .map_err(fail("ending a turn with nothing to store"))?;
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
            applied.new_chunks.push(Chunk {
                pos: base + c_off[k] as u64,
                source: chunk_sources[k].clone(),
                first_seq: c_first[k] as u64,
                count: c_count[k] as u64,
                format: if c_fmt[k] == RecordFormat::Forwarded as i16 {
                    RecordFormat::Forwarded
                } else {
                    RecordFormat::Plain
                },
                stored_at_ms: stored_at,
                body: records,
            });
        }
    }
    Ok(applied)
}

fn mark_known(conn: &mut Conn, app: AppIndex, names: &[String]) {
    for n in names {
        conn.known.insert((app, n.clone()));
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
}

/// Chunk rows fetched per query by [`PgReader::for_each_record_view`].
const READ_PAGE: i64 = 512;

/// Chunk rows fetched per query by [`PgReader::read_from`]: a feed wants at most an outlet's room, and a chunk can
/// hold a whole turn of a source.
const FEED_PAGE: i64 = 32;

impl PgReader {
    /// Connects to the database at `url` (docs/scale-out.md); tables need not be there yet.
    pub fn open(url: &str, password: Option<&str>) -> Result<Self, StoreError> {
        let mut config = config_of(url, password, "pure-serve records")?;
        config.connect_timeout(NET_TIMEOUT);
        Self::connect(
            Target {
                config,
                shown: url.to_string(),
            },
            None,
        )
    }

    /// Connects to `target`, giving up at `deadline` if one is given.
    fn connect(target: Target, deadline: Option<tokio::time::Instant>) -> Result<Self, StoreError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|source| StoreError::SyncThread { source })?;
        let reader = |rt, client| PgReader {
            rt,
            client,
            shown: target.shown.clone(),
            deadline: std::cell::Cell::new(deadline),
        };
        let connecting = async {
            let (client, connection) = target.config.connect(NoTls).await?;
            tokio::spawn(async move {
                let _ = connection.await;
            });
            Ok(client)
        };
        let client = match deadline {
            None => rt.block_on(connecting),
            Some(at) => {
                match rt.block_on(async { tokio::time::timeout_at(at, connecting).await }) {
                    Ok(r) => r,
                    Err(_) => {
                        return Err(StoreError::DatabaseDown {
                            url: target.shown.clone(),
                            why: "connecting: no answer in time".into(),
                        });
                    }
                }
            }
        };
        match client {
            Ok(client) => Ok(reader(rt, client)),
            Err(source) => Err(StoreError::DatabaseRead {
                url: target.shown.clone(),
                doing: "connecting",
                source,
            }),
        }
    }

    /// Waits for `f` on this reader's runtime, until its deadline if one is set; a wait that runs out is
    /// [`StoreError::DatabaseDown`].
    fn wait_raw<T>(
        &self,
        doing: &'static str,
        f: impl std::future::Future<Output = Result<T, tokio_postgres::Error>>,
    ) -> Result<Result<T, tokio_postgres::Error>, StoreError> {
        match self.deadline.get() {
            None => Ok(self.rt.block_on(f)),
            Some(at) => self
                .rt
                .block_on(async { tokio::time::timeout_at(at, f).await })
                .map_err(|_| StoreError::DatabaseDown {
                    url: self.shown.clone(),
                    why: format!("{doing}: no answer in time"),
                }),
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
        move |source| StoreError::DatabaseRead {
            url: self.shown.clone(),
            doing,
            source,
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
            let sources = self
                .rt
                .block_on(self.client.query(
                    "SELECT id, name FROM sources \
                     WHERE app = $1 AND ($2::text IS NULL OR name = $2) AND (name > $3 OR $4) \
                     ORDER BY name LIMIT $5",
                    &[&id, &source, &after_name, &first_page, &READ_PAGE],
                ))
                .map_err(self.err("reading sources"))?;
            first_page = false;
            for s in &sources {
                let (sid, name): (i64, String) = (s.get(0), s.get(1));
                let mut after_first = -1i64;
                loop {
                    let rows = self
                        .rt
                        .block_on(self.client.query(
                            "SELECT c.first_seq, c.count, c.body, c.pos, c.stored_at, c.format FROM chunks c \
                             WHERE c.app = $1 AND c.source = $2 AND c.first_seq > $3 \
                             ORDER BY c.first_seq LIMIT $4",
                            &[&id, &sid, &after_first, &READ_PAGE],
                        ))
                        .map_err(self.err("reading records"))?;
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
