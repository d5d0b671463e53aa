//! The receiver: the one thread that owns the node's UDP socket and drives the node core through turns.
//!
//! Each round: wait for the socket (or the next deadline), read a bounded batch of datagrams without blocking,
//! hand each to [`Node::handle_datagram`], apply the turn to the stores in one transaction per app and commit, then
//! send the acks. Acks leave only after the commit returns: "stored" means on disk (docs/protocol.md 5.3).
//! Under a flood the batch bound keeps the loop turning (BRIEF.md, receive livelock): input beyond it waits in the
//! socket buffer, whose overflow the kernel counts.
//!
//! Links over HTTP come in the same way: the HTTP thread queues each `POST /link` ([`crate::http::link`]) and
//! wakes the loop, which feeds the request's packets to the node core beside the datagrams of the round and answers
//! the request with the node packets they earned, after the commit, as it sends the UDP acks ([`links`]).
//!
//! The loop is also where the node tells the outside it is alive and what it is doing ([`crate::ops`]): READY=1
//! once it turns, WATCHDOG=1 and the `/healthz` heartbeat from its own rounds (a stuck loop stops both), STATUS=
//! lines, and a reload of the senders file on SIGHUP — read on a helper thread so a million lines do not stall
//! the socket, then swapped in between two turns, where no turn holds indices into the old list.

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, TryRecvError};
use std::time::{Duration, Instant};

use socket2::{Protocol, Socket, Type};
use thiserror::Error;

use crate::apps::config::{AppsConfig, AppsError};
use crate::apps::host::Host;
use crate::apps::host::outbox::{Outbox, OutboxSettings};
use crate::common::dns::DnsSettings;
use crate::common::figures::LiveStats;
use crate::common::push::{PushInbox, PushQueue, push_channel};
use crate::common::wake::Wake;
use crate::http::link::{self, LinkInbox, LinkQueue};
use crate::keys::{self, KeyError};
use crate::ops::fds;
use crate::ops::notify::{Notifier, WatchdogTimer};
use crate::proto::admission::AdmissionConfig;
use crate::proto::allow_list::AllowList;
use crate::proto::crypto;
use crate::proto::node::{DropReason, Node, NodeConfig, NodeCounters, Transmit};
use crate::senders::{self, SendersError};
use crate::sending::{LoopSettings, SendingLoop};
use crate::store::engine::StoreChoice;
use crate::store::memo::Memo;
use crate::store::state::{self, StateError, StateLock};
use crate::store::{StoreError, StoreStart};
use heap::{IdleTrim, Phase, release_freed_memory};

mod batch;
pub mod heap;
mod links;
mod local;
pub mod push_stream;
pub mod pushes;
pub use links::LINK_BYTES_PER_ROUND;
pub use local::LocalNode;

/// Datagrams read per round before the turn is applied (BRIEF.md: bound the work per round).
const BATCH: usize = 4096;
/// Longest the loop sleeps without looking at the stop flag.
const MAX_WAIT: Duration = Duration::from_millis(100);
/// How often a summary line is logged while traffic flows.
const SUMMARY_EVERY: Duration = Duration::from_secs(10);
/// How often STATUS= is refreshed for `systemctl status` (only when something changed): often enough to be
/// current when a person looks, rare enough to cost nothing.
const STATUS_EVERY: Duration = Duration::from_secs(2);

#[derive(Debug, Error)]
pub enum NodeError {
    #[error(transparent)]
    Key(#[from] KeyError),
    #[error(transparent)]
    Senders(#[from] SendersError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    State(#[from] StateError),
    #[error("cannot create state directory {}: {}", path.display(), state_dir_problem(source))]
    StateDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "cannot listen on UDP {addr}: {}",
        crate::ops::bind_problem(source, *addr, "--link-port", "--bind")
    )]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("UDP socket: {0}")]
    Socket(std::io::Error),
    #[error("cannot start the sending loop: {0}")]
    SendingLoop(std::io::Error),
    #[error(transparent)]
    Apps(#[from] AppsError),
    #[error("{0}")]
    OwnKey(String),
    #[error("cannot make the queue for links over HTTP: {0}")]
    LinkQueue(std::io::Error),
}

impl NodeError {
    /// Whether the node's configuration is at fault (a bad file, a state that lost data, a store of a newer
    /// layout, a fleet's database that refuses the node's login or settings), so that starting it again cannot help
    /// (`cli::EXIT_CONFIG`).
    pub fn is_configuration(&self) -> bool {
        match self {
            // A disk that refused a write (full, failing) at the start: tried again once it is fixed.
            NodeError::Key(crate::keys::KeyError::Write { source, .. })
            | NodeError::State(StateError::Write { source, .. })
                if crate::files::disk_refused(source) =>
            {
                false
            }
            NodeError::Key(_)
            | NodeError::Senders(_)
            | NodeError::State(_)
            | NodeError::Apps(_)
            | NodeError::OwnKey(_) => true,
            NodeError::Store(e) => e.is_configuration(),
            // A place the node may never make its state in: restarting does not change it.
            NodeError::StateDir { source, .. } => {
                !matches!(source.kind(), std::io::ErrorKind::StorageFull)
            }
            _ => false,
        }
    }
}

/// What the node needs to start, already validated.
#[derive(Debug, Clone)]
pub struct NodeSettings {
    pub state_dir: PathBuf,
    pub key_file: PathBuf,
    /// `None`: no senders file; nobody can send until one is given.
    pub senders_file: Option<PathBuf>,
    pub link_addr: SocketAddr,
    pub idle: Duration,
    /// The apps to host (`--apps`, or one app `main` that accepts every sender).
    pub apps: AppsConfig,
    /// The apps file they came from, re-read on a reload (`None`: the single app `main`).
    pub apps_file: Option<PathBuf>,
    pub recv_buffer: usize,
    /// X25519 per second that input which does not authenticate may cost (`--x25519-budget`, protocol.md 6.1).
    pub x25519_budget: u32,
    /// Most sessions (runs) one sender may hold at once, and in all (protocol.md 6.2).
    pub sessions_per_sender: usize,
    pub max_sessions: usize,
    /// Name servers for outlets given by name.
    pub dns: DnsSettings,
    /// Start even where the state looks like it lost data (`--accept-lost-state`; [`state::judge`]).
    pub accept_lost_state: bool,
    /// Where the apps' records and heard sequences are kept (`--store`): the state directory's SQLite files, or a
    /// database shared with the other nodes of a fleet.
    pub store: StoreChoice,
    /// The password of `store`'s database user (`--store-password-file`).
    pub store_password: Option<String>,
}

/// What the process around the receive loop gives it: when to stop, when to reload, whom to tell.
#[derive(Clone, Copy)]
pub struct Control<'a> {
    /// Set (SIGTERM, SIGINT, a test) to stop: the loop stops reading, stores and acks the turn in hand, returns.
    pub stop: &'a AtomicBool,
    /// Set (SIGHUP) to re-read the senders file; the loop clears it when it takes the reload.
    pub reload: Option<&'a AtomicBool>,
    /// The supervisor's notify socket, if there is one.
    pub notifier: Option<&'a Notifier>,
    /// A descriptor that becomes readable when `stop` or `reload` is set (the signal handlers' eventfd), so the
    /// loop wakes at once instead of at its next timeout.
    pub wake: Option<RawFd>,
}

/// A reload being read on its helper thread.
struct PendingReload {
    path: PathBuf,
    result: Receiver<Result<AllowList, SendersError>>,
}

/// A node that has its key, stores and socket, ready to [`ReadyNode::run`].
pub struct ReadyNode {
    node: Node,
    host: Host,
    /// On a fleet's store, the outbox that drives this node's share of the outlets (started with the sending loop;
    /// dropped before it, so it stops its outlets and gives their leases back first).
    outbox: Option<Outbox>,
    /// The sending loop, when any app has a link, wire or webhook outlet (started lazily: a node without outlets
    /// runs no thread for them).
    sending: Option<SendingLoop>,
    /// Wakes this loop from other threads: outlets (room, resume) and inbound HTTP.
    wake: Arc<Wake>,
    /// The node's key, for a sending loop started by a reload that adds the first outlet.
    identity: crate::proto::crypto::Identity,
    memo: Memo,
    socket: UdpSocket,
    pub key_created: bool,
    pub senders_source: String,
    pub stats: Arc<LiveStats>,
    settings: NodeSettings,
    reloads_ok: u64,
    reloads_failed: u64,
    /// Time spent in `apply_turn` (apply and commit), for `pure_commit_seconds_total`.
    commit_time: Duration,
    /// When the last reload ended and whether it took effect whole.
    last_reload: Option<(Instant, bool)>,
    /// Said in every STATUS= line until the next good reload: a refused reload must stay visible.
    status_note: Option<String>,
    /// What STATUS says of the last reload of the apps file while it was refused (cleared by one that is not).
    apps_note: Option<String>,
    /// The apps file was refused in the reload under way: the reload counts as refused whatever the senders do.
    apps_refused: bool,
    /// Link requests from the HTTP server, if it hands any over.
    links: Option<LinkQueue>,
    /// Pushes of downlink records from the HTTP server's push socket, if it serves one.
    pushes: Option<PushQueue>,
    /// The push datagram socket, read and answered by this loop, if the node serves one.
    push_datagrams: Option<pushes::PushDatagrams>,
    /// The push socket's listener, its simple pushes served by this loop, the rest handed to the HTTP thread.
    push_stream: Option<push_stream::PushStream>,
    /// The number the next link request is given (its pseudo peer address).
    next_link_request: u64,
    /// The link requests taken and not yet answered (they wait for their turns to finish).
    link_requests: links::LinkRequests,
    /// The state directory's lock: held while this node serves from it.
    _lock: StateLock,
    /// What `STATE/identity` says (kept current as apps are added).
    state_identity: state::Identity,
    /// The host's [`Host::stores_reopened`] when the identity was last brought up to date.
    stores_reopened_seen: u64,
    /// Batched reads of the socket, and the kernel's drop count for it.
    rx: batch::BatchReceiver,
    /// Kernel drops already counted into the node core.
    kernel_drops_counted: u64,
    /// The turn's UDP datagrams, sent together (kept to reuse its allocation).
    udp_out: Vec<Transmit>,
}

/// What a failure to make the state directory means, and the fix.
fn state_dir_problem(source: &std::io::Error) -> String {
    use std::io::ErrorKind;
    match source.kind() {
        ErrorKind::AlreadyExists | ErrorKind::NotADirectory => format!(
            "a file, not a directory, is there or on the way to it ({source}): give --state a directory, or move \
             the file away"
        ),
        ErrorKind::PermissionDenied => format!(
            "this user may not make it ({source}): make it and give it to the node's user (mkdir, then chown), or \
             run the node as a user who may"
        ),
        ErrorKind::ReadOnlyFilesystem => {
            format!(
                "its filesystem is read-only ({source}): give --state a directory on a writable one"
            )
        }
        ErrorKind::StorageFull => format!("the disk is full ({source}): make room on it"),
        _ => source.to_string(),
    }
}

fn create_private_dir(path: &Path) -> Result<(), NodeError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .map_err(|source| NodeError::StateDir {
            path: path.to_path_buf(),
            source,
        })
}

fn bind_udp(addr: SocketAddr, recv_buffer: usize) -> Result<UdpSocket, NodeError> {
    let socket = crate::common::listen::socket(addr, Type::DGRAM, Protocol::UDP)
        .map_err(NodeError::Socket)?;
    set_recv_buffer(&socket, recv_buffer);
    socket
        .bind(&addr.into())
        .map_err(|source| NodeError::Bind { addr, source })?;
    socket.set_nonblocking(true).map_err(NodeError::Socket)?;
    Ok(socket.into())
}

/// Asks for `wanted` bytes of receive buffer. SO_RCVBUF is capped by net.core.rmem_max (212,992 bytes on a stock
/// kernel, less than one sender's burst); SO_RCVBUFFORCE passes the cap where the process may (root or
/// CAP_NET_ADMIN). What the kernel granted is logged, with the fix when it is short: a full buffer drops datagrams
/// the senders must then resend (research/001).
fn set_recv_buffer(socket: &Socket, wanted: usize) {
    let value = wanted.min(i32::MAX as usize / 2) as libc::c_int;
    // SAFETY: setsockopt with a valid fd and a pointer to a c_int of the size passed.
    let forced = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    } == 0;
    if !forced {
        let _ = socket.set_recv_buffer_size(wanted);
    }
    // Linux reports twice the size asked for (it counts its bookkeeping); half of it is comparable to `wanted`.
    let granted = socket.recv_buffer_size().map(|b| b / 2).unwrap_or(0);
    if granted < wanted {
        tracing::warn!(
            "UDP receive buffer is {granted} bytes, not the {wanted} asked for: bursts beyond it are dropped; \
             raise the cap with `sysctl -w net.core.rmem_max={wanted}` (or --recv-buffer to ask for less)"
        );
    } else {
        tracing::debug!(granted, "UDP receive buffer");
    }
}

impl ReadyNode {
    /// Loads the key (making one if missing), the senders file and the stores, and binds the socket.
    pub fn prepare(settings: NodeSettings) -> Result<Self, NodeError> {
        create_private_dir(&settings.state_dir)?;
        let lock = StateLock::acquire(&settings.state_dir)?;
        // The senders file before the key: a start refused for a bad senders file makes no key.
        let (senders, senders_source) = match &settings.senders_file {
            Some(path) => {
                let (list, how) = senders::load_indexed(path, &settings.state_dir)?;
                let n = list.len();
                if n == 0 {
                    tracing::warn!(
                        "senders file {} lists no senders: nobody can send until it does (add `NAME \
                         PUBLIC_KEY` lines and reload with SIGHUP)",
                        path.display()
                    );
                }
                let how = match how {
                    senders::IndexUse::Mapped => "index unchanged",
                    senders::IndexUse::Rebuilt => "index rebuilt",
                    senders::IndexUse::InMemory => "in memory",
                };
                (list, format!("{n} from {} ({how})", path.display()))
            }
            None => (
                AllowList::default(),
                "none (no senders file given)".to_string(),
            ),
        };
        let (identity, key_created, state_identity) = check_state(&settings)?;
        let mut made_key = MadeKey(key_created.then(|| settings.key_file.clone()));
        // Which stores the last run closed cleanly; taken now, so that this run leaves the file only if it ends
        // cleanly too (docs/durability.md, "A damaged store is never served").
        let clean_stop = state::CleanStop::take(&settings.state_dir)?;
        let own = settings.apps.check_own_key(identity.public());
        if !own.is_empty() {
            let path = settings
                .apps_file
                .clone()
                .unwrap_or_else(|| PathBuf::from("apps"));
            let lines: Vec<String> = own.iter().map(|p| p.render(&path)).collect();
            return Err(NodeError::OwnKey(lines.join("\n")));
        }
        for w in accept_warnings(&settings.apps, &senders) {
            tracing::warn!("{w}");
        }
        let wake = Arc::new(Wake::new().map_err(NodeError::Socket)?);
        let shared = settings.store.open_shared(
            settings.store_password.as_deref(),
            &settings
                .apps
                .apps
                .iter()
                .map(|a| a.name.clone())
                .collect::<Vec<_>>(),
        )?;
        let (mut host, outlets) = match shared {
            None => Host::open(
                &settings.state_dir,
                &settings.apps,
                wake.clone(),
                &StoreStart {
                    clean: clean_stop,
                    accept_lost: settings.accept_lost_state,
                },
            )?,
            Some(turns) => {
                tracing::info!(
                    "storing in the fleet's database {} (docs/scale-out.md); the memo of secrets stays in {}",
                    settings.store.shown(),
                    settings.state_dir.display()
                );
                Host::open_shared(
                    &settings.apps,
                    wake.clone(),
                    Arc::new(Wake::new().map_err(NodeError::Socket)?),
                    turns,
                )?
            }
        };
        let memo = Memo::open_or_none(&settings.state_dir.join("memo.sqlite"));
        let state_identity =
            record_apps(&settings.state_dir, state_identity, &host.open_app_names())?;
        let socket = bind_udp(settings.link_addr, settings.recv_buffer)?;
        let rx = batch::BatchReceiver::new(socket.as_raw_fd(), true);
        tracing::debug!(gro = rx.gro(), "UDP receive: batched, kernel drops counted");
        let mut node = Node::new(
            NodeConfig {
                identity: identity.clone(),
                epoch: u64::from_be_bytes(crypto::random_array()),
                idle: settings.idle,
                apps: Vec::new(),
            },
            Arc::new(senders),
        );
        node.set_apps(host.hosted_apps());
        // The lag budgets' room from the start: else the first turn would take a burst whole (protocol.md 6.3).
        host.check_lag(&mut node);
        node.set_admission(AdmissionConfig::new(
            settings.x25519_budget,
            crypto::random_array(),
        ));
        node.set_session_limits(settings.sessions_per_sender, settings.max_sessions);
        let fleet_inner = host.is_shared() && !host.fleet_inner().is_empty();
        let (sending, outbox) = if outlets.start.is_empty() && !fleet_inner {
            (None, None)
        } else {
            let sending = SendingLoop::start(LoopSettings {
                identity: identity.clone(),
                dns: settings.dns.clone(),
            })
            .map_err(NodeError::SendingLoop)?;
            let outbox = match start_outbox(&settings, &host, &sending, &wake) {
                Some(outbox) => {
                    let (start, stop) = host.fleet_outlets(outlets);
                    outbox.change(start, stop);
                    outbox.set_inner(host.fleet_inner());
                    Some(outbox)
                }
                None => {
                    for (outlet, target) in outlets.start {
                        sending.start_outlet(outlet, target);
                    }
                    None
                }
            };
            (Some(sending), outbox)
        };
        // Ready: the node says it made its key among the lines it prints once started.
        made_key.0 = None;
        let stats = Arc::new(LiveStats::default());
        *stats
            .allow_list
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(node.senders().clone());
        Ok(ReadyNode {
            node,
            host,
            outbox,
            sending,
            wake,
            identity,
            memo,
            socket,
            key_created,
            senders_source,
            stats,
            settings,
            reloads_ok: 0,
            reloads_failed: 0,
            commit_time: Duration::ZERO,
            last_reload: None,
            status_note: None,
            apps_note: None,
            apps_refused: false,
            links: None,
            pushes: None,
            push_datagrams: None,
            push_stream: None,
            next_link_request: 0,
            link_requests: links::LinkRequests::default(),
            _lock: lock,
            state_identity,
            stores_reopened_seen: 0,
            rx,
            kernel_drops_counted: 0,
            udp_out: Vec::new(),
        })
    }

    /// Takes `POST /link` requests from `queue` from now on (the HTTP server holds its [`LinkInbox`]).
    pub fn serve_links(&mut self, queue: LinkQueue) {
        self.links = Some(queue);
    }

    /// Makes the queue for links over HTTP, bounded at [`link::LINK_QUEUE`] requests, and serves it; give the
    /// inbox to [`crate::http::HttpServer::spawn`].
    /// Where the HTTP server's push socket hands its pushes (docs/downlink.md): the loop takes them between turns,
    /// and the app host answers each once its records are synced.
    pub fn push_inbox(&mut self) -> PushInbox {
        let (inbox, queue) = push_channel(self.wake.clone(), self.node.senders().clone());
        self.pushes = Some(queue);
        inbox
    }

    /// Serves the push datagram socket on this loop (docs/downlink.md, "The push datagram socket").
    pub fn serve_push_datagrams(&mut self, socket: pushes::PushDatagrams) {
        self.push_datagrams = Some(socket);
    }

    /// Serves the push socket (docs/downlink.md, "The push socket's requests") from this loop: its listener
    /// (non-blocking), path and inode as bound; a connection waits for its request at most `head_timeout` (the HTTP
    /// server's). Returns where the connections this loop does not serve itself go:
    /// the HTTP server's [`crate::http::HttpServer::with_pushes`], with [`ReadyNode::push_inbox`] for their pushes.
    pub fn serve_push_stream(
        &mut self,
        listener: std::os::unix::net::UnixListener,
        path: std::path::PathBuf,
        ino: u64,
        head_timeout: Duration,
    ) -> tokio::sync::mpsc::UnboundedReceiver<crate::common::push::Handed> {
        let (hand, handed) = tokio::sync::mpsc::unbounded_channel();
        self.push_stream = Some(push_stream::PushStream::new(
            listener,
            path,
            ino,
            hand,
            head_timeout,
        ));
        handed
    }

    pub fn link_inbox(&mut self) -> Result<LinkInbox, NodeError> {
        let (inbox, queue) = link::link_channel(link::LINK_QUEUE).map_err(NodeError::LinkQueue)?;
        self.serve_links(queue);
        Ok(inbox)
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.socket.local_addr().unwrap_or(self.settings.link_addr)
    }

    /// **For measurement only** (research/006): how the host feeds its outlets, e.g. a record at a time with a
    /// wake of the sending loop after each instead of one push per turn ([`crate::apps::host::FeedMode`]).
    pub fn set_feed_mode(&mut self, mode: crate::apps::host::FeedMode) {
        self.host.set_feed_mode(mode);
    }

    pub fn public_key(&self) -> String {
        keys::encode_key(self.node.public_key())
    }

    pub fn identity_public(&self) -> [u8; 32] {
        *self.node.public_key()
    }

    /// Serves until `stop` is set, then finishes the turn in hand (commit and acks) and returns the counters.
    pub fn run(self, stop: &AtomicBool) -> Result<NodeCounters, NodeError> {
        self.run_with(Control {
            stop,
            reload: None,
            notifier: None,
            wake: None,
        })
    }

    /// [`ReadyNode::run`] as a service: also reloads on `control.reload` and keeps the supervisor informed.
    pub fn run_with(mut self, control: Control<'_>) -> Result<NodeCounters, NodeError> {
        let mut segments = Vec::with_capacity(batch::SLOTS * 4);
        let mut idle_fds: Vec<RawFd> = Vec::new();
        let mut last_summary = Instant::now();
        let mut summarized = NodeCounters::default();
        let notifier = control.notifier;
        let mut watchdog = notifier
            .and_then(Notifier::watchdog)
            .map(|interval| WatchdogTimer::new(interval, Instant::now()));
        let mut pending: Option<PendingReload> = None;
        let mut next_status = Instant::now() + STATUS_EVERY;
        let mut last_status = String::new();
        let mut told_stopping = false;
        let mut more_work = false;
        let mut links_left = false;
        // The socket is bound (prepare did it) and the loop is about to turn: from here a datagram is served.
        self.stats.heartbeat.beat(Instant::now());
        self.publish();
        // What reading the senders file and opening the stores freed goes back before serving starts; from here the
        // heap keeps turn-sized buffers between turns (heap.rs).
        release_freed_memory();
        heap::set_phase(Phase::Serving);
        let mut idle_trim = IdleTrim::new(Instant::now());
        if let Some(n) = notifier {
            last_status = self.status_line();
            n.ready(&last_status);
        }
        loop {
            let stopping = control.stop.load(Ordering::Relaxed);
            if stopping && !told_stopping {
                told_stopping = true;
                tracing::info!("stopping: storing and acknowledging the turn in hand");
                if let Some(n) = notifier {
                    n.stopping("stopping: storing and acknowledging the turn in hand");
                }
            }
            let now = Instant::now();
            let wait = self
                .node
                .poll_timeout()
                .map(|t| t.saturating_duration_since(now))
                .unwrap_or(MAX_WAIT)
                .min(MAX_WAIT);
            // While a reload is being read on its thread, look for its result often; reloads are rare.
            let wait = if pending.is_some() {
                wait.min(RELOAD_POLL)
            } else {
                wait
            };
            // Link requests left over from the last round, or inner outlets behind: go on now rather than after a
            // sleep.
            // (Inner outlets behind wait for a turn, which waits for the sync in flight: its wake ends the sleep.)
            let wait = if links_left || (more_work && !self.host.has_unsynced()) {
                Duration::ZERO
            } else {
                wait
            };
            let (mut pushes_ready, mut stream_ready, mut idle_ready) = (false, false, 0u64);
            if !stopping {
                let link_wake = self.links.as_ref().map(|q| q.wake().fd());
                // A full turn the host cannot take yet (its store is behind) waits for the store's wake, not for
                // the socket, which stays readable and would turn this wait into a busy loop.
                let read_socket = !self.node.turn_is_full() || self.host.can_take_turn();
                let push_fd = self
                    .push_datagrams
                    .as_ref()
                    .and_then(pushes::PushDatagrams::fd_to_wait_on);
                let stream_fd = self.push_stream.as_ref().map(push_stream::PushStream::fd);
                idle_fds.clear();
                if let Some(p) = &self.push_stream {
                    idle_fds.extend(p.idle_fds());
                }
                [pushes_ready, stream_ready] = wait_readable(
                    read_socket.then_some(&self.socket),
                    [push_fd, stream_fd],
                    &idle_fds,
                    &mut idle_ready,
                    &[
                        control.wake,
                        link_wake,
                        Some(self.wake.fd()),
                        self.host.sync_fd(),
                    ],
                    wait,
                );
            }
            let now = Instant::now();
            let mut read = 0;
            // At most BATCH datagrams a round, many per system call; a turn that fills in the middle of a batch is
            // committed and the batch goes on into the next (nothing read is dropped for it).
            while !stopping && read < BATCH && !self.node.turn_is_full() {
                segments.clear();
                if self.rx.recv(&mut segments).map_err(NodeError::Socket)? == 0 {
                    break;
                }
                for s in &segments {
                    read += 1;
                    if self.node.turn_is_full() {
                        self.turn()?;
                    }
                    self.node
                        .handle_datagram(now, s.from, self.rx.data(s), &mut self.memo);
                }
            }
            let kernel_drops = self.rx.kernel_drops();
            let kernel = kernel_drops - self.kernel_drops_counted;
            if kernel > 0 {
                self.node.count_drops(DropReason::Kernel, kernel);
                self.kernel_drops_counted = kernel_drops;
            }
            links_left = !stopping && self.take_link_requests(now)?;
            if let Some(q) = self.pushes.as_ref().filter(|_| !stopping) {
                while let Some(work) = q.try_recv() {
                    for push in work.into_requests() {
                        self.host.push(&mut self.node, push, now);
                    }
                }
            }
            if let Some(p) = self
                .push_stream
                .as_mut()
                .filter(|_| stream_ready || idle_ready != 0)
            {
                let senders = self.node.senders().clone();
                p.take(now, &senders, stream_ready, idle_ready, |push| {
                    self.host.push(&mut self.node, push, now)
                });
            }
            if let Some(p) = self.push_stream.as_mut() {
                p.expire(now);
            }
            if let Some(d) = self.push_datagrams.as_mut().filter(|_| pushes_ready) {
                let senders = self.node.senders().clone();
                d.take(now, &senders, |push| {
                    self.host.push(&mut self.node, push, now)
                });
                // What was answered at once (a malformed push, no such app or sender) goes now.
                d.answer(now, false);
            }
            self.finish_synced();
            // Group commit (research/010): while a turn's sync is in flight the next turn keeps filling, and is
            // committed when the sync is done — or now, if nothing waits or it is full.
            // (A host on a fleet's store that is behind takes no turn: Host::can_take_turn.)
            if stopping
                || (!self.host.has_unsynced() || self.node.turn_is_full())
                    && self.host.can_take_turn()
            {
                more_work = self.turn()?;
            }
            if stopping {
                self.host.drain(&mut self.node);
                if !self.node.turn_is_empty() {
                    self.turn()?;
                    self.host.drain(&mut self.node);
                }
                self.after_finish();
                if let Some(d) = self.push_datagrams.as_mut() {
                    d.answer(Instant::now(), true);
                    d.close();
                }
                if let Some(p) = self.push_stream.as_mut() {
                    p.answer(Instant::now(), true);
                    p.close();
                }
                self.host.checkpoint_at_stop();
                if let Err(e) = self.memo.write() {
                    tracing::warn!(
                        "memo: the last secrets were not written ({e}); each costs an X25519 after the restart"
                    );
                }
            }
            let swept_before = self.node.counters().sessions_swept;
            self.node.handle_timeout(now);
            // A downlink RTO that passed put a read into the turn: take it in the next round at once, not after the
            // next wake (an outside tester saw every DOWN resent 100 ms late, the loop's longest sleep).
            if !self.node.turn_is_empty() && self.host.can_take_turn() {
                more_work = true;
            }
            if self.node.counters().sessions_swept - swept_before >= TRIM_AFTER_SWEPT {
                release_freed_memory();
            }
            idle_trim.after_round(now, read);
            self.publish();
            let now = Instant::now();
            self.stats.heartbeat.beat(now);
            // The sending loop feeds the watchdog too: a stuck loop of either kind stops the pings.
            let sending_alive = self
                .sending
                .as_ref()
                .is_none_or(|s| s.alive(now, SENDING_STALE));
            if let (Some(w), Some(n)) = (watchdog.as_mut(), notifier)
                && sending_alive
                && w.due(now)
            {
                n.watchdog_ping();
            }
            if !stopping {
                // Between two turns: nothing taken is uncommitted, so the allow-list may change here.
                if pending.is_none()
                    && control
                        .reload
                        .is_some_and(|f| f.swap(false, Ordering::SeqCst))
                {
                    self.settle()?;
                    pending = self.start_reload(notifier);
                }
                if let Some(p) = &pending {
                    match p.result.try_recv() {
                        Ok(result) => {
                            let path = p.path.clone();
                            pending = None;
                            self.settle()?;
                            self.finish_reload(&path, result, notifier);
                            // The reading thread's buffers (a million lines' worth) and, after a good reload,
                            // the old list are freed now: give them back rather than keep them in the heap.
                            release_freed_memory();
                            heap::set_phase(Phase::Serving);
                        }
                        Err(TryRecvError::Empty) => {}
                        Err(TryRecvError::Disconnected) => {
                            let path = p.path.clone();
                            pending = None;
                            self.reload_failed(
                                &path,
                                "the reading thread died".to_string(),
                                notifier,
                            );
                            release_freed_memory();
                            heap::set_phase(Phase::Serving);
                        }
                    }
                }
                if let Some(n) = notifier
                    && pending.is_none()
                    && now >= next_status
                {
                    next_status = now + STATUS_EVERY;
                    let line = self.status_line();
                    if line != last_status {
                        n.status(&line);
                        last_status = line;
                    }
                }
            }
            if last_summary.elapsed() >= SUMMARY_EVERY {
                log_summary(
                    &summarized,
                    self.node.counters(),
                    self.node.sessions_active(),
                );
                summarized = self.node.counters().clone();
                last_summary = Instant::now();
            }
            if stopping {
                log_summary(
                    &summarized,
                    self.node.counters(),
                    self.node.sessions_active(),
                );
                return Ok(self.node.counters().clone());
            }
        }
    }

    /// Runs a turn of the host (every app's input applied and committed app by app, and handed to the sync
    /// thread), then sends the acks of what is finished. Returns whether the host has more to do at once (inner
    /// outlets behind).
    fn turn(&mut self) -> Result<bool, NodeError> {
        let started = Instant::now();
        let report = self.host.turn(&mut self.node, started);
        if self.host.stores_reopened() != self.stores_reopened_seen {
            // A retry may have made a store the app never had (a full disk at its start): recorded before any ack
            // of this turn, which comes only after its sync.
            self.stores_reopened_seen = self.host.stores_reopened();
            self.record_open_apps();
        }
        self.commit_time += started.elapsed();
        // Every link request fed whole so far is in this turn or an earlier one.
        self.link_requests.taken(self.host.last_seq());
        self.after_finish();
        Ok(report.more)
    }

    /// Adds the apps whose stores are open to `STATE/identity` (written only when that changes).
    fn record_open_apps(&mut self) {
        match record_apps(
            &self.settings.state_dir,
            self.state_identity.clone(),
            &self.host.open_app_names(),
        ) {
            Ok(id) => self.state_identity = id,
            Err(e) => {
                tracing::warn!("{e}; a restart cannot tell if the new apps' stores go missing")
            }
        }
    }

    /// Finishes the turns whose sync is done, and sends what they earned.
    fn finish_synced(&mut self) {
        if self.host.poll_synced(&mut self.node) {
            self.after_finish();
        }
        // Answers held for a round with no datagrams of finished turns to send first (after_finish sent the others
        // already): none waits for a later turn, which a fleet's store that is behind may not take for a while.
        self.host.send_push_answers();
    }

    /// Commits the turn being filled and waits for every sync: after it nothing taken is uncommitted or
    /// unsynced, so the allow-list or the apps may change.
    fn settle(&mut self) -> Result<(), NodeError> {
        self.turn()?;
        self.host.drain(&mut self.node);
        if !self.node.turn_is_empty() {
            // A host on a fleet's store takes no turn while its store is behind (Host::can_take_turn); it is
            // drained now, so this one is taken.
            self.turn()?;
            self.host.drain(&mut self.node);
        }
        self.after_finish();
        Ok(())
    }

    /// Sends the acks finished turns earned (to the socket, or into their link requests' answers, then answers
    /// the requests whose turns are all finished), and keeps new secrets in the memo.
    fn after_finish(&mut self) {
        self.node.flush_acks();
        let mut udp = std::mem::take(&mut self.udp_out);
        while let Some(t) = self.node.poll_transmit() {
            if let Some(t) = self.route(t) {
                udp.push(t);
            }
        }
        batch::send_all(&self.socket, &udp);
        udp.clear();
        self.udp_out = udp;
        // After the datagrams of the same turns: a push to a live session reaches its device first, and the pusher
        // then, on either socket (research/049: answered first, the push socket's pusher woke the HTTP thread,
        // which took this core before the DOWN left).
        self.host.send_push_answers();
        if let Some(d) = self.push_datagrams.as_mut() {
            d.answer(Instant::now(), false);
        }
        if let Some(p) = self.push_stream.as_mut() {
            p.answer(Instant::now(), false);
        }
        self.link_requests.answer_finished(self.host.finished_seq());
        for r in self.node.take_forward_refusals() {
            tracing::warn!(
                app = %r.app,
                sender = %r.sender,
                "app {app} refused forwarded records (FORWARD frames) from sender {sender}: it is not in the app's \
                 forwarders, so none is stored (pure_forward_records_refused_total counts them). If {sender} is a \
                 node whose outlet forwards to this one, add it to forwarders of [apps.{app}] in the apps file \
                 (without --apps: an apps file with [apps.main] and forwarders = [\"{sender}\"]) and reload \
                 (docs/apps.md); if it is a device, it is claiming other senders' records",
                app = r.app,
                sender = r.sender,
            );
        }
        // Secrets of packets that authenticated join the memo's batch, written when due: this runs every round (at
        // least every MAX_WAIT), so a batch is not much later than memo::BATCH_EVERY.
        let secrets = self.node.take_new_secrets();
        if let Err(e) = self.memo.put_all(Instant::now(), &secrets) {
            tracing::warn!(
                "memo not updated ({e}); known senders will cost an X25519 after a restart"
            );
        }
    }

    /// Routes a node packet to where its peer is: the answer of the link request whose pseudo peer address it is
    /// sent to (docs/protocol.md, Links over HTTP), or the UDP socket — then it is handed back, for the round's
    /// datagrams to go out together. The one place that tells the two apart.
    fn route(&mut self, t: Transmit) -> Option<Transmit> {
        match link::request_of(t.to) {
            None => Some(t),
            Some(request) => {
                if !self.link_requests.push(request, t.bytes) {
                    self.stats
                        .link_packets_unrouted
                        .fetch_add(1, Ordering::Relaxed);
                }
                None
            }
        }
    }

    /// Feeds waiting link requests to the node core: at least one, and no more once [`LINK_BYTES_PER_ROUND`] of
    /// packets are taken. A request's packets all go into this round's turns: when the turn is full it is
    /// committed first. Returns whether requests may be left in the queue.
    fn take_link_requests(&mut self, now: Instant) -> Result<bool, NodeError> {
        let Some(queue) = &self.links else {
            return Ok(false);
        };
        // Cleared before draining: a request queued after this leaves the wake set for the next poll.
        queue.wake().clear();
        let mut bytes = 0;
        while bytes < LINK_BYTES_PER_ROUND {
            let Some(request) = self.links.as_ref().and_then(LinkQueue::try_recv) else {
                return Ok(false);
            };
            bytes += request.packets.as_bytes().len();
            let id = self.next_link_request;
            self.next_link_request += 1;
            let from = link::pseudo_peer(id);
            self.link_requests.open(id, request.reply);
            // Admission pays for their X25519 from the TCP peer's prefix, as a proven address (no cookies).
            let peer = request.peer.ip();
            for packet in request.packets.iter() {
                if self.node.turn_is_full() {
                    self.turn()?;
                }
                self.node
                    .handle_link_packet(now, from, peer, packet, &mut self.memo);
            }
            self.link_requests.fed(id);
        }
        Ok(true)
    }

    /// The senders file a reload reads: the one given, else `senders` in the state directory if it exists now
    /// (so a node started without one can be given one without a restart).
    fn senders_path(&self) -> Option<PathBuf> {
        self.settings.senders_file.clone().or_else(|| {
            let p = self.settings.state_dir.join("senders");
            p.exists().then_some(p)
        })
    }

    /// Re-reads the apps file, between two turns, and puts in force what can change without a restart (new apps,
    /// accept lists, turn shares, outlets); says what cannot. A bad file changes nothing.
    fn reload_apps(&mut self) {
        let Some(path) = self.settings.apps_file.clone() else {
            return;
        };
        let new = match AppsConfig::load(&path) {
            Ok(new) => new,
            Err(e) => {
                let why = e.lines().join("; ");
                tracing::error!(
                    "reload of {} refused, the apps in force stay: {why}",
                    path.display()
                );
                self.apps_refused(format!(
                    "last reload of the apps file refused ({})",
                    e.lines().first().cloned().unwrap_or_default()
                ));
                return;
            }
        };
        // New apps' stores would each fail to open past the limit on open files: say it once instead.
        let need = fds::Need::of(&new);
        if let Err(e) = fds::limits()
            .map_err(fds::FdError::Limit)
            .and_then(|l| fds::enough(&need, l.soft))
        {
            tracing::error!(
                "reload of {} refused, the apps in force stay: {e}",
                path.display()
            );
            self.apps_refused(format!("last reload of the apps file refused ({e})"));
            return;
        }
        let own = new.check_own_key(self.node.public_key());
        if !own.is_empty() {
            let why: Vec<String> = own.iter().map(|p| p.render(&path)).collect();
            tracing::error!(
                "reload of {} refused, the apps in force stay: {}",
                path.display(),
                why.join("; ")
            );
            self.apps_refused(format!(
                "last reload of the apps file refused ({})",
                why.first().cloned().unwrap_or_default()
            ));
            return;
        }
        self.apps_note = None;
        let plan = crate::apps::config::plan_reload(&self.settings.apps, &new);
        if plan.is_empty() {
            tracing::info!("reload: apps file {} unchanged", path.display());
            return;
        }
        match self.host.reload(&new, &mut self.node) {
            Ok(done) => {
                for line in &plan.lines {
                    // An app gone from the file is not removed (its line says so): what the operator asked is not
                    // all in force, so it is a warning, said once.
                    let not_done = plan
                        .needs_restart
                        .iter()
                        .any(|n| line.starts_with(&format!("app {n} is no longer in the file")));
                    if not_done {
                        tracing::warn!("reload: {line}");
                    } else {
                        tracing::info!("reload: {line}");
                    }
                }
                for line in &plan.warnings {
                    tracing::warn!("reload: {line}");
                }
                if !done.needs_restart.is_empty() {
                    // Counted and shown as a reload refused in part (`pure_reloads_failed_total`), until a reload
                    // whose file is all in force.
                    self.apps_refused(format!(
                        "last reload of the apps file applied in part: {} no longer in the file, running until a \
                         restart",
                        plan.needs_restart
                            .iter()
                            .map(|n| format!("app {n}"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ));
                }
                self.apply_outlet_changes(done.outlets);
                self.settings.apps = new;
                self.record_open_apps();
                self.publish();
            }
            Err(e) => {
                tracing::error!(
                    "reload of {} refused, the apps in force stay: {e}",
                    path.display()
                );
                self.apps_refused(format!("last reload of the apps file refused ({e})"));
            }
        }
    }

    /// The apps file of this reload was refused: STATUS says so until one is not, and the reload counts as refused.
    fn apps_refused(&mut self, note: String) {
        self.apps_note = Some(note);
        self.apps_refused = true;
    }

    /// A reload is over: it counts as taking effect only if neither file was refused.
    fn count_reload(&mut self, senders_taken: bool) {
        let applied = senders_taken && !std::mem::take(&mut self.apps_refused);
        if applied {
            self.reloads_ok += 1;
        } else {
            self.apps_refused = false;
            self.reloads_failed += 1;
        }
        self.last_reload = Some((Instant::now(), applied));
    }

    fn apply_outlet_changes(&mut self, changes: crate::apps::host::OutletChanges) {
        if let Some(o) = &self.outbox {
            let (start, stop) = self.host.fleet_outlets(changes);
            o.change(start, stop);
            o.set_inner(self.host.fleet_inner());
            return;
        }
        if let Some(l) = &self.sending {
            for &id in &changes.stop {
                l.stop_outlet(id);
            }
        }
        let fleet_inner = self.host.is_shared() && !self.host.fleet_inner().is_empty();
        if changes.start.is_empty() && !fleet_inner {
            return;
        }
        if self.sending.is_none() {
            match SendingLoop::start(LoopSettings {
                identity: self.identity.clone(),
                dns: self.settings.dns.clone(),
            }) {
                Ok(l) => self.sending = Some(l),
                Err(e) => {
                    tracing::error!(
                        "cannot start the sending loop, the new outlets do not run: {e}"
                    );
                    return;
                }
            }
        }
        if let Some(l) = &self.sending {
            if let Some(outbox) = start_outbox(&self.settings, &self.host, l, &self.wake) {
                let (start, stop) = self.host.fleet_outlets(changes);
                outbox.change(start, stop);
                outbox.set_inner(self.host.fleet_inner());
                self.outbox = Some(outbox);
                return;
            }
            for (outlet, target) in changes.start {
                l.start_outlet(outlet, target);
            }
        }
    }

    /// The apps this node hosts, by name.
    pub fn app_names(&self) -> Vec<String> {
        self.host.app_names()
    }

    /// Starts reading the senders file on a helper thread. RELOADING=1 now; READY=1 when it is done either way.
    fn start_reload(&mut self, notifier: Option<&Notifier>) -> Option<PendingReload> {
        self.apps_refused = false;
        self.reload_apps();
        let Some(path) = self.senders_path() else {
            let what = format!(
                "reload: no senders file to read (give --senders, or write {})",
                self.settings.state_dir.join("senders").display()
            );
            tracing::warn!("{what}");
            // Nothing of the senders changed, and nothing was wrong with them: the apps file decides.
            self.count_reload(true);
            self.publish();
            if let Some(n) = notifier {
                n.reloading("reloading");
                self.status_note = Some(what);
                n.ready(&self.status_line());
            }
            return None;
        };
        tracing::info!("reload: reading senders file {}", path.display());
        if let Some(n) = notifier {
            n.reloading(&format!("reloading senders from {}", path.display()));
        }
        // The reload thread's arrays are mappings of their own, given back when freed (heap.rs); the loop's turns
        // fault their buffers in meanwhile, for the second or so a big file takes.
        heap::set_phase(Phase::ReadingSenders);
        let (tx, rx) = mpsc::channel();
        let thread_path = path.clone();
        let state_dir = self.settings.state_dir.clone();
        let spawned = std::thread::Builder::new()
            .name("pure-reload".into())
            .spawn(move || {
                // The receiver may be gone if the loop stopped meanwhile; then the result is not wanted.
                let _ =
                    tx.send(senders::load_indexed(&thread_path, &state_dir).map(|(list, _)| list));
            });
        if let Err(e) = spawned {
            heap::set_phase(Phase::Serving);
            self.reload_failed(&path, format!("cannot start a thread: {e}"), notifier);
            return None;
        }
        Some(PendingReload { path, result: rx })
    }

    fn finish_reload(
        &mut self,
        path: &Path,
        result: Result<AllowList, SendersError>,
        notifier: Option<&Notifier>,
    ) {
        let list = match result {
            Ok(list) => list,
            Err(e) => return self.reload_failed(path, e.to_string(), notifier),
        };
        let before = self.node.senders().len();
        match self.node.replace_senders(Arc::new(list)) {
            Ok(done) => {
                if let Some(q) = &self.pushes {
                    q.publish(self.node.senders().clone());
                }
                *self
                    .stats
                    .allow_list
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner()) =
                    Some(self.node.senders().clone());
                self.count_reload(true);
                self.status_note = None;
                tracing::info!(
                    senders = done.senders,
                    before,
                    sessions_kept = done.sessions_kept,
                    sessions_dropped = done.sessions_dropped,
                    "reloaded senders from {}",
                    path.display()
                );
                self.senders_source = format!("{} from {}", done.senders, path.display());
                self.publish();
                if let Some(n) = notifier {
                    n.ready(&self.status_line());
                }
            }
            // The loop reloads only between turns, so this does not happen; if it did, the old list stays.
            Err(e) => self.reload_failed(path, e.to_string(), notifier),
        }
    }

    fn reload_failed(&mut self, path: &Path, why: String, notifier: Option<&Notifier>) {
        self.count_reload(false);
        let kept = self.node.senders().len();
        // One line, so the journal keeps it as one entry: every problem with its file:line, then the fix.
        let flat = why
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect::<Vec<_>>()
            .join("; ");
        tracing::error!(
            "reload of {} refused, the old list of {kept} senders stays in force: {flat}",
            path.display()
        );
        // STATUS= is one line: the headline and the first problem, which names the file and line.
        let mut lines = why.lines().map(str::trim);
        let first = [lines.next(), lines.next()]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join(": ");
        self.status_note = Some(format!("last reload refused ({first})"));
        self.publish();
        if let Some(n) = notifier {
            n.ready(&self.status_line());
        }
    }

    /// The one line `systemctl status` shows.
    fn status_line(&self) -> String {
        let figures = self.host.figures();
        // What the stores hold, so a restart does not make it 0 (an app whose store's count is not known yet
        // counts what this process stored).
        let stored: u64 = figures
            .iter()
            .map(|a| a.store_records.unwrap_or(a.stored_records))
            .sum();
        let mut line = format!(
            "serving udp {}: {} senders, {stored} records stored, {} active runs",
            self.local_addr(),
            self.node.senders().len(),
            self.node.sessions_active()
        );
        for a in figures {
            if let Some(why) = &a.failed {
                line.push_str(&format!("; app {} CANNOT STORE: {why}", a.name));
            }
            for o in &a.outlets {
                if o.status == "failing" {
                    line.push_str(&format!("; outlet {}/{} failing", a.name, o.name));
                }
            }
        }
        for note in [&self.status_note, &self.apps_note].into_iter().flatten() {
            line.push_str("; ");
            line.push_str(note);
        }
        line
    }

    fn publish(&self) {
        let c = self.node.counters();
        if let Ok(mut s) = self.stats.snapshot.lock() {
            s.counters.clone_from(c);
            if s.apps.len() != self.node.apps().len() {
                s.apps = self.node.app_names();
            }
            s.app_figures = self.host.figures();
            s.sending_loop_alive = self
                .sending
                .as_ref()
                .map(|l| l.alive(Instant::now(), SENDING_STALE));
            s.senders = self.node.senders().len();
            s.sessions = self.node.sessions_active();
            s.reloads_ok = self.reloads_ok;
            s.reloads_failed = self.reloads_failed;
            s.commit_seconds = self.commit_time.as_secs_f64();
            s.x25519_budget = self.node.x25519_budget();
            s.store_connections = self.host.store_connections();
            s.store_syncs = self.host.store_syncs();
            s.push_datagrams = self.push_datagrams.as_ref().map(|d| {
                let c = d.counts();
                (c.taken, c.unanswered)
            });
            if s.node_key.is_empty() {
                s.node_key = self.public_key();
                s.link_addr = Some(self.local_addr());
                s.state_dir = Some(self.settings.state_dir.clone());
            }
            if let Some((at, applied)) = self.last_reload
                && s.last_reload.as_ref().is_none_or(|r| r.at != at)
            {
                // Copied once per reload: the note is the refused file's first problem (or what an applied
                // reload said), the same words STATUS= has.
                let notes: Vec<&str> = [&self.status_note, &self.apps_note]
                    .into_iter()
                    .flatten()
                    .map(String::as_str)
                    .collect();
                s.last_reload = Some(crate::common::figures::LastReload {
                    at,
                    applied,
                    note: (!notes.is_empty()).then(|| notes.join("; ")),
                });
            }
        }
        self.stats
            .stored_records
            .store(c.stored_records, Ordering::Relaxed);
        self.stats.datagrams.store(c.datagrams, Ordering::Relaxed);
        self.stats
            .dropped
            .store(c.total_dropped(), Ordering::Relaxed);
        self.stats.x25519.store(c.x25519, Ordering::Relaxed);
        self.stats
            .sessions
            .store(self.node.sessions_active() as u64, Ordering::Relaxed);
    }
}

/// Loads the node's key (or makes one) once the state directory has been compared with its identity file: a state
/// that looks like it lost data is refused unless `accept_lost_state` ([`state::judge`]). Returns the key, whether
/// it was made, and the identity the state now has (written by [`record_apps`]).
/// A node key made by a start that then failed: said on the way out, since the ready lines that would have said
/// it are not printed, and the key is kept (the next start uses it; senders must list its public key).
struct MadeKey(Option<PathBuf>);

impl Drop for MadeKey {
    fn drop(&mut self) {
        if let Some(path) = &self.0 {
            tracing::warn!(
                "made a new node key {} before the start failed: it is kept, and the next start uses it",
                path.display()
            );
        }
    }
}

fn check_state(
    settings: &NodeSettings,
) -> Result<(crypto::Identity, bool, state::Identity), NodeError> {
    let dir = &settings.state_dir;
    let recorded = state::Identity::read(dir)?;
    let existing = if settings.key_file.exists() {
        Some(keys::read_identity(&settings.key_file)?)
    } else {
        None
    };
    let stores = crate::store::list_apps(dir);
    let apps: Vec<String> = settings.apps.apps.iter().map(|a| a.name.clone()).collect();
    let problems = state::judge(&state::Found {
        dir,
        identity: recorded.as_ref(),
        key_file: &settings.key_file,
        key: existing.as_ref().map(|k| *k.public()),
        stores: &stores,
        apps: &apps,
    });
    if !problems.is_empty() {
        if !settings.accept_lost_state {
            return Err(StateError::LooksLost {
                dir: dir.clone(),
                problems,
            }
            .into());
        }
        for p in &problems {
            tracing::warn!("{}: starting anyway: {p}", state::ACCEPT_FLAG);
        }
    }
    let (identity, created) = match existing {
        Some(id) => (id, false),
        None => keys::load_or_create_identity(&settings.key_file)?,
    };
    let mut recorded = recorded.unwrap_or_default();
    if recorded.public_key != *identity.public() {
        recorded = state::Identity {
            public_key: *identity.public(),
            apps: Default::default(),
        };
    }
    Ok((identity, created, recorded))
}

/// Adds `apps` (whose stores are open) to the state's identity file, writing it only when it changes.
fn record_apps(
    dir: &Path,
    mut identity: state::Identity,
    apps: &[String],
) -> Result<state::Identity, StateError> {
    let before = identity.clone();
    identity.apps.extend(apps.iter().cloned());
    if identity != before || !state::Identity::path(dir).exists() {
        identity.write(dir)?;
    }
    Ok(identity)
}

/// The apps file's warnings (accept lists naming senders the senders file does not list), with one pass over the
/// allow-list however many names the accept lists hold.
fn accept_warnings(apps: &AppsConfig, senders: &AllowList) -> Vec<String> {
    use crate::apps::config::Accept;
    // Every name the apps file names: accept lists and forwarders (an outside tester saw every forwarder warned
    // of as not listed when only accept's names were looked for).
    let wanted: std::collections::HashSet<&str> = apps
        .apps
        .iter()
        .flat_map(|a| {
            let accepted = match &a.accept {
                Accept::Only(names) => names.as_slice(),
                Accept::All => &[],
            };
            accepted
                .iter()
                .chain(a.forwarders.iter())
                .map(String::as_str)
        })
        .collect();
    let mut listed = std::collections::HashSet::new();
    if !wanted.is_empty() {
        for i in 0..senders.len() {
            let name = senders.name(i as crate::proto::allow_list::SenderIndex);
            if wanted.contains(name) {
                listed.insert(name.to_string());
            }
        }
    }
    apps.warnings(&|name| listed.contains(name))
}

fn log_summary(before: &NodeCounters, now: &NodeCounters, sessions: usize) {
    if now.datagrams == before.datagrams {
        return;
    }
    let drops: Vec<String> = DropReason::ALL
        .iter()
        .filter(|r| now.dropped(**r) > before.dropped(**r))
        .map(|r| format!("{}={}", r.name(), now.dropped(*r) - before.dropped(*r)))
        .collect();
    tracing::info!(
        datagrams = now.datagrams - before.datagrams,
        stored = now.stored_records - before.stored_records,
        duplicates = now.duplicate_records - before.duplicate_records,
        sessions,
        x25519 = now.x25519 - before.x25519,
        x25519_wasted = (now.x25519 - now.x25519_authentic) - (before.x25519 - before.x25519_authentic),
        cookies = now.cookies_sent - before.cookies_sent,
        forward_refused = now.forward_refused_frames - before.forward_refused_frames,
        drops = %if drops.is_empty() { "none".to_string() } else { drops.join(" ") },
        "link summary"
    );
}

/// What a session may cost the node, generously: ~600 B measured (research/007), with the tables' slack.
const SESSION_BYTES: u64 = 1024;

/// The default bound on sessions in all: a quarter of the machine's memory at [`SESSION_BYTES`] each (about 250k on
/// a 1 GB Raspberry Pi), or [`crate::proto::node::DEFAULT_MAX_SESSIONS`] if the memory cannot be read.
pub fn max_sessions_for_memory() -> usize {
    let total = std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| {
        m.lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
    });
    match total {
        Some(kib) => ((kib * 1024 / 4 / SESSION_BYTES) as usize).max(1024),
        None => crate::proto::node::DEFAULT_MAX_SESSIONS,
    }
}

/// How often the loop looks for a reload's result while the senders file is being read.
const RELOAD_POLL: Duration = Duration::from_millis(2);

/// On a fleet's store, the outbox that drives this node's share of its outlets, on `sending` (`None` on SQLite,
/// where the host feeds its outlets itself, or if its thread cannot start: then logged, and no outlet runs here).
fn start_outbox(
    settings: &NodeSettings,
    host: &Host,
    sending: &SendingLoop,
    host_wake: &Arc<Wake>,
) -> Option<Outbox> {
    let node_id = fleet_node_id(&settings.state_dir);
    let (Some(connect), Some(wake), Some(inner_queue)) = (
        settings
            .store
            .outbox_connector(settings.store_password.clone(), node_id.clone()),
        host.outbox_wake(),
        host.inner_queue(),
    ) else {
        return None;
    };
    let outbox = Outbox::start(
        OutboxSettings {
            connect,
            node_id,
            sending: sending.commander(),
            inner_queue,
            host_wake: host_wake.clone(),
        },
        wake,
    );
    match outbox {
        Ok(o) => Some(o),
        Err(e) => {
            tracing::error!("cannot start the outbox thread, no outlet runs on this node: {e}");
            None
        }
    }
}

/// This node's id among the fleet's nodes, which its outlets' leases are held under: its host name and state
/// directory, for the operator to read, and a number drawn at random at this start, so that it is unique by
/// construction (issue 34). Host names and state paths are not: every Pi cloned from one image is `raspberrypi`
/// with its state in one place, and a copied state directory holds the same files; two live nodes under one id
/// would both renew, and both drive, every outlet. The price: a node SIGKILLed and started again does not take its
/// own leases back at once, but waits, as any other node does, for them to end (a clean stop gives them back).
fn fleet_node_id(state_dir: &Path) -> String {
    let mut name = [0u8; 256];
    // SAFETY: gethostname writes at most `len` bytes into the live buffer.
    let ok = unsafe { libc::gethostname(name.as_mut_ptr().cast(), name.len()) } == 0;
    let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    let host = if ok {
        String::from_utf8_lossy(&name[..end]).into_owned()
    } else {
        "unknown-host".to_string()
    };
    let dir = std::fs::canonicalize(state_dir).unwrap_or_else(|_| state_dir.to_path_buf());
    let mut run = [0u8; 8];
    getrandom::fill(&mut run).expect("the operating system's random generator failed");
    format!("{host}:{}#{:016x}", dir.display(), u64::from_le_bytes(run))
}

/// A sending loop that has not beaten for this long is stuck: the watchdog is not fed (it beats every 0.5 s).
const SENDING_STALE: Duration = Duration::from_secs(3);

/// Sessions swept in one sweep that make it worth giving freed heap back to the kernel.
const TRIM_AFTER_SWEPT: u64 = 1024;

/// Waits until the socket is readable, a wake descriptor (signals, outlets, HTTP) is, or `timeout` passes. Wakes
/// are cleared: one round serves them all. Returns whether each of `pushes` (the push datagram socket, the push
/// socket's listener) is readable, so that a round without a push costs the uplink no read of them.
fn wait_readable(
    socket: Option<&UdpSocket>,
    pushes: [Option<RawFd>; 2],
    idle: &[RawFd],
    idle_ready: &mut u64,
    wakes: &[Option<RawFd>],
    timeout: Duration,
) -> [bool; 2] {
    // A negative fd is ignored by poll(2). The sockets first: only the wakes after them are cleared.
    let mut fds = vec![libc::pollfd {
        fd: socket.map_or(-1, |s| s.as_raw_fd()),
        events: libc::POLLIN,
        revents: 0,
    }];
    for p in pushes {
        fds.push(libc::pollfd {
            fd: p.unwrap_or(-1),
            events: libc::POLLIN,
            revents: 0,
        });
    }
    // The push socket's kept connections (at most 32, so their bits fit), then the wakes.
    for &fd in idle.iter().take(64) {
        fds.push(libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        });
    }
    let wakes_at = fds.len();
    for w in wakes {
        fds.push(libc::pollfd {
            // A negative fd is ignored by poll(2).
            fd: w.unwrap_or(-1),
            events: libc::POLLIN,
            revents: 0,
        });
    }
    // Rounded up: rounding down turns the last partial millisecond before a deadline into a busy loop of
    // zero-timeout polls (research/003 saw 14 in a row).
    let ms = timeout.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
    // SAFETY: valid pollfds for the duration of the call; a failure (EINTR) just ends the wait early.
    if unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) } <= 0 {
        return [false; 2];
    }
    // Readable, closed or failed: a read says which.
    *idle_ready = 0;
    for (i, p) in fds[3..wakes_at].iter().enumerate() {
        if p.revents != 0 {
            *idle_ready |= 1 << i;
        }
    }
    for p in &fds[wakes_at..] {
        if p.fd >= 0 && p.revents & libc::POLLIN != 0 {
            crate::common::wake::clear_eventfd(p.fd);
        }
    }
    let ready = |p: &libc::pollfd| p.fd >= 0 && p.revents & libc::POLLIN != 0;
    [ready(&fds[1]), ready(&fds[2])]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::crypto::Identity;

    #[test]
    fn a_forwarder_or_accepted_sender_that_is_listed_is_not_warned_of() {
        let apps = AppsConfig::parse(
            std::path::Path::new("apps.toml"),
            "[apps.a]\naccept = [\"hall\", \"attic\"]\n[apps.f]\nforwarders = [\"edge\", \"edge-9\"]\n",
        )
        .unwrap();
        let senders = AllowList::from_unique(vec![
            ("hall".into(), *Identity::generate().public()),
            ("edge".into(), *Identity::generate().public()),
        ]);
        let w = accept_warnings(&apps, &senders);
        assert_eq!(w.len(), 2, "{w:#?}");
        assert!(w[0].contains("sender attic is not"), "{w:#?}");
        assert!(
            w[1].contains("key forwarders: sender edge-9 is not"),
            "{w:#?}"
        );
    }
}
