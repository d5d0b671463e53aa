//! `pure-serve send` over a path that is not loopback (research/033): a veth pair to a network namespace of the
//! test's own, its MTU (1,100) below the sender's datagram size (1,200). A lone datagram is fragmented there, but a
//! UDP GSO send of full datagrams is refused (`EMSGSIZE`: a segment is never fragmented), so `send` must fall back
//! to one datagram per system call and still deliver every record once.
//!
//! Needs root and `ip` (network namespaces): without them the test says `skipped:`, what is missing and how to run
//! it, unless `PURE_REQUIRE_NETNS=1` (`.ci/run`), where it fails.

#[path = "ops_util/mod.rs"]
mod ops_util;

use std::process::{Command, Stdio};

use ops_util::{NodeProcess, bin, keygen, records};

/// A namespace and the veth pair to it, deleted (with every process in the namespace) when dropped.
struct Path1100 {
    netns: String,
    veth: String,
}

impl Path1100 {
    fn new() -> Path1100 {
        let tag = format!("{:x}", std::process::id());
        let path = Path1100 {
            netns: format!("pure-mtu-{tag}"),
            veth: format!("pmtu{tag}"),
        };
        let peer = format!("{}p", path.veth);
        run(&["netns", "add", &path.netns]);
        run(&[
            "link", "add", &path.veth, "type", "veth", "peer", "name", &peer,
        ]);
        run(&["link", "set", &peer, "netns", &path.netns]);
        run(&["addr", "add", "10.231.0.1/24", "dev", &path.veth]);
        run(&["link", "set", &path.veth, "mtu", "1100", "up"]);
        let inside = |args: &[&str]| {
            let mut all = vec!["netns", "exec", &path.netns, "ip"];
            all.extend_from_slice(args);
            run(&all);
        };
        inside(&["addr", "add", "10.231.0.2/24", "dev", &peer]);
        inside(&["link", "set", &peer, "mtu", "1100", "up"]);
        inside(&["link", "set", "lo", "up"]);
        path
    }
}

impl Drop for Path1100 {
    fn drop(&mut self) {
        if let Ok(out) = Command::new("ip")
            .args(["netns", "pids", &self.netns])
            .output()
        {
            for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                if let Ok(pid) = pid.parse::<i32>() {
                    // SAFETY: kill(2) of a process in a namespace this test made.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
            }
        }
        for args in [
            vec!["link", "del", self.veth.as_str()],
            vec!["netns", "del", self.netns.as_str()],
        ] {
            let _ = Command::new("ip")
                .args(&args)
                .stderr(Stdio::null())
                .status();
        }
    }
}

fn run(args: &[&str]) {
    let out = Command::new("ip").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Root and `ip netns`: if missing, says so and returns false, unless `PURE_REQUIRE_NETNS=1`.
fn can_run(test: &str) -> bool {
    let required = std::env::var_os("PURE_REQUIRE_NETNS").is_some_and(|v| v == "1");
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let ip = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .is_ok_and(|o| o.status.success());
    if root && ip {
        return true;
    }
    let why = "needs root and `ip netns` (iproute2); run it as root, as .ci/run does with PURE_REQUIRE_NETNS=1";
    assert!(!required, "{test}: PURE_REQUIRE_NETNS=1 but it {why}");
    eprintln!("skipped: {test}: {why}");
    false
}

#[test]
fn send_over_a_path_narrower_than_its_datagrams_falls_back_from_gso_and_stores_every_record_once() {
    if !can_run("send_over_a_path_narrower_than_its_datagrams") {
        return;
    }
    let path = Path1100::new();
    let dir = tempfile::tempdir().unwrap();
    let (key, public) = keygen(dir.path(), "dev");
    let senders = dir.path().join("senders");
    std::fs::write(&senders, format!("dev {public}\n")).unwrap();
    let state = dir.path().join("state");
    let node = NodeProcess::start_in(
        &path.netns,
        "10.231.0.2",
        7380,
        &state,
        &["--senders", senders.to_str().unwrap()],
    );
    let n = 50_000;
    let lines: String = (1..=n).map(|i| format!("{i:07}\n")).collect();
    let input = dir.path().join("lines");
    std::fs::write(&input, lines).unwrap();
    // `--timeout` bounds the run.
    let out = Command::new(bin())
        .arg("send")
        .arg("--key")
        .arg(&key)
        .args(["--node", &node.public_key, "--to", "10.231.0.2:7380"])
        .args(["--timeout", "20", "--log", "debug"])
        .stdin(std::fs::File::open(&input).unwrap())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("UDP GSO refused"),
        "GSO was tried and refused on this path: {err}"
    );
    drop(node);
    let stored = records(&state);
    assert_eq!(stored.len(), n);
    for (i, (source, seq, payload)) in stored.iter().enumerate() {
        assert_eq!((source.as_str(), *seq), ("dev", i as u64 + 1));
        assert_eq!(payload, &format!("{:07}", i + 1));
    }
}
