//! `pure-serve demo`: a node and simulated senders on loopback in one process. Shows progress while they deliver,
//! then what was stored (checked in the store: each record exactly once), how fast, and ack latency percentiles.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;

use crate::apps::config::AppsConfig;
use crate::proto::crypto::Identity;
use crate::receive::LocalNode;
use crate::sender::UdpLink;
use crate::store;

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Simulated senders, each on its own thread and UDP socket.
    #[arg(long, default_value_t = 20)]
    pub senders: usize,
    /// Records each sender delivers.
    #[arg(long, default_value_t = 20_000)]
    pub records: usize,
    /// Records a sender queues at once; the ack latency is measured per burst.
    #[arg(long, default_value_t = 500)]
    pub burst: usize,
    /// Bytes per record payload.
    #[arg(long, default_value_t = 40)]
    pub payload: usize,
    /// Keep the demo's files here instead of in a temporary directory (the node's state is DIR/state: inspect it
    /// with `pure-serve records --state DIR/state`).
    #[arg(long, value_name = "DIR")]
    pub state: Option<PathBuf>,
    /// Also forward: app `main` gets an inner outlet to a second app `copy` and a link outlet to app `ingest` of a
    /// second node in this process (docs/apps.md); the demo then checks that both ends got every record once,
    /// with its origin, and says how fast they were forwarded.
    #[arg(long)]
    pub forward: bool,
}

/// Counts each origin's records in `app` of `state` and checks they are 1..=per_origin once each, in order.
/// Returns (records, origins, exactly once).
fn check_forwarded(
    state: &std::path::Path,
    app: &str,
    per_origin: u64,
) -> anyhow::Result<(u64, usize, bool)> {
    let s =
        store::open_app_for_reading(state, app).with_context(|| format!("opening store {app}"))?;
    let mut last = std::collections::HashMap::<String, u64>::new();
    let mut ok = true;
    let mut n = 0;
    s.for_each_record_view(None, 1, |r| {
        n += 1;
        match r.origin {
            Some((origin, seq)) => {
                let l = last.entry(origin.to_string()).or_insert(0);
                ok &= seq == *l + 1;
                *l = seq;
            }
            None => ok = false,
        }
        true
    })?;
    ok &= last.values().all(|&l| l == per_origin);
    Ok((n, last.len(), ok))
}

fn head_of(state: &std::path::Path, app: &str) -> u64 {
    store::open_app_for_reading(state, app)
        .and_then(|s| s.read_head())
        .map(|h| h - 1)
        .unwrap_or(0)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

pub fn run(args: &DemoArgs) -> anyhow::Result<()> {
    if args.senders == 0 || args.records == 0 || args.burst == 0 {
        bail!("--senders, --records and --burst must be at least 1");
    }
    let temp;
    let state_dir = match &args.state {
        // A demo checks that its senders' records are 1..=N once each: in the state of an earlier demo its new
        // senders, named as the old ones, would go on after them and the check would fail on a sound store.
        Some(d) if std::fs::read_dir(d).is_ok_and(|mut entries| entries.next().is_some()) => bail!(
            "demo --state {}: the directory is not empty (an earlier demo's state?); give a new or empty \
             directory, or delete this one",
            d.display()
        ),
        Some(d) => d.clone(),
        None => {
            temp = tempfile::Builder::new().prefix("pure-demo-").tempdir()?;
            temp.path().to_path_buf()
        }
    };
    let identities: Vec<Identity> = (0..args.senders).map(|_| Identity::generate()).collect();
    std::fs::create_dir_all(&state_dir)?;
    let listed: Vec<(String, [u8; 32])> = identities
        .iter()
        .enumerate()
        .map(|(i, id)| (format!("device-{i}"), *id.public()))
        .collect();
    // With --forward: node B first (node A's link outlet needs its address and key), then A, whose key B lists.
    let far = if args.forward {
        let dir_b = state_dir.join("node-b");
        let dir_a = state_dir.join("node-a");
        std::fs::create_dir_all(&dir_b)?;
        std::fs::create_dir_all(&dir_a)?;
        let key_a = Identity::generate();
        crate::keys::write_new_identity(&dir_a.join("node.key"), &key_a)?;
        let b_apps = AppsConfig::parse(
            std::path::Path::new("demo-b.toml"),
            "[apps.ingest]\naccept = [\"node-a\"]\nforwarders = [\"node-a\"]\n",
        )?;
        let b = LocalNode::start_apps(
            &dir_b,
            &[("node-a".to_string(), *key_a.public())],
            b_apps,
            Duration::from_secs(30),
            4 << 20,
        )?;
        Some((b, dir_a))
    } else {
        None
    };
    let node = match &far {
        Some((b, dir_a)) => {
            let text = format!(
                "[apps.main]\n\
                 [apps.main.outlets.to-b]\nkind = \"link\"\nto = \"{}\"\nnode_key = \"{}\"\napp = \"ingest\"\n\
                 [apps.main.outlets.copy]\nkind = \"app\"\napp = \"copy\"\n\
                 [apps.copy]\naccept = []\n",
                b.addr,
                crate::keys::encode_key(&b.public)
            );
            let apps = AppsConfig::parse(std::path::Path::new("demo-a.toml"), &text)?;
            LocalNode::start_apps(dir_a, &listed, apps, Duration::from_secs(30), 4 << 20)?
        }
        None => LocalNode::start(&state_dir, &listed, Duration::from_secs(30), 4 << 20)?,
    };
    let (addr, node_key, stats) = (node.addr, node.public, node.stats.clone());
    let state_dir = node.state_dir.clone();
    let total = (args.senders * args.records) as u64;
    println!(
        "demo: {} senders × {} records of {} bytes → node at udp {addr} (state {})",
        args.senders,
        args.records,
        args.payload,
        state_dir.display()
    );
    let start = Instant::now();
    let mut workers = Vec::new();
    for (i, identity) in identities.into_iter().enumerate() {
        let (records, burst, payload) = (args.records, args.burst, args.payload);
        workers.push(std::thread::spawn(
            move || -> anyhow::Result<Vec<Duration>> {
                let mut link = UdpLink::connect(identity, node_key, addr)?;
                let mut latencies = Vec::new();
                let mut sent = 0;
                while sent < records {
                    let n = burst.min(records - sent);
                    for k in 0..n {
                        let mut body = format!("device-{i} record {}", sent + k + 1).into_bytes();
                        body.resize(payload.max(body.len()), b'.');
                        link.sender().queue("main", body)?;
                    }
                    let t = Instant::now();
                    let outcome = link.deliver(Some(Duration::from_secs(60)))?;
                    if outcome.unacked > 0 {
                        bail!(
                            "device-{i}: {} records not acknowledged within 60 s",
                            outcome.unacked
                        );
                    }
                    latencies.push(t.elapsed());
                    sent += n;
                }
                Ok(latencies)
            },
        ));
    }
    let show = std::io::stderr().is_terminal();
    let mut shown = Instant::now();
    // Poll often so the end time is exact; show progress a few times a second.
    while workers.iter().any(|w| !w.is_finished()) {
        std::thread::sleep(Duration::from_millis(2));
        if show && shown.elapsed() >= Duration::from_millis(200) {
            shown = Instant::now();
            let stored = stats.stored_records.load(Ordering::Relaxed);
            eprint!(
                "\rstored {stored} of {total} ({:.0}%), {} sessions",
                stored as f64 * 100.0 / total as f64,
                stats.sessions.load(Ordering::Relaxed)
            );
            let _ = std::io::stderr().flush();
        }
    }
    if show {
        eprintln!();
    }
    let elapsed = start.elapsed();
    let mut latencies = Vec::new();
    for w in workers {
        let l = w
            .join()
            .map_err(|_| anyhow::anyhow!("a sender thread panicked"))??;
        latencies.extend(l);
    }
    let forwarded = match &far {
        Some((b, _)) => {
            // The senders are done; now wait for both ends of main's outlets to have everything.
            let started = Instant::now();
            let mut shown = Instant::now();
            loop {
                let (on_b, copied) = (head_of(&b.state_dir, "ingest"), head_of(&state_dir, "copy"));
                if on_b >= total && copied >= total {
                    break;
                }
                if started.elapsed() > Duration::from_secs(120) {
                    bail!(
                        "forwarding did not finish within 120 s: node B has {on_b}, copy has {copied} of {total}"
                    );
                }
                if show && shown.elapsed() >= Duration::from_millis(200) {
                    shown = Instant::now();
                    eprint!("\rforwarded: node B {on_b}, copy {copied} of {total}");
                    let _ = std::io::stderr().flush();
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            if show {
                eprintln!();
            }
            Some(start.elapsed())
        }
        None => None,
    };
    let counters = node.stop()?;
    // Check exactly-once in the store itself, not in the node's counters.
    let s = store::open_app_for_reading(&state_dir, "main").context("opening the demo's store")?;
    let mut seen = std::collections::HashMap::<String, u64>::new();
    let mut in_order = true;
    s.for_each_record(None, |source, seq, _| {
        let last = seen.entry(source.to_string()).or_insert(0);
        in_order &= seq == *last + 1;
        *last = seq;
        true
    })?;
    let stored: u64 = seen.values().sum();
    latencies.sort();
    println!(
        "stored {stored} records from {} senders in {:.2} s: {:.0} records/s",
        seen.len(),
        elapsed.as_secs_f64(),
        stored as f64 / elapsed.as_secs_f64()
    );
    println!(
        "each exactly once: {} (every sender's sequence 1..{} present once, checked in the store)",
        if in_order && stored == total {
            "yes"
        } else {
            "NO"
        },
        args.records
    );
    println!(
        "burst of {} records → stored ack: p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms ({} bursts)",
        args.burst,
        percentile(&latencies, 0.5).as_secs_f64() * 1e3,
        percentile(&latencies, 0.9).as_secs_f64() * 1e3,
        percentile(&latencies, 0.99).as_secs_f64() * 1e3,
        latencies.len()
    );
    println!(
        "node: {} datagrams, {} duplicates ignored, {} dropped, {} X25519",
        counters.datagrams,
        counters.duplicate_records,
        counters.total_dropped(),
        counters.x25519
    );
    if stored != total || !in_order {
        bail!("the store does not hold every record exactly once");
    }
    if let (Some((b, _)), Some(all_done)) = (far, forwarded) {
        let b_dir = b.state_dir.clone();
        b.stop()?;
        let per = args.records as u64;
        let (n_copy, o_copy, ok_copy) = check_forwarded(&state_dir, "copy", per)?;
        let (n_b, o_b, ok_b) = check_forwarded(&b_dir, "ingest", per)?;
        let yes = |ok: bool| if ok { "yes" } else { "NO" };
        println!(
            "inner outlet main → copy: {n_copy} records from {o_copy} origins, each exactly once: {}",
            yes(ok_copy && n_copy == total)
        );
        println!(
            "link outlet main → node B ingest: {n_b} records from {o_b} origins, each exactly once: {} \
             (source node-a, origin and sequence of each device kept)",
            yes(ok_b && n_b == total)
        );
        println!(
            "stored at the far ends {:.2} s after the start: {:.0} records/s end to end",
            all_done.as_secs_f64(),
            total as f64 / all_done.as_secs_f64()
        );
        if !(ok_copy && ok_b && n_copy == total && n_b == total) {
            bail!("a far end does not hold every record exactly once");
        }
    }
    Ok(())
}
