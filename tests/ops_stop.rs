//! Clean stop, end to end (issue 3): SIGTERM during load stores and acknowledges the turn in hand and exits 0, and
//! every record the sender saw acknowledged is in the store; a second signal exits at once.

mod ops_util;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ops_util::*;
use pure_serve::sender::{SenderEvent, UdpLink};

#[test]
fn sigterm_during_load_exits_0_and_keeps_every_acked_record() {
    let dir = tempfile::tempdir().unwrap();
    let (key, public) = keygen(dir.path(), "dev");
    let senders = dir.path().join("senders");
    write_atomic(&senders, &format!("dev {public}\n"));
    let state = dir.path().join("state");
    let notify = NotifySocket::path();
    let mut node = NodeProcess::start(
        &state,
        &["--senders", senders.to_str().unwrap()],
        Some(&notify),
    );
    notify.until("READY=1");

    let node_key = pure_serve::keys::parse_public_key(&node.public_key).unwrap();
    let mut link = UdpLink::connect(
        pure_serve::keys::read_identity(&key).unwrap(),
        node_key,
        node.link,
    )
    .unwrap();
    const TOTAL: u64 = 200_000;
    for i in 1..=TOTAL {
        link.sender()
            .queue("main", format!("r{i}").into_bytes())
            .unwrap();
    }
    let acked = Arc::new(AtomicU64::new(0));
    let node_gone = Arc::new(AtomicBool::new(false));
    let sender = {
        let (acked, node_gone) = (acked.clone(), node_gone.clone());
        std::thread::spawn(move || {
            // Drive until everything is acked or the node is gone (then what was acked is final).
            while !link.sender().is_idle() && !node_gone.load(Ordering::SeqCst) {
                link.drive(Instant::now() + Duration::from_millis(50))
                    .unwrap();
                for e in link.take_events() {
                    if let SenderEvent::Stored { through, .. } = e {
                        acked.fetch_max(through, Ordering::SeqCst);
                    }
                }
            }
            // Acks already in this socket's buffer count too.
            link.drive(Instant::now() + Duration::from_millis(200))
                .unwrap();
            for e in link.take_events() {
                if let SenderEvent::Stored { through, .. } = e {
                    acked.fetch_max(through, Ordering::SeqCst);
                }
            }
        })
    };
    // Stop in the middle of the load: after some records were acked, long before all.
    let deadline = Instant::now() + DEADLINE;
    while acked.load(Ordering::SeqCst) < 1_000 {
        assert!(Instant::now() < deadline, "no progress");
        std::thread::sleep(Duration::from_millis(1));
    }
    node.signal(libc::SIGTERM);
    notify.until("STOPPING=1");
    let code = node.wait_exit();
    node_gone.store(true, Ordering::SeqCst);
    sender.join().unwrap();
    assert_eq!(code, Some(0), "{}", node.stderr_text());
    let acked = acked.load(Ordering::SeqCst);
    assert!(acked >= 1_000);

    let got = records(&state);
    let mut seqs: Vec<u64> = got.iter().map(|r| r.1).collect();
    seqs.sort_unstable();
    let n = seqs.len();
    seqs.dedup();
    assert_eq!(seqs.len(), n, "a record stored twice");
    // Stored records are exactly 1..=k for some k ≥ every acked sequence, each with its payload.
    assert!(n as u64 >= acked, "acked {acked}, stored {n}");
    assert_eq!(seqs.last().copied(), Some(n as u64));
    for (source, seq, payload) in &got {
        assert_eq!(source, "dev");
        assert_eq!(payload, &format!("r{seq}"));
    }
    eprintln!("acked {acked} of {TOTAL}, stored {n} before the stop");
}

#[test]
fn a_second_signal_exits_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut node = NodeProcess::start(&state, &[], None);
    // Both signals are pending when the process continues, so the second arrives while the first is honoured.
    node.signal(libc::SIGSTOP);
    node.signal(libc::SIGINT);
    node.signal(libc::SIGTERM);
    node.signal(libc::SIGCONT);
    let code = node.wait_exit();
    assert!(
        code == Some(128 + libc::SIGINT) || code == Some(128 + libc::SIGTERM),
        "{code:?}"
    );
}
