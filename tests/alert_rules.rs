//! The Prometheus alerting rules shipped in `dist/pure-serve.rules.yml` (issue 37, §5): `promtool` finds them
//! well formed and their unit tests (`dist/pure-serve.rules.test.yml`) pass, every series they use is one a real
//! node serves, and docs/operations.md names every alert and every series.
//!
//! promtool is in Debian's `prometheus` package (`.ci/run` installs it). Without it the promtool test says
//! "skipped" and passes, unless `PURE_REQUIRE_PROMTOOL` is set (CI sets it), when its absence fails it.

mod ops_util;

use std::path::{Path, PathBuf};
use std::process::Command;

use ops_util::*;

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

/// The `pure_*` series named in the rules' expressions.
fn series_in_rules() -> Vec<String> {
    let rules = std::fs::read_to_string(repo("dist/pure-serve.rules.yml")).unwrap();
    let mut names: Vec<String> = Vec::new();
    for line in rules
        .lines()
        .filter(|l| l.trim_start().starts_with("expr:"))
    {
        let mut rest = line;
        while let Some(at) = rest.find("pure_") {
            let name: String = rest[at..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            rest = &rest[at + name.len()..];
            if !names.contains(&name) {
                names.push(name);
            }
        }
    }
    names
}

fn alerts_in_rules() -> Vec<String> {
    let rules = std::fs::read_to_string(repo("dist/pure-serve.rules.yml")).unwrap();
    rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert:"))
        .map(|a| a.trim().to_string())
        .collect()
}

#[test]
fn promtool_checks_the_rules_and_their_tests_pass() {
    let Some(promtool) = on_path("promtool") else {
        assert!(
            std::env::var_os("PURE_REQUIRE_PROMTOOL").is_none(),
            "PURE_REQUIRE_PROMTOOL is set but promtool is not on PATH (apt-get install prometheus)"
        );
        eprintln!("alert_rules: skipped — promtool is not installed (apt-get install prometheus)");
        return;
    };
    for args in [
        ["check", "rules", "pure-serve.rules.yml"],
        ["test", "rules", "pure-serve.rules.test.yml"],
    ] {
        let out = Command::new(&promtool)
            .args(args)
            .current_dir(repo("dist"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "promtool {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // Every alert has a test that expects it to fire.
    let tests = std::fs::read_to_string(repo("dist/pure-serve.rules.test.yml")).unwrap();
    for alert in alerts_in_rules() {
        assert!(
            tests.contains(&format!(
                "alertname: {alert}\n        exp_alerts:\n          - "
            )),
            "no test of {alert} firing in dist/pure-serve.rules.test.yml"
        );
    }
}

/// The rules name only series a node serves (a renamed metric would leave an alert that never fires), and the
/// operator's document names each alert and each series.
#[test]
fn the_rules_use_what_the_node_serves_and_the_docs_name_it_all() {
    let series = series_in_rules();
    assert!(series.len() >= 10, "{series:?}");
    let alerts = alerts_in_rules();
    assert_eq!(alerts.len(), 10, "{alerts:?}");

    let dir = tempfile::tempdir().unwrap();
    let (_, public) = keygen(dir.path(), "dev");
    let senders = dir.path().join("senders");
    write_atomic(&senders, &format!("dev {public}\n"));
    // An outlet, so the outlets' series and the sending loop's are there.
    let apps = dir.path().join("apps.toml");
    write_atomic(
        &apps,
        "[apps.main]\n[apps.main.outlets.cloud]\nkind = \"webhook\"\nurl = \"http://127.0.0.1:9/in\"\n",
    );
    let node = NodeProcess::start(
        &dir.path().join("state"),
        &[
            "--senders",
            senders.to_str().unwrap(),
            "--apps",
            apps.to_str().unwrap(),
        ],
        None,
    );
    node.metric_published("pure_outlet_failing{app=\"main\",outlet=\"cloud\"}");
    // The devices census publishes its series once its first scan has ended.
    node.metric_published("pure_senders_quiet");
    let (code, page) = node.http_get("/metrics");
    assert_eq!(code, 200);
    let docs = std::fs::read_to_string(repo("docs/operations.md")).unwrap();
    for name in &series {
        assert!(
            page.contains(&format!("\n{name}{{")) || page.contains(&format!("\n{name} ")),
            "the rules use {name}, which the node does not serve:\n{page}"
        );
        assert!(
            docs.contains(&format!("`{name}")),
            "docs/operations.md does not name {name}"
        );
    }
    for alert in &alerts {
        assert!(
            docs.contains(&format!("`{alert}`")),
            "docs/operations.md does not name the alert {alert}"
        );
    }
}
