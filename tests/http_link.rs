//! Links over HTTP end to end: a real node process, a sans-IO sender whose datagrams go in `POST /link` bodies, the
//! records checked with `pure-serve records`. Also over TLS with a CA made at test time, and the node's refusal to
//! start on bad TLS files.

mod http_util;
mod ops_util;

use std::process::Command;
use std::time::{Duration, Instant};

use http_util::*;
use ops_util::*;
use pure_serve::keys;
use pure_serve::proto::sender::{Sender, SenderConfig, SenderEvent};

fn sender_for(node: &NodeProcess, key: &std::path::Path) -> Sender {
    let identity = keys::read_identity(key).unwrap();
    let node_public = keys::parse_public_key(&node.public_key).unwrap();
    Sender::new(SenderConfig::new(identity, node_public)).unwrap()
}

fn stored_through(d: &Delivery) -> Option<u64> {
    d.events.iter().rev().find_map(|e| match e {
        SenderEvent::Stored { app, through } if app == "main" => Some(*through),
        _ => None,
    })
}

fn wait_metric(node: &NodeProcess, series: &str, done: impl Fn(f64) -> bool) -> f64 {
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Some(v) = node.metric(series)
            && done(v)
        {
            return v;
        }
        assert!(Instant::now() < deadline, "{series} never got there");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn records_posted_over_http_are_stored_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let (key, public) = keygen(dir.path(), "dev");
    let (udp_key, udp_public) = keygen(dir.path(), "udp");
    let senders = dir.path().join("senders");
    write_atomic(&senders, &format!("dev {public}\nudp {udp_public}\n"));
    let state = dir.path().join("state");
    // Sessions are forgotten after 1.5 s of quiet, so the test can replay into a swept session too.
    let node = NodeProcess::start(
        &state,
        &[
            "--senders",
            senders.to_str().unwrap(),
            "--link-idle-ms",
            "1500",
        ],
        None,
    );

    // The same node takes UDP from another sender meanwhile.
    let (ok, out) = node.send(&udp_key, &["u1".into(), "u2".into()], "60");
    assert!(ok, "{out}");

    let mut sender = sender_for(&node, &key);
    for i in 1..=300 {
        sender.queue("main", format!("h{i}").into_bytes()).unwrap();
    }
    let mut http = Client::connect(node.http);
    let delivery = deliver(&mut sender, DEADLINE, |packets| {
        let r = http.post_link(packets);
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("content-type"), Some("application/x-pure-link"));
        r.packets()
    });
    assert_eq!(stored_through(&delivery), Some(300), "{delivery:?}");
    assert!(delivery.requests.len() >= 2, "a probe, then the records");
    let stored = records(&state);
    let mine: Vec<_> = stored.iter().filter(|r| r.0 == "dev").collect();
    assert_eq!(mine.len(), 300);
    for (i, (_, seq, payload)) in mine.iter().enumerate() {
        assert_eq!(
            (*seq, payload.as_str()),
            (i as u64 + 1, format!("h{}", i + 1).as_str())
        );
    }
    assert_eq!(stored.iter().filter(|r| r.0 == "udp").count(), 2);
    assert!(node.metric("pure_http_link_requests_total").unwrap() >= 2.0);

    // The same packets again at once: every one is a replay within the session's window. The node drops them
    // before they reach a turn (as it would over UDP) and so earns no ack: 200 with no packets.
    let replay_drops = node.metric("pure_drops_total{stage=\"replay\"}").unwrap();
    let all: Vec<Vec<u8>> = delivery.requests.concat();
    let r = http.post_link(&all);
    assert_eq!((r.status, r.body.len()), (200, 0), "{}", r.text());
    let dropped = wait_metric(&node, "pure_drops_total{stage=\"replay\"}", |v| {
        v >= replay_drops + all.len() as f64
    });
    assert_eq!(dropped, replay_drops + all.len() as f64);

    // Once the session is swept, the same packets open it again: their records are duplicates, nothing more is
    // stored, and the node acks what it holds — an answer the sender authenticates.
    wait_metric(&node, "pure_sessions_active", |v| v == 0.0);
    let received = sender.stats().packets_received;
    let rejected = sender.stats().packets_rejected;
    let r = http.post_link(&all);
    assert_eq!(r.status, 200, "{}", r.text());
    let answers = r.packets();
    assert!(!answers.is_empty(), "a swept session's replay is acked");
    for a in &answers {
        sender.handle_datagram(Instant::now(), a);
    }
    assert_eq!(
        sender.stats().packets_received,
        received + answers.len() as u64
    );
    assert_eq!(sender.stats().packets_rejected, rejected);
    assert_eq!(sender.stored_through("main"), Some(300));
    // (The page is published after the round's answers went out, so it may lag an answer by a round.)
    wait_metric(&node, "pure_records_duplicate_total", |v| v >= 300.0);
    assert_eq!(records(&state).len(), 302, "nothing stored twice");

    // Bad requests against the real node.
    let r = http.request("POST", "/link", &[], &[0, 0]).unwrap();
    assert_eq!(r.status, 400);
    assert!(r.text().contains("length 0"), "{}", r.text());
    assert_eq!(http.get("/link").status, 405);
    let mut big = Client::connect(node.http);
    big.write_raw(b"POST /link HTTP/1.1\r\nHost: x\r\nContent-Length: 2000000\r\n\r\n")
        .unwrap();
    assert_eq!(big.read_reply(false).unwrap().status, 413);
    // /metrics shows the HTTP side.
    assert_eq!(
        node.metric("pure_http_link_errors_total{reason=\"too_large\"}"),
        Some(1.0)
    );
    // One HTTP thread, whatever the connections: 50 more kept alive add none. (From five addresses: one may hold
    // no more than 32.)
    let threads = node.metric("pure_threads").unwrap();
    let mut held: Vec<_> = (0..50)
        .map(|i| {
            Client::connect_from(
                format!("127.0.0.{}", 10 + i % 5).parse().unwrap(),
                node.http,
            )
        })
        .collect();
    for c in &mut held {
        assert_eq!(c.get("/healthz").status, 200);
    }
    assert_eq!(node.metric("pure_threads"), Some(threads));
    let http_threads = std::fs::read_dir(format!("/proc/{}/task", node.child.id()))
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.trim() == "pure-http")
        .count();
    assert_eq!(http_threads, 1);
}

#[test]
fn links_over_https_with_a_test_ca_and_plain_http_on_the_same_port() {
    let dir = tempfile::tempdir().unwrap();
    let ca = test_ca(dir.path());
    let (key, public) = keygen(dir.path(), "dev");
    let senders = dir.path().join("senders");
    write_atomic(&senders, &format!("dev {public}\n"));
    let state = dir.path().join("state");
    let node = NodeProcess::start(
        &state,
        &[
            "--senders",
            senders.to_str().unwrap(),
            "--tls-cert",
            ca.cert_file.to_str().unwrap(),
            "--tls-key",
            ca.key_file.to_str().unwrap(),
            "--tls-handshake-budget",
            "50",
        ],
        None,
    );
    assert_eq!(node.metric("pure_http_tls_handshake_budget"), Some(50.0));
    let mut sender = sender_for(&node, &key);
    for i in 1..=50 {
        sender.queue("main", format!("s{i}").into_bytes()).unwrap();
    }
    let mut https = Client::connect_tls(node.http, &ca.ca_der).unwrap();
    let delivery = deliver(&mut sender, DEADLINE, |packets| {
        let r = https.post_link(packets);
        assert_eq!(r.status, 200, "{}", r.text());
        r.packets()
    });
    assert_eq!(stored_through(&delivery), Some(50));
    assert_eq!(records(&state).len(), 50);
    assert_eq!(https.get("/healthz").status, 200);
    let (code, body) = node.http_get("/healthz");
    assert_eq!((code, body.as_str()), (200, "ok\n"), "plain HTTP too");
}

#[test]
fn the_node_does_not_start_on_bad_tls_files() {
    let dir = tempfile::tempdir().unwrap();
    let ca = test_ca(dir.path());
    let state = dir.path().join("state");
    let run = |cert: &std::path::Path, key: &std::path::Path| {
        let out = Command::new(bin())
            .arg("--state")
            .arg(&state)
            .args([
                "--bind",
                "127.0.0.1",
                "--link-port",
                "0",
                "--http-port",
                "0",
            ])
            .arg("--tls-cert")
            .arg(cert)
            .arg("--tls-key")
            .arg(key)
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    let missing = dir.path().join("nope.pem");
    let err = run(&missing, &ca.key_file);
    assert!(
        err.contains("nope.pem") && err.contains("did not start"),
        "{err}"
    );
    let err = run(&ca.cert_file, &ca.cert_file);
    assert!(
        err.contains("server.pem") && err.contains("--tls-key"),
        "{err}"
    );
    // One flag without the other is a usage error that says which is missing.
    let out = Command::new(bin())
        .arg("--state")
        .arg(&state)
        .arg("--tls-cert")
        .arg(&ca.cert_file)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--tls-key"), "{err}");
}

/// Two requests of one run on their way at once (issue 18, item 15), the later-numbered one answered first: the
/// records of the other are stored after that answer went, and their ACK comes in the answer of the request that
/// carried them (protocol.md 10), not after the sender's timeout. Before, the node sent a run's answers to the
/// request of its highest packet number, here the one already answered, and the ACK was lost.
#[test]
fn each_request_gets_the_ack_of_its_own_records_when_the_later_one_is_answered_first() {
    let dir = tempfile::tempdir().unwrap();
    let (key, public) = keygen(dir.path(), "dev");
    let senders = dir.path().join("senders");
    write_atomic(&senders, &format!("dev {public}\n"));
    let state = dir.path().join("state");
    let node = NodeProcess::start(&state, &["--senders", senders.to_str().unwrap()], None);
    let mut sender = sender_for(&node, &key);
    sender
        .open_flow("main", pure_serve::proto::sender::FlowStart::At(1))
        .unwrap();
    let now = Instant::now();
    let packet = |sender: &mut Sender, from: u32| {
        for i in from..from + 5 {
            sender.queue("main", format!("r{i}").into_bytes()).unwrap();
        }
        let mut out = Vec::new();
        assert!(sender.poll_transmit(now, &mut out));
        assert!(
            !sender.poll_transmit(now, &mut Vec::new()),
            "one packet each"
        );
        out
    };
    let first = packet(&mut sender, 1); // records 1–5, packet number 0
    let second = packet(&mut sender, 6); // records 6–10, packet number 1
    let mut a = Client::connect(node.http);
    let mut b = Client::connect(node.http);
    // The second arrives first: its records follow a gap, so it is answered with ACK 0.
    let r = b.post_link(std::slice::from_ref(&second));
    assert_eq!(r.status, 200, "{}", r.text());
    for p in r.packets() {
        sender.handle_datagram(Instant::now(), &p);
    }
    assert_eq!(sender.stored_through("main"), Some(0));
    // The first, after that answer went: its records are stored and its own answer says so.
    let r = a.post_link(std::slice::from_ref(&first));
    assert_eq!(r.status, 200, "{}", r.text());
    let answers = r.packets();
    assert!(
        !answers.is_empty(),
        "the request that stored 1–5 is answered with their ACK"
    );
    for p in answers {
        sender.handle_datagram(Instant::now(), &p);
    }
    assert_eq!(sender.stored_through("main"), Some(5));
    assert_eq!(records(&state).len(), 5);
    assert_eq!(
        node.metric("pure_http_link_packets_lost_total"),
        Some(0.0),
        "no node packet went to a request answered already"
    );
}

/// `--no-http-links` switches links over HTTP off (protocol.md 10, docs/operations.md): `POST /link` is 404 and
/// says why (whatever the body, a malformed one too), `/healthz` is still served on --http-port, and links over UDP work as ever.
#[test]
fn no_http_links_answers_post_link_404_and_keeps_health_and_udp() {
    let dir = tempfile::tempdir().unwrap();
    let (key, public) = keygen(dir.path(), "dev");
    let senders = dir.path().join("senders");
    write_atomic(&senders, &format!("dev {public}\n"));
    let state = dir.path().join("state");
    let node = NodeProcess::start(
        &state,
        &["--senders", senders.to_str().unwrap(), "--no-http-links"],
        None,
    );
    let mut sender = sender_for(&node, &key);
    sender.queue("main", b"x".to_vec()).unwrap();
    let mut packets = Vec::new();
    let mut out = Vec::new();
    while sender.poll_transmit(Instant::now(), &mut out) {
        packets.push(out.clone());
    }
    let mut http = Client::connect(node.http);
    let r = http.post_link(&packets);
    assert_eq!(r.status, 404);
    assert!(r.text().contains("--no-http-links"), "{}", r.text());
    // A body that is not framed packets is 404 too, not 400: the node takes no links over HTTP at all.
    let r = http
        .request(
            "POST",
            "/link",
            &[("Content-Type", "application/x-pure-link")],
            b"\xff\xff\x01",
        )
        .unwrap();
    assert_eq!(r.status, 404, "{}", r.text());
    assert!(r.text().contains("--no-http-links"), "{}", r.text());
    assert_eq!(http.get("/healthz").status, 200);
    let (ok, out) = node.send(&key, &["u1".into()], "60");
    assert!(ok, "{out}");
    assert_eq!(records(&state).len(), 1, "only the record sent over UDP");
}
