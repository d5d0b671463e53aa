//! Outlets: an app's outputs, and the one shape they all have (BRIEF.md, "outlet").
//!
//! To its app every outlet is the same thing: the app **feeds** it records by position (its store is the outbox,
//! docs/store.md) and **pushes** it once per turn; the outlet reports back the position its far side has
//! **acknowledged** as stored and the bytes it **holds** in memory. How the records travel is the kind's business:
//!
//! - [`link`]: sealed UDP to another node (docs/protocol.md), this node's key as the sender key;
//! - [`wire`]: the same sealed packets in HTTP/1.1 POSTs to another node's `--http-port` ([`http`] is the client);
//! - [`webhook`]: JSON batches POSTed to any HTTP(S) endpoint (at least once);
//! - inner outlets (to another app of this host) have no socket and no state here: the app host moves their records
//!   inside its turns ([`crate::apps`]).
//!
//! An [`Outlet`] is shared between two threads: the app host (the receive loop, which owns the stores) and the
//! sending loop ([`crate::sending`], which owns the sockets). Everything they exchange is in it, behind one small
//! lock or in atomics, so neither ever waits for the other's work: the host feeds chunks it already holds and
//! wakes the loop once (a [`tokio::sync::Notify`]); the loop takes them, and wakes the host through its eventfd
//! when acknowledgements have made room or when the far side said where to resume.
//!
//! Memory is bounded by the outlet's budget (`memory_bytes`): what the outlet holds plus what waits in its feed
//! (records' bytes as stored) never passes it, since the host feeds chunks only while they fit the room left and
//! cuts the one that does not; the rest of a backlog stays in the store, which is also what survives a crash.

pub mod http;
pub mod link;
pub mod webhook;
pub mod wire;

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::common::wake::Wake;
use crate::proto::crypto::PublicKeyBytes;
use crate::store::Chunk;

/// Where an outlet sends, by kind (docs/apps.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// Sealed UDP to `to` (`host:port`), whose node key is `node_key`, into its app `far_app`.
    Link {
        to: String,
        node_key: PublicKeyBytes,
        far_app: String,
    },
    /// Sealed packets in HTTP POSTs to `url`, whose node key is `node_key`, into its app `far_app`.
    Wire(wire::WireTarget),
    /// JSON batches POSTed to any HTTP(S) endpoint.
    Webhook(webhook::WebhookTarget),
}

impl Target {
    /// Where it sends, for the status page: the link's address and far app, or the URL without its query (which
    /// may carry a token).
    pub fn words(&self) -> String {
        let url = |u: &crate::common::address::HttpUrl| {
            let mut u = u.clone();
            if let Some(q) = u.path_and_query.find('?') {
                u.path_and_query.truncate(q);
                u.path_and_query.push_str("?…");
            }
            u.to_string()
        };
        match self {
            Target::Link { to, far_app, .. } => format!("udp {to}, app {far_app}"),
            Target::Wire(w) => format!("{}, app {}", url(&w.url), w.far_app),
            Target::Webhook(h) => url(&h.url),
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Target::Link { .. } => "link",
            Target::Wire(_) => "wire",
            Target::Webhook(_) => "webhook",
        }
    }
}

/// What the host has handed the outlet and the loop has not taken yet.
#[derive(Debug, Default)]
struct Feed {
    chunks: VecDeque<Arc<Chunk>>,
    bytes: usize,
    /// Bytes the loop holds (taken and not yet acknowledged), kept under the same lock as `bytes` so the host's
    /// view of the budget is never short of a batch in transit between the two.
    held: usize,
    /// Set by the loop: the position it wants next (after it learned the far side's heard sequence). The host takes
    /// it and feeds from there; the feed was emptied when it was set.
    restart_from: Option<u64>,
}

/// An outlet as both loops see it.
#[derive(Debug)]
pub struct Outlet {
    /// Unique within the process (the sending loop's handle for it).
    pub id: u64,
    pub app: String,
    pub name: String,
    pub kind: &'static str,
    /// Bytes of records this outlet may hold in memory (fed and not yet acknowledged).
    pub memory_bytes: usize,
    /// Positions before its start (docs/apps.md, `from`): a link or wire numbers its far flow `position − base`,
    /// so a far app that has heard nothing of this node starts at the outlet's start. Set before the sending loop
    /// starts the outlet (on a fleet, once the database says where it starts: [`Outlet::set_base`]).
    base: AtomicU64,
    feed: Mutex<Feed>,
    push: Notify,
    /// The far side's stored position (0 until known).
    acked: AtomicU64,
    /// Records the far side acknowledged since start, for `pure_outlet_sent_total`.
    sent: AtomicU64,
    host: Arc<Wake>,
    state: Mutex<OutletState>,
}

#[derive(Debug, Default, Clone)]
pub struct OutletState {
    /// One word for metrics and status: resolving, connecting, syncing, sending, idle, failing.
    pub status: &'static str,
    /// The last error, shown in logs and status.
    pub last_error: Option<String>,
    /// The kind of `last_error`.
    pub last_error_kind: Option<&'static str>,
    /// When the errors since the last success began.
    pub failing_since: Option<Instant>,
    /// When `status` last changed (set only on a change: a status set again keeps its time).
    pub status_since: Option<Instant>,
    /// Errors by kind (dns, tls, http, socket, refused, far_state, timeout).
    pub errors: BTreeMap<&'static str, u64>,
    last_logged: Option<Instant>,
    /// The likely cause of a silence has been told ([`Outlet::silent`]); cleared when the far side answers.
    silence_told: bool,
}

/// An error is logged at most this often per outlet: a far side that is down for an hour makes a line a minute, not
/// a line a retry. Every one is counted.
const LOG_EVERY: Duration = Duration::from_secs(60);

impl Outlet {
    /// Sets the positions before the outlet's start ([`Outlet::base`]).
    pub fn with_base(self, base: u64) -> Self {
        self.set_base(base);
        self
    }

    /// Positions before the outlet's start ([`Outlet::with_base`]).
    pub fn base(&self) -> u64 {
        self.base.load(Ordering::Acquire)
    }

    /// Sets the outlet's start while the sending loop does not run it (a fleet's node learns it from the database
    /// when it takes the outlet's lease).
    pub fn set_base(&self, base: u64) {
        self.base.store(base, Ordering::Release);
    }

    /// Learns that the far side stores everything up to `through` from elsewhere than this node's sending (a
    /// fleet's database, written by the node that drives the outlet): for lag budgets and the next start, not
    /// counted as sent.
    pub fn know_acked(&self, through: u64) {
        self.acked.fetch_max(through, Ordering::AcqRel);
    }

    /// Forgets what was fed and held, and any restart asked for: the sending loop stopped this outlet, and it
    /// starts afresh from its far side's word when it is started again (a fleet's node that lost or takes its lease).
    pub fn reset(&self) {
        let mut f = self.lock_feed();
        f.chunks.clear();
        f.bytes = 0;
        f.held = 0;
        f.restart_from = None;
    }

    /// Sets what the far side is known to have acknowledged (from the store at start): where a webhook resumes.
    pub fn with_acked(self, acked: u64) -> Self {
        self.acked.store(acked, Ordering::Release);
        self
    }

    pub fn new(
        id: u64,
        app: &str,
        name: &str,
        kind: &'static str,
        memory_bytes: usize,
        host: Arc<Wake>,
    ) -> Self {
        Outlet {
            id,
            app: app.to_string(),
            name: name.to_string(),
            kind,
            memory_bytes,
            base: AtomicU64::new(0),
            feed: Mutex::new(Feed::default()),
            push: Notify::new(),
            acked: AtomicU64::new(0),
            sent: AtomicU64::new(0),
            host,
            state: Mutex::new(OutletState {
                status: "starting",
                status_since: Some(Instant::now()),
                ..OutletState::default()
            }),
        }
    }

    fn lock_feed(&self) -> std::sync::MutexGuard<'_, Feed> {
        // A panic while holding this lock is a bug elsewhere; the feed's data is still consistent enough to go on.
        self.feed.lock().unwrap_or_else(|e| e.into_inner())
    }

    // ----- the host's side -----

    /// Where the loop wants the host to feed from, once, after the far side told it (see [`Outlet::restart_from`]).
    pub fn take_restart(&self) -> Option<u64> {
        self.lock_feed().restart_from.take()
    }

    /// Bytes the host may still feed before the outlet holds its budget.
    pub fn room(&self) -> usize {
        let f = self.lock_feed();
        self.memory_bytes.saturating_sub(f.bytes + f.held)
    }

    /// Hands chunks to the outlet (in position order, following what was fed before). Call [`Outlet::push`] once
    /// when the turn's feeding is done.
    pub fn feed(&self, chunks: impl IntoIterator<Item = Arc<Chunk>>) {
        let mut f = self.lock_feed();
        if f.restart_from.is_some() {
            // The loop has asked to start over; what the host fed from its old view is not wanted.
            return;
        }
        for c in chunks {
            f.bytes += c.body.len();
            f.chunks.push_back(c);
        }
    }

    /// Wakes the sending loop for this outlet: once per turn, never per record (BRIEF.md: wake per turn).
    pub fn push(&self) {
        self.push.notify_one();
    }

    pub fn acked(&self) -> u64 {
        self.acked.load(Ordering::Acquire)
    }

    pub fn sent_records(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// Bytes held by the outlet and waiting in its feed.
    pub fn held_bytes(&self) -> usize {
        let f = self.lock_feed();
        f.bytes + f.held
    }

    pub fn state(&self) -> OutletState {
        self.state.lock().map(|s| s.clone()).unwrap_or_default()
    }

    // ----- the sending loop's side -----

    /// Resolves when the host pushed (a push while nobody waits is kept for the next wait).
    pub async fn pushed(&self) {
        self.push.notified().await
    }

    /// Takes what the host fed; its bytes count as held until [`Outlet::release`].
    pub fn take_fed(&self) -> Vec<Arc<Chunk>> {
        let mut f = self.lock_feed();
        f.held += f.bytes;
        f.bytes = 0;
        f.chunks.drain(..).collect()
    }

    /// The loop no longer holds `bytes` (acknowledged, or dropped on a restart).
    pub fn release(&self, bytes: usize) {
        let mut f = self.lock_feed();
        f.held = f.held.saturating_sub(bytes);
    }

    /// The far side stores everything before `next`: feed from there. Empties the feed and wakes the host.
    pub fn restart_from(&self, next: u64) {
        {
            let mut f = self.lock_feed();
            f.chunks.clear();
            f.bytes = 0;
            f.held = 0;
            f.restart_from = Some(next);
        }
        self.acked
            .fetch_max(next.saturating_sub(1), Ordering::AcqRel);
        self.host.wake();
    }

    /// The far side has stored everything up to `through`; wakes the host if that made room worth filling.
    pub fn set_acked(&self, through: u64) {
        let before = self.acked.fetch_max(through, Ordering::AcqRel);
        if through > before {
            self.sent.fetch_add(through - before, Ordering::Relaxed);
            if self.room() * 2 >= self.memory_bytes {
                self.host.wake();
            }
        }
    }

    pub fn set_status(&self, status: &'static str) {
        if let Ok(mut s) = self.state.lock() {
            s.change_status(status);
        }
    }

    /// Counts an error of `kind` and logs it (at most once a minute per outlet).
    pub fn error(&self, kind: &'static str, what: String) {
        let Ok(mut s) = self.state.lock() else {
            return;
        };
        *s.errors.entry(kind).or_insert(0) += 1;
        s.change_status("failing");
        let now = Instant::now();
        s.last_error_kind = Some(kind);
        s.failing_since.get_or_insert(now);
        if s.last_logged
            .is_none_or(|t| now.duration_since(t) >= LOG_EVERY)
        {
            s.last_logged = Some(now);
            let count = s.errors[kind];
            tracing::warn!(
                app = %self.app,
                outlet = %self.name,
                kind,
                count,
                "outlet {}/{}: {what}",
                self.app,
                self.name
            );
        }
        s.last_error = Some(what);
    }

    /// The far side has not answered a single packet for a while: counted (kind `unanswered`) each time, and the
    /// likely cause with its fix, `what`, logged once until it answers (docs/operations.md, "When an outlet does not
    /// deliver"). The commonest mistake, a far node whose senders file lacks this node's key, looks exactly like
    /// this: the far node cannot say why, since it cannot tell who sent what it cannot open.
    pub fn silent(&self, what: String) {
        let Ok(mut s) = self.state.lock() else {
            return;
        };
        *s.errors.entry("unanswered").or_insert(0) += 1;
        s.status = "failing";
        if !s.silence_told {
            s.silence_told = true;
            tracing::warn!(
                app = %self.app,
                outlet = %self.name,
                kind = "unanswered",
                "outlet {}/{}: {what}",
                self.app,
                self.name
            );
        }
        s.last_error = Some(what);
    }

    /// The far side answered (a packet that authenticated): a later silence is told again.
    pub fn answered(&self) {
        if let Ok(mut s) = self.state.lock() {
            s.silence_told = false;
        }
    }

    /// Another node of the fleet drives this outlet now: its errors are that node's to tell, and its status says so.
    pub fn standby(&self) {
        if let Ok(mut s) = self.state.lock() {
            s.last_error = None;
            s.last_error_kind = None;
            s.failing_since = None;
            s.silence_told = false;
            s.change_status("standby");
        }
    }

    /// The error is over: say so once.
    pub fn recovered(&self, status: &'static str) {
        let Ok(mut s) = self.state.lock() else {
            return;
        };
        s.last_error_kind = None;
        s.failing_since = None;
        s.silence_told = false;
        if s.last_error.take().is_some() {
            tracing::info!(app = %self.app, outlet = %self.name, "outlet {}/{}: working again", self.app, self.name);
            s.last_logged = None;
        }
        s.change_status(status);
    }
}

impl OutletState {
    fn change_status(&mut self, status: &'static str) {
        if self.status != status {
            self.status = status;
            self.status_since = Some(Instant::now());
        }
    }
}

/// What of `chunks` (in position order) fits an outlet's `room`: chunks whole while they fit, and the one that does
/// not cut to what fits, so that what the outlet holds never passes its `memory_bytes` (a turn's chunk can be far
/// larger than the budget). With it, the position after the last record taken (`None` if none fit).
pub fn fill(
    mut room: usize,
    chunks: impl IntoIterator<Item = Arc<Chunk>>,
) -> (Vec<Arc<Chunk>>, Option<u64>) {
    let (mut fed, mut at) = (Vec::new(), None);
    for c in chunks {
        if c.body.len() <= room {
            room -= c.body.len();
            at = Some(c.pos + c.count);
            fed.push(c);
            continue;
        }
        if let Some(part) = c.prefix_within(room) {
            at = Some(part.pos + part.count);
            fed.push(Arc::new(part));
        }
        break;
    }
    (fed, at)
}

/// Bytes held by a run of an outlet, by the last position of each chunk it queued: acknowledgements release them
/// chunk by chunk.
#[derive(Debug, Default)]
pub struct Held {
    chunks: VecDeque<(u64, usize)>,
    bytes: usize,
}

impl Held {
    pub fn add(&mut self, last_pos: u64, bytes: usize) {
        self.chunks.push_back((last_pos, bytes));
        self.bytes += bytes;
    }
    /// Releases every chunk whose last position is ≤ `through`; returns the bytes released.
    pub fn release_through(&mut self, through: u64) -> usize {
        let mut freed = 0;
        while let Some(&(last, bytes)) = self.chunks.front() {
            if last > through {
                break;
            }
            self.chunks.pop_front();
            freed += bytes;
        }
        self.bytes -= freed;
        freed
    }
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::wire::RecordFormat;

    fn chunk(pos: u64, n: u64) -> Arc<Chunk> {
        Arc::new(Chunk {
            pos,
            source: "s".into(),
            first_seq: pos,
            count: n,
            format: RecordFormat::Plain,
            stored_at_ms: 0,
            body: vec![0; 100 * n as usize],
        })
    }

    #[test]
    fn the_budget_counts_what_is_fed_and_what_is_held_until_acknowledged() {
        let wake = Arc::new(Wake::new().unwrap());
        let o = Outlet::new(1, "a", "out", "link", 1000, wake.clone());
        assert_eq!(o.room(), 1000);
        o.feed([chunk(1, 3), chunk(4, 2)]);
        assert_eq!(o.room(), 500);
        let taken = o.take_fed();
        assert_eq!(taken.len(), 2);
        assert_eq!(o.room(), 500, "taken is still held");
        o.release(300);
        assert_eq!(o.room(), 800);
        // A restart empties everything and tells the host where to feed from.
        o.feed([chunk(6, 1)]);
        o.restart_from(4);
        wake.clear();
        assert_eq!(o.take_restart(), Some(4));
        assert_eq!(o.take_restart(), None);
        assert_eq!(o.room(), 1000);
        assert!(o.take_fed().is_empty());
        assert_eq!(o.acked(), 3);
    }

    #[test]
    fn held_bytes_are_released_chunk_by_chunk() {
        let mut h = Held::default();
        h.add(10, 100);
        h.add(20, 50);
        assert_eq!(h.release_through(15), 100);
        assert_eq!(h.release_through(19), 0);
        assert_eq!(h.release_through(20), 50);
        assert_eq!(h.bytes(), 0);
    }
}
