//! Two nodes of one fleet cloned from one SD card (issue 34, item 2): the same host name (`raspberrypi`, as every
//! Pi of one image is called), their state at the same path, and that state a copy of one directory — identity
//! file, memo and all. Each node runs in mount and UTS namespaces of its own (`unshare --mount --uts`), where its
//! copy of the state is bind-mounted at one path both share and the host name is set alike, so that nothing a node
//! can see of itself tells the two apart. They share one PostgreSQL and one webhook outlet.
//!
//! What must hold (docs/scale-out.md, "Outlets of a fleet"): never both drive the outlet at once, and every record
//! reaches the receiver, none twice. Sampled over longer than a lease (10 s), with records stored through both.
//!
//! Needs root (namespaces, bind mounts) and PostgreSQL: without either it says `skipped:` and why, unless
//! `PURE_REQUIRE_NETNS=1` (`.ci/run`), where it fails.

#[path = "fleet_util/mod.rs"]
mod fleet_util;
#[path = "http_util/mod.rs"]
mod http_util;
#[path = "ops_util/mod.rs"]
mod ops_util;
#[path = "outlet_util/mod.rs"]
mod outlet_util;
#[path = "pg_util/mod.rs"]
mod pg_util;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use fleet_util::{keys_with_public, send_all};
use ops_util::{NodeProcess, node_command};

/// Whether this machine can run the test; if not, says why and returns false, or fails where it is required.
fn can_run() -> bool {
    let required = std::env::var_os("PURE_REQUIRE_NETNS").is_some_and(|v| v == "1");
    let mut missing = Vec::new();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        missing.push("root (mount and UTS namespaces need it)");
    }
    let unshare = Command::new("unshare")
        .args(["--mount", "--uts", "true"])
        .output();
    if !unshare.is_ok_and(|o| o.status.success()) {
        missing.push("`unshare --mount --uts` (util-linux)");
    }
    if !pg_util::installed() {
        missing.push("PostgreSQL (/usr/lib/postgresql/*/bin; apt-get install postgresql)");
    }
    if missing.is_empty() {
        return true;
    }
    assert!(
        !required,
        "PURE_REQUIRE_NETNS=1 but this machine lacks: {}",
        missing.join(", ")
    );
    eprintln!(
        "skipped: the cloned nodes' test needs {}; run it as root",
        missing.join(", ")
    );
    false
}

/// The path both clones see their state at (each its own copy, bind-mounted there in its own namespace).
fn shared_state_path(dir: &Path) -> std::path::PathBuf {
    let at = dir.join("var-lib-pure-serve");
    std::fs::create_dir_all(&at).unwrap();
    at
}

/// Starts a node whose state is `copy`, seen by it at `at`, on a host named `raspberrypi`.
fn start_clone(copy: &Path, at: &Path, args: &[&str]) -> NodeProcess {
    let inner = node_command(at, args, None);
    let mut cmd = Command::new("unshare");
    cmd.args(["--mount", "--uts", "--propagation", "private", "sh", "-c"])
        .arg(r#"echo raspberrypi > /proc/sys/kernel/hostname && mount --bind "$1" "$2" && shift 2 && exec "$@""#)
        .arg("sh")
        .arg(copy)
        .arg(at)
        .arg(inner.get_program())
        .args(inner.get_args())
        .env("RUST_LOG", "info")
        .env_remove("NOTIFY_SOCKET")
        .env_remove("WATCHDOG_USEC")
        .env_remove("WATCHDOG_PID")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    NodeProcess::attach(cmd.spawn().unwrap(), copy)
}

#[test]
fn two_nodes_cloned_from_one_card_with_one_host_name_never_drive_one_outlet_at_once() {
    if !can_run() {
        return;
    }
    let Some(cluster) = pg_util::PgCluster::start(
        "two_nodes_cloned_from_one_card_with_one_host_name_never_drive_one_outlet_at_once",
    ) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (node_key, node_public, device_key, senders) = keys_with_public(dir.path());
    let ca_dir = dir.path().join("ca");
    std::fs::create_dir_all(&ca_dir).unwrap();
    let ca = http_util::test_ca(&ca_dir);
    let server =
        outlet_util::HookServer::start(&ca.cert_file, &ca.key_file, |_| outlet_util::Answer::Ok);
    let apps = dir.path().join("fleet.toml");
    std::fs::write(
        &apps,
        format!(
            "[apps.main]\n[apps.main.outlets.hook]\nkind = \"webhook\"\nurl = \"https://localhost:{}/ingest\"\n\
             ca_file = \"{}\"\nbatch_records = 50\n",
            server.port(),
            ca.ca_file.display()
        ),
    )
    .unwrap();
    let url = cluster.url();
    let args = [
        "--key",
        node_key.to_str().unwrap(),
        "--senders",
        senders.to_str().unwrap(),
        "--apps",
        apps.to_str().unwrap(),
        "--store",
        &url,
    ];
    let at = shared_state_path(dir.path());

    // The card: a node ran on it once and stopped; then it was copied, state and all.
    let card = dir.path().join("card");
    std::fs::create_dir_all(&card).unwrap();
    let mut first = start_clone(&card, &at, &args);
    first.signal(libc::SIGTERM);
    assert_eq!(first.wait_exit(), Some(0), "{}", first.stderr_text());
    drop(first);
    let copy = dir.path().join("copy");
    let cp = Command::new("cp")
        .arg("-a")
        .arg(&card)
        .arg(&copy)
        .status()
        .unwrap();
    assert!(cp.success());

    let nodes = [
        start_clone(&card, &at, &args),
        start_clone(&copy, &at, &args),
    ];
    let series = "pure_outlet_driving{app=\"main\",outlet=\"hook\"}";
    let mut both = 0;
    let mut samples = 0;
    let mut total = 0u64;
    let mut feed = 0;
    // Longer than a lease, with records stored through both nodes meanwhile.
    let until = Instant::now() + Duration::from_secs(14);
    while Instant::now() < until {
        send_all(None, &device_key, &node_public, nodes[feed % 2].link, 200);
        total += 200;
        feed += 1;
        for _ in 0..5 {
            let driving: Vec<f64> = nodes
                .iter()
                .map(|n| n.metric(series).unwrap_or(0.0))
                .collect();
            samples += 1;
            if driving.iter().all(|d| *d == 1.0) {
                both += 1;
            }
            std::thread::sleep(Duration::from_millis(60));
        }
    }
    outlet_util::wait_until("every record at the receiver", || {
        outlet_util::hooked(&server).0.len() as u64 >= total
    });
    let (got, again) = outlet_util::hooked(&server);
    let logs: Vec<String> = nodes.iter().map(NodeProcess::stderr_text).collect();
    assert_eq!(
        both, 0,
        "both clones drove the outlet in {both} of {samples} samples\nfirst:\n{}\nsecond:\n{}",
        logs[0], logs[1]
    );
    assert_eq!(again, 0, "positions delivered twice");
    assert_eq!(got.len() as u64, total, "positions at the receiver");
    assert_eq!(
        got.keys().copied().collect::<Vec<_>>(),
        (1..=total).collect::<Vec<_>>(),
        "positions 1.. without a gap"
    );
    // Each names itself apart from the other in what it logs at start.
    let ids: Vec<String> = logs
        .iter()
        .map(|l| {
            l.lines()
                .find_map(|line| {
                    let (_, id) = line.split_once("asks for their leases as ")?;
                    Some(id.to_string())
                })
                .unwrap_or_else(|| panic!("no lease id in the log:\n{l}"))
        })
        .collect();
    // Nothing a node can see of itself told them apart: one host name, one state path.
    let seen = |id: &str| id.rsplit_once('#').map(|(seen, _)| seen.to_string());
    assert_eq!(seen(&ids[0]), seen(&ids[1]), "{ids:?}");
    assert!(ids[0].starts_with("\"raspberrypi:"), "{ids:?}");
    assert_ne!(ids[0], ids[1], "the clones' ids in the fleet");
}
