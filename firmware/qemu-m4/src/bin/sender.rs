//! The sender's firmware: `pure-link`'s sender (the one implementation the node's own tools run) on the board,
//! delivering records to a real node over the UART and printing the node's downlink records (issue 35). Its
//! records are kept in `pure-link`'s outbox in flash, so a power cut at any moment loses no record it said was
//! queued and numbers none twice.
//!
//! Configuration is the semihosting command line, `sender WORD... -- FLASH-PATH` (README.md, "The sender"):
//! `key=HEX` (the device's 32-byte secret key), `node=HEX` (the node's public key), `app=NAME`, `records=N` (queue
//! records until the outbox's next sequence passes N: records 1..=N over all boots), `size=BYTES` (each record's
//! size), `stay=MS` (how long to keep listening for downlink once every record is acknowledged), `timeout=MS`
//! (give up, exit 2).
//!
//! Kept in flash: the outbox ([`pure_link::outbox::Outbox`] over [`BoardFlash`], pages 0–9 of the board's 16):
//! the records queued and not yet stored by the node, their numbering, the downlink heard sequence and the run
//! count, from which the run id comes.
//!
//! Console lines: `key: value` facts, `queued SEQ` once a record is in flash, `stored APP THROUGH` per
//! acknowledgement, `down SEQ PAYLOAD` per downlink record (the payload as text when it is printable ASCII, else
//! `hex:` and its bytes in hex), `kept heard SEQ` once the heard sequence is in flash, and the stack peak.
//! Exit 0 when every record is acknowledged, the stay is over and the sender is idle; 2 at the timeout; 4 a flash
//! error; 5 no board; 6 a bad command line; 7 the node refused the app.
#![no_std]
#![no_main]

use cortex_m_rt::entry;
use pure_link::buf::SliceOut;
use pure_link::crypto::Identity;
use pure_link::outbox::{Outbox, OutboxError};
use pure_link::queue::RecordQueue;
use pure_link::sender::{Event, Sender, SenderConfig};
use pure_link::time::Millis;
use pure_link::wire::RecordFormat;
use pure_qemu_m4::board::{exit, host, now_ms, stack, Board};
use pure_qemu_m4::outbox::BoardFlash;
use pure_qemu_m4::println;

/// The outbox's pages: the board's first 10 (of 16), 40 KiB.
const OUTBOX_FIRST_PAGE: usize = 0;
const OUTBOX_PAGES: u16 = 10;
/// Records the outbox holds unacknowledged (6 bytes of RAM each: where each lies in flash).
const OUTBOX_RECORDS: usize = 64;
type DeviceOutbox = Outbox<BoardFlash, OUTBOX_RECORDS>;
/// One flow, one listen, the last 8 packets' send times for round-trip samples.
type DeviceSender = Sender<Millis, DeviceOutbox, 1, 1, 8>;

/// The sender's datagrams: the core's default size (docs/protocol.md 4), which the transmit buffer holds.
const DATAGRAM: usize = pure_link::sender::DEFAULT_DATAGRAM;
/// The largest node datagram (docs/protocol.md 4): the receive buffer.
const NODE_DATAGRAM: usize = pure_link::wire::MAX_DATAGRAM;
/// The largest record this firmware makes.
const RECORD_MAX: usize = 256;
/// While staying awake for downlink, the firmware asks the node again this often (within the node's default
/// `--link-idle-ms`, 30 s, so its session stays live and pushed records come at once).
const ASK_EVERY_MS: u64 = 5_000;

const EXIT_TIMEOUT: u32 = 2;
const EXIT_FLASH: u32 = 4;
const EXIT_BOARD: u32 = 5;
const EXIT_CONFIG: u32 = 6;
const EXIT_REFUSED: u32 = 7;

#[entry]
fn main() -> ! {
    let board = Board::take().unwrap_or_else(|e| {
        println!("error: board: {:?}", e);
        exit(EXIT_BOARD)
    });
    let mut uart = board.uart;
    let mut line = [0u8; 512];
    let cfg = host::cmdline(&mut line)
        .ok_or("no command line")
        .and_then(config::parse)
        .unwrap_or_else(|e| {
            println!("error: command line: {}", e);
            exit(EXIT_CONFIG)
        });
    let flash = BoardFlash::new(board.flash, OUTBOX_FIRST_PAGE, OUTBOX_PAGES).unwrap_or_else(|e| {
        println!("error: flash: {:?}", e);
        exit(EXIT_FLASH)
    });
    let mut outbox = DeviceOutbox::open(flash).unwrap_or_else(|e| outbox_err(e, None));
    // The run is counted in flash before its id is used for anything (docs/devices.md; `Outbox::new_run` says why
    // a run id must never repeat): a cut between the two only skips a count.
    let run_id = outbox
        .new_run(&cfg.key, &[])
        .unwrap_or_else(|e| outbox_err(e, Some(&outbox)));
    let first = outbox.first_seq();
    // A new outbox asks the node where its numbering stands (docs/devices.md, "A new outbox").
    let start = outbox.flow_start();
    let heard = outbox.heard();
    println!("boot: {}", outbox.runs());
    println!("run id: {:016x}", run_id);
    println!("first seq: {}", first);
    println!("in flash: {}", outbox.len());
    println!("heard: {}", heard);

    let identity = Identity::from_secret_bytes(cfg.key);
    let mut sender = DeviceSender::new(SenderConfig::with_run_id(identity, cfg.node, run_id))
        .unwrap_or_else(|e| {
            println!("error: sender: {}", e);
            exit(EXIT_CONFIG)
        });
    let app = cfg.app;
    let opened = sender
        .open_flow_with(app, start, RecordFormat::Plain, outbox)
        .and_then(|()| sender.listen(app, heard));
    if let Err(e) = opened {
        println!("error: sender: {}", e);
        exit(EXIT_CONFIG)
    }
    if cfg.size > RECORD_MAX.min(sender.max_payload(app)) {
        println!(
            "error: command line: size={} is above {}",
            cfg.size,
            RECORD_MAX.min(sender.max_payload(app))
        );
        exit(EXIT_CONFIG)
    }

    let mut tx = [0u8; DATAGRAM];
    let mut out = SliceOut::new(&mut tx);
    let mut rx = [0u8; NODE_DATAGRAM];
    let mut record = [0u8; RECORD_MAX];
    let mut status = Status::default();
    let mut queued = 0u64;
    let started = now_ms();
    let mut done_at: Option<u64> = None;
    let mut asked_at = started;

    loop {
        let now = now_ms();

        // Queue what the outbox takes, each record naming its sequence. `push_slice` returns Ok once the record
        // is in flash (its header programmed last): then, and only then, it is "queued". A full outbox keeps the
        // rest for after the next acknowledgement frees room. (`Sender::queue` wants a queue it can make by
        // `Default`, for flows it opens itself; the outbox is opened on its flash, so records go in through the
        // flow's queue: the sender reads its records from there.)
        if let Some(outbox) = sender.queue_mut(app) {
            let failures = outbox.stats().flash_failures;
            loop {
                let seq = outbox.next_seq();
                if seq > cfg.records {
                    break;
                }
                let r = make_record(seq, cfg.size, &mut record);
                if outbox.push_slice(r).is_err() {
                    break;
                }
                println!("queued {}", seq);
                queued += 1;
            }
            if outbox.stats().flash_failures > failures {
                outbox_err(OutboxError::Flash, Some(outbox))
            }
        }

        while sender.poll_transmit(Millis(now), &mut out) {
            if out.overflowed() {
                // The buffer holds the configured datagram size, so this cannot happen; never send a cut one.
                println!("error: datagram larger than {} bytes", DATAGRAM);
                continue;
            }
            uart.send(out.written());
        }

        if let Some(n) = uart.recv(&mut rx) {
            let mut sink = |e: Event<'_>| status.event(e);
            sender.handle_datagram(Millis(now_ms()), &mut rx[..n], &mut sink);
        } else if sender.poll_timeout().is_some_and(|t| Millis(now) >= t) {
            let mut sink = |e: Event<'_>| status.event(e);
            sender.handle_timeout(Millis(now), &mut sink);
        }
        // The downlink records just printed: their heard sequence is kept in flash before the next
        // `poll_transmit` tells the node they were taken (it deletes them then). A cut after the printing and
        // before this write prints them again at the next boot: at least once, never lost.
        if let Some(seq) = status.heard.take() {
            if let Some(outbox) = sender.queue_mut(app) {
                match outbox.set_heard(seq) {
                    Ok(()) => println!("kept heard {}", seq),
                    Err(e) => outbox_err(e, Some(outbox)),
                }
            }
        }
        if status.refused {
            exit(EXIT_REFUSED)
        }

        let next = sender.queue_mut(app).map_or(0, |o| o.next_seq());
        let delivered = next > cfg.records && sender.unacked(app) == 0;
        if delivered && done_at.is_none() {
            done_at = Some(now);
            println!(
                "delivered: {} records queued this boot, all stored, in {} ms",
                queued,
                now - started
            );
        }
        if let Some(at) = done_at {
            if now >= at.saturating_add(cfg.stay_ms) && sender.is_idle() {
                break;
            }
            if now >= asked_at + ASK_EVERY_MS {
                asked_at = now;
                sender.listen_now(app);
            }
        }
        if now >= started.saturating_add(cfg.timeout_ms) {
            println!(
                "error: timeout after {} ms: next seq {} (records={}), {} unacknowledged, stored through {:?}",
                cfg.timeout_ms,
                next,
                cfg.records,
                sender.unacked(app),
                sender.stored_through(app)
            );
            exit(EXIT_TIMEOUT)
        }
    }

    let stats = sender.stats().clone();
    println!(
        "stored through: {}",
        sender.stored_through(app).unwrap_or(0)
    );
    if let Some(outbox) = sender.queue_mut(app) {
        let o = outbox.stats();
        println!("next seq: {}", outbox.next_seq());
        println!("heard: {}", outbox.heard());
        println!("outbox units programmed: {}", o.units_programmed);
        println!("outbox pages erased: {}", o.pages_erased);
        println!("outbox marks lost: {}", o.marks_lost);
        for page in 0..OUTBOX_PAGES {
            if let Ok((erases, units)) = outbox.flash().counts(page) {
                println!(
                    "flash page {}: {} erases, {} units programmed",
                    page, erases, units
                );
            }
        }
    }
    println!("packets sent: {}", stats.packets_sent);
    println!("packets received: {}", stats.packets_received);
    println!("packets rejected: {}", stats.packets_rejected);
    println!("retransmit rounds: {}", stats.retransmit_rounds);
    println!("queue read failures: {}", stats.queue_read_failures);
    println!("uart dropped: {}", uart.dropped());
    println!("run: {} ms", now_ms() - started);
    println!(
        "sender state: {} bytes",
        core::mem::size_of::<DeviceSender>()
    );
    println!("stack peak: {} of {} bytes", stack::peak(), stack::size());
    exit(0)
}

/// Prints what the outbox (and, where it knows, the board's flash under it) said and exits 4.
fn outbox_err(e: OutboxError, outbox: Option<&DeviceOutbox>) -> ! {
    match outbox.and_then(|o| o.flash().last_error()) {
        Some(flash) => println!("error: outbox: {} ({:?})", e, flash),
        None => println!("error: outbox: {}", e),
    }
    exit(EXIT_FLASH)
}

/// `rec-SEQ` padded with `.` to `size` bytes (cut to `size` if longer).
fn make_record(seq: u64, size: usize, buf: &mut [u8; RECORD_MAX]) -> &[u8] {
    let size = size.min(RECORD_MAX);
    buf.fill(b'.');
    let mut digits = [0u8; 20];
    let mut n = seq;
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    let text = b"rec-".iter().chain(&digits[at..]);
    for (slot, &b) in buf.iter_mut().zip(text) {
        *slot = b;
    }
    &buf[..size]
}

/// What the sender's events left for the loop to act on.
#[derive(Default)]
struct Status {
    /// The largest downlink sequence printed and not yet kept in flash.
    heard: Option<u64>,
    refused: bool,
}

impl Status {
    /// Prints an event; a downlink record's sequence is noted, for the loop to keep in flash once the sender
    /// hands the datagram back (the sink cannot reach the outbox: the sender holds it while it calls).
    fn event(&mut self, e: Event<'_>) {
        match e {
            Event::Stored { app, through } => println!("stored {} {}", app, through),
            Event::Down {
                app: _,
                seq,
                payload,
            } => {
                print_down(seq, payload);
                self.heard = Some(self.heard.map_or(seq, |h| h.max(seq)));
            }
            Event::Refused { app, reason } => {
                println!("refused {} {}", app, reason);
                self.refused = true;
            }
            Event::NotStored { app, reason } => println!("not stored {} {}", app, reason),
            Event::NodeAhead { app, node, ours } => {
                println!("node ahead {} {} {}", app, node, ours)
            }
            Event::NodeBehind { app, node, ours } => {
                println!("node behind {} {} {}", app, node, ours)
            }
            Event::DownlinkUnanswered { app } => println!("downlink unanswered {}", app),
        }
    }
}

/// `down SEQ PAYLOAD`: the payload as text if every byte is printable ASCII, else `hex:` and its bytes.
fn print_down(seq: u64, payload: &[u8]) {
    if let Some(text) = payload
        .iter()
        .all(|b| (0x20..0x7f).contains(b))
        .then(|| core::str::from_utf8(payload).ok())
        .flatten()
    {
        println!("down {} {}", seq, text);
        return;
    }
    cortex_m_semihosting::hprint!("down {} hex:", seq);
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut chunk = [0u8; 64];
    for part in payload.chunks(chunk.len() / 2) {
        for (i, b) in part.iter().enumerate() {
            chunk[2 * i] = HEX[usize::from(b >> 4)];
            chunk[2 * i + 1] = HEX[usize::from(b & 15)];
        }
        // Hex digits are ASCII.
        let text = core::str::from_utf8(&chunk[..2 * part.len()]).unwrap_or("");
        cortex_m_semihosting::hprint!("{}", text);
    }
    println!();
}

/// The command line's words (module doc). Never panics on what the host gives.
mod config {
    /// What a boot is asked to do.
    pub struct Config<'a> {
        pub key: [u8; 32],
        pub node: [u8; 32],
        pub app: &'a str,
        pub records: u64,
        pub size: usize,
        pub stay_ms: u64,
        pub timeout_ms: u64,
    }

    /// Parses `NAME WORD... [-- FLASH-PATH]`.
    pub fn parse(line: &[u8]) -> Result<Config<'_>, &'static str> {
        let line = core::str::from_utf8(line).map_err(|_| "not text")?;
        let words = line.split(" -- ").next().unwrap_or("");
        let mut key = None;
        let mut node = None;
        let mut cfg = Config {
            key: [0; 32],
            node: [0; 32],
            app: "main",
            records: 0,
            size: 32,
            stay_ms: 0,
            timeout_ms: 60_000,
        };
        for word in words.split(' ').skip(1).filter(|w| !w.is_empty()) {
            let (name, value) = word.split_once('=').ok_or("a word without =")?;
            match name {
                "key" => key = Some(hex32(value).ok_or("key= wants 64 hex digits")?),
                "node" => node = Some(hex32(value).ok_or("node= wants 64 hex digits")?),
                "app" => cfg.app = value,
                "records" => cfg.records = number(value).ok_or("records= wants a number")?,
                "size" => {
                    cfg.size = number(value)
                        .and_then(|n| usize::try_from(n).ok())
                        .ok_or("size= wants a number")?
                }
                "stay" => cfg.stay_ms = number(value).ok_or("stay= wants milliseconds")?,
                "timeout" => cfg.timeout_ms = number(value).ok_or("timeout= wants milliseconds")?,
                _ => return Err("an unknown word"),
            }
        }
        cfg.key = key.ok_or("no key=")?;
        cfg.node = node.ok_or("no node=")?;
        Ok(cfg)
    }

    fn number(s: &str) -> Option<u64> {
        if s.is_empty() || s.len() > 19 {
            return None;
        }
        s.bytes().try_fold(0u64, |n, b| {
            b.is_ascii_digit().then(|| n * 10 + u64::from(b - b'0'))
        })
    }

    fn hex32(s: &str) -> Option<[u8; 32]> {
        let s = s.as_bytes();
        if s.len() != 64 {
            return None;
        }
        let digit = |c: u8| match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            b'A'..=b'F' => Some(c - b'A' + 10),
            _ => None,
        };
        let mut out = [0u8; 32];
        for (i, o) in out.iter_mut().enumerate() {
            *o = (digit(s[2 * i])? << 4) | digit(s[2 * i + 1])?;
        }
        Some(out)
    }
}
