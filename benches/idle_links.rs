//! research/002-idle-links: what an idle link costs the node, measured on the real binary.
//!
//! For each run it writes a senders file of N senders, starts `pure-serve` on it, and reads the node's memory from
//! /proc when it is ready (no sender has sent: "listed" phase). With `--send`, every sender then delivers one record
//! (a new run each, so one X25519 per sender on the node) and the tool waits until the node has swept every session
//! ("after_idle" phase) and reads the memory again. Prints one JSON object per measurement.
//!
//! With `--reload`, the senders file gets one more line and the node a SIGHUP; the time until the node counts the
//! reload done ("reload" phase) is the whole parse-and-index path, and the resident peak above rest during it (mapped
//! pages included) is what a reload costs in memory (research/018).
//!
//! Then ("changed" phase) the node is stopped, the senders file gets one more line, and the node is started again:
//! the time to `ready` with a file that changed since the last start (issue 17: ≤ 0.30 s at a million senders) and
//! the node's CPU time until then, beside the machine's own floor in the same run, a plain read of the same file in
//! 1 MiB reads (the fastest of three: `plain_read_ms`, and `ready_per_plain_read`), so a slow or busy machine shows
//! as such (research/027).
//!
//! Usage: cargo bench --bench idle_links -- [--senders N]... [--runs R] [--send] [--reload] [--bin PATH] [--label L]

#[path = "util/process.rs"]
mod process;

use std::io::Write;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use process::{metric, par_map, proc_kb, read_banner};

/// The CPU time of process `pid` so far, all its threads, those that ended included (/proc/PID/stat: clock ticks).
fn cpu_so_far(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    Duration::from_secs_f64(ticks as f64 / per_second as f64)
}

/// Reads `path` whole in 1 MiB reads, as the node reads a senders file, and drops it: how long the machine takes
/// (the fastest of three reads, so the floor is not one read's bad luck).
fn plain_read(path: &Path) -> Duration {
    use std::io::Read;
    let mut buf = vec![0u8; 1 << 20];
    (0..3)
        .map(|_| {
            let start = Instant::now();
            let mut f = std::fs::File::open(path).unwrap();
            while f.read(&mut buf).unwrap() > 0 {}
            start.elapsed()
        })
        .min()
        .unwrap()
}
use pure_serve::keys::encode_key;
use pure_serve::proto::crypto::Identity;
use pure_serve::proto::sender::{FlowStart, Sender, SenderConfig};

struct Args {
    senders: Vec<usize>,
    runs: usize,
    send: bool,
    reload: bool,
    bin: String,
    label: String,
}

fn args() -> Args {
    let mut a = Args {
        senders: Vec::new(),
        runs: 1,
        send: false,
        reload: false,
        bin: env!("CARGO_BIN_EXE_pure-serve").to_string(),
        label: "current".into(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--senders" => a.senders.push(it.next().unwrap().parse().unwrap()),
            "--runs" => a.runs = it.next().unwrap().parse().unwrap(),
            "--send" => a.send = true,
            "--reload" => a.reload = true,
            "--bin" => a.bin = it.next().unwrap(),
            "--label" => a.label = it.next().unwrap(),
            "--bench" => {}
            other => panic!("unknown argument {other}"),
        }
    }
    if a.senders.is_empty() {
        a.senders = vec![0, 100_000, 1_000_000];
    }
    a
}

struct Node {
    child: Child,
    link: SocketAddr,
    http: SocketAddr,
    public: [u8; 32],
    ready: Duration,
}

fn start_node(bin: &str, dir: &Path, idle_ms: u64) -> Node {
    let start = Instant::now();
    let mut child = Command::new(bin)
        .arg("--state")
        .arg(dir.join("state"))
        .arg("--senders")
        .arg(dir.join("senders"))
        .args([
            "--bind",
            "127.0.0.1",
            "--link-port",
            "0",
            "--http-port",
            "0",
        ])
        .args([
            "--link-idle-ms",
            &idle_ms.to_string(),
            "--recv-buffer",
            "4194304",
        ])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let banner = read_banner(child.stdout.take().unwrap());
    let ready = start.elapsed();
    Node {
        child,
        link: banner.link,
        http: banner.http,
        public: banner.public,
        ready,
    }
}

/// Makes `n` identities on all cores.
fn identities(n: usize) -> Vec<Identity> {
    par_map(n, |_| Identity::generate())
}

/// A sender with its first packet (one record, data in the first packet of a new run), made ahead of time on all
/// cores so the delivery measures the node, not the generator's X25519.
fn first_packets(ids: &[Identity], node: &[u8; 32]) -> Vec<(Sender, Vec<u8>)> {
    par_map(ids.len(), |i| {
        let mut sender = Sender::new(SenderConfig::new(ids[i].clone(), *node)).unwrap();
        sender.open_flow("main", FlowStart::At(1)).unwrap();
        sender
            .queue("main", b"hello from an idle link".to_vec())
            .unwrap();
        let mut p = Vec::new();
        assert!(sender.poll_transmit(Instant::now(), &mut p));
        (sender, p)
    })
}

/// Each sender sends its first packet; 1024 sockets each carry one sender at a time. An answer counts only if it
/// authenticates for the sender in flight on that socket and says its record is stored (a late duplicate answer
/// for the previous sender fails authentication under the new sender's keys). Returns when all are stored.
fn deliver_one_each(mut senders: Vec<(Sender, Vec<u8>)>, node: &Node) -> Duration {
    let start = Instant::now();
    let total = senders.len();
    let sockets: Vec<UdpSocket> = (0..1024)
        .map(|_| {
            let s = UdpSocket::bind("127.0.0.1:0").unwrap();
            s.connect(node.link).unwrap();
            s.set_nonblocking(true).unwrap();
            s
        })
        .collect();
    let mut in_flight: Vec<Option<(Sender, Vec<u8>, Instant)>> =
        (0..sockets.len()).map(|_| None).collect();
    let mut done = 0;
    let mut buf = [0u8; 2048];
    let mut fds: Vec<libc::pollfd> = sockets
        .iter()
        .map(|s| libc::pollfd {
            fd: s.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    while done < total {
        for (k, slot) in in_flight.iter_mut().enumerate() {
            match slot {
                None => {
                    if let Some((sender, p)) = senders.pop() {
                        let _ = sockets[k].send(&p);
                        *slot = Some((sender, p, Instant::now()));
                    }
                }
                Some((_, p, at)) if at.elapsed() > Duration::from_secs(2) => {
                    let _ = sockets[k].send(p);
                    *at = Instant::now();
                }
                _ => {}
            }
        }
        // SAFETY: a valid array of pollfds for the call's duration.
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 10) };
        for (k, fd) in fds.iter_mut().enumerate() {
            if fd.revents & libc::POLLIN == 0 {
                continue;
            }
            fd.revents = 0;
            while let Ok(n) = sockets[k].recv(&mut buf) {
                let stored = match &mut in_flight[k] {
                    Some((sender, _, _)) => {
                        sender.handle_datagram(Instant::now(), &buf[..n]);
                        sender.stored_through("main") == Some(1)
                    }
                    None => false,
                };
                if stored {
                    in_flight[k] = None;
                    done += 1;
                }
            }
        }
    }
    start.elapsed()
}

fn main() {
    let a = args();
    for run in 0..a.runs {
        for &n in &a.senders {
            let dir = tempfile::tempdir().unwrap();
            let ids = if a.send { identities(n) } else { Vec::new() };
            let mut text = String::with_capacity(n * 56);
            for i in 0..n {
                let key = match ids.get(i) {
                    Some(id) => *id.public(),
                    // Idle senders that never send need no private key: any 32 bytes make a listed key.
                    None => pure_serve::proto::crypto::random_array(),
                };
                text.push_str(&format!("dev{i:07} {}\n", encode_key(&key)));
            }
            std::fs::write(dir.path().join("senders"), text).unwrap();
            // First start builds the index (if the build keeps one); the measured start is the second.
            let first = start_node(&a.bin, dir.path(), 1000);
            let first_ready = first.ready;
            let mut first = first;
            first.child.kill().unwrap();
            first.child.wait().unwrap();
            let mut node = start_node(&a.bin, dir.path(), 1000);
            let pid = node.child.id();
            std::thread::sleep(Duration::from_millis(200));
            println!(
                "{{\"bench\":\"idle_links\",\"label\":\"{}\",\"run\":{run},\"senders\":{n},\"phase\":\"listed\",\"first_ready_ms\":{:.1},\"ready_ms\":{:.1},\"rss_anon_kb\":{},\"rss_file_kb\":{}}}",
                a.label,
                first_ready.as_secs_f64() * 1e3,
                node.ready.as_secs_f64() * 1e3,
                proc_kb(pid, "RssAnon:"),
                proc_kb(pid, "RssFile:")
            );
            if a.reload {
                // A reload of a changed file (one sender more): the full parse-and-index path a SIGHUP takes.
                let mut text = std::fs::read_to_string(dir.path().join("senders")).unwrap();
                text.push_str(&format!(
                    "added-by-reload {}\n",
                    encode_key(&pure_serve::proto::crypto::random_array())
                ));
                std::fs::write(dir.path().join("senders"), text).unwrap();
                let before = metric(node.http, "pure_reloads_total");
                let rest_kb = proc_kb(pid, "VmRSS:");
                let mut peak_kb = rest_kb;
                let t = Instant::now();
                // SAFETY: kill(2) on our own child.
                unsafe { libc::kill(pid as i32, libc::SIGHUP) };
                // The resident peak, mapped pages included (issue 17: ≤ 64 MB above rest; research/018), sampled
                // between the polls of the reload counter.
                while metric(node.http, "pure_reloads_total") <= before {
                    assert!(
                        t.elapsed() < Duration::from_secs(60),
                        "reload did not finish"
                    );
                    peak_kb = peak_kb.max(proc_kb(pid, "VmRSS:"));
                    std::thread::sleep(Duration::from_millis(2));
                }
                let took = t.elapsed();
                println!(
                    "{{\"bench\":\"idle_links\",\"label\":\"{}\",\"run\":{run},\"senders\":{n},\"phase\":\"reload\",\"reload_ms\":{:.1},\"rss_rest_kb\":{rest_kb},\"rss_peak_above_rest_kb\":{},\"senders_after\":{}}}",
                    a.label,
                    took.as_secs_f64() * 1e3,
                    peak_kb - rest_kb,
                    metric(node.http, "pure_senders")
                );
            }
            if a.send && n > 0 {
                let took = deliver_one_each(first_packets(&ids, &node.public), &node);
                let peak_anon = proc_kb(pid, "RssAnon:");
                let deadline = Instant::now() + Duration::from_secs(120);
                while metric(node.http, "pure_sessions_active") > 0.0 && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(200));
                }
                std::thread::sleep(Duration::from_millis(500));
                // Read after the sweep: the metrics snapshot is published after each turn's acks are sent.
                let stored = metric(node.http, "pure_records_stored_total{app=\"main\"}");
                println!(
                    "{{\"bench\":\"idle_links\",\"label\":\"{}\",\"run\":{run},\"senders\":{n},\"phase\":\"after_idle\",\"deliver_s\":{:.2},\"stored\":{stored},\"x25519\":{},\"sessions\":{},\"rss_anon_after_send_kb\":{peak_anon},\"rss_anon_kb\":{},\"rss_file_kb\":{}}}",
                    a.label,
                    took.as_secs_f64(),
                    metric(node.http, "pure_x25519_total"),
                    metric(node.http, "pure_sessions_active"),
                    proc_kb(pid, "RssAnon:"),
                    proc_kb(pid, "RssFile:")
                );
            }
            node.child.kill().unwrap();
            node.child.wait().unwrap();
            if n > 0 {
                // A start with a file changed since the last start: parsed, checked and indexed again.
                let path = dir.path().join("senders");
                let mut f = std::fs::OpenOptions::new()
                    .append(true)
                    .open(&path)
                    .unwrap();
                writeln!(
                    f,
                    "added-before-start {}",
                    encode_key(&pure_serve::proto::crypto::random_array())
                )
                .unwrap();
                drop(f);
                let plain = plain_read(&path);
                let mut node = start_node(&a.bin, dir.path(), 1000);
                let cpu = cpu_so_far(node.child.id());
                println!(
                    "{{\"bench\":\"idle_links\",\"label\":\"{}\",\"run\":{run},\"senders\":{n},\"phase\":\"changed\",\"ready_ms\":{:.1},\"cpu_to_ready_ms\":{:.0},\"plain_read_ms\":{:.1},\"ready_per_plain_read\":{:.1},\"load_1m\":{}}}",
                    a.label,
                    node.ready.as_secs_f64() * 1e3,
                    cpu.as_secs_f64() * 1e3,
                    plain.as_secs_f64() * 1e3,
                    node.ready.as_secs_f64() / plain.as_secs_f64(),
                    std::fs::read_to_string("/proc/loadavg")
                        .unwrap()
                        .split_whitespace()
                        .next()
                        .unwrap()
                );
                node.child.kill().unwrap();
                node.child.wait().unwrap();
            }
            std::io::stdout().flush().unwrap();
        }
    }
}
