//! A node on a thread of this process, listening on loopback: what `pure-serve demo` runs, and what benchmarks and
//! tests start when they need the real receive loop without a child process.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use super::{NodeError, NodeSettings, ReadyNode};
use crate::apps::config::AppsConfig;
use crate::common::figures::LiveStats;
use crate::proto::crypto::PublicKeyBytes;
use crate::proto::node::NodeCounters;

pub struct LocalNode {
    /// The node's UDP address (127.0.0.1, a free port).
    pub addr: SocketAddr,
    pub public: PublicKeyBytes,
    /// Live counters, updated every round of the loop.
    pub stats: Arc<LiveStats>,
    /// The node's state directory (stores, key, memo).
    pub state_dir: PathBuf,
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Result<NodeCounters, NodeError>>,
}

impl LocalNode {
    /// Writes `dir/senders` listing `senders` (name, public key) and starts a node with its state in `dir/state`,
    /// its key in `dir/node.key`, and the one app `main`.
    pub fn start(
        dir: &Path,
        senders: &[(String, PublicKeyBytes)],
        idle: Duration,
        recv_buffer: usize,
    ) -> Result<Self, NodeError> {
        Self::start_apps(
            dir,
            senders,
            AppsConfig::default_single(),
            idle,
            recv_buffer,
        )
    }

    /// [`LocalNode::start`] hosting the apps of `apps` (their outlets run on a sending loop of this process).
    pub fn start_apps(
        dir: &Path,
        senders: &[(String, PublicKeyBytes)],
        apps: AppsConfig,
        idle: Duration,
        recv_buffer: usize,
    ) -> Result<Self, NodeError> {
        let senders_file = dir.join("senders");
        let text: String = senders
            .iter()
            .map(|(name, key)| format!("{name} {}\n", crate::keys::encode_key(key)))
            .collect();
        std::fs::write(&senders_file, text).map_err(|source| NodeError::StateDir {
            path: senders_file.clone(),
            source,
        })?;
        let state_dir = dir.join("state");
        let ready = ReadyNode::prepare(NodeSettings {
            state_dir: state_dir.clone(),
            key_file: dir.join("node.key"),
            senders_file: Some(senders_file),
            link_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            idle,
            apps,
            apps_file: None,
            recv_buffer,
            x25519_budget: crate::proto::admission::DEFAULT_X25519_BUDGET,
            sessions_per_sender: crate::proto::node::DEFAULT_SESSIONS_PER_SENDER,
            max_sessions: crate::proto::node::DEFAULT_MAX_SESSIONS,
            dns: Default::default(),
            accept_lost_state: false,
            store: crate::store::engine::StoreChoice::Sqlite,
            store_password: None,
        })?;
        let addr = ready.local_addr();
        let public = ready.identity_public();
        let stats = ready.stats.clone();
        let stop = Arc::new(AtomicBool::new(false));
        let stop_flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("pure-receive".into())
            .spawn(move || ready.run(&stop_flag))
            .map_err(NodeError::Socket)?;
        Ok(LocalNode {
            addr,
            public,
            stats,
            state_dir,
            stop,
            thread,
        })
    }

    /// Stops the node (the turn in hand is stored and acked) and returns its counters.
    pub fn stop(self) -> Result<NodeCounters, NodeError> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or_else(|_| {
            Err(NodeError::Socket(std::io::Error::other(
                "the node thread panicked",
            )))
        })
    }
}
