//! `pure-serve send`: deliver standard input, one record per line, and exit 0 only when every record is stored.
//!
//! The flow starts with a probe (docs/protocol.md 7): the command keeps no state between runs, so it asks the node
//! where the flow is and numbers its records from there.

use std::io::{BufRead, IsTerminal, Write};
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;

use crate::sender::{SenderEvent, UdpLink};

/// Lines read ahead of the link, and records queued in the sender at most.
const LINE_QUEUE: usize = 65_536;
/// How long one round waits for the node before looking at the input again.
const INPUT_POLL: Duration = Duration::from_millis(5);

#[derive(Args, Debug)]
pub struct SendArgs {
    /// This sender's private key (its public key must be in the node's senders file).
    #[arg(long, value_name = "FILE")]
    pub key: PathBuf,
    /// The node's public key (printed by the node at start, or `pure-serve pubkey --key NODE_KEY`).
    #[arg(long, value_name = "PUBKEY")]
    pub node: String,
    /// The node's link address.
    #[arg(long, value_name = "HOST:PORT")]
    pub to: String,
    /// The app to deliver to.
    #[arg(long, value_name = "NAME", default_value = "main")]
    pub app: String,
    /// Give up (exit 1, saying how many records were not acknowledged) when the node acknowledges nothing for
    /// this many seconds while records wait. 0 waits for ever.
    #[arg(long, value_name = "SECONDS", default_value_t = 60.0)]
    pub timeout: f64,
}

fn resolve(to: &str) -> anyhow::Result<SocketAddr> {
    to.to_socket_addrs()
        .with_context(|| {
            format!("cannot resolve --to {to:?}; expected HOST:PORT, e.g. 192.0.2.1:7380")
        })?
        .next()
        .with_context(|| format!("--to {to:?} resolves to no address"))
}

pub fn run(args: &SendArgs) -> anyhow::Result<()> {
    let identity = crate::keys::read_identity(&args.key)?;
    let node = crate::keys::parse_public_key(&args.node)
        .with_context(|| format!("--node {:?} is not a public key", args.node))?;
    let to = resolve(&args.to)?;
    let mut link = UdpLink::connect(identity, node, to)
        .with_context(|| format!("cannot open a UDP socket to {to}"))?;
    if !crate::proto::wire::valid_app_name(args.app.as_bytes()) {
        bail!("--app {:?} is not 1–32 characters of a-z 0-9 _ -", args.app);
    }
    // Standard input is read on its own thread so records stream: `tail -f log | pure-serve send …` works, and
    // sending starts before the input ends. The channel is bounded so a fast producer waits for the link.
    let (lines_tx, lines_rx) = mpsc::sync_channel::<std::io::Result<Vec<u8>>>(LINE_QUEUE);
    std::thread::Builder::new()
        .name("send-stdin".into())
        .spawn(move || {
            for line in std::io::stdin().lock().split(b'\n') {
                if lines_tx.send(line).is_err() {
                    return;
                }
            }
        })
        .context("starting the input reader")?;
    let no_progress_limit = (args.timeout > 0.0).then(|| Duration::from_secs_f64(args.timeout));
    let progress = std::io::stderr().is_terminal();
    let start = Instant::now();
    let mut last_shown = Instant::now();
    let mut last_progress = Instant::now();
    let mut lines = 0u64;
    let mut input_open = true;
    let mut first_seq: Option<u64> = None;
    let mut through = 0;
    let mut refused = false;
    // The app the node last said it cannot store, until it stores again.
    let mut cannot_store: Option<String> = None;
    loop {
        // Take what input there is, up to the sender's window, without waiting for it.
        while input_open && link.sender().unacked_total() < LINE_QUEUE {
            match lines_rx.try_recv() {
                Ok(line) => {
                    let line = line.context("reading standard input")?;
                    link.sender()
                        .queue(&args.app, line)
                        .with_context(|| format!("line {} of standard input", lines + 1))?;
                    lines += 1;
                }
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => input_open = false,
            }
        }
        if !input_open && (lines == 0 || link.sender().is_idle()) {
            break;
        }
        let waiting = link.sender().unacked_total() > 0 || first_seq.is_none() && lines > 0;
        if !waiting {
            // Nothing in flight: the clock of the give-up timeout only runs while records wait.
            last_progress = Instant::now();
        }
        if let Some(limit) = no_progress_limit
            && waiting
            && last_progress.elapsed() >= limit
        {
            break;
        }
        link.drive(Instant::now() + INPUT_POLL)?;
        for event in link.take_events() {
            match event {
                SenderEvent::Stored { through: t, .. } => {
                    if first_seq.is_none() {
                        // The first Stored answers the probe: our records start after it.
                        first_seq = Some(t + 1);
                    }
                    through = t;
                    last_progress = Instant::now();
                    if let Some(app) = cannot_store.take() {
                        eprintln!("the node stores app {app} again");
                    }
                }
                SenderEvent::NotStored { app, reason } => {
                    eprintln!(
                        "the node cannot store app {app} now (reason {reason}: {}; its /healthz says which); \
                         sending again until it can",
                        not_stored_reason(reason)
                    );
                    cannot_store = Some(app);
                }
                SenderEvent::Refused { app, reason } => {
                    eprintln!(
                        "the node refused app {app} (reason {reason}: {})",
                        refuse_reason(reason)
                    );
                    refused = true;
                }
                SenderEvent::NodeAhead { app, node, ours } => {
                    eprintln!(
                        "warning: the node holds {app} records up to {node}, past ours ({ours})"
                    );
                }
                SenderEvent::NodeBehind { app, node, ours } => {
                    eprintln!(
                        "warning: the node has {app} records only up to {node}, not {ours}; continuing from {}",
                        node + 1
                    );
                }
                // `send` does not listen yet, so the node sends it no downlink.
                SenderEvent::Down { .. } | SenderEvent::DownlinkUnanswered { .. } => {}
            }
        }
        if refused {
            break;
        }
        if progress && last_shown.elapsed() > Duration::from_millis(200) {
            let done = first_seq.map_or(0, |f| (through + 1).saturating_sub(f));
            eprint!(
                "\rstored {done} of {lines}{}",
                if input_open { " (reading input)" } else { "" }
            );
            let _ = std::io::stderr().flush();
            last_shown = Instant::now();
        }
    }
    if progress {
        eprint!("\r\x1b[K");
    }
    let secs = start.elapsed().as_secs_f64();
    if lines == 0 {
        println!("nothing to send: standard input was empty");
        return Ok(());
    }
    let stored = first_seq.map_or(0, |f| (through + 1).saturating_sub(f));
    let unacked = lines.saturating_sub(stored);
    if refused {
        bail!(
            "{unacked} of {lines} records not stored: the node refused app {}",
            args.app
        );
    }
    if unacked > 0 {
        bail!(
            "gave up: {unacked} of {lines} records not acknowledged by {to}; nothing was acknowledged for {:.1} s{}",
            args.timeout,
            match (&cannot_store, first_seq) {
                (Some(app), _) => format!(
                    ": the node said it cannot store app {app} ({}; its /healthz says which)",
                    not_stored_reason(crate::proto::wire::NOT_STORED_STORE_FAILING)
                ),
                (None, None) => " and the node never answered (is it running there, with this key in its senders file, and is --node its public key?)".to_string(),
                (None, Some(_)) => String::new(),
            }
        );
    }
    println!(
        "stored {lines} records for app {} (seq {}–{through}) in {secs:.2} s ({:.0} records/s)",
        args.app,
        first_seq.unwrap_or(1),
        lines as f64 / secs.max(1e-9)
    );
    Ok(())
}

fn not_stored_reason(reason: u8) -> &'static str {
    match reason {
        crate::proto::wire::NOT_STORED_STORE_FAILING => {
            "its store fails: a full or read-only disk, or a store deleted under it"
        }
        _ => "unknown reason",
    }
}

fn refuse_reason(reason: u8) -> &'static str {
    match reason {
        crate::proto::wire::REFUSE_NO_APP => "no such app on the node",
        crate::proto::wire::REFUSE_NOT_ACCEPTED => "the app does not accept this sender",
        crate::proto::wire::REFUSE_NOT_FORWARDER => {
            "the app takes no forwarded records from this sender"
        }
        _ => "unknown reason",
    }
}
