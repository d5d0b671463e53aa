//! Messages that used to mislead (issue 8, item 6) and what `check` finds that the node would refuse (item 5), one
//! test per message, with the real binary: each says what is wrong once, names the file or flag, and the fix.

mod ops_util;

use std::net::{TcpListener, UdpSocket};
use std::path::Path;
use std::process::{Command, Output};

use ops_util::{NodeProcess, bin, keygen};

/// Runs the node with `args` (and the state, loopback and free ports where `args` do not say) and expects it not
/// to start.
fn node_refuses(state: &Path, args: &[&str]) -> String {
    let mut cmd = Command::new(bin());
    cmd.arg("--state").arg(state);
    for (flag, value) in [
        ("--bind", "127.0.0.1"),
        ("--link-port", "0"),
        ("--http-port", "0"),
    ] {
        if !args.contains(&flag) {
            cmd.args([flag, value]);
        }
    }
    let out = cmd.args(args).env_remove("NOTIFY_SOCKET").output().unwrap();
    assert!(!out.status.success(), "it started: {out:?}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("ready"));
    String::from_utf8_lossy(&out.stderr).to_string()
}

fn check(args: &[&str]) -> Output {
    Command::new(bin())
        .arg("check")
        .args(args)
        .output()
        .unwrap()
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn a_key_path_that_is_a_directory_is_not_told_to_chmod() {
    let dir = tempfile::tempdir().unwrap();
    let err = node_refuses(
        &dir.path().join("state"),
        &["--key", dir.path().to_str().unwrap()],
    );
    assert!(
        err.contains("is a directory; give the key file itself"),
        "{err}"
    );
    assert!(!err.contains("chmod"), "{err}");
}

#[test]
fn an_address_not_on_this_host_is_blamed_on_bind_not_the_port() {
    let dir = tempfile::tempdir().unwrap();
    let err = node_refuses(&dir.path().join("state"), &["--bind", "192.0.2.1"]);
    assert!(
        err.contains("192.0.2.1 is not an address of this host: give one it has with --bind"),
        "{err}"
    );
    assert!(!err.contains("another node"), "{err}");
}

#[test]
fn a_port_in_use_names_the_port_and_its_flag_and_the_os_error_once() {
    let dir = tempfile::tempdir().unwrap();
    let taken = UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let err = node_refuses(&dir.path().join("state"), &["--link-port", &port]);
    assert!(
        err.contains(&format!("port {port} is in use by another program (another node?): choose another with --link-port")),
        "{err}"
    );
    assert_eq!(err.matches("os error").count(), 1, "said once: {err}");
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = tcp.local_addr().unwrap().port().to_string();
    let err = node_refuses(&dir.path().join("state2"), &["--http-port", &port]);
    assert!(err.contains("choose another with --http-port"), "{err}");
}

#[test]
fn an_os_error_is_said_once() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-senders");
    let err = node_refuses(
        &dir.path().join("state"),
        &["--senders", missing.to_str().unwrap()],
    );
    assert!(err.contains("cannot read senders file"), "{err}");
    assert_eq!(err.matches("No such file or directory").count(), 1, "{err}");
}

#[test]
fn a_store_that_is_not_a_database_is_said_once_and_named() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    drop(NodeProcess::start(&state, &[], None));
    std::fs::remove_file(state.join("apps/main.sqlite-wal")).ok();
    std::fs::remove_file(state.join("apps/main.sqlite-shm")).ok();
    std::fs::write(state.join("apps/main.sqlite"), vec![0x42u8; 8192]).unwrap();
    let err = node_refuses(&state, &[]);
    assert!(err.contains("apps/main.sqlite"), "{err}");
    assert_eq!(err.matches("not a database").count(), 1, "{err}");
}

#[test]
fn a_receive_buffer_too_small_or_too_large_is_refused_with_the_range() {
    let dir = tempfile::tempdir().unwrap();
    for (value, words) in [
        ("0", "too small"),
        ("1", "too small"),
        ("99999999999", "more than the kernel can give a socket"),
    ] {
        let err = node_refuses(&dir.path().join("state"), &["--recv-buffer", value]);
        assert!(err.contains(words), "{value}: {err}");
        assert!(err.contains("--recv-buffer"), "{value}: {err}");
    }
}

#[test]
fn an_empty_senders_file_starts_with_a_warning_and_check_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let senders = dir.path().join("senders");
    std::fs::write(&senders, "# nobody yet\n").unwrap();
    let state = dir.path().join("state");
    let node = NodeProcess::start(&state, &["--senders", senders.to_str().unwrap()], None);
    let deadline = std::time::Instant::now() + ops_util::DEADLINE;
    while !node.stderr_text().contains("lists no senders") {
        assert!(
            std::time::Instant::now() < deadline,
            "{}",
            node.stderr_text()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    drop(node);
    let out = check(&[
        "--state",
        state.to_str().unwrap(),
        "--senders",
        senders.to_str().unwrap(),
        "--link-port",
        "0",
        "--http-port",
        "0",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("warning: senders") && text(&out).contains("lists no senders"),
        "{}",
        text(&out)
    );
}

#[test]
fn check_finds_a_key_in_a_missing_directory_and_ports_in_use() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let key = dir.path().join("no-such-dir/node.key");
    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    let out = check(&[
        "--state",
        state.to_str().unwrap(),
        "--key",
        key.to_str().unwrap(),
        "--bind",
        "127.0.0.1",
        "--link-port",
        &udp.local_addr().unwrap().port().to_string(),
        "--http-port",
        &tcp.local_addr().unwrap().port().to_string(),
    ]);
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    assert!(t.contains("no-such-dir does not exist"), "{t}");
    assert!(t.contains("problem: UDP 127.0.0.1:"), "{t}");
    assert!(t.contains("choose another with --link-port"), "{t}");
    assert!(t.contains("problem: TCP 127.0.0.1:"), "{t}");
    assert!(t.contains("3 problems found"), "{t}");
    // The node agrees: it refuses the key's directory.
    let err = node_refuses(&state, &["--key", key.to_str().unwrap()]);
    assert!(err.contains("no-such-dir/node.key"), "{err}");
}

#[test]
fn check_beside_a_running_node_warns_of_its_ports_and_finds_lost_data() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let (_, _) = keygen(dir.path(), "unused");
    let node = NodeProcess::start(&state, &[], None);
    let out = check(&[
        "--state",
        state.to_str().unwrap(),
        "--bind",
        "127.0.0.1",
        "--link-port",
        &node.link.port().to_string(),
        "--http-port",
        &node.http.port().to_string(),
    ]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(
        t.contains(&format!(
            "a node (pid {}) is serving from it now",
            node.child.id()
        )),
        "{t}"
    );
    assert!(
        t.contains("in use, presumably by the node serving from this state"),
        "{t}"
    );
    // Checked against another state directory (the operator's `check --senders FILE` before a reload, the node
    // under systemd): the node's ports are still warnings, told by its HTTP port.
    let other = dir.path().join("elsewhere");
    let out = check(&[
        "--state",
        other.to_str().unwrap(),
        "--bind",
        "127.0.0.1",
        "--link-port",
        &node.link.port().to_string(),
        "--http-port",
        &node.http.port().to_string(),
    ]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(t.contains("in use by a running pure-serve"), "{t}");
    drop(node);
    std::fs::remove_file(state.join("node.key")).unwrap();
    let out = check(&[
        "--state",
        state.to_str().unwrap(),
        "--link-port",
        "0",
        "--http-port",
        "0",
    ]);
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    assert!(t.contains("node.key is missing"), "{t}");
    assert!(t.contains("--accept-lost-state"), "{t}");
}
