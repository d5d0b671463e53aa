//! research/003-first-packet-latency: an idle link's first packet → stored ack, beside a quinn new connection
//! (and a 0-RTT resumption) in the same process and the same minutes, on loopback.
//!
//! One round (one process) interleaves the variants sample by sample, in a new random order for every set of
//! samples (seeded by the round), so a slow minute of the shared disk or CPU falls on all of them alike and no
//! variant always follows the same one:
//!
//! - `ours/known`: an allowed sender the node has in its memo (0 X25519 on the node) wakes after its session was
//!   swept: a new run (new `UdpLink`, new run id, sender X25519 done before the clock starts) sends one 40-byte
//!   record at its known sequence (`FlowStart::At`); the clock runs from just before the first send to the Stored
//!   event.
//! - `ours/known+setup`: the same, with the clock started before `UdpLink::connect` (socket, the sender's X25519,
//!   HKDF): what a device pays if it computes its shared secret at wake instead of once per boot.
//! - `ours/new`: an allowed sender the node has never seen (1 X25519 on the node), otherwise as `ours/known`.
//! - `quinn/new`: a new quinn `Endpoint` (made before the clock) connects with a full TLS 1.3 handshake (1-RTT),
//!   opens a bidirectional stream, sends one 40-byte record; the server reads it and answers 1 byte ("stored",
//!   though nothing is stored); the clock stops when the client has read the answer.
//! - `quinn/0rtt`: the same with TLS session resumption and 0-RTT data (`into_0rtt`); a sample that could not use
//!   0-RTT (no ticket yet) is counted as a fallback and not timed.
//! - `machine/udp_rtt`: one 96-byte UDP datagram to an echo thread and back (two thread wakes, no crypto, no store).
//! - `machine/udp_commit_rtt`: the same, but the echo thread commits one row (as below) before it answers: the
//!   floor of any design that answers "stored" one round trip after a durable commit.
//! - `machine/sqlite_commit`: one row committed in a WAL database with `synchronous=FULL` (the fsync), on the same
//!   file system as the node's store.
//! - `machine/x25519`: one x25519-dalek Diffie-Hellman.
//!
//! Every sample, of every variant, starts after the same quiet gap (`--gap-ms`, default 20): on this VM an fsync
//! after a quiet spell costs about twice one right after another, and a sleeping vCPU wakes more slowly, so a
//! variant that happened to follow a busy one would look faster than it is.
//!
//! The node is the real receive loop (`ReadyNode::run`) on a thread of this process, with `idle` sessions swept
//! (`--link-idle-ms`); the quinn server runs on a tokio current-thread runtime on another thread; the clients of
//! both run on the main thread. Prints one JSON object per variant (with its raw samples) and one of counters.
//!
//! Usage: cargo bench --bench first_packet -- [--round R] [--samples N] [--warmup W] [--idle-ms MS] [--gap-ms MS]
//!        cargo bench --bench first_packet -- --phases [--samples N] [--gap-ms MS]

use std::net::{SocketAddr, UdpSocket};
use std::path::Path;
use std::sync::Arc;

use std::time::{Duration, Instant};

use pure_serve::proto::allow_list::AllowList;
use pure_serve::proto::crypto::Identity;
use pure_serve::proto::node::{Node, NodeConfig};
use pure_serve::proto::sender::{Sender, SenderConfig};
use pure_serve::receive::LocalNode;
use pure_serve::sender::{FlowStart, SenderEvent, UdpLink};
use pure_serve::store::Stores;
use pure_serve::store::memo::Memo;

const APP: &str = "main";
const RECORD: usize = 40;
/// Known senders the `ours/known*` samples take turns with, so each is quiet long enough to be swept.
const KNOWN: usize = 48;

struct Args {
    round: u32,
    samples: usize,
    warmup: usize,
    idle: Duration,
    gap: Duration,
    phases: bool,
}

fn args() -> Args {
    let mut a = Args {
        round: 0,
        samples: 250,
        warmup: 10,
        idle: Duration::from_millis(100),
        gap: Duration::from_millis(20),
        phases: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut num = || -> u64 { it.next().and_then(|v| v.parse().ok()).expect("a number") };
        match arg.as_str() {
            "--round" => a.round = num() as u32,
            "--samples" => a.samples = num() as usize,
            "--warmup" => a.warmup = num() as usize,
            "--idle-ms" => a.idle = Duration::from_millis(num()),
            "--gap-ms" => a.gap = Duration::from_millis(num()),
            "--phases" => a.phases = true,
            "--bench" => {}
            other => panic!("unknown argument {other}"),
        }
    }
    a
}

fn record(tag: u64) -> Vec<u8> {
    let mut p = format!("record {tag}").into_bytes();
    p.resize(RECORD, b'.');
    p
}

// ---------------------------------------------------------------------------------------------------------------
// Our node, in process

fn start_node(dir: &Path, listed: &[&Identity], idle: Duration) -> LocalNode {
    let listed: Vec<(String, [u8; 32])> = listed
        .iter()
        .enumerate()
        .map(|(i, id)| (format!("dev-{i}"), *id.public()))
        .collect();
    LocalNode::start(dir, &listed, idle, 2 << 20).expect("node")
}

fn ours_sample(id: &Identity, node: &LocalNode, seq: u64) -> (Duration, Duration) {
    let id = id.clone();
    let payload = record(seq);
    let setup = Instant::now();
    let mut link = UdpLink::connect(id, node.public, node.addr).expect("link");
    link.sender()
        .open_flow(APP, FlowStart::At(seq))
        .expect("flow");
    link.sender().queue(APP, payload).expect("queue");
    let t = Instant::now();
    let mut at = None;
    let o = link
        .deliver_with(Some(Duration::from_secs(5)), |e| {
            if at.is_none() && matches!(e, SenderEvent::Stored { .. }) {
                at = Some(Instant::now());
            }
        })
        .expect("deliver");
    assert_eq!(o.unacked, 0, "record {seq} acked");
    let at = at.expect("a Stored event");
    (at - t, at - setup)
}

// ---------------------------------------------------------------------------------------------------------------
// quinn

struct Quinn {
    addr: SocketAddr,
    /// No resumption: every connection is a full handshake.
    fresh: quinn::ClientConfig,
    /// Resumption and early data: a connection after the first can send its record in 0-RTT.
    resuming: quinn::ClientConfig,
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Starts the quinn server on its own thread (a current-thread tokio runtime), with a self-signed certificate.
fn start_quinn() -> Quinn {
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).expect("cert");
    let cert_der = cert.cert.der().clone();
    let key_der = rustls::pki_types::PrivateKeyDer::Pkcs8(
        rustls::pki_types::PrivatePkcs8KeyDer::from(cert.signing_key.serialize_der()),
    );
    let mut server_tls = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("tls 1.3")
        .with_no_client_auth()
        .with_single_cert(vec![cert_der.clone()], key_der)
        .expect("server cert");
    // QUIC's 0-RTT needs this exact value (RFC 9001 4.6.1); quinn refuses anything else.
    server_tls.max_early_data_size = u32::MAX;
    let server_config = quinn::ServerConfig::with_crypto(Arc::new(
        quinn::crypto::rustls::QuicServerConfig::try_from(server_tls).expect("quic server"),
    ));

    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert_der).expect("root");
    let client_tls = |resume: bool| {
        let mut c = rustls::ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .expect("tls 1.3")
            .with_root_certificates(roots.clone())
            .with_no_client_auth();
        if resume {
            c.enable_early_data = true;
        } else {
            c.resumption = rustls::client::Resumption::disabled();
        }
        quinn::ClientConfig::new(Arc::new(
            quinn::crypto::rustls::QuicClientConfig::try_from(c).expect("quic client"),
        ))
    };

    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("quinn-server".into())
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let endpoint =
                    quinn::Endpoint::server(server_config, "127.0.0.1:0".parse().expect("literal"))
                        .expect("server endpoint");
                tx.send(endpoint.local_addr().expect("addr"))
                    .expect("send addr");
                while let Some(incoming) = endpoint.accept().await {
                    tokio::spawn(async move {
                        if let Err(e) = serve(incoming).await {
                            eprintln!("quinn server: {e}");
                        }
                    });
                }
            });
        })
        .expect("thread");
    Quinn {
        addr: rx.recv().expect("server address"),
        fresh: client_tls(false),
        resuming: client_tls(true),
    }
}

/// Reads one record on the first stream and answers one byte, in 0.5-RTT when the client sent 0-RTT.
async fn serve(incoming: quinn::Incoming) -> Result<(), Box<dyn std::error::Error>> {
    let connecting = incoming.accept()?;
    let conn = match connecting.into_0rtt() {
        Ok((conn, _)) => conn,
        Err(connecting) => connecting.await?,
    };
    let (mut send, mut recv) = conn.accept_bi().await?;
    let mut rec = [0u8; RECORD];
    recv.read_exact(&mut rec).await?;
    send.write_all(&[1]).await?;
    send.finish()?;
    conn.closed().await;
    Ok(())
}

enum QuinnOutcome {
    Timed(Duration),
    /// 0-RTT was asked for but the client had no ticket: a full handshake was done instead, not timed.
    Fallback,
    Failed(String),
}

/// One quinn sample on a new endpoint. The endpoint (a socket) is made before the clock starts, like our
/// `UdpLink`; the clock covers connect, stream, record, answer.
async fn quinn_sample(q: &Quinn, zero_rtt: bool) -> QuinnOutcome {
    let endpoint =
        quinn::Endpoint::client("127.0.0.1:0".parse().expect("literal")).expect("client endpoint");
    let cfg = if zero_rtt { &q.resuming } else { &q.fresh };
    let rec = record(0);
    let t = Instant::now();
    let result: Result<(Duration, bool), Box<dyn std::error::Error>> = async {
        let connecting = endpoint.connect_with(cfg.clone(), q.addr, "localhost")?;
        let (conn, accepted, used_0rtt) = if zero_rtt {
            match connecting.into_0rtt() {
                Ok((conn, accepted)) => (conn, Some(accepted), true),
                Err(connecting) => (connecting.await?, None, false),
            }
        } else {
            (connecting.await?, None, false)
        };
        let (mut send, mut recv) = conn.open_bi().await?;
        send.write_all(&rec).await?;
        send.finish()?;
        let mut answer = [0u8; 1];
        recv.read_exact(&mut answer).await?;
        let took = t.elapsed();
        if let Some(accepted) = accepted {
            if !accepted.await {
                return Err("0-RTT rejected".into());
            }
            // Let the server's session tickets arrive (sent when it sees our Finished) for the next sample.
            tokio::time::sleep(Duration::from_millis(3)).await;
        }
        conn.close(0u32.into(), b"done");
        Ok((took, used_0rtt))
    }
    .await;
    // Outside the clock: let the close go out and the connection drain, so no timer of this sample runs
    // during the next one.
    let _ = tokio::time::timeout(Duration::from_millis(300), endpoint.wait_idle()).await;
    match result {
        Ok((took, used)) if used || !zero_rtt => QuinnOutcome::Timed(took),
        Ok(_) => QuinnOutcome::Fallback,
        Err(e) => QuinnOutcome::Failed(e.to_string()),
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Machine limits

/// An echo thread; a datagram whose first byte is 1 is answered only after one row is committed (`db`).
fn start_echo(db: rusqlite::Connection) -> SocketAddr {
    let s = UdpSocket::bind("127.0.0.1:0").expect("echo socket");
    let addr = s.local_addr().expect("addr");
    std::thread::Builder::new()
        .name("udp-echo".into())
        .spawn(move || {
            let mut buf = [0u8; 2048];
            let mut i = 0;
            while let Ok((n, from)) = s.recv_from(&mut buf) {
                if buf[0] == 1 {
                    i += 1;
                    sqlite_commit(&db, i);
                }
                let _ = s.send_to(&buf[..n], from);
            }
        })
        .expect("thread");
    addr
}

fn udp_rtt(sock: &UdpSocket, commit: bool) -> Duration {
    let mut out = [0x11u8; 96];
    out[0] = commit as u8;
    let mut buf = [0u8; 2048];
    let t = Instant::now();
    sock.send(&out).expect("send");
    sock.recv(&mut buf).expect("echo");
    t.elapsed()
}

fn sqlite_commit_db(path: &Path) -> rusqlite::Connection {
    let conn = rusqlite::Connection::open(path).expect("db");
    conn.pragma_update(None, "journal_mode", "WAL")
        .expect("wal");
    conn.pragma_update(None, "synchronous", "FULL")
        .expect("full");
    conn.execute_batch("CREATE TABLE r (id INTEGER PRIMARY KEY, v BLOB NOT NULL);")
        .expect("table");
    conn
}

fn sqlite_commit(conn: &rusqlite::Connection, i: u64) -> Duration {
    let v = record(i);
    let t = Instant::now();
    conn.execute("INSERT INTO r (v) VALUES (?1)", [&v])
        .expect("insert");
    t.elapsed()
}

fn x25519_once(a: &x25519_dalek::StaticSecret, b: &x25519_dalek::PublicKey) -> Duration {
    let t = Instant::now();
    let s = a.diffie_hellman(b);
    let took = t.elapsed();
    std::hint::black_box(s.as_bytes());
    took
}

// ---------------------------------------------------------------------------------------------------------------

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Variant {
    OursKnown,
    OursKnownSetup,
    OursNew,
    QuinnNew,
    Quinn0Rtt,
    UdpRtt,
    UdpCommitRtt,
    SqliteCommit,
    X25519,
}

const ALL: [Variant; 9] = [
    Variant::OursKnown,
    Variant::QuinnNew,
    Variant::OursNew,
    Variant::Quinn0Rtt,
    Variant::OursKnownSetup,
    Variant::UdpRtt,
    Variant::SqliteCommit,
    Variant::UdpCommitRtt,
    Variant::X25519,
];

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::OursKnown => "ours/known",
            Variant::OursKnownSetup => "ours/known+setup",
            Variant::OursNew => "ours/new",
            Variant::QuinnNew => "quinn/new",
            Variant::Quinn0Rtt => "quinn/0rtt",
            Variant::UdpRtt => "machine/udp_rtt",
            Variant::UdpCommitRtt => "machine/udp_commit_rtt",
            Variant::SqliteCommit => "machine/sqlite_commit",
            Variant::X25519 => "machine/x25519",
        }
    }
}

fn pct(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[(((sorted.len() - 1) as f64) * p).round() as usize].as_secs_f64() * 1e3
}

fn emit(round: u32, name: &str, samples: &[Duration], extra: &str) {
    let mut s = samples.to_vec();
    s.sort();
    let mean = s.iter().map(Duration::as_secs_f64).sum::<f64>() / s.len().max(1) as f64 * 1e3;
    let raw: Vec<String> = samples
        .iter()
        .map(|d| format!("{:.1}", d.as_secs_f64() * 1e6))
        .collect();
    println!(
        "{{\"bench\":\"first_packet\",\"round\":{round},\"variant\":\"{name}\",\"n\":{},\"p50_ms\":{:.4},\"p99_ms\":{:.4},\"mean_ms\":{mean:.4},\"min_ms\":{:.4},\"max_ms\":{:.4}{extra},\"samples_us\":[{}]}}",
        s.len(),
        pct(&s, 0.5),
        pct(&s, 0.99),
        pct(&s, 0.0),
        pct(&s, 1.0),
        raw.join(",")
    );
}

/// Fisher–Yates with xorshift64: a fresh order of the variants for every set of samples.
fn shuffle(v: &mut [Variant], state: &mut u64) {
    for i in (1..v.len()).rev() {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        v.swap(i, (*state % (i as u64 + 1)) as usize);
    }
}

fn main() {
    let a = args();
    if a.phases {
        return phases(&a);
    }
    let started = Instant::now();
    // Quiet long enough that the sender's last session was swept: idle plus two sweep intervals (idle/4, at least
    // 10 ms) and a margin.
    let quiet =
        a.idle + 2 * (a.idle / 4).max(Duration::from_millis(10)) + Duration::from_millis(20);
    let n_new = a.samples + a.warmup;
    eprintln!(
        "first_packet round {}: {} samples (+{} warm-up) per variant, idle {:?}, quiet {:?}",
        a.round, a.samples, a.warmup, a.idle, quiet
    );
    let known: Vec<Identity> = (0..KNOWN).map(|_| Identity::generate()).collect();
    let fresh: Vec<Identity> = (0..n_new).map(|_| Identity::generate()).collect();
    // The node's state lives on the same file system as the commit probe (TMPDIR; run.sh keeps it on disk).
    let dir = tempfile::tempdir().expect("tempdir");
    let listed: Vec<&Identity> = known.iter().chain(fresh.iter()).collect();
    let node = start_node(dir.path(), &listed, a.idle);
    let q = start_quinn();
    let echo = start_echo(sqlite_commit_db(&dir.path().join("echo.sqlite")));
    let echo_sock = UdpSocket::bind("127.0.0.1:0").expect("socket");
    echo_sock.connect(echo).expect("connect");
    let db = sqlite_commit_db(&dir.path().join("commit.sqlite"));
    let dh_a = x25519_dalek::StaticSecret::random();
    let dh_b = x25519_dalek::PublicKey::from(&x25519_dalek::StaticSecret::random());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");

    // First contact of every known sender: the node computes its secret once and keeps it in the memo.
    let mut next_seq = vec![1u64; KNOWN];
    let mut last_sent = vec![Instant::now(); KNOWN];
    let mut first_contact = Vec::with_capacity(KNOWN);
    for i in 0..KNOWN {
        std::thread::sleep(a.gap);
        first_contact.push(ours_sample(&known[i], &node, next_seq[i]).0);
        next_seq[i] += 1;
        last_sent[i] = Instant::now();
    }
    let mut k = 0usize;
    let mut next_known = || {
        let i = k % KNOWN;
        k += 1;
        i
    };
    let mut fresh_iter = fresh.iter();

    let mut order: Vec<Variant> = ALL.to_vec();
    let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ u64::from(a.round);
    let mut samples: Vec<Vec<Duration>> = vec![Vec::with_capacity(a.samples); ALL.len()];
    let mut setup_cost: Vec<Duration> = Vec::with_capacity(a.samples);
    let (mut fallbacks, mut failures) = (0u64, 0u64);
    let mut slept = Duration::ZERO;
    for it in 0..n_new {
        let keep = it >= a.warmup;
        shuffle(&mut order, &mut rng);
        for &v in &order {
            std::thread::sleep(a.gap);
            let took = match v {
                Variant::OursKnown | Variant::OursKnownSetup => {
                    let i = next_known();
                    let since = last_sent[i].elapsed();
                    if since < quiet {
                        slept += quiet - since;
                        std::thread::sleep(quiet - since);
                    }
                    let (first_send, with_setup) = ours_sample(&known[i], &node, next_seq[i]);
                    next_seq[i] += 1;
                    last_sent[i] = Instant::now();
                    if v == Variant::OursKnown {
                        if keep {
                            setup_cost.push(with_setup - first_send);
                        }
                        Some(first_send)
                    } else {
                        Some(with_setup)
                    }
                }
                Variant::OursNew => {
                    let id = fresh_iter.next().expect("a fresh sender");
                    Some(ours_sample(id, &node, 1).0)
                }
                Variant::QuinnNew | Variant::Quinn0Rtt => {
                    match rt.block_on(quinn_sample(&q, v == Variant::Quinn0Rtt)) {
                        QuinnOutcome::Timed(d) => Some(d),
                        QuinnOutcome::Fallback => {
                            fallbacks += keep as u64;
                            None
                        }
                        QuinnOutcome::Failed(e) => {
                            eprintln!("{}: {e}", v.name());
                            failures += 1;
                            None
                        }
                    }
                }
                Variant::UdpRtt => Some(udp_rtt(&echo_sock, false)),
                Variant::UdpCommitRtt => Some(udp_rtt(&echo_sock, true)),
                Variant::SqliteCommit => Some(sqlite_commit(&db, it as u64)),
                Variant::X25519 => Some(x25519_once(&dh_a, &dh_b)),
            };
            if let (true, Some(d)) = (keep, took) {
                let idx = ALL.iter().position(|x| *x == v).expect("listed");
                samples[idx].push(d);
            }
        }
    }
    // Let the last turn's memo write and counters settle, then stop the node.
    std::thread::sleep(Duration::from_millis(50));
    let c = node.stop().expect("node run");

    for (idx, v) in ALL.iter().enumerate() {
        let extra = match v {
            Variant::Quinn0Rtt => format!(",\"fallbacks\":{fallbacks}"),
            _ => String::new(),
        };
        emit(a.round, v.name(), &samples[idx], &extra);
    }
    emit(a.round, "ours/sender_setup", &setup_cost, "");
    emit(a.round, "ours/first_contact", &first_contact, "");
    // What the node did: X25519 only for first contacts and never-seen senders, a memo hit for every known wake.
    println!(
        "{{\"bench\":\"first_packet\",\"round\":{},\"variant\":\"counters\",\"order\":\"random per set, seed {}\",\"idle_ms\":{},\"gap_ms\":{},\"quiet_ms\":{},\"x25519\":{},\"x25519_expected\":{},\"memo_hits\":{},\"memo_hits_expected\":{},\"sessions_made\":{},\"sessions_swept\":{},\"stored_records\":{},\"quinn_failures\":{failures},\"slept_s\":{:.1},\"elapsed_s\":{:.1}}}",
        a.round,
        a.round,
        a.idle.as_millis(),
        a.gap.as_millis(),
        quiet.as_millis(),
        c.x25519,
        KNOWN + n_new,
        c.memo_hits,
        2 * n_new,
        c.sessions_made,
        c.sessions_swept,
        c.stored_records,
        slept.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
}

// ---------------------------------------------------------------------------------------------------------------
// `--phases`: where the node's time for one wake goes, without sockets or threads

/// The daemon's work for one wake of a known sender (`ReadyNode::turn`'s steps on the sans-IO node, in the same
/// order), each step timed, with the same quiet gap before each wake; the SQLite probe commit beside it.
fn phases(a: &Args) {
    let dir = tempfile::tempdir().expect("tempdir");
    let node_id = Identity::generate();
    let ids: Vec<Identity> = (0..KNOWN).map(|_| Identity::generate()).collect();
    let senders = Arc::new(AllowList::from_unique(
        ids.iter()
            .enumerate()
            .map(|(i, id)| (format!("dev-{i}"), *id.public()))
            .collect(),
    ));
    let mut node = Node::new(
        NodeConfig {
            identity: node_id.clone(),
            epoch: u64::from_be_bytes(pure_serve::proto::crypto::random_array()),
            idle: a.idle,
            apps: vec![APP.to_string()],
        },
        senders.clone(),
    );
    let state = dir.path().join("state");
    let mut stores = Stores::open(&state, &[APP.to_string()]).expect("stores");
    let mut memo = Memo::open(&state.join("memo.sqlite")).expect("memo");
    let probe = sqlite_commit_db(&state.join("probe.sqlite"));
    let from: SocketAddr = "127.0.0.1:9".parse().expect("literal");
    let mut seq = vec![1u64; KNOWN];
    let names = [
        "phase/handle_datagram",
        "phase/apply_turn_commit",
        "phase/acks",
        "phase/memo_put",
        "phase/probe_commit",
    ];
    let mut times: Vec<Vec<Duration>> = vec![Vec::with_capacity(a.samples); names.len()];
    // The first KNOWN wakes are first contacts (X25519, memo written): warm-up, not kept.
    for it in 0..KNOWN + a.samples {
        let i = it % KNOWN;
        let mut s =
            Sender::new(SenderConfig::new(ids[i].clone(), *node_id.public())).expect("sender");
        s.open_flow(APP, FlowStart::At(seq[i])).expect("flow");
        s.queue(APP, record(seq[i])).expect("queue");
        seq[i] += 1;
        let mut pkt = Vec::new();
        assert!(s.poll_transmit(Instant::now(), &mut pkt));
        std::thread::sleep(a.gap);
        let t0 = Instant::now();
        node.handle_datagram(t0, from, &pkt, &mut memo);
        let t1 = Instant::now();
        let turn = node.take_turn().expect("a turn");
        let committed = stores.apply_turn(&turn, &senders).expect("apply");
        let t2 = Instant::now();
        node.handle_committed(&committed);
        node.flush_acks();
        let mut acks = 0;
        while let Some(t) = node.poll_transmit() {
            std::hint::black_box(&t);
            acks += 1;
        }
        let t3 = Instant::now();
        memo.put_all(Instant::now(), &node.take_new_secrets())
            .expect("memo");
        let t4 = Instant::now();
        assert_eq!(acks, 1, "one ack per wake");
        // Sweep everything: the next wake of any sender finds no session, as in the daemon after `idle`.
        node.handle_timeout(t4 + 4 * a.idle);
        std::thread::sleep(a.gap);
        let p = sqlite_commit(&probe, it as u64);
        if it >= KNOWN {
            for (k, d) in [t1 - t0, t2 - t1, t3 - t2, t4 - t3, p]
                .into_iter()
                .enumerate()
            {
                times[k].push(d);
            }
        }
    }
    assert_eq!(
        node.counters().x25519,
        KNOWN as u64,
        "known wakes use the memo"
    );
    for (k, name) in names.iter().enumerate() {
        emit(a.round, name, &times[k], "");
    }
}
