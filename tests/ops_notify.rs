//! systemd readiness and watchdog, end to end: the real binary with `$NOTIFY_SOCKET` pointed at a socket this test
//! reads (issue 3: "READY=1 arrives only after the port answers").

mod ops_util;

use std::net::UdpSocket;
use std::time::Instant;

use ops_util::*;
use pure_serve::proto::sender::{Sender, SenderConfig};

/// Sends exactly one datagram (a probe of a listed sender) and waits for the node's answer. A single packet with
/// no retransmission proves the port was serving when it was sent.
fn one_packet_is_answered(
    link: std::net::SocketAddr,
    key: &std::path::Path,
    node_key: &str,
) -> bool {
    let identity = pure_serve::keys::read_identity(key).unwrap();
    let node = pure_serve::keys::parse_public_key(node_key).unwrap();
    let mut sender = Sender::new(SenderConfig::new(identity, node)).unwrap();
    sender.queue("main", b"hello".to_vec()).unwrap();
    let mut out = Vec::new();
    assert!(sender.poll_transmit(Instant::now(), &mut out));
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket.send_to(&out, link).unwrap();
    socket.set_read_timeout(Some(DEADLINE)).unwrap();
    let mut buf = [0u8; 2048];
    socket.recv_from(&mut buf).is_ok()
}

fn ready_after_port_answers(notify: NotifySocket) {
    let dir = tempfile::tempdir().unwrap();
    let (key, public) = keygen(dir.path(), "dev");
    let senders = dir.path().join("senders");
    write_atomic(&senders, &format!("dev {public}\n"));
    let state = dir.path().join("state");
    let child = spawn_node(
        &state,
        &["--senders", senders.to_str().unwrap()],
        Some(&notify),
        &[],
    );
    // Wait for READY=1 before reading anything else from the node.
    let seen = notify.until("READY=1");
    let ready = seen.last().unwrap();
    let status = field(ready, "STATUS").expect("READY=1 comes with a STATUS");
    assert!(status.starts_with("serving udp 127.0.0.1:"), "{status}");
    assert!(status.contains("1 senders"), "{status}");
    let link: std::net::SocketAddr = status
        .trim_start_matches("serving udp ")
        .split(':')
        .take(2)
        .collect::<Vec<_>>()
        .join(":")
        .parse()
        .unwrap();
    let node_key = pure_serve::keys::encode_key(
        pure_serve::keys::read_identity(&state.join("node.key"))
            .unwrap()
            .public(),
    );
    assert!(one_packet_is_answered(link, &key, &node_key));
    let mut node = NodeProcess::attach(child, &state);
    assert_eq!(node.link, link);
    node.signal(libc::SIGTERM);
    let stopping = notify.until("STOPPING=1");
    assert!(
        field(stopping.last().unwrap(), "STATUS").is_some_and(|s| s.starts_with("stopping")),
        "{stopping:?}"
    );
    assert_eq!(node.wait_exit(), Some(0));
}

#[test]
fn ready_after_the_port_answers_on_a_path_socket() {
    ready_after_port_answers(NotifySocket::path());
}

#[test]
fn ready_after_the_port_answers_on_an_abstract_socket() {
    ready_after_port_answers(NotifySocket::abstract_name("ready"));
}

/// The STATUS line's "records stored" is what the stores hold: after a restart it is not 0 (issue 37, §3).
#[test]
fn status_counts_what_the_stores_hold_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (key, public) = keygen(dir.path(), "dev");
    let senders = dir.path().join("senders");
    write_atomic(&senders, &format!("dev {public}\n"));
    let state = dir.path().join("state");
    let args = ["--senders", senders.to_str().unwrap()];
    let mut node = NodeProcess::start(&state, &args, None);
    let records: Vec<String> = (1..=7).map(|i| format!("r{i}")).collect();
    let (ok, out) = node.send(&key, &records, "60");
    assert!(ok, "{out}");
    node.signal(libc::SIGTERM);
    assert_eq!(node.wait_exit(), Some(0));

    let notify = NotifySocket::path();
    let child = spawn_node(&state, &args, Some(&notify), &[]);
    let seen = notify.until("READY=1");
    let status = field(seen.last().unwrap(), "STATUS").expect("READY=1 comes with a STATUS");
    assert!(status.contains(", 7 records stored,"), "{status}");
    let mut node = NodeProcess::attach(child, &state);
    node.signal(libc::SIGTERM);
    assert_eq!(node.wait_exit(), Some(0));
}

#[test]
fn no_ready_when_the_node_cannot_start() {
    let notify = NotifySocket::path();
    let dir = tempfile::tempdir().unwrap();
    let senders = dir.path().join("senders");
    write_atomic(&senders, "dev not-a-key\n");
    let child = spawn_node(
        &dir.path().join("state"),
        &["--senders", senders.to_str().unwrap()],
        Some(&notify),
        &[],
    );
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("senders:1:"), "{stderr}");
    let sent = notify.drain();
    assert!(
        !sent.iter().any(|m| m.lines().any(|l| l == "READY=1")),
        "{sent:?}"
    );
}

#[test]
fn watchdog_pings_come_from_the_running_loop() {
    let notify = NotifySocket::path();
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    // A 200 ms watchdog: pings every 100 ms at most, so a few arrive quickly.
    let child = spawn_node(&state, &[], Some(&notify), &[("WATCHDOG_USEC", "200000")]);
    notify.until("READY=1");
    for _ in 0..3 {
        notify.until("WATCHDOG=1");
    }
    // A watchdog meant for another process (WATCHDOG_PID) is not ours: no pings.
    let mut node = NodeProcess::attach(child, &state);
    node.signal(libc::SIGTERM);
    assert_eq!(node.wait_exit(), Some(0));
    let notify2 = NotifySocket::path();
    let state2 = dir.path().join("state2");
    let child = spawn_node(
        &state2,
        &[],
        Some(&notify2),
        &[("WATCHDOG_USEC", "200000"), ("WATCHDOG_PID", "1")],
    );
    notify2.until("READY=1");
    let mut node = NodeProcess::attach(child, &state2);
    node.signal(libc::SIGTERM);
    let rest = notify2.until("STOPPING=1");
    assert_eq!(node.wait_exit(), Some(0));
    let all: Vec<String> = rest.into_iter().chain(notify2.drain()).collect();
    assert!(!all.iter().any(|m| m.contains("WATCHDOG=1")), "{all:?}");
}

/// Under systemd, standard error is the journal (`$JOURNAL_STREAM` names it): each line carries its syslog priority
/// (`<3>` an error, `<6>` info), so `journalctl -p warning` shows the errors (issue 18, item 10). The same variable
/// naming another stream (inherited by a program whose standard error goes elsewhere) adds nothing.
#[test]
fn journal_lines_carry_their_priority_only_when_stderr_is_the_journal() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let senders = dir.path().join("senders");
    write_atomic(&senders, "dev not-a-key\n");
    let run = |journal: bool| {
        let log = dir.path().join(format!("stderr-{journal}"));
        let file = std::fs::File::create(&log).unwrap();
        let m = file.metadata().unwrap();
        let stream = if journal {
            format!("{}:{}", m.dev(), m.ino())
        } else {
            format!("{}:{}", m.dev(), m.ino() + 1)
        };
        let status = std::process::Command::new(bin())
            .arg("--state")
            .arg(dir.path().join("state"))
            .arg("--senders")
            .arg(&senders)
            .args([
                "--bind",
                "127.0.0.1",
                "--link-port",
                "0",
                "--http-port",
                "0",
            ])
            .env("RUST_LOG", "info")
            .env("JOURNAL_STREAM", stream)
            .env_remove("NOTIFY_SOCKET")
            .stdout(std::process::Stdio::null())
            .stderr(file)
            .status()
            .unwrap();
        assert_eq!(status.code(), Some(78), "a bad senders file is EX_CONFIG");
        std::fs::read_to_string(&log).unwrap()
    };
    let text = run(true);
    assert!(
        text.lines()
            .any(|l| l.starts_with("<3>pure-serve: the node did not start")),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("<6>") && l.contains("INFO")),
        "{text}"
    );
    assert!(
        text.lines().all(|l| l.starts_with('<')),
        "every line has its priority, those of a message of several lines too: {text}"
    );
    let text = run(false);
    assert!(
        !text.contains("<3>") && text.contains("pure-serve: the node did not start"),
        "{text}"
    );
}

/// The exit status tells the unit whether a restart can help (issue 18, item 9): a configuration at fault (a bad
/// senders or apps file, a key that is a directory) is 78, EX_CONFIG, which `RestartPreventExitStatus=78` does
/// not restart; a port in use, which a restart may find free, is 1.
#[test]
fn a_bad_configuration_exits_78_and_a_port_in_use_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        let mut cmd = std::process::Command::new(bin());
        cmd.arg("--state")
            .arg(dir.path().join("state"))
            .args(["--bind", "127.0.0.1", "--http-port", "0"])
            .args(args)
            .env_remove("NOTIFY_SOCKET")
            .stdout(std::process::Stdio::null());
        let out = cmd.output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let senders = dir.path().join("senders");
    write_atomic(&senders, "dev not-a-key\n");
    let (code, err) = run(&["--link-port", "0", "--senders", senders.to_str().unwrap()]);
    assert_eq!(code, Some(78), "{err}");
    let apps = dir.path().join("apps.toml");
    write_atomic(&apps, "[apps.main]\nturn_records = \"many\"\n");
    let (code, err) = run(&["--link-port", "0", "--apps", apps.to_str().unwrap()]);
    assert_eq!(code, Some(78), "{err}");
    let (code, err) = run(&["--link-port", "0", "--key", dir.path().to_str().unwrap()]);
    assert_eq!(code, Some(78), "{err}");
    let taken = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let (code, err) = run(&["--link-port", &port]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("is in use"), "{err}");
}

/// A bad flag under systemd (a drop-in's `ExecStart=`) is filed as an error too, every line of it: it is why the
/// unit failed, and `journalctl -p warning` must show it (an outside audit found clap's message without a priority).
#[test]
fn a_bad_flag_under_the_journal_is_filed_as_an_error() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    for args in [&["--link-port", "seventy"][..], &["--log", "warnings"][..]] {
        let log = dir.path().join("stderr");
        let file = std::fs::File::create(&log).unwrap();
        let m = file.metadata().unwrap();
        let status = std::process::Command::new(bin())
            .arg("--state")
            .arg(dir.path().join("state"))
            .args(args)
            .env("JOURNAL_STREAM", format!("{}:{}", m.dev(), m.ino()))
            .env_remove("NOTIFY_SOCKET")
            .stdout(std::process::Stdio::null())
            .stderr(file)
            .status()
            .unwrap();
        assert_eq!(status.code(), Some(78), "{args:?}");
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(!text.trim().is_empty());
        assert!(
            text.lines().all(|l| l.is_empty() || l.starts_with("<3>")),
            "{args:?}: {text}"
        );
    }
}
