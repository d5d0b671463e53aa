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
