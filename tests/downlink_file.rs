//! A file pushed to many devices as pieces (docs/downlink.md, "Pushing a file"), through real processes:
//! `pure-serve push --file` stores it once in the app's SQLite file however many senders it goes to, each device over
//! real UDP is handed every piece once and in order (also across a SIGKILL of the node in the middle of its
//! delivery), and the stored file goes when the last device has it. Bounds refuse a sender's push whole.

#[path = "ops_util/mod.rs"]
mod ops_util;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use ops_util::{DEADLINE, NodeProcess, bin, keygen, push_command};
use pure_serve::keys;
use pure_serve::sender::UdpLink;

/// Bytes that are not the same from piece to piece, so a piece out of place is found.
fn file_bytes(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 + i / 1024) as u8).collect()
}

/// (blob rows, their lengths, range rows) of the app's store, read beside the running node.
fn stored(state: &Path) -> (Vec<i64>, usize) {
    let db = rusqlite::Connection::open_with_flags(
        state.join("apps").join("main.sqlite"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    let mut q = db
        .prepare("SELECT LENGTH(bytes) FROM down_blob_bytes ORDER BY id")
        .unwrap();
    let blobs = q
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let ranges: i64 = db
        .query_row("SELECT COUNT(*) FROM down_ranges", [], |r| r.get(0))
        .unwrap();
    (blobs, ranges as usize)
}

/// Waits (within the deadline) until the store holds no blob and no range: the last acknowledgement's turn has
/// committed.
fn until_nothing_stored(state: &Path) -> (Vec<i64>, usize) {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let now = stored(state);
        if (now.0.is_empty() && now.1 == 0) || Instant::now() > deadline {
            return now;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

fn link_of(node: &NodeProcess, key: &Path) -> UdpLink {
    let identity = keys::read_identity(key).unwrap();
    let public = keys::parse_public_key(&node.public_key).unwrap();
    UdpLink::connect(identity, public, node.link).unwrap()
}

/// A device listening on `main` from `heard`, handed records until it has `want` (or the deadline); with `ack`,
/// it then acknowledges them and takes what came meanwhile.
fn listen(
    node: &NodeProcess,
    key: &Path,
    heard: u64,
    want: usize,
    ack: bool,
) -> Vec<(u64, Vec<u8>)> {
    let mut link = link_of(node, key);
    link.listen("main", heard).unwrap();
    let mut got = Vec::new();
    let deadline = Instant::now() + DEADLINE;
    while got.len() < want && Instant::now() < deadline {
        for r in link.receive(deadline).unwrap() {
            got.push((r.seq, r.payload));
        }
    }
    if ack {
        let outcome = link.deliver(Some(DEADLINE)).unwrap();
        assert_eq!(outcome.unacked, 0);
        got.extend(
            link.receive(Instant::now())
                .unwrap()
                .into_iter()
                .map(|r| (r.seq, r.payload)),
        );
    }
    got
}

fn push_file(state: &Path, file: &Path, extra: &[&str]) -> (i32, String, String) {
    let out = push_command(
        state,
        &[&["--app", "main", "--file", file.to_str().unwrap()], extra].concat(),
        b"",
    );
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

fn post_raw(socket: &Path, target: &str, body: &[u8]) -> (u16, String) {
    let mut s = UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(DEADLINE)).unwrap();
    let mut request = format!(
        "POST {target} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(body);
    s.write_all(&request).unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    let status = answer[9..12].parse().unwrap();
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    (status, body)
}

#[test]
fn a_file_pushed_to_three_devices_is_stored_once_and_each_gets_every_piece_once_in_order_across_a_node_kill()
 {
    let dir = tempfile::tempdir().unwrap();
    let devices: Vec<(std::path::PathBuf, String)> = (0..3)
        .map(|k| keygen(dir.path(), &format!("dev-{k}")))
        .collect();
    let senders = dir.path().join("senders");
    let mut list = String::new();
    for (k, (_, public)) in devices.iter().enumerate() {
        list.push_str(&format!("dev-{k} {public}\n"));
    }
    std::fs::write(&senders, list).unwrap();
    let state = dir.path().join("state");
    let args = ["--senders", senders.to_str().unwrap()];
    let mut node = NodeProcess::start(&state, &args, None);
    let bytes = file_bytes(20_000);
    let file = dir.path().join("firmware.bin");
    std::fs::write(&file, &bytes).unwrap();
    // A record ahead of the file for dev-0: pieces are numbered after it, and read among records in order.
    let (code, out) = ops_util::push(&state, "main", "dev-0", b"before\n");
    assert_eq!(code, 0, "{out}");

    let (code, out, err) = push_file(&state, &file, &["--to", "dev-0,dev-1,dev-2"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("(20000 bytes, 20 pieces of at most 1024) for 3 of the 3 senders in app main"),
        "{out}"
    );
    let (blobs, ranges) = stored(&state);
    assert_eq!(blobs, [20_000], "stored once");
    assert_eq!(ranges, 3);
    // `records --waiting` lists each piece as a record, saying which piece of which blob it is.
    let waiting = Command::new(bin())
        .args(["records", "--waiting", "--source", "dev-2", "--state"])
        .arg(&state)
        .output()
        .unwrap();
    assert!(waiting.status.success(), "{waiting:?}");
    let lines: Vec<String> = String::from_utf8_lossy(&waiting.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(lines.len(), 20, "{lines:?}");
    assert!(
        lines[0].starts_with("main\tdev-2\t1\t(piece 0 of blob "),
        "{lines:?}"
    );
    assert!(lines[19].ends_with(", 544 bytes)"), "{lines:?}");

    // dev-0: its record, then the 20 pieces, each once, in order, reassembling the file.
    let got = listen(&node, &devices[0].0, 0, 21, true);
    let seqs: Vec<u64> = got.iter().map(|r| r.0).collect();
    assert_eq!(seqs, (1..=21).collect::<Vec<u64>>());
    assert_eq!(got[0].1, b"before");
    assert_eq!(
        got[1..]
            .iter()
            .flat_map(|r| r.1.clone())
            .collect::<Vec<u8>>(),
        bytes
    );

    // dev-1 takes 7 pieces, acknowledges them (its next LISTEN says 7), and the node is killed.
    let mut link = link_of(&node, &devices[1].0);
    link.listen("main", 0).unwrap();
    let mut first = Vec::new();
    let deadline = Instant::now() + DEADLINE;
    while first.len() < 7 && Instant::now() < deadline {
        for r in link.receive(deadline).unwrap() {
            first.push((r.seq, r.payload));
        }
    }
    let heard = first.last().map_or(0, |r| r.0);
    assert!(heard >= 7, "{heard}");
    drop(link);
    node.signal(libc::SIGKILL);
    node.wait_exit();
    let node = NodeProcess::start(&state, &args, None);
    // It goes on after what it kept: nothing again, nothing skipped.
    let rest = listen(&node, &devices[1].0, heard, 20 - heard as usize, true);
    let seqs: Vec<u64> = rest.iter().map(|r| r.0).collect();
    assert_eq!(seqs, (heard + 1..=20).collect::<Vec<u64>>());
    let whole: Vec<u8> = first
        .iter()
        .chain(rest.iter())
        .flat_map(|r| r.1.clone())
        .collect();
    assert_eq!(whole, bytes);
    assert_eq!(stored(&state).0, [20_000], "dev-2 still waits for it");

    let got = listen(&node, &devices[2].0, 0, 20, true);
    assert_eq!(
        got.iter().flat_map(|r| r.1.clone()).collect::<Vec<u8>>(),
        bytes
    );
    assert_eq!(
        until_nothing_stored(&state),
        (vec![], 0),
        "deleted once the last device has it"
    );
}

#[test]
fn a_file_past_a_bound_is_refused_whole_and_bad_pushes_of_a_file_say_why() {
    let dir = tempfile::tempdir().unwrap();
    let (_, a) = keygen(dir.path(), "a");
    let (_, b) = keygen(dir.path(), "b");
    let (_, c) = keygen(dir.path(), "c");
    let senders = dir.path().join("senders");
    std::fs::write(&senders, format!("a {a}\nb {b}\nc {c}\n")).unwrap();
    let apps = dir.path().join("apps.toml");
    std::fs::write(
        &apps,
        "[apps.main]\naccept = [\"a\", \"b\"]\n[apps.main.downlink]\nmax_records = 10\n",
    )
    .unwrap();
    let state = dir.path().join("state");
    let _node = NodeProcess::start(
        &state,
        &[
            "--senders",
            senders.to_str().unwrap(),
            "--apps",
            apps.to_str().unwrap(),
        ],
        None,
    );
    let file = dir.path().join("image.bin");
    std::fs::write(&file, file_bytes(5000)).unwrap();
    // 20 pieces of 250 bytes pass max_records (10) for every sender: refused whole, nothing stored.
    let (code, out, err) = push_file(&state, &file, &["--to-all", "--piece-size", "250"]);
    assert_eq!(code, 65, "{out}{err}");
    assert!(
        out.contains("for 0 of the 2 senders app main accepts (1 it does not accept passed over)"),
        "{out}"
    );
    assert!(
        err.contains("this push has 20 records") && err.contains("max_records"),
        "{err}"
    );
    assert_eq!(stored(&state), (vec![], 0));
    // 5 pieces of 1024 pass no bound: queued for both senders the app accepts, stored once.
    let (code, out, err) = push_file(&state, &file, &["--to-all"]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(stored(&state), (vec![5000], 2));
    // A sender not listed, beside one that is: queued for the one, and the exit status is the worst outcome's,
    // as for a push of many.
    let (code, out, err) = push_file(&state, &file, &["--to", "a,nobody"]);
    assert_eq!(code, 65, "{out}{err}");
    assert!(out.contains("for 1 of the 2 senders"), "{out}");
    assert!(err.contains("sender 2: not_found (nobody)"), "{err}");
    // 5 + 5 wait for a now: a third push is refused for it, all or nothing, and stores nothing.
    let (code, _, err) = push_file(&state, &file, &["--to", "a"]);
    assert_eq!(code, 65, "{err}");
    assert!(err.contains("max_records"), "{err}");
    assert_eq!(stored(&state), (vec![5000, 5000], 3));

    let empty = dir.path().join("empty.bin");
    std::fs::write(&empty, b"").unwrap();
    let (code, _, err) = push_file(&state, &empty, &["--to", "a"]);
    assert_eq!(code, 65, "{err}");
    assert!(err.contains("empty.bin is empty"), "{err}");
    let (code, _, err) = push_file(&state, &dir.path().join("missing.bin"), &["--to", "a"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("cannot open --file") && err.contains("missing.bin"),
        "{err}"
    );
    let (code, _, err) = push_file(&state, &file, &["--to", "a", "--piece-size", "1025"]);
    assert_eq!(code, 2, "{err}");

    let socket = state.join("push.sock");
    for (target, body, status, words) in [
        (
            "/push-file?app=main&to=a",
            &b""[..],
            400,
            "the file is empty",
        ),
        (
            "/push-file?app=main&to=a&piece_size=2000",
            &b"x"[..],
            400,
            "from 1 to 1024",
        ),
        ("/push-file?app=main", &b"x"[..], 400, "names its senders"),
        ("/push-file?app=nope&to=a", &b"x"[..], 200, "not_found"),
    ] {
        let (got, body) = post_raw(&socket, target, body);
        assert_eq!(got, status, "{target}: {body}");
        assert!(body.contains(words), "{target}: {body}");
    }
}
