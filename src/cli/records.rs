//! `pure-serve records`: print what the stores hold, or follow what they store.

use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::store::engine::{AppReader, StoreChoice, StoreReader};
use crate::store::{self, RecordView};

/// How often `--follow` looks for new records.
const FOLLOW_EVERY: Duration = Duration::from_millis(100);

/// How long `--follow` waits before it connects again to a fleet's database it lost: this at first, doubled after
/// each try that fails, up to [`RECONNECT_MOST`].
const RECONNECT_FIRST: Duration = Duration::from_millis(250);
const RECONNECT_MOST: Duration = Duration::from_secs(5);

#[derive(Args, Debug)]
pub struct RecordsArgs {
    /// The node's state directory. Default: $STATE_DIRECTORY or ./pure-state.
    #[arg(long, value_name = "DIR")]
    pub state: Option<PathBuf>,
    /// Only this app (default: every app with a store; --follow needs one app unless there is only one).
    #[arg(long, value_name = "NAME")]
    pub app: Option<String>,
    /// Only records from this source (a sender's name, or app/NAME for an inner outlet's records); with --waiting,
    /// only records waiting for this sender.
    #[arg(long, value_name = "NAME")]
    pub source: Option<String>,
    /// Print the downlink records waiting for devices instead of stored records (docs/downlink.md): app, the sender
    /// each waits for, its sequence and payload; with --json also queued_at and expires_at. Records that expired
    /// are not printed (the node deletes them unsent). What a device took is gone from the list once it said so.
    #[arg(long, conflicts_with_all = ["follow", "from"])]
    pub waiting: bool,
    /// One JSON object per line: app, source, seq, pos, stored_at, origin and origin_seq (forwarded records), and
    /// payload (UTF-8) or payload_b64.
    #[arg(long)]
    pub json: bool,
    /// Keep running and print records as they are stored, in store order, like `tail -f`. Starts after what is
    /// stored now, unless --from says where. With --store postgres://… it survives the database: when the
    /// connection is lost (the database restarts, fails over, or stops answering for 10 s) it says so on standard
    /// error, connects again (after 0.25 s, doubling to 5 s between tries) and goes on after the last position it
    /// printed, nothing skipped or printed twice.
    #[arg(long)]
    pub follow: bool,
    /// Start at this position of the app's log (1: everything), and list in store order (by position) rather than
    /// by source and sequence. With --json each line has its `pos`, so a consumer that stopped resumes with
    /// --from LAST+1.
    #[arg(long, value_name = "POS", value_parser = position)]
    pub from: Option<u64>,
    /// Read the fleet's database instead of the state directory's files: the nodes' --store URL,
    /// `postgres://USER@HOST[:PORT]/DATABASE` (docs/scale-out.md). Positions are the app's across every node.
    #[arg(long, value_name = "URL", default_value = "sqlite", value_parser = super::StoreParser)]
    pub store: StoreChoice,
    /// The password of --store's database user, on the first line of this file.
    #[arg(long, value_name = "FILE")]
    pub store_password_file: Option<PathBuf>,
}

fn line(app: &str, r: &RecordView<'_>, json: bool) -> String {
    if json {
        store::json::record(app, r).to_string()
    } else {
        let text = String::from_utf8_lossy(r.payload);
        format!("{app}\t{}\t{}\t{text}", r.source, r.seq)
    }
}

pub fn run(args: &RecordsArgs) -> anyhow::Result<()> {
    let state = args
        .state
        .clone()
        .unwrap_or_else(super::node::default_state_dir);
    let password = match &args.store_password_file {
        Some(f) if args.store.is_shared() => Some(store::engine::read_store_password(f)?),
        _ => None,
    };
    let reader = StoreReader::open(&args.store, &state, password.as_deref())?;
    let apps = match &args.app {
        Some(a) => vec![a.clone()],
        None => reader.apps()?.map_err(anyhow::Error::msg)?,
    };
    let open = |app: &str| reader.app(app).map_err(anyhow::Error::from);
    let stdout = std::io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let result = if args.waiting {
        apps.iter()
            .try_for_each(|app| write_waiting(&open(app)?, app, args, &mut out))
    } else if args.follow {
        let [app] = apps.as_slice() else {
            anyhow::bail!(
                "--follow follows one app; choose one with --app (apps: {})",
                apps.join(", ")
            );
        };
        follow_store(reader, app, args, password.as_deref(), &state, &mut out)
    } else {
        apps.iter().try_for_each(|app| {
            write_records(&open(app)?, app, args, args.from.unwrap_or(0), &mut out).map(|_| ())
        })
    };
    match result {
        // A closed pipe (`records | head`) is a normal end.
        Err(e) if is_broken_pipe(&e) => Ok(()),
        other => other,
    }
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.downcast_ref::<std::io::Error>()
        .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
}

/// `--from`'s value: a position, and positions start at 1 (0 was once taken as 1 without a word).
fn position(text: &str) -> Result<u64, String> {
    match text.parse::<u64>() {
        Ok(0) => Err("positions start at 1: use --from 1 for everything stored".to_string()),
        Ok(pos) => Ok(pos),
        Err(_) => Err(format!(
            "`{text}` is not a position: a whole number from 1 (--from 1 for everything stored)"
        )),
    }
}

/// Lines written to `out` from inside a store's reading, which can only be told to stop: the first write error is
/// kept, ends the reading, and is returned by [`Lines::finish`].
struct Lines<'o, W: Write> {
    out: &'o mut W,
    error: Option<std::io::Error>,
}

impl<'o, W: Write> Lines<'o, W> {
    fn new(out: &'o mut W) -> Self {
        Lines { out, error: None }
    }

    /// Writes `line`; false once a write failed (the reading should stop).
    fn put(&mut self, line: std::fmt::Arguments<'_>) -> bool {
        match writeln!(self.out, "{line}") {
            Ok(()) => true,
            Err(e) => {
                self.error = Some(e);
                false
            }
        }
    }

    fn finish(self) -> anyhow::Result<()> {
        if let Some(e) = self.error {
            return Err(e.into());
        }
        self.out.flush()?;
        Ok(())
    }
}

/// Writes the records of `app` from position `from` (0: all, in source order) as lines; returns the last
/// position written.
fn write_records(
    store: &AppReader<'_>,
    app: &str,
    args: &RecordsArgs,
    from: u64,
    out: &mut impl Write,
) -> anyhow::Result<Option<u64>> {
    let mut lines = Lines::new(out);
    let mut last = None;
    store.for_each(args.source.as_deref(), from, |r| {
        last = Some(r.pos);
        lines.put(format_args!("{}", line(app, r, args.json)))
    })?;
    lines.finish()?;
    Ok(last)
}

/// Writes the downlink records waiting in `app` as lines.
fn write_waiting(
    store: &AppReader<'_>,
    app: &str,
    args: &RecordsArgs,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let mut lines = Lines::new(out);
    store.for_each_waiting(args.source.as_deref(), store::now_ms(), |w| {
        if args.json {
            lines.put(format_args!("{}", store::json::waiting(app, w)))
        } else if let Some((blob, piece)) = w.piece {
            // A piece of a file is bytes, not a line: which piece of which blob, and its size (--json has them).
            lines.put(format_args!(
                "{app}\t{}\t{}\t(piece {piece} of blob {blob}, {} bytes)",
                w.sender,
                w.seq,
                w.payload.len()
            ))
        } else {
            let text = String::from_utf8_lossy(w.payload);
            lines.put(format_args!("{app}\t{}\t{}\t{text}", w.sender, w.seq))
        }
    })?;
    lines.finish()
}

/// Follows `app` of the store `reader` reads (`--follow`), for as long as the process runs. A fleet's database
/// that fails in a way that may pass ([`store::StoreError::may_pass`]) is connected to again, with a growing pause,
/// and following goes on after the last position printed; any other error ends it.
fn follow_store(
    mut reader: StoreReader,
    app: &str,
    args: &RecordsArgs,
    password: Option<&str>,
    state: &std::path::Path,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let mut next = args.from;
    loop {
        let lost = match reader.app(app) {
            Ok(s) => follow(&s, app, args, &mut next, out),
            Err(e) => Err(e.into()),
        };
        let e = match lost {
            Ok(()) => return Ok(()),
            Err(e) if may_pass(&e) => e,
            Err(e) => return Err(e),
        };
        let after = match next {
            Some(n) => format!("after position {}", n.saturating_sub(1)),
            None => "from the app's head".to_string(),
        };
        let mut pause = RECONNECT_FIRST;
        eprintln!(
            "pure-serve records: lost the fleet's database: {}; connecting again in {:.2} s, to go on {after}",
            super::one_line(&e),
            pause.as_secs_f64()
        );
        reader = loop {
            std::thread::sleep(pause);
            pause = (pause * 2).min(RECONNECT_MOST);
            match StoreReader::open(&args.store, state, password) {
                Ok(r) => break r,
                Err(e) if e.may_pass() => eprintln!(
                    "pure-serve records: {}; trying again in {:.2} s",
                    super::one_line(&e.into()),
                    pause.as_secs_f64()
                ),
                Err(e) => return Err(e.into()),
            }
        };
        eprintln!(
            "pure-serve records: connected again to {}; going on {after}",
            args.store.shown()
        );
    }
}

/// Whether `e` is a failure of the store that may pass by itself (a fleet's database restarting or out of reach).
fn may_pass(e: &anyhow::Error) -> bool {
    e.downcast_ref::<store::StoreError>()
        .is_some_and(store::StoreError::may_pass)
}

/// Prints the records of `app` as they are stored, from position `next` (the head when `None`), and keeps `next`
/// one past the last position printed, so that a follower that connects again goes on exactly there. Returns only
/// on an error (a read of the store, or a write of standard output); what was printed before it stays printed.
fn follow(
    s: &AppReader<'_>,
    app: &str,
    args: &RecordsArgs,
    next: &mut Option<u64>,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let mut at = match *next {
        Some(p) => p,
        None => s.head()?,
    };
    *next = Some(at);
    loop {
        let head = s.head()?;
        if head > at {
            let mut lines = Lines::new(out);
            let read = s.for_each(args.source.as_deref(), at, |r| {
                let put = lines.put(format_args!("{}", line(app, r, args.json)));
                if put {
                    at = r.pos + 1;
                }
                put
            });
            *next = Some(at);
            // What was written goes out (and a write that failed ends it) before a failed read is said.
            lines.finish()?;
            read?;
            // With a source filter the last record printed may be before the head; nothing before it is new.
            at = at.max(head);
            *next = Some(at);
        }
        std::thread::sleep(FOLLOW_EVERY);
    }
}
