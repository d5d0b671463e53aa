//! Apps and outlets end to end with real processes on loopback: node A hosts app `main` (devices send to it with
//! `pure-serve send`) with a link outlet to app `ingest` of node B and an inner outlet to its own app `copy`. Both
//! nodes are killed with SIGKILL several times in the middle; in the end every record is on B and in `copy`
//! exactly once, in order, with its origin, as `pure-serve records --json` shows them.

mod ops_util;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ops_util::{DEADLINE, NodeProcess, bin, keygen, spawn_node};

/// `records --json --app APP` of a state directory, as parsed JSON values.
fn records(state: &Path, app: &str) -> Vec<serde_json::Value> {
    let out = Command::new(bin())
        .args(["records", "--json", "--app", app, "--state"])
        .arg(state)
        .output()
        .unwrap();
    if !out.status.success() {
        return Vec::new(); // not made yet
    }
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn start(state: &Path, args: &[String], link_port: u16) -> NodeProcess {
    let mut all: Vec<&str> = args.iter().map(String::as_str).collect();
    let port = link_port.to_string();
    // spawn_node passes --link-port 0 first; a later flag wins in clap only if it is not repeated, so the fixed
    // port goes in place of it.
    let child = if link_port == 0 {
        spawn_node(state, &all, None, &[])
    } else {
        all.extend(["--link-port", &port]);
        let mut cmd = Command::new(bin());
        cmd.arg("--state")
            .arg(state)
            .args(["--bind", "127.0.0.1", "--http-port", "0"])
            .args(&all)
            .env("RUST_LOG", "info")
            .env_remove("NOTIFY_SOCKET")
            .env_remove("WATCHDOG_USEC")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd.spawn().unwrap()
    };
    NodeProcess::attach(child, state)
}

fn spawn_send(key: &Path, node: &NodeProcess) -> Child {
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
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + DEADLINE * 2;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Checks that `got` holds each device's records 1..=per_device exactly once, in order, with `origin` the device.
fn assert_each_once(
    got: &[serde_json::Value],
    devices: usize,
    per_device: u64,
    forwarded_by: &str,
) {
    let mut by_origin: BTreeMap<String, Vec<(u64, String)>> = BTreeMap::new();
    for (k, r) in got.iter().enumerate() {
        assert_eq!(r["source"], forwarded_by, "record {k}: {r}");
        // Numbered by A's positions: 1, 2, 3, … with no gap or repeat.
        assert_eq!(r["seq"].as_u64(), Some(k as u64 + 1), "record {k}: {r}");
        assert!(r["stored_at"].is_string(), "stored_at shown: {r}");
        by_origin
            .entry(r["origin"].as_str().unwrap().to_string())
            .or_default()
            .push((
                r["origin_seq"].as_u64().unwrap(),
                r["payload"].as_str().unwrap().to_string(),
            ));
    }
    assert_eq!(by_origin.len(), devices);
    for (origin, list) in by_origin {
        assert_eq!(list.len() as u64, per_device, "{origin}: count");
        for (k, (seq, payload)) in list.iter().enumerate() {
            assert_eq!(*seq, k as u64 + 1, "{origin}: order");
            assert_eq!(
                payload,
                &format!("{origin} line {seq}"),
                "{origin}: payload"
            );
        }
    }
}

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
    std::fs::write(&apps_b, "[apps.ingest]\naccept = [\"node-a\"]\n").unwrap();
    let args_b: Vec<String> = [
        "--senders",
        senders_b.to_str().unwrap(),
        "--apps",
        apps_b.to_str().unwrap(),
    ]
    .map(String::from)
    .to_vec();
    let mut b = start(&state_b, &args_b, 0);
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
    let args_a: Vec<String> = [
        "--key",
        key_a.to_str().unwrap(),
        "--senders",
        senders_a.to_str().unwrap(),
        "--apps",
        apps_a.to_str().unwrap(),
    ]
    .map(String::from)
    .to_vec();
    let mut a = start(&state_a, &args_a, 0);
    let port_a = a.link.port();

    let mut sends: Vec<Child> = devices.iter().map(|(k, _)| spawn_send(k, &a)).collect();
    let writers: Vec<_> = sends
        .iter_mut()
        .enumerate()
        .map(|(i, child)| {
            let mut stdin = child.stdin.take().unwrap();
            std::thread::spawn(move || {
                for chunk in 0..PER_DEVICE / 100 {
                    let mut text = String::new();
                    for k in chunk * 100 + 1..=chunk * 100 + 100 {
                        text.push_str(&format!("dev{i} line {k}\n"));
                    }
                    stdin.write_all(text.as_bytes()).unwrap();
                    // Paced over about four seconds, so the kills land in the middle of delivery.
                    std::thread::sleep(Duration::from_millis(40));
                }
            })
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
            a.child.kill().unwrap();
            a.child.wait().unwrap();
            a = start(&state_a, &args_a, port_a);
        } else {
            b.child.kill().unwrap();
            b.child.wait().unwrap();
            b = start(&state_b, &args_b, port_b);
        }
    }
    for w in writers {
        w.join().unwrap();
    }
    for (i, child) in sends.into_iter().enumerate() {
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "dev{i}'s send failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    wait_until("every record on B", || {
        records(&state_b, "ingest").len() as u64 >= total
    });
    wait_until("every record in copy", || {
        records(&state_a, "copy").len() as u64 >= total
    });
    // Let anything that would be a duplicate arrive before looking.
    std::thread::sleep(Duration::from_millis(500));
    assert_each_once(&records(&state_b, "ingest"), DEVICES, PER_DEVICE, "node-a");
    assert_each_once(&records(&state_a, "copy"), DEVICES, PER_DEVICE, "app/main");
    drop(a);
    drop(b);
}
