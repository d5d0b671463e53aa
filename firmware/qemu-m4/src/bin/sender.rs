//! The sender's firmware: `pure-link`'s sender (the one implementation the node's own tools run) on the board,
//! delivering records to a real node over the UART and printing the node's downlink records (issue 35).
//!
//! Configuration is the semihosting command line, `sender WORD... -- FLASH-PATH` (README.md, "The sender"):
//! `key=HEX` (the device's 32-byte secret key), `node=HEX` (the node's public key), `app=NAME`, `records=N` (how
//! many records to deliver this boot), `size=BYTES` (each record's size), `stay=MS` (how long to keep listening
//! for downlink once every record is acknowledged), `timeout=MS` (give up, exit 2).
//!
//! Kept in flash ([`pure_qemu_m4::counter`], each a log in two pages): the boot counter (pages 0–1), from which
//! the run id comes; the flow's next sequence (pages 2–3), written before a record is handed to the sender; the
//! downlink heard sequence (pages 4–5), written after a downlink record is printed.
//!
//! Console lines: `key: value` facts, `stored APP THROUGH` per acknowledgement, `down SEQ PAYLOAD` per downlink
//! record (the payload as text when it is printable ASCII, else `hex:` and its bytes in hex), and the stack peak.
//! Exit 0 when every record is acknowledged, the stay is over and the sender is idle; 2 at the timeout; 4 a flash
//! error; 5 no board; 6 a bad command line; 7 the node refused the app.
#![no_std]
#![no_main]

use cortex_m_rt::entry;
use pure_link::buf::SliceOut;
use pure_link::crypto::Identity;
use pure_link::queue::ArrayQueue;
use pure_link::sender::{Event, FlowStart, Sender, SenderConfig, SenderError};
use pure_link::time::Millis;
use pure_qemu_m4::board::flash::{Flash, FlashError};
use pure_qemu_m4::board::{exit, host, now_ms, stack, Board};
use pure_qemu_m4::counter::Counter;
use pure_qemu_m4::println;
use sha2::{Digest, Sha256};

/// The flow's queue in RAM: at most this many bytes of records (each with its length) and this many records. The
/// flash outbox will take its place through the same `RecordQueue` trait.
const QUEUE_BYTES: usize = 2048;
const QUEUE_RECORDS: usize = 64;
/// One flow, one listen, the last 8 packets' send times for round-trip samples.
type DeviceSender = Sender<Millis, ArrayQueue<QUEUE_BYTES, QUEUE_RECORDS>, 1, 1, 8>;

/// The sender's datagrams: the core's default size (docs/protocol.md 4), which the transmit buffer holds.
const DATAGRAM: usize = pure_link::sender::DEFAULT_DATAGRAM;
/// The largest node datagram (docs/protocol.md 4): the receive buffer.
const NODE_DATAGRAM: usize = pure_link::wire::MAX_DATAGRAM;
/// The largest record this firmware makes.
const RECORD_MAX: usize = 256;
/// While staying awake for downlink, the firmware asks the node again this often (within the node's default
/// `--link-idle-ms`, 30 s, so its session stays live and pushed records come at once).
const ASK_EVERY_MS: u64 = 5_000;

/// Flash pages of the three counters (two pages each).
const BOOT_PAGES: usize = 0;
const SEQ_PAGES: usize = 2;
const HEARD_PAGES: usize = 4;

const EXIT_TIMEOUT: u32 = 2;
const EXIT_FLASH: u32 = 4;
const EXIT_BOARD: u32 = 5;
const EXIT_CONFIG: u32 = 6;
const EXIT_REFUSED: u32 = 7;

#[entry]
fn main() -> ! {
    let mut board = Board::take().unwrap_or_else(|e| {
        println!("error: board: {:?}", e);
        exit(EXIT_BOARD)
    });
    let mut line = [0u8; 512];
    let cfg = host::cmdline(&mut line)
        .ok_or("no command line")
        .and_then(config::parse)
        .unwrap_or_else(|e| {
            println!("error: command line: {}", e);
            exit(EXIT_CONFIG)
        });
    // The boot counter is raised in flash before its value is used for anything, so no two boots that send get
    // the same one (a cut between the write and the first packet only skips a value).
    let mut boots = Counter::load(&mut board.flash, BOOT_PAGES).unwrap_or_else(|e| flash_err(e));
    let boot = boots.get() + 1;
    boots
        .set(&mut board.flash, boot)
        .unwrap_or_else(|e| flash_err(e));
    let mut next_seq = Counter::load(&mut board.flash, SEQ_PAGES).unwrap_or_else(|e| flash_err(e));
    let mut heard = Counter::load(&mut board.flash, HEARD_PAGES).unwrap_or_else(|e| flash_err(e));
    let first = next_seq.get().max(1);
    let run_id = run_id(&cfg.key, boot);
    println!("boot: {}", boot);
    println!("run id: {:016x}", run_id);
    println!("first seq: {}", first);
    println!("heard: {}", heard.get());

    let identity = Identity::from_secret_bytes(cfg.key);
    let mut sender = DeviceSender::new(SenderConfig::with_run_id(identity, cfg.node, run_id))
        .unwrap_or_else(|e| {
            println!("error: sender: {}", e);
            exit(EXIT_CONFIG)
        });
    let app = cfg.app;
    let opened = sender
        .open_flow(app, FlowStart::At(first))
        .and_then(|()| sender.listen(app, heard.get()));
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

        // Queue what fits. The record's sequence is persisted before the sender gets it: a reboot starts after
        // it, whatever became of the record. A full queue keeps the rest for after the next acknowledgement.
        while queued < cfg.records {
            let Some(seq) = sender.next_seq(app) else {
                break;
            };
            // The queue's own rule (ArrayQueue: records and bytes, each with its length), asked first so that a
            // sequence is not written to flash for a record the queue would refuse.
            let need = pure_link::wire::varint_len(cfg.size as u64) + cfg.size;
            if sender.unacked(app) >= QUEUE_RECORDS || sender.unacked_bytes() + need > QUEUE_BYTES {
                break;
            }
            next_seq
                .set(&mut board.flash, seq.saturating_add(1))
                .unwrap_or_else(|e| flash_err(e));
            let r = make_record(seq, cfg.size, &mut record);
            match sender.queue(app, r) {
                Ok(()) => queued += 1,
                Err(SenderError::QueueFull(_)) => break,
                Err(e) => {
                    println!("error: queue: {}", e);
                    exit(EXIT_CONFIG)
                }
            }
        }

        while sender.poll_transmit(Millis(now), &mut out) {
            if out.overflowed() {
                // The buffer holds the configured datagram size, so this cannot happen; never send a cut one.
                println!("error: datagram larger than {} bytes", DATAGRAM);
                continue;
            }
            board.uart.send(out.written());
        }

        if let Some(n) = board.uart.recv(&mut rx) {
            let mut sink = |e: Event<'_>| status.event(e, &mut board.flash, &mut heard);
            sender.handle_datagram(Millis(now_ms()), &mut rx[..n], &mut sink);
        } else if sender.poll_timeout().is_some_and(|t| Millis(now) >= t) {
            let mut sink = |e: Event<'_>| status.event(e, &mut board.flash, &mut heard);
            sender.handle_timeout(Millis(now), &mut sink);
        }
        if let Some(e) = status.flash_error {
            flash_err(e)
        }
        if status.refused {
            exit(EXIT_REFUSED)
        }

        let delivered = queued == cfg.records && sender.unacked(app) == 0;
        if delivered && done_at.is_none() {
            done_at = Some(now);
            println!("delivered: {} records in {} ms", queued, now - started);
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
                "error: timeout after {} ms: {} of {} records queued, {} unacknowledged, stored through {:?}",
                cfg.timeout_ms,
                queued,
                cfg.records,
                sender.unacked(app),
                sender.stored_through(app)
            );
            exit(EXIT_TIMEOUT)
        }
    }

    let stats = sender.stats();
    println!(
        "stored through: {}",
        sender.stored_through(app).unwrap_or(0)
    );
    println!("next seq: {}", next_seq.get());
    println!("heard: {}", heard.get());
    println!("packets sent: {}", stats.packets_sent);
    println!("packets received: {}", stats.packets_received);
    println!("packets rejected: {}", stats.packets_rejected);
    println!("retransmit rounds: {}", stats.retransmit_rounds);
    println!("uart dropped: {}", board.uart.dropped());
    println!("run: {} ms", now_ms() - started);
    println!(
        "sender state: {} bytes",
        core::mem::size_of::<DeviceSender>()
    );
    println!("stack peak: {} of {} bytes", stack::peak(), stack::size());
    exit(0)
}

fn flash_err(e: FlashError) -> ! {
    println!("error: flash: {:?}", e);
    exit(EXIT_FLASH)
}

/// The run id of boot `boot` of the device with secret `key`: the first 8 bytes of
/// SHA-256("pure-link run id" ‖ key ‖ boot as u64 LE).
///
/// It must never repeat for one key: the run's keys (k_s2n, k_n2s) are derived from it, and packet numbers start
/// at 0 in every run, so a repeated run id would seal different packets under the same key and nonce
/// (AES-GCM's nonce reuse: the plaintexts' XOR leaks and tags can be forged), and the node would take the new
/// run's packets as replays of the old one's. It does not repeat because `boot` does not: the counter lives in
/// flash as a log that only grows ([`Counter`]), and each boot writes its new value before it is used, so no two
/// boots that send anything hash the same input; SHA-256 of distinct inputs truncated to 64 bits collides only
/// with the chance of a 64-bit hash collision (about n²/2^65 after n boots: 2^-25 after a million). The key is
/// mixed in so that run ids, which travel in clear, do not show the boot count and are unrelated between devices.
/// What this cannot survive is the counter's pages being erased with the key kept: a device whose flash is wiped
/// must get a new key (docs/devices.md's rule for a counter that went back).
fn run_id(key: &[u8; 32], boot: u64) -> u64 {
    let mut h = Sha256::new();
    h.update(b"pure-link run id");
    h.update(key);
    h.update(boot.to_le_bytes());
    let digest = h.finalize();
    let mut id = [0u8; 8];
    id.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(id)
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
    flash_error: Option<FlashError>,
    refused: bool,
}

impl Status {
    /// Prints an event; a downlink record's sequence is written to flash after the record is printed (a cut
    /// between the two prints it again at the next boot: at least once, never lost).
    fn event(&mut self, e: Event<'_>, flash: &mut Flash, heard: &mut Counter) {
        match e {
            Event::Stored { app, through } => println!("stored {} {}", app, through),
            Event::Down {
                app: _,
                seq,
                payload,
            } => {
                print_down(seq, payload);
                if let Err(e) = heard.set(flash, seq) {
                    self.flash_error.get_or_insert(e);
                }
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
