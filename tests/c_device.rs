//! The device library's C interface (`link-c/include/pure_link.h`) as a C program uses it: the static library
//! built, `link-c/examples/deliver.c` compiled against it with the system's C compiler (warnings are errors), and
//! run against a real node — records queued through the outbox in a flash file, stored by the node once each and
//! in order (more than the outbox holds at once, so it fills and drains), downlink records printed once each, and
//! a second and third run on the same flash that number on and hand nothing over twice, and a file pushed with
//! `push --file` to a run that offers version 1.2 (`pl_set_down_window`), taken through wide downlink.

#[path = "ops_util/mod.rs"]
mod ops_util;

use std::path::{Path, PathBuf};
use std::process::Command;

/// Builds the library and the example `name` (`link-c/examples/NAME.c`); the program's path.
fn build_example(dir: &Path, name: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("link-c");
    // A workspace of its own (panic = "abort"), with its own target directory; RUSTFLAGS of the outer build are
    // not the library's.
    let out = Command::new(env!("CARGO"))
        .args(["build", "--release", "--quiet"])
        .current_dir(&root)
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_TARGET_DIR")
        .output()
        .unwrap();
    assert!(out.status.success(), "cargo build of link-c: {out:?}");
    let exe = dir.join(name);
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let out = Command::new(cc)
        .args(["-O2", "-std=c11", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(root.join("include"))
        .arg(root.join(format!("examples/{name}.c")))
        .arg(root.join("target/release/libpure_link_c.a"))
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap();
    assert!(out.status.success(), "cc {name}.c: {out:?}");
    exe
}

struct Run {
    queued: Vec<u64>,
    stored: Vec<u64>,
    downs: Vec<(u64, String)>,
    first: u64,
    next: u64,
    /// The node took the run's offer of version 1.2.
    wide: bool,
}

fn lines_after<'a>(text: &'a str, word: &str) -> impl Iterator<Item = &'a str> {
    text.lines()
        .filter_map(move |l| l.strip_prefix(word)?.strip_prefix(' '))
}

#[test]
fn a_c_program_delivers_through_its_flash_outbox_and_takes_downlink_once() {
    let ops_util::DeviceNode {
        dir,
        state,
        node,
        key_hex: secret,
        node_hex: node_public,
    } = ops_util::DeviceNode::start("c-device");
    let exe = build_example(dir.path(), "deliver");
    let flash = dir.path().join("flash.bin");
    let run = |count: u64, listen_ms: u64, down_window: u64| {
        let out = ops_util::output_within(
            Command::new(&exe)
                .arg(&flash)
                .args([&secret, &node_public, "main", "127.0.0.1"])
                .arg(node.link.port().to_string())
                .arg(count.to_string())
                .arg(listen_ms.to_string())
                .arg(down_window.to_string()),
        );
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "deliver: {out:?}\n{text}\nnode: {}",
            node.stderr_text()
        );
        let num = |s: &str| s.split_whitespace().next().unwrap().parse::<u64>().unwrap();
        Run {
            queued: lines_after(&text, "queued").map(num).collect(),
            stored: lines_after(&text, "stored").map(num).collect(),
            downs: lines_after(&text, "down")
                .map(|l| {
                    let (seq, payload) = l.split_once(' ').unwrap_or((l, ""));
                    (seq.parse().unwrap(), payload.to_string())
                })
                .collect(),
            first: lines_after(&text, "first").map(num).next().unwrap(),
            next: lines_after(&text, "next").map(num).next().unwrap(),
            wide: lines_after(&text, "wide").map(num).next().unwrap() == 1,
        }
    };
    let push = |text: &[u8]| {
        let (code, out) = ops_util::push(&state, "main", "c-device", text);
        assert_eq!(code, 0, "push: {out}");
    };
    let assert_stored = |through: u64| {
        ops_util::assert_stored_once_in_order(
            &state,
            "c-device",
            through,
            |seq| format!("c-{seq}"),
            "deliver.c",
        )
    };

    // Downlink waiting before the device first runs.
    push(b"set rate 10\nhello device\n");
    // 150 records: more than the outbox holds unacknowledged (64), so it says full and takes more once stored.
    let first = run(150, 1_000, 0);
    assert_eq!(first.first, 1);
    assert_eq!(first.queued, (1..=150).collect::<Vec<_>>());
    assert_eq!(first.stored.last(), Some(&150));
    assert!(
        first.stored.windows(2).all(|w| w[0] < w[1]),
        "{:?}",
        first.stored
    );
    assert_eq!(
        first.downs,
        [
            (1, "set rate 10".to_string()),
            (2, "hello device".to_string())
        ]
    );
    assert_eq!(first.next, 151);
    assert_stored(150);

    // The same flash: numbering goes on; not listening, nothing handed over.
    push(b"third\n");
    let second = run(20, 0, 0);
    assert_eq!((second.first, second.next), (151, 171));
    assert_eq!(second.queued, (151..=170).collect::<Vec<_>>());
    assert!(second.downs.is_empty());
    assert_stored(170);

    // Listening again: only what was not handed over before.
    let third = run(0, 1_000, 0);
    assert_eq!(third.first, 171);
    assert_eq!(third.downs, [(3, "third".to_string())]);
    assert!(!third.wide, "no window given: version 1.1");
    assert_stored(170);

    // A file of 48 KiB (printable, so each piece is one line of the program's output) to a run that offers
    // version 1.2 with a window of 16 KiB: every piece once, in order after the heard sequence, reassembling it.
    let image: Vec<u8> = (0..48 << 10)
        .map(|i: usize| b'!' + ((i * 31 + i / 1024) % 94) as u8)
        .collect();
    let file = dir.path().join("image.bin");
    std::fs::write(&file, &image).unwrap();
    let out = ops_util::push_command(
        &state,
        &[
            "--app",
            "main",
            "--to",
            "c-device",
            "--file",
            file.to_str().unwrap(),
        ],
        b"",
    );
    assert!(out.status.success(), "push --file: {out:?}");
    let fourth = run(0, 200, 16 << 10);
    assert!(
        fourth.wide,
        "the node did not challenge the run that offered 1.2"
    );
    let seqs: Vec<u64> = fourth.downs.iter().map(|d| d.0).collect();
    assert_eq!(seqs, (4..4 + 48).collect::<Vec<_>>());
    let got: Vec<u8> = fourth.downs.iter().flat_map(|d| d.1.bytes()).collect();
    assert!(got == image, "the pieces do not reassemble the file");

    // The flash wiped (a chip erase when reflashing, or a new board given the key): a new outbox counts from 1
    // until the node tells where the numbering stands, and its records then follow the 170 the node holds. They
    // once went as 1..=5, which the node took for records it had: dropped, while the device was told "stored".
    std::fs::remove_file(&flash).unwrap();
    let fifth = run(5, 0, 0);
    assert_eq!(fifth.first, 1, "counted from 1 before the node answers");
    assert_eq!(fifth.stored.last(), Some(&175), "{:?}", fifth.stored);
    let stored = ops_util::records(&state);
    let seqs: Vec<u64> = stored.iter().map(|r| r.1).collect();
    assert_eq!(seqs, (1..=175).collect::<Vec<_>>());
    let newest: Vec<&str> = stored[170..].iter().map(|r| r.2.as_str()).collect();
    assert_eq!(newest, ["c-1", "c-2", "c-3", "c-4", "c-5"]);
    // Its next start numbers from what the node told.
    let sixth = run(1, 0, 0);
    assert_eq!(sixth.queued, [176]);
    assert_eq!(ops_util::records(&state).len(), 176);
}

/// An outside audit: a record larger than a flash page takes, and a failed flash program, both came back as
/// PL_ERR_FULL ("queue again once the node has stored records"), which for the first is never true and for the
/// second hides the flash's fault; and an outbox full of records whose kept page filled with run entries refused
/// every start for ever (sooner when the device queued a reading at each start: the readings took the kept page).
/// `link-c/examples/errors.c` checks each answer against a flash in memory, that readings queued at each start of
/// a full outbox are refused, and `pl_drop_oldest` as the way out of the last.
#[test]
fn a_c_program_is_told_too_large_and_flash_failed_not_full() {
    let dir = tempfile::tempdir().unwrap();
    let exe = build_example(dir.path(), "errors");
    let out = Command::new(&exe).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(text.lines().count(), 16, "{text}");
}
