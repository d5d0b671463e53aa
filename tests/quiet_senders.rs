//! `pure-serve senders` (issue 37, "Devices: who went quiet") against a real node's stores: every sender of the
//! senders file, the never-heard-of first, then the longest quiet; `--quiet-for`, `--name`, `--json`, and the
//! count by hour and day.

#[path = "ops_util/mod.rs"]
mod ops_util;

use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ops_util::{NodeProcess, bin, finish_send, keygen};

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

fn senders(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(bin())
        .arg("senders")
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn senders_are_listed_quietest_first_with_when_each_last_stored_a_record() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    let (key_a, pub_a) = keygen(dir.path(), "alpha");
    let (key_b, pub_b) = keygen(dir.path(), "beta");
    let (_, pub_c) = keygen(dir.path(), "gamma");
    std::fs::write(
        state.join("senders"),
        format!("beta {pub_b}\ngamma {pub_c}\nalpha {pub_a}\n"),
    )
    .unwrap();
    let node = NodeProcess::start(&state, &[], None);
    let before = now_ms();
    let (ok, said) =
        finish_send(node.spawn_send(&key_a, &["a1".into(), "a2".into(), "a3".into()], "30"));
    assert!(ok, "{said}");
    // beta's records are stored later than alpha's, by the store's clock (milliseconds).
    std::thread::sleep(Duration::from_millis(20));
    let (ok, said) = finish_send(node.spawn_send(&key_b, &["b1".into(), "b2".into()], "30"));
    assert!(ok, "{said}");
    let after = now_ms();
    let (code, said) = ops_util::push(&state, "main", "gamma", b"hello\n");
    assert_eq!(code, 0, "{said}");

    let state_arg = state.to_str().unwrap();
    let (ok, out, err) = senders(&["--state", state_arg]);
    assert!(ok, "{out}{err}");
    let lines: Vec<Vec<&str>> = out.lines().map(|l| l.split('\t').collect()).collect();
    assert_eq!(
        lines[0],
        [
            "NAME",
            "LAST SEEN (UTC)",
            "QUIET",
            "STORED THROUGH",
            "DOWNLINK WAITING"
        ]
    );
    let rows: Vec<(&str, &str, &str, &str)> = lines[1..]
        .iter()
        .map(|l| (l[0], l[1], l[3], l[4]))
        .collect();
    assert_eq!(rows.len(), 3, "{out}");
    assert_eq!(
        rows[0],
        ("gamma", "never", "0", "1"),
        "never heard of first: {out}"
    );
    assert_eq!(
        (rows[1].0, rows[1].2, rows[1].3),
        ("alpha", "3", "0"),
        "{out}"
    );
    assert_eq!(
        (rows[2].0, rows[2].2, rows[2].3),
        ("beta", "2", "0"),
        "{out}"
    );
    assert!(
        rows[1].1.starts_with("20") && rows[1].1.len() == 19,
        "a UTC time: {out}"
    );
    assert!(
        err.contains("3 senders: 2 stored a record in the last hour, 0 more in the last day, 0 longer ago, 1 never"),
        "{err}"
    );

    // Quiet for an hour: only the one never heard of. Quiet for 0s: everyone.
    let (ok, out, _) = senders(&["--state", state_arg, "--quiet-for", "1h"]);
    assert!(ok);
    assert_eq!(
        out.lines()
            .skip(1)
            .map(|l| l.split('\t').next().unwrap())
            .collect::<Vec<_>>(),
        ["gamma"]
    );
    let (ok, out, _) = senders(&["--state", state_arg, "--quiet-for", "0s", "--limit", "2"]);
    assert!(ok);
    assert_eq!(
        out.lines().count(),
        3,
        "a header and the two quietest: {out}"
    );

    let (ok, out, _) = senders(&["--state", state_arg, "--name", "et", "--json"]);
    assert!(ok);
    let v: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(v.len(), 1, "{out}");
    assert_eq!(v[0]["name"], "beta");
    assert_eq!(v[0]["stored_through"], 2);
    assert_eq!(v[0]["downlink_waiting"], 0);
    let last = v[0]["last_seen_ms"].as_i64().unwrap();
    assert!(
        (before..=after).contains(&last),
        "{before} <= {last} <= {after}"
    );
    assert!(v[0]["quiet_s"].as_i64().unwrap() < 3_600);

    let (ok, _, err) = senders(&["--state", state_arg, "--quiet-for", "6w"]);
    assert!(!ok);
    assert!(err.contains("its unit must be s, m, h or d"), "{err}");
    drop(node);
}
