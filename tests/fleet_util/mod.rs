//! What the fleet's tests share (tests/fleet.rs, tests/fleet_net.rs): the fleet's keys and senders file, nodes on
//! a fleet's store, `send` runs, and the check that reads the database afterwards: every record once, in
//! sequence, with its own payload, at positions without gaps.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crate::ops_util::{NodeProcess, bin, keygen};
use crate::pg_util;

/// A node key shared by the fleet, a device key, and a senders file listing the device.
pub fn setup(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let (node_key, _) = keygen(dir, "node");
    let (device_key, device_public) = keygen(dir, "dev");
    let senders = dir.join("senders");
    std::fs::write(&senders, format!("dev {device_public}\n")).unwrap();
    (node_key, device_key, senders)
}

pub fn start_node(
    dir: &Path,
    name: &str,
    url: &str,
    node_key: &Path,
    senders: &Path,
    extra: &[&str],
) -> NodeProcess {
    let state = dir.join(name);
    let mut args = vec![
        "--key",
        node_key.to_str().unwrap(),
        "--senders",
        senders.to_str().unwrap(),
        "--store",
        url,
    ];
    args.extend_from_slice(extra);
    NodeProcess::start(&state, &args, None)
}

/// The device's records in app `main` as the database holds them: (seq, payload, pos) in position order, the
/// heard sequence of `dev`, and the app's head.
pub fn stored(cluster: &pg_util::PgCluster) -> (Vec<(u64, String, i64)>, i64, i64) {
    pg_util::sql(&cluster.conninfo(), async |client| {
        let rows = client
            .query(
                "SELECT c.first_seq, c.count, c.pos, c.body FROM chunks c JOIN sources s ON s.id = c.source \
                 JOIN apps a ON a.id = c.app WHERE a.name = 'main' AND s.name = 'dev' ORDER BY c.pos",
                &[],
            )
            .await
            .unwrap();
        let mut records = Vec::new();
        for r in rows {
            let (first, count, pos, body): (i64, i32, i64, Vec<u8>) =
                (r.get(0), r.get(1), r.get(2), r.get(3));
            let payloads = payloads(&body);
            assert_eq!(payloads.len(), count as usize, "chunk at {pos}");
            for (k, p) in payloads.into_iter().enumerate() {
                records.push((first as u64 + k as u64, p, pos + k as i64));
            }
        }
        let heard: i64 = client
            .query_one(
                "SELECT s.heard FROM sources s JOIN apps a ON a.id = s.app WHERE a.name = 'main' AND s.name = 'dev'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        let head: i64 = client
            .query_one("SELECT head FROM apps WHERE name = 'main'", &[])
            .await
            .unwrap()
            .get(0);
        (records, heard, head)
    })
}

/// The payloads of a chunk's body (one-byte lengths: every payload here is short).
pub fn payloads(body: &[u8]) -> Vec<String> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < body.len() {
        let n = body[i] as usize;
        out.push(String::from_utf8(body[i + 1..i + 1 + n].to_vec()).unwrap());
        i += 1 + n;
    }
    out
}

/// Every record 1..=count stored once, in sequence, with its own payload (record `s` of a run that started
/// after `k` records is `r{s - k}`: `runs` holds where each run started), at positions 1.. without gaps.
pub fn assert_exactly_once(cluster: &pg_util::PgCluster, count: u64, runs: &[u64]) {
    let (records, heard, head) = stored(cluster);
    assert_eq!(heard as u64, count, "heard sequence");
    assert_eq!(records.len() as u64, count, "records stored");
    for (k, (seq, payload, pos)) in records.iter().enumerate() {
        let want = k as u64 + 1;
        assert_eq!(*seq, want, "record at position {pos}");
        let after = runs
            .iter()
            .filter(|&&r| r < want)
            .max()
            .copied()
            .unwrap_or(0);
        assert_eq!(payload, &format!("r{}", want - after), "record {seq}");
        assert_eq!(*pos, want as i64, "position of record {seq}");
    }
    assert_eq!(head as u64, count + 1, "the app's head");
}

pub fn stored_by(node: &NodeProcess) -> f64 {
    node.metric("pure_records_stored_total{app=\"main\"}")
        .unwrap_or(0.0)
}

/// `pure-serve send` from the device to `to` (comma-separated addresses), in the network namespace `netns` if
/// given (`ip netns exec`), its stdin, stdout and stderr piped: the caller writes the records.
pub fn send_command(
    netns: Option<&str>,
    device_key: &Path,
    node_public: &str,
    to: &str,
) -> Command {
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, bin()]);
            c
        }
        None => Command::new(bin()),
    };
    cmd.arg("send")
        .arg("--key")
        .arg(device_key)
        .args(["--node", node_public, "--to", to, "--timeout", "30"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    cmd
}

/// A `send` running, what it prints on its standard error read as it comes, so a test can wait for a line.
pub struct RunningSend {
    child: std::process::Child,
    stderr: Arc<Mutex<String>>,
    reader: JoinHandle<()>,
}

/// Reads `child`'s standard error (piped) on a thread of its own into a string the caller may look at any time.
pub fn collect_stderr(child: &mut std::process::Child) -> (Arc<Mutex<String>>, JoinHandle<()>) {
    use std::io::Read;
    let stderr = Arc::new(Mutex::new(String::new()));
    let (mut pipe, sink) = (child.stderr.take().unwrap(), stderr.clone());
    let reader = std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = pipe.read(&mut buf) {
            if n == 0 {
                break;
            }
            sink.lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    (stderr, reader)
}

impl RunningSend {
    /// Takes over `child` (its stderr piped), reading its stderr on a thread of its own.
    pub fn watch(mut child: std::process::Child) -> RunningSend {
        let (stderr, reader) = collect_stderr(&mut child);
        RunningSend {
            child,
            stderr,
            reader,
        }
    }

    /// What it has printed on its standard error so far.
    pub fn said(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Waits for it to exit: whether it exited 0, and everything it printed.
    pub fn finish(mut self) -> (bool, String) {
        use std::io::Read;
        let mut out = String::new();
        self.child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut out)
            .unwrap();
        let status = self.child.wait().unwrap();
        self.reader.join().unwrap();
        let err = self.stderr.lock().unwrap().clone();
        (status.success(), format!("{out}{err}"))
    }
}

/// `pure-serve send` of `r1` … `rN` from the device to `to` (comma-separated addresses), started.
pub fn spawn_send_to(
    device_key: &Path,
    node_public: &str,
    to: &str,
    count: u64,
) -> std::process::Child {
    use std::io::Write;
    let mut child = send_command(None, device_key, node_public, to)
        .spawn()
        .unwrap();
    let mut stdin = std::io::BufWriter::new(child.stdin.take().unwrap());
    std::thread::spawn(move || {
        for i in 1..=count {
            if writeln!(stdin, "r{i}").is_err() {
                break;
            }
        }
    });
    child
}

/// One column of the `outlets` table, a row per outlet by name, as the database has it.
fn outlets_column<T: for<'a> tokio_postgres::types::FromSql<'a>>(
    cluster: &pg_util::PgCluster,
    column: &str,
) -> Vec<T> {
    pg_util::sql(&cluster.conninfo(), async |client| {
        client
            .query(&format!("SELECT {column} FROM outlets ORDER BY name"), &[])
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect()
    })
}

/// The outlets' acknowledged positions, as the database has them.
pub fn outlets_acked(cluster: &pg_util::PgCluster) -> Vec<i64> {
    outlets_column(cluster, "acked")
}

/// The holders of the outlets' leases, as the database has them.
/// The state directory of the node whose id in the fleet is `holder` (`HOST:STATE#RUN`, docs/scale-out.md).
pub fn holder_state(holder: &str) -> &str {
    holder.rsplit_once('#').map_or(holder, |(state, _)| state)
}

pub fn holders(cluster: &pg_util::PgCluster) -> Vec<Option<String>> {
    outlets_column(cluster, "holder")
}

/// Which of the nodes whose state directories are `…/a` and `…/b` holds the one outlet's lease (0 or 1).
pub fn holder_index(cluster: &pg_util::PgCluster) -> usize {
    match holders(cluster).as_slice() {
        [Some(h)] if holder_state(h).ends_with("/a") => 0,
        [Some(h)] if holder_state(h).ends_with("/b") => 1,
        other => panic!("one node holds the outlet: {other:?}"),
    }
}

/// The fleet's key and its public half, a device key, and a senders file listing the device.
pub fn keys_with_public(dir: &Path) -> (PathBuf, String, PathBuf, PathBuf) {
    let (node_key, node_public) = keygen(dir, "node");
    let (device_key, device_public) = keygen(dir, "dev");
    let senders = dir.join("senders");
    std::fs::write(&senders, format!("dev {device_public}\n")).unwrap();
    (node_key, node_public, device_key, senders)
}
/// `send` of `r1` … `rN` to `to` (in the network namespace `netns` if given), to its end: every one acked.
pub fn send_all(
    netns: Option<&str>,
    device_key: &Path,
    node_public: &str,
    to: std::net::SocketAddr,
    count: u64,
) {
    use std::io::Write;
    let mut child = send_command(netns, device_key, node_public, &to.to_string())
        .spawn()
        .unwrap();
    let mut stdin = std::io::BufWriter::new(child.stdin.take().unwrap());
    for i in 1..=count {
        writeln!(stdin, "r{i}").unwrap();
    }
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "send: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
