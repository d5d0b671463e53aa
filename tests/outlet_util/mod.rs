//! Helpers for the end-to-end tests of outlets (tests/e2e_*.rs): real `pure-serve` processes with fixed ports so a
//! killed node comes back where its peers look for it, `records --json` of an app, `pure-serve send` to an app, a
//! small HTTPS webhook receiver (hyper and tokio-rustls on a runtime of its own), and name servers that never
//! answer or answer "no such name". Every wait polls with a generous deadline; nothing asserts how long anything
//! took.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::Write;
use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::ops_util::{DEADLINE, NodeProcess, bin};

/// `records --json --app APP` of a state directory, as parsed JSON values (empty if the store is not made yet).
pub fn records(state: &Path, app: &str) -> Vec<serde_json::Value> {
    records_in(app, &["--state", state.to_str().unwrap()])
}

/// `records --json --app APP` of the store `store_args` name (`--state DIR`, `--store URL`), as parsed JSON values
/// (empty if it cannot be read yet).
pub fn records_in(app: &str, store_args: &[&str]) -> Vec<serde_json::Value> {
    let out = Command::new(bin())
        .args(["records", "--json", "--app", app])
        .args(store_args)
        .output()
        .unwrap();
    if !out.status.success() {
        return Vec::new();
    }
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Starts a node on `127.0.0.1` with the given ports (0 picks one; give the ports it got to start it again in the
/// same place after a kill) and waits for its banner.
pub fn start(state: &Path, args: &[String], link_port: u16, http_port: u16) -> NodeProcess {
    let mut cmd = Command::new(bin());
    cmd.arg("--state")
        .arg(state)
        .args(["--bind", "127.0.0.1"])
        .args(["--link-port", &link_port.to_string()])
        .args(["--http-port", &http_port.to_string()])
        // A fixed HTTP port would put the metrics at the default 7382, where nodes side by side collide.
        .args(["--metrics-listen", "127.0.0.1:0"])
        .args(args)
        .env("RUST_LOG", "info")
        .env_remove("NOTIFY_SOCKET")
        .env_remove("WATCHDOG_USEC")
        .env_remove("WATCHDOG_PID")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    NodeProcess::attach(cmd.spawn().unwrap(), state)
}

/// SIGKILLs `node` and starts it again with the same state, arguments and ports.
pub fn kill_and_restart(node: &mut NodeProcess, args: &[String]) {
    let (link, http) = (node.link.port(), node.http.port());
    node.child.kill().unwrap();
    node.child.wait().unwrap();
    let state = node.state.clone();
    *node = start(&state, args, link, http);
}

/// Strings for a node's command line.
/// Writes node `name`'s senders file (`senders-NAME`) and apps file (`NAME.toml`) under `dir`; their paths.
pub fn node_files(dir: &Path, name: &str, senders: &str, apps: &str) -> (PathBuf, PathBuf) {
    let (senders_file, apps_file) = (
        dir.join(format!("senders-{name}")),
        dir.join(format!("{name}.toml")),
    );
    std::fs::write(&senders_file, senders).unwrap();
    std::fs::write(&apps_file, apps).unwrap();
    (senders_file, apps_file)
}

pub fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// `pure-serve send --app APP` to `node` from `key`, reading records from its standard input (the caller writes
/// them), giving up after `timeout_s` without progress.
pub fn spawn_send(key: &Path, node: &NodeProcess, app: &str, timeout_s: u64) -> Child {
    Command::new(bin())
        .arg("send")
        .arg("--key")
        .arg(key)
        .args(["--node", &node.public_key, "--to", &node.link.to_string()])
        .args(["--app", app, "--timeout", &timeout_s.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Writes `NAME line K` for K in `1..=count` to the send's standard input from a thread, `batch` lines at a time
/// with `pause` between batches (so kills land in the middle of a delivery), then closes it.
pub fn feed_lines(
    child: &mut Child,
    name: &str,
    count: u64,
    batch: u64,
    pause: Duration,
) -> std::thread::JoinHandle<()> {
    feed_lines_gated(
        child,
        name,
        count,
        batch,
        pause,
        Arc::new(AtomicU64::new(count)),
    )
}

/// [`feed_lines`], writing line K only once `gate` is at least K: a test that must kill nodes in the middle of a
/// delivery holds part of the input back until its last kill, so a slow machine cannot end the delivery first.
pub fn feed_lines_gated(
    child: &mut Child,
    name: &str,
    count: u64,
    batch: u64,
    pause: Duration,
    gate: Arc<AtomicU64>,
) -> std::thread::JoinHandle<()> {
    let mut stdin = child.stdin.take().unwrap();
    let name = name.to_string();
    std::thread::spawn(move || {
        let mut k = 1;
        while k <= count {
            let mut text = String::new();
            for _ in 0..batch {
                if k > count || k > gate.load(Ordering::Relaxed) {
                    break;
                }
                text.push_str(&format!("{name} line {k}\n"));
                k += 1;
            }
            stdin.write_all(text.as_bytes()).unwrap();
            std::thread::sleep(pause);
        }
    })
}

/// Waits for a send to exit and checks it exited 0.
pub fn assert_sent(child: Child, what: &str) {
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{what}: send failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

pub fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + DEADLINE * 2;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The value of a series of `/metrics`, e.g. `pure_outlet_errors_total{app="main",outlet="x",kind="tls"}`; 0 when
/// the page does not have it (an error kind not seen yet).
pub fn metric(node: &NodeProcess, series: &str) -> f64 {
    node.metric(series).unwrap_or(0.0)
}

pub fn errors(node: &NodeProcess, app: &str, outlet: &str, kind: &str) -> f64 {
    metric(
        node,
        &format!("pure_outlet_errors_total{{app=\"{app}\",outlet=\"{outlet}\",kind=\"{kind}\"}}"),
    )
}

pub fn lag(node: &NodeProcess, app: &str, outlet: &str, kind: &str) -> Option<f64> {
    node.metric(&format!(
        "pure_outlet_lag_records{{app=\"{app}\",outlet=\"{outlet}\",kind=\"{kind}\"}}"
    ))
}

/// The threads of a process, by name, from `/proc/PID/task`.
pub fn threads(pid: u32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            std::fs::read_to_string(e.path().join("comm"))
                .unwrap_or_default()
                .trim()
                .to_string()
        })
        .collect()
}

/// Checks that `got` (an app's records on a far node) holds each device's records `1..=per_device` exactly once,
/// in order, with `origin` the device, numbered `1, 2, 3, …` in the flow from `forwarded_by` (the forwarding
/// node's positions), payload `DEVICE line K`.
pub fn assert_each_once_forwarded(
    got: &[serde_json::Value],
    devices: &[&str],
    per_device: u64,
    forwarded_by: &str,
) {
    let mut by_origin: BTreeMap<String, Vec<(u64, String)>> = BTreeMap::new();
    for (k, r) in got.iter().enumerate() {
        assert_eq!(r["source"], forwarded_by, "record {k}: {r}");
        assert_eq!(r["seq"].as_u64(), Some(k as u64 + 1), "record {k}: {r}");
        assert!(r["stored_at"].is_string(), "stored_at shown: {r}");
        by_origin
            .entry(r["origin"].as_str().unwrap().to_string())
            .or_default()
            .push((
                r["origin_seq"].as_u64().unwrap(),
                r["payload"].as_str().unwrap().to_string(),
            ));
    }
    assert_eq!(
        by_origin.keys().map(String::as_str).collect::<Vec<_>>(),
        devices,
        "origins"
    );
    for (origin, list) in by_origin {
        assert_eq!(list.len() as u64, per_device, "{origin}: count");
        for (k, (seq, payload)) in list.iter().enumerate() {
            assert_eq!(*seq, k as u64 + 1, "{origin}: order");
            assert_eq!(
                payload,
                &format!("{origin} line {seq}"),
                "{origin}: payload"
            );
        }
    }
}

// ----- name servers -----

/// A name server on `127.0.0.1` that counts the queries it gets and answers none of them (`silent`) or each with
/// NXDOMAIN ("no such name").
pub struct FakeDns {
    pub addr: SocketAddr,
    pub queries: Arc<AtomicU64>,
    /// The names asked for, in order.
    pub names: Arc<Mutex<Vec<String>>>,
}

impl FakeDns {
    pub fn silent() -> Self {
        Self::start(false)
    }

    pub fn nxdomain() -> Self {
        Self::start(true)
    }

    fn start(answer: bool) -> Self {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = socket.local_addr().unwrap();
        let queries = Arc::new(AtomicU64::new(0));
        let names = Arc::new(Mutex::new(Vec::new()));
        let (q, n) = (queries.clone(), names.clone());
        std::thread::spawn(move || {
            let mut buf = [0u8; 1500];
            while let Ok((len, from)) = socket.recv_from(&mut buf) {
                let query = &buf[..len];
                q.fetch_add(1, Ordering::Relaxed);
                let Some((name, question_end)) = question(query) else {
                    continue;
                };
                n.lock().unwrap().push(name);
                if answer {
                    let mut reply = Vec::with_capacity(question_end);
                    reply.extend_from_slice(&query[..2]); // id
                    reply.push(0x80 | (query[2] & 0x79)); // QR, the query's opcode and RD
                    reply.push(0x80 | 3); // RA, RCODE 3: NXDOMAIN
                    reply.extend_from_slice(&[0, 1, 0, 0, 0, 0, 0, 0]); // one question, nothing else
                    reply.extend_from_slice(&query[12..question_end]);
                    let _ = socket.send_to(&reply, from);
                }
            }
        });
        FakeDns {
            addr,
            queries,
            names,
        }
    }

    pub fn asked_for(&self, name: &str) -> bool {
        self.names
            .lock()
            .unwrap()
            .iter()
            .any(|n| n.trim_end_matches('.').eq_ignore_ascii_case(name))
    }
}

/// The first question of a DNS query: its name and where the question ends.
fn question(q: &[u8]) -> Option<(String, usize)> {
    if q.len() < 12 || u16::from_be_bytes([q[4], q[5]]) == 0 {
        return None;
    }
    let mut at = 12;
    let mut labels = Vec::new();
    loop {
        let len = *q.get(at)? as usize;
        at += 1;
        if len == 0 {
            break;
        }
        labels.push(String::from_utf8_lossy(q.get(at..at + len)?).to_string());
        at += len;
    }
    let end = at + 4;
    (end <= q.len()).then(|| (labels.join("."), end))
}

// ----- a webhook receiver -----

/// What the receiver does with one request, by its number (0, 1, 2, … in the order they came, over every
/// connection).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    Ok,
    /// 500 Internal Server Error.
    Fail,
    /// Close the connection without an answer (after reading the whole request).
    Drop,
}

/// One request the receiver got.
#[derive(Debug, Clone)]
pub struct HookRequest {
    pub n: usize,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub answer: Answer,
}

impl HookRequest {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "request {} is not JSON ({e}): {}",
                self.n,
                String::from_utf8_lossy(&self.body)
            )
        })
    }
}

/// A webhook receiver over HTTPS on `127.0.0.1` (certificate and key from PEM files, e.g. [`crate::http_util`]'s
/// test CA), on a thread of its own with a current-thread tokio runtime: hyper's HTTP/1.1 server on tokio-rustls.
/// It records every request and answers it as `plan` says.
pub struct HookServer {
    pub addr: SocketAddr,
    pub requests: Arc<Mutex<Vec<HookRequest>>>,
    /// TLS handshakes that failed (a client that does not trust the certificate ends its handshake).
    pub handshake_failures: Arc<AtomicU64>,
}

type Plan = Arc<dyn Fn(usize) -> Answer + Send + Sync>;

impl HookServer {
    pub fn start(
        cert_file: &Path,
        key_file: &Path,
        plan: impl Fn(usize) -> Answer + Send + Sync + 'static,
    ) -> Self {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert_file)
            .unwrap()
            .map(Result::unwrap)
            .collect();
        let key = PrivateKeyDer::from_pem_file(key_file).unwrap();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let handshake_failures = Arc::new(AtomicU64::new(0));
        let plan: Plan = Arc::new(plan);
        let (reqs, fails) = (requests.clone(), handshake_failures.clone());
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(serve(listener, acceptor, plan, reqs, fails));
        });
        HookServer {
            addr,
            requests,
            handshake_failures,
        }
    }

    pub fn requests(&self) -> Vec<HookRequest> {
        self.requests.lock().unwrap().clone()
    }

    /// The port, for `https://localhost:PORT/…` (the certificate is for `localhost`).
    pub fn port(&self) -> u16 {
        self.addr.port()
    }
}

async fn serve(
    listener: std::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    plan: Plan,
    requests: Arc<Mutex<Vec<HookRequest>>>,
    handshake_failures: Arc<AtomicU64>,
) {
    let listener = tokio::net::TcpListener::from_std(listener).unwrap();
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            continue;
        };
        let acceptor = acceptor.clone();
        let (plan, requests, fails) = (plan.clone(), requests.clone(), handshake_failures.clone());
        tokio::spawn(async move {
            let tls = match acceptor.accept(tcp).await {
                Ok(s) => s,
                Err(_) => {
                    fails.fetch_add(1, Ordering::Relaxed);
                    return;
                }
            };
            let service = hyper::service::service_fn(move |req| {
                let (plan, requests) = (plan.clone(), requests.clone());
                async move { answer(req, plan, requests).await }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                .await;
        });
    }
}

async fn answer(
    req: hyper::Request<hyper::body::Incoming>,
    plan: Plan,
    requests: Arc<Mutex<Vec<HookRequest>>>,
) -> Result<hyper::Response<http_body_util::Full<bytes::Bytes>>, std::io::Error> {
    use http_body_util::BodyExt;
    let path = req.uri().path().to_string();
    let headers = req
        .headers()
        .iter()
        .map(|(k, v)| (k.as_str().to_string(), v.to_str().unwrap_or("").to_string()))
        .collect();
    let body = req
        .into_body()
        .collect()
        .await
        .map_err(std::io::Error::other)?
        .to_bytes()
        .to_vec();
    let decided = {
        let mut all = requests.lock().unwrap();
        let n = all.len();
        let answer = plan(n);
        all.push(HookRequest {
            n,
            path,
            headers,
            body,
            answer,
        });
        answer
    };
    let status = match decided {
        Answer::Ok => 200,
        Answer::Fail => 500,
        // An error from the service makes hyper close the connection without an answer.
        Answer::Drop => return Err(std::io::Error::other("dropped on purpose")),
    };
    Ok(hyper::Response::builder()
        .status(status)
        .body(http_body_util::Full::new(bytes::Bytes::from_static(
            b"test receiver\n",
        )))
        .unwrap())
}

/// What a webhook receiver was given in the requests it answered 200: payload by position (each position always
/// with the same payload), and how many positions came more than once.
pub fn hooked(server: &HookServer) -> (std::collections::BTreeMap<u64, String>, usize) {
    let mut got = std::collections::BTreeMap::new();
    let mut again = 0;
    for req in server.requests() {
        if req.answer != Answer::Ok {
            continue;
        }
        for r in req.json()["records"].as_array().unwrap() {
            let (pos, payload) = (r["pos"].as_u64().unwrap(), r["payload"].as_str().unwrap());
            if let Some(before) = got.insert(pos, payload.to_string()) {
                assert_eq!(before, payload, "position {pos} sent again alike");
                again += 1;
            }
        }
    }
    (got, again)
}
