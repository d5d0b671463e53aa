//! pure-serve: a link node daemon. Devices ("senders") deliver records over connectionless, encrypted UDP links;
//! the node stores each record exactly once in SQLite before it acknowledges it.
//!
//! Module map (ARCHITECTURE.md has the invariants):
//!
//! - [`proto`] — the protocol, sans-IO: [`proto::wire`] (byte layouts), [`proto::crypto`] (X25519, HKDF,
//!   AES-GCM), [`proto::allow_list`] (every allowed sender, compact), [`proto::session_cache`] (active runs),
//!   [`proto::node`] and [`proto::sender`] (the state machines), [`proto::turn`] (what a turn hands the store).
//! - [`receive`] — the receiver: the node's socket loop that drives [`proto::node`] through turns.
//! - [`store`] — SQLite: per-app records and heard sequences, the memo of derived secrets.
//! - [`sender`] — the device side: a blocking UDP driver around [`proto::sender`].
//! - [`apps`] — the host: apps, turns, budgets, outlets; so far [`apps::config`], the `--apps` file.
//! - [`senders`], [`keys`] — the senders file and key files.
//! - [`files`] — opening the files an operator names: regular files only, never blocking, within a size limit.
//! - [`http`] — the HTTP server (one thread, hyper): `/healthz` and `POST /link` (sealed link packets over
//!   HTTP(S) handed to the receive loop) on `--http-port`; `/metrics` and `/healthz` on `--metrics-listen`
//!   (loopback by default).
//! - [`ops`] — running as a service: systemd notify and watchdog, signals, reload, metrics and health, `check`.
//! - [`cli`] — the subcommands of the `pure-serve` binary.
//!
//! Sending from a device:
//!
//! ```no_run
//! use pure_serve::proto::crypto::Identity;
//! use pure_serve::sender::UdpLink;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let me = pure_serve::keys::read_identity("device.key".as_ref())?;
//! let node_key = pure_serve::keys::parse_public_key("NODE_PUBLIC_KEY_BASE64=")?;
//! let mut link = UdpLink::connect(me, node_key, "192.0.2.1:7380".parse()?)?;
//! link.sender().queue("main", b"temperature=21.5".to_vec())?;
//! let outcome = link.deliver(Some(std::time::Duration::from_secs(10)))?;
//! assert_eq!(outcome.unacked, 0);
//! # Ok(()) }
//! ```

pub mod apps;
pub mod cli;
pub mod common;
pub mod files;
pub mod http;
pub mod keys;
pub mod ops;
pub mod outlets;
pub mod proto;
pub mod provision;
pub mod receive;
pub mod sender;
pub mod senders;
pub mod sending;
pub mod store;
