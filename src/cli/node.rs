//! `pure-serve` with no subcommand: run the node until SIGTERM or SIGINT; SIGHUP reloads the senders file.

use std::io::IsTerminal;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;

use crate::http::push::PushSocket;
use crate::http::{HttpLimits, HttpServer, TlsConfig};
use crate::ops::notify::Notifier;
use crate::ops::signals;
use crate::receive::pushes::PushDatagrams;
use crate::receive::{Control, NodeSettings, ReadyNode};

#[derive(Args, Debug)]
pub struct NodeArgs {
    /// The node's private key. Made (mode 0600) if missing. Default: node.key in the state directory.
    #[arg(long, value_name = "FILE")]
    pub key: Option<PathBuf>,
    /// Allowed senders: one `NAME PUBLIC_KEY_BASE64` per line, `#` comments. Default: `senders` in the state
    /// directory if it exists, else nobody may send.
    #[arg(long, value_name = "FILE")]
    pub senders: Option<PathBuf>,
    /// Apps to host, with the senders each accepts, their budgets and their outlets (links, wires, webhooks,
    /// other apps): a TOML file, every key in docs/apps.md. Default: one app `main` that accepts every sender and
    /// forwards nothing. A bad file stops the node before it serves, naming file, line, app and key (check one with
    /// `pure-serve check --apps FILE`); SIGHUP re-reads it and says what needs a restart.
    #[arg(long, value_name = "FILE")]
    pub apps: Option<PathBuf>,
    /// Where stores, key and memo live; created if missing. Default: $STATE_DIRECTORY (set by systemd) or
    /// ./pure-state.
    #[arg(long, value_name = "DIR")]
    pub state: Option<PathBuf>,
    /// Where records and heard sequences are stored: `sqlite` (one SQLite file per app in the state directory), or
    /// the PostgreSQL that several nodes of one fleet share, as a URL `postgres://USER@HOST[:PORT]/DATABASE`
    /// (docs/scale-out.md); for a database that fails over, every server's address,
    /// `postgres://USER@HOST1:PORT1,HOST2:PORT2/DATABASE`: the node writes only to the one that takes writes, the
    /// primary. A password in the URL is refused: give it in --store-password-file. On PostgreSQL the
    /// node stores links' records exactly once across the fleet's nodes, each outlet is driven by one node at a
    /// time (a lease in the database), and downlink records pushed on any node reach their device on any node.
    #[arg(long, value_name = "URL", default_value = "sqlite",
          value_parser = super::StoreParser)]
    pub store: crate::store::engine::StoreChoice,
    /// The password of --store's database user, on the first line of this file (keep it mode 0600).
    #[arg(long, value_name = "FILE")]
    pub store_password_file: Option<PathBuf>,
    /// UDP port for links (0 picks a free one and prints it).
    #[arg(long, value_name = "PORT", default_value_t = super::DEFAULT_LINK_PORT)]
    pub link_port: u16,
    /// TCP port for HTTP: `/healthz` (for load balancers) and `POST /link` (sealed link packets over HTTP,
    /// answered with the node's acks; docs/protocol.md), on --bind. `/metrics` is not served here but on
    /// --metrics-listen. Connections are bounded per address, per /24 (/56) and in all (docs/operations.md). 0 picks
    /// a free one and prints it.
    #[arg(long, value_name = "PORT", default_value_t = super::DEFAULT_HTTP_PORT)]
    pub http_port: u16,
    /// Take links over UDP only: `POST /link` on --http-port is answered 404 (docs/protocol.md 10), while
    /// `/healthz` and `/` are still served there, for load balancers. (--http-port 0 does not do this: it picks a
    /// free port.)
    #[arg(long)]
    pub no_http_links: bool,
    /// Where to serve the status page (`/`, `/status.json`), `/metrics` (Prometheus) and `/healthz`, as ADDR:PORT: a
    /// listener of their own, so the metrics stay off the port that takes links from the internet. Default:
    /// 127.0.0.1:7382, this host only; to scrape
    /// from elsewhere give an address of the network Prometheus is on (or 0.0.0.0:7382, and firewall it). With
    /// --http-port 0 the default port is 0 too (a free one, printed), so nodes started side by side never collide.
    #[arg(long, value_name = "ADDR:PORT", value_parser = super::parse_listen)]
    pub metrics_listen: Option<SocketAddr>,
    /// A sender with no record stored for this long counts as quiet: the status page's devices panel and
    /// `pure_senders_quiet` on /metrics, which the shipped alert "devices quiet" fires on (docs/operations.md). Give
    /// a few times your devices' reporting interval: e.g. 90s, 30m, 6h, 2d.
    #[arg(long, value_name = "DURATION", default_value = "1h", value_parser = super::senders::parse_duration)]
    pub quiet_after: std::time::Duration,
    /// Where programs of this machine queue downlink records for senders (`pure-serve push`, or HTTP `POST
    /// /push?app=APP&to=SENDER` on it: docs/downlink.md): a Unix socket, mode 0660, so who may push is who may
    /// open it. Default: push.sock in the state directory (0700: the node's user and root). `none` serves none.
    #[arg(long, value_name = "PATH|none")]
    pub push_socket: Option<PathBuf>,
    /// Where programs of this machine queue downlink records a datagram at a time, answered by a datagram
    /// (docs/downlink.md, "The push datagram socket"): the quickest way to a live device, read by the loop that
    /// stores and sends. A Unix datagram socket, mode 0660 like --push-socket. Default: the push socket's path with
    /// the extension .dgram (push.dgram in the state directory; .dgram added to a path that has it already); none
    /// with --push-socket none. `none` serves none.
    #[arg(long, value_name = "PATH|none")]
    pub push_datagrams: Option<PathBuf>,
    /// Serve TLS (HTTPS) on --http-port too, with this PEM certificate chain: the server's certificate first, then
    /// any intermediates. Needs --tls-key. Plain HTTP keeps working on the same port (the first byte of a
    /// connection tells them apart).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key (PKCS#8, PKCS#1 or SEC1) of --tls-cert. Keep it readable by the node only.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// New TLS connections per second --http-port takes, in total; one /24 (/56) may have an eighth of it, and a
    /// network that opens more than 4 a second only the half of it that networks opening fewer leave. A handshake
    /// costs the HTTP thread a key exchange and a signature (~0.3 ms on the development machines); past the budget a
    /// new TLS connection is closed before its handshake and the client connects again. Connections kept alive are
    /// not touched by it. The default was measured in research/015-http-bounds.
    #[arg(long, value_name = "PER_SECOND", default_value_t = crate::http::DEFAULT_TLS_HANDSHAKE_BUDGET,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub tls_handshake_budget: u32,
    /// Address to listen on for links: UDP --link-port and TCP --http-port (not the metrics: --metrics-listen).
    /// The default, ::, is every address, IPv6 and IPv4 (one dual-stack socket per port; IPv4 alone on a host
    /// without IPv6); 0.0.0.0 is every IPv4 address only.
    #[arg(long, value_name = "ADDR", default_value = "::")]
    pub bind: IpAddr,
    /// A run's session is forgotten after this long without packets (it costs nothing while idle).
    #[arg(long, value_name = "MS", default_value_t = 30_000)]
    pub link_idle_ms: u64,
    /// Socket receive buffer to ask the kernel for, in bytes. Bursts beyond it are dropped by the kernel and sent
    /// again by the senders. 8 MiB was the best of 208 KB to 8 MB at overload, with floods and without
    /// (research/007; 4 MiB had kept four links at full speed without loss, research/004). Past
    /// net.core.rmem_max only as root or with CAP_NET_ADMIN; the node warns when it got less.
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_RECV_BUFFER, value_parser = parse_recv_buffer)]
    pub recv_buffer: usize,
    /// X25519 operations per second that input which does not authenticate may cost the node, in total; one
    /// source prefix (/24, /56) may use an eighth of it. A first packet of a sender not yet known costs one X25519
    /// (~66 µs on the development machines); a real sender's is given back, so this bounds only what forged
    /// packets cost. Beyond it first packets are answered with a cookie (docs/protocol.md 4.4, 6.1). The default
    /// was measured in research/007-overload.
    #[arg(long, value_name = "PER_SECOND", default_value_t = crate::proto::admission::DEFAULT_X25519_BUDGET,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub x25519_budget: u32,
    /// Most runs (sessions) one sender may have active at once: a device has one per boot, a node forwarding here
    /// one per outlet. A new run past it makes the sender's least recently heard idle run go (it costs only a memo
    /// lookup to come back); if none is idle the new run waits (docs/protocol.md 6.2).
    /// At most 1024: a sender's sessions are kept in one short list, looked through for each of its packets.
    #[arg(long, value_name = "N", default_value_t = crate::proto::node::DEFAULT_SESSIONS_PER_SENDER,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1024))]
    pub sessions_per_sender: usize,
    /// Most active runs in all. Default: a quarter of the machine's memory at 1 KiB each (~600 B measured); past it
    /// new runs wait and quiet ones are swept sooner (docs/protocol.md 6.2).
    #[arg(long, value_name = "N", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub max_sessions: Option<usize>,
    /// Name server for outlets given by name (`IP` or `IP:PORT`). Default: the system's, from /etc/resolv.conf;
    /// /etc/hosts is read first either way. Lookups never stop other outlets.
    #[arg(long, value_name = "ADDR", value_parser = parse_dns_server)]
    pub dns: Option<SocketAddr>,
    /// Start even though the state directory looks like it lost data: the key file missing beside the stores, a
    /// different key than the one the state belongs to, or the store of an app that existed gone (STATE/identity
    /// records what was there; docs/durability.md), or a store found damaged when it was read whole at start (its
    /// files are moved aside to APP.sqlite.damaged-SECONDS). What is missing is made anew: a new key locks out
    /// every sender until they are given its public key, and a new store starts its senders' flows from 0.
    #[arg(long)]
    pub accept_lost_state: bool,
}

/// `--recv-buffer` unless given: `--help` and the refusal of a too small one both show this one number.
pub const DEFAULT_RECV_BUFFER: usize = 8 << 20;

/// Smallest `--recv-buffer` taken: below it a burst of one sender overflows the buffer and the node crawls
/// through retransmissions (a buffer of 1 byte was measured 300× slower than the default).
pub const MIN_RECV_BUFFER: usize = 64 << 10;
/// Largest: the kernel keeps SO_RCVBUF in an int and doubles what it is asked for.
pub const MAX_RECV_BUFFER: usize = (i32::MAX / 2) as usize;

fn parse_recv_buffer(s: &str) -> Result<usize, String> {
    let n: usize = s.parse().map_err(|_| {
        format!("{s:?} is not a number of bytes (e.g. {DEFAULT_RECV_BUFFER}, the default)")
    })?;
    if n < MIN_RECV_BUFFER {
        return Err(format!(
            "{n} bytes is too small: bursts beyond it are dropped and resent, which makes the node crawl; give at \
             least {MIN_RECV_BUFFER} (the default is {DEFAULT_RECV_BUFFER})"
        ));
    }
    if n > MAX_RECV_BUFFER {
        return Err(format!(
            "{n} bytes is more than the kernel can give a socket; give at most {MAX_RECV_BUFFER}"
        ));
    }
    Ok(n)
}

fn parse_dns_server(s: &str) -> Result<SocketAddr, String> {
    s.parse::<SocketAddr>()
        .or_else(|_| s.parse::<IpAddr>().map(|ip| SocketAddr::new(ip, 53)))
        .map_err(|_| {
            format!("{s:?} is not an IP address or IP:PORT (e.g. 192.0.2.53 or 127.0.0.1:5353)")
        })
}

/// Default state directory: systemd's `StateDirectory=` if set, else `./pure-state`.
pub fn default_state_dir() -> PathBuf {
    std::env::var_os("STATE_DIRECTORY")
        .map(|v| {
            // systemd may list several directories separated by ':'; the first is ours.
            let s = v.to_string_lossy().to_string();
            PathBuf::from(s.split(':').next().unwrap_or("pure-state"))
        })
        .unwrap_or_else(|| PathBuf::from("pure-state"))
}

impl NodeArgs {
    /// The node's settings; reads and checks the apps file, if one is given.
    pub fn settings(&self) -> Result<NodeSettings, crate::apps::config::AppsError> {
        let state_dir = self.state.clone().unwrap_or_else(default_state_dir);
        let senders_file = self.senders.clone().or_else(|| {
            let p = state_dir.join("senders");
            p.exists().then_some(p)
        });
        let apps = match &self.apps {
            Some(path) => crate::apps::config::AppsConfig::load(path)?,
            None => crate::apps::config::AppsConfig::default_single(),
        };
        Ok(NodeSettings {
            key_file: self
                .key
                .clone()
                .unwrap_or_else(|| state_dir.join("node.key")),
            senders_file,
            link_addr: SocketAddr::new(crate::common::listen::effective(self.bind), self.link_port),
            idle: Duration::from_millis(self.link_idle_ms),
            apps,
            apps_file: self.apps.clone(),
            recv_buffer: self.recv_buffer,
            x25519_budget: self.x25519_budget,
            sessions_per_sender: self.sessions_per_sender,
            max_sessions: self
                .max_sessions
                .unwrap_or_else(crate::receive::max_sessions_for_memory),
            dns: crate::common::dns::DnsSettings { server: self.dns },
            accept_lost_state: self.accept_lost_state,
            state_dir,
            store: self.store.clone(),
            store_password: None,
        })
    }
}

pub fn run(args: &NodeArgs) -> anyhow::Result<()> {
    crate::receive::heap::set_phase(crate::receive::heap::Phase::ReadingSenders);
    let mut settings = args.settings().context("the node did not start")?;
    settings.store_password = match &args.store_password_file {
        Some(file) if args.store.is_shared() => Some(
            crate::store::engine::read_store_password(file).context("the node did not start")?,
        ),
        Some(file) => {
            tracing::warn!(
                "--store-password-file {} is not read: the node stores in SQLite (give --store postgres://… to \
                 store in a fleet's database)",
                file.display()
            );
            None
        }
        None => None,
    };
    // Before anything is opened: past the limit every store would fail on its own, each with a misleading error.
    crate::ops::fds::prepare(&settings.apps).context("the node did not start")?;
    let state = settings.state_dir.clone();
    let key_file = settings.key_file.clone();
    let no_senders = settings.senders_file.is_none();
    // Before loading anything: a stop asked for while a big senders file loads is honoured as soon as the loop
    // starts, and a SIGHUP then is not fatal (its default action would end the process).
    let signals = signals::install();
    let notifier = match Notifier::from_env() {
        Ok(n) => n,
        Err(e) => {
            tracing::warn!("not notifying the supervisor: {e}");
            None
        }
    };
    let http_addr = SocketAddr::new(crate::common::listen::effective(args.bind), args.http_port);
    // Before the senders file: a bad certificate should not wait for a million lines to be read to be told.
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => {
            Some(TlsConfig::load(cert, key).context("the node did not start")?)
        }
        _ => None,
    };
    // Reading a big senders file for the first time takes a moment (about 0.25 s per million lines here,
    // research/027); say so on a terminal, and only there: the journal gets the one line that follows.
    let big_senders = settings.senders_file.as_ref().and_then(|p| {
        let size = std::fs::metadata(p).ok()?.len();
        (size >= 8 << 20 && std::io::stderr().is_terminal()).then_some((p.clone(), size))
    });
    if let Some((path, size)) = &big_senders {
        eprint!("reading {} ({} MB)…", path.display(), size >> 20);
    }
    let store_password = settings.store_password.clone();
    let ready = ReadyNode::prepare(settings);
    if big_senders.is_some() {
        eprint!("\r\x1b[K");
    }
    let mut ready = ready.context("the node did not start")?;
    // Said now, not with the ready lines: the key is kept even if a step below (a port in use) stops this start.
    if ready.key_created {
        println!("made a new node key: {}", key_file.display());
    }
    let metrics_addr = args
        .metrics_listen
        .unwrap_or_else(|| super::default_metrics_listen(args.http_port));
    let mut http = HttpServer::bind(http_addr)
        .and_then(|h| h.with_metrics_listener(metrics_addr))
        .context("the node did not start")?
        .with_limits(HttpLimits {
            tls_handshakes_per_second: args.tls_handshake_budget,
            ..HttpLimits::default()
        });
    let http_addr = http.local_addr().unwrap_or(http_addr);
    let metrics_addr = http.metrics_addr().unwrap_or(metrics_addr);
    let tls_line = tls.as_ref().map(|t| {
        format!(
            "tls:        https://{http_addr}/ too (certificate {})",
            t.cert_file.display()
        )
    });
    if let Some(tls) = tls {
        http = http.with_tls(tls);
    }
    let (push_path, datagrams_path) = crate::common::push::socket_paths(
        args.push_socket.as_deref(),
        args.push_datagrams.as_deref(),
        &state,
    );
    // What can be told before binding (a path too long for a Unix socket, named against the flag that made it).
    if let Some(problem) = crate::common::push::path_problems(
        push_path.as_deref(),
        datagrams_path.as_deref(),
        args.push_datagrams.is_some(),
        Some(&state),
    )
    .into_iter()
    .next()
    {
        let crate::common::push::PathProblem { kind, path, why } = problem;
        let e = match kind {
            crate::common::push::PushSocketKind::Stream => {
                anyhow::Error::new(crate::http::HttpError::PushSocket { path, why })
            }
            crate::common::push::PushSocketKind::Datagram => {
                anyhow::Error::new(crate::receive::pushes::PushDatagramError { path, why })
            }
        };
        return Err(e.context("the node did not start"));
    }
    // The datagram socket first: if the push socket then cannot be bound, the datagram socket's file goes with the
    // node (nothing is left behind by a start that failed).
    if let Some(path) = &datagrams_path {
        let socket = PushDatagrams::bind(path).context("the node did not start")?;
        ready.serve_push_datagrams(socket);
    }
    if let Some(path) = &push_path {
        let socket = PushSocket::bind(path).context("the node did not start")?;
        let (listener, path, ino) = socket
            .into_parts()
            .map_err(|e| crate::http::HttpError::PushSocket {
                path: path.clone(),
                why: format!("cannot make it non-blocking ({e})"),
            })
            .context("the node did not start")?;
        let handed = ready.serve_push_stream(listener, path, ino, http.limits().head_timeout);
        http = http.with_pushes(handed, ready.push_inbox());
    }
    let inbox = if args.no_http_links {
        None
    } else {
        Some(ready.link_inbox().context("the node did not start")?)
    };
    // The devices census reads the stores on a thread of its own (src/ops/devices.rs); the page searches through it.
    let census = crate::ops::devices::Census::spawn(
        ready.stats.clone(),
        crate::ops::devices::CensusStore {
            choice: args.store.clone(),
            state: state.clone(),
            password: store_password,
        },
        args.quiet_after,
    )
    .context("the node did not start: cannot start the devices census thread")?;
    let http = http
        .with_device_search(census.search())
        .spawn(ready.stats.clone(), inbox)
        .context("the node did not start")?;
    println!("public key: {}", ready.public_key());
    println!("link:       udp {}", ready.local_addr());
    if args.no_http_links {
        println!("http link:  off (--no-http-links: POST /link is answered 404)");
    } else {
        println!("http link:  POST http://{http_addr}/link");
    }
    println!("health:     http://{http_addr}/healthz");
    match &push_path {
        Some(p) => println!("push:       unix {} (pure-serve push)", p.display()),
        None => println!("push:       off (--push-socket none)"),
    }
    if let Some(p) = &datagrams_path {
        println!("push dgram: unix {} (a push a datagram)", p.display());
    }
    println!("metrics:    http://{metrics_addr}/metrics and /healthz");
    println!("status:     http://{metrics_addr}/");
    if let Some(line) = tls_line {
        println!("{line}");
    }
    println!(
        "state:      {} (apps: {})",
        state.display(),
        ready.app_names().join(", ")
    );
    println!("senders:    {}", ready.senders_source);
    if no_senders {
        println!(
            "            add senders as `NAME PUBLIC_KEY` lines in {} and reload (SIGHUP)",
            state.join("senders").display()
        );
    }
    println!("ready");
    tracing::info!(addr = %ready.local_addr(), "serving");
    let counters = ready.run_with(Control {
        stop: signals.stop,
        reload: Some(signals.reload),
        notifier: notifier.as_ref(),
        wake: signals.wake,
    });
    // The loop is gone: link requests still queued were answered 503. Let requests in progress finish, then stop.
    http.stop();
    drop(census);
    // A senders index written at this start or a reload may still be syncing: in place before the process ends, or
    // the next start would parse the file again (src/senders.rs, `sync_then_rename`).
    crate::senders::wait_index_synced();
    let counters = counters?;
    tracing::info!(
        stored = counters.stored_records,
        datagrams = counters.datagrams,
        "stopped"
    );
    Ok(())
}
