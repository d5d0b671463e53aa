//! Outlets between two real nodes on loopback (each the real receive loop on a thread of this process, with real
//! SQLite stores and UDP sockets): what app `main` of node A stores reaches app `ingest` of node B exactly once,
//! with its origin, through a link outlet; and an inner outlet copies it to a second app of A.

use std::path::Path;
use std::time::{Duration, Instant};

use pure_serve::apps::config::AppsConfig;
use pure_serve::keys::encode_key;
use pure_serve::proto::crypto::Identity;
use pure_serve::receive::LocalNode;
use pure_serve::sender::UdpLink;
use pure_serve::store::{self, AppStore};

/// The apps file, parsed as the node parses `--apps FILE`.
fn apps(toml: &str) -> AppsConfig {
    AppsConfig::parse(Path::new("apps.toml"), toml).unwrap_or_else(|e| panic!("{e}"))
}

/// How long a test waits for what should happen at once: only a hang takes this long.
const HANG: Duration = Duration::from_secs(60);

/// One stored record as the test compares it: source, seq, origin (name and sequence), payload.
type Seen = (String, u64, Option<(String, u64)>, String);

/// Every record of `app`, in (source, seq) order.
fn records(state: &Path, app: &str) -> Vec<Seen> {
    let Ok(s) = AppStore::open_read(&store::app_store_path(state, app)) else {
        return Vec::new();
    };
    let mut v = Vec::new();
    s.for_each_record_view(None, 0, |r| {
        v.push((
            r.source.to_string(),
            r.seq,
            r.origin.map(|(o, q)| (o.to_string(), q)),
            String::from_utf8_lossy(r.payload).to_string(),
        ));
        true
    })
    .unwrap();
    v
}

fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let until = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_link_outlet_and_an_inner_outlet_deliver_every_record_once_with_its_origin() {
    let dir = tempfile::tempdir().unwrap();
    let (dir_a, dir_b) = (dir.path().join("a"), dir.path().join("b"));
    std::fs::create_dir_all(&dir_a).unwrap();
    std::fs::create_dir_all(&dir_b).unwrap();
    // A's key exists before either starts: B lists it as a sender.
    let key_a = Identity::generate();
    pure_serve::keys::write_new_identity(&dir_a.join("node.key"), &key_a).unwrap();
    let device = Identity::generate();

    let b = LocalNode::start_apps(
        &dir_b,
        &[("node-a".into(), *key_a.public())],
        apps("[apps.ingest]\naccept = [\"node-a\"]\nforwarders = [\"node-a\"]\n"),
        Duration::from_secs(30),
        4 << 20,
    )
    .unwrap();
    let a = LocalNode::start_apps(
        &dir_a,
        &[("dev".into(), *device.public())],
        apps(&format!(
            r#"
[apps.main]
[apps.main.outlets.to-b]
kind = "link"
to = "{}"
node_key = "{}"
app = "ingest"
memory_bytes = 1048576
[apps.main.outlets.copy]
kind = "app"
app = "copy"
[apps.copy]
accept = []
"#,
            b.addr,
            encode_key(&b.public)
        )),
        Duration::from_secs(30),
        4 << 20,
    )
    .unwrap();

    const N: u64 = 20_000;
    let mut link = UdpLink::connect(device.clone(), a.public, a.addr).unwrap();
    for i in 1..=N {
        link.sender()
            .queue("main", format!("reading {i}").into_bytes())
            .unwrap();
    }
    let outcome = link.deliver(Some(Duration::from_secs(30))).unwrap();
    assert_eq!(outcome.unacked, 0);
    // The device may not send to `copy` directly: it accepts nobody but its inner inlet.
    let mut direct = UdpLink::connect(device, a.public, a.addr).unwrap();
    direct
        .sender()
        .queue("copy", b"not for you".to_vec())
        .unwrap();
    let refused = direct.deliver(Some(HANG)).unwrap();
    assert_eq!(refused.refused, vec![("copy".to_string(), 2)]);

    wait_for("B to store every record", Duration::from_secs(60), || {
        records(&b.state_dir, "ingest").len() as u64 >= N
    });
    wait_for(
        "the inner outlet to copy every record",
        Duration::from_secs(60),
        || records(&a.state_dir, "copy").len() as u64 >= N,
    );
    let on_b = records(&b.state_dir, "ingest");
    let copied = records(&a.state_dir, "copy");
    assert_eq!(on_b.len() as u64, N);
    assert_eq!(copied.len() as u64, N);
    for (k, ((source, seq, origin, payload), (csource, cseq, corigin, cpayload))) in
        on_b.iter().zip(&copied).enumerate()
    {
        let i = k as u64 + 1;
        // On B: forwarded by node-a, in the flow numbered by A's positions; its origin is the device.
        assert_eq!((source.as_str(), *seq), ("node-a", i));
        assert_eq!(origin, &Some(("dev".to_string(), i)));
        assert_eq!(payload, &format!("reading {i}"));
        // On A's second app: from the inner inlet app/main, same origin.
        assert_eq!((csource.as_str(), *cseq), ("app/main", i));
        assert_eq!(corigin, &Some(("dev".to_string(), i)));
        assert_eq!(cpayload, payload);
    }
    a.stop().unwrap();
    b.stop().unwrap();
}

/// docs/apps.md, `max_lag_records`: a burst of 5,000 records to an app whose outlet cannot deliver and has a budget
/// of 1,000 stops at the budget plus less than one frame (issue 18, item 5: it used to store the whole burst), the
/// app pauses, its senders are held back (counted as held back or dropped before decryption, not as stored) and
/// nothing of it is lost.
#[test]
fn an_app_whose_outlet_is_past_its_lag_budget_stops_taking_input_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let device = Identity::generate();
    // The far side is a port nobody listens on: the outlet cannot deliver, its lag grows.
    let dead = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let dead_addr = dead.local_addr().unwrap();
    drop(dead);
    let a = LocalNode::start_apps(
        dir.path(),
        &[("dev".into(), *device.public())],
        apps(&format!(
            "[apps.main]\n[apps.main.outlets.away]\nkind = \"link\"\nto = \"{dead_addr}\"\n\
             node_key = \"{}\"\napp = \"far\"\nmax_lag_records = 1000\n",
            encode_key(Identity::generate().public())
        )),
        Duration::from_secs(30),
        4 << 20,
    )
    .unwrap();
    let mut link = UdpLink::connect(device, a.public, a.addr).unwrap();
    for i in 1..=5000 {
        link.sender()
            .queue("main", format!("record-{i:05}").into_bytes())
            .unwrap();
    }
    // Sent until the app says it paused for its outlet's lag, and the sender was acked all it stored.
    let paused = || a.stats.snapshot.lock().unwrap().app_figures[0].paused_for_lag;
    let until = Instant::now() + HANG;
    let (outcome, stored) = loop {
        let outcome = link.deliver(Some(Duration::from_millis(100))).unwrap();
        if paused() {
            let stored = records(&a.state_dir, "main").len();
            if outcome.unacked == 5000 - stored {
                break (outcome, stored);
            }
        }
        assert!(
            Instant::now() < until,
            "the app never paused for lag, or what it stored was never all acked: {} unacked",
            outcome.unacked
        );
    };
    // A frame of these 12-byte records holds at most 1472 / 13 of them.
    assert!(
        (1000..1000 + 1472 / 13).contains(&stored),
        "{stored} of the burst stored with a budget of 1000"
    );
    assert_eq!(
        outcome.unacked,
        5000 - stored,
        "only what was stored is acked"
    );
    let snapshot = a.stats.snapshot.lock().unwrap().clone();
    assert!(snapshot.app_figures[0].paused_for_lag);
    let c = &snapshot.counters;
    assert!(
        c.paused_records + c.dropped(pure_serve::proto::node::DropReason::Backpressure) > 0,
        "held back while paused: {c:?}"
    );
    let out = &snapshot.app_figures[0].outlets[0];
    assert_eq!(out.lag_records as usize, stored);
    assert!(out.held_bytes <= 1 << 20);
    // Still paused: nothing more is stored, over a while and until the node has held back more of the sender's
    // packets since (so an ack, had there been one, would have come).
    let held_back = || {
        let c = a.stats.snapshot.lock().unwrap().counters.clone();
        c.paused_records + c.dropped(pure_serve::proto::node::DropReason::Backpressure)
    };
    let before = held_back();
    let mut outcome = link.deliver(Some(Duration::from_secs(2))).unwrap();
    let until = Instant::now() + HANG;
    while held_back() <= before {
        assert!(
            Instant::now() < until,
            "the sender's packets never reached the node"
        );
        outcome = link.deliver(Some(Duration::from_millis(100))).unwrap();
    }
    assert_eq!(outcome.unacked, 5000 - stored, "nothing acked while paused");
    assert_eq!(records(&a.state_dir, "main").len(), stored);
    a.stop().unwrap();
}

/// docs/apps.md, `memory_bytes`: what an outlet holds (`pure_outlet_held_bytes`, [`OutletFigures::held_bytes`]) is
/// at most its budget, even when one turn's chunk of a sender is many times the budget (issue 18, item 4: a link
/// with 65,536 held 209,202). B's app pauses after a few records (its own outlet goes nowhere), so A's link, which
/// B answered, holds its budget's worth and waits; the rest of the burst waits in A's store.
#[test]
fn an_outlet_holds_at_most_its_memory_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let (dir_a, dir_b) = (dir.path().join("a"), dir.path().join("b"));
    std::fs::create_dir_all(&dir_a).unwrap();
    std::fs::create_dir_all(&dir_b).unwrap();
    let key_a = Identity::generate();
    pure_serve::keys::write_new_identity(&dir_a.join("node.key"), &key_a).unwrap();
    let device = Identity::generate();
    let dead = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let dead_addr = dead.local_addr().unwrap();
    drop(dead);
    let b = LocalNode::start_apps(
        &dir_b,
        &[("node-a".into(), *key_a.public())],
        apps(&format!(
            "[apps.ingest]\naccept = [\"node-a\"]\nforwarders = [\"node-a\"]\n\
             [apps.ingest.outlets.away]\nkind = \"link\"\nto = \"{dead_addr}\"\nnode_key = \"{}\"\n\
             max_lag_records = 1\n",
            encode_key(Identity::generate().public())
        )),
        Duration::from_secs(30),
        4 << 20,
    )
    .unwrap();
    const BUDGET: usize = 65_536;
    let a = LocalNode::start_apps(
        &dir_a,
        &[("dev".into(), *device.public())],
        apps(&format!(
            "[apps.main]\n[apps.main.outlets.to-b]\nkind = \"link\"\nto = \"{}\"\nnode_key = \"{}\"\n\
             app = \"ingest\"\nmemory_bytes = {BUDGET}\n",
            b.addr,
            encode_key(&b.public)
        )),
        Duration::from_secs(30),
        4 << 20,
    )
    .unwrap();
    let outlet = || {
        let snapshot = a.stats.snapshot.lock().unwrap();
        snapshot
            .app_figures
            .first()
            .and_then(|f| f.outlets.first())
            .map(|o| (o.status, o.held_bytes))
    };
    let held = || outlet().map_or(0, |(_, h)| h);
    // The link has synced with B (its probe was answered) before the burst.
    wait_for("the link to sync", HANG, || {
        outlet().is_some_and(|(s, _)| s == "idle" || s == "sending")
    });
    let mut link = UdpLink::connect(device, a.public, a.addr).unwrap();
    for i in 1..=4_000 {
        link.sender()
            .queue("main", format!("{i:06} {}", "x".repeat(500)).into_bytes())
            .unwrap();
    }
    // Until A stored the burst (2 MB, 30 times the link's budget) and its link held its budget's worth, and a
    // while after, what the link holds is sampled: never more than its budget.
    let mut most = 0;
    let until = Instant::now() + HANG;
    let mut delivered = false;
    let mut after: Option<Instant> = None;
    while after.is_none_or(|t| t.elapsed() < Duration::from_secs(2)) {
        assert!(
            Instant::now() < until,
            "A stored the burst: {delivered}; the link held at most {most} bytes"
        );
        if !delivered {
            delivered = link
                .deliver(Some(Duration::from_millis(100)))
                .unwrap()
                .unacked
                == 0;
        } else {
            std::thread::sleep(Duration::from_millis(10));
        }
        most = most.max(held());
        if delivered && most > BUDGET / 2 && after.is_none() {
            after = Some(Instant::now());
        }
    }
    assert!(
        most <= BUDGET,
        "held {most} bytes with memory_bytes = {BUDGET}"
    );
    assert!(records(&b.state_dir, "ingest").len() < 4_000, "B paused");
    a.stop().unwrap();
    b.stop().unwrap();
}
