//! `pure-serve send`: deliver standard input, one record per line, and exit 0 only when every record is stored.

use std::io::{BufRead, IsTerminal, Write};
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;

use crate::sender::{SenderEvent, UdpLink};

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
    /// Give up after this many seconds with records unacknowledged (exit 1). 0 waits for ever.
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
    let stdin = std::io::stdin();
    let mut lines = 0usize;
    for line in stdin.lock().split(b'\n') {
        let line = line.context("reading standard input")?;
        link.sender()
            .queue(&args.app, line)
            .with_context(|| format!("line {}", lines + 1))?;
        lines += 1;
    }
    if lines == 0 {
        println!("nothing to send: standard input was empty");
        return Ok(());
    }
    let timeout = (args.timeout > 0.0).then(|| Duration::from_secs_f64(args.timeout));
    let progress = std::io::stderr().is_terminal();
    let mut last_shown = Instant::now();
    let mut first_seq: Option<u64> = None;
    let mut through = 0;
    let outcome = link.deliver_with(timeout, |event| match event {
        SenderEvent::Stored { through: t, .. } => {
            if first_seq.is_none() {
                // The first Stored answers the probe: our records start after it.
                first_seq = Some(*t + 1);
            }
            through = *t;
            if progress && last_shown.elapsed() > Duration::from_millis(200) {
                let done = through + 1 - first_seq.unwrap_or(1);
                eprint!("\rstored {done} of {lines}");
                let _ = std::io::stderr().flush();
                last_shown = Instant::now();
            }
        }
        SenderEvent::Refused { app, reason } => {
            eprintln!(
                "the node refused app {app} (reason {reason}: {})",
                refuse_reason(*reason)
            );
        }
        SenderEvent::NodeAhead { app, node, ours } => {
            eprintln!("warning: the node holds {app} records up to {node}, past ours ({ours})");
        }
    })?;
    if progress {
        eprint!("\r");
    }
    let secs = outcome.elapsed.as_secs_f64();
    if !outcome.refused.is_empty() {
        bail!(
            "{} records not stored: the node refused app {}",
            outcome.unacked.max(lines),
            args.app
        );
    }
    if outcome.unacked > 0 || first_seq.is_none() {
        let unacked = if first_seq.is_none() {
            lines
        } else {
            outcome.unacked
        };
        bail!(
            "gave up after {secs:.1} s: {unacked} of {lines} records not acknowledged by {to}{}",
            if first_seq.is_none() {
                " (no answer at all: is the node running there, with this key in its senders file and this node key?)"
            } else {
                ""
            }
        );
    }
    let first = first_seq.unwrap_or(1);
    println!(
        "stored {lines} records for app {} (seq {first}–{through}) in {secs:.2} s ({:.0} records/s)",
        args.app,
        lines as f64 / secs.max(1e-9)
    );
    Ok(())
}

fn refuse_reason(reason: u8) -> &'static str {
    match reason {
        crate::proto::wire::REFUSE_NO_APP => "no such app on the node",
        crate::proto::wire::REFUSE_NOT_ACCEPTED => "the app does not accept this sender",
        _ => "unknown reason",
    }
}
