//! A throwaway PostgreSQL cluster for a test: `initdb` in a temp dir, the server on a unix socket in it (no TCP
//! port; with [`PgCluster::start_in`], also TCP on an address inside a network namespace), stopped and removed
//! when dropped. PostgreSQL refuses to run as root: as root the cluster runs as the
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
    /// The network namespace the server runs in, and the address there it listens on for TCP (port 5432).
    netns: Option<(String, String)>,
    /// Its port: 5432, or a free one for a cluster on the test's own loopback ([`PgCluster::start_tcp`]).
    port: u16,
    /// Whether it listens on TCP at 127.0.0.1:`port` too ([`PgCluster::start_tcp`]).
    tcp: bool,
}

/// A TCP port free on loopback now (bound and let go).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// Whether PostgreSQL's binaries are here (for a test that checks all it needs before it starts anything).
pub fn installed() -> bool {
    find_bin().is_some()
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

/// Runs `f` with a client of the caller's own connected to `conninfo`, on a runtime made for the call: for the
/// tests' and benches' reads and writes of a cluster beside the nodes.
pub fn sql<T>(conninfo: &str, f: impl AsyncFnOnce(&tokio_postgres::Client) -> T) -> T {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (client, conn) = tokio_postgres::connect(conninfo, tokio_postgres::NoTls)
            .await
            .expect("connect to the test's cluster");
        tokio::spawn(conn);
        f(&client).await
    })
}

impl PgCluster {
    /// Starts a cluster, or says why not: `None` (skip) only when PostgreSQL is not installed and not required.
    pub fn start(test: &str) -> Option<PgCluster> {
        Self::start_with(test, None)
    }

    /// [`PgCluster::start`] with the server in the network namespace `netns`, listening on TCP at `addr:5432`
    /// there (trusting any client: the namespace is the test's own) besides its unix socket. A firewall rule
    /// between a client and `addr` then bites, as it does not on the unix socket.
    pub fn start_in(test: &str, netns: &str, addr: &str) -> Option<PgCluster> {
        Self::start_with(test, Some((netns.to_string(), addr.to_string())))
    }

    /// [`PgCluster::start`] with the server on TCP at 127.0.0.1 too, on a free port of its own ([`PgCluster::tcp_host`]),
    /// so that a URL may name several clusters as hosts.
    pub fn start_tcp(test: &str) -> Option<PgCluster> {
        Self::start_on(test, None, true)
    }

    fn start_with(test: &str, netns: Option<(String, String)>) -> Option<PgCluster> {
        Self::start_on(test, netns, false)
    }

    fn start_on(test: &str, netns: Option<(String, String)>, tcp: bool) -> Option<PgCluster> {
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
            netns,
            port: if tcp { free_port() } else { 5432 },
            tcp,
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
        if c.netns.is_some() {
            use std::io::Write;
            let mut hba = std::fs::OpenOptions::new()
                .append(true)
                .open(c.data().join("pg_hba.conf"))
                .expect("pg_hba.conf");
            writeln!(hba, "host all all 0.0.0.0/0 trust").unwrap();
        }
        c.start_server();
        Some(c)
    }

    /// Starts the server (again, after [`PgCluster::kill`]), waiting until it takes connections.
    pub fn start_server(&self) {
        self.start_server_fsync(true);
    }

    /// Stops the server cleanly and starts it again with `fsync` on or off (research/041 measures a node beside a
    /// database whose fsync is off; every test runs with it on).
    #[allow(dead_code)]
    pub fn restart_with_fsync(&self, on: bool) {
        self.restart_with(on, "");
    }

    /// [`PgCluster::restart_with_fsync`] with more server options (`-c name=value …`): research/047 preloads
    /// `pg_stat_statements` to see which statements take a turn's time.
    #[allow(dead_code)]
    pub fn restart_with(&self, fsync: bool, extra: &str) {
        self.run(
            "pg_ctl",
            &[
                "-D",
                &self.data().to_string_lossy(),
                "-m",
                "fast",
                "-w",
                "stop",
            ],
        );
        self.start_server_with(fsync, extra);
    }

    fn start_server_fsync(&self, fsync: bool) {
        self.start_server_with(fsync, "");
    }

    fn start_server_with(&self, fsync: bool, extra: &str) {
        let listen = match &self.netns {
            Some((_, addr)) => addr.as_str(),
            None if self.tcp => "127.0.0.1",
            None => "",
        };
        let fsync = if fsync { "on" } else { "off" };
        // Research runs may add server options (`PURE_PG_OPTS`, e.g. `-c log_min_duration_statement=20`) and keep
        // the server's log where they say (`PURE_PG_LOG`); tests never set them.
        let research = std::env::var("PURE_PG_OPTS").unwrap_or_default();
        let opts = format!(
            "-k {} -p {} -c listen_addresses={listen} -c fsync={fsync} -c synchronous_commit=on {extra} {research}",
            self.socket_dir().display(),
            self.port
        );
        let log = std::env::var_os("PURE_PG_LOG")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| self.dir.path().join("log"));
        self.run_in(
            "pg_ctl",
            &[
                "-D",
                &self.data().to_string_lossy(),
                "-l",
                &log.to_string_lossy(),
                "-w",
                "-o",
                &opts,
                "start",
            ],
            true,
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

    /// Puts `line` first in the server's `pg_hba.conf` (so it wins over initdb's `trust` lines) and starts the server
    /// again to read it (a restart, which waits, rather than a reload, which does not say when it took effect).
    pub fn hba_first(&self, line: &str) {
        let path = self.data().join("pg_hba.conf");
        let old = std::fs::read_to_string(&path).expect("pg_hba.conf");
        std::fs::write(&path, format!("{line}\n{old}")).expect("write pg_hba.conf");
        self.kill();
        self.start_server();
    }

    /// The cluster as `--store` names it, as `user` on `database`.
    pub fn url_as(&self, user: &str, database: &str) -> String {
        format!(
            "postgresql://{user}@localhost/{database}?host={}",
            self.socket_dir().display()
        )
    }

    /// A standby of this cluster in a temp dir of its own, made by `pg_basebackup -R` and streaming from this one,
    /// started (it takes read-only connections on its own socket). With `synchronous`, this cluster's commits then
    /// wait for it ([`PgCluster::make_synchronous`]).
    pub fn start_standby(&self, synchronous: bool) -> PgCluster {
        let dir = tempfile::Builder::new()
            .prefix("pure-pg-standby-")
            .tempdir_in("/var/tmp")
            .or_else(|_| tempfile::tempdir())
            .expect("a temp dir for the standby");
        if self.as_postgres {
            let st = Command::new("chown")
                .arg("postgres")
                .arg(dir.path())
                .status()
                .expect("chown");
            assert!(st.success(), "chown postgres {}", dir.path().display());
        }
        let standby = PgCluster {
            dir,
            bin: self.bin.clone(),
            as_postgres: self.as_postgres,
            netns: None,
            port: if self.tcp { free_port() } else { 5432 },
            tcp: self.tcp,
        };
        self.run(
            "pg_basebackup",
            &[
                "-D",
                &standby.data().to_string_lossy(),
                "-R",
                "-X",
                "stream",
                "-h",
                &self.socket_dir().to_string_lossy(),
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
            ],
        );
        standby.start_server();
        if synchronous {
            self.make_synchronous();
        }
        standby
    }

    /// Makes this cluster's commits wait for a standby's flush (`synchronous_standby_names = '*'`), and waits until
    /// a standby streams to it as a synchronous one.
    pub fn make_synchronous(&self) {
        sql(&self.conninfo(), async |client| {
            client
                .batch_execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
                .await
                .unwrap();
            client
                .batch_execute("SELECT pg_reload_conf()")
                .await
                .unwrap();
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
            loop {
                let sync: i64 = client
                    .query_one(
                        "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'",
                        &[],
                    )
                    .await
                    .unwrap()
                    .get(0);
                if sync > 0 {
                    break;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "no synchronous standby streams to the primary"
                );
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        })
    }

    /// Kills the server's postmaster with SIGKILL, as a machine that dies would stop it (its backends end when they
    /// find it gone; nothing is checkpointed).
    pub fn sigkill(&self) {
        let pid_file =
            std::fs::read_to_string(self.data().join("postmaster.pid")).expect("postmaster.pid");
        let pid: i32 = pid_file.lines().next().unwrap().trim().parse().unwrap();
        // SAFETY: kill(2) of the cluster's own postmaster, by the pid it wrote.
        assert_eq!(
            unsafe { libc::kill(pid, libc::SIGKILL) },
            0,
            "kill -9 {pid}"
        );
    }

    /// Promotes this standby to a primary (`pg_ctl promote`, which waits until it takes writes).
    pub fn promote(&self) {
        self.run(
            "pg_ctl",
            &["-D", &self.data().to_string_lossy(), "-w", "promote"],
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

    /// The cluster as `--store` names it over TCP, for a client in a namespace that reaches the server's address
    /// ([`PgCluster::start_in`]).
    pub fn tcp_url(&self) -> String {
        let (_, addr) = self
            .netns
            .as_ref()
            .expect("a cluster started with start_in");
        format!("postgresql://postgres@{addr}:5432/postgres?sslmode=disable")
    }

    /// The cluster as a libpq key=value string (its unix socket, reachable from every namespace).
    pub fn conninfo(&self) -> String {
        format!(
            "host={} port={} user=postgres dbname=postgres",
            self.socket_dir().display(),
            self.port
        )
    }

    /// Where a cluster of [`PgCluster::start_tcp`] listens on TCP, as a URL's host names it.
    pub fn tcp_host(&self) -> String {
        assert!(self.tcp, "a cluster started with start_tcp");
        format!("127.0.0.1:{}", self.port)
    }

    fn command(&self, tool: &str) -> Command {
        self.command_in(tool, false)
    }

    /// `tool` as the cluster's user, in the cluster's network namespace if `in_netns` (only the server needs to
    /// be there: stopping it goes by its pid file, from anywhere).
    fn command_in(&self, tool: &str, in_netns: bool) -> Command {
        let exe = self.bin.join(tool);
        let mut argv: Vec<std::ffi::OsString> = Vec::new();
        if let Some((ns, _)) = self.netns.as_ref().filter(|_| in_netns) {
            argv.extend(["ip", "netns", "exec", ns].map(Into::into));
        }
        if self.as_postgres {
            argv.extend(
                [
                    "setpriv",
                    "--reuid=postgres",
                    "--regid=postgres",
                    "--init-groups",
                ]
                .map(Into::into),
            );
        }
        argv.push(exe.into());
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..]);
        cmd.stdin(Stdio::null());
        cmd
    }

    fn run(&self, tool: &str, args: &[&str]) {
        self.run_in(tool, args, false)
    }

    fn run_in(&self, tool: &str, args: &[&str], in_netns: bool) {
        let out = self
            .command_in(tool, in_netns)
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
