//! Apps and outlets end to end with real processes on loopback: node A hosts app `main` (devices send to it with
//! `pure-serve send`) with a link outlet to app `ingest` of node B and an inner outlet to its own app `copy`. Both
//! nodes are killed with SIGKILL several times in the middle; in the end every record is on B and in `copy`
//! exactly once, in order, with its origin, as `pure-serve records --json` shows them. And a device listed on
//! both nodes cannot forge where records came from: only an app's `forwarders` may send it forwarded records.

mod ops_util;
mod outlet_util;

use std::process::Child;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ops_util::{NodeProcess, keygen};
use outlet_util::{
    args, assert_each_once_forwarded, assert_sent, errors, feed_lines, feed_lines_gated,
    kill_and_restart, lag, metric, node_files, records, spawn_send, start, wait_until,
};
use pure_serve::proto::wire::{REFUSE_NOT_FORWARDER, RecordFormat};
use pure_serve::sender::{FlowStart, UdpLink};

#[test]
fn every_record_reaches_the_far_node_and_the_inner_app_once_through_kills_of_both() {
    const DEVICES: usize = 2;
    const PER_DEVICE: u64 = 10_000;
    let dir = tempfile::tempdir().unwrap();
    let (state_a, state_b) = (dir.path().join("a"), dir.path().join("b"));
    let (key_a, pub_a) = keygen(dir.path(), "node-a");
    let devices: Vec<_> = (0..DEVICES)
        .map(|i| keygen(dir.path(), &format!("dev{i}")))
        .collect();

    // Node B: app ingest takes node-a only.
    let (senders_b, apps_b) = node_files(
        dir.path(),
        "b",
        &format!("node-a {pub_a}\n"),
        "[apps.ingest]\naccept = [\"node-a\"]\nforwarders = [\"node-a\"]\n",
    );
    let args_b = args(&[
        "--senders",
        senders_b.to_str().unwrap(),
        "--apps",
        apps_b.to_str().unwrap(),
    ]);
    let mut b = start(&state_b, &args_b, 0, 0);
    let port_b = b.link.port();

    // Node A: main → B's ingest (link) and → copy (inner).
    let senders_a = dir.path().join("senders-a");
    let list: String = devices
        .iter()
        .enumerate()
        .map(|(i, (_, p))| format!("dev{i} {p}\n"))
        .collect();
    std::fs::write(&senders_a, list).unwrap();
    let apps_a = dir.path().join("a.toml");
    std::fs::write(
        &apps_a,
        format!(
            "[apps.main]\n\
             [apps.main.outlets.to-b]\nkind = \"link\"\nto = \"127.0.0.1:{port_b}\"\nnode_key = \"{}\"\napp = \"ingest\"\n\
             [apps.main.outlets.copy]\nkind = \"app\"\napp = \"copy\"\n\
             [apps.copy]\naccept = []\n",
            b.public_key
        ),
    )
    .unwrap();
    let args_a = args(&[
        "--key",
        key_a.to_str().unwrap(),
        "--senders",
        senders_a.to_str().unwrap(),
        "--apps",
        apps_a.to_str().unwrap(),
    ]);
    let mut a = start(&state_a, &args_a, 0, 0);

    let mut sends: Vec<Child> = devices
        .iter()
        .map(|(k, _)| spawn_send(k, &a, "main", 120))
        .collect();
    // Paced over about four seconds, and the last fifth held back until the last kill, so the kills land in the
    // middle of delivery however slow the machine is.
    let gate = Arc::new(AtomicU64::new(PER_DEVICE * 4 / 5));
    let writers: Vec<_> = sends
        .iter_mut()
        .enumerate()
        .map(|(i, child)| {
            feed_lines_gated(
                child,
                &format!("dev{i}"),
                PER_DEVICE,
                100,
                Duration::from_millis(40),
                gate.clone(),
            )
        })
        .collect();

    // Kills in the middle: A, then B, then A, then B, each at a later point of the delivery to B.
    let total = DEVICES as u64 * PER_DEVICE;
    for (k, target) in [2_000u64, 6_000, 10_000, 14_000].into_iter().enumerate() {
        wait_until(&format!("{target} records on B"), || {
            records(&state_b, "ingest").len() as u64 >= target
        });
        assert!(
            (records(&state_b, "ingest").len() as u64) < total,
            "kill {k} landed after delivery ended"
        );
        if k % 2 == 0 {
            kill_and_restart(&mut a, &args_a);
        } else {
            kill_and_restart(&mut b, &args_b);
        }
    }
    gate.store(PER_DEVICE, Ordering::Relaxed);
    for w in writers {
        w.join().unwrap();
    }
    for (i, child) in sends.into_iter().enumerate() {
        assert_sent(child, &format!("dev{i}"));
    }
    wait_until("every record on B", || {
        records(&state_b, "ingest").len() as u64 >= total
    });
    wait_until("every record in copy", || {
        records(&state_a, "copy").len() as u64 >= total
    });
    // Anything that would be a duplicate has had its chance to arrive: a while, and both outlets caught up.
    std::thread::sleep(Duration::from_millis(500));
    wait_until("A to see both outlets caught up", || {
        lag(&a, "main", "to-b", "link") == Some(0.0) && lag(&a, "main", "copy", "app") == Some(0.0)
    });
    assert_each_once_forwarded(
        &records(&state_b, "ingest"),
        &["dev0", "dev1"],
        PER_DEVICE,
        "node-a",
    );
    assert_each_once_forwarded(
        &records(&state_a, "copy"),
        &["dev0", "dev1"],
        PER_DEVICE,
        "app/main",
    );
    drop(a);
    drop(b);
}

/// FORWARD frames from `key` to `app` of `node`, claiming `origin`'s records `1..=count` with its payloads (as a
/// compromised device would); returns what the node refused, once the sender is idle.
fn forge(
    key: &std::path::Path,
    node: &NodeProcess,
    app: &str,
    origin: &str,
    count: u64,
) -> Vec<(String, u8)> {
    let identity = pure_serve::keys::read_identity(key).unwrap();
    let node_key = pure_serve::keys::parse_public_key(&node.public_key).unwrap();
    let mut link = UdpLink::connect(identity, node_key, node.link).unwrap();
    link.sender()
        .open_flow_as(app, FlowStart::At(1), RecordFormat::Forwarded)
        .unwrap();
    for k in 1..=count {
        link.sender()
            .queue_forwarded(
                app,
                origin.as_bytes(),
                k,
                format!("{origin} line {k}").as_bytes(),
            )
            .unwrap();
    }
    let outcome = link.deliver(Some(Duration::from_secs(30))).unwrap();
    assert_eq!(outcome.unacked, 0, "refused, so nothing is left waiting");
    outcome.refused
}

/// Issue 14, item 5. A rogue device, listed on edge node A and on far node B, sends FORWARD frames claiming dev0's
/// records (origin dev0, its sequences and payloads) to A, whose link outlet would carry them on to B as node-a's,
/// and to B directly. Neither stores them; both refuse them (REFUSE reason 3), count them and log the sender and
/// app; dev0's genuine records reach B through A exactly once with their origin, since B's `ingest` lets node-a
/// forward. A's second outlet, to an app of B that does not, is refused before it sends a record, and both ends
/// say what to add; once B's operator adds node-a to that app's forwarders and reloads (the upgrade of
/// docs/apps.md), the outlet goes on by itself and delivers every record once.
#[test]
fn a_device_cannot_forge_origins_and_only_an_apps_forwarders_may_forward_to_it() {
    const PER_DEVICE: u64 = 200;
    const FORGED: u64 = 50;
    let dir = tempfile::tempdir().unwrap();
    let (state_a, state_b) = (dir.path().join("a"), dir.path().join("b"));
    let (key_a, pub_a) = keygen(dir.path(), "node-a");
    let (key_dev, pub_dev) = keygen(dir.path(), "dev0");
    let (key_rogue, pub_rogue) = keygen(dir.path(), "rogue");

    let (senders_b, apps_b) = node_files(
        dir.path(),
        "b",
        &format!("node-a {pub_a}\nrogue {pub_rogue}\n"),
        "[apps.ingest]\naccept = [\"node-a\", \"rogue\"]\nforwarders = [\"node-a\"]\n\
         [apps.closed]\naccept = [\"node-a\"]\n",
    );
    let b = start(
        &state_b,
        &args(&[
            "--senders",
            senders_b.to_str().unwrap(),
            "--apps",
            apps_b.to_str().unwrap(),
        ]),
        0,
        0,
    );

    // A: devices send to main (it lets nobody forward to it), which forwards to B's ingest and to B's closed.
    let (senders_a, apps_a) = node_files(
        dir.path(),
        "a",
        &format!("dev0 {pub_dev}\nrogue {pub_rogue}\n"),
        &format!(
            "[apps.main]\n\
             [apps.main.outlets.to-b]\nkind = \"link\"\nto = \"{to}\"\nnode_key = \"{key}\"\napp = \"ingest\"\n\
             [apps.main.outlets.to-closed]\nkind = \"link\"\nto = \"{to}\"\nnode_key = \"{key}\"\napp = \"closed\"\n",
            to = b.link,
            key = b.public_key
        ),
    );
    let a = start(
        &state_a,
        &args(&[
            "--key",
            key_a.to_str().unwrap(),
            "--senders",
            senders_a.to_str().unwrap(),
            "--apps",
            apps_a.to_str().unwrap(),
        ]),
        0,
        0,
    );

    let mut send = spawn_send(&key_dev, &a, "main", 60);
    feed_lines(&mut send, "dev0", PER_DEVICE, PER_DEVICE, Duration::ZERO)
        .join()
        .unwrap();
    assert_sent(send, "dev0");
    let refused = vec![("main".to_string(), REFUSE_NOT_FORWARDER)];
    assert_eq!(
        forge(&key_rogue, &a, "main", "dev0", FORGED),
        refused,
        "at the edge"
    );
    let refused = vec![("ingest".to_string(), REFUSE_NOT_FORWARDER)];
    assert_eq!(
        forge(&key_rogue, &b, "ingest", "dev0", FORGED),
        refused,
        "at the far node"
    );

    wait_until("dev0's records on B", || {
        records(&state_b, "ingest").len() as u64 >= PER_DEVICE
    });
    wait_until("A's outlet to closed refused", || {
        errors(&a, "main", "to-closed", "refused") >= 1.0
    });
    // Let anything forged that would get through arrive before looking: a while, and A's outlet to B caught up.
    std::thread::sleep(Duration::from_millis(500));
    wait_until("A's outlet to ingest caught up", || {
        lag(&a, "main", "to-b", "link") == Some(0.0)
    });
    assert_each_once_forwarded(
        &records(&state_b, "ingest"),
        &["dev0"],
        PER_DEVICE,
        "node-a",
    );
    let on_a = records(&state_a, "main");
    assert_eq!(on_a.len() as u64, PER_DEVICE);
    assert!(
        on_a.iter()
            .all(|r| r["source"] == "dev0" && r["origin"].is_null()),
        "only dev0's own records on A"
    );
    assert!(
        records(&state_b, "closed").is_empty(),
        "closed takes nothing forwarded"
    );
    for node in [&a, &b] {
        assert!(metric(node, "pure_forward_frames_refused_total") >= 1.0);
        assert!(metric(node, "pure_forward_records_refused_total") >= FORGED as f64);
        assert_eq!(
            metric(node, "pure_frames_refused_total"),
            0.0,
            "counted apart"
        );
    }

    let (log_a, log_b) = (a.stderr_text(), b.stderr_text());
    for (log, app, sender) in [
        (&log_a, "main", "rogue"),
        (&log_b, "ingest", "rogue"),
        (&log_b, "closed", "node-a"),
    ] {
        let line =
            format!("app {app} refused forwarded records (FORWARD frames) from sender {sender}");
        assert!(log.contains(&line), "{line}\n{log}");
        assert_eq!(log.matches(&line).count(), 1, "said once: {line}\n{log}");
    }
    assert!(
        log_b.contains("add it to forwarders of [apps.closed] in the apps file"),
        "{log_b}"
    );
    assert!(
        log_a.contains(&format!(
            "outlet main/to-closed: {} app closed does not let this node forward to it (REFUSE reason 3): on that \
             node, add this node's name in its senders file to `forwarders` of [apps.closed]",
            b.link
        )),
        "{log_a}"
    );

    // What the operator adds, put in force by a reload: nothing was lost, the outlet resumes on its own.
    ops_util::write_atomic(
        &apps_b,
        "[apps.ingest]\naccept = [\"node-a\", \"rogue\"]\nforwarders = [\"node-a\"]\n\
         [apps.closed]\naccept = [\"node-a\"]\nforwarders = [\"node-a\"]\n",
    );
    b.signal(libc::SIGHUP);
    wait_until("the reload on B", || {
        b.stderr_text()
            .contains("reload: app closed: forwarders none → node-a")
    });
    wait_until("dev0's records in closed", || {
        records(&state_b, "closed").len() as u64 >= PER_DEVICE
    });
    std::thread::sleep(Duration::from_millis(500));
    wait_until("A's outlet to closed caught up", || {
        lag(&a, "main", "to-closed", "link") == Some(0.0)
    });
    assert_each_once_forwarded(
        &records(&state_b, "closed"),
        &["dev0"],
        PER_DEVICE,
        "node-a",
    );
}
