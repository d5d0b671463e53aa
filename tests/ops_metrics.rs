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

/// Now on the wall clock, in seconds since the Unix epoch (what records' stored times are).
fn wall() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

fn status(node: &NodeProcess) -> serde_json::Value {
    let (code, body) = node.http_get("/status.json");
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// Figures that survive a restart (issue 37, §3): after a restart with 500 records waiting for two outlets whose
/// far sides are down, "records stored" is what the store holds (not 0), each outlet's lag in seconds is the age
/// of its oldest record (not capped at the node's uptime), and `/metrics` has a gauge for each outlet's lag in
/// seconds and for whether it fails. The webhook is sent its records (read back from the store), the link never is
/// (its far side never says where it stands): its figure comes from the times read at the start.
#[test]
fn figures_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (key, public) = keygen(dir.path(), "dev");
    let senders = dir.path().join("senders");
    write_atomic(&senders, &format!("dev {public}\n"));
    // Nothing listens on this port, TCP or UDP: both outlets fail.
    let down = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = down.local_addr().unwrap().port();
    drop(down);
    let apps = dir.path().join("apps.toml");
    write_atomic(
        &apps,
        &format!(
            "[apps.main]\n\
             [apps.main.outlets.cloud]\nkind = \"webhook\"\nurl = \"http://127.0.0.1:{port}/in\"\n\
             [apps.main.outlets.relay]\nkind = \"link\"\nto = \"127.0.0.1:{port}\"\n\
             node_key = \"daMGbrvtfNPfdX0m7LxP65QWRxE6CrjCt7+W4FtVWgA=\"\n"
        ),
    );
    let args = [
        "--senders",
        senders.to_str().unwrap(),
        "--apps",
        apps.to_str().unwrap(),
    ];
    let state = dir.path().join("state");
    let mut node = NodeProcess::start(&state, &args, None);
    let sent_from = wall();
    let records: Vec<String> = (1..=500).map(|i| format!("r{i}")).collect();
    let (ok, out) = node.send(&key, &records, "60");
    assert!(ok, "{out}");
    // Every record was acknowledged, so stored, by now.
    let stored_by = wall();
    assert_eq!(
        node.metric_published("pure_app_store_records{app=\"main\"}"),
        500.0
    );
    node.signal(libc::SIGTERM);
    assert_eq!(node.wait_exit(), Some(0), "{}", node.stderr_text());
    // The records grow older than the next run will be: its uptime cannot stand for their age.
    std::thread::sleep(std::time::Duration::from_secs(3));

    let node = NodeProcess::start(&state, &args, None);
    let deadline = std::time::Instant::now() + DEADLINE;
    let (s, asked_from, asked_by) = loop {
        let from = wall();
        let s = status(&node);
        let by = wall();
        // Both failed once since the start (between tries an outlet may wait rather than fail: the issue stands).
        let failing = |name: &str| {
            s["issues"].as_array().unwrap().iter().any(|i| {
                i["kind"] == "outlet_failing" && i["subject"] == format!("main/{name}").as_str()
            })
        };
        let known = s["outlets"]
            .as_array()
            .is_some_and(|o| o.len() == 2 && o.iter().all(|o| o["lag_seconds"].is_number()))
            && failing("cloud")
            && failing("relay");
        if known {
            break (s, from, by);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the outlets' lag in seconds never known, or they never failed: {s}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    // The node stores, so the load balancer's question is answered yes; the outlets make it degraded.
    assert_eq!(s["health"], "degraded", "{s}");
    assert_eq!(node.http_get("/healthz"), (200, "ok\n".to_string()));
    let app = &s["apps"][0];
    assert_eq!(app["store_records"], 500, "from the store: {s}");
    assert_eq!(app["stored_total"], 0, "this run stored nothing: {s}");
    let uptime = s["uptime_seconds"].as_f64().unwrap();
    for o in s["outlets"].as_array().unwrap() {
        assert_eq!(o["lag_records"], 500, "{o}");
        assert_eq!(o["lag_seconds_at_least"], false, "{o}");
        let lag = o["lag_seconds"].as_f64().unwrap();
        // Its oldest record was stored after `sent_from` and before `stored_by`; the figure is never less than
        // its age and more by under a second.
        assert!(
            lag >= asked_from - stored_by - 0.01 && lag <= asked_by - sent_from + 1.0,
            "{} lag {lag} s: stored between {sent_from} and {stored_by}, asked between {asked_from} and {asked_by}",
            o["name"]
        );
        assert!(
            lag > uptime + 2.0,
            "{}: lag {lag} s is not the node's uptime ({uptime} s)",
            o["name"]
        );
    }
    // /metrics: the store's count, and per outlet whether it fails and its lag in seconds.
    let metrics_from = wall();
    let (code, page) = node.http_get("/metrics");
    let metrics_by = wall();
    assert_eq!(code, 200);
    let metric = |series: &str| -> f64 {
        page.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("{series} not in /metrics:\n{page}"))
    };
    assert_eq!(metric("pure_app_store_records{app=\"main\"}"), 500.0);
    assert_eq!(metric("pure_records_stored_total{app=\"main\"}"), 0.0);
    for outlet in ["cloud", "relay"] {
        assert_eq!(
            metric(&format!(
                "pure_outlet_failing{{app=\"main\",outlet=\"{outlet}\"}}"
            )),
            1.0,
            "{page}"
        );
        let lag = metric(&format!(
            "pure_outlet_lag_seconds{{app=\"main\",outlet=\"{outlet}\"}}"
        ));
        assert!(
            lag >= metrics_from - stored_by - 0.001 && lag <= metrics_by - sent_from + 1.0,
            "{outlet}: lag {lag} s"
        );
    }
    assert!(
        page.contains("# TYPE pure_outlet_lag_seconds gauge"),
        "{page}"
    );
    assert!(page.contains("# TYPE pure_outlet_failing gauge"), "{page}");
}
