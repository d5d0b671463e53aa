//! research/015-http-bounds: what a flood of TLS handshakes on `--http-port` does to the records a node stores
//! through UDP and through `POST /link`. A real node (the release binary, its own process, with a certificate made at
//! run time) is sent records by legitimate senders, beside a flood of new connections; prints one JSON line per run.
//!
//! Threads of this process:
//!
//! - **legit**: `--senders K` senders (the sans-IO `Sender`, `FlowStart::At(1)`, records of 40 bytes, a backlog of
//!   `--backlog` each, as fast as acks allow), either `--via udp` (one UDP socket each, on 127.0.1.x) or `--via http`
//!   (a thread each, one HTTPS connection each from 127.0.2.x, opened before the window and kept alive: one
//!   `POST /link` per batch of datagrams, as the wire outlet does);
//! - **flood**: with `--flood tls`, `--flood-workers` threads open new TCP connections to `--http-port` at
//!   `--flood-rate` a second in all (0: as fast as they can), from `--flood-sources` addresses in as many /24s
//!   (127.3.x.1), write one ClientHello captured once from rustls (what an attacker replays at no cost of its own:
//!   the node still does its key exchange and signature for each), wait for the first byte of the node's answer
//!   (the work is done by then) and reset the connection; `--flood plain` does the same with a plain
//!   `GET /healthz` (the control: what the connections and a request cost, without TLS);
//! - **probe**: every `--probe-ms` a client from a network the flood does not use (127.4.x.1, a new /24 each time)
//!   opens a new TLS connection and asks `/healthz`: whether a newcomer gets in, and how long it takes.
//!
//! The node's figures come from its `/metrics` (records stored, TLS handshakes failed, connections refused by
//! reason) and /proc (CPU time of the process, of its `pure-http` thread and of its receive loop), sampled after
//! `--warmup` seconds and again after `--seconds`.
//!
//! Usage: cargo bench --bench http_bounds -- --bin target/release/pure-serve [options]; see `args()`.

#[path = "../tests/http_util/mod.rs"]
mod http_util;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use pure_serve::keys::encode_key;
use pure_serve::proto::crypto::{Identity, PublicKeyBytes};
use pure_serve::proto::sender::{FlowStart, Sender, SenderConfig, SenderEvent};

const APP: &str = "main";
const RECORD: usize = 40;

#[derive(Debug, Clone)]
struct Args {
    bin: PathBuf,
    label: String,
    via: String,
    flood: String,
    flood_rate: u64,
    flood_sources: u32,
    flood_workers: usize,
    senders: usize,
    backlog: usize,
    probe_ms: u64,
    warmup: f64,
    seconds: f64,
    extra: Vec<String>,
}

fn args() -> Args {
    let mut a = Args {
        bin: PathBuf::from("target/release/pure-serve"),
        label: String::new(),
        via: "udp".into(),
        flood: "none".into(),
        flood_rate: 0,
        flood_sources: 64,
        flood_workers: 4,
        senders: 4,
        backlog: 20_000,
        probe_ms: 100,
        warmup: 1.0,
        seconds: 4.0,
        extra: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut val = || it.next().expect("a value");
        match arg.as_str() {
            "--bin" => a.bin = PathBuf::from(val()),
            "--label" => a.label = val(),
            "--via" => a.via = val(),
            "--flood" => a.flood = val(),
            "--flood-rate" => a.flood_rate = val().parse().expect("connections/s"),
            "--flood-sources" => a.flood_sources = val().parse().expect("n"),
            "--flood-workers" => a.flood_workers = val().parse().expect("n"),
            "--senders" => a.senders = val().parse().expect("n"),
            "--backlog" => a.backlog = val().parse().expect("records"),
            "--probe-ms" => a.probe_ms = val().parse().expect("ms"),
            "--warmup" => a.warmup = val().parse().expect("s"),
            "--seconds" => a.seconds = val().parse().expect("s"),
            "--node-arg" => a.extra.push(val()),
            "--bench" => {}
            other => panic!("unknown argument {other}"),
        }
    }
    assert!(
        matches!(a.via.as_str(), "udp" | "http"),
        "--via udp or http"
    );
    assert!(
        matches!(a.flood.as_str(), "none" | "tls" | "plain"),
        "--flood none, tls or plain"
    );
    a
}

// ---------------------------------------------------------------- the node process

struct NodeProc {
    child: Child,
    link: SocketAddr,
    http: SocketAddr,
    metrics: SocketAddr,
    public: PublicKeyBytes,
}

fn start_node(a: &Args, dir: &Path, senders: &Path, ca: &http_util::TestCa) -> NodeProc {
    let mut child = Command::new(&a.bin)
        .arg("--state")
        .arg(dir.join("state"))
        .arg("--senders")
        .arg(senders)
        .args([
            "--bind",
            "127.0.0.1",
            "--link-port",
            "0",
            "--http-port",
            "0",
            "--metrics-listen",
            "127.0.0.1:0",
        ])
        .arg("--tls-cert")
        .arg(&ca.cert_file)
        .arg("--tls-key")
        .arg(&ca.key_file)
        .args(&a.extra)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .stdin(Stdio::null())
        .spawn()
        .expect("start the node binary (cargo build --release first)");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let (mut link, mut http, mut metrics, mut public) = (None, None, None, None);
    let addr_of = |url: &str| -> SocketAddr {
        let rest = url.split("://").nth(1).expect("a URL");
        rest.split('/').next().unwrap().parse().expect("address")
    };
    for line in lines.by_ref() {
        let line = line.expect("node output");
        if let Some(k) = line.strip_prefix("public key:") {
            public = Some(pure_serve::keys::decode_key(k.trim()).expect("node key"));
        } else if let Some(l) = line.strip_prefix("link:") {
            link = Some(l.trim().trim_start_matches("udp").trim().parse().unwrap());
        } else if let Some(l) = line.strip_prefix("http link:") {
            http = Some(addr_of(l.trim().trim_start_matches("POST").trim()));
        } else if let Some(m) = line.strip_prefix("metrics:") {
            metrics = Some(addr_of(m.split_whitespace().next().expect("url")));
        } else if line == "ready" {
            break;
        }
    }
    std::thread::spawn(move || for _ in lines {});
    NodeProc {
        child,
        link: link.expect("link line"),
        http: http.expect("http link line"),
        metrics: metrics.expect("metrics line"),
        public: public.expect("public key line"),
    }
}

fn ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_CLK_TCK) as f64 }
}

/// utime + stime of a /proc stat line, in seconds.
fn stat_cpu(stat: &str) -> f64 {
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let t = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (t(11) + t(12)) / ticks()
}

impl NodeProc {
    fn stop(mut self) {
        // SAFETY: kill with a pid we spawned.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let _ = self.child.wait();
    }

    fn scrape(&self) -> HashMap<String, f64> {
        let mut out = HashMap::new();
        let Ok(mut s) = TcpStream::connect(self.metrics) else {
            return out;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        let _ = write!(
            s,
            "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        );
        let mut body = String::new();
        let _ = s.read_to_string(&mut body);
        for line in body.lines().filter(|l| !l.starts_with('#')) {
            if let Some((k, v)) = line.rsplit_once(' ')
                && let Ok(v) = v.parse::<f64>()
            {
                out.insert(k.to_string(), v);
            }
        }
        out
    }

    /// CPU seconds of the process, and of its threads by name.
    fn cpu(&self) -> (f64, HashMap<String, f64>) {
        let pid = self.child.id();
        let total =
            stat_cpu(&std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default());
        let mut threads = HashMap::new();
        if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
            for t in tasks.flatten() {
                let name = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
                let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
                *threads.entry(name.trim().to_string()).or_insert(0.0) += stat_cpu(&stat);
            }
        }
        (total, threads)
    }
}

fn metric(m: &HashMap<String, f64>, k: &str) -> f64 {
    m.get(k).copied().unwrap_or(0.0)
}

// ---------------------------------------------------------------- legitimate senders

#[derive(Default)]
struct LegitOut {
    stored: AtomicU64,
    requests: AtomicU64,
    failed_requests: AtomicU64,
}

fn record(tag: u64) -> Vec<u8> {
    let mut r = format!("{tag:020}").into_bytes();
    r.resize(RECORD, b'.');
    r
}

fn new_sender(id: Identity, node: PublicKeyBytes) -> Sender {
    let mut s = Sender::new(SenderConfig::new(id, node)).unwrap();
    s.open_flow(APP, FlowStart::At(1)).unwrap();
    s
}

/// Keeps `s` at its backlog of records.
fn top_up(s: &mut Sender, queued: &mut u64, backlog: usize) {
    let room = backlog.saturating_sub(s.unacked_total()) as u64;
    for k in 0..room {
        let _ = s.queue(APP, record(*queued + k + 1));
    }
    *queued += room;
}

/// Counts what `s` newly had stored.
fn count_stored(s: &mut Sender, last: &mut u64, out: &LegitOut) {
    while let Some(e) = s.poll_event() {
        if let SenderEvent::Stored { through, .. } = e
            && through > *last
        {
            out.stored.fetch_add(through - *last, Ordering::Relaxed);
            *last = through;
        }
    }
}

/// UDP senders, all on this thread, until `stop`.
fn legit_udp(
    ids: Vec<Identity>,
    node: PublicKeyBytes,
    to: SocketAddr,
    backlog: usize,
    stop: Arc<AtomicBool>,
    out: Arc<LegitOut>,
) {
    let mut links: Vec<(UdpSocket, Sender, u64, u64)> = ids
        .into_iter()
        .enumerate()
        .map(|(i, id)| {
            let sock = UdpSocket::bind(SocketAddr::from(([127, 0, 1, 1 + i as u8], 0))).unwrap();
            sock.connect(to).unwrap();
            sock.set_nonblocking(true).unwrap();
            let _ = socket2::SockRef::from(&sock).set_recv_buffer_size(1 << 20);
            (sock, new_sender(id, node), 0, 0)
        })
        .collect();
    let mut buf = Vec::with_capacity(2048);
    let mut inbuf = vec![0u8; 2048];
    while !stop.load(Ordering::Relaxed) {
        for (sock, s, queued, last) in links.iter_mut() {
            top_up(s, queued, backlog);
            let now = Instant::now();
            s.handle_timeout(now);
            while s.poll_transmit(now, &mut buf) {
                if sock.send(&buf).is_err() {
                    break;
                }
            }
            while let Ok(n) = sock.recv(&mut inbuf) {
                s.handle_datagram(Instant::now(), &inbuf[..n]);
            }
            count_stored(s, last, &out);
        }
        let mut fds: Vec<libc::pollfd> = links
            .iter()
            .map(|l| libc::pollfd {
                fd: l.0.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: valid pollfds for the call.
        unsafe {
            libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 1);
        }
    }
}

/// One sender over one kept-alive HTTPS connection from `from`, until `stop`: a `POST /link` per batch.
#[allow(clippy::too_many_arguments)]
fn legit_http(
    id: Identity,
    node: PublicKeyBytes,
    from: IpAddr,
    to: SocketAddr,
    ca_der: Vec<u8>,
    backlog: usize,
    stop: Arc<AtomicBool>,
    out: Arc<LegitOut>,
) {
    let mut s = new_sender(id, node);
    let mut client = http_util::Client::connect_tls_from(from, to, &ca_der).expect("HTTPS");
    let (mut queued, mut last) = (0, 0);
    let mut buf = Vec::with_capacity(2048);
    while !stop.load(Ordering::Relaxed) {
        top_up(&mut s, &mut queued, backlog);
        let now = Instant::now();
        s.handle_timeout(now);
        let mut packets = Vec::new();
        while s.poll_transmit(now, &mut buf) {
            packets.push(buf.clone());
        }
        if packets.is_empty() {
            std::thread::sleep(Duration::from_millis(1));
            continue;
        }
        let body = pure_serve::http::Framed::from_packets(&packets)
            .expect("framed")
            .into_bytes();
        out.requests.fetch_add(1, Ordering::Relaxed);
        let reply = client.request(
            "POST",
            "/link",
            &[("Content-Type", pure_serve::http::LINK_CONTENT_TYPE)],
            &body,
        );
        match reply {
            Ok(r) if r.status == 200 => {
                for p in r.packets() {
                    s.handle_datagram(Instant::now(), &p);
                }
            }
            Ok(_) => {
                out.failed_requests.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => {
                out.failed_requests.fetch_add(1, Ordering::Relaxed);
                // The connection is gone: a new one, as a sender would.
                match http_util::Client::connect_tls_from(from, to, &ca_der) {
                    Ok(c) => client = c,
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        }
        count_stored(&mut s, &mut last, &out);
    }
}

// ---------------------------------------------------------------- the flood

#[derive(Default)]
struct FloodOut {
    opened: AtomicU64,
    failed: AtomicU64,
    /// TLS connections the node closed without answering the ClientHello (refused, or its bounds).
    unanswered: AtomicU64,
    /// CPU time of the flood's threads, in µs: what the flood costs the machine beside what it costs the node.
    cpu_us: AtomicU64,
}

fn thread_cpu() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to fill.
    unsafe {
        libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts);
    }
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

/// The first flight of a TLS 1.3 client, as rustls sends it: replayed, it costs the server a full handshake's work
/// and the sender nothing.
fn client_hello(ca_der: &[u8]) -> Vec<u8> {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls::pki_types::CertificateDer::from(ca_der.to_vec()))
        .unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let mut conn = rustls::ClientConnection::new(
        Arc::new(config),
        rustls::pki_types::ServerName::try_from("localhost").unwrap(),
    )
    .unwrap();
    let mut hello = Vec::new();
    while conn.wants_write() {
        conn.write_tls(&mut hello).unwrap();
    }
    hello
}

#[allow(clippy::too_many_arguments)]
fn flood(
    worker: usize,
    workers: usize,
    hello: Arc<Vec<u8>>,
    rate: u64,
    sources: u32,
    to: SocketAddr,
    stop: Arc<AtomicBool>,
    out: Arc<FloodOut>,
) {
    let start = Instant::now();
    let per_worker = rate as f64 / workers as f64;
    let mut made = 0u64;
    let mut k = worker as u32;
    let mut cpu = thread_cpu();
    while !stop.load(Ordering::Relaxed) {
        if made.is_multiple_of(64) {
            let now = thread_cpu();
            out.cpu_us
                .fetch_add(((now - cpu) * 1e6) as u64, Ordering::Relaxed);
            cpu = now;
        }
        if rate > 0 {
            let due = (start.elapsed().as_secs_f64() * per_worker) as u64;
            if made >= due {
                std::thread::sleep(Duration::from_micros(200));
                continue;
            }
        }
        made += 1;
        let i = k % sources.max(1);
        k = k.wrapping_add(workers as u32);
        // One /24 each: 127.3.0.1, 127.3.1.1, …
        let from = IpAddr::from([127, 3 + (i >> 8) as u8, (i & 255) as u8, 1]);
        match http_util::connect_from(from, to) {
            Ok(mut s) => {
                // Closed with a reset: no TIME_WAIT here, whose ports loopback would reuse while the node still
                // holds the old connection (a SYN lost for a second: the tool's limit, not the node's).
                let _ = socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO));
                // Wait for the first byte of the node's answer: by then it has done the work (for TLS the key
                // exchange and the signature). Resetting earlier would not make it do the work.
                let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
                let mut first = [0u8; 1];
                let answered = s.write_all(&hello).is_ok() && matches!(s.read(&mut first), Ok(1));
                if !answered {
                    out.unanswered.fetch_add(1, Ordering::Relaxed);
                }
                out.opened.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => {
                out.failed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

// ---------------------------------------------------------------- newcomers

#[derive(Default)]
struct ProbeOut {
    times_us: std::sync::Mutex<Vec<u64>>,
    failed: AtomicU64,
    /// Why probes failed, by error.
    errors: std::sync::Mutex<HashMap<String, u64>>,
}

fn probe(
    every: Duration,
    to: SocketAddr,
    ca_der: Vec<u8>,
    stop: Arc<AtomicBool>,
    out: Arc<ProbeOut>,
) {
    let mut n = 0u32;
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(every);
        // A /24 of its own each time, so that each probe is a newcomer.
        let from = IpAddr::from([127, 4 + ((n >> 8) & 3) as u8, (n & 255) as u8, 1]);
        n += 1;
        let t0 = Instant::now();
        let outcome = http_util::Client::connect_tls_from(from, to, &ca_der)
            .map_err(|e| format!("connect: {e}"))
            .and_then(|mut c| {
                c.request("GET", "/healthz", &[], &[])
                    .map_err(|e| format!("request: {e}"))
            })
            .and_then(|r| match r.status {
                200 => Ok(()),
                s => Err(format!("status {s}")),
            });
        if let Err(e) = &outcome {
            *out.errors.lock().unwrap().entry(e.clone()).or_default() += 1;
        }
        if outcome.is_ok() {
            out.times_us
                .lock()
                .unwrap()
                .push(t0.elapsed().as_micros() as u64);
        } else {
            out.failed.fetch_add(1, Ordering::Relaxed);
        }
    }
}

// ---------------------------------------------------------------- one run

fn main() {
    let a = args();
    let dir = tempfile::tempdir().unwrap();
    let ca = http_util::test_ca(dir.path());
    let ids: Vec<Identity> = (0..a.senders).map(|_| Identity::generate()).collect();
    let senders = dir.path().join("senders");
    {
        let mut f = std::io::BufWriter::new(std::fs::File::create(&senders).unwrap());
        for (i, id) in ids.iter().enumerate() {
            writeln!(f, "legit{i} {}", encode_key(id.public())).unwrap();
        }
    }
    let node = start_node(&a, dir.path(), &senders, &ca);
    let stop = Arc::new(AtomicBool::new(false));
    let lout = Arc::new(LegitOut::default());
    let fout = Arc::new(FloodOut::default());
    let pout = Arc::new(ProbeOut::default());
    let mut threads = Vec::new();
    if a.via == "udp" {
        let (stop, out, ids, to, public, backlog) = (
            stop.clone(),
            lout.clone(),
            ids.clone(),
            node.link,
            node.public,
            a.backlog,
        );
        threads.push(std::thread::spawn(move || {
            legit_udp(ids, public, to, backlog, stop, out)
        }));
    } else {
        for (i, id) in ids.iter().enumerate() {
            let (stop, out, id, to, public, backlog, ca_der) = (
                stop.clone(),
                lout.clone(),
                id.clone(),
                node.http,
                node.public,
                a.backlog,
                ca.ca_der.clone(),
            );
            let from = IpAddr::from([127, 0, 2, 1 + i as u8]);
            threads.push(std::thread::spawn(move || {
                legit_http(id, public, from, to, ca_der, backlog, stop, out)
            }));
        }
    }
    if a.flood != "none" {
        let hello = Arc::new(if a.flood == "tls" {
            client_hello(&ca.ca_der)
        } else {
            b"GET /healthz HTTP/1.1\r\nHost: flood\r\n\r\n".to_vec()
        });
        for w in 0..a.flood_workers.max(1) {
            let (stop, out, hello, to) = (stop.clone(), fout.clone(), hello.clone(), node.http);
            let (workers, rate, sources) = (a.flood_workers.max(1), a.flood_rate, a.flood_sources);
            threads.push(std::thread::spawn(move || {
                flood(w, workers, hello, rate, sources, to, stop, out)
            }));
        }
    }
    std::thread::sleep(Duration::from_secs_f64(a.warmup));
    let probe_thread = (a.probe_ms > 0).then(|| {
        let (stop, out, to, ca_der) = (stop.clone(), pout.clone(), node.http, ca.ca_der.clone());
        let every = Duration::from_millis(a.probe_ms);
        std::thread::spawn(move || probe(every, to, ca_der, stop, out))
    });
    let m0 = node.scrape();
    let (cpu0, threads0) = node.cpu();
    let t0 = Instant::now();
    let l_stored0 = lout.stored.load(Ordering::Relaxed);
    let l_req0 = lout.requests.load(Ordering::Relaxed);
    let l_fail0 = lout.failed_requests.load(Ordering::Relaxed);
    let f_open0 = fout.opened.load(Ordering::Relaxed);
    let f_fail0 = fout.failed.load(Ordering::Relaxed);
    let f_unans0 = fout.unanswered.load(Ordering::Relaxed);
    let f_cpu0 = fout.cpu_us.load(Ordering::Relaxed);
    std::thread::sleep(Duration::from_secs_f64(a.seconds));
    let secs = t0.elapsed().as_secs_f64();
    let m1 = node.scrape();
    let (cpu1, threads1) = node.cpu();
    let l_stored = lout.stored.load(Ordering::Relaxed) - l_stored0;
    let l_req = lout.requests.load(Ordering::Relaxed) - l_req0;
    let l_fail = lout.failed_requests.load(Ordering::Relaxed) - l_fail0;
    let f_open = fout.opened.load(Ordering::Relaxed) - f_open0;
    let f_fail = fout.failed.load(Ordering::Relaxed) - f_fail0;
    let f_unans = fout.unanswered.load(Ordering::Relaxed) - f_unans0;
    let f_cpu = (fout.cpu_us.load(Ordering::Relaxed) - f_cpu0) as f64 / 1e6;
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    if let Some(t) = probe_thread {
        t.join().unwrap();
    }
    let d = |k: &str| metric(&m1, k) - metric(&m0, k);
    let thread_cpu = |name: &str| {
        (threads1.get(name).copied().unwrap_or(0.0) - threads0.get(name).copied().unwrap_or(0.0))
            / secs
    };
    let refused: serde_json::Map<String, serde_json::Value> = m1
        .keys()
        .filter_map(|k| {
            let reason = k
                .strip_prefix("pure_http_refused_total{listener=\"http\",reason=\"")?
                .strip_suffix("\"}")?;
            Some((reason.to_string(), serde_json::json!(d(k) / secs)))
        })
        .collect();
    let mut probes = pout.times_us.lock().unwrap().clone();
    probes.sort_unstable();
    let probe_failed = pout.failed.load(Ordering::Relaxed);
    let line = serde_json::json!({
        "label": a.label,
        "via": a.via,
        "flood": a.flood,
        "flood_rate_target": a.flood_rate,
        "flood_sources": a.flood_sources,
        "flood_workers": a.flood_workers,
        "senders": a.senders,
        "seconds": secs,
        "stored_per_s": d("pure_records_stored_total{app=\"main\"}") / secs,
        "legit_stored_per_s": l_stored as f64 / secs,
        "link_requests_per_s": l_req as f64 / secs,
        "link_requests_failed": l_fail,
        "flood_opened_per_s": f_open as f64 / secs,
        "flood_connect_failed": f_fail,
        "flood_unanswered_per_s": f_unans as f64 / secs,
        "flood_cpu": f_cpu / secs,
        "tls_failures_per_s": d("pure_http_tls_failures_total") / secs,
        "connections_served_per_s": d("pure_http_connections_total{listener=\"http\",outcome=\"served\"}") / secs,
        "refused_per_s": refused,
        "node_cpu": (cpu1 - cpu0) / secs,
        "http_thread_cpu": thread_cpu("pure-http"),
        "loop_thread_cpu": thread_cpu("pure-serve"),
        "sync_thread_cpu": thread_cpu("pure-sync"),
        "probe_ok": probes.len(),
        "probe_failed": probe_failed,
        "probe_errors": *pout.errors.lock().unwrap(),
        "probe_ms_p50": probes.get(probes.len() / 2).map(|us| *us as f64 / 1000.0),
        "probe_ms_max": probes.last().map(|us| *us as f64 / 1000.0),
    });
    println!("{line}");
    node.stop();
}
