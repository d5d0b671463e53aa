//! research/025-fleet-nodes: records/s stored and acked by one node on SQLite, and by one, two and three nodes on
//! one PostgreSQL, in one round, measured from outside the real binary.
//!
//! A round makes a PostgreSQL cluster of its own (as the tests do: `tests/pg_util`), one node key, `--devices` K
//! device keys and a senders file listing them, and a file of `--records` R short lines. Then, for each
//! configuration in turn (`sqlite1`, `pg1`, `pg2`, `pg3`, and the variants `pg1-pglz` and `pg1-lz4`), on a fresh database and fresh state directories, it
//! starts the nodes, starts K `pure-serve send` processes at once (device j to node j mod N), and waits for the last
//! to exit; each exits 0 only when every record is acked. records/s = K·R over that span. Beside it, over the same
//! span, CPU per record of the nodes (their threads' schedstat), of PostgreSQL (every process of the cluster:
//! utime + stime of the postmaster and its children from /proc) and of the senders (wait4).
//!
//! After each PostgreSQL configuration the database is checked: K·R records in the chunks, each device's heard
//! sequence R, positions 1..head without a gap. A configuration that fails a check panics rather than print.
//!
//! Prints one JSON object per line on stdout: `{"name", "run", "config", "value", "unit"}`; progress to stderr.
//! `research/experiments/025-fleet-nodes/run.sh` runs it for several rounds.
//!
//! Usage: cargo bench --bench fleet -- [--records R] [--devices K] [--round N] [--configs sqlite1,pg1,pg2,pg3]
//! [--bin PATH]

#[path = "../tests/pg_util/mod.rs"]
mod pg_util;
#[path = "util/process.rs"]
mod process;

use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use process::{process_cpu, wait_with_cpu};
use pure_serve::keys::{encode_key, write_new_identity};
use pure_serve::proto::crypto::Identity;

fn emit(run: u32, config: &str, name: &str, value: f64, unit: &str) {
    println!(
        "{}",
        serde_json::json!({"name": name, "run": run, "config": config, "value": value, "unit": unit})
    );
    eprintln!("  {config} {name} = {value:.3} {unit}");
}

/// Clock ticks per second, for /proc's utime and stime.
fn ticks_per_s() -> f64 {
    // SAFETY: sysconf has no preconditions.
    (unsafe { libc::sysconf(libc::_SC_CLK_TCK) }) as f64
}

/// CPU time (utime + stime) of `root` and every process below it, from /proc.
fn tree_cpu(root: u32) -> Duration {
    let mut ticks = 0u64;
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Duration::ZERO;
    };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // Fields after the command (in parentheses, which may hold spaces): state ppid … utime(14) stime(15).
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        let ppid: u32 = f.get(1).and_then(|v| v.parse().ok()).unwrap_or(0);
        if pid == root || ppid == root {
            let ut: u64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0);
            let st: u64 = f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0);
            ticks += ut + st;
        }
    }
    Duration::from_secs_f64(ticks as f64 / ticks_per_s())
}

/// The postmaster's pid, from the first line of `postmaster.pid` in the cluster's data directory.
fn postmaster_pid(cluster: &pg_util::PgCluster) -> u32 {
    let text = std::fs::read_to_string(cluster.socket_dir().join("data/postmaster.pid"))
        .expect("postmaster.pid");
    text.lines()
        .next()
        .and_then(|l| l.trim().parse().ok())
        .expect("a pid")
}

fn sql<T>(conninfo: &str, f: impl AsyncFnOnce(&tokio_postgres::Client) -> T) -> T {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (client, conn) = tokio_postgres::connect(conninfo, tokio_postgres::NoTls)
            .await
            .expect("connect to the bench's cluster");
        tokio::spawn(conn);
        f(&client).await
    })
}

struct Node {
    child: Child,
    link: String,
}

fn start_node(bin: &str, dir: &Path, name: &str, store: Option<&str>) -> Node {
    let mut cmd = Command::new(bin);
    cmd.arg("--key")
        .arg(dir.join("node.key"))
        .arg("--senders")
        .arg(dir.join("senders"))
        .arg("--state")
        .arg(dir.join(name))
        .args([
            "--bind",
            "127.0.0.1",
            "--link-port",
            "0",
            "--http-port",
            "0",
        ])
        .env("RUST_LOG", "warn")
        .env_remove("NOTIFY_SOCKET")
        .env_remove("WATCHDOG_USEC")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if let Some(url) = store {
        cmd.args(["--store", url]);
    }
    let mut child = cmd.spawn().expect("pure-serve node");
    let banner = process::read_banner(child.stdout.take().expect("stdout"));
    Node {
        child,
        link: banner.link.to_string(),
    }
}

fn main() {
    let (mut records, mut devices, mut round) = (200_000u64, 6usize, 1u32);
    let mut configs = "sqlite1,pg1,pg2,pg3".to_string();
    let mut bin = env!("CARGO_BIN_EXE_pure-serve").to_string();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().unwrap_or_else(|| panic!("{a} needs a value"));
        match a.as_str() {
            "--records" => records = val().parse().expect("--records N"),
            "--devices" => devices = val().parse().expect("--devices K"),
            "--round" => round = val().parse().expect("--round N"),
            "--configs" => configs = val(),
            "--bin" => bin = val(),
            _ => {}
        }
    }
    let Some(cluster) = pg_util::PgCluster::start("bench fleet") else {
        panic!("the fleet bench needs PostgreSQL: apt-get install postgresql");
    };
    let postmaster = postmaster_pid(&cluster);
    let dir = tempfile::Builder::new()
        .prefix("pure-fleet-bench-")
        .tempdir_in("/var/tmp")
        .expect("tempdir");
    let d = dir.path();
    write_new_identity(&d.join("node.key"), &Identity::generate()).expect("node key");
    let node_public = encode_key(
        pure_serve::keys::read_identity(&d.join("node.key"))
            .expect("node key")
            .public(),
    );
    let mut listed = String::new();
    for j in 0..devices {
        let id = Identity::generate();
        write_new_identity(&d.join(format!("dev{j}.key")), &id).expect("device key");
        listed.push_str(&format!("dev{j} {}\n", encode_key(id.public())));
    }
    std::fs::write(d.join("senders"), listed).expect("senders");
    {
        let mut f = std::io::BufWriter::new(std::fs::File::create(d.join("lines")).expect("lines"));
        for i in 1..=records {
            writeln!(f, "{i}").expect("write");
        }
    }
    if let Some(load) = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next()?.parse::<f64>().ok())
    {
        emit(round, "machine", "loadavg_1m_at_start", load, "load");
    }
    for config in configs.split(',') {
        // `pg1-pglz` and `pg1-lz4`: one node, with the chunks' bodies compressed by PostgreSQL's default (pglz) or
        // by lz4, instead of stored as they are (the node's schema); set once the node has made the tables, before
        // any record.
        let (nodes, pg, body) = match config {
            "sqlite1" => (1, false, None),
            "pg1" => (1, true, None),
            "pg2" => (2, true, None),
            "pg3" => (3, true, None),
            "pg1-pglz" => (1, true, Some("SET STORAGE EXTENDED")),
            "pg1-lz4" => (
                1,
                true,
                Some("SET STORAGE EXTENDED, ALTER COLUMN body SET COMPRESSION lz4"),
            ),
            other => {
                panic!("no configuration {other:?}: sqlite1, pg1, pg2, pg3, pg1-pglz, pg1-lz4")
            }
        };
        let db = format!("fleet_{round}_{}", config.replace('-', "_"));
        let url = pg.then(|| {
            sql(&cluster.conninfo(), async |c| {
                c.batch_execute(&format!("CREATE DATABASE {db}"))
                    .await
                    .expect("create database")
            });
            format!(
                "postgresql://postgres@localhost/{db}?host={}",
                cluster.socket_dir().display()
            )
        });
        let run_dir = d.join(config);
        std::fs::create_dir_all(&run_dir).expect("run dir");
        for f in ["node.key", "senders"] {
            std::fs::copy(d.join(f), run_dir.join(f)).expect("copy");
        }
        let mut started: Vec<Node> = (0..nodes)
            .map(|i| start_node(&bin, &run_dir, &format!("node{i}"), url.as_deref()))
            .collect();
        let conninfo = format!(
            "host={} user=postgres dbname={db}",
            cluster.socket_dir().display()
        );
        if let Some(body) = body {
            sql(&conninfo, async |c| {
                c.batch_execute(&format!("ALTER TABLE chunks ALTER COLUMN body {body}"))
                    .await
                    .expect("alter the chunks' body")
            });
        }
        eprintln!(
            "round {round} {config}: {devices} devices × {records} records into {nodes} node(s)"
        );
        let node_cpu0: Duration = started.iter().map(|n| process_cpu(n.child.id())).sum();
        let pg_cpu0 = tree_cpu(postmaster);
        let t = Instant::now();
        // Waited for by wait4 below, which also gives their CPU time.
        #[allow(clippy::zombie_processes)]
        let sends: Vec<Child> = (0..devices)
            .map(|j| {
                Command::new(&bin)
                    .arg("send")
                    .arg("--key")
                    .arg(d.join(format!("dev{j}.key")))
                    .args(["--node", &node_public])
                    .args(["--to", &started[j % nodes].link])
                    .args(["--timeout", "60"])
                    .stdin(std::fs::File::open(d.join("lines")).expect("lines"))
                    .stdout(Stdio::null())
                    .stderr(Stdio::inherit())
                    .spawn()
                    .expect("pure-serve send")
            })
            .collect();
        let mut send_cpu = Duration::ZERO;
        let mut all_ok = true;
        for s in &sends {
            let (status, cpu) = wait_with_cpu(s.id());
            send_cpu += cpu;
            all_ok &= libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
        }
        let secs = t.elapsed().as_secs_f64();
        let node_cpu: Duration = started
            .iter()
            .map(|n| process_cpu(n.child.id()))
            .sum::<Duration>()
            - node_cpu0;
        let pg_cpu = tree_cpu(postmaster).saturating_sub(pg_cpu0);
        for n in &mut started {
            let _ = n.child.kill();
            let _ = n.child.wait();
        }
        assert!(all_ok, "{config}: a send did not exit 0");
        let total = devices as u64 * records;
        if url.is_some() {
            let (stored, min_heard, max_heard, head, gaps) = sql(&conninfo, async |c| {
                let r = c
                    .query_one(
                        "SELECT coalesce(sum(count), 0)::bigint, \
                                (SELECT min(heard) FROM sources), (SELECT max(heard) FROM sources), \
                                (SELECT head FROM apps WHERE name = 'main'), \
                                (SELECT count(*) FROM (SELECT pos, count, \
                                    lead(pos) OVER (ORDER BY pos) AS next FROM chunks) x \
                                 WHERE next IS NOT NULL AND next <> pos + count) \
                         FROM chunks",
                        &[],
                    )
                    .await
                    .expect("check query");
                (
                    r.get::<_, i64>(0),
                    r.get::<_, Option<i64>>(1),
                    r.get::<_, Option<i64>>(2),
                    r.get::<_, i64>(3),
                    r.get::<_, i64>(4),
                )
            });
            assert_eq!(stored as u64, total, "{config}: records in the chunks");
            assert_eq!(min_heard, Some(records as i64), "{config}: heard");
            assert_eq!(max_heard, Some(records as i64), "{config}: heard");
            assert_eq!(head as u64, total + 1, "{config}: head");
            assert_eq!(gaps, 0, "{config}: positions with gaps");
            // Checked: its room goes back for the next configuration.
            sql(&cluster.conninfo(), async |c| {
                c.batch_execute(&format!("DROP DATABASE {db}"))
                    .await
                    .expect("drop database")
            });
        }
        let _ = std::fs::remove_dir_all(&run_dir);
        let per = |cpu: Duration| cpu.as_nanos() as f64 / total as f64;
        emit(
            round,
            config,
            "records_per_s",
            total as f64 / secs,
            "records/s",
        );
        emit(round, config, "node_cpu_ns_per_record", per(node_cpu), "ns");
        emit(
            round,
            config,
            "postgres_cpu_ns_per_record",
            per(pg_cpu),
            "ns",
        );
        emit(round, config, "send_cpu_ns_per_record", per(send_cpu), "ns");
    }
    drop(cluster);
    let _ = std::io::stdout().flush();
}
