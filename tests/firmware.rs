//! The board the link's sender firmware runs on (`firmware/qemu-m4`), proven with its probe under
//! `qemu-system-arm -M mps2-an386`: datagrams over the UART to a UDP echo server of the test's own and back, the
//! millisecond clock against the host's, a counter in flash across runs and across a power cut (QEMU SIGKILLed),
//! and the flash file's counts of erases and programs.
//!
//! Skipped (with the reason printed) without `qemu-system-arm` or the `thumbv7em-none-eabihf` target, unless
//! `PURE_REQUIRE_FIRMWARE=1` (`.ci/run`), where it fails.

#[path = "firmware_util/mod.rs"]
mod firmware_util;

use std::time::Duration;

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
    // The board's clock against the host's: datagram 2 leaves 500 ms after datagram 1 by the board's clock.
    let board_gap: u64 = run
        .field("clock gap")
        .and_then(|v| v.strip_suffix(" ms")?.parse().ok())
        .unwrap_or_else(|| panic!("no clock gap printed: {console}"));
    assert!((500..600).contains(&board_gap), "{console}");
    let gap = run.datagrams[1].0 - run.datagrams[0].0;
    assert!(
        gap >= Duration::from_millis(450) && gap <= Duration::from_millis(2_000),
        "500 ms of the board's clock took {gap:?} of the host's: {console}"
    );
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
