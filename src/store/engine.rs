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
use std::sync::Arc;

use thiserror::Error;

use super::downlink::{DownPush, OwnedFetch, PushOutcome};
use super::{Applied, Piece, StoreError};
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
    /// The heard sequence of `source` in `app` (0 if none): a read that may wait, for starts, tests and tools,
    /// never for a loop.
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
                "{s:?} is not a store: give `sqlite` (the default: files under --state) or a PostgreSQL URL such as \
                 postgres://pure@db.internal:5432/fleet (docs/scale-out.md)"
            ));
        };
        // The user info ends at the last '@' before the first '/' (the host part may hold none).
        let authority = rest.split(['/', '?']).next().unwrap_or("");
        if let Some((userinfo, _)) = authority.rsplit_once('@')
            && userinfo.contains(':')
        {
            return Err(StoreChoiceError::PasswordInUrl { given: redact(s) }.to_string());
        }
        Ok(StoreChoice::Postgres(s.to_string()))
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

/// The URL with the password of its user info replaced by `***`, so an error never repeats it.
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{scheme}://{user}:***@{host}{tail}")
        }
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
        let e = StoreChoice::parse("mysql://x").unwrap_err();
        assert!(e.contains("sqlite"), "{e}");
    }
}
