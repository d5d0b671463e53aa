//! The device side of downlink through real processes (docs/downlink.md, "Receiving on a device"): `pure-serve send
//! --listen` prints what `pure-serve push` queued, once and in order; its heard file carries that across runs and
//! across a SIGKILL of the device command; with `--stay` it prints records pushed while it is awake.

#[path = "ops_util/mod.rs"]
mod ops_util;

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use ops_util::{DEADLINE, NodeProcess, bin, keygen, output_within, records};

fn push(state: &Path, to: &str, stdin: &[u8]) {
    let (code, out) = ops_util::push(state, "main", to, stdin);
    assert_eq!(code, 0, "push: {out}");
}

struct Device {
    key: PathBuf,
    heard: PathBuf,
}

impl Device {
    fn command(&self, node: &NodeProcess, extra: &[&str]) -> Command {
        self.command_to(node, node.link, extra)
    }

    /// The device command sending to `to` (a relay in front of the node) instead of the node's link address.
    fn command_to(&self, node: &NodeProcess, to: SocketAddr, extra: &[&str]) -> Command {
        let mut cmd = Command::new(bin());
        cmd.arg("send")
            .arg("--key")
            .arg(&self.key)
            .args(["--node", &node.public_key, "--to", &to.to_string()])
            .args(["--listen", "main", "--heard-file"])
            .arg(&self.heard)
            .args(extra);
        cmd
    }

    /// One run with nothing to send: (stdout, stderr), after checking it exited 0.
    fn run(&self, node: &NodeProcess) -> (String, String) {
        let out = output_within(&mut self.command(node, &[]));
        let text = (
            String::from_utf8(out.stdout).unwrap(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        );
        assert!(out.status.success(), "{text:?}");
        text
    }

    fn kept(&self) -> u64 {
        std::fs::read_to_string(&self.heard)
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }

    /// A run that stays awake, its standard output read line by line as it comes.
    fn spawn(&self, node: &NodeProcess, extra: &[&str]) -> (Child, mpsc::Receiver<String>) {
        let mut child = self
            .command(node, extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let (tx, rx) = mpsc::channel();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        (child, rx)
    }
}

fn setup(dir: &Path) -> (Device, PathBuf) {
    let (key, public) = keygen(dir, "dev");
    let senders = dir.join("senders");
    std::fs::write(&senders, format!("kitchen-1 {public}\n")).unwrap();
    (
        Device {
            key,
            heard: dir.join("kitchen-1.heard"),
        },
        senders,
    )
}

#[test]
fn send_listen_prints_each_pushed_record_once_in_order_and_its_heard_file_carries_that_across_runs()
{
    let dir = tempfile::tempdir().unwrap();
    let (device, senders) = setup(dir.path());
    let state = dir.path().join("state");
    let node = NodeProcess::start(&state, &["--senders", senders.to_str().unwrap()], None);
    push(&state, "kitchen-1", b"rate=10\nreboot\n\nlast one\n");
    let (out, err) = device.run(&node);
    assert_eq!(out, "rate=10\nreboot\n\nlast one\n", "{err}");
    assert!(
        err.contains("printed 4 downlink records of app main; heard 4"),
        "{err}"
    );
    assert_eq!(device.kept(), 4);

    // Again: nothing is printed twice.
    let (out, err) = device.run(&node);
    assert_eq!(out, "", "{err}");
    assert_eq!(device.kept(), 4);

    // Sending and listening in one run: the uplink records are stored, the downlink printed, and stdout is the
    // downlink's alone.
    push(&state, "kitchen-1", b"five\n");
    let mut child = device
        .command(&node, &[])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"up-1\nup-2\n")
        .unwrap();
    let done = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&done.stderr);
    assert!(done.status.success(), "{err}");
    assert_eq!(String::from_utf8_lossy(&done.stdout), "five\n", "{err}");
    assert!(err.contains("stored 2 records for app main"), "{err}");
    let stored: Vec<String> = records(&state).into_iter().map(|r| r.2).collect();
    assert_eq!(stored, ["up-1", "up-2"]);
    assert_eq!(device.kept(), 5);

    // The heard file lost: what the earlier runs acknowledged was deleted by the node, so nothing comes again.
    std::fs::remove_file(&device.heard).unwrap();
    let (out, err) = device.run(&node);
    assert_eq!(out, "", "{err}");

    // A heard file that is not a number: the run stops before it asks, naming the file and the fix.
    std::fs::write(&device.heard, "five\n").unwrap();
    let out = output_within(&mut device.command(&node, &[]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("kitchen-1.heard line 1") && err.contains("delete the file"),
        "{err}"
    );

    // An app the node does not host: refused, said so, exit 1.
    let out = output_within(
        Command::new(bin())
            .arg("send")
            .arg("--key")
            .arg(&device.key)
            .args(["--node", &node.public_key, "--to", &node.link.to_string()])
            .args(["--listen", "nope"]),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("the node refused app nope (no such app on the node); nothing was printed"),
        "{err}"
    );
    // Said once: not also "printed 0 downlink records of app nope" before it.
    assert!(!err.contains("printed 0"), "{err}");
}

#[test]
fn send_listen_stay_prints_records_pushed_while_it_is_awake() {
    let dir = tempfile::tempdir().unwrap();
    let (device, senders) = setup(dir.path());
    let state = dir.path().join("state");
    // Sessions kept for an hour, so the device's stays live however slow the machine.
    let node = NodeProcess::start(
        &state,
        &[
            "--senders",
            senders.to_str().unwrap(),
            "--link-idle-ms",
            "3600000",
        ],
        None,
    );
    push(&state, "kitchen-1", b"waiting\n");
    // It asks only every hour: what is pushed later reaches it within the test's deadline only because the node
    // sends it to the live session.
    let (mut child, lines) = device.spawn(&node, &["--stay", "forever", "--ask-every", "3600"]);
    assert_eq!(lines.recv_timeout(DEADLINE).unwrap(), "waiting");
    for i in 0..3 {
        let record = format!("pushed-{i}");
        push(&state, "kitchen-1", format!("{record}\n").as_bytes());
        assert_eq!(
            lines.recv_timeout(DEADLINE),
            Ok(record),
            "a pushed record waits, as if for the device's next ask"
        );
    }
    // The heard file follows what was printed.
    let deadline = Instant::now() + DEADLINE;
    while device.kept() != 4 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(device.kept(), 4);
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn a_device_command_killed_mid_flow_goes_on_from_its_heard_file_and_skips_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (device, senders) = setup(dir.path());
    let state = dir.path().join("state");
    let node = NodeProcess::start(&state, &["--senders", senders.to_str().unwrap()], None);
    // Records of 1000 bytes: one per answer, so the flow takes many round trips and the kill lands inside it.
    let all: Vec<String> = (0..300)
        .map(|i| format!("{i:04}{}", "x".repeat(996)))
        .collect();
    push(
        &state,
        "kitchen-1",
        format!("{}\n", all.join("\n")).as_bytes(),
    );
    // Its standard output is read 40 lines and then not until it is killed: once the pipe is full the command
    // waits to print, so the kill lands inside the flow however fast the records come (version 1.2 sends many
    // an answer).
    let mut child = device
        .command(&node, &["--stay", "forever"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (tx, lines) = mpsc::channel();
    let (go_on_tx, go_on) = mpsc::channel::<()>();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for (n, line) in BufReader::new(stdout).lines().enumerate() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
            if n + 1 == 40 {
                let _ = go_on.recv();
            }
        }
    });
    let mut first = Vec::new();
    while first.len() < 40 {
        first.push(lines.recv_timeout(DEADLINE).unwrap());
    }
    child.kill().unwrap();
    child.wait().unwrap();
    go_on_tx.send(()).unwrap();
    first.extend(lines.iter());
    // What the killed run printed is a prefix of the records, not all of them; its heard file is at most that far.
    assert!(first.len() < all.len(), "the kill came after the flow");
    assert_eq!(first[..], all[..first.len()]);
    let kept = device.kept() as usize;
    assert!(kept <= first.len(), "kept {kept}, printed {}", first.len());
    // The next run prints exactly what comes after the kept sequence: a record printed after the last keep comes
    // again (it was never kept as heard), none is skipped.
    let (out, err) = device.run(&node);
    let second: Vec<&str> = out.lines().collect();
    assert_eq!(second.len(), all.len() - kept, "{err}");
    assert!(second.iter().zip(&all[kept..]).all(|(a, b)| a == b));
    assert_eq!(device.kept(), 300);
}

/// What the outside testers found could lose or double a record on the device side (docs/downlink.md, "Receiving
/// on a device"): a standard output that goes nowhere, a handler that fails, and two runs on one heard file.
#[test]
fn a_record_is_handed_over_only_where_it_is_kept_and_one_heard_file_serves_one_run_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let (device, senders) = setup(dir.path());
    let state = dir.path().join("state");
    let node = NodeProcess::start(&state, &["--senders", senders.to_str().unwrap()], None);
    push(&state, "kitchen-1", b"one\ntwo\nthree\n");

    // Standard output is /dev/null (as when it was closed): refused before anything is acknowledged.
    let out = device
        .command(&node, &[])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("/dev/null") && err.contains("--exec"), "{err}");

    // --exec: each record handed to the handler; kept as heard only once it exits 0.
    let got = dir.path().join("handled");
    let handler = format!(
        "cat >> {0}; echo \" $PURE_APP $PURE_SEQ\" >> {0}; [ \"$PURE_SEQ\" != 5 ]",
        got.display()
    );
    let out = output_within(&mut device.command(&node, &["--exec", &handler]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!(out.stdout, b"", "nothing printed with --exec");
    assert!(
        err.contains("handed 3 downlink records of app main to"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(&got).unwrap(),
        "one main 1\ntwo main 2\nthree main 3\n"
    );
    assert_eq!(device.kept(), 3);

    // The handler fails on record 5: the run stops, 4 is kept, and 5 comes again to the next run, once.
    push(&state, "kitchen-1", b"four\nfive\nsix\n");
    let out = output_within(&mut device.command(&node, &["--exec", &handler]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("failed") && err.contains("downlink record 5") && err.contains("again"),
        "{err}"
    );
    assert_eq!(device.kept(), 4);
    let (out, err) = device.run(&node);
    assert_eq!(out, "five\nsix\n", "{err}");
    assert!(err.contains("printed 2 downlink records"), "{err}");

    // Two runs on one heard file: the second is refused while the first holds it, and works once it ended.
    push(&state, "kitchen-1", b"seven\n");
    let (mut first, lines) = device.spawn(&node, &["--stay", "forever"]);
    // Printed: the first run holds the file.
    assert_eq!(lines.recv_timeout(DEADLINE).unwrap(), "seven");
    let lock = format!("{}.lock", device.heard.display());
    let out = output_within(&mut device.command(&node, &[]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("in use by another") && err.contains(&lock),
        "{err}"
    );
    first.kill().unwrap();
    first.wait().unwrap();
    device.run(&node);
}

/// A heard file that cannot be made stops the run before it asks, naming the file (not "kept in" a path that does
/// not exist).
#[test]
fn a_heard_file_that_cannot_be_made_stops_the_run_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let (mut device, senders) = setup(dir.path());
    device.heard = dir.path().join("no-such-dir").join("main.heard");
    let state = dir.path().join("state");
    let node = NodeProcess::start(&state, &["--senders", senders.to_str().unwrap()], None);
    let out = output_within(&mut device.command(&node, &[]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("no-such-dir/main.heard"), "{err}");
    assert!(!err.contains("kept in"), "{err}");
}

/// A turn that only reads downlink for a device's LISTENs is answered once committed, without a sync of its own
/// (docs/store.md, "Downlink"): a device draining records one per answer costs the node no sync per record; a
/// LISTEN that raises the flow's next number (the device has more than the node knows of) is synced before its
/// answer, so a push after a power cut cannot be numbered below what the device has.
#[test]
fn draining_records_costs_no_sync_per_answer_and_a_raised_number_is_synced_first() {
    let dir = tempfile::tempdir().unwrap();
    let (device, senders) = setup(dir.path());
    let state = dir.path().join("state");
    let node = NodeProcess::start(&state, &["--senders", senders.to_str().unwrap()], None);
    let syncs = || {
        node.metric("pure_store_syncs_total")
            .expect("pure_store_syncs_total")
    };
    // 40 records of 1000 bytes: one per answer of a 1200-byte room.
    let records: Vec<String> = (0..40)
        .map(|i| format!("{i:04}{}", "x".repeat(996)))
        .collect();
    push(&state, "kitchen-1", (records.join("\n") + "\n").as_bytes());
    let before = syncs();
    let (out, err) = device.run(&node);
    assert_eq!(out, records.join("\n") + "\n", "{err}");
    assert_eq!(device.kept(), 40);
    let drained = syncs() - before;
    assert!(
        drained <= 2.0,
        "40 answers of LISTENs alone took {drained} syncs"
    );

    // A device whose heard file says 100 (the node lost its queue): its LISTEN raises the flow's next number,
    // synced before the answer, and the next push is numbered above what the device has.
    std::fs::write(&device.heard, "100\n").unwrap();
    let before = syncs();
    let (out, err) = device.run(&node);
    assert_eq!(out, "", "{err}");
    assert!(syncs() > before, "the raise was not synced");
    let (code, said) = ops_util::push(&state, "main", "kitchen-1", b"after\n");
    assert_eq!(code, 0, "{said}");
    assert!(said.contains("sequence 101"), "{said}");
    let (out, err) = device.run(&node);
    assert_eq!(out, "after\n", "{err}");
}

/// An outside tester's LISTEN with `heard` 2^63 − 1 made every later push to its device and every later LISTEN
/// of it fail its app's whole turn. A `heard` above 2^62 − 1 is taken as 2^62 − 1 (docs/protocol.md 12.2): the
/// device's run works, pushes are numbered on above it, and the app keeps storing.
#[test]
fn a_device_that_says_it_heard_more_than_the_largest_fails_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (device, senders) = setup(dir.path());
    let state = dir.path().join("state");
    let node = NodeProcess::start(&state, &["--senders", senders.to_str().unwrap()], None);
    for heard in [i64::MAX as u64, u64::MAX] {
        std::fs::write(&device.heard, format!("{heard}\n")).unwrap();
        device.run(&node);
        for _ in 0..2 {
            let (code, said) = ops_util::push(&state, "main", "kitchen-1", b"x\n");
            assert_eq!(code, 0, "{said}");
        }
        device.run(&node);
    }
    let (code, said) = ops_util::push(&state, "main", "kitchen-1", b"x\n");
    assert_eq!(code, 0, "{said}");
    assert!(
        said.contains(&format!("sequence {}", (1u64 << 62) + 4)),
        "{said}"
    );
    assert_eq!(
        node.metric("pure_app_turns_failed_total{app=\"main\"}"),
        Some(0.0)
    );
}

/// A UDP relay on loopback between a device and the node, counting the bytes of the datagrams each way: what the
/// device sent and what it was sent, measured outside both. The node sees the relay's one address, as a device
/// behind a NAT.
struct Relay {
    addr: SocketAddr,
    /// Payload bytes of the datagrams from the device to the node, and from the node to the device.
    up: Arc<AtomicU64>,
    down: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Relay {
    fn start(node: SocketAddr) -> Relay {
        let front = Arc::new(UdpSocket::bind("127.0.0.1:0").unwrap());
        let back = Arc::new(UdpSocket::bind("127.0.0.1:0").unwrap());
        back.connect(node).unwrap();
        for s in [&front, &back] {
            // Room for a window of datagrams, so the relay itself loses none (a loss would only slow the test).
            socket2::SockRef::from(&**s)
                .set_recv_buffer_size(4 << 20)
                .unwrap();
            s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        }
        let addr = front.local_addr().unwrap();
        let device: Arc<Mutex<Option<SocketAddr>>> = Arc::default();
        let (up, down, stop) = (
            Arc::<AtomicU64>::default(),
            Arc::<AtomicU64>::default(),
            Arc::<AtomicBool>::default(),
        );
        let to_node = {
            let (front, back, device, up, stop) = (
                front.clone(),
                back.clone(),
                device.clone(),
                Arc::clone(&up),
                stop.clone(),
            );
            std::thread::spawn(move || {
                let mut buf = [0u8; 2048];
                while !stop.load(Ordering::Relaxed) {
                    if let Ok((n, from)) = front.recv_from(&mut buf) {
                        *device.lock().unwrap() = Some(from);
                        up.fetch_add(n as u64, Ordering::Relaxed);
                        let _ = back.send(&buf[..n]);
                    }
                }
            })
        };
        let to_device = {
            let (down, stop) = (Arc::clone(&down), stop.clone());
            std::thread::spawn(move || {
                let mut buf = [0u8; 2048];
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(n) = back.recv(&mut buf) {
                        let to = *device.lock().unwrap();
                        if let Some(to) = to {
                            down.fetch_add(n as u64, Ordering::Relaxed);
                            let _ = front.send_to(&buf[..n], to);
                        }
                    }
                }
            })
        };
        Relay {
            addr,
            up,
            down,
            stop,
            threads: vec![to_node, to_device],
        }
    }

    /// (bytes the device sent, bytes it was sent) so far.
    fn counted(&self) -> (u64, u64) {
        (
            self.up.load(Ordering::Relaxed),
            self.down.load(Ordering::Relaxed),
        )
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// A file of `len` printable bytes (no newline, so `send --listen` prints each piece as one line) that differ
/// from piece to piece, so a piece out of place is found.
fn printable_file(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| b'!' + ((i * 31 + i / 1024) % 94) as u8)
        .collect()
}

/// Issue 39: a large downlink to a device of version 1.2 (docs/downlink.md, "Large downlink: version 1.2"). A
/// file of 256 KiB pushed with `push --file` reaches `send --listen --down-window` through real processes on
/// loopback, every piece printed once and in order, the pieces reassembling the file; and the device, counted by a
/// relay between it and the node, sent a small part of what it was sent, where with `--down-window 0` (1.1) it
/// sends about as much as it is sent.
#[test]
fn a_file_of_256_kib_reaches_a_device_of_version_1_2_which_sends_a_small_part_of_what_it_is_sent() {
    let dir = tempfile::tempdir().unwrap();
    let (device, senders) = setup(dir.path());
    let state = dir.path().join("state");
    let node = NodeProcess::start(&state, &["--senders", senders.to_str().unwrap()], None);
    let relay = Relay::start(node.link);
    let push_file = |bytes: &[u8]| {
        let file = dir.path().join("image.bin");
        std::fs::write(&file, bytes).unwrap();
        let out = ops_util::push_command(
            &state,
            &[
                "--app",
                "main",
                "--to",
                "kitchen-1",
                "--file",
                file.to_str().unwrap(),
            ],
            b"",
        );
        assert!(out.status.success(), "push --file: {out:?}");
    };
    // The file as `send --listen` prints it: each piece of 1024 bytes a line.
    let printed = |bytes: &[u8]| {
        bytes
            .chunks(1024)
            .flat_map(|c| [c, b"\n"].concat())
            .collect::<Vec<u8>>()
    };

    let image = printable_file(256 << 10);
    push_file(&image);
    let out =
        output_within(&mut device.command_to(&node, relay.addr, &["--down-window", "262144"]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    // Every piece once, in order: the lines are the pieces, and they reassemble to the file.
    assert!(out.stdout == printed(&image), "{err}");
    assert!(err.contains("printed 256 downlink records"), "{err}");
    assert_eq!(device.kept(), 256);
    let (sent, received) = relay.counted();
    assert!(received >= image.len() as u64, "{received}");
    assert!(
        sent * 8 < received,
        "version 1.2: the device sent {sent} bytes for the {received} it was sent"
    );

    // The same measure of version 1.1 (through a relay of its own: the node sends what is pushed to the first
    // run's session too, while it is live): the device sends about as much as it is sent.
    let relay_11 = Relay::start(node.link);
    let second = printable_file(64 << 10);
    push_file(&second);
    let out = output_within(&mut device.command_to(&node, relay_11.addr, &["--down-window", "0"]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(out.stdout == printed(&second), "{err}");
    assert_eq!(device.kept(), 256 + 64);
    let (sent_11, received_11) = relay_11.counted();
    assert!(
        sent_11 * 2 > received_11,
        "version 1.1: the device sent {sent_11} bytes for the {received_11} it was sent"
    );
    eprintln!("1.2: sent {sent} bytes for {received}; 1.1: sent {sent_11} bytes for {received_11}");
}

#[test]
fn a_staying_device_command_whose_reader_went_away_stops_without_waiting_for_a_record() {
    let dir = tempfile::tempdir().unwrap();
    let (device, senders) = setup(dir.path());
    let state = dir.path().join("state");
    let node = NodeProcess::start(&state, &["--senders", senders.to_str().unwrap()], None);
    push(&state, "kitchen-1", b"first\n");
    // `send --listen --stay forever | head -1`: the reader takes one line and goes.
    let mut child = device
        .command(&node, &["--stay", "forever"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line, "first\n");
    drop(stdout);
    // Nothing more is pushed: the command learns of it without writing.
    let deadline = Instant::now() + DEADLINE;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() >= deadline {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("send --stay forever went on waiting after its reader had gone");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(!status.success(), "{err}");
    assert!(
        err.contains("standard output's reader is gone")
            && err.contains("printed 1 downlink record of app main; heard 1"),
        "{err}"
    );
    assert_eq!(device.kept(), 1, "what was printed is kept as heard");
}
