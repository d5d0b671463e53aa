//! research/006-one-sending-loop: records per second from one app to others through link and wire outlets, all
//! served by the one sending loop, beside the machine's limits measured in the same run.
//!
//! Prints one JSON object per line on stdout: `{"name": ..., "run": N, "value": ..., "unit": ...}`; progress and
//! notes go to stderr. `research/experiments/006-one-sending-loop/run.sh` runs it several rounds and
//! `summarize.py` turns the lines into the note's tables.
//!
//! Arguments (after `cargo bench --bench sending_loop --`): `--round N` (written into each line), `--only
//! PART[,PART]` with PART one of `limits`, `forward`, `wake`, `threads` (default: all), `--records N` (records in
//! the source app, each forwarded once per outlet; default 1,000,000), `--shapes S[,S]` with S one of `link/1`,
//! `link/4`, `wire/1`, `wire/4` (default: all), `--far-turn-records N` (the far apps' `turn_records`; default the
//! default, 16,384).
//!
//! The setup: **two nodes in one process**, each the real receive loop (`receive::ReadyNode`) on a thread of its
//! own with real SQLite stores (WAL, `synchronous=FULL`) in a temporary directory, on loopback. Node A hosts app
//! `src`, whose store is filled before A starts (so what is timed is the forwarding path, not the input), with 1
//! or 4 link or wire outlets; node B hosts apps `d1`..`d4` (one per outlet) and serves `POST /link` on its HTTP
//! thread for the wires. Not one host sending to itself as in the seed: a node refuses an outlet to its own key
//! (docs/apps.md), since it would be its own sender. The clock runs from A's start until B has stored every record
//! of every outlet; then each destination is read back: `node-a`'s heard sequence and the store's head are the
//! record count, and every record is there once, in order, with its origin (`dev`, its sequence in `src`).
//!
//! `wake`: the same runs with the host feeding its outlets a record at a time (`ReadyNode::set_feed_mode`, a
//! switch for this bench only: `FeedMode` in src/apps/host.rs), once pushing each outlet once per turn as the
//! daemon does (what cutting chunks into records costs) and once pushing after every record (what a wake per record
//! costs on top).
//!
//! `limits`: plain UDP send/recv on loopback (1,472-byte datagrams, the outlets' packet size), the store alone
//! (`AppStore::apply` of forwarded records at the far node's turn size: 16,384 records a turn, all in one app, or
//! shared by four apps committing one transaction each), reading
//! the source store back (`AppStore::read_from` at the host's catch-up size), and the sans-IO sender alone (queue
//! forwarded records, build and seal every packet, no socket).
//!
//! `threads`: a real `pure-serve --apps` process with 10 link and 10 wire outlets (to B in this process), its
//! threads counted from `/proc/PID/task` while it sends; and the same binary with no outlets.

use std::collections::BTreeMap;
use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use pure_serve::apps::config::AppsConfig;
use pure_serve::apps::host::FeedMode;
use pure_serve::common::figures::LiveStats;
use pure_serve::http::{HttpHandle, HttpServer};
use pure_serve::keys::{self, encode_key};
use pure_serve::proto::crypto::Identity;
use pure_serve::proto::node::NodeCounters;
use pure_serve::proto::sender::{FlowStart, Sender, SenderConfig};
use pure_serve::proto::wire::{self, Forwarded, RecordFormat};
use pure_serve::receive::{NodeSettings, ReadyNode};
use pure_serve::store::{self, AppStore, Piece};

/// Bytes of a record's payload (as research/001: ~30 forwarded records fill a 1,472-byte packet).
const PAYLOAD: usize = 40;
/// The device the source app's records came from.
const ORIGIN: &str = "dev";
/// The source node's name in the far node's senders file.
const NODE_A: &str = "node-a";
/// The host's turn size (docs/apps.md `turn_records` default) and its catch-up read (src/apps/host.rs).
const TURN_RECORDS: u64 = 16_384;
const CATCH_UP_RECORDS: u64 = 16_384;
/// The CLI's default `--recv-buffer`.
const RECV_BUFFER: usize = 4 << 20;
/// A forwarding run that has not finished by then is reported as such (exactly_once = 0), not waited for.
const RUN_LIMIT: Duration = Duration::from_secs(90);

struct Out {
    run: u32,
}

impl Out {
    fn emit(&self, name: &str, value: f64, unit: &str) {
        println!(
            "{}",
            serde_json::json!({"name": name, "run": self.run, "value": value, "unit": unit})
        );
        eprintln!("  {name} = {value:.3} {unit}");
    }
}

fn payload(seq: u64) -> Vec<u8> {
    let mut p = format!("record {seq}").into_bytes();
    p.resize(PAYLOAD, b'.');
    p
}

// ---------------------------------------------------------------------------------------------------------------
// Threads of this process and of a child: count, names, CPU time

/// One thread of a process as /proc shows it.
struct ThreadSample {
    tid: u64,
    name: String,
    cpu: Duration,
    /// Times it gave up the CPU to wait (for each, a wake later).
    waits: u64,
}

/// Each thread of process `pid` ("self" for this one).
fn threads_of(pid: &str) -> Vec<ThreadSample> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    let mut v = Vec::new();
    for e in dir.flatten() {
        let Some(tid) = e.file_name().to_str().and_then(|s| s.parse::<u64>().ok()) else {
            continue;
        };
        let base = e.path();
        let name = std::fs::read_to_string(base.join("comm"))
            .unwrap_or_default()
            .trim()
            .to_string();
        // schedstat: nanoseconds on the CPU, then waiting, then timeslices.
        let cpu = std::fs::read_to_string(base.join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
            .map(Duration::from_nanos)
            .unwrap_or_default();
        let waits = std::fs::read_to_string(base.join("status"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
                    .and_then(|v| v.trim().parse().ok())
            })
            .unwrap_or(0);
        v.push(ThreadSample {
            tid,
            name,
            cpu,
            waits,
        });
    }
    v
}

fn thread_count(pid: &str) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count())
}

/// CPU time and waits per thread name of this process between two snapshots (threads born in between count from
/// zero).
fn usage_by_name(
    before: &[ThreadSample],
    after: &[ThreadSample],
) -> BTreeMap<String, (Duration, u64)> {
    let mut by = BTreeMap::new();
    for a in after {
        let (cpu, waits) = before
            .iter()
            .find(|b| b.tid == a.tid)
            .map_or((Duration::ZERO, 0), |b| (b.cpu, b.waits));
        let e = by.entry(a.name.clone()).or_insert((Duration::ZERO, 0));
        e.0 += a.cpu.saturating_sub(cpu);
        e.1 += a.waits.saturating_sub(waits);
    }
    by
}

/// The kernel's count of UDP datagrams dropped because a socket's receive buffer was full (whole host).
fn udp_rcvbuf_errors() -> u64 {
    let text = std::fs::read_to_string("/proc/net/snmp").unwrap_or_default();
    let mut lines = text.lines().filter(|l| l.starts_with("Udp:"));
    let (Some(names), Some(values)) = (lines.next(), lines.next()) else {
        return 0;
    };
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(n, _)| *n == "RcvbufErrors")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0)
}

// ---------------------------------------------------------------------------------------------------------------
// The source store, filled before the node starts

/// Writes `n` records of the device `dev` into a fresh store at `path`, a turn of [`TURN_RECORDS`] per commit cut
/// into frames of 28 (as a device's full packets would arrive), so it holds chunks of 16,384 records.
fn fill_source(path: &Path, n: u64) {
    let mut s = AppStore::open(path).expect("source store");
    let mut seq = 1;
    let mut body = Vec::new();
    while seq <= n {
        let turn = TURN_RECORDS.min(n - seq + 1);
        body.clear();
        let mut frames = Vec::new();
        let mut k = 0;
        while k < turn {
            let count = 28.min(turn - k);
            let start = body.len();
            for j in 0..count {
                wire::put_record(&mut body, &payload(seq + k + j));
            }
            frames.push((seq + k, count, start..body.len()));
            k += count;
        }
        let mut pieces: Vec<Piece<'_>> = frames
            .iter()
            .map(|(first, count, r)| Piece {
                source: ORIGIN,
                first_seq: *first,
                count: *count,
                format: RecordFormat::Plain,
                records: &body[r.clone()],
            })
            .collect();
        let a = s.apply(&mut pieces, &[], false).expect("fill");
        assert_eq!(a.stored, turn);
        seq += turn;
    }
    assert_eq!(s.head(), n + 1);
}

// ---------------------------------------------------------------------------------------------------------------
// The two nodes

struct RunningNode {
    addr: SocketAddr,
    public: [u8; 32],
    stats: Arc<LiveStats>,
    http: Option<HttpHandle>,
    stop: Arc<AtomicBool>,
    thread: JoinHandle<NodeCounters>,
}

impl RunningNode {
    fn stop(self) -> NodeCounters {
        self.stop.store(true, Ordering::Relaxed);
        let c = self.thread.join().expect("node thread");
        if let Some(h) = self.http {
            h.stop();
        }
        c
    }
}

fn apps(toml: &str) -> AppsConfig {
    AppsConfig::parse(Path::new("apps.toml"), toml).unwrap_or_else(|e| panic!("{e}"))
}

/// Prepares a node with its state in `dir/state` and its key in `dir/node.key`; `senders` as `NAME KEY` lines.
fn prepare(dir: &Path, senders: &str, apps_toml: &str) -> ReadyNode {
    std::fs::create_dir_all(dir).expect("dir");
    let senders_file = dir.join("senders");
    std::fs::write(&senders_file, senders).expect("senders");
    ReadyNode::prepare(NodeSettings {
        state_dir: dir.join("state"),
        key_file: dir.join("node.key"),
        senders_file: Some(senders_file),
        link_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        idle: Duration::from_secs(30),
        apps: apps(apps_toml),
        apps_file: None,
        recv_buffer: RECV_BUFFER,
        dns: Default::default(),
        accept_lost_state: false,
        store: pure_serve::store::engine::StoreChoice::Sqlite,
        store_password: None,
        x25519_budget: pure_serve::proto::admission::DEFAULT_X25519_BUDGET,
        sessions_per_sender: pure_serve::proto::node::DEFAULT_SESSIONS_PER_SENDER,
        max_sessions: pure_serve::proto::node::DEFAULT_MAX_SESSIONS,
    })
    .expect("node")
}

/// Runs a prepared node on a thread named `name`, with an HTTP server for `POST /link` if `http`.
fn run(mut ready: ReadyNode, name: &str, http: bool) -> (RunningNode, Option<SocketAddr>) {
    let addr = ready.local_addr();
    let public = ready.identity_public();
    let stats = ready.stats.clone();
    let (http, http_addr) = if http {
        let inbox = ready.link_inbox().expect("link inbox");
        let server = HttpServer::bind(SocketAddr::from(([127, 0, 0, 1], 0))).expect("http");
        let a = server.local_addr();
        (
            Some(server.spawn(stats.clone(), Some(inbox)).expect("spawn")),
            a,
        )
    } else {
        (None, None)
    };
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let thread = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || ready.run(&flag).expect("node run"))
        .expect("thread");
    (
        RunningNode {
            addr,
            public,
            stats,
            http,
            stop,
            thread,
        },
        http_addr,
    )
}

/// `turn_records` of the far node's apps (`--far-turn-records`; 0: the default, 16,384).
static FAR_TURN_RECORDS: AtomicU64 = AtomicU64::new(0);

/// Node B: apps `d1`..`dN`, each accepting only node A.
fn start_far(dir: &Path, a_public: &[u8; 32], n: usize) -> (RunningNode, SocketAddr) {
    let mut toml = String::new();
    let share = FAR_TURN_RECORDS.load(Ordering::Relaxed);
    for i in 1..=n {
        toml.push_str(&format!(
            "[apps.d{i}]\naccept = [\"{NODE_A}\"]\nforwarders = [\"{NODE_A}\"]\n"
        ));
        if share > 0 {
            toml.push_str(&format!("turn_records = {share}\n"));
        }
    }
    let ready = prepare(dir, &format!("{NODE_A} {}\n", encode_key(a_public)), &toml);
    let (node, http) = run(ready, "b-recv", true);
    (node, http.expect("http address"))
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Link,
    Wire,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Link => "link",
            Kind::Wire => "wire",
        }
    }
}

/// The apps file of node A: app `src` with outlets `o1`..`oN` of the kinds given, outlet `i` to app `d{i}` of B.
fn source_apps(kinds: &[Kind], far: &RunningNode, far_http: SocketAddr) -> String {
    let mut toml = String::from("[apps.src]\n");
    for (i, kind) in kinds.iter().enumerate() {
        let i = i + 1;
        toml.push_str(&format!("[apps.src.outlets.o{i}]\n"));
        match kind {
            Kind::Link => toml.push_str(&format!("kind = \"link\"\nto = \"{}\"\n", far.addr)),
            Kind::Wire => toml.push_str(&format!(
                "kind = \"wire\"\nurl = \"http://{far_http}/link\"\n"
            )),
        }
        toml.push_str(&format!(
            "node_key = \"{}\"\napp = \"d{i}\"\n",
            encode_key(&far.public)
        ));
    }
    toml
}

/// Checks app `app` of the far node holds records 1..=n of `node-a` exactly once, in order, each with its origin
/// (`dev`, the same sequence) and payload. Returns (records, exactly once).
fn check_far(state: &Path, app: &str, n: u64) -> (u64, bool) {
    let s = AppStore::open_read(&store::app_store_path(state, app)).expect("far store");
    let heard = s.heard_of(NODE_A).expect("heard");
    let head = s.read_head().expect("head");
    let mut count = 0u64;
    let mut ok = true;
    s.for_each_record_view(None, 0, |r| {
        count += 1;
        ok &= r.source == NODE_A
            && r.seq == count
            && r.origin == Some((ORIGIN, count))
            && r.payload.len() == PAYLOAD;
        true
    })
    .expect("read far store");
    let once = ok && count == n && heard == n && head == n + 1;
    if !once {
        eprintln!(
            "  !! {app}: {count} records (want {n}), heard {heard}, head {head}, in order with origins: {ok}"
        );
    }
    (count, once)
}

/// One forwarding run: `outlets` outlets of `kind` from a pre-filled `src` of `n` records; every outlet carries all
/// `n`. Returns records/s.
fn forward(out: &Out, source: &Path, n: u64, kind: Kind, outlets: usize, mode: FeedMode) -> f64 {
    let label = format!(
        "{}/{outlets}{}",
        kind.name(),
        match mode {
            FeedMode::Chunks => "",
            FeedMode::RecordsPushPerTurn => "/records_push_per_turn",
            FeedMode::RecordsPushPerRecord => "/wake_per_record",
        }
    );
    eprintln!("forward {label}: {n} records × {outlets}");
    let dir = tempfile::tempdir().expect("tempdir");
    let (dir_a, dir_b) = (dir.path().join("a"), dir.path().join("b"));
    std::fs::create_dir_all(dir_a.join("state/apps")).expect("dir");
    let key_a = Identity::generate();
    keys::write_new_identity(&dir_a.join("node.key"), &key_a).expect("key");
    std::fs::copy(source, store::app_store_path(&dir_a.join("state"), "src")).expect("copy source");
    let (far, far_http) = start_far(&dir_b, key_a.public(), outlets);
    let toml = source_apps(&vec![kind; outlets], &far, far_http);
    let total = n * outlets as u64;
    let rcvbuf0 = udp_rcvbuf_errors();
    let b0 = far
        .stats
        .snapshot
        .lock()
        .expect("snapshot")
        .counters
        .clone();
    let cpu0 = threads_of("self");

    let t = Instant::now();
    let mut ready = prepare(&dir_a, "", &toml);
    ready.set_feed_mode(mode);
    let (near, _) = run(ready, "a-recv", false);
    let mut first = None;
    let mut max_threads = 0;
    let mut last_stored = 0;
    let mut last_move = Instant::now();
    let mut longest_quiet = Duration::ZERO;
    let mut finished = true;
    loop {
        let stored = far.stats.stored_records.load(Ordering::Relaxed) - b0.stored_records;
        if stored > 0 && first.is_none() {
            first = Some(t.elapsed());
        }
        if stored != last_stored {
            last_stored = stored;
            longest_quiet = longest_quiet.max(last_move.elapsed());
            last_move = Instant::now();
        }
        if stored >= total {
            break;
        }
        if t.elapsed() > RUN_LIMIT {
            eprintln!("  !! {label}: only {stored} of {total} stored after {RUN_LIMIT:?}");
            finished = false;
            break;
        }
        max_threads = max_threads.max(thread_count("self"));
        std::thread::sleep(Duration::from_millis(1));
    }
    let secs = t.elapsed().as_secs_f64();
    let usage = usage_by_name(&cpu0, &threads_of("self"));
    let names: Vec<String> = threads_of("self").into_iter().map(|t| t.name).collect();
    let requests = far
        .http
        .as_ref()
        .map_or(0, |h| h.counters().link_requests.load(Ordering::Relaxed));
    let rcvbuf = udp_rcvbuf_errors().saturating_sub(rcvbuf0);
    near.stop();
    let b = far.stop();
    let datagrams = b.datagrams - b0.datagrams;
    let turns = b.turns_committed - b0.turns_committed;
    let mut all_once = finished;
    for i in 1..=outlets {
        let (_, once) = check_far(&dir_b.join("state"), &format!("d{i}"), n);
        all_once &= once;
    }
    let rate = total as f64 / secs;
    let name = format!("forward/{label}");
    out.emit(&format!("{name}/records_per_s"), rate, "records/s");
    out.emit(&format!("{name}/seconds"), secs, "s");
    out.emit(
        &format!("{name}/first_stored_ms"),
        first.unwrap_or_default().as_secs_f64() * 1e3,
        "ms",
    );
    out.emit(
        &format!("{name}/records_per_packet"),
        total as f64 / datagrams.max(1) as f64,
        "records",
    );
    out.emit(
        &format!("{name}/packets_per_s"),
        datagrams as f64 / secs,
        "packets/s",
    );
    out.emit(
        &format!("{name}/far_records_per_turn"),
        total as f64 / turns.max(1) as f64,
        "records",
    );
    out.emit(
        &format!("{name}/far_duplicates"),
        (b.duplicate_records - b0.duplicate_records) as f64,
        "count",
    );
    // Records the far node did not store at once: past a hole (a lost or dropped packet), or beyond the app's share
    // of a turn (`turn_records`); either is sent again after a retransmission timeout.
    out.emit(
        &format!("{name}/far_gap_records"),
        (b.gap_records - b0.gap_records) as f64,
        "count",
    );
    out.emit(
        &format!("{name}/far_busy_records"),
        (b.busy_records - b0.busy_records) as f64,
        "count",
    );
    if kind == Kind::Wire {
        out.emit(
            &format!("{name}/records_per_request"),
            total as f64 / requests.max(1) as f64,
            "records",
        );
    }
    out.emit(
        &format!("{name}/kernel_rcvbuf_errors"),
        rcvbuf as f64,
        "count",
    );
    out.emit(
        &format!("{name}/longest_no_progress_ms"),
        longest_quiet.as_secs_f64() * 1e3,
        "ms",
    );
    out.emit(&format!("{name}/threads"), max_threads as f64, "count");
    for thread in ["a-recv", "pure-send", "b-recv", "pure-http"] {
        let (c, waits) = usage.get(thread).copied().unwrap_or_default();
        out.emit(
            &format!("{name}/cpu_ns_per_record/{thread}"),
            c.as_nanos() as f64 / total as f64,
            "ns",
        );
        out.emit(&format!("{name}/waits/{thread}"), waits as f64, "count");
    }
    out.emit(
        &format!("{name}/exactly_once"),
        if all_once { 1.0 } else { 0.0 },
        "bool",
    );
    eprintln!("  threads: {}", names.join(", "));
    rate
}

// ---------------------------------------------------------------------------------------------------------------
// The machine's limits

/// Plain send/recv of `size`-byte datagrams between two loopback sockets, one thread each, for `budget`.
fn udp_plain(out: &Out, size: usize, budget: Duration) {
    let rx = UdpSocket::bind("127.0.0.1:0").expect("bind");
    let tx = UdpSocket::bind("127.0.0.1:0").expect("bind");
    tx.connect(rx.local_addr().expect("addr")).expect("connect");
    rx.set_read_timeout(Some(Duration::from_millis(50)))
        .expect("timeout");
    let stop = Arc::new(AtomicBool::new(false));
    let received = Arc::new(AtomicU64::new(0));
    let (stop2, received2) = (stop.clone(), received.clone());
    let reader = std::thread::spawn(move || {
        let mut buf = [0u8; 2048];
        while !stop2.load(Ordering::Relaxed) {
            if rx.recv(&mut buf).is_ok() {
                received2.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    let packet = vec![0x11u8; size];
    let t = Instant::now();
    while t.elapsed() < budget {
        for _ in 0..64 {
            let _ = tx.send(&packet);
        }
    }
    let secs = t.elapsed().as_secs_f64();
    let got = received.load(Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    reader.join().expect("reader");
    out.emit(
        &format!("limit/udp_{size}/recv_packets_per_s"),
        got as f64 / secs,
        "packets/s",
    );
}

/// What one durable commit costs here at least: a 4 KiB write and an fdatasync, 100 times; p50 and p90. This VM's
/// disk switches between ~0.1 ms and several ms (research/001), which moves every figure that commits.
fn fsync_floor(out: &Out) {
    use std::io::{Seek, SeekFrom, Write};
    let dir = tempfile::tempdir().expect("tempdir");
    let mut f = std::fs::File::create(dir.path().join("sync")).expect("file");
    let block = [0x5au8; 4096];
    let mut times = Vec::with_capacity(100);
    for i in 0..100u64 {
        f.seek(SeekFrom::Start((i % 16) * 4096)).expect("seek");
        f.write_all(&block).expect("write");
        let t = Instant::now();
        f.sync_data().expect("fdatasync");
        times.push(t.elapsed());
    }
    times.sort();
    out.emit("limit/fsync_4k/p50_ms", times[50].as_secs_f64() * 1e3, "ms");
    out.emit("limit/fsync_4k/p90_ms", times[90].as_secs_f64() * 1e3, "ms");
}

/// Frames of a turn: (first sequence, records, their bytes in the turn's body).
type Frames = Vec<(u64, u64, std::ops::Range<usize>)>;

/// Forwarded records of `node-a` as B's turns carry them: frames of `per_frame` records.
fn forwarded_turn(first: u64, count: u64, per_frame: u64) -> (Vec<u8>, Frames) {
    let mut body = Vec::new();
    let mut frames = Vec::new();
    let mut k = 0;
    while k < count {
        let c = per_frame.min(count - k);
        let start = body.len();
        for j in 0..c {
            let seq = first + k + j;
            Forwarded::put(&mut body, ORIGIN.as_bytes(), seq, &payload(seq));
        }
        frames.push((first + k, c, start..body.len()));
        k += c;
    }
    (body, frames)
}

/// The store alone: `AppStore::apply` of forwarded records in turns of [`TURN_RECORDS`] shared by `apps` stores,
/// one transaction each (as the far node commits a turn: the node core's turn holds at most 16,384 records of all
/// apps, and each app commits its share), for about `budget`. Records/s over the time in apply.
fn store_alone(out: &Out, apps: usize, budget: Duration) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut stores: Vec<AppStore> = (0..apps)
        .map(|i| AppStore::open(&dir.path().join(format!("d{i}.sqlite"))).expect("store"))
        .collect();
    let per_app = TURN_RECORDS / apps as u64;
    let mut seq = 1;
    let mut busy = Duration::ZERO;
    let mut stored = 0;
    let t = Instant::now();
    let mut turns = 0;
    while turns < 3 || t.elapsed() < budget {
        let (body, frames) = forwarded_turn(seq, per_app, 30);
        for s in &mut stores {
            let mut pieces: Vec<Piece<'_>> = frames
                .iter()
                .map(|(f, c, r)| Piece {
                    source: NODE_A,
                    first_seq: *f,
                    count: *c,
                    format: RecordFormat::Forwarded,
                    records: &body[r.clone()],
                })
                .collect();
            let a = Instant::now();
            stored += s.apply(&mut pieces, &[], false).expect("apply").stored;
            busy += a.elapsed();
        }
        seq += per_app;
        turns += 1;
    }
    out.emit(
        &format!("limit/store_apply_turn{TURN_RECORDS}/apps_{apps}/records_per_s"),
        stored as f64 / busy.as_secs_f64(),
        "records/s",
    )
}

/// Reading the source store back as the host does when an outlet catches up: `read_from` of
/// [`CATCH_UP_RECORDS`], from the first position to the head.
fn read_alone(out: &Out, source: &Path, n: u64) {
    let s = AppStore::open_read(source).expect("source");
    let t = Instant::now();
    let mut next = 1;
    while next <= n {
        let chunks = s.read_from(next, CATCH_UP_RECORDS, 4 << 20).expect("read");
        next = chunks.last().map_or(n + 1, |c| c.pos + c.count);
    }
    out.emit(
        "limit/store_read_from/records_per_s",
        n as f64 / t.elapsed().as_secs_f64(),
        "records/s",
    );
}

/// The sans-IO sender alone, as an outlet drives it: each record queued as a forwarded record (its origin
/// prefixed, `Sender::queue_forwarded`), then every packet built and sealed; no socket, no acks (the window is
/// lifted).
fn sender_alone(out: &Out, source: &Path, n: u64) {
    let s = AppStore::open_read(source).expect("source");
    let chunks = s.read_from(1, n, usize::MAX).expect("read");
    let far = Identity::generate();
    let mut config = SenderConfig::new(Identity::generate(), *far.public());
    config.max_datagram = wire::MAX_DATAGRAM;
    config.allow_oversize = true;
    config.window = u64::MAX / 2;
    let mut sender = Sender::new(config).expect("sender");
    sender
        .open_flow_as("d1", FlowStart::At(1), RecordFormat::Forwarded)
        .expect("flow");
    let t = Instant::now();
    for c in &chunks {
        for (k, record) in (0u64..).zip(c.records()) {
            sender
                .queue_forwarded("d1", c.source.as_bytes(), c.first_seq + k, record)
                .expect("queue");
        }
    }
    let queued = t.elapsed();
    let mut packet = Vec::with_capacity(wire::MAX_ACCEPTED_DATAGRAM);
    let now = Instant::now();
    let mut packets = 0u64;
    while sender.poll_transmit(now, &mut packet) {
        packets += 1;
    }
    let secs = t.elapsed().as_secs_f64();
    out.emit(
        "limit/sender_alone/records_per_s",
        n as f64 / secs,
        "records/s",
    );
    out.emit(
        "limit/sender_alone/queue_ns_per_record",
        queued.as_nanos() as f64 / n as f64,
        "ns",
    );
    out.emit(
        "limit/sender_alone/records_per_packet",
        n as f64 / packets.max(1) as f64,
        "records",
    );
}

// ---------------------------------------------------------------------------------------------------------------
// Threads of a real host

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_pure-serve")
}

/// Starts `pure-serve` with its state in `dir/state` (the source store already there), key `dir/node.key`, and
/// the apps file `toml`; waits for "ready".
fn spawn_host(dir: &Path, toml: &str) -> Child {
    use std::io::BufRead;
    let apps_file = dir.join("apps.toml");
    std::fs::write(&apps_file, toml).expect("apps file");
    let mut child = Command::new(bin())
        .arg("--key")
        .arg(dir.join("node.key"))
        .arg("--state")
        .arg(dir.join("state"))
        .arg("--apps")
        .arg(&apps_file)
        .args([
            "--bind",
            "127.0.0.1",
            "--link-port",
            "0",
            "--http-port",
            "0",
        ])
        .env("RUST_LOG", "warn")
        .env_remove("NOTIFY_SOCKET")
        .env_remove("WATCHDOG_USEC")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("pure-serve");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = std::io::BufReader::new(stdout).lines();
    for line in lines.by_ref() {
        if line.expect("stdout").trim() == "ready" {
            break;
        }
    }
    // Keep draining so the child never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    child
}

/// Threads of a host process with 10 link and 10 wire outlets while it sends `n` records through each, and of the
/// same binary with no outlets.
fn part_threads(out: &Out, n: u64) {
    eprintln!("threads: a host with 10 links and 10 wires, {n} records each");
    let dir = tempfile::tempdir().expect("tempdir");
    let (dir_a, dir_b) = (dir.path().join("a"), dir.path().join("b"));
    std::fs::create_dir_all(dir_a.join("state/apps")).expect("dir");
    let key_a = Identity::generate();
    keys::write_new_identity(&dir_a.join("node.key"), &key_a).expect("key");
    fill_source(&store::app_store_path(&dir_a.join("state"), "src"), n);
    let (far, far_http) = start_far(&dir_b, key_a.public(), 20);
    let kinds: Vec<Kind> = (0..20)
        .map(|i| if i < 10 { Kind::Link } else { Kind::Wire })
        .collect();
    let total = n * 20;
    let b0 = far.stats.stored_records.load(Ordering::Relaxed);
    let t = Instant::now();
    let mut child = spawn_host(&dir_a, &source_apps(&kinds, &far, far_http));
    let pid = child.id().to_string();
    let mut max = 0;
    let mut names = Vec::new();
    while far.stats.stored_records.load(Ordering::Relaxed) - b0 < total && t.elapsed() < RUN_LIMIT {
        let now = threads_of(&pid);
        max = max.max(now.len());
        if !now.is_empty() {
            names = now.into_iter().map(|t| t.name).collect();
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let secs = t.elapsed().as_secs_f64();
    let after = thread_count(&pid);
    let _ = child.kill();
    let _ = child.wait();
    far.stop();
    let mut all_once = true;
    for i in 1..=20 {
        all_once &= check_far(&dir_b.join("state"), &format!("d{i}"), n).1;
    }
    out.emit(
        "threads/host_20_outlets/max_while_sending",
        max as f64,
        "count",
    );
    out.emit("threads/host_20_outlets/after", after as f64, "count");
    out.emit(
        "threads/host_20_outlets/records_per_s",
        total as f64 / secs,
        "records/s",
    );
    out.emit(
        "threads/host_20_outlets/exactly_once",
        if all_once { 1.0 } else { 0.0 },
        "bool",
    );
    eprintln!(
        "  threads of the host (last look while sending): {}",
        names.join(", ")
    );

    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join("state")).expect("dir");
    keys::write_new_identity(&dir.path().join("node.key"), &Identity::generate()).expect("key");
    let mut child = spawn_host(dir.path(), "[apps.src]\n");
    std::thread::sleep(Duration::from_millis(300));
    let pid = child.id().to_string();
    let names: Vec<String> = threads_of(&pid).into_iter().map(|t| t.name).collect();
    let _ = child.kill();
    let _ = child.wait();
    out.emit("threads/host_no_outlets", names.len() as f64, "count");
    eprintln!("  threads of a host without outlets: {}", names.join(", "));
}

// ---------------------------------------------------------------------------------------------------------------

fn want(parts: &[String], part: &str) -> bool {
    parts.is_empty() || parts.iter().any(|p| p == part)
}

fn main() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .try_init();
    let mut round = 1;
    let mut parts: Vec<String> = Vec::new();
    let mut n: u64 = 1_000_000;
    let mut shapes_wanted: Vec<String> = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--round" => round = args.next().and_then(|v| v.parse().ok()).unwrap_or(1),
            "--only" => {
                parts = args
                    .next()
                    .unwrap_or_default()
                    .split(',')
                    .map(str::to_string)
                    .collect()
            }
            "--records" => n = args.next().and_then(|v| v.parse().ok()).unwrap_or(n),
            "--far-turn-records" => FAR_TURN_RECORDS.store(
                args.next().and_then(|v| v.parse().ok()).unwrap_or(0),
                Ordering::Relaxed,
            ),
            "--shapes" => {
                shapes_wanted = args
                    .next()
                    .unwrap_or_default()
                    .split(',')
                    .map(str::to_string)
                    .collect()
            }
            // `cargo bench` passes --bench; anything else is ignored too.
            _ => {}
        }
    }
    let out = Out { run: round };
    // How busy the shared machine was (other engineers' builds): the 1-minute load average as the round starts.
    if let Some(load) = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next()?.parse::<f64>().ok())
    {
        out.emit("machine/loadavg_1m_at_start", load, "load");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let source: PathBuf = dir.path().join("src.sqlite");
    let t = Instant::now();
    fill_source(&source, n);
    eprintln!("source store: {n} records in {:?}", t.elapsed());
    if want(&parts, "limits") {
        eprintln!("limits");
        fsync_floor(&out);
        udp_plain(&out, wire::MAX_DATAGRAM, Duration::from_millis(500));
        store_alone(&out, 1, Duration::from_millis(700));
        store_alone(&out, 4, Duration::from_millis(700));
        read_alone(&out, &source, n);
        sender_alone(&out, &source, n);
    }
    // Every forwarding run of the round, in an order turned by the round number, so no configuration always runs
    // first (on a cold cache) or last.
    let mut runs = Vec::new();
    let shapes = [
        (Kind::Link, 1),
        (Kind::Link, 4),
        (Kind::Wire, 1),
        (Kind::Wire, 4),
    ];
    if want(&parts, "forward") {
        runs.extend(shapes.map(|(k, o)| (k, o, FeedMode::Chunks)));
    }
    if want(&parts, "wake") {
        runs.extend(shapes.map(|(k, o)| (k, o, FeedMode::RecordsPushPerTurn)));
        runs.extend(shapes.map(|(k, o)| (k, o, FeedMode::RecordsPushPerRecord)));
    }
    if !shapes_wanted.is_empty() {
        runs.retain(|(k, o, _)| shapes_wanted.contains(&format!("{}/{o}", k.name())));
    }
    if !runs.is_empty() {
        let turn = round as usize % runs.len();
        runs.rotate_left(turn);
    }
    for (kind, outlets, mode) in runs {
        forward(&out, &source, n, kind, outlets, mode);
    }
    if want(&parts, "threads") {
        part_threads(&out, (n / 20).max(1));
    }
}
