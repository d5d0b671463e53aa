//! What a node on a fleet's store refuses to start with, and the exit status it says it with (issue 36, item 3):
//! each fault of the configuration — a login refused, no password given, a database that is not there, no right to
//! make the tables, tables of a newer layout, `synchronous_commit` off — exits 78 (EX_CONFIG), which systemd does
//! not restart (`RestartPreventExitStatus=78`), with one message that says what is wrong, names the flag and the
//! fix, and never prints a password. A database that is only down exits 1: a restart may cure it. The real binary
//! against a PostgreSQL cluster made by the test (`pg_util`; skipped without PostgreSQL unless
//! `PURE_REQUIRE_POSTGRES=1`, as in CI).

#[path = "fleet_util/mod.rs"]
mod fleet_util;
#[path = "ops_util/mod.rs"]
mod ops_util;
#[path = "pg_util/mod.rs"]
mod pg_util;

use std::path::{Path, PathBuf};
use std::process::Command;

use fleet_util::setup;
use ops_util::{NodeProcess, bin, output_within};

/// EX_CONFIG, as docs/operations.md's table says.
const EXIT_CONFIG: i32 = 78;

/// The fleet's files for one test: its node key and senders file, and where its state directories go.
struct Fleet {
    dir: tempfile::TempDir,
    node_key: PathBuf,
    senders: PathBuf,
}

impl Fleet {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let (node_key, _, senders) = setup(dir.path());
        Fleet {
            dir,
            node_key,
            senders,
        }
    }

    /// The node's command on `url` (state `name`, loopback, free ports), with `extra` flags.
    fn node(&self, name: &str, url: &str, extra: &[&str]) -> Command {
        let mut cmd = Command::new(bin());
        cmd.arg("--state")
            .arg(self.dir.path().join(name))
            .args([
                "--bind",
                "127.0.0.1",
                "--link-port",
                "0",
                "--http-port",
                "0",
            ])
            .arg("--key")
            .arg(&self.node_key)
            .arg("--senders")
            .arg(&self.senders)
            .args(["--store", url])
            .args(extra)
            .env_remove("NOTIFY_SOCKET");
        cmd
    }

    /// Runs the node and expects it not to start: its exit status and standard error.
    fn refused(&self, name: &str, url: &str, extra: &[&str]) -> (Option<i32>, String) {
        let out = output_within(&mut self.node(name, url, extra));
        let stdout = String::from_utf8_lossy(&out.stdout);
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(!stdout.contains("ready"), "it started: {stdout}{err}");
        (out.status.code(), err)
    }

    /// A file holding `password` on its first line.
    fn password_file(&self, password: &str) -> PathBuf {
        let path = self.dir.path().join(format!("password-{password}"));
        std::fs::write(&path, format!("{password}\n")).unwrap();
        path
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// Runs `statements` on the cluster as its superuser, one at a time (CREATE DATABASE may not share a transaction).
fn as_superuser(cluster: &pg_util::PgCluster, statements: &[&str]) {
    pg_util::sql(&cluster.conninfo(), async |client| {
        for statement in statements {
            client.batch_execute(statement).await.unwrap();
        }
    })
}

/// The message is one line of its own, said once: `words` appear in it exactly once.
fn said_once(err: &str, words: &str) {
    assert_eq!(err.matches(words).count(), 1, "{words:?} once in: {err}");
}

#[test]
fn a_login_refused_or_without_its_password_exits_78_naming_the_password_file_and_never_prints_it() {
    let Some(cluster) = pg_util::PgCluster::start("fleet_refusals::login") else {
        return;
    };
    as_superuser(
        &cluster,
        &[
            "CREATE ROLE pw LOGIN PASSWORD 'right-one'",
            "CREATE DATABASE pwdb OWNER pw",
        ],
    );
    cluster.hba_first("local all pw scram-sha-256");
    let fleet = Fleet::new();
    let url = cluster.url_as("pw", "pwdb");

    // No password file, and the server asks for one.
    let (status, err) = fleet.refused("nopw", &url, &[]);
    assert_eq!(status, Some(EXIT_CONFIG), "{err}");
    said_once(&err, "the server asks for a password and none was given");
    assert!(err.contains("--store-password-file"), "{err}");
    assert!(
        err.contains("pure-serve: the node did not start: "),
        "{err}"
    );

    // A wrong password.
    let wrong = fleet.password_file("wrong-secret");
    let (status, err) = fleet.refused(
        "wrong",
        &url,
        &["--store-password-file", wrong.to_str().unwrap()],
    );
    assert_eq!(status, Some(EXIT_CONFIG), "{err}");
    said_once(&err, "password authentication failed for user \"pw\"");
    assert!(
        err.contains("check the user in --store and the password in --store-password-file"),
        "{err}"
    );
    assert!(
        !err.contains("wrong-secret"),
        "the password was printed: {err}"
    );
    // Nothing a start that failed would take back: no line tells of turns in hand or connecting again.
    assert!(
        !err.contains("turn in hand") && !err.contains("connects again"),
        "{err}"
    );

    // The right one: the same node starts (so the refusals above were the password's).
    let right = fleet.password_file("right-one");
    let state = fleet.path().join("right");
    let mut node = NodeProcess::start(
        &state,
        &[
            "--key",
            fleet.node_key.to_str().unwrap(),
            "--senders",
            fleet.senders.to_str().unwrap(),
            "--store",
            &url,
            "--store-password-file",
            right.to_str().unwrap(),
        ],
        None,
    );
    node.signal(libc::SIGTERM);
    assert_eq!(node.wait_exit(), Some(0), "{}", node.stderr_text());
}

#[test]
fn a_database_that_does_not_exist_or_may_not_be_written_exits_78_with_the_fix() {
    let Some(cluster) = pg_util::PgCluster::start("fleet_refusals::database") else {
        return;
    };
    // On PostgreSQL 15 and later nobody but the database's owner may create in its schema public.
    as_superuser(&cluster, &["CREATE ROLE weak LOGIN"]);
    let fleet = Fleet::new();

    let (status, err) = fleet.refused("nodb", &cluster.url_as("postgres", "nosuch"), &[]);
    assert_eq!(status, Some(EXIT_CONFIG), "{err}");
    said_once(&err, "database \"nosuch\" does not exist");
    assert!(
        err.contains("createdb -O USER DATABASE), or name an existing one in --store"),
        "{err}"
    );

    let (status, err) = fleet.refused("weak", &cluster.url_as("weak", "postgres"), &[]);
    assert_eq!(status, Some(EXIT_CONFIG), "{err}");
    said_once(&err, "permission denied for schema public");
    assert!(
        err.contains("making the tables") && err.contains("GRANT CREATE ON SCHEMA public TO USER"),
        "{err}"
    );
}

#[test]
fn tables_of_a_newer_layout_or_synchronous_commit_off_exit_78_and_nothing_is_made() {
    let Some(cluster) = pg_util::PgCluster::start("fleet_refusals::layout") else {
        return;
    };
    as_superuser(
        &cluster,
        &[
            "CREATE DATABASE newer",
            "CREATE ROLE lazy LOGIN",
            "ALTER ROLE lazy SET synchronous_commit = off",
            "CREATE DATABASE lazydb OWNER lazy",
        ],
    );
    pg_util::sql(
        &format!("{} dbname=newer", cluster.conninfo()),
        async |client| {
            client
                .batch_execute(
                    "CREATE TABLE pure_layout (version INTEGER NOT NULL); INSERT INTO pure_layout VALUES (99)",
                )
                .await
                .unwrap()
        },
    );
    let fleet = Fleet::new();

    let (status, err) = fleet.refused("newer", &cluster.url_as("postgres", "newer"), &[]);
    assert_eq!(status, Some(EXIT_CONFIG), "{err}");
    said_once(
        &err,
        "its tables have layout 99, this pure-serve knows layouts up to 1",
    );
    assert!(
        err.contains("run the newer pure-serve that made them"),
        "{err}"
    );
    // Refused before anything was made beside the newer tables.
    let tables: i64 = pg_util::sql(
        &format!("{} dbname=newer", cluster.conninfo()),
        async |client| {
            client
                .query_one(
                    "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'",
                    &[],
                )
                .await
                .unwrap()
                .get(0)
        },
    );
    assert_eq!(tables, 1, "only pure_layout");

    let (status, err) = fleet.refused("lazy", &cluster.url_as("lazy", "lazydb"), &[]);
    assert_eq!(status, Some(EXIT_CONFIG), "{err}");
    said_once(&err, "reading synchronous_commit: it is off");
    assert!(
        err.contains("ALTER ROLE USER SET synchronous_commit = on"),
        "{err}"
    );
}

/// A database that is not there now (no server at the socket) may be there after a restart: exit 1, which systemd
/// restarts, with the address named.
#[test]
fn a_database_that_cannot_be_reached_exits_1_naming_where_it_was_looked_for() {
    let fleet = Fleet::new();
    let (status, err) = fleet.refused(
        "nowhere",
        "postgresql://postgres@localhost/postgres?host=/nonexistent-dir",
        &[],
    );
    assert_eq!(status, Some(1), "{err}");
    assert!(err.contains("/nonexistent-dir"), "{err}");
    assert!(err.contains("check --store"), "{err}");
}

/// An outside audit: docs/scale-out.md says a node's role needs to make the tables at the first start "and to read
/// and write them after", but every start ran the layout's `CREATE … IF NOT EXISTS`, which needs the right to
/// create in the schema and to own the tables: a role granted reading and writing tables another role made exited
/// 78 ("making the tables: permission denied for schema public"). It serves, and stores what it is sent.
#[test]
fn a_role_granted_reading_and_writing_the_tables_another_made_serves() {
    let Some(cluster) = pg_util::PgCluster::start("fleet_refusals::granted") else {
        return;
    };
    as_superuser(
        &cluster,
        &[
            "CREATE ROLE maker LOGIN",
            "CREATE ROLE writer LOGIN",
            "CREATE DATABASE granted OWNER maker",
        ],
    );
    let dir = tempfile::tempdir().unwrap();
    let (node_key, device_key, senders) = setup(dir.path());
    // The first start, as the tables' owner, makes them; then it stops.
    drop(fleet_util::start_node(
        dir.path(),
        "maker",
        &cluster.url_as("maker", "granted"),
        &node_key,
        &senders,
        &[],
    ));
    let granted = cluster
        .conninfo()
        .replace("dbname=postgres", "dbname=granted");
    pg_util::sql(&granted, async |client| {
        client
            .batch_execute(
                "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO writer; \
                 GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA public TO writer",
            )
            .await
            .unwrap();
    });
    let node = fleet_util::start_node(
        dir.path(),
        "writer",
        &cluster.url_as("writer", "granted"),
        &node_key,
        &senders,
        &[],
    );
    fleet_util::send_all(None, &device_key, &node.public_key, node.link, 3);
    let count: i64 = pg_util::sql(&granted, async |client| {
        client
            .query_one("SELECT count(*)::bigint FROM chunks", &[])
            .await
            .unwrap()
            .get(0)
    });
    assert!(count >= 1, "the records are stored: {count} chunk rows");
}

/// An outside audit: docs/scale-out.md offered `sslmode=require`, which this node's client cannot speak: every try
/// failed its TLS handshake and exited 1, which systemd restarts for ever. It is refused at once as a flag error.
#[test]
fn a_url_that_asks_for_tls_exits_78_saying_the_node_connects_without_it() {
    let fleet = Fleet::new();
    let (status, err) = fleet.refused(
        "tls",
        "postgresql://pure@db.example/fleet?sslmode=require",
        &[],
    );
    assert_eq!(status, Some(EXIT_CONFIG), "{err}");
    said_once(&err, "it asks for TLS");
    assert!(
        err.contains("give sslmode=disable (or prefer) in --store")
            && err.contains("this pure-serve connects without TLS"),
        "{err}"
    );
}
