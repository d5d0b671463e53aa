//! Apps and outlets end to end with real processes on loopback: node A hosts app `main` (devices send to it with
//! `pure-serve send`) with a link outlet to app `ingest` of node B and an inner outlet to its own app `copy`. Both
//! nodes are killed with SIGKILL several times in the middle; in the end every record is on B and in `copy`
//! exactly once, in order, with its origin, as `pure-serve records --json` shows them.

mod ops_util;
mod outlet_util;

use std::process::Child;
use std::time::Duration;

use ops_util::keygen;
use outlet_util::{
    args, assert_each_once_forwarded, assert_sent, feed_lines, kill_and_restart, records,
    spawn_send, start, wait_until,
};

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
    let senders_b = dir.path().join("senders-b");
    std::fs::write(&senders_b, format!("node-a {pub_a}\n")).unwrap();
    let apps_b = dir.path().join("b.toml");
    std::fs::write(
        &apps_b,
        "[apps.ingest]\naccept = [\"node-a\"]\nforwarders = [\"node-a\"]\n",
    )
    .unwrap();
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
    // Paced over about four seconds, so the kills land in the middle of delivery.
    let writers: Vec<_> = sends
        .iter_mut()
        .enumerate()
        .map(|(i, child)| {
            feed_lines(
                child,
                &format!("dev{i}"),
                PER_DEVICE,
                100,
                Duration::from_millis(40),
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
    // Let anything that would be a duplicate arrive before looking.
    std::thread::sleep(Duration::from_millis(500));
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
