//! `pure-serve records --follow`: a consumer on the node reads records as they are stored, like `tail -f`, and
//! resumes with `--from` after the last `pos` it printed.

mod ops_util;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Instant;

use ops_util::{DEADLINE, NodeProcess, bin, keygen};

#[test]
fn follow_prints_new_records_as_they_are_stored_and_from_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let (key, public) = keygen(dir.path(), "dev");
    let senders = dir.path().join("senders");
    std::fs::write(&senders, format!("dev {public}\n")).unwrap();
    let state = dir.path().join("state");
    let node = NodeProcess::start(&state, &["--senders", senders.to_str().unwrap()], None);
    let first: Vec<String> = (1..=10).map(|i| format!("before {i}")).collect();
    assert!(node.send(&key, &first, "30").0);

    // Following from position 11 on (without --from it starts at the head, which would race with the send below).
    let mut follow = Command::new(bin())
        .args([
            "records", "--follow", "--from", "11", "--json", "--app", "main", "--state",
        ])
        .arg(&state)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, lines) = mpsc::channel();
    let stdout = follow.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            if tx.send(line.unwrap()).is_err() {
                break;
            }
        }
    });
    let second: Vec<String> = (1..=25).map(|i| format!("after {i}")).collect();
    assert!(node.send(&key, &second, "30").0);
    let deadline = Instant::now() + DEADLINE;
    let mut got = Vec::new();
    while got.len() < 25 {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = lines
            .recv_timeout(left)
            .expect("follow printed the new records");
        got.push(serde_json::from_str::<serde_json::Value>(&line).unwrap());
    }
    follow.kill().unwrap();
    follow.wait().unwrap();
    for (i, r) in got.iter().enumerate() {
        assert_eq!(r["payload"], format!("after {}", i + 1), "{r}");
        assert_eq!(r["seq"], 11 + i as u64);
        assert_eq!(r["pos"], 11 + i as u64);
        assert!(r["stored_at"].as_str().unwrap().ends_with('Z'));
    }
    // A consumer that stopped after pos 20 resumes at 21 and gets exactly the rest.
    let out = Command::new(bin())
        .args([
            "records", "--json", "--app", "main", "--from", "21", "--state",
        ])
        .arg(&state)
        .output()
        .unwrap();
    let rest: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let pos: Vec<u64> = rest.iter().map(|r| r["pos"].as_u64().unwrap()).collect();
    assert_eq!(pos, (21..=35).collect::<Vec<_>>());
}
