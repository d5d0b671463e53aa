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
//!   - `cookies`: the packets of `forged`, each echoing a real cookie for its socket's address (type 4): before the
//!     flood each socket sends forged first packets until the node answers with a COOKIE, and puts it in front of
//!     all it sends from then on (research/016: an attacker who receives at its addresses; a cookie is good for
//!     at least 120 s, longer than a run);
//!
//!   with `--flood-to sink` the same flood goes to a socket of this process that nobody reads: the control for what
//!   the flood costs the machine (two cores shared by tool, senders and node) rather than the node; with
//!   `--flood-to read` a thread of this process reads it and throws it away: the cheapest receiver there can be;
//! - **new**: with `--new N`, N senders the node has never heard from start one after another during the flood, each
//!   delivering one record; their time to stored and the COOKIEs they got are reported;
//! - **burst** (research/016, the memo's writes): with `--burst N`, N listed senders start after the warm-up, one
//!   every 1/`--burst-rate` s (0: all at once), each delivering one record over a socket of its own; new to the
//!   node, or with `--burst-known` in its memo (their secrets put there by this tool: the same records and
//!   sessions to store, no new secret). `--memo-fill K` puts K more secrets (random keys) into the memo before the measured node
//!   starts, so a new secret goes into a memo of that size. The node's disk writes (`write_bytes` less
//!   `cancelled_write_bytes` of /proc/PID/io) are counted from the start of the window through its exit, read from
//!   the exited process before it is reaped, so what it writes as it stops (its checkpoints) is counted too;
//!   `--settle S` waits S seconds after the window before stopping it. With `--memo-dir DIR --memo-dev DEV` the
//!   state directory lives in DIR, a filesystem of its own on block device DEV (a loop device made by the script),
//!   with its `apps/` (the stores) a symbolic link back to this tool's temporary directory: once the node has
//!   started, the memo is all it writes on DEV, and the sectors DEV wrote (/sys/block/DEV/stat, after a `syncfs`
//!   of DIR) over the same span are the memo's writes, the filesystem's journal included.
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
    burst: usize,
    burst_rate: f64,
    burst_known: bool,
    memo_fill: usize,
    settle: f64,
    memo_dir: Option<PathBuf>,
    memo_dev: Option<String>,
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
        burst: 0,
        burst_rate: 0.0,
        burst_known: false,
        memo_fill: 0,
        settle: 0.0,
        memo_dir: None,
        memo_dev: None,
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
            "--burst" => a.burst = val().parse().expect("n"),
            "--burst-rate" => a.burst_rate = val().parse().expect("senders/s"),
            "--burst-known" => a.burst_known = true,
            "--memo-fill" => a.memo_fill = val().parse().expect("n"),
            "--settle" => a.settle = val().parse().expect("s"),
            "--memo-dir" => a.memo_dir = Some(PathBuf::from(val())),
            "--memo-dev" => a.memo_dev = Some(val()),
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

/// Bytes block device `dev` has written, once what is dirty on the filesystem of `dir` is written out.
fn device_written(dir: &Path, dev: &str) -> u64 {
    if let Ok(d) = std::fs::File::open(dir) {
        // SAFETY: syncfs on a descriptor we own.
        unsafe {
            libc::syncfs(d.as_raw_fd());
        }
    }
    let stat = std::fs::read_to_string(format!("/sys/block/{dev}/stat")).unwrap_or_default();
    // The seventh field: sectors written, of 512 bytes.
    stat.split_whitespace()
        .nth(6)
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0)
        * 512
}

/// (write_bytes, cancelled_write_bytes) of /proc/PID/io.
fn io_of(pid: u32) -> (u64, u64) {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).unwrap_or_default();
    let field = |name: &str| {
        io.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    (field("write_bytes:"), field("cancelled_write_bytes:"))
}

impl NodeProc {
    /// Bytes the node made the disk write so far: dirtied in the page cache, less what was cancelled (truncated or
    /// deleted before write-back).
    fn written(&self) -> u64 {
        let (w, c) = io_of(self.child.id());
        w.saturating_sub(c)
    }
    /// Stops the node and returns the bytes it made the disk write through its exit: the exited process is read
    /// before it is reaped.
    fn stop_written(mut self) -> u64 {
        let pid = self.child.id();
        // SAFETY: kill and waitid on a pid we spawned and have not reaped.
        let written = unsafe {
            libc::kill(pid as i32, libc::SIGTERM);
            let mut info: libc::siginfo_t = std::mem::zeroed();
            libc::waitid(libc::P_PID, pid, &mut info, libc::WEXITED | libc::WNOWAIT);
            let (w, c) = io_of(pid);
            w.saturating_sub(c)
        };
        let _ = self.child.wait();
        written
    }
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
    /// `cookies`: sockets that got a COOKIE to echo.
    cookie_sockets: AtomicU64,
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
        "forged" | "cookies" => victims.len().saturating_sub(memo_victims).max(1),
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
            "forged" | "cookies" => {
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

/// `cookies`: from each socket, forged first packets until the node answers with a COOKIE (or 5 s pass); returns
/// the 17 bytes each socket puts in front of its packets (type 4 and the cookie), or `None` for a socket that got
/// none.
fn fetch_cookies(
    socks: &[UdpSocket],
    packets: &[Vec<u8>],
    to: SocketAddr,
) -> Vec<Option<[u8; wire::COOKIE_PREFIX_LEN]>> {
    let mut buf = [0u8; 2048];
    let mut next = 0usize;
    socks
        .iter()
        .map(|s| {
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_secs(5) {
                let _ = s.send_to(&packets[next % packets.len()], to);
                next += 1;
                std::thread::sleep(Duration::from_micros(500));
                while let Ok(n) = s.recv(&mut buf) {
                    if let Ok(c) = wire::CookiePacket::parse(&buf[..n]) {
                        let mut prefix = [0u8; wire::COOKIE_PREFIX_LEN];
                        prefix[0] = wire::TYPE_SENDER_COOKIE;
                        prefix[1..].copy_from_slice(&c.cookie);
                        return Some(prefix);
                    }
                }
            }
            None
        })
        .collect()
}

fn flood(
    packets: Vec<Vec<u8>>,
    pps: u64,
    prefixes: u32,
    echo_cookies: bool,
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
    // The cookie each socket echoes (`cookies`): fetched before the flood starts; a socket that got none sends
    // its packets without one.
    let cookies = if echo_cookies {
        let c = fetch_cookies(&socks, &packets, to);
        out.cookie_sockets
            .store(c.iter().flatten().count() as u64, Ordering::Relaxed);
        c
    } else {
        vec![None; socks.len()]
    };
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
        // Per datagram the socket's cookie prefix (if any) and the packet, gathered by the kernel.
        let mut iovs: Vec<[libc::iovec; 2]> = Vec::with_capacity(n);
        let prefix = cookies[sock].as_ref();
        for k in 0..n {
            let p = &packets[(next + k) % packets.len()];
            let packet = libc::iovec {
                iov_base: p.as_ptr() as *mut libc::c_void,
                iov_len: p.len(),
            };
            iovs.push(match prefix {
                Some(c) => [
                    libc::iovec {
                        iov_base: c.as_ptr() as *mut libc::c_void,
                        iov_len: c.len(),
                    },
                    packet,
                ],
                None => [packet, packet],
            });
        }
        let parts = if prefix.is_some() { 2 } else { 1 };
        let mut hdrs: Vec<libc::mmsghdr> = iovs
            .iter_mut()
            .map(|iov| {
                // SAFETY: plain old data, zero is empty.
                let mut h: libc::mmsghdr = unsafe { std::mem::zeroed() };
                h.msg_hdr.msg_name = sa.as_ptr() as *mut libc::c_void;
                h.msg_hdr.msg_namelen = sa.len();
                h.msg_hdr.msg_iov = iov.as_mut_ptr();
                h.msg_hdr.msg_iovlen = parts;
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

/// `--burst`: `ids` each deliver one record over a socket of their own, sender i starting `i / rate` s after the
/// first (rate 0: all at once); returns (records stored, seconds from the first start to the last stored).
fn burst(
    ids: &[Identity],
    node: PublicKeyBytes,
    to: SocketAddr,
    rate: f64,
    limit: Duration,
) -> (usize, f64) {
    let mut links: Vec<(UdpSocket, Sender, bool)> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| {
            // 250 addresses a /24, from 127.0.4.0/24 on.
            let sock = UdpSocket::bind(SocketAddr::from((
                [127, 0, 4 + (i / 250) as u8, 1 + (i % 250) as u8],
                0,
            )))
            .unwrap();
            sock.connect(to).unwrap();
            sock.set_nonblocking(true).unwrap();
            let mut s = Sender::new(SenderConfig::new(id.clone(), node)).unwrap();
            s.open_flow(APP, FlowStart::At(1)).unwrap();
            s.queue(APP, record(i as u64)).unwrap();
            (sock, s, false)
        })
        .collect();
    let t0 = Instant::now();
    let mut stored = 0;
    let mut last = 0.0;
    let mut buf = Vec::new();
    let mut inbuf = vec![0u8; 2048];
    while stored < links.len() && t0.elapsed() < limit {
        let elapsed = t0.elapsed().as_secs_f64();
        let started = if rate > 0.0 {
            ((elapsed * rate) as usize + 1).min(links.len())
        } else {
            links.len()
        };
        for (sock, s, done) in links[..started].iter_mut() {
            if *done {
                continue;
            }
            let now = Instant::now();
            s.handle_timeout(now);
            while s.poll_transmit(now, &mut buf) {
                let _ = sock.send(&buf);
            }
            while let Ok(n) = sock.recv(&mut inbuf) {
                s.handle_datagram(Instant::now(), &inbuf[..n]);
            }
            while let Some(e) = s.poll_event() {
                if matches!(e, SenderEvent::Stored { through: 1, .. }) {
                    *done = true;
                    stored += 1;
                    last = t0.elapsed().as_secs_f64();
                }
            }
        }
        std::thread::sleep(Duration::from_micros(500));
    }
    (stored, last)
}

/// Puts `secrets` into the memo file of a stopped node (the layout every build so far reads: a `secrets` table).
fn fill_memo(path: &Path, secrets: impl Iterator<Item = ([u8; 32], [u8; 32])>) {
    let mut conn = rusqlite::Connection::open(path).expect("the memo");
    conn.pragma_update(None, "cache_size", -262_144).unwrap();
    let tx = conn.transaction().unwrap();
    {
        let mut put = tx
            .prepare("INSERT OR REPLACE INTO secrets (public, shared) VALUES (?1, ?2)")
            .unwrap();
        for (k, v) in secrets {
            put.execute((&k[..], &v[..])).unwrap();
        }
    }
    tx.commit().unwrap();
    // Into the file, so the measured node starts with an empty -wal.
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();
}

// ---------------------------------------------------------------- one run

fn main() {
    let a = args();
    let dir = tempfile::tempdir().unwrap();
    let legit_ids: Vec<Identity> = (0..a.senders).map(|_| Identity::generate()).collect();
    let new_ids: Vec<Identity> = (0..a.new).map(|_| Identity::generate()).collect();
    let burst_ids: Vec<Identity> = (0..a.burst).map(|_| Identity::generate()).collect();
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
        for (i, id) in burst_ids.iter().enumerate() {
            writeln!(f, "burst{i} {}", encode_key(id.public())).unwrap();
        }
        writeln!(f, "runs {}", encode_key(runs_id.public())).unwrap();
        for (i, k) in victims.iter().enumerate() {
            writeln!(f, "victim{i} {}", encode_key(k)).unwrap();
        }
    }
    // The memo: legit senders (and with `--burst-known` the burst's), learned by a first node process with an
    // unlimited budget and kept in the state directory for the measured one; for forged_memo 4096 victims, and
    // `--memo-fill` random keys, put into the file between the two. (A forged packet's secret need not be right:
    // it costs the memo lookup, HKDF and open all the same. Earlier runs had the first node learn the victims from
    // forged packets, which only a node that memoises secrets of packets that do not authenticate does.)
    let memo_victims = if a.mix == "forged_memo" { 4096 } else { 0 };
    let memo_dir = a.memo_dir.as_ref().map(|d| {
        // STATE on the memo's filesystem, its apps/ (the stores) back on this one: during the window the memo is
        // all that is written there.
        let mine = tempfile::tempdir_in(d).expect("a directory in --memo-dir");
        std::fs::create_dir_all(dir.path().join("apps")).unwrap();
        std::fs::create_dir_all(mine.path().join("state")).unwrap();
        std::os::unix::fs::symlink(dir.path().join("apps"), mine.path().join("state/apps"))
            .unwrap();
        std::os::unix::fs::symlink(mine.path().join("state"), dir.path().join("state")).unwrap();
        mine
    });
    let node_public = {
        let node = start_node(&a, dir.path(), &senders, u32::MAX / 4);
        let public = node.public;
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
        public
    };
    // `--burst-known`: the burst's senders' secrets, worked out on their side (X25519 is symmetric), so the node
    // has them in its memo and nothing of theirs in its store: the same records to store as new senders, no new
    // secret.
    let known: Vec<([u8; 32], [u8; 32])> = if a.burst_known {
        burst_ids
            .iter()
            .map(|id| (*id.public(), id.shared_secret(&node_public).unwrap()))
            .collect()
    } else {
        Vec::new()
    };
    if memo_victims + a.memo_fill + known.len() > 0 {
        let mut rng = Xorshift(0x5eed_0016);
        let mut random = move || {
            let mut k = [0u8; 32];
            for c in k.chunks_mut(8) {
                c.copy_from_slice(&rng.next().to_le_bytes());
            }
            k
        };
        fill_memo(
            &dir.path().join("state").join("memo.sqlite"),
            victims[..memo_victims]
                .iter()
                .map(|k| (*k, [0x5a; 32]))
                .chain(known)
                .chain((0..a.memo_fill).map(move |_| (random(), random()))),
        );
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
        let echo = a.mix == "cookies";
        std::thread::spawn(move || flood(packets, pps, prefixes, echo, to, stop, out))
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
    let written0 = node.written();
    let memo_device = || match (&memo_dir, &a.memo_dev) {
        (Some(d), Some(dev)) => Some(device_written(d.path(), dev)),
        _ => None,
    };
    let memo_device0 = memo_device();
    let (burst_stored, burst_seconds) = if a.burst > 0 {
        burst(
            &burst_ids,
            node.public,
            node.link,
            a.burst_rate,
            Duration::from_secs(120),
        )
    } else {
        (0, 0.0)
    };
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
        "try_budget",
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
        "new_seconds": new_times,
        "flood_cookie_sockets": fout.cookie_sockets.load(Ordering::Relaxed),
        "burst": a.burst,
        "burst_rate": a.burst_rate,
        "burst_known": a.burst_known,
        "burst_stored": burst_stored,
        "burst_seconds": burst_seconds,
        "memo_fill": a.memo_fill,
    });
    std::thread::sleep(Duration::from_secs_f64(a.settle));
    let written = node.stop_written();
    let mut line = line;
    line["node_written_bytes"] = serde_json::json!(written.saturating_sub(written0));
    if let (Some(d0), Some(d1)) = (memo_device0, memo_device()) {
        line["memo_device_written_bytes"] = serde_json::json!(d1.saturating_sub(d0));
    }
    println!("{line}");
}
