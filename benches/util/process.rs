//! What the benches that run the real binary read from outside it (`idle_links`, `downlink`, `send_path`, `fleet`):
//! its memory and CPU time from /proc, a child's CPU time from wait4, a series of its `/metrics`, and work spread
//! over all cores of the machine that drives it.

// Each bench that includes this module uses a part of it.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// A `kB` field of /proc/PID/status (`RssAnon:`, `RssFile:`, `VmRSS:`), 0 if it is missing.
pub fn proc_kb(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| {
            l.strip_prefix(field)?
                .trim()
                .strip_suffix("kB")?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

/// One series of the node's `/metrics` (the name with its labels), 0 if it is not there.
pub fn metric(http: SocketAddr, name: &str) -> f64 {
    let mut s = TcpStream::connect(http).unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

/// Maps `0..n` through `f` on all cores, keeping the order.
pub fn par_map<R: Send>(n: usize, f: impl Fn(usize) -> R + Sync) -> Vec<R> {
    let threads = std::thread::available_parallelism().map_or(1, |p| p.get());
    let chunk = n.div_ceil(threads).max(1);
    let f = &f;
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .step_by(chunk)
            .map(|start| {
                s.spawn(move || (start..(start + chunk).min(n)).map(f).collect::<Vec<_>>())
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    })
}

/// What a node prints before `ready`: its link address, its metrics listener and its public key.
pub struct Banner {
    pub link: SocketAddr,
    pub http: SocketAddr,
    pub public: [u8; 32],
}

/// Reads the node's standard output up to its `ready` line, then keeps draining it on a thread so the node never
/// blocks on a full pipe.
pub fn read_banner(stdout: std::process::ChildStdout) -> Banner {
    use std::io::BufRead;
    let mut lines = std::io::BufReader::new(stdout).lines();
    let (mut link, mut http, mut public) = (None, None, None);
    for line in lines.by_ref() {
        let line = line.unwrap();
        if let Some(v) = line.strip_prefix("public key:") {
            public = Some(pure_serve::keys::parse_public_key(v.trim()).unwrap());
        } else if let Some(v) = line.strip_prefix("link:") {
            link = Some(v.trim().trim_start_matches("udp").trim().parse().unwrap());
        } else if let Some(v) = line.strip_prefix("metrics:") {
            let url = v.trim().trim_start_matches("http://");
            http = Some(url.split('/').next().unwrap().parse().unwrap());
        } else if line == "ready" {
            break;
        }
    }
    std::thread::spawn(move || for _ in lines {});
    Banner {
        link: link.expect("the node printed its link address"),
        http: http.expect("the node printed its metrics listener"),
        public: public.expect("the node printed its public key"),
    }
}

/// CPU time of every thread of process `pid` now (ns on the CPU, from schedstat).
pub fn process_cpu(pid: u32) -> Duration {
    let mut total = 0u64;
    if let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for e in dir.flatten() {
            if let Ok(s) = std::fs::read_to_string(e.path().join("schedstat")) {
                total += s
                    .split_whitespace()
                    .next()
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0);
            }
        }
    }
    Duration::from_nanos(total)
}

/// Waits for child `pid`; its exit status and CPU time (user + system, all its threads).
pub fn wait_with_cpu(pid: u32) -> (i32, Duration) {
    let mut status = 0;
    // SAFETY: a zeroed rusage is a valid out-parameter; `pid` is our own child, not yet waited for.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::wait4(pid as i32, &mut status, 0, &mut usage) };
    assert_eq!(r, pid as i32, "wait4");
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    (status, tv(usage.ru_utime) + tv(usage.ru_stime))
}
