//! Which store the node uses (`--store`), and the one interface a turn is applied through ([`TurnStore`]).
//!
//! SQLite (files under the state directory, [`super::AppStore`], behind [`super::sqlite_engine::SqliteTurns`])
//! is the embedded default and needs no flag; PostgreSQL ([`super::postgres`]) is for several nodes that serve
//! one fleet together (docs/scale-out.md).
//!
//! The interface is "submit a turn; later, its outcome": a loop hands a turn over and never waits on a database
//! round trip or a disk sync, and learns the outcome when [`TurnStore::wake_fd`] is readable. SQLite commits in
//! the caller's thread (in-process, no round trip) and gives the outcome once the `pure-sync` thread has synced
//! it; PostgreSQL runs the whole transaction on a store thread of its own. Either way the outcome is what is
//! durable, and only it may be acked.

use std::os::fd::RawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;

use super::downlink::{DownPush, OwnedFetch, PushOutcome};
use super::lease::{OutletKey, Renewal};
use super::{Applied, Chunk, OutletStart, Piece, RecordView, StoreError};
use crate::proto::turn::AppIndex;
use crate::proto::wire::RecordFormat;

/// Records of one flow to apply, owned, so that a turn can be handed to another thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedPiece {
    pub source: String,
    pub first_seq: u64,
    pub count: u64,
    pub format: RecordFormat,
    /// `count` records in their wire encoding.
    pub records: Vec<u8>,
}

impl OwnedPiece {
    pub fn from_piece(p: &Piece<'_>) -> Self {
        OwnedPiece {
            source: p.source.to_string(),
            first_seq: p.first_seq,
            count: p.count,
            format: p.format,
            records: p.records.to_vec(),
        }
    }

    pub fn as_piece(&self) -> Piece<'_> {
        Piece {
            source: &self.source,
            first_seq: self.first_seq,
            count: self.count,
            format: self.format,
            records: &self.records,
        }
    }
}

/// What one app applies in a turn, in one transaction of its own.
#[derive(Debug, Clone, Default)]
pub struct AppTurn {
    pub app: AppIndex,
    pub pieces: Vec<OwnedPiece>,
    /// Outlets' progress (name, highest position the far side acknowledged), written in the same transaction.
    pub outlets: Vec<(String, u64)>,
    /// Whether the outcome should carry the chunks written ([`Applied::new_chunks`]).
    pub keep_new: bool,
    /// The turn's downlink reads of this app (LISTENs), in the part's transaction: what each device has deleted,
    /// what waits above it read ([`Applied::down`]).
    pub fetches: Vec<OwnedFetch>,
    /// Pushes of downlink records to this app's senders, each in a transaction of its own applied before the
    /// part's, answered in [`TurnOutcome::pushes`] in order.
    pub pushes: Vec<DownPush>,
}

impl AppTurn {
    /// A part with nothing to apply: a probe of whether the app can store (a failed app's retry).
    pub fn is_probe(&self) -> bool {
        self.pieces.is_empty()
            && self.outlets.is_empty()
            && self.fetches.is_empty()
            && self.pushes.is_empty()
    }
}

/// A push committed on another node of a fleet (docs/scale-out.md, "Downlink on a fleet"): a session of that
/// sender listening on the app here should read what waits for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DownNotice {
    pub app: AppIndex,
    pub key: crate::proto::crypto::PublicKeyBytes,
    pub sender: String,
}

/// The outcome of a submitted turn, once it is durable: per app of the turn, what its transaction did, or why it
/// did not (nothing of a failed app's part may be acked).
#[derive(Debug)]
pub struct TurnOutcome {
    pub seq: u64,
    pub apps: Vec<(AppIndex, Result<Applied, Arc<StoreError>>)>,
    /// Per part that carried pushes, the outcome of each, in the part's order: apart from the part's own result,
    /// since each push is a transaction of its own.
    pub pushes: Vec<(AppIndex, Vec<PushOutcome>)>,
}

/// The store as everything above `src/store/` applies turns to it.
pub trait TurnStore {
    /// Hands over turn `seq` (increasing), one [`AppTurn`] per app with something to apply. Never waits on a
    /// database round trip or a sync.
    fn submit(&mut self, seq: u64, parts: Vec<AppTurn>);
    /// Outcomes of turns that became durable since the last call, in the order submitted.
    fn done(&mut self) -> Vec<TurnOutcome>;
    /// Blocks until the oldest submitted turn has its outcome (or none waits), then returns what is done.
    fn wait_done(&mut self) -> Vec<TurnOutcome>;
    /// Readable when an outcome is ready; `None` when outcomes are ready at once (stores in memory).
    fn wake_fd(&self) -> Option<RawFd>;
    /// Turns submitted whose outcome has not been returned yet.
    fn waiting(&self) -> usize;
    /// The heard sequence of `source` in `app` (0 if none): a read that may wait (on a fleet's database at most
    /// 10 s), for starts, tests and tools, never for a loop.
    fn heard_of(&mut self, app: AppIndex, source: &str) -> Result<u64, StoreError>;
    /// The app's next position (1 when empty) as the store holds it now, turns still waiting for their outcome
    /// included: a read that may wait, as [`TurnStore::heard_of`].
    fn head(&mut self, app: AppIndex) -> Result<u64, StoreError>;
    /// Apps added after the open (by a reload), in order: their indexes follow the apps given before, and turns
    /// submitted after this may carry parts for them. An engine whose apps' stores are opened by their owner (SQLite:
    /// the host opens each app's file) has nothing to do.
    fn add_apps(&mut self, _names: &[String]) {}
    /// How many connections to a database the store has made so far (0 for a store that needs none). A host whose
    /// apps failed probes them at once when it grows, rather than at its next retry.
    fn connections(&self) -> u64 {
        0
    }
    /// Pushes other nodes of a fleet committed since the last call (none on a store of one node's own). Ready
    /// when [`TurnStore::wake_fd`] is readable, as outcomes are.
    fn down_notices(&mut self) -> Vec<DownNotice> {
        Vec::new()
    }
    /// The host has taken the database as out of reach (a turn left without an outcome too long): a part waiting
    /// on it now is given up with its connection (its outcome unknown, so it fails and nothing of it is acked),
    /// and a new connection is tried at once, so that the store serves again soon after the database is back
    /// rather than after the network's timeouts. Nothing on a store that needs no connection.
    fn give_up_waiting(&mut self) {}
}

/// What a renewal of leases found: the leases this node holds (with their acknowledged positions), every wanted
/// outlet's acknowledged position, and the head of each of their apps (the next position the fleet gives: what
/// every node stored, for the outlets' lag on a node that stored none of it).
pub type Renewed = (
    Vec<(OutletKey, u64)>,
    Vec<(OutletKey, u64)>,
    Vec<(String, u64)>,
);

/// How long a wait on a shared store may last at most, whatever the network does (the outbox bounds each of its
/// waits by it and by the end of its leases).
pub const SHARED_WAIT: Duration = super::postgres::NET_TIMEOUT;

/// The connection a node's outbox works on when its store is shared with a fleet (docs/scale-out.md, "Outlets of
/// a fleet"): the outlets' leases, where each starts, and reads of what every node stored. Blocking calls on the
/// outbox's own thread, never a loop's; every wait ends within the bound last set by [`OutboxConn::within`].
pub trait OutboxConn {
    /// Bounds every later wait to end within `within` from now (`None`: no bound but the network's).
    fn within(&self, within: Option<Duration>);
    /// Renews (and asks for) the leases of `renewal`, writing their far sides' acknowledged positions.
    fn renew(&mut self, renewal: &Renewal) -> Result<Renewed, StoreError>;
    /// Gives held leases back, writing their acknowledged positions (a clean stop).
    fn release(&self, outlets: &[(OutletKey, u64)]) -> Result<(), StoreError>;
    /// Where the outlet starts, as the first node that took its lease kept it (this node's `start` if none did).
    fn start_of(&self, app: &str, start: &OutletStart) -> Result<OutletStart, StoreError>;
    /// The heard sequence of `source` in `app`.
    fn heard_of(&self, app: &str, source: &str) -> Result<u64, StoreError>;
    /// Up to `max_records` records and `max_bytes` bytes of `app` from position `from`, as chunks in position order.
    fn read_from(
        &self,
        app: &str,
        from: u64,
        max_records: u64,
        max_bytes: usize,
    ) -> Result<Vec<Chunk>, StoreError>;
}

/// Makes an outbox's connection, each wait of the making bounded by the duration given.
pub type OutboxConnector =
    Box<dyn Fn(Duration) -> Result<Box<dyn OutboxConn + Send>, StoreError> + Send>;

/// What a store holds, for reading by a tool (`pure-serve records`): one node's files under its state directory,
/// or a fleet's database.
pub struct StoreReader(Reader);

enum Reader {
    Files(PathBuf),
    Fleet(Box<super::postgres::PgReader>),
}

/// One app of a [`StoreReader`].
pub struct AppReader<'a>(AppReading<'a>);

enum AppReading<'a> {
    File(Box<super::AppStore>),
    Fleet(&'a super::postgres::PgReader, String),
}

impl StoreReader {
    /// The store `choice` names: the files under `state` (SQLite), or the database (its password if it needs one).
    pub fn open(
        choice: &StoreChoice,
        state: &Path,
        password: Option<&str>,
    ) -> Result<Self, StoreError> {
        Ok(StoreReader(match choice {
            StoreChoice::Sqlite => Reader::Files(state.to_path_buf()),
            StoreChoice::Postgres(url) => {
                Reader::Fleet(Box::new(super::postgres::PgReader::open(url, password)?))
            }
        }))
    }

    /// The apps the store holds, by name; when there are none, why (what to check), as an error message.
    pub fn apps(&self) -> Result<Result<Vec<String>, String>, StoreError> {
        let (apps, why) = match &self.0 {
            Reader::Files(state) => (
                super::list_apps(state),
                format!(
                    "no stores in {}: is that the node's --state directory? (A fleet's records are in its database: \
                     give --store postgres://…)",
                    state.join("apps").display()
                ),
            ),
            Reader::Fleet(r) => (
                r.apps()?,
                "no apps in the fleet's database yet: a node registers its apps when it first connects".to_string(),
            ),
        };
        Ok(if apps.is_empty() { Err(why) } else { Ok(apps) })
    }

    /// One app, opened for reading.
    pub fn app(&self, app: &str) -> Result<AppReader<'_>, StoreError> {
        Ok(AppReader(match &self.0 {
            Reader::Files(state) => {
                AppReading::File(Box::new(super::open_app_for_reading(state, app)?))
            }
            Reader::Fleet(r) => AppReading::Fleet(r, app.to_string()),
        }))
    }
}

impl AppReader<'_> {
    /// The app's next position, as the store holds it now.
    pub fn head(&self) -> Result<u64, StoreError> {
        match &self.0 {
            AppReading::File(s) => s.read_head(),
            AppReading::Fleet(r, app) => r.head(app),
        }
    }

    /// Calls `each` for every downlink record waiting for its device (of one sender, if given) and not expired at
    /// `now_ms`, by sender then sequence; `each` returns false to stop.
    pub fn for_each_waiting(
        &self,
        sender: Option<&str>,
        now_ms: i64,
        each: impl FnMut(&super::downlink::WaitingView<'_>) -> bool,
    ) -> Result<(), StoreError> {
        match &self.0 {
            AppReading::File(s) => s.for_each_waiting(sender, now_ms, each),
            AppReading::Fleet(r, app) => r.for_each_waiting(app, sender, now_ms, each),
        }
    }

    /// Calls `each(name, heard, last_stored_ms)` for every source of the app, by name (`pure-serve senders`).
    pub fn for_each_source_seen(
        &self,
        each: impl FnMut(&str, u64, i64) -> bool,
    ) -> Result<(), StoreError> {
        match &self.0 {
            AppReading::File(s) => s.for_each_source_seen(each),
            AppReading::Fleet(r, app) => r.for_each_source_seen(app, each),
        }
    }

    /// One source's heard sequence and its newest record's commit time (0: none); `None`: the app never stored one.
    pub fn source_seen(&self, name: &str) -> Result<Option<(u64, i64)>, StoreError> {
        match &self.0 {
            AppReading::File(s) => s.source_seen(name),
            AppReading::Fleet(r, app) => r.source_seen(app, name),
        }
    }

    /// How many downlink records wait for each sender, not expired at `now_ms`, by sender.
    pub fn waiting_by_sender(&self, now_ms: i64) -> Result<Vec<(String, u64)>, StoreError> {
        match &self.0 {
            AppReading::File(s) => s.waiting_by_sender(now_ms),
            AppReading::Fleet(r, app) => r.waiting_by_sender(app, now_ms),
        }
    }

    /// Calls `each` for every record at position ≥ `from` (of one source, if given): ordered by source then
    /// sequence when `from` is 0, else by position (a follower); `each` returns false to stop.
    pub fn for_each(
        &self,
        source: Option<&str>,
        from: u64,
        each: impl FnMut(&RecordView<'_>) -> bool,
    ) -> Result<(), StoreError> {
        match &self.0 {
            AppReading::File(s) => s.for_each_record_view(source, from, each),
            AppReading::Fleet(r, app) => r.for_each_record_view(app, source, from, each),
        }
    }
}

/// `--store`: where records and heard sequences are kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreChoice {
    /// One SQLite file per app under the state directory (docs/store.md).
    Sqlite,
    /// A PostgreSQL database shared by the nodes of a fleet: the URL as given (without a password).
    Postgres(String),
}

#[derive(Debug, Error)]
pub enum StoreChoiceError {
    #[error(
        "--store {given:?} holds a password, which would be visible in `ps` and in logs: remove it from the URL \
         and put it on the first line of a file named by --store-password-file (mode 0600)"
    )]
    PasswordInUrl { given: String },
}

/// Why `--store-password-file` gave no password. Each is the operator's to fix (a missing or unreadable file is a
/// [`crate::files::FileError`]).
#[derive(Debug, Error)]
pub enum StorePasswordError {
    #[error(transparent)]
    File(#[from] crate::files::FileError),
    #[error(
        "store password file {}: its first line is not UTF-8 text; write the password alone on the first line",
        path.display()
    )]
    NotText { path: PathBuf },
    #[error(
        "store password file {}: its first line is empty; write the database user's password on it",
        path.display()
    )]
    Empty { path: PathBuf },
}

/// The first line of the store password file (`--store-password-file`), without its line end.
pub fn read_store_password(file: &Path) -> Result<String, StorePasswordError> {
    let bytes = crate::files::read(file, &crate::files::STORE_PASSWORD)?;
    let text = String::from_utf8(bytes).map_err(|_| StorePasswordError::NotText {
        path: file.to_path_buf(),
    })?;
    let first = text.lines().next().unwrap_or("").trim_end_matches('\r');
    if first.is_empty() {
        return Err(StorePasswordError::Empty {
            path: file.to_path_buf(),
        });
    }
    Ok(first.to_string())
}

impl StoreChoice {
    /// Parses `--store`: `sqlite`, or a `postgres://` / `postgresql://` URL without a password.
    pub fn parse(s: &str) -> Result<Self, String> {
        if s == "sqlite" {
            return Ok(StoreChoice::Sqlite);
        }
        let Some(rest) = s
            .strip_prefix("postgres://")
            .or_else(|| s.strip_prefix("postgresql://"))
        else {
            return Err(format!(
                "--store {:?} is not a store: give `sqlite` (the default: files under --state) or a PostgreSQL URL such as \
                 postgres://pure@db.internal:5432/fleet (docs/scale-out.md)",
                shown_briefly(&redact(s))
            ));
        };
        if s.len() > MAX_STORE_URL {
            return Err(format!(
                "--store is {} bytes long: a PostgreSQL URL is at most {MAX_STORE_URL} (postgres://USER@HOST[:PORT]/DATABASE)",
                s.len()
            ));
        }
        // A password among the query's parameters (`?password=…`) is one too.
        if let Some((before, query)) = s.split_once('?')
            && query.split('&').any(|kv| {
                kv.split('=')
                    .next()
                    .is_some_and(|k| k.eq_ignore_ascii_case("password"))
            })
        {
            let query: Vec<String> = query
                .split('&')
                .map(|kv| match kv.split_once('=') {
                    Some((k, _)) if k.eq_ignore_ascii_case("password") => format!("{k}=***"),
                    _ => kv.to_string(),
                })
                .collect();
            return Err(StoreChoiceError::PasswordInUrl {
                given: shown_briefly(&format!("{}?{}", redact(before), query.join("&"))),
            }
            .to_string());
        }
        // The user info ends at the last '@' before the first '/' (the host part may hold none).
        let authority = rest.split(['/', '?']).next().unwrap_or("");
        if let Some((userinfo, _)) = authority.rsplit_once('@')
            && userinfo.contains(':')
        {
            return Err(StoreChoiceError::PasswordInUrl {
                given: shown_briefly(&redact(s)),
            }
            .to_string());
        }
        // Several hosts go in the URL's own host part: the client here takes `host=A,B` as one name.
        if let Some((_, query)) = s.split_once('?')
            && query
                .split('&')
                .any(|kv| kv.strip_prefix("host=").is_some_and(|v| v.contains(',')))
        {
            return Err(
                "--store's host= parameter names several hosts, which this PostgreSQL client takes as one name: \
                 name each in the URL itself, postgres://USER@HOST1:PORT1,HOST2:PORT2/DATABASE?target_session_attrs=read-write \
                 (docs/scale-out.md, \"A database that fails over\")"
                    .to_string(),
            );
        }
        // What PostgreSQL's client would refuse when the node connects is refused here, with the flag's other
        // mistakes (its words name an option at most, never the value).
        if let Err(e) = <tokio_postgres::Config as std::str::FromStr>::from_str(s) {
            return Err(format!(
                "--store {:?} is not a PostgreSQL URL ({e}): give postgres://USER@HOST[:PORT]/DATABASE, with \
                 ?host=/run/postgresql for a unix socket (docs/scale-out.md)",
                shown_briefly(s)
            ));
        }
        Ok(StoreChoice::Postgres(s.to_string()))
    }

    /// Whether this store is shared with the other nodes of a fleet (and so needs a password file if its user has a
    /// password).
    pub fn is_shared(&self) -> bool {
        matches!(self, StoreChoice::Postgres(_))
    }

    /// The store as a log line names it (no password: a URL holding one is refused by [`StoreChoice::parse`]).
    pub fn shown(&self) -> &str {
        match self {
            StoreChoice::Sqlite => "sqlite",
            StoreChoice::Postgres(url) => url,
        }
    }

    /// On a store shared with a fleet, what makes the outbox's connections as node `node_id`; `None` on a store of
    /// the node's own, whose outlets the host feeds itself.
    pub fn outbox_connector(
        &self,
        password: Option<String>,
        node_id: String,
    ) -> Option<OutboxConnector> {
        match self {
            StoreChoice::Sqlite => None,
            StoreChoice::Postgres(url) => {
                let url = url.clone();
                Some(Box::new(move |within| {
                    let conn = super::postgres::leases::LeaseConn::open_within(
                        &url,
                        password.as_deref(),
                        &node_id,
                        super::lease::DATABASE_LEASE,
                        within,
                    )?;
                    Ok(Box::new(conn) as Box<dyn OutboxConn + Send>)
                }))
            }
        }
    }

    /// The store shared with the other nodes of a fleet that this names, connected and with `apps` registered (app
    /// index = place in the list); `None` for SQLite, whose stores are the node's own files. The first connection
    /// is made here, so a wrong address or a refused login stops the start with its reason.
    pub fn open_shared(
        &self,
        password: Option<&str>,
        apps: &[String],
    ) -> Result<Option<Box<dyn TurnStore + Send>>, StoreError> {
        match self {
            StoreChoice::Sqlite => Ok(None),
            StoreChoice::Postgres(url) => Ok(Some(Box::new(super::postgres::PostgresTurns::open(
                url, password, apps,
            )?))),
        }
    }
}

/// The longest `--store` URL taken: far above any real one, and a bound on what a message may echo.
const MAX_STORE_URL: usize = 2048;

/// At most 100 characters of a value given on the command line, for a message: a value of 100 kB is not echoed.
fn shown_briefly(value: &str) -> String {
    const MOST: usize = 100;
    match value.char_indices().nth(MOST) {
        Some((cut, _)) => format!("{}… ({} bytes)", &value[..cut], value.len()),
        None => value.to_string(),
    }
}

/// The URL with the password of its user info replaced by `***`, so an error never repeats it; a URL whose user
/// info has no password is shown as it is (an outside audit saw `pure:***@` for a URL that had none).
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***@{host}{tail}"),
            None => url.to_string(),
        },
        None => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_choice_parses_sqlite_and_urls_and_refuses_passwords() {
        assert_eq!(StoreChoice::parse("sqlite"), Ok(StoreChoice::Sqlite));
        assert_eq!(
            StoreChoice::parse("postgres://pure@db:5432/fleet"),
            Ok(StoreChoice::Postgres(
                "postgres://pure@db:5432/fleet".into()
            ))
        );
        assert!(StoreChoice::parse("postgresql://pure@db/fleet?host=/run/postgresql").is_ok());
        let e = StoreChoice::parse("postgres://pure:hunter2@db/fleet").unwrap_err();
        assert!(e.contains("--store-password-file"), "{e}");
        assert!(!e.contains("hunter2"), "the password is not repeated: {e}");
        assert!(e.contains("pure:***@db/fleet"), "{e}");
        let e = StoreChoice::parse("postgres://pure@db/fleet?sslmode=disable&password=hunter2")
            .unwrap_err();
        assert!(
            !e.contains("hunter2") && e.contains("holds a password"),
            "{e}"
        );
        assert!(
            e.contains("postgres://pure@db/fleet?sslmode=disable&password=***"),
            "only the password is hidden: {e}"
        );
        assert_eq!(redact("mysql://pure@db:5/fleet"), "mysql://pure@db:5/fleet");
        let e =
            StoreChoice::parse(&format!("postgres://pure@db/{}", "x".repeat(5000))).unwrap_err();
        assert!(e.len() < 200, "{e}");
        let e = StoreChoice::parse("mysql://x").unwrap_err();
        assert!(e.contains("sqlite"), "{e}");
        // Several hosts, as the client takes them, and as it does not.
        assert!(
            StoreChoice::parse(
                "postgres://pure@db1:5432,db2:5432/fleet?target_session_attrs=read-write"
            )
            .is_ok()
        );
        let e = StoreChoice::parse("postgres://pure@/fleet?host=/a,/b").unwrap_err();
        assert!(e.contains("HOST1:PORT1,HOST2:PORT2"), "{e}");
        // What the client would refuse at the first connection is refused by the flag.
        let e = StoreChoice::parse("postgres://pure@db/fleet?sslmode=sometimes").unwrap_err();
        assert!(
            e.contains("sslmode") && e.contains("is not a PostgreSQL URL"),
            "{e}"
        );
    }
}
