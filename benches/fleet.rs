//! research/025-fleet-nodes and research/028-fleet-limit: records/s stored and acked by one node on SQLite, by one,
//! two and three nodes on one PostgreSQL, and by the database alone at the same batch size, in one round.
//!
//! A round makes a PostgreSQL cluster of its own (as the tests do: `tests/pg_util`), one node key, `--devices` K
//! device keys and a senders file listing them. Then, for each configuration in turn, on a fresh database and fresh
//! state directories:
//! - `sqlite1`, `pg1`, `pg2`, `pg3` (and the variants `pg1-pglz`, `pg1-lz4`, research/025): 1 node on SQLite or N
//!   nodes on one PostgreSQL, device j to node j mod N;
//! - `db1`, `db2`, `db3` (research/028): no node, no UDP, no sender. N threads of this process, each with its own
//!   `PostgresTurns` engine (the node's engine code and transactions), submit turns of the shape the `pgN` run
//!   before it in the same round made (chunk rows per turn = chunk rows ÷ the nodes' committed turns; records per
//!   row = records ÷ chunk rows; records per piece = records ÷ packets received), up to `--depth` (4, the node's
//!   `MAX_UNSYNCED`) in flight per engine; engine i takes the sources node i had. Same records, same payloads.
//!
//! Two shapes:
//! - big turns (the default, research/025): K `pure-serve send` processes of `--records` R short lines each, all
//!   started at once; records/s = K·R ÷ the time from the first started to the last exited (each exits 0 only when
//!   every record is acked);
//! - `--many`: K devices (default 10,000) driven from this process (`util/devices.rs`, one `Sender` each), a new
//!   run each warmed with one record (its X25519 is not measured; `--link-idle-ms` is raised so the sessions live
//!   through the run), then `--waves` W waves in which every device queues `--per-packet` P records (one packet)
//!   and waits for its stored ack, at most `--in-flight` F devices (1024) waiting at once; records/s = K·W·P ÷ the
//!   waves' time. `dbN` warms its sources likewise, untimed. Between the warm-up and the waves the database is
//!   analyzed (as autovacuum would be on a live fleet), unless `--no-analyze`.
//!
//! Beside it, over the same span, CPU per record of the nodes (their threads' schedstat), of PostgreSQL (every
//! process of the cluster: utime + stime of the postmaster and its children from /proc), of the senders (`send`:
//! wait4; `--many`: this process, which drives them) and of the engines (`dbN`: this process).
//!
//! After each configuration the store is checked: every record once (K·R, or K·(1 + W·P), in the chunks), each
//! device's heard sequence, positions 1..head without a gap. A configuration that fails a check panics rather
//! than print.
//!
//! Prints one JSON object per line on stdout: `{"name", "run", "config", "value", "unit"}`; progress to stderr.
//! `research/experiments/025-fleet-nodes/run.sh` and `research/experiments/028-fleet-limit/run.sh` run it for
//! several rounds.
//!
//! Usage: cargo bench --bench fleet -- [--records R] [--devices K] [--round N]
//! [--configs sqlite1,pg1,db1,pg2,db2,pg3,db3] [--bin PATH] [--depth D]
//! [--many [--waves W] [--per-packet P] [--in-flight F] [--no-analyze]] [--statements]
//!
//! For each PostgreSQL configuration it prints the WAL written over the timed span per record and the WAL's
//! syncs (`pg_stat_wal`); with `--statements` the cluster preloads `pg_stat_statements` and the statements that
//! took the database's time over the span are printed too (research/047).

#[path = "util/devices.rs"]
mod devices;
#[path = "../tests/pg_util/mod.rs"]
mod pg_util;
#[path = "util/process.rs"]
mod process;

use std::collections::HashMap;
use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use devices::{Driven, drive};
use pg_util::sql;
use process::{metric, par_map, process_cpu, wait_with_cpu};
use pure_serve::keys::{encode_key, write_new_identity};
use pure_serve::proto::crypto::Identity;
use pure_serve::proto::sender::{FlowStart, Sender, SenderConfig, SenderEvent};
use pure_serve::proto::wire::{self, RecordFormat};
use pure_serve::store::engine::{AppTurn, OwnedPiece, TurnOutcome, TurnStore};
use pure_serve::store::postgres::PostgresTurns;

/// The shape of this run's turns (`big`, or `many-pP` for `--many --per-packet P`), in every line printed, so that
/// the lines of several runs can be kept in one file.
static SHAPE: std::sync::OnceLock<String> = std::sync::OnceLock::new();

fn emit(run: u32, config: &str, name: &str, value: f64, unit: &str) {
    let shape = SHAPE.get().map_or("big", |s| s.as_str());
    println!(
        "{}",
        serde_json::json!({"name": name, "run": run, "config": config, "shape": shape, "value": value, "unit": unit})
    );
    eprintln!("  {config} {name} = {value:.3} {unit}");
}

/// Clock ticks per second, for /proc's utime and stime.
fn ticks_per_s() -> f64 {
    // SAFETY: sysconf has no preconditions.
    (unsafe { libc::sysconf(libc::_SC_CLK_TCK) }) as f64
}

/// CPU time (utime + stime) of `root` and every process below it, from /proc; and the part of it spent by the
/// cluster's connection backends (a child whose title names its client, `… [local] …`) rather than its own
/// processes (WAL writer, checkpointer, background writer, autovacuum): research/047 asks which a record costs.
fn tree_cpu_split(root: u32) -> (Duration, Duration) {
    let mut ticks = 0u64;
    let mut backend_ticks = 0u64;
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return (Duration::ZERO, Duration::ZERO);
    };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // Fields after the command (in parentheses, which may hold spaces): state ppid … utime(14) stime(15).
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        let ppid: u32 = f.get(1).and_then(|v| v.parse().ok()).unwrap_or(0);
        if pid == root || ppid == root {
            let ut: u64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0);
            let st: u64 = f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0);
            ticks += ut + st;
            let title = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if String::from_utf8_lossy(&title).contains("[local]") {
                backend_ticks += ut + st;
            }
        }
    }
    let of = |t: u64| Duration::from_secs_f64(t as f64 / ticks_per_s());
    (of(ticks), of(backend_ticks))
}

/// The postmaster's pid, from the first line of `postmaster.pid` in the cluster's data directory.
fn postmaster_pid(cluster: &pg_util::PgCluster) -> u32 {
    let text = std::fs::read_to_string(cluster.socket_dir().join("data/postmaster.pid"))
        .expect("postmaster.pid");
    text.lines()
        .next()
        .and_then(|l| l.trim().parse().ok())
        .expect("a pid")
}

/// CPU time (user + system) of this process so far, its ended threads included (a `dbN` run's engine threads end
/// before the figure is read).
fn self_cpu() -> Duration {
    // SAFETY: a zeroed rusage is a valid out-parameter.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_SELF with a valid out-parameter.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// CPU time all the machine's cores spent busy so far (every process, this bench's or another tenant's), from the
/// first line of /proc/stat: user, nice, system, irq, softirq and steal.
fn machine_busy() -> Duration {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let f: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().unwrap_or(0))
        .collect();
    let busy: u64 = [0, 1, 2, 5, 6, 7].iter().filter_map(|&i| f.get(i)).sum();
    Duration::from_secs_f64(busy as f64 / ticks_per_s())
}

struct Node {
    child: Child,
    link: SocketAddr,
    http: SocketAddr,
}

impl Node {
    /// A series of its `/metrics`, summed over `nodes`.
    fn sum(nodes: &[Node], name: &str) -> f64 {
        nodes.iter().map(|n| metric(n.http, name)).sum()
    }
}

fn start_node(bin: &str, dir: &Path, name: &str, store: Option<&str>, extra: &[&str]) -> Node {
    let mut cmd = Command::new(bin);
    cmd.arg("--key")
        .arg(dir.join("node.key"))
        .arg("--senders")
        .arg(dir.join("senders"))
        .arg("--state")
        .arg(dir.join(name))
        .args([
            "--bind",
            "127.0.0.1",
            "--link-port",
            "0",
            "--http-port",
            "0",
        ])
        .args(extra)
        .env("RUST_LOG", "warn")
        .env_remove("NOTIFY_SOCKET")
        .env_remove("WATCHDOG_USEC")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if let Some(url) = store {
        cmd.args(["--store", url]);
    }
    let mut child = cmd.spawn().expect("pure-serve node");
    let banner = process::read_banner(child.stdout.take().expect("stdout"));
    Node {
        child,
        link: banner.link,
        http: banner.http,
    }
}

/// What a round measures.
#[derive(Clone, Copy)]
enum Workload {
    /// research/025: K `pure-serve send` of R records each.
    Big { records: u64 },
    /// research/028: K devices warmed with one record each, then W waves of P records per device in one packet, at
    /// most `in_flight` devices waiting for their ack at once.
    Many {
        waves: u64,
        per_packet: u64,
        in_flight: usize,
    },
}

impl Workload {
    /// The sequence of a device's first record in the timed span, and its heard sequence at the end.
    fn timed_seqs(self) -> (u64, u64) {
        match self {
            Workload::Big { records } => (1, records),
            Workload::Many {
                waves, per_packet, ..
            } => (2, 1 + waves * per_packet),
        }
    }

    /// Device `dev`'s record `seq`: for big turns the line `seq` prints (what `send` reads), for many devices a
    /// short record naming both.
    fn payload(self, dev: usize, seq: u64) -> Vec<u8> {
        match self {
            Workload::Big { .. } => seq.to_string().into_bytes(),
            Workload::Many { .. } => format!("d{dev}s{seq}").into_bytes(),
        }
    }
}

/// The shape of the turns the nodes of a `pgN` run committed, which its `dbN` submits.
#[derive(Clone, Copy, Debug)]
struct Shape {
    rows_per_turn: f64,
    records_per_row: f64,
    records_per_piece: f64,
}

/// What one configuration measured over its timed span.
#[derive(Default)]
struct Measured {
    secs: f64,
    records: u64,
    node_cpu: Option<Duration>,
    pg_cpu: Option<Duration>,
    /// Of `pg_cpu`, what the cluster's connection backends spent (the rest: its own processes).
    pg_backend_cpu: Option<Duration>,
    /// The senders' (`send` processes, or this process driving many devices).
    send_cpu: Option<Duration>,
    /// `dbN`: this process, whose threads run the engines.
    engine_cpu: Option<Duration>,
    /// Committed turns and packets received by the nodes over the span.
    turns: f64,
    packets: f64,
    /// Sessions the nodes made over the span (`--many`: 0 once warmed).
    sessions_made: f64,
    /// What all the machine's cores spent busy over the span, whoever ran: 2 s per second is a full machine.
    machine: Duration,
}

/// The same share `i` of `x` per step as a steady rate would give: step `i` (from 1) of a running total of `x`
/// per step, so that fractional averages come out exact over many steps.
fn step(x: f64, i: u64) -> u64 {
    ((x * i as f64).round() - (x * (i - 1) as f64).round()).max(1.0) as u64
}

/// The turns of one `dbN` engine: its `sources` (device indexes), each from `first` through `last`, cut to
/// `shape`: rows of `records_per_row` records taken from the sources in turn, `rows_per_turn` of them per turn,
/// each row in pieces of `records_per_piece` records (a node's turn has a piece per DATA frame).
fn turns_of(
    sources: &[usize],
    first: u64,
    last: u64,
    shape: Shape,
    workload: Workload,
) -> Vec<AppTurn> {
    let mut next = vec![first; sources.len()];
    let mut left = sources.len() as u64 * (last + 1 - first);
    let per_piece = shape.records_per_piece.round().max(1.0) as u64;
    let (mut cursor, mut rows, mut turns) = (0usize, 0u64, Vec::new());
    while left > 0 {
        let want = step(shape.rows_per_turn, turns.len() as u64 + 1);
        let mut pieces = Vec::new();
        let (mut taken, mut scanned) = (0, 0);
        while taken < want && scanned < sources.len() {
            let k = cursor % sources.len();
            cursor += 1;
            scanned += 1;
            if next[k] > last {
                continue;
            }
            rows += 1;
            let n = step(shape.records_per_row, rows).min(last + 1 - next[k]);
            let end = next[k] + n;
            while next[k] < end {
                let count = per_piece.min(end - next[k]);
                let mut records = Vec::new();
                for seq in next[k]..next[k] + count {
                    wire::put_record(&mut records, &workload.payload(sources[k], seq));
                }
                pieces.push(OwnedPiece {
                    source: format!("dev{}", sources[k]),
                    first_seq: next[k],
                    count,
                    format: RecordFormat::Plain,
                    records,
                });
                next[k] += count;
            }
            left -= n;
            taken += 1;
        }
        turns.push(AppTurn {
            app: 0,
            pieces,
            ..AppTurn::default()
        });
    }
    turns
}

/// Submits `turns` to `engine`, at most `depth` waiting for their outcome, and waits for the last. Returns the
/// records stored; a turn that fails stops the bench (nothing of it would be acked).
fn apply_all(engine: &mut PostgresTurns, turns: Vec<AppTurn>, seq: &mut u64, depth: usize) -> u64 {
    let mut stored = 0;
    let mut take = |outcomes: Vec<TurnOutcome>| {
        for o in outcomes {
            for (_, r) in o.apps {
                stored += r.expect("a turn of the database alone failed").stored;
            }
        }
    };
    for t in turns {
        while engine.waiting() >= depth {
            take(engine.wait_done());
        }
        *seq += 1;
        engine.submit(*seq, vec![t]);
    }
    while engine.waiting() > 0 {
        take(engine.wait_done());
    }
    stored
}

/// A `dbN` run: `nodes` engines, turns of `shape`, at most `depth` of them waiting per engine.
struct Alone {
    nodes: usize,
    shape: Shape,
    depth: usize,
}

/// `dbN`: `nodes` engines in threads of this process, engine i with the sources of devices j ≡ i (mod N).
fn run_db(
    url: &str,
    Alone {
        nodes,
        shape,
        depth,
    }: Alone,
    devices: usize,
    workload: Workload,
    postmaster: u32,
    warmed: &dyn Fn(),
) -> Measured {
    // Opened one after another, as the nodes start: the first makes the tables.
    let engines: Vec<PostgresTurns> = (0..nodes)
        .map(|_| PostgresTurns::open(url, None, &["main".to_string()]).expect("engine"))
        .collect();
    let (warm, ready) = (
        Arc::new(Barrier::new(nodes + 1)),
        Arc::new(Barrier::new(nodes + 1)),
    );
    let threads: Vec<_> = engines
        .into_iter()
        .enumerate()
        .map(|(i, mut engine)| {
            let (warm, ready) = (warm.clone(), ready.clone());
            std::thread::spawn(move || {
                let sources: Vec<usize> = (i..devices).step_by(nodes).collect();
                let (first, last) = workload.timed_seqs();
                let mut seq = 0;
                if first > 1 {
                    // Warmed as the devices are: one record each, untimed (their source rows made).
                    let warm = Shape {
                        records_per_row: 1.0,
                        records_per_piece: 1.0,
                        ..shape
                    };
                    let warm = turns_of(&sources, 1, first - 1, warm, workload);
                    apply_all(&mut engine, warm, &mut seq, depth);
                }
                warm.wait();
                // Made before the clock starts: the database's figure, not the bench's encoding.
                let turns = turns_of(&sources, first, last, shape, workload);
                let n = turns.len() as u64;
                ready.wait();
                let stored = apply_all(&mut engine, turns, &mut seq, depth);
                // Handed back, not dropped: its connection's backend is still counted when the CPU is read.
                (engine, stored, n)
            })
        })
        .collect();
    warm.wait();
    warmed();
    ready.wait();
    let (cpu0, pg0, busy0, t) = (
        self_cpu(),
        tree_cpu_split(postmaster),
        machine_busy(),
        Instant::now(),
    );
    let done: Vec<_> = threads
        .into_iter()
        .map(|h| h.join().expect("an engine thread"))
        .collect();
    let secs = t.elapsed().as_secs_f64();
    let pg1 = tree_cpu_split(postmaster);
    let (engine_cpu, pg_cpu) = (self_cpu() - cpu0, pg1.0.saturating_sub(pg0.0));
    let machine = machine_busy().saturating_sub(busy0);
    let records = done.iter().map(|d| d.1).sum();
    let turns = done.iter().map(|d| d.2).sum::<u64>() as f64;
    drop(done);
    Measured {
        secs,
        records,
        pg_cpu: Some(pg_cpu),
        pg_backend_cpu: Some(pg1.1.saturating_sub(pg0.1)),
        engine_cpu: Some(engine_cpu),
        turns,
        machine,
        ..Measured::default()
    }
}

/// Big turns: K `pure-serve send` at once, device j to node j mod N.
fn run_sends(
    bin: &str,
    d: &Path,
    started: &[Node],
    node_public: &str,
    devices: usize,
    postmaster: u32,
) -> Measured {
    let nodes = started.len();
    let node_cpu0: Duration = started.iter().map(|n| process_cpu(n.child.id())).sum();
    let (pg_cpu0, busy0) = (tree_cpu_split(postmaster), machine_busy());
    let t = Instant::now();
    // Waited for by wait4 below, which also gives their CPU time.
    #[allow(clippy::zombie_processes)]
    let sends: Vec<Child> = (0..devices)
        .map(|j| {
            Command::new(bin)
                .arg("send")
                .arg("--key")
                .arg(d.join(format!("dev{j}.key")))
                .args(["--node", node_public])
                .args(["--to", &started[j % nodes].link.to_string()])
                .args(["--timeout", "60"])
                .stdin(std::fs::File::open(d.join("lines")).expect("lines"))
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("pure-serve send")
        })
        .collect();
    let mut send_cpu = Duration::ZERO;
    let mut all_ok = true;
    for s in &sends {
        let (status, cpu) = wait_with_cpu(s.id());
        send_cpu += cpu;
        all_ok &= libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
    }
    let secs = t.elapsed().as_secs_f64();
    let node_cpu: Duration = started
        .iter()
        .map(|n| process_cpu(n.child.id()))
        .sum::<Duration>()
        - node_cpu0;
    let pg_cpu1 = tree_cpu_split(postmaster);
    let machine = machine_busy().saturating_sub(busy0);
    assert!(all_ok, "a send did not exit 0");
    Measured {
        secs,
        node_cpu: Some(node_cpu),
        pg_cpu: Some(pg_cpu1.0.saturating_sub(pg_cpu0.0)),
        pg_backend_cpu: Some(pg_cpu1.1.saturating_sub(pg_cpu0.1)),
        send_cpu: Some(send_cpu),
        turns: Node::sum(started, "pure_turns_total{outcome=\"committed\"}"),
        packets: Node::sum(started, "pure_packets_received_total"),
        sessions_made: Node::sum(started, "pure_sessions_made_total"),
        machine,
        ..Measured::default()
    }
}

/// One device of `--many`: its run, and the node of the fleet it sends to.
struct Device {
    index: usize,
    node: usize,
    sender: Sender,
    refused: u32,
}

impl Driven for Device {
    fn sender(&mut self) -> &mut Sender {
        &mut self.sender
    }

    fn event(&mut self, e: SenderEvent) {
        if matches!(e, SenderEvent::Refused { .. }) {
            self.refused += 1;
        }
    }
}

/// `--many` through the nodes: every device warmed with a new run and one record, then the timed waves.
fn run_devices(
    started: &[Node],
    ids: &[Identity],
    node_public: [u8; 32],
    workload: Workload,
    postmaster: u32,
    rows: &dyn Fn() -> u64,
    warmed: &dyn Fn(),
) -> (Measured, u64) {
    let Workload::Many {
        waves,
        per_packet,
        in_flight,
    } = workload
    else {
        unreachable!("only --many drives devices")
    };
    let links: Vec<SocketAddr> = started.iter().map(|n| n.link).collect();
    let nodes = links.len();
    let devices = par_map(ids.len(), |i| {
        let mut sender = Sender::new(SenderConfig::new(ids[i].clone(), node_public)).unwrap();
        sender.open_flow("main", FlowStart::At(1)).unwrap();
        sender.queue("main", workload.payload(i, 1)).unwrap();
        Device {
            index: i,
            node: i % nodes,
            sender,
            refused: 0,
        }
    });
    let t = Instant::now();
    let (mut devices, rest) = drive(devices, in_flight, None, |d| links[d.node]);
    assert!(rest.is_empty());
    eprintln!(
        "  warmed {} devices in {:.1} s",
        devices.len(),
        t.elapsed().as_secs_f64()
    );
    warmed();
    let counters = |name| Node::sum(started, name);
    let (turns0, packets0, made0) = (
        counters("pure_turns_total{outcome=\"committed\"}"),
        counters("pure_packets_received_total"),
        counters("pure_sessions_made_total"),
    );
    let rows0 = rows();
    let node_cpu0: Duration = started.iter().map(|n| process_cpu(n.child.id())).sum();
    let (pg_cpu0, self0, busy0, t) = (
        tree_cpu_split(postmaster),
        self_cpu(),
        machine_busy(),
        Instant::now(),
    );
    for w in 0..waves {
        for d in &mut devices {
            for k in 0..per_packet {
                let seq = 2 + w * per_packet + k;
                d.sender
                    .queue("main", workload.payload(d.index, seq))
                    .unwrap();
            }
        }
        let rest;
        (devices, rest) = drive(devices, in_flight, None, |d| links[d.node]);
        assert!(rest.is_empty());
    }
    let secs = t.elapsed().as_secs_f64();
    let node_cpu = started
        .iter()
        .map(|n| process_cpu(n.child.id()))
        .sum::<Duration>()
        - node_cpu0;
    let (pg_cpu1, send_cpu, machine) = (
        tree_cpu_split(postmaster),
        self_cpu() - self0,
        machine_busy().saturating_sub(busy0),
    );
    let last = 1 + waves * per_packet;
    for d in &devices {
        assert_eq!(d.refused, 0, "dev{} was refused", d.index);
        assert_eq!(
            d.sender.stored_through("main"),
            Some(last),
            "dev{}",
            d.index
        );
    }
    let m = Measured {
        secs,
        records: devices.len() as u64 * waves * per_packet,
        node_cpu: Some(node_cpu),
        pg_cpu: Some(pg_cpu1.0.saturating_sub(pg_cpu0.0)),
        pg_backend_cpu: Some(pg_cpu1.1.saturating_sub(pg_cpu0.1)),
        send_cpu: Some(send_cpu),
        turns: counters("pure_turns_total{outcome=\"committed\"}") - turns0,
        packets: counters("pure_packets_received_total") - packets0,
        sessions_made: counters("pure_sessions_made_total") - made0,
        machine,
        ..Measured::default()
    };
    (m, rows() - rows0)
}

/// Chunk rows in a fleet database.
fn pg_rows(conninfo: &str) -> u64 {
    sql(conninfo, async |c| {
        c.query_one("SELECT count(*) FROM chunks", &[])
            .await
            .expect("rows")
            .get::<_, i64>(0) as u64
    })
}

/// Every record once in a fleet database: `total` records in the chunks, `devices` sources each heard through
/// `heard`, positions 1..head without a gap. Returns the chunk rows.
fn check_pg(conninfo: &str, config: &str, devices: usize, total: u64, heard: u64) -> u64 {
    let (stored, sources, min_heard, max_heard, head, gaps, rows) = sql(conninfo, async |c| {
        let r = c
            .query_one(
                "SELECT coalesce(sum(count), 0)::bigint, \
                        (SELECT count(*) FROM sources), \
                        (SELECT min(heard) FROM sources), (SELECT max(heard) FROM sources), \
                        (SELECT head FROM apps WHERE name = 'main'), \
                        (SELECT count(*) FROM (SELECT pos, count, \
                            lead(pos) OVER (ORDER BY pos) AS next FROM chunks) x \
                         WHERE next IS NOT NULL AND next <> pos + count), \
                        count(*) \
                 FROM chunks",
                &[],
            )
            .await
            .expect("check query");
        (
            r.get::<_, i64>(0),
            r.get::<_, i64>(1),
            r.get::<_, Option<i64>>(2),
            r.get::<_, Option<i64>>(3),
            r.get::<_, i64>(4),
            r.get::<_, i64>(5),
            r.get::<_, i64>(6),
        )
    });
    assert_eq!(stored as u64, total, "{config}: records in the chunks");
    assert_eq!(sources as usize, devices, "{config}: sources");
    assert_eq!(min_heard, Some(heard as i64), "{config}: heard");
    assert_eq!(max_heard, Some(heard as i64), "{config}: heard");
    assert_eq!(head as u64, total + 1, "{config}: head");
    assert_eq!(gaps, 0, "{config}: positions with gaps");
    rows as u64
}

/// The same checks on one node's SQLite store.
fn check_sqlite(path: &Path, config: &str, devices: usize, total: u64, heard: u64) {
    let conn = rusqlite::Connection::open(path).expect("the node's store");
    let (stored, sources, min_heard, max_heard, first, gaps): (i64, i64, i64, i64, i64, i64) = conn
        .query_row(
            "SELECT (SELECT sum(count) FROM chunks), (SELECT count(*) FROM sources), \
                    (SELECT min(heard) FROM sources), (SELECT max(heard) FROM sources), \
                    (SELECT min(pos) FROM chunks), \
                    (SELECT count(*) FROM (SELECT pos, count, lead(pos) OVER (ORDER BY pos) AS next FROM chunks) \
                     WHERE next IS NOT NULL AND next <> pos + count)",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?)),
        )
        .expect("check query");
    assert_eq!(stored as u64, total, "{config}: records in the chunks");
    assert_eq!(sources as usize, devices, "{config}: sources");
    assert_eq!(
        (min_heard, max_heard),
        (heard as i64, heard as i64),
        "{config}: heard"
    );
    assert_eq!((first, gaps), (1, 0), "{config}: positions with gaps");
}

/// The cluster's WAL so far (`pg_stat_wal`, PostgreSQL 14 or later): bytes, records, and the syncs of the WAL
/// (`wal_sync`: each COMMIT's flush that found its WAL not yet on disk).
fn wal_now(conninfo: &str) -> (f64, f64, f64) {
    sql(conninfo, async |c| {
        let r = c
            .query_one(
                "SELECT wal_bytes::float8, wal_records::float8, wal_sync::float8 FROM pg_stat_wal",
                &[],
            )
            .await
            .expect("pg_stat_wal");
        (r.get(0), r.get(1), r.get(2))
    })
}

/// research/047: the statements of the timed span (since the reset when the devices were warmed, or the whole
/// run for big turns) by the database's time in them, one JSON line each: calls, time in all, time per record,
/// rows, and the statement.
fn print_statements(conninfo: &str, round: u32, config: &str, records: u64) {
    let rows = sql(conninfo, async |c| {
        c.query(
            "SELECT query, calls::float8, total_exec_time, rows::float8,                     (wal_bytes)::float8 FROM pg_stat_statements              WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())              ORDER BY total_exec_time DESC LIMIT 12",
            &[],
        )
        .await
        .expect("pg_stat_statements")
    });
    for r in rows {
        let (query, calls, ms, n, wal): (String, f64, f64, f64, f64) =
            (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4));
        let shape = SHAPE.get().map_or("big", |s| s.as_str());
        println!(
            "{}",
            serde_json::json!({"name": "statement", "run": round, "config": config, "shape": shape,
                "calls": calls, "total_ms": ms, "ns_per_record": ms * 1e6 / records as f64,
                "rows": n, "wal_bytes": wal, "query": query})
        );
        eprintln!(
            "  {config} {:>8.0} calls {:>9.1} ms {:>7.0} ns/record {:>9.0} rows {:>11.0} WAL B  {}",
            calls,
            ms,
            ms * 1e6 / records as f64,
            n,
            wal,
            query.chars().take(90).collect::<String>()
        );
    }
}

fn main() {
    let (mut records, mut devices, mut round) = (200_000u64, None, 1u32);
    let (mut many, mut waves, mut per_packet, mut depth) = (false, 5u64, 1u64, 4usize);
    let mut analyze = true;
    let mut statements = false;
    let mut in_flight = devices::SOCKETS;
    let mut configs = "sqlite1,pg1,pg2,pg3".to_string();
    let mut bin = env!("CARGO_BIN_EXE_pure-serve").to_string();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().unwrap_or_else(|| panic!("{a} needs a value"));
        match a.as_str() {
            "--records" => records = val().parse().expect("--records N"),
            "--devices" => devices = Some(val().parse().expect("--devices K")),
            "--round" => round = val().parse().expect("--round N"),
            "--configs" => configs = val(),
            "--bin" => bin = val(),
            "--many" => many = true,
            "--waves" => waves = val().parse().expect("--waves W"),
            "--per-packet" => per_packet = val().parse().expect("--per-packet P"),
            "--depth" => depth = val().parse().expect("--depth D"),
            "--no-analyze" => analyze = false,
            "--statements" => statements = true,
            "--in-flight" => in_flight = val().parse().expect("--in-flight N"),
            _ => {}
        }
    }
    let workload = if many {
        Workload::Many {
            waves,
            per_packet,
            in_flight,
        }
    } else {
        Workload::Big { records }
    };
    let devices = devices.unwrap_or(if many { 10_000 } else { 6 });
    let _ = SHAPE.set(if many && in_flight != devices::SOCKETS {
        format!("many-p{per_packet}-f{in_flight}")
    } else if many {
        format!("many-p{per_packet}")
    } else {
        "big".to_string()
    });
    let Some(cluster) = pg_util::PgCluster::start("bench fleet") else {
        panic!("the fleet bench needs PostgreSQL: apt-get install postgresql");
    };
    if statements {
        // research/047: which statements take the database's time, per record (the cluster's own option, for this
        // bench only: the tests never load it).
        cluster.restart_with(true, "-c shared_preload_libraries=pg_stat_statements");
    }
    let mut postmaster = postmaster_pid(&cluster);
    let dir = tempfile::Builder::new()
        .prefix("pure-fleet-bench-")
        .tempdir_in("/var/tmp")
        .expect("tempdir");
    let d = dir.path();
    let node_identity = Identity::generate();
    write_new_identity(&d.join("node.key"), &node_identity).expect("node key");
    let node_public = encode_key(node_identity.public());
    let ids = par_map(devices, |_| Identity::generate());
    let mut listed = String::new();
    for (j, id) in ids.iter().enumerate() {
        if !many {
            // `send` reads its key from a file.
            write_new_identity(&d.join(format!("dev{j}.key")), id).expect("device key");
        }
        listed.push_str(&format!("dev{j} {}\n", encode_key(id.public())));
    }
    std::fs::write(d.join("senders"), listed).expect("senders");
    if !many {
        let mut f = std::io::BufWriter::new(std::fs::File::create(d.join("lines")).expect("lines"));
        for i in 1..=records {
            writeln!(f, "{i}").expect("write");
        }
    }
    if let Some(load) = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next()?.parse::<f64>().ok())
    {
        emit(round, "machine", "loadavg_1m_at_start", load, "load");
    }
    // The shape of each pgN run's turns, for the dbN after it.
    let mut shapes: HashMap<usize, Shape> = HashMap::new();
    for config in configs.split(',') {
        // `pg1-pglz` and `pg1-lz4`: one node, with the chunks' bodies compressed by PostgreSQL's default (pglz) or
        // by lz4, instead of stored as they are (the node's schema); set once the node has made the tables, before
        // any record.
        // `dbN-d1`: the database alone with one turn waiting per engine at a time, as a node keeps it while its
        // turns do not fill (it takes the next turn when the last is done, receive/mod.rs's group commit).
        let (config_depth, base) = match config.strip_suffix("-d1") {
            Some(base) if base.starts_with("db") => (1, base),
            _ => (depth, config),
        };
        let (nodes, pg, alone, body) = match base {
            "sqlite1" => (1, false, false, None),
            "pg1" | "pg2" | "pg3" => (config[2..].parse().unwrap(), true, false, None),
            "db1" | "db2" | "db3" => (base[2..].parse().unwrap(), true, true, None),
            "pg1-pglz" => (1, true, false, Some("SET STORAGE EXTENDED")),
            // research/041: one node on a PostgreSQL whose fsync is off (the cluster is started with it on, as the
            // tests start theirs; this sets it off for the run and back on after), to show what such a harness
            // default does to the comparison with SQLite.
            "pg1-fsync-off" => (1, true, false, None),
            "pg1-lz4" => (
                1,
                true,
                false,
                Some("SET STORAGE EXTENDED, ALTER COLUMN body SET COMPRESSION lz4"),
            ),
            other => panic!(
                "no configuration {other:?}: sqlite1, pg1, pg2, pg3, db1, db2, db3 (-d1), pg1-pglz, pg1-lz4, \
                 pg1-fsync-off"
            ),
        };
        let db = format!("fleet_{round}_{}", config.replace('-', "_"));
        let url = pg.then(|| {
            sql(&cluster.conninfo(), async |c| {
                c.batch_execute(&format!("CREATE DATABASE {db}"))
                    .await
                    .expect("create database")
            });
            if statements {
                let conninfo = format!(
                    "host={} user=postgres dbname={db}",
                    cluster.socket_dir().display()
                );
                sql(&conninfo, async |c| {
                    c.batch_execute("CREATE EXTENSION pg_stat_statements")
                        .await
                        .expect("create extension pg_stat_statements")
                });
            }
            format!(
                "postgresql://postgres@localhost/{db}?host={}",
                cluster.socket_dir().display()
            )
        });
        let conninfo = format!(
            "host={} user=postgres dbname={db}",
            cluster.socket_dir().display()
        );
        if pg {
            let fsync_off = config == "pg1-fsync-off";
            let shown = |c: &str| {
                sql(c, async |c| {
                    c.query_one("SHOW fsync", &[])
                        .await
                        .expect("show fsync")
                        .get::<_, String>(0)
                })
            };
            // fsync is set on the server's command line (tests/pg_util), which ALTER SYSTEM cannot override: the
            // server is started again with it off for this run, and with it on for the next.
            if (shown(&cluster.conninfo()) == "off") != fsync_off {
                cluster.restart_with_fsync(!fsync_off);
                postmaster = postmaster_pid(&cluster);
            }
            let fsync = shown(&cluster.conninfo());
            assert_eq!(fsync == "off", fsync_off, "{config}: fsync is {fsync}");
            emit(
                round,
                config,
                "postgres_fsync_on",
                if fsync == "on" { 1.0 } else { 0.0 },
                "bool",
            );
        }
        let heard = workload.timed_seqs().1;
        let total = devices as u64 * heard;
        let run_dir = d.join(config);
        eprintln!("round {round} {config}: {devices} devices into {nodes} node(s)");
        // Once the devices are warmed (--many), before the clock starts: the database's statistics brought up to
        // date, as autovacuum does within its naptime (a minute) on a live fleet. Without it every connection keeps
        // the plans it made while `sources` was nearly empty, and the lock of a turn's sources filters the whole
        // table against the turn's names (research/028, "A plan made on an empty table"). `--no-analyze` keeps
        // that.
        let wal0 = std::cell::Cell::new(pg.then(|| wal_now(&conninfo)));
        let warmed = || {
            if pg && analyze {
                sql(&conninfo, async |c| {
                    c.batch_execute("ANALYZE").await.expect("analyze")
                });
            }
            if pg {
                if statements {
                    sql(&conninfo, async |c| {
                        c.batch_execute("SELECT pg_stat_statements_reset()")
                            .await
                            .expect("reset pg_stat_statements")
                    });
                }
                wal0.set(Some(wal_now(&conninfo)));
            }
        };
        let (m, timed_rows) = if alone {
            let Some(&shape) = shapes.get(&nodes) else {
                panic!(
                    "{config} takes the shape of pg{nodes}'s turns: run pg{nodes} before it (--configs)"
                );
            };
            eprintln!("  the shape of pg{nodes}'s turns: {shape:?}");
            let m = run_db(
                url.as_deref().unwrap(),
                Alone {
                    nodes,
                    shape,
                    depth: config_depth,
                },
                devices,
                workload,
                postmaster,
                &warmed,
            );
            (m, 0)
        } else {
            std::fs::create_dir_all(&run_dir).expect("run dir");
            for f in ["node.key", "senders"] {
                std::fs::copy(d.join(f), run_dir.join(f)).expect("copy");
            }
            // Many devices: sessions that outlive the run (they were warmed so that the waves reuse them), and a
            // receive buffer for a thousand devices' packets at once.
            let extra: &[&str] = if many {
                &["--link-idle-ms", "600000", "--recv-buffer", "4194304"]
            } else {
                &[]
            };
            let mut started: Vec<Node> = (0..nodes)
                .map(|i| start_node(&bin, &run_dir, &format!("node{i}"), url.as_deref(), extra))
                .collect();
            if let Some(body) = body {
                sql(&conninfo, async |c| {
                    c.batch_execute(&format!("ALTER TABLE chunks ALTER COLUMN body {body}"))
                        .await
                        .expect("alter the chunks' body")
                });
            }
            let (mut m, timed_rows) = if many {
                let rows = || if pg { pg_rows(&conninfo) } else { 0 };
                run_devices(
                    &started,
                    &ids,
                    *node_identity.public(),
                    workload,
                    postmaster,
                    &rows,
                    &warmed,
                )
            } else {
                (
                    run_sends(&bin, d, &started, &node_public, devices, postmaster),
                    0,
                )
            };
            for n in &mut started {
                let _ = n.child.kill();
                let _ = n.child.wait();
            }
            if !many {
                // Every row was written in the timed span.
                m.records = total;
            }
            (m, timed_rows)
        };
        let wal = wal0.get().map(|w0| {
            let w1 = wal_now(&conninfo);
            (w1.0 - w0.0, w1.1 - w0.1, w1.2 - w0.2)
        });
        if pg && statements {
            print_statements(&conninfo, round, config, m.records);
        }
        if pg {
            let rows = check_pg(&conninfo, config, devices, total, heard);
            if !alone && body.is_none() {
                let timed_rows = if many { timed_rows } else { rows };
                let shape = Shape {
                    rows_per_turn: timed_rows as f64 / m.turns,
                    records_per_row: m.records as f64 / timed_rows as f64,
                    records_per_piece: m.records as f64 / m.packets,
                };
                shapes.insert(nodes, shape);
                emit(
                    round,
                    config,
                    "chunk_rows_per_turn",
                    shape.rows_per_turn,
                    "rows",
                );
                emit(
                    round,
                    config,
                    "records_per_row",
                    shape.records_per_row,
                    "records",
                );
                emit(
                    round,
                    config,
                    "records_per_packet",
                    shape.records_per_piece,
                    "records",
                );
            }
            // Checked: its room goes back for the next configuration.
            sql(&cluster.conninfo(), async |c| {
                c.batch_execute(&format!("DROP DATABASE {db}"))
                    .await
                    .expect("drop database")
            });
        } else {
            check_sqlite(
                &run_dir.join("node0/apps/main.sqlite"),
                config,
                devices,
                total,
                heard,
            );
        }
        let _ = std::fs::remove_dir_all(&run_dir);
        assert_eq!(m.records, if many { total - devices as u64 } else { total });
        let per = |cpu: Duration| cpu.as_nanos() as f64 / m.records as f64;
        emit(
            round,
            config,
            "records_per_s",
            m.records as f64 / m.secs,
            "records/s",
        );
        emit(round, config, "seconds", m.secs, "s");
        emit(round, config, "turns", m.turns, "turns");
        emit(
            round,
            config,
            "machine_busy_cores",
            m.machine.as_secs_f64() / m.secs,
            "cores",
        );
        if let Some(c) = m.node_cpu {
            emit(round, config, "node_cpu_ns_per_record", per(c), "ns");
            emit(round, config, "sessions_made", m.sessions_made, "sessions");
        }
        if let Some(c) = m.pg_cpu.filter(|_| pg) {
            emit(round, config, "postgres_cpu_ns_per_record", per(c), "ns");
        }
        if let Some(c) = m.pg_backend_cpu.filter(|_| pg) {
            emit(
                round,
                config,
                "postgres_backend_cpu_ns_per_record",
                per(c),
                "ns",
            );
        }
        if let Some((bytes, records, syncs)) = wal {
            let n = m.records as f64;
            emit(round, config, "wal_bytes_per_record", bytes / n, "bytes");
            emit(
                round,
                config,
                "wal_records_per_record",
                records / n,
                "records",
            );
            emit(round, config, "wal_syncs", syncs, "syncs");
        }
        if let Some(c) = m.send_cpu {
            emit(round, config, "send_cpu_ns_per_record", per(c), "ns");
        }
        if let Some(c) = m.engine_cpu {
            emit(round, config, "engine_cpu_ns_per_record", per(c), "ns");
        }
    }
    drop(cluster);
    let _ = std::io::stdout().flush();
}
