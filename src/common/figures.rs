//! What the receive loop publishes for its readers on other threads: the figures of a round ([`Snapshot`], copied
//! under a lock once per round, with every app's and outlet's), the loop's [`Heartbeat`], and the counters a
//! caller may read at any time ([`LiveStats`]). The receive loop and the app host fill them; the HTTP server
//! (`/metrics`, `/healthz`, the status page), `src/ops/metrics.rs` and `src/ops/status.rs` read them. They live
//! below all of those so that no reader imports from the loop it reads.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::proto::allow_list::AllowList;
use crate::proto::node::NodeCounters;

/// Live figures a caller (the demo, tests, later metrics) may read while the node runs.
#[derive(Debug, Default)]
pub struct LiveStats {
    pub stored_records: AtomicU64,
    pub datagrams: AtomicU64,
    pub dropped: AtomicU64,
    pub sessions: AtomicU64,
    pub x25519: AtomicU64,
    /// Everything `/metrics` shows, copied once per round.
    pub snapshot: Mutex<Snapshot>,
    /// Bumped each round; `/healthz` fails when it goes stale.
    pub heartbeat: Heartbeat,
    /// Node packets for a link request (HTTP) that was answered already: lost, as a datagram to a peer that moved
    /// on would be; the sender sends again.
    pub link_packets_unrouted: AtomicU64,
    /// The allow-list the loop serves, as it last published it (at start and after each reload): what the devices
    /// census reads its names from.
    pub allow_list: Mutex<Option<Arc<AllowList>>>,
    /// What the devices census found last (`None` until its first scan ends): `src/ops/devices.rs`.
    pub devices: Mutex<Option<DeviceCensus>>,
}

/// Who went quiet: the counts of the devices census (`src/ops/devices.rs`), one scan of every app's store, and the
/// quietest senders. `/status.json` shows it as `devices`, `/metrics` as `pure_senders_*` (docs/operations.md).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct DeviceCensus {
    /// Senders in the allow-list when the scan ran.
    pub senders: u64,
    /// Senders with a record stored in the last hour.
    pub heard_last_hour: u64,
    /// Senders with a record stored in the last day (the last hour's included).
    pub heard_last_day: u64,
    /// Senders with no record in any app's store: never heard of (or only listening for downlink).
    pub never_heard: u64,
    /// Senders heard of before whose newest record is at least `quiet_after_seconds` old.
    pub quiet: u64,
    /// `--quiet-after`, in seconds.
    pub quiet_after_seconds: u64,
    /// When the scan read the stores (milliseconds since the Unix epoch), and how long it took.
    pub scanned_at_ms: i64,
    pub scan_seconds: f64,
    /// The quietest senders heard of before, the quietest first (at most [`QUIETEST_LISTED`]).
    pub quietest: Vec<SenderSeen>,
}

/// At most this many senders in [`DeviceCensus::quietest`].
pub const QUIETEST_LISTED: usize = 10;

/// One sender as the stores see it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SenderSeen {
    pub name: String,
    /// Its newest record's commit time over every app (milliseconds since the Unix epoch); `None`: never.
    pub last_seen_ms: Option<i64>,
    /// Its heard sequence, the largest over the apps.
    pub stored_through: u64,
}

/// What the receive loop publishes each round for the metrics page.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub counters: NodeCounters,
    pub apps: Vec<String>,
    pub senders: usize,
    pub sessions: usize,
    pub reloads_ok: u64,
    pub reloads_failed: u64,
    /// Time spent applying and committing turns, in total.
    pub commit_seconds: f64,
    /// Every app's figures and its outlets'.
    pub app_figures: Vec<AppFigures>,
    /// Whether the sending loop beats (`None`: no outlets, no loop).
    pub sending_loop_alive: Option<bool>,
    /// The X25519 budget in force, per second.
    pub x25519_budget: u32,
    /// The node's public key, as the senders file and apps files write it.
    pub node_key: String,
    /// The link socket's address.
    pub link_addr: Option<std::net::SocketAddr>,
    /// The node's state directory, whose filesystem `/metrics` reports (`pure_state_free_bytes`).
    pub state_dir: Option<std::path::PathBuf>,
    /// The last reload (SIGHUP), if there was one.
    pub last_reload: Option<LastReload>,
    /// Connections made to the fleet's database so far (`None`: the apps are stored in SQLite files).
    pub store_connections: Option<u64>,
    /// Syncs of the stores' `-wal` files by `pure-sync` so far (`None`: on a fleet's database).
    pub store_syncs: Option<u64>,
    /// The push datagram socket's pushes taken and answers not sent (`None`: the node serves no such socket).
    pub push_datagrams: Option<(u64, u64)>,
}

/// What the last reload did, for the status page.
#[derive(Debug, Clone)]
pub struct LastReload {
    pub at: Instant,
    /// Both files (the senders file, and the apps file if there is one) were taken whole.
    pub applied: bool,
    /// What was wrong (the refused file, its first problem with its line), or a note of an applied one.
    pub note: Option<String>,
}

/// When the receive loop last turned, as microseconds since `base` (0: never).
#[derive(Debug)]
pub struct Heartbeat {
    base: Instant,
    last_us: AtomicU64,
}

impl Default for Heartbeat {
    fn default() -> Self {
        Heartbeat {
            base: Instant::now(),
            last_us: AtomicU64::new(0),
        }
    }
}

impl Heartbeat {
    /// Called by the loop each round.
    pub fn beat(&self, now: Instant) {
        let us = now.saturating_duration_since(self.base).as_micros() as u64 + 1;
        self.last_us.store(us, Ordering::Relaxed);
    }

    /// When the figures began: the node's start, for its uptime.
    pub fn started(&self) -> Instant {
        self.base
    }

    /// How long ago the loop last turned, or `None` if it never has.
    pub fn age(&self, now: Instant) -> Option<Duration> {
        let us = self.last_us.load(Ordering::Relaxed);
        if us == 0 {
            return None;
        }
        let since = now.saturating_duration_since(self.base).as_micros() as u64 + 1;
        Some(Duration::from_micros(since.saturating_sub(us)))
    }
}

/// What the operator sees of an app (metrics, status, health).
#[derive(Debug, Clone, Default)]
pub struct AppFigures {
    pub name: String,
    /// Records this process stored since it started.
    pub stored_records: u64,
    /// Records the app's store holds, from the store: every record it stored, before this start too (`None`
    /// until known: a closed store, or on a fleet's store before this node's first commit of the app).
    pub store_records: Option<u64>,
    pub turns_failed: u64,
    /// Tries to reopen the app's store after it could not store (a store in SQLite; 0 on a fleet's database).
    pub reopen_tries: u64,
    /// Records offered to the app and not yet stored (what its inner outlets' sources hold beyond it).
    pub queue_depth: u64,
    /// Why the app cannot store now, if it cannot.
    pub failed: Option<String>,
    /// It cannot store because this node cannot reach or use the fleet's database (`--store postgres://…`).
    pub failed_database: bool,
    /// The store's next position (1 when empty): what outlets' acknowledged positions are compared with.
    pub head: u64,
    pub paused_for_lag: bool,
    /// Times the app stopped taking input for lag since the start.
    pub lag_pauses: u64,
    pub outlets: Vec<OutletFigures>,
    /// Downlink (docs/downlink.md): records waiting in the store for all senders, and records delivered
    /// (acknowledged by their device) and expired since the start.
    pub down_waiting: u64,
    pub down_delivered: u64,
    pub down_expired: u64,
    /// Downlink records pushed and queued (synced) since the start, and pushed and refused by a bound.
    pub down_queued: u64,
    pub down_refused: u64,
}

#[derive(Debug, Clone, Default)]
pub struct OutletFigures {
    pub name: String,
    pub kind: &'static str,
    /// Records stored by the app and not yet acknowledged by the outlet's far side.
    pub lag_records: u64,
    /// When the oldest of them was stored, at the latest (ms since the Unix epoch; `None` when none lags or it is
    /// not known: `src/apps/host/times.rs`).
    pub oldest_stored_ms: Option<i64>,
    pub sent_records: u64,
    pub held_bytes: usize,
    pub status: &'static str,
    pub last_error: Option<String>,
    /// The kind of the last error (one of `errors`' kinds), while it stands.
    pub last_error_kind: Option<&'static str>,
    /// Since when the outlet has been failing without a success between.
    pub failing_since: Option<std::time::Instant>,
    /// Since when it has been in `status`.
    pub status_since: Option<std::time::Instant>,
    pub errors: Vec<(&'static str, u64)>,
    /// Where it sends, in words (no secrets: a URL's query is left out).
    pub target: Arc<str>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heartbeat_ages() {
        let hb = Heartbeat::default();
        let t = Instant::now();
        assert_eq!(hb.age(t), None);
        hb.beat(t);
        assert_eq!(hb.age(t), Some(Duration::ZERO));
        assert_eq!(
            hb.age(t + Duration::from_secs(3)),
            Some(Duration::from_secs(3))
        );
    }
}
