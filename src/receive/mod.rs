//! The receiver: the one thread that owns the node's UDP socket and drives the node core through turns.
//!
//! Each round: wait for the socket (or the next deadline), read a bounded batch of datagrams without blocking,
//! hand each to [`Node::handle_datagram`], apply the turn to the stores in one transaction per app and commit, then
//! send the acks. Acks leave only after the commit returns: "stored" means on disk (docs/protocol.md 5.3).
//! Under a flood the batch bound keeps the loop turning (BRIEF.md, receive livelock): input beyond it waits in the
//! socket buffer, whose overflow the kernel counts.

use std::io::ErrorKind;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, Socket, Type};
use thiserror::Error;

use crate::keys::{self, KeyError};
use crate::proto::allow_list::AllowList;
use crate::proto::crypto;
use crate::proto::node::{DropReason, Node, NodeConfig, NodeCounters};
use crate::senders::{self, SendersError};
use crate::store::memo::Memo;
use crate::store::{StoreError, Stores};

/// Datagrams read per round before the turn is applied (BRIEF.md: bound the work per round).
const BATCH: usize = 1024;
/// Longest the loop sleeps without looking at the stop flag.
const MAX_WAIT: Duration = Duration::from_millis(100);
/// How often a summary line is logged while traffic flows.
const SUMMARY_EVERY: Duration = Duration::from_secs(10);

#[derive(Debug, Error)]
pub enum NodeError {
    #[error(transparent)]
    Key(#[from] KeyError),
    #[error(transparent)]
    Senders(#[from] SendersError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot create state directory {path}: {source}")]
    StateDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "cannot listen on UDP {addr}: {source} (is another node on that port? choose one with --link-port)"
    )]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("UDP socket: {0}")]
    Socket(std::io::Error),
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
    pub apps: Vec<String>,
    pub recv_buffer: usize,
}

/// Live figures a caller (the demo, tests, later metrics) may read while the node runs.
#[derive(Debug, Default)]
pub struct LiveStats {
    pub stored_records: AtomicU64,
    pub datagrams: AtomicU64,
    pub dropped: AtomicU64,
    pub sessions: AtomicU64,
    pub x25519: AtomicU64,
}

/// A node that has its key, stores and socket, ready to [`ReadyNode::run`].
pub struct ReadyNode {
    node: Node,
    stores: Stores,
    memo: Memo,
    socket: UdpSocket,
    pub key_created: bool,
    pub senders_source: String,
    pub stats: Arc<LiveStats>,
    settings: NodeSettings,
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
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))
        .map_err(NodeError::Socket)?;
    // Best effort: the kernel caps it at net.core.rmem_max; what we got is logged.
    let _ = socket.set_recv_buffer_size(recv_buffer);
    socket
        .bind(&addr.into())
        .map_err(|source| NodeError::Bind { addr, source })?;
    socket.set_nonblocking(true).map_err(NodeError::Socket)?;
    Ok(socket.into())
}

impl ReadyNode {
    /// Loads the key (making one if missing), the senders file and the stores, and binds the socket.
    pub fn prepare(settings: NodeSettings) -> Result<Self, NodeError> {
        create_private_dir(&settings.state_dir)?;
        let (identity, key_created) = keys::load_or_create_identity(&settings.key_file)?;
        let (senders, senders_source) = match &settings.senders_file {
            Some(path) => {
                let list = senders::load(path)?;
                let n = list.len();
                (list, format!("{n} from {}", path.display()))
            }
            None => (
                AllowList::default(),
                "none (no senders file given)".to_string(),
            ),
        };
        let stores = Stores::open(&settings.state_dir, &settings.apps)?;
        let memo = Memo::open(&settings.state_dir.join("memo.sqlite"))?;
        let socket = bind_udp(settings.link_addr, settings.recv_buffer)?;
        let node = Node::new(
            NodeConfig {
                identity,
                epoch: u64::from_be_bytes(crypto::random_array()),
                idle: settings.idle,
                apps: settings.apps.clone(),
            },
            Arc::new(senders),
        );
        Ok(ReadyNode {
            node,
            stores,
            memo,
            socket,
            key_created,
            senders_source,
            stats: Arc::new(LiveStats::default()),
            settings,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.socket.local_addr().unwrap_or(self.settings.link_addr)
    }

    pub fn public_key(&self) -> String {
        keys::encode_key(self.node.public_key())
    }

    pub fn identity_public(&self) -> [u8; 32] {
        *self.node.public_key()
    }

    /// Serves until `stop` is set, then finishes the turn in hand (commit and acks) and returns the counters.
    pub fn run(mut self, stop: &AtomicBool) -> Result<NodeCounters, NodeError> {
        let mut buf = vec![0u8; 2048];
        let mut last_summary = Instant::now();
        let mut summarized = NodeCounters::default();
        loop {
            let stopping = stop.load(Ordering::Relaxed);
            let now = Instant::now();
            let wait = self
                .node
                .poll_timeout()
                .map(|t| t.saturating_duration_since(now))
                .unwrap_or(MAX_WAIT)
                .min(MAX_WAIT);
            if !stopping {
                wait_readable(&self.socket, wait);
            }
            let now = Instant::now();
            let mut read = 0;
            while !stopping && read < BATCH && !self.node.turn_is_full() {
                match self.socket.recv_from(&mut buf) {
                    Ok((n, from)) => {
                        read += 1;
                        self.node
                            .handle_datagram(now, from, &buf[..n], &mut self.memo);
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                    // ICMP errors from earlier sends surface here on some systems; they are not fatal.
                    Err(e) if e.kind() == ErrorKind::ConnectionRefused => continue,
                    Err(e) => return Err(NodeError::Socket(e)),
                }
            }
            self.turn()?;
            self.node.handle_timeout(now);
            self.publish();
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

    /// Applies the current turn, commits, and sends the acks it earned.
    fn turn(&mut self) -> Result<(), NodeError> {
        if let Some(turn) = self.node.take_turn() {
            match self.stores.apply_turn(&turn, self.node.senders()) {
                Ok(committed) => self.node.handle_committed(&committed),
                Err(e) => {
                    // Nothing of the turn is acked; senders resend. A store that keeps failing shows in the log.
                    tracing::error!("turn {} not stored: {e}", turn.id);
                    self.node.handle_turn_failed(turn.id);
                }
            }
        }
        self.node.flush_acks();
        while let Some(t) = self.node.poll_transmit() {
            if let Err(e) = self.socket.send_to(&t.bytes, t.to) {
                // A full send buffer or unreachable peer loses this ack; the sender's resend earns another.
                tracing::debug!("ack to {} not sent: {e}", t.to);
            }
        }
        let secrets = self.node.take_new_secrets();
        if let Err(e) = self.memo.put_all(&secrets) {
            tracing::warn!(
                "memo not updated ({e}); known senders will cost an X25519 after a restart"
            );
        }
        Ok(())
    }

    fn publish(&self) {
        let c = self.node.counters();
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
        drops = %if drops.is_empty() { "none".to_string() } else { drops.join(" ") },
        "link summary"
    );
}

/// Waits until the socket is readable or `timeout` passes.
fn wait_readable(socket: &UdpSocket, timeout: Duration) {
    let mut fds = libc::pollfd {
        fd: socket.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: one valid pollfd for the duration of the call; a failure (EINTR) just ends the wait early.
    unsafe {
        libc::poll(&mut fds, 1, ms);
    }
}
