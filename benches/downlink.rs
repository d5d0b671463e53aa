//! research/024-downlink: downlink measured on the real binary (issue 16, item 6). Prints one JSON object per line
//! on stdout (`{"bench":"downlink","part":…,"round":…,…}`); progress goes to stderr.
//!
//! Parts (`--only PART[,PART]`, default all):
//! - `idle`: for each `--senders N` (default 100000 and 1000000), the node's anonymous memory with nothing queued
//!   and with one record waiting for each sender (written into the app store's downlink tables while the node is
//!   stopped, so the figure is the node's, not a pusher's), and the store's bytes per queued record. Then every
//!   sender wakes once (a new run, `LISTEN main 0`) and must be handed its record once; halfway the node is
//!   SIGKILLed and restarted, and the devices that had theirs make a new run with the heard sequence they kept and
//!   must be handed nothing. Anonymous memory after every session is swept.
//! - `live`: push → device program for a live listening session, through the push socket (HTTP) and through
//!   the push datagram socket and `pure-serve push`, beside one `fdatasync` on the same filesystem and one UDP round trip on loopback, and beside
//!   the node's own commit and round trip the other way (one record from the device on a live run → its stored ack).
//!   With `--senders N`, once for each N, the device among N listed senders.
//! - `live-mixed` (only when named): the same pushes and uplink records taken in turn, each beside the others in
//!   the same seconds (research/046: the disk's sync time moved tenfold within a run), and a fourth, an HTTP push on
//!   one connection kept for all of them (`kept_*`, research/049: a connection of its own costs a push ~0.1 ms);
//!   and, at the same pace, one commit as the node makes one and one UDP round trip (`*_paced_*`, research/051:
//!   5 ms apart they cost several times what they cost back to back, so "one commit plus one round trip" is taken
//!   in the pushes' setting); `--senders N` as for `live`.
//! - `wake`: a device that wakes every second (a new run each time, its session swept between): push → program.
//! - `one`: records/s to one device (20,000 records of 32 bytes waiting), and records per answer.
//! - `wide`: 100,000 devices with one record each woken together, beside the same devices' uplink of one record
//!   each from a new run, with the same driver.
//!
//! - `fleet`: downlink on a fleet's store (docs/scale-out.md, "Downlink on a fleet"): two nodes with one key on one
//!   PostgreSQL made for the bench (`tests/pg_util`), one device listening on node B; push → program through node
//!   A's push socket (B hears of it from the database) and through B's own, interleaved, beside B's uplink record →
//!   stored ack and one autocommitted one-row INSERT on the same database (its commit).
//!
//! - `name`: `AllowList::find_name` (how a push finds its sender, on the HTTP thread) over a list of 1M senders:
//!   names found at random and a name not listed, beside one lookup by key (`find`) on the same list; then the
//!   index by name made (its time and bytes) and the same lookups through it (research/046).
//!
//! Usage: cargo bench --bench downlink -- [--only PARTS] [--senders N]... [--round R] [--bin PATH]

#[path = "util/devices.rs"]
mod devices;
#[path = "../tests/pg_util/mod.rs"]
mod pg_util;
#[path = "util/process.rs"]
mod process;

use std::io::{Read, Write};
use std::net::{SocketAddr, UdpSocket};
use std::os::unix::net::{UnixDatagram, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use devices::{Driven, drive};
use process::{metric, par_map, proc_kb, process_cpu, read_banner};
use pure_serve::keys::encode_key;
use pure_serve::proto::crypto::Identity;
use pure_serve::proto::sender::{FlowStart, Sender, SenderConfig, SenderEvent};
use pure_serve::sender::UdpLink;
use serde_json::json;

struct Args {
    only: Vec<String>,
    senders: Vec<usize>,
    round: u64,
    bin: String,
    /// Devices taking an image at once (`image-many`, `--devices N`, repeatable).
    devices: Vec<usize>,
    /// Whether `--senders` was given (`live` then runs once for each; else with its device alone).
    senders_given: bool,
}

fn args() -> Args {
    let mut a = Args {
        only: Vec::new(),
        senders: Vec::new(),
        round: 0,
        bin: env!("CARGO_BIN_EXE_pure-serve").to_string(),
        devices: Vec::new(),
        senders_given: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--only" => a.only = it.next().unwrap().split(',').map(String::from).collect(),
            "--senders" => a.senders.push(it.next().unwrap().parse().unwrap()),
            "--round" => a.round = it.next().unwrap().parse().unwrap(),
            "--bin" => a.bin = it.next().unwrap(),
            "--devices" => a.devices.push(it.next().unwrap().parse().unwrap()),
            "--bench" => {}
            other => panic!("unknown argument {other}"),
        }
    }
    a.senders_given = !a.senders.is_empty();
    if a.senders.is_empty() {
        a.senders = vec![100_000, 1_000_000];
    }
    if a.devices.is_empty() {
        a.devices = vec![1_000, 10_000];
    }
    a
}

fn emit(round: u64, part: &str, mut v: serde_json::Value) {
    v["bench"] = json!("downlink");
    v["part"] = json!(part);
    v["round"] = json!(round);
    println!("{v}");
    std::io::stdout().flush().unwrap();
}

fn free_udp_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Node {
    child: Child,
    /// From the spawn to the node's `ready` line.
    ready: Duration,
    link: SocketAddr,
    http: SocketAddr,
    public: [u8; 32],
    state: PathBuf,
}

impl Node {
    fn start(bin: &str, state: &Path, senders: &Path, port: u16, extra: &[&str]) -> Node {
        Node::start_in(None, "127.0.0.1", bin, state, senders, port, extra)
    }

    /// A node in network namespace `netns` (run through `ip netns exec`), bound to `bind`.
    fn start_in(
        netns: Option<&str>,
        bind: &str,
        bin: &str,
        state: &Path,
        senders: &Path,
        port: u16,
        extra: &[&str],
    ) -> Node {
        let started = Instant::now();
        let mut command = match netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, bin]);
                c
            }
            None => Command::new(bin),
        };
        let mut child = command
            .arg("--state")
            .arg(state)
            .arg("--senders")
            .arg(senders)
            .args(["--bind", bind, "--http-port", "0"])
            .args(["--link-port", &port.to_string(), "--recv-buffer", "4194304"])
            .args(extra)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let banner = read_banner(child.stdout.take().unwrap());
        let ready = started.elapsed();
        Node {
            child,
            ready,
            link: banner.link,
            http: banner.http,
            public: banner.public,
            state: state.to_path_buf(),
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn stop(mut self, signal: i32) {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.child.id() as i32, signal) };
        self.child.wait().unwrap();
    }
}

fn name(i: usize) -> String {
    format!("dev{i:07}")
}

/// The 16-byte downlink record waiting for device `i`.
fn record_of(i: usize) -> Vec<u8> {
    format!("down-for-{i:07}").into_bytes()
}

/// A senders file of `ids` in `dir`.
fn write_senders(dir: &Path, ids: &[Identity]) -> PathBuf {
    let mut text = String::with_capacity(ids.len() * 56);
    for (i, id) in ids.iter().enumerate() {
        text.push_str(&format!("{} {}\n", name(i), encode_key(id.public())));
    }
    let path = dir.join("senders");
    std::fs::write(&path, text).unwrap();
    path
}

/// Bytes of the store's pages in use, after a checkpoint.
fn store_bytes(conn: &rusqlite::Connection) -> u64 {
    conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
        .unwrap();
    let q = |p: &str| -> u64 { conn.query_row(p, [], |r| r.get::<_, i64>(0)).unwrap() as u64 };
    (q("PRAGMA page_count") - q("PRAGMA freelist_count")) * q("PRAGMA page_size")
}

/// Queues `record_of(i)` for every `i < n` as sequence 1, in the app store's downlink tables (docs/store.md,
/// "Downlink"), while no node runs. Returns the store's bytes in use before and after.
fn queue_in_store(state: &Path, n: usize) -> (u64, u64) {
    let mut conn = rusqlite::Connection::open(state.join("apps").join("main.sqlite")).unwrap();
    let before = store_bytes(&conn);
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let tx = conn.transaction().unwrap();
    {
        let mut rec = tx
            .prepare(
                "INSERT INTO downlink (sender, seq, payload, queued_at, expires_at) VALUES (?1, 1, ?2, ?3, NULL)",
            )
            .unwrap();
        let mut flow = tx
            .prepare("INSERT INTO down_flows (sender, next_seq, acked) VALUES (?1, 2, 0)")
            .unwrap();
        for i in 0..n {
            rec.execute(rusqlite::params![name(i), record_of(i), now_ms])
                .unwrap();
            flow.execute([name(i)]).unwrap();
        }
        // No kept count: the next open counts the table once (as every open did before the count was kept) and
        // writes the row; the opens after it read the row.
        tx.execute("DELETE FROM down_count", []).unwrap();
    }
    tx.commit().unwrap();
    let after = store_bytes(&conn);
    (before, after)
}

/// One device of a wake wave: its run, and what its program was handed in it.
struct Device {
    index: usize,
    sender: Sender,
    handed: u32,
    wrong: u32,
}

impl Device {
    /// A new run listening on `main` from `heard`, or (uplink) with one record of its own in the first packet.
    fn new(index: usize, id: &Identity, node: &[u8; 32], heard: Option<u64>) -> Device {
        let mut sender = Sender::new(SenderConfig::new(id.clone(), *node)).unwrap();
        match heard {
            Some(h) => sender.listen("main", h).unwrap(),
            None => {
                sender.open_flow("main", FlowStart::At(1)).unwrap();
                sender.queue("main", record_of(index)).unwrap();
            }
        }
        Device {
            index,
            sender,
            handed: 0,
            wrong: 0,
        }
    }
}

impl Driven for Device {
    fn sender(&mut self) -> &mut Sender {
        &mut self.sender
    }

    fn event(&mut self, e: SenderEvent) {
        if let SenderEvent::Down { seq, payload, .. } = e {
            self.handed += 1;
            if seq != 1 || payload != record_of(self.index) {
                self.wrong += 1;
            }
        }
    }
}

/// Waits until the node has swept every session, then a little more for the figures after its last turn.
fn wait_swept(node: &Node) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while metric(node.http, "pure_sessions_active") > 0.0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_millis(500));
}

fn identities(n: usize) -> Vec<Identity> {
    par_map(n, |_| Identity::generate())
}

fn part_idle(a: &Args, n: usize) {
    let dir = tempfile::tempdir_in("/tmp").unwrap();
    eprintln!("idle {n}: making {n} identities");
    let ids = identities(n);
    let senders = write_senders(dir.path(), &ids);
    let port = free_udp_port();
    let extra = ["--link-idle-ms", "1000"];
    // Nothing queued: the same senders, a state of its own; the first start builds its index.
    let empty = dir.path().join("empty");
    Node::start(&a.bin, &empty, &senders, port, &extra).stop(libc::SIGTERM);
    let node = Node::start(&a.bin, &empty, &senders, port, &extra);
    let ready_empty = node.ready;
    std::thread::sleep(Duration::from_millis(300));
    let anon_empty = proc_kb(node.pid(), "RssAnon:");
    let file_empty = proc_kb(node.pid(), "RssFile:");
    node.stop(libc::SIGTERM);
    // One record waiting for each.
    let state = dir.path().join("waiting");
    Node::start(&a.bin, &state, &senders, port, &extra).stop(libc::SIGTERM);
    let t = Instant::now();
    let (store_before, store_after) = queue_in_store(&state, n);
    eprintln!("idle {n}: queued in {:.1} s", t.elapsed().as_secs_f64());
    // The page cache holds the store as the queueing left it; a start after a reboot reads it from the disk.
    // First a start that counts the waiting records (the store has no kept count yet), then one that reads it.
    let node = Node::start(&a.bin, &state, &senders, port, &extra);
    let ready_counting = node.ready;
    std::thread::sleep(Duration::from_millis(300));
    let anon_counting = proc_kb(node.pid(), "RssAnon:");
    node.stop(libc::SIGTERM);
    let node = Node::start(&a.bin, &state, &senders, port, &extra);
    let ready_waiting = node.ready;
    std::thread::sleep(Duration::from_millis(300));
    let anon_waiting = proc_kb(node.pid(), "RssAnon:");
    let file_waiting = proc_kb(node.pid(), "RssFile:");
    let waiting_metric = metric(node.http, "pure_downlink_waiting{app=\"main\"}");
    emit(
        a.round,
        "idle",
        json!({
            "phase": "listed", "senders": n, "rss_anon_empty_kb": anon_empty, "rss_anon_waiting_kb": anon_waiting,
            "rss_file_empty_kb": file_empty, "rss_file_waiting_kb": file_waiting,
            "anon_bytes_per_sender_waiting_minus_empty":
                (anon_waiting as f64 - anon_empty as f64) * 1024.0 / n as f64,
            "store_bytes_before": store_before, "store_bytes_after": store_after,
            "store_bytes_per_queued_record": (store_after - store_before) as f64 / n as f64,
            "payload_bytes": record_of(0).len(), "waiting_metric": waiting_metric,
            "ready_empty_ms": ms(ready_empty), "ready_waiting_ms": ms(ready_waiting),
            "ready_counting_ms": ms(ready_counting), "rss_anon_counting_kb": anon_counting,
        }),
    );
    // Every device wakes once; the node is killed halfway.
    eprintln!("idle {n}: building {n} first runs");
    let devices = par_map(n, |i| Device::new(i, &ids[i], &node.public, Some(0)));
    let t = Instant::now();
    let (mut done, rest) = drive(devices, devices::SOCKETS, Some(n / 2), |_| node.link);
    let first_wave = t.elapsed();
    node.stop(libc::SIGKILL);
    eprintln!(
        "idle {n}: {} done in {:.1} s, node killed",
        done.len(),
        first_wave.as_secs_f64()
    );
    let node = Node::start(&a.bin, &state, &senders, port, &extra);
    let t = Instant::now();
    let (rest_done, left) = drive(rest, devices::SOCKETS, None, |_| node.link);
    assert!(left.is_empty());
    let second_wave = t.elapsed();
    // The devices that had theirs restart their program: a new run with the heard they kept (1).
    let restarted: Vec<usize> = done.iter().map(|d| d.index).collect();
    eprintln!("idle {n}: {} devices restart", restarted.len());
    let again = par_map(restarted.len(), |k| {
        let i = restarted[k];
        Device::new(i, &ids[i], &node.public, Some(1))
    });
    let t = Instant::now();
    let (again_done, _) = drive(again, devices::SOCKETS, None, |_| node.link);
    let restart_wave = t.elapsed();
    done.extend(rest_done);
    let mut handed = vec![0u32; n];
    let mut wrong = 0;
    for d in done.iter().chain(&again_done) {
        handed[d.index] += d.handed;
        wrong += d.wrong;
    }
    let once = handed.iter().filter(|&&h| h == 1).count();
    let lost = handed.iter().filter(|&&h| h == 0).count();
    let doubled = handed.iter().filter(|&&h| h > 1).count();
    let peak_anon = proc_kb(node.pid(), "RssAnon:");
    wait_swept(&node);
    emit(
        a.round,
        "idle",
        json!({
            "phase": "after_wake", "senders": n, "handed_once": once, "lost": lost, "doubled": doubled,
            "wrong_payload": wrong, "first_wave_s": first_wave.as_secs_f64(),
            "second_wave_s": second_wave.as_secs_f64(), "restart_wave_s": restart_wave.as_secs_f64(),
            "restarted_devices": restarted.len(),
            "handed_in_restart_wave": again_done.iter().map(|d| d.handed).sum::<u32>(),
            "records_per_s_second_wave": rest_done_count(n, &restarted) as f64 / second_wave.as_secs_f64(),
            "waiting_after": metric(node.http, "pure_downlink_waiting{app=\"main\"}"),
            "delivered_metric_after_restart": metric(node.http, "pure_downlink_delivered_total{app=\"main\"}"),
            "x25519_after_restart": metric(node.http, "pure_x25519_total"),
            "rss_anon_peak_kb": peak_anon, "rss_anon_after_idle_kb": proc_kb(node.pid(), "RssAnon:"),
            "anon_bytes_per_sender_after_idle": proc_kb(node.pid(), "RssAnon:") as f64 * 1024.0 / n as f64,
        }),
    );
    node.stop(libc::SIGTERM);
}

fn rest_done_count(n: usize, first: &[usize]) -> usize {
    n - first.len()
}

/// One push of `body` on the push socket; returns when the node answered (200 expected).
fn push_http(socket: &Path, to: &str, body: &[u8]) {
    let mut s = UnixStream::connect(socket).unwrap();
    // One write, as a client that builds its request first sends it (curl does): a request in pieces costs the
    // server a read and a wake per piece.
    let mut request = format!(
        "POST /push?app=main&to={to} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(body);
    s.write_all(&request).unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

/// A pusher that keeps one connection to the push socket for all its pushes (HTTP/1.1 keep-alive), as a program on
/// the node's machine would rather than connect for each.
struct KeptPusher {
    stream: std::io::BufReader<UnixStream>,
}

impl KeptPusher {
    fn connect(socket: &Path) -> Self {
        KeptPusher {
            stream: std::io::BufReader::new(UnixStream::connect(socket).unwrap()),
        }
    }

    fn push(&mut self, to: &str, body: &[u8]) {
        use std::io::BufRead;
        let mut request = format!(
            "POST /push?app=main&to={to} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        request.extend_from_slice(body);
        self.stream.get_mut().write_all(&request).unwrap();
        let (mut status, mut length) = (String::new(), 0usize);
        self.stream.read_line(&mut status).unwrap();
        assert!(status.starts_with("HTTP/1.1 200"), "{status}");
        loop {
            let mut line = String::new();
            self.stream.read_line(&mut line).unwrap();
            if line == "\r\n" {
                break;
            }
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                length = v.trim().parse().unwrap();
            }
        }
        let mut answer = vec![0u8; length];
        self.stream.read_exact(&mut answer).unwrap();
    }
}

/// A push on the push datagram socket (docs/downlink.md), from `client` (bound, so the node can answer it).
fn push_dgram(client: &UnixDatagram, socket: &Path, to: &str, body: &[u8]) {
    let mut datagram = format!("app=main&to={to}\n").into_bytes();
    datagram.extend_from_slice(body);
    client.send_to(&datagram, socket).unwrap();
    let mut answer = [0u8; 4096];
    let n = client.recv(&mut answer).unwrap();
    assert!(
        answer[..n].starts_with(b"200 "),
        "{}",
        String::from_utf8_lossy(&answer[..n])
    );
}

fn push_command(bin: &str, state: &Path, to: &str, body: &[u8]) {
    let mut child = Command::new(bin)
        .args(["push", "--app", "main", "--to", to, "--state"])
        .arg(state)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(body).unwrap();
    assert!(child.wait().unwrap().success());
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// A device listening on `main` on a thread of its own: each record handed over is sent, with when, on the
/// channel. Asks again every 5 s so its session stays live.
fn listening_device(
    id: Identity,
    node: &Node,
    stop: mpsc::Receiver<()>,
) -> mpsc::Receiver<(u64, Instant)> {
    let (tx, rx) = mpsc::channel();
    let mut link = UdpLink::connect(id, node.public, node.link).unwrap();
    link.listen("main", 0).unwrap();
    std::thread::spawn(move || {
        let mut asked = Instant::now();
        while stop.try_recv().is_err() {
            for r in link
                .receive(Instant::now() + Duration::from_millis(100))
                .unwrap()
            {
                tx.send((r.seq, Instant::now())).unwrap();
            }
            if asked.elapsed() > Duration::from_secs(5) {
                link.listen("main", 0).unwrap();
                asked = Instant::now();
            }
        }
    });
    rx
}

/// Median of `n` 4 KiB writes each followed by `fdatasync`, in `dir`.
fn fdatasync_ms(dir: &Path, n: usize) -> f64 {
    let mut f = std::fs::File::create(dir.join("fsync-probe")).unwrap();
    let block = [7u8; 4096];
    let mut v: Vec<f64> = (0..n)
        .map(|_| {
            let t = Instant::now();
            f.write_all(&block).unwrap();
            f.sync_data().unwrap();
            ms(t.elapsed())
        })
        .collect();
    percentile(&mut v, 0.5)
}

/// Median of `n` UDP round trips on loopback (an echo thread), back to back.
fn udp_rtt_ms(n: usize) -> f64 {
    let probe = RttProbe::start();
    let mut v: Vec<f64> = (0..n).map(|_| probe.once()).collect();
    percentile(&mut v, 0.5)
}

/// One commit as the node makes one (research/051): a SQLite transaction of one row in WAL mode
/// (`synchronous=NORMAL`), then `fdatasync` of its `-wal`. Taken one at a time at the pushes' pace, it says what
/// "one commit" costs in the setting the pushes meet; back to back ([`fdatasync_ms`]) the disk answers faster than
/// after an idle pause (research/051: 0.2 against 1.0 ms for the same writes on this VM).
struct CommitProbe {
    conn: rusqlite::Connection,
    wal: std::fs::File,
    k: i64,
}

impl CommitProbe {
    fn open(dir: &Path) -> Self {
        let path = dir.join("commit-probe.sqlite");
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.pragma_update(None, "journal_mode", "WAL").unwrap();
        conn.pragma_update(None, "synchronous", "NORMAL").unwrap();
        conn.execute_batch("CREATE TABLE t (k INTEGER PRIMARY KEY, v BLOB NOT NULL)")
            .unwrap();
        let wal = std::fs::File::open(dir.join("commit-probe.sqlite-wal")).unwrap();
        CommitProbe { conn, wal, k: 0 }
    }

    /// One commit, ms.
    fn once(&mut self) -> f64 {
        self.k += 1;
        let t = Instant::now();
        self.conn
            .execute(
                "INSERT INTO t (k, v) VALUES (?1, ?2)",
                rusqlite::params![self.k, [7u8; 32]],
            )
            .unwrap();
        self.wal.sync_data().unwrap();
        ms(t.elapsed())
    }
}

/// UDP round trips on loopback to an echo thread, one at a time: back to back ([`udp_rtt_ms`]) or at the pushes'
/// pace (research/051).
struct RttProbe {
    socket: UdpSocket,
}

impl RttProbe {
    fn start() -> Self {
        let echo = UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = echo.local_addr().unwrap();
        std::thread::spawn(move || {
            let mut b = [0u8; 1500];
            // Until the probe's socket is gone: its last datagram is a zero-length one.
            while let Ok((k, from)) = echo.recv_from(&mut b) {
                if k == 0 {
                    break;
                }
                let _ = echo.send_to(&b[..k], from);
            }
        });
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        socket.connect(addr).unwrap();
        RttProbe { socket }
    }

    /// One round trip of 100 bytes, ms.
    fn once(&self) -> f64 {
        let mut b = [0u8; 1500];
        let t = Instant::now();
        self.socket.send(&[1u8; 100]).unwrap();
        self.socket.recv(&mut b).unwrap();
        ms(t.elapsed())
    }
}

impl Drop for RttProbe {
    fn drop(&mut self) {
        let _ = self.socket.send(&[]);
    }
}

/// In `$TMPDIR` if set (research/046 ran `live` on tmpfs too), else `/tmp`.
fn one_device_dir(extra_apps: Option<&str>) -> (tempfile::TempDir, Identity, PathBuf, Vec<String>) {
    let dir =
        tempfile::tempdir_in(std::env::var_os("TMPDIR").unwrap_or_else(|| "/tmp".into())).unwrap();
    let id = Identity::generate();
    let senders = write_senders(dir.path(), std::slice::from_ref(&id));
    let mut extra = Vec::new();
    if let Some(apps) = extra_apps {
        let path = dir.path().join("apps.toml");
        std::fs::write(&path, apps).unwrap();
        extra = vec!["--apps".to_string(), path.display().to_string()];
    }
    (dir, id, senders, extra)
}

/// One uplink record `up K` queued and delivered: ms from its send to its stored ack.
fn one_stored_ack(uplink: &mut UdpLink, k: usize) -> f64 {
    uplink
        .sender()
        .queue("main", format!("up {k}").into_bytes())
        .unwrap();
    let t = Instant::now();
    let out = uplink.deliver(Some(Duration::from_secs(10))).unwrap();
    assert_eq!(out.unacked, 0);
    ms(t.elapsed())
}

/// 200 records, one at a time, from the device on a live run to `node`: each one's time to its stored ack, ms.
/// `pause`: how long the device waits after an ack before its next record (the pushes below wait 5 ms between
/// them; a loop left idle that long runs its next turn about three times slower, research/035).
fn uplink_stored_acks(id: &Identity, node: &Node, pause: Duration) -> Vec<f64> {
    let mut uplink = UdpLink::connect(id.clone(), node.public, node.link).unwrap();
    uplink.sender().open_flow("main", FlowStart::Probe).unwrap();
    uplink.deliver(Some(Duration::from_secs(10))).unwrap();
    (0..200)
        .map(|k| {
            let took = one_stored_ack(&mut uplink, k);
            std::thread::sleep(pause);
            took
        })
        .collect()
}

/// `listed`: senders in the node's senders file, the device first and the rest with keys of no device (a push finds
/// its sender by name among them: research/046).
fn part_live(a: &Args, listed: usize) {
    let (dir, id, senders, _) = one_device_dir(None);
    if listed > 1 {
        use std::fmt::Write as _;
        let mut text = std::fs::read_to_string(&senders).unwrap();
        for i in 1..listed {
            let key: [u8; 32] = pure_serve::proto::crypto::random_array();
            writeln!(text, "{} {}", name(i), encode_key(&key)).unwrap();
        }
        std::fs::write(&senders, text).unwrap();
    }
    let node = Node::start(&a.bin, &dir.path().join("state"), &senders, 0, &[]);
    // The node's own commit and round trip, the other way: one record at a time from the same device on a live run
    // → its stored ack (docs/protocol.md 5.3), on the same node and disk, before the downlink starts.
    // The node's commit time per turn in each phase (pure_commit_seconds_total over pure_turns_total): what a turn
    // of one record costs the loop beside a turn of one push and its read.
    let commit = |node: &Node| {
        (
            metric(node.http, "pure_commit_seconds_total"),
            metric(node.http, "pure_turns_total{outcome=\"committed\"}"),
        )
    };
    let per_turn_us = |a: (f64, f64), b: (f64, f64)| (b.0 - a.0) / (b.1 - a.1).max(1.0) * 1e6;
    let before_uplink = commit(&node);
    let mut stored_ack = uplink_stored_acks(&id, &node, Duration::ZERO);
    let uplink_turn_us = per_turn_us(before_uplink, commit(&node));
    // The same with the pushes' pause between records: the like-for-like "one commit plus one round trip".
    let before_paced = commit(&node);
    let mut paced_ack = uplink_stored_acks(&id, &node, Duration::from_millis(5));
    let paced_turn_us = per_turn_us(before_paced, commit(&node));
    let (stop_tx, stop_rx) = mpsc::channel();
    let handed = listening_device(id, &node, stop_rx);
    std::thread::sleep(Duration::from_millis(300));
    let socket = node.state.join("push.sock");
    let dgram = UnixDatagram::bind(dir.path().join("pusher.dgram")).unwrap();
    dgram
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let to = name(0);
    // `kept`: push over that connection; else `how` says: a connection per push ("socket"), or `pure-serve push`.
    let measure = |count: usize, how: &str, mut kept: Option<&mut KeptPusher>| {
        let mut total = Vec::new();
        let mut answered = Vec::new();
        for k in 0..count {
            let t = Instant::now();
            let body = format!("live {k}\n");
            if how == "socket" {
                push_http(&socket, &to, body.as_bytes());
            } else if how.starts_with("dgram") {
                push_dgram(&dgram, &node.state.join("push.dgram"), &to, body.as_bytes());
            } else if let Some(kept) = kept.as_mut() {
                kept.push(&to, body.as_bytes());
            } else {
                push_command(&a.bin, &node.state, &to, body.as_bytes());
            }
            answered.push(ms(t.elapsed()));
            let (_, at) = handed.recv_timeout(Duration::from_secs(30)).unwrap();
            total.push(ms(at.duration_since(t)));
            // `dgram-hot`: the next push at once, as the uplink's records go in `stored_ack`; else 5 ms apart, as in
            // `paced_ack`.
            if how != "dgram-hot" {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        (total, answered)
    };
    let (mut socket_total, mut socket_answer) = measure(200, "socket", None);
    let before_dgram = commit(&node);
    // A build without the datagram socket (an older one, run beside) is measured without it.
    let has_dgram = node.state.join("push.dgram").exists();
    let (mut dgram_total, mut dgram_answer) = if has_dgram {
        measure(200, "dgram", None)
    } else {
        (vec![f64::NAN], vec![f64::NAN])
    };
    let dgram_turn_us = per_turn_us(before_dgram, commit(&node));
    let (mut hot_total, _) = if has_dgram {
        measure(200, "dgram-hot", None)
    } else {
        (vec![f64::NAN], vec![f64::NAN])
    };
    let mut kept = KeptPusher::connect(&socket);
    let (mut kept_total, mut kept_answer) = measure(200, "kept", Some(&mut kept));
    let (mut cmd_total, mut cmd_answer) = measure(50, "command", None);
    let fsync = fdatasync_ms(&node.state, 200);
    let rtt = udp_rtt_ms(200);
    emit(
        a.round,
        "live",
        json!({
            "senders": listed,
            "socket_p50_ms": percentile(&mut socket_total, 0.5), "socket_p99_ms": percentile(&mut socket_total, 0.99),
            "socket_answer_p50_ms": percentile(&mut socket_answer, 0.5),
            "kept_p50_ms": percentile(&mut kept_total, 0.5), "kept_p99_ms": percentile(&mut kept_total, 0.99),
            "kept_answer_p50_ms": percentile(&mut kept_answer, 0.5),
            "kept_p50_over_uplink_stored_ack_p50":
                percentile(&mut kept_total, 0.5) / percentile(&mut stored_ack, 0.5),
            "dgram_p50_ms": percentile(&mut dgram_total, 0.5), "dgram_p99_ms": percentile(&mut dgram_total, 0.99),
            "dgram_answer_p50_ms": percentile(&mut dgram_answer, 0.5),
            "uplink_commit_us_per_turn": uplink_turn_us, "dgram_commit_us_per_turn": dgram_turn_us,
            "paced_uplink_commit_us_per_turn": paced_turn_us,
            "dgram_hot_p50_ms": percentile(&mut hot_total, 0.5), "dgram_hot_p99_ms": percentile(&mut hot_total, 0.99),
            "dgram_hot_p50_over_uplink_stored_ack_p50":
                percentile(&mut hot_total, 0.5) / percentile(&mut stored_ack, 0.5),
            "paced_uplink_stored_ack_p50_ms": percentile(&mut paced_ack, 0.5),
            "paced_uplink_stored_ack_p99_ms": percentile(&mut paced_ack, 0.99),
            "dgram_p50_over_paced_uplink_stored_ack_p50":
                percentile(&mut dgram_total, 0.5) / percentile(&mut paced_ack, 0.5),
            "socket_p50_over_paced_uplink_stored_ack_p50":
                percentile(&mut socket_total, 0.5) / percentile(&mut paced_ack, 0.5),
            "dgram_p50_over_uplink_stored_ack_p50":
                percentile(&mut dgram_total, 0.5) / percentile(&mut stored_ack, 0.5),
            "command_p50_ms": percentile(&mut cmd_total, 0.5), "command_p99_ms": percentile(&mut cmd_total, 0.99),
            "command_answer_p50_ms": percentile(&mut cmd_answer, 0.5),
            "fdatasync_p50_ms": fsync, "udp_rtt_p50_ms": rtt,
            "socket_p50_over_commit_plus_rtt": percentile(&mut socket_total, 0.5) / (fsync + rtt),
            "uplink_stored_ack_p50_ms": percentile(&mut stored_ack, 0.5),
            "uplink_stored_ack_p99_ms": percentile(&mut stored_ack, 0.99),
            "socket_p50_over_uplink_stored_ack_p50":
                percentile(&mut socket_total, 0.5) / percentile(&mut stored_ack, 0.5),
        }),
    );
    let _ = stop_tx.send(());
    node.stop(libc::SIGTERM);
}

/// research/046: push → program beside an uplink record → stored ack taken in the same seconds, so that both meet
/// the same disk (this machine's `fdatasync` went from 0.3 to 4 ms and back within a run when other work wrote).
/// One device listens (`dev0000000`), another sends (`dev0000001`), with `listed` senders in all; 200 times in
/// turn: one uplink record → its stored ack, a datagram push → the listener's program, an HTTP push (a connection
/// each) → the program, each 5 ms after the last. Ratios per neighbouring pair, and of the p50s.
fn part_live_mixed(a: &Args, listed: usize) {
    use std::fmt::Write as _;
    let dir =
        tempfile::tempdir_in(std::env::var_os("TMPDIR").unwrap_or_else(|| "/tmp".into())).unwrap();
    let ids = [Identity::generate(), Identity::generate()];
    let senders = write_senders(dir.path(), &ids);
    if listed > 2 {
        let mut text = std::fs::read_to_string(&senders).unwrap();
        for i in 2..listed {
            let key: [u8; 32] = pure_serve::proto::crypto::random_array();
            writeln!(text, "{} {}", name(i), encode_key(&key)).unwrap();
        }
        std::fs::write(&senders, text).unwrap();
    }
    let node = Node::start(&a.bin, &dir.path().join("state"), &senders, 0, &[]);
    let (stop_tx, stop_rx) = mpsc::channel();
    let handed = listening_device(ids[0].clone(), &node, stop_rx);
    let mut uplink = UdpLink::connect(ids[1].clone(), node.public, node.link).unwrap();
    uplink.sender().open_flow("main", FlowStart::Probe).unwrap();
    uplink.deliver(Some(Duration::from_secs(10))).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let socket = node.state.join("push.sock");
    let dgram_path = node.state.join("push.dgram");
    let dgram = UnixDatagram::bind(dir.path().join("pusher.dgram")).unwrap();
    dgram
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let to = name(0);
    let pause = Duration::from_millis(5);
    let (mut up, mut dg, mut http, mut kept) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut dg_pair, mut http_pair, mut kept_pair) = (Vec::new(), Vec::new(), Vec::new());
    // A pusher that keeps its connection: what an HTTP push costs without a connection of its own.
    let mut pusher = KeptPusher::connect(&socket);
    // One commit and one round trip taken in the same rounds, at the same pace (research/051).
    let mut commit_probe = CommitProbe::open(dir.path());
    let rtt_probe = RttProbe::start();
    let (mut commit, mut round_trip) = (Vec::new(), Vec::new());
    let cpu_before = process_cpu(node.pid());
    for k in 0..200 {
        let u = one_stored_ack(&mut uplink, k);
        std::thread::sleep(pause);
        let body = format!("mixed {k}\n");
        let t = Instant::now();
        push_dgram(&dgram, &dgram_path, &to, body.as_bytes());
        let (_, at) = handed.recv_timeout(Duration::from_secs(30)).unwrap();
        let d = ms(at.duration_since(t));
        std::thread::sleep(pause);
        let t = Instant::now();
        push_http(&socket, &to, body.as_bytes());
        let (_, at) = handed.recv_timeout(Duration::from_secs(30)).unwrap();
        let h = ms(at.duration_since(t));
        std::thread::sleep(pause);
        let t = Instant::now();
        pusher.push(&to, body.as_bytes());
        let (_, at) = handed.recv_timeout(Duration::from_secs(30)).unwrap();
        let kh = ms(at.duration_since(t));
        std::thread::sleep(pause);
        commit.push(commit_probe.once());
        std::thread::sleep(pause);
        round_trip.push(rtt_probe.once());
        std::thread::sleep(pause);
        kept.push(kh);
        kept_pair.push(kh / u);
        up.push(u);
        dg.push(d);
        http.push(h);
        dg_pair.push(d / u);
        http_pair.push(h / u);
    }
    // What the node spent on the part's 200 steps (three pushes and a record each, and the probes' idle pauses).
    let node_cpu_ms = ms(process_cpu(node.pid()) - cpu_before);
    let fsync = fdatasync_ms(&node.state, 200);
    let rtt = udp_rtt_ms(200);
    let (u50, d50, h50) = (
        percentile(&mut up, 0.5),
        percentile(&mut dg, 0.5),
        percentile(&mut http, 0.5),
    );
    let (commit50, rtt50) = (
        percentile(&mut commit, 0.5),
        percentile(&mut round_trip, 0.5),
    );
    emit(
        a.round,
        "live-mixed",
        json!({
            "senders": listed,
            "uplink_stored_ack_p50_ms": u50, "dgram_p50_ms": d50, "socket_p50_ms": h50,
            "dgram_p99_ms": percentile(&mut dg, 0.99), "socket_p99_ms": percentile(&mut http, 0.99),
            "dgram_p50_over_uplink_p50": d50 / u50, "socket_p50_over_uplink_p50": h50 / u50,
            "dgram_over_uplink_pair_p50": percentile(&mut dg_pair, 0.5),
            "socket_over_uplink_pair_p50": percentile(&mut http_pair, 0.5),
            "kept_p50_ms": percentile(&mut kept, 0.5),
            "kept_over_uplink_pair_p50": percentile(&mut kept_pair, 0.5),
            "fdatasync_p50_ms": fsync, "udp_rtt_p50_ms": rtt,
            "dgram_p50_over_commit_plus_rtt": d50 / (fsync + rtt),
            "commit_paced_p50_ms": commit50, "udp_rtt_paced_p50_ms": rtt50,
            "dgram_p50_over_paced_commit_plus_rtt": d50 / (commit50 + rtt50),
            "node_cpu_ms": node_cpu_ms,
        }),
    );
    let _ = stop_tx.send(());
    node.stop(libc::SIGTERM);
}

fn part_fleet(a: &Args) {
    let Some(cluster) = pg_util::PgCluster::start("bench downlink fleet") else {
        panic!("the fleet part needs PostgreSQL: apt-get install postgresql");
    };
    let (dir, id, senders, _) = one_device_dir(None);
    let key = dir.path().join("node.key");
    pure_serve::keys::write_new_identity(&key, &Identity::generate()).unwrap();
    let url = cluster.url();
    let extra = ["--key", key.to_str().unwrap(), "--store", &url];
    let na = Node::start(&a.bin, &dir.path().join("a"), &senders, 0, &extra);
    let nb = Node::start(&a.bin, &dir.path().join("b"), &senders, 0, &extra);
    // B's own commit and round trip, the other way, as in `live`.
    let mut stored_ack = uplink_stored_acks(&id, &nb, Duration::ZERO);
    let (stop_tx, stop_rx) = mpsc::channel();
    let handed = listening_device(id, &nb, stop_rx);
    std::thread::sleep(Duration::from_millis(300));
    let to = name(0);
    let (mut other, mut own) = (Vec::new(), Vec::new());
    for k in 0..400 {
        let via = if k % 2 == 0 { &na } else { &nb };
        let t = Instant::now();
        push_http(
            &via.state.join("push.sock"),
            &to,
            format!("fleet {k}\n").as_bytes(),
        );
        let (_, at) = handed.recv_timeout(Duration::from_secs(30)).unwrap();
        let took = ms(at.duration_since(t));
        if k % 2 == 0 {
            other.push(took);
        } else {
            own.push(took);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    // One commit of the database: an autocommitted one-row INSERT, from a client of the bench's own.
    let mut commit: Vec<f64> = pg_util::sql(&cluster.conninfo(), async |client| {
        client
            .batch_execute("CREATE TABLE commit_probe (x INTEGER)")
            .await
            .unwrap();
        let insert = client
            .prepare("INSERT INTO commit_probe VALUES (1)")
            .await
            .unwrap();
        let mut v = Vec::new();
        for _ in 0..200 {
            let t = Instant::now();
            client.execute(&insert, &[]).await.unwrap();
            v.push(ms(t.elapsed()));
        }
        v
    });
    let rtt = udp_rtt_ms(200);
    let (o50, n50) = (percentile(&mut other, 0.5), percentile(&mut own, 0.5));
    emit(
        a.round,
        "fleet",
        json!({
            "other_node_p50_ms": o50, "other_node_p99_ms": percentile(&mut other, 0.99),
            "own_node_p50_ms": n50, "own_node_p99_ms": percentile(&mut own, 0.99),
            "other_over_own_p50": o50 / n50,
            "uplink_stored_ack_p50_ms": percentile(&mut stored_ack, 0.5),
            "pg_commit_p50_ms": percentile(&mut commit, 0.5), "udp_rtt_p50_ms": rtt,
            "own_p50_over_uplink_stored_ack_p50": n50 / percentile(&mut stored_ack, 0.5),
        }),
    );
    let _ = stop_tx.send(());
    na.stop(libc::SIGTERM);
    nb.stop(libc::SIGTERM);
}

fn part_wake(a: &Args) {
    let (dir, id, senders, _) = one_device_dir(None);
    // The device sleeps between wakes: its session is swept (300 ms) long before the next one.
    let node = Node::start(
        &a.bin,
        &dir.path().join("state"),
        &senders,
        0,
        &["--link-idle-ms", "300"],
    );
    let every = Duration::from_secs(1);
    let pushes = 30;
    let (tx, rx) = mpsc::channel::<(u64, Instant)>();
    let (public, link) = (node.public, node.link);
    let device = std::thread::spawn(move || {
        let mut heard = 0;
        let mut next = Instant::now();
        while heard < pushes {
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
            next += every;
            let mut l = UdpLink::connect(id.clone(), public, link).unwrap();
            l.listen("main", heard).unwrap();
            l.deliver(Some(Duration::from_secs(5))).unwrap();
            for r in l.receive(Instant::now()).unwrap() {
                heard = r.seq;
                tx.send((r.seq, Instant::now())).unwrap();
            }
        }
    });
    let mut pushed_at = Vec::new();
    let mut lcg: u64 = 0x2545_f491_4f6c_dd1d ^ a.round;
    for k in 0..pushes {
        lcg = lcg
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let gap = 300 + (lcg >> 33) % 1400;
        std::thread::sleep(Duration::from_millis(gap));
        pushed_at.push(Instant::now());
        push_http(
            &node.state.join("push.sock"),
            &name(0),
            format!("wake {k}\n").as_bytes(),
        );
    }
    device.join().unwrap();
    let mut lat: Vec<f64> = rx
        .try_iter()
        .map(|(seq, at)| ms(at.duration_since(pushed_at[seq as usize - 1])))
        .collect();
    emit(
        a.round,
        "wake",
        json!({
            "every_s": every.as_secs_f64(), "records": lat.len(),
            "p50_ms": percentile(&mut lat, 0.5), "p99_ms": percentile(&mut lat, 0.99),
        }),
    );
    node.stop(libc::SIGTERM);
}

fn part_one(a: &Args) {
    let (dir, id, senders, extra) = one_device_dir(Some(
        "[apps.main]\n[apps.main.downlink]\nmax_records = 100000\nmax_bytes = 16777216\n",
    ));
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let node = Node::start(&a.bin, &dir.path().join("state"), &senders, 0, &extra);
    let records = 20_000;
    let payload = |k: usize| format!("{k:08}-{}", "r".repeat(23));
    for batch in 0..records / 1000 {
        let body: String = (batch * 1000..(batch + 1) * 1000)
            .map(|k| payload(k) + "\n")
            .collect();
        push_http(&node.state.join("push.sock"), &name(0), body.as_bytes());
    }
    let mut link = UdpLink::connect(id, node.public, node.link).unwrap();
    let t = Instant::now();
    link.listen("main", 0).unwrap();
    let mut got = 0;
    let mut in_order = true;
    while got < records && t.elapsed() < Duration::from_secs(300) {
        for r in link
            .receive(Instant::now() + Duration::from_secs(1))
            .unwrap()
        {
            in_order &= r.seq == got as u64 + 1 && r.payload == payload(got).into_bytes();
            got += 1;
        }
    }
    link.deliver(Some(Duration::from_secs(30))).unwrap();
    let took = t.elapsed();
    let answers = link.sender().stats().packets_received;
    emit(
        a.round,
        "one",
        json!({
            "records": got, "in_order": in_order, "payload_bytes": payload(0).len(), "seconds": took.as_secs_f64(),
            "records_per_s": got as f64 / took.as_secs_f64(), "node_packets": answers,
            "records_per_node_packet": got as f64 / answers.max(1) as f64,
            "turns": metric(node.http, "pure_turns_total{outcome=\"committed\"}"),
        }),
    );
    node.stop(libc::SIGTERM);
}

fn part_wide(a: &Args) {
    let n = 100_000;
    let dir = tempfile::tempdir_in("/tmp").unwrap();
    let ids = identities(n);
    let senders = write_senders(dir.path(), &ids);
    let port = free_udp_port();
    // Downlink: one record waiting for each, every device wakes and is handed it.
    let down = dir.path().join("down");
    Node::start(&a.bin, &down, &senders, port, &[]).stop(libc::SIGTERM);
    queue_in_store(&down, n);
    let node = Node::start(&a.bin, &down, &senders, port, &[]);
    let devices = par_map(n, |i| Device::new(i, &ids[i], &node.public, Some(0)));
    let t = Instant::now();
    let (done, _) = drive(devices, devices::SOCKETS, None, |_| node.link);
    let down_s = t.elapsed().as_secs_f64();
    let handed: u32 = done.iter().map(|d| d.handed).sum();
    let wrong: u32 = done.iter().map(|d| d.wrong).sum();
    let down_x25519 = metric(node.http, "pure_x25519_total");
    node.stop(libc::SIGTERM);
    // Uplink: the same devices, a fresh state (no memo), one record each from a new run.
    let up = dir.path().join("up");
    Node::start(&a.bin, &up, &senders, port, &[]).stop(libc::SIGTERM);
    let node = Node::start(&a.bin, &up, &senders, port, &[]);
    let devices = par_map(n, |i| Device::new(i, &ids[i], &node.public, None));
    let t = Instant::now();
    let (done_up, _) = drive(devices, devices::SOCKETS, None, |_| node.link);
    let up_s = t.elapsed().as_secs_f64();
    let stored = metric(node.http, "pure_records_stored_total{app=\"main\"}");
    emit(
        a.round,
        "wide",
        json!({
            "devices": n, "handed": handed, "wrong_payload": wrong, "down_s": down_s,
            "down_records_per_s": handed as f64 / down_s, "down_x25519": down_x25519,
            "up_devices_done": done_up.len(), "up_stored": stored, "up_s": up_s,
            "up_records_per_s": done_up.len() as f64 / up_s, "down_over_up": up_s / down_s,
        }),
    );
    node.stop(libc::SIGTERM);
}

fn part_name(a: &Args) {
    use pure_serve::proto::allow_list::AllowList;
    let n = 1_000_000;
    let entries: Vec<(String, [u8; 32])> = (0..n)
        .map(|i| (name(i), pure_serve::proto::crypto::random_array()))
        .collect();
    let keys: Vec<[u8; 32]> = entries.iter().map(|e| e.1).collect();
    let list = AllowList::from_unique(entries);
    let mut lcg: u64 = 88172645463325252 ^ a.round;
    let mut pick = || {
        lcg = lcg
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (lcg >> 33) as usize % n
    };
    let time = |f: &mut dyn FnMut() -> bool, count: usize| -> f64 {
        let t = Instant::now();
        let mut found = 0;
        for _ in 0..count {
            found += usize::from(f());
        }
        assert!(found == 0 || found == count);
        t.elapsed().as_secs_f64() * 1e6 / count as f64
    };
    let names: Vec<String> = (0..1000).map(|_| name(pick())).collect();
    let mut k = 0;
    let found_us = time(
        &mut || {
            k += 1;
            list.find_name(&names[k % names.len()]).is_some()
        },
        1000,
    );
    let missing_us = time(&mut || list.find_name("not-listed-anywhere").is_some(), 200);
    // research/046: the same lookups through the index by name, made here (its time and heap bytes).
    let t = Instant::now();
    let index_bytes = list.index_names().byte_len();
    let index_build_ms = t.elapsed().as_secs_f64() * 1e3;
    let mut k = 0;
    let indexed_found_us = time(
        &mut || {
            k += 1;
            list.find_name(&names[k % names.len()]).is_some()
        },
        100_000,
    );
    let indexed_missing_us = time(
        &mut || list.find_name("not-listed-anywhere").is_some(),
        100_000,
    );
    let mut k = 0;
    let by_key_us = time(
        &mut || {
            k += 1;
            list.find(&keys[(k * 7919) % n]).is_some()
        },
        100_000,
    );
    emit(
        a.round,
        "name",
        json!({
            "senders": n, "names_bytes": n * name(0).len(), "find_name_found_us": found_us,
            "find_name_missing_us": missing_us, "find_by_key_us": by_key_us,
            "index_build_ms": index_build_ms, "index_bytes": index_bytes,
            "index_bytes_per_sender": index_bytes as f64 / n as f64,
            "indexed_found_us": indexed_found_us, "indexed_missing_us": indexed_missing_us,
        }),
    );
}

// ---------------------------------------------------------------------------------------------------------------
// research/045: a firmware image (a file pushed as pieces, stored once) to devices of version 1.2 and 1.1, and
// the same file over HTTPS.

const IMAGE: usize = 1 << 20;
const PIECE: usize = 1024;
const IMAGE_APPS: &str =
    "[apps.main]\n[apps.main.downlink]\nmax_records = 100000\nmax_bytes = 16777216\n";
/// What a device of 1.2 takes in flight beyond what it was handed.
const DOWN_WINDOW: u64 = 64 * 1024;

fn image_bytes() -> Vec<u8> {
    (0..IMAGE).map(|i| (i * 31 % 251) as u8).collect()
}

/// A device taking the image from `heard + 1` on: checks each piece against the file, counts its datagrams.
struct ImageDevice {
    sender: Sender,
    image: std::sync::Arc<Vec<u8>>,
    first: u64,
    handed: usize,
    wrong: u32,
    sent: usize,
    received: usize,
    started: Instant,
    done: Option<Duration>,
    /// The longest wait between two pieces handed over, and after which piece it came.
    last_at: Instant,
    longest_gap: (Duration, usize),
}

impl ImageDevice {
    fn new(
        id: &Identity,
        node: &[u8; 32],
        heard: u64,
        window: u64,
        image: &std::sync::Arc<Vec<u8>>,
    ) -> Self {
        let mut sender = Sender::new(SenderConfig::new(id.clone(), *node)).unwrap();
        sender.set_down_window(window);
        sender.listen("main", heard).unwrap();
        ImageDevice {
            sender,
            image: image.clone(),
            first: heard + 1,
            handed: 0,
            wrong: 0,
            sent: 0,
            received: 0,
            started: Instant::now(),
            done: None,
            last_at: Instant::now(),
            longest_gap: (Duration::ZERO, 0),
        }
    }
    fn pieces(&self) -> usize {
        self.image.len().div_ceil(PIECE)
    }
}

impl Driven for ImageDevice {
    fn sender(&mut self) -> &mut Sender {
        &mut self.sender
    }
    fn event(&mut self, e: SenderEvent) {
        if let SenderEvent::Down { seq, payload, .. } = e {
            let k = (seq - self.first) as usize;
            let want = &self.image
                [(k * PIECE).min(self.image.len())..((k + 1) * PIECE).min(self.image.len())];
            if payload != want || k != self.handed {
                self.wrong += 1;
            }
            let gap = self.last_at.elapsed();
            if gap > self.longest_gap.0 {
                self.longest_gap = (gap, self.handed);
            }
            self.last_at = Instant::now();
            self.handed += 1;
            if self.handed == self.pieces() {
                self.done = Some(self.started.elapsed());
            }
        }
    }
    fn sent(&mut self, bytes: usize) {
        self.sent += bytes;
    }
    fn received(&mut self, bytes: usize) {
        self.received += bytes;
    }
}

fn push_file(bin: &str, state: &Path, file: &Path, to: &[&str]) {
    let mut c = Command::new(bin);
    c.args(["push", "--state"])
        .arg(state)
        .args(["--app", "main", "--file"])
        .arg(file);
    if to.is_empty() {
        c.arg("--to-all");
    } else {
        c.args(["--to", &to.join(",")]);
    }
    let out = c.output().unwrap();
    assert!(
        out.status.success(),
        "push --file: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// An HTTPS server of the files in `dir` (`openssl s_server -WWW`, TLS 1.3, a certificate made now), in `netns`.
fn https_server(dir: &Path, netns: Option<&str>, bind: &str) -> (Child, SocketAddr) {
    let status = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ])
        .args([
            "-subj",
            "/CN=bench",
            "-days",
            "1",
            "-keyout",
            "key.pem",
            "-out",
            "cert.pem",
        ])
        .current_dir(dir)
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    let port = free_udp_port();
    let mut c = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, "openssl"]);
            c
        }
        None => Command::new("openssl"),
    };
    let child = c
        .args([
            "s_server", "-WWW", "-quiet", "-cert", "cert.pem", "-key", "key.pem",
        ])
        .args(["-accept", &format!("{bind}:{port}")])
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let addr: SocketAddr = format!("{bind}:{port}").parse().unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(addr).is_err() {
        assert!(Instant::now() < until, "openssl s_server did not listen");
        std::thread::sleep(Duration::from_millis(20));
    }
    (child, addr)
}

/// One HTTPS fetch of `/image.bin` with curl: seconds, and whether every byte came.
fn https_fetch(addr: SocketAddr) -> (f64, bool) {
    let out = Command::new("curl")
        .args([
            "-sk",
            "--http1.1",
            "-o",
            "/dev/null",
            "-w",
            "%{time_total} %{size_download}",
        ])
        .arg(format!("https://{addr}/image.bin"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let mut it = text.split_whitespace();
    let secs: f64 = it.next().and_then(|s| s.parse().ok()).unwrap_or(f64::NAN);
    let size: usize = it
        .next()
        .and_then(|s| s.parse::<f64>().ok())
        .map_or(0, |s| s as usize);
    (secs, size == IMAGE)
}

/// A network namespace behind a veth pair (host 10.211.0.1, namespace 10.211.0.2) that drops `loss` percent of
/// packets each way at random (nftables `numgen`, since `tc netem` is not installed here). Removed on drop.
struct LossyPath;

impl LossyPath {
    fn new(loss: u32) -> LossyPath {
        let run = |args: &[&str]| {
            let st = Command::new(args[0]).args(&args[1..]).status().unwrap();
            assert!(st.success(), "{args:?}");
        };
        let _ = Command::new("ip").args(["netns", "del", "pimg"]).status();
        let _ = Command::new("ip")
            .args(["link", "del", "pimg0"])
            .stderr(Stdio::null())
            .status();
        run(&["ip", "netns", "add", "pimg"]);
        run(&[
            "ip", "link", "add", "pimg0", "type", "veth", "peer", "name", "pimg1",
        ]);
        run(&["ip", "link", "set", "pimg1", "netns", "pimg"]);
        run(&["ip", "addr", "add", "10.211.0.1/24", "dev", "pimg0"]);
        run(&["ip", "link", "set", "pimg0", "up"]);
        run(&[
            "ip",
            "netns",
            "exec",
            "pimg",
            "ip",
            "addr",
            "add",
            "10.211.0.2/24",
            "dev",
            "pimg1",
        ]);
        run(&[
            "ip", "netns", "exec", "pimg", "ip", "link", "set", "pimg1", "up",
        ]);
        run(&[
            "ip", "netns", "exec", "pimg", "ip", "link", "set", "lo", "up",
        ]);
        let rules = format!(
            "table inet loss {{\n chain i {{\n type filter hook input priority 0;\n iifname \"pimg1\" numgen random mod 100 < {loss} drop\n }}\n \
             chain o {{\n type filter hook output priority 0;\n oifname \"pimg1\" numgen random mod 100 < {loss} drop\n }}\n}}\n"
        );
        let mut nft = Command::new("ip")
            .args(["netns", "exec", "pimg", "nft", "-f", "-"])
            .stdin(Stdio::piped())
            .spawn()
            .unwrap();
        nft.stdin
            .take()
            .unwrap()
            .write_all(rules.as_bytes())
            .unwrap();
        assert!(nft.wait().unwrap().success());
        LossyPath
    }
}

impl Drop for LossyPath {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", "pimg"]).status();
    }
}

/// One device: the image with 1.2, with 1.1, and over HTTPS, interleaved (`loss`: through a lossy namespace).
fn part_image(a: &Args, loss: Option<u32>) {
    let part = if loss.is_some() {
        "image-lossy"
    } else {
        "image"
    };
    let _path = loss.map(LossyPath::new);
    let (netns, bind) = match loss {
        Some(_) => (Some("pimg"), "10.211.0.2"),
        None => (None, "127.0.0.1"),
    };
    let (dir, id, senders, extra) = one_device_dir(Some(IMAGE_APPS));
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let node = Node::start_in(
        netns,
        bind,
        &a.bin,
        &dir.path().join("state"),
        &senders,
        0,
        &extra,
    );
    let image = std::sync::Arc::new(image_bytes());
    let file = dir.path().join("image.bin");
    std::fs::write(&file, image.as_slice()).unwrap();
    let (mut server, https) = https_server(dir.path(), netns, bind);
    // The metrics listener of a node in a namespace is that namespace's loopback: not read from here.
    let node_metric = |name: &str| {
        if netns.is_some() {
            f64::NAN
        } else {
            metric(node.http, name)
        }
    };
    let mut heard = 0;
    let limit = Duration::from_secs(if loss.is_some() { 900 } else { 300 });
    for k in 0..6 {
        let order: [&str; 3] = if k % 2 == 0 {
            ["1.2", "1.1", "https"]
        } else {
            ["https", "1.1", "1.2"]
        };
        for how in order {
            if how == "https" {
                let (secs, whole) = https_fetch(https);
                emit(
                    a.round,
                    part,
                    json!({"how": how, "k": k, "seconds": secs, "whole": whole,
                    "mb_per_s": IMAGE as f64 / secs / 1e6}),
                );
                continue;
            }
            push_file(&a.bin, &node.state, &file, &[&name(0)]);
            let window = if how == "1.2" { DOWN_WINDOW } else { 0 };
            let device = ImageDevice::new(&id, &node.public, heard, window, &image);
            let pieces = device.pieces();
            let t = Instant::now();
            let (mut done, rest) = drive(vec![device], 1, None, |_| node.link);
            let took = t.elapsed();
            assert!(rest.is_empty() && took < limit);
            let d = done.pop().unwrap();
            assert_eq!(
                (d.handed, d.wrong),
                (pieces, 0),
                "{how}: every piece once, in order"
            );
            heard += pieces as u64;
            let secs = d.done.unwrap_or(took).as_secs_f64();
            emit(
                a.round,
                part,
                json!({"how": how, "k": k, "seconds": secs, "whole": true,
                "mb_per_s": IMAGE as f64 / secs / 1e6, "device_sent": d.sent, "device_received": d.received,
                "sent_over_received": d.sent as f64 / d.received.max(1) as f64,
                "wide": d.sender.wide(), "node_packets": d.sender.stats().packets_received,
                "longest_gap_ms": ms(d.longest_gap.0), "longest_gap_after": d.longest_gap.1,
                "node_windows_lost_so_far": node_metric("pure_downlink_windows_lost_total"),
                "node_wide_datagrams_so_far": node_metric("pure_downlink_wide_datagrams_total"),
                "node_turns_so_far": node_metric("pure_turns_total{outcome=\"committed\"}")}),
            );
        }
    }
    let _ = server.kill();
    let _ = server.wait();
    node.stop(libc::SIGTERM);
}

fn raise_open_files(n: u64) {
    let lim = libc::rlimit {
        rlim_cur: n,
        rlim_max: n,
    };
    // SAFETY: setrlimit with a valid struct.
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
}

/// Samples a process's anonymous memory every 100 ms until `stop`: the largest, kB.
fn peak_anon(
    pid: u32,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut peak = 0;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            peak = peak.max(proc_kb(pid, "RssAnon:"));
            std::thread::sleep(Duration::from_millis(100));
        }
        peak
    })
}

/// `n` devices of 1.2 take the image at once: time, the node's memory, fairness.
fn part_image_many(a: &Args, n: usize) {
    raise_open_files(n as u64 + 4096);
    let dir = tempfile::tempdir_in("/tmp").unwrap();
    let ids = identities(n);
    let senders = write_senders(dir.path(), &ids);
    let apps = dir.path().join("apps.toml");
    std::fs::write(&apps, IMAGE_APPS).unwrap();
    let apps = apps.display().to_string();
    let node = Node::start(
        &a.bin,
        &dir.path().join("state"),
        &senders,
        0,
        &["--apps", &apps],
    );
    let image = std::sync::Arc::new(image_bytes());
    let file = dir.path().join("image.bin");
    std::fs::write(&file, image.as_slice()).unwrap();
    let t = Instant::now();
    push_file(&a.bin, &node.state, &file, &[]);
    let push_s = t.elapsed().as_secs_f64();
    let store_mb = ["apps/main.sqlite", "apps/main.sqlite-wal"]
        .iter()
        .map(|f| std::fs::metadata(node.state.join(f)).map_or(0, |m| m.len()))
        .sum::<u64>() as f64
        / 1e6;
    let rest_kb = proc_kb(node.pid(), "RssAnon:");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = peak_anon(node.pid(), stop.clone());
    let devices = par_map(n, |i| {
        ImageDevice::new(&ids[i], &node.public, 0, DOWN_WINDOW, &image)
    });
    let t = Instant::now();
    let (done, rest) = drive(devices, n, None, |_| node.link);
    let took = t.elapsed().as_secs_f64();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let peak_kb = sampler.join().unwrap();
    assert!(rest.is_empty());
    let wrong: u32 = done.iter().map(|d| d.wrong).sum();
    let whole = done.iter().filter(|d| d.handed == d.pieces()).count();
    let mut times: Vec<f64> = done
        .iter()
        .map(|d| d.done.map_or(f64::NAN, |t| t.as_secs_f64()))
        .collect();
    let rates: Vec<f64> = times.iter().map(|t| IMAGE as f64 / t).collect();
    let jain = rates.iter().sum::<f64>().powi(2)
        / (rates.len() as f64 * rates.iter().map(|r| r * r).sum::<f64>());
    let sent: usize = done.iter().map(|d| d.sent).sum();
    let received: usize = done.iter().map(|d| d.received).sum();
    emit(
        a.round,
        "image-many",
        json!({
            "devices": n, "whole": whole, "wrong": wrong, "push_s": push_s, "store_mb": store_mb, "seconds": took,
            "mb_per_s": (n * IMAGE) as f64 / took / 1e6, "rest_anon_mb": rest_kb as f64 / 1e3,
            "peak_anon_above_rest_mb": (peak_kb.saturating_sub(rest_kb)) as f64 / 1e3,
            "done_p10_s": percentile(&mut times, 0.1), "done_p50_s": percentile(&mut times, 0.5),
            "done_p90_s": percentile(&mut times, 0.9), "done_max_s": percentile(&mut times, 1.0), "jain": jain,
            "sent_over_received": sent as f64 / received.max(1) as f64,
        }),
    );
    node.stop(libc::SIGTERM);
}

/// What an update of 1,000 devices costs another device's uplink: its stored-ack latency beside it and without it.
fn part_image_uplink(a: &Args) {
    let n = 1000;
    raise_open_files(n as u64 + 4096);
    let dir = tempfile::tempdir_in("/tmp").unwrap();
    let ids = identities(n + 1);
    let senders = write_senders(dir.path(), &ids);
    let apps = dir.path().join("apps.toml");
    std::fs::write(&apps, IMAGE_APPS).unwrap();
    let apps = apps.display().to_string();
    let node = Node::start(
        &a.bin,
        &dir.path().join("state"),
        &senders,
        0,
        &["--apps", &apps],
    );
    let image = std::sync::Arc::new(image_bytes());
    let file = dir.path().join("image.bin");
    std::fs::write(&file, image.as_slice()).unwrap();
    let names: Vec<String> = (0..n).map(name).collect();
    let to: Vec<&str> = names.iter().map(String::as_str).collect();
    for k in 0..3 {
        let mut alone = uplink_stored_acks(&ids[n], &node, Duration::from_millis(5));
        push_file(&a.bin, &node.state, &file, &to);
        let heard = (k * image.len().div_ceil(PIECE)) as u64;
        let devices = par_map(n, |i| {
            ImageDevice::new(&ids[i], &node.public, heard, DOWN_WINDOW, &image)
        });
        let link = node.link;
        let update = std::thread::spawn(move || {
            let t = Instant::now();
            let (done, _) = drive(devices, n, None, |_| link);
            (
                t.elapsed().as_secs_f64(),
                done.iter().filter(|d| d.handed == d.pieces()).count(),
            )
        });
        std::thread::sleep(Duration::from_millis(500));
        let mut beside = uplink_stored_acks(&ids[n], &node, Duration::from_millis(5));
        let (update_s, whole) = update.join().unwrap();
        emit(
            a.round,
            "image-uplink",
            json!({
                "k": k, "devices": n, "whole": whole, "update_s": update_s,
                "alone_p50_ms": percentile(&mut alone, 0.5), "alone_p99_ms": percentile(&mut alone, 0.99),
                "beside_p50_ms": percentile(&mut beside, 0.5), "beside_p99_ms": percentile(&mut beside, 0.99),
            }),
        );
    }
    node.stop(libc::SIGTERM);
}

/// research/043's push of many on a fleet's database beside the same push on one node's files (issue 39 item 1,
/// "on a fleet too"): 100,000 lines (or `--senders N`), one record each, through `pure-serve push --many`,
/// interleaved.
fn part_many_fleet(a: &Args) {
    let n = a.senders.first().copied().unwrap_or(100_000);
    let Some(cluster) = pg_util::PgCluster::start("bench downlink many-fleet") else {
        panic!("the many-fleet part needs PostgreSQL: apt-get install postgresql");
    };
    let dir = tempfile::tempdir_in("/tmp").unwrap();
    let ids = identities(n);
    let senders = write_senders(dir.path(), &ids);
    let key = dir.path().join("node.key");
    pure_serve::keys::write_new_identity(&key, &Identity::generate()).unwrap();
    let url = cluster.url();
    let fleet = Node::start(
        &a.bin,
        &dir.path().join("fleet"),
        &senders,
        0,
        &["--key", key.to_str().unwrap(), "--store", &url],
    );
    let one = Node::start(&a.bin, &dir.path().join("one"), &senders, 0, &[]);
    let body: String = (0..n)
        .map(|i| format!("{} interval=300\n", name(i)))
        .collect();
    for k in 0..3 {
        let order = if k % 2 == 0 {
            [("fleet", &fleet), ("one", &one)]
        } else {
            [("one", &one), ("fleet", &fleet)]
        };
        for (how, node) in order {
            let t = Instant::now();
            let mut child = Command::new(&a.bin)
                .args(["push", "--many", "--app", "main", "--state"])
                .arg(&node.state)
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            child
                .stdin
                .take()
                .unwrap()
                .write_all(body.as_bytes())
                .unwrap();
            let out = child.wait_with_output().unwrap();
            let secs = t.elapsed().as_secs_f64();
            assert!(
                out.status.success(),
                "{how}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            emit(
                a.round,
                "many-fleet",
                json!({"how": how, "k": k, "lines": n, "seconds": secs,
                "lines_per_s": n as f64 / secs}),
            );
        }
    }
    fleet.stop(libc::SIGTERM);
    one.stop(libc::SIGTERM);
}

fn main() {
    let a = args();
    let want = |p: &str| a.only.is_empty() || a.only.iter().any(|o| o == p);
    if want("name") {
        part_name(&a);
    }
    if want("live") {
        // `--senders N` with `live`: the device among N listed senders (research/046), once for each N.
        if !a.senders_given {
            part_live(&a, 1);
        } else {
            for &n in &a.senders {
                part_live(&a, n);
            }
        }
    }
    if a.only.iter().any(|o| o == "live-mixed") {
        if !a.senders_given {
            part_live_mixed(&a, 2);
        } else {
            for &n in &a.senders {
                part_live_mixed(&a, n);
            }
        }
    }
    if want("fleet") {
        part_fleet(&a);
    }
    if want("wake") {
        part_wake(&a);
    }
    if want("one") {
        part_one(&a);
    }
    if want("wide") {
        part_wide(&a);
    }
    if want("image") {
        part_image(&a, None);
    }
    if want("image-lossy") {
        part_image(&a, Some(2));
    }
    if want("image-many") {
        for &n in &a.devices {
            part_image_many(&a, n);
        }
    }
    if want("many-fleet") {
        part_many_fleet(&a);
    }
    if want("image-uplink") {
        part_image_uplink(&a);
    }
    if want("idle") {
        for &n in &a.senders {
            part_idle(&a, n);
        }
    }
}
