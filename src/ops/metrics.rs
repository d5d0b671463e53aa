//! `/metrics` (Prometheus text format 0.0.4) and `/healthz` on `--http-port`, served by a small hand-written
//! HTTP/1.1 responder on its own thread.
//!
//! Why no framework: two read-only pages do not justify an async runtime and its threads on a Raspberry Pi. The
//! responder answers one request per connection (`Connection: close`), one connection at a time, with short
//! socket timeouts, so a slow or hostile client delays only other scrapes — never the receive loop, which only
//! ever writes a [`Snapshot`] under a lock held for a copy, and bumps a [`Heartbeat`].
//!
//! Names follow Prometheus conventions: base units, `_total` on counters, labels only of small fixed sets (app,
//! drop stage). There are no per-sender labels: a million senders would be a million series.
//!
//! `/healthz` answers 200 while the receive loop has turned within [`HEALTH_STALE`] and 503 otherwise (including
//! before its first round), so a stuck loop shows even when systemd's watchdog is not in use.

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use thiserror::Error;

use crate::proto::node::{DropReason, NodeCounters};
use crate::receive::LiveStats;

/// A receive loop that has not turned for this long is reported unhealthy. The loop turns at least every 100 ms
/// when idle; only a commit (an fsync on a slow SD card) or a stuck store keeps it away longer.
pub const HEALTH_STALE: Duration = Duration::from_secs(10);
/// Per-connection read and write timeout: a scrape is one small request.
const IO_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest request head read; anything longer is answered 431 and closed.
const MAX_REQUEST: usize = 8 * 1024;

#[derive(Debug, Error)]
pub enum MetricsError {
    #[error(
        "cannot listen on TCP {addr} for metrics: {source} (is another node on that port? choose one with --http-port)"
    )]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot start the metrics thread: {0}")]
    Thread(std::io::Error),
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

/// The health rule: the loop has turned, and recently.
pub fn healthy(age: Option<Duration>, stale: Duration) -> bool {
    age.is_some_and(|a| a < stale)
}

/// Process figures read from /proc at scrape time.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessFigures {
    pub threads: Option<u64>,
    pub resident_bytes: Option<u64>,
}

impl ProcessFigures {
    pub fn read() -> Self {
        let threads = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("Threads:"))
                    .and_then(|v| v.trim().parse().ok())
            });
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        let resident_bytes = std::fs::read_to_string("/proc/self/statm")
            .ok()
            .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
            .filter(|_| page > 0)
            .map(|pages| pages * page as u64);
        ProcessFigures {
            threads,
            resident_bytes,
        }
    }
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// Renders the metrics page.
pub fn render(s: &Snapshot, process: ProcessFigures, loop_age: Option<Duration>) -> String {
    let c = &s.counters;
    let mut out = String::with_capacity(4096);
    family(
        &mut out,
        "pure_records_stored_total",
        "counter",
        "Records committed to an app's store (each exactly once).",
    );
    // The store reports stored records per turn, not per app; with one app (no --apps) they are the same.
    if let [app] = s.apps.as_slice() {
        let _ = writeln!(
            out,
            "pure_records_stored_total{{app=\"{app}\"}} {}",
            c.stored_records
        );
    } else {
        let _ = writeln!(
            out,
            "pure_records_stored_total{{app=\"\"}} {}",
            c.stored_records
        );
    }
    let simple: [(&str, &str, &str, u64); 12] = [
        (
            "pure_records_duplicate_total",
            "counter",
            "Records received again after they were stored; nothing stored.",
            c.duplicate_records,
        ),
        (
            "pure_records_gap_total",
            "counter",
            "Records that arrived ahead of a missing one; not stored, the sender resends.",
            c.gap_records,
        ),
        (
            "pure_packets_received_total",
            "counter",
            "UDP datagrams read from the link socket.",
            c.datagrams,
        ),
        (
            "pure_acks_sent_total",
            "counter",
            "Stored acks sent (each after its commit).",
            c.acks_sent,
        ),
        (
            "pure_frames_refused_total",
            "counter",
            "DATA frames for an app this node does not host.",
            c.refused_frames,
        ),
        (
            "pure_x25519_total",
            "counter",
            "X25519 operations: one per candidate key not in the memo, tried for a packet no session opened (forged packets included).",
            c.x25519,
        ),
        (
            "pure_memo_hits_total",
            "counter",
            "Shared secrets taken from the memo instead of an X25519: one per candidate key tried for a packet no session opened (forged packets included).",
            c.memo_hits,
        ),
        (
            "pure_sessions_made_total",
            "counter",
            "Sessions made by the first packet of a run.",
            c.sessions_made,
        ),
        (
            "pure_sessions_swept_total",
            "counter",
            "Sessions forgotten after --link-idle-ms of quiet.",
            c.sessions_swept,
        ),
        (
            "pure_sessions_active",
            "gauge",
            "Runs with state in the session cache.",
            s.sessions as u64,
        ),
        (
            "pure_senders",
            "gauge",
            "Senders on the allow-list in force.",
            s.senders as u64,
        ),
        (
            "pure_reloads_failed_total",
            "counter",
            "Reloads of the senders file refused (the old list stayed).",
            s.reloads_failed,
        ),
    ];
    for (name, kind, help, value) in simple {
        family(&mut out, name, kind, help);
        let _ = writeln!(out, "{name} {value}");
    }
    family(
        &mut out,
        "pure_reloads_total",
        "counter",
        "Reloads of the senders file that took effect.",
    );
    let _ = writeln!(out, "pure_reloads_total {}", s.reloads_ok);
    family(
        &mut out,
        "pure_turns_total",
        "counter",
        "Turns applied to the stores: committed, or failed and rolled back (nothing of them acked).",
    );
    let _ = writeln!(
        out,
        "pure_turns_total{{outcome=\"committed\"}} {}",
        c.turns_committed
    );
    let _ = writeln!(
        out,
        "pure_turns_total{{outcome=\"failed\"}} {}",
        c.turns_failed
    );
    family(
        &mut out,
        "pure_commit_seconds_total",
        "counter",
        "Time spent applying and committing turns; divided by the turns, the mean time to stored.",
    );
    let _ = writeln!(out, "pure_commit_seconds_total {}", s.commit_seconds);
    family(
        &mut out,
        "pure_drops_total",
        "counter",
        "Datagrams dropped, by the stage that dropped them.",
    );
    for r in DropReason::ALL {
        let _ = writeln!(
            out,
            "pure_drops_total{{stage=\"{}\"}} {}",
            r.name(),
            c.dropped(r)
        );
    }
    if let Some(t) = process.threads {
        family(&mut out, "pure_threads", "gauge", "Threads of the process.");
        let _ = writeln!(out, "pure_threads {t}");
    }
    if let Some(b) = process.resident_bytes {
        family(
            &mut out,
            "process_resident_memory_bytes",
            "gauge",
            "Resident memory size in bytes.",
        );
        let _ = writeln!(out, "process_resident_memory_bytes {b}");
    }
    if let Some(a) = loop_age {
        family(
            &mut out,
            "pure_receive_loop_age_seconds",
            "gauge",
            "Time since the receive loop last turned.",
        );
        let _ = writeln!(out, "pure_receive_loop_age_seconds {:.3}", a.as_secs_f64());
    }
    out
}

/// The metrics and health listener, bound before the node reports ready.
pub struct HttpServer {
    listener: TcpListener,
}

impl HttpServer {
    pub fn bind(addr: SocketAddr) -> Result<Self, MetricsError> {
        let listener =
            TcpListener::bind(addr).map_err(|source| MetricsError::Bind { addr, source })?;
        Ok(HttpServer { listener })
    }

    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.listener.local_addr().ok()
    }

    /// Serves on a thread of its own for the rest of the process.
    pub fn spawn(self, stats: Arc<LiveStats>) -> Result<(), MetricsError> {
        std::thread::Builder::new()
            .name("pure-http".into())
            .spawn(move || {
                for conn in self.listener.incoming() {
                    match conn {
                        Ok(stream) => {
                            if let Err(e) = serve(stream, &stats) {
                                tracing::debug!("metrics connection: {e}");
                            }
                        }
                        // EMFILE and friends: back off instead of spinning on a listener that cannot accept.
                        Err(e) => {
                            tracing::debug!("metrics accept: {e}");
                            std::thread::sleep(Duration::from_millis(100));
                        }
                    }
                }
            })
            .map_err(MetricsError::Thread)?;
        Ok(())
    }
}

/// What a request asked for, from its request line.
#[derive(Debug, PartialEq, Eq)]
enum Route {
    Metrics,
    Health,
    Index,
    NotFound,
    BadMethod,
}

fn route(head: &str) -> (Route, bool) {
    let mut parts = head.lines().next().unwrap_or("").split_whitespace();
    let method = parts.next().unwrap_or("");
    let target = parts.next().unwrap_or("");
    let path = target.split('?').next().unwrap_or("");
    let head_only = method == "HEAD";
    if method != "GET" && !head_only {
        return (Route::BadMethod, false);
    }
    let r = match path {
        "/metrics" => Route::Metrics,
        "/healthz" => Route::Health,
        "/" => Route::Index,
        _ => Route::NotFound,
    };
    (r, head_only)
}

fn serve(mut stream: TcpStream, stats: &LiveStats) -> std::io::Result<()> {
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    let complete = loop {
        if buf.windows(4).any(|w| w == b"\r\n\r\n") || buf.windows(2).any(|w| w == b"\n\n") {
            break true;
        }
        if buf.len() >= MAX_REQUEST {
            break false;
        }
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            // The client closed before finishing its request; answer what we have if it has a request line.
            break buf.contains(&b'\n');
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    if !complete {
        return respond(
            &mut stream,
            "431 Request Header Fields Too Large",
            "text/plain",
            "request too large\n",
            false,
        );
    }
    let head = String::from_utf8_lossy(&buf);
    let (route, head_only) = route(&head);
    let now = Instant::now();
    match route {
        Route::Metrics => {
            let snapshot = match stats.snapshot.lock() {
                Ok(s) => s.clone(),
                // The loop panicked while publishing; the last figures are still worth showing.
                Err(poisoned) => poisoned.into_inner().clone(),
            };
            let body = render(&snapshot, ProcessFigures::read(), stats.heartbeat.age(now));
            respond(
                &mut stream,
                "200 OK",
                "text/plain; version=0.0.4; charset=utf-8",
                &body,
                head_only,
            )
        }
        Route::Health => {
            let age = stats.heartbeat.age(now);
            if healthy(age, HEALTH_STALE) {
                respond(&mut stream, "200 OK", "text/plain", "ok\n", head_only)
            } else {
                let body = match age {
                    None => "receive loop not started\n".to_string(),
                    Some(a) => format!(
                        "receive loop stuck: last turned {:.1} s ago\n",
                        a.as_secs_f64()
                    ),
                };
                respond(
                    &mut stream,
                    "503 Service Unavailable",
                    "text/plain",
                    &body,
                    head_only,
                )
            }
        }
        Route::Index => respond(
            &mut stream,
            "200 OK",
            "text/plain",
            "pure-serve: /metrics (Prometheus), /healthz\n",
            head_only,
        ),
        Route::NotFound => respond(
            &mut stream,
            "404 Not Found",
            "text/plain",
            "not found: try /metrics or /healthz\n",
            head_only,
        ),
        Route::BadMethod => respond(
            &mut stream,
            "405 Method Not Allowed",
            "text/plain",
            "only GET and HEAD\n",
            false,
        ),
    }
}

fn respond(
    stream: &mut TcpStream,
    status: &str,
    content_type: &str,
    body: &str,
    head_only: bool,
) -> std::io::Result<()> {
    let mut out = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    if !head_only {
        out.push_str(body);
    }
    stream.write_all(out.as_bytes())?;
    stream.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_needs_a_recent_turn() {
        let stale = Duration::from_secs(10);
        assert!(!healthy(None, stale));
        assert!(healthy(Some(Duration::from_millis(100)), stale));
        assert!(!healthy(Some(Duration::from_secs(11)), stale));
    }

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

    #[test]
    fn routes() {
        assert_eq!(route("GET /metrics HTTP/1.1\r\n"), (Route::Metrics, false));
        assert_eq!(route("HEAD /healthz HTTP/1.0\r\n"), (Route::Health, true));
        assert_eq!(
            route("GET /metrics?x=1 HTTP/1.1\r\n"),
            (Route::Metrics, false)
        );
        assert_eq!(route("POST /metrics HTTP/1.1\r\n").0, Route::BadMethod);
        assert_eq!(route("GET /nope HTTP/1.1\r\n").0, Route::NotFound);
        assert_eq!(route("").0, Route::BadMethod);
    }

    #[test]
    fn page_has_every_family_and_no_sender_labels() {
        let mut s = Snapshot {
            apps: vec!["main".into()],
            senders: 3,
            sessions: 2,
            ..Snapshot::default()
        };
        s.counters.stored_records = 42;
        s.counters.drops[DropReason::Auth as usize] = 5;
        let page = render(
            &s,
            ProcessFigures {
                threads: Some(3),
                resident_bytes: Some(4096),
            },
            Some(Duration::from_millis(5)),
        );
        assert!(page.contains("pure_records_stored_total{app=\"main\"} 42\n"));
        assert!(page.contains("pure_drops_total{stage=\"auth\"} 5\n"));
        assert!(page.contains("pure_drops_total{stage=\"turn_full\"} 0\n"));
        assert!(page.contains("pure_sessions_active 2\n"));
        assert!(page.contains("pure_threads 3\n"));
        assert!(page.contains("# TYPE pure_x25519_total counter\n"));
        assert!(!page.contains("sender="));
        // Every sample line is `name{labels} value` with a numeric value.
        for line in page.lines().filter(|l| !l.starts_with('#')) {
            let value = line.rsplit(' ').next().unwrap();
            assert!(value.parse::<f64>().is_ok(), "{line}");
        }
    }
}
