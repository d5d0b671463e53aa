//! What `/metrics` (Prometheus text format 0.0.4) and `/healthz` say, as pure functions of what the receive loop
//! publishes: a [`Snapshot`] it copies under a lock once per round, and a [`Heartbeat`](crate::common::figures::Heartbeat) it bumps. The HTTP server
//! that serves them, on its own thread, is [`crate::http`]; it appends its own families to the page. The receive
//! loop never waits for a reader: it holds the lock only for a copy.
//!
//! Names follow Prometheus conventions: base units, `_total` on counters, labels only of small fixed sets (app,
//! drop stage). There are no per-sender labels: a million senders would be a million series.
//!
//! `/healthz` answers 200 while the receive loop has turned within [`HEALTH_STALE`] and 503 otherwise (including
//! before its first round), so a stuck loop shows even when systemd's watchdog is not in use.

use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;

use crate::common::figures::{AppFigures, OutletFigures, Snapshot};
use crate::proto::node::DropReason;

/// A receive loop that has not turned for this long is reported unhealthy. The loop turns at least every 100 ms
/// when idle; only a commit (an fsync on a slow SD card) or a stuck store keeps it away longer.
pub const HEALTH_STALE: Duration = Duration::from_secs(10);
/// The health rule: the loop has turned, and recently.
pub fn healthy(age: Option<Duration>, stale: Duration) -> bool {
    age.is_some_and(|a| a < stale)
}

/// Now, in milliseconds since the Unix epoch: what records' `stored_at` is compared with.
pub fn wall_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Whether an outlet is failing: failing now, or between two tries (resolving, syncing again) with the error that
/// failed it standing. `pure_outlet_failing` and the status page's `outlet_failing` issue say the same.
pub fn outlet_failing(o: &OutletFigures) -> bool {
    o.status == "failing"
        || (o.last_error.is_some() && !matches!(o.status, "sending" | "idle" | "standby"))
}

/// How long an outlet's oldest record not acknowledged has waited since it was stored, in seconds, at `wall_ms`:
/// 0 when none waits, `None` when its time is not known (docs/operations.md, `pure_outlet_lag_seconds`).
pub fn lag_seconds(o: &OutletFigures, wall_ms: i64) -> Option<f64> {
    if o.lag_records == 0 {
        return Some(0.0);
    }
    o.oldest_stored_ms
        .map(|ms| (wall_ms.saturating_sub(ms)).max(0) as f64 / 1000.0)
}

/// Process figures read from /proc, and the state directory's filesystem from statvfs(2), at scrape time (on the
/// HTTP thread: no loop waits for them).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ProcessFigures {
    pub threads: Option<u64>,
    pub resident_bytes: Option<u64>,
    /// Anonymous resident memory (`RssAnon`): the node's own heap and stacks, not the files it maps.
    pub anonymous_bytes: Option<u64>,
    /// Bytes this process caused to be written to storage since it started (`write_bytes` of /proc/self/io): on
    /// a Raspberry Pi, the SD card's wear.
    pub disk_written_bytes: Option<u64>,
    /// The CPU's temperature where the host says it (/sys/class/thermal: the zone named for the CPU, else the
    /// hottest).
    pub cpu_temperature_celsius: Option<f64>,
    /// Bytes the node may still write on the state directory's filesystem (`f_bavail`), and its size.
    pub state_free_bytes: Option<u64>,
    pub state_size_bytes: Option<u64>,
    /// Each app's store on disk (its file, `-wal` and `-shm`), by app; none on a fleet's database.
    pub store_bytes: Vec<StoreSize>,
}

/// One app's store on disk.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StoreSize {
    pub app: String,
    pub bytes: u64,
}

/// A `Key: N kB` line of a /proc file, in bytes.
fn proc_kb(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
}

/// The CPU's temperature from /sys/class/thermal: a zone whose type names the CPU (`cpu-thermal` on a Raspberry
/// Pi, `x86_pkg_temp` on a PC), else the hottest zone; `None` where there is none (a VM, a container).
fn cpu_temperature() -> Option<f64> {
    let mut best: Option<(bool, f64)> = None;
    for entry in std::fs::read_dir("/sys/class/thermal").ok()?.flatten() {
        let dir = entry.path();
        let Some(milli) = std::fs::read_to_string(dir.join("temp"))
            .ok()
            .and_then(|t| t.trim().parse::<i64>().ok())
        else {
            continue;
        };
        let kind = std::fs::read_to_string(dir.join("type")).unwrap_or_default();
        let cpu = kind.contains("cpu") || kind.contains("pkg") || kind.contains("soc");
        let c = milli as f64 / 1000.0;
        if best.is_none_or(|(bc, bt)| (cpu && !bc) || (cpu == bc && c > bt)) {
            best = Some((cpu, c));
        }
    }
    best.map(|(_, c)| c)
}

/// The filesystem under `dir`: (bytes available to an unprivileged writer, bytes in all).
fn filesystem(dir: &std::path::Path) -> Option<(u64, u64)> {
    use std::os::unix::ffi::OsStrExt as _;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs(2) with a NUL-terminated path and a zeroed struct it fills.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
        return None;
    }
    let unit = st.f_frsize as u64;
    Some((
        (st.f_bavail as u64).saturating_mul(unit),
        (st.f_blocks as u64).saturating_mul(unit),
    ))
}

impl ProcessFigures {
    /// Reads them; `state` is the node's state directory, `apps` its apps (their stores' sizes, where they are
    /// files under it).
    pub fn read(state: Option<&std::path::Path>, apps: &[String]) -> Self {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let threads = status
            .lines()
            .find_map(|l| l.strip_prefix("Threads:"))
            .and_then(|v| v.trim().parse().ok());
        let anonymous_bytes = proc_kb(&status, "RssAnon:");
        let disk_written_bytes = std::fs::read_to_string("/proc/self/io")
            .ok()
            .and_then(|io| {
                io.lines()
                    .find_map(|l| l.strip_prefix("write_bytes:"))
                    .and_then(|v| v.trim().parse().ok())
            });
        let store_bytes = state
            .map(|dir| {
                apps.iter()
                    .filter_map(|app| {
                        let path = crate::store::app_store_path(dir, app);
                        let main = std::fs::metadata(&path).ok()?.len();
                        let side = |suffix: &str| {
                            let mut p = path.clone().into_os_string();
                            p.push(suffix);
                            std::fs::metadata(p).map_or(0, |m| m.len())
                        };
                        Some(StoreSize {
                            app: app.clone(),
                            bytes: main + side("-wal") + side("-shm"),
                        })
                    })
                    .collect()
            })
            .unwrap_or_default();
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        let resident_bytes = std::fs::read_to_string("/proc/self/statm")
            .ok()
            .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
            .filter(|_| page > 0)
            .map(|pages| pages * page as u64);
        let fs = state.and_then(filesystem);
        ProcessFigures {
            threads,
            resident_bytes,
            anonymous_bytes,
            disk_written_bytes,
            cpu_temperature_celsius: cpu_temperature(),
            state_free_bytes: fs.map(|f| f.0),
            state_size_bytes: fs.map(|f| f.1),
            store_bytes,
        }
    }
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// Renders the metrics page; `wall_ms` is now ([`wall_ms`]).
pub fn render(
    s: &Snapshot,
    process: ProcessFigures,
    loop_age: Option<Duration>,
    wall_ms: i64,
) -> String {
    let c = &s.counters;
    let mut out = String::with_capacity(4096);
    family(
        &mut out,
        "pure_records_stored_total",
        "counter",
        "Records committed to an app's store and made durable (each exactly once; a commit whose sync failed is not counted).",
    );
    if !s.app_figures.is_empty() {
        for a in &s.app_figures {
            let _ = writeln!(
                out,
                "pure_records_stored_total{{app=\"{}\"}} {}",
                a.name, a.stored_records
            );
        }
    } else if let [app] = s.apps.as_slice() {
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
    let simple: [(&str, &str, &str, u64); 26] = [
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
            "Stored acks sent (each after its commit): ACK frames telling a sender of records stored since it was \
             last told; one repeating what it was told (beside NOT_STORED, or to a resent duplicate) is not counted.",
            c.acks_sent,
        ),
        (
            "pure_answers_sent_total",
            "counter",
            "Answer packets sent to senders: ACKs, ECHOs, REFUSE, NOT_STORED, DOWN.",
            c.answers_sent,
        ),
        (
            "pure_downlink_validated_total",
            "counter",
            "Sessions of version 1.2 whose address was validated (docs/protocol.md 13): from then on they may be sent DOWN records beyond what they sent, within a congestion window.",
            c.validated,
        ),
        (
            "pure_downlink_wide_datagrams_total",
            "counter",
            "Answer datagrams sent to validated sessions (an answer may be several).",
            c.wide_datagrams,
        ),
        (
            "pure_downlink_windows_lost_total",
            "counter",
            "Windows of DOWN datagrams to validated sessions taken as lost (a third duplicate acknowledgement, or a timeout): each halves a window and sends again from the device's heard sequence.",
            c.wide_losses,
        ),
        (
            "pure_frames_refused_total",
            "counter",
            "DATA and FORWARD frames for an app this node does not host, or that does not accept their sender (REFUSE reasons 1 and 2).",
            c.refused_frames,
        ),
        (
            "pure_forward_frames_refused_total",
            "counter",
            "FORWARD frames refused because the app does not let their sender forward (REFUSE reason 3, docs/protocol.md 5.4): a sender claiming records of others, or a node missing from the app's forwarders.",
            c.forward_refused_frames,
        ),
        (
            "pure_forward_records_refused_total",
            "counter",
            "Records in those FORWARD frames: none of them stored.",
            c.forward_refused_records,
        ),
        (
            "pure_x25519_total",
            "counter",
            "X25519 operations: one per candidate key not in the memo, tried for a packet no session opened (forged packets included).",
            c.x25519,
        ),
        (
            "pure_x25519_authentic_total",
            "counter",
            "X25519 operations whose packet authenticated (a real sender's first contact); the rest of pure_x25519_total is what unauthenticated input cost, bounded by the budget.",
            c.x25519_authentic,
        ),
        (
            "pure_x25519_budget",
            "gauge",
            "X25519 operations per second that input which does not authenticate may cost (--x25519-budget).",
            u64::from(s.x25519_budget),
        ),
        (
            "pure_new_run_tries_total",
            "counter",
            "Candidate senders tried for packets no session opened (a memo lookup, HKDF, an open; an X25519 if not in the memo), forged packets included.",
            c.new_run_tries,
        ),
        (
            "pure_new_run_tries_authentic_total",
            "counter",
            "Tries whose packet authenticated; the rest of pure_new_run_tries_total is what forged packets cost, bounded by 20 x the X25519 budget per second.",
            c.new_run_tries_authentic,
        ),
        (
            "pure_cookies_sent_total",
            "counter",
            "COOKIE packets sent: first packets refused an X25519 for want of a cookie, under load (docs/protocol.md 4.4).",
            c.cookies_sent,
        ),
        (
            "pure_cookies_withheld_total",
            "counter",
            "First packets refused for want of a cookie that got no COOKIE: the COOKIE rate limits were reached.",
            c.cookies_withheld,
        ),
        (
            "pure_cookies_invalid_total",
            "counter",
            "Packets that echoed a cookie not valid for their address (expired, another address, forged).",
            c.cookies_invalid,
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
            "pure_sessions_evicted_total",
            "counter",
            "Idle sessions forgotten to make room for a new run of a sender at its --sessions-per-sender.",
            c.sessions_evicted,
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
            "Reloads (SIGHUP) refused in whole or in part: the senders file or the apps file was bad, and what was in \
             force of it stayed.",
            s.reloads_failed,
        ),
    ];
    for (name, kind, help, value) in simple {
        family(&mut out, name, kind, help);
        let _ = writeln!(out, "{name} {value}");
    }
    if let Some(n) = s.store_syncs {
        family(
            &mut out,
            "pure_store_syncs_total",
            "counter",
            "Syncs (fdatasync) of the apps' stores' -wal files: one per store per group of turns. A turn that only \
             read downlink for devices needs none (on an SD card, each is a write the card wears by).",
        );
        let _ = writeln!(out, "pure_store_syncs_total {n}");
    }
    if let Some((taken, unanswered)) = s.push_datagrams {
        family(
            &mut out,
            "pure_push_datagrams_total",
            "counter",
            "Datagrams read from the push datagram socket, well formed or not (docs/downlink.md).",
        );
        let _ = writeln!(out, "pure_push_datagrams_total {taken}");
        family(
            &mut out,
            "pure_push_datagrams_unanswered_total",
            "counter",
            "Answers of the push datagram socket not sent: the pusher's socket is unbound (has no address), gone, \
             or its receive buffer is full. The pushes themselves were applied.",
        );
        let _ = writeln!(out, "pure_push_datagrams_unanswered_total {unanswered}");
    }
    if let Some(n) = s.store_connections {
        family(
            &mut out,
            "pure_store_connections_total",
            "counter",
            "Connections made to the fleet's database (--store postgres://…): 1 at the start, and one more each time a \
             lost one is made again.",
        );
        let _ = writeln!(out, "pure_store_connections_total {n}");
    }
    family(
        &mut out,
        "pure_reloads_total",
        "counter",
        "Reloads (SIGHUP) that took effect whole: the senders file and the apps file, if there is one.",
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
        "pure_not_stored_sent_total",
        "counter",
        "NOT_STORED frames sent to senders: an app's store cannot commit now (on a fleet, its database out of reach or refusing); one per app per answer.",
    );
    let _ = writeln!(out, "pure_not_stored_sent_total {}", c.not_stored_sent);
    family(
        &mut out,
        "pure_records_held_back_total",
        "counter",
        "Records decrypted but not taken, unacknowledged (the sender resends): their app was paused, or had its share of the turn.",
    );
    let _ = writeln!(
        out,
        "pure_records_held_back_total{{why=\"paused\"}} {}",
        c.paused_records
    );
    let _ = writeln!(
        out,
        "pure_records_held_back_total{{why=\"busy\"}} {}",
        c.busy_records
    );
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
    render_apps(&mut out, s, wall_ms);
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
    if let Some(b) = process.anonymous_bytes {
        family(
            &mut out,
            "pure_anonymous_memory_bytes",
            "gauge",
            "Anonymous resident memory (RssAnon): the node's own, not the files it maps.",
        );
        let _ = writeln!(out, "pure_anonymous_memory_bytes {b}");
    }
    if let Some(b) = process.disk_written_bytes {
        family(
            &mut out,
            "pure_disk_written_bytes_total",
            "counter",
            "Bytes this process caused to be written to storage since it started (the SD card's wear).",
        );
        let _ = writeln!(out, "pure_disk_written_bytes_total {b}");
    }
    if let Some(c) = process.cpu_temperature_celsius {
        family(
            &mut out,
            "pure_cpu_temperature_celsius",
            "gauge",
            "The CPU's temperature, where the host has a thermal zone for it.",
        );
        let _ = writeln!(out, "pure_cpu_temperature_celsius {c}");
    }
    if !process.store_bytes.is_empty() {
        family(
            &mut out,
            "pure_app_store_bytes",
            "gauge",
            "Bytes of each app's store on disk: its file, -wal and -shm.",
        );
        for StoreSize { app, bytes } in &process.store_bytes {
            let _ = writeln!(out, "pure_app_store_bytes{{app=\"{app}\"}} {bytes}");
        }
    }
    if let (Some(free), Some(size)) = (process.state_free_bytes, process.state_size_bytes) {
        family(
            &mut out,
            "pure_state_free_bytes",
            "gauge",
            "Bytes the node may still write on the filesystem of its state directory (its stores, unless on a \
             fleet's database).",
        );
        let _ = writeln!(out, "pure_state_free_bytes {free}");
        family(
            &mut out,
            "pure_state_size_bytes",
            "gauge",
            "Size of the filesystem of the node's state directory, in bytes.",
        );
        let _ = writeln!(out, "pure_state_size_bytes {size}");
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

/// The devices census's families (`src/ops/devices.rs`), appended to the page once its first scan has ended: absent
/// before, so that no alert reads a zero that was never counted.
pub fn render_devices(out: &mut String, c: &crate::common::figures::DeviceCensus) {
    let gauges: [(&str, &str, String); 7] = [
        (
            "pure_senders_heard_last_hour",
            "Senders with a record stored in the last hour (the devices census, at its last scan).",
            c.heard_last_hour.to_string(),
        ),
        (
            "pure_senders_heard_last_day",
            "Senders with a record stored in the last day, the last hour's included.",
            c.heard_last_day.to_string(),
        ),
        (
            "pure_senders_never_heard",
            "Senders of the allow-list with no record in any app's store.",
            c.never_heard.to_string(),
        ),
        (
            "pure_senders_quiet",
            "Senders heard of before with no record stored for --quiet-after or longer.",
            c.quiet.to_string(),
        ),
        (
            "pure_senders_quiet_after_seconds",
            "The node's --quiet-after, in seconds: how long a sender must be silent to count as quiet.",
            c.quiet_after_seconds.to_string(),
        ),
        (
            "pure_senders_scan_timestamp_seconds",
            "When the devices census last read the stores (Unix time).",
            format!("{:.3}", c.scanned_at_ms as f64 / 1000.0),
        ),
        (
            "pure_senders_scan_seconds",
            "How long the devices census's last scan of the stores took.",
            format!("{:.3}", c.scan_seconds),
        ),
    ];
    for (name, help, value) in gauges {
        family(out, name, "gauge", help);
        let _ = writeln!(out, "{name} {value}");
    }
}

/// The apps' and outlets' families (issue 7: what operators see).
fn render_apps(out: &mut String, s: &Snapshot, wall_ms: i64) {
    if s.app_figures.is_empty() {
        return;
    }
    family(
        out,
        "pure_app_store_records",
        "gauge",
        "Records the app's store holds, read from the store: every record the app stored, before the node's last \
         start too (pure_records_stored_total counts this process's).",
    );
    for a in &s.app_figures {
        if let Some(n) = a.store_records {
            let _ = writeln!(out, "pure_app_store_records{{app=\"{}\"}} {n}", a.name);
        }
    }
    // One line per app for each of these families.
    type Figure = fn(&AppFigures) -> u64;
    let per_app: [(&str, &str, &str, Figure); 11] = [
        (
            "pure_app_can_store",
            "gauge",
            "1 while the app's store commits; 0 while it cannot (its senders get no acks; /healthz says why).",
            |a| u64::from(a.failed.is_none()),
        ),
        (
            "pure_app_turns_failed_total",
            "counter",
            "Turns of the app whose transaction failed and rolled back (nothing of them acked).",
            |a| a.turns_failed,
        ),
        (
            "pure_app_store_reopen_tries_total",
            "counter",
            "Tries to reopen the app's store after it could not store (0.25 s apart, doubling to 10 s): growing while \
             pure_app_can_store is 0 says the node is still trying.",
            |a| a.reopen_tries,
        ),
        (
            "pure_app_queue_depth",
            "gauge",
            "Records offered to the app by its inner inlets and not yet stored by it.",
            |a| a.queue_depth,
        ),
        (
            "pure_app_paused",
            "gauge",
            "1 while the app takes no input because an outlet is behind its max_lag_records.",
            |a| u64::from(a.paused_for_lag),
        ),
        (
            "pure_app_pauses_total",
            "counter",
            "Times the app stopped taking input because an outlet passed its max_lag_records (it resumes at half).",
            |a| a.lag_pauses,
        ),
        (
            "pure_downlink_waiting",
            "gauge",
            "Downlink records queued in the app's store for its senders and not yet deleted (delivered, or expired: an expired record counts until its sender next asks or is pushed to).",
            |a| a.down_waiting,
        ),
        (
            "pure_downlink_delivered_total",
            "counter",
            "Downlink records deleted because their device acknowledged them (LISTEN heard at or above them).",
            |a| a.down_delivered,
        ),
        (
            "pure_downlink_expired_total",
            "counter",
            "Downlink records deleted unsent because their expiry (downlink.expiry_seconds) passed.",
            |a| a.down_expired,
        ),
        (
            "pure_downlink_queued_total",
            "counter",
            "Downlink records pushed and queued in the app's store (counted once synced, when the pusher is told).",
            |a| a.down_queued,
        ),
        (
            "pure_downlink_refused_total",
            "counter",
            "Downlink records pushed and refused by a bound (max_records, max_bytes, or larger than 1024 bytes).",
            |a| a.down_refused,
        ),
    ];
    for (name, kind, help, value) in per_app {
        family(out, name, kind, help);
        for a in &s.app_figures {
            let _ = writeln!(out, "{name}{{app=\"{}\"}} {}", a.name, value(a));
        }
    }
    let outlets = || {
        s.app_figures
            .iter()
            .flat_map(|a| a.outlets.iter().map(move |o| (a, o)))
    };
    family(
        out,
        "pure_outlet_lag_records",
        "gauge",
        "Records the app stored that the outlet's far side has not acknowledged (they wait in the store).",
    );
    for (a, o) in outlets() {
        let _ = writeln!(
            out,
            "pure_outlet_lag_records{{app=\"{}\",outlet=\"{}\",kind=\"{}\"}} {}",
            a.name, o.name, o.kind, o.lag_records
        );
    }
    family(
        out,
        "pure_outlet_lag_seconds",
        "gauge",
        "How long the outlet's oldest record not acknowledged by its far side has waited since it was stored (0: \
         none waits); never less than the truth.",
    );
    for (a, o) in outlets() {
        if let Some(secs) = lag_seconds(o, wall_ms) {
            let _ = writeln!(
                out,
                "pure_outlet_lag_seconds{{app=\"{}\",outlet=\"{}\"}} {secs:.3}",
                a.name, o.name
            );
        }
    }
    family(
        out,
        "pure_outlet_failing",
        "gauge",
        "1 while the outlet fails (failing now, or between two tries with the error that failed it standing); \
         its records wait in the store.",
    );
    for (a, o) in outlets() {
        let _ = writeln!(
            out,
            "pure_outlet_failing{{app=\"{}\",outlet=\"{}\"}} {}",
            a.name,
            o.name,
            u8::from(outlet_failing(o))
        );
    }
    family(
        out,
        "pure_outlet_sent_total",
        "counter",
        "Records the outlet's far side acknowledged as stored since the node started.",
    );
    for (a, o) in outlets() {
        let _ = writeln!(
            out,
            "pure_outlet_sent_total{{app=\"{}\",outlet=\"{}\"}} {}",
            a.name, o.name, o.sent_records
        );
    }
    family(
        out,
        "pure_outlet_driving",
        "gauge",
        "1 while this node drives the outlet: always on one node; on a fleet, while it holds the outlet's lease.",
    );
    for (a, o) in outlets().filter(|(_, o)| o.kind != "app") {
        let _ = writeln!(
            out,
            "pure_outlet_driving{{app=\"{}\",outlet=\"{}\"}} {}",
            a.name,
            o.name,
            u8::from(o.status != "standby")
        );
    }
    family(
        out,
        "pure_outlet_held_bytes",
        "gauge",
        "Bytes of records the outlet holds in memory (bounded by its memory_bytes).",
    );
    for (a, o) in outlets() {
        let _ = writeln!(
            out,
            "pure_outlet_held_bytes{{app=\"{}\",outlet=\"{}\"}} {}",
            a.name, o.name, o.held_bytes
        );
    }
    family(
        out,
        "pure_outlet_errors_total",
        "counter",
        "Outlet errors by kind: dns, connect, tls, http, timeout, unanswered, socket, refused, far_state.",
    );
    for (a, o) in outlets() {
        for (kind, n) in &o.errors {
            let _ = writeln!(
                out,
                "pure_outlet_errors_total{{app=\"{}\",outlet=\"{}\",kind=\"{kind}\"}} {n}",
                a.name, o.name
            );
        }
    }
    if let Some(alive) = s.sending_loop_alive {
        family(
            out,
            "pure_sending_loop_up",
            "gauge",
            "1 while the sending loop beats.",
        );
        let _ = writeln!(out, "pure_sending_loop_up {}", u8::from(alive));
    }
}

/// The health rule in full: the receive loop has turned recently, every app can store, and the sending loop (if
/// there is one) beats. The error names what is wrong, for `/healthz`'s body.
pub fn health(s: &Snapshot, loop_age: Option<Duration>) -> Result<(), String> {
    let mut wrong = Vec::new();
    match loop_age {
        None => wrong.push("receive loop not started".to_string()),
        Some(a) if a >= HEALTH_STALE => wrong.push(format!(
            "receive loop stuck: last turned {:.1} s ago",
            a.as_secs_f64()
        )),
        Some(_) => {}
    }
    for a in &s.app_figures {
        if let Some(why) = &a.failed {
            wrong.push(format!("app {} cannot store: {why}", a.name));
        }
    }
    if s.sending_loop_alive == Some(false) {
        wrong.push("sending loop stuck: its outlets do not run".to_string());
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(wrong.join("\n"))
    }
}

#[cfg(test)]
mod tests {

    /// Read for real from this process and a state directory of the test's: its memory and what it wrote, and a
    /// store's file with its `-wal` counted as the app's store.
    #[test]
    fn process_figures_are_read_from_proc_and_the_stores() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("apps")).unwrap();
        std::fs::write(dir.path().join("apps/main.sqlite"), vec![0u8; 4096]).unwrap();
        std::fs::write(dir.path().join("apps/main.sqlite-wal"), vec![0u8; 1000]).unwrap();
        let p = ProcessFigures::read(Some(dir.path()), &["main".to_string(), "gone".to_string()]);
        assert_eq!(
            p.store_bytes,
            vec![StoreSize {
                app: "main".into(),
                bytes: 5096
            }]
        );
        assert!(p.resident_bytes.is_some_and(|r| r > 0));
        assert!(
            p.anonymous_bytes
                .is_some_and(|a| a > 0 && a <= p.resident_bytes.unwrap())
        );
        assert!(p.state_size_bytes.is_some());
        // Where the kernel counts I/O (it does here), the counter is read; a temperature only where a zone is.
        if std::path::Path::new("/proc/self/io").exists() {
            assert!(p.disk_written_bytes.is_some());
        }
        if let Some(c) = p.cpu_temperature_celsius {
            assert!((-40.0..150.0).contains(&c), "{c}");
        }
    }

    use super::*;

    #[test]
    fn health_needs_a_recent_turn() {
        let stale = Duration::from_secs(10);
        assert!(!healthy(None, stale));
        assert!(healthy(Some(Duration::from_millis(100)), stale));
        assert!(!healthy(Some(Duration::from_secs(11)), stale));
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
        s.counters.forward_refused_frames = 2;
        s.counters.forward_refused_records = 7;
        let page = render(
            &s,
            ProcessFigures {
                threads: Some(3),
                resident_bytes: Some(4096),
                anonymous_bytes: Some(2048),
                disk_written_bytes: Some(1 << 20),
                cpu_temperature_celsius: Some(51.5),
                state_free_bytes: Some(1 << 30),
                state_size_bytes: Some(1 << 34),
                store_bytes: vec![StoreSize {
                    app: "main".into(),
                    bytes: 12_288,
                }],
            },
            Some(Duration::from_millis(5)),
            0,
        );
        assert!(page.contains("pure_records_stored_total{app=\"main\"} 42\n"));
        assert!(page.contains("pure_drops_total{stage=\"auth\"} 5\n"));
        assert!(page.contains("pure_drops_total{stage=\"turn_full\"} 0\n"));
        assert!(page.contains("pure_sessions_active 2\n"));
        assert!(page.contains("pure_forward_frames_refused_total 2\n"));
        assert!(page.contains("pure_forward_records_refused_total 7\n"));
        assert!(page.contains("pure_threads 3\n"));
        assert!(page.contains("pure_anonymous_memory_bytes 2048\n"));
        assert!(page.contains("pure_disk_written_bytes_total 1048576\n"));
        assert!(page.contains("pure_cpu_temperature_celsius 51.5\n"));
        assert!(page.contains("pure_app_store_bytes{app=\"main\"} 12288\n"));
        assert!(page.contains("pure_state_free_bytes 1073741824\n"));
        assert!(page.contains("pure_state_size_bytes 17179869184\n"));
        assert!(page.contains("# TYPE pure_x25519_total counter\n"));
        assert!(!page.contains("sender="));
        // Every sample line is `name{labels} value` with a numeric value.
        for line in page.lines().filter(|l| !l.starts_with('#')) {
            let value = line.rsplit(' ').next().unwrap();
            assert!(value.parse::<f64>().is_ok(), "{line}");
        }
    }
}
