//! The app host: every app's store, its turns, its inner outlets, and the feeding of its other outlets.
//!
//! A turn of the host ([`Host::turn`]), on the receive loop's thread:
//!
//! 1. take the node core's turn (records from links and wires) and, for each app fed by inner outlets, a bounded
//!    batch of its sources' records after what it already holds (the destination's heard sequence of the source
//!    `app/NAME` is how far the inner outlet got, so nothing but the stores remembers it);
//! 2. apply each app's input in **one transaction of its own**, with its outlets' acknowledged positions, and
//!    commit. A store that fails stops its app alone: its input is not acked (the senders retry), the app is
//!    paused in the node core and retried with a growing delay, and it says why (log, status, `/healthz`, metrics);
//! 3. have the commits made durable: the `pure-sync` thread syncs each store's `-wal` ([`crate::store::sync`]),
//!    while the receive loop goes on reading; the turn is **finished** when its sync is done ([`Host::poll_synced`]);
//! 4. then hand the node core the outcome, so the acks it sends are exactly for what is on disk;
//! 5. and feed each link, wire and webhook outlet what it has room for — this turn's new chunks when it is caught
//!    up, else a batch read back from the store, never beyond what is synced — and **push each outlet once**.
//!
//! Nothing of a turn leaves the node before its sync: no ack, no forward, no inner outlet's read (each app's
//! `durable` position says how far its outlets may read). A sync that fails stops its app like a failed commit,
//! and nothing of that app's unsynced turns is acked.
//!
//! **Pushes** of downlink records (docs/downlink.md, "Queueing records") come between turns ([`Host::push`]): each
//! waits for the next turn and is queued in its app's transaction of that turn, ahead of the LISTEN reads the node
//! core put into it (a live listening session of the sender gets one when the push is taken), and is answered when
//! that turn is finished, so "queued" means on disk, as an ack does, and the records go out to a live session in
//! the same finish: one commit and one sync for both (`host/pushes.rs`, research/032).
//!
//! Apps are fair to each other because each has its share of a turn (`turn_records`, enforced by the node core for
//! direct input and here for inner input), and an app whose outlet is further behind than its `max_lag_records`
//! stops taking input until the outlet has caught up half of it, instead of growing anything but the store.

use std::collections::{HashMap, VecDeque};
use std::os::fd::RawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::config::{Accept, AppConfig, AppsConfig, OutletKind};
use crate::common::figures::{AppFigures, OutletFigures};
use crate::common::push::{PushAnswer, PushRequest};
use crate::common::wake::Wake;
use crate::outlets::{Outlet, Target};
use crate::proto::node::{AppAccept, HostedApp, Node};
use crate::proto::turn::{AppIndex, Committed};
use crate::proto::wire::{Forwarded, RecordFormat};
use crate::store::check::UNCLEAN;
use crate::store::downlink::{self, DownPush, PushOutcome};
use crate::store::engine::TurnStore;
use crate::store::sync::{SyncFiles, Synced, Syncer};
use crate::store::{self, AppStore, Chunk, Never, Piece, StoreError, StoreStart, Stores};
use pushes::TurnPush;

pub mod outbox;
mod pushes;
mod shared;
mod times;

/// Records read back from a store for one outlet in one turn when it is catching up.
const CATCH_UP_RECORDS: u64 = 16_384;
/// A failed store is tried again after this, doubling up to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_millis(250);
const RETRY_MAX: Duration = Duration::from_secs(10);
/// How often the host looks whether a store's check on its own thread is done.
const CHECK_POLL: Duration = Duration::from_millis(20);
/// Turns committed and not yet synced before a turn waits for the oldest one's sync (a bound on what waits in
/// memory; the sync thread syncs all queued turns at once, so more rarely helps).
const MAX_UNSYNCED: usize = 4;

/// An app paused because an outlet passed its `max_lag_records` takes input again when every outlet is within this
/// share of its budget (research/012 measures the mark).
const LAG_RESUME_PERCENT: u64 = 50;

/// The lag below which a paused app resumes, for a budget of `max` records.
fn resume_below(max: u64) -> u64 {
    (u128::from(max) * u128::from(LAG_RESUME_PERCENT) / 100) as u64
}

/// An app that has taken input this long without a pause is said to have caught up.
const LAG_CALM: Duration = Duration::from_secs(10);

/// When the log tells of lag pauses. A slow outlet under steady input pauses its app several times a second
/// (research/012: 8 a second), and a line per pause and per resume would fill the journal. So a spell of pauses gets
/// one warning when it begins and one line when the app has taken input for [`LAG_CALM`] since its last pause, with
/// the count in between; `pure_app_paused` and `pure_app_pauses_total` say the rest as it happens.
#[derive(Debug, Default)]
struct LagSpell {
    /// When the spell began (its first pause); `None` when there is none.
    since: Option<Instant>,
    pauses: u64,
    /// When the app last took input again, if it is not paused now.
    resumed_at: Option<Instant>,
}

/// A line the log should get about lag.
#[derive(Debug, PartialEq)]
enum LagLine {
    SpellBegins,
    CaughtUp { pauses: u64, over: Duration },
}

impl LagSpell {
    fn paused(&mut self, now: Instant) -> Option<LagLine> {
        self.pauses += 1;
        self.resumed_at = None;
        if self.since.is_some() {
            return None;
        }
        self.since = Some(now);
        Some(LagLine::SpellBegins)
    }

    fn resumed(&mut self, now: Instant) {
        if self.since.is_some() {
            self.resumed_at = Some(now);
        }
    }

    /// The spell's end, once the app has taken input for [`LAG_CALM`].
    fn calm(&mut self, now: Instant) -> Option<LagLine> {
        let (since, resumed) = (self.since?, self.resumed_at?);
        if now.saturating_duration_since(resumed) < LAG_CALM {
            return None;
        }
        let line = LagLine::CaughtUp {
            pauses: self.pauses,
            over: resumed.saturating_duration_since(since),
        };
        *self = LagSpell::default();
        Some(line)
    }
}
/// Outlet progress is written with the app's turns; an app with no input writes it at most this often.
const PROGRESS_EVERY: Duration = Duration::from_secs(2);

/// Prefix of the source name an inner outlet's records have in their destination app (a sender name cannot have a
/// `/`, so the two never meet).
pub const INNER_SOURCE_PREFIX: &str = "app/";

impl InnerOutlet {
    /// How far the destination holds the source, as far as this node knows.
    fn heard_now(&self) -> u64 {
        self.heard
            .unwrap_or(0)
            .max(self.fleet_heard.load(std::sync::atomic::Ordering::Acquire))
    }
}

/// A link, wire or webhook outlet of an app, as the host keeps it.
struct RemoteOutlet {
    outlet: Arc<Outlet>,
    target: Target,
    /// Where it sends, in words for the status page (made once: the figures copy it each round).
    target_words: Arc<str>,
    /// The next position to feed; `None` until the outlet says where its far side stands.
    fed_next: Option<u64>,
    max_lag: u64,
    /// The acknowledged position last written to the store.
    acked_written: u64,
    /// Its start (docs/apps.md, `from`) when it could not be kept in the store as it was applied (the store closed
    /// or failing): the outlet is fed nothing until it is, since a far side that had records under one start and
    /// a restart that decides another would number the flow differently (skipping or doubling records).
    unkept_start: Option<store::OutletStart>,
}

/// Keeps in the store the start of an outlet that could not keep it when it was applied, unless the store already
/// holds one for it; the outlet is fed from then on. A different start found there (the store could not be read
/// then) is kept and the outlet stays unfed: its numbering would not be the far side's, and a reload or restart
/// makes it again with the start the store holds.
fn keep_start(store: &mut AppStore, app: &str, o: &mut RemoteOutlet) {
    let Some(row) = &o.unkept_start else { return };
    let found = match store.outlet_starts() {
        Ok((starts, _)) => starts
            .into_iter()
            .find(|s| s.name == row.name && s.kind == row.kind && s.target == row.target),
        Err(_) => return,
    };
    match found {
        Some(s) if s.start == row.start => {}
        Some(s) => {
            o.outlet.error(
                "store",
                format!(
                    "its start in the store is position {}, not {}: reload or restart the node to send from it",
                    s.start, row.start
                ),
            );
            return;
        }
        None => {
            if let Err(e) = store.set_outlet_starts(std::slice::from_ref(row)) {
                tracing::debug!("app {app}: outlet {}: start still not kept: {e}", row.name);
                return;
            }
        }
    }
    tracing::info!(
        "app {app}: outlet {} keeps its start (position {}) and sends",
        row.name,
        row.start
    );
    o.unkept_start = None;
}

/// An inner outlet: records of app `source` go into app `dest` of this host.
struct InnerOutlet {
    name: String,
    source: AppIndex,
    dest: AppIndex,
    /// `app/SOURCE`: the source's name in the destination's store.
    source_name: String,
    /// How far the destination holds the source (its heard sequence of `source_name`), once read.
    heard: Option<u64>,
    /// On a fleet's store: how far the destination holds the source fleet-wide, as the outbox last learned it
    /// (it drives the outlet, or the database said); 0 on one node.
    fleet_heard: Arc<std::sync::atomic::AtomicU64>,
    max_lag: u64,
}

#[derive(Debug, Clone)]
struct Failure {
    /// What failed first.
    why: String,
    /// Why the last try to open the store again did not succeed, if it did not.
    last_try: Option<String>,
    /// The last "still cannot store" words logged: a try that only reports the store still being read in between
    /// does not make the same words be logged again at every retry.
    logged: Option<String>,
    since: Instant,
    retry_at: Instant,
    backoff: Duration,
    /// The fleet's database is what fails (unreachable, or a statement failed there), not a file of this node.
    database: bool,
}

impl Failure {
    fn new(why: String, now: Instant) -> Self {
        Failure {
            why,
            last_try: None,
            logged: None,
            database: false,
            since: now,
            retry_at: now + RETRY_FIRST,
            backoff: RETRY_FIRST,
        }
    }

    /// The words the operator sees (status, `/healthz`, metrics): what failed and, once tried again, why it still
    /// cannot store when that says something else.
    fn words(&self) -> String {
        match &self.last_try {
            Some(t) if *t != self.why => format!("{}; tried again: {t}", self.why),
            _ => self.why.clone(),
        }
    }
}

/// Opens an app's store into `stores`, or, when the disk under it fails (full, read-only, gone), adds it closed
/// and returns why: the node serves its other apps and tries this one again. A store that is wrong in itself (a
/// newer layout, not a database) is an error.
fn open_or_close(
    stores: &mut Stores,
    path: PathBuf,
    app: &str,
) -> Result<Option<String>, StoreError> {
    match AppStore::open(&path) {
        Ok(s) => {
            stores.push(s);
            Ok(None)
        }
        Err(e) => closed_for_now(stores, path, app, e, None),
    }
}

/// A store that could not be opened now: an error if it is wrong in itself (refused at start), else added closed
/// to be tried again with backoff (read whole first, with `whole`), and why.
fn closed_for_now(
    stores: &mut Stores,
    path: PathBuf,
    app: &str,
    e: StoreError,
    whole: Option<&'static str>,
) -> Result<Option<String>, StoreError> {
    if e.is_fatal_at_open() {
        return Err(e);
    }
    let why = e.to_string();
    tracing::error!(
        "app {app} cannot store, its senders get no acks until it can (tried again with backoff): {why}"
    );
    match whole {
        Some(w) => stores.push_to_check(path, w),
        None => stores.push_closed(path),
    };
    Ok(Some(why))
}

/// Opens an app's store whose last run did not end cleanly once it has been read whole and found sound: at once
/// if it is small (a damaged one is refused, and the node does not start), else on a `pure-check` thread while the
/// node serves the other apps (this one waits, closed; found damaged, it is not served while the node runs).
fn open_checked(
    stores: &mut Stores,
    path: PathBuf,
    app: &str,
    accept_lost: bool,
) -> Result<Option<String>, StoreError> {
    let bytes = store::check::store_bytes(&path);
    if bytes > store::check::SYNC_CHECK_MAX {
        let why = format!(
            "its store {} ({} MiB) is being read whole before it is served, because {UNCLEAN}",
            path.display(),
            bytes >> 20
        );
        tracing::warn!("app {app} cannot store, its senders get no acks until it can: {why}");
        stores.push_to_check(path, UNCLEAN);
        return Ok(Some(why));
    }
    let wanted = store::check::Wanted {
        acked_head: 1,
        whole: Some(UNCLEAN),
        accept_lost,
    };
    let progress = Arc::new(store::check::CheckProgress::default());
    match store::check::reopen_checked(&path, wanted, &progress) {
        Ok(s) => {
            stores.push(s);
            Ok(None)
        }
        // A damaged store is refused as one that is not a database is: the node does not start on it (exit 78).
        Err(e) => closed_for_now(stores, path, app, e, Some(UNCLEAN)),
    }
}

struct App {
    config: AppConfig,
    outlets: Vec<RemoteOutlet>,
    /// Behind an outlet by more than its lag budget: not taking input.
    lag_paused: bool,
    /// Records the app may still take before an outlet with a lag budget is at it (`None`: no budget), as the
    /// node core was last told ([`HostedApp::lag_room`]).
    lag_room: Option<u64>,
    /// Times `lag_paused` was set: how often backpressure stopped this app's input.
    lag_pauses: u64,
    /// The spell of lag pauses the log has told of, if one is going on.
    lag_spell: LagSpell,
    failure: Option<Failure>,
    stored: u64,
    turns_failed: u64,
    /// Tries to reopen this app's store after it could not store (each read to its end, whatever came of it).
    reopen_tries: u64,
    last_progress_write: Instant,
    /// Downlink records deleted because their device had them, or because they expired (docs/downlink.md).
    down_delivered: u64,
    down_expired: u64,
    /// Downlink records pushed and queued (counted once synced, when the pusher is told), and pushed and refused by
    /// a bound (nothing of their push queued).
    down_queued: u64,
    down_refused: u64,
    /// On a fleet's store: the app's waiting records as the database last said (docs/scale-out.md, "Downlink on a
    /// fleet").
    down_waiting_shared: u64,
    /// When the records its outlets have not delivered were stored, for their lag in seconds (`host/times.rs`).
    times: times::StoredTimes,
    /// Its store's head has been known: the store was opened (its head is known while it is open), or a turn of
    /// it committed (on a fleet's store, the head is what the database last returned).
    head_known: bool,
    /// On a fleet's store: the app's head as the database said at the outbox's last renewal (0 until then, and on
    /// one node), shared with the outbox. A node that stored none of the fleet's last records counts its outlets'
    /// lag from it, not from its own last turn.
    fleet_head: Arc<std::sync::atomic::AtomicU64>,
}

/// What one turn of the host did.
#[derive(Debug, Default)]
pub struct TurnReport {
    pub stored: u64,
    /// Inner outlets have more to move: turn again soon rather than sleep.
    pub more: bool,
}

/// Outlets the sending loop must start or stop (at open and after a reload).
#[derive(Debug, Default)]
pub struct OutletChanges {
    pub start: Vec<(Arc<Outlet>, Target)>,
    pub stop: Vec<u64>,
}

/// What a reload of the apps file did, in words for the log.
#[derive(Debug, Default)]
pub struct Reloaded {
    pub applied: Vec<String>,
    pub needs_restart: Vec<String>,
    pub outlets: OutletChanges,
}

/// One app's commit in a turn, waiting for its sync.
struct CommittedPart {
    app: AppIndex,
    /// What the node core learns of it once it is synced.
    outcome: Committed,
    new_chunks: Vec<Arc<Chunk>>,
    /// The app's head after the commit: records before it are durable once this part is synced.
    head: u64,
    /// Records it stored, counted (`pure_records_stored_total`) only once synced: a commit whose sync fails is
    /// never acknowledged, and was counted as stored all the same (an outside audit: 6,771 against 4,131 kept).
    stored: u64,
}

/// A turn whose commits wait for their sync ([`crate::store::sync`]).
struct Unsynced {
    seq: u64,
    /// The node core's turn, if it had one.
    turn: Option<u64>,
    parts: Vec<CommittedPart>,
    /// Pushes the turn's transactions carried (on the host's own files; a shared store's are in `shared`), and
    /// their outcomes by app: answered when it is finished.
    pushes: Vec<TurnPush>,
    pushed: Vec<(AppIndex, Vec<PushOutcome>)>,
    /// On a shared store: what the turn's outcome is turned into the node core's with (its parts come with it).
    shared: Option<shared::SharedTurn>,
}

pub struct Host {
    state_dir: Option<PathBuf>,
    stores: Stores,
    apps: Vec<App>,
    /// Per app: records before this position are durable, so outlets and inner outlets may read them.
    durable: Vec<u64>,
    /// Committed turns waiting for their sync, oldest first; finished in order.
    unsynced: VecDeque<Unsynced>,
    /// The `pure-sync` thread; `None` for stores in memory, which have nothing to sync.
    syncer: Option<Syncer>,
    /// The sequence number the next turn of the host gets ([`Host::turn`]).
    next_seq: u64,
    /// Every turn up to this sequence number is finished.
    finished_seq: u64,
    inner: Vec<InnerOutlet>,
    wake: Arc<Wake>,
    next_outlet_id: u64,
    /// How outlets are fed: [`FeedMode::Chunks`] always, but for research/006 ([`Host::set_feed_mode`]).
    feed_mode: FeedMode,
    /// The store shared with the other nodes of a fleet, when the apps are stored there rather than in files of
    /// this host's own (`shared.rs`).
    shared: Option<Box<dyn TurnStore + Send>>,
    /// The shared store's [`TurnStore::connections`] when last looked at.
    shared_connections: u64,
    /// On a shared store: when it last handed back an outcome, or the host last gave up waiting for one (or the
    /// host started): silence is measured from here ([`shared::STORE_SILENT`]).
    shared_heard: Instant,
    /// On a shared store: the outbox's wake ([`outbox`]), which the outlets ring instead of the receive loop's (the
    /// outbox feeds them) and the host rings when a turn stored records.
    outbox_wake: Option<Arc<Wake>>,
    /// On a shared store: the inner outlets' batches the outbox read, for the next turn.
    inner_queue: Option<Arc<outbox::InnerQueue>>,
    /// Pushes taken since the last turn, which the next one hands the store (`pushes.rs`).
    turn_pushes: Vec<TurnPush>,
    /// Answers of finished pushes, sent by [`Host::send_push_answers`] after the finished turns' datagrams.
    due_answers: pushes::DueAnswers,
    /// How the stores' last run ended, for stores opened later (an app a reload adds).
    start: StoreStart,
    /// Stores opened again by a retry so far ([`Host::stores_reopened`]).
    stores_reopened: u64,
}

/// How the host hands records to its link, wire and webhook outlets. The daemon always feeds [`FeedMode::Chunks`];
/// the others exist **for measurement only** (research/006, `benches/sending_loop.rs`), to show what feeding whole
/// chunks and pushing once per turn buys — BRIEF.md's lesson "wake per turn, not per record".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FeedMode {
    /// The turn's chunks as they are, then one push per outlet per turn.
    #[default]
    Chunks,
    /// Each record as a chunk of its own, then one push per outlet per turn (the cost of cutting, without the
    /// wakes).
    RecordsPushPerTurn,
    /// Each record as a chunk of its own, and a push after every record: an owner that wakes the sending loop per
    /// record.
    RecordsPushPerRecord,
}

fn hosted(config: &AppConfig) -> HostedApp {
    HostedApp {
        name: config.name.clone(),
        accept: match &config.accept {
            Accept::All => AppAccept::All,
            Accept::Only(names) => {
                AppAccept::Only(names.iter().map(|n| n.as_str().into()).collect())
            }
        },
        forwarders: config
            .forwarders
            .iter()
            .map(|n| n.as_str().into())
            .collect(),
        turn_records: config.turn_records.max(1),
        paused: false,
        cannot_store: false,
        lag_room: None,
    }
}

fn target_of(kind: &OutletKind) -> Option<Target> {
    match kind {
        OutletKind::Link { to, node_key, app } => Some(Target::Link {
            to: to.clone(),
            node_key: *node_key,
            far_app: app.clone(),
        }),
        OutletKind::Wire {
            url,
            node_key,
            app,
            ca_file,
        } => Some(Target::Wire(crate::outlets::wire::WireTarget {
            url: url.clone(),
            node_key: *node_key,
            far_app: app.clone(),
            ca_file: ca_file.clone(),
        })),
        OutletKind::Webhook {
            url,
            ca_file,
            headers,
            batch_records,
        } => Some(Target::Webhook(crate::outlets::webhook::WebhookTarget {
            url: url.clone(),
            ca_file: ca_file.clone(),
            headers: headers.clone(),
            batch_records: *batch_records,
        })),
        OutletKind::App { .. } => None,
    }
}

impl Host {
    /// Opens every app's store under `state_dir` and makes its outlets (not yet started: see the returned
    /// changes). `wake` is the receive loop's: outlets use it to ask for a turn.
    /// A store whose last run did not end cleanly (`start.clean` does not name its app) is read whole first
    /// ([`open_checked`]).
    pub fn open(
        state_dir: &Path,
        config: &AppsConfig,
        wake: Arc<Wake>,
        start: &StoreStart,
    ) -> Result<(Self, OutletChanges), StoreError> {
        let mut stores = Stores::open(state_dir, &[])?;
        stores.set_accept_lost(start.accept_lost);
        let mut closed = Vec::new();
        for app in &config.apps {
            let path = store::app_store_path(state_dir, &app.name);
            let opened = if start.clean.contains(&app.name) || !path.exists() {
                open_or_close(&mut stores, path, &app.name)?
            } else {
                open_checked(&mut stores, path, &app.name, start.accept_lost)?
            };
            match opened {
                Some(why) => closed.push((stores.len() - 1, why)),
                None => continue,
            }
        }
        let (mut host, changes) =
            Self::with_stores(Some(state_dir.to_path_buf()), stores, config, wake, None)?;
        host.start = start.clone();
        host.syncer = Some(Syncer::start().map_err(|source| StoreError::SyncThread { source })?);
        let now = Instant::now();
        for (i, why) in closed {
            host.apps[i].failure = Some(Failure::new(why, now));
        }
        Ok((host, changes))
    }

    /// How many times a retry has opened a failed app's store again. A store an app could not make at its start or
    /// its reload (a full disk) is made by such a retry: the receive loop then records the app in `STATE/identity`
    /// before the turn's acks, or a later start could not tell that store's loss from a new app.
    pub fn stores_reopened(&self) -> u64 {
        self.stores_reopened
    }

    /// The apps whose stores are open, by name (a closed one may have no file yet).
    pub fn open_app_names(&self) -> Vec<String> {
        self.apps
            .iter()
            .enumerate()
            .filter(|(i, _)| self.stores.app(*i as AppIndex).is_some())
            .map(|(_, a)| a.config.name.clone())
            .collect()
    }

    /// A host over stores in memory (tests).
    pub fn in_memory(
        config: &AppsConfig,
        wake: Arc<Wake>,
    ) -> Result<(Self, OutletChanges), StoreError> {
        let names: Vec<String> = config.apps.iter().map(|a| a.name.clone()).collect();
        Self::with_stores(None, Stores::open_in_memory(&names)?, config, wake, None)
    }

    /// A host over `stores`; with `outbox_wake`, a host on a fleet's store whose outlets the outbox drives.
    fn with_stores(
        state_dir: Option<PathBuf>,
        stores: Stores,
        config: &AppsConfig,
        wake: Arc<Wake>,
        outbox_wake: Option<Arc<Wake>>,
    ) -> Result<(Self, OutletChanges), StoreError> {
        let mut host = Host {
            state_dir,
            stores,
            apps: Vec::new(),
            durable: Vec::new(),
            unsynced: VecDeque::new(),
            syncer: None,
            next_seq: 1,
            finished_seq: 0,
            inner: Vec::new(),
            wake,
            next_outlet_id: 1,
            feed_mode: FeedMode::Chunks,
            shared: None,
            shared_connections: 0,
            shared_heard: Instant::now(),
            outbox_wake,
            inner_queue: None,
            turn_pushes: Vec::new(),
            due_answers: pushes::DueAnswers::default(),
            start: StoreStart::default(),
            stores_reopened: 0,
        };
        let mut changes = OutletChanges::default();
        for app in &config.apps {
            host.add_app(app.clone(), &mut changes)?;
        }
        host.rebuild_inner(config);
        Ok((host, changes))
    }

    fn add_app(
        &mut self,
        config: AppConfig,
        changes: &mut OutletChanges,
    ) -> Result<(), StoreError> {
        let index = self.apps.len() as AppIndex;
        let acked = self
            .stores
            .app(index)
            .map(|s| s.outlets_acked())
            .transpose()?
            .unwrap_or_default();
        let outlets = config
            .outlets
            .iter()
            .filter_map(|o| self.make_outlet(index, &config.name, o, &acked, changes))
            .collect();
        if let Some(store) = self.stores.app_mut(index)
            && let Err(e) = store.forget_legacy_outlets()
        {
            tracing::warn!("app {}: {e}", config.name);
        }
        // What a store holds when it is opened is durable (its open synced it).
        self.durable
            .push(self.stores.app(index).map_or(1, AppStore::head));
        self.apps.push(App {
            config,
            outlets,
            lag_paused: false,
            lag_room: None,
            lag_pauses: 0,
            lag_spell: LagSpell::default(),
            failure: None,
            stored: 0,
            turns_failed: 0,
            reopen_tries: 0,
            down_delivered: 0,
            down_expired: 0,
            down_queued: 0,
            down_refused: 0,
            down_waiting_shared: 0,
            times: times::StoredTimes::default(),
            head_known: self.stores.app(index).is_some(),
            last_progress_write: Instant::now(),
            fleet_head: Arc::default(),
        });
        Ok(())
    }

    /// A link, wire or webhook outlet of `app` as configured (`None` for an inner one), resuming from what the
    /// store says its far side acknowledged, and queued in `changes` for the sending loop to start.
    fn make_outlet(
        &mut self,
        index: AppIndex,
        app: &str,
        o: &super::config::OutletConfig,
        acked: &HashMap<String, u64>,
        changes: &mut OutletChanges,
    ) -> Option<RemoteOutlet> {
        let target = target_of(&o.kind)?;
        let was = acked.get(&o.name).copied().unwrap_or(0);
        // On a fleet the outbox learns the start from the database when it takes the outlet's lease.
        let (start, unkept_start) = match self.outbox_wake {
            Some(_) => (1, None),
            None => self.outlet_start(index, app, o, was),
        };
        let id = self.next_outlet_id;
        self.next_outlet_id += 1;
        let outlet = Arc::new(
            Outlet::new(
                id,
                app,
                &o.name,
                target.kind(),
                o.memory_bytes,
                self.outbox_wake
                    .clone()
                    .unwrap_or_else(|| self.wake.clone()),
            )
            .with_base(start - 1)
            .with_acked(was.max(start - 1)),
        );
        changes.start.push((outlet.clone(), target.clone()));
        Some(RemoteOutlet {
            outlet,
            target_words: target.words().into(),
            target,
            fed_next: None,
            max_lag: o.max_lag_records,
            acked_written: was,
            unkept_start,
        })
    }

    /// The first position outlet `o` of app `index` sends (docs/apps.md, `from`), kept in the store the first time
    /// the outlet is applied so that it stays through restarts. An outlet known to the store by its name and
    /// target keeps its start; a link or wire into a far flow the store knows (renamed, or moved between link and
    /// wire) keeps that flow's, since the far node numbers the flow by it; an outlet that has a saved position from
    /// a node that kept no starts, or of a store whose outlets all came from one, starts at 1, as it always did.
    /// Otherwise `from`: 1, or the app's head now. With the start, the row still to be kept when the store could
    /// not keep it now (closed, or its write failed): the outlet is fed only once it is ([`keep_start`]).
    fn outlet_start(
        &mut self,
        index: AppIndex,
        app: &str,
        o: &super::config::OutletConfig,
        was: u64,
    ) -> (u64, Option<store::OutletStart>) {
        let (kind, target) = o.kind.target();
        let flow = o.kind.far_flow_key();
        let Some(store) = self.stores.app_mut(index) else {
            // The store is closed (it failed): its kept start, read from the file; else one decided from what the
            // file holds, kept once the store is open again, and nothing fed before (`unkept_start`).
            let reading = self
                .state_dir
                .as_deref()
                .and_then(|dir| store::open_app_for_reading(dir, app).ok());
            let kept = reading
                .as_ref()
                .and_then(|s| s.outlet_starts().ok())
                .and_then(|(starts, _)| {
                    starts
                        .iter()
                        .find(|s| s.name == o.name && s.kind == kind && s.target == target)
                        .or_else(|| {
                            flow.as_ref()
                                .and_then(|f| starts.iter().find(|s| s.flow.as_ref() == Some(f)))
                        })
                        .map(|s| s.start)
                });
            if let Some(start) = kept {
                return (start, None);
            }
            let start = match o.from {
                super::config::StartFrom::Next if was == 0 => reading.map_or(1, |s| s.head()),
                _ => 1,
            };
            let row = store::OutletStart {
                name: o.name.clone(),
                kind: kind.to_string(),
                target,
                flow,
                start,
            };
            return (start, Some(row));
        };
        let (starts, legacy) = match store.outlet_starts() {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(
                    "app {app}: outlet {}: cannot read its start: {e}; it sends nothing until its start is read",
                    o.name
                );
                let row = store::OutletStart {
                    name: o.name.clone(),
                    kind: kind.to_string(),
                    target,
                    flow,
                    start: 1,
                };
                return (1, Some(row));
            }
        };
        let known = starts
            .iter()
            .find(|s| s.name == o.name && s.kind == kind && s.target == target)
            .or_else(|| {
                flow.as_ref()
                    .and_then(|f| starts.iter().find(|s| s.flow.as_ref() == Some(f)))
            })
            .map(|s| s.start);
        let start = match known {
            Some(s) => s,
            None if legacy || (was > 0 && !starts.iter().any(|s| s.name == o.name)) => 1,
            None => match o.from {
                super::config::StartFrom::First => 1,
                super::config::StartFrom::Next => store.head(),
            },
        };
        let row = store::OutletStart {
            name: o.name.clone(),
            kind: kind.to_string(),
            target,
            flow,
            start,
        };
        if !starts.contains(&row) {
            if let Err(e) = store.set_outlet_starts(std::slice::from_ref(&row)) {
                tracing::warn!(
                    "app {app}: outlet {}: cannot keep its start: {e}; it sends nothing until it is kept",
                    o.name
                );
                return (start, Some(row));
            } else if known.is_none() && start > 1 {
                tracing::info!(
                    "app {app}: outlet {} starts at position {start}: from = \"next\", it sends only what is \
                     stored from now on",
                    o.name
                );
            }
        }
        (start, None)
    }

    /// Inner outlets from the config, keeping what is known of those that stay.
    fn rebuild_inner(&mut self, config: &AppsConfig) {
        let index = |name: &str| {
            self.apps
                .iter()
                .position(|a| a.config.name == name)
                .map(|i| i as AppIndex)
        };
        let mut inner = Vec::new();
        for (s, app) in config.apps.iter().enumerate() {
            for o in &app.outlets {
                let OutletKind::App { app: dest } = &o.kind else {
                    continue;
                };
                let Some(dest) = index(dest) else { continue };
                let source = s as AppIndex;
                let was = self
                    .inner
                    .iter()
                    .find(|i| i.source == source && i.dest == dest);
                inner.push(InnerOutlet {
                    name: o.name.clone(),
                    source,
                    dest,
                    source_name: format!("{INNER_SOURCE_PREFIX}{}", app.name),
                    heard: was.and_then(|i| i.heard),
                    fleet_heard: was.map(|i| i.fleet_heard.clone()).unwrap_or_default(),
                    max_lag: o.max_lag_records,
                });
            }
        }
        self.inner = inner;
    }

    /// The apps as the node core must know them, in app-index order.
    pub fn hosted_apps(&self) -> Vec<HostedApp> {
        self.apps
            .iter()
            .map(|a| {
                let mut h = hosted(&a.config);
                h.paused = a.failure.is_some() || a.lag_paused;
                h.cannot_store = a.failure.is_some();
                h.lag_room = a.lag_room;
                h
            })
            .collect()
    }

    pub fn app_names(&self) -> Vec<String> {
        self.apps.iter().map(|a| a.config.name.clone()).collect()
    }

    pub fn stores(&self) -> &Stores {
        &self.stores
    }

    /// **For measurement only** (research/006): how outlets are fed ([`FeedMode`]). Nothing in the daemon calls it.
    pub fn set_feed_mode(&mut self, mode: FeedMode) {
        self.feed_mode = mode;
    }

    /// Syncs of the node's own stores so far (`None` on a fleet's store, whose commits are the database's).
    pub fn store_syncs(&self) -> Option<u64> {
        self.syncer.as_ref().map(Syncer::syncs)
    }

    /// Runs one turn (module docs): applies and commits, and hands the commits to the sync thread. `node` gets the
    /// outcome of its turn when the turn is finished: here if nothing waits for a sync, else in
    /// [`Host::poll_synced`]. Waits for the oldest turn's sync only when [`MAX_UNSYNCED`] turns wait.
    pub fn turn(&mut self, node: &mut Node, now: Instant) -> TurnReport {
        if self.shared.is_some() {
            return self.turn_shared(node, now);
        }
        let mut report = TurnReport::default();
        self.retry_failed(node, now);
        let turn = node.take_turn();
        let senders = node.senders().clone();
        let n = self.apps.len();
        // Inner input first, read into buffers the pieces borrow: records of a source up to what its destination
        // has room for in this turn.
        let mut direct_counts = vec![0u64; n];
        if let Some(t) = &turn {
            for item in &t.items {
                if let Some(c) = direct_counts.get_mut(item.app as usize) {
                    *c += item.count;
                }
            }
        }
        let inner_input = self.read_inner(&direct_counts, &mut report);
        let mut per_app = match &turn {
            Some(t) => store::pieces_of_turn(t, &senders, n),
            None => (0..n).map(|_| Vec::new()).collect(),
        };
        let fetches = match &turn {
            Some(t) => store::fetches_of_turn(t, &senders, n),
            None => (0..n).map(|_| Vec::new()).collect(),
        };
        for (dest, source_name, chunk) in &inner_input {
            per_app[*dest as usize].push(Piece {
                source: source_name,
                first_seq: chunk.pos,
                count: chunk.count,
                format: RecordFormat::Forwarded,
                records: &chunk.body,
            });
        }
        let mut parts = Vec::new();
        let mut failed_commits: Vec<(AppIndex, Arc<StoreError>)> = Vec::new();
        let mut taken_pushes = Vec::new();
        let mut pushed: Vec<(AppIndex, Vec<PushOutcome>)> = Vec::new();
        let mut waiting_pushes = std::mem::take(&mut self.turn_pushes);
        // Whether the turn's answers must wait for its sync: it stored records, queued pushes, wrote outlets'
        // progress (synced when written, as always) or raised a downlink flow's next number. A turn that only read
        // downlink for LISTENs (deleting what devices have, reading what waits, all of it synced by earlier turns)
        // is answered once committed, when no earlier turn waits for its sync (docs/store.md, "Downlink").
        let mut answer_after_sync = false;
        for (i, pieces) in per_app.iter_mut().enumerate() {
            let app = &mut self.apps[i];
            let app_pushes = pushes::extract(&mut waiting_pushes, &mut [], i as AppIndex);
            if let Some(f) = &app.failure {
                for p in app_pushes {
                    p.unavailable(format!(
                        "app {} cannot store now ({}): nothing was queued; push again once it stores",
                        app.config.name,
                        f.words()
                    ));
                }
                continue;
            }
            let progress: Vec<(String, u64)> = app
                .outlets
                .iter()
                .filter(|o| o.outlet.acked() > o.acked_written)
                .map(|o| (o.outlet.name.clone(), o.outlet.acked()))
                .collect();
            let write_progress = !progress.is_empty()
                && (!pieces.is_empty()
                    || now.saturating_duration_since(app.last_progress_write) >= PROGRESS_EVERY);
            if pieces.is_empty()
                && !write_progress
                && fetches[i].is_empty()
                && app_pushes.is_empty()
            {
                continue;
            }
            let progress_refs: Vec<(&str, u64)> = if write_progress {
                progress.iter().map(|(n, a)| (n.as_str(), *a)).collect()
            } else {
                Vec::new()
            };
            let keep_new = !app.outlets.is_empty();
            let Some(store) = self.stores.app_mut(i as AppIndex) else {
                for p in app_pushes {
                    p.unavailable(format!(
                        "app {}'s store is not open: nothing was queued; push again in a moment",
                        app.config.name
                    ));
                }
                continue;
            };
            let to_queue: Vec<&DownPush> =
                app_pushes.iter().filter_map(TurnPush::records).collect();
            answer_after_sync |= !pieces.is_empty() || !app_pushes.is_empty() || write_progress;
            let commits = store.commits();
            let result = store
                .apply_with_down(pieces, &progress_refs, keep_new, &fetches[i], &to_queue)
                .map_err(Arc::new);
            if !app_pushes.is_empty() {
                // An error after the commit (a checkpoint, the file replaced) may leave the records kept.
                let committed = store.commits() > commits;
                let outcomes = downlink::outcomes_of(&result, app_pushes.len(), committed);
                pushed.push((i as AppIndex, outcomes));
                taken_pushes.extend(app_pushes);
            }
            match result {
                Ok(applied) => {
                    answer_after_sync |= applied.down.raised;
                    if write_progress {
                        app.last_progress_write = now;
                        for o in &mut app.outlets {
                            if let Some((_, a)) = progress.iter().find(|(n, _)| *n == o.outlet.name)
                            {
                                o.acked_written = *a;
                            }
                        }
                    }
                    report.stored += applied.stored;
                    app.down_delivered += applied.down.delivered;
                    app.down_expired += applied.down.expired;
                    for inner in self.inner.iter_mut().filter(|x| x.dest == i as AppIndex) {
                        if let Some((_, h)) =
                            applied.heard.iter().find(|(s, _)| *s == inner.source_name)
                        {
                            inner.heard = Some(*h);
                        }
                    }
                    let mut outcome = Committed::default();
                    if let Some(t) = turn.as_ref() {
                        outcome.add(i as AppIndex, &applied, t, &senders);
                    }
                    parts.push(CommittedPart {
                        app: i as AppIndex,
                        outcome,
                        new_chunks: applied.new_chunks.into_iter().map(Arc::new).collect(),
                        head: store.head(),
                        stored: applied.stored,
                    });
                }
                Err(e) => failed_commits.push((i as AppIndex, e)),
            }
        }
        // Every app had its turn at the pushes; none is left, but none is lost either.
        self.turn_pushes.extend(waiting_pushes);
        for (app, e) in failed_commits {
            // A commit (or its checkpoint) refused by a filesystem the kernel made read-only (after a disk error)
            // says only "disk I/O error" or "readonly database": it is the disk's fault, for every store on it, and
            // the message says what the operator must do.
            let e = match self.stores.path(app) {
                Some(path)
                    if !matches!(*e, StoreError::ReadOnly { .. })
                        && store::filesystem_read_only(path) =>
                {
                    Arc::new(StoreError::ReadOnly {
                        path: path.to_path_buf(),
                    })
                }
                _ => e,
            };
            if e.lost_a_write() {
                // The commit or its checkpoint found the disk failing: as a failed sync (every store on it).
                self.disk_fault(app, &e, node, now);
            } else {
                self.apps[app as usize].turns_failed += 1;
                self.fail_app(app, &e, node, now);
            }
        }
        // An app whose commit of this turn succeeded but whose store the failures above closed (another app's on
        // the same disk) has nothing left to sync that commit: its part of this turn is dropped and its pushes may
        // or may not be queued, as for its parts of later turns ([`Host::fail_app`]). Before issue 34 such a part
        // was answered at once, without any sync: acknowledged records the disk then lost (research/036).
        let closed: Vec<AppIndex> = parts
            .iter()
            .map(|p| p.app)
            .filter(|&a| self.stores.app(a).is_none())
            .collect();
        for app in closed {
            parts.retain(|p| p.app != app);
            let words = self.unsynced_words(app);
            for p in pushes::extract(&mut taken_pushes, &mut pushed, app) {
                p.maybe_queued(words.clone());
            }
        }
        // The heads moved: the lag budgets' room for the next turn is smaller.
        self.check_lag(node);
        let seq = self.next_seq;
        self.next_seq += 1;
        let files: SyncFiles = parts
            .iter()
            .filter_map(|p| self.stores.app(p.app)?.sync_item(p.app))
            .collect();
        let unsynced = Unsynced {
            seq,
            turn: turn.as_ref().map(|t| t.id),
            parts,
            pushes: taken_pushes,
            pushed,
            shared: None,
        };
        match &self.syncer {
            // In order: a turn with nothing to sync, or nothing that must be synced before its answers, is finished
            // here only when no earlier one waits. What it wrote is synced with the next turn that syncs its store.
            Some(syncer)
                if (!files.is_empty() && answer_after_sync) || !self.unsynced.is_empty() =>
            {
                syncer.submit(seq, files);
                self.unsynced.push_back(unsynced);
            }
            _ => self.finish(unsynced, &[], node, now),
        }
        if self.unsynced.len() > MAX_UNSYNCED {
            self.wait_synced(node);
        }
        report
    }

    /// Takes a push of records for its sender: they are queued in the app's store with the next turn
    /// (`pushes.rs`), and the answer goes out when that turn is finished, or now if the push names no app or
    /// sender it may go to, has no record (checked all the same, so that a typo is found before records are
    /// pushed), or its app cannot store.
    pub fn push(&mut self, node: &mut Node, request: PushRequest, now: Instant) {
        let PushRequest {
            app,
            to,
            records,
            blob,
            answer,
            found,
        } = request;
        let Some(i) = self.apps.iter().position(|a| a.config.name == app) else {
            let names: Vec<&str> = self.apps.iter().map(|a| a.config.name.as_str()).collect();
            let _ = answer.send(PushAnswer::NoSuchApp(format!(
                "this node has no app {app:?} (its apps: {}): name one of them",
                names.join(", ")
            )));
            return;
        };
        let a = &self.apps[i];
        // Looked up off the loop if the list is still the one it was looked up in (common/push.rs says why).
        let sender = match found.and_then(|f| f.in_list(node.senders())) {
            Some(index) => index,
            None => crate::common::push::find_name(node.senders(), &to),
        };
        let Some(sender) = sender else {
            let _ = answer.send(PushAnswer::NotFound(format!(
                "no sender {to:?} in the node's senders file: a record can be pushed only to a listed sender"
            )));
            return;
        };
        if !a.config.accept.allows(&to) {
            let _ = answer.send(PushAnswer::NotAccepted(format!(
                "app {app} does not accept sender {to:?}: add it to accept in [apps.{app}] of the apps file and \
                 reload, or push in an app that accepts it"
            )));
            return;
        }
        if records.is_empty() && blob.is_none() {
            // Nothing to queue, whatever the store's state: the answer says only that the names are right.
            let _ = answer.send(PushAnswer::Empty);
            return;
        }
        if let Some(f) = &a.failure {
            let _ = answer.send(PushAnswer::Unavailable(format!(
                "app {app} cannot store now ({}): nothing was queued; push again once it stores",
                f.words()
            )));
            return;
        }
        if self.shared.is_none() && self.stores.app(i as AppIndex).is_none() {
            let _ = answer.send(PushAnswer::Unavailable(format!(
                "app {app}'s store is not open: nothing was queued; push again in a moment"
            )));
            return;
        }
        // Queued with the next turn, ahead of its LISTEN reads, so that a live listening session's read, put into
        // that turn now, finds the records (pushes.rs).
        let read_with_it = node.downlink_queued(now, sender, i as AppIndex);
        let push = crate::store::downlink::DownPush {
            sender: to,
            key: *node.senders().key(sender),
            records,
            blob,
            limits: a.config.downlink,
        };
        self.turn_pushes.push(TurnPush::new(
            i as AppIndex,
            sender,
            push,
            answer,
            read_with_it,
        ));
    }

    /// Finishes every turn whose sync is done (module docs, 4–5); returns whether any was. Call when
    /// [`Host::sync_fd`] is readable (it is cheap otherwise too).
    pub fn poll_synced(&mut self, node: &mut Node) -> bool {
        if let Some(shared) = &mut self.shared {
            let done = shared.done();
            let notices = shared.down_notices();
            let connections = shared.connections();
            let any = !done.is_empty();
            self.finish_outcomes(done, node);
            self.down_notices(notices, node);
            if connections != self.shared_connections {
                self.shared_connections = connections;
                self.probe_now(Instant::now());
            }
            self.notice_silence(node, Instant::now());
            return any;
        }
        let Some(syncer) = &self.syncer else {
            return false;
        };
        let done = syncer.done();
        let any = !done.is_empty();
        self.finish_done(done, node);
        any
    }

    /// Waits for the oldest waiting turn's sync and finishes what is done.
    pub fn wait_synced(&mut self, node: &mut Node) {
        if let Some(shared) = &mut self.shared {
            let done = shared.wait_done();
            self.finish_outcomes(done, node);
            return;
        }
        let Some(syncer) = &self.syncer else { return };
        let done = syncer.wait_done();
        self.finish_done(done, node);
    }

    /// Waits until no turn waits for its sync (before a reload, and at a stop).
    pub fn drain(&mut self, node: &mut Node) {
        while !self.unsynced.is_empty() {
            self.wait_synced(node);
        }
    }

    /// At a clean stop, once every turn is synced: copies each store's `-wal` into its file, checked as after a
    /// commit, then empties the `-wal` ([`AppStore::empty_wal`]), so that after a stop the file alone holds every
    /// record (a copy of it is a whole backup) and a file renamed over it is read as it is. One that fails loses
    /// nothing: the `-wal` keeps the commits and the next start reads them.
    ///
    /// Then writes `STATE/clean-stop` naming the apps whose stores are open and sound here: no fault of the disk
    /// under them in this run. The next start reads every other store whole before serving it.
    pub fn checkpoint_at_stop(&mut self) {
        let mut clean = std::collections::BTreeSet::new();
        for (i, app) in self.apps.iter().enumerate() {
            if app.failure.is_some() {
                continue;
            }
            let Some(store) = self.stores.app_mut(i as AppIndex) else {
                continue;
            };
            match store.checkpoint().and_then(|()| store.empty_wal()) {
                Ok(()) => {}
                Err(e) => {
                    tracing::warn!(
                        "app {}: the last checkpoint before the stop failed ({e}); nothing is lost, its -wal keeps \
                         the records",
                        app.config.name
                    );
                    if e.lost_a_write() {
                        continue;
                    }
                }
            }
            clean.insert(app.config.name.clone());
        }
        if let Some(dir) = &self.state_dir
            && let Err(e) = store::state::CleanStop::write(dir, &clean)
        {
            tracing::warn!("{e}: each store is read whole at the next start");
        }
    }

    /// Whether [`Host::turn`] takes the node core's turn now. Always on the host's own files (a turn waits there
    /// for the oldest sync when too many are behind); on a shared store only while at most [`MAX_UNSYNCED`] turns
    /// wait for their outcome (so at most one more is handed over: as on its own files, where the turn after the
    /// fourth waits for the oldest), so that the loop never waits on the database (`shared.rs`), or while the
    /// database is out of reach for every app (a turn that filled before then is taken and stores nothing, so that
    /// the loop reads on and answers NOT_STORED rather than waiting for the turns in hand).
    pub fn can_take_turn(&self) -> bool {
        self.shared.is_none() || self.unsynced.len() <= MAX_UNSYNCED || self.database_out_of_reach()
    }

    /// Whether committed turns wait for their sync.
    pub fn has_unsynced(&self) -> bool {
        !self.unsynced.is_empty()
    }

    /// Every turn of the host up to this sequence number is finished (acks out, outlets fed).
    pub fn finished_seq(&self) -> u64 {
        self.finished_seq
    }

    /// The sequence number of the last turn taken ([`Host::turn`]).
    pub fn last_seq(&self) -> u64 {
        self.next_seq - 1
    }

    /// Readable when a sync is done: the receive loop polls it beside its socket.
    pub fn sync_fd(&self) -> Option<RawFd> {
        if let Some(shared) = &self.shared {
            return shared.wake_fd();
        }
        self.syncer.as_ref().map(Syncer::wake_fd)
    }

    fn finish_done(&mut self, done: Vec<Synced>, node: &mut Node) {
        let now = Instant::now();
        for synced in done {
            let Some(unsynced) = self.unsynced.pop_front() else {
                break;
            };
            debug_assert_eq!(unsynced.seq, synced.seq, "syncs finish in order");
            self.finish(unsynced, &synced.failed, node, now);
        }
    }

    /// A turn is durable (but for the apps in `failed`): the node core learns it, outlets are fed from it.
    fn finish(
        &mut self,
        unsynced: Unsynced,
        failed: &[(AppIndex, Arc<StoreError>)],
        node: &mut Node,
        now: Instant,
    ) {
        for (app, error) in failed {
            self.disk_fault(*app, error, node, now);
        }
        let mut committed = unsynced.turn.map(|turn| Committed {
            turn,
            ..Committed::default()
        });
        let mut new_chunks: Vec<Vec<Arc<Chunk>>> =
            (0..self.apps.len()).map(|_| Vec::new()).collect();
        for part in unsynced.parts {
            if failed.iter().any(|(a, _)| *a == part.app) {
                continue;
            }
            let i = part.app as usize;
            self.durable[i] = self.durable[i].max(part.head);
            self.apps[i].stored += part.stored;
            if let Some(c) = committed.as_mut() {
                c.heard.extend(part.outcome.heard);
                c.stored_records += part.outcome.stored_records;
                c.duplicate_records += part.outcome.duplicate_records;
                c.gap_records += part.outcome.gap_records;
                // Reads for LISTENs go out with the turn's answers: after its sync if it needed one.
                c.down.extend(part.outcome.down);
            }
            if let Some(c) = part.new_chunks.first() {
                self.apps[i].times.note(c.pos, c.stored_at_ms);
            }
            self.apps[i].head_known = true;
            new_chunks[i] = part.new_chunks;
        }
        if let Some(c) = &committed {
            node.handle_committed(c);
        }
        // A push whose store's sync failed may or may not have kept its records.
        let mut pushed = unsynced.pushed;
        for (app, outcomes) in &mut pushed {
            if let Some((_, e)) = failed.iter().find(|(a, _)| a == app) {
                for o in outcomes.iter_mut().filter(|o| o.done().is_some()) {
                    *o = PushOutcome::Failed {
                        error: e.clone(),
                        maybe_queued: true,
                    };
                }
            }
        }
        self.answer_pushes(unsynced.pushes, pushed, node, now);
        self.finished_seq = unsynced.seq;
        self.feed_outlets(&new_chunks);
        self.check_lag(node);
    }

    /// A sync or checkpoint of an app's store failed: the disk under it did not write what it was given. The app
    /// fails, and so does every other app whose store is on the same filesystem: a disk that failed a write of
    /// one file (its journal aborted, a card wearing out) cannot be trusted with the others' (research/014).
    fn disk_fault(&mut self, app: AppIndex, error: &StoreError, node: &mut Node, now: Instant) {
        if matches!(error, StoreError::FailedEarlier { .. })
            && self.apps[app as usize].failure.is_some()
        {
            return;
        }
        let device = self.device_of(app);
        self.apps[app as usize].turns_failed += 1;
        self.fail_app(app, error, node, now);
        let Some(device) = device else { return };
        let name = self.apps[app as usize].config.name.clone();
        for other in 0..self.apps.len() as AppIndex {
            // Apps already stopped for a fault they could recover from (a full disk) are stopped for good too.
            if other != app
                && self.stores.reopenable(other)
                && self.device_of(other) == Some(device)
            {
                let why = StoreError::SameDisk { app: name.clone() };
                self.fail_app(other, &why, node, now);
            }
        }
    }

    /// The filesystem an app's open store is on.
    fn device_of(&self, app: AppIndex) -> Option<u64> {
        use std::os::unix::fs::MetadataExt;
        let Some(store) = self.stores.app(app) else {
            return std::fs::metadata(self.stores.path(app)?)
                .ok()
                .map(|m| m.dev());
        };
        match store.files() {
            Some(f) => Some(f.device()),
            None => std::fs::metadata(store.path()).ok().map(|m| m.dev()),
        }
    }

    /// An app cannot store: none of its commits since its last good sync may be acked or read. Its input stops
    /// (its senders get NOT_STORED), its parts of the turns still waiting for a sync are dropped, and its store is
    /// closed, to be reopened and checked against what was acknowledged ([`Stores::retry`]). The first reason is
    /// kept; a later one for an app that failed already is not news.
    fn fail_app(&mut self, app: AppIndex, error: &StoreError, node: &mut Node, now: Instant) {
        let i = app as usize;
        // A disk that lost a write is not trusted again by this process: its later syncs may report writes done
        // that it lost (issue 34; docs/durability.md, "On a failing disk").
        let never = match error {
            StoreError::Gone { what, .. } => Some(Never::Gone(what.clone())),
            e if e.lost_a_write() => Some(Never::Other(e.to_string())),
            _ => None,
        };
        // A failure it could recover from that turns into one it cannot is news.
        let worse = never.is_some() && self.stores.reopenable(app);
        if self.apps[i].failure.is_none() || worse {
            let why = error.to_string();
            let a = &mut self.apps[i];
            let until = if never.is_some() {
                "the node is restarted"
            } else {
                "it can"
            };
            tracing::error!(
                app = %a.config.name,
                "app {} cannot store, its senders get no acks until {until}: {why}",
                a.config.name
            );
            match &mut a.failure {
                Some(f) => {
                    f.why = why;
                    f.last_try = None;
                    f.logged = None;
                }
                None => a.failure = Some(Failure::new(why, now)),
            }
        }
        node.set_app_paused(app, true);
        node.set_app_cannot_store(app, true);
        let words = self.unsynced_words(app);
        for later in &mut self.unsynced {
            later.parts.retain(|p| p.app != app);
            for p in pushes::extract(&mut later.pushes, &mut later.pushed, app) {
                p.maybe_queued(words.clone());
            }
        }
        let name = self.apps[i].config.name.clone();
        let why = self.apps[i]
            .failure
            .as_ref()
            .map(Failure::words)
            .unwrap_or_default();
        for p in pushes::extract(&mut self.turn_pushes, &mut [], app) {
            p.unavailable(format!(
                "app {name} cannot store now ({why}): nothing was queued; push again once it stores"
            ));
        }
        // Read again from the store when the app is back.
        for inner in self.inner.iter_mut().filter(|x| x.dest == app) {
            inner.heard = None;
        }
        if self.state_dir.is_some() {
            self.stores.close_failed(app, self.durable[i], never);
        }
    }

    /// What a pusher is told of records of `app` committed but not yet synced when it failed.
    fn unsynced_words(&self, app: AppIndex) -> String {
        let a = &self.apps[app as usize];
        let why = a.failure.as_ref().map(Failure::words).unwrap_or_default();
        format!(
            "app {} cannot store ({why}): the records were committed but not yet on disk when it failed, so they \
             may or may not be queued once its store is back; pushing them again may queue them twice",
            a.config.name
        )
    }

    /// Reads each inner outlet's next batch from its source store, as forwarded records for its destination.
    fn read_inner(
        &mut self,
        direct_counts: &[u64],
        report: &mut TurnReport,
    ) -> Vec<(AppIndex, String, Chunk)> {
        let mut out = Vec::new();
        let mut room: Vec<u64> = self
            .apps
            .iter()
            .zip(direct_counts)
            .map(|(a, c)| {
                // The destination's turn share, and what its own outlets' lag budgets leave (less what its direct
                // input already took in this turn).
                let lag_room = a.lag_room.map_or(u64::MAX, |r| r.saturating_sub(*c));
                a.config.turn_records.saturating_sub(*c).min(lag_room)
            })
            .collect();
        for inner in &mut self.inner {
            let dest = inner.dest as usize;
            if self.apps[dest].failure.is_some() || self.apps[dest].lag_paused || room[dest] == 0 {
                continue;
            }
            let heard = match inner.heard {
                Some(h) => h,
                None => match self
                    .stores
                    .app(inner.dest)
                    .map(|s| s.heard_of(&inner.source_name))
                {
                    Some(Ok(h)) => {
                        inner.heard = Some(h);
                        h
                    }
                    _ => continue,
                },
            };
            let Some(source) = self.stores.app(inner.source) else {
                continue;
            };
            // Only what is synced: an inner outlet must not hold what its source may lose.
            let durable = self.durable[inner.source as usize];
            if heard + 1 >= durable {
                continue;
            }
            let limit = room[dest].min(durable - heard - 1);
            let chunks = match source.read_from(heard + 1, limit, usize::MAX) {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!("inner outlet {}: cannot read its source: {e}", inner.name);
                    continue;
                }
            };
            let mut taken = 0;
            for chunk in chunks {
                self.apps[inner.source as usize]
                    .times
                    .note(chunk.pos, chunk.stored_at_ms);
                if taken >= limit {
                    report.more = true;
                    break;
                }
                let take = chunk.count.min(limit - taken);
                taken += take;
                out.push((
                    inner.dest,
                    inner.source_name.clone(),
                    as_forwarded(chunk, take),
                ));
            }
            room[dest] -= taken;
            if heard + taken + 1 < durable {
                report.more = true;
            }
        }
        out
    }

    /// Feeds every remote outlet what it has room for and pushes each one that got something.
    fn feed_outlets(&mut self, new_chunks: &[Vec<Arc<Chunk>>]) {
        for (i, app) in self.apps.iter_mut().enumerate() {
            if let Some(store) = self.stores.app_mut(i as AppIndex) {
                for o in app.outlets.iter_mut().filter(|o| o.unkept_start.is_some()) {
                    keep_start(store, &app.config.name, o);
                }
            }
            let Some(store) = self.stores.app(i as AppIndex) else {
                continue;
            };
            // Only what is synced: a far side must never hold what this node may lose.
            let head = self.durable[i];
            for o in &mut app.outlets {
                if let Some(from) = o.outlet.take_restart() {
                    o.fed_next = Some(from);
                }
                let Some(next) = o.fed_next else { continue };
                if next >= head || o.unkept_start.is_some() {
                    continue;
                }
                let room = o.outlet.room();
                if room == 0 {
                    continue;
                }
                let fresh = &new_chunks[i];
                let (fed, at) = if fresh.first().is_some_and(|c| c.pos == next) {
                    // Caught up: this turn's chunks are exactly what it wants next, already in memory.
                    crate::outlets::fill(room, fresh.iter().cloned())
                } else {
                    match store.read_from(next, CATCH_UP_RECORDS.min(head - next), room) {
                        // Chunks end at turns' ends, so none straddles `head`.
                        Ok(chunks) => crate::outlets::fill(
                            room,
                            chunks
                                .into_iter()
                                .take_while(|c| c.pos < head)
                                .inspect(|c| app.times.note(c.pos, c.stored_at_ms))
                                .map(Arc::new),
                        ),
                        Err(e) => {
                            o.outlet
                                .error("store", format!("cannot read the app's store: {e}"));
                            continue;
                        }
                    }
                };
                let Some(at) = at else { continue };
                o.fed_next = Some(at);
                match self.feed_mode {
                    FeedMode::Chunks => o.outlet.feed(fed),
                    // research/006's contrasts, never the daemon's path (see `FeedMode`).
                    FeedMode::RecordsPushPerTurn => {
                        for c in &fed {
                            o.outlet.feed(single_records(c).map(Arc::new));
                        }
                    }
                    FeedMode::RecordsPushPerRecord => {
                        for c in &fed {
                            for one in single_records(c) {
                                o.outlet.feed([Arc::new(one)]);
                                o.outlet.push();
                            }
                        }
                    }
                }
                o.outlet.push();
            }
        }
    }

    /// Keeps each app's stored times (`host/times.rs`) to what its outlets' oldest records need: read from the
    /// store when an outlet's oldest record is before every point the host has (after a start, a reopened store, a
    /// reload that added an outlet: a few lookups by the position index, once), forgotten before the oldest.
    fn keep_times(&mut self, heads: &[u64]) {
        // Per app, its outlets' oldest record not acknowledged (one pass over the inner outlets, not one per app).
        let mut oldest: Vec<Option<u64>> = vec![None; self.apps.len()];
        let mut lags = |i: usize, next: u64| {
            if next < heads[i] {
                oldest[i] = Some(oldest[i].map_or(next, |o| o.min(next)));
            }
        };
        for inner in &self.inner {
            lags(inner.source as usize, inner.heard_now() + 1);
        }
        for (i, app) in self.apps.iter().enumerate() {
            for o in &app.outlets {
                lags(i, o.outlet.acked() + 1);
            }
        }
        for (i, app) in self.apps.iter_mut().enumerate() {
            let head = heads[i];
            let Some(oldest) = oldest[i] else {
                app.times.forget_before(head);
                continue;
            };
            if app.times.wants_seed(oldest)
                && let Some(store) = self.stores.app(i as AppIndex)
            {
                for pos in times::StoredTimes::seed_positions(oldest, head) {
                    match store.chunk_stored_at(pos) {
                        Ok(Some((p, ms))) => app.times.note(p, ms),
                        Ok(None) => {}
                        Err(e) => {
                            // The figure stays unknown; the store's own faults are told where it commits.
                            tracing::debug!("app {}: stored times not read: {e}", app.config.name);
                            break;
                        }
                    }
                }
                app.times.seeded(oldest);
            }
            app.times.forget_before(oldest);
        }
    }

    /// Pauses apps whose outlets are at their lag budget; resumes them at [`LAG_RESUME_PERCENT`] of it
    /// (hysteresis). While an app takes input the node core is told the records it may still take before an outlet
    /// reaches its budget, so a burst passes it by less than a frame (protocol.md 6.3), not by a turn. Called after
    /// each turn's commits (the head moved) and when a turn is finished (acknowledgements may have come); and once
    /// the node core has its apps (at start and after a reload), so that a budget holds from the first packet.
    pub fn check_lag(&mut self, node: &mut Node) {
        let heads: Vec<u64> = (0..self.apps.len()).map(|i| self.head_known(i)).collect();
        self.keep_times(&heads);
        let mut over: Vec<Option<bool>> = vec![None; self.apps.len()];
        let mut rooms: Vec<Option<u64>> = vec![None; self.apps.len()];
        let mut budget = |i: usize, lag: u64, max: u64, paused: bool| {
            if max == 0 {
                return;
            }
            let v = over[i].get_or_insert(false);
            *v |= lag >= max || (paused && lag > resume_below(max));
            let room = max.saturating_sub(lag);
            rooms[i] = Some(rooms[i].map_or(room, |r| r.min(room)));
        };
        for (i, app) in self.apps.iter().enumerate() {
            for o in &app.outlets {
                let lag = heads[i].saturating_sub(1).saturating_sub(o.outlet.acked());
                budget(i, lag, o.max_lag, app.lag_paused);
            }
        }
        for inner in &self.inner {
            let s = inner.source as usize;
            let lag = heads[s].saturating_sub(1).saturating_sub(inner.heard_now());
            budget(s, lag, inner.max_lag, self.apps[s].lag_paused);
        }
        for (i, app) in self.apps.iter_mut().enumerate() {
            if rooms[i] != app.lag_room {
                app.lag_room = rooms[i];
                node.set_app_lag_room(i as AppIndex, rooms[i]);
            }
        }
        let now = Instant::now();
        for (i, app) in self.apps.iter_mut().enumerate() {
            let now_over = over[i].unwrap_or(false);
            if now_over != app.lag_paused {
                app.lag_paused = now_over;
                app.lag_pauses += u64::from(now_over);
                if now_over {
                    if app.lag_spell.paused(now) == Some(LagLine::SpellBegins) {
                        tracing::warn!(
                            "app {}: an outlet is behind its max_lag_records; not taking input until it has caught \
                             up half of it (pauses while it stays behind are counted in pure_app_pauses_total)",
                            app.config.name
                        );
                    }
                } else {
                    app.lag_spell.resumed(now);
                }
                node.set_app_paused(i as AppIndex, now_over || app.failure.is_some());
            }
            if let Some(LagLine::CaughtUp { pauses, over }) = app.lag_spell.calm(now) {
                tracing::info!(
                    "app {}: outlets caught up; taking input again ({pauses} pause{} over {:.1} s, none for {} s \
                     since)",
                    app.config.name,
                    if pauses == 1 { "" } else { "s" },
                    over.as_secs_f64(),
                    LAG_CALM.as_secs()
                );
            }
        }
    }

    /// Lets a failed app try again when its delay is up: its store is reopened and checked against what was
    /// acknowledged, and must commit and sync a probe ([`Stores::retry`]).
    fn retry_failed(&mut self, node: &mut Node, now: Instant) {
        for (i, app) in self.apps.iter_mut().enumerate() {
            let Some(f) = &mut app.failure else { continue };
            if now < f.retry_at || !self.stores.reopenable(i as AppIndex) {
                continue;
            }
            if self.stores.closing(i as AppIndex) {
                // A sync of the old descriptors is still in flight: try once it is done, without waiting here.
                f.retry_at = now + RETRY_FIRST;
                continue;
            }
            let tried = self.stores.retry(i as AppIndex);
            if !matches!(tried, Err(StoreError::Checking { .. })) {
                app.reopen_tries += 1;
            }
            match tried {
                Ok(_) => {
                    tracing::info!(
                        "app {} can store again (it could not for {:.1} s)",
                        app.config.name,
                        now.saturating_duration_since(f.since).as_secs_f64()
                    );
                    app.failure = None;
                    self.stores_reopened += 1;
                    // The reopened store was read from the disk and its probe synced: what it holds is durable.
                    self.durable[i] = self.stores.app(i as AppIndex).map_or(1, AppStore::head);
                    node.set_app_paused(i as AppIndex, app.lag_paused);
                    node.set_app_cannot_store(i as AppIndex, false);
                }
                Err(e @ StoreError::Checking { .. }) => {
                    // Reading on its own thread: ask again soon, without counting it as a try.
                    f.last_try = Some(e.to_string());
                    f.retry_at = now + CHECK_POLL;
                }
                Err(e) => {
                    let words = e.to_string();
                    if f.logged.as_deref() != Some(words.as_str()) && words != f.why {
                        if matches!(e, StoreError::Lost { .. }) {
                            tracing::error!("app {}: {words}", app.config.name);
                        } else {
                            tracing::warn!("app {} still cannot store: {words}", app.config.name);
                        }
                        f.logged = Some(words.clone());
                    }
                    f.last_try = Some(words);
                    f.backoff = (f.backoff * 2).min(RETRY_MAX);
                    f.retry_at = now + f.backoff;
                }
            }
        }
    }

    /// App `i`'s head as this node knows it: its store's, or on a fleet's store the larger of its last turn's and
    /// the database's at the outbox's last renewal (records the other nodes stored since).
    fn head_known(&self, i: usize) -> u64 {
        let own = self
            .stores
            .app(i as AppIndex)
            .map_or(self.durable[i], |s| s.head());
        own.max(
            self.apps[i]
                .fleet_head
                .load(std::sync::atomic::Ordering::Acquire),
        )
    }

    /// Figures for metrics, status and health.
    pub fn figures(&self) -> Vec<AppFigures> {
        self.apps
            .iter()
            .enumerate()
            .map(|(i, app)| {
                let head = self.head_known(i);
                let mut outlets: Vec<OutletFigures> = app
                    .outlets
                    .iter()
                    .map(|o| {
                        let state = o.outlet.state();
                        let lag = head.saturating_sub(1).saturating_sub(o.outlet.acked());
                        OutletFigures {
                            name: o.outlet.name.clone(),
                            kind: o.outlet.kind,
                            lag_records: lag,
                            oldest_stored_ms: (lag > 0)
                                .then(|| app.times.stored_at(o.outlet.acked() + 1))
                                .flatten(),
                            sent_records: o.outlet.sent_records(),
                            held_bytes: o.outlet.held_bytes(),
                            status: state.status,
                            last_error: state.last_error,
                            last_error_kind: state.last_error_kind,
                            failing_since: state.failing_since,
                            status_since: state.status_since,
                            errors: state.errors.into_iter().collect(),
                            target: o.target_words.clone(),
                        }
                    })
                    .collect();
                for inner in self.inner.iter().filter(|x| x.source as usize == i) {
                    let lag = head.saturating_sub(1).saturating_sub(inner.heard_now());
                    outlets.push(OutletFigures {
                        name: inner.name.clone(),
                        kind: "app",
                        lag_records: lag,
                        oldest_stored_ms: (lag > 0)
                            .then(|| app.times.stored_at(inner.heard_now() + 1))
                            .flatten(),
                        sent_records: inner.heard_now(),
                        held_bytes: 0,
                        status: "sending",
                        last_error: None,
                        last_error_kind: None,
                        failing_since: None,
                        status_since: None,
                        errors: Vec::new(),
                        target: format!("app {}", self.apps[inner.dest as usize].config.name)
                            .into(),
                    });
                }
                let queue_depth = self
                    .inner
                    .iter()
                    .filter(|x| x.dest as usize == i)
                    .map(|x| {
                        let src_head = self.stores.app(x.source).map_or(1, |s| s.head());
                        src_head
                            .saturating_sub(1)
                            .saturating_sub(x.heard.unwrap_or(0))
                    })
                    .sum();
                AppFigures {
                    name: app.config.name.clone(),
                    stored_records: app.stored,
                    store_records: (app.head_known || self.stores.app(i as AppIndex).is_some())
                        .then(|| head.saturating_sub(1)),
                    turns_failed: app.turns_failed,
                    reopen_tries: app.reopen_tries,
                    queue_depth,
                    failed: app.failure.as_ref().map(Failure::words),
                    failed_database: app.failure.as_ref().is_some_and(|f| f.database),
                    head,
                    paused_for_lag: app.lag_paused,
                    lag_pauses: app.lag_pauses,
                    outlets,
                    down_waiting: if self.shared.is_some() {
                        app.down_waiting_shared
                    } else {
                        self.stores
                            .app(i as AppIndex)
                            .map_or(0, |s| s.down_waiting())
                    },
                    down_delivered: app.down_delivered,
                    down_expired: app.down_expired,
                    down_queued: app.down_queued,
                    down_refused: app.down_refused,
                }
            })
            .collect()
    }

    /// Puts a new apps file in force where that is safe: new apps, accept lists, turn shares and outlets. Removing
    /// or renaming an app needs a restart (its index is in turns and sessions); that is reported, not done.
    pub fn reload(&mut self, config: &AppsConfig, node: &mut Node) -> Result<Reloaded, StoreError> {
        let mut done = Reloaded::default();
        for app in &self.apps {
            if !config.apps.iter().any(|a| a.name == app.config.name) {
                done.needs_restart.push(format!(
                    "app {} is no longer in the file: it keeps running until a restart",
                    app.config.name
                ));
            }
        }
        let mut effective = Vec::new();
        for app in &self.apps {
            effective.push(
                config
                    .apps
                    .iter()
                    .find(|a| a.name == app.config.name)
                    .cloned()
                    .unwrap_or_else(|| app.config.clone()),
            );
        }
        for new in &config.apps {
            if !self.apps.iter().any(|a| a.config.name == new.name) {
                effective.push(new.clone());
            }
        }
        // Apps that stay: rules and outlets.
        // Per app, what the far sides of the outlets stopped below had acknowledged, by name.
        let mut stopped_acked: Vec<HashMap<String, u64>> = Vec::new();
        for (app, new) in self.apps.iter_mut().zip(&effective) {
            let new = new.clone();
            if app.config.accept != new.accept
                || app.config.forwarders != new.forwarders
                || app.config.turn_records != new.turn_records
            {
                done.applied.push(format!(
                    "app {}: accept list, forwarders and turn share updated",
                    new.name
                ));
            }
            let old_outlets = std::mem::take(&mut app.outlets);
            let mut kept = Vec::new();
            let mut left = HashMap::new();
            for o in old_outlets {
                let still = new.outlets.iter().find(|n| {
                    n.name == o.outlet.name
                        && target_of(&n.kind).as_ref() == Some(&o.target)
                        && n.memory_bytes == o.outlet.memory_bytes
                });
                match still {
                    Some(n) => {
                        let mut o = o;
                        o.max_lag = n.max_lag_records;
                        kept.push(o);
                    }
                    None => {
                        done.applied.push(format!(
                            "app {}: outlet {} stopped",
                            new.name, o.outlet.name
                        ));
                        done.outlets.stop.push(o.outlet.id);
                        left.insert(o.outlet.name.clone(), o.outlet.acked());
                    }
                }
            }
            app.outlets = kept;
            app.config = new;
            stopped_acked.push(left);
        }
        for i in 0..self.apps.len() {
            let config = self.apps[i].config.clone();
            let mut acked = self
                .stores
                .app(i as AppIndex)
                .map(|s| s.outlets_acked())
                .transpose()?
                .unwrap_or_default();
            // An outlet made again with other keys (a webhook's batch size or url) goes on from what its far side
            // acknowledged to the one it replaces, which the store may not have been written yet: from the store's
            // older figure it would send those records again (an outside audit counted 84 in 12 reloads).
            for (name, position) in stopped_acked.get(i).into_iter().flatten() {
                let was = acked.entry(name.clone()).or_insert(0);
                *was = (*was).max(*position);
            }
            for o in &config.outlets {
                if self.apps[i].outlets.iter().any(|x| x.outlet.name == o.name) {
                    continue;
                }
                if let Some(remote) =
                    self.make_outlet(i as AppIndex, &config.name, o, &acked, &mut done.outlets)
                {
                    done.applied
                        .push(format!("app {}: outlet {} started", config.name, o.name));
                    self.apps[i].outlets.push(remote);
                }
            }
        }
        // New apps.
        for new in effective
            .iter()
            .skip(self.apps.len())
            .cloned()
            .collect::<Vec<_>>()
        {
            if let Some(shared) = &mut self.shared {
                // Registered by the store's thread before any turn that carries the app's parts.
                shared.add_apps(std::slice::from_ref(&new.name));
                done.applied.push(format!("app {} added", new.name));
                self.add_app(new, &mut done.outlets)?;
                continue;
            }
            let closed = match &self.state_dir {
                Some(dir) => {
                    let path = store::app_store_path(dir, &new.name);
                    // A store left from an earlier run of the app: read whole unless that run closed it cleanly.
                    if self.start.clean.contains(&new.name) || !path.exists() {
                        open_or_close(&mut self.stores, path, &new.name)?
                    } else {
                        open_checked(&mut self.stores, path, &new.name, self.start.accept_lost)?
                    }
                }
                None => {
                    self.stores.push(AppStore::open_in_memory(&new.name)?);
                    None
                }
            };
            done.applied.push(format!("app {} added", new.name));
            self.add_app(new, &mut done.outlets)?;
            if let (Some(why), Some(app)) = (closed, self.apps.last_mut()) {
                app.failure = Some(Failure::new(why, Instant::now()));
            }
        }
        let full = AppsConfig {
            apps: effective,
            path: config.path.clone(),
        };
        self.rebuild_inner(&full);
        node.set_apps(self.hosted_apps());
        // An outlet given a budget (or a new one) holds from the next packet, not from the next turn's end.
        self.check_lag(node);
        Ok(done)
    }
}

/// `chunk` cut into chunks of one record each (research/006's [`FeedMode`]s).
fn single_records(chunk: &Chunk) -> impl Iterator<Item = Chunk> + '_ {
    (0u64..).zip(chunk.records()).map(move |(k, record)| {
        let mut body = Vec::with_capacity(record.len() + 3);
        crate::proto::wire::put_record(&mut body, record);
        Chunk {
            pos: chunk.pos + k,
            source: chunk.source.clone(),
            first_seq: chunk.first_seq + k,
            count: 1,
            format: chunk.format,
            stored_at_ms: chunk.stored_at_ms,
            body,
        }
    })
}

/// An inner outlet's chunk for its destination: the first `take` records, as forwarded records (a plain record's
/// origin is its source and sequence here; a forwarded one keeps its own).
fn as_forwarded(chunk: Chunk, take: u64) -> Chunk {
    let mut body = Vec::with_capacity(chunk.body.len() + take as usize * (chunk.source.len() + 4));
    for (k, record) in chunk.records().take(take as usize).enumerate() {
        match chunk.format {
            RecordFormat::Plain => Forwarded::put(
                &mut body,
                chunk.source.as_bytes(),
                chunk.first_seq + k as u64,
                record,
            ),
            RecordFormat::Forwarded => crate::proto::wire::put_record(&mut body, record),
        }
    }
    Chunk {
        count: take,
        format: RecordFormat::Forwarded,
        body,
        ..chunk
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pauses several times a second make one warning and, after the calm, one line with their count; a pause
    /// during the calm starts it over.
    #[test]
    fn a_spell_of_lag_pauses_is_told_once_at_each_end() {
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let mut spell = LagSpell::default();
        assert_eq!(spell.calm(ms(0)), None, "no spell, nothing to end");
        assert_eq!(spell.paused(ms(0)), Some(LagLine::SpellBegins));
        spell.resumed(ms(100));
        for k in 1..8 {
            assert_eq!(spell.paused(ms(125 * k)), None, "the same spell");
            assert_eq!(spell.calm(ms(125 * k + 50)), None);
            spell.resumed(ms(125 * k + 60));
        }
        assert_eq!(
            spell.calm(ms(935 + 9_000)),
            None,
            "not yet calm for long enough"
        );
        // A pause now restarts the calm.
        assert_eq!(spell.paused(ms(9_950)), None);
        assert_eq!(
            spell.calm(ms(19_000)),
            None,
            "paused: no end while it lasts"
        );
        spell.resumed(ms(20_000));
        assert_eq!(
            spell.calm(ms(30_000)),
            Some(LagLine::CaughtUp {
                pauses: 9,
                over: Duration::from_millis(20_000)
            })
        );
        assert_eq!(spell.calm(ms(40_000)), None, "told once");
        assert_eq!(
            spell.paused(ms(41_000)),
            Some(LagLine::SpellBegins),
            "a new spell"
        );
    }

    /// App `main` with a webhook outlet of `from = "next"` for each name.
    fn next_webhooks(outlets: &[&str]) -> AppsConfig {
        let mut text = "[apps.main]\n".to_string();
        for o in outlets {
            text.push_str(&format!(
                "[apps.main.outlets.{o}]\nkind = \"webhook\"\nurl = \"http://127.0.0.1:9/{o}\"\nfrom = \"next\"\n"
            ));
        }
        AppsConfig::parse(Path::new("apps.toml"), &text).unwrap()
    }

    /// Stores `records` of source `dev` from `first_seq`, with the outlets' acknowledged positions `acked`.
    fn store_records(
        store: &mut AppStore,
        first_seq: u64,
        records: &[&str],
        acked: &[(&str, u64)],
    ) {
        let mut body = Vec::new();
        for r in records {
            crate::proto::wire::put_record(&mut body, r.as_bytes());
        }
        let mut pieces = vec![Piece {
            source: "dev",
            first_seq,
            count: records.len() as u64,
            format: RecordFormat::Plain,
            records: &body,
        }];
        store.apply(&mut pieces, acked, false).unwrap();
    }

    /// docs/apps.md, `from`, "Upgrading": outlets of a store written by a node that kept no starts keep the
    /// position they had whatever their `from` (a webhook with a saved position goes on from it; one without starts
    /// at the first record); an outlet added later with `from = "next"` starts at the head then, and a restart
    /// keeps every start.
    #[test]
    fn outlets_of_an_older_store_keep_their_position_and_new_ones_start_by_from() {
        let dir = tempfile::tempdir().unwrap();
        let wake = Arc::new(Wake::new().unwrap());
        {
            let (mut host, _) = Host::open(
                dir.path(),
                &next_webhooks(&[]),
                wake.clone(),
                &StoreStart::default(),
            )
            .unwrap();
            // A webhook `hook` of the older node had 3 acknowledged.
            let store = host.stores.app_mut(0).unwrap();
            store_records(store, 1, &["1", "2", "3", "4", "5"], &[("hook", 3)]);
        }
        // What an older node's store looks like: no starts.
        let conn = rusqlite::Connection::open(store::app_store_path(dir.path(), "main")).unwrap();
        conn.execute_batch("DROP TABLE outlet_starts").unwrap();
        drop(conn);
        let acked = |host: &Host, name: &str| {
            let o = host.apps[0]
                .outlets
                .iter()
                .find(|o| o.outlet.name == name)
                .unwrap();
            (o.outlet.acked(), o.outlet.base())
        };
        {
            let (host, _) = Host::open(
                dir.path(),
                &next_webhooks(&["hook", "quiet"]),
                wake.clone(),
                &StoreStart::default(),
            )
            .unwrap();
            assert_eq!(acked(&host, "hook"), (3, 0), "keeps its saved position");
            assert_eq!(
                acked(&host, "quiet"),
                (0, 0),
                "in the file at the upgrade: from the first record"
            );
        }
        {
            let (host, _) = Host::open(
                dir.path(),
                &next_webhooks(&["hook", "quiet", "later"]),
                wake.clone(),
                &StoreStart::default(),
            )
            .unwrap();
            assert_eq!(acked(&host, "hook"), (3, 0));
            assert_eq!(acked(&host, "quiet"), (0, 0), "a restart keeps its start");
            assert_eq!(
                acked(&host, "later"),
                (5, 5),
                "added later with next: from the head"
            );
        }
        let (host, _) = Host::open(
            dir.path(),
            &next_webhooks(&["later"]),
            wake,
            &StoreStart::default(),
        )
        .unwrap();
        assert_eq!(acked(&host, "later"), (5, 5), "a restart keeps its start");
    }

    /// A link of `from = "next"` moved to another far app and then back numbers the first far flow as its far node
    /// does: with the start it had there, not the head at the move back (an outside audit: the far node took
    /// positions 11.. as sequences 1.. it already had, acknowledged them, and they were lost).
    #[test]
    fn a_link_moved_to_another_far_app_and_back_keeps_the_first_flows_start() {
        let dir = tempfile::tempdir().unwrap();
        let wake = Arc::new(Wake::new().unwrap());
        let key = crate::keys::encode_key(&[7u8; 32]);
        let link_to = |far: &str| {
            AppsConfig::parse(
                Path::new("apps.toml"),
                &format!(
                    "[apps.main]\n[apps.main.outlets.o]\nkind = \"link\"\nto = \"127.0.0.1:9\"\n\
                     node_key = \"{key}\"\napp = \"{far}\"\nfrom = \"next\"\n"
                ),
            )
            .unwrap()
        };
        let base = |config: &AppsConfig, records: &[&str], first_seq: u64| {
            let (mut host, _) =
                Host::open(dir.path(), config, wake.clone(), &StoreStart::default()).unwrap();
            let base = host.apps[0].outlets[0].outlet.base();
            let store = host.stores.app_mut(0).unwrap();
            store_records(store, first_seq, records, &[]);
            store.sync().unwrap();
            base
        };
        drop(host_with_five_records(&dir, &wake));
        assert_eq!(
            base(&link_to("x"), &["6", "7"], 6),
            5,
            "from the head: position 6"
        );
        assert_eq!(
            base(&link_to("y"), &["8", "9"], 8),
            7,
            "a new far flow: the head then"
        );
        assert_eq!(
            base(&link_to("x"), &[], 10),
            5,
            "back to x: x's start, as its far node numbers it"
        );
        assert_eq!(base(&link_to("y"), &[], 10), 7, "and y's");
        // The start of x, which no outlet sends to now, is kept under a name no outlet can have.
        let store = AppStore::open(&store::app_store_path(dir.path(), "main")).unwrap();
        let (starts, _) = store.outlet_starts().unwrap();
        assert!(
            starts
                .iter()
                .any(|s| s.name.starts_with(store::FAR_FLOW_KEPT)
                    && s.flow.as_deref().is_some_and(|f| f.ends_with(" x"))
                    && s.start == 6),
            "{starts:?}"
        );
    }

    /// A host of app `main` with five records stored and synced, before any outlet.
    fn host_with_five_records(dir: &tempfile::TempDir, wake: &Arc<Wake>) -> Host {
        let (mut host, _) = Host::open(
            dir.path(),
            &next_webhooks(&[]),
            wake.clone(),
            &StoreStart::default(),
        )
        .unwrap();
        let store = host.stores.app_mut(0).unwrap();
        store_records(store, 1, &["1", "2", "3", "4", "5"], &[]);
        store.sync().unwrap();
        host
    }

    /// An outlet first applied with `from = "next"` while its app's store is closed is fed nothing until its
    /// start is kept; once the store is open it keeps the start it decided (the store's head), and a restart makes
    /// it with that start. A different start found in the store then is not overwritten: the outlet stays unfed
    /// and says why.
    #[test]
    fn an_outlet_whose_start_cannot_be_kept_is_fed_nothing_until_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let wake = Arc::new(Wake::new().unwrap());
        let mut host = host_with_five_records(&dir, &wake);
        host.stores.close_failed(0, 6, None);
        assert!(host.stores.app(0).is_none(), "the store is closed");

        let two = next_webhooks(&["later", "other"]);
        let mut changes = OutletChanges::default();
        let mut make = |host: &mut Host, k: usize| {
            host.make_outlet(
                0,
                "main",
                &two.apps[0].outlets[k],
                &std::collections::HashMap::new(),
                &mut changes,
            )
            .unwrap()
        };
        let mut later = make(&mut host, 0);
        let mut other = make(&mut host, 1);
        assert_eq!(later.outlet.base(), 5, "decided from what the file holds");
        let row = later
            .unkept_start
            .clone()
            .expect("not kept: the store is closed");
        assert_eq!(row.start, 6);
        assert!(other.unkept_start.is_some());

        let path = store::app_store_path(dir.path(), "main");
        let mut reopened = AppStore::open(&path).unwrap();
        // Meanwhile the store got another start for `other` (as when it could not be read): kept, not overwritten.
        let mut elsewhere = other.unkept_start.clone().unwrap();
        elsewhere.start = 2;
        reopened.set_outlet_starts(&[elsewhere]).unwrap();
        keep_start(&mut reopened, "main", &mut later);
        keep_start(&mut reopened, "main", &mut other);
        assert!(later.unkept_start.is_none(), "kept once the store is open");
        assert!(
            other.unkept_start.is_some(),
            "a different start: still unfed"
        );
        assert!(
            other
                .outlet
                .state()
                .last_error
                .is_some_and(|e| e.contains("position 2")),
            "and it says why"
        );
        // Records stored after it: a start decided again now would be the new head.
        store_records(&mut reopened, 6, &["6", "7"], &[]);
        reopened.sync().unwrap();
        drop(reopened);
        drop(host);
        let (host, _) = Host::open(
            dir.path(),
            &next_webhooks(&["later"]),
            wake,
            &StoreStart::default(),
        )
        .unwrap();
        let o = &host.apps[0].outlets[0];
        assert_eq!(o.outlet.base(), 5, "a restart keeps the start it kept");
        assert!(o.unkept_start.is_none());
    }
}
