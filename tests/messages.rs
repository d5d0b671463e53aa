//! Messages that used to mislead (issue 8, item 6) and what `check` finds that the node would refuse (item 5), one
//! test per message, with the real binary: each says what is wrong once, names the file or flag, and the fix.

mod ops_util;

use std::net::{TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use ops_util::{NodeProcess, bin, keygen, mkfifo, output_within, sparse};

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
    let out = output_within(cmd.args(args).env_remove("NOTIFY_SOCKET"));
    assert!(!out.status.success(), "it started: {out:?}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("ready"));
    String::from_utf8_lossy(&out.stderr).to_string()
}

fn check(args: &[&str]) -> Output {
    output_within(Command::new(bin()).arg("check").args(args))
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
        err.contains("is a directory, not a regular file: point --key at a regular file"),
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
    // The metrics listener's address is its own flag's.
    let err = node_refuses(
        &dir.path().join("state2"),
        &["--metrics-listen", "192.0.2.1:7382"],
    );
    assert!(
        err.contains(
            "192.0.2.1 is not an address of this host: give one it has with --metrics-listen"
        ),
        "{err}"
    );
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
    // The key was made before the socket was bound, and is kept: the start says so on its way out.
    assert!(
        err.contains("made a new node key")
            && err.contains("it is kept, and the next start uses it"),
        "{err}"
    );
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = tcp.local_addr().unwrap().port().to_string();
    let err = node_refuses(&dir.path().join("state2"), &["--http-port", &port]);
    assert!(err.contains("choose another with --http-port"), "{err}");
    let taken = format!("127.0.0.1:{port}");
    let err = node_refuses(&dir.path().join("state3"), &["--metrics-listen", &taken]);
    assert!(
        err.contains(&format!(
            "cannot listen on TCP {taken} for the metrics: port {port} is in use by another program (another \
             node?): choose another with --metrics-listen"
        )),
        "{err}"
    );
    // Not an address and a port: said by the flag's parser, with examples.
    let err = node_refuses(&dir.path().join("state4"), &["--metrics-listen", "7382"]);
    assert!(
        err.contains("--metrics-listen")
            && err.contains("is not ADDR:PORT: give e.g. 127.0.0.1:7382"),
        "{err}"
    );
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
        "--metrics-listen",
        &node.metrics.to_string(),
    ]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert_eq!(
        t.matches("in use, presumably by the node serving from this state")
            .count(),
        3,
        "UDP, HTTP and metrics: {t}"
    );
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
        "--metrics-listen",
        &node.metrics.to_string(),
    ]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert_eq!(
        t.matches("in use by a running pure-serve").count(),
        3,
        "{t}"
    );
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

/// Paths in `dir` that are not regular files, each with what the message must call it: a FIFO (whose open would
/// block), endless devices, a directory, directly and through symbolic links.
fn not_files(dir: &Path) -> Vec<(PathBuf, String)> {
    let fifo = dir.join("fifo");
    mkfifo(&fifo);
    let link = |name: &str, to: &Path| {
        let p = dir.join(name);
        std::os::unix::fs::symlink(to, &p).unwrap();
        p
    };
    let fifo_link = link("fifo-link", &fifo);
    let zero = link("zero", Path::new("/dev/zero"));
    let random = link("random", Path::new("/dev/urandom"));
    let sub = dir.join("a-directory");
    std::fs::create_dir(&sub).unwrap();
    let fifo_real = fifo.canonicalize().unwrap();
    let d = |p: &Path| p.display().to_string();
    vec![
        (
            fifo.clone(),
            format!("{} is a FIFO (named pipe), not a regular file", d(&fifo)),
        ),
        (
            fifo_link.clone(),
            format!(
                "{} (a symbolic link to {}) is a FIFO (named pipe), not a regular file",
                d(&fifo_link),
                d(&fifo_real)
            ),
        ),
        (
            "/dev/zero".into(),
            "/dev/zero is a character device, not a regular file".into(),
        ),
        (
            zero.clone(),
            format!(
                "{} (a symbolic link to /dev/zero) is a character device, not a regular file",
                d(&zero)
            ),
        ),
        (
            random.clone(),
            format!(
                "{} (a symbolic link to /dev/urandom) is a character device, not a regular file",
                d(&random)
            ),
        ),
        (
            sub.clone(),
            format!("{} is a directory, not a regular file", d(&sub)),
        ),
    ]
}

#[test]
fn a_senders_file_that_is_not_a_file_or_is_too_big_is_refused_at_once_by_the_node_and_check() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut cases: Vec<(PathBuf, String)> = not_files(dir.path())
        .into_iter()
        .map(|(p, words)| (p, format!("{words}: point --senders at a regular file")))
        .collect();
    // One byte past the limit (2 GiB), sparse: nothing of it is read, and it costs no disk.
    let big = dir.path().join("big");
    sparse(&big, (2 << 30) + 1);
    cases.push((
        big.clone(),
        format!(
            "senders file {} is 2147483649 bytes, more than any useful one (at most 2147483648 bytes: 10 million \
             senders of the longest names, with comments): point --senders at the right file",
            big.display()
        ),
    ));
    for (path, words) in &cases {
        let err = node_refuses(&state, &["--senders", path.to_str().unwrap()]);
        assert!(err.contains(words), "{}: {err}", path.display());
        assert_eq!(
            err.matches("not a regular file").count() + err.matches("more than any").count(),
            1,
            "said once: {err}"
        );
        let out = check(&[
            "--state",
            state.to_str().unwrap(),
            "--senders",
            path.to_str().unwrap(),
            "--link-port",
            "0",
            "--http-port",
            "0",
        ]);
        let t = text(&out);
        assert!(!out.status.success(), "{t}");
        assert!(
            t.contains(&format!("problem: senders file {}", path.display())),
            "{t}"
        );
        assert!(t.contains(words), "{t}");
    }
    assert!(
        !state.join("node.key").exists(),
        "a start refused for its senders file makes no node key"
    );
}

#[test]
fn apps_key_tls_and_ca_files_that_are_not_files_are_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let fifo = dir.path().join("fifo");
    mkfifo(&fifo);
    let f = fifo.to_str().unwrap();
    let zero = dir.path().join("zero");
    std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
    let z = zero.to_str().unwrap();
    let big_key = dir.path().join("big.key");
    sparse(&big_key, 4096);
    let ports = ["--link-port", "0", "--http-port", "0"];
    let s = state.to_str().unwrap();
    let ca_apps = dir.path().join("apps.toml");
    std::fs::write(
        &ca_apps,
        format!("[apps.a.outlets.h]\nkind = \"webhook\"\nurl = \"https://127.0.0.1:9/x\"\nca_file = \"{f}\"\n"),
    )
    .unwrap();
    let a = ca_apps.to_str().unwrap();
    let fifo_is = format!("{f} is a FIFO (named pipe), not a regular file");
    let zero_is =
        format!("{z} (a symbolic link to /dev/zero) is a character device, not a regular file");
    for (args, words) in [
        (vec!["--apps", f], format!("apps file {fifo_is}: point --apps at a regular file")),
        (vec!["--apps", z], format!("apps file {zero_is}: point --apps at a regular file")),
        (vec!["--key", f], format!("key file {fifo_is}: point --key at a regular file")),
        (vec!["--key", z], format!("key file {zero_is}: point --key at a regular file")),
        (
            vec!["--key", big_key.to_str().unwrap()],
            "is 4096 bytes, more than any useful one (at most 512 bytes: one line of 44 characters of base64): \
             point --key at the right file"
                .to_string(),
        ),
        (
            vec!["--apps", a],
            format!("key outlets.h.ca_file: CA file {fifo_is}: point `ca_file` in the apps file at a regular file"),
        ),
    ] {
        let err = node_refuses(&state, &args);
        assert!(err.contains(&words), "{args:?}: {err}");
        let out = check(&[&["--state", s][..], &ports, &args].concat());
        let t = text(&out);
        assert!(!out.status.success(), "{args:?}: {t}");
        assert!(t.contains("problem: ") && t.contains(&words), "{args:?}: {t}");
    }
    for args in [
        ["--tls-cert", f, "--tls-key", z],
        ["--tls-cert", z, "--tls-key", f],
    ] {
        let err = node_refuses(&state, &args);
        assert!(
            err.contains("PEM certificate file")
                && err.contains("point --tls-cert at a regular file"),
            "{err}"
        );
    }
    for (cmd, key) in [("pubkey", f), ("pubkey", z), ("send", f), ("send", z)] {
        let mut c = Command::new(bin());
        c.args([cmd, "--key", key]);
        if cmd == "send" {
            c.args([
                "--node",
                "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
                "--to",
                "127.0.0.1:9",
            ]);
        }
        let out = output_within(&mut c);
        assert!(!out.status.success(), "{cmd} {key}");
        let t = text(&out);
        assert!(
            t.contains(&format!("key file {key}"))
                && t.contains("not a regular file: point --key at"),
            "{t}"
        );
    }
}

#[test]
fn check_does_not_hang_on_a_state_directory_whose_files_are_fifos() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    mkfifo(&state.join("lock"));
    mkfifo(&state.join("identity"));
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
    assert!(
        t.contains(&format!(
            "problem: state identity file {} is a FIFO (named pipe), not a regular file: give --state the node's own \
             state directory",
            state.join("identity").display()
        )),
        "{t}"
    );
}

/// Issue 18, item 7: the refusal of a too small `--recv-buffer` states the default that `--help` shows (it said
/// 4194304 while `--help` said 8388608).
#[test]
fn the_receive_buffer_refusal_states_the_default_help_shows() {
    let help = output_within(Command::new(bin()).arg("--help"));
    let help = String::from_utf8_lossy(&help.stdout).to_string();
    let at = help.find("--recv-buffer").expect("--recv-buffer in --help");
    let rest = &help[at..];
    let default = rest
        .split("[default: ")
        .nth(1)
        .and_then(|r| r.split(']').next())
        .expect("a default in --help")
        .to_string();
    assert_eq!(default, "8388608", "{rest}");
    let dir = tempfile::tempdir().unwrap();
    let err = node_refuses(&dir.path().join("state"), &["--recv-buffer", "1"]);
    assert!(err.contains(&format!("the default is {default}")), "{err}");
}

/// The binary as nobody may run it (as root; else the binary itself): a copy in `dir`, which everyone may enter,
/// since the checkout itself may be where only root can go (issue 38: a clone under /root).
fn exe_for_nobody(root: bool, dir: &std::path::Path) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    if !root {
        return std::path::PathBuf::from(bin());
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let exe = dir.join("pure-serve");
    std::fs::copy(bin(), &exe).unwrap();
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    exe
}

/// An outside audit: `check --state` on a directory this user may not look into (the packaged node's
/// /var/lib/private/pure-serve, run without sudo) said "missing; the node will make it" of the directory and of the
/// key, then "configuration is fine", exit 0. It is a problem, said once, with the fix.
#[test]
fn check_on_a_state_directory_this_user_may_not_look_into_says_so_not_missing() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let private = tempfile::tempdir().unwrap();
    let state = private.path().join("pure-serve");
    std::fs::create_dir(&state).unwrap();
    std::fs::set_permissions(private.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let exe_dir = tempfile::tempdir().unwrap();
    let exe = exe_for_nobody(root, exe_dir.path());
    let mut cmd = Command::new(&exe);
    cmd.args(["check", "--link-port", "0", "--http-port", "0", "--state"])
        .arg(&state);
    if root {
        cmd.uid(65534).gid(65534);
    } else {
        std::fs::set_permissions(private.path(), std::fs::Permissions::from_mode(0o000)).unwrap();
    }
    let out = cmd.output().unwrap();
    if !root {
        std::fs::set_permissions(private.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    }
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(
        all.contains("this user cannot look at it")
            && all.contains("run check as the node's user, or with sudo"),
        "{all}"
    );
    assert_eq!(
        all.matches("this user cannot look at it").count(),
        1,
        "said once: {all}"
    );
    assert!(!all.contains("missing"), "{all}");
    assert!(!all.contains("configuration is fine"), "{all}");
}

/// `pure-serve push` as `cmd` says it, with one record on standard input.
fn push_one(cmd: &mut Command) -> Output {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Not written when the command exits first (it could not connect): a broken pipe then is no failure.
    let _ = child.stdin.take().unwrap().write_all(b"reboot\n");
    child.wait_with_output().unwrap()
}

/// Black-box findings, item 10: a push socket this user may not open was reported as "no node answers … start the
/// node". It says the real fix (the node's user or group, docs/downlink.md "Who may push"), still exit 69: nothing
/// was sent.
#[test]
fn a_push_socket_this_user_may_not_open_says_who_may_push_not_start_the_node() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("push.sock");
    // A node's socket, as far as connecting goes: it is never answered, because it is never reached.
    let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    // Root may open any socket: push as nobody, who may not enter the test's 0700 directory.
    let exe_dir = tempfile::tempdir().unwrap();
    let exe = exe_for_nobody(root, exe_dir.path());
    let mut cmd = Command::new(&exe);
    cmd.args(["push", "--to", "kitchen-1", "--socket"])
        .arg(&socket);
    if root {
        cmd.uid(65534).gid(65534);
    } else {
        std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o000)).unwrap();
    }
    let out = push_one(&mut cmd);
    let err = text(&out);
    assert_eq!(out.status.code(), Some(69), "{err}");
    assert!(err.contains("permission denied"), "{err}");
    assert!(
        err.contains("run push as the node's user, or as a member of the node's group")
            && err.contains("Who may push"),
        "{err}"
    );
    assert!(!err.contains("start the node"), "{err}");
}

/// Black-box findings, item 10: `--socket` naming a directory (a state directory) said "Connection refused … start
/// the node"; it points at `--state` instead.
#[test]
fn a_push_socket_that_is_a_directory_suggests_state() {
    let dir = tempfile::tempdir().unwrap();
    let out = push_one(
        Command::new(bin())
            .args(["push", "--to", "kitchen-1", "--socket"])
            .arg(dir.path()),
    );
    let err = text(&out);
    assert_eq!(out.status.code(), Some(69), "{err}");
    assert!(
        err.contains("is a directory, not a push socket")
            && err.contains(&format!("--state {}", dir.path().display())),
        "{err}"
    );
    assert!(!err.contains("start the node"), "{err}");
}

/// Issue 36: a `--store` URL with a password was refused, but the argument parser's own prefix printed it first
/// (`invalid value 'postgres://pure:secret@…'`), into the journal; and a 100 kB value was echoed whole. Now the
/// message masks the password and shows at most 100 characters of a value, for the node and for `records`. A bad
/// flag of the node is its configuration: it exits 78 (EX_CONFIG), which systemd does not restart; `records` says
/// it with clap's usage status, 2.
#[test]
fn a_store_url_with_a_password_is_refused_without_printing_it_and_a_long_value_is_not_echoed() {
    for (cmd, usage) in [(&[][..], 78), (&["records"][..], 2)] {
        let out = Command::new(bin())
            .args(cmd)
            .args(["--store", "postgres://pure:hunter2@db.internal/fleet"])
            .output()
            .unwrap();
        let err = text(&out);
        assert_eq!(out.status.code(), Some(usage), "{err}");
        assert!(!err.contains("hunter2"), "the password was printed: {err}");
        assert!(
            err.contains("postgres://pure:***@db.internal/fleet")
                && err.contains("--store-password-file"),
            "{err}"
        );
        // A password as a parameter of the query is one too.
        let out = Command::new(bin())
            .args(cmd)
            .args(["--store", "postgres://pure@db/fleet?password=hunter2"])
            .output()
            .unwrap();
        let err = text(&out);
        assert_eq!(out.status.code(), Some(usage), "{err}");
        assert!(
            !err.contains("hunter2") && err.contains("holds a password"),
            "{err}"
        );
        // 100 kB: refused, and not echoed.
        for long in [
            format!("postgres://pure@db/{}", "x".repeat(100_000)),
            format!("nosuch://{}", "x".repeat(100_000)),
        ] {
            let out = Command::new(bin())
                .args(cmd)
                .args(["--store", &long])
                .output()
                .unwrap();
            let err = text(&out);
            assert_eq!(
                out.status.code(),
                Some(usage),
                "{}",
                &err[..err.len().min(300)]
            );
            assert!(err.len() < 1_000, "{} bytes of message", err.len());
        }
    }
}

/// Issue 36: a bad `--store` exited 2, which systemd restarts five times; every mistake in the node's flags is its
/// configuration and exits 78 at once, while `--help` still exits 0 and another command's mistake 2.
#[test]
fn a_bad_flag_of_the_node_exits_78_and_help_exits_0() {
    for args in [
        &["--store", "nosuch://db"][..],
        &["--store", "postgres://pure@db/fleet?sslmode=sometimes"][..],
        &["--link-port", "seventy"][..],
        &["--no-such-flag"][..],
        &["--log", "pure_serve=loud"][..],
        // A bare word is a target to tracing: a misspelt level silenced every line, errors included.
        &["--log", "warnings"][..],
        &["--log", "inf"][..],
        &["--log", "info,,"][..],
    ] {
        let out = output_within(Command::new(bin()).args(args));
        let err = text(&out);
        assert_eq!(out.status.code(), Some(78), "{args:?}: {err}");
        assert!(!err.contains("ready"), "{err}");
    }
    let err =
        text(&output_within(Command::new(bin()).args([
            "--store",
            "postgres://pure@db/fleet?sslmode=sometimes",
        ])));
    assert!(
        err.contains("is not a PostgreSQL URL") && err.contains("sslmode"),
        "{err}"
    );
    let out = output_within(Command::new(bin()).arg("--help"));
    assert_eq!(out.status.code(), Some(0));
    let out = output_within(Command::new(bin()).args(["records", "--no-such-flag"]));
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let out = output_within(Command::new(bin()).args(["--log", "debug", "records", "--frm", "1"]));
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    // `senders` on a directory with no stores (a wrong --state) says so, as `records` does, not every sender
    // "never" heard from, exit 0.
    let dir = tempfile::tempdir().unwrap();
    let list = dir.path().join("senders");
    std::fs::write(&list, "dev dD99cLJyvmdDIHy5yp01Io6HkkUfpvSvwJAyxAd+ahk=\n").unwrap();
    let out = output_within(
        Command::new(bin())
            .args(["senders", "--senders", list.to_str().unwrap(), "--state"])
            .arg(dir.path().join("nowhere")),
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("is that the node's --state directory?"),
        "{}",
        text(&out)
    );
    // Positions start at 1; `--from 0` was once taken as 1 without a word.
    let out = output_within(Command::new(bin()).args(["records", "--from", "0"]));
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("positions start at 1: use --from 1"),
        "{}",
        text(&out)
    );
    let out = output_within(Command::new(bin()).args(["--log", "warnings"]));
    let err = text(&out);
    assert!(
        err.contains("--log \"warnings\" is not a log level or filter")
            && err.contains("not a level (trace, debug, info, warn, error, off) nor TARGET=LEVEL")
            && err.contains("try --log debug"),
        "{err}"
    );
}

/// An outside audit: a push while the node was starting (its senders file still being read, its push socket not
/// yet bound) said the node "serves no push socket … started with --push-socket none", exit 69, and the operator
/// went looking at flags. A push to a node that started moments ago and will serve that socket waits for it.
#[test]
fn a_push_while_the_node_starts_waits_for_its_socket() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let senders = dir.path().join("senders");
    // Long enough to read that the push comes before the socket (a few tenths of a second).
    let mut list = std::io::BufWriter::new(std::fs::File::create(&senders).unwrap());
    for i in 0..300_000u32 {
        let key: [u8; 32] =
            std::array::from_fn(|k| (i.wrapping_mul(2_654_435_761) >> (k % 4 * 8)) as u8 ^ k as u8);
        use base64::Engine;
        let b64 = base64::engine::general_purpose::STANDARD.encode(key);
        writeln!(list, "d{i} {b64}").unwrap();
    }
    drop(list);
    let mut node = Command::new(bin())
        .arg("--state")
        .arg(&state)
        .args(["--senders", senders.to_str().unwrap()])
        .args([
            "--bind",
            "127.0.0.1",
            "--link-port",
            "0",
            "--http-port",
            "0",
        ])
        .args(["--metrics-listen", "127.0.0.1:0"])
        .env_remove("NOTIFY_SOCKET")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // The lock is taken first: the push finds a node there, starting.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !state.join("lock").exists() {
        assert!(std::time::Instant::now() < deadline, "no lock");
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    let (code, said) = ops_util::push(&state, "main", "d7", b"hello\n");
    node.kill().unwrap();
    node.wait().unwrap();
    assert_eq!(code, 0, "{said}");
}

/// Issue 37, "small things seen": `push` to a node running with `--push-socket none` said "no node answers … start
/// the node". A node holds the state directory, so it says that node serves no push socket and what to do; exit
/// 69, nothing sent. With no node there, it still says to start one.
#[test]
fn a_push_to_a_node_without_a_push_socket_says_so_not_start_the_node() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let node = NodeProcess::start(&state, &["--push-socket", "none"], None);
    let mut cmd = Command::new(bin());
    cmd.args(["push", "--to", "kitchen-1", "--state"])
        .arg(&state);
    let out = push_one(&mut cmd);
    let err = text(&out);
    assert_eq!(out.status.code(), Some(69), "{err}");
    assert!(
        err.contains(&format!(
            "the node running on {} (pid {})",
            state.display(),
            node.child.id()
        )) && err.contains("serves no push socket")
            && err.contains("--push-socket none"),
        "{err}"
    );
    assert!(!err.contains("start the node"), "{err}");
    drop(node);

    let empty = dir.path().join("no-node");
    std::fs::create_dir(&empty).unwrap();
    let mut cmd = Command::new(bin());
    cmd.args(["push", "--to", "kitchen-1", "--state"])
        .arg(&empty);
    let out = push_one(&mut cmd);
    let err = text(&out);
    assert_eq!(out.status.code(), Some(69), "{err}");
    assert!(err.contains("no node answers"), "{err}");
}

/// Issue 37, "small things seen": `check` knows `--push-socket` and `--push-datagrams`, and a push socket path whose
/// datagram socket (the same path with `.dgram`) is too long for a Unix socket is blamed on `--push-socket`, by
/// the node (exit 78, before anything is bound) and by `check` alike. A directory that is not there is found too.
#[test]
fn push_socket_paths_are_checked_and_a_long_derived_one_is_blamed_on_its_flag() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    // A push socket of exactly 107 bytes (the most a Unix socket's path holds): its datagram socket, `….dgram`
    // for `….sock`, is 108.
    let base = dir.path().join("s");
    std::fs::create_dir(&base).unwrap();
    let prefix = format!("{}/", base.display());
    let stem = "p".repeat(107 - prefix.len() - ".sock".len());
    let long = format!("{prefix}{stem}.sock");
    assert_eq!(long.len(), 107);

    let err = node_refuses(&state, &["--push-socket", &long]);
    assert!(
        err.contains(&format!(
            "push datagram socket {prefix}{stem}.dgram: its path is 108 bytes"
        )) && err.contains("give --push-socket a shorter path, or --push-datagrams one of its own"),
        "{err}"
    );
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
        .args(["--push-socket", &long])
        .env_remove("NOTIFY_SOCKET")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(78), "{}", text(&out));
    assert!(!Path::new(&long).exists(), "nothing bound");

    let out = check(&["--state", state.to_str().unwrap(), "--push-socket", &long]);
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    assert!(
        t.contains("problem: push datagram socket")
            && t.contains("give --push-socket a shorter path"),
        "{t}"
    );
    // Its own path for the datagrams: then the stream socket's is fine.
    let short = base.join("p.dgram");
    let out = check(&[
        "--state",
        state.to_str().unwrap(),
        "--push-socket",
        &long,
        "--push-datagrams",
        short.to_str().unwrap(),
        "--link-port",
        "0",
        "--http-port",
        "0",
    ]);
    let t = text(&out);
    assert!(
        t.contains(&format!("ok: push sockets: {long} and {}", short.display())),
        "{t}"
    );

    let missing = dir.path().join("nowhere/push.sock");
    let out = check(&[
        "--state",
        state.to_str().unwrap(),
        "--push-socket",
        missing.to_str().unwrap(),
    ]);
    let t = text(&out);
    assert!(
        t.contains(&format!(
            "problem: push socket {}: its directory {} does not exist: make it, or give --push-socket another path",
            missing.display(),
            dir.path().join("nowhere").display()
        )),
        "{t}"
    );
}

/// An outside audit: a line too long to be a record made `send` exit saying only that, while the lines before it
/// were stored; sending the same input again (the obvious retry) stored those twice. It now delivers what it
/// queued before the line, then says what was stored, that nothing from the line on was sent, and where to go on.
#[test]
fn a_line_too_long_for_a_record_says_what_before_it_was_stored_and_where_to_send_from() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let (key, public) = keygen(dir.path(), "dev");
    let senders = dir.path().join("senders");
    std::fs::write(&senders, format!("dev {public}\n")).unwrap();
    let node = NodeProcess::start(&state, &["--senders", senders.to_str().unwrap()], None);
    let lines = [
        "r1".to_string(),
        "r2".to_string(),
        "b".repeat(1200),
        "r3".to_string(),
    ];
    let (ok, said) = node.send(&key, &lines, "30");
    assert!(!ok, "{said}");
    for want in [
        "line 3 of standard input: a record of 1200 bytes is too long: at most 1125 bytes",
        "the 2 lines before it were stored for app main (seq 1–2) and nothing from it on was sent",
        "tail -n +3",
    ] {
        assert!(said.contains(want), "{want:?} in {said}");
    }
    let stored = pure_serve::store::open_app_for_reading(&state, "main")
        .and_then(|s| s.read_head())
        .unwrap();
    assert_eq!(stored, 3, "r1 and r2 stored, nothing after");
}

/// An outside audit: `demo --state DIR` run twice said "each exactly once: NO" of a sound store (its new senders
/// went on after the old ones' sequences). A directory that is not empty is refused, naming it.
#[test]
fn a_demo_runs_in_its_own_directory_and_refuses_one_that_is_not_empty() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("demo");
    let demo = || {
        output_within(
            Command::new(bin())
                .args(["demo", "--senders", "2", "--records", "50", "--state"])
                .arg(&state),
        )
    };
    let out = demo();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        text(&out).contains("each exactly once: yes"),
        "{}",
        text(&out)
    );
    let out = demo();
    let err = text(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "demo --state {}: the directory is not empty",
            state.display()
        )),
        "{err}"
    );
    assert!(!err.contains("exactly once"), "{err}");
}

/// An outside audit: `--state` naming a file exited 1 (systemd restarts it five times) with only the OS error, and
/// `check` said "configuration is fine" of a state directory the node cannot make and of a store that is not a
/// database, both of which the node refuses. The node now exits 78 with the fix; `check` finds all three, each once.
#[test]
fn a_state_the_node_cannot_make_or_a_store_that_is_not_a_database_is_found_by_check() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("afile");
    std::fs::write(&file, "").unwrap();
    let out = output_within(Command::new(bin()).arg("--state").arg(&file).args([
        "--bind",
        "127.0.0.1",
        "--link-port",
        "0",
        "--http-port",
        "0",
    ]));
    let err = text(&out);
    assert_eq!(out.status.code(), Some(78), "{err}");
    assert!(
        err.contains("cannot create state directory")
            && err.contains("a file, not a directory")
            && err.contains("give --state a directory, or move the file away"),
        "{err}"
    );
    let check_state = |state: &Path| {
        let out = check(&[
            "--link-port",
            "0",
            "--http-port",
            "0",
            "--state",
            state.to_str().unwrap(),
        ]);
        (out.status.code(), text(&out))
    };
    for state in [file.clone(), file.join("state")] {
        let (code, all) = check_state(&state);
        assert_eq!(code, Some(1), "{all}");
        assert_eq!(all.matches("problem:").count(), 1, "said once: {all}");
        assert!(all.contains("not a directory"), "{all}");
    }
    // A store that is not a database.
    let state = dir.path().join("state");
    drop(NodeProcess::start(&state, &[], None));
    for suffix in ["-wal", "-shm"] {
        std::fs::remove_file(state.join(format!("apps/main.sqlite{suffix}"))).ok();
    }
    std::fs::write(state.join("apps/main.sqlite"), vec![0x42u8; 8192]).unwrap();
    let (code, all) = check_state(&state);
    assert_eq!(code, Some(1), "{all}");
    assert!(
        all.contains("apps/main.sqlite: not an SQLite database")
            && all.contains("restore it from a backup"),
        "{all}"
    );
    // A state directory to be made where this user may not write.
    use std::os::unix::process::CommandExt;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        let exe_dir = tempfile::tempdir().unwrap();
        let exe = exe_for_nobody(true, exe_dir.path());
        let out = Command::new(&exe)
            .args(["check", "--link-port", "0", "--http-port", "0", "--state"])
            .arg(exe_dir.path().join("state"))
            .uid(65534)
            .gid(65534)
            .output()
            .unwrap();
        let all = text(&out);
        assert_eq!(out.status.code(), Some(1), "{all}");
        assert!(
            all.contains("missing, and this user may not make it"),
            "{all}"
        );
    }
}

/// An outside audit: `send --timeout 1e20` (or `inf`) panicked converting it to a duration; `NaN` waited for ever;
/// and a timeout shorter than reading the input once (`1e-9`) gave up before the first line was read, said
/// "standard input was empty" and exited 0 with nothing stored.
#[test]
fn send_timeouts_out_of_range_are_refused_and_a_tiny_one_never_says_the_input_was_empty() {
    let dir = tempfile::tempdir().unwrap();
    let (key, _) = keygen(dir.path(), "dev");
    let (_, node_key) = keygen(dir.path(), "node");
    let silent = UdpSocket::bind("127.0.0.1:0").unwrap();
    let to = silent.local_addr().unwrap().to_string();
    let send = |timeout: &str| {
        use std::io::Write;
        let mut child = Command::new(bin())
            .args(["send", "--key", key.to_str().unwrap(), "--node", &node_key])
            .args(["--to", &to, &format!("--timeout={timeout}")])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // A refused flag ends the command before it reads: the pipe may be closed already.
        let _ = child.stdin.take().unwrap().write_all(b"1\n2\n3\n4\n5\n");
        child.wait_with_output().unwrap()
    };
    for bad in ["1e20", "inf", "NaN", "-1"] {
        let out = send(bad);
        let t = text(&out);
        assert_eq!(out.status.code(), Some(2), "--timeout {bad}: {t}");
        assert!(t.contains("is not a number of seconds"), "{t}");
    }
    let out = send("1e-9");
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    assert!(
        t.contains("gave up: 5 of 5 records not acknowledged"),
        "{t}"
    );
    assert!(!t.contains("empty"), "{t}");
}

/// An outside audit: a store its node's user may not write (`chmod 444`) was served: `ready`, `/healthz` 200, and
/// the first record failed with SQLite's "attempt to write a readonly database", no fix named. It is said at
/// start, on `/healthz`, with the fix, and the app stores once the file may be written, without a restart.
#[test]
fn a_store_the_nodes_user_may_not_write_is_said_at_start_with_the_fix() {
    use std::io::{BufRead, BufReader};
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let dir = tempfile::tempdir().unwrap();
    let exe = exe_for_nobody(root, dir.path());
    let state = dir.path().join("state");
    let start = || {
        let free = TcpListener::bind("127.0.0.1:0").unwrap();
        let http = free.local_addr().unwrap();
        drop(free);
        let mut cmd = Command::new(&exe);
        cmd.arg("--state").arg(&state);
        cmd.args(["--bind", "127.0.0.1", "--link-port", "0", "--http-port"])
            .arg(http.port().to_string())
            .args(["--metrics-listen", "127.0.0.1:0"])
            .env_remove("NOTIFY_SOCKET")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null());
        if root {
            cmd.uid(65534).gid(65534);
        }
        let mut child = cmd.spawn().unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        for line in out.lines() {
            if line.unwrap() == "ready" {
                break;
            }
        }
        (child, http)
    };
    std::fs::create_dir(&state).unwrap();
    if root {
        std::os::unix::fs::chown(&state, Some(65534), Some(65534)).unwrap();
    }
    let (mut node, _) = start();
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(node.id() as i32, libc::SIGTERM) };
    assert!(node.wait().unwrap().success());
    let store = state.join("apps/main.sqlite");
    std::fs::set_permissions(&store, std::fs::Permissions::from_mode(0o444)).unwrap();
    let (mut node, http) = start();
    let (code, body) = ops_util::http_get(http, "/healthz");
    assert_eq!(code, 503, "{body}");
    assert!(
        body.contains("cannot be written by the node's user") && body.contains("chmod u+w"),
        "{body}"
    );
    std::fs::set_permissions(&store, std::fs::Permissions::from_mode(0o644)).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while ops_util::http_get(http, "/healthz").0 != 200 {
        assert!(std::time::Instant::now() < deadline, "never stored again");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    node.kill().unwrap();
    node.wait().unwrap();
}
