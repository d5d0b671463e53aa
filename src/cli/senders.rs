//! `pure-serve senders`: every sender of the senders file with when its last record was stored, how far its
//! records go, and whether downlink waits for it — the quietest first, so the devices that stopped reporting are
//! at the top (issue 37: "which devices have not reported, since when?").
//!
//! What it reads is what the node keeps anyway, so the node writes nothing more for it: the senders file (the
//! names, so that a sender never heard of is listed too), and per app the store's sources (the heard sequence) and
//! the commit time of each source's newest chunk (one index lookup per source), and the downlink records waiting.
//! On a fleet it reads the database (`--store`), as `records` does. A sender's last seen is its newest record's
//! over every app; a sender that delivers nothing (it only listens for downlink) is not seen by it.
//!
//! Memory: the senders file is mapped (as the node maps it) and each sender takes 24 bytes here while the stores
//! are read, so a million senders cost about 24 MB beside the sort of their names.

use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use clap::Args;

use crate::ops::devices::{ByName, name_matches};
use crate::store::engine::{StoreChoice, StoreReader};

#[derive(Args, Debug)]
pub struct SendersArgs {
    /// The node's state directory. Default: $STATE_DIRECTORY or ./pure-state.
    #[arg(long, value_name = "DIR")]
    pub state: Option<PathBuf>,
    /// The node's senders file. Default: `senders` in the state directory, as the node.
    #[arg(long, value_name = "FILE")]
    pub senders: Option<PathBuf>,
    /// Only this app's records count (default: every app with a store).
    #[arg(long, value_name = "NAME")]
    pub app: Option<String>,
    /// Only senders with no record stored for this long (never heard of included): e.g. 90s, 30m, 6h, 2d.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub quiet_for: Option<Duration>,
    /// Only senders whose name contains this (ASCII letters match in either case).
    #[arg(long, value_name = "TEXT")]
    pub name: Option<String>,
    /// At most this many lines (the quietest).
    #[arg(long, value_name = "N")]
    pub limit: Option<usize>,
    /// One JSON object per line: name, last_seen_ms (null: never), quiet_s (null: never), stored_through,
    /// downlink_waiting.
    #[arg(long)]
    pub json: bool,
    /// Read the fleet's database instead of the state directory's files: the nodes' --store URL
    /// (docs/scale-out.md).
    #[arg(long, value_name = "URL", default_value = "sqlite", value_parser = super::StoreParser)]
    pub store: StoreChoice,
    /// The password of --store's database user, on the first line of this file.
    #[arg(long, value_name = "FILE")]
    pub store_password_file: Option<PathBuf>,
}

/// `90s`, `30m`, `6h`, `2d`, or a number of seconds.
pub(super) fn parse_duration(s: &str) -> Result<Duration, String> {
    let (digits, unit) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{s:?} is not a duration: give e.g. 90s, 30m, 6h or 2d"))?;
    let seconds = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3_600,
        "d" => 86_400,
        _ => {
            return Err(format!(
                "{s:?} is not a duration: its unit must be s, m, h or d (e.g. 6h)"
            ));
        }
    };
    n.checked_mul(seconds)
        .map(Duration::from_secs)
        .ok_or_else(|| format!("{s:?} is too long a duration"))
}

/// What the stores say of one sender.
#[derive(Debug, Default, Clone, Copy)]
struct Seen {
    /// Its newest record's commit time over every app (milliseconds since the Unix epoch), 0: none.
    last_ms: i64,
    /// Its heard sequence, the largest over the apps.
    stored_through: u64,
    downlink_waiting: u64,
}

/// `12s`, `5m`, `3h`, `2d`: how long ago, to the largest whole unit.
fn ago(ms: i64) -> String {
    let s = (ms / 1000).max(0);
    match s {
        s if s < 120 => format!("{s}s"),
        s if s < 7_200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3_600),
        s => format!("{}d", s / 86_400),
    }
}

pub fn run(args: &SendersArgs) -> anyhow::Result<()> {
    let state = args
        .state
        .clone()
        .unwrap_or_else(super::node::default_state_dir);
    let senders_path = args
        .senders
        .clone()
        .unwrap_or_else(|| state.join("senders"));
    let list = crate::senders::load(&senders_path).map(std::sync::Arc::new);
    // The path is in the error itself: the context says only where it came from.
    let list = if args.senders.is_none() {
        list.context(
            "no --senders given, so the state directory's (give the node's with --senders)",
        )?
    } else {
        list?
    };
    // The names, sorted, each with what the stores say of it.
    let by_name = ByName::new(list);
    let mut seen = vec![Seen::default(); by_name.len()];

    let password = match &args.store_password_file {
        Some(f) if args.store.is_shared() => Some(crate::store::engine::read_store_password(f)?),
        _ => None,
    };
    let reader = StoreReader::open(&args.store, &state, password.as_deref())?;
    // No store at all is a wrong --state (or --store), said as `records` says it, not a list of senders "never"
    // heard from.
    let apps = match &args.app {
        Some(a) => vec![a.clone()],
        None => reader.apps()?.map_err(anyhow::Error::msg)?,
    };
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    for app in &apps {
        let store = reader.app(app)?;
        by_name.walk(&store, |k, heard, at| {
            let s = &mut seen[k];
            s.last_ms = s.last_ms.max(at);
            s.stored_through = s.stored_through.max(heard);
        })?;
        for (name, n) in store.waiting_by_sender(now_ms)? {
            if let Some(k) = by_name.find(&name) {
                seen[k].downlink_waiting += n;
            }
        }
    }

    // The quietest first: never heard of (by name), then the longest quiet.
    let mut rows: Vec<usize> = (0..by_name.len())
        .filter(|&k| {
            args.name
                .as_deref()
                .is_none_or(|t| name_matches(by_name.name(k), t))
        })
        .filter(|&k| {
            args.quiet_for.is_none_or(|q| {
                let last = seen[k].last_ms;
                last == 0 || now_ms - last >= q.as_millis() as i64
            })
        })
        .collect();
    rows.sort_by_key(|&k| (seen[k].last_ms != 0, seen[k].last_ms));
    let (mut hour, mut day, mut never) = (0usize, 0usize, 0usize);
    for s in &seen {
        match s.last_ms {
            0 => never += 1,
            t if now_ms - t < 3_600_000 => hour += 1,
            t if now_ms - t < 86_400_000 => day += 1,
            _ => {}
        }
    }

    let stdout = std::io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    if !args.json {
        writeln!(
            out,
            "NAME\tLAST SEEN (UTC)\tQUIET\tSTORED THROUGH\tDOWNLINK WAITING"
        )?;
    }
    for &k in rows.iter().take(args.limit.unwrap_or(usize::MAX)) {
        let name = by_name.name(k);
        let s = seen[k];
        if args.json {
            let (last, quiet) = if s.last_ms == 0 {
                (serde_json::Value::Null, serde_json::Value::Null)
            } else {
                (
                    s.last_ms.into(),
                    ((now_ms - s.last_ms).max(0) / 1000).into(),
                )
            };
            let line = serde_json::json!({
                "name": name, "last_seen_ms": last, "quiet_s": quiet,
                "stored_through": s.stored_through, "downlink_waiting": s.downlink_waiting,
            });
            writeln!(out, "{line}")?;
        } else if s.last_ms == 0 {
            writeln!(
                out,
                "{name}\tnever\t-\t{}\t{}",
                s.stored_through, s.downlink_waiting
            )?;
        } else {
            writeln!(
                out,
                "{name}\t{}\t{}\t{}\t{}",
                utc(s.last_ms),
                ago(now_ms - s.last_ms),
                s.stored_through,
                s.downlink_waiting
            )?;
        }
    }
    out.flush()?;
    eprintln!(
        "{} senders: {hour} stored a record in the last hour, {} more in the last day, {} longer ago, {never} never \
         ({} listed)",
        seen.len(),
        day,
        seen.len() - hour - day - never,
        rows.len().min(args.limit.unwrap_or(usize::MAX))
    );
    Ok(())
}

/// `2026-12-06 12:34:56` for milliseconds since the Unix epoch (UTC).
fn utc(ms: i64) -> String {
    let (y, m, d, hour, minute, second, _) = crate::store::json::utc_parts(ms);
    format!("{y:04}-{m:02}-{d:02} {hour:02}:{minute:02}:{second:02}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_dates() {
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("30m"), Ok(Duration::from_secs(1_800)));
        assert_eq!(parse_duration("6h"), Ok(Duration::from_secs(21_600)));
        assert_eq!(parse_duration("2d"), Ok(Duration::from_secs(172_800)));
        assert_eq!(parse_duration("45"), Ok(Duration::from_secs(45)));
        assert!(parse_duration("6w").unwrap_err().contains("s, m, h or d"));
        assert!(parse_duration("h").is_err());
        assert!(parse_duration("99999999999999999999d").is_err());
        assert_eq!(utc(0), "1970-01-01 00:00:00");
        assert_eq!(utc(1_796_560_496_000), "2026-12-06 12:34:56");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00");
        assert_eq!(
            (ago(5_000), ago(600_000), ago(10_800_000), ago(345_600_000)),
            ("5s".into(), "10m".into(), "3h".into(), "4d".into())
        );
    }
}
