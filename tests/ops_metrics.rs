//! `/metrics`, `/healthz` and `pure-serve check`, end to end with the real binary (issue 3).

mod ops_util;

use std::process::Command;

use ops_util::*;

#[test]
fn metrics_and_health_on_the_http_port() {
    let dir = tempfile::tempdir().unwrap();
    let (key, public) = keygen(dir.path(), "dev");
    let senders = dir.path().join("senders");
    write_atomic(&senders, &format!("dev {public}\n"));
    let state = dir.path().join("state");
    let node = NodeProcess::start(&state, &["--senders", senders.to_str().unwrap()], None);
    assert_ne!(node.http.port(), 0);

    let records: Vec<String> = (1..=50).map(|i| format!("m{i}")).collect();
    let (ok, out) = node.send(&key, &records, "60");
    assert!(ok, "{out}");
    // The page is published once per loop round; poll until it shows the commit.
    let deadline = std::time::Instant::now() + DEADLINE;
    while node.metric("pure_records_stored_total{app=\"main\"}") != Some(50.0) {
        assert!(
            std::time::Instant::now() < deadline,
            "stored count never reached 50"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let (code, page) = node.http_get("/metrics");
    assert_eq!(code, 200);
    for family in [
        "# TYPE pure_records_stored_total counter",
        "# TYPE pure_packets_received_total counter",
        "# TYPE pure_drops_total counter",
        "# TYPE pure_sessions_active gauge",
        "# TYPE pure_x25519_total counter",
        "# TYPE pure_threads gauge",
        "pure_drops_total{stage=\"auth\"} ",
        "pure_senders 1\n",
    ] {
        assert!(page.contains(family), "{family} missing:\n{page}");
    }
    assert!(!page.contains("dev"), "no per-sender labels:\n{page}");
    assert!(node.metric("pure_packets_received_total").unwrap() >= 1.0);
    assert_eq!(node.metric("pure_x25519_total"), Some(1.0));
    // Threads: the receive loop, the metrics responder, and main waiting; not one per sender or connection.
    assert!(node.metric("pure_threads").unwrap() <= 4.0, "{page}");

    let (code, body) = node.http_get("/healthz");
    assert_eq!((code, body.as_str()), (200, "ok\n"));
    assert_eq!(node.http_get("/nope").0, 404);
}

#[test]
fn check_lists_every_problem_and_fails() {
    let dir = tempfile::tempdir().unwrap();
    let (_, public) = keygen(dir.path(), "dev");
    let senders = dir.path().join("senders");
    std::fs::write(&senders, format!("dev {public}\nbroken\ndev2 {public}\n")).unwrap();
    let key = dir.path().join("open.key");
    std::fs::write(&key, "x\n").unwrap();
    let out = Command::new(bin())
        .arg("check")
        // Ports are not what this test checks: 0 leaves them untried (tests run side by side).
        .args(["--link-port", "0", "--http-port", "0"])
        .arg("--senders")
        .arg(&senders)
        .arg("--key")
        .arg(&key)
        .arg("--state")
        .arg(dir.path().join("state"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("senders:2: has 1 field"), "{text}");
    assert!(text.contains("senders:3: duplicate key: line 1"), "{text}");
    assert!(text.contains("open.key"), "{text}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("2 problems"),
        "{out:?}"
    );

    std::fs::write(&senders, format!("dev {public}\n")).unwrap();
    let out = Command::new(bin())
        .arg("check")
        // Ports are not what this test checks: 0 leaves them untried (tests run side by side).
        .args(["--link-port", "0", "--http-port", "0"])
        .arg("--senders")
        .arg(&senders)
        .arg("--state")
        .arg(dir.path().join("state"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(text.contains("1 sender"), "{text}");
}
