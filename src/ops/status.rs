//! The status page's figures (`/status.json`, and the page at `/` that draws them; docs/operations.md, "Status
//! page"): what an operator with one node on a shelf wants at a glance, taken from what the loops already publish.
//!
//! This module owns two things:
//!
//! - [`History`], the ring behind the page's charts: one sample every [`SAMPLE_EVERY`] of a few counters per app
//!   and per outlet, [`SAMPLES`] of them (the last hour);
//! - [`report`], a pure function from the published [`Snapshot`], the ring and the server's addresses to the
//!   [`Status`] that `/status.json` serializes, with [`issues`]: everything wrong now, each in words. `/healthz`
//!   answers the load balancer's narrower question (can this node store?, [`super::metrics::health`]); `issues`
//!   holds its problems too, and what it lets pass (a failing outlet, a paused app, a refused reload), which
//!   makes the node `degraded` rather than `ok`.
//!
//! **Cost, and why the ring is sampled while nobody looks.** The issue asks that nothing be computed for the page
//! while nobody asks, and also for a chart of the last hour, which needs the hour's history when someone first
//! opens the page. Recording is kept to the least that gives that history: every 5 s the HTTP thread (never the
//! receive or sending loop) takes the snapshot's lock for the time it takes to read one integer per app and per
//! outlet (plus two node counters), writes them into slots allocated when the series first appeared, and sleeps.
//! That is one lock and a copy of one integer per series (a search among at most [`MAX_SERIES`] keys each) on
//! the HTTP thread per 5 s, and one more wake of an idle process every 5 s (the receive loop already wakes ten
//! times a second). Nothing else happens without a request: rates, lag in
//! seconds, hints and the JSON are computed only when `/status.json` is asked for, from the snapshot and the ring.
//! The receive loop's side is unchanged in kind: it already copied its figures into the snapshot each round; it
//! now also copies the node key, its address and the last reload once (not per round), and a shared string for
//! each outlet's target (a reference count, no allocation).
//!
//! **Memory.** A series is [`SAMPLES`] `u64`s (5,760 bytes) plus its names; at most [`MAX_SERIES`] series are
//! kept (apps, outlets and the two node series together), so the ring never holds more than
//! [`History::MAX_BYTES`] (about 743 KB, names bounded by [`MAX_NAME`]) whatever the apps file says. Apps and
//! outlets past the limit are shown with their figures but without a chart, and the page says so.

use std::time::{Duration, Instant};

use serde::Serialize;

use super::metrics::{health, lag_seconds, outlet_failing};
use crate::common::figures::Snapshot;
use crate::proto::node::DropReason;

/// How often the ring takes a sample.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(5);
/// Samples kept: one hour at [`SAMPLE_EVERY`].
pub const SAMPLES: usize = 720;
/// Series kept: apps, outlets and the two node series together.
pub const MAX_SERIES: usize = 128;
/// A series' app and outlet names together are kept to this many bytes (longer ones are cut for the key).
pub const MAX_NAME: usize = 256;

/// No sample in this slot for this series (it did not exist yet).
const NONE: u64 = u64::MAX;

/// The key of the node series of drops (all stages) and of X25519 operations that did not authenticate.
const NODE_DROPS: &str = "drops";
const NODE_X25519: &str = "x25519_unauthenticated";

#[derive(Debug, Clone, PartialEq, Eq)]
struct Key {
    /// Empty for the node's own series.
    app: String,
    /// Empty for an app's series; the series name for the node's.
    outlet: String,
}

impl Key {
    fn new(app: &str, outlet: &str) -> Self {
        let cut = |s: &str, n: usize| {
            let mut end = s.len().min(n);
            while !s.is_char_boundary(end) {
                end -= 1;
            }
            s[..end].to_string()
        };
        let app = cut(app, MAX_NAME / 2);
        let outlet = cut(outlet, MAX_NAME - app.len());
        Key { app, outlet }
    }

    fn is(&self, app: &str, outlet: &str) -> bool {
        // Compared as cut, so a name longer than the key still finds its series.
        *self == Key::new(app, outlet)
    }
}

#[derive(Debug)]
struct Series {
    key: Key,
    /// One value per slot of the ring: a cumulative counter (an app's store head, an outlet's sent records).
    values: Box<[u64]>,
    /// Sampled in the last round (series not seen are dropped).
    seen: bool,
}

/// The ring of samples behind the charts.
#[derive(Debug)]
pub struct History {
    base: Instant,
    /// When each slot was sampled, in milliseconds since `base`.
    times: Box<[u64]>,
    /// The slot the next sample goes into.
    next: usize,
    /// Slots filled (up to [`SAMPLES`]).
    len: usize,
    series: Vec<Series>,
    /// Series that could not be kept because [`MAX_SERIES`] were.
    pub left_out: usize,
}

// The issue's bound, checked when the crate compiles.
const _: () = assert!(History::MAX_BYTES <= 1 << 20);

impl Default for History {
    fn default() -> Self {
        History::new(Instant::now())
    }
}

impl History {
    /// The most the ring holds: times, values and key names of [`MAX_SERIES`] series, with the `Vec`s' headers.
    pub const MAX_BYTES: usize = SAMPLES * 8
        + MAX_SERIES * (SAMPLES * 8 + MAX_NAME + std::mem::size_of::<Series>())
        + std::mem::size_of::<History>();

    pub fn new(base: Instant) -> Self {
        History {
            base,
            times: vec![0; SAMPLES].into_boxed_slice(),
            next: 0,
            len: 0,
            series: Vec::new(),
            left_out: 0,
        }
    }

    /// Bytes the ring holds now (what [`History::MAX_BYTES`] bounds).
    pub fn bytes(&self) -> usize {
        std::mem::size_of::<History>()
            + self.times.len() * 8
            + self.series.capacity() * std::mem::size_of::<Series>()
            + self
                .series
                .iter()
                .map(|s| s.values.len() * 8 + s.key.app.capacity() + s.key.outlet.capacity())
                .sum::<usize>()
    }

    /// Takes a sample of `s` at `now`.
    pub fn sample(&mut self, now: Instant, s: &Snapshot) {
        let slot = self.next;
        self.times[slot] = now.saturating_duration_since(self.base).as_millis() as u64;
        for series in &mut self.series {
            series.seen = false;
        }
        let c = &s.counters;
        self.put(slot, "", NODE_DROPS, c.total_dropped());
        self.put(
            slot,
            "",
            NODE_X25519,
            c.x25519.saturating_sub(c.x25519_authentic),
        );
        let mut left_out = 0;
        for a in &s.app_figures {
            left_out += usize::from(!self.put(slot, &a.name, "", a.head));
            for o in &a.outlets {
                left_out += usize::from(!self.put(slot, &a.name, &o.name, o.sent_records));
            }
        }
        self.left_out = left_out;
        self.series.retain(|s| s.seen);
        self.next = (slot + 1) % SAMPLES;
        self.len = (self.len + 1).min(SAMPLES);
    }

    /// Writes one value; false if the series is new and there is no room for it.
    fn put(&mut self, slot: usize, app: &str, outlet: &str, value: u64) -> bool {
        let at = match self.series.iter().position(|s| s.key.is(app, outlet)) {
            Some(i) => i,
            None if self.series.len() < MAX_SERIES => {
                self.series.push(Series {
                    key: Key::new(app, outlet),
                    values: vec![NONE; SAMPLES].into_boxed_slice(),
                    seen: false,
                });
                self.series.len() - 1
            }
            None => return false,
        };
        let series = &mut self.series[at];
        series.values[slot] = value.min(NONE - 1);
        series.seen = true;
        true
    }

    /// Slots from the oldest to the newest.
    fn slots(&self) -> impl DoubleEndedIterator<Item = usize> + '_ {
        let start = (self.next + SAMPLES - self.len) % SAMPLES;
        (0..self.len).map(move |i| (start + i) % SAMPLES)
    }

    fn at(&self, slot: usize) -> Instant {
        self.base + Duration::from_millis(self.times[slot])
    }

    fn find(&self, app: &str, outlet: &str) -> Option<&Series> {
        self.series.iter().find(|s| s.key.is(app, outlet))
    }

    /// The rate of a series over the last 2 to 7 seconds: from the newest sample at least 2 s old to `value` now.
    /// `None` before there is such a sample.
    fn rate_now(&self, series: &Series, value: u64, now: Instant) -> Option<f64> {
        self.slots().rev().find_map(|slot| {
            let then = series.values[slot];
            let dt = now.saturating_duration_since(self.at(slot)).as_secs_f64();
            (then != NONE && dt >= 2.0).then(|| value.saturating_sub(then) as f64 / dt)
        })
    }

    /// Per-second rates between successive samples, oldest first, then from the newest sample to `value` now (so
    /// the chart's right end moves while records flow). `None` where a sample is missing.
    fn rates(&self, series: &Series, value: u64, now: Instant) -> Vec<Option<f64>> {
        let slots: Vec<usize> = self.slots().collect();
        let mut out = Vec::with_capacity(slots.len() + 1);
        let rate = |a: u64, b: u64, dt: f64| {
            (a != NONE && b != NONE && dt > 0.0).then(|| b.saturating_sub(a) as f64 / dt)
        };
        for w in slots.windows(2) {
            let dt = self
                .at(w[1])
                .saturating_duration_since(self.at(w[0]))
                .as_secs_f64();
            out.push(rate(series.values[w[0]], series.values[w[1]], dt));
        }
        if let Some(&last) = slots.last() {
            let dt = now.saturating_duration_since(self.at(last)).as_secs_f64();
            out.push(rate(series.values[last], value, dt));
        }
        out
    }

    /// How long the oldest record not yet acknowledged (store position `oldest`) has waited, from the app's store
    /// heads in the ring: at least since the first sample whose head had passed it. `(seconds, at_least)`:
    /// `at_least` when the record is older than the ring, so the figure is the ring's span.
    fn waited(&self, app: &Series, oldest: u64, now: Instant) -> Option<(f64, bool)> {
        let mut first = true;
        for slot in self.slots() {
            let head = app.values[slot];
            if head == NONE {
                first = false;
                continue;
            }
            if head > oldest {
                let seconds = now.saturating_duration_since(self.at(slot)).as_secs_f64();
                return Some((seconds, first && self.len == SAMPLES));
            }
            first = false;
        }
        // Stored after the newest sample (less than one interval ago), or no sample yet: not known yet.
        None
    }

    /// Seconds before `now` at which each point of [`History::rates`] ends, oldest first.
    fn ends_ago(&self, now: Instant) -> Vec<f64> {
        let mut out: Vec<f64> = self
            .slots()
            .skip(1)
            .map(|slot| round(now.saturating_duration_since(self.at(slot)).as_secs_f64()))
            .collect();
        if self.len > 0 {
            out.push(0.0);
        }
        out
    }
}

fn round(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

fn round_all(v: Vec<Option<f64>>) -> Vec<Option<f64>> {
    v.into_iter().map(|x| x.map(round)).collect()
}

/// The server's own addresses, for the "listens" figures.
#[derive(Debug, Clone, Default)]
pub struct Listens {
    pub http: Option<std::net::SocketAddr>,
    pub metrics: Option<std::net::SocketAddr>,
    pub tls: bool,
}

/// What `/status.json` says (docs/operations.md, "Status page", lists every field; the names are stable).
#[derive(Debug, Serialize)]
pub struct Status {
    pub version: &'static str,
    pub node_key: String,
    pub uptime_seconds: f64,
    pub healthy: bool,
    pub problems: Vec<String>,
    /// `ok`, `degraded` (something in `issues`, and `/healthz` still answers 200) or `unhealthy` (`/healthz`
    /// answers 503: `healthy` is false).
    pub health: &'static str,
    /// Everything wrong now, `problems`' included, one entry each.
    pub issues: Vec<Issue>,
    pub listens: ListensOut,
    pub senders: usize,
    pub active_runs: usize,
    pub receive_loop_age_seconds: Option<f64>,
    pub sending_loop_up: Option<bool>,
    pub apps: Vec<AppStatus>,
    pub outlets: Vec<OutletStatus>,
    pub drops: Drops,
    pub x25519: X25519,
    pub reloads: Reloads,
    pub history: HistoryInfo,
    /// The host as the node sees it: its memory, what it wrote to the disk, the state directory's filesystem,
    /// each store's size, the CPU's temperature (docs/operations.md, "Status page").
    pub host: super::metrics::ProcessFigures,
    /// Who went quiet: the devices census's last scan (`null` until the first ends; src/ops/devices.rs).
    pub devices: Option<crate::common::figures::DeviceCensus>,
}

/// One thing wrong with the node (docs/operations.md, "Status page", lists the kinds).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Issue {
    /// What is wrong: `receive_loop`, `sending_loop`, `app_cannot_store`, `database`, `app_paused`,
    /// `outlet_failing`, `reload_refused`.
    pub kind: &'static str,
    /// `fail` (records go unacknowledged for it; `/healthz` says 503) or `warn` (the node stores and acknowledges;
    /// something does not work as configured).
    pub severity: &'static str,
    /// The app (`APP`) or outlet (`APP/OUTLET`) concerned; `null` for the node itself.
    pub subject: Option<String>,
    /// What is wrong and what to do, in words.
    pub words: String,
}

#[derive(Debug, Serialize)]
pub struct ListensOut {
    pub udp: Option<String>,
    pub http: Option<String>,
    pub https: bool,
    pub metrics: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct AppStatus {
    pub name: String,
    pub stored_total: u64,
    /// Records the app's store holds (`pure_app_store_records`): every record it stored, before this start too.
    pub store_records: Option<u64>,
    pub records_per_second: Option<f64>,
    pub can_store: bool,
    pub cannot_store_why: Option<String>,
    pub paused: bool,
    pub pauses_total: u64,
    pub queue_depth: u64,
    pub turns_failed_total: u64,
    /// ok, paused (warn) or cannot_store (fail).
    pub severity: &'static str,
    pub history: Option<Vec<Option<f64>>>,
    pub downlink: DownlinkStatus,
}

/// An app's downlink (docs/downlink.md), the figures of its `pure_downlink_*` series.
#[derive(Debug, Serialize)]
pub struct DownlinkStatus {
    pub waiting: u64,
    pub queued_total: u64,
    pub delivered_total: u64,
    pub expired_total: u64,
    pub refused_total: u64,
}

#[derive(Debug, Serialize)]
pub struct OutletStatus {
    pub app: String,
    pub name: String,
    pub kind: &'static str,
    pub target: String,
    pub state: &'static str,
    pub state_words: String,
    pub failing: bool,
    /// ok, waiting (warn) or failing (fail).
    pub severity: &'static str,
    pub last_error: Option<String>,
    pub last_error_kind: Option<&'static str>,
    pub hint: Option<&'static str>,
    pub failing_seconds: Option<f64>,
    /// Since `state` last changed (`null` for inner outlets, which have no state of their own).
    pub state_seconds: Option<f64>,
    pub lag_records: u64,
    pub lag_seconds: Option<f64>,
    pub lag_seconds_at_least: bool,
    pub sent_total: u64,
    pub records_per_second: Option<f64>,
    pub held_bytes: usize,
    pub errors: std::collections::BTreeMap<&'static str, u64>,
    pub history: Option<Vec<Option<f64>>>,
}

#[derive(Debug, Serialize)]
pub struct Drops {
    pub total: u64,
    pub per_second: Option<f64>,
    pub by_stage: std::collections::BTreeMap<&'static str, u64>,
    pub history: Option<Vec<Option<f64>>>,
}

#[derive(Debug, Serialize)]
pub struct X25519 {
    pub budget_per_second: u32,
    pub unauthenticated_per_second: Option<f64>,
    /// `unauthenticated_per_second / budget_per_second`, 0 to 1 (and a little over while a burst is let through).
    pub budget_used: Option<f64>,
    pub total: u64,
    pub authentic_total: u64,
    pub history: Option<Vec<Option<f64>>>,
}

#[derive(Debug, Serialize)]
pub struct Reloads {
    pub applied_total: u64,
    pub refused_total: u64,
    pub last: Option<LastReloadOut>,
}

#[derive(Debug, Serialize)]
pub struct LastReloadOut {
    /// applied or refused.
    pub outcome: &'static str,
    pub seconds_ago: f64,
    pub why: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct HistoryInfo {
    pub interval_seconds: u64,
    /// Seconds before now at which each point of every `history` array ends, oldest first; the last is 0 (the
    /// interval in progress).
    pub ends_seconds_ago: Vec<f64>,
    pub ring_bytes: usize,
    pub ring_max_bytes: usize,
    /// Apps and outlets without a chart, past [`MAX_SERIES`].
    pub series_left_out: usize,
}

/// Leaves out the query of every URL in `text`: an outlet's error names its URL, whose query may carry a token.
pub fn redact_queries(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let end = rest[at..]
            .find(char::is_whitespace)
            .map_or(rest.len(), |e| at + e);
        let url = &rest[..end];
        match url[at..].find('?') {
            Some(q) => {
                out.push_str(&url[..at + q]);
                out.push_str("?…");
                // A colon right after the URL is the message's, not the query's.
                if url.ends_with(':') {
                    out.push(':');
                }
            }
            None => out.push_str(url),
        }
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// What an outlet's state word means, in words.
fn state_words(status: &str, error: Option<&str>) -> String {
    let words = state_word(status, error);
    match error {
        // Between retries (resolving, syncing again) the error that sent it back there still stands.
        Some(e) if status != "failing" => format!("{words}; last error: {e}"),
        _ => words,
    }
}

fn state_word(status: &str, error: Option<&str>) -> String {
    match status {
        "sending" => "sending".into(),
        "idle" => "idle: everything sent".into(),
        "standby" => "standby: another node of the fleet drives it".into(),
        "starting" => "starting".into(),
        "resolving" => "resolving the far side's name".into(),
        "connecting" => "connecting to the far side".into(),
        "syncing" => "waiting for the far side to say where it stands".into(),
        "failing" => match error {
            Some(e) => format!("failing, retrying: {e}"),
            None => "failing, retrying".into(),
        },
        other => other.to_string(),
    }
}

/// What an operator can do about an outlet's error, by its kind (the error's own words come first; many carry
/// their fix already).
pub fn hint(kind: &str) -> &'static str {
    match kind {
        "dns" => {
            "the far side's name does not resolve: check the name in the apps file and this host's name servers"
        }
        "connect" => {
            "nothing takes the connection: is the far side running, and are its address and port right?"
        }
        "tls" => {
            "the far side's certificate is not trusted for that name: give the outlet a ca_file, or renew or fix the certificate"
        }
        "http" => {
            "the far side answered with an error: see its answer; the records wait in the store"
        }
        "timeout" => {
            "the far side does not answer in time: is it up and reachable from here (firewall, route)?"
        }
        "socket" => {
            "the far side's port refuses, or this host cannot send there: is the far node running on that address and port?"
        }
        "refused" => {
            "the far node refuses these records: its app must accept this node's key (accept, forwarders)"
        }
        "far_state" => "the far side's store is behind what it had acknowledged: see docs/apps.md",
        "config" => "the outlet's settings are wrong: fix the apps file and reload",
        "too_large" => "a record is larger than the far side takes: see the error",
        _ => "see the error; the records wait in the store and are sent when it clears",
    }
}

/// Everything wrong now, in the order an operator should look at it: what stops acknowledgements first (the
/// loops, the fleet's database, stores), then what the node works around (outlets, paused apps, a refused reload).
/// `/healthz`'s problems are all here ([`health`] is the same rule), each with the words it has there.
pub fn issues(s: &Snapshot, loop_age: Option<Duration>, now: Instant) -> Vec<Issue> {
    let mut out = Vec::new();
    let node = |kind, severity, words: String| Issue {
        kind,
        severity,
        subject: None,
        words,
    };
    match loop_age {
        None => out.push(node(
            "receive_loop",
            "fail",
            "receive loop not started".to_string(),
        )),
        Some(a) if a >= super::metrics::HEALTH_STALE => out.push(node(
            "receive_loop",
            "fail",
            format!(
                "receive loop stuck: last turned {:.1} s ago",
                a.as_secs_f64()
            ),
        )),
        Some(_) => {}
    }
    if s.sending_loop_alive == Some(false) {
        out.push(node(
            "sending_loop",
            "fail",
            "sending loop stuck: its outlets do not run".to_string(),
        ));
    }
    let no_database: Vec<&str> = s
        .app_figures
        .iter()
        .filter(|a| a.failed.is_some() && a.failed_database)
        .map(|a| a.name.as_str())
        .collect();
    if !no_database.is_empty() {
        out.push(node(
            "database",
            "fail",
            format!(
                "this node cannot use the fleet's database, so app{} {} cannot store: check the database and the \
                 network to it (the node connects again by itself; docs/scale-out.md)",
                if no_database.len() > 1 { "s" } else { "" },
                no_database.join(", ")
            ),
        ));
    }
    for a in &s.app_figures {
        if let Some(why) = &a.failed {
            out.push(Issue {
                kind: "app_cannot_store",
                severity: "fail",
                subject: Some(a.name.clone()),
                words: format!("app {} cannot store: {why}", a.name),
            });
        }
    }
    for a in &s.app_figures {
        for o in &a.outlets {
            if !outlet_failing(o) {
                continue;
            }
            let since = o
                .failing_since
                .map(|t| {
                    format!(
                        " for {:.0} s",
                        now.saturating_duration_since(t).as_secs_f64()
                    )
                })
                .unwrap_or_default();
            let error = o
                .last_error
                .as_deref()
                .map(redact_queries)
                .unwrap_or_else(|| "no answer yet".to_string());
            let what = o.last_error_kind.map(hint).unwrap_or(hint(""));
            out.push(Issue {
                kind: "outlet_failing",
                severity: "warn",
                subject: Some(format!("{}/{}", a.name, o.name)),
                words: format!(
                    "outlet {}/{} failing{since}, {} records wait in the store: {error}; what to do: {what}",
                    a.name, o.name, o.lag_records
                ),
            });
        }
    }
    for a in s
        .app_figures
        .iter()
        .filter(|a| a.paused_for_lag && a.failed.is_none())
    {
        out.push(Issue {
            kind: "app_paused",
            severity: "warn",
            subject: Some(a.name.clone()),
            words: format!(
                "app {} takes no input: an outlet is behind its max_lag_records (its senders send again later); it \
                 resumes when every outlet is within half of it",
                a.name
            ),
        });
    }
    if let Some(r) = s.last_reload.as_ref().filter(|r| !r.applied) {
        out.push(node(
            "reload_refused",
            "warn",
            format!(
                "{}; what was in force stays: fix the file and reload again",
                r.note
                    .as_deref()
                    .unwrap_or("the last reload was refused (the log says why)")
            ),
        ));
    }
    out
}

/// Builds the status from the published snapshot, the ring and the server's addresses.
/// `wall_ms` is `now` as a wall clock (ms since the Unix epoch), for records' stored times.
pub fn report(
    s: &Snapshot,
    history: &History,
    listens: &Listens,
    started: Instant,
    loop_age: Option<Duration>,
    now: Instant,
    wall_ms: i64,
) -> Status {
    let c = &s.counters;
    let problems = match health(s, loop_age) {
        Ok(()) => Vec::new(),
        Err(why) => why.lines().map(str::to_string).collect(),
    };
    let chart = |app: &str, outlet: &str, value: u64| {
        history
            .find(app, outlet)
            .map(|series| round_all(history.rates(series, value, now)))
    };
    let rate = |app: &str, outlet: &str, value: u64| {
        history
            .find(app, outlet)
            .and_then(|series| history.rate_now(series, value, now))
            .map(round)
    };
    let mut apps = Vec::new();
    let mut outlets = Vec::new();
    for a in &s.app_figures {
        let severity = if a.failed.is_some() {
            "cannot_store"
        } else if a.paused_for_lag {
            "paused"
        } else {
            "ok"
        };
        apps.push(AppStatus {
            name: a.name.clone(),
            stored_total: a.stored_records,
            store_records: a.store_records,
            records_per_second: rate(&a.name, "", a.head),
            can_store: a.failed.is_none(),
            cannot_store_why: a.failed.clone(),
            paused: a.paused_for_lag,
            pauses_total: a.lag_pauses,
            queue_depth: a.queue_depth,
            turns_failed_total: a.turns_failed,
            severity,
            history: chart(&a.name, "", a.head),
            downlink: DownlinkStatus {
                waiting: a.down_waiting,
                queued_total: a.down_queued,
                delivered_total: a.down_delivered,
                expired_total: a.down_expired,
                refused_total: a.down_refused,
            },
        });
        for o in &a.outlets {
            let failing = o.status == "failing";
            let (lag_seconds, at_least) = if let Some(secs) = lag_seconds(o, wall_ms) {
                // From the oldest record's stored time (0 when none waits).
                (Some(round(secs)), false)
            } else {
                // Its time is not known (a fleet's store): since the ring saw the app's head pass it.
                // The oldest record not acknowledged is the one after the far side's position.
                let oldest = a.head.saturating_sub(o.lag_records);
                match history
                    .find(&a.name, "")
                    .and_then(|series| history.waited(series, oldest, now))
                {
                    Some((secs, at_least)) => (Some(round(secs)), at_least),
                    None => (None, false),
                }
            };
            outlets.push(OutletStatus {
                app: a.name.clone(),
                name: o.name.clone(),
                kind: o.kind,
                target: o.target.to_string(),
                state: o.status,
                state_words: state_words(
                    o.status,
                    o.last_error.as_deref().map(redact_queries).as_deref(),
                ),
                failing,
                severity: if failing {
                    "failing"
                } else if matches!(o.status, "sending" | "idle" | "standby") {
                    "ok"
                } else {
                    "waiting"
                },
                last_error: o.last_error.as_deref().map(redact_queries),
                last_error_kind: o.last_error_kind,
                hint: o.last_error_kind.map(hint),
                failing_seconds: o
                    .failing_since
                    .map(|t| round(now.saturating_duration_since(t).as_secs_f64())),
                state_seconds: o
                    .status_since
                    .map(|t| round(now.saturating_duration_since(t).as_secs_f64())),
                lag_records: o.lag_records,
                lag_seconds,
                lag_seconds_at_least: at_least,
                sent_total: o.sent_records,
                records_per_second: rate(&a.name, &o.name, o.sent_records),
                held_bytes: o.held_bytes,
                errors: o.errors.iter().copied().collect(),
                history: chart(&a.name, &o.name, o.sent_records),
            });
        }
    }
    let unauth = c.x25519.saturating_sub(c.x25519_authentic);
    let unauth_rate = rate("", NODE_X25519, unauth);
    let issues = issues(s, loop_age, now);
    Status {
        version: env!("CARGO_PKG_VERSION"),
        node_key: s.node_key.clone(),
        uptime_seconds: round(now.saturating_duration_since(started).as_secs_f64()),
        healthy: problems.is_empty(),
        health: if !problems.is_empty() {
            "unhealthy"
        } else if issues.is_empty() {
            "ok"
        } else {
            "degraded"
        },
        problems,
        issues,
        listens: ListensOut {
            udp: s.link_addr.map(|a| a.to_string()),
            http: listens.http.map(|a| a.to_string()),
            https: listens.tls,
            metrics: listens.metrics.map(|a| a.to_string()),
        },
        senders: s.senders,
        active_runs: s.sessions,
        receive_loop_age_seconds: loop_age.map(|a| round(a.as_secs_f64())),
        sending_loop_up: s.sending_loop_alive,
        apps,
        outlets,
        drops: Drops {
            total: c.total_dropped(),
            per_second: rate("", NODE_DROPS, c.total_dropped()),
            by_stage: DropReason::ALL
                .iter()
                .map(|r| (r.name(), c.dropped(*r)))
                .collect(),
            history: chart("", NODE_DROPS, c.total_dropped()),
        },
        x25519: X25519 {
            budget_per_second: s.x25519_budget,
            unauthenticated_per_second: unauth_rate,
            budget_used: unauth_rate
                .filter(|_| s.x25519_budget > 0)
                .map(|r| round(r / f64::from(s.x25519_budget))),
            total: c.x25519,
            authentic_total: c.x25519_authentic,
            history: chart("", NODE_X25519, unauth),
        },
        reloads: Reloads {
            applied_total: s.reloads_ok,
            refused_total: s.reloads_failed,
            last: s.last_reload.as_ref().map(|r| LastReloadOut {
                outcome: if r.applied { "applied" } else { "refused" },
                seconds_ago: round(now.saturating_duration_since(r.at).as_secs_f64()),
                why: r.note.clone(),
            }),
        },
        history: HistoryInfo {
            interval_seconds: SAMPLE_EVERY.as_secs(),
            ends_seconds_ago: history.ends_ago(now),
            ring_bytes: history.bytes(),
            ring_max_bytes: History::MAX_BYTES,
            series_left_out: history.left_out,
        },
        // Read from the host by the caller, which may (the HTTP thread); this stays pure.
        host: Default::default(),
        devices: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::common::figures::{AppFigures, OutletFigures};

    fn snapshot(head: u64, sent: u64, lag: u64) -> Snapshot {
        Snapshot {
            app_figures: vec![AppFigures {
                name: "main".into(),
                stored_records: head - 1,
                head,
                outlets: vec![OutletFigures {
                    name: "cloud".into(),
                    kind: "webhook",
                    lag_records: lag,
                    sent_records: sent,
                    status: "failing",
                    last_error: Some("connection refused".into()),
                    last_error_kind: Some("connect"),
                    target: "http://127.0.0.1:9/in".into(),
                    ..OutletFigures::default()
                }],
                ..AppFigures::default()
            }],
            x25519_budget: 100,
            ..Snapshot::default()
        }
    }

    #[test]
    fn rates_lag_and_the_moving_last_point() {
        let t0 = Instant::now();
        let mut h = History::new(t0);
        // 10 records/s stored; the outlet sent nothing after the first 11.
        for i in 0..4u64 {
            h.sample(
                t0 + SAMPLE_EVERY * i as u32,
                &snapshot(1 + 50 * i, 0, 50 * i),
            );
        }
        let now = t0 + SAMPLE_EVERY * 3 + Duration::from_secs(3);
        let s = report(
            &snapshot(181, 0, 180),
            &h,
            &Listens::default(),
            t0,
            Some(Duration::ZERO),
            now,
            0,
        );
        let app = &s.apps[0];
        assert_eq!(app.records_per_second, Some(10.0));
        let hist = app.history.as_ref().unwrap();
        assert_eq!(hist.len(), 4);
        assert_eq!(hist[..3], [Some(10.0); 3]);
        assert_eq!(
            hist[3],
            Some(10.0),
            "the point in progress: 30 records in 3 s"
        );
        let o = &s.outlets[0];
        assert!(o.failing);
        assert_eq!(o.severity, "failing");
        assert_eq!(o.hint, Some(hint("connect")));
        // Position 1 was stored by the second sample (head 51): it has waited since then, 13 s.
        assert_eq!(o.lag_seconds, Some(13.0));
        assert!(!o.lag_seconds_at_least);
        assert_eq!(s.history.ends_seconds_ago, vec![13.0, 8.0, 3.0, 0.0]);
        assert!(s.healthy);
    }

    /// Not a check of a bound: prints how big `/status.json` is for a node with two apps and two outlets after an
    /// hour of varied rates (what a page open in a browser fetches every 2 s).
    #[test]
    fn the_json_of_an_hour() {
        let t0 = Instant::now();
        let mut h = History::new(t0);
        let mut s = snapshot(1, 0, 0);
        s.app_figures[0].outlets.push(OutletFigures {
            name: "archive".into(),
            kind: "app",
            ..OutletFigures::default()
        });
        s.app_figures.push(AppFigures {
            name: "archive".into(),
            head: 1,
            ..AppFigures::default()
        });
        for k in 0..SAMPLES as u64 {
            let head = 1 + k * k * 7 % 100_003 + k * 1234;
            s.app_figures[0].head = head;
            s.app_figures[1].head = head;
            s.app_figures[0].outlets[1].sent_records = head - 1;
            s.counters.x25519 = k * 3;
            h.sample(t0 + SAMPLE_EVERY * k as u32, &s);
        }
        let now = t0 + SAMPLE_EVERY * SAMPLES as u32;
        let json =
            serde_json::to_vec(&report(&s, &h, &Listens::default(), t0, None, now, 0)).unwrap();
        eprintln!(
            "/status.json after an hour, 2 apps and 2 outlets: {} bytes",
            json.len()
        );
        assert!(json.len() > 6 * SAMPLES, "every series has its hour");
    }

    /// Each of the issue's cases makes the node `degraded` (or `unhealthy` when `/healthz` says 503) and is listed
    /// with its subject; every line `/healthz` says is an issue too.
    #[test]
    fn health_says_degraded_and_lists_each_issue() {
        let t0 = Instant::now();
        let h = History::new(t0);
        let at = |s: &Snapshot| report(s, &h, &Listens::default(), t0, Some(Duration::ZERO), t0, 0);
        let kinds = |st: &Status| -> Vec<(&'static str, Option<String>)> {
            st.issues
                .iter()
                .map(|i| (i.kind, i.subject.clone()))
                .collect()
        };
        // A working outlet: ok, nothing listed.
        let mut s = snapshot(5, 4, 0);
        s.app_figures[0].outlets[0].status = "idle";
        s.app_figures[0].outlets[0].last_error = None;
        let st = at(&s);
        assert_eq!((st.health, st.healthy, st.issues.len()), ("ok", true, 0));

        // A failing outlet: degraded, /healthz still 200.
        let mut s = snapshot(5, 0, 4);
        s.app_figures[0].outlets[0].failing_since = Some(t0);
        let st = at(&s);
        assert_eq!((st.health, st.healthy), ("degraded", true));
        assert_eq!(kinds(&st), [("outlet_failing", Some("main/cloud".into()))]);
        let words = &st.issues[0].words;
        assert!(
            words.contains("connection refused") && words.contains("4 records wait"),
            "{words}"
        );
        // Between two tries with its error standing, it is still failing; a token in its URL is not shown.
        s.app_figures[0].outlets[0].status = "syncing";
        s.app_figures[0].outlets[0].last_error = Some("http://h/x?token=s3cret: refused".into());
        let st = at(&s);
        assert_eq!(st.issues[0].kind, "outlet_failing");
        assert!(!st.issues[0].words.contains("s3cret"), "{:?}", st.issues);

        // A paused app and a refused reload: degraded.
        let mut s = snapshot(5, 4, 0);
        s.app_figures[0].outlets[0].status = "sending";
        s.app_figures[0].outlets[0].last_error = None;
        s.app_figures[0].paused_for_lag = true;
        s.last_reload = Some(crate::common::figures::LastReload {
            at: t0,
            applied: false,
            note: Some("last reload refused (apps.toml:2: turn_records)".into()),
        });
        let st = at(&s);
        assert_eq!(st.health, "degraded");
        assert_eq!(
            kinds(&st),
            [
                ("app_paused", Some("main".into())),
                ("reload_refused", None)
            ]
        );
        assert!(
            st.issues[1].words.contains("apps.toml:2"),
            "{:?}",
            st.issues
        );

        // A store that cannot commit: unhealthy, as /healthz says; on a fleet, the database is named first.
        let mut s = snapshot(5, 4, 0);
        s.app_figures[0].outlets.clear();
        s.app_figures[0].failed = Some("the disk is full".into());
        s.app_figures[0].paused_for_lag = true;
        let st = at(&s);
        assert_eq!((st.health, st.healthy), ("unhealthy", false));
        assert_eq!(kinds(&st), [("app_cannot_store", Some("main".into()))]);
        s.app_figures[0].failed_database = true;
        let st = at(&s);
        assert_eq!(
            kinds(&st),
            [
                ("database", None),
                ("app_cannot_store", Some("main".into()))
            ]
        );
        assert_eq!(st.issues[0].severity, "fail");
        s.sending_loop_alive = Some(false);
        let st = report(&s, &h, &Listens::default(), t0, None, t0, 0);
        for line in &st.problems {
            assert!(
                st.issues
                    .iter()
                    .any(|i| i.severity == "fail" && &i.words == line),
                "{line} not in {:?}",
                st.issues
            );
        }
        assert_eq!(st.problems.len(), 3, "{:?}", st.problems);
    }

    /// An outlet's lag in seconds comes from its oldest record's stored time when the host knows it, whatever the
    /// ring holds (after a restart it holds nothing older than the start), and `/metrics` says the same.
    #[test]
    fn lag_seconds_come_from_the_stored_time() {
        let t0 = Instant::now();
        let h = History::new(t0);
        let mut s = snapshot(501, 0, 500);
        s.app_figures[0].store_records = Some(500);
        s.app_figures[0].outlets[0].oldest_stored_ms = Some(1_000_000);
        let st = report(
            &s,
            &h,
            &Listens::default(),
            t0,
            Some(Duration::ZERO),
            t0,
            1_050_250,
        );
        let o = &st.outlets[0];
        assert_eq!(
            (o.lag_seconds, o.lag_seconds_at_least),
            (Some(50.25), false)
        );
        assert_eq!(st.apps[0].store_records, Some(500));
        let page = super::super::metrics::render(
            &s,
            super::super::metrics::ProcessFigures::default(),
            Some(Duration::ZERO),
            1_050_250,
        );
        for line in [
            "pure_outlet_lag_seconds{app=\"main\",outlet=\"cloud\"} 50.250\n",
            "pure_outlet_failing{app=\"main\",outlet=\"cloud\"} 1\n",
            "pure_app_store_records{app=\"main\"} 500\n",
        ] {
            assert!(page.contains(line), "{line} not in:\n{page}");
        }
        // Nothing waiting: 0 s, whatever the time. A clock set back never makes it negative.
        s.app_figures[0].outlets[0].lag_records = 0;
        s.app_figures[0].outlets[0].status = "idle";
        s.app_figures[0].outlets[0].last_error = None;
        let st = report(
            &s,
            &h,
            &Listens::default(),
            t0,
            Some(Duration::ZERO),
            t0,
            1_050_250,
        );
        assert_eq!(st.outlets[0].lag_seconds, Some(0.0));
        s.app_figures[0].outlets[0].lag_records = 3;
        let st = report(
            &s,
            &h,
            &Listens::default(),
            t0,
            Some(Duration::ZERO),
            t0,
            999_000,
        );
        assert_eq!(st.outlets[0].lag_seconds, Some(0.0));
        let page = super::super::metrics::render(
            &s,
            super::super::metrics::ProcessFigures::default(),
            None,
            999_000,
        );
        assert!(page.contains("pure_outlet_failing{app=\"main\",outlet=\"cloud\"} 0\n"));
    }

    #[test]
    fn queries_are_left_out_of_errors() {
        assert_eq!(
            redact_queries("http://h:9/in?token=s3cret: cannot connect to h:9: refused"),
            "http://h:9/in?…: cannot connect to h:9: refused"
        );
        assert_eq!(
            redact_queries("a https://x/p and https://y/q?k=v end"),
            "a https://x/p and https://y/q?… end"
        );
        assert_eq!(redact_queries("no url here"), "no url here");
    }

    #[test]
    fn the_ring_is_bounded_whatever_the_configuration() {
        let t0 = Instant::now();
        let mut h = History::new(t0);
        let long = "x".repeat(10_000);
        let mut s = Snapshot::default();
        for i in 0..400 {
            s.app_figures.push(AppFigures {
                name: format!("{i}{long}"),
                head: 1,
                ..AppFigures::default()
            });
        }
        for k in 0..(SAMPLES as u32 + 10) {
            h.sample(t0 + SAMPLE_EVERY * k, &s);
        }
        assert!(h.bytes() <= History::MAX_BYTES, "{}", h.bytes());
        eprintln!(
            "ring at its most: {} bytes (bound {})",
            h.bytes(),
            History::MAX_BYTES
        );
        assert_eq!(h.series.len(), MAX_SERIES);
        assert_eq!(h.left_out, 400 + 2 - MAX_SERIES);
        assert_eq!(h.slots().count(), SAMPLES);
    }

    #[test]
    fn series_come_and_go_with_the_configuration() {
        let t0 = Instant::now();
        let mut h = History::new(t0);
        h.sample(t0, &snapshot(1, 0, 0));
        assert!(h.find("main", "cloud").is_some());
        h.sample(t0 + SAMPLE_EVERY, &Snapshot::default());
        assert!(h.find("main", "cloud").is_none());
        h.sample(t0 + SAMPLE_EVERY * 2, &snapshot(5, 0, 0));
        let s = report(
            &snapshot(9, 0, 0),
            &h,
            &Listens::default(),
            t0,
            None,
            t0 + SAMPLE_EVERY * 3,
            0,
        );
        // The app's chart is empty before it came back, then 4 records in 5 s.
        assert_eq!(
            s.apps[0].history.as_ref().unwrap(),
            &vec![None, None, Some(0.8)]
        );
        assert!(!s.healthy, "the loop never turned");
    }
}
