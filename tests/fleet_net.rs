//! A fleet on a network of network namespaces (docs/scale-out.md; issue 15, items 4 and 5): real `pure-serve`
//! processes started with `ip netns exec`, a real PostgreSQL listening on TCP at an address inside a namespace
//! (so that firewall rules bite: a unix socket ignores them), and nftables as the load balancer and the firewall.
//!
//! - An nftables UDP balancer (the recipe of docs/scale-out.md, without connection tracking) in front of two nodes,
//!   its map rewritten twice mid-flow: a `send` to the balancer's address moves to the other node and back, exits
//!   0, and every record is in the database once, in sequence. That the flow really moved is proven, not assumed:
//!   after each rehash the node it left stops storing while the other stores, and the balancer counted answers
//!   from both.
//! - A node cut off from its database by a drop rule on the router between them, mid-flow: before the
//!   connection's TCP timeout could end it, `/healthz` says 503 naming the database and the log says so; its sender
//!   is told NOT_STORED; it acks nothing more; with the rule gone it stores again, the send finishes, and every
//!   record is in the database once.
//! - The node driving a link outlet cut off from its database the same way: it stops the outlet before the other
//!   node takes the lease (7 s after its last good renewal by its own clock, against the database's 10 s), the
//!   other delivers on, every record reaches the far node once, and the node cut off stays on standby once healed.
//!
//! Each test makes namespaces of its own (unique names), deleted with every process in them by a guard, even on a
//! panic. They need root, `ip`, `nft` and PostgreSQL: without one they say `skipped:`, what is missing and how to
//! run them, unless `PURE_REQUIRE_NETNS=1` (`.ci/run`), where they fail.

#[path = "fleet_util/mod.rs"]
mod fleet_util;
#[path = "ops_util/mod.rs"]
mod ops_util;
#[path = "outlet_util/mod.rs"]
mod outlet_util;
#[path = "pg_util/mod.rs"]
mod pg_util;

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use fleet_util::{
    RunningSend, assert_exactly_once, holders, send_all, send_command, setup, stored_by,
};
use ops_util::{DEADLINE, NodeProcess, in_netns};

/// The nodes' UDP link port.
const PORT: u16 = 7380;

/// How long a node cut off from its database may take to say so. The host takes the database as out of reach once
/// a turn has waited 750 ms for its outcome (`STORE_SILENT`, src/apps/host/shared.rs); the bound is generous for a
/// shared machine, yet below the engine's `NET_TIMEOUT` (5 s), so the notice cannot come from the connection's TCP
/// timeout (what research/041 measures is the time itself).
const CUT_OFF_WITHIN: Duration = Duration::from_millis(4_500);
/// Once the node says it is cut off, its sender is told within this.
const TOLD_WITHIN: Duration = Duration::from_secs(5);
/// A node serves again within this of its database coming back (BRIEF.md: within 1 s; a test on a shared machine
/// allows more, and prints what it measured).
const BACK_WITHIN: Duration = Duration::from_secs(3);

/// The namespaces of one test: made with unique names, and deleted, every process in them killed first, when
/// dropped (at the end of the test or on a panic). Declared before everything that runs in them, so that it is
/// dropped last.
struct Namespaces {
    names: Vec<(String, String)>,
}

impl Namespaces {
    /// One namespace per role, each with its loopback up.
    fn new(roles: &[&str]) -> Namespaces {
        static MADE: AtomicU32 = AtomicU32::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let made = MADE.fetch_add(1, Ordering::SeqCst);
        let tag = format!("{}-{made}-{nanos:x}", std::process::id());
        let mut ns = Namespaces { names: Vec::new() };
        for role in roles {
            let name = format!("pure-{role}-{tag}");
            run("ip", &["netns", "add", &name]);
            ns.names.push((role.to_string(), name));
            run("ip", &["-n", ns.name(role), "link", "set", "lo", "up"]);
        }
        ns
    }

    fn name(&self, role: &str) -> &str {
        &self.names.iter().find(|(r, _)| r == role).unwrap().1
    }

    /// A veth pair between two namespaces, each end with its address (`A.B.C.D/24`) and up.
    fn link(&self, a: (&str, &str, &str), b: (&str, &str, &str)) {
        let (na, nb) = (self.name(a.0), self.name(b.0));
        run(
            "ip",
            &[
                "-n", na, "link", "add", a.1, "type", "veth", "peer", "name", b.1, "netns", nb,
            ],
        );
        for (ns, dev, addr) in [(na, a.1, a.2), (nb, b.1, b.2)] {
            run("ip", &["-n", ns, "addr", "add", addr, "dev", dev]);
            run("ip", &["-n", ns, "link", "set", dev, "up"]);
        }
    }

    fn addr(&self, role: &str, dev: &str, addr: &str) {
        run(
            "ip",
            &["-n", self.name(role), "addr", "add", addr, "dev", dev],
        );
    }

    fn default_route(&self, role: &str, via: &str) {
        run(
            "ip",
            &["-n", self.name(role), "route", "add", "default", "via", via],
        );
    }

    /// Makes a namespace a router (`net.ipv4.ip_forward=1` there).
    fn forward(&self, role: &str) {
        run(
            "ip",
            &[
                "netns",
                "exec",
                self.name(role),
                "sh",
                "-c",
                "echo 1 > /proc/sys/net/ipv4/ip_forward",
            ],
        );
    }

    /// `nft -f -` in a namespace: one transaction.
    fn nft(&self, role: &str, rules: &str) {
        let mut child = Command::new("ip")
            .args(["netns", "exec", self.name(role), "nft", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(rules.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "nft -f in {role}: {}\n{rules}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The packets counted by the rule of `table ip TABLE chain CHAIN` whose text contains `rule` (as `nft list`
    /// prints it).
    fn counter(&self, role: &str, table: &str, chain: &str, rule: &str) -> u64 {
        let out = Command::new("ip")
            .args(["netns", "exec", self.name(role), "nft", "list", "chain"])
            .args(["ip", table, chain])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let text = String::from_utf8(out.stdout).unwrap();
        let line = text
            .lines()
            .find(|l| l.contains(rule) && l.contains("counter packets"))
            .unwrap_or_else(|| panic!("no rule with {rule:?} in\n{text}"));
        let after = line.split("counter packets ").nth(1).unwrap();
        after.split_whitespace().next().unwrap().parse().unwrap()
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for (_, name) in &self.names {
            if let Ok(out) = Command::new("ip").args(["netns", "pids", name]).output() {
                for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                    if let Ok(pid) = pid.parse::<i32>() {
                        // SAFETY: kill(2) of a process in a namespace this test made.
                        unsafe { libc::kill(pid, libc::SIGKILL) };
                    }
                }
            }
            let _ = Command::new("ip")
                .args(["netns", "del", name])
                .stderr(Stdio::null())
                .status();
        }
    }
}

fn run(tool: &str, args: &[&str]) {
    let out = Command::new(tool)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{tool}: {e}"));
    assert!(
        out.status.success(),
        "{tool} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Whether this machine can run the test: root, `ip`, `nft`, PostgreSQL, and network namespaces. If not, says
/// what is missing and how to run it, and returns false (the test passes) — unless `PURE_REQUIRE_NETNS=1`, where
/// it fails.
fn can_run(test: &str) -> bool {
    let required = std::env::var_os("PURE_REQUIRE_NETNS").is_some_and(|v| v == "1");
    let works = |tool: &str, arg: &str| {
        Command::new(tool)
            .arg(arg)
            .output()
            .is_ok_and(|o| o.status.success())
    };
    let mut missing = Vec::new();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        missing.push("root (network namespaces and nftables need it)".to_string());
    }
    if !works("ip", "-V") {
        missing.push("the `ip` tool (apt-get install iproute2)".to_string());
    }
    if !works("nft", "--version") {
        missing.push("the `nft` tool (apt-get install nftables)".to_string());
    }
    if !pg_util::installed() {
        missing
            .push("PostgreSQL (/usr/lib/postgresql/*/bin; apt-get install postgresql)".to_string());
    }
    if missing.is_empty() {
        static PROBES: AtomicU32 = AtomicU32::new(0);
        let n = PROBES.fetch_add(1, Ordering::SeqCst);
        let probe = format!("pure-probe-{}-{n}", std::process::id());
        match Command::new("ip").args(["netns", "add", &probe]).output() {
            Ok(o) if o.status.success() => {
                let _ = Command::new("ip").args(["netns", "del", &probe]).status();
            }
            Ok(o) => missing.push(format!(
                "network namespaces (`ip netns add` said: {})",
                String::from_utf8_lossy(&o.stderr).trim()
            )),
            Err(e) => missing.push(format!("network namespaces (`ip netns add`: {e})")),
        }
    }
    if missing.is_empty() {
        return true;
    }
    let why = format!(
        "needs {}: run it as root where they are, e.g. `sudo -E cargo test --release --test fleet_net`; \
         .ci/run installs them and sets PURE_REQUIRE_NETNS=1",
        missing.join(", ")
    );
    assert!(!required, "{test}: PURE_REQUIRE_NETNS=1 but it {why}");
    eprintln!("skipped: {test}: {why}");
    false
}

/// A `send` in namespace `ns` to `to`, fed `r1`, `r2`, … until at least `min` records are written and `stop`
/// is set (at most 100,000 a second, slowed by the pipe to what the sender takes), then its input closed. The thread
/// returns how many records it wrote.
fn feed_send(
    ns: &str,
    device_key: &std::path::Path,
    public: &str,
    to: &str,
    min: u64,
    stop: Arc<AtomicBool>,
) -> (RunningSend, JoinHandle<u64>) {
    let mut child = send_command(Some(ns), device_key, public, to)
        .spawn()
        .unwrap();
    let mut stdin = std::io::BufWriter::new(child.stdin.take().unwrap());
    let writer = std::thread::spawn(move || {
        let mut i = 0u64;
        // At most 500 records every 5 ms (100,000 a second), so that a run held open by the test stays small.
        let mut next = Instant::now();
        while i < min || !stop.load(Ordering::SeqCst) {
            for _ in 0..500 {
                i += 1;
                if writeln!(stdin, "r{i}").is_err() {
                    return i; // send has ended: the test says why
                }
            }
            if stdin.flush().is_err() {
                return i;
            }
            next += Duration::from_millis(5);
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
        }
        i
    });
    (RunningSend::watch(child), writer)
}

/// Polls `what` until it holds, failing the test (with `why()`) at the deadline.
fn wait_until(
    what: &str,
    deadline: Instant,
    mut ok: impl FnMut() -> bool,
    why: impl Fn() -> String,
) {
    while !ok() {
        assert!(Instant::now() < deadline, "{what}: {}", why());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// How many records `to` stores in a row, with `from` storing none meanwhile, for the flow to count as moved.
const LEFT_AFTER: f64 = 2_000.0;

/// The flow has left `from` for `to`: `to` stores [`LEFT_AFTER`] records while `from` stores none. What was in
/// flight to `from` when the map changed may still be stored there meanwhile, so the count starts again until it
/// holds; were the flow still split between the two, it never would, and the test fails at the deadline.
fn assert_left(from: &NodeProcess, to: &NodeProcess, names: (&str, &str)) {
    let deadline = Instant::now() + DEADLINE;
    let (mut f1, mut t1) = (stored_by(from), stored_by(to));
    loop {
        let (f2, t2) = (stored_by(from), stored_by(to));
        if f2 != f1 {
            (f1, t1) = (f2, t2);
        } else if t2 - t1 >= LEFT_AFTER {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{} stored {f2} (still storing after the rehash?), {} stored {} since",
            names.0,
            names.1,
            t2 - t1
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_load_balancer_that_rehashes_mid_flow_moves_the_sender_and_every_record_is_stored_once() {
    let test =
        "a_load_balancer_that_rehashes_mid_flow_moves_the_sender_and_every_record_is_stored_once";
    if !can_run(test) {
        return;
    }
    // sender (10.77.1.2) — balancer (10.77.1.1 | 10.77.2.1, the VIP 10.77.9.1) — nodes A 10.77.2.2 and B 10.77.2.3
    // in one namespace, with PostgreSQL at 10.77.2.9 there.
    let ns = Namespaces::new(&["snd", "lb", "nodes"]);
    ns.link(
        ("lb", "s0", "10.77.1.1/24"),
        ("snd", "eth0", "10.77.1.2/24"),
    );
    ns.link(
        ("lb", "n0", "10.77.2.1/24"),
        ("nodes", "eth0", "10.77.2.2/24"),
    );
    ns.addr("nodes", "eth0", "10.77.2.3/24");
    ns.addr("nodes", "eth0", "10.77.2.9/24");
    ns.default_route("snd", "10.77.1.1");
    ns.default_route("nodes", "10.77.2.1");
    ns.forward("lb");
    let (vip, a_addr, b_addr) = ("10.77.9.1", "10.77.2.2", "10.77.2.3");
    // The recipe of docs/scale-out.md, with a counter per backend on the answers' way back.
    ns.nft(
        "lb",
        &format!(
            "table ip lb {{
  map backends {{ typeof numgen inc mod 1 : ip daddr; elements = {{ 0 : {a_addr}, 1 : {b_addr} }}; }}
  chain pre {{ type filter hook prerouting priority -300; policy accept;
    ip daddr {vip} udp dport {PORT} notrack ip daddr set jhash ip saddr mod 2 seed 0x1 map @backends counter;
    ip saddr 10.77.2.0/24 udp sport {PORT} notrack counter; }}
  chain post {{ type filter hook postrouting priority 100; policy accept;
    ip saddr {a_addr} udp sport {PORT} ip saddr set {vip} counter;
    ip saddr {b_addr} udp sport {PORT} ip saddr set {vip} counter; }}
}}
"
        ),
    );

    let Some(cluster) = pg_util::PgCluster::start_in(test, ns.name("nodes"), "10.77.2.9") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (node_key, device_key, senders) = setup(dir.path());
    let url = cluster.tcp_url();
    let args = [
        "--key",
        node_key.to_str().unwrap(),
        "--senders",
        senders.to_str().unwrap(),
        "--store",
        &url,
    ];
    let a = NodeProcess::start_in(ns.name("nodes"), a_addr, PORT, &dir.path().join("a"), &args);
    let b = NodeProcess::start_in(ns.name("nodes"), b_addr, PORT, &dir.path().join("b"), &args);
    assert_eq!(a.public_key, b.public_key, "one fleet, one key");

    let started = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let (send, writer) = feed_send(
        ns.name("snd"),
        &device_key,
        &a.public_key,
        &format!("{vip}:{PORT}"),
        200_000,
        stop.clone(),
    );
    // The hash puts the sender on one of the two; the rehash is the map's elements swapped, in one transaction.
    let deadline = Instant::now() + DEADLINE;
    wait_until(
        "the sender reaches a node",
        deadline,
        || stored_by(&a) > 0.0 || stored_by(&b) > 0.0,
        String::new,
    );
    let (first, second, names) = if stored_by(&a) > 0.0 {
        (&a, &b, ("A", "B"))
    } else {
        (&b, &a, ("B", "A"))
    };
    let map = |zero: &str, one: &str| {
        ns.nft(
            "lb",
            &format!(
                "flush map ip lb backends\nadd element ip lb backends {{ 0 : {zero}, 1 : {one} }}\n"
            ),
        )
    };
    // Swapped: the sender's hash now names the other node.
    map(b_addr, a_addr);
    wait_until(
        "the sender moves to the other node",
        Instant::now() + DEADLINE,
        || stored_by(second) > 0.0,
        || format!("{} stored {}", names.1, stored_by(second)),
    );
    assert_left(first, second, names);
    let moved = started.elapsed();
    // And back.
    let before = stored_by(first);
    map(a_addr, b_addr);
    wait_until(
        "the sender moves back",
        Instant::now() + DEADLINE,
        || stored_by(first) > before,
        || format!("{} stored {}", names.0, stored_by(first)),
    );
    assert_left(second, first, (names.1, names.0));
    let moved_back = started.elapsed();

    stop.store(true, Ordering::SeqCst);
    let count = writer.join().unwrap();
    let (ok, said) = send.finish();
    assert!(ok, "{said}");
    let elapsed = started.elapsed();
    // Each record stored by one node, together all of them, each once in the database.
    let (sa, sb) = (stored_by(&a), stored_by(&b));
    assert_eq!(sa + sb, count as f64, "A stored {sa}, B stored {sb}");
    assert_exactly_once(&cluster, count, &[0]);
    // The balancer itself carried answers from both nodes.
    for node in [a_addr, b_addr] {
        let answers = ns.counter("lb", "lb", "post", &format!("ip saddr {node} "));
        assert!(answers > 0, "the balancer saw no answer from {node}");
    }
    eprintln!(
        "{count} records through the balancer, moved at {moved:.1?} and back at {moved_back:.1?}, sent in \
         {elapsed:.1?}: A stored {sa}, B stored {sb}; send: {}",
        said.trim()
    );
}

#[test]
fn a_node_cut_off_from_its_database_by_a_firewall_acks_nothing_says_so_and_serves_again() {
    let test =
        "a_node_cut_off_from_its_database_by_a_firewall_acks_nothing_says_so_and_serves_again";
    if !can_run(test) {
        return;
    }
    // node (10.78.1.2; its sender beside it) — router (10.78.1.1 | 10.78.2.1) — PostgreSQL (10.78.2.2).
    let ns = Namespaces::new(&["node", "rtr", "db"]);
    ns.link(
        ("rtr", "n0", "10.78.1.1/24"),
        ("node", "eth0", "10.78.1.2/24"),
    );
    ns.link(
        ("rtr", "d0", "10.78.2.1/24"),
        ("db", "eth0", "10.78.2.2/24"),
    );
    ns.default_route("node", "10.78.1.1");
    ns.default_route("db", "10.78.2.1");
    ns.forward("rtr");
    // The firewall: a prerouting chain (FLEET-TESTING.md: a forward hook may see nothing), empty for now.
    ns.nft(
        "rtr",
        "table ip cut {\n  chain pre { type filter hook prerouting priority -300; policy accept; }\n}\n",
    );
    let (node_addr, db_addr) = ("10.78.1.2", "10.78.2.2");

    let Some(cluster) = pg_util::PgCluster::start_in(test, ns.name("db"), db_addr) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (node_key, device_key, senders) = setup(dir.path());
    let url = cluster.tcp_url();
    let node = NodeProcess::start_in(
        ns.name("node"),
        node_addr,
        PORT,
        &dir.path().join("a"),
        &[
            "--key",
            node_key.to_str().unwrap(),
            "--senders",
            senders.to_str().unwrap(),
            "--store",
            &url,
        ],
    );
    let stop = Arc::new(AtomicBool::new(false));
    let (send, writer) = feed_send(
        ns.name("node"),
        &device_key,
        &node.public_key,
        &format!("{node_addr}:{PORT}"),
        50_000,
        stop.clone(),
    );
    wait_until(
        "the node stores",
        Instant::now() + DEADLINE,
        || stored_by(&node) > 0.0,
        || node.stderr_text(),
    );
    assert_eq!(node.http_get("/healthz").0, 200);

    // Cut: both directions dropped on the router, in one transaction.
    ns.nft(
        "rtr",
        &format!(
            "add rule ip cut pre ip saddr {node_addr} ip daddr {db_addr} counter drop\n\
             add rule ip cut pre ip saddr {db_addr} ip daddr {node_addr} counter drop\n"
        ),
    );
    let cut = Instant::now();
    wait_until(
        "/healthz says 503 once the database is cut off",
        cut + CUT_OFF_WITHIN,
        || node.http_get("/healthz").0 == 503,
        || node.http_get("/healthz").1,
    );
    let noticed = cut.elapsed();
    let (_, body) = node.http_get("/healthz");
    assert!(
        body.contains("app main cannot store") && body.contains("database"),
        "{body}"
    );
    // And its sender is told so (NOT_STORED), not left to time out: the host does not wait for the turn in hand,
    // whose outcome the cut leaves unknown, to answer the packets that come after it (docs/scale-out.md, "When the
    // database is unreachable").
    wait_until(
        "the sender is told NOT_STORED while cut off",
        Instant::now() + TOLD_WITHIN,
        || send.said().contains("the node cannot store app main"),
        || {
            format!(
                "send said: {}\nnode said: {}",
                send.said(),
                node.stderr_text()
            )
        },
    );
    let told = cut.elapsed();
    // And the node counts what it told (`pure_not_stored_sent_total`, docs/operations.md).
    assert!(
        node.metric("pure_not_stored_sent_total").unwrap_or(0.0) > 0.0,
        "NOT_STORED told but not counted"
    );
    // (Its log is read from a pipe by a thread of the test: it may come a little after the status.)
    wait_until(
        "the node's log says app main cannot store",
        Instant::now() + Duration::from_secs(2),
        || node.stderr_text().contains("app main cannot store"),
        || node.stderr_text(),
    );
    // It acks nothing more: not the turn in hand at the cut either, whose outcome is unknown.
    let s1 = stored_by(&node);
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(stored_by(&node), s1, "the node stores while cut off");
    // And the rule really drops: the node's packets to the database hit it, and a connection cannot be made.
    let dropped = ns.counter("rtr", "cut", "pre", &format!("ip saddr {node_addr} "));
    assert!(dropped > 0, "the drop rule saw nothing");
    let to_db: std::net::SocketAddr = format!("{db_addr}:5432").parse().unwrap();
    let connects = in_netns(Some(ns.name("node")), move || {
        std::net::TcpStream::connect_timeout(&to_db, Duration::from_millis(500)).is_ok()
    });
    assert!(!connects, "the database is reachable through the cut");
    assert_eq!(node.http_get("/healthz").0, 503, "cut off still");

    // Healed: the rules gone, the node serves again.
    ns.nft("rtr", "flush chain ip cut pre\n");
    let healed = Instant::now();
    wait_until(
        "/healthz says 200 once the database is back",
        healed + DEADLINE,
        || node.http_get("/healthz").0 == 200,
        || node.http_get("/healthz").1,
    );
    let back = healed.elapsed();
    wait_until(
        "the node stores again",
        healed + DEADLINE,
        || stored_by(&node) > s1,
        || node.stderr_text(),
    );
    let flowing = healed.elapsed();
    assert!(
        node.stderr_text().contains("app main can store again"),
        "{}",
        node.stderr_text()
    );
    stop.store(true, Ordering::SeqCst);
    let count = writer.join().unwrap();
    let (ok, said) = send.finish();
    assert!(ok, "{said}");
    assert_exactly_once(&cluster, count, &[0]);
    eprintln!(
        "cut off: 503 after {noticed:.1?}, the sender told NOT_STORED by {told:.1?}; healed: 200 after {back:.1?}, \
         stored acks again after {flowing:.1?}; {count} records, {s1} stored before the cut"
    );
    // For research/041 (its run.sh collects these lines).
    eprintln!(
        "research-041 {{\"what\":\"cut\",\"healthz_503_s\":{:.3},\"not_stored_s\":{:.3},\"healthz_200_s\":{:.3},\
         \"stored_again_s\":{:.3},\"records\":{count}}}",
        noticed.as_secs_f64(),
        told.as_secs_f64(),
        back.as_secs_f64(),
        flowing.as_secs_f64()
    );
    assert!(
        back <= BACK_WITHIN,
        "the node served again {back:?} after the database came back (at most {BACK_WITHIN:?})"
    );
}

#[test]
fn an_outlets_driver_cut_off_from_its_database_stops_it_before_another_node_takes_it_over() {
    let test =
        "an_outlets_driver_cut_off_from_its_database_stops_it_before_another_node_takes_it_over";
    if !can_run(test) {
        return;
    }
    // nodes A (10.79.1.2) and B (10.79.2.2) — router (10.79.1.1 | 10.79.2.1 | 10.79.3.1; the far node listens
    // on 10.79.1.1) — PostgreSQL (10.79.3.2).
    let ns = Namespaces::new(&["a", "b", "rtr", "db"]);
    ns.link(("rtr", "a0", "10.79.1.1/24"), ("a", "eth0", "10.79.1.2/24"));
    ns.link(("rtr", "b0", "10.79.2.1/24"), ("b", "eth0", "10.79.2.2/24"));
    ns.link(
        ("rtr", "d0", "10.79.3.1/24"),
        ("db", "eth0", "10.79.3.2/24"),
    );
    ns.default_route("a", "10.79.1.1");
    ns.default_route("b", "10.79.2.1");
    ns.default_route("db", "10.79.3.1");
    ns.forward("rtr");
    ns.nft(
        "rtr",
        "table ip cut {\n  chain pre { type filter hook prerouting priority -300; policy accept; }\n}\n",
    );
    let (addrs, far_addr, db_addr) = (["10.79.1.2", "10.79.2.2"], "10.79.1.1", "10.79.3.2");
    let Some(cluster) = pg_util::PgCluster::start_in(test, ns.name("db"), db_addr) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (node_key, device_key, senders) = setup(dir.path());
    let (far_key, far_public) = ops_util::keygen(dir.path(), "far");
    let far_apps = dir.path().join("far.toml");
    std::fs::write(
        &far_apps,
        "[apps.far]\naccept = [\"fleet\"]\nforwarders = [\"fleet\"]\n",
    )
    .unwrap();
    let apps = dir.path().join("fleet.toml");
    std::fs::write(
        &apps,
        format!(
            "[apps.main]\n[apps.main.outlets.out]\nkind = \"link\"\nto = \"{far_addr}:{PORT}\"\n\
             node_key = \"{far_public}\"\napp = \"far\"\n"
        ),
    )
    .unwrap();
    let url = cluster.tcp_url();
    let args = [
        "--key",
        node_key.to_str().unwrap(),
        "--senders",
        senders.to_str().unwrap(),
        "--store",
        &url,
        "--apps",
        apps.to_str().unwrap(),
    ];
    let nodes = [
        NodeProcess::start_in(ns.name("a"), addrs[0], PORT, &dir.path().join("a"), &args),
        NodeProcess::start_in(ns.name("b"), addrs[1], PORT, &dir.path().join("b"), &args),
    ];
    // The far node, on the router: app `far` takes the fleet's records as forwarded.
    let node_public = nodes[0].public_key.clone();
    let far_senders = dir.path().join("far-senders");
    std::fs::write(&far_senders, format!("fleet {node_public}\n")).unwrap();
    let far_state = dir.path().join("far");
    let _far = NodeProcess::start_in(
        ns.name("rtr"),
        far_addr,
        PORT,
        &far_state,
        &[
            "--key",
            far_key.to_str().unwrap(),
            "--senders",
            far_senders.to_str().unwrap(),
            "--apps",
            far_apps.to_str().unwrap(),
        ],
    );
    let far_has = |n: u64| far_records(&far_state).len() as u64 >= n;
    let first = 2_000;
    send_all(
        Some(ns.name("a")),
        &device_key,
        &node_public,
        nodes[0].link,
        first,
    );
    wait_until(
        "the first batch on the far node",
        Instant::now() + DEADLINE,
        || far_has(first),
        || nodes[0].stderr_text() + &nodes[1].stderr_text(),
    );
    let names = ["/a", "/b"];
    let holds = |i: usize| matches!(holders(&cluster).as_slice(), [Some(h)] if fleet_util::holder_state(h).ends_with(names[i]));
    let holder = if holds(0) { 0 } else { 1 };
    assert!(
        holds(holder),
        "one node holds the outlet: {:?}",
        holders(&cluster)
    );
    let other = 1 - holder;
    let driving = |i: usize| nodes[i].metric("pure_outlet_driving{app=\"main\",outlet=\"out\"}");
    assert_eq!(driving(holder), Some(1.0));
    assert_eq!(driving(other), Some(0.0));

    // The holder is cut off from the database: it must stop driving the outlet before the other node may take
    // it (7 s after its last good renewal by its own clock, against the database's 10 s).
    let cut_addr = addrs[holder];
    ns.nft(
        "rtr",
        &format!(
            "add rule ip cut pre ip saddr {cut_addr} ip daddr {db_addr} counter drop\n\
             add rule ip cut pre ip saddr {db_addr} ip daddr {cut_addr} counter drop\n"
        ),
    );
    let cut = Instant::now();
    let (mut stopped, mut taken) = (None, None);
    while stopped.is_none() || taken.is_none() {
        assert!(
            cut.elapsed() < DEADLINE,
            "stopped {stopped:?}, taken {taken:?}"
        );
        if stopped.is_none() && driving(holder) == Some(0.0) {
            stopped = Some(cut.elapsed());
        }
        if taken.is_none() && holds(other) {
            taken = Some(cut.elapsed());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let (stopped, taken) = (stopped.unwrap(), taken.unwrap());
    eprintln!(
        "cut off: the holder stopped its outlet {stopped:.1?} after the cut, the other took it {taken:.1?} after"
    );
    assert!(
        stopped < taken,
        "the holder stopped ({stopped:?}) before the other took it ({taken:?})"
    );

    // The other node delivers what is stored through it meanwhile.
    let second = 3_000;
    send_all(
        Some(ns.name(["a", "b"][other])),
        &device_key,
        &node_public,
        nodes[other].link,
        second,
    );
    let total = first + second;
    wait_until(
        "every record on the far node",
        Instant::now() + DEADLINE,
        || far_has(total),
        || nodes[other].stderr_text(),
    );
    // Healed, the node that was cut off stays on standby: the lease is the other's.
    ns.nft("rtr", "flush chain ip cut pre\n");
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(
        driving(holder),
        Some(0.0),
        "the healed node took the lease back"
    );
    assert!(holds(other));
    let got = far_records(&far_state);
    assert_eq!(got.len() as u64, total, "records on the far node");
    for (k, (seq, origin_seq, payload)) in got.iter().enumerate() {
        let s = k as u64 + 1;
        assert_eq!((*seq, *origin_seq), (s, s), "record {s}");
        let line = if s <= first { s } else { s - first };
        assert_eq!(payload, &format!("r{line}"), "record {s}");
    }
    assert_exactly_once(&cluster, total, &[0, first]);
}

/// The far node's records of app `far` (seq, origin_seq, payload), as `records --json` reads its store.
fn far_records(state: &std::path::Path) -> Vec<(u64, u64, String)> {
    outlet_util::records(state, "far")
        .iter()
        .map(|v| {
            (
                v["seq"].as_u64().unwrap(),
                v["origin_seq"].as_u64().unwrap(),
                v["payload"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}
