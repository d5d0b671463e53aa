//! The board the link's sender firmware runs on (`firmware/qemu-m4`), proven with its probe under
//! `qemu-system-arm -M mps2-an386`: datagrams over the UART to a UDP echo server of the test's own and back, the
//! millisecond clock against the host's, a counter in flash across runs and across a power cut (QEMU SIGKILLed),
//! and the flash file's counts of erases and units programmed. Then the sender's firmware (`src/bin/sender.rs`,
//! pure-link's sender on the board, its records in the outbox in flash) against a real node: records delivered and
//! stored once each and in order, downlink pushed to it printed once each, a second boot on the same flash that
//! numbers on, and thousands of records delivered through power cuts at random moments.
//!
//! Skipped (with the reason printed) without `qemu-system-arm` or the `thumbv7em-none-eabihf` target, unless
//! `PURE_REQUIRE_FIRMWARE=1` (`.ci/run`), where it fails.

#[path = "firmware_util/mod.rs"]
mod firmware_util;
#[path = "ops_util/mod.rs"]
mod ops_util;

use std::path::Path;
use std::time::{Duration, Instant};

use firmware_util::{Echo, Kill, Outcome, RunConfig};

/// The probe's datagram: `b'P'`, kind, counter (u32 LE), the board's `now_ms` (u64 LE), … (probe.rs).
fn counter_in(datagram: &[u8]) -> u32 {
    u32::from_le_bytes(datagram[2..6].try_into().unwrap())
}

fn assert_clean(run: &Outcome, counter: u32) {
    let console = &format!("{}{}", run.console, run.qemu_stderr);
    assert_eq!(run.code(), Some(0), "the probe failed: {console}");
    assert_eq!(
        run.field("counter"),
        Some(counter.to_string().as_str()),
        "{console}"
    );
    // Two datagrams, both echoed back and checked by the probe; nothing malformed on the UART.
    assert_eq!(run.datagrams.len(), 2, "{console}");
    assert_eq!(run.answers, 2, "{console}");
    assert_eq!(run.bad_frames, 0, "{console}");
    assert_eq!(run.field("uart dropped"), Some("0"), "{console}");
    for (_, d) in &run.datagrams {
        assert_eq!((d[0], d.len()), (b'P', 131), "{console}");
        assert_eq!(counter_in(d), counter);
        // The probe ends each datagram with the bytes SLIP escapes: they crossed both ways intact.
        assert_eq!(&d[d.len() - 5..], &[0xC0, 0xDB, 0xDC, 0xDD, 0xC0]);
    }
    // The board's clock against the host's: datagram 2 leaves 500 ms after datagram 1 by the board's clock, and
    // the host sees at least that much between them (the board's clock runs no faster than the host's). How much
    // more is not checked: a loaded host delays the emulated board and the UART as it likes.
    let board_gap: u64 = run
        .field("clock gap")
        .and_then(|v| v.strip_suffix(" ms")?.parse().ok())
        .unwrap_or_else(|| panic!("no clock gap printed: {console}"));
    assert!(board_gap >= 500, "{console}");
    let gap = run.datagrams[1].0 - run.datagrams[0].0;
    assert!(
        gap >= Duration::from_millis(450),
        "500 ms of the board's clock took {gap:?} of the host's: {console}"
    );
    eprintln!("500 ms of the board's clock ({board_gap} ms printed) took {gap:?} of the host's");
    let peak: usize = run
        .field("stack peak")
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no stack peak printed: {console}"));
    assert!(peak > 0 && peak < 16 * 1024, "stack peak {peak}: {console}");
}

#[test]
fn probe_counts_in_flash_across_runs_and_a_power_cut() {
    const TEST: &str = "probe_counts_in_flash_across_runs_and_a_power_cut";
    if !firmware_util::available(TEST) {
        return;
    }
    let elf = firmware_util::build("probe");
    let echo = Echo::start();
    let dir = tempfile::tempdir().unwrap();
    // A comma and a space in the path: QEMU's option quoting and the firmware's command line both hold.
    let flash = dir.path().join("flash, one.bin");
    let run = |kill| {
        firmware_util::run(&RunConfig {
            elf: &elf,
            flash: &flash,
            to: echo.addr,
            kill,
            args: &[],
        })
    };

    // Twice on one flash file: the counter is 1, then 2.
    let first = run(Kill::Never);
    assert_clean(&first, 1);
    eprintln!("probe run 1 took {:?}:\n{}", first.took, first.console);
    let second = run(Kill::Never);
    assert_clean(&second, 2);

    // Power cut when its first datagram is on the wire (the counter was written before it): the next run counts
    // on from it.
    let cut = run(Kill::AtDatagram(1));
    assert!(cut.killed, "{}", cut.console);
    assert_eq!(cut.code(), None, "QEMU was killed by a signal");
    assert_eq!(cut.datagrams.len(), 1);
    assert_eq!(counter_in(&cut.datagrams[0].1), 3);
    assert_clean(&run(Kill::Never), 4);

    // Power cuts at moments the test does not choose: a run cut before it wrote leaves the counter as it was, a
    // run cut after it wrote (or not cut at all) leaves it one more; never a torn or lost value.
    let mut last = 4;
    for ms in [40, 120, 250] {
        let cut = run(Kill::After(Duration::from_millis(ms)));
        let after = run(Kill::Never);
        assert_eq!(after.code(), Some(0), "{}", after.console);
        let n: u32 = after.field("counter").unwrap().parse().unwrap();
        eprintln!(
            "cut at {ms} ms: killed {}, its console {:?}; the next run counted {n}",
            cut.killed,
            cut.console.lines().collect::<Vec<_>>()
        );
        assert!(
            n == last + 2 || (n == last + 1 && cut.killed),
            "after a cut at {ms} ms the counter went from {last} to {n}: {}",
            cut.console
        );
        last = n;
    }

    // The flash file's counts: one program of page 0 per increment that reached the flash, no erase yet (the log
    // has 512 slots).
    let counts = firmware_util::flash_counts(&flash);
    assert_eq!(counts[0], (0, last), "page 0 (erases, programs)");
    assert!(counts[1..].iter().all(|&c| c == (0, 0)), "{counts:?}");
}

#[test]
fn slip_decoder_takes_any_bytes() {
    use firmware_util::{SlipDecoder, slip_encode};
    let mut d = SlipDecoder::default();
    let mut out = Vec::new();
    let mut feed = |bytes: &[u8], d: &mut SlipDecoder| {
        for &b in bytes {
            if let Some(f) = d.push(b) {
                out.push(f);
            }
        }
    };
    feed(&slip_encode(&[1, 0xC0, 0xDB, 2]), &mut d);
    feed(&[0xC0, 0xC0, 7, 0xDB, 0x00, 8, 0xC0], &mut d); // empty frames skipped; a bad escape
    feed(&[3, 0xDB, 0xC0, 9, 0xC0], &mut d); // ESC then END: bad; then a good frame
    feed(&vec![5u8; 70_000], &mut d); // longer than any datagram
    feed(&[0xC0, 6, 0xC0], &mut d);
    assert_eq!(
        out,
        vec![
            Ok(vec![1, 0xC0, 0xDB, 2]),
            Err(()),
            Err(()),
            Ok(vec![9]),
            Err(()),
            Ok(vec![6])
        ]
    );
}

/// The sender firmware's command line: its key and the node's, the app, records 1..=`records` of `size` bytes,
/// how long it stays awake listening once they are stored, and its own give-up time.
fn sender_args(key: &str, node_key: &str, records: u64, size: usize, stay_ms: u64) -> [String; 7] {
    [
        format!("key={key}"),
        format!("node={node_key}"),
        "app=main".to_string(),
        format!("records={records}"),
        format!("size={size}"),
        format!("stay={stay_ms}"),
        "timeout=60000".to_string(),
    ]
}

/// The record the sender firmware makes for `seq`: `rec-SEQ` padded with `.` to `size` bytes.
fn firmware_record(seq: u64, size: usize) -> String {
    let mut r = format!("rec-{seq}");
    while r.len() < size {
        r.push('.');
    }
    r.truncate(size);
    r
}

/// The `down SEQ PAYLOAD` lines of a run's console, in order (a line a power cut left without its end is not
/// taken: the record was not printed whole, and its heard sequence was not kept).
fn downs(console: &str) -> Vec<(u64, String)> {
    whole_lines(console)
        .filter_map(|l| {
            let rest = l.strip_prefix("down ")?;
            let (seq, payload) = rest.split_once(' ').unwrap_or((rest, ""));
            Some((seq.parse().ok()?, payload.to_string()))
        })
        .collect()
}

/// The `queued SEQ` lines' sequences, in order (a line the cut left without its end is not taken).
fn queued_lines(console: &str) -> Vec<u64> {
    whole_lines(console)
        .filter_map(|l| l.strip_prefix("queued ")?.parse().ok())
        .collect()
}

/// The console's lines that were printed to their end (a power cut may stop one midway).
fn whole_lines(console: &str) -> impl Iterator<Item = &str> {
    let end = console.rfind('\n').map_or(0, |i| i + 1);
    console[..end].lines()
}

/// The `stored APP THROUGH` lines' THROUGH values, in order.
fn stored_lines(console: &str) -> Vec<u64> {
    console
        .lines()
        .filter_map(|l| l.strip_prefix("stored main ")?.parse().ok())
        .collect()
}

fn push(state: &Path, record: &[u8]) {
    let (code, out) = ops_util::push(state, "main", "board-1", record);
    assert_eq!(code, 0, "push: {out}");
}

/// The node's records of the board, checked to be `1..=through`, each once, in order, each the firmware's.
fn assert_stored(state: &Path, through: u64, size: usize, context: &str) {
    ops_util::assert_stored_once_in_order(
        state,
        "board-1",
        through,
        |seq| firmware_record(seq, size),
        context,
    );
}

#[test]
fn sender_firmware_delivers_to_a_real_node_and_prints_its_downlink_once() {
    const TEST: &str = "sender_firmware_delivers_to_a_real_node_and_prints_its_downlink_once";
    if !firmware_util::available(TEST) {
        return;
    }
    let elf = firmware_util::build("sender");
    let ops_util::DeviceNode {
        dir,
        state,
        node,
        key_hex: key,
        node_hex: node_key,
    } = ops_util::DeviceNode::start("board-1");
    let flash = dir.path().join("board flash.bin");
    const SIZE: usize = 32;
    let run = |records: u64, stay_ms: u64, kill: Kill| {
        firmware_util::run(&RunConfig {
            elf: &elf,
            flash: &flash,
            to: node.link,
            kill,
            args: &sender_args(&key, &node_key, records, SIZE, stay_ms),
        })
    };
    let boot = |records: u64, stay_ms: u64| {
        let run = run(records, stay_ms, Kill::Never);
        let console = format!("{}{}", run.console, run.qemu_stderr);
        assert_eq!(
            run.code(),
            Some(0),
            "the sender firmware failed: {console}\nnode: {}",
            node.stderr_text()
        );
        assert_eq!(run.bad_frames, 0, "{console}");
        assert_eq!(run.field("uart dropped"), Some("0"), "{console}");
        let peak: usize = run
            .field("stack peak")
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| panic!("no stack peak printed: {console}"));
        assert!(peak > 0 && peak < 32 * 1024, "stack peak {peak}: {console}");
        run
    };

    // Downlink waiting before the board first wakes: a text, another, and one that is not printable.
    push(&state, b"rate=10\nreboot\ntab\there\n");

    // Boot 1: 300 records, and while it stays awake after they are stored, one more downlink record pushed to its
    // live session.
    let pusher = {
        let state = state.clone();
        std::thread::spawn(move || {
            let deadline = Instant::now() + ops_util::DEADLINE;
            while ops_util::records(&state).len() < 300 {
                assert!(Instant::now() < deadline, "300 records never stored");
                std::thread::sleep(Duration::from_millis(50));
            }
            push(&state, b"while awake\n");
        })
    };
    let first = boot(300, 5_000);
    pusher.join().unwrap();
    eprintln!("sender boot 1 took {:?}:\n{}", first.took, first.console);
    assert_eq!(first.field("boot"), Some("1"), "{}", first.console);
    assert_eq!(first.field("first seq"), Some("1"));
    assert_eq!(first.field("stored through"), Some("300"));
    assert_eq!(first.field("next seq"), Some("301"));
    assert_stored(&state, 300, SIZE, "the board");
    let stored = stored_lines(&first.console);
    assert!(
        stored.windows(2).all(|w| w[0] < w[1]) && stored.last() == Some(&300),
        "stored lines {stored:?}"
    );
    assert_eq!(
        downs(&first.console),
        [
            (1, "rate=10".to_string()),
            (2, "reboot".to_string()),
            (3, "hex:7461620968657265".to_string()),
            (4, "while awake".to_string()),
        ],
        "{}",
        first.console
    );
    assert_eq!(first.field("heard"), Some("0"), "printed at the start");
    assert!(first.console.contains("\nheard: 4\n"), "{}", first.console);

    // Boot 2 on the same flash: numbering goes on from 301, nothing printed again but what was pushed since.
    push(&state, b"after boot 1\n");
    let second = boot(350, 0);
    eprintln!("sender boot 2 took {:?}:\n{}", second.took, second.console);
    assert_eq!(second.field("boot"), Some("2"), "{}", second.console);
    assert_eq!(second.field("first seq"), Some("301"));
    assert_eq!(second.field("heard"), Some("4"));
    assert_eq!(second.field("stored through"), Some("350"));
    assert_ne!(first.field("run id"), second.field("run id"));
    assert_stored(&state, 350, SIZE, "the board");
    assert_eq!(
        downs(&second.console),
        [(5, "after boot 1".to_string())],
        "{}",
        second.console
    );
    // Every datagram of the board within the sender's size.
    for (_, d) in first.datagrams.iter().chain(&second.datagrams) {
        assert!(d.len() <= 1200, "a datagram of {} bytes", d.len());
    }

    // A power cut as the board's third datagram leaves it: the records it said were queued are in the outbox in
    // flash, so the next boot sends them again from the oldest the node may not have (the acknowledgements kept
    // in flash) and numbers on after the last record written: nothing lost, nothing stored twice, no gap, and no
    // renumbering (the node is never behind a numbering it was never given).
    let cut = run(550, 0, Kill::AtDatagram(3));
    assert!(cut.killed, "{}", cut.console);
    let cut_queued = queued_lines(&cut.console);
    assert!(
        cut_queued.first() == Some(&351) && cut_queued.windows(2).all(|w| w[1] == w[0] + 1),
        "{}",
        cut.console
    );
    let fourth = boot(570, 0);
    eprintln!("sender boot 4, after a cut:\n{}", fourth.console);
    assert_eq!(fourth.field("boot"), Some("4"), "{}", fourth.console);
    let started: u64 = fourth.field("first seq").unwrap().parse().unwrap();
    assert!(started > 350, "{}", fourth.console);
    assert_eq!(
        fourth.field("stored through"),
        Some("570"),
        "{}",
        fourth.console
    );
    assert!(
        !fourth.console.contains("node behind"),
        "{}",
        fourth.console
    );
    // What boot 4 queued starts right after the last record boot 3 wrote (its last printed, or one more).
    let fourth_queued = queued_lines(&fourth.console);
    let last_cut = *cut_queued.last().unwrap();
    assert!(
        fourth_queued
            .first()
            .map_or(last_cut >= 549, |&q| q == last_cut + 1 || q == last_cut + 2),
        "{}",
        fourth.console
    );
    assert_stored(&state, 570, SIZE, "the board");
    assert!(downs(&fourth.console).is_empty(), "{}", fourth.console);
}

/// Every record any boot said was queued is stored (`1..=records` is); none was said queued twice (a sequence
/// is never given twice); within a boot they go up by one; `records` is at most one past the largest said (a
/// record written as the power went may be there, unannounced: at most one per cut). Returns how many were
/// stored unannounced.
fn assert_queued_once(consoles: &[&str], records: u64, killed: usize, seed: u64) -> u64 {
    let mut said = std::collections::BTreeSet::new();
    for (i, console) in consoles.iter().enumerate() {
        let q = queued_lines(console);
        assert!(
            q.windows(2).all(|w| w[1] == w[0] + 1),
            "seed {seed}: boot {} queued {q:?}",
            i + 1
        );
        for s in q {
            assert!(said.insert(s), "seed {seed}: queued {s} said twice");
            assert!(s <= records, "seed {seed}: queued {s} is not stored");
        }
    }
    let largest = said.last().copied().unwrap_or(0);
    assert!(
        records <= largest + 1,
        "seed {seed}: {records} stored, {largest} the largest said queued"
    );
    let unannounced = records - said.len() as u64;
    assert!(
        unannounced <= killed as u64,
        "seed {seed}: {unannounced} records stored that no boot said queued, with {killed} cuts"
    );
    unannounced
}

/// Downlink across boots: every record `pushed` printed at least once, each sequence with one payload. A record
/// can be printed twice only across a cut: the firmware prints a record, then keeps its sequence as heard in
/// flash (docs/devices.md: do what the record asks, then `set_heard`); a cut between the two leaves the old heard
/// sequence in flash, so the next boot listens from it and the node hands the record over again (at least once).
/// Then no earlier boot can have printed `kept heard` for it.
fn assert_downlink_once_but_across_cuts(consoles: &[&str], pushed: &[String], seed: u64) {
    let mut payload_of: std::collections::BTreeMap<u64, String> = Default::default();
    for (i, console) in consoles.iter().enumerate() {
        let mut in_boot = std::collections::BTreeSet::new();
        for (seq, payload) in downs(console) {
            assert!(
                in_boot.insert(seq),
                "seed {seed}: boot {} printed downlink {seq} twice",
                i + 1
            );
            if let Some(before) = payload_of.insert(seq, payload.clone()) {
                assert_eq!(before, payload, "seed {seed}: downlink {seq}");
                let kept_before = consoles[..i].iter().any(|e| {
                    whole_lines(e).any(|l| {
                        l.strip_prefix("kept heard ")
                            .and_then(|h| h.parse::<u64>().ok())
                            .is_some_and(|h| h >= seq)
                    })
                });
                assert!(
                    !kept_before,
                    "seed {seed}: downlink {seq} printed again after its heard sequence was kept"
                );
            }
        }
    }
    let printed: std::collections::BTreeSet<&str> =
        payload_of.values().map(String::as_str).collect();
    for p in pushed {
        assert!(
            printed.contains(p.as_str()),
            "seed {seed}: pushed {p:?} never printed; printed {payload_of:?}"
        );
    }
    assert_eq!(
        payload_of.len(),
        pushed.len(),
        "seed {seed}: {payload_of:?}"
    );
}

/// The seed of a test's power cuts: `PURE_FIRMWARE_SEED`, else the clock's nanoseconds; printed, so that a run
/// can be replayed.
fn cut_seed(test: &str) -> u64 {
    let seed: u64 = std::env::var("PURE_FIRMWARE_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    eprintln!("{test}: seed {seed} (PURE_FIRMWARE_SEED={seed} replays these cuts)");
    seed
}

/// SIGKILLs the node and starts it again on the same state, senders file and port.
fn restart_node(
    mut old: ops_util::NodeProcess,
    state: &Path,
    senders: &Path,
) -> ops_util::NodeProcess {
    let link = old.link;
    old.signal(libc::SIGKILL);
    old.wait_exit();
    let child = ops_util::node_command_at(
        None,
        "127.0.0.1",
        link.port(),
        state,
        &["--senders", senders.to_str().unwrap()],
        None,
    )
    .spawn()
    .unwrap();
    let node = ops_util::NodeProcess::attach(child, state);
    assert_eq!(node.link, link, "the node is back on its port");
    node
}

/// A small deterministic generator (splitmix64) for the power cuts: a seed replays them.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// When to cut a boot: by its datagram count (within its first 8) or by time (10–150 ms), one or the other at
    /// random. A boot starts its link in some 40 ms and then stores about a record a millisecond, so both fall
    /// mostly while records are being written, sent and acknowledged.
    fn cut(&mut self) -> Kill {
        if self.next().is_multiple_of(2) {
            Kill::AtDatagram(self.between(1, 8) as usize)
        } else {
            Kill::After(Duration::from_millis(self.between(10, 150)))
        }
    }

    /// In `lo..=hi`.
    fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

/// One boot of the power-cut test: how it was cut, and what it printed.
struct CutBoot {
    kill: Kill,
    killed: bool,
    /// Datagrams it sent (the one a cut by datagram count stopped included).
    datagrams: usize,
    console: String,
    took: Duration,
}

/// Issue 35, item 2: thousands of records delivered by the sender firmware, its records in the outbox in flash,
/// while the board's power is cut (QEMU SIGKILLed) at random moments — by its datagram count and by time, seeded
/// (`PURE_FIRMWARE_SEED=N` replays a run; the seed is printed) — and the board started again on its flash file
/// each time, until a boot that is not cut finishes with everything acknowledged. From the node: records 1..=N
/// once each, in order, each naming its sequence; every `queued SEQ` any boot printed is stored, and N is at most
/// one past the largest printed. Downlink pushed before and during the run is printed, each at least once.
#[test]
fn sender_firmware_outbox_survives_power_cuts_at_random_moments() {
    const TEST: &str = "sender_firmware_outbox_survives_power_cuts_at_random_moments";
    if !firmware_util::available(TEST) {
        return;
    }
    const RECORDS: u64 = 5_000;
    const SIZE: usize = 32;
    const MAX_CUT_BOOTS: usize = 400;
    let seed = cut_seed(TEST);
    let mut rng = Rng(seed);

    let elf = firmware_util::build("sender");
    let ops_util::DeviceNode {
        dir,
        state,
        node,
        key_hex: key,
        node_hex: node_key,
    } = ops_util::DeviceNode::start("board-1");
    let flash = dir.path().join("flash.bin");
    let run = |stay_ms: u64, kill: Kill| {
        firmware_util::run(&RunConfig {
            elf: &elf,
            flash: &flash,
            to: node.link,
            kill,
            args: &sender_args(&key, &node_key, RECORDS, SIZE, stay_ms),
        })
    };

    // Downlink waiting before the first boot, and more pushed while the board is cut and started again.
    let mut pushed: Vec<String> = vec!["before-1".into(), "before-2".into(), "before-3".into()];
    push(&state, b"before-1\nbefore-2\nbefore-3\n");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let pusher = {
        let (state, stop) = (state.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut during = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(700));
                let payload = format!("during-{}", during.len() + 1);
                push(&state, format!("{payload}\n").as_bytes());
                during.push(payload);
            }
            during
        })
    };

    // Cut boots until one has every record stored (it prints `delivered:`) or exits by itself. A boot starts its
    // link in some 40 ms and then stores about a record a millisecond, in datagrams of up to 64 records: cuts
    // within its first 8 datagrams or 150 ms fall mostly while records are being written, sent and acknowledged.
    let started = Instant::now();
    let mut boots: Vec<CutBoot> = Vec::new();
    loop {
        assert!(
            boots.len() < MAX_CUT_BOOTS,
            "seed {seed}: {MAX_CUT_BOOTS} boots cut and the records are not all stored"
        );
        let kill = rng.cut();
        let run = run(0, kill);
        let console = format!("{}{}", run.console, run.qemu_stderr);
        // Not cut: it finished by itself (everything was stored before the moment came), or it failed.
        assert!(
            run.killed || run.code() == Some(0),
            "seed {seed}: boot {} ({kill:?}) failed: {console}\nnode: {}",
            boots.len() + 1,
            node.stderr_text()
        );
        let done = !run.killed || console.contains("\ndelivered:");
        boots.push(CutBoot {
            kill,
            killed: run.killed,
            datagrams: run.datagrams.len(),
            // The firmware's lines only: QEMU's own messages would run into a line the cut left unfinished.
            console: run.console.clone(),
            took: run.took,
        });
        if done {
            break;
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    pushed.extend(pusher.join().unwrap());
    // The final boot: not cut, it delivers what is left and takes every downlink record pushed.
    let last = run(1_000, Kill::Never);
    let last_console = format!("{}{}", last.console, last.qemu_stderr);
    assert_eq!(
        last.code(),
        Some(0),
        "seed {seed}: the final boot failed: {last_console}\nnode: {}",
        node.stderr_text()
    );
    assert_eq!(last.bad_frames, 0, "{last_console}");
    boots.push(CutBoot {
        kill: Kill::Never,
        killed: false,
        datagrams: last.datagrams.len(),
        console: last.console.clone(),
        took: last.took,
    });
    let took = started.elapsed();

    let killed = boots.iter().filter(|b| b.killed).count();
    let killed_delivering = boots
        .iter()
        .filter(|b| b.killed && !b.console.contains("delivered:"))
        .count();
    for (i, b) in boots.iter().enumerate() {
        let q = queued_lines(&b.console);
        eprintln!(
            "boot {:2}: {:?}, killed {}, took {:?}, {} datagrams, queued {} ({:?}..={:?}), {} downlink printed",
            i + 1,
            b.kill,
            b.killed,
            b.took,
            b.datagrams,
            q.len(),
            q.first(),
            q.last(),
            downs(&b.console).len()
        );
    }
    eprintln!("final boot:\n{last_console}");

    // The node: 1..=N once each, in order, each record naming its own sequence.
    assert_stored(&state, RECORDS, SIZE, &format!("seed {seed}"));
    let consoles: Vec<&str> = boots.iter().map(|b| b.console.as_str()).collect();
    let unannounced = assert_queued_once(&consoles, RECORDS, killed, seed);

    assert_downlink_once_but_across_cuts(&consoles, &pushed, seed);
    assert_eq!(
        last.field("stored through"),
        Some(RECORDS.to_string().as_str())
    );
    // The final boot took every downlink record there was: its heard sequence in flash is the last pushed.
    assert!(
        last.console
            .contains(&format!("\nheard: {}\n", pushed.len())),
        "seed {seed}: {last_console}"
    );
    let reprinted: usize =
        boots.iter().map(|b| downs(&b.console).len()).sum::<usize>() - pushed.len();

    // The flash's wear over the whole test, from the board's per-page counts (the outbox's 10 pages).
    let counts = firmware_util::flash_counts(&flash);
    let erases: Vec<u32> = counts[..10].iter().map(|c| c.0).collect();
    let units: u64 = counts[..10].iter().map(|c| u64::from(c.1)).sum();
    assert!(
        counts[10..].iter().all(|&c| c == (0, 0)),
        "pages past the outbox untouched: {counts:?}"
    );
    eprintln!(
        "{TEST}: seed {seed}: {RECORDS} records of {SIZE} bytes, {} boots, {killed} cut ({killed_delivering} \
         before their records were all stored), {} downlink records ({reprinted} printed again after a cut), \
         {unannounced} records stored unannounced, {took:?}; flash: erases per page {erases:?}, {units} units \
         programmed ({:.2} per record)",
        boots.len(),
        pushed.len(),
        units as f64 / RECORDS as f64
    );
}

/// The node SIGKILLed and started again (same state, same port) while the board delivers and listens: every record
/// is stored once and in order, and every downlink record pushed, before the cuts and between them, is printed by
/// the board once (the board is not cut here, so nothing is printed twice).
#[test]
fn sender_firmware_delivers_through_node_restarts() {
    const TEST: &str = "sender_firmware_delivers_through_node_restarts";
    if !firmware_util::available(TEST) {
        return;
    }
    const RECORDS: u64 = 1_500;
    const SIZE: usize = 32;
    const KILLS: usize = 3;
    let elf = firmware_util::build("sender");
    let ops_util::DeviceNode {
        dir,
        state,
        node,
        key_hex: key,
        node_hex: node_key,
    } = ops_util::DeviceNode::start("board-1");
    let link = node.link;
    let senders = dir.path().join("senders");
    let restart = |old| restart_node(old, &state, &senders);
    let flash = dir.path().join("flash.bin");
    push(&state, b"before-1\nbefore-2\n");

    let outcome = std::thread::scope(|s| {
        let board = s.spawn(|| {
            firmware_util::run(&RunConfig {
                elf: &elf,
                flash: &flash,
                to: link,
                kill: Kill::Never,
                args: &sender_args(&key, &node_key, RECORDS, SIZE, 3_000),
            })
        });
        // Kill the node each time another few hundred records are stored, and push one downlink record after each
        // restart.
        let mut node = node;
        for k in 1..=KILLS {
            let deadline = Instant::now() + ops_util::DEADLINE;
            while (ops_util::records(&state).len() as u64) < RECORDS * k as u64 / (KILLS as u64 + 1)
            {
                assert!(
                    Instant::now() < deadline,
                    "the board stopped delivering before kill {k}"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            node = restart(node);
            push(&state, format!("after-kill-{k}\n").as_bytes());
        }
        let outcome = board.join().unwrap();
        (outcome, node)
    });
    let (run, node) = outcome;
    let console = format!("{}{}", run.console, run.qemu_stderr);
    assert_eq!(
        run.code(),
        Some(0),
        "the board: {console}\nnode: {}",
        node.stderr_text()
    );
    assert_stored(&state, RECORDS, SIZE, "through node restarts");
    assert_eq!(
        queued_lines(&run.console),
        (1..=RECORDS).collect::<Vec<_>>()
    );
    let mut expected = vec!["before-1".to_string(), "before-2".to_string()];
    expected.extend((1..=KILLS).map(|k| format!("after-kill-{k}")));
    let printed: Vec<String> = downs(&run.console).into_iter().map(|(_, p)| p).collect();
    assert_eq!(printed, expected, "{console}");
}

/// Issue 35, items 3 and 5: the C firmware (`link-c/examples/mps2-an386/sender.c`, through `pure_link.h` and the
/// library built for thumbv7em-none-eabihf, compiled and linked by the distribution's `arm-none-eabi-gcc` with
/// newlib) on the emulated board, against a real node: its power cut (QEMU SIGKILLed) at random moments, seeded as
/// in the Rust firmware's test, and in every third boot the node SIGKILLed and started again while the board runs,
/// in the same run. The node stores records 1..=N once each, in order; every `queued SEQ` printed is among them;
/// downlink pushed before and between the boots is printed at least once, again only across a cut before its
/// heard sequence was kept, and applied to the program's state kept with the heard sequence exactly once.
#[test]
fn c_firmware_delivers_through_power_cuts_and_node_kills() {
    const TEST: &str = "c_firmware_delivers_through_power_cuts_and_node_kills";
    if !firmware_util::available_c(TEST) {
        return;
    }
    const RECORDS: u64 = 1_000;
    const SIZE: usize = 32;
    const MAX_CUT_BOOTS: usize = 200;
    let seed = cut_seed(TEST);
    let mut rng = Rng(seed);
    let elf = firmware_util::build_c();
    let ops_util::DeviceNode {
        dir,
        state,
        node,
        key_hex: key,
        node_hex: node_key,
    } = ops_util::DeviceNode::start("board-1");
    let link = node.link;
    let senders = dir.path().join("senders");
    let flash = dir.path().join("flash.bin");
    let run = |stay_ms: u64, kill: Kill| {
        firmware_util::run(&RunConfig {
            elf: &elf,
            flash: &flash,
            to: link,
            kill,
            args: &sender_args(&key, &node_key, RECORDS, SIZE, stay_ms),
        })
    };
    let mut pushed: Vec<String> = vec!["before-1".into(), "before-2".into()];
    push(&state, b"before-1\nbefore-2\n");

    let started = Instant::now();
    let mut node = Some(node);
    let mut consoles: Vec<String> = Vec::new();
    let (mut killed, mut node_kills) = (0, 0);
    loop {
        assert!(
            consoles.len() < MAX_CUT_BOOTS,
            "seed {seed}: {MAX_CUT_BOOTS} boots cut and the records are not all stored"
        );
        let kill = rng.cut();
        let node_kill = (consoles.len() % 3 == 2).then(|| rng.between(5, 120));
        let outcome = std::thread::scope(|s| {
            let board = s.spawn(|| run(0, kill));
            if let Some(ms) = node_kill {
                std::thread::sleep(Duration::from_millis(ms));
                node = Some(restart_node(node.take().unwrap(), &state, &senders));
                node_kills += 1;
            }
            board.join().unwrap()
        });
        let console = format!("{}{}", outcome.console, outcome.qemu_stderr);
        assert!(
            outcome.killed || outcome.code() == Some(0),
            "seed {seed}: boot {} ({kill:?}) failed: {console}\nnode: {}",
            consoles.len() + 1,
            node.as_ref().unwrap().stderr_text()
        );
        killed += usize::from(outcome.killed);
        let done = !outcome.killed || console.contains("\ndelivered:");
        // The firmware's lines only: QEMU's own messages would run into a line the cut left unfinished.
        consoles.push(outcome.console.clone());
        if done {
            break;
        }
        if consoles.len().is_multiple_of(5) {
            let payload = format!("during-{}", consoles.len() / 5);
            push(&state, format!("{payload}\n").as_bytes());
            pushed.push(payload);
        }
    }
    let last = run(1_000, Kill::Never);
    let last_console = format!("{}{}", last.console, last.qemu_stderr);
    assert_eq!(
        last.code(),
        Some(0),
        "seed {seed}: the final boot failed: {last_console}\nnode: {}",
        node.as_ref().unwrap().stderr_text()
    );
    assert_eq!(last.bad_frames, 0, "{last_console}");
    consoles.push(last.console.clone());

    assert_stored(&state, RECORDS, SIZE, &format!("seed {seed}"));
    let all: Vec<&str> = consoles.iter().map(String::as_str).collect();
    let unannounced = assert_queued_once(&all, RECORDS, killed, seed);
    assert_downlink_once_but_across_cuts(&all, &pushed, seed);
    assert!(
        last.console
            .contains(&format!("\nheard: {}\n", pushed.len())),
        "seed {seed}: the final boot keeps the last downlink record's sequence: {last_console}"
    );
    // Printed at least once, applied exactly once: the state kept with the heard sequence (sender.c's module
    // comment) is every record pushed, once each, in order.
    let applied = whole_lines(&last.console)
        .filter_map(|l| l.strip_prefix("applied: "))
        .last()
        .unwrap_or_else(|| panic!("seed {seed}: no applied: line: {last_console}"));
    let mut hash = 0u64;
    for p in &pushed {
        for b in p.bytes().chain([b'\n']) {
            hash = (hash ^ u64::from(b)).wrapping_mul(0x100000001b3);
        }
    }
    assert_eq!(
        applied,
        format!("{} {hash:016x}", pushed.len()),
        "seed {seed}: the downlink records applied: {last_console}"
    );
    eprintln!(
        "{TEST}: seed {seed}: {RECORDS} records of {SIZE} bytes, {} boots, {killed} cut, the node killed {node_kills} \
         times, {} downlink records, {unannounced} records stored unannounced, {:?}",
        consoles.len(),
        pushed.len(),
        started.elapsed()
    );
}

/// Issue 39, item 4: a firmware image through wide downlink (docs/protocol.md 13) to the C firmware, which offers
/// version 1.2 with the window its RAM holds (`sender.c`, `DOWN_WINDOW`). A file of 48 KiB pushed with `push
/// --file` as 48 pieces; the board's power is cut in the middle of it (at a seeded datagram of the board's), and the
/// next boot goes on from the heard sequence its flash outbox keeps: every piece printed, again only across the
/// cut, and applied to the program's state exactly once, in order (the state's count and hash are the whole file's);
/// the node validated the board's address and the board sent a small part of what it was sent.
#[test]
fn c_firmware_takes_an_image_through_wide_downlink_across_a_power_cut() {
    const TEST: &str = "c_firmware_takes_an_image_through_wide_downlink_across_a_power_cut";
    if !firmware_util::available_c(TEST) {
        return;
    }
    const PIECES: usize = 48;
    let seed = cut_seed(TEST);
    let mut rng = Rng(seed);
    let elf = firmware_util::build_c();
    let ops_util::DeviceNode {
        dir,
        state,
        node,
        key_hex: key,
        node_hex: node_key,
    } = ops_util::DeviceNode::start("board-1");
    // Printable bytes, so the console prints each piece as it is; different from piece to piece.
    let image: Vec<u8> = (0..PIECES * 1024)
        .map(|i| b'!' + ((i * 31 + i / 1024) % 94) as u8)
        .collect();
    let pieces: Vec<String> = image
        .chunks(1024)
        .map(|c| String::from_utf8(c.to_vec()).unwrap())
        .collect();
    let file = dir.path().join("image.bin");
    std::fs::write(&file, &image).unwrap();
    let out = ops_util::push_command(
        &state,
        &[
            "--app",
            "main",
            "--to",
            "board-1",
            "--file",
            file.to_str().unwrap(),
        ],
        b"",
    );
    assert!(out.status.success(), "push --file: {out:?}");
    let flash = dir.path().join("flash.bin");
    let run = |kill: Kill| {
        firmware_util::run(&RunConfig {
            elf: &elf,
            flash: &flash,
            to: node.link,
            kill,
            args: &sender_args(&key, &node_key, 0, 32, 0),
        })
    };

    // The cut: each DOWN datagram (one piece) is acknowledged by one of the board's, so a cut at its datagram
    // 6–30 lands inside the 48 pieces.
    let at = rng.between(6, 30) as usize;
    let first = run(Kill::AtDatagram(at));
    assert!(
        first.killed,
        "seed {seed}: not cut at datagram {at}: {}",
        first.console
    );
    let first_downs = downs(&first.console);
    assert!(
        first_downs.len() < PIECES,
        "seed {seed}: the cut at datagram {at} came after the image: {}",
        first.console
    );
    let second = run(Kill::Never);
    let console = format!("{}{}", second.console, second.qemu_stderr);
    assert_eq!(
        second.code(),
        Some(0),
        "seed {seed}: {console}\nnode: {}",
        node.stderr_text()
    );
    assert_eq!(second.field("wide"), Some("1"), "{console}");
    // The second boot goes on from the heard sequence its flash kept: no piece past it was skipped.
    let kept: u64 = second.field("heard").unwrap().parse().unwrap();
    let second_downs = downs(&second.console);
    assert_eq!(
        second_downs.iter().map(|d| d.0).collect::<Vec<_>>(),
        (kept + 1..=PIECES as u64).collect::<Vec<_>>(),
        "seed {seed}: {console}"
    );
    assert!(
        kept as usize <= first_downs.len(),
        "seed {seed}: kept {kept}, printed {}",
        first_downs.len()
    );
    let consoles = [first.console.as_str(), second.console.as_str()];
    assert_downlink_once_but_across_cuts(&consoles, &pieces, seed);
    assert!(
        second_downs
            .iter()
            .all(|(seq, p)| *p == pieces[*seq as usize - 1]),
        "seed {seed}: a piece out of place"
    );
    // Applied exactly once, in order: the state kept with the heard sequence is the whole image's.
    let mut hash = 0u64;
    for p in &pieces {
        for b in p.bytes().chain([b'\n']) {
            hash = (hash ^ u64::from(b)).wrapping_mul(0x100000001b3);
        }
    }
    let applied = whole_lines(&second.console)
        .filter_map(|l| l.strip_prefix("applied: "))
        .last();
    assert_eq!(
        applied,
        Some(format!("{PIECES} {hash:016x}").as_str()),
        "seed {seed}: {console}"
    );
    // What the board sent in its second boot, counted by the harness off its UART, against what it was sent.
    let sent: usize = second.datagrams.iter().map(|d| d.1.len()).sum();
    let taken = (PIECES - kept as usize) * 1024;
    assert!(
        sent * 2 < taken,
        "seed {seed}: the board sent {sent} bytes in {} datagrams for {taken} bytes of pieces",
        second.datagrams.len()
    );
    eprintln!(
        "{TEST}: seed {seed}: cut at datagram {at} after {} pieces printed, {kept} kept; the next boot took {} \
         pieces ({taken} bytes) and sent {sent} bytes in {} datagrams, in {:?}",
        first_downs.len(),
        second_downs.len(),
        second.datagrams.len(),
        second.took
    );
}
