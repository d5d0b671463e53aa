//! The outbox of a fleet's node: which of its link, wire and webhook outlets this node drives, and their feed from
//! the fleet's database (docs/scale-out.md, "Outlets of a fleet").
//!
//! On a fleet every node has every outlet of its apps file, but one node at a time drives each: the holder of its
//! lease. The `pure-outbox` thread owns the node's [`Leases`] and one connection of its own ([`OutboxConn`], made by
//! the store: this thread never knows which engine is behind it): it
//! renews, and when the leases say so it starts an outlet on the sending loop ([`Commander`]) as at a restart of
//! one node (links and wires ask their far side where it stands; webhooks resend from the acknowledged position)
//! or stops it there. It feeds the outlets it drives from the database, what every node of the fleet stored, by
//! position ([`OutboxConn::read_from`]), and writes what their far sides acknowledged with each renewal. The receive
//! loop never waits on any of it; its lag budgets read the outlets' acknowledged positions, which this thread keeps
//! for the outlets other nodes drive too (from each renewal's answer).
//!
//! The thread sleeps on an eventfd ([`Wake`]) that the outlets ring (acknowledgements made room, the far side said
//! where to resume) and that the host rings when a turn of this node stored records, and wakes at least every
//! [`FEED_AGAIN`] while it drives an outlet (records other nodes stored) and when its leases want it. Every wait on
//! the database is bounded by the moment the held leases run out, so an outlet is stopped on time even when the
//! database does not answer.

use std::collections::{BTreeSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::common::wake::Wake;
use crate::outlets::{Outlet, Target};
use crate::sending::Commander;
use crate::store::engine::{OutboxConn, OutboxConnector, SHARED_WAIT as NET_TIMEOUT};
use crate::store::lease::{LeaseEvent, Leases, OutletKey, RENEW_EVERY};
use crate::store::{Chunk, OutletStart};

/// How soon a caught-up outlet's feed reads again for records other nodes stored.
pub const FEED_AGAIN: Duration = Duration::from_millis(200);

/// Records read for an outlet at a time.
const FEED_RECORDS: u64 = 16_384;

/// Records, and bytes, an inner outlet hands its destination at a time (one turn's part).
const INNER_RECORDS: u64 = 4_096;
const INNER_BYTES: usize = 4 << 20;

/// An inner outlet of a fleet's node (records of app `key.app` into app `dest`), as the host made it.
pub struct FleetInner {
    pub key: OutletKey,
    pub dest: String,
    /// `app/SOURCE`: the source's name in the destination.
    pub source_name: String,
    /// How far the destination holds the source, fleet-wide, as this node last learned it: the host's lag
    /// budgets and figures read it.
    pub heard: Arc<AtomicU64>,
    /// The source app's head as the database last said (0 until a renewal said): [`FleetOutlet::app_head`].
    pub app_head: Arc<AtomicU64>,
}

/// Records of an inner outlet's source for its destination, read by the outbox from the database and applied by
/// the host in its next turn, as forwarded records of `app/SOURCE` numbered by position: the destination's heard
/// sequence of that source, updated conditionally in the turn's transaction, keeps each once whichever node
/// applies them.
pub struct InnerBatch {
    pub dest: String,
    pub source_name: String,
    chunks: Mutex<Vec<Chunk>>,
    outcome: Mutex<Option<Result<u64, String>>>,
    wake: Arc<Wake>,
}

impl InnerBatch {
    /// The chunks, once (the host takes them into its turn).
    pub fn take_chunks(&self) -> Vec<Chunk> {
        std::mem::take(&mut *self.chunks.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The turn that carried the batch is finished: the destination's heard sequence of the source after it, or
    /// why it was not applied. Wakes the outbox.
    pub fn answer(&self, outcome: Result<u64, String>) {
        *self.outcome.lock().unwrap_or_else(|e| e.into_inner()) = Some(outcome);
        self.wake.wake();
    }

    fn outcome(&self) -> Option<Result<u64, String>> {
        self.outcome
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// Inner batches waiting for the host's next turn.
pub type InnerQueue = Mutex<VecDeque<Arc<InnerBatch>>>;

/// One outlet of a fleet's node, as the host made it.
pub struct FleetOutlet {
    pub key: OutletKey,
    pub outlet: Arc<Outlet>,
    pub target: Target,
    /// Its start as this node would keep it if it is the first to take the lease: `start` 1 for `from = "first"`,
    /// 0 for the app's head at that moment (`from = "next"`).
    pub start: OutletStart,
    /// Its app's head as the database last said, at most a renewal old (0 until one said), shared with the host:
    /// what every node of the fleet stored, which the outlet's lag counts from on a node that stored none of it.
    pub app_head: Arc<AtomicU64>,
}

/// Where the outbox connects, as whom, and the sending loop it starts outlets on.
pub struct OutboxSettings {
    /// Makes the outbox's connection to the fleet's store (`StoreChoice::outbox_connector`).
    pub connect: OutboxConnector,
    /// This node's id in the leases: its host name and state directory (docs/scale-out.md), for the log.
    pub node_id: String,
    pub sending: Commander,
    /// Where inner batches go, and the receive loop's wake that says one is there.
    pub inner_queue: Arc<InnerQueue>,
    pub host_wake: Arc<Wake>,
}

enum Command {
    Change {
        start: Vec<FleetOutlet>,
        stop: Vec<u64>,
    },
    /// Every inner outlet of the apps in force (at start and after each reload).
    Inner(Vec<FleetInner>),
}

/// The running outbox thread.
pub struct Outbox {
    commands: mpsc::Sender<Command>,
    wake: Arc<Wake>,
    stopping: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Outbox {
    /// Starts the thread; `wake` is the one the outlets were made with ([`super::Host::outbox_wake`]).
    pub fn start(settings: OutboxSettings, wake: Arc<Wake>) -> std::io::Result<Self> {
        let (commands, rx) = mpsc::channel();
        let stopping = Arc::new(AtomicBool::new(false));
        let (w, s) = (wake.clone(), stopping.clone());
        let thread = std::thread::Builder::new()
            .name("pure-outbox".into())
            .spawn(move || Driver::new(settings, w.clone()).run(&w, &rx, &s))?;
        Ok(Outbox {
            commands,
            wake,
            stopping,
            thread: Some(thread),
        })
    }

    /// Outlets made by a reload (or at start), and the ids of those it removed.
    pub fn change(&self, start: Vec<FleetOutlet>, stop: Vec<u64>) {
        let _ = self.commands.send(Command::Change { start, stop });
        self.wake.wake();
    }

    /// The inner outlets in force now, all of them.
    pub fn set_inner(&self, inner: Vec<FleetInner>) {
        let _ = self.commands.send(Command::Inner(inner));
        self.wake.wake();
    }
}

impl Drop for Outbox {
    /// Stops the outlets this node drives and gives their leases back, so another node takes them at its next
    /// renewal rather than when they expire.
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::Release);
        self.wake.wake();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct Entry {
    f: FleetOutlet,
    /// Started on the sending loop.
    running: bool,
    /// The next position to feed; `None` until the outlet says where its far side stands.
    fed_next: Option<u64>,
    /// Its start is known from the database (the outlet's base is set).
    start_kept: bool,
    /// No try to start it before this (the last failed).
    try_after: Instant,
}

struct InnerEntry {
    f: FleetInner,
    /// The destination's heard sequence of the source, as the last batch's outcome or a read said.
    known: Option<u64>,
    /// The batch handed to the host and not yet answered.
    in_flight: Option<Arc<InnerBatch>>,
    try_after: Instant,
}

struct Driver {
    settings: OutboxSettings,
    wake: Arc<Wake>,
    leases: Leases,
    entries: Vec<Entry>,
    inner: Vec<InnerEntry>,
    conn: Option<Box<dyn OutboxConn + Send>>,
    connect_after: Instant,
    /// The last problem with the database logged, so a lasting one is logged once.
    told: Option<String>,
}

impl Driver {
    fn new(settings: OutboxSettings, wake: Arc<Wake>) -> Self {
        let now = Instant::now();
        tracing::info!(
            "outlets of a fleet: this node asks for their leases as {:?}",
            settings.node_id
        );
        Driver {
            settings,
            wake,
            leases: Leases::new(now),
            entries: Vec::new(),
            inner: Vec::new(),
            conn: None,
            connect_after: now,
            told: None,
        }
    }

    fn run(mut self, wake: &Wake, rx: &mpsc::Receiver<Command>, stopping: &AtomicBool) {
        loop {
            wake.clear();
            if stopping.load(Ordering::Acquire) {
                self.stop();
                return;
            }
            let mut changed = false;
            while let Ok(command) = rx.try_recv() {
                match command {
                    Command::Change { start, stop } => self.change(start, stop),
                    Command::Inner(inner) => self.set_inner(inner),
                }
                changed = true;
            }
            let now = Instant::now();
            if changed {
                let keys: Vec<OutletKey> = self
                    .entries
                    .iter()
                    .map(|e| e.f.key.clone())
                    .chain(self.inner.iter().map(|e| e.f.key.clone()))
                    .collect();
                let events = self.leases.set_wanted(keys, now);
                self.apply(events);
            }
            let events = self.leases.handle_timeout(now);
            self.apply(events);
            self.renew();
            self.start_held();
            let more = self.feed();
            self.drive_inner();
            let now = Instant::now();
            let mut sleep = self
                .leases
                .poll_timeout()
                .map_or(RENEW_EVERY, |t| t.saturating_duration_since(now));
            if self.entries.iter().any(|e| e.running)
                || self.inner.iter().any(|e| self.leases.holds(&e.f.key))
            {
                sleep = sleep.min(FEED_AGAIN);
            }
            if self
                .entries
                .iter()
                .any(|e| !e.running && self.leases.holds(&e.f.key))
            {
                sleep = sleep.min(Duration::from_secs(1));
            }
            if more {
                sleep = Duration::ZERO;
            }
            poll_for(wake, sleep);
        }
    }

    fn change(&mut self, start: Vec<FleetOutlet>, stop: Vec<u64>) {
        let gone: BTreeSet<u64> = stop.into_iter().collect();
        for e in self
            .entries
            .iter_mut()
            .filter(|e| gone.contains(&e.f.outlet.id))
        {
            if e.running {
                self.settings.sending.stop_outlet(e.f.outlet.id);
                e.running = false;
            }
        }
        self.entries.retain(|e| !gone.contains(&e.f.outlet.id));
        let now = Instant::now();
        for f in start {
            f.outlet.standby();
            self.entries.push(Entry {
                f,
                running: false,
                fed_next: None,
                start_kept: false,
                try_after: now,
            });
        }
    }

    fn set_inner(&mut self, inner: Vec<FleetInner>) {
        let now = Instant::now();
        let mut before = std::mem::take(&mut self.inner);
        for f in inner {
            let kept = before
                .iter()
                .position(|e| e.f.key == f.key && e.f.dest == f.dest)
                .map(|at| before.swap_remove(at));
            self.inner.push(match kept {
                Some(e) => InnerEntry { f, ..e },
                None => InnerEntry {
                    f,
                    known: None,
                    in_flight: None,
                    try_after: now,
                },
            });
        }
    }

    /// Hands the host the next batch of each inner outlet this node drives, one batch in flight per outlet, from
    /// where the destination holds its source.
    fn drive_inner(&mut self) {
        let now = Instant::now();
        for i in 0..self.inner.len() {
            let e = &mut self.inner[i];
            if now < e.try_after || !self.leases.holds(&e.f.key) {
                continue;
            }
            if let Some(b) = &e.in_flight {
                match b.outcome() {
                    None => continue,
                    Some(Ok(heard)) => {
                        e.known = Some(heard);
                        e.f.heard.fetch_max(heard, Ordering::AcqRel);
                        self.leases.progress(&e.f.key, heard);
                    }
                    Some(Err(why)) => {
                        tracing::debug!("inner outlet {}: batch not applied: {why}", e.f.key.name);
                        e.known = None;
                        e.try_after = now + FEED_AGAIN;
                    }
                }
                e.in_flight = None;
                continue;
            }
            let (source, dest, name) = (
                e.f.key.app.clone(),
                e.f.dest.clone(),
                e.f.source_name.clone(),
            );
            let known = e.known;
            let Some(conn) = self.conn() else { break };
            let heard = match known {
                Some(h) => Ok(h),
                None => conn.heard_of(&dest, &name),
            };
            let read = heard.and_then(|h| {
                conn.read_from(&source, h + 1, INNER_RECORDS, INNER_BYTES)
                    .map(|c| (h, c))
            });
            let e = &mut self.inner[i];
            match read {
                Ok((heard, chunks)) => {
                    e.known = Some(heard);
                    e.f.heard.fetch_max(heard, Ordering::AcqRel);
                    if chunks.is_empty() {
                        continue;
                    }
                    let batch = Arc::new(InnerBatch {
                        dest,
                        source_name: name,
                        chunks: Mutex::new(chunks),
                        outcome: Mutex::new(None),
                        wake: self.wake.clone(),
                    });
                    self.settings
                        .inner_queue
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push_back(batch.clone());
                    self.settings.host_wake.wake();
                    e.in_flight = Some(batch);
                }
                Err(err) => {
                    e.try_after = now + Duration::from_secs(1);
                    let what = format!(
                        "inner outlet {}/{}: cannot read: {err}",
                        source, e.f.key.name
                    );
                    self.conn = None;
                    self.tell(what);
                }
            }
        }
    }

    /// How long a wait on the database may last now: until the held leases end, and never past [`NET_TIMEOUT`].
    fn bound(&self) -> Duration {
        let now = Instant::now();
        self.leases
            .hold_ends()
            .map_or(NET_TIMEOUT, |t| t.saturating_duration_since(now))
            .min(NET_TIMEOUT)
    }

    /// The connection, made now if there is none and its delay is up.
    fn conn(&mut self) -> Option<&mut (dyn OutboxConn + Send + 'static)> {
        let within = self.bound();
        if self.conn.is_none() && Instant::now() >= self.connect_after && !within.is_zero() {
            match (self.settings.connect)(within) {
                Ok(c) => self.conn = Some(c),
                Err(e) => {
                    self.connect_after = Instant::now() + RENEW_EVERY;
                    self.tell(format!("cannot connect for the outlets' leases: {e}"));
                }
            }
        }
        let within = self.bound();
        let c = self.conn.as_deref_mut()?;
        c.within(Some(within));
        Some(c)
    }

    /// Logs a problem with the database once while it lasts.
    fn tell(&mut self, what: String) {
        if self.told.as_deref() != Some(what.as_str()) {
            tracing::warn!(
                "outlets of a fleet: {what}; the outlets this node drives stop 7 s after its last good renewal, \
                 and another node takes them over once their lease expires"
            );
            self.told = Some(what);
        }
    }

    fn renew(&mut self) {
        for e in self.entries.iter().filter(|e| e.running) {
            self.leases.progress(&e.f.key, e.f.outlet.acked());
        }
        for e in &self.inner {
            self.leases
                .progress(&e.f.key, e.f.heard.load(Ordering::Acquire));
        }
        let Some(renewal) = self.leases.poll_renewal(Instant::now()) else {
            return;
        };
        let Some(conn) = self.conn() else {
            self.leases.renewal_failed(renewal.sent_at);
            return;
        };
        match conn.renew(&renewal) {
            Ok((held, all, heads)) => {
                if self.told.take().is_some() {
                    tracing::info!("outlets of a fleet: leases renewed again");
                }
                let apps_heads = self.entries.iter().map(|e| (&e.f.key, &e.f.app_head));
                let inner_heads = self.inner.iter().map(|e| (&e.f.key, &e.f.app_head));
                for (key, head) in apps_heads.chain(inner_heads) {
                    if let Some((_, h)) = heads.iter().find(|(app, _)| *app == key.app) {
                        head.fetch_max(*h, Ordering::AcqRel);
                    }
                }
                let events = self
                    .leases
                    .renewed(renewal.sent_at, held, all, Instant::now());
                self.apply(events);
            }
            Err(e) => {
                self.leases.renewal_failed(renewal.sent_at);
                self.conn = None;
                self.tell(format!("cannot renew the outlets' leases: {e}"));
            }
        }
        // What other nodes' far sides acknowledged, for this node's lag budgets.
        for e in self.entries.iter().filter(|e| !e.running) {
            if let Some(a) = self.leases.fleet_acked(&e.f.key) {
                e.f.outlet.know_acked(a);
            }
        }
        for e in &self.inner {
            if let Some(a) = self.leases.fleet_acked(&e.f.key) {
                e.f.heard.fetch_max(a, Ordering::AcqRel);
            }
        }
    }

    fn apply(&mut self, events: Vec<LeaseEvent>) {
        for event in events {
            match event {
                // Started by `start_held`, which also retries a start that fails.
                LeaseEvent::Take { outlet, acked } => {
                    if let Some(e) = self.entries.iter_mut().find(|e| e.f.key == outlet) {
                        e.f.outlet.know_acked(acked);
                        e.try_after = Instant::now();
                    }
                    if let Some(e) = self.inner.iter_mut().find(|e| e.f.key == outlet) {
                        e.known = None;
                        e.try_after = Instant::now();
                        tracing::info!(
                            "inner outlet {}/{}: this node drives it now (into app {})",
                            outlet.app,
                            outlet.name,
                            e.f.dest
                        );
                    }
                }
                LeaseEvent::Lose { outlet } => {
                    if let Some(e) = self.inner.iter_mut().find(|e| e.f.key == outlet) {
                        // A batch in flight may still be applied: the destination's heard sequence keeps it once.
                        e.in_flight = None;
                        e.known = None;
                        tracing::info!(
                            "inner outlet {}/{}: its lease is lost; another node of the fleet drives it now",
                            outlet.app,
                            outlet.name
                        );
                        continue;
                    }
                    let Some(e) = self
                        .entries
                        .iter_mut()
                        .find(|e| e.f.key == outlet && e.running)
                    else {
                        continue;
                    };
                    self.settings.sending.stop_outlet(e.f.outlet.id);
                    e.running = false;
                    e.fed_next = None;
                    e.f.outlet.reset();
                    e.f.outlet.standby();
                    tracing::info!(
                        "outlet {}/{}: its lease is lost; another node of the fleet drives it now",
                        outlet.app,
                        outlet.name
                    );
                }
            }
        }
    }

    /// Starts on the sending loop every outlet whose lease this node holds and that does not run yet, once its
    /// start is known.
    fn start_held(&mut self) {
        let now = Instant::now();
        for i in 0..self.entries.len() {
            let e = &self.entries[i];
            if e.running || now < e.try_after || !self.leases.holds(&e.f.key) {
                continue;
            }
            if !e.start_kept {
                let (app, wanted) = (e.f.key.app.clone(), e.f.start.clone());
                let Some(conn) = self.conn() else {
                    self.entries[i].try_after = now + Duration::from_secs(1);
                    continue;
                };
                let kept = conn.start_of(&app, &wanted);
                let e = &mut self.entries[i];
                match kept {
                    Ok(row) if row.kind == wanted.kind && row.target == wanted.target => {
                        e.f.outlet.set_base(row.start - 1);
                        e.start_kept = true;
                    }
                    Ok(row) => {
                        e.f.outlet.error(
                            "far_state",
                            format!(
                                "the fleet's database keeps this outlet's start (position {}) for a {} to {}, not \
                                 this {} to {}: every node of a fleet needs the same outlets; rename the outlet \
                                 in the apps file to send from a new start",
                                row.start, row.kind, row.target, wanted.kind, wanted.target
                            ),
                        );
                        e.try_after = now + Duration::from_secs(60);
                        continue;
                    }
                    Err(err) => {
                        e.f.outlet
                            .error("store", format!("cannot read its start: {err}"));
                        e.try_after = now + Duration::from_secs(1);
                        self.conn = None;
                        continue;
                    }
                }
            }
            let e = &mut self.entries[i];
            let o = &e.f.outlet;
            o.reset();
            o.know_acked(o.base());
            o.know_acked(self.leases.known_acked(&e.f.key));
            o.set_status("starting");
            self.settings
                .sending
                .start_outlet(o.clone(), e.f.target.clone());
            e.running = true;
            e.fed_next = None;
            tracing::info!(
                "outlet {}/{}: this node drives it now (its far side has position {} and before)",
                e.f.key.app,
                e.f.key.name,
                o.acked()
            );
        }
    }

    /// Feeds the outlets this node drives from the database, each as far as its room; whether one was fed (it
    /// may take more at once).
    fn feed(&mut self) -> bool {
        let mut more = false;
        for i in 0..self.entries.len() {
            let e = &mut self.entries[i];
            if !e.running {
                continue;
            }
            if let Some(from) = e.f.outlet.take_restart() {
                e.fed_next = Some(from);
            }
            let Some(next) = e.fed_next else { continue };
            let room = e.f.outlet.room();
            if room == 0 {
                continue;
            }
            let app = e.f.key.app.clone();
            let Some(conn) = self.conn() else { break };
            let read = conn.read_from(&app, next, FEED_RECORDS, room);
            let e = &mut self.entries[i];
            match read {
                Ok(chunks) => {
                    let (fed, at) = crate::outlets::fill(room, chunks.into_iter().map(Arc::new));
                    if let Some(at) = at {
                        e.fed_next = Some(at);
                        e.f.outlet.feed(fed);
                        e.f.outlet.push();
                        more = true;
                    }
                }
                Err(err) => {
                    e.f.outlet.error(
                        "store",
                        format!("cannot read the app's records from the fleet's database: {err}"),
                    );
                    self.conn = None;
                }
            }
        }
        more
    }

    fn stop(&mut self) {
        for e in self.entries.iter().filter(|e| e.running) {
            self.settings.sending.stop_outlet(e.f.outlet.id);
            self.leases.progress(&e.f.key, e.f.outlet.acked());
        }
        let held = self.leases.held_progress();
        if held.is_empty() {
            return;
        }
        if let Some(conn) = self.conn.as_ref() {
            conn.within(Some(Duration::from_secs(2)));
            match conn.release(&held) {
                Ok(()) => tracing::info!(
                    "outlets of a fleet: {} lease{} given back",
                    held.len(),
                    if held.len() == 1 { "" } else { "s" }
                ),
                Err(e) => tracing::warn!(
                    "outlets of a fleet: cannot give the leases back ({e}); other nodes take them once they expire"
                ),
            }
        }
    }
}

/// Sleeps until `wake` is rung or `timeout` has passed.
fn poll_for(wake: &Wake, timeout: Duration) {
    let mut fds = [libc::pollfd {
        fd: wake.fd(),
        events: libc::POLLIN,
        revents: 0,
    }];
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: one pollfd of a live array; poll only writes its revents.
    unsafe { libc::poll(fds.as_mut_ptr(), 1, ms) };
}
