//! `/metrics`, `/healthz` and `pure-serve check`, end to end with the real binary (issue 3); the metrics on a
//! listener of their own, loopback unless told otherwise (issue 14, item 4).

mod ops_util;

use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};

use ops_util::*;

#[test]
fn metrics_on_their_own_listener_and_health_on_both() {
    let dir = tempfile::tempdir().unwrap();
    let (key, public) = keygen(dir.path(), "dev");
    let senders = dir.path().join("senders");
    write_atomic(&senders, &format!("dev {public}\n"));
    let state = dir.path().join("state");
    let node = NodeProcess::start(&state, &["--senders", senders.to_str().unwrap()], None);
    assert_ne!(node.http.port(), 0);
    assert_ne!(node.metrics.port(), 0);
    assert_ne!(node.metrics, node.http);

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
    // The sender is named "dev": no label may carry its name (a million senders would be a million series).
    assert!(!page.contains("=\"dev\""), "no per-sender labels:\n{page}");
    assert!(node.metric("pure_packets_received_total").unwrap() >= 1.0);
    assert_eq!(node.metric("pure_x25519_total"), Some(1.0));
    // Threads: the receive loop, the metrics responder, and main waiting; not one per sender or connection.
    assert!(node.metric("pure_threads").unwrap() <= 4.0, "{page}");

    let (code, body) = node.http_get("/healthz");
    assert_eq!((code, body.as_str()), (200, "ok\n"));
    assert_eq!(node.http_get("/nope").0, 404);
    // The port that takes links answers /healthz (load balancers ask there), not /metrics.
    let (code, body) = http_get(node.http, "/healthz");
    assert_eq!((code, body.as_str()), (200, "ok\n"));
    let (code, body) = http_get(node.http, "/metrics");
    assert_eq!(code, 404);
    assert!(body.contains("--metrics-listen"), "{body}");
    assert!(!body.contains("pure_"), "{body}");
}

/// Starts the node with `args` after the state and ports 0, without `--bind 127.0.0.1`.
fn start_bound(state: &std::path::Path, args: &[&str]) -> NodeProcess {
    let child = Command::new(bin())
        .arg("--state")
        .arg(state)
        .args(["--link-port", "0", "--http-port", "0"])
        .args(args)
        .env_remove("NOTIFY_SOCKET")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    NodeProcess::attach(child, state)
}

/// Whether a TCP connection to `ip` at `port` is taken.
fn accepts(ip: &str, port: u16) -> bool {
    TcpStream::connect(SocketAddr::new(ip.parse().unwrap(), port)).is_ok()
}

#[test]
fn the_metrics_listener_is_loopback_unless_told_otherwise() {
    let dir = tempfile::tempdir().unwrap();
    // --bind 0.0.0.0: the link ports are on every address, the metrics on 127.0.0.1 only. (Linux routes all of
    // 127/8 to loopback, so 127.0.0.2 stands for an address of another interface.)
    let node = start_bound(&dir.path().join("a"), &["--bind", "0.0.0.0"]);
    assert_eq!(node.metrics.ip().to_string(), "127.0.0.1");
    assert!(
        accepts("127.0.0.2", node.http.port()),
        "links: every address"
    );
    assert!(
        !accepts("127.0.0.2", node.metrics.port()),
        "metrics: loopback's 127.0.0.1 only"
    );
    assert_eq!(http_get(node.metrics, "/metrics").0, 200);
    let on_http = SocketAddr::new("127.0.0.2".parse().unwrap(), node.http.port());
    assert_eq!(http_get(on_http, "/metrics").0, 404);
    drop(node);
    // Told another address, it listens there and nowhere else.
    let node = start_bound(
        &dir.path().join("b"),
        &["--bind", "127.0.0.1", "--metrics-listen", "127.0.0.3:0"],
    );
    assert_eq!(node.metrics.ip().to_string(), "127.0.0.3");
    assert!(!accepts("127.0.0.1", node.metrics.port()));
    let (code, page) = http_get(node.metrics, "/metrics");
    assert_eq!(code, 200);
    assert!(
        page.contains("# TYPE pure_http_refused_total counter"),
        "{page}"
    );
    // --help teaches the flag and its default.
    let out = Command::new(bin()).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(
        help.contains("--metrics-listen <ADDR:PORT>") && help.contains("127.0.0.1:7382"),
        "{help}"
    );
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
