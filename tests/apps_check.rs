//! `pure-serve check --apps FILE` as an operator runs it: the real binary, a bad apps file, every problem printed as
//! `FILE:LINE: …` and a non-zero exit; a good file passes with a summary.

use std::path::Path;
use std::process::{Command, Output};

fn check(dir: &Path, apps: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pure-serve"))
        .arg("check")
        // Ports are not what these tests check: 0 leaves them untried (tests run side by side).
        .args(["--link-port", "0", "--http-port", "0"])
        .arg("--state")
        .arg(dir.join("state"))
        .arg("--apps")
        .arg(apps)
        .env_remove("STATE_DIRECTORY")
        .output()
        .unwrap()
}

#[test]
fn a_bad_apps_file_lists_every_problem_with_its_line_and_fails() {
    let dir = tempfile::tempdir().unwrap();
    let apps = dir.path().join("bad.toml");
    std::fs::write(
        &apps,
        "[apps.sensors]\n\
         acept = \"all\"\n\
         \n\
         [apps.sensors.outlets.cloud]\n\
         kind = \"link\"\n\
         to = \"cloud.example.net\"\n\
         node_key = \"BASE64=\"\n\
         \n\
         [apps.sensors.outlets.copy]\n\
         kind = \"app\"\n\
         app = \"countr\"\n\
         \n\
         [apps.counter]\n\
         accept = []\n",
    )
    .unwrap();
    let out = check(dir.path(), &apps);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    let file = apps.display().to_string();
    for want in [
        format!(
            "problem: {file}:2: app sensors, key acept: unknown key `acept`; did you mean `accept`?"
        ),
        format!(
            "problem: {file}:6: app sensors, key outlets.cloud.to: \"cloud.example.net\" has no port; "
        ),
        format!("problem: {file}:7: app sensors, key outlets.cloud.node_key: not valid base64; "),
        format!(
            "problem: {file}:11: app sensors, key outlets.copy.app: names app countr, which is not in this file; \
             did you mean \"counter\"?"
        ),
    ] {
        assert!(stdout.contains(&want), "missing {want:?} in:\n{stdout}");
    }
    assert_eq!(stdout.matches("problem: ").count(), 4, "{stdout}");
    assert!(stderr.contains("4 problems found"), "{stderr}");
}

#[test]
fn a_syntax_error_is_reported_with_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let apps = dir.path().join("apps.toml");
    std::fs::write(&apps, "[apps.main]\naccept = \"all\n").unwrap();
    let out = check(dir.path(), &apps);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains(&format!("problem: {}:2: TOML syntax: ", apps.display())),
        "{stdout}"
    );
}

#[test]
fn a_good_apps_file_passes_with_a_summary_and_warnings() {
    let dir = tempfile::tempdir().unwrap();
    let apps = dir.path().join("apps.toml");
    std::fs::write(
        &apps,
        "[apps.sensors]\naccept = [\"kitchen-1\"]\n\
         [apps.sensors.outlets.copy]\nkind = \"app\"\napp = \"counter\"\n\
         [apps.counter]\naccept = []\n",
    )
    .unwrap();
    let out = check(dir.path(), &apps);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains(&format!(
            "ok: apps {}: 2 apps (sensors, counter), 1 outlet\n",
            apps.display()
        )),
        "{stdout}"
    );
    // No senders file: kitchen-1 is not in it, which is a warning, not a problem.
    assert!(
        stdout.contains("warning: ")
            && stdout.contains("sender kitchen-1 is not in the senders file"),
        "{stdout}"
    );
    assert!(stdout.contains("configuration is fine"), "{stdout}");
}

#[test]
fn the_node_and_check_both_document_apps() {
    for args in [&["--help"][..], &["check", "--help"][..]] {
        let out = Command::new(env!("CARGO_BIN_EXE_pure-serve"))
            .args(args)
            .output()
            .unwrap();
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(help.contains("--apps <FILE>"), "{args:?}: {help}");
        assert!(help.contains("docs/apps.md"), "{args:?}: {help}");
    }
}

/// Issue 18, item 7: `[app.s]` is `apps` mistyped, so `check` suggests `[apps.s]` (it used to say `[apps.app]`);
/// a `ca_file` that cannot be read is reported at the line of its key, not of its outlet's table.
#[test]
fn check_suggests_the_app_a_mistyped_apps_names_and_reports_ca_file_at_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let apps = dir.path().join("typo.toml");
    std::fs::write(&apps, "[app.s]\naccept = \"all\"\n").unwrap();
    let out = check(dir.path(), &apps);
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("did you mean [apps.s]?"), "{text}");
    assert!(!text.contains("[apps.app]"), "{text}");

    let apps = dir.path().join("ca.toml");
    std::fs::write(
        &apps,
        "[apps.main]\n\
         accept = \"all\"\n\
         \n\
         [apps.main.outlets.hook]\n\
         kind = \"webhook\"\n\
         url = \"https://receiver.example:8443/in\"\n\
         \n\
         ca_file = \"missing-ca.pem\"\n",
    )
    .unwrap();
    let out = check(dir.path(), &apps);
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{text}");
    let want = format!("{}:8: app main, key outlets.hook.ca_file: ", apps.display());
    assert!(text.contains(&want), "{text}");
    assert!(text.contains("missing-ca.pem"), "{text}");
}
