//! The crash loop (issue 8, "make the proof stay"): four senders deliver records whose payloads encode the sender,
//! the index and a checksum, while the node is SIGKILLed again and again mid-delivery and restarted on the same
//! state and port. At the end every record each sender saw acknowledged is in the store exactly once, with no
//! gaps and its own payload, and the store passes `PRAGMA integrity_check`.
//!
//! CI runs a few kills (bounded). `CRASH_LOOP_CYCLES=50 CRASH_LOOP_RECORDS=25000 cargo test --release --test
//! crash_loop -- --nocapture` is the long run of research/009-crash-loop.md; it prints one JSON line per cycle.

mod ops_util;

use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ops_util::{DEADLINE, NodeProcess, bin, keygen};

const SENDERS: usize = 4;

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// FNV-1a of the sender and index: a record that comes back with another payload is caught.
fn checksum(sender: usize, index: usize) -> u64 {
    format!("{sender}/{index}")
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        })
}

fn payload(sender: usize, index: usize) -> String {
    format!("s{sender} i{index} c{:016x}", checksum(sender, index))
}

fn node_on(state: &Path, senders: &Path, port: u16) -> NodeProcess {
    let child = Command::new(bin())
        .arg("--state")
        .arg(state)
        .arg("--senders")
        .arg(senders)
        .args(["--bind", "127.0.0.1", "--http-port", "0"])
        .args(["--link-port", &port.to_string()])
        .env("RUST_LOG", "warn")
        .env_remove("NOTIFY_SOCKET")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    NodeProcess::attach(child, state)
}

fn stored(state: &Path) -> usize {
    let Ok(store) = pure_serve::store::open_app_for_reading(state, "main") else {
        return 0;
    };
    store.read_head().map_or(0, |h| h as usize - 1)
}

#[test]
fn every_acked_record_survives_repeated_kills_exactly_once() {
    let cycles = env_or("CRASH_LOOP_CYCLES", 3);
    let per_sender = env_or("CRASH_LOOP_RECORDS", 4000);
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let senders = dir.path().join("senders");
    let keys: Vec<_> = (0..SENDERS)
        .map(|i| keygen(dir.path(), &format!("s{i}")))
        .collect();
    let list: String = keys
        .iter()
        .enumerate()
        .map(|(i, (_, public))| format!("s{i} {public}\n"))
        .collect();
    std::fs::write(&senders, list).unwrap();
    let mut node = node_on(&state, &senders, 0);
    let port = node.link.port();
    let total = SENDERS * per_sender;
    let mut sends: Vec<Child> = keys
        .iter()
        .map(|(key, _)| {
            Command::new(bin())
                .arg("send")
                .arg("--key")
                .arg(key)
                .args(["--node", &node.public_key, "--to", &node.link.to_string()])
                .args(["--timeout", "120"])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    // Each sender's lines come in steadily, so the kills land while all four are delivering.
    let pace = Duration::from_micros(env_or("CRASH_LOOP_PACE_US", 25_000) as u64);
    // The last part of each sender's records is held back until the last kill, so that every kill lands in the
    // middle of the delivery however slow the machine is.
    let gate = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(
        per_sender - per_sender / (2 * (cycles + 1)),
    ));
    let writers: Vec<_> = sends
        .iter_mut()
        .enumerate()
        .map(|(s, child)| {
            let mut stdin = child.stdin.take().unwrap();
            let gate = gate.clone();
            std::thread::spawn(move || {
                for chunk in (1..=per_sender).collect::<Vec<_>>().chunks(50) {
                    while chunk[chunk.len() - 1] > gate.load(std::sync::atomic::Ordering::Relaxed) {
                        std::thread::sleep(pace);
                    }
                    let text: String = chunk.iter().map(|&i| payload(s, i) + "\n").collect();
                    stdin.write_all(text.as_bytes()).unwrap();
                    std::thread::sleep(pace);
                }
            })
        })
        .collect();
    let started = Instant::now();
    for cycle in 1..=cycles {
        // Kill points spread over the delivery: after cycle/(cycles+1) of all records are stored.
        let target = total * cycle / (cycles + 1);
        let deadline = Instant::now() + DEADLINE;
        while stored(&state) < target {
            assert!(
                Instant::now() < deadline,
                "cycle {cycle}: the store never reached {target} records: {}",
                node.stderr_text()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        node.child.kill().unwrap(); // SIGKILL: no clean stop, no last commit.
        node.child.wait().unwrap();
        let at_kill = stored(&state);
        assert!(
            at_kill < total,
            "cycle {cycle}: the kill landed after delivery ended ({at_kill} of {total} stored)"
        );
        node = node_on(&state, &senders, port);
        println!(
            "{{\"bench\":\"crash_loop\",\"cycle\":{cycle},\"stored_at_kill\":{at_kill},\"target\":{target},\
             \"elapsed_s\":{:.2}}}",
            started.elapsed().as_secs_f64()
        );
    }
    gate.store(per_sender, std::sync::atomic::Ordering::Relaxed);
    for w in writers {
        w.join().unwrap();
    }
    for (s, child) in sends.into_iter().enumerate() {
        let out = child.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "sender s{s}: {text}");
        assert!(
            text.contains(&format!("stored {per_sender} records")),
            "s{s}: every record acknowledged: {text}"
        );
    }
    drop(node);
    // Every acknowledged record exactly once, in order, with its own payload.
    let store = pure_serve::store::open_app_for_reading(&state, "main").unwrap();
    let mut next = [1usize; SENDERS];
    store
        .for_each_record(None, |source, seq, p| {
            let s: usize = source.trim_start_matches('s').parse().unwrap();
            assert_eq!(
                seq as usize, next[s],
                "{source}: a gap or a duplicate at {seq}"
            );
            assert_eq!(p, payload(s, next[s]).as_bytes(), "{source} {seq}: payload");
            next[s] += 1;
            true
        })
        .unwrap();
    assert_eq!(next, [per_sender + 1; SENDERS], "every record is there");
    drop(store);
    let conn = rusqlite::Connection::open(state.join("apps/main.sqlite")).unwrap();
    let check: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(check, "ok");
    println!(
        "{{\"bench\":\"crash_loop\",\"cycles\":{cycles},\"senders\":{SENDERS},\"records\":{total},\
         \"exactly_once\":true,\"integrity_check\":\"{check}\",\"elapsed_s\":{:.2}}}",
        started.elapsed().as_secs_f64()
    );
}
