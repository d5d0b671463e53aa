//! research/007-overload: the flood tool. A real node (the release binary, its own process) is sent more than it can
//! take, from outside as an attacker would, side by side with legitimate senders; prints one JSON line per run.
//!
//! Threads of this process, each measuring its own CPU time (CLOCK_THREAD_CPUTIME_ID):
//!
//! - **legit**: `--senders K` legitimate senders (the sans-IO `Sender`, `FlowStart::At(1)`, one UDP socket each on
//!   127.0.1.x), each queueing 40-byte records at `--rate-each` records/s (0: as fast as the window allows), its
//!   backlog capped at `--backlog` records (the app would drop beyond it; counted as offered all the same);
//! - **flood**: `--flood PPS` datagrams/s of `--mix`, paced every millisecond, sent with sendmmsg from `--prefixes`
//!   sockets on 127.2.0.0/16 (one /24 each, or one address), packets made before the run:
//!   - `random`: random bytes (size and version checks);
//!   - `unknown`: type 1 with key ids nobody has (`unknown_key`);
//!   - `forged`: type 1 with the key ids of listed senders the node has never heard from, new run ids, bad tags
//!     (each would cost an X25519: the budget, COOKIEs);
//!   - `forged_memo`: the same for listed senders in the node's memo (a memo lookup, HKDF and an open each);
//!   - `replay`: copies of 64 captured authentic first packets of distinct runs;
//!   - `runs`: one compromised listed sender starting a new run with every packet, each authentic (sessions);
//!
//!   with `--flood-to sink` the same flood goes to a socket of this process that nobody reads: the control for what
//!   the flood costs the machine (two cores shared by tool, senders and node) rather than the node; with
//!   `--flood-to read` a thread of this process reads it and throws it away: the cheapest receiver there can be;
//! - **new**: with `--new N`, N senders the node has never heard from start one after another during the flood, each
//!   delivering one record; their time to stored and the COOKIEs they got are reported.
//!
//! The node's figures come from its `/metrics` (records stored, X25519 and those that authenticated, drops by stage,
//! COOKIEs, sessions) and /proc (CPU time, resident and anonymous memory), sampled before and after the measured
//! window (`--warmup` then `--seconds`).
//!
//! Usage: cargo bench --bench overload -- --bin target/release/pure-serve [options]; see `args()`.

#![recursion_limit = "256"]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use pure_serve::keys::encode_key;
use pure_serve::proto::crypto::{self, Identity, PublicKeyBytes};
use pure_serve::proto::sender::{FlowStart, Sender, SenderConfig, SenderEvent};
use pure_serve::proto::wire;

const APP: &str = "main";
const RECORD: usize = 40;

#[derive(Debug, Clone)]
struct Args {
    bin: PathBuf,
    label: String,
    mix: String,
    flood: u64,
    prefixes: u32,
    senders: usize,
    rate_each: u64,
    backlog: usize,
    new: usize,
    warmup: f64,
    seconds: f64,
    budget: u32,
    recv_buffer: usize,
    victims: usize,
    flood_to: String,
    extra: Vec<String>,
}

fn args() -> Args {
    let mut a = Args {
        bin: PathBuf::from("target/release/pure-serve"),
        label: String::new(),
        mix: "forged".into(),
        flood: 0,
        prefixes: 256,
        senders: 4,
        rate_each: 0,
        backlog: 20_000,
        new: 0,
        warmup: 1.0,
        seconds: 3.0,
        budget: 250,
        recv_buffer: 8 << 20,
        victims: 100_000,
        flood_to: "node".into(),
        extra: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut val = || it.next().expect("a value");
        match arg.as_str() {
            "--bin" => a.bin = PathBuf::from(val()),
            "--label" => a.label = val(),
            "--mix" => a.mix = val(),
            "--flood" => a.flood = val().parse().expect("pps"),
            "--prefixes" => a.prefixes = val().parse().expect("n"),
            "--senders" => a.senders = val().parse().expect("n"),
            "--rate-each" => a.rate_each = val().parse().expect("records/s"),
            "--backlog" => a.backlog = val().parse().expect("records"),
            "--new" => a.new = val().parse().expect("n"),
            "--warmup" => a.warmup = val().parse().expect("s"),
            "--seconds" => a.seconds = val().parse().expect("s"),
            "--budget" => a.budget = val().parse().expect("per second"),
            "--recv-buffer" => a.recv_buffer = val().parse().expect("bytes"),
            "--victims" => a.victims = val().parse().expect("n"),
            "--flood-to" => a.flood_to = val(),
            "--node-arg" => a.extra.push(val()),
            "--bench" => {}
            other => panic!("unknown argument {other}"),
        }
    }
    a
}

// ---------------------------------------------------------------- the node process

struct NodeProc {
    child: Child,
    link: SocketAddr,
    metrics: SocketAddr,
    public: PublicKeyBytes,
}

fn start_node(a: &Args, dir: &Path, senders: &Path, budget: u32) -> NodeProc {
    let mut cmd = Command::new(&a.bin);
    cmd.arg("--state")
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
        ])
        .arg("--x25519-budget")
        .arg(budget.to_string())
        .arg("--recv-buffer")
        .arg(a.recv_buffer.to_string())
        .args(&a.extra)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .stdin(Stdio::null());
    let mut child = cmd
        .spawn()
        .expect("start the node binary (cargo build --release first)");
    let out = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(out).lines();
    let (mut link, mut metrics, mut public) = (None, None, None);
    for line in lines.by_ref() {
        let line = line.expect("node output");
        if let Some(k) = line.strip_prefix("public key:") {
            public = Some(pure_serve::keys::decode_key(k.trim()).expect("node key"));
        } else if let Some(l) = line.strip_prefix("link:") {
            link = Some(
                l.trim()
                    .trim_start_matches("udp")
                    .trim()
                    .parse()
                    .expect("link addr"),
            );
        } else if let Some(m) = line.strip_prefix("metrics:") {
            let url = m.split_whitespace().next().expect("url");
            let hostport = url
                .trim_start_matches("http://")
                .trim_end_matches("/metrics");
            metrics = Some(hostport.parse().expect("metrics addr"));
        } else if line == "ready" {
            break;
        }
    }
    // Keep draining stdout so the node never blocks on it.
    std::thread::spawn(move || for _ in lines {});
    NodeProc {
        child,
        link: link.expect("link line"),
        metrics: metrics.expect("metrics line"),
        public: public.expect("public key line"),
    }
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
        for line in body.lines() {
            if line.starts_with('#') {
                continue;
            }
            if let Some((k, v)) = line.rsplit_once(' ')
                && let Ok(v) = v.parse::<f64>()
            {
                out.insert(k.to_string(), v);
            }
        }
        out
    }
    /// User + system CPU time of the node process.
    fn cpu(&self) -> f64 {
        let stat =
            std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap_or_default();
        let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
        let f: Vec<&str> = after.split_whitespace().collect();
        // SAFETY: sysconf has no preconditions.
        let tck = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        let t = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
        // Fields 14 and 15 of stat (utime, stime) are 11 and 12 after the command name.
        (t(11) + t(12)) / tck
    }
    /// (resident, anonymous) bytes.
    fn memory(&self) -> (u64, u64) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap_or_default();
        let kb = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                .unwrap_or(0)
                * 1024
        };
        (kb("VmRSS:"), kb("RssAnon:"))
    }
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

fn metric(m: &HashMap<String, f64>, k: &str) -> f64 {
    m.get(k).copied().unwrap_or(0.0)
}

// ---------------------------------------------------------------- legitimate senders

#[derive(Default)]
struct LegitOut {
    stored: AtomicU64,
    offered: AtomicU64,
    packets: AtomicU64,
    go_back: AtomicU64,
    cookies: AtomicU64,
    cpu_us: AtomicU64,
    /// The senders' smoothed round-trip times, mean, in µs.
    srtt_us: AtomicU64,
}

fn record(tag: u64) -> Vec<u8> {
    let mut r = format!("{tag:020}").into_bytes();
    r.resize(RECORD, b'.');
    r
}

/// Drives `ids` as senders until `stop`; counts records stored (acknowledged) and offered.
fn legit(
    ids: Vec<Identity>,
    node: PublicKeyBytes,
    to: SocketAddr,
    rate_each: u64,
    backlog: usize,
    stop: Arc<AtomicBool>,
    out: Arc<LegitOut>,
) {
    let cpu0 = thread_cpu();
    let mut links: Vec<(UdpSocket, Sender, u64)> = ids
        .into_iter()
        .enumerate()
        .map(|(i, id)| {
            let sock = UdpSocket::bind(SocketAddr::from(([127, 0, 1, 1 + i as u8], 0))).unwrap();
            sock.connect(to).unwrap();
            sock.set_nonblocking(true).unwrap();
            let _ = socket2::SockRef::from(&sock).set_recv_buffer_size(1 << 20);
            let mut s = Sender::new(SenderConfig::new(id, node)).unwrap();
            s.open_flow(APP, FlowStart::At(1)).unwrap();
            (sock, s, 0)
        })
        .collect();
    let start = Instant::now();
    let mut buf = Vec::with_capacity(2048);
    let mut inbuf = vec![0u8; 2048];
    let mut last_stored = vec![0u64; links.len()];
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        let elapsed = now.duration_since(start).as_secs_f64();
        for (i, (sock, s, queued)) in links.iter_mut().enumerate() {
            // The app's offered load: records due by now; beyond the backlog the app drops them (offered all the
            // same). Only what is queued costs anything here, so any offered rate can be asked for.
            let room = backlog.saturating_sub(s.unacked_total()) as u64;
            let due = if rate_each == 0 {
                *queued + room
            } else {
                (elapsed * rate_each as f64) as u64
            };
            if due > *queued {
                out.offered.fetch_add(due - *queued, Ordering::Relaxed);
                let take = (due - *queued).min(room);
                for k in 0..take {
                    let _ = s.queue(APP, record(*queued + k + 1));
                }
                *queued = due;
            }
            s.handle_timeout(now);
            while s.poll_transmit(now, &mut buf) {
                out.packets.fetch_add(1, Ordering::Relaxed);
                if sock.send(&buf).is_err() {
                    break;
                }
            }
            while let Ok(n) = sock.recv(&mut inbuf) {
                s.handle_datagram(Instant::now(), &inbuf[..n]);
            }
            while let Some(e) = s.poll_event() {
                if let SenderEvent::Stored { through, .. } = e
                    && through > last_stored[i]
                {
                    out.stored
                        .fetch_add(through - last_stored[i], Ordering::Relaxed);
                    last_stored[i] = through;
                }
            }
        }
        let go_back: u64 = links.iter().map(|l| l.1.stats().retransmit_rounds).sum();
        out.go_back.store(go_back, Ordering::Relaxed);
        let cookies: u64 = links.iter().map(|l| l.1.stats().cookies_received).sum();
        out.cookies.store(cookies, Ordering::Relaxed);
        let srtt: Vec<u64> = links
            .iter()
            .filter_map(|l| l.1.srtt())
            .map(|d| d.as_micros() as u64)
            .collect();
        if !srtt.is_empty() {
            out.srtt_us.store(
                srtt.iter().sum::<u64>() / srtt.len() as u64,
                Ordering::Relaxed,
            );
        }
        out.cpu_us
            .store(((thread_cpu() - cpu0) * 1e6) as u64, Ordering::Relaxed);
        // Wait for any socket or 1 ms.
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

// ---------------------------------------------------------------- the flood

#[derive(Default)]
struct FloodOut {
    sent: AtomicU64,
    cpu_us: AtomicU64,
    /// `--flood-to read`: datagrams the reading thread took, and its CPU time.
    read: AtomicU64,
    read_cpu_us: AtomicU64,
}

/// `--flood-to read`: a receiver that does nothing but read what arrives (recvmmsg, 64 at a time, waiting for the
/// first) and throw it away. What senders keep beside it is the most any receiver could leave them on this machine.
fn read_sink(sock: UdpSocket, stop: Arc<AtomicBool>, out: Arc<FloodOut>) {
    let cpu0 = thread_cpu();
    sock.set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    const N: usize = 64;
    let mut bufs = vec![[0u8; 2048]; N];
    let mut read = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let mut iovs: Vec<libc::iovec> = bufs
            .iter_mut()
            .map(|b| libc::iovec {
                iov_base: b.as_mut_ptr() as *mut libc::c_void,
                iov_len: b.len(),
            })
            .collect();
        let mut hdrs: Vec<libc::mmsghdr> = iovs
            .iter_mut()
            .map(|iov| {
                // SAFETY: plain old data, zero is empty.
                let mut h: libc::mmsghdr = unsafe { std::mem::zeroed() };
                h.msg_hdr.msg_iov = iov;
                h.msg_hdr.msg_iovlen = 1;
                h
            })
            .collect();
        // SAFETY: headers point at live buffers for the call.
        let r = unsafe {
            libc::recvmmsg(
                sock.as_raw_fd(),
                hdrs.as_mut_ptr(),
                N as libc::c_uint,
                libc::MSG_WAITFORONE,
                std::ptr::null_mut(),
            )
        };
        if r > 0 {
            read += r as u64;
            out.read.store(read, Ordering::Relaxed);
            out.read_cpu_us
                .store(((thread_cpu() - cpu0) * 1e6) as u64, Ordering::Relaxed);
        }
    }
    out.read_cpu_us
        .store(((thread_cpu() - cpu0) * 1e6) as u64, Ordering::Relaxed);
}

struct Xorshift(u64);
impl Xorshift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// The flood's packets, made before the run.
fn flood_packets(
    mix: &str,
    victims: &[PublicKeyBytes],
    memo_victims: usize,
    runs_id: &Identity,
    node: &PublicKeyBytes,
) -> Vec<Vec<u8>> {
    let mut rng = Xorshift(0x1234_5678_9abc_def1);
    // Forged packets name every victim in turn, so few are in the memo by the end (only those the budget let through
    // are memoised); other mixes cycle over a smaller pool.
    let n = match mix {
        "runs" => 1_000_000,
        "forged" => victims.len().saturating_sub(memo_victims).max(1),
        _ => 8192,
    };
    let forged = |key_id: u32, rng: &mut Xorshift| {
        let mut p = Vec::with_capacity(200);
        wire::SenderHeader {
            key_id,
            run_id: rng.next(),
            packet_number: 0,
        }
        .emit(&mut p);
        while p.len() < 200 {
            p.extend_from_slice(&rng.next().to_le_bytes());
        }
        p.truncate(200);
        p
    };
    let shared = runs_id.shared_secret(node).unwrap();
    let authentic = |run_id: u64| {
        let key = crypto::sender_to_node_key(&shared, run_id, runs_id.public(), node);
        let mut p = Vec::new();
        wire::SenderHeader {
            key_id: crypto::key_id(runs_id.public()),
            run_id,
            packet_number: 0,
        }
        .emit(&mut p);
        // A probe: authentic, stores nothing, asks for an ACK.
        wire::put_data_header(&mut p, APP.as_bytes(), 0, 0);
        while p.len() + wire::TAG_LEN < wire::MIN_SENDER_DATAGRAM {
            p.push(wire::FRAME_PADDING);
        }
        crypto::seal(&key, 0, &mut p, wire::SENDER_HEADER_LEN);
        p
    };
    (0..n)
        .map(|i| match mix {
            "random" => {
                let mut p = vec![0u8; 200];
                for c in p.chunks_mut(8) {
                    c.copy_from_slice(&rng.next().to_le_bytes()[..c.len()]);
                }
                p
            }
            "unknown" => forged(rng.next() as u32 | 1, &mut rng),
            // Victims past the first `memo_victims` are the ones the node has never heard from.
            "forged" => {
                let k = memo_victims + (i % (victims.len() - memo_victims).max(1));
                forged(crypto::key_id(&victims[k % victims.len()]), &mut rng)
            }
            "forged_memo" => forged(crypto::key_id(&victims[i % memo_victims.max(1)]), &mut rng),
            "replay" => authentic(0xfeed_0000 + (i % 64) as u64),
            "runs" => authentic(0x0ace_0000_0000 + i as u64),
            other => panic!("unknown mix {other}"),
        })
        .collect()
}

fn flood(
    packets: Vec<Vec<u8>>,
    pps: u64,
    prefixes: u32,
    to: SocketAddr,
    stop: Arc<AtomicBool>,
    out: Arc<FloodOut>,
) {
    let cpu0 = thread_cpu();
    let socks: Vec<UdpSocket> = (0..prefixes.max(1))
        .map(|i| {
            // One /24 each: 127.2.0.1, 127.2.1.1, …, 127.3.0.1, …
            let s = UdpSocket::bind(SocketAddr::from((
                [127, 2 + (i >> 8) as u8, (i & 255) as u8, 1],
                0,
            )))
            .unwrap();
            s.set_nonblocking(true).unwrap();
            // Answers (COOKIEs) pile up and are dropped by the kernel: nobody reads them, as a spoofer would not.
            let _ = socket2::SockRef::from(&s).set_recv_buffer_size(4096);
            s
        })
        .collect();
    let sa = socket2::SockAddr::from(to);
    let start = Instant::now();
    let mut sent = 0u64;
    let mut next = 0usize;
    let mut sock = 0usize;
    const CHUNK: usize = 32;
    while !stop.load(Ordering::Relaxed) {
        let due = (start.elapsed().as_secs_f64() * pps as f64) as u64;
        if sent >= due {
            std::thread::sleep(Duration::from_micros(200));
            continue;
        }
        let n = ((due - sent) as usize).min(CHUNK);
        let mut iovs: Vec<libc::iovec> = Vec::with_capacity(n);
        for k in 0..n {
            let p = &packets[(next + k) % packets.len()];
            iovs.push(libc::iovec {
                iov_base: p.as_ptr() as *mut libc::c_void,
                iov_len: p.len(),
            });
        }
        let mut hdrs: Vec<libc::mmsghdr> = iovs
            .iter_mut()
            .map(|iov| {
                // SAFETY: plain old data, zero is empty.
                let mut h: libc::mmsghdr = unsafe { std::mem::zeroed() };
                h.msg_hdr.msg_name = sa.as_ptr() as *mut libc::c_void;
                h.msg_hdr.msg_namelen = sa.len();
                h.msg_hdr.msg_iov = iov;
                h.msg_hdr.msg_iovlen = 1;
                h
            })
            .collect();
        // SAFETY: headers point at live buffers for the call.
        let r = unsafe {
            libc::sendmmsg(
                socks[sock].as_raw_fd(),
                hdrs.as_mut_ptr(),
                n as libc::c_uint,
                0,
            )
        };
        let done = if r > 0 { r as u64 } else { n as u64 };
        sent += done;
        next += done as usize;
        sock = (sock + 1) % socks.len();
        out.sent.store(sent, Ordering::Relaxed);
        if sent.is_multiple_of(1024) {
            out.cpu_us
                .store(((thread_cpu() - cpu0) * 1e6) as u64, Ordering::Relaxed);
        }
    }
    out.cpu_us
        .store(((thread_cpu() - cpu0) * 1e6) as u64, Ordering::Relaxed);
}

// ---------------------------------------------------------------- new senders during the flood

/// Each new sender delivers one record over its own socket; returns (seconds to stored, or None, cookies got).
fn new_sender(
    id: Identity,
    node: PublicKeyBytes,
    to: SocketAddr,
    i: usize,
    limit: Duration,
) -> (Option<f64>, u64) {
    let sock = UdpSocket::bind(SocketAddr::from(([127, 0, 3, 1 + (i % 250) as u8], 0))).unwrap();
    sock.connect(to).unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(5)))
        .unwrap();
    let mut s = Sender::new(SenderConfig::new(id, node)).unwrap();
    s.open_flow(APP, FlowStart::At(1)).unwrap();
    s.queue(APP, record(i as u64)).unwrap();
    let t0 = Instant::now();
    let mut buf = Vec::new();
    let mut inbuf = vec![0u8; 2048];
    while t0.elapsed() < limit {
        let now = Instant::now();
        s.handle_timeout(now);
        while s.poll_transmit(now, &mut buf) {
            let _ = sock.send(&buf);
        }
        if let Ok(n) = sock.recv(&mut inbuf) {
            s.handle_datagram(Instant::now(), &inbuf[..n]);
        }
        while let Some(e) = s.poll_event() {
            if matches!(e, SenderEvent::Stored { through: 1, .. }) {
                return (Some(t0.elapsed().as_secs_f64()), s.stats().cookies_received);
            }
        }
    }
    (None, s.stats().cookies_received)
}

// ---------------------------------------------------------------- one run

fn main() {
    let a = args();
    let dir = tempfile::tempdir().unwrap();
    let legit_ids: Vec<Identity> = (0..a.senders).map(|_| Identity::generate()).collect();
    let new_ids: Vec<Identity> = (0..a.new).map(|_| Identity::generate()).collect();
    let runs_id = Identity::generate();
    let victims: Vec<PublicKeyBytes> = (0..a.victims).map(|_| crypto::random_array()).collect();
    let senders = dir.path().join("senders");
    {
        let mut f = std::io::BufWriter::new(std::fs::File::create(&senders).unwrap());
        for (i, id) in legit_ids.iter().enumerate() {
            writeln!(f, "legit{i} {}", encode_key(id.public())).unwrap();
        }
        for (i, id) in new_ids.iter().enumerate() {
            writeln!(f, "new{i} {}", encode_key(id.public())).unwrap();
        }
        writeln!(f, "runs {}", encode_key(runs_id.public())).unwrap();
        for (i, k) in victims.iter().enumerate() {
            writeln!(f, "victim{i} {}", encode_key(k)).unwrap();
        }
    }
    // The memo: legit senders (a node that knew them before), and for forged_memo 4096 victims, worked out by a
    // first node process with an unlimited budget and kept in the state directory for the measured one.
    let memo_victims = if a.mix == "forged_memo" { 4096 } else { 0 };
    {
        let node = start_node(&a, dir.path(), &senders, u32::MAX / 4);
        let warm = flood_packets(
            "forged_memo",
            &victims,
            memo_victims.max(1),
            &runs_id,
            &node.public,
        );
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        for p in warm.iter().take(memo_victims) {
            let _ = sock.send_to(p, node.link);
            std::thread::sleep(Duration::from_micros(300));
        }
        for id in &legit_ids {
            let (t, _) = new_sender(
                id.clone(),
                node.public,
                node.link,
                0,
                Duration::from_secs(5),
            );
            assert!(t.is_some(), "a legit sender's first contact");
        }
        std::thread::sleep(Duration::from_millis(300));
        node.stop();
    }
    let node = start_node(&a, dir.path(), &senders, a.budget);
    let stop = Arc::new(AtomicBool::new(false));
    let lout = Arc::new(LegitOut::default());
    let fout = Arc::new(FloodOut::default());
    let legit_thread = {
        let (stop, out, ids, to, public) = (
            stop.clone(),
            lout.clone(),
            legit_ids.clone(),
            node.link,
            node.public,
        );
        let (rate, backlog) = (a.rate_each, a.backlog);
        std::thread::spawn(move || legit(ids, public, to, rate, backlog, stop, out))
    };
    // `--flood-to sink`: the same flood, sent to a socket of this process that nobody reads. The machine does the
    // same sending and loopback delivery, the node none of the reading: on two cores shared by the tool, the
    // senders and the node, what senders lose beside a sink flood is the machine's, beside a node flood the node's.
    // `--flood-to read`: the same flood to a socket like the node's (its buffer size) that a thread of this process
    // only reads: the limit, what the cheapest possible receiver of the flood costs the machine.
    let sink = matches!(a.flood_to.as_str(), "sink" | "read").then(|| {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        let size = if a.flood_to == "read" {
            a.recv_buffer
        } else {
            4096
        };
        let _ = socket2::SockRef::from(&s).set_recv_buffer_size(size);
        s
    });
    let flood_target = match (&sink, a.flood_to.as_str()) {
        (Some(s), _) => s.local_addr().unwrap(),
        (None, "node") => node.link,
        (None, other) => panic!("--flood-to {other}: give node, sink or read"),
    };
    let reader = match (&sink, a.flood_to.as_str()) {
        (Some(s), "read") => {
            let (sock, stop, out) = (s.try_clone().unwrap(), stop.clone(), fout.clone());
            Some(std::thread::spawn(move || read_sink(sock, stop, out)))
        }
        _ => None,
    };
    let flood_thread = (a.flood > 0).then(|| {
        let packets = flood_packets(&a.mix, &victims, memo_victims, &runs_id, &node.public);
        let (stop, out, to, pps, prefixes) = (
            stop.clone(),
            fout.clone(),
            flood_target,
            a.flood,
            a.prefixes,
        );
        std::thread::spawn(move || flood(packets, pps, prefixes, to, stop, out))
    });
    std::thread::sleep(Duration::from_secs_f64(a.warmup));
    let m0 = node.scrape();
    let (cpu0, t0) = (node.cpu(), Instant::now());
    let (l_stored0, l_offered0, l_packets0, l_cpu0) = (
        lout.stored.load(Ordering::Relaxed),
        lout.offered.load(Ordering::Relaxed),
        lout.packets.load(Ordering::Relaxed),
        lout.cpu_us.load(Ordering::Relaxed),
    );
    let (f_sent0, f_cpu0, r_read0, r_cpu0) = (
        fout.sent.load(Ordering::Relaxed),
        fout.cpu_us.load(Ordering::Relaxed),
        fout.read.load(Ordering::Relaxed),
        fout.read_cpu_us.load(Ordering::Relaxed),
    );
    // New senders, one after another, during the window.
    let mut new_times = Vec::new();
    let mut new_cookies = 0;
    let mut mem_samples = Vec::new();
    let window = Duration::from_secs_f64(a.seconds);
    if a.new > 0 {
        for (i, id) in new_ids.iter().enumerate() {
            let (t, c) = new_sender(
                id.clone(),
                node.public,
                node.link,
                i,
                window.max(Duration::from_secs(10)),
            );
            new_times.push(t);
            new_cookies += c;
        }
    }
    while t0.elapsed() < window {
        std::thread::sleep(Duration::from_millis(250));
        mem_samples.push(node.memory());
    }
    let secs = t0.elapsed().as_secs_f64();
    let m1 = node.scrape();
    let cpu1 = node.cpu();
    let (mem_rss, mem_anon) = node.memory();
    let l_stored = lout.stored.load(Ordering::Relaxed) - l_stored0;
    let l_offered = lout.offered.load(Ordering::Relaxed) - l_offered0;
    let l_packets = lout.packets.load(Ordering::Relaxed) - l_packets0;
    let l_cpu = (lout.cpu_us.load(Ordering::Relaxed) - l_cpu0) as f64 / 1e6;
    let f_sent = fout.sent.load(Ordering::Relaxed) - f_sent0;
    let r_read = fout.read.load(Ordering::Relaxed) - r_read0;
    stop.store(true, Ordering::Relaxed);
    legit_thread.join().unwrap();
    if let Some(t) = flood_thread {
        t.join().unwrap();
    }
    if let Some(t) = reader {
        t.join().unwrap();
    }
    let f_cpu = (fout.cpu_us.load(Ordering::Relaxed) - f_cpu0) as f64 / 1e6;
    let r_cpu = (fout.read_cpu_us.load(Ordering::Relaxed) - r_cpu0) as f64 / 1e6;
    let d = |k: &str| metric(&m1, k) - metric(&m0, k);
    let stages = [
        "kernel",
        "size",
        "version",
        "unknown_key",
        "auth",
        "replay",
        "malformed",
        "turn_full",
        "x25519_budget",
        "cookie_required",
        "session_cap",
        "backpressure",
    ];
    let drops: serde_json::Map<String, serde_json::Value> = stages
        .iter()
        .map(|s| {
            (
                s.to_string(),
                serde_json::json!(d(&format!("pure_drops_total{{stage=\"{s}\"}}")) / secs),
            )
        })
        .collect();
    let stored = d("pure_records_stored_total{app=\"main\"}");
    // Per app, for a node given `--node-arg --apps --node-arg FILE` (research/012: inner outlets and lag budgets).
    let per_app = |family: &str, per_second: bool| -> serde_json::Map<String, serde_json::Value> {
        m1.keys()
            .filter_map(|k| {
                let app = k
                    .strip_prefix(family)?
                    .strip_prefix("{app=\"")?
                    .strip_suffix("\"}")?;
                let v = d(k);
                Some((
                    app.to_string(),
                    serde_json::json!(if per_second { v / secs } else { v }),
                ))
            })
            .collect()
    };
    let x = d("pure_x25519_total");
    let xa = d("pure_x25519_authentic_total");
    let mut new_ok: Vec<f64> = new_times.iter().flatten().copied().collect();
    new_ok.sort_by(f64::total_cmp);
    let line = serde_json::json!({
        "label": a.label,
        "mix": a.mix,
        "flood_to": a.flood_to,
        "flood_pps_target": a.flood,
        "flood_pps_sent": f_sent as f64 / secs,
        "prefixes": a.prefixes,
        "senders": a.senders,
        "rate_each": a.rate_each,
        "budget": a.budget,
        "recv_buffer": a.recv_buffer,
        "seconds": secs,
        "stored_per_s": stored / secs,
        "legit_stored_per_s": l_stored as f64 / secs,
        "legit_offered_per_s": l_offered as f64 / secs,
        "legit_packets_per_s": l_packets as f64 / secs,
        "legit_go_back_total": lout.go_back.load(Ordering::Relaxed),
        "legit_cookies_total": lout.cookies.load(Ordering::Relaxed),
        "legit_srtt_ms": lout.srtt_us.load(Ordering::Relaxed) as f64 / 1000.0,
        "x25519_per_s": x / secs,
        "x25519_wasted_per_s": (x - xa) / secs,
        "memo_hits_per_s": d("pure_memo_hits_total") / secs,
        "cookies_sent_per_s": d("pure_cookies_sent_total") / secs,
        "cookies_withheld_per_s": d("pure_cookies_withheld_total") / secs,
        "datagrams_per_s": d("pure_packets_received_total") / secs,
        "drops_per_s": drops,
        "apps_stored_per_s": per_app("pure_records_stored_total", true),
        "apps_pauses": per_app("pure_app_pauses_total", false),
        "held_back_paused_per_s": d("pure_records_held_back_total{why=\"paused\"}") / secs,
        "duplicates_per_s": d("pure_records_duplicate_total") / secs,
        "gaps_per_s": d("pure_records_gap_total") / secs,
        "commit_fraction": d("pure_commit_seconds_total") / secs,
        "turns_per_s": d("pure_turns_total{outcome=\"committed\"}") / secs,
        "sessions_active": metric(&m1, "pure_sessions_active"),
        "sessions_evicted": d("pure_sessions_evicted_total"),
        "node_cpu": (cpu1 - cpu0) / secs,
        "flood_cpu": f_cpu / secs,
        "reader_read_per_s": r_read as f64 / secs,
        "reader_cpu": r_cpu / secs,
        "legit_cpu": l_cpu / secs,
        "node_rss": mem_rss,
        "node_anon": mem_anon,
        "node_anon_min": mem_samples.iter().map(|m| m.1).min().unwrap_or(0),
        "node_anon_max": mem_samples.iter().map(|m| m.1).max().unwrap_or(0),
        "new_senders": a.new,
        "new_stored": new_ok.len(),
        "new_seconds_p50": new_ok.get(new_ok.len() / 2),
        "new_seconds_max": new_ok.last(),
        "new_cookies": new_cookies,
    });
    println!("{line}");
    node.stop();
}
