//! The fleet's tools and nodes survive its database (issue 36, item 2). `records --store` against a server that
//! takes the connection and says nothing, or answers what is not PostgreSQL, gives up with a message naming --store
//! rather than hanging for ever, and so does a node starting against one; a node whose database backend stops
//! answering mid-flow (SIGSTOP: its kernel still acknowledges every byte, so no TCP timeout sees it) gives the
//! connection up, acks nothing of the turn, and stores again on a new one. `records --follow --store` lives through a
//! restart of PostgreSQL (killed as a crash would, mid-flow): it says so on standard error, connects again, and goes
//! on after the last position it printed, every record printed once, in position order. Real processes against a
//! PostgreSQL cluster made by the test (`pg_util`; skipped without PostgreSQL unless `PURE_REQUIRE_POSTGRES=1`, as
//! in CI) and TCP servers of the test's own.

#[path = "fleet_util/mod.rs"]
mod fleet_util;
#[path = "ops_util/mod.rs"]
mod ops_util;
#[path = "pg_util/mod.rs"]
mod pg_util;

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use fleet_util::{keys_with_public, send_all, start_node};
use ops_util::{DEADLINE, bin, output_within};

/// A TCP server of the test's own that takes every connection, writes `answer` to it (nothing, if empty), and then
/// holds it open without a word more, for as long as the test runs.
fn fake_server(answer: &'static [u8]) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { break };
            let _ = conn.write_all(answer);
            held.push(conn);
        }
    });
    addr
}

/// `--store` for the server at `addr`.
fn url_at(addr: SocketAddr) -> String {
    format!("postgresql://pure@{addr}/fleet?sslmode=disable")
}

/// Runs `cmd` to its end (the test fails if that takes longer than [`DEADLINE`]); its exit status, its standard
/// error and how long it ran (said, for the record; never asserted on).
fn run(what: &str, cmd: &mut Command) -> (Option<i32>, String) {
    let started = Instant::now();
    let out = output_within(cmd);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    eprintln!(
        "{what}: exit {:?} after {:.1} s: {err}",
        out.status.code(),
        started.elapsed().as_secs_f64()
    );
    (out.status.code(), err)
}

#[test]
fn records_and_the_node_give_up_on_a_server_that_says_nothing_or_not_postgresql_naming_store() {
    let silent = fake_server(b"");
    // What an HTTP server says to bytes it does not understand.
    let garbage = fake_server(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
    let dir = tempfile::tempdir().unwrap();
    let (node_key, _, _, senders) = keys_with_public(dir.path());
    let mut waits = Vec::new();
    for (name, addr) in [("silent", silent), ("garbage", garbage)] {
        let url = url_at(addr);
        let records = {
            let url = url.clone();
            std::thread::spawn(move || {
                run(
                    &format!("records against the {name} server"),
                    Command::new(bin()).args(["records", "--store", &url]),
                )
            })
        };
        let follow = {
            let url = url.clone();
            std::thread::spawn(move || {
                run(
                    &format!("records --follow against the {name} server"),
                    Command::new(bin())
                        .args(["records", "--follow", "--app", "main", "--store", &url]),
                )
            })
        };
        let mut node_cmd = Command::new(bin());
        node_cmd
            .arg("--state")
            .arg(dir.path().join(name))
            .args([
                "--bind",
                "127.0.0.1",
                "--link-port",
                "0",
                "--http-port",
                "0",
            ])
            .arg("--key")
            .arg(&node_key)
            .arg("--senders")
            .arg(&senders)
            .args(["--store", &url])
            .env_remove("NOTIFY_SOCKET");
        let node = std::thread::spawn(move || {
            run(
                &format!("the node against the {name} server"),
                &mut node_cmd,
            )
        });
        waits.extend([records, follow, node]);
    }
    for wait in waits {
        let (status, err) = wait.join().unwrap();
        // Not the configuration's fault for sure (the server may be a database that is starting): 1, as a database
        // that is down.
        assert_eq!(status, Some(1), "{err}");
        assert!(err.contains("check --store"), "{err}");
        assert!(err.contains("postgresql://pure@127.0.0.1:"), "{err}");
        assert!(!err.contains("ready"), "{err}");
    }
}

/// `records --follow --json --from 1 --store URL --app main`, started: its lines as they come, and its standard
/// error as it grows.
struct Follower {
    child: std::process::Child,
    lines: mpsc::Receiver<String>,
    stderr: Arc<Mutex<String>>,
    got: Vec<serde_json::Value>,
}

impl Follower {
    fn start(url: &str) -> Self {
        let mut child = Command::new(bin())
            .args([
                "records", "--follow", "--json", "--from", "1", "--app", "main", "--store", url,
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, lines) = mpsc::channel();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let (stderr, _reader) = fleet_util::collect_stderr(&mut child);
        Follower {
            child,
            lines,
            stderr,
            got: Vec::new(),
        }
    }

    /// Waits until it has printed at least `n` lines in all (within [`DEADLINE`] of the last line).
    fn wait_for(&mut self, n: usize) {
        while self.got.len() < n {
            let line = self.lines.recv_timeout(DEADLINE).unwrap_or_else(|_| {
                panic!(
                    "the follower printed {} of {n} lines; its standard error: {}",
                    self.got.len(),
                    self.stderr.lock().unwrap()
                )
            });
            self.got.push(serde_json::from_str(&line).unwrap());
        }
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn records_follow_lives_through_a_database_restart_and_prints_every_record_once_in_order() {
    let Some(cluster) = pg_util::PgCluster::start(
        "records_follow_lives_through_a_database_restart_and_prints_every_record_once_in_order",
    ) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (node_key, node_public, device_key, senders) = keys_with_public(dir.path());
    let url = cluster.url();
    let node = start_node(dir.path(), "a", &url, &node_key, &senders, &[]);
    let mut follower = Follower::start(&url);

    // A first run of the device sends, a record a millisecond or so, while the follower prints; PostgreSQL is killed
    // as a crash would once the follower has printed 100 of them, and started again.
    let first = 3_000;
    let mut send =
        fleet_util::send_command(None, &device_key, &node_public, &node.link.to_string())
            .spawn()
            .unwrap();
    let mut stdin = send.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        for i in 1..=first {
            writeln!(stdin, "r{i}").unwrap();
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    });
    follower.wait_for(100);
    cluster.kill();
    let seen: Vec<String> = follower.lines.try_iter().collect();
    for line in seen {
        follower.got.push(serde_json::from_str(&line).unwrap());
    }
    let printed_at_kill = follower.got.len() as u64;
    eprintln!("PostgreSQL killed with {printed_at_kill} of {first} records printed");
    cluster.start_server();
    writer.join().unwrap();
    let (ok, said) = ops_util::finish_send(send);
    assert!(ok, "{said}");
    assert!(printed_at_kill < first, "the kill came mid-flow");
    // A second run after the restart.
    let second = 1_000;
    send_all(None, &device_key, &node_public, node.link, second);
    let total = (first + second) as usize;
    follower.wait_for(total);

    // Every record once, in position order, positions 1.. without a gap, each its own payload (the second run's
    // payloads start again at r1).
    for (k, r) in follower.got.iter().enumerate() {
        let pos = k as u64 + 1;
        assert_eq!(r["pos"], pos, "{r}");
        assert_eq!(r["seq"], pos, "{r}");
        let payload = if pos <= first {
            format!("r{pos}")
        } else {
            format!("r{}", pos - first)
        };
        assert_eq!(r["payload"], payload, "{r}");
    }
    fleet_util::assert_exactly_once(&cluster, first + second, &[first]);
    // One record more: the next line is it, not one printed again.
    send_all(None, &device_key, &node_public, node.link, 1);
    follower.wait_for(total + 1);
    assert_eq!(
        follower.got[total]["pos"],
        total + 1,
        "{}",
        follower.got[total]
    );
    let err = follower.stderr.lock().unwrap().clone();
    eprintln!("the follower's standard error:\n{err}");
    assert!(
        err.contains("pure-serve records: lost the fleet's database: ")
            && err.contains("connecting again in 0.25 s, to go on after position"),
        "{err}"
    );
    assert!(
        err.contains("pure-serve records: connected again to "),
        "{err}"
    );
}

/// The database's processes serving connections named `application` (pg_stat_activity).
fn backends_of(cluster: &pg_util::PgCluster, application: &str) -> Vec<i32> {
    pg_util::sql(&cluster.conninfo(), async |client| {
        client
            .query(
                "SELECT pid FROM pg_stat_activity WHERE application_name = $1",
                &[&application],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect()
    })
}

/// A process stopped with SIGSTOP, continued when dropped (so that its cluster can stop, whatever the test found).
struct Stopped(i32);

impl Stopped {
    fn new(pid: i32) -> Self {
        // SAFETY: kill(2) of the test's own cluster's backend, by the pid the cluster gave.
        assert_eq!(
            unsafe { libc::kill(pid, libc::SIGSTOP) },
            0,
            "SIGSTOP {pid}"
        );
        Stopped(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        // SAFETY: as in `new`.
        unsafe { libc::kill(self.0, libc::SIGCONT) };
    }
}

#[test]
fn a_node_whose_database_backend_stops_answering_gives_it_up_acks_nothing_of_it_and_stores_again() {
    let Some(cluster) = pg_util::PgCluster::start(
        "a_node_whose_database_backend_stops_answering_gives_it_up_acks_nothing_of_it_and_stores_again",
    ) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (node_key, node_public, device_key, senders) = keys_with_public(dir.path());
    let node = start_node(dir.path(), "a", &cluster.url(), &node_key, &senders, &[]);
    send_all(None, &device_key, &node_public, node.link, 100);

    // The backend of the node's connection stops, as a hung server would: its kernel goes on taking the bytes.
    let stopped = backends_of(&cluster, "pure-serve");
    assert_eq!(stopped.len(), 1, "the node's one connection: {stopped:?}");
    let _stopped = Stopped::new(stopped[0]);
    let mut send =
        fleet_util::send_command(None, &device_key, &node_public, &node.link.to_string())
            .spawn()
            .unwrap();
    {
        let mut stdin = send.stdin.take().unwrap();
        for i in 1..=100 {
            writeln!(stdin, "r{i}").unwrap();
        }
    }
    let wait_said = |words: &str| {
        let deadline = Instant::now() + DEADLINE;
        while !node.stderr_text().contains(words) {
            assert!(
                Instant::now() < deadline,
                "the node never said {words:?}: {}",
                node.stderr_text()
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    };
    // The host gives the turn up once it has waited 750 ms (src/apps/host/shared.rs, `STORE_SILENT`), well before
    // the engine's own bound on a part (10 s), which stays beneath it.
    wait_said("left a turn without an answer until the node took it as out of reach");
    wait_said("app main can store again");
    let (ok, said) = ops_util::finish_send(send);
    assert!(ok, "{said}");
    // Stored through a connection of its own, made while the stopped backend still stands.
    assert!(
        backends_of(&cluster, "pure-serve")
            .iter()
            .any(|&pid| pid != stopped[0]),
        "the node has no connection but the stopped one"
    );
    fleet_util::assert_exactly_once(&cluster, 200, &[100]);
}
