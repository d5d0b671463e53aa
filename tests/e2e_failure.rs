//! Failure boundaries with a real node: one app's store stops committing while records flow; that app stops alone
//! (its sender gets no ack and waits, `/healthz` is 503 naming it, `pure_app_can_store{app} 0`), the other app keeps
//! storing, and when the fault is gone the app resumes without a restart, with nothing lost or doubled.
//!
//! What really makes a commit fail, found on this machine (root, ext4, SQLite in WAL mode holding its files open):
//!
//! - `chmod 0444` on the `.sqlite` and `-wal` files: nothing. Root ignores modes, and SQLite writes through the
//!   descriptors it already has.
//! - a bind mount of the store's directory remounted read-only: the remount itself fails (`mount point is busy`)
//!   while a file on it is open for writing.
//! - `chattr +i` (immutable) on the `.sqlite` and `-wal` files of an ext4 store: every write, through open
//!   descriptors too, fails with EPERM; SQLite's commit fails with "disk I/O error". `chattr -i` undoes it. (On a
//!   tmpfs `chattr +i` is accepted and changes nothing for open descriptors.)
//! - a full filesystem (the store on a small tmpfs, then a file that fills it): the commit fails with "database or
//!   disk is full"; removing the file undoes it.
//!
//! So the tests use the last two. Both need root (CAP_LINUX_IMMUTABLE, mount); without it they say so and pass.

mod ops_util;
mod outlet_util;

use std::path::{Path, PathBuf};
use std::process::Command;

use ops_util::{NodeProcess, keygen, push};
use outlet_util::{args, assert_sent, metric, records, spawn_send, start, wait_until};

fn root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn run(cmd: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .map_err(|e| format!("{cmd}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{cmd} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// A fault of the store of app `bad`, and how to end it. Ended on drop too, so a failing test leaves nothing
/// immutable or mounted behind.
trait Fault {
    fn start(&mut self);
    fn end(&mut self);
}

/// `chattr +i` on the store's files.
struct Immutable {
    files: Vec<PathBuf>,
    on: bool,
}

impl Fault for Immutable {
    fn start(&mut self) {
        for f in &self.files {
            run("chattr", &["+i", f.to_str().unwrap()]).unwrap();
        }
        self.on = true;
    }
    fn end(&mut self) {
        for f in &self.files {
            let _ = run("chattr", &["-i", f.to_str().unwrap()]);
        }
        self.on = false;
    }
}

impl Drop for Immutable {
    fn drop(&mut self) {
        if self.on {
            self.end();
        }
    }
}

/// The store on a small tmpfs, filled by a file.
struct DiskFull {
    mount: PathBuf,
    filler: PathBuf,
}

impl Fault for DiskFull {
    fn start(&mut self) {
        use std::io::Write;
        let mut f = std::fs::File::create(&self.filler).unwrap();
        let block = vec![0u8; 64 << 10];
        // Until the filesystem is full: ENOSPC ends the loop.
        while f.write_all(&block).is_ok() {}
        let _ = f.sync_all();
    }
    fn end(&mut self) {
        let _ = std::fs::remove_file(&self.filler);
    }
}

impl Drop for DiskFull {
    fn drop(&mut self) {
        self.end();
        let _ = run("umount", &["-l", self.mount.to_str().unwrap()]);
    }
}

fn health(node: &NodeProcess) -> (u16, String) {
    node.http_get("/healthz")
}

fn can_store(node: &NodeProcess, app: &str) -> f64 {
    metric(node, &format!("pure_app_can_store{{app=\"{app}\"}}"))
}

/// Checks that `app` holds exactly `dev`'s records `1..=n`, once each, in order.
fn assert_all_once(state: &Path, app: &str, dev: &str, n: u64) {
    let got = records(state, app);
    assert_eq!(got.len() as u64, n, "{app}: count");
    for (k, r) in got.iter().enumerate() {
        let seq = k as u64 + 1;
        assert_eq!(r["source"], dev, "{app} record {k}");
        assert_eq!(r["seq"].as_u64(), Some(seq), "{app} record {k}");
        assert_eq!(
            r["payload"],
            format!("{dev} line {seq}"),
            "{app} record {k}"
        );
    }
}

/// Node with apps `good` and `bad`; `setup` may prepare the state directory before the node starts and returns
/// the fault for `bad`'s store, given the store's path.
fn one_store_fails_its_app_stops_alone(setup: impl FnOnce(&Path, &Path) -> Box<dyn Fault>) {
    const BEFORE: u64 = 100;
    const DURING: u64 = 500;
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir_all(state.join("apps")).unwrap();
    let (key_good, pub_good) = keygen(dir.path(), "d-good");
    let (key_bad, pub_bad) = keygen(dir.path(), "d-bad");
    let senders = dir.path().join("senders");
    std::fs::write(&senders, format!("d-good {pub_good}\nd-bad {pub_bad}\n")).unwrap();
    let apps = dir.path().join("apps.toml");
    std::fs::write(
        &apps,
        "[apps.good]\naccept = [\"d-good\"]\n[apps.bad]\naccept = [\"d-bad\"]\n",
    )
    .unwrap();
    let bad_store = state.join("apps").join("bad.sqlite");
    let mut fault = setup(dir.path(), &bad_store);
    // A store placed (a symbolic link to a small filesystem) before the node ever made its key looks like lost data
    // to the state guard (docs/durability.md): say it is meant.
    let node = start(
        &state,
        &args(&[
            "--senders",
            senders.to_str().unwrap(),
            "--apps",
            apps.to_str().unwrap(),
            "--accept-lost-state",
        ]),
        0,
        0,
    );
    let send = |key: &Path, app: &str, dev: &str, from: u64, n: u64| {
        let mut child = spawn_send(key, &node, app, 120);
        let mut stdin = child.stdin.take().unwrap();
        let mut text = String::new();
        for k in from..from + n {
            text.push_str(&format!("{dev} line {k}\n"));
        }
        std::thread::spawn(move || {
            use std::io::Write;
            stdin.write_all(text.as_bytes()).unwrap();
        });
        child
    };
    // Both apps store, so both stores and their write-ahead logs exist.
    assert_sent(send(&key_good, "good", "d-good", 1, BEFORE), "good, before");
    assert_sent(send(&key_bad, "bad", "d-bad", 1, BEFORE), "bad, before");
    assert_eq!(health(&node).0, 200);

    fault.start();
    // A push to the failing app, taken by the turn that finds its store failing or refused once it is known to:
    // nothing is queued either way (docs/downlink.md, exit 75).
    let (code, out) = push(&state, "bad", "d-bad", b"during the fault\n");
    assert_eq!(code, 75, "{out}");
    assert!(out.contains("nothing was queued"), "{out}");
    let mut stuck = send(&key_bad, "bad", "d-bad", BEFORE + 1, DURING);
    wait_until("/healthz to name app bad", || {
        let (code, body) = health(&node);
        code == 503 && body.contains("app bad cannot store")
    });
    assert_eq!(can_store(&node, "bad"), 0.0);
    // The other app goes on storing: a whole send to it completes while bad cannot store.
    assert_sent(
        send(&key_good, "good", "d-good", BEFORE + 1, DURING),
        "good, during",
    );
    assert_eq!(can_store(&node, "good"), 1.0);
    assert!(
        stuck.try_wait().unwrap().is_none(),
        "bad's sender got no ack and still waits"
    );
    assert_eq!(
        records(&state, "bad").len() as u64,
        BEFORE,
        "bad stored nothing more"
    );
    let (_, body) = health(&node);
    eprintln!("/healthz while the fault lasts: {}", body.trim());
    assert!(
        node.stderr_text().contains("app bad cannot store"),
        "the log says why"
    );

    // The fault ends: bad resumes by itself, and its waiting sender's records are all stored once.
    fault.end();
    wait_until("bad's sender to be acknowledged", || {
        stuck.try_wait().unwrap().is_some()
    });
    let out = stuck.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "bad's send after the fault: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_until("/healthz 200 again", || health(&node).0 == 200);
    assert_eq!(can_store(&node, "bad"), 1.0);
    // The push during the fault left nothing: the first one after it is numbered 1.
    let (code, out) = push(&state, "bad", "d-bad", b"after the fault\n");
    assert_eq!(code, 0, "{out}");
    assert!(out.contains(": sequence 1\n"), "{out}");
    assert_all_once(&state, "bad", "d-bad", BEFORE + DURING);
    assert_all_once(&state, "good", "d-good", BEFORE + DURING);
    assert!(
        node.stderr_text().contains("app bad can store again"),
        "the log says it recovered"
    );
    drop(node);
    drop(fault);
}

#[test]
fn a_store_made_immutable_stops_its_app_alone_and_it_resumes_when_writable() {
    if !root() {
        eprintln!("skipped: chattr +i needs root");
        return;
    }
    one_store_fails_its_app_stops_alone(|_, store| {
        let files = vec![store.to_path_buf(), store.with_extension("sqlite-wal")];
        Box::new(Immutable { files, on: false })
    });
}

#[test]
fn a_full_disk_stops_its_app_alone_and_it_resumes_when_there_is_room() {
    if !root() {
        eprintln!("skipped: mounting a tmpfs needs root");
        return;
    }
    one_store_fails_its_app_stops_alone(|dir, store| {
        let mount = dir.join("small");
        std::fs::create_dir_all(&mount).unwrap();
        run(
            "mount",
            &[
                "-t",
                "tmpfs",
                "-o",
                "size=4m",
                "tmpfs",
                mount.to_str().unwrap(),
            ],
        )
        .unwrap();
        // The store is a symbolic link into the small filesystem; SQLite puts its -wal beside the real file.
        std::os::unix::fs::symlink(mount.join("bad.sqlite"), store).unwrap();
        Box::new(DiskFull {
            filler: mount.join("filler"),
            mount,
        })
    });
}
