//! `pure-serve send`: deliver standard input, one record per line, and exit 0 only when every record is stored.
//!
//! The flow starts with a probe (docs/protocol.md 7): the command keeps no state between runs, so it asks the node
//! where the flow is and numbers its records from there.

use std::io::{IsTerminal, Read, Write};
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;

use crate::sender::{SenderEvent, UdpLink};

/// Records in flight at once: four of the node's turns (protocol.md 6), so the link goes on while the node syncs a
/// turn and acknowledges it only then. The library's default is one turn's share (research/022).
const SEND_WINDOW: u64 = 65_536;
/// Records queued in the sender at most (twice the window, so acks always find more to send); what is read beyond
/// waits in blocks.
const LINE_QUEUE: usize = 2 * SEND_WINDOW as usize;
/// Bytes of standard input one read takes at most, and blocks read ahead of the link at most.
const BLOCK: usize = 256 << 10;
const BLOCKS_AHEAD: usize = 4;
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
    link.sender().set_window(SEND_WINDOW);
    // Standard input is read on its own thread so records stream: `tail -f log | pure-serve send …` works, and
    // sending starts before the input ends. It reads blocks (whatever each read gives, up to BLOCK) and hands them
    // over whole; this thread splits them into lines and queues each straight from the block, and the buffers go
    // back to the reader: one channel hop per block and no allocation per record (research/021). The channel is
    // bounded so a fast producer waits for the link.
    let (blocks_tx, blocks_rx) =
        mpsc::sync_channel::<std::io::Result<(Vec<u8>, usize)>>(BLOCKS_AHEAD);
    let (free_tx, free_rx) = mpsc::channel::<Vec<u8>>();
    std::thread::Builder::new()
        .name("send-stdin".into())
        .spawn(move || {
            let mut stdin = std::io::stdin().lock();
            loop {
                let mut buf = free_rx.try_recv().unwrap_or_else(|_| vec![0u8; BLOCK]);
                let got = loop {
                    match stdin.read(&mut buf) {
                        Ok(0) => return,
                        Ok(n) => break Ok((buf, n)),
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                        Err(e) => break Err(e),
                    }
                };
                let failed = got.is_err();
                if blocks_tx.send(got).is_err() || failed {
                    return;
                }
            }
        })
        .context("starting the input reader")?;
    let mut input = LineInput {
        blocks: blocks_rx,
        free: free_tx,
        block: None,
        partial: Vec::new(),
    };
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
        if input_open {
            input_open = input.take(link.sender(), &args.app, &mut lines)?;
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

/// Standard input as blocks from the reader thread, cut into lines.
struct LineInput {
    blocks: mpsc::Receiver<std::io::Result<(Vec<u8>, usize)>>,
    free: mpsc::Sender<Vec<u8>>,
    /// The block being queued: its buffer, the bytes read into it, and how far it is queued.
    block: Option<(Vec<u8>, usize, usize)>,
    /// The start of a line a block's end cut, until its `\n` comes (or the input ends).
    partial: Vec<u8>,
}

impl LineInput {
    /// Queues the lines there are, until the sender holds [`LINE_QUEUE`] records, without waiting for input.
    /// `lines` counts the lines queued. Returns false once the input has ended and all of it is queued.
    fn take(
        &mut self,
        sender: &mut crate::sender::Sender,
        app: &str,
        lines: &mut u64,
    ) -> anyhow::Result<bool> {
        loop {
            let room = LINE_QUEUE.saturating_sub(sender.unacked_total());
            if room == 0 {
                return Ok(true);
            }
            let Some((buf, len, pos)) = &mut self.block else {
                match self.blocks.try_recv() {
                    Ok(Ok((buf, len))) => self.block = Some((buf, len, 0)),
                    Ok(Err(e)) => return Err(e).context("reading standard input"),
                    Err(mpsc::TryRecvError::Empty) => return Ok(true),
                    Err(mpsc::TryRecvError::Disconnected) => {
                        // A last line without `\n` is a record too.
                        if !self.partial.is_empty() {
                            queue_partial(&mut self.partial, sender, app, lines)?;
                        }
                        return Ok(false);
                    }
                }
                continue;
            };
            let data = &buf[*pos..*len];
            if !self.partial.is_empty() {
                match memchr::memchr(b'\n', data) {
                    Some(k) => {
                        self.partial.extend_from_slice(&data[..k]);
                        *pos += k + 1;
                        queue_partial(&mut self.partial, sender, app, lines)?;
                    }
                    None => {
                        self.partial.extend_from_slice(data);
                        *pos = *len;
                    }
                }
            } else {
                let (used, n) = sender.queue_lines(app, data, room).map_err(|(n, e)| {
                    anyhow::Error::new(e)
                        .context(format!("line {} of standard input", *lines + n as u64 + 1))
                })?;
                *lines += n as u64;
                *pos += used;
                if n < room {
                    // No `\n` in the rest: the start of a line the next block ends.
                    self.partial.extend_from_slice(&buf[*pos..*len]);
                    *pos = *len;
                }
            }
            if *pos == *len
                && let Some((buf, _, _)) = self.block.take()
            {
                let _ = self.free.send(buf);
            }
        }
    }
}

/// Queues the line gathered in `partial` and empties it (keeping its buffer).
fn queue_partial(
    partial: &mut Vec<u8>,
    sender: &mut crate::sender::Sender,
    app: &str,
    lines: &mut u64,
) -> anyhow::Result<()> {
    sender
        .queue_slice(app, partial)
        .with_context(|| format!("line {} of standard input", *lines + 1))?;
    *lines += 1;
    partial.clear();
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
