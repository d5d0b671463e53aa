//! Helpers for the end-to-end tests of running the node as a service (tests/ops_*.rs): the real binary, a notify
//! socket the test reads, keys and senders files, and plain HTTP. Every wait polls with a generous deadline; no
//! test asserts on how long something took.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long any one wait may take before the test fails: generous, so a loaded CI machine does not flake.
pub const DEADLINE: Duration = Duration::from_secs(60);

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_pure-serve")
}

/// Makes a private key with `pure-serve keygen`; returns its path and public key.
pub fn keygen(dir: &Path, name: &str) -> (PathBuf, String) {
    let path = dir.join(format!("{name}.key"));
    let out = Command::new(bin())
        .args(["keygen", "--out"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(out.status.success(), "keygen: {out:?}");
    (
        path,
        String::from_utf8(out.stdout).unwrap().trim().to_string(),
    )
}

/// Runs `cmd` to its end and returns its output, or fails the test if it has not ended within [`DEADLINE`]: a
/// command that blocks (on a FIFO, say) is a failure, not a hung test.
pub fn output_within(cmd: &mut Command) -> std::process::Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pipe = |mut p: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = p.read_to_end(&mut v);
            v
        })
    };
    let out = pipe(Box::new(child.stdout.take().unwrap()));
    let err = pipe(Box::new(child.stderr.take().unwrap()));
    let deadline = Instant::now() + DEADLINE;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{cmd:?} did not end within {DEADLINE:?}: it blocked");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    std::process::Output {
        status,
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

/// Makes a FIFO (named pipe) at `path`.
pub fn mkfifo(path: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
}

/// Makes a sparse file of `len` bytes at `path`: no disk is used, whatever its size.
pub fn sparse(path: &Path, len: u64) {
    std::fs::File::create(path).unwrap().set_len(len).unwrap();
}

/// Writes a file whole and renames it into place, as an operator's tooling should (and as a reload expects).
pub fn write_atomic(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// A notify socket the test reads, as systemd would.
pub struct NotifySocket {
    pub socket: UnixDatagram,
    /// The value for `$NOTIFY_SOCKET`.
    pub env: String,
    _dir: Option<tempfile::TempDir>,
}

impl NotifySocket {
    pub fn path() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let socket = UnixDatagram::bind(&path).unwrap();
        NotifySocket {
            socket,
            env: path.to_string_lossy().to_string(),
            _dir: Some(dir),
        }
    }

    pub fn abstract_name(tag: &str) -> Self {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("pure-serve-test-{tag}-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let socket = UnixDatagram::bind_addr(&addr).unwrap();
        NotifySocket {
            socket,
            env: format!("@{name}"),
            _dir: None,
        }
    }

    /// Next notification, or `None` at the deadline.
    pub fn recv(&self, deadline: Instant) -> Option<String> {
        let mut buf = vec![0u8; 4096];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            self.socket.set_read_timeout(Some(left)).unwrap();
            match self.socket.recv(&mut buf) {
                Ok(n) => return Some(String::from_utf8_lossy(&buf[..n]).to_string()),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    continue;
                }
                Err(e) => panic!("notify socket: {e}"),
            }
        }
    }

    /// Reads notifications until one has `key` (e.g. "READY=1"); returns every one read, that one last.
    pub fn until(&self, key: &str) -> Vec<String> {
        let deadline = Instant::now() + DEADLINE;
        let mut seen = Vec::new();
        loop {
            match self.recv(deadline) {
                Some(m) => {
                    let hit = m.lines().any(|l| l == key);
                    seen.push(m);
                    if hit {
                        return seen;
                    }
                }
                None => panic!("no {key} within {DEADLINE:?}; got {seen:?}"),
            }
        }
    }

    /// Everything already waiting, without blocking.
    pub fn drain(&self) -> Vec<String> {
        self.socket.set_nonblocking(true).unwrap();
        let mut buf = vec![0u8; 4096];
        let mut out = Vec::new();
        while let Ok(n) = self.socket.recv(&mut buf) {
            out.push(String::from_utf8_lossy(&buf[..n]).to_string());
        }
        self.socket.set_nonblocking(false).unwrap();
        out
    }
}

/// The value of `KEY=` in a notification.
pub fn field<'a>(message: &'a str, key: &str) -> Option<&'a str> {
    message
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
}

/// A running node process; killed when dropped.
pub struct NodeProcess {
    pub child: Child,
    pub state: PathBuf,
    lines: Receiver<String>,
    pub stderr: Arc<Mutex<String>>,
    pub public_key: String,
    pub link: SocketAddr,
    /// `--http-port`: `/healthz`, `POST /link`.
    pub http: SocketAddr,
    /// `--metrics-listen`: `/metrics`, `/healthz`.
    pub metrics: SocketAddr,
    /// The network namespace the node runs in (its addresses are that namespace's), if not the test's own.
    pub netns: Option<String>,
}

/// Starts `pure-serve` with `args` (state directory and ports 0 are added), `$NOTIFY_SOCKET` if given, and
/// extra environment. Does not wait for it to be ready.
pub fn spawn_node(
    state: &Path,
    args: &[&str],
    notify: Option<&NotifySocket>,
    env: &[(&str, &str)],
) -> Child {
    let mut cmd = node_command(state, args, notify);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().unwrap()
}

/// The command [`spawn_node`] runs, for a test to add to (limits, say) before it spawns it.
pub fn node_command(state: &Path, args: &[&str], notify: Option<&NotifySocket>) -> Command {
    node_command_at(None, "127.0.0.1", 0, state, args, notify)
}

/// [`node_command`] in a network namespace (`ip netns exec NS`, which execs the node: the child is the node
/// itself), listening for links on `bind:link_port` (0: a free port); HTTP on a free port there, metrics on the
/// namespace's loopback.
pub fn node_command_at(
    netns: Option<&str>,
    bind: &str,
    link_port: u16,
    state: &Path,
    args: &[&str],
    notify: Option<&NotifySocket>,
) -> Command {
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, bin()]);
            c
        }
        None => Command::new(bin()),
    };
    cmd.arg("--state")
        .arg(state)
        .args(["--bind", bind, "--link-port", &link_port.to_string()])
        .args(["--http-port", "0"])
        .args(args)
        .env("RUST_LOG", "info")
        .env_remove("NOTIFY_SOCKET")
        .env_remove("WATCHDOG_USEC")
        .env_remove("WATCHDOG_PID")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(n) = notify {
        cmd.env("NOTIFY_SOCKET", &n.env);
    }
    cmd
}

impl NodeProcess {
    /// Takes over a spawned node and reads its banner up to "ready".
    pub fn attach(mut child: Child, state: &Path) -> Self {
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = Arc::new(Mutex::new(String::new()));
        let mut err_pipe = child.stderr.take().unwrap();
        let sink = stderr.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = err_pipe.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        let mut node = NodeProcess {
            child,
            state: state.to_path_buf(),
            lines,
            stderr,
            public_key: String::new(),
            link: "0.0.0.0:0".parse().unwrap(),
            http: "0.0.0.0:0".parse().unwrap(),
            metrics: "0.0.0.0:0".parse().unwrap(),
            netns: None,
        };
        let deadline = Instant::now() + DEADLINE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = node.lines.recv_timeout(left).unwrap_or_else(|_| {
                panic!(
                    "node banner incomplete; stderr: {}",
                    node.stderr.lock().unwrap()
                )
            });
            if let Some(v) = line.strip_prefix("public key:") {
                node.public_key = v.trim().to_string();
            } else if let Some(v) = line.strip_prefix("link:") {
                node.link = v.trim().trim_start_matches("udp").trim().parse().unwrap();
            } else if let Some(v) = line.strip_prefix("health:") {
                // (Not the "http link:" line: with --no-http-links it says "off".)
                let url = v.trim().trim_start_matches("http://");
                node.http = url.split('/').next().unwrap().parse().unwrap();
            } else if let Some(v) = line.strip_prefix("metrics:") {
                let url = v.trim().trim_start_matches("http://");
                node.metrics = url.split('/').next().unwrap().parse().unwrap();
            } else if line == "ready" {
                return node;
            }
        }
    }

    pub fn start(state: &Path, args: &[&str], notify: Option<&NotifySocket>) -> Self {
        let child = spawn_node(state, args, notify, &[]);
        Self::attach(child, state)
    }

    /// Starts a node in the network namespace `netns` on `bind:link_port` ([`node_command_at`]); its HTTP
    /// helpers then reach it from inside that namespace.
    pub fn start_in(netns: &str, bind: &str, link_port: u16, state: &Path, args: &[&str]) -> Self {
        let child = node_command_at(Some(netns), bind, link_port, state, args, None)
            .spawn()
            .unwrap();
        let mut node = Self::attach(child, state);
        node.netns = Some(netns.to_string());
        node
    }

    pub fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on our own child's pid.
        let r = unsafe { libc::kill(self.child.id() as i32, signal) };
        assert_eq!(r, 0, "kill {signal}");
    }

    /// Waits for the process to exit (within the deadline) and returns its exit code.
    pub fn wait_exit(&mut self) -> Option<i32> {
        let deadline = Instant::now() + DEADLINE;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            assert!(Instant::now() < deadline, "node did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn stderr_text(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// `pure-serve send` from `key` of `records` (one per line); returns whether it exited 0, and its output.
    pub fn send(&self, key: &Path, records: &[String], timeout_s: &str) -> (bool, String) {
        finish_send(self.spawn_send(key, records, timeout_s))
    }

    /// `pure-serve send` started, its records written and its stdin closed, for a test to act while it runs;
    /// [`finish_send`] waits for it.
    pub fn spawn_send(&self, key: &Path, records: &[String], timeout_s: &str) -> Child {
        let mut child = Command::new(bin())
            .arg("send")
            .arg("--key")
            .arg(key)
            .args(["--node", &self.public_key, "--to", &self.link.to_string()])
            .args(["--timeout", timeout_s])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        for r in records {
            writeln!(stdin, "{r}").unwrap();
        }
        drop(stdin);
        child
    }

    /// One HTTP GET on the node's metrics listener: (status code, body).
    pub fn http_get(&self, path: &str) -> (u16, String) {
        let metrics = self.metrics;
        let path = path.to_string();
        in_netns(self.netns.as_deref(), move || http_get(metrics, &path))
    }

    /// The value of a sample line of `/metrics` (`name{labels}` as written).
    pub fn metric(&self, series: &str) -> Option<f64> {
        let (code, body) = self.http_get("/metrics");
        assert_eq!(code, 200);
        body.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    /// [`NodeProcess::metric`] once the node has published it: an app's series appear with the receive loop's
    /// first figures, which may come just after "ready". Fails the test after [`DEADLINE`].
    pub fn metric_published(&self, series: &str) -> f64 {
        let deadline = Instant::now() + DEADLINE;
        loop {
            if let Some(v) = self.metric(series) {
                return v;
            }
            assert!(Instant::now() < deadline, "{series} never published");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `f` in the network namespace `netns` (`/run/netns/NAME`, as `ip netns add` makes it), on a thread of its
/// own so that the test's other threads stay where they are: the sockets `f` makes are that namespace's. `None`:
/// here, on this thread.
pub fn in_netns<T: Send + 'static>(
    netns: Option<&str>,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let Some(ns) = netns else { return f() };
    let file = std::fs::File::open(Path::new("/run/netns").join(ns))
        .unwrap_or_else(|e| panic!("network namespace {ns}: {e}"));
    std::thread::spawn(move || {
        use std::os::fd::AsRawFd;
        // SAFETY: setns(2) on an open namespace file; it moves this thread alone.
        let r = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(r, 0, "setns: {}", std::io::Error::last_os_error());
        f()
    })
    .join()
    .unwrap_or_else(|e| std::panic::resume_unwind(e))
}

pub fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(DEADLINE)).unwrap();
    // A client that reads to the end asks the server to close; the server keeps connections alive otherwise.
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let code = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (code, body.to_string())
}

/// `pure-serve records --json` of a state directory: (source, seq, payload) per record.
pub fn records(state: &Path) -> Vec<(String, u64, String)> {
    let out = Command::new(bin())
        .args(["records", "--json", "--state"])
        .arg(state)
        .output()
        .unwrap();
    assert!(out.status.success(), "records: {out:?}");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (
                v["source"].as_str().unwrap().to_string(),
                v["seq"].as_u64().unwrap(),
                v["payload"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

/// Waits for a `send` started by [`NodeProcess::spawn_send`]: whether it exited 0, and its output.
pub fn finish_send(child: Child) -> (bool, String) {
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// `pure-serve push ARGS --state STATE`, `stdin` on its standard input, run to its end.
pub fn push_command(state: &Path, args: &[&str], stdin: &[u8]) -> std::process::Output {
    let mut child = Command::new(bin())
        .arg("push")
        .args(args)
        .arg("--state")
        .arg(state)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    child.wait_with_output().unwrap()
}

/// `pure-serve push` of `stdin` (one record per line) for `to` in `app`, through the push socket of the node on
/// `state`: its exit code and what it said (docs/downlink.md).
pub fn push(state: &Path, app: &str, to: &str, stdin: &[u8]) -> (i32, String) {
    let out = push_command(state, &["--app", app, "--to", to], stdin);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

/// A key file's or a printed key's base64 as 64 hex digits: what device programs take on their command line.
pub fn key_hex(base64_text: &str) -> String {
    use base64::Engine;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(base64_text.trim())
        .expect("a base64 key");
    assert_eq!(bytes.len(), 32);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A node with one device listed, for the device programs' tests (firmware, C): the temp directory they share,
/// the node's state, the node, and both keys as 64 hex digits.
pub struct DeviceNode {
    pub dir: tempfile::TempDir,
    pub state: PathBuf,
    pub node: NodeProcess,
    /// The device's secret key.
    pub key_hex: String,
    pub node_hex: String,
}

impl DeviceNode {
    /// A node whose senders file lists `device` only, with a key made for it.
    pub fn start(device: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let (key_file, public) = keygen(dir.path(), "device");
        let senders = dir.path().join("senders");
        std::fs::write(&senders, format!("{device} {public}\n")).unwrap();
        let state = dir.path().join("state");
        let node = NodeProcess::start(&state, &["--senders", senders.to_str().unwrap()], None);
        DeviceNode {
            key_hex: key_hex(&std::fs::read_to_string(&key_file).unwrap()),
            node_hex: key_hex(&node.public_key),
            dir,
            state,
            node,
        }
    }
}

/// The node's records are `source`'s `1..=through`, each once, in order, each `payload(seq)`.
pub fn assert_stored_once_in_order(
    state: &Path,
    source: &str,
    through: u64,
    payload: impl Fn(u64) -> String,
    context: &str,
) {
    let stored = records(state);
    let seqs: Vec<u64> = stored.iter().map(|r| r.1).collect();
    assert_eq!(
        seqs,
        (1..=through).collect::<Vec<_>>(),
        "{context}: the node's sequences"
    );
    for (from, seq, got) in &stored {
        assert_eq!(from, source, "{context}: record {seq}");
        assert_eq!(*got, payload(*seq), "{context}: record {seq}");
    }
}
