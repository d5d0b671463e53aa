//! The state directory guards (issue 8, items 1 and 4): a second node on the same state refuses to start naming the
//! first one's pid, and a state that looks like it lost data (a key gone beside its stores, a store gone that the
//! state's identity file says was made) is refused unless `--accept-lost-state`. Real processes, real files.

mod ops_util;

use std::path::Path;
use std::process::{Command, Output};

use ops_util::{NodeProcess, bin, keygen};

/// Runs a node that is expected not to start; returns its output.
fn run_refused(state: &Path, extra: &[&str]) -> Output {
    let out = Command::new(bin())
        .arg("--state")
        .arg(state)
        .args([
            "--bind",
            "127.0.0.1",
            "--link-port",
            "0",
            "--http-port",
            "0",
        ])
        .args(extra)
        .env_remove("NOTIFY_SOCKET")
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "the node started: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    // EX_CONFIG: a state that looks like it lost data is for the operator; systemd does not restart on it.
    assert_eq!(out.status.code(), Some(78), "{out:?}");
    out
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).to_string()
}

#[test]
fn a_second_node_on_the_same_state_refuses_and_names_the_first_ones_pid() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let first = NodeProcess::start(&state, &[], None);
    let out = run_refused(&state, &[]);
    let err = stderr(&out);
    assert!(
        err.contains(&format!(
            "in use by another pure-serve (pid {},",
            first.child.id()
        )),
        "{err}"
    );
    assert!(err.contains("--state"), "{err}");
    assert_eq!(err.matches("in use").count(), 1, "said once: {err}");
    // The first node still serves.
    let (_, key) = keygen(dir.path(), "nobody");
    assert!(!key.is_empty());
    assert_eq!(first.http_get("/healthz").0, 200);
    drop(first);
    // Once it is gone (killed: no clean stop), the state is free.
    let again = NodeProcess::start(&state, &[], None);
    drop(again);
}

#[test]
fn a_key_deleted_beside_its_stores_is_refused_until_told() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let node = NodeProcess::start(&state, &[], None);
    let old_key = node.public_key.clone();
    drop(node);
    assert!(state.join("identity").exists());
    std::fs::remove_file(state.join("node.key")).unwrap();
    let err = stderr(&run_refused(&state, &[]));
    assert!(err.contains("looks like it lost data"), "{err}");
    assert!(err.contains("node.key is missing"), "{err}");
    assert!(
        err.contains(&old_key),
        "names the key the state belongs to: {err}"
    );
    assert!(err.contains("--accept-lost-state"), "{err}");
    assert!(!state.join("node.key").exists(), "no key was made");
    let node = NodeProcess::start(&state, &["--accept-lost-state"], None);
    assert_ne!(node.public_key, old_key);
    drop(node);
    // The identity file now names the new key: a plain start is fine again.
    let node = NodeProcess::start(&state, &[], None);
    drop(node);
}

#[test]
fn a_store_deleted_while_the_node_was_stopped_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    drop(NodeProcess::start(&state, &[], None));
    for f in ["main.sqlite", "main.sqlite-wal", "main.sqlite-shm"] {
        let _ = std::fs::remove_file(state.join("apps").join(f));
    }
    let err = stderr(&run_refused(&state, &[]));
    assert!(err.contains("the store of app main"), "{err}");
    assert!(err.contains("apps/main.sqlite"), "{err}");
    drop(NodeProcess::start(&state, &["--accept-lost-state"], None));
}

#[test]
fn the_whole_state_deleted_but_the_key_kept_outside_starts_afresh_with_the_same_key() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let (key, public) = keygen(dir.path(), "node");
    let k = key.to_str().unwrap();
    let node = NodeProcess::start(&state, &["--key", k], None);
    assert_eq!(node.public_key, public);
    drop(node);
    // The state's identity names the key: swapping in another key is refused.
    let (other, _) = keygen(dir.path(), "other");
    let err = stderr(&run_refused(&state, &["--key", other.to_str().unwrap()]));
    assert!(err.contains("says this state belongs to node"), "{err}");
    std::fs::remove_dir_all(&state).unwrap();
    let node = NodeProcess::start(&state, &["--key", k], None);
    assert_eq!(node.public_key, public);
}

/// `pure-serve records --json` of app `main`: how many records it prints, or its error.
fn records_of_main(state: &Path) -> Result<usize, String> {
    let out = Command::new(bin())
        .args(["records", "--app", "main", "--state"])
        .arg(state)
        .output()
        .unwrap();
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).lines().count())
    } else {
        Err(stderr(&out))
    }
}

/// Zeroes `pages` 4 KiB pages of `file` from page `from` (1-based): what a disk that lost their writes reads back.
fn zero_pages(file: &Path, from: u64, pages: u64) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(file).unwrap();
    f.write_all_at(&vec![0u8; (pages * 4096) as usize], (from - 1) * 4096)
        .unwrap();
    f.sync_all().unwrap();
}

/// A state with a device's records stored by a node that was then stopped cleanly (SIGTERM), for the tests of
/// what a later start or reader finds.
struct StoppedCleanly {
    dir: tempfile::TempDir,
    state: std::path::PathBuf,
    key: std::path::PathBuf,
    senders: String,
}

impl StoppedCleanly {
    fn new(records: &[String]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let (key, public) = keygen(dir.path(), "dev");
        let senders = dir.path().join("senders");
        std::fs::write(&senders, format!("dev {public}\n")).unwrap();
        let senders = senders.to_str().unwrap().to_string();
        let mut node = NodeProcess::start(&state, &["--senders", &senders], None);
        let (ok, said) = node.send(&key, records, "60");
        assert!(ok, "{said}");
        node.signal(libc::SIGTERM);
        assert_eq!(node.wait_exit(), Some(0));
        StoppedCleanly {
            dir,
            state,
            key,
            senders,
        }
    }

    fn args(&self) -> [&str; 2] {
        ["--senders", &self.senders]
    }
}

/// 3,000 records of about 200 bytes: a store of several hundred pages.
fn many_records() -> Vec<String> {
    (1..=3000)
        .map(|i| format!("r{i} {}", "x".repeat(200)))
        .collect()
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + ops_util::DEADLINE;
    while !done() {
        assert!(std::time::Instant::now() < deadline, "waited for {what}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn a_damaged_store_is_never_served_and_says_what_it_lost_and_the_way_back() {
    // A clean stop names the store in STATE/clean-stop: the next start does not read it whole.
    let stopped = StoppedCleanly::new(&many_records());
    let (state, key, args) = (stopped.state.clone(), stopped.key.clone(), stopped.args());
    let senders = Path::new(&stopped.senders);
    let marker = state.join("clean-stop");
    let named = std::fs::read_to_string(&marker).unwrap();
    assert!(
        named
            .lines()
            .any(|l| l.split_whitespace().take(2).eq(["app", "main"])),
        "{named}"
    );
    // After a clean stop the file alone holds every record (docs/durability.md): its -wal may go, as SQLite's
    // own tools would remove it.
    let store = state.join("apps/main.sqlite");
    for suffix in ["-wal", "-shm"] {
        std::fs::remove_file(format!("{}{suffix}", store.display())).unwrap();
    }
    assert_eq!(records_of_main(&state), Ok(3000));
    let mut node = NodeProcess::start(&state, &args, None);
    assert!(!marker.exists(), "taken at start");
    assert!(
        !node.stderr_text().contains("checked whole"),
        "{}",
        node.stderr_text()
    );
    // Stopped with nothing stored in its run, its -wal empty: a clean stop too, not a failed checkpoint (an idle
    // node's stop once said the disk failed, and the next start read the store whole).
    node.signal(libc::SIGTERM);
    assert_eq!(node.wait_exit(), Some(0));
    let log = node.stderr_text();
    assert!(!log.contains("checkpoint before the stop failed"), "{log}");
    drop(node);
    let named = std::fs::read_to_string(&marker).unwrap();
    assert!(
        named
            .lines()
            .any(|l| l.split_whitespace().take(2).eq(["app", "main"])),
        "{named}"
    );
    let node = NodeProcess::start(&state, &args, None);
    assert!(
        !node.stderr_text().contains("checked whole"),
        "{}",
        node.stderr_text()
    );
    // SIGKILLed: no clean-stop, so the next start reads the store whole, finds it sound and serves it.
    drop(node);
    assert!(!marker.exists());
    let node = NodeProcess::start(&state, &args, None);
    let log = node.stderr_text();
    assert!(
        log.contains("checked whole (the last run of the node did not end cleanly)")
            && log.contains("nothing damaged"),
        "{log}"
    );
    assert_eq!(
        node.metric_published("pure_app_can_store{app=\"main\"}"),
        1.0,
        "{log}"
    );
    drop(node);

    // The pages a dying disk lost, read back as zeros (as an outside test found them after an fsck): refused,
    // as a store that is not a database is, naming the file, what is lost and the way back.
    assert_eq!(records_of_main(&state), Ok(3000));
    zero_pages(&store, 40, 40);
    let out = run_refused(&state, &args);
    let err = stderr(&out);
    let path = store.display().to_string();
    assert!(err.contains(&format!("store {path} is damaged")), "{err}");
    assert!(err.contains("--accept-lost-state"), "{err}");
    assert!(err.contains("backup"), "{err}");
    assert_eq!(err.matches("is damaged").count(), 1, "said once: {err}");

    // Told to go on without it: the damaged files are kept aside, and the app serves from an empty store.
    let node = NodeProcess::start(
        &state,
        &[
            "--senders",
            senders.to_str().unwrap(),
            "--accept-lost-state",
        ],
        None,
    );
    let log = node.stderr_text();
    assert!(log.contains("moved aside"), "{log}");
    wait_for("main to store", || {
        node.metric("pure_app_can_store{app=\"main\"}") == Some(1.0)
    });
    let aside: Vec<_> = std::fs::read_dir(state.join("apps"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("main.sqlite.damaged-"))
        .collect();
    assert!(!aside.is_empty(), "kept aside");
    let (ok, said) = node.send(&key, &["again".to_string()], "30");
    assert!(ok, "{said}");
}

/// An outside audit: after a kill of the node, a `records --follow` still reading its store kept the app from
/// storing at the next start (the whole read of the store waited for it to close, saying "after a disk fault").
/// With no fault of the disk seen, the check reads beside it, and the app stores at once.
#[test]
fn a_follower_left_reading_does_not_keep_the_app_from_storing_after_a_kill() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let (key, public) = keygen(dir.path(), "dev");
    let senders = dir.path().join("senders");
    std::fs::write(&senders, format!("dev {public}\n")).unwrap();
    let args = ["--senders", senders.to_str().unwrap()];
    let node = NodeProcess::start(&state, &args, None);
    let (ok, said) = node.send(&key, &["a1".to_string(), "a2".to_string()], "60");
    assert!(ok, "{said}");
    let mut follower = Command::new(bin())
        .args(["records", "--follow", "--from", "1", "--state"])
        .arg(&state)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(follower.stdout.take().unwrap()).lines();
    for _ in 0..2 {
        lines.next().unwrap().unwrap();
    }
    // SIGKILL (the drop): no clean stop, so the next start reads the store whole.
    drop(node);
    let node = NodeProcess::start(&state, &args, None);
    let (ok, said) = node.send(&key, &["b1".to_string()], "20");
    let log = node.stderr_text();
    assert!(ok, "{said}\n{log}");
    assert!(log.contains("checked beside it"), "{log}");
    assert!(!log.contains("cannot store"), "{log}");
    // The follower read on through all of it, and prints the new record.
    let next = lines.next().unwrap().unwrap();
    assert!(next.contains("b1"), "{next}");
    follower.kill().unwrap();
    follower.wait().unwrap();
}

/// An outside audit: a store damaged while the node was stopped after a clean stop was served, and acknowledged
/// into, until a later kill made the next start read it whole and refuse it. `STATE/clean-stop` now holds each
/// store's size and time of change: a store changed since is read whole, and refused when damaged.
#[test]
fn a_store_damaged_after_a_clean_stop_is_read_whole_and_refused() {
    let stopped = StoppedCleanly::new(&many_records());
    zero_pages(&stopped.state.join("apps/main.sqlite"), 40, 10);
    let out = run_refused(&stopped.state, &stopped.args());
    let err = stderr(&out);
    assert!(
        err.contains("changed since the node's last clean stop"),
        "{err}"
    );
    assert!(err.contains("is damaged"), "{err}");
}

/// An outside audit: a cleanly stopped state copied to a read-only mount (a backup, docs/operations.md) could not
/// be read: "unable to open database file", no reason. SQLite reads a WAL store through a `-shm` it makes beside
/// it; with none there and none to be made, a store whose `-wal` is empty is read as the file holds it, and one
/// with records in its `-wal` says to copy it where it can be read. Needs root, for the mount.
#[test]
fn a_cleanly_stopped_store_on_a_read_only_mount_is_read() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return;
    }
    let stopped = StoppedCleanly::new(&["a".to_string(), "b".to_string()]);
    let (dir, state) = (&stopped.dir, stopped.state.clone());
    // The copy: the store file alone (what a clean stop leaves whole).
    let copy = dir.path().join("copy");
    std::fs::create_dir_all(copy.join("apps")).unwrap();
    std::fs::copy(
        state.join("apps/main.sqlite"),
        copy.join("apps/main.sqlite"),
    )
    .unwrap();
    let ro = dir.path().join("ro");
    std::fs::create_dir(&ro).unwrap();
    let mount = |args: &[&str]| Command::new("mount").args(args).status().unwrap().success();
    assert!(mount(&[
        "--bind",
        copy.to_str().unwrap(),
        ro.to_str().unwrap()
    ]));
    let read = (|| {
        if !mount(&["-o", "remount,ro,bind", ro.to_str().unwrap()]) {
            return Err("remount read-only failed".to_string());
        }
        let whole = records_of_main(&ro);
        // Records in a -wal beside it that cannot be read without a -shm: said, with the way.
        std::fs::write(copy.join("apps/main.sqlite-wal"), b"frames").unwrap();
        let with_wal = records_of_main(&ro);
        Ok((whole, with_wal))
    })();
    assert!(Command::new("umount").arg(&ro).status().unwrap().success());
    let (whole, with_wal) = read.unwrap();
    assert_eq!(whole, Ok(2));
    let err = with_wal.unwrap_err();
    assert!(err.contains("copy the store with its -wal"), "{err}");
}

/// A `STATE/lock` that is a FIFO is refused at once, naming it, rather than started on (a lock naming no one) or
/// read by a second node for ever, deaf to SIGTERM; a `STATE/senders.idx` that is one is an index that fails its
/// checks, rebuilt, not a start blocked before `ready` (an outside audit found both hangs).
#[test]
fn state_files_that_are_fifos_neither_block_a_start_nor_are_used() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    ops_util::mkfifo(&state.join("lock"));
    let mut cmd = Command::new(bin());
    cmd.arg("--state")
        .arg(&state)
        .args([
            "--bind",
            "127.0.0.1",
            "--link-port",
            "0",
            "--http-port",
            "0",
        ])
        .env_remove("NOTIFY_SOCKET");
    let out = ops_util::output_within(&mut cmd);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(78), "{err}");
    assert!(err.contains("lock") && err.contains("is a FIFO"), "{err}");

    std::fs::remove_file(state.join("lock")).unwrap();
    let node = NodeProcess::start(&state, &[], None);
    drop(node);
    let index = state.join("senders.idx");
    let _ = std::fs::remove_file(&index);
    ops_util::mkfifo(&index);
    let (_, public) = keygen(dir.path(), "dev");
    let senders = dir.path().join("senders");
    std::fs::write(&senders, format!("dev {public}\n")).unwrap();
    let node = NodeProcess::start(&state, &["--senders", senders.to_str().unwrap()], None);
    assert_eq!(node.http_get("/healthz").0, 200);
    assert!(std::fs::metadata(&index).unwrap().is_file(), "rebuilt");
}
