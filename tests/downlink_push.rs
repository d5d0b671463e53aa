//! Downlink through real processes (docs/downlink.md): `pure-serve push` and HTTP on the node's push socket queue
//! records, a device over real UDP is handed each of them once, in order — also when it was already listening
//! (pushed to a live session), and across a SIGKILL of the node. Refusals, exit statuses and the socket's life.

#[path = "ops_util/mod.rs"]
mod ops_util;

use std::io::{Read, Write};
use std::os::unix::net::{UnixDatagram, UnixStream};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use ops_util::{DEADLINE, NodeProcess, bin, keygen, node_command, output_within, push};
use pure_serve::keys;
use pure_serve::sender::{SenderEvent, UdpLink};

/// A `POST` of `body` to `target` closing its connection, whole, as one write takes it: a server that answers a
/// bad request before its body (400) and closes would make a second write fail with a broken pipe.
fn post_request(target: &str, body: &[u8]) -> Vec<u8> {
    let mut request = format!(
        "POST {target} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(body);
    request
}

/// One HTTP/1.1 request on the push socket, as a program without our command would make it.
fn post_raw(socket: &Path, target: &str, body: &[u8]) -> (u16, String) {
    let mut s = UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(DEADLINE)).unwrap();
    s.write_all(&post_request(target, body)).unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    let status = answer[9..12].parse().unwrap();
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    (status, body)
}

/// A device listening on `main` from `heard`, driven until it was handed `want` records or the deadline.
fn listen(node: &NodeProcess, key: &Path, heard: u64, want: usize) -> Vec<(u64, Vec<u8>)> {
    let identity = keys::read_identity(key).unwrap();
    let public = keys::parse_public_key(&node.public_key).unwrap();
    let mut link = UdpLink::connect(identity, public, node.link).unwrap();
    link.listen("main", heard).unwrap();
    let mut got = Vec::new();
    let deadline = Instant::now() + DEADLINE;
    while got.len() < want && Instant::now() < deadline {
        for r in link.receive(deadline).unwrap() {
            assert_eq!(r.app, "main");
            got.push((r.seq, r.payload));
        }
    }
    // What the device was handed it acknowledges: `deliver` returns once the node says nothing more waits, and
    // keeps any record that came meanwhile for `receive`.
    let outcome = link.deliver(Some(DEADLINE)).unwrap();
    assert_eq!(outcome.unacked, 0);
    got.extend(
        link.receive(Instant::now())
            .unwrap()
            .into_iter()
            .map(|r| (r.seq, r.payload)),
    );
    got
}

/// The device of `key` listening on `main` from 0, driven until the node has answered its LISTEN: its session is
/// live and listening.
fn live_listening_link(node: &NodeProcess, key: &Path) -> UdpLink {
    let identity = keys::read_identity(key).unwrap();
    let public = keys::parse_public_key(&node.public_key).unwrap();
    let mut link = UdpLink::connect(identity, public, node.link).unwrap();
    link.sender().listen("main", 0).unwrap();
    // deliver returns once the LISTEN is answered and the node says nothing more waits.
    link.deliver(Some(DEADLINE)).unwrap();
    assert!(
        link.sender().is_idle(),
        "the node never answered the LISTEN"
    );
    link
}

/// The downlink records `link` is handed first, driving it (and sending nothing of its own but what its state
/// machine sends) until some arrive or the deadline.
fn first_downs(link: &mut UdpLink) -> Vec<(u64, Vec<u8>)> {
    let deadline = Instant::now() + DEADLINE;
    let mut got = Vec::new();
    while got.is_empty() && Instant::now() < deadline {
        link.drive(Instant::now() + Duration::from_millis(50))
            .unwrap();
        for e in link.take_events() {
            if let SenderEvent::Down { seq, payload, .. } = e {
                got.push((seq, payload));
            }
        }
    }
    got
}

/// A node on `state` with `senders` and `extra` flags, run to its exit (for starts that are refused).
fn node_that_does_not_start(state: &Path, senders: &Path, extra: &[&str]) -> std::process::Output {
    let args = [&["--senders", senders.to_str().unwrap()], extra].concat();
    output_within(&mut node_command(state, &args, None))
}

fn setup(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let (key, public) = keygen(dir, "dev");
    let senders = dir.join("senders");
    std::fs::write(
        &senders,
        format!("kitchen-1 {public}\nother {}\n", keygen(dir, "o").1),
    )
    .unwrap();
    (key, senders)
}

/// A node on `dir/state` with the senders of [`setup`] and an apps file of `apps_toml`: (node, state, apps file).
fn node_with_apps(
    dir: &Path,
    senders: &Path,
    apps_toml: &str,
) -> (NodeProcess, std::path::PathBuf, std::path::PathBuf) {
    let apps = dir.join("apps.toml");
    std::fs::write(&apps, apps_toml).unwrap();
    let state = dir.join("state");
    let node = NodeProcess::start(
        &state,
        &[
            "--senders",
            senders.to_str().unwrap(),
            "--apps",
            apps.to_str().unwrap(),
        ],
        None,
    );
    (node, state, apps)
}

#[test]
fn pushed_records_reach_the_device_once_in_order_across_a_node_kill() {
    let dir = tempfile::tempdir().unwrap();
    let (key, senders) = setup(dir.path());
    let state = dir.path().join("state");
    let args = ["--senders", senders.to_str().unwrap()];
    let mut node = NodeProcess::start(&state, &args, None);
    let (code, out) = push(&state, "main", "kitchen-1", b"one\ntwo\n\nfour");
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("queued 4 records for kitchen-1 in app main: sequences 1-4"),
        "{out}"
    );
    let got = listen(&node, &key, 0, 4);
    let want: Vec<(u64, Vec<u8>)> = vec![
        (1, b"one".to_vec()),
        (2, b"two".to_vec()),
        (3, b"".to_vec()),
        (4, b"four".to_vec()),
    ];
    assert_eq!(got, want);

    // Pushed while nothing listens, the node SIGKILLed: the records were synced before push said so.
    let (code, out) = push(&state, "main", "kitchen-1", b"five\nsix\n");
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("sequences 5-6"), "{out}");
    node.signal(libc::SIGKILL);
    node.wait_exit();
    let node = NodeProcess::start(&state, &args, None);
    // The device kept heard = 4: nothing of 1–4 again, 5 and 6 once.
    let got = listen(&node, &key, 4, 2);
    assert_eq!(got, vec![(5, b"five".to_vec()), (6, b"six".to_vec())]);
    // A device that lost its heard (0) gets only what still waits: 1–6 were acknowledged and deleted.
    let (code, out) = push(&state, "main", "kitchen-1", b"seven\n");
    assert_eq!(code, 0, "{out}");
    let got = listen(&node, &key, 0, 1);
    assert_eq!(
        got.iter().map(|r| r.0).collect::<Vec<_>>(),
        vec![7],
        "{got:?}"
    );
}

/// `pure-serve records --waiting` of `state`, with `extra` arguments: its lines.
fn waiting_lines(state: &Path, extra: &[&str]) -> Vec<String> {
    let out = Command::new(bin())
        .args(["records", "--waiting", "--state"])
        .arg(state)
        .args(extra)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn records_waiting_lists_what_each_device_has_not_taken_while_the_node_runs() {
    let dir = tempfile::tempdir().unwrap();
    let (key, senders) = setup(dir.path());
    let state = dir.path().join("state");
    let node = NodeProcess::start(&state, &["--senders", senders.to_str().unwrap()], None);
    assert_eq!(waiting_lines(&state, &[]), Vec::<String>::new());
    assert_eq!(push(&state, "main", "kitchen-1", b"one\ntwo\n").0, 0);
    assert_eq!(push(&state, "main", "other", b"x\n").0, 0);
    assert_eq!(
        waiting_lines(&state, &[]),
        [
            "main\tkitchen-1\t1\tone",
            "main\tkitchen-1\t2\ttwo",
            "main\tother\t1\tx"
        ]
    );
    let json = waiting_lines(&state, &["--source", "kitchen-1", "--json"]);
    assert_eq!(json.len(), 2, "{json:?}");
    let v: serde_json::Value = serde_json::from_str(&json[1]).unwrap();
    assert_eq!(
        (
            v["app"].as_str(),
            v["to"].as_str(),
            v["seq"].as_u64(),
            v["payload"].as_str()
        ),
        (Some("main"), Some("kitchen-1"), Some(2), Some("two")),
        "{v}"
    );
    assert!(v["queued_at"].as_str().unwrap().ends_with('Z'), "{v}");
    assert!(v["expires_at"].is_null(), "{v}");
    // Once the device has them and said so, they are no longer listed; the other sender's still is.
    assert_eq!(listen(&node, &key, 0, 2).len(), 2);
    assert_eq!(
        waiting_lines(&state, &["--source", "kitchen-1"]),
        Vec::<String>::new()
    );
    assert_eq!(waiting_lines(&state, &[]), ["main\tother\t1\tx"]);
}

#[test]
fn a_record_pushed_to_a_live_listening_session_goes_out_without_waiting_for_the_device() {
    let dir = tempfile::tempdir().unwrap();
    let (key, senders) = setup(dir.path());
    let state = dir.path().join("state");
    let node = NodeProcess::start(&state, &["--senders", senders.to_str().unwrap()], None);
    let mut link = live_listening_link(&node, &key);
    let (code, out) = push(&state, "main", "kitchen-1", b"now\n");
    assert_eq!(code, 0, "{out}");
    // The device sends nothing more of its own (its LISTEN is answered and its RTO is not due for seconds);
    // the record arrives because the node sent it.
    assert_eq!(first_downs(&mut link), vec![(1, b"now".to_vec())]);
}

/// A pusher that connects and writes its request only later (past the wait the node gives a new connection's
/// request before it sleeps on it, research/052) is answered as any other, and its record queued once.
#[test]
fn a_request_written_long_after_its_connection_is_served_as_any_other() {
    let dir = tempfile::tempdir().unwrap();
    let (_key, senders) = setup(dir.path());
    let state = dir.path().join("state");
    let _node = NodeProcess::start(&state, &["--senders", senders.to_str().unwrap()], None);
    let socket = state.join("push.sock");
    let mut s = UnixStream::connect(&socket).unwrap();
    s.set_read_timeout(Some(DEADLINE)).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    s.write_all(&post_request("/push?app=main&to=kitchen-1", b"late\n"))
        .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200 "), "{answer}");
    // Queued once: the next push to the same device is numbered after it.
    let (status, json) = post_raw(&socket, "/push?app=main&to=kitchen-1", b"next\n");
    assert_eq!(status, 200, "{json}");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["first"].as_u64(), Some(2), "{v}");
}

/// Pushes on one kept-alive connection of the push socket, each `POST /push` of `records` answered before the next:
/// the answers' (status, JSON) in order.
fn pushes_on_one_connection(
    socket: &Path,
    to: &str,
    records: &[String],
) -> Vec<(u16, serde_json::Value)> {
    let stream = UnixStream::connect(socket).unwrap();
    stream.set_read_timeout(Some(DEADLINE)).unwrap();
    let mut stream = std::io::BufReader::new(stream);
    let mut answers = Vec::new();
    for r in records {
        let body = format!("{r}\n");
        let request = format!(
            "POST /push?app=main&to={to} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        stream.get_mut().write_all(request.as_bytes()).unwrap();
        answers.push(read_answer(&mut stream));
    }
    answers
}

/// One HTTP answer read off `stream`: its status and JSON body.
fn read_answer(stream: &mut std::io::BufReader<UnixStream>) -> (u16, serde_json::Value) {
    use std::io::BufRead;
    let mut status = String::new();
    stream.read_line(&mut status).unwrap();
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        stream.read_line(&mut line).unwrap();
        if line == "\r\n" {
            break;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            length = v.trim().parse().unwrap();
        }
    }
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).unwrap();
    (
        status[9..12].parse().unwrap(),
        serde_json::from_slice(&body).unwrap(),
    )
}

/// Requests written at once on one connection (pipelined): the receive loop serves the first push (research/054)
/// and hands the connection, with the requests after it, to the HTTP thread; each is answered once, in order, and
/// the pushes' records are numbered in that order. A push whose body is written later than its head, one of
/// another path and one of many lines come after it on the same connection, as a pusher may write them.
#[test]
fn requests_written_at_once_on_one_connection_are_each_answered_once_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let (_key, senders) = setup(dir.path());
    let state = dir.path().join("state");
    let _node = NodeProcess::start(&state, &["--senders", senders.to_str().unwrap()], None);
    let stream = UnixStream::connect(state.join("push.sock")).unwrap();
    stream.set_read_timeout(Some(DEADLINE)).unwrap();
    let mut stream = std::io::BufReader::new(stream);
    let push = |body: &str| {
        format!(
            "POST /push?app=main&to=kitchen-1 HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    let at_once = format!(
        "{}{}GET /nothing HTTP/1.1\r\nHost: x\r\n\r\n{}",
        push("one\n"),
        push("two\nthree\n"),
        push("four\n")
    );
    stream.get_mut().write_all(at_once.as_bytes()).unwrap();
    let late = push("five\n");
    let (head, body) = late.split_at(late.len() - 5);
    stream.get_mut().write_all(head.as_bytes()).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    stream.get_mut().write_all(body.as_bytes()).unwrap();
    let answers: Vec<_> = (0..5).map(|_| read_answer(&mut stream)).collect();
    let firsts: Vec<_> = answers
        .iter()
        .map(|(status, v)| (*status, v["first"].as_u64(), v["count"].as_u64()))
        .collect();
    assert_eq!(
        firsts,
        [
            (200, Some(1), Some(1)),
            (200, Some(2), Some(2)),
            (400, None, None),
            (200, Some(4), Some(1)),
            (200, Some(5), Some(1)),
        ],
        "{answers:?}"
    );
}

/// Pushes from several pushers at once to a live listening device, many taken into each turn (the loop busy with
/// them): each pusher is answered once per push, in the order of its pushes (its records numbered in that order),
/// none is lost or answered twice, and the device is handed every record once, in order. The answers are sent after
/// the turn's DOWN datagrams (research/049): this checks that holding them loses and reorders none.
#[test]
fn pushes_from_several_pushers_at_once_are_each_answered_in_order_and_none_is_lost() {
    const PUSHERS: usize = 4;
    const EACH: usize = 25;
    let dir = tempfile::tempdir().unwrap();
    let (key, senders) = setup(dir.path());
    let state = dir.path().join("state");
    let node = NodeProcess::start(&state, &["--senders", senders.to_str().unwrap()], None);
    // Live and listening, so that the node sends each turn's records to it as the pushes are answered.
    let _live = live_listening_link(&node, &key);
    let socket = state.join("push.sock");
    let pushers: Vec<_> = (0..PUSHERS)
        .map(|p| {
            let socket = socket.clone();
            std::thread::spawn(move || {
                let records: Vec<String> = (0..EACH).map(|k| format!("p{p} {k}")).collect();
                (
                    records.clone(),
                    pushes_on_one_connection(&socket, "kitchen-1", &records),
                )
            })
        })
        .collect();
    let mut numbered = std::collections::BTreeMap::new();
    for pusher in pushers {
        let (records, answers) = pusher.join().unwrap();
        assert_eq!(answers.len(), EACH);
        let mut last = 0;
        for (record, (status, v)) in records.iter().zip(&answers) {
            assert_eq!(*status, 200, "{v}");
            assert_eq!(v["count"].as_u64(), Some(1), "{v}");
            let seq = v["last"].as_u64().unwrap();
            assert!(
                seq > last,
                "a pusher's answers in the order of its pushes: {seq} after {last}"
            );
            last = seq;
            assert!(
                numbered.insert(seq, record.clone().into_bytes()).is_none(),
                "numbered twice: {seq}"
            );
        }
    }
    let all = (PUSHERS * EACH) as u64;
    assert_eq!(
        numbered.keys().copied().collect::<Vec<_>>(),
        (1..=all).collect::<Vec<_>>()
    );
    // A new session of the device from 0 is handed every record once, in order, as the answers numbered them.
    let got = listen(&node, &key, 0, PUSHERS * EACH);
    assert_eq!(got, numbered.into_iter().collect::<Vec<_>>());
}

#[test]
fn pushes_that_cannot_be_queued_say_why_queue_nothing_and_exit_by_kind() {
    let dir = tempfile::tempdir().unwrap();
    let (key, senders) = setup(dir.path());
    let (node, state, _apps) = node_with_apps(
        dir.path(),
        &senders,
        "[apps.main]\naccept = [\"kitchen-1\"]\n[apps.main.downlink]\nmax_records = 3\n",
    );
    let cases: [(&str, &str, &[u8], i32, &str); 5] = [
        ("main", "nobody", b"x\n", 67, "no sender \"nobody\""),
        ("nope", "kitchen-1", b"x\n", 67, "no app \"nope\""),
        (
            "main",
            "other",
            b"x\n",
            67,
            "does not accept sender \"other\"",
        ),
        ("main", "kitchen-1", b"a\nb\nc\nd\n", 65, "max_records"),
        (
            "main",
            "kitchen-1",
            &[b'z'; 1025],
            65,
            "above the downlink limit of 1024",
        ),
    ];
    for (app, to, stdin, code, words) in cases {
        let (got, out) = push(&state, app, to, stdin);
        assert_eq!(got, code, "{app} {to}: {out}");
        assert!(out.contains(words), "{app} {to}: {out}");
    }
    // Nothing of those was queued: three fit, and are 1–3.
    let (code, out) = push(&state, "main", "kitchen-1", b"a\nb\nc\n");
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("sequences 1-3"), "{out}");
    // The socket's own requests, as curl --unix-socket makes them.
    let socket = state.join("push.sock");
    let (status, body) = post_raw(&socket, "/push?app=main&to=kitchen%2D1", b"d\n");
    assert_eq!(status, 409, "{body}");
    assert!(body.contains("\"refused\":\"max_records\""), "{body}");
    let (status, body) = post_raw(&socket, "/push?app=main", b"d\n");
    assert_eq!(status, 400, "{body}");
    let (status, body) = post_raw(&socket, "/push?app=main&to=kitchen-1", b"");
    assert_eq!(
        (status, body.contains("\"count\":0")),
        (200, true),
        "{body}"
    );
    let got = listen(&node, &key, 0, 3);
    assert_eq!(got.iter().map(|r| r.0).collect::<Vec<_>>(), vec![1, 2, 3]);
    // Per app, as the operator sees them: 3 queued, 6 refused (4 + 1 + the socket's 1), 3 delivered (the device
    // acknowledged them), none waiting.
    let want = [
        ("pure_downlink_queued_total{app=\"main\"}", 3.0),
        ("pure_downlink_refused_total{app=\"main\"}", 6.0),
        ("pure_downlink_delivered_total{app=\"main\"}", 3.0),
        ("pure_downlink_waiting{app=\"main\"}", 0.0),
    ];
    let deadline = Instant::now() + DEADLINE;
    let read = || want.map(|(series, _)| node.metric(series));
    while read() != want.map(|w| Some(w.1)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(read(), want.map(|w| Some(w.1)));
    let (status, body) = post_raw(&socket, "/push?app=main&to=kitchen-1", b"d\ne\n");
    // The device acknowledged 1–3 by its LISTEN (heard 3) only if it sent one after them; either way the
    // answer is whole: queued with 4–5, or refused with nothing queued.
    assert!(status == 200 || status == 409, "{status} {body}");
    // No node: exit 69 naming the socket.
    let (code, out) = push(&dir.path().join("none"), "main", "kitchen-1", b"x\n");
    assert_eq!(code, 69, "{out}");
    assert!(out.contains("none/push.sock"), "{out}");
}

#[test]
fn the_push_socket_is_private_replaces_a_stale_one_and_goes_with_a_clean_stop() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let (_key, senders) = setup(dir.path());
    let state = dir.path().join("state");
    let args = ["--senders", senders.to_str().unwrap()];
    let mut node = NodeProcess::start(&state, &args, None);
    let socket = state.join("push.sock");
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o660);
    node.signal(libc::SIGKILL);
    node.wait_exit();
    // Left behind by the kill, both sockets: the next node replaces them.
    let dgram = state.join("push.dgram");
    assert!(socket.exists() && dgram.exists());
    let mut node = NodeProcess::start(&state, &args, None);
    let (code, out) = push(&state, "main", "kitchen-1", b"x\n");
    assert_eq!(code, 0, "{out}");
    let client = UnixDatagram::bind(dir.path().join("pusher")).unwrap();
    client.set_read_timeout(Some(DEADLINE)).unwrap();
    let (status, v) = push_datagram(&client, &dgram, b"app=main&to=kitchen-1\ny\n");
    assert_eq!((status, v["first"].as_u64()), (200, Some(2)), "{v}");
    node.signal(libc::SIGTERM);
    assert_eq!(node.wait_exit(), Some(0));
    assert!(!socket.exists(), "a clean stop removes its socket");
    assert!(!dgram.exists(), "and its datagram socket");
    // --push-socket none serves neither.
    let mut node = NodeProcess::start(
        &state,
        &[&args[..], &["--push-socket", "none"]].concat(),
        None,
    );
    assert!(!socket.exists() && !dgram.exists());
    node.signal(libc::SIGTERM);
    assert_eq!(node.wait_exit(), Some(0));
    // A file that is not a socket where the socket goes: a configuration error naming it.
    let not_socket = dir.path().join("not-a-socket");
    std::fs::write(&not_socket, "x").unwrap();
    let out = node_that_does_not_start(
        &state,
        &senders,
        &["--push-socket", not_socket.to_str().unwrap()],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{err}");
    assert!(
        err.contains("not-a-socket") && err.contains("not a socket"),
        "{err}"
    );
}

#[test]
fn a_reload_of_the_senders_file_decides_who_may_be_pushed_to() {
    let dir = tempfile::tempdir().unwrap();
    let (key, senders) = setup(dir.path());
    let state = dir.path().join("state");
    let node = NodeProcess::start(&state, &["--senders", senders.to_str().unwrap()], None);
    let (code, out) = push(&state, "main", "newcomer", b"x\n");
    assert_eq!(code, 67, "{out}");
    // `other` leaves the list, `newcomer` joins it (the same key as kitchen-1's, under another name, would be a
    // duplicate key: a key of its own).
    let public = std::fs::read_to_string(&senders).unwrap();
    let kitchen = public.lines().next().unwrap();
    std::fs::write(
        &senders,
        format!("{kitchen}\nnewcomer {}\n", keygen(dir.path(), "n").1),
    )
    .unwrap();
    let before = node.metric("pure_reloads_total").unwrap_or(0.0);
    node.signal(libc::SIGHUP);
    let deadline = Instant::now() + DEADLINE;
    while node.metric("pure_reloads_total").unwrap_or(0.0) <= before && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    // The socket's lookups follow the new list: a stale one is never trusted.
    let (code, out) = push(&state, "main", "newcomer", b"welcome\n");
    assert_eq!(code, 0, "{out}");
    let (code, out) = push(&state, "main", "other", b"x\n");
    assert_eq!(code, 67, "{out}");
    let (code, out) = push(&state, "main", "kitchen-1", b"still here\n");
    assert_eq!(code, 0, "{out}");
    assert_eq!(listen(&node, &key, 0, 1), vec![(1, b"still here".to_vec())]);
}

#[test]
fn a_reload_of_the_apps_file_applies_and_says_new_downlink_bounds() {
    let dir = tempfile::tempdir().unwrap();
    let (_key, senders) = setup(dir.path());
    let bounds = |n: u32| format!("[apps.main]\n[apps.main.downlink]\nmax_records = {n}\n");
    let (node, state, apps) = node_with_apps(dir.path(), &senders, &bounds(2));
    let (code, out) = push(&state, "main", "kitchen-1", b"a\nb\nc\n");
    assert_eq!(code, 65, "{out}");
    std::fs::write(&apps, bounds(5)).unwrap();
    node.signal(libc::SIGHUP);
    let deadline = Instant::now() + DEADLINE;
    while !node.stderr_text().contains("downlink max_records 2 → 5") && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        node.stderr_text()
            .contains("reload: app main: downlink max_records 2 → 5; records already waiting stay"),
        "{}",
        node.stderr_text()
    );
    let (code, out) = push(&state, "main", "kitchen-1", b"a\nb\nc\n");
    assert_eq!(code, 0, "{out}");
}

/// `pure-serve push` on `socket` with `stdin`: its exit status and everything it printed.
fn push_on(socket: &Path, stdin: &[u8]) -> (i32, String) {
    use std::process::Stdio;
    let mut child = Command::new(bin())
        .args(["push", "--to", "kitchen-1", "--socket"])
        .arg(socket)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    let stdin = stdin.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = input.write_all(&stdin);
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

/// Reads one request (head and a Content-Length body) from `s`, as a node does before it queues anything.
fn read_request(s: &mut UnixStream) {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let head_end = loop {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "the request ended early");
        got.extend_from_slice(&buf[..n]);
        if let Some(k) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            break k + 4;
        }
    };
    let head = String::from_utf8_lossy(&got[..head_end]).to_ascii_lowercase();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map_or(0, |v| v.trim().parse().unwrap());
    while got.len() < head_end + len {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "the body ended early");
        got.extend_from_slice(&buf[..n]);
    }
}

/// A stand-in for a node on `socket` that serves one connection with `serve`.
fn one_connection(
    socket: &Path,
    serve: impl FnOnce(UnixStream) + Send + 'static,
) -> std::thread::JoinHandle<()> {
    let _ = std::fs::remove_file(socket);
    let listener = std::os::unix::net::UnixListener::bind(socket).unwrap();
    std::thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        serve(s);
    })
}

/// Black-box findings, item 1: a node killed after it took a push and before it answered made `push` exit 69 "no
/// node answers … start the node", which the doc said meant nothing was queued, and a router pushed the record a
/// second time. Now a connection cut after the push was sent (or a node that says it does not know) is 74, "may or
/// may not be queued", apart from 69 (nothing was sent) and 75 (nothing was queued).
#[test]
fn a_push_cut_off_after_it_was_sent_may_be_queued_and_exits_74_apart_from_69_and_75() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("push.sock");
    // The whole request read, then the connection closed without an answer: as a node killed after it queued.
    let node = one_connection(&socket, |mut s| read_request(&mut s));
    let (code, out) = push_on(&socket, b"reboot\n");
    node.join().unwrap();
    assert_eq!(code, 74, "{out}");
    assert!(
        out.contains("closed the connection after the push was sent")
            && out.contains("may or may not be queued")
            && out.contains("at least once"),
        "{out}"
    );
    assert!(!out.contains("start the node"), "{out}");
    // The node answers that its store may have kept them (500): 74 too, with its words.
    let node = one_connection(&socket, |mut s| {
        read_request(&mut s);
        let body = "{\"error\":\"app main could not queue (a failed sync): the records may or may not be queued\",\
                    \"maybe_queued\":true}\n";
        let _ = write!(
            s,
            "HTTP/1.1 500 Internal Server Error\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
    });
    let (code, out) = push_on(&socket, b"reboot\n");
    node.join().unwrap();
    assert_eq!(code, 74, "{out}");
    assert!(out.contains("a failed sync"), "{out}");
    // Closed before anything of the push was read, small or large: nothing queued, 75, maybe busy.
    for body in [b"reboot\n".to_vec(), vec![b'x'; 3 << 20]] {
        let node = one_connection(&socket, drop);
        let (code, out) = push_on(&socket, &body);
        node.join().unwrap();
        assert_eq!(code, 75, "{} bytes: {out}", body.len());
        assert!(
            out.contains("nothing was queued") && out.contains("may be busy"),
            "{out}"
        );
    }
    // Nothing listens: nothing was sent, 69.
    std::fs::remove_file(&socket).unwrap();
    let (code, out) = push_on(&socket, b"reboot\n");
    assert_eq!(code, 69, "{out}");
    assert!(out.contains("nothing was sent"), "{out}");
}

/// What the push socket answers requests it does not take (black-box findings, items 5, 7 and 8): another path or
/// method is 400 with a JSON error (404 means only "no such app or sender"), a repeated `app` or `to` is refused
/// rather than the last one taken, and a body past 4 MiB is 413 with `"refused":"too_large"`; `push` refuses more
/// than 4 MiB itself (65).
#[test]
fn the_push_socket_answers_400_for_another_path_method_or_a_repeated_name() {
    let dir = tempfile::tempdir().unwrap();
    let (_key, senders) = setup(dir.path());
    let state = dir.path().join("state");
    let _node = NodeProcess::start(&state, &["--senders", senders.to_str().unwrap()], None);
    let socket = state.join("push.sock");
    let raw = |request: &[u8]| {
        let mut s = UnixStream::connect(&socket).unwrap();
        s.set_read_timeout(Some(DEADLINE)).unwrap();
        s.write_all(request).unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).unwrap();
        let status: u16 = answer[9..12].parse().unwrap();
        let body = answer.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
        (status, body)
    };
    let json_error = |body: &str| {
        serde_json::from_str::<serde_json::Value>(body)
            .ok()
            .and_then(|v| v["error"].as_str().map(str::to_string))
    };
    for request in [
        "GET /push?app=main&to=kitchen-1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        "PUT /push?app=main&to=kitchen-1 HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nConnection: close\r\n\r\nx",
        "POST /other?app=main&to=kitchen-1 HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nConnection: close\r\n\r\nx",
        "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    ] {
        let (status, body) = raw(request.as_bytes());
        assert_eq!(status, 400, "{request}: {body}");
        let why = json_error(&body).unwrap_or_else(|| panic!("{request}: not JSON: {body}"));
        assert!(
            why.contains("serves POST /push?app=APP&to=SENDER")
                && why.contains("POST /push-many?app=APP"),
            "{why}"
        );
    }
    // Not HTTP at all: the HTTP library's 400, with no body (as documented).
    let (status, _) = raw(b"GARBAGE\r\n\r\n");
    assert_eq!(status, 400);
    // A name given twice: refused whole, nothing queued for either.
    for target in [
        "/push?app=main&to=kitchen-1&to=other",
        "/push?app=main&app=main&to=kitchen-1",
    ] {
        let (status, body) = post_raw(&socket, target, b"plus\n");
        assert_eq!(status, 400, "{target}: {body}");
        assert!(
            json_error(&body).is_some_and(|w| w.contains("is given twice")),
            "{body}"
        );
    }
    // A body past 4 MiB, said by its Content-Length before it is read: 413 refused too_large.
    let (status, body) = raw(
        b"POST /push?app=main&to=kitchen-1 HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999\r\n\
          Connection: close\r\n\r\n",
    );
    assert_eq!(status, 413, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["refused"].as_str(), Some("too_large"), "{body}");
    // Nothing of those was queued: the next push is sequence 1.
    let (code, out) = push(&state, "main", "kitchen-1", b"first\n");
    assert_eq!(code, 0, "{out}");
    assert!(out.contains(": sequence 1\n"), "{out}");
    // Standard input past 4 MiB: refused by the command itself, 65, saying the limit.
    let (code, out) = push(&state, "main", "kitchen-1", &vec![b'x'; (4 << 20) + 1]);
    assert_eq!(code, 65, "{out}");
    assert!(
        out.contains("4 MiB") && out.contains("push the records in parts"),
        "{out}"
    );
}

/// Black-box findings, item 6: the 33rd connection at once was closed unanswered and `push` said "no node answers
/// … start the node" (69). It is answered 503 "busy" at once, and `push` exits 75: try again.
#[test]
fn a_connection_past_the_bound_is_answered_busy_and_push_exits_75() {
    let dir = tempfile::tempdir().unwrap();
    let (_key, senders) = setup(dir.path());
    let state = dir.path().join("state");
    let _node = NodeProcess::start(&state, &["--senders", senders.to_str().unwrap()], None);
    let socket = state.join("push.sock");
    // 32 connections that send nothing (each is held up to 10 s, the head's timeout).
    let idle: Vec<UnixStream> = (0..32)
        .map(|_| UnixStream::connect(&socket).unwrap())
        .collect();
    // Until the node has taken all 32: then one more is answered busy.
    let deadline = Instant::now() + DEADLINE;
    let (status, body) = loop {
        let (status, body) = post_raw(&socket, "/push?app=main&to=kitchen-1", b"x\n");
        if status == 503 || Instant::now() >= deadline {
            break (status, body);
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status, 503, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let why = v["error"].as_str().unwrap();
    assert!(why.contains("busy") && why.contains("32"), "{why}");
    let (code, out) = push(&state, "main", "kitchen-1", b"x\n");
    assert_eq!(code, 75, "{out}");
    assert!(
        out.contains("busy") && out.contains("nothing was queued"),
        "{out}"
    );
    assert!(!out.contains("start the node"), "{out}");
    drop(idle);
    // The bound frees with the connections.
    let deadline = Instant::now() + DEADLINE;
    let (code, out) = loop {
        let (code, out) = push(&state, "main", "kitchen-1", b"after\n");
        if code == 0 || Instant::now() >= deadline {
            break (code, out);
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(code, 0, "{out}");
}

/// Black-box findings, item 13: an empty push to an app or sender that does not exist was answered 200 (exit 0),
/// so a typo went unnoticed until records were pushed. It is checked like any push and queues nothing.
#[test]
fn an_empty_push_checks_its_app_and_sender_and_queues_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (_key, senders) = setup(dir.path());
    let state = dir.path().join("state");
    let _node = NodeProcess::start(&state, &["--senders", senders.to_str().unwrap()], None);
    let (code, out) = push(&state, "nope", "kitchen-1", b"");
    assert_eq!(code, 67, "{out}");
    assert!(out.contains("no app \"nope\""), "{out}");
    let (code, out) = push(&state, "main", "kitchen-l", b"");
    assert_eq!(code, 67, "{out}");
    assert!(out.contains("no sender \"kitchen-l\""), "{out}");
    let (code, out) = push(&state, "main", "kitchen-1", b"");
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("nothing to queue"), "{out}");
    let socket = state.join("push.sock");
    let (status, body) = post_raw(&socket, "/push?app=nope&to=kitchen-1", b"");
    assert_eq!(status, 404, "{body}");
    let (status, body) = post_raw(&socket, "/push?app=main&to=kitchen-1", b"");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"count\":0"), "{body}");
    // Nothing was queued by them: the first record is sequence 1.
    let (code, out) = push(&state, "main", "kitchen-1", b"first\n");
    assert_eq!(code, 0, "{out}");
    assert!(out.contains(": sequence 1\n"), "{out}");
    // With no node, an empty push is no longer "ok": nothing could check it.
    let (code, out) = push(&dir.path().join("none"), "main", "kitchen-1", b"");
    assert_eq!(code, 69, "{out}");
}

/// Black-box findings, item 9: a refusal by a per-sender bound says the push's own size beside what waits, names
/// the app's own table, gives the fix, and says (and answers, `expired`) what expired records the refused push
/// deleted.
#[test]
fn a_refusal_says_the_push_the_table_the_fix_and_what_it_deleted_as_expired() {
    let dir = tempfile::tempdir().unwrap();
    let (_key, senders) = setup(dir.path());
    let (_node, state, _apps) = node_with_apps(
        dir.path(),
        &senders,
        "[apps.sensors]\n[apps.sensors.downlink]\nmax_records = 3\nmax_bytes = 100\nexpiry_seconds = 1\n",
    );
    let (code, out) = push(&state, "sensors", "kitchen-1", b"a\nb\n");
    assert_eq!(code, 0, "{out}");
    std::thread::sleep(Duration::from_millis(1100));
    // The two expired; the push of 4 is refused all the same, and deleted them.
    let (code, out) = push(&state, "sensors", "kitchen-1", b"1\n2\n3\n4\n");
    assert_eq!(code, 65, "{out}");
    for words in [
        "this push has 4 records; 0 already wait for kitchen-1; at most 3 may wait",
        "max_records in [apps.sensors.downlink] of the apps file",
        "push fewer at once, wait until the device takes what waits, or raise max_records and reload",
        "this push deleted 2 of kitchen-1's records that had expired unsent",
    ] {
        assert!(out.contains(words), "{words:?} not in {out}");
    }
    let socket = state.join("push.sock");
    let (status, body) = post_raw(&socket, "/push?app=sensors&to=kitchen-1", &[b'b'; 101]);
    assert_eq!(status, 409, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (v["refused"].as_str(), v["expired"].as_u64()),
        (Some("max_bytes"), Some(0)),
        "{body}"
    );
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("this push has 101 bytes of records; 0 bytes already wait"),
        "{body}"
    );
}

/// One push datagram from `client` to the node's push datagram socket, and its answer: (status, JSON).
fn push_datagram(
    client: &UnixDatagram,
    socket: &Path,
    datagram: &[u8],
) -> (u16, serde_json::Value) {
    client.send_to(datagram, socket).unwrap();
    datagram_answer(client)
}

fn datagram_answer(client: &UnixDatagram) -> (u16, serde_json::Value) {
    let mut buf = vec![0u8; 70_000];
    let n = client.recv(&mut buf).expect("an answer datagram");
    let text = std::str::from_utf8(&buf[..n]).unwrap();
    let (status, json) = text.split_once(' ').unwrap();
    assert!(text.ends_with('\n'), "{text:?}");
    (status.parse().unwrap(), serde_json::from_str(json).unwrap())
}

#[test]
fn the_push_datagram_socket_queues_answers_each_pusher_in_order_and_reaches_a_live_device() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let (key, senders) = setup(dir.path());
    let state = dir.path().join("state");
    let args = ["--senders", senders.to_str().unwrap()];
    let mut node = NodeProcess::start(&state, &args, None);
    let socket = state.join("push.dgram");
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o660);
    let client = UnixDatagram::bind(dir.path().join("pusher")).unwrap();
    client.set_read_timeout(Some(DEADLINE)).unwrap();

    // A live listening session: the pushed record goes out without waiting for the device.
    let mut link = live_listening_link(&node, &key);
    let (status, v) = push_datagram(&client, &socket, b"app=main&to=kitchen-1\nnow\n");
    assert_eq!(
        (status, v["first"].as_u64(), v["last"].as_u64()),
        (200, Some(1), Some(1)),
        "{v}"
    );
    assert_eq!(first_downs(&mut link), vec![(1, b"now".to_vec())]);

    // Four pushes at once: the middle ones are answered at once (one malformed, by the socket; one to no such
    // sender, by the node), the others once synced; the pusher gets the answers in the order of its pushes all the
    // same (an outside tester saw a 400 overtake an earlier push's 200).
    client
        .send_to(b"app=main&to=kitchen-1\na\nb", &socket)
        .unwrap();
    client.send_to(b"app=main&x=1\nx\n", &socket).unwrap();
    client.send_to(b"app=main&to=nobody\nx\n", &socket).unwrap();
    client
        .send_to(b"app=main&to=kitchen-1\nc\n", &socket)
        .unwrap();
    let (s1, v1) = datagram_answer(&client);
    let (s2, v2) = datagram_answer(&client);
    let (s3, v3) = datagram_answer(&client);
    let (s4, v4) = datagram_answer(&client);
    assert_eq!(
        (s1, v1["first"].as_u64(), v1["count"].as_u64()),
        (200, Some(2), Some(2)),
        "{v1}"
    );
    assert_eq!(s2, 400, "{v2}");
    assert_eq!(s3, 404, "{v3}");
    assert!(v3["error"].as_str().unwrap().contains("nobody"), "{v3}");
    assert_eq!((s4, v4["first"].as_u64()), (200, Some(4)), "{v4}");
    // A first line past 1,024 bytes is refused without being repeated back whole.
    let mut long = b"app=".to_vec();
    long.resize(5000, b'\x01');
    long.extend_from_slice(b"\nx\n");
    let (status, v) = push_datagram(&client, &socket, &long);
    assert_eq!(status, 400, "{v}");
    assert!(v["error"].as_str().unwrap().len() < 500, "{v}");

    // Malformed and too large: answered, nothing queued.
    let (status, v) = push_datagram(&client, &socket, b"to=kitchen-1\nx\n");
    assert_eq!(status, 400, "{v}");
    assert!(
        v["error"].as_str().unwrap().contains("app=APP&to=SENDER"),
        "{v}"
    );
    let mut big = b"app=main&to=kitchen-1\n".to_vec();
    big.resize(65_537, b'x');
    let (status, v) = push_datagram(&client, &socket, &big);
    assert_eq!(
        (status, v["refused"].as_str()),
        (413, Some("too_large")),
        "{v}"
    );
    assert!(v["error"].as_str().unwrap().contains("65536"), "{v}");

    // A pusher that did not bind gets no answer, but its push is queued: the next one is numbered after it.
    let unbound = UnixDatagram::unbound().unwrap();
    unbound
        .send_to(b"app=main&to=kitchen-1\nunseen\n", &socket)
        .unwrap();
    let (status, v) = push_datagram(&client, &socket, b"app=main&to=kitchen-1\nseen\n");
    assert_eq!((status, v["first"].as_u64()), (200, Some(6)), "{v}");

    let got = listen(&node, &key, 1, 5);
    let seqs: Vec<u64> = got.iter().map(|r| r.0).collect();
    assert_eq!(seqs, vec![2, 3, 4, 5, 6], "{got:?}");
    assert_eq!(got[3].1, b"unseen".to_vec());

    // Pushes still in the socket's queue when the node stops are answered 503, the ones it took as usual: the node
    // is stopped (SIGSTOP) with three pushes sent, then told to stop, then let go.
    node.signal(libc::SIGSTOP);
    for k in 0..3 {
        client
            .send_to(
                format!("app=main&to=kitchen-1\nlate {k}\n").as_bytes(),
                &socket,
            )
            .unwrap();
    }
    node.signal(libc::SIGTERM);
    node.signal(libc::SIGCONT);
    let answers: Vec<(u16, serde_json::Value)> = (0..3).map(|_| datagram_answer(&client)).collect();
    assert_eq!(node.wait_exit(), Some(0));
    assert!(!socket.exists(), "a clean stop removes its socket");
    let mut queued = Vec::new();
    for (k, (status, v)) in answers.iter().enumerate() {
        match status {
            200 => queued.push(format!("main\tkitchen-1\t{}\tlate {k}", v["first"])),
            503 => assert!(v["error"].as_str().unwrap().contains("stopping"), "{v}"),
            _ => panic!("{status} {v}"),
        }
    }
    // What was answered 200 waits; nothing else of them does.
    let late: Vec<String> = waiting_lines(&state, &[])
        .into_iter()
        .filter(|l| l.contains("late"))
        .collect();
    assert_eq!(late, queued);
}

#[test]
fn a_push_socket_named_dgram_keeps_its_datagram_socket_apart_and_one_path_for_both_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (_key, senders) = setup(dir.path());
    let state = dir.path().join("state");
    let stream = dir.path().join("x.dgram");
    let node = NodeProcess::start(
        &state,
        &[
            "--senders",
            senders.to_str().unwrap(),
            "--push-socket",
            stream.to_str().unwrap(),
        ],
        None,
    );
    assert!(dir.path().join("x.dgram.dgram").exists());
    drop(node);
    let out = node_that_does_not_start(
        &state,
        &senders,
        &["--push-socket", "/tmp/x", "--push-datagrams", "/tmp/x"],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{err}");
    assert!(err.contains("push socket's own path"), "{err}");
}

/// `pure-serve push --many` on the node of `state`, standard input `stdin`: (exit status, stdout, stderr).
fn push_many(state: &Path, app: &str, stdin: &[u8]) -> (i32, String, String) {
    let out = ops_util::push_command(state, &["--many", "--app", app], stdin);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_push_of_many_queues_each_line_for_its_sender_in_order_and_says_what_became_of_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let (key, senders) = setup(dir.path());
    let state = dir.path().join("state");
    let node = NodeProcess::start(&state, &["--senders", senders.to_str().unwrap()], None);
    let too_large = format!("other {}\n", "a".repeat(1_050));
    let body = [
        "kitchen-1 one\n",
        "other x\n",
        "kitchen-1 two\n",
        "nobody hi\n",
        "garbage\n",
        &too_large,
        "kitchen-1 three",
    ]
    .concat();
    let (code, out, err) = push_many(&state, "main", body.as_bytes());
    assert_eq!(code, 65, "{out}{err}");
    assert_eq!(
        out.lines().next(),
        Some("queued 4 of 7 lines in app main"),
        "{out}"
    );
    assert!(
        err.contains("line 4: not_found (nobody): no sender \"nobody\""),
        "{err}"
    );
    assert!(
        err.contains("line 5: malformed (): a line is SENDER RECORD"),
        "{err}"
    );
    assert!(err.contains("line 6: refused (other): "), "{err}");
    assert!(err.contains("above the downlink limit"), "{err}");
    assert!(
        err.contains(
            "3 of 7 lines not queued: 1 refused by a bound, 1 to no such sender or app, 1 malformed"
        ),
        "{err}"
    );
    assert_eq!(
        waiting_lines(&state, &[]),
        [
            "main\tkitchen-1\t1\tone",
            "main\tkitchen-1\t2\ttwo",
            "main\tkitchen-1\t3\tthree",
            "main\tother\t1\tx"
        ]
    );
    let got = listen(&node, &key, 0, 3);
    assert_eq!(
        got,
        [
            (1, b"one".to_vec()),
            (2, b"two".to_vec()),
            (3, b"three".to_vec())
        ]
    );

    // Past several batches of lines (2,048 each), to two senders in turn: each line is a push of its own, so each sender's
    // bound (max_records, 1,024 by default) refuses its lines past it, and the answer counts them all.
    let many: String = (0..9_000)
        .map(|i| format!("{} r{i}\n", if i % 2 == 0 { "kitchen-1" } else { "other" }))
        .collect();
    let (code, out, err) = push_many(&state, "main", many.as_bytes());
    assert_eq!(code, 65, "{out}{err}");
    // kitchen-1 took what it was handed, so 1,024 may wait for it again; `other` has one waiting already.
    assert_eq!(
        out.lines().next(),
        Some("queued 2047 of 9000 lines in app main"),
        "{out}"
    );
    assert!(err.contains("… and 6853 more lines not queued"), "{err}");
    assert!(err.contains("6953 refused by a bound"), "{err}");
    let waiting = waiting_lines(&state, &["--source", "kitchen-1"]);
    assert_eq!(waiting.len(), 1_024);
    assert_eq!(waiting[0], "main\tkitchen-1\t4\tr0");
    assert_eq!(waiting[1_023], "main\tkitchen-1\t1027\tr2046");

    // The first 100 lines not queued, in order: lines found malformed at once once came before lines refused
    // when their batch was answered, and the first of those were left out (an outside audit).
    let mut body = String::new();
    for i in 1..=60 {
        body.push_str(&format!("nobody-{i} x\n"));
    }
    for _ in 61..=120 {
        body.push_str("nospace\n");
    }
    let (code, _, err) = push_many(&state, "main", body.as_bytes());
    assert_eq!(code, 65, "{err}");
    let listed: Vec<u64> = err
        .lines()
        .filter_map(|l| l.strip_prefix("line ")?.split(':').next()?.parse().ok())
        .collect();
    assert_eq!(listed, (1..=100).collect::<Vec<_>>(), "{err}");
    assert!(err.contains("… and 20 more lines not queued"), "{err}");

    // Over HTTP as any client makes it: an app that is not there is each line's outcome; a `to` is refused.
    let socket = state.join("push.sock");
    let (status, body) = post_raw(&socket, "/push-many?app=nope", b"other x\n");
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["outcomes"]["not_found"], 1, "{v}");
    assert!(
        v["problems"][0]["error"]
            .as_str()
            .unwrap()
            .contains("no app \"nope\""),
        "{v}"
    );
    let (status, body) = post_raw(&socket, "/push-many?app=main&to=other", b"other x\n");
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("not from to="), "{body}");
}

#[test]
fn a_push_to_all_queues_the_records_for_every_sender_the_app_accepts_and_passes_over_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let (key, senders) = setup(dir.path());
    let (node, state, _apps) = node_with_apps(
        dir.path(),
        &senders,
        "[apps.main]\naccept = [\"kitchen-1\"]\n",
    );
    let out = ops_util::push_command(&state, &["--to-all", "--app", "main"], b"cfg=1\ncfg=2\n");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        said.trim(),
        "queued for 1 of the 1 senders app main accepts (1 it does not accept passed over)"
    );
    assert_eq!(
        waiting_lines(&state, &[]),
        ["main\tkitchen-1\t1\tcfg=1", "main\tkitchen-1\t2\tcfg=2"]
    );
    assert_eq!(
        listen(&node, &key, 0, 2),
        [(1, b"cfg=1".to_vec()), (2, b"cfg=2".to_vec())]
    );
    // No record is refused before anything is pushed.
    let (status, body) = post_raw(&state.join("push.sock"), "/push-all?app=main", b"");
    assert_eq!(status, 400, "{body}");
    // An app the node does not have: said once, exit 67 as for one push (an outside audit saw one not_found line
    // per sender, exit 65).
    let out = ops_util::push_command(&state, &["--to-all", "--app", "nope"], b"cfg=1\n");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(67), "{out:?}");
    assert_eq!(err.matches("no app \"nope\"").count(), 1, "{err}");
}
