//! SIGHUP reloads the senders file, end to end (issue 3): RELOADING=1 then READY=1; a good file lets a new sender
//! in and keeps listed senders' runs going; a bad file is reported with its line and the old list stays.

mod ops_util;

use std::time::Duration;

use ops_util::*;
use pure_serve::sender::UdpLink;

fn reload(node: &NodeProcess, notify: &NotifySocket) -> Vec<String> {
    node.signal(libc::SIGHUP);
    let seen = notify.until("RELOADING=1");
    let reloading = seen.last().unwrap();
    assert!(
        field(reloading, "MONOTONIC_USEC").is_some_and(|v| v.parse::<u64>().is_ok()),
        "{reloading}"
    );
    let mut all = seen;
    all.extend(notify.until("READY=1"));
    all
}

#[test]
fn good_file_lets_a_new_sender_in_and_bad_file_keeps_the_old_list() {
    let dir = tempfile::tempdir().unwrap();
    let (key_a, pub_a) = keygen(dir.path(), "a");
    let (key_b, pub_b) = keygen(dir.path(), "b");
    let senders = dir.path().join("senders");
    write_atomic(&senders, &format!("a {pub_a}\n"));
    let notify = NotifySocket::path();
    let state = dir.path().join("state");
    let node = NodeProcess::start(
        &state,
        &["--senders", senders.to_str().unwrap()],
        Some(&notify),
    );
    notify.until("READY=1");

    // b is not listed: nothing of it is stored.
    let (ok, out) = node.send(&key_b, &["b-early".to_string()], "1");
    assert!(!ok, "{out}");

    write_atomic(&senders, &format!("a {pub_a}\n# added\nb {pub_b}\n"));
    let seen = reload(&node, &notify);
    let ready = seen.last().unwrap();
    assert!(
        field(ready, "STATUS").unwrap().contains("2 senders"),
        "{ready}"
    );
    let (ok, out) = node.send(&key_b, &["b1".to_string(), "b2".to_string()], "60");
    assert!(ok, "{out}");

    // A bad file: reported with file and line (log and STATUS), and the old list (a and b) stays in force.
    write_atomic(&senders, &format!("a {pub_a}\nc not-base64!\n"));
    let seen = reload(&node, &notify);
    let status = field(seen.last().unwrap(), "STATUS").unwrap().to_string();
    assert!(status.contains("2 senders"), "{status}");
    assert!(status.contains("reload refused"), "{status}");
    assert!(status.contains("senders:2:"), "{status}");
    let (ok, out) = node.send(&key_a, &["a1".to_string()], "60");
    assert!(ok, "{out}");
    let (ok, out) = node.send(&key_b, &["b3".to_string()], "60");
    assert!(ok, "{out}");
    let deadline = std::time::Instant::now() + DEADLINE;
    while !node.stderr_text().contains("reload of") {
        assert!(
            std::time::Instant::now() < deadline,
            "no reload error logged"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let log = node.stderr_text();
    assert!(log.contains("ERROR"), "{log}");
    assert!(log.contains("senders:2: public key of c"), "{log}");
    assert_eq!(node.metric("pure_reloads_failed_total"), Some(1.0));
    assert_eq!(node.metric("pure_reloads_total"), Some(1.0));

    let mut got: Vec<(String, u64, String)> = records(&state);
    got.sort();
    let expect: Vec<(String, u64, String)> = vec![
        ("a".into(), 1, "a1".into()),
        ("b".into(), 1, "b1".into()),
        ("b".into(), 2, "b2".into()),
        ("b".into(), 3, "b3".into()),
    ];
    assert_eq!(got, expect);
}

#[test]
fn a_listed_senders_run_goes_on_and_a_removed_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (key_a, pub_a) = keygen(dir.path(), "a");
    let (key_b, pub_b) = keygen(dir.path(), "b");
    let senders = dir.path().join("senders");
    write_atomic(&senders, &format!("a {pub_a}\nb {pub_b}\n"));
    let notify = NotifySocket::path();
    let state = dir.path().join("state");
    let node = NodeProcess::start(
        &state,
        &[
            "--senders",
            senders.to_str().unwrap(),
            "--link-idle-ms",
            "600000",
        ],
        Some(&notify),
    );
    notify.until("READY=1");
    let node_key = pure_serve::keys::parse_public_key(&node.public_key).unwrap();
    let link_of = |key: &std::path::Path| {
        UdpLink::connect(
            pure_serve::keys::read_identity(key).unwrap(),
            node_key,
            node.link,
        )
        .unwrap()
    };
    let (mut a, mut b) = (link_of(&key_a), link_of(&key_b));
    for (link, name) in [(&mut a, "a"), (&mut b, "b")] {
        link.sender()
            .queue("main", format!("{name}1").into_bytes())
            .unwrap();
        assert_eq!(link.deliver(Some(DEADLINE)).unwrap().unacked, 0);
    }
    assert_eq!(node.metric("pure_sessions_active"), Some(2.0));
    let x25519 = node.metric("pure_x25519_total").unwrap();

    // Reload without b and with a new sender c (the list is sorted by key, so a may move: sessions are remapped
    // by key; the unit tests of proto::node force the move).
    let (_, pub_c) = keygen(dir.path(), "c");
    write_atomic(&senders, &format!("c {pub_c}\na {pub_a}\n"));
    reload(&node, &notify);
    assert_eq!(node.metric("pure_senders"), Some(2.0));
    assert_eq!(node.metric("pure_sessions_active"), Some(1.0));

    // a's run goes on in its session: stored, and no new X25519 (a new session would have cost one).
    a.sender().queue("main", b"a2".to_vec()).unwrap();
    assert_eq!(a.deliver(Some(DEADLINE)).unwrap().unacked, 0);
    assert_eq!(node.metric("pure_x25519_total"), Some(x25519));

    // b's later packets are refused before any crypto, and counted.
    b.sender().queue("main", b"b2".to_vec()).unwrap();
    // Nothing acked over a while, and then until the node has counted a drop (so an ack would have come by then).
    let mut outcome = b.deliver(Some(Duration::from_secs(1))).unwrap();
    let deadline = std::time::Instant::now() + DEADLINE;
    while node
        .metric("pure_drops_total{stage=\"unknown_key\"}")
        .unwrap_or(0.0)
        < 1.0
    {
        assert!(std::time::Instant::now() < deadline, "no drop counted");
        outcome = b.deliver(Some(Duration::from_millis(100))).unwrap();
    }
    assert_eq!(outcome.unacked, 1);
    assert_eq!(node.metric("pure_x25519_total"), Some(x25519));

    let mut got: Vec<(String, u64, String)> = records(&state);
    got.sort();
    assert_eq!(
        got,
        vec![
            ("a".to_string(), 1, "a1".to_string()),
            ("a".to_string(), 2, "a2".to_string()),
            ("b".to_string(), 1, "b1".to_string()),
        ]
    );
}

#[test]
fn a_file_that_is_not_a_file_on_reload_keeps_what_is_in_force_and_the_next_reload_works() {
    let dir = tempfile::tempdir().unwrap();
    let (key_a, pub_a) = keygen(dir.path(), "a");
    let (key_b, pub_b) = keygen(dir.path(), "b");
    let senders = dir.path().join("senders");
    write_atomic(&senders, &format!("a {pub_a}\n"));
    let apps = dir.path().join("apps.toml");
    write_atomic(&apps, "[apps.main]\n");
    let notify = NotifySocket::path();
    let state = dir.path().join("state");
    let node = NodeProcess::start(
        &state,
        &[
            "--senders",
            senders.to_str().unwrap(),
            "--apps",
            apps.to_str().unwrap(),
        ],
        Some(&notify),
    );
    notify.until("READY=1");
    let tmp = dir.path().join("next");
    let s = senders.display().to_string();
    // Each put in place of the senders file as tooling would (renamed over it); each read would have blocked or
    // gone on without end. The reload thread must answer every time, and the list of one sender stay.
    type Make<'a> = &'a dyn Fn(&std::path::Path);
    let bad: [(Make, String); 4] = [
        (
            &|p| mkfifo(p),
            format!("senders file {s} is a FIFO (named pipe), not a regular file"),
        ),
        (
            &|p| std::os::unix::fs::symlink("/dev/zero", p).unwrap(),
            format!("senders file {s} (a symbolic link to /dev/zero) is a character device"),
        ),
        (
            &|p| std::os::unix::fs::symlink("/dev/urandom", p).unwrap(),
            format!("senders file {s} (a symbolic link to /dev/urandom) is a character device"),
        ),
        (
            &|p| sparse(p, 3 << 30),
            format!("senders file {s} is 3221225472 bytes, more than any useful one"),
        ),
    ];
    for (make, words) in &bad {
        make(&tmp);
        std::fs::rename(&tmp, &senders).unwrap();
        let seen = reload(&node, &notify);
        let status = field(seen.last().unwrap(), "STATUS").unwrap().to_string();
        assert!(status.contains(": 1 senders"), "{status}");
        assert!(status.contains("last reload refused"), "{status}");
        assert!(status.contains(words.as_str()), "{status}");
    }
    let (ok, out) = node.send(&key_a, &["a1".to_string()], "60");
    assert!(ok, "{out}");

    // The apps file is re-read on the receive loop itself: a FIFO there would have stopped the node.
    std::fs::remove_file(&apps).unwrap();
    mkfifo(&apps);
    write_atomic(&senders, &format!("a {pub_a}\nb {pub_b}\n"));
    let seen = reload(&node, &notify);
    let status = field(seen.last().unwrap(), "STATUS").unwrap().to_string();
    assert!(status.contains(": 2 senders"), "{status}");
    let (ok, out) = node.send(&key_b, &["b1".to_string()], "60");
    assert!(ok, "{out}");
    let log = node.stderr_text();
    assert!(
        log.contains(&format!(
            "reload of {a} refused, the apps in force stay: apps file {a} is a FIFO (named pipe), not a regular \
             file: point --apps at a regular file",
            a = apps.display()
        )),
        "{log}"
    );
    // The senders file took effect, the apps file did not: a reload refused in part counts as refused, and STATUS
    // says which file.
    assert!(
        status.contains("last reload of the apps file refused"),
        "{status}"
    );
    assert_eq!(node.metric("pure_reloads_failed_total"), Some(5.0));
    assert_eq!(node.metric("pure_reloads_total"), Some(0.0));
    let mut got = records(&state);
    got.sort();
    assert_eq!(
        got,
        vec![("a".into(), 1, "a1".into()), ("b".into(), 1, "b1".into())]
    );
}
