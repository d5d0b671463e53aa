//! research/021-send-cpu and 022-link-vs-store: `pure-serve send` into a real node, each figure beside the other
//! side of the same run.
//!
//! One round: N short lines (decimal numbers, as `seq 1 N` prints them) in a file; the store alone takes the same
//! records in turns of the node's size (`Stores::apply_turn`: apply, commit and `fdatasync`, 16,384 records a turn,
//! in DATA frames as full packets carry them); then a real node (`--bin`, the release binary by default) is started
//! on a state directory of its own and `pure-serve send` (the same binary) delivers the file through its standard
//! input. The send process's CPU (user + system, all threads, from `wait4`) and the node's CPU over the same span
//! (the sum of its threads' `schedstat`) are divided by the records, and their ratio printed; so is the link's
//! records/s (from `send`'s start to its exit, every record stored and acked) divided by the store alone's.
//!
//! Prints one JSON object per line on stdout: `{"name": ..., "run": N, "label": L, "value": ..., "unit": ...}`;
//! progress to stderr. `research/experiments/021-send-cpu/run.sh` runs it several rounds for each build.
//!
//! Usage: cargo bench --bench send_path -- [--records N] [--round R] [--bin PATH] [--label L] [--state-dir DIR]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use pure_serve::keys::{encode_key, write_new_identity};
use pure_serve::proto::allow_list::AllowList;
use pure_serve::proto::crypto::Identity;
use pure_serve::store::Stores;

#[path = "util/process.rs"]
mod process;
#[path = "util/turns.rs"]
mod turns;
use process::{process_cpu, wait_with_cpu};

/// The node's turn bound per app (docs/protocol.md 6, `TURN_RECORDS`).
const TURN_RECORDS: u64 = 16_384;
const APP: &str = "main";

struct Out {
    run: u32,
    label: String,
}

impl Out {
    fn emit(&self, name: &str, value: f64, unit: &str) {
        println!(
            "{}",
            serde_json::json!({"name": name, "run": self.run, "label": self.label, "value": value, "unit": unit})
        );
        eprintln!("  {name} = {value:.3} {unit}");
    }
}

/// The i-th line's bytes (1-based), as `seq` prints it.
fn line(i: u64) -> Vec<u8> {
    i.to_string().into_bytes()
}

/// The store alone: turns of [`TURN_RECORDS`] of the same records as the lines, from one sender, cut into DATA
/// frames of as many records as a 1,200-byte packet carries; records/s over the time in `apply_turn` (which
/// commits and syncs each turn).
fn store_alone(dir: &Path, n: u64, per_frame: u64) -> f64 {
    let mut stores = Stores::open(dir, &[APP.to_string()]).expect("stores");
    let id = Identity::generate();
    let senders = AllowList::from_unique(vec![("dev".to_string(), *id.public())]);
    let mut seq = 0u64;
    let mut busy = Duration::ZERO;
    let mut turn_id = 0;
    while seq < n {
        let in_turn = TURN_RECORDS.min(n - seq);
        let turn = turns::turn_of(turn_id, seq + 1, in_turn, per_frame, line);
        turn_id += 1;
        seq += in_turn;
        let a = Instant::now();
        let c = stores.apply_turn(&turn, &senders).expect("apply");
        busy += a.elapsed();
        assert_eq!(c.stored_records, in_turn);
    }
    n as f64 / busy.as_secs_f64()
}

fn main() {
    let mut n: u64 = 1_000_000;
    let mut round = 1;
    let mut bin = env!("CARGO_BIN_EXE_pure-serve").to_string();
    let mut label = "current".to_string();
    let mut state_dir: Option<PathBuf> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--records" => {
                n = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("--records N")
            }
            "--round" => round = args.next().and_then(|v| v.parse().ok()).expect("--round R"),
            "--bin" => bin = args.next().expect("--bin PATH"),
            "--label" => label = args.next().expect("--label L"),
            "--state-dir" => state_dir = Some(args.next().expect("--state-dir DIR").into()),
            _ => {}
        }
    }
    let out = Out { run: round, label };
    if let Some(load) = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next()?.parse::<f64>().ok())
    {
        out.emit("machine/loadavg_1m_at_start", load, "load");
    }
    let dir = match &state_dir {
        Some(d) => tempfile::tempdir_in(d),
        None => tempfile::tempdir(),
    }
    .expect("tempdir");
    let input = dir.path().join("lines");
    {
        let mut f = std::io::BufWriter::new(std::fs::File::create(&input).expect("input"));
        for i in 1..=n {
            f.write_all(&line(i)).expect("write");
            f.write_all(b"\n").expect("write");
        }
    }
    // As many of these records as a 1,200-byte packet holds (the sender fills packets; 16-byte tag, ~25 bytes of
    // headers): each record is its length byte and its digits.
    let per_frame = (1200 - 16 - 25) / (1 + line(n).len() as u64);
    eprintln!("round {round}: store alone, {n} records, turns of {TURN_RECORDS}");
    let store_dir = dir.path().join("store-alone");
    std::fs::create_dir_all(&store_dir).expect("dir");
    let store_rate = store_alone(&store_dir, n, per_frame);
    out.emit(
        &format!("store_alone/turn{TURN_RECORDS}/records_per_s"),
        store_rate,
        "records/s",
    );

    // The node, on a state of its own, with one sender listed.
    let node_key = Identity::generate();
    let dev_key = Identity::generate();
    write_new_identity(&dir.path().join("node.key"), &node_key).expect("node key");
    write_new_identity(&dir.path().join("dev.key"), &dev_key).expect("dev key");
    std::fs::write(
        dir.path().join("senders"),
        format!("dev {}\n", encode_key(dev_key.public())),
    )
    .expect("senders");
    let mut node = Command::new(&bin)
        .arg("--key")
        .arg(dir.path().join("node.key"))
        .arg("--senders")
        .arg(dir.path().join("senders"))
        .arg("--state")
        .arg(dir.path().join("state"))
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
        .stderr(Stdio::inherit())
        .spawn()
        .expect("pure-serve node");
    let mut lines = BufReader::new(node.stdout.take().expect("stdout")).lines();
    let mut addr = None;
    for l in lines.by_ref() {
        let l = l.expect("node stdout");
        if let Some(a) = l.strip_prefix("link:") {
            addr = a.trim().strip_prefix("udp").map(|s| s.trim().to_string());
        }
        if l.trim() == "ready" {
            break;
        }
    }
    std::thread::spawn(move || for _ in lines {});
    let addr = addr.expect("the node printed its link address");
    let node_pid = node.id();

    eprintln!("round {round}: pure-serve send of {n} lines to {addr}");
    let cpu0 = process_cpu(node_pid);
    let t = Instant::now();
    // Waited for by `wait4` below, which also gives its CPU time; `Child::wait` would reap it without that.
    #[allow(clippy::zombie_processes)]
    let send = Command::new(&bin)
        .arg("send")
        .arg("--key")
        .arg(dir.path().join("dev.key"))
        .arg("--node")
        .arg(encode_key(node_key.public()))
        .arg("--to")
        .arg(&addr)
        .arg("--timeout")
        .arg("30")
        .stdin(std::fs::File::open(&input).expect("input"))
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("pure-serve send");
    let (status, send_cpu) = wait_with_cpu(send.id());
    let secs = t.elapsed().as_secs_f64();
    let node_cpu = process_cpu(node_pid) - cpu0;
    let _ = node.kill();
    let _ = node.wait();
    let ok = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
    out.emit("send/exit_ok", if ok { 1.0 } else { 0.0 }, "bool");
    let link_rate = n as f64 / secs;
    let send_ns = send_cpu.as_nanos() as f64 / n as f64;
    let node_ns = node_cpu.as_nanos() as f64 / n as f64;
    out.emit("send/records_per_s", link_rate, "records/s");
    out.emit("send/cpu_ns_per_record", send_ns, "ns");
    out.emit("node/cpu_ns_per_record", node_ns, "ns");
    out.emit("ratio/send_cpu_per_node_cpu", send_ns / node_ns, "ratio");
    out.emit(
        "ratio/link_per_store_alone",
        link_rate / store_rate,
        "ratio",
    );
}
