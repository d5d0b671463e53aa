//! SIGHUP re-reads the apps file, end to end (issue 7): a new app with an inner outlet takes effect without a
//! restart (and is filled with what was stored before), an accept list change refuses a sender (REFUSE reason 2),
//! a bad file is refused naming its line and the apps in force stay, and removing an app is reported as needing a
//! restart.

mod ops_util;

use std::time::Instant;

use ops_util::*;

fn reload(node: &NodeProcess, notify: &NotifySocket) {
    node.signal(libc::SIGHUP);
    notify.until("RELOADING=1");
    notify.until("READY=1");
}

fn count(state: &std::path::Path, app: &str) -> usize {
    pure_serve::store::open_app_for_reading(state, app)
        .and_then(|s| s.read_head())
        .map_or(0, |h| (h - 1) as usize)
}

fn wait_for_log(node: &NodeProcess, needle: &str) -> String {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let err = node.stderr_text();
        if err.contains(needle) {
            return err;
        }
        assert!(
            Instant::now() < deadline,
            "log never said {needle:?}: {err}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn apps_reload_adds_apps_changes_accept_lists_and_refuses_bad_files() {
    let dir = tempfile::tempdir().unwrap();
    let (key, public) = keygen(dir.path(), "dev");
    let senders = dir.path().join("senders");
    write_atomic(&senders, &format!("dev {public}\n"));
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
    let batch = |tag: &str| (1..=10).map(|i| format!("{tag} {i}")).collect::<Vec<_>>();
    assert!(node.send(&key, &batch("first"), "30").0);

    // A new app fed by an inner outlet: it gets main's records from the start, without a restart.
    write_atomic(
        &apps,
        "[apps.main]\n[apps.main.outlets.copy]\nkind = \"app\"\napp = \"copy\"\n[apps.copy]\naccept = []\n",
    );
    reload(&node, &notify);
    wait_for_log(&node, "app copy added");
    let deadline = Instant::now() + DEADLINE;
    while count(&state, "copy") < 10 {
        assert!(Instant::now() < deadline, "copy never got main's records");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(node.send(&key, &batch("second"), "30").0);
    let deadline = Instant::now() + DEADLINE;
    while count(&state, "copy") < 20 {
        assert!(Instant::now() < deadline, "copy never got the new records");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }

    // A bad file: refused with its file and line; the apps in force stay (dev may still send to main).
    write_atomic(&apps, "[apps.main]\naccept = [\"dev\"\n");
    reload(&node, &notify);
    let log = wait_for_log(&node, "reload of");
    assert!(log.contains("apps.toml:2"), "{log}");
    assert!(log.contains("the apps in force stay"), "{log}");
    assert!(node.send(&key, &batch("third"), "30").0);

    // Only `other` may send to main now, and copy is gone from the file: dev is refused (reason 2), and copy keeps
    // running until a restart, as the log says.
    write_atomic(&apps, "[apps.main]\naccept = [\"other\"]\n");
    reload(&node, &notify);
    let log = wait_for_log(&node, "no longer in the file");
    assert!(log.contains("app copy"), "{log}");
    // Not all of the file is in force: a reload refused in part, said once (it was said twice, and counted as
    // applied whole).
    assert_eq!(
        node.stderr_text().matches("no longer in the file").count(),
        1,
        "{}",
        node.stderr_text()
    );
    assert_eq!(node.metric("pure_reloads_failed_total"), Some(2.0));
    let (ok, out) = node.send(&key, &batch("refused"), "10");
    assert!(!ok, "{out}");
    assert!(out.contains("refused"), "{out}");
    assert_eq!(
        count(&state, "main"),
        30,
        "nothing of the refused sender stored"
    );
}

/// A refused apps file counts and shows as a refused reload does (issue 18, item 2): `pure_reloads_failed_total`
/// goes up and `pure_reloads_total` does not, though the senders file was fine, and STATUS says so until a reload
/// that takes the apps file.
#[test]
fn a_refused_apps_file_counts_as_a_refused_reload_and_stays_in_status_until_a_good_one() {
    let dir = tempfile::tempdir().unwrap();
    let (_, public) = keygen(dir.path(), "dev");
    let senders = dir.path().join("senders");
    write_atomic(&senders, &format!("dev {public}\n"));
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
    write_atomic(&apps, "[apps.main]\nturn_records = \"many\"\n");
    node.signal(libc::SIGHUP);
    notify.until("RELOADING=1");
    let ready = notify.until("READY=1");
    let status = ready
        .iter()
        .find_map(|m| field(m, "STATUS"))
        .unwrap_or_default()
        .to_string();
    assert!(
        status.contains("last reload of the apps file refused") && status.contains("apps.toml:2"),
        "{ready:?}"
    );
    assert_eq!(node.metric("pure_reloads_failed_total"), Some(1.0));
    assert_eq!(node.metric("pure_reloads_total"), Some(0.0));
    // A later reload whose senders file is fine does not hide the apps file still refused.
    reload(&node, &notify);
    assert_eq!(node.metric("pure_reloads_failed_total"), Some(2.0));
    write_atomic(&apps, "[apps.main]\nturn_records = 500\n");
    node.signal(libc::SIGHUP);
    notify.until("RELOADING=1");
    let ready = notify.until("READY=1");
    let status = ready
        .iter()
        .find_map(|m| field(m, "STATUS"))
        .unwrap_or_default()
        .to_string();
    assert!(!status.contains("refused"), "{status}");
    assert_eq!(node.metric("pure_reloads_total"), Some(1.0));
    assert_eq!(node.metric("pure_reloads_failed_total"), Some(2.0));
}

/// An outside audit: an app renamed by a reload (which makes the new name's store), the node stopped, and the old
/// store's file renamed to the new name as docs/apps.md said: the new store's `-wal`, left by the stop, was read
/// over the renamed file and the records were gone. A clean stop now leaves every `-wal` empty; the log's advice
/// names the `-wal` and `-shm` too.
#[test]
fn an_app_renamed_by_renaming_its_store_after_a_reload_and_a_stop_keeps_its_records() {
    let dir = tempfile::tempdir().unwrap();
    let (key, public) = keygen(dir.path(), "dev");
    let senders = dir.path().join("senders");
    write_atomic(&senders, &format!("dev {public}\n"));
    let apps = dir.path().join("apps.toml");
    write_atomic(&apps, "[apps.main]\n");
    let notify = NotifySocket::path();
    let state = dir.path().join("state");
    let args = [
        "--senders",
        senders.to_str().unwrap(),
        "--apps",
        apps.to_str().unwrap(),
    ];
    let mut node = NodeProcess::start(&state, &args, Some(&notify));
    notify.until("READY=1");
    let records: Vec<String> = (1..=10).map(|i| format!("r{i}")).collect();
    assert!(node.send(&key, &records, "30").0);
    write_atomic(&apps, "[apps.kept]\n");
    reload(&node, &notify);
    let log = wait_for_log(&node, "if main was renamed to kept");
    assert!(log.contains("-wal and -shm"), "{log}");
    node.signal(libc::SIGTERM);
    assert_eq!(node.wait_exit(), Some(0));
    drop(node);
    let apps_dir = state.join("apps");
    for suffix in ["", "-wal", "-shm"] {
        let wal = apps_dir.join(format!("kept.sqlite{suffix}"));
        if suffix == "-wal" && wal.exists() {
            assert_eq!(
                std::fs::metadata(&wal).unwrap().len(),
                0,
                "kept's -wal after a clean stop"
            );
        }
    }
    // Only the file, as the document said before.
    std::fs::rename(apps_dir.join("main.sqlite"), apps_dir.join("kept.sqlite")).unwrap();
    let node = NodeProcess::start(&state, &args, None);
    assert_eq!(count(&state, "kept"), 10);
    drop(node);
    assert_eq!(count(&state, "kept"), 10);
}
