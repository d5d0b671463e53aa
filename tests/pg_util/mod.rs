//! A throwaway PostgreSQL cluster for a test: `initdb` in a temp dir, the server on a unix socket in it (no TCP
//! port), stopped and removed when dropped. PostgreSQL refuses to run as root: as root the cluster runs as the
//! `postgres` user (`setpriv`), otherwise as the test's own user.
//!
//! Without PostgreSQL's binaries (`/usr/lib/postgresql/VERSION/bin`) [`PgCluster::start`] returns `None` and the
//! test says it skipped and how to run it, unless `PURE_REQUIRE_POSTGRES=1` (CI, `.ci/run`), where it fails.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

pub struct PgCluster {
    dir: tempfile::TempDir,
    bin: PathBuf,
    as_postgres: bool,
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// The newest PostgreSQL's binaries, if any.
fn find_bin() -> Option<PathBuf> {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let v: u32 = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((v, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, b)| b)
}

impl PgCluster {
    /// Starts a cluster, or says why not: `None` (skip) only when PostgreSQL is not installed and not required.
    pub fn start(test: &str) -> Option<PgCluster> {
        let required = std::env::var_os("PURE_REQUIRE_POSTGRES").is_some_and(|v| v == "1");
        let Some(bin) = find_bin() else {
            let why = "no PostgreSQL here (/usr/lib/postgresql/*/bin/initdb): install it \
                       (`apt-get install postgresql`) to run this test; CI does (.ci/run)";
            assert!(!required, "{test}: PURE_REQUIRE_POSTGRES=1 but {why}");
            eprintln!("skipped: {test}: {why}");
            return None;
        };
        let as_postgres = is_root();
        let dir = tempfile::Builder::new()
            .prefix("pure-pg-")
            .tempdir_in("/var/tmp")
            .or_else(|_| tempfile::tempdir())
            .expect("a temp dir for the cluster");
        if as_postgres {
            let st = Command::new("chown")
                .arg("postgres")
                .arg(dir.path())
                .status()
                .expect("chown");
            assert!(st.success(), "chown postgres {}", dir.path().display());
        }
        let c = PgCluster {
            dir,
            bin,
            as_postgres,
        };
        c.run(
            "initdb",
            &[
                "-D",
                &c.data().to_string_lossy(),
                "-A",
                "trust",
                "-U",
                "postgres",
            ],
        );
        c.start_server();
        Some(c)
    }

    /// Starts the server (again, after [`PgCluster::kill`]), waiting until it takes connections.
    pub fn start_server(&self) {
        let opts = format!(
            "-k {} -c listen_addresses= -c fsync=on -c synchronous_commit=on",
            self.socket_dir().display()
        );
        self.run(
            "pg_ctl",
            &[
                "-D",
                &self.data().to_string_lossy(),
                "-l",
                &self.dir.path().join("log").to_string_lossy(),
                "-w",
                "-o",
                &opts,
                "start",
            ],
        );
    }

    /// Stops the server at once, as a crash would (`-m immediate`: no checkpoint, connections cut).
    pub fn kill(&self) {
        self.run(
            "pg_ctl",
            &[
                "-D",
                &self.data().to_string_lossy(),
                "-m",
                "immediate",
                "-w",
                "stop",
            ],
        );
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    pub fn socket_dir(&self) -> &Path {
        self.dir.path()
    }

    /// The cluster as `--store` names it.
    pub fn url(&self) -> String {
        format!(
            "postgresql://postgres@localhost/postgres?host={}",
            self.socket_dir().display()
        )
    }

    /// The cluster as a libpq key=value string.
    pub fn conninfo(&self) -> String {
        format!(
            "host={} user=postgres dbname=postgres",
            self.socket_dir().display()
        )
    }

    fn command(&self, tool: &str) -> Command {
        let exe = self.bin.join(tool);
        let mut cmd = if self.as_postgres {
            let mut c = Command::new("setpriv");
            c.args(["--reuid=postgres", "--regid=postgres", "--init-groups"])
                .arg(exe);
            c
        } else {
            Command::new(exe)
        };
        cmd.stdin(Stdio::null());
        cmd
    }

    fn run(&self, tool: &str, args: &[&str]) {
        let out = self
            .command(tool)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("{tool}: {e}"));
        let log = std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default();
        assert!(
            out.status.success(),
            "{tool} {args:?} failed: {}\n{}\nserver log:\n{log}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        let _ = self
            .command("pg_ctl")
            .args([
                "-D",
                &self.data().to_string_lossy(),
                "-m",
                "immediate",
                "stop",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}
