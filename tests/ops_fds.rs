//! The limit on open files (issue 14, item 3), with the real binary under limits set for it: the node raises its
//! soft limit to the hard one; a configuration that needs more descriptors than it may open is refused before
//! anything is opened, with one message that names the numbers and the fix, and `check` says the same; a reload
//! that would pass the limit keeps the apps in force; and a running node holds no more than it estimates.

mod ops_util;

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use ops_util::*;
use pure_serve::ops::fds::{FDS_BASE, FDS_PER_OUTLET};
use pure_serve::store::FDS_PER_STORE;

/// Has `cmd`'s process start with this limit on open files.
fn with_nofile(cmd: &mut Command, soft: u64, hard: u64) -> &mut Command {
    // SAFETY: setrlimit is async-signal-safe, and the closure touches nothing but its two copied integers.
    unsafe {
        cmd.pre_exec(move || {
            let r = libc::rlimit {
                rlim_cur: soft,
                rlim_max: hard,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &r) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    }
}

fn hard_limit() -> u64 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the struct it is given.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) }, 0);
    r.rlim_max
}

/// An apps file of `n` apps `a0 … a(n-1)`, the first with `extra` lines in its table.
fn apps_file(dir: &Path, name: &str, n: usize, extra: &str) -> PathBuf {
    let path = dir.join(name);
    let mut text = format!("[apps.a0]\n{extra}");
    for i in 1..n {
        text.push_str(&format!("[apps.a{i}]\n"));
    }
    write_atomic(&path, &text);
    path
}

fn text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn wait_for_log(node: &NodeProcess, needle: &str) -> String {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let log = node.stderr_text();
        if log.contains(needle) {
            return log;
        }
        assert!(
            Instant::now() < deadline,
            "log never said {needle:?}: {log}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What the node's start line says the configuration needs.
fn estimate(log: &str) -> u64 {
    let (_, rest) = log
        .split_once("the configuration needs about ")
        .unwrap_or_else(|| panic!("no estimate in the log: {log}"));
    rest.split(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

fn open_descriptors(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count() as u64
}

#[test]
fn five_hundred_apps_under_1024_descriptors_are_refused_with_one_message_and_check_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let apps = apps_file(dir.path(), "apps.toml", 500, "");
    let state = dir.path().join("state");
    let out = output_within(with_nofile(
        &mut node_command(&state, &["--apps", apps.to_str().unwrap()], None),
        1024,
        1024,
    ));
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "it started: {err}");
    let need = 500 * FDS_PER_STORE;
    let (_, message) = err
        .split_once("the node did not start: ")
        .unwrap_or_else(|| panic!("{err}"));
    let message = message.trim();
    assert!(
        message.starts_with("the configuration needs about ")
            && message.contains(&format!("(500 app stores at {FDS_PER_STORE} each"))
            && message
                .contains("the limit on open files (RLIMIT_NOFILE) is 1024: raise it to at least")
            && message.contains("`LimitNOFILE=4096` in the systemd unit")
            && message.contains("`ulimit -n 4096`"),
        "{message}"
    );
    assert!(estimate(message) > need, "{message}");
    // Said once, and before anything was opened: no store tried, so none of SQLite's words.
    assert_eq!(err.matches("file descriptors").count(), 1, "{err}");
    assert!(!err.contains("unable to open database file"), "{err}");
    assert!(!err.contains("Too many open files"), "{err}");
    assert!(!state.join("apps").exists());

    let out = output_within(with_nofile(
        Command::new(bin()).args([
            "check",
            "--state",
            state.to_str().unwrap(),
            "--apps",
            apps.to_str().unwrap(),
            "--link-port",
            "0",
            "--http-port",
            "0",
        ]),
        1024,
        1024,
    ));
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    assert!(t.contains(&format!("problem: {message}")), "{t}");
    assert!(t.contains("1 problem found"), "{t}");

    // With room for them, check says what the configuration needs and what the node may open.
    let out = output_within(with_nofile(
        Command::new(bin()).args([
            "check",
            "--state",
            state.to_str().unwrap(),
            "--apps",
            apps.to_str().unwrap(),
            "--link-port",
            "0",
            "--http-port",
            "0",
        ]),
        1024,
        8192,
    ));
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(
        t.contains(&format!(
            "ok: file descriptors: the configuration needs about {}; a node started from here may open 8192",
            estimate(message)
        )),
        "{t}"
    );
}

#[test]
fn the_soft_limit_is_raised_to_the_hard_one() {
    let hard = hard_limit();
    assert!(
        hard > 512,
        "this test needs a hard limit on open files above 512, not {hard}"
    );
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let child = with_nofile(&mut node_command(&state, &[], None), 256, hard)
        .spawn()
        .unwrap();
    let node = NodeProcess::attach(child, &state);
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", node.child.id())).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    let fields: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(fields[3..5], [hard.to_string(), hard.to_string()], "{line}");
    wait_for_log(
        &node,
        &format!("file descriptors: {hard} (soft limit raised from 256)"),
    );
}

#[test]
fn a_running_node_holds_no_more_descriptors_than_it_estimates() {
    let dir = tempfile::tempdir().unwrap();
    let (_, far) = keygen(dir.path(), "far");
    // A link outlet (a UDP socket of its own) and an inner one (none) beside the stores.
    let outlets = format!(
        "[apps.a0.outlets.up]\nkind = \"link\"\nto = \"127.0.0.1:9\"\nnode_key = \"{far}\"\n\
         [apps.a0.outlets.copy]\nkind = \"app\"\napp = \"a1\"\n"
    );
    let mut held = Vec::new();
    for (n, name) in [(2, "small"), (12, "large")] {
        let apps = apps_file(dir.path(), &format!("{name}.toml"), n, &outlets);
        let state = dir.path().join(name);
        let node = NodeProcess::start(&state, &["--apps", apps.to_str().unwrap()], None);
        let need = estimate(&wait_for_log(&node, "the configuration needs about"));
        // Let the sending loop and the outlets settle before counting.
        std::thread::sleep(Duration::from_millis(500));
        let open = open_descriptors(node.child.id());
        // What stands open: within the node's own, its stores and its outlets; the estimate's HTTP connections
        // and passing descriptors are on top.
        let standing = FDS_BASE + n as u64 * FDS_PER_STORE + FDS_PER_OUTLET;
        assert!(
            open <= standing && standing < need,
            "{n} apps: {open} open, {standing} estimated standing, {need} in all"
        );
        held.push(open);
    }
    let per_app = (held[1] - held[0]) as f64 / 10.0;
    assert!(
        per_app <= FDS_PER_STORE as f64,
        "each app holds {per_app} descriptors, more than FDS_PER_STORE ({FDS_PER_STORE})"
    );
}

#[test]
fn a_reload_past_the_limit_keeps_the_apps_in_force() {
    let dir = tempfile::tempdir().unwrap();
    let (_, public) = keygen(dir.path(), "dev");
    let senders = dir.path().join("senders");
    write_atomic(&senders, &format!("dev {public}\n"));
    let apps = apps_file(dir.path(), "apps.toml", 1, "");
    let notify = NotifySocket::path();
    let state = dir.path().join("state");
    let args = [
        "--senders",
        senders.to_str().unwrap(),
        "--apps",
        apps.to_str().unwrap(),
    ];
    let child = with_nofile(&mut node_command(&state, &args, Some(&notify)), 512, 512)
        .spawn()
        .unwrap();
    let node = NodeProcess::attach(child, &state);
    notify.until("READY=1");
    // 100 apps need some 1000 descriptors; the node may open 512.
    apps_file(dir.path(), "apps.toml", 100, "");
    node.signal(libc::SIGHUP);
    notify.until("RELOADING=1");
    notify.until("READY=1");
    let log = wait_for_log(
        &node,
        "the apps in force stay: the configuration needs about",
    );
    assert!(log.contains("RLIMIT_NOFILE) is 512"), "{log}");
    assert!(!log.contains("unable to open database file"), "{log}");
    assert!(!state.join("apps/a1.sqlite").exists());
    assert!(state.join("apps/a0.sqlite").exists());
}
