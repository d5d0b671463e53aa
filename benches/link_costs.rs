//! research/001-link-costs: what a link costs the node, each figure next to the limit it is made of, in one run.
//!
//! Prints one JSON object per line on stdout: `{"name": ..., "run": N, "value": ..., "unit": ...}`; progress and
//! notes go to stderr. `research/experiments/001-link-costs/run.sh` runs it 5 rounds and
//! `summarize.py` turns the lines into the note's table.
//!
//! Arguments (after `cargo bench --bench link_costs --`): `--round N` (the run index written into each line),
//! `--only PART[,PART]` with PART one of `x25519`, `aes`, `sqlite`, `udp`, `link`, `wake` (default: all).
//!
//! 1. X25519 alone vs the sans-IO node accepting first packets of new runs (NoMemo; then a memo of the secrets,
//!    i.e. known senders after a restart).
//! 2. AES-128-GCM open of 1200 B (key setup included) vs `Node::handle_datagram` per full packet on a session,
//!    without and with the store apply.
//! 3. SQLite row per record at 1/256/4096/16384 records per commit vs the node's chunk store at 28/1024/16384
//!    records per commit, vs the node over real UDP loopback (one link, four links); UDP loopback's plain
//!    packets/s for 1200 B datagrams.
//! 4. An idle link's first packet of a new run → stored ack, `--link-idle-ms 200`, ~200 times.

use std::collections::HashMap;
use std::hint::black_box;
use std::net::{SocketAddr, UdpSocket};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use aes_gcm::aead::AeadInOut;
use aes_gcm::{Aes128Gcm, KeyInit, Nonce, Tag};
use pure_serve::proto::allow_list::AllowList;
use pure_serve::proto::crypto::{self, Identity};
use pure_serve::proto::node::{DropReason, NoMemo, Node, NodeConfig};
use pure_serve::proto::sender::{FlowStart, Sender, SenderConfig, SenderEvent};
use pure_serve::proto::turn::{Committed, FlowHeard, Turn};
use pure_serve::receive::LocalNode;
use pure_serve::sender::UdpLink;
use pure_serve::store::memo::Memo;
use pure_serve::store::{self, Stores};
use rusqlite::{Connection, params};
use x25519_dalek::{PublicKey, StaticSecret};

#[path = "util/turns.rs"]
mod turns;

/// Bytes of a record's payload in every throughput test (BRIEF.md: ~20 records per 1200 B packet).
const PAYLOAD: usize = 40;
const APP: &str = "main";

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

/// CPU time of the calling thread.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec out-pointer; CLOCK_THREAD_CPUTIME_ID is always available on Linux.
    unsafe {
        libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts);
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn payload(tag: u64) -> Vec<u8> {
    let mut p = format!("record {tag}").into_bytes();
    p.resize(PAYLOAD, b'.');
    p
}

fn from_addr(i: usize) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 1024 + (i % 60_000) as u16))
}

fn allow_list(ids: &[Identity]) -> AllowList {
    AllowList::from_unique(
        ids.iter()
            .enumerate()
            .map(|(i, id)| (format!("dev-{i}"), *id.public()))
            .collect(),
    )
}

fn new_node(identity: &Identity, senders: Arc<AllowList>, idle: Duration) -> Node {
    Node::new(
        NodeConfig {
            identity: identity.clone(),
            epoch: u64::from_be_bytes(crypto::random_array()),
            idle,
            apps: vec![APP.to_string()],
        },
        senders,
    )
}

/// The first packet of a new run of each sender: one record at sequence `seq`.
fn first_packets(ids: &[Identity], node_public: &[u8; 32], seq: u64) -> Vec<Vec<u8>> {
    let now = Instant::now();
    ids.iter()
        .map(|id| {
            let mut s = Sender::new(SenderConfig::new(id.clone(), *node_public)).expect("sender");
            s.open_flow(APP, FlowStart::At(seq)).expect("flow");
            s.queue(APP, payload(seq)).expect("queue");
            let mut buf = Vec::new();
            assert!(s.poll_transmit(now, &mut buf));
            buf
        })
        .collect()
}

/// What the store would report for a turn if every frame were stored: for the store-less measurements.
fn pretend_committed(turn: &Turn) -> Committed {
    let mut heard: HashMap<(u32, u16), u64> = HashMap::new();
    for item in &turn.items {
        if item.count > 0 {
            let e = heard.entry((item.sender, item.app)).or_insert(0);
            *e = (*e).max(item.first_seq + item.count - 1);
        }
    }
    Committed {
        turn: turn.id,
        heard: heard
            .into_iter()
            .map(|((sender, app), heard)| FlowHeard { sender, app, heard })
            .collect(),
        stored_records: turn.record_count,
        ..Committed::default()
    }
}

/// One round of the node's loop after its datagrams: turn → store (or pretend) → committed → acks → memo.
fn finish_turn(node: &mut Node, stores: Option<&mut Stores>, memo: Option<&mut Memo>) -> u64 {
    if let Some(turn) = node.take_turn() {
        let committed = match stores {
            Some(stores) => {
                let senders = node.senders().clone();
                stores.apply_turn(&turn, &senders).expect("apply turn")
            }
            None => pretend_committed(&turn),
        };
        node.handle_committed(&committed);
    }
    node.flush_acks();
    let mut acks = 0;
    while let Some(t) = node.poll_transmit() {
        black_box(&t);
        acks += 1;
    }
    let secrets = node.take_new_secrets();
    if let Some(memo) = memo {
        memo.put_all(Instant::now(), &secrets).expect("memo");
    }
    acks
}

struct Drive {
    wall: Duration,
    cpu: Duration,
    acks: u64,
    /// X25519 alone, as many operations as packets, run after each group and timed apart (paired: the same
    /// moments of this shared machine are in both figures).
    x_wall: Duration,
    x_cpu: Duration,
}

/// Feeds `packets` to the node `per_turn` at a time, finishing a turn after each group (the receive loop's shape).
/// After each group, as many plain X25519 operations as the group had packets are timed apart.
fn drive(
    node: &mut Node,
    packets: &[Vec<u8>],
    per_turn: usize,
    use_memo: bool,
    mut stores: Option<&mut Stores>,
    mut memo: Option<&mut Memo>,
) -> Drive {
    let secret = StaticSecret::from(crypto::random_array::<32>());
    let peers: Vec<PublicKey> = (0..64)
        .map(|_| PublicKey::from(&StaticSecret::from(crypto::random_array::<32>())))
        .collect();
    let mut d = Drive {
        wall: Duration::ZERO,
        cpu: Duration::ZERO,
        acks: 0,
        x_wall: Duration::ZERO,
        x_cpu: Duration::ZERO,
    };
    let mut i = 0;
    for group in packets.chunks(per_turn) {
        let (w0, c0) = (Instant::now(), thread_cpu());
        let now = Instant::now();
        for p in group {
            match (&mut memo, use_memo) {
                (Some(m), true) => node.handle_datagram(now, from_addr(i), p, &mut **m),
                _ => node.handle_datagram(now, from_addr(i), p, &mut NoMemo),
            }
            i += 1;
        }
        d.acks += finish_turn(node, stores.as_deref_mut(), memo.as_deref_mut());
        d.wall += w0.elapsed();
        d.cpu += thread_cpu() - c0;
        let (w0, c0) = (Instant::now(), thread_cpu());
        for k in 0..group.len() {
            black_box(secret.diffie_hellman(black_box(&peers[k % peers.len()])));
        }
        d.x_wall += w0.elapsed();
        d.x_cpu += thread_cpu() - c0;
    }
    d
}

/// Emits a node-vs-X25519 pair from one [`drive`]: senders/s, CPU µs per sender, and the paired ratios.
fn emit_paired(out: &Out, name: &str, n: usize, d: &Drive) {
    let n = n as f64;
    out.emit(
        &format!("{name}/per_s"),
        n / d.wall.as_secs_f64(),
        "senders/s",
    );
    out.emit(
        &format!("{name}/cpu_us"),
        d.cpu.as_secs_f64() * 1e6 / n,
        "us/sender",
    );
    out.emit(
        &format!("{name}/paired_x25519_per_s"),
        n / d.x_wall.as_secs_f64(),
        "ops/s",
    );
    out.emit(
        &format!("{name}/ratio_to_paired_x25519"),
        d.x_wall.as_secs_f64() / d.wall.as_secs_f64(),
        "ratio",
    );
    out.emit(
        &format!("{name}/cpu_ratio_to_paired_x25519"),
        d.x_cpu.as_secs_f64() / d.cpu.as_secs_f64(),
        "ratio",
    );
}

// ---------------------------------------------------------------------------------------------------------------
// 1. X25519 vs accepting a new sender

/// X25519 alone for ~0.6 s: (ops per second of wall time, CPU microseconds per op of this thread). The CPU
/// figure does not count time the thread was preempted by other work on this shared machine.
fn x25519_only() -> (f64, f64) {
    let node = StaticSecret::from(crypto::random_array::<32>());
    let peers: Vec<PublicKey> = (0..64)
        .map(|_| PublicKey::from(&StaticSecret::from(crypto::random_array::<32>())))
        .collect();
    let (t, c0) = (Instant::now(), thread_cpu());
    let mut ops = 0u64;
    while t.elapsed() < Duration::from_millis(600) {
        for p in &peers {
            black_box(node.diffie_hellman(black_box(p)));
        }
        ops += peers.len() as u64;
    }
    let cpu = thread_cpu() - c0;
    (
        ops as f64 / t.elapsed().as_secs_f64(),
        cpu.as_secs_f64() * 1e6 / ops as f64,
    )
}

fn part_new_senders(out: &Out) {
    const N: usize = 4096;
    const N_SINGLE: usize = 200;
    eprintln!("part 1: X25519 alone vs the node accepting {N} new senders");
    let node_id = Identity::generate();
    let ids: Vec<Identity> = (0..N).map(|_| Identity::generate()).collect();
    let senders = Arc::new(allow_list(&ids));
    let run_a = first_packets(&ids, node_id.public(), 1);
    let run_b = first_packets(&ids, node_id.public(), 2);
    let dir = tempfile::tempdir().expect("tempdir");

    // X25519 alone is measured before and after the node's runs; the reference is their mean.
    let x_before = x25519_only();

    // The protocol alone: handle_datagram (X25519, HKDF, open, parse, session) and the ack, no SQLite.
    {
        let mut node = new_node(&node_id, senders.clone(), Duration::from_secs(30));
        let d = drive(&mut node, &run_a, 1024, false, None, None);
        assert_eq!(node.counters().x25519, N as u64);
        assert_eq!(d.acks, N as u64);
        emit_paired(out, "new_sender/node_only", N, &d);
    }
    // The daemon's path: turns of 1024 (BATCH), applied to a real store, secrets written to the memo.
    let state = dir.path().join("state");
    {
        let mut node = new_node(&node_id, senders.clone(), Duration::from_secs(30));
        let mut stores = Stores::open(&state, &[APP.to_string()]).expect("stores");
        let mut memo = Memo::open(&state.join("memo.sqlite")).expect("memo");
        let d = drive(
            &mut node,
            &run_a,
            1024,
            false,
            Some(&mut stores),
            Some(&mut memo),
        );
        let c = node.counters();
        assert_eq!(c.stored_records, N as u64, "every first record stored");
        assert_eq!(d.acks, N as u64);
        emit_paired(out, "new_sender/turn1024", N, &d);
        out.emit("new_sender/turn1024/x25519", c.x25519 as f64, "count");
    }
    // A restart: a new node process (new epoch, no sessions) with the memo from above; the same senders start new
    // runs at sequence 2. Every one must be found in the memo: X25519 count 0.
    {
        let mut node = new_node(&node_id, senders.clone(), Duration::from_secs(30));
        let mut stores = Stores::open(&state, &[APP.to_string()]).expect("stores");
        let mut memo = Memo::open(&state.join("memo.sqlite")).expect("memo");
        let d = drive(
            &mut node,
            &run_b,
            1024,
            true,
            Some(&mut stores),
            Some(&mut memo),
        );
        let c = node.counters();
        assert_eq!(c.stored_records, N as u64, "every second record stored");
        emit_paired(out, "known_sender/turn1024", N, &d);
        out.emit("known_sender/turn1024/x25519", c.x25519 as f64, "count");
        out.emit(
            "known_sender/turn1024/memo_hits",
            c.memo_hits as f64,
            "count",
        );
    }
    // A turn per new sender: each one pays a commit (an fsync) before its ack.
    {
        let state1 = dir.path().join("state1");
        let mut node = new_node(&node_id, senders.clone(), Duration::from_secs(30));
        let mut stores = Stores::open(&state1, &[APP.to_string()]).expect("stores");
        let mut memo = Memo::open(&state1.join("memo.sqlite")).expect("memo");
        let d = drive(
            &mut node,
            &run_a[..N_SINGLE],
            1,
            false,
            Some(&mut stores),
            Some(&mut memo),
        );
        assert_eq!(node.counters().stored_records, N_SINGLE as u64);
        emit_paired(out, "new_sender/turn1", N_SINGLE, &d);
    }
    let x_after = x25519_only();
    out.emit("x25519/before_ops_per_s", x_before.0, "ops/s");
    out.emit("x25519/after_ops_per_s", x_after.0, "ops/s");
    out.emit("x25519/ops_per_s", (x_before.0 + x_after.0) / 2.0, "ops/s");
    out.emit("x25519/cpu_us", (x_before.1 + x_after.1) / 2.0, "us/op");
}

// ---------------------------------------------------------------------------------------------------------------
// 2. AES-128-GCM open vs the node's packet on a session

fn aes_open_1200(out: &Out) {
    let key = crypto::random_array::<16>();
    let mut packet = vec![0x11u8; 21];
    packet.extend((0..1200 - 21 - 16).map(|i| i as u8));
    crypto::seal(&key, 7, &mut packet, 21);
    assert_eq!(packet.len(), 1200);
    let mut scratch = Vec::with_capacity(1500);
    let mut n = [0u8; 12];
    n[4..].copy_from_slice(&7u64.to_be_bytes());
    let nonce: Nonce<aes_gcm::aead::consts::U12> = n.into();
    let t = Instant::now();
    let mut ops = 0u64;
    while t.elapsed() < Duration::from_millis(400) {
        for _ in 0..256 {
            // As the node does it: a copy of the datagram, a fresh key schedule, open in place.
            scratch.clear();
            scratch.extend_from_slice(black_box(&packet));
            let cipher = Aes128Gcm::new(black_box(&key).into());
            let (header, rest) = scratch.split_at_mut(21);
            let (body, tag) = rest.split_at_mut(1200 - 21 - 16);
            let tag = Tag::try_from(&*tag).expect("16 bytes");
            cipher
                .decrypt_inout_detached(&nonce, header, body.into(), &tag)
                .expect("opens");
            black_box(&scratch);
        }
        ops += 256;
    }
    let ns = t.elapsed().as_secs_f64() * 1e9 / ops as f64;
    out.emit("aes_gcm_open_1200/ns", ns, "ns/packet");
    // Key setup alone, to say how much of the open it is.
    let t = Instant::now();
    let mut ops = 0u64;
    while t.elapsed() < Duration::from_millis(200) {
        for _ in 0..1024 {
            black_box(Aes128Gcm::new(black_box(&key).into()));
        }
        ops += 1024;
    }
    out.emit(
        "aes_gcm_key_setup/ns",
        t.elapsed().as_secs_f64() * 1e9 / ops as f64,
        "ns/key",
    );
}

/// Full packets of one run carrying `records` records of PAYLOAD bytes from sequence 1.
fn session_packets(id: &Identity, node_public: &[u8; 32], records: u64) -> Vec<Vec<u8>> {
    let mut config = SenderConfig::new(id.clone(), *node_public);
    config.window = u64::MAX / 4;
    let mut s = Sender::new(config).expect("sender");
    s.open_flow(APP, FlowStart::At(1)).expect("flow");
    for i in 1..=records {
        s.queue(APP, payload(i)).expect("queue");
    }
    let now = Instant::now();
    let mut packets = Vec::new();
    let mut buf = Vec::new();
    while s.poll_transmit(now, &mut buf) {
        packets.push(buf.clone());
    }
    packets
}

/// Feeds session packets the way the receive loop does: a turn when the node says it is full or after BATCH.
fn drive_session(
    node: &mut Node,
    packets: &[Vec<u8>],
    mut stores: Option<&mut Stores>,
) -> Duration {
    const BATCH: usize = 1024;
    let t = Instant::now();
    let mut read = 0;
    let now = Instant::now();
    for p in packets {
        node.handle_datagram(now, from_addr(0), p, &mut NoMemo);
        read += 1;
        if read == BATCH || node.turn_is_full() {
            finish_turn(node, stores.as_deref_mut(), None);
            read = 0;
        }
    }
    finish_turn(node, stores, None);
    t.elapsed()
}

fn part_packets(out: &Out) {
    const RECORDS: u64 = 600_000;
    eprintln!("part 2: AES-GCM open vs the node's packet ({RECORDS} records of {PAYLOAD} B)");
    aes_open_1200(out);
    let node_id = Identity::generate();
    let ids = vec![Identity::generate()];
    let senders = Arc::new(allow_list(&ids));
    let packets = session_packets(&ids[0], node_id.public(), RECORDS);
    let n = (packets.len() - 1) as f64;
    out.emit(
        "session_packet/records_per_packet",
        RECORDS as f64 / packets.len() as f64,
        "records/packet",
    );
    out.emit(
        "session_packet/bytes",
        packets[1].len() as f64,
        "bytes/packet",
    );
    for with_store in [false, true] {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut stores =
            with_store.then(|| Stores::open(dir.path(), &[APP.to_string()]).expect("stores"));
        let mut node = new_node(&node_id, senders.clone(), Duration::from_secs(30));
        // The first packet makes the session (one X25519); time only the packets after it.
        drive_session(&mut node, &packets[..1], stores.as_mut());
        let wall = drive_session(&mut node, &packets[1..], stores.as_mut());
        let c = node.counters();
        assert_eq!(c.total_dropped(), 0, "no packet dropped");
        if with_store {
            assert_eq!(c.stored_records, RECORDS, "every record stored");
        }
        let name = if with_store {
            "with_store"
        } else {
            "node_only"
        };
        out.emit(
            &format!("session_packet/{name}/ns"),
            wall.as_secs_f64() * 1e9 / n,
            "ns/packet",
        );
        out.emit(
            &format!("session_packet/{name}/records_per_s"),
            (RECORDS as f64 - RECORDS as f64 / (n + 1.0)) / wall.as_secs_f64(),
            "records/s",
        );
    }
}

// ---------------------------------------------------------------------------------------------------------------
// 3. SQLite, the chunk store, UDP, and the node over UDP

fn open_sqlite(path: &Path) -> Connection {
    let conn = Connection::open(path).expect("sqlite");
    conn.pragma_update(None, "journal_mode", "WAL")
        .expect("wal");
    conn.pragma_update(None, "synchronous", "FULL")
        .expect("full");
    conn
}

/// A row per record plus an upserted heard row, `per_commit` records per transaction, for about `budget`.
fn sqlite_rows(out: &Out, per_commit: u64, budget: Duration) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut conn = open_sqlite(&dir.path().join("rows.sqlite"));
    conn.execute_batch(
        "CREATE TABLE records (source INTEGER NOT NULL, seq INTEGER NOT NULL, body BLOB NOT NULL,
                               PRIMARY KEY (source, seq));
         CREATE TABLE heard (source INTEGER PRIMARY KEY, heard INTEGER NOT NULL);",
    )
    .expect("schema");
    let body = payload(0);
    let mut seq = 0i64;
    let t = Instant::now();
    let mut commits = 0;
    while commits < 2 || t.elapsed() < budget {
        let tx = conn.transaction().expect("tx");
        {
            let mut put = tx
                .prepare_cached("INSERT INTO records (source, seq, body) VALUES (1, ?1, ?2)")
                .expect("prepare");
            let mut heard = tx
                .prepare_cached(
                    "INSERT INTO heard (source, heard) VALUES (1, ?1)
                     ON CONFLICT (source) DO UPDATE SET heard = excluded.heard",
                )
                .expect("prepare");
            for _ in 0..per_commit {
                seq += 1;
                put.execute(params![seq, &body]).expect("insert");
                heard.execute(params![seq]).expect("upsert");
            }
        }
        tx.commit().expect("commit");
        commits += 1;
    }
    out.emit(
        &format!("sqlite_rows/{per_commit}/records_per_s"),
        seq as f64 / t.elapsed().as_secs_f64(),
        "records/s",
    );
}

/// The node's own store (`Stores::apply_turn`, chunk rows) fed synthetic turns of `per_commit` records from one
/// sender, cut into DATA frames of 28 records as full packets carry them.
fn store_chunks(out: &Out, per_commit: u64, budget: Duration) {
    const PER_FRAME: u64 = 28;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut stores = Stores::open(dir.path(), &[APP.to_string()]).expect("stores");
    let ids = vec![Identity::generate()];
    let senders = allow_list(&ids);
    let mut seq = 0u64;
    let mut turn_id = 0;
    let t = Instant::now();
    let mut commits = 0;
    let mut busy = Duration::ZERO;
    while commits < 2 || t.elapsed() < budget {
        let turn = turns::turn_of(turn_id, seq + 1, per_commit, PER_FRAME, payload);
        turn_id += 1;
        seq += per_commit;
        let a = Instant::now();
        let c = stores.apply_turn(&turn, &senders).expect("apply");
        busy += a.elapsed();
        assert_eq!(c.stored_records, per_commit);
        commits += 1;
    }
    out.emit(
        &format!("store_chunks/{per_commit}/records_per_s"),
        seq as f64 / busy.as_secs_f64(),
        "records/s",
    );
}

/// Plain send/recv of 1200 B datagrams between two loopback sockets, one thread each.
fn udp_ceiling(out: &Out) -> f64 {
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
    let packet = [0x11u8; 1200];
    let t = Instant::now();
    let r0 = received.load(Ordering::Relaxed);
    let mut sent = 0u64;
    while t.elapsed() < Duration::from_millis(1000) {
        for _ in 0..64 {
            if tx.send(&packet).is_ok() {
                sent += 1;
            }
        }
    }
    let secs = t.elapsed().as_secs_f64();
    let got = received.load(Ordering::Relaxed) - r0;
    stop.store(true, Ordering::Relaxed);
    reader.join().expect("reader");
    out.emit(
        "udp_1200/recv_packets_per_s",
        got as f64 / secs,
        "packets/s",
    );
    out.emit(
        "udp_1200/sent_packets_per_s",
        sent as f64 / secs,
        "packets/s",
    );
    got as f64 / secs
}

/// The kernel's count of UDP datagrams dropped because a socket's receive buffer was full (all sockets).
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

/// What one durable commit costs here at least: a 4 KiB write and an fdatasync, 200 times; p50 and p99.
fn fsync_floor(out: &Out, name: &str) {
    use std::io::{Seek, SeekFrom, Write};
    let dir = tempfile::tempdir().expect("tempdir");
    let mut f = std::fs::File::create(dir.path().join("sync")).expect("file");
    let block = [0x5au8; 4096];
    let mut times = Vec::with_capacity(200);
    for i in 0..200u64 {
        f.seek(SeekFrom::Start((i % 16) * 4096)).expect("seek");
        f.write_all(&block).expect("write");
        let t = Instant::now();
        f.sync_data().expect("fdatasync");
        times.push(t.elapsed());
    }
    times.sort();
    out.emit(
        &format!("{name}/p50_ms"),
        times[100].as_secs_f64() * 1e3,
        "ms",
    );
    out.emit(
        &format!("{name}/p99_ms"),
        times[198].as_secs_f64() * 1e3,
        "ms",
    );
}

fn start_node(dir: &Path, ids: &[Identity], idle: Duration, recv_buffer: usize) -> LocalNode {
    let listed: Vec<(String, [u8; 32])> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| (format!("dev-{i}"), *id.public()))
        .collect();
    LocalNode::start(dir, &listed, idle, recv_buffer).expect("node")
}

/// Stops the node; its counters and its state directory.
fn stop_node(node: LocalNode) -> (pure_serve::proto::node::NodeCounters, std::path::PathBuf) {
    let state = node.state_dir.clone();
    (node.stop().expect("node run"), state)
}

/// Counts stored records per source and checks each source holds 1..=n exactly once, in order.
fn check_store(state: &Path) -> (u64, bool) {
    let s = store::open_app_for_reading(state, APP).expect("store");
    let mut last: HashMap<String, u64> = HashMap::new();
    let mut in_order = true;
    s.for_each_record(None, |source, seq, _| {
        let l = last.entry(source.to_string()).or_insert(0);
        in_order &= seq == *l + 1;
        *l = seq;
        true
    })
    .expect("read store");
    (last.values().sum(), in_order)
}

/// `links` links, each on its own thread and socket, deliver `per_link` records each through a real node.
/// The CLI's default `--recv-buffer` (the kernel doubles what it is asked for).
const DEFAULT_RECV_BUFFER: usize = 2 << 20;

fn links_over_udp(out: &Out, links: usize, per_link: u64, recv_buffer: usize) -> f64 {
    let dir = tempfile::tempdir().expect("tempdir");
    let ids: Vec<Identity> = (0..links).map(|_| Identity::generate()).collect();
    let node = start_node(dir.path(), &ids, Duration::from_secs(30), recv_buffer);
    // Queue everything before the clock starts: the figure is the link's, not the payload formatting's.
    let mut prepared = Vec::new();
    for id in &ids {
        let mut link = UdpLink::connect(id.clone(), node.public, node.addr).expect("link");
        link.sender()
            .open_flow(APP, FlowStart::At(1))
            .expect("flow");
        for i in 1..=per_link {
            link.sender().queue(APP, payload(i)).expect("queue");
        }
        prepared.push(link);
    }
    let d0 = node.stats.datagrams.load(Ordering::Relaxed);
    let t = Instant::now();
    let rcvbuf0 = udp_rcvbuf_errors();
    // A watcher: the longest time the store made no progress while the links delivered (a stall shows here).
    let mon_stats = node.stats.clone();
    let mon_done = Arc::new(AtomicBool::new(false));
    let mon_done2 = mon_done.clone();
    let monitor = std::thread::spawn(move || {
        let mut last = 0;
        let mut since = Instant::now();
        let mut longest = Duration::ZERO;
        let mut report = Instant::now();
        while !mon_done2.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(5));
            let stored = mon_stats.stored_records.load(Ordering::Relaxed);
            if stored != last {
                last = stored;
                since = Instant::now();
            }
            longest = longest.max(since.elapsed());
            if report.elapsed() >= Duration::from_secs(5) {
                report = Instant::now();
                eprintln!(
                    "    stored={stored} datagrams={} dropped={} sessions={}",
                    mon_stats.datagrams.load(Ordering::Relaxed),
                    mon_stats.dropped.load(Ordering::Relaxed),
                    mon_stats.sessions.load(Ordering::Relaxed)
                );
            }
        }
        longest
    });
    let workers: Vec<_> = prepared
        .into_iter()
        .map(|mut link| {
            std::thread::spawn(move || {
                let o = link
                    .deliver(Some(Duration::from_secs(120)))
                    .expect("deliver");
                (o.unacked, link.sender().stats().clone())
            })
        })
        .collect();
    let mut unacked = 0;
    let mut sent = 0;
    let mut retransmit_rounds = 0;
    for w in workers {
        let (u, s) = w.join().expect("link thread");
        unacked += u;
        sent += s.packets_sent;
        retransmit_rounds += s.retransmit_rounds;
    }
    let secs = t.elapsed().as_secs_f64();
    mon_done.store(true, Ordering::Relaxed);
    let longest_quiet = monitor.join().expect("monitor");
    let rcvbuf_errors = udp_rcvbuf_errors().saturating_sub(rcvbuf0);
    let datagrams = node.stats.datagrams.load(Ordering::Relaxed) - d0;
    let (c, state) = stop_node(node);
    let (stored, in_order) = check_store(&state);
    let total = links as u64 * per_link;
    let name = if recv_buffer == DEFAULT_RECV_BUFFER {
        format!("link_udp/{links}")
    } else {
        format!("link_udp/{links}_rcvbuf{}m", recv_buffer >> 20)
    };
    out.emit(
        &format!("{name}/records_per_s"),
        total as f64 / secs,
        "records/s",
    );
    out.emit(
        &format!("{name}/packets_per_s"),
        datagrams as f64 / secs,
        "packets/s",
    );
    out.emit(&format!("{name}/sender_packets"), sent as f64, "count");
    out.emit(
        &format!("{name}/retransmit_rounds"),
        retransmit_rounds as f64,
        "count",
    );
    out.emit(
        &format!("{name}/node_duplicates"),
        c.duplicate_records as f64,
        "count",
    );
    out.emit(&format!("{name}/node_gaps"), c.gap_records as f64, "count");
    out.emit(
        &format!("{name}/turn_full_drops"),
        c.dropped(DropReason::TurnFull) as f64,
        "count",
    );
    out.emit(&format!("{name}/unacked"), unacked as f64, "count");
    out.emit(
        &format!("{name}/longest_no_progress_ms"),
        longest_quiet.as_secs_f64() * 1e3,
        "ms",
    );
    out.emit(
        &format!("{name}/kernel_rcvbuf_errors"),
        rcvbuf_errors as f64,
        "count",
    );
    out.emit(
        &format!("{name}/exactly_once"),
        if stored == total && in_order && unacked == 0 {
            1.0
        } else {
            0.0
        },
        "bool",
    );
    if stored != total || !in_order {
        eprintln!("  !! {name}: store holds {stored} of {total} records (in order: {in_order})");
    }
    datagrams as f64 / secs
}

fn part_store_and_link(out: &Out, parts: &[String]) {
    if want(parts, "sqlite") {
        eprintln!("part 3a: SQLite row per record vs the chunk store");
        fsync_floor(out, "fsync_4k");
        for (n, ms) in [(1, 800), (256, 1200), (4096, 1500), (16384, 1500)] {
            sqlite_rows(out, n, Duration::from_millis(ms));
        }
        for (n, ms) in [(28, 800), (1024, 1200), (16384, 1500)] {
            store_chunks(out, n, Duration::from_millis(ms));
        }
    }
    if want(parts, "udp") {
        eprintln!("part 3b: UDP loopback ceiling");
        udp_ceiling(out);
    }
    if want(parts, "link") {
        eprintln!("part 3c: the node over UDP loopback");
        links_over_udp(out, 1, 1_000_000, DEFAULT_RECV_BUFFER);
        links_over_udp(out, 4, 250_000, DEFAULT_RECV_BUFFER);
        // Is the socket buffer what four links lose datagrams in? The same with twice the buffer (this machine's
        // net.core.rmem_max is 4 MiB).
        links_over_udp(out, 4, 250_000, 4 << 20);
    }
}

// ---------------------------------------------------------------------------------------------------------------
// 4. An idle link's first packet → stored ack

fn part_wake(out: &Out) {
    const SENDERS: usize = 40;
    const SAMPLES: usize = 200;
    const IDLE: Duration = Duration::from_millis(200);
    eprintln!(
        "part 4: idle link → stored ack ({SAMPLES} wakes of {SENDERS} senders, idle {IDLE:?})"
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let ids: Vec<Identity> = (0..SENDERS).map(|_| Identity::generate()).collect();
    // The disk's commit floor right before the wakes: on this VM it moves from ~0.2 ms to several ms over minutes.
    fsync_floor(out, "fsync_4k_before_wake");
    let node = start_node(dir.path(), &ids, IDLE, DEFAULT_RECV_BUFFER);
    let mut next_seq = vec![1u64; SENDERS];
    let mut last_sent = vec![Instant::now() - Duration::from_secs(10); SENDERS];
    // One wake: a new run (new UdpLink, made before the clock starts) with one record at the known sequence.
    let mut wake = |i: usize| -> Duration {
        // Quiet longer than the idle time plus a sweep interval (idle/4), so the old session is gone.
        let quiet = IDLE + IDLE / 2;
        let since = last_sent[i].elapsed();
        if since < quiet {
            std::thread::sleep(quiet - since);
        }
        let mut link = UdpLink::connect(ids[i].clone(), node.public, node.addr).expect("link");
        link.sender()
            .open_flow(APP, FlowStart::At(next_seq[i]))
            .expect("flow");
        link.sender()
            .queue(APP, payload(next_seq[i]))
            .expect("queue");
        let t = Instant::now();
        let mut at = None;
        let o = link
            .deliver_with(Some(Duration::from_secs(5)), |e| {
                if at.is_none() && matches!(e, SenderEvent::Stored { .. }) {
                    at = Some(t.elapsed());
                }
            })
            .expect("deliver");
        assert_eq!(o.unacked, 0, "wake record acked");
        next_seq[i] += 1;
        last_sent[i] = Instant::now();
        at.expect("a Stored event")
    };
    let mut first: Vec<Duration> = (0..SENDERS).map(&mut wake).collect();
    // Let the turn that wrote the memo publish its counters.
    std::thread::sleep(Duration::from_millis(20));
    let x0 = node.stats.x25519.load(Ordering::Relaxed);
    let sessions_before = node.stats.sessions.load(Ordering::Relaxed);
    let mut wakes: Vec<Duration> = Vec::with_capacity(SAMPLES);
    let pace = (IDLE + IDLE / 2 + Duration::from_millis(20)) / SENDERS as u32;
    for k in 0..SAMPLES {
        let started = Instant::now();
        wakes.push(wake(k % SENDERS));
        if let Some(rest) = pace.checked_sub(started.elapsed()) {
            std::thread::sleep(rest);
        }
    }
    // The same with the session kept: one link stays up and sends one record at the same pace. The difference
    // from the wakes is what waking costs (memo lookup, HKDF, a new session); the rest is the round trip and commit.
    let mut link = UdpLink::connect(ids[0].clone(), node.public, node.addr).expect("link");
    link.sender()
        .open_flow(APP, FlowStart::At(next_seq[0]))
        .expect("flow");
    let mut active: Vec<Duration> = Vec::with_capacity(SAMPLES / 2);
    for _ in 0..SAMPLES / 2 {
        let started = Instant::now();
        link.sender()
            .queue(APP, payload(next_seq[0]))
            .expect("queue");
        next_seq[0] += 1;
        let t = Instant::now();
        let mut at = None;
        let o = link
            .deliver_with(Some(Duration::from_secs(5)), |e| {
                if at.is_none() && matches!(e, SenderEvent::Stored { .. }) {
                    at = Some(t.elapsed());
                }
            })
            .expect("deliver");
        assert_eq!(o.unacked, 0, "record acked");
        active.push(at.expect("a Stored event"));
        if let Some(rest) = pace.checked_sub(started.elapsed()) {
            std::thread::sleep(rest);
        }
    }
    active.sort();
    std::thread::sleep(Duration::from_millis(20));
    let x1 = node.stats.x25519.load(Ordering::Relaxed);
    let (c, _) = stop_node(node);
    first.sort();
    wakes.sort();
    let pct = |v: &[Duration], p: f64| {
        v[(((v.len() - 1) as f64) * p).round() as usize].as_secs_f64() * 1e3
    };
    out.emit("wake/first_contact/p50_ms", pct(&first, 0.5), "ms");
    out.emit("wake/first_contact/p99_ms", pct(&first, 0.99), "ms");
    out.emit("wake/first_contact/x25519", x0 as f64, "count");
    out.emit("wake/idle/p50_ms", pct(&wakes, 0.5), "ms");
    out.emit("wake/idle/p99_ms", pct(&wakes, 0.99), "ms");
    out.emit("wake/idle/x25519", (x1 - x0) as f64, "count");
    out.emit("wake/active_session/p50_ms", pct(&active, 0.5), "ms");
    out.emit("wake/active_session/p99_ms", pct(&active, 0.99), "ms");
    out.emit(
        "wake/idle/sessions_at_start",
        sessions_before as f64,
        "count",
    );
    out.emit("wake/sessions_made", c.sessions_made as f64, "count");
    out.emit("wake/sessions_swept", c.sessions_swept as f64, "count");
    out.emit("wake/memo_hits", c.memo_hits as f64, "count");
}

fn want(parts: &[String], part: &str) -> bool {
    parts.is_empty() || parts.iter().any(|p| p == part)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mut run = 0u32;
    let mut parts: Vec<String> = Vec::new();
    let mut i = 1;
    while i < args.len() {
        match args[i].as_str() {
            "--round" => {
                run = args.get(i + 1).and_then(|v| v.parse().ok()).unwrap_or(0);
                i += 1;
            }
            "--only" => {
                parts = args
                    .get(i + 1)
                    .map(|v| v.split(',').map(str::to_string).collect())
                    .unwrap_or_default();
                i += 1;
            }
            // `cargo bench` passes --bench; anything else is ignored too.
            _ => {}
        }
        i += 1;
    }
    let out = Out { run };
    let t = Instant::now();
    eprintln!("link_costs round {run}");
    if want(&parts, "x25519") {
        part_new_senders(&out);
    }
    if want(&parts, "aes") {
        part_packets(&out);
    }
    part_store_and_link(&out, &parts);
    if want(&parts, "wake") {
        part_wake(&out);
    }
    eprintln!("round {run} took {:.1} s", t.elapsed().as_secs_f64());
}
