//! The host on a store it shares with the other nodes of a fleet (`--store postgres://…`, docs/scale-out.md).
//!
//! Here the host holds no store of its own: every turn goes to the [`TurnStore`] as owned parts, one per app, and
//! is **finished** when that store hands back its outcome (the database's COMMIT returned), in the order the turns
//! were submitted, exactly as a SQLite turn is finished when its sync is done. The receive loop never waits on a
//! round trip: it polls [`TurnStore::wake_fd`] beside its socket, as it polls the sync thread's. While more than
//! [`super::MAX_UNSYNCED`] turns wait for their outcome the host takes no new one ([`Host::can_take_turn`]), but
//! for a turn that filled within a batch the loop was reading: the node core's turn fills and, once full, the loop
//! stops reading its socket until an outcome comes, and serves everything else meanwhile (a slow or unreachable
//! database never stops the loop).
//!
//! What this increment serves: links and `POST /link` into any number of apps, exactly once across nodes (the
//! database decides, docs/scale-out.md "A turn"), apps added by a reload (the store registers them before any
//! turn carries their parts: [`TurnStore::add_apps`]), and outlets: the host makes link, wire and webhook outlets
//! as on one node, but hands them to the fleet's outbox ([`super::outbox`], [`Host::fleet_outlets`]) rather than
//! to the sending loop, and feeds them nothing itself; the outbox drives those whose lease this node holds. Inner
//! outlets the outbox reads from the database too, and hands the host batches that its next turn applies to their
//! destinations ([`Host::fleet_inner`], `take_inner_batches`). Downlink (docs/scale-out.md, "Downlink on a
//! fleet"): a push waits in the host for the next turn, whose part carries it to the store ahead of the turn's own
//! transaction (so a LISTEN of the same turn reads it), and is answered from that turn's outcome; the turn's
//! LISTENs ride in their app's part; and pushes other nodes committed ([`TurnStore::down_notices`]) have this
//! node's listening sessions of their sender read again, the sender found by its key.
//!
//! **When the store fails** (the database unreachable, its thread gone), each app of the failed part stops as a
//! failing disk stops it: NOT_STORED to its senders, `/healthz` and the log say why. Once its delay is up it is
//! **probed**: an empty part rides with the next turn, and the store answers it only after a round trip to the
//! database (the probe is a statement, not a look at the connection). A probe that comes back stored lets the app
//! take input again; one that fails doubles the delay, up to [`RETRY_MAX`]. The store never waits in a turn for a
//! connection to be made (it fails the part at once and connects beside its jobs, src/store/postgres.rs), so the
//! turns of a node cut off go on finishing and its senders are told NOT_STORED; and when a connection is made the
//! failed apps are probed at once ([`Host::probe_now`]).
//!
//! **When the database says nothing** (a firewall that drops packets, a hung server), no failure comes back for the
//! network's timeouts: so once the turn in hand has had no outcome for [`STORE_SILENT`] the host takes the database
//! as out of reach ([`Host::notice_silence`]): every app stops as above, and the store gives up the part it waits
//! on with its connection and connects again at once ([`TurnStore::give_up_waiting`]). The turns in hand are never
//! acked on that account: their outcome is unknown until it comes back.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::outbox::{FleetInner, FleetOutlet, InnerBatch, InnerQueue};
use super::pushes::TurnPush;
use super::{Failure, Host, OutletChanges, RETRY_MAX, TurnReport, Unsynced};
use crate::apps::config::{AppsConfig, StartFrom};
use crate::proto::allow_list::AllowList;
use crate::proto::node::Node;
use crate::proto::turn::{AppIndex, Committed, Turn};
use crate::proto::wire::RecordFormat;
use crate::store::downlink::{OwnedFetch, PushOutcome};
use crate::store::engine::{AppTurn, DownNotice, OwnedPiece, TurnOutcome, TurnStore};
use crate::store::lease::OutletKey;
use crate::store::{self, Applied, StoreError};

/// How long a node on a fleet's store goes without an outcome before it probes the database with an empty turn
/// (each app that stores), so that `/healthz` says within about a second and [`STORE_SILENT`] that the database is
/// out of reach even when no sender sends. A probe is one round trip per app.
const IDLE_PROBE: Duration = Duration::from_secs(1);

/// How long the database may leave a turn handed to it without an outcome (saying nothing else meanwhile) before
/// the host takes it as out of reach: its apps stop taking input, their senders are told NOT_STORED at once, and
/// `/healthz` says 503 ([`Host::notice_silence`]). Without it a database cut off by a firewall that drops packets
/// was noticed only when the connection's TCP_USER_TIMEOUT ended it (`NET_TIMEOUT`, 5 s), and the node answered
/// nothing meanwhile (issue 36: 5.7 s). A part takes milliseconds (two waits per app, research/025), so 750 ms is
/// far above a healthy database's answer, and leaves a quarter of the 1 s target for the loop's wake (at most
/// 100 ms) and the status publish. Taking a slow database for a lost one costs little: its senders send again
/// (NOT_STORED is not final) and the turns in hand are acked as soon as their outcome comes back stored.
pub(super) const STORE_SILENT: Duration = Duration::from_millis(750);

/// Pushes one turn carries to the database at most. A push of many hands the loop 2,048 at once (src/http/
/// push_many.rs), and one transaction of 2,048 pushes took the database longer than [`STORE_SILENT`] here: the node
/// took a healthy database for a lost one and answered its pusher "maybe queued" (research/043's fleet row); the rest
/// go in the next turns, in order. The store splits a turn of pushes to many senders over two connections
/// (research/050), so 1,024 a turn are two transactions of 512 at once, whose slowest statement took 148 ms at a
/// million lines (512 were a third slower a million lines than 1,024, with no slower statement).
const PUSHES_PER_TURN: usize = 1024;

/// What a turn handed to the shared store needs once its outcome is back.
pub(super) struct SharedTurn {
    /// When it was handed to the store (`None`: finished at once, nothing handed over).
    submitted: Option<Instant>,
    /// The node core's turn, to name its flows by sender again ([`Committed::add`]).
    turn: Option<Turn>,
    senders: Arc<AllowList>,
    /// Inner outlets' batches in this turn, by destination: answered when it is finished.
    inner: Vec<(AppIndex, Arc<InnerBatch>)>,
    /// Pushes in this turn, in the order their parts carry them: answered when it is finished.
    pushes: Vec<TurnPush>,
}

impl Host {
    /// A host whose apps are stored in `turns`, a store shared with other nodes: nothing is opened under the state
    /// directory for them. Its outlets ring `outbox_wake`, and
    /// the changes it returns go to the outbox ([`Host::fleet_outlets`]), not to the sending loop.
    pub fn open_shared(
        config: &AppsConfig,
        wake: Arc<crate::common::wake::Wake>,
        outbox_wake: Arc<crate::common::wake::Wake>,
        turns: Box<dyn TurnStore + Send>,
    ) -> Result<(Self, OutletChanges), StoreError> {
        let (mut host, changes) = Self::with_stores(
            None,
            store::Stores::open_in_memory(&[])?,
            config,
            wake,
            Some(outbox_wake),
        )?;
        host.shared_connections = turns.connections();
        host.shared = Some(turns);
        host.inner_queue = Some(Arc::default());
        Ok((host, changes))
    }

    /// The outlets of `changes` as the outbox takes them: each with its key in the leases and the start this node
    /// would keep for it.
    pub fn fleet_outlets(&self, changes: OutletChanges) -> (Vec<FleetOutlet>, Vec<u64>) {
        let mut start = Vec::new();
        for (outlet, target) in changes.start {
            let config = self
                .apps
                .iter()
                .find(|a| a.config.name == outlet.app)
                .and_then(|a| {
                    let o = a.config.outlets.iter().find(|o| o.name == outlet.name)?;
                    Some((o, a.fleet_head.clone()))
                });
            let Some((config, app_head)) = config else {
                continue;
            };
            let (kind, target_words) = config.kind.target();
            let from = match config.from {
                StartFrom::First => 1,
                StartFrom::Next => 0,
            };
            // Standby until the outbox takes its lease: `pure_outlet_driving` says 1 only on the node that holds it.
            outlet.standby();
            start.push(FleetOutlet {
                key: OutletKey {
                    app: outlet.app.clone(),
                    name: outlet.name.clone(),
                },
                start: store::OutletStart {
                    name: outlet.name.clone(),
                    kind: kind.to_string(),
                    target: target_words,
                    flow: config.kind.far_flow_key(),
                    start: from,
                },
                outlet,
                target,
                app_head,
            });
        }
        (start, changes.stop)
    }

    /// The inner outlets in force, as the outbox drives them (each sharing with the host how far its destination
    /// holds it).
    pub fn fleet_inner(&self) -> Vec<FleetInner> {
        self.inner
            .iter()
            .map(|i| FleetInner {
                key: OutletKey {
                    app: self.apps[i.source as usize].config.name.clone(),
                    name: i.name.clone(),
                },
                dest: self.apps[i.dest as usize].config.name.clone(),
                source_name: i.source_name.clone(),
                heard: i.fleet_heard.clone(),
                app_head: self.apps[i.source as usize].fleet_head.clone(),
            })
            .collect()
    }

    /// Where the outbox puts inner batches for the next turn, on a shared store.
    pub fn inner_queue(&self) -> Option<Arc<InnerQueue>> {
        self.inner_queue.clone()
    }

    /// The outbox's wake, on a shared store.
    pub fn outbox_wake(&self) -> Option<Arc<crate::common::wake::Wake>> {
        self.outbox_wake.clone()
    }

    /// The inner outlets' batches the outbox queued, as forwarded pieces of their destinations' parts (a part made
    /// for a destination that has none in this turn); a destination that takes no input now answers its batch at
    /// once, and the outbox reads it again later.
    fn take_inner_batches(&mut self, parts: &mut Vec<AppTurn>) -> Vec<(AppIndex, Arc<InnerBatch>)> {
        let Some(queue) = &self.inner_queue else {
            return Vec::new();
        };
        let batches: Vec<Arc<InnerBatch>> = queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
            .collect();
        let mut taken = Vec::new();
        for batch in batches {
            let Some(d) = self.apps.iter().position(|a| a.config.name == batch.dest) else {
                batch.answer(Err(format!("no app {} on this node", batch.dest)));
                continue;
            };
            let app = &self.apps[d];
            if app.failure.is_some() || app.lag_paused {
                batch.answer(Err(format!("app {} takes no input now", batch.dest)));
                continue;
            }
            let dest = d as AppIndex;
            let at = match parts.iter().position(|p| p.app == dest) {
                Some(at) => at,
                None => {
                    parts.push(AppTurn {
                        app: dest,
                        ..AppTurn::default()
                    });
                    parts.len() - 1
                }
            };
            for chunk in batch.take_chunks() {
                let count = chunk.count;
                let forwarded = super::as_forwarded(chunk, count);
                parts[at].pieces.push(OwnedPiece {
                    source: batch.source_name.clone(),
                    first_seq: forwarded.pos,
                    count: forwarded.count,
                    format: RecordFormat::Forwarded,
                    records: forwarded.body,
                });
            }
            taken.push((dest, batch));
        }
        taken
    }

    /// The pushes taken since the last turn, at most [`PUSHES_PER_TURN`], each added to its app's part (a part made
    /// for an app that has none in this turn); a push whose app cannot store now is answered at once. The rest wait
    /// for the next turns, in order.
    fn take_pushes(&mut self, parts: &mut Vec<AppTurn>) -> Vec<TurnPush> {
        let mut taken = Vec::new();
        let rest = self
            .turn_pushes
            .split_off(self.turn_pushes.len().min(PUSHES_PER_TURN));
        for mut p in std::mem::replace(&mut self.turn_pushes, rest) {
            let a = &self.apps[p.app as usize];
            if let Some(f) = &a.failure {
                let words = format!(
                    "app {} cannot store now ({}): nothing was queued; push again once it stores",
                    a.config.name,
                    f.words()
                );
                p.unavailable(words);
                continue;
            }
            let at = match parts.iter().position(|part| part.app == p.app) {
                Some(at) => at,
                None => {
                    parts.push(AppTurn {
                        app: p.app,
                        ..AppTurn::default()
                    });
                    parts.len() - 1
                }
            };
            parts[at].pushes.extend(p.take());
            taken.push(p);
        }
        taken
    }

    /// Pushes other nodes of the fleet committed: a session of their sender here that listens on the app reads
    /// what waits in the next turn. The sender is found by its key (a binary search), and only if its name here is
    /// the one the push named.
    pub(super) fn down_notices(&mut self, notices: Vec<DownNotice>, node: &mut Node) {
        if notices.is_empty() {
            return;
        }
        let now = Instant::now();
        for notice in notices {
            let senders = node.senders();
            let Some(sender) = senders.find(&notice.key) else {
                continue;
            };
            if senders.name(sender) != notice.sender || notice.app as usize >= self.apps.len() {
                continue;
            }
            node.downlink_queued(now, sender, notice.app);
        }
    }

    /// The shared store made a new connection: every failed app is probed with the next turn, rather than at its
    /// next retry (a database back after a cut serves again within a round trip or two).
    pub(super) fn probe_now(&mut self, now: Instant) {
        for app in &mut self.apps {
            if let Some(f) = &mut app.failure {
                f.retry_at = now;
                f.backoff = super::RETRY_FIRST;
            }
        }
    }

    /// Connections the shared store has made so far ([`TurnStore::connections`]); `None` on a host of its own.
    pub fn store_connections(&self) -> Option<u64> {
        self.shared.as_ref().map(|s| s.connections())
    }

    /// Whether the apps are stored in a store shared with other nodes ([`Host::open_shared`]).
    pub fn is_shared(&self) -> bool {
        self.shared.is_some()
    }

    /// A turn on the shared store: the node core's records as owned parts, one per app that can store, and a probe
    /// for each failed app whose delay is up (module docs). Finished when the outcome is back.
    pub(super) fn turn_shared(&mut self, node: &mut Node, now: Instant) -> TurnReport {
        if !self.can_take_turn() && !node.turn_is_full() {
            // The store is behind: the node core's turn stays with it until an outcome comes back, rather than the
            // loop waiting on the database. A full one is taken all the same: it filled within a batch of
            // datagrams already read (the loop starts none while the store is behind and the turn full), and a
            // datagram handled into a full turn would lose its records to the turn's bound.
            return TurnReport::default();
        }
        let turn = node.take_turn();
        let senders = node.senders().clone();
        let n = self.apps.len();
        let mut parts: Vec<AppTurn> = Vec::new();
        if let Some(t) = &turn {
            let fetches = store::fetches_of_turn(t, &senders, n);
            for (i, (pieces, fetches)) in store::pieces_of_turn(t, &senders, n)
                .into_iter()
                .zip(fetches)
                .enumerate()
            {
                if (pieces.is_empty() && fetches.is_empty()) || self.apps[i].failure.is_some() {
                    continue;
                }
                parts.push(AppTurn {
                    app: i as AppIndex,
                    pieces: pieces.iter().map(OwnedPiece::from_piece).collect(),
                    fetches: fetches.iter().map(OwnedFetch::from_fetch).collect(),
                    ..AppTurn::default()
                });
            }
        }
        let pushes = self.take_pushes(&mut parts);
        let inner = self.take_inner_batches(&mut parts);
        for (i, app) in self.apps.iter_mut().enumerate() {
            if let Some(f) = &mut app.failure
                && now >= f.retry_at
            {
                // Not again until this probe's outcome says (finish_shared sets the next delay).
                f.retry_at = now + Duration::from_secs(3600);
                parts.push(AppTurn {
                    app: i as AppIndex,
                    ..AppTurn::default()
                });
            }
        }
        if parts.is_empty()
            && self.unsynced.is_empty()
            && now.saturating_duration_since(self.shared_heard) >= IDLE_PROBE
        {
            // An idle node hears of its database only through turns: without these probes `/healthz` said ok, and a
            // balancer kept sending it senders, for as long as none sent (an outside audit: 40 s on a stopped
            // database). Each app that stores is probed as a failed one is; a failure stops it, a silence stops
            // every app (STORE_SILENT).
            for (i, app) in self.apps.iter().enumerate() {
                if app.failure.is_none() {
                    parts.push(AppTurn {
                        app: i as AppIndex,
                        ..AppTurn::default()
                    });
                }
            }
            self.shared_heard = now;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let unsynced = Unsynced {
            seq,
            turn: turn.as_ref().map(|t| t.id),
            parts: Vec::new(),
            pushes: Vec::new(),
            pushed: Vec::new(),
            shared: Some(SharedTurn {
                submitted: None,
                turn,
                senders,
                inner,
                pushes,
            }),
        };
        let shared = self.shared.as_mut().expect("a shared host");
        if parts.is_empty() && self.unsynced.is_empty() {
            // Nothing to store and nothing earlier waits: finished now (its LISTENs read nothing).
            self.finish_shared(unsynced, Vec::new(), Vec::new(), node, now);
        } else {
            shared.submit(seq, parts);
            let mut unsynced = unsynced;
            if let Some(s) = unsynced.shared.as_mut() {
                s.submitted = Some(now);
            }
            self.unsynced.push_back(unsynced);
        }
        TurnReport {
            more: !self.turn_pushes.is_empty(),
            ..TurnReport::default()
        }
    }

    /// Finishes the turns whose outcome is back, in order.
    pub(super) fn finish_outcomes(&mut self, done: Vec<TurnOutcome>, node: &mut Node) {
        let now = Instant::now();
        if !done.is_empty() {
            self.shared_heard = now;
        }
        for outcome in done {
            let Some(unsynced) = self.unsynced.pop_front() else {
                break;
            };
            debug_assert_eq!(unsynced.seq, outcome.seq, "outcomes come in order");
            self.finish_shared(unsynced, outcome.apps, outcome.pushes, node, now);
        }
    }

    /// One turn's outcome: failed apps stop (or stay stopped), probes that came back stored let theirs go on, and
    /// the node core learns what was stored, so it acks exactly that.
    fn finish_shared(
        &mut self,
        mut unsynced: Unsynced,
        apps: Vec<(AppIndex, Result<Applied, Arc<StoreError>>)>,
        pushed: Vec<(AppIndex, Vec<PushOutcome>)>,
        node: &mut Node,
        now: Instant,
    ) {
        let Some(SharedTurn {
            turn,
            senders,
            inner,
            pushes,
            ..
        }) = unsynced.shared.take()
        else {
            return;
        };
        self.answer_pushes(pushes, pushed, node, now);
        for (dest, batch) in &inner {
            let answer = match apps.iter().find(|(a, _)| a == dest) {
                Some((_, Ok(applied))) => {
                    match applied.heard.iter().find(|(n, _)| *n == batch.source_name) {
                        Some((_, h)) => Ok(*h),
                        None => Err("its destination's part did not name it".to_string()),
                    }
                }
                Some((_, Err(e))) => Err(e.to_string()),
                None => Err("its destination's part was not applied".to_string()),
            };
            if let Ok(h) = answer {
                for x in self
                    .inner
                    .iter_mut()
                    .filter(|x| x.dest == *dest && x.source_name == batch.source_name)
                {
                    x.heard = Some(x.heard.unwrap_or(0).max(h));
                }
            }
            batch.answer(answer);
        }
        let mut parts = Vec::new();
        for (app, result) in apps {
            let i = app as usize;
            match result {
                Ok(applied) => {
                    let a = &mut self.apps[i];
                    if let Some(f) = a.failure.take() {
                        tracing::info!(
                            "app {} can store again (it could not for {:.1} s)",
                            a.config.name,
                            now.saturating_duration_since(f.since).as_secs_f64()
                        );
                        node.set_app_paused(app, a.lag_paused);
                        node.set_app_cannot_store(app, false);
                    }
                    a.down_delivered += applied.down.delivered;
                    a.down_expired += applied.down.expired;
                    if let Some(w) = applied.down.waiting {
                        a.down_waiting_shared = w;
                    }
                    if applied.stored > 0
                        && let Some(w) = &self.outbox_wake
                    {
                        // The outlets this node drives may have more to read: at once, not at the next poll.
                        w.wake();
                    }
                    let mut outcome = Committed::default();
                    if let Some(t) = &turn {
                        outcome.add(app, &applied, t, &senders);
                    }
                    parts.push(super::CommittedPart {
                        app,
                        outcome,
                        new_chunks: Vec::new(),
                        head: applied.head.max(self.durable[i]),
                        stored: applied.stored,
                    });
                }
                Err(e) => self.shared_failed(app, &e, node, now),
            }
        }
        unsynced.parts = parts;
        self.finish(unsynced, &[], node, now);
    }

    /// The oldest turn handed to the store has had no outcome for [`STORE_SILENT`], and no other outcome came
    /// meanwhile: the database is taken as out of reach. Every app that stores stops as if its part had failed
    /// (NOT_STORED to its senders from now on, `/healthz` 503 naming the database, probes at its retries), without
    /// waiting for the network's timeouts. The turns in hand are not touched: their records stay unacknowledged
    /// until their outcome comes (stored: acked, and the apps store again; failed: never acked), since a COMMIT
    /// may have reached the database before the cut (docs/scale-out.md, "When the database is unreachable").
    pub(super) fn notice_silence(&mut self, node: &mut Node, now: Instant) {
        let Some(submitted) = self
            .unsynced
            .front()
            .and_then(|u| u.shared.as_ref())
            .and_then(|s| s.submitted)
        else {
            return;
        };
        let waited = now.saturating_duration_since(submitted.max(self.shared_heard));
        if waited < STORE_SILENT {
            return;
        }
        let error = StoreError::DatabaseLate { waited };
        for app in 0..self.apps.len() as AppIndex {
            if self.apps[app as usize].failure.is_none() {
                self.database_failed(app, &error, node, now);
            }
        }
        // The part waiting now is given up with its connection, and a new one tried at once: a connection cut off
        // would otherwise hold the store until its TCP timeout, and the node would serve again that long after
        // the database is back. Measured again from now: a part after it that waits as long is given up too.
        if let Some(shared) = self.shared.as_mut() {
            shared.give_up_waiting();
        }
        self.shared_heard = now;
    }

    /// Whether every app is stopped for its database (out of reach, silent, refusing): the turns then carry no
    /// records, only probes, and one that filled before the apps stopped is taken past [`super::MAX_UNSYNCED`], so
    /// that the loop goes on reading and telling senders NOT_STORED ([`Host::can_take_turn`]).
    pub(super) fn database_out_of_reach(&self) -> bool {
        !self.apps.is_empty()
            && self
                .apps
                .iter()
                .all(|a| a.failure.as_ref().is_some_and(|f| f.database))
    }

    /// An app's part failed on the shared store: it stops taking input; the first reason is logged and kept, a
    /// later probe's reason is logged only when it says something new.
    fn shared_failed(&mut self, app: AppIndex, error: &StoreError, node: &mut Node, now: Instant) {
        self.apps[app as usize].turns_failed += 1;
        self.database_failed(app, error, node, now);
    }

    /// An app cannot store on the shared store (its part failed, or the database is silent): it stops taking
    /// input; the first reason is logged and kept, a later one is logged only when it says something new.
    fn database_failed(
        &mut self,
        app: AppIndex,
        error: &StoreError,
        node: &mut Node,
        now: Instant,
    ) {
        let i = app as usize;
        let words = error.to_string();
        // What the status page calls "without its database" (docs/operations.md, `issues`).
        let database = matches!(
            error,
            StoreError::Database { .. }
                | StoreError::DatabaseDown { .. }
                | StoreError::DatabaseRefused { .. }
                | StoreError::DatabaseSilent { .. }
                | StoreError::DatabaseLate { .. }
                | StoreError::StoreThreadGone { .. }
        );
        let a = &mut self.apps[i];
        match &mut a.failure {
            None => {
                tracing::error!(
                    app = %a.config.name,
                    "app {} cannot store, its senders get no acks until it can: {words}",
                    a.config.name
                );
                a.failure = Some(Failure {
                    database,
                    ..Failure::new(words, now)
                });
            }
            Some(f) => {
                f.database = database;
                if f.logged.as_deref() != Some(words.as_str()) && words != f.why {
                    tracing::warn!("app {} still cannot store: {words}", a.config.name);
                    f.logged = Some(words.clone());
                }
                f.last_try = Some(words);
                f.backoff = (f.backoff * 2).min(RETRY_MAX);
                f.retry_at = now + f.backoff;
            }
        }
        node.set_app_paused(app, true);
        node.set_app_cannot_store(app, true);
    }
}
