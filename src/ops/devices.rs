//! The devices census: which senders went quiet, for the status page's devices panel, `/status.json`'s `devices`
//! and `/metrics`' `pure_senders_*` (issue 37: "which devices have not reported, since when?"), and the reading of
//! every sender's last record that `pure-serve senders` shares with it.
//!
//! A sender's last seen is its newest stored record's commit time, which every store keeps anyway (research/040: one
//! index lookup per source, 4.7 s for a million senders): the node writes nothing more for it and keeps nothing per
//! idle sender between scans. So the figures come from a **scan** on a thread of their own (`pure-census`), never on
//! the receive loop or the sending loop: every app's store read through [`StoreReader`] (the files, or a fleet's
//! database), the counts and the quietest few kept, the rest dropped. A scan runs at start and then every
//! [`period`]: a quarter of `--quiet-after` (a gauge need not be fresher than that), at least a second and at most
//! a minute, and never more often than 20 times its own cost, so it takes at most about 5 % of one core however
//! many senders there are. While it runs it holds 12 bytes per sender (the names' order and each last seen).
//!
//! The page's search by name asks the same thread ([`DeviceSearch`]): the allow-list's names are scanned for the
//! text and each match looked up in each store, at most [`SEARCH_LISTED`] of them. A search waits for a scan in
//! progress to end.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::time::{Duration, Instant};

use crate::common::figures::{DeviceCensus, LiveStats, QUIETEST_LISTED, SenderSeen};
use crate::proto::allow_list::{AllowList, SenderIndex};
use crate::store::StoreError;
use crate::store::engine::{AppReader, StoreChoice, StoreReader};

/// At most this many senders answer one search.
pub const SEARCH_LISTED: usize = 50;

/// `--quiet-after`'s default: a sender with no record stored for an hour counts as quiet.
pub const DEFAULT_QUIET_AFTER: Duration = Duration::from_secs(3_600);

/// Searches that may wait for the census thread at once; more are answered busy.
const SEARCHES_WAITING: usize = 4;

/// The allow-list's senders in the byte order of their names (4 bytes per sender, for as long as it is kept), so
/// that the stores' sources, which come by name, are walked beside them rather than each searched for (a census,
/// `pure-serve senders`); a name alone is found by [`AllowList::find_name`].
pub struct ByName {
    list: Arc<AllowList>,
    order: Vec<SenderIndex>,
}

impl ByName {
    pub fn new(list: Arc<AllowList>) -> Self {
        let mut order: Vec<SenderIndex> = (0..list.len() as SenderIndex).collect();
        order.sort_unstable_by(|&a, &b| list.name_bytes(a).cmp(list.name_bytes(b)));
        ByName { list, order }
    }

    /// The list it orders.
    pub fn list(&self) -> &Arc<AllowList> {
        &self.list
    }

    /// The `k`th name's index in the list.
    pub fn index(&self, k: usize) -> SenderIndex {
        self.order[k]
    }

    pub fn len(&self) -> usize {
        self.order.len()
    }

    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// The `k`th name in byte order.
    pub fn name(&self, k: usize) -> &str {
        self.list.name(self.order[k])
    }

    /// Where `name` is in the order.
    pub fn find(&self, name: &str) -> Option<usize> {
        self.order
            .binary_search_by(|&i| self.list.name_bytes(i).cmp(name.as_bytes()))
            .ok()
    }

    /// Calls `each(k, heard, last_stored_ms)` for every source of `store` that is in the allow-list (`k`: its place
    /// in the order). SQLite gives the sources in byte order, so both are walked together; a database whose
    /// collation orders otherwise is searched where the walk misses.
    pub fn walk(
        &self,
        store: &AppReader<'_>,
        mut each: impl FnMut(usize, u64, i64),
    ) -> Result<(), StoreError> {
        let mut cursor = 0;
        store.for_each_source_seen(|name, heard, at| {
            while cursor < self.order.len()
                && self.list.name_bytes(self.order[cursor]) < name.as_bytes()
            {
                cursor += 1;
            }
            let hit = if cursor < self.order.len()
                && self.list.name_bytes(self.order[cursor]) == name.as_bytes()
            {
                Some(cursor)
            } else {
                self.find(name)
            };
            if let Some(k) = hit {
                each(k, heard, at);
            }
            true
        })
    }
}

/// Whether `name` contains `text`, ASCII letters matching in either case (`senders --name`, the page's search).
pub fn name_matches(name: &str, text: &str) -> bool {
    let (n, t) = (name.as_bytes(), text.as_bytes());
    t.is_empty() || n.windows(t.len()).any(|w| w.eq_ignore_ascii_case(t))
}

/// The counts and the quietest senders of every app's store in `reader`, at `now_ms`.
pub fn census(
    list: &Arc<AllowList>,
    reader: &StoreReader,
    now_ms: i64,
    quiet_after: Duration,
) -> Result<DeviceCensus, StoreError> {
    let by_name = ByName::new(list.clone());
    // Each sender's newest record over the apps (0: none): read whole, then counted.
    let mut last = vec![0i64; by_name.len()];
    let apps = reader.apps()?.unwrap_or_default();
    for app in &apps {
        by_name.walk(&reader.app(app)?, |k, _, at| last[k] = last[k].max(at))?;
    }
    let quiet_ms = quiet_after.as_millis().min(i64::MAX as u128) as i64;
    let mut c = DeviceCensus {
        senders: by_name.len() as u64,
        quiet_after_seconds: quiet_after.as_secs(),
        scanned_at_ms: now_ms,
        ..DeviceCensus::default()
    };
    // The quietest heard-of senders: a max-heap on last seen of at most QUIETEST_LISTED.
    let mut quietest: std::collections::BinaryHeap<(i64, usize)> = Default::default();
    for (k, &at) in last.iter().enumerate() {
        // A sender stored before commit times were kept (0) or only listening counts as never heard of.
        if at <= 0 {
            c.never_heard += 1;
            continue;
        }
        let ago = now_ms.saturating_sub(at);
        c.heard_last_hour += u64::from(ago < 3_600_000);
        c.heard_last_day += u64::from(ago < 86_400_000);
        c.quiet += u64::from(ago >= quiet_ms);
        if quietest.len() < QUIETEST_LISTED {
            quietest.push((at, k));
        } else if quietest.peek().is_some_and(|&(newest, _)| at < newest) {
            quietest.pop();
            quietest.push((at, k));
        }
    }
    drop(last);
    c.quietest = quietest
        .into_sorted_vec()
        .into_iter()
        .map(|(at, k)| SenderSeen {
            name: by_name.name(k).to_string(),
            last_seen_ms: Some(at),
            stored_through: 0,
        })
        .collect();
    // Their heard sequences: looked up for these few rather than kept for every sender.
    for app in &apps {
        let store = reader.app(app)?;
        for s in &mut c.quietest {
            if let Some((heard, _)) = store.source_seen(&s.name)? {
                s.stored_through = s.stored_through.max(heard);
            }
        }
    }
    Ok(c)
}

/// The senders whose names contain `text` (as [`name_matches`]), at most `limit`, by name, each with what the stores
/// say of it; and whether more matched.
pub fn search(
    list: &AllowList,
    reader: &StoreReader,
    text: &str,
    limit: usize,
) -> Result<(Vec<SenderSeen>, bool), StoreError> {
    let mut names: Vec<&str> = Vec::new();
    let mut more = false;
    for i in 0..list.len() as SenderIndex {
        let name = list.name(i);
        if name_matches(name, text) {
            if names.len() == limit {
                more = true;
                break;
            }
            names.push(name);
        }
    }
    names.sort_unstable();
    let mut found: Vec<SenderSeen> = names
        .iter()
        .map(|&name| SenderSeen {
            name: name.to_string(),
            last_seen_ms: None,
            stored_through: 0,
        })
        .collect();
    for app in reader.apps()?.unwrap_or_default() {
        let store = reader.app(&app)?;
        for s in &mut found {
            if let Some((heard, at)) = store.source_seen(&s.name)? {
                s.stored_through = s.stored_through.max(heard);
                if at > 0 {
                    s.last_seen_ms = Some(s.last_seen_ms.unwrap_or(0).max(at));
                }
            }
        }
    }
    Ok((found, more))
}

/// How long to wait after a scan that took `cost` before the next: a quarter of `quiet_after`, within 1 s and
/// 60 s, and at least 20 times the scan's own cost.
pub fn period(quiet_after: Duration, cost: Duration) -> Duration {
    (quiet_after / 4)
        .clamp(Duration::from_secs(1), Duration::from_secs(60))
        .max(cost.saturating_mul(20))
}

/// Where the census reads: the node's store (`--store`), its state directory, the database's password.
pub struct CensusStore {
    pub choice: StoreChoice,
    pub state: PathBuf,
    pub password: Option<String>,
}

/// What a search answers: the senders found and whether more matched, or why the stores could not be read.
pub type SearchAnswer = Result<(Vec<SenderSeen>, bool), String>;

enum Ask {
    Search(String, tokio::sync::oneshot::Sender<SearchAnswer>),
    Stop,
}

/// Why a search was not asked.
#[derive(Debug, PartialEq, Eq)]
pub enum SearchRefused {
    /// [`SEARCHES_WAITING`] searches wait already (a scan is in progress).
    Busy,
    /// The census thread is gone.
    Stopped,
}

/// The HTTP thread's end: asks the census thread for a search.
#[derive(Clone)]
pub struct DeviceSearch(SyncSender<Ask>);

impl DeviceSearch {
    /// Asks for the senders whose names contain `text`; the answer comes on the receiver. Never blocks.
    pub fn ask(
        &self,
        text: &str,
    ) -> Result<tokio::sync::oneshot::Receiver<SearchAnswer>, SearchRefused> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        match self.0.try_send(Ask::Search(text.to_string(), tx)) {
            Ok(()) => Ok(rx),
            Err(TrySendError::Full(_)) => Err(SearchRefused::Busy),
            Err(TrySendError::Disconnected(_)) => Err(SearchRefused::Stopped),
        }
    }
}

/// The census thread; it stops when this is dropped (a scan in progress ends first, unwaited for).
pub struct Census {
    asks: SyncSender<Ask>,
}

impl Census {
    /// Starts the `pure-census` thread, publishing into `stats.devices` and reading names from
    /// `stats.allow_list`.
    pub fn spawn(
        stats: Arc<LiveStats>,
        store: CensusStore,
        quiet_after: Duration,
    ) -> std::io::Result<Self> {
        let (asks, rx) = mpsc::sync_channel(SEARCHES_WAITING);
        std::thread::Builder::new()
            .name("pure-census".into())
            .spawn(move || run(&stats, &store, quiet_after, &rx))?;
        Ok(Census { asks })
    }

    /// Where the HTTP server sends the page's searches.
    pub fn search(&self) -> DeviceSearch {
        DeviceSearch(self.asks.clone())
    }
}

impl Drop for Census {
    fn drop(&mut self) {
        // The queue may be full of searches; then the thread ends when every sender is gone instead.
        let _ = self.asks.try_send(Ask::Stop);
    }
}

fn run(stats: &LiveStats, store: &CensusStore, quiet_after: Duration, asks: &Receiver<Ask>) {
    let list = || {
        stats
            .allow_list
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    };
    let reader = || StoreReader::open(&store.choice, &store.state, store.password.as_deref());
    let mut next = Instant::now();
    // Said once per run of failures, not at every scan.
    let mut failing = false;
    loop {
        match asks.recv_timeout(next.saturating_duration_since(Instant::now())) {
            Ok(Ask::Search(text, answer)) => {
                let found = match list() {
                    Some(list) => reader()
                        .and_then(|r| search(&list, &r, &text, SEARCH_LISTED))
                        .map_err(|e| e.to_string()),
                    None => Ok((Vec::new(), false)),
                };
                let _ = answer.send(found);
            }
            Ok(Ask::Stop) | Err(RecvTimeoutError::Disconnected) => return,
            Err(RecvTimeoutError::Timeout) => {
                let Some(list) = list() else {
                    next = Instant::now() + Duration::from_secs(1);
                    continue;
                };
                let started = Instant::now();
                let scanned = reader()
                    .and_then(|r| census(&list, &r, crate::ops::metrics::wall_ms(), quiet_after));
                drop(list);
                let cost = started.elapsed();
                match scanned {
                    Ok(mut c) => {
                        c.scan_seconds = cost.as_secs_f64();
                        *stats
                            .devices
                            .lock()
                            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(c);
                        if failing {
                            tracing::info!("the devices census reads the stores again");
                        }
                        failing = false;
                    }
                    Err(e) => {
                        if !failing {
                            tracing::warn!(
                                "the devices census cannot read the stores (the devices panel and pure_senders_* \
                                 keep their last figures until it can): {e}"
                            );
                        }
                        failing = true;
                    }
                }
                // The scan's arrays are megabytes at a million senders: give them back now, not at the next idle.
                crate::receive::heap::release_freed_memory();
                next = Instant::now() + period(quiet_after, cost);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_in_either_case() {
        assert!(name_matches("Boiler-7", "boiler"));
        assert!(name_matches("boiler-7", "R-7"));
        assert!(name_matches("x", ""));
        assert!(!name_matches("boiler", "boilers"));
        assert!(!name_matches("ä-1", "Ä"));
    }

    #[test]
    fn the_period_follows_quiet_after_and_the_scans_cost() {
        let s = Duration::from_secs;
        assert_eq!(period(s(3_600), Duration::ZERO), s(60));
        assert_eq!(period(s(8), Duration::ZERO), s(2));
        assert_eq!(period(s(1), Duration::ZERO), s(1));
        assert_eq!(period(s(3_600), Duration::from_millis(4_700)), s(94));
    }
}
