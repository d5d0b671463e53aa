//! The `pure-serve` command line: flags and subcommands. Types from clap stop here; each subcommand turns its
//! flags into validated settings and calls into the library.

pub mod demo;
pub mod node;
pub mod push;
pub mod records;
pub mod send;
pub mod senders;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// Default UDP port of a node's links.
pub const DEFAULT_LINK_PORT: u16 = 7380;
/// Default TCP port of `/healthz` and `POST /link` (links over HTTP, and wires from other nodes): the one after
/// the links'.
pub const DEFAULT_HTTP_PORT: u16 = 7381;
/// Default TCP port of the metrics listener (`/metrics`, `/healthz`): the one after HTTP's, on loopback.
pub const DEFAULT_METRICS_PORT: u16 = 7382;

/// The metrics listener when `--metrics-listen` is not given: loopback, this host only, at
/// [`DEFAULT_METRICS_PORT`]; at port 0 (a free one) when the HTTP port is 0, so that nodes started side by side
/// (tests, benches) with `--http-port 0` never collide on it.
pub fn default_metrics_listen(http_port: u16) -> std::net::SocketAddr {
    let port = if http_port == 0 {
        0
    } else {
        DEFAULT_METRICS_PORT
    };
    std::net::SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, port))
}

/// `--store`'s value. A parser of its own because clap's own error for a bad value begins by echoing it, whole: a
/// URL with a password would reach the journal, and a 100 kB value would be printed back. This one says only what
/// [`crate::store::engine::StoreChoice::parse`] says, which masks the password and shortens what it shows.
#[derive(Clone)]
pub struct StoreParser;

impl clap::builder::TypedValueParser for StoreParser {
    type Value = crate::store::engine::StoreChoice;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        _arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<Self::Value, clap::Error> {
        let text = value.to_str().ok_or_else(|| {
            clap::Error::raw(
                clap::error::ErrorKind::InvalidUtf8,
                "--store is not UTF-8: give `sqlite` or a postgres:// URL\n",
            )
            .with_cmd(cmd)
        })?;
        crate::store::engine::StoreChoice::parse(text).map_err(|e| {
            clap::Error::raw(clap::error::ErrorKind::ValueValidation, format!("{e}\n"))
                .with_cmd(cmd)
        })
    }
}

/// `--metrics-listen`'s value: `ADDR:PORT`.
pub fn parse_listen(s: &str) -> Result<std::net::SocketAddr, String> {
    s.parse().map_err(|_| {
        format!(
            "{s:?} is not ADDR:PORT: give e.g. 127.0.0.1:{DEFAULT_METRICS_PORT}, 0.0.0.0:{DEFAULT_METRICS_PORT} \
             or [::1]:{DEFAULT_METRICS_PORT}"
        )
    })
}

#[derive(Parser, Debug)]
#[command(
    name = "pure-serve",
    version,
    about = "A link node: devices deliver records over encrypted UDP; each is stored exactly once in SQLite before it is acknowledged.",
    long_about = "A link node: devices (senders) deliver records over connectionless, encrypted UDP links; the node \
stores each record exactly once in SQLite before it tells the sender \"stored\".\n\n\
With no subcommand, runs the node. With no flags at all it makes ./pure-state, a node key in it, and listens on UDP \
port 7380; it prints its public key, which senders need.\n\n\
Getting started:\n  \
pure-serve keygen --out device.key          # on a device: prints its public key\n  \
echo \"dev1 DEVICE_PUBLIC_KEY\" > senders     # on the node: who may send\n  \
pure-serve --senders senders                # run the node; note its public key\n  \
seq 1 100 | pure-serve send --key device.key --node NODE_PUBLIC_KEY --to HOST:7380\n  \
pure-serve records                          # what was stored\n\n\
Try it all on one machine first: pure-serve demo"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Log level or filter (error, warn, info, debug, trace, or e.g. `pure_serve::receive=debug`). Overrides
    /// RUST_LOG. Logs go to standard error; under systemd, to the journal.
    #[arg(long, global = true, value_name = "LEVEL")]
    pub log: Option<String>,
    #[command(flatten)]
    pub node: node::NodeArgs,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Make a new private key file (mode 0600) and print its public key; or, with --many, the keys of many
    /// devices and the senders-file lines for them.
    #[command(after_help = "Examples:\n  \
        pure-serve keygen --out device.key                 # one device: prints its public key\n  \
        pure-serve keygen --many 1000 --out-dir batch1      # dev-1 … dev-1000\n  \
        pure-serve keygen --many 500 --out-dir batch2 --name-prefix kitchen- --start 1001 --digits 5\n\n\
        With --many N, for each device NAME (--name-prefix, then its number from --start) it writes in --out-dir,\n\
        each with mode 0600 (the directory is made with mode 0700 if missing):\n  \
        NAME.key   the private key file, as --out writes it (pure-serve send --key NAME.key)\n  \
        NAME.bin   the same private key as 32 raw bytes, for a firmware to flash\n  \
        NAME.h     a C header: static const uint8_t pure_device_key[32], the public key in a comment\n\
        and for all N one senders.fragment (mode 0644): a `NAME PUBLIC_KEY_BASE64` line each, the senders file's\n\
        format, to append to the node's senders file (then pure-serve check, and reload the node).\n\n\
        It never overwrites a file: if one it would write exists, it stops, removes what it made and names the file.\n\
        Names are checked as the senders file checks them. Progress goes to standard error every second; the key\n\
        files are synced to disk once, before the fragment is written. docs/operations.md, \"Many devices\".")]
    Keygen(KeygenArgs),
    /// Print the public key of a private key file.
    Pubkey(PubkeyArgs),
    /// Send records read from standard input (one line each) to a node, and wait until all are stored.
    #[command(after_help = "Examples:\n  \
        seq 1 1000 | pure-serve send --key device.key --node NODE_PUBLIC_KEY --to 192.0.2.1:7380\n  \
        tail -f readings.log | pure-serve send --key device.key --node NODE_PUBLIC_KEY --to node.lan:7380 --timeout 0\n  \
        pure-serve send --key device.key --node NODE_PUBLIC_KEY --to node.lan:7380 --listen main \\\n      \
        --heard-file main.heard --stay forever --exec 'apply-setting' < /dev/null\n\n\
        The first packet asks the node where this sender's records of the app stand, so records continue after\n\
        what an earlier run stored. Up to 262,144 records (and 8 MiB of them) are in flight at once (sixteen of a\n\
        node's turns, so the link goes on while the node syncs the turns before). Exit status: 0 when every record\n\
        is stored, 1 otherwise (the message says how many were not acknowledged and why).\n\n\
        Downlink (docs/downlink.md): --listen APP also prints the app's records queued for this device (pure-serve\n\
        push on the node), each once and in order, on standard output; the rest goes to standard error. A record\n\
        is handed over once written there (a pipe's reader that dies loses what it had not handled); --exec CMD\n\
        runs CMD per record instead and hands the record over only when CMD exits 0. --heard-file keeps what was\n\
        handed over, so the next run goes on after it; one run at a time uses it. Without --stay the command\n\
        exits once nothing more waits (a device that wakes on a schedule); with --stay it takes pushed records as\n\
        they come. It offers the node version 1.2 (--down-window, 256 KiB by default): a large downlink, a file\n\
        pushed as pieces, comes several datagrams an answer and costs the device a small acknowledgement each;\n\
        --down-window 0 keeps version 1.1 (each answer within the bytes the device sent).")]
    Send(send::SendArgs),
    /// Queue downlink records for one sender through the running node (one line of standard input each).
    #[command(after_help = "Examples:\n  \
        printf 'rate=10\\nreboot\\n' | pure-serve push --state /var/lib/pure-serve --app main --to kitchen-1\n  \
        curl --unix-socket STATE/push.sock --data-binary @records 'http://node/push?app=main&to=kitchen-1'\n\n\
        All the lines are one push, queued all or nothing in the app's store and synced to disk before this\n\
        prints the sequences they were given; the device gets them the next time its link is live (at once if it\n\
        is live now and listening: pure-serve send --listen). An empty standard input queues nothing, but the\n\
        node checks the app and the sender all the same.\n\n\
        Exit status: 0 queued; 65 refused, nothing queued: a record above 1024 bytes, standard input above 4 MiB,\n\
        or the sender's max_records or max_bytes (the message names the bound, its table in the apps file and the\n\
        fix); 67 no such app or sender; 69 could not connect to the socket, nothing was sent (no node there, or\n\
        this user may not connect: the message says which); 74 the connection broke after the push was sent, or\n\
        the node's store failed as it queued: the records may or may not be queued, and pushing again may queue\n\
        them twice; 75 not queued now (the node is busy, its store failed, or it is stopping): nothing was\n\
        queued, push again. docs/downlink.md has the rest.")]
    Push(push::PushArgs),
    /// Print stored records.
    #[command(after_help = "Examples:\n  \
        pure-serve records --state /var/lib/private/pure-serve --source kitchen-1 | tail\n  \
        pure-serve records --json | jq -r 'select(.seq > 100) | .payload'\n  \
        pure-serve records --waiting --source kitchen-1   # downlink records kitchen-1 has not taken yet\n\n\
        Plain output is one record per line: app, source, sequence, payload (tab-separated; bytes that are not\n\
        UTF-8 are shown replaced). --json gives payload as text when it is UTF-8, else payload_b64. With\n\
        --waiting the source is the sender each downlink record waits for.\n\n\
        Order: without --from, each app's records by source name, then by sequence (each source's records\n\
        together); with --from POS (and with --follow), by position, the order the app stored them in, over all\n\
        sources. `--from 1` lists everything in store order.\n\n\
        Exit status: 0; 78 when the fleet's database (--store) refuses the login, is not there, or may not be read,\n\
        or a store is not a database or is damaged (the message says the fix); 2 for a mistake in the flags; 1\n\
        otherwise.")]
    Records(records::RecordsArgs),
    /// List the senders with when each last stored a record, the quietest first: which devices went quiet.
    #[command(after_help = "Examples:\n  \
        pure-serve senders --state /var/lib/private/pure-serve | head        # the quietest ten, and never-seen\n  \
        pure-serve senders --quiet-for 6h                                     # no record for six hours or more\n  \
        pure-serve senders --name kitchen- --json | jq -r .name\n\n\
        One line per sender of the senders file: its name, when its newest record was stored (UTC) and how long\n\
        ago, its heard sequence (the last record stored, the largest over the apps), and how many downlink records\n\
        wait for it. Never-heard-of senders first, then the longest quiet. A count by hour and day goes to\n\
        standard error. It reads the stores as the node keeps them (or the fleet's database with --store) and\n\
        writes nothing; docs/operations.md, \"Which devices went quiet\".")]
    Senders(senders::SendersArgs),
    /// Run a node and simulated senders on loopback in this process, and show what they stored and how fast.
    Demo(demo::DemoArgs),
    /// Check the node's configuration without serving: list every problem, exit non-zero if there is one.
    #[command(after_help = "Examples:\n  \
        sudo pure-serve check --senders /etc/pure-serve/senders --state /var/lib/private/pure-serve\n  \
        pure-serve check --apps /etc/pure-serve/apps.toml --senders /etc/pure-serve/senders\n\n\
        Prints `ok:` for each file that is fine, `warning:` for what is allowed but probably not meant (it does not\n\
        stop the node), and `problem: FILE:LINE: …` for each problem with how to fix it. Exit status: 0 when there\n\
        is no problem, 1 otherwise (2 for a mistake in the flags). Nothing is written.")]
    Check(CheckArgs),
}

#[derive(Args, Debug)]
pub struct CheckArgs {
    /// The senders file to check. Default: `senders` in the state directory, as the node.
    #[arg(long, value_name = "FILE")]
    pub senders: Option<PathBuf>,
    /// The node key to check. Default: node.key in the state directory, as the node.
    #[arg(long, value_name = "FILE")]
    pub key: Option<PathBuf>,
    /// The state directory. Default: $STATE_DIRECTORY or ./pure-state, as the node.
    #[arg(long, value_name = "DIR")]
    pub state: Option<PathBuf>,
    /// The apps file to check (docs/apps.md): every problem with its line, app and key, then warnings such as
    /// accept names that the senders file does not have. Without it: the node's one app `main`.
    #[arg(long, value_name = "FILE")]
    pub apps: Option<PathBuf>,
    /// The address the node listens on, as the node's --bind: its ports are tried (bound and let go).
    #[arg(long, value_name = "ADDR", default_value = "::")]
    pub bind: std::net::IpAddr,
    /// The node's UDP port for links, to try (0: not tried).
    #[arg(long, value_name = "PORT", default_value_t = DEFAULT_LINK_PORT)]
    pub link_port: u16,
    /// The node's TCP port for HTTP, to try (0: not tried).
    #[arg(long, value_name = "PORT", default_value_t = DEFAULT_HTTP_PORT)]
    pub http_port: u16,
    /// The node's metrics listener, as the node's --metrics-listen, to try (port 0: not tried). Default:
    /// 127.0.0.1:7382, or port 0 with --http-port 0.
    #[arg(long, value_name = "ADDR:PORT", value_parser = parse_listen)]
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// The node's --push-socket (PATH or none), to check its path (and that of the datagram socket made from it).
    #[arg(long, value_name = "PATH|none")]
    pub push_socket: Option<PathBuf>,
    /// The node's --push-datagrams (PATH or none), to check its path.
    #[arg(long, value_name = "PATH|none")]
    pub push_datagrams: Option<PathBuf>,
}

pub fn check(args: &CheckArgs) -> anyhow::Result<()> {
    let state_dir = args.state.clone().unwrap_or_else(node::default_state_dir);
    let input = crate::ops::check::CheckInput {
        key_file: args
            .key
            .clone()
            .unwrap_or_else(|| state_dir.join("node.key")),
        senders_file: args.senders.clone().or_else(|| {
            let p = state_dir.join("senders");
            p.exists().then_some(p)
        }),
        apps_file: args.apps.clone(),
        link_addr: (args.link_port != 0).then(|| {
            std::net::SocketAddr::new(crate::common::listen::effective(args.bind), args.link_port)
        }),
        http_addr: (args.http_port != 0).then(|| {
            std::net::SocketAddr::new(crate::common::listen::effective(args.bind), args.http_port)
        }),
        metrics_addr: Some(
            args.metrics_listen
                .unwrap_or_else(|| default_metrics_listen(args.http_port)),
        )
        .filter(|a| a.port() != 0),
        push_socket: args.push_socket.clone(),
        push_datagrams: args.push_datagrams.clone(),
        state_dir,
    };
    let report = crate::ops::check::check(&input);
    for f in &report.fine {
        println!("ok: {f}");
    }
    for w in &report.warnings {
        println!("warning: {w}");
    }
    for p in &report.problems {
        println!("problem: {p}");
    }
    match report.problems.len() {
        0 => {
            println!("configuration is fine");
            Ok(())
        }
        n => anyhow::bail!(
            "{n} problem{} found; the node would not start with this configuration",
            if n == 1 { "" } else { "s" }
        ),
    }
}

#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("what").required(true).args(["out", "many"])))]
pub struct KeygenArgs {
    /// Where to write the private key (one device); refuses to overwrite an existing file.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Make N devices at once (1 to 1,000,000): three key files each in --out-dir and one senders.fragment for
    /// all (below).
    #[arg(long, value_name = "N", requires = "out_dir",
          value_parser = clap::value_parser!(u64).range(1..=crate::provision::MAX_DEVICES))]
    pub many: Option<u64>,
    /// With --many: the directory for the devices' files and senders.fragment (made with mode 0700 if missing).
    #[arg(long, value_name = "DIR", requires = "many")]
    pub out_dir: Option<PathBuf>,
    /// With --many: device names are this, then the number.
    #[arg(long, value_name = "PREFIX", default_value = "dev-", requires = "many")]
    pub name_prefix: String,
    /// With --many: the first device's number.
    #[arg(long, value_name = "NUMBER", default_value_t = 1, requires = "many")]
    pub start: u64,
    /// With --many: pad the numbers with zeros to this many digits (0: not padded; 5 gives dev-00001).
    #[arg(long, value_name = "D", default_value_t = 0, requires = "many",
          value_parser = clap::value_parser!(u8).range(0..=20))]
    pub digits: u8,
}

#[derive(Args, Debug)]
pub struct PubkeyArgs {
    /// The private key file.
    #[arg(long, value_name = "FILE")]
    pub key: PathBuf,
}

pub fn keygen(args: &KeygenArgs) -> anyhow::Result<()> {
    let (Some(count), Some(out_dir)) = (args.many, &args.out_dir) else {
        let Some(out) = &args.out else {
            anyhow::bail!("give --out FILE (one key) or --many N --out-dir DIR (many devices)");
        };
        let identity = crate::proto::crypto::Identity::generate();
        crate::keys::write_new_identity(out, &identity)?;
        println!("{}", crate::keys::encode_key(identity.public()));
        return Ok(());
    };
    let plan = crate::provision::Plan {
        out_dir: out_dir.clone(),
        prefix: args.name_prefix.clone(),
        start: args.start,
        count,
        digits: usize::from(args.digits),
    };
    let workers = std::thread::available_parallelism().map_or(1, usize::from);
    let started = std::time::Instant::now();
    let made = crate::provision::provision(&plan, workers, |done, total| {
        eprintln!("keygen: {done} of {total} devices made");
    })?;
    let dir = out_dir.display();
    println!(
        "made {} devices, {} … {}, in {dir} in {:.2} s: NAME.key, NAME.bin, NAME.h each (mode 0600)",
        made.count,
        made.first,
        made.last,
        started.elapsed().as_secs_f64()
    );
    println!(
        "senders lines: {}; on the node, append them to the senders file, check it and reload:",
        made.fragment.display()
    );
    println!(
        "  cat {} >> /etc/pure-serve/senders",
        made.fragment.display()
    );
    println!(
        "  pure-serve check --senders /etc/pure-serve/senders && sudo systemctl reload pure-serve"
    );
    Ok(())
}

pub fn pubkey(args: &PubkeyArgs) -> anyhow::Result<()> {
    let identity = crate::keys::read_identity(&args.key)?;
    println!("{}", crate::keys::encode_key(identity.public()));
    Ok(())
}

/// EX_CONFIG (sysexits.h): the command stopped because of its configuration — a bad flag of the node, a bad
/// senders, apps, key, TLS or password file, a limit on open files too low for it, a state directory that looks like
/// it lost data, a store of a newer layout, a fleet's database that refuses the login, is not there, may not be
/// written, or does not make commits durable. Starting it again cannot help, so the unit does not restart on it
/// (`RestartPreventExitStatus=78`, docs/operations.md).
pub const EXIT_CONFIG: i32 = 78;

/// The exit status after `e` stopped a command (the node, `records`): [`EXIT_CONFIG`] when the configuration is at
/// fault, 1 for anything a restart may cure (a port in use, a disk that failed, a database that is down). Each
/// layer's error type says which of its errors are the configuration's (`is_configuration`); this only asks them.
pub fn exit_status(e: &anyhow::Error) -> i32 {
    use crate::apps::config::AppsError;
    use crate::files::FileError;
    use crate::http::HttpError;
    use crate::keys::KeyError;
    use crate::ops::fds::FdError;
    use crate::receive::NodeError;
    use crate::senders::SendersError;
    use crate::store::StoreError;
    use crate::store::engine::{StoreChoiceError, StorePasswordError};
    use crate::store::state::StateError;
    let configuration = e.chain().any(|c| {
        c.downcast_ref::<NodeError>()
            .is_some_and(NodeError::is_configuration)
            || c.downcast_ref::<HttpError>()
                .is_some_and(HttpError::is_configuration)
            || c.downcast_ref::<StoreError>()
                .is_some_and(StoreError::is_configuration)
            // Every error of these types is a file or a setting the operator gave.
            || c.is::<AppsError>()
            || c.is::<FdError>()
            || c.is::<KeyError>()
            || c.is::<SendersError>()
            || c.is::<FileError>()
            || c.is::<StateError>()
            || c.is::<crate::receive::pushes::PushDatagramError>()
            || c.is::<StoreChoiceError>()
            || c.is::<StorePasswordError>()
    });
    if configuration { EXIT_CONFIG } else { 1 }
}

/// The exit status after the command line could not be read. The node's flags are its configuration (a unit's
/// `ExecStart=`): a mistake in them is [`EXIT_CONFIG`], so systemd does not restart it in a loop. Another
/// command's is clap's usage error (2); `--help` and `--version` are 0.
pub fn usage_exit_status(e: &clap::Error, args: &[std::ffi::OsString]) -> i32 {
    use clap::CommandFactory;
    use clap::error::ErrorKind;
    if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) || !e.use_stderr() {
        return e.exit_code();
    }
    // What the line names when its mistakes are passed over: a subcommand, or the node.
    let node = Cli::command()
        .ignore_errors(true)
        .try_get_matches_from(args)
        .map_or(true, |m| m.subcommand_name().is_none());
    if node { EXIT_CONFIG } else { e.exit_code() }
}

/// The error and its causes, each said once: a cause whose words the message already holds (an OS error that a
/// layer above already quoted, SQLite's code behind its own message, the client's "db error" before the database's
/// own words) is left out.
pub fn one_line(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        if cause.is::<rusqlite::ffi::Error>() {
            continue;
        }
        let words = cause.to_string();
        if text.contains(&words) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&words);
    }
    text
}
