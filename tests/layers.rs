//! The layering ARCHITECTURE.md states ("Imports run down"), held by reading the sources: a module that imports
//! from a room above it fails here with the file and line, so a shared type is moved to `src/common/` instead.

use std::fs;
use std::path::{Path, PathBuf};

fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(sources(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out.sort();
    out
}

/// Every `crate::ROOM` named in code (not comments, not a file's unit tests, which may drive the real store)
/// under `dir`, with where.
fn rooms_named(dir: &str) -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src").join(dir);
    let mut found = Vec::new();
    for file in sources(&root) {
        let text = fs::read_to_string(&file).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for (n, line) in lines.iter().enumerate() {
            if line.trim() == "#[cfg(test)]"
                && lines.get(n + 1).is_some_and(|l| l.starts_with("mod tests"))
            {
                break;
            }
            let code = line.split("//").next().unwrap_or("");
            let mut rest = code;
            while let Some(at) = rest.find("crate::") {
                let after = &rest[at + "crate::".len()..];
                let room: String = after
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                found.push((room, format!("{}:{}", file.display(), n + 1)));
                rest = after;
            }
        }
    }
    found
}

/// Fails with every place under `src/dir/` that names a room `allowed` refuses.
fn assert_only(dir: &str, allowed: impl Fn(&str) -> bool) {
    let bad: Vec<String> = rooms_named(dir)
        .into_iter()
        .filter(|(room, _)| !allowed(room))
        .map(|(room, at)| format!("{at}: crate::{room}"))
        .collect();
    assert!(
        bad.is_empty(),
        "src/{dir}/ imports from a room above it; move the shared type to src/common/:\n{}",
        bad.join("\n")
    );
}

fn assert_never(dir: &str, forbidden: &[&str]) {
    assert_only(dir, |room| !forbidden.contains(&room));
}

#[test]
fn the_floor_imports_only_from_the_protocol_core_and_itself() {
    assert_only("common", |room| room == "proto" || room == "common");
}

#[test]
fn rooms_do_not_import_from_rooms_above_them() {
    assert_never("outlets", &["apps", "sending", "receive", "cli", "ops"]);
    assert_never("http", &["receive", "apps", "cli", "sending"]);
    assert_never(
        "store",
        &["ops", "receive", "http", "outlets", "sending", "cli"],
    );
    assert_never(
        "proto",
        &[
            "common", "store", "receive", "http", "outlets", "apps", "ops", "sending", "cli",
        ],
    );
}

/// One store interface, two engines (ARCHITECTURE.md): above `src/store/` nothing names an engine's module. The
/// host, the receive loop, the outbox and the tools talk to `store::engine` (`TurnStore`, `OutboxConn`,
/// `StoreReader`, `StoreChoice`), so the engine behind them can change without them.
#[test]
fn nothing_above_the_store_names_an_engine() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut bad = Vec::new();
    for file in sources(&root) {
        if file.starts_with(root.join("store")) {
            continue;
        }
        let text = fs::read_to_string(&file).unwrap();
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for engine in [
                "store::postgres",
                "store::sqlite_engine",
                "StoreChoice::Postgres",
            ] {
                if code.contains(engine) {
                    bad.push(format!("{}:{}: {engine}", file.display(), n + 1));
                }
            }
        }
    }
    assert!(
        bad.is_empty(),
        "names a store engine above src/store/; go through store::engine instead:\n{}",
        bad.join("\n")
    );
}
