//! `pure-serve keygen --many` (issue 35, item 7) with the real binary: the files it writes and their modes and
//! formats, a senders fragment that `check` and a node take, a device provisioned so that `send --key` is stored,
//! and a run that refuses to overwrite and says the fix.

mod ops_util;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use ops_util::{NodeProcess, bin, output_within, records};

fn run(args: &[&str], dir: &Path) -> Output {
    output_within(Command::new(bin()).args(args).current_dir(dir))
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

#[test]
fn fifty_devices_their_files_and_a_node_that_takes_one_of_them() {
    let dir = tempfile::tempdir().unwrap();
    let batch = dir.path().join("batch");
    let out = run(
        &[
            "keygen",
            "--many",
            "50",
            "--out-dir",
            "batch",
            "--name-prefix",
            "dev-",
            "--start",
            "1",
        ],
        dir.path(),
    );
    assert!(out.status.success(), "{}", text(&out));
    let said = text(&out);
    assert!(said.contains("made 50 devices, dev-1 … dev-50"), "{said}");
    assert!(said.contains("senders.fragment"), "{said}");

    assert_eq!(mode(&batch), 0o700);
    let mut expected: Vec<String> = (1..=50)
        .flat_map(|i| ["key", "bin", "h"].map(|e| format!("dev-{i}.{e}")))
        .collect();
    expected.push("senders.fragment".into());
    expected.sort();
    assert_eq!(
        names_in(&batch),
        expected,
        "only the devices' files and the fragment"
    );

    // The fragment: a comment, then `NAME KEY` for each device in order.
    let fragment = batch.join("senders.fragment");
    assert_eq!(mode(&fragment), 0o644);
    let lines: Vec<(String, String)> = std::fs::read_to_string(&fragment)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            let (n, k) = l.split_once(' ').unwrap();
            (n.to_string(), k.to_string())
        })
        .collect();
    assert_eq!(lines.len(), 50);
    let mut publics = std::collections::HashSet::new();
    for (i, (name, public)) in lines.iter().enumerate() {
        assert_eq!(name, &format!("dev-{}", i + 1));
        assert!(publics.insert(public.clone()), "{public} twice");
        let key = batch.join(format!("{name}.key"));
        let raw = batch.join(format!("{name}.bin"));
        let header = batch.join(format!("{name}.h"));
        for f in [&key, &raw, &header] {
            assert_eq!(mode(f), 0o600, "{}", f.display());
        }
        // NAME.key is what `keygen --out` writes: `pubkey` reads it and gives the fragment's key.
        let out = run(&["pubkey", "--key", key.to_str().unwrap()], dir.path());
        assert!(out.status.success(), "{}", text(&out));
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), public);
        let key_text = std::fs::read_to_string(&key).unwrap();
        assert!(
            key_text.ends_with('\n') && key_text.len() == 45,
            "{key_text:?}"
        );
        let secret = STANDARD.decode(key_text.trim()).unwrap();
        // NAME.bin: the same 32 bytes, raw.
        assert_eq!(std::fs::read(&raw).unwrap(), secret);
        // NAME.h: the array of those bytes, and the public key in a comment.
        let h = std::fs::read_to_string(&header).unwrap();
        assert!(
            h.contains("#include <stdint.h>")
                && h.contains("static const uint8_t pure_device_key[32] = {"),
            "{h}"
        );
        let body = &h[h.find("= {").unwrap()..h.find("};").unwrap()];
        let bytes: Vec<u8> = body
            .split(|c: char| c == ',' || c.is_whitespace() || c == '{' || c == '=')
            .filter(|t| !t.is_empty())
            .map(|t| u8::from_str_radix(t.strip_prefix("0x").unwrap(), 16).unwrap())
            .collect();
        assert_eq!(bytes, secret, "{h}");
        assert!(h.contains(&format!("{name} {public}")), "{h}");
    }

    // The fragment is a senders file: `check` says so, and a node started with it takes dev-37's records.
    let state = dir.path().join("state");
    let out = run(
        &[
            "check",
            "--senders",
            fragment.to_str().unwrap(),
            "--state",
            state.to_str().unwrap(),
            "--link-port",
            "0",
            "--http-port",
            "0",
        ],
        dir.path(),
    );
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("50 senders"), "{}", text(&out));

    let node = NodeProcess::start(&state, &["--senders", fragment.to_str().unwrap()], None);
    let records_sent: Vec<String> = (1..=5).map(|i| format!("reading {i}")).collect();
    let (ok, said) = node.send(&batch.join("dev-37.key"), &records_sent, "60");
    assert!(ok, "{said}\n{}", node.stderr_text());
    drop(node);
    let stored = records(&state);
    assert_eq!(stored.len(), 5, "{stored:?}");
    for (i, (source, seq, payload)) in stored.iter().enumerate() {
        assert_eq!(source, "dev-37");
        assert_eq!(*seq, i as u64 + 1);
        assert_eq!(payload, &records_sent[i]);
    }
}

#[test]
fn it_never_overwrites_and_says_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let batch = dir.path().join("batch");
    let out = run(&["keygen", "--many", "5", "--out-dir", "batch"], dir.path());
    assert!(out.status.success(), "{}", text(&out));
    let before: Vec<Vec<u8>> = names_in(&batch)
        .iter()
        .map(|n| std::fs::read(batch.join(n)).unwrap())
        .collect();

    // The same run again: the fragment of the first is there.
    let out = run(&["keygen", "--many", "5", "--out-dir", "batch"], dir.path());
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let said = text(&out);
    assert!(
        said.contains("batch/senders.fragment already exists")
            && said.contains("refusing to overwrite")
            && said.contains("another --out-dir"),
        "{said}"
    );

    // Its fragment moved away (appended to a node's senders file, say): now dev-1.key is the file in the way.
    std::fs::rename(batch.join("senders.fragment"), dir.path().join("appended")).unwrap();
    let out = run(&["keygen", "--many", "8", "--out-dir", "batch"], dir.path());
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let said = text(&out);
    assert!(
        said.contains("already exists; refusing to overwrite a device's key")
            && said.contains("--start past the numbers made before"),
        "{said}"
    );
    // It names the file (one of the first run's; which one depends on which worker got there first).
    let named = (1..=5).any(|i| {
        ["key", "bin", "h"]
            .iter()
            .any(|e| said.contains(&format!("batch/dev-{i}.{e} already exists")))
    });
    assert!(named, "{said}");
    // Nothing of the refused run is left, and the first run's files are as they were.
    std::fs::rename(dir.path().join("appended"), batch.join("senders.fragment")).unwrap();
    let after: Vec<Vec<u8>> = names_in(&batch)
        .iter()
        .map(|n| std::fs::read(batch.join(n)).unwrap())
        .collect();
    assert_eq!(names_in(&batch).len(), 16);
    assert_eq!(before, after);

    // The fix it gave works: --start past the numbers made before.
    std::fs::rename(batch.join("senders.fragment"), dir.path().join("appended")).unwrap();
    let out = run(
        &[
            "keygen",
            "--many",
            "3",
            "--out-dir",
            "batch",
            "--start",
            "6",
        ],
        dir.path(),
    );
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("dev-6 … dev-8"), "{}", text(&out));

    // One key with --out refuses too, as before.
    let out = run(&["keygen", "--out", "batch/dev-1.key"], dir.path());
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("refusing to overwrite"),
        "{}",
        text(&out)
    );
}

#[test]
fn names_are_checked_as_the_senders_file_checks_them_and_help_shows_the_way() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(
        &[
            "keygen",
            "--many",
            "2",
            "--out-dir",
            "b",
            "--name-prefix",
            "kitchen/",
        ],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out)
            .contains("name \"kitchen/1\" is not 1–64 characters of letters, digits and . _ : @ -"),
        "{}",
        text(&out)
    );
    assert!(
        !dir.path().join("b").exists(),
        "nothing made for a bad name"
    );

    let out = run(&["keygen", "--help"], dir.path());
    let help = text(&out);
    for word in [
        "--many",
        "--out-dir",
        "--name-prefix",
        "--start",
        "NAME.bin",
        "senders.fragment",
    ] {
        assert!(help.contains(word), "{word}: {help}");
    }
    // --out-dir without --many, and --out with --many, are usage errors.
    let out = run(&["keygen", "--out-dir", "b"], dir.path());
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let out = run(
        &["keygen", "--out", "k", "--many", "2", "--out-dir", "b"],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
}
