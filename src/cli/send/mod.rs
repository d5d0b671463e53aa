//! `pure-serve send`: deliver standard input, one record per line, and exit 0 only when every record is stored.
//!
//! The flow starts with a probe (docs/protocol.md 7): the command keeps no state between runs, so it asks the node
//! where the flow is and numbers its records from there.
//!
//! With `--listen APP` the same link receives APP's downlink (docs/downlink.md): each record is printed on standard
//! output, its bytes and a newline, once and in order, and the sequence of the last one printed is kept in the
//! `--heard-file` ([`heard`]), so the next run goes on from there. `--stay` keeps the command awake for records
//! pushed while it runs: the device command for a device that wakes on a schedule is the same one without it.

mod heard;

use std::io::{IsTerminal, Read, Write};
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;

use crate::sender::{SenderEvent, UdpLink};
use heard::HeardFile;

/// Records in flight at once: sixteen of the node's turns (protocol.md 6), so the link goes on while the node syncs
/// the turns before and acknowledges each only then, also when the sync waits for a core (research/033). The
/// library's default is one turn's share (research/022).
const SEND_WINDOW: u64 = 262_144;
/// The same bound in bytes, so long lines do not put hundreds of megabytes in flight.
const SEND_WINDOW_BYTES: usize = 8 << 20;
/// Records queued in the sender at most (twice the window, so acks always find more to send), and bytes; what is
/// read beyond waits in blocks.
const LINE_QUEUE: usize = 2 * SEND_WINDOW as usize;
const LINE_QUEUE_BYTES: usize = 2 * SEND_WINDOW_BYTES;
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
    /// The node's link address. Several, comma-separated (or a name with several addresses), for the nodes of
    /// one fleet (docs/scale-out.md): the first is used until it answers nothing for 1 s while records wait, then
    /// the next, and so on round; nothing is stored twice whichever node stores it.
    #[arg(long, value_name = "HOST:PORT[,HOST:PORT…]")]
    pub to: String,
    /// The app to deliver to.
    #[arg(long, value_name = "NAME", default_value = "main")]
    pub app: String,
    /// Give up (exit 1, saying how many records were not acknowledged) when the node acknowledges nothing for
    /// this many seconds while records wait. 0 waits for ever.
    #[arg(long, value_name = "SECONDS", default_value_t = 60.0, value_parser = seconds)]
    pub timeout: f64,
    /// Also receive this app's downlink records (docs/downlink.md) and print each on standard output, its bytes
    /// and a newline, once and in order. Everything else this command says then goes to standard error. A record
    /// counts as handed over once it is written to standard output: a reader on a pipe that dies loses what it had
    /// not handled yet (--exec hands each record over only when its handler succeeds).
    #[arg(long, value_name = "APP")]
    pub listen: Option<String>,
    /// Instead of printing the records, run CMD (with `sh -c`) once per record, the record's bytes on its standard
    /// input (no newline added), PURE_APP and PURE_SEQ in its environment. A record counts as handed over (and is
    /// kept in --heard-file) only once CMD exits 0; if it fails the run stops (exit 1) and the record is given
    /// again to the next run.
    #[arg(long, value_name = "CMD", requires = "listen")]
    pub exec: Option<String>,
    /// Keep the sequence of the last downlink record printed in FILE (one number; made at the start if missing), so
    /// the next run prints nothing twice. It is written after the records are printed: a kill in between prints them
    /// again. One run at a time: a run holds FILE.lock, and a second run on the same file is refused.
    /// Without it every run starts from 0 and is given whatever still waits (what earlier runs acknowledged was
    /// deleted by the node).
    #[arg(long, value_name = "FILE", requires = "listen")]
    pub heard_file: Option<PathBuf>,
    /// Once the input is stored and the records that waited are printed, stay awake this long printing records
    /// pushed meanwhile (each within a round trip), then exit; `forever` stays until stopped. While it stays it
    /// keeps asking however long the node is silent.
    #[arg(long, value_name = "SECONDS|forever", default_value = "0", requires = "listen", value_parser = parse_stay)]
    pub stay: Stay,
    /// While staying, ask the node this often, so the device's session stays live there (it is swept after the
    /// node's --link-idle-ms, 30 s by default) and pushed records reach it without waiting.
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 10.0,
        requires = "listen",
        value_parser = seconds
    )]
    pub ask_every: f64,
    /// With --listen, offer the node version 1.2 of downlink (docs/downlink.md, "Large downlink: version 1.2"):
    /// once the node has checked that this device receives at its address, it sends several datagrams of records
    /// per answer, at most BYTES of them in flight beyond what was printed, and the device acknowledges each with
    /// a small packet, instead of being sent at most what it sent (a round trip per datagram). The socket's receive
    /// buffer is asked for as much. 0 keeps version 1.1. A node of 1.1 drops the offer; the command then goes on
    /// with 1.1, at most two retransmission timeouts later.
    #[arg(
        long,
        value_name = "BYTES",
        default_value_t = DOWN_WINDOW,
        requires = "listen"
    )]
    pub down_window: u64,
}

/// `--down-window`'s default: DOWN datagrams in flight to a host, about 220 of 1,200 bytes; a socket's receive
/// buffer holds about as many at Linux's default `net.core.rmem_max` (212,992, which the kernel doubles for its
/// bookkeeping of each datagram).
pub const DOWN_WINDOW: u64 = 262_144;

/// How long `send --listen` stays awake after its input is stored.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Stay {
    For(Duration),
    Forever,
}

fn parse_stay(text: &str) -> Result<Stay, String> {
    if text == "forever" {
        return Ok(Stay::Forever);
    }
    match seconds(text) {
        Ok(s) => Ok(Stay::For(Duration::from_secs_f64(s))),
        Err(_) => Err(format!(
            "{text:?} is not a number of seconds (e.g. 30) or `forever`"
        )),
    }
}

/// A number of seconds a flag may hold: finite, not negative, and at most what a `Duration` holds (about 585
/// billion years; more once made the command panic).
fn seconds(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(s) if s >= 0.0 && Duration::try_from_secs_f64(s).is_ok() => Ok(s),
        _ => Err(format!(
            "{text:?} is not a number of seconds: from 0 up to about 1.8e19 (e.g. 30)"
        )),
    }
}

/// Every address of every comma-separated `HOST:PORT` in `to`, in order, each once.
fn resolve(to: &str) -> anyhow::Result<Vec<SocketAddr>> {
    let mut all = Vec::new();
    for one in to.split(',').map(str::trim) {
        if one.is_empty() {
            bail!(
                "--to {to:?} has an empty address between commas; expected HOST:PORT[,HOST:PORT…]"
            );
        }
        let found: Vec<SocketAddr> = one
            .to_socket_addrs()
            .with_context(|| {
                format!("cannot resolve {one:?} of --to; expected HOST:PORT, e.g. 192.0.2.1:7380")
            })?
            .collect();
        if found.is_empty() {
            bail!("{one:?} of --to resolves to no address");
        }
        for a in found {
            if !all.contains(&a) {
                all.push(a);
            }
        }
    }
    // One socket serves the link: the addresses of its first family.
    let family = all[0].is_ipv4();
    all.retain(|a| a.is_ipv4() == family);
    Ok(all)
}

pub fn run(args: &SendArgs) -> anyhow::Result<()> {
    let identity = crate::keys::read_identity(&args.key)?;
    let node = crate::keys::parse_public_key(&args.node)
        .with_context(|| format!("--node {:?} is not a public key", args.node))?;
    let addrs = resolve(&args.to)?;
    let mut link = UdpLink::connect_any(identity, node, addrs.clone())
        .with_context(|| format!("cannot open a UDP socket to {}", addrs[0]))?;
    let mut moves_told = 0;
    if !crate::proto::wire::valid_app_name(args.app.as_bytes()) {
        bail!("--app {:?} is not 1–32 characters of a-z 0-9 _ -", args.app);
    }
    let mut downlink = match &args.listen {
        Some(app) => Some(Downlink::open(&mut link, app, args)?),
        None => None,
    };
    let listening = downlink.is_some();
    link.sender().set_window(SEND_WINDOW);
    link.sender().set_window_bytes(SEND_WINDOW_BYTES);
    let mut input = LineInput::spawn()?;
    let no_progress_limit = (args.timeout > 0.0).then(|| Duration::from_secs_f64(args.timeout));
    let progress = std::io::stderr().is_terminal();
    let start = Instant::now();
    let mut last_shown = Instant::now();
    let mut last_progress = Instant::now();
    let mut seen_progress = None;
    let mut lines = 0u64;
    let mut input_open = true;
    let mut first_seq: Option<u64> = None;
    let mut through = 0;
    let mut refused: Option<(String, u8)> = None;
    let mut no_downlink = false;
    // The app the node last said it cannot store, until it stores again.
    let mut cannot_store: Option<String> = None;
    // A line that cannot be a record (or input that cannot be read): nothing from it on is sent, and what was
    // queued before it is delivered first, so that the summary can say where to send again from.
    let mut bad_input: Option<anyhow::Error> = None;
    loop {
        // Take what input there is, up to the sender's window, without waiting for it.
        if input_open {
            input_open = match input.take(link.sender(), &args.app, &mut lines) {
                Ok(open) => open,
                Err(e) => {
                    bad_input = Some(e);
                    false
                }
            };
        }
        let records_done = lines == 0 || first_seq.is_some() && link.sender().unacked_total() == 0;
        if !input_open && records_done {
            let Some(d) = &mut downlink else { break };
            if no_downlink || link.sender().is_idle() && d.stay_over(Instant::now()) {
                break;
            }
            // Staying, nothing is written to standard output until a record comes: a reader that went away
            // (`send --listen --stay forever | head -1`) would otherwise keep the command waiting until the next.
            if d.staying() && d.exec.is_none() && stdout_reader_gone() {
                bail!(
                    "standard output's reader is gone (its pipe was closed) while staying for downlink records: \
                     stopped; {}, and the node keeps what comes next for the next run",
                    d.summary()
                );
            }
            d.ask_if_due(&mut link, Instant::now());
        }
        let staying = downlink.as_ref().is_some_and(|d| d.staying());
        let waiting = !link.sender().is_idle() || first_seq.is_none() && lines > 0;
        if link.sender().last_progress() != seen_progress {
            seen_progress = link.sender().last_progress();
            last_progress = Instant::now();
        }
        if !waiting || staying {
            // The clock of the give-up timeout runs only while something waits for the node, and not while the
            // command stays awake for pushes: then it keeps asking until the node is back.
            last_progress = Instant::now();
        }
        // Only while records wait: a timeout shorter than reading the input once gave up before a line was read,
        // and said the input was empty.
        if let Some(limit) = no_progress_limit
            && waiting
            && last_progress.elapsed() >= limit
        {
            break;
        }
        let round = if input_open { INPUT_POLL } else { STAY_POLL };
        let was_at = link.address();
        link.drive(Instant::now() + round)?;
        if link.moves() > moves_told {
            moves_told = link.moves();
            eprintln!(
                "the node at {was_at} answered nothing for {} s; trying {}",
                crate::sender::MOVE_AFTER.as_secs_f64(),
                link.address()
            );
        }
        let to = link.address();
        for event in link.take_events() {
            match event {
                SenderEvent::Stored { through: t, .. } => {
                    if first_seq.is_none() {
                        // The first Stored answers the probe: our records start after it.
                        first_seq = Some(t + 1);
                    }
                    through = t;
                    if let Some(app) = cannot_store.take() {
                        eprintln!("the node stores app {app} again");
                    }
                }
                SenderEvent::NotStored { app, reason } => {
                    eprintln!(
                        "the node cannot store app {app} now (reason {reason}: {}); sending again until it can",
                        not_stored_reason(reason)
                    );
                    cannot_store = Some(app);
                }
                SenderEvent::Refused { app, reason } => {
                    // Said once, by the exit message below: the loop ends at once.
                    refused = Some((app, reason));
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
                SenderEvent::Down { seq, payload, .. } => {
                    if let Some(d) = &mut downlink {
                        d.print(seq, &payload)?;
                    }
                }
                SenderEvent::DownlinkUnanswered { app } => {
                    eprintln!(
                        "the node at {to} answers this sender but never its LISTEN for app {app}: it has no \
                         downlink (a node older than protocol version 1.1)"
                    );
                    no_downlink = true;
                }
            }
        }
        // Printed records are kept as heard only once standard output has them.
        if let Some(d) = &mut downlink {
            d.keep()?;
        }
        if refused.is_some() {
            break;
        }
        if progress && last_shown.elapsed() > Duration::from_millis(200) {
            let done = first_seq.map_or(0, |f| (through + 1).saturating_sub(f));
            eprint!(
                "\rstored {done} of {lines}{}{}",
                if input_open { " (reading input)" } else { "" },
                downlink
                    .as_ref()
                    .map_or(String::new(), |d| format!(", printed {}", d.printed))
            );
            let _ = std::io::stderr().flush();
            last_shown = Instant::now();
        }
    }
    if progress {
        eprint!("\r\x1b[K");
    }
    let secs = start.elapsed().as_secs_f64();
    let to = if addrs.len() == 1 {
        addrs[0].to_string()
    } else {
        let all: Vec<String> = addrs.iter().map(SocketAddr::to_string).collect();
        format!("{} (the last of {} tried)", link.address(), all.join(", "))
    };
    // With --listen, standard output carries the downlink records alone.
    let say = |text: String| {
        if listening {
            eprintln!("{text}");
        } else {
            println!("{text}");
        }
    };
    // Not when the node refused the app listened on before anything was printed: the refusal below says so once.
    if let Some(d) = &downlink
        && !(d.printed == 0
            && refused
                .as_ref()
                .is_some_and(|(app, _)| Some(app) == args.listen.as_ref()))
    {
        eprintln!("{}", d.summary());
    }
    let stored = first_seq.map_or(0, |f| (through + 1).saturating_sub(f));
    let unacked = lines.saturating_sub(stored);
    if let Some(e) = bad_input {
        let at = lines + 1;
        let what = match (lines, unacked) {
            (0, _) => "nothing was sent".to_string(),
            (_, 0) => format!(
                "the {lines} line{} before it {} stored for app {} (seq {}–{through}) and nothing from it on was \
                 sent",
                if lines == 1 { "" } else { "s" },
                if lines == 1 { "was" } else { "were" },
                args.app,
                first_seq.unwrap_or(1)
            ),
            _ => format!(
                "of the {lines} lines before it {unacked} were not acknowledged (the node at {to} answered nothing \
                 for {:.1} s) and nothing from it on was sent",
                args.timeout
            ),
        };
        let again = if lines == 0 {
            "Fix that line and send again".to_string()
        } else {
            format!(
                "Fix that line, then send from it on (`tail -n +{at} FILE | pure-serve send …`): sending the lines \
                 before it again would store them again"
            )
        };
        bail!(
            "{}; send stopped there: {what}. {again}",
            super::one_line(&e)
        );
    }
    if let Some((app, reason)) = refused {
        let why = refuse_reason(reason);
        if lines == 0 {
            bail!("the node refused app {app} ({why}); nothing was printed");
        }
        bail!("{unacked} of {lines} records not stored: the node refused app {app} ({why})");
    }
    if unacked > 0 || downlink.is_some() && !link.sender().is_idle() && !no_downlink {
        let what = if unacked > 0 {
            format!("{unacked} of {lines} records not acknowledged; ")
        } else {
            String::new()
        };
        let why = match (&cannot_store, seen_progress) {
            (Some(app), _) => format!(
                "acknowledged nothing for {:.1} s: the node said it cannot store app {app} ({})",
                args.timeout,
                not_stored_reason(crate::proto::wire::NOT_STORED_STORE_FAILING)
            ),
            (None, None) => {
                // With no record sent, what was asked is the downlink of --listen's app, served while it takes no
                // input, not while its store cannot commit.
                let app_hint = match (&args.listen, lines) {
                    (Some(listen), 0) => format!(
                        "Or can app {listen} not store now? The node's /healthz and pure_app_can_store say so"
                    ),
                    _ => format!(
                        "Or does app {} take no input now, an outlet behind its max_lag_records? The node's status \
                         page and pure_app_paused say so",
                        args.app
                    ),
                };
                format!(
                    "never answered in {:.1} s (is it running there, with this key in its senders file, and is \
                     --node its public key? {app_hint})",
                    args.timeout
                )
            }
            (None, Some(_)) => format!("answered nothing for {:.1} s", args.timeout),
        };
        bail!("gave up: {what}the node at {to} {why}");
    }
    if lines == 0 {
        if !listening {
            say("nothing to send: standard input was empty".to_string());
        }
    } else {
        let records = if lines == 1 { "record" } else { "records" };
        say(format!(
            "stored {lines} {records} for app {} (seq {}–{through}) in {secs:.2} s ({:.0} records/s)",
            args.app,
            first_seq.unwrap_or(1),
            lines as f64 / secs.max(1e-9)
        ));
    }
    if no_downlink {
        bail!(
            "app {} has no downlink on the node at {to}; nothing was printed",
            args.listen.as_deref().unwrap_or_default()
        );
    }
    Ok(())
}

/// `--listen`: the downlink flow's printing, its heard file and the stay after the input.
struct Downlink {
    app: String,
    out: std::io::BufWriter<std::io::Stdout>,
    heard_file: Option<HeardFile>,
    /// `--exec`: the handler run per record instead of printing it.
    exec: Option<String>,
    /// The sequence of the last record printed.
    heard: u64,
    printed: u64,
    stay: Stay,
    ask_every: Duration,
    /// When the stay began (the first time all was done), and when the node was last asked.
    stay_from: Option<Instant>,
    last_ask: Instant,
}

impl Downlink {
    fn open(link: &mut UdpLink, app: &str, args: &SendArgs) -> anyhow::Result<Self> {
        if !crate::proto::wire::valid_app_name(app.as_bytes()) {
            bail!("--listen {app:?} is not 1–32 characters of a-z 0-9 _ -");
        }
        if !(args.ask_every.is_finite() && args.ask_every > 0.0) {
            bail!(
                "--ask-every {} is not a positive number of seconds (e.g. 10)",
                args.ask_every
            );
        }
        if args.exec.is_none() && stdout_is_null() {
            bail!(
                "--listen prints the downlink records on standard output, which is /dev/null (or was closed): \
                 they would be lost once printed, since the node deletes what the device has; give standard \
                 output a file or a pipe, or hand each record to a program with --exec"
            );
        }
        let heard_file = args
            .heard_file
            .as_deref()
            .map(HeardFile::open)
            .transpose()?;
        let heard = heard_file.as_ref().map_or(0, HeardFile::kept);
        if args.down_window > 0 {
            link.sender().set_down_window(args.down_window);
            // The system call takes an int; the kernel caps it at net.core.rmem_max anyway.
            let buffer = args.down_window.min(i32::MAX as u64) as usize;
            link.set_receive_buffer(buffer).with_context(|| {
                format!(
                    "cannot give the socket a receive buffer for --down-window {}; give a smaller one, or 0 \
                     for version 1.1",
                    args.down_window
                )
            })?;
        }
        link.listen(app, heard)?;
        Ok(Downlink {
            app: app.to_string(),
            out: std::io::BufWriter::new(std::io::stdout()),
            heard_file,
            exec: args.exec.clone(),
            heard,
            printed: 0,
            stay: args.stay,
            ask_every: Duration::from_secs_f64(args.ask_every),
            stay_from: None,
            last_ask: Instant::now(),
        })
    }

    fn print(&mut self, seq: u64, payload: &[u8]) -> anyhow::Result<()> {
        if let Some(cmd) = &self.exec {
            run_handler(cmd, &self.app, seq, payload)?;
            self.heard = seq;
            self.printed += 1;
            // Kept at once: a later record's failure must not give this one again.
            if let Some(f) = &mut self.heard_file {
                f.keep(seq)?;
            }
            return Ok(());
        }
        self.out
            .write_all(payload)
            .and_then(|()| self.out.write_all(b"\n"))
            .context(STDOUT_GONE)?;
        self.heard = seq;
        self.printed += 1;
        Ok(())
    }

    /// Flushes what was printed, then keeps its sequence in the heard file.
    fn keep(&mut self) -> anyhow::Result<()> {
        self.out.flush().context(STDOUT_GONE)?;
        if let Some(f) = &mut self.heard_file {
            f.keep(self.heard)?;
        }
        Ok(())
    }

    fn staying(&self) -> bool {
        self.stay_from.is_some()
    }

    /// Everything is done now: true once the stay is over (it starts the first time this is asked).
    fn stay_over(&mut self, now: Instant) -> bool {
        let from = *self.stay_from.get_or_insert(now);
        match self.stay {
            Stay::For(d) => now >= from + d,
            Stay::Forever => false,
        }
    }

    fn ask_if_due(&mut self, link: &mut UdpLink, now: Instant) {
        if self.staying() && now >= self.last_ask + self.ask_every {
            link.sender().listen_now(&self.app);
            self.last_ask = now;
        }
    }

    fn summary(&self) -> String {
        let records = if self.printed == 1 {
            "record"
        } else {
            "records"
        };
        let verb = match &self.exec {
            Some(cmd) => format!(
                "handed {} downlink {records} of app {} to `{cmd}`",
                self.printed, self.app
            ),
            None => format!(
                "printed {} downlink {records} of app {}",
                self.printed, self.app
            ),
        };
        format!(
            "{verb}; heard {}{}",
            self.heard,
            self.heard_file.as_ref().map_or(String::new(), |_| format!(
                ", kept in {}",
                self.heard_path()
            ))
        )
    }

    fn heard_path(&self) -> String {
        self.heard_file
            .as_ref()
            .map_or(String::new(), |f| f.path().display().to_string())
    }
}

/// Runs `--exec`'s handler for one record and waits for it; an error unless it exits 0.
fn run_handler(cmd: &str, app: &str, seq: u64, payload: &[u8]) -> anyhow::Result<()> {
    let mut child = std::process::Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .env("PURE_APP", app)
        .env("PURE_SEQ", seq.to_string())
        .stdin(std::process::Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot start --exec {cmd:?} with sh -c"))?;
    if let Some(mut stdin) = child.stdin.take() {
        // A handler that does not read its record is its own business: only its exit status counts.
        let _ = stdin.write_all(payload);
    }
    let status = child
        .wait()
        .with_context(|| format!("waiting for --exec {cmd:?}"))?;
    if !status.success() {
        bail!(
            "--exec {cmd:?} failed ({status}) for downlink record {seq} of app {app}: it was not kept as heard, \
             so the node gives it again to the next run; fix the handler and run again"
        );
    }
    Ok(())
}

/// Whether standard output is a pipe or socket whose reader has gone: the kernel reports it as an error or hang-up
/// on the writing end without anything being written.
fn stdout_reader_gone() -> bool {
    let mut fd = libc::pollfd {
        fd: 1,
        events: 0,
        revents: 0,
    };
    // SAFETY: one pollfd this function owns, no wait.
    let ready = unsafe { libc::poll(&mut fd, 1, 0) };
    ready == 1 && fd.revents & (libc::POLLERR | libc::POLLHUP) != 0
}

/// Whether standard output is /dev/null: where the program's standard library put it if it was closed at start,
/// or where the user sent it.
fn stdout_is_null() -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(null) = std::fs::metadata("/dev/null") else {
        return false;
    };
    // SAFETY: fstat of descriptor 1 into a zeroed stat this function owns.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(1, &mut st) } != 0 {
        return false;
    }
    st.st_mode & libc::S_IFMT == libc::S_IFCHR && st.st_rdev == null.rdev()
}

const STDOUT_GONE: &str = "writing a downlink record to standard output (its reader is gone?); it was not kept as \
                           heard, so the node sends it again to the next run";
/// How long one round waits for the node once the input has ended.
const STAY_POLL: Duration = Duration::from_millis(250);

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
    /// Starts the reader thread. Standard input is read on its own thread so records stream: `tail -f log |
    /// pure-serve send …` works, and sending starts before the input ends. It reads blocks (whatever each read
    /// gives, up to BLOCK) and hands them over whole; the link's thread splits them into lines and queues each
    /// straight from the block, and the buffers go back to the reader: one channel hop per block and no allocation
    /// per record (research/021). The channel is bounded so a fast producer waits for the link.
    fn spawn() -> anyhow::Result<Self> {
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
        Ok(LineInput {
            blocks: blocks_rx,
            free: free_tx,
            block: None,
            partial: Vec::new(),
        })
    }

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
            // Checked between blocks: the queue may pass its bytes by one block at most.
            if room == 0 || sender.unacked_bytes() >= LINE_QUEUE_BYTES {
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
                let (used, n) = match sender.queue_lines(app, data, room) {
                    Ok(taken) => taken,
                    Err((n, e)) => {
                        // The lines before it stay queued and are sent.
                        *lines += n as u64;
                        return Err(anyhow::Error::new(e)
                            .context(format!("line {} of standard input", *lines + 1)));
                    }
                };
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
            "its store cannot commit: a full or read-only disk or a store deleted under it, or on a fleet its \
             database out of reach; the node's log and /healthz say which"
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
