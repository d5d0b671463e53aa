//! The link outlet: an app's records to an app of another node, as sealed UDP (docs/protocol.md), with this node's
//! own key as the sender key and FORWARD frames (5.4) so the far node knows each record's origin.
//!
//! It is the sans-IO [`Sender`] driven by a task of the sending loop. A run of the outlet:
//!
//! 1. resolve the far node's name (on the loop, [`crate::common::dns`]) and open a UDP socket to it;
//! 2. probe the far app: its heard sequence `h` for this node is where the outlet got to before, since the
//!    forwarded flow is numbered by the app's positions (docs/store.md); ask the host to feed from `h + 1`. The
//!    probe is a FORWARD frame, so a far app that does not let this node forward refuses it at once (REFUSE reason
//!    3, docs/protocol.md 5.4) and the operator is told what to add there before any record is sent;
//! 3. queue what the host feeds, send (packets filled to the datagram size), take acks; report the stored position
//!    to the host, which frees memory and lets it feed more.
//!
//! A run ends, and the next starts from a new probe, when the far side says something only a restart can fix (it
//! went back or ahead of this flow; or it refused the app or this node's forwarding — then after a wait, since
//! only the far node's operator can fix that) or after three retransmission rounds with no answer — then the name
//! is resolved again, in case the far node moved. Nothing is lost between runs: what was not acknowledged is in the
//! store and is fed again from the far side's heard sequence.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::UdpSocket;

use super::{Held, Outlet};
use crate::common::dns::Resolver;
use crate::proto::crypto::{Identity, PublicKeyBytes};
use crate::proto::sender::{FlowStart, Sender, SenderConfig, SenderEvent};
use crate::proto::wire::{self, RecordFormat};
use crate::store::Chunk;

/// Retransmission rounds without an answer before the name is resolved again (docs/apps.md).
const UNANSWERED_ROUNDS: u64 = 3;
/// Wait before a new run after the far side refused the app or a lookup failed: a misconfiguration is not fixed by
/// retrying at once.
pub(super) const RETRY_AFTER: Duration = Duration::from_secs(5);
/// Datagrams read per wake before the outlet sends again.
const RECV_BATCH: usize = 64;

#[derive(Debug, Clone)]
pub struct LinkTarget {
    pub to: String,
    pub node_key: PublicKeyBytes,
    pub far_app: String,
}

/// Why a run ended.
pub(super) enum RunEnd {
    /// Start a new run now (the far side's flow state needs a fresh probe).
    Again,
    /// Nobody answered: resolve the name again, then a new run.
    Unanswered,
    /// Wait a while, then a new run.
    Later,
}

pub async fn run(outlet: Arc<Outlet>, target: LinkTarget, identity: Identity, dns: Resolver) {
    loop {
        outlet.set_status("resolving");
        let addr = match dns.resolve(&target.to).await {
            Ok(a) => a,
            Err(e) => {
                outlet.error("dns", e.to_string());
                tokio::time::sleep(RETRY_AFTER).await;
                continue;
            }
        };
        let socket = match open_socket(addr).await {
            Ok(s) => s,
            Err(e) => {
                outlet.error("socket", format!("UDP socket to {addr}: {e}"));
                tokio::time::sleep(RETRY_AFTER).await;
                continue;
            }
        };
        match serve(&outlet, &target, &identity, &socket, addr).await {
            RunEnd::Again | RunEnd::Unanswered => {}
            RunEnd::Later => tokio::time::sleep(RETRY_AFTER).await,
        }
    }
}

async fn open_socket(addr: SocketAddr) -> std::io::Result<UdpSocket> {
    let local: SocketAddr = if addr.is_ipv4() {
        "0.0.0.0:0".parse().expect("a literal address")
    } else {
        "[::]:0".parse().expect("a literal address")
    };
    let socket = UdpSocket::bind(local).await?;
    socket.connect(addr).await?;
    Ok(socket)
}

/// Appends the records of `chunk` from position `from` on to the sender's flow, as forwarded records, written
/// straight into the sender's queue (no allocation per record). Returns the bytes queued.
fn queue_chunk(
    sender: &mut Sender,
    far_app: &str,
    chunk: &Chunk,
    from: u64,
) -> Result<usize, String> {
    let mut bytes = 0;
    let skip = from.saturating_sub(chunk.pos) as usize;
    for (pos, record) in (chunk.pos..).zip(chunk.records()).skip(skip) {
        let queued = match chunk.format {
            // A record that came from a device here: its origin is its source and sequence here.
            RecordFormat::Plain => {
                let seq = chunk.first_seq + (pos - chunk.pos);
                sender.queue_forwarded(far_app, chunk.source.as_bytes(), seq, record)
            }
            // Already forwarded: its origin stays (protocol.md 5.4).
            RecordFormat::Forwarded => sender.queue_slice(far_app, record).map(|()| record.len()),
        };
        bytes +=
            queued.map_err(|e| format!("record at position {pos} cannot be forwarded: {e}"))?;
    }
    Ok(bytes)
}

/// The forwarded flow of one run of a link or wire outlet: the sans-IO sender, and where the host's feed stands.
pub(super) struct Forwarding {
    pub sender: Sender,
    far_app: String,
    /// The far side, for messages.
    far: String,
    /// This node's public key, base64: what the far node's senders file must list.
    own_key: String,
    /// The next position to queue, once the far side told us where it stands.
    next: Option<u64>,
    held: Held,
    rounds_at_progress: u64,
    /// Retransmission rounds and authenticated packets from the far side when it last answered.
    rounds_at_answer: u64,
    received: u64,
}

impl Forwarding {
    pub fn new(
        outlet: &Outlet,
        identity: &Identity,
        node_key: PublicKeyBytes,
        far_app: &str,
        far: &str,
    ) -> Option<Self> {
        let mut config = SenderConfig::new(identity.clone(), node_key);
        config.max_datagram = wire::MAX_DATAGRAM;
        config.allow_oversize = true;
        let mut sender = match Sender::new(config) {
            Ok(s) => s,
            Err(e) => {
                outlet.error("config", format!("node key: {e}"));
                return None;
            }
        };
        if let Err(e) = sender.open_flow_as(far_app, FlowStart::Probe, RecordFormat::Forwarded) {
            outlet.error("config", e.to_string());
            return None;
        }
        outlet.set_status("syncing");
        Some(Forwarding {
            sender,
            far_app: far_app.to_string(),
            far: far.to_string(),
            own_key: crate::keys::encode_key(identity.public()),
            next: None,
            held: Held::default(),
            rounds_at_progress: 0,
            rounds_at_answer: 0,
            received: 0,
        })
    }

    /// Queues what the host fed (once synced). `Err` ends the run.
    pub fn take_fed(&mut self, outlet: &Outlet) -> Result<(), RunEnd> {
        let Some(n) = self.next.as_mut() else {
            return Ok(());
        };
        for chunk in outlet.take_fed() {
            let size = chunk.body.len();
            if chunk.pos > *n {
                // A hole between what was queued and what was fed: start over from the far side's view.
                outlet.release(size);
                outlet.error(
                    "internal",
                    format!("fed position {} while expecting {n}", chunk.pos),
                );
                outlet.release(self.held.bytes());
                return Err(RunEnd::Again);
            }
            let end = chunk.pos + chunk.count;
            if end <= *n {
                outlet.release(size);
                continue;
            }
            match queue_chunk(&mut self.sender, &self.far_app, &chunk, *n) {
                Ok(_) => {
                    self.held.add(end - 1, size);
                    *n = end;
                }
                Err(e) => {
                    // Cannot happen for records a node accepted (protocol.md 5.4 bounds them); if it does, it
                    // must be seen, and the outlet must not spin on it.
                    outlet.release(size);
                    outlet.error("too_large", e);
                    outlet.release(self.held.bytes());
                    return Err(RunEnd::Later);
                }
            }
        }
        Ok(())
    }

    /// Handles what the sender reported. `Err` ends the run.
    pub fn events(&mut self, outlet: &Outlet) -> Result<(), RunEnd> {
        while let Some(event) = self.sender.poll_event() {
            match event {
                SenderEvent::Stored { through, .. } => {
                    // The far flow is numbered from the outlet's start: its sequence s is position s + base.
                    let through = through + outlet.base();
                    self.rounds_at_progress = self.sender.stats().retransmit_rounds;
                    if self.next.is_none() {
                        self.next = Some(through + 1);
                        outlet.restart_from(through + 1);
                        outlet.recovered("sending");
                    } else {
                        outlet.release(self.held.release_through(through));
                        outlet.set_acked(through);
                    }
                }
                SenderEvent::NodeAhead { node, ours, .. } => {
                    outlet.error(
                        "far_state",
                        format!(
                            "{} holds {node} records of this flow, this app only {ours}: this node's store was \
                             replaced by an older one; records up to {node} are not sent again",
                            self.far
                        ),
                    );
                    outlet.release(self.held.bytes());
                    return Err(RunEnd::Again);
                }
                SenderEvent::NodeBehind { node, ours, .. } => {
                    outlet.error(
                        "far_state",
                        format!(
                            "{} has only {node} of the {ours} records it acknowledged (its store was replaced); \
                             sending again from {}",
                            self.far,
                            node + 1
                        ),
                    );
                    outlet.release(self.held.bytes());
                    return Err(RunEnd::Again);
                }
                // An outlet never listens: the far node sends it no downlink (docs/protocol.md 12.3).
                SenderEvent::Down { .. } | SenderEvent::DownlinkUnanswered { .. } => {}
                SenderEvent::NotStored { .. } => {
                    outlet.error(
                        "not_stored",
                        format!(
                            "{} app {} cannot store now (its store fails); sending again later",
                            self.far, self.far_app
                        ),
                    );
                }
                SenderEvent::Refused { reason, .. } => {
                    let (far_app, key) = (&self.far_app, &self.own_key);
                    let why = match reason {
                        wire::REFUSE_NO_APP => "has no such app".to_string(),
                        wire::REFUSE_NOT_ACCEPTED => format!(
                            "does not accept this node (REFUSE reason 2): on that node, list this node's public \
                             key {key} in its senders file, and its name there in accept and forwarders of \
                             [apps.{far_app}] in its apps file (docs/apps.md)"
                        ),
                        wire::REFUSE_NOT_FORWARDER => format!(
                            "does not let this node forward to it (REFUSE reason 3): on that node, add this \
                             node's name in its senders file to `forwarders` of [apps.{far_app}] in its apps \
                             file (docs/apps.md) and reload it; this node's public key is {key}"
                        ),
                        r => format!("refused it (reason {r})"),
                    };
                    outlet.error(
                        "refused",
                        format!("{} app {} {why}", self.far, self.far_app),
                    );
                    outlet.release(self.held.bytes());
                    return Err(RunEnd::Later);
                }
            }
        }
        Ok(())
    }

    /// Retransmission rounds have gone unanswered long enough to look for the far side again.
    pub fn unanswered(&self) -> bool {
        self.sender.stats().retransmit_rounds >= self.rounds_at_progress + UNANSWERED_ROUNDS
    }

    /// Whether the far side has answered nothing at all (no packet that authenticated) for [`UNANSWERED_ROUNDS`]
    /// retransmission rounds; if so it is told to the operator, with the likely cause and its fix
    /// ([`Outlet::silent`]), and the count starts again. A far node that does not list this node's key drops
    /// every packet without an answer, as does one whose key is not `node_key`, one that does not run there, and a
    /// far app that is paused; one that lists it but whose app refuses it answers REFUSE, told elsewhere.
    pub fn check_silence(&mut self, outlet: &Outlet) -> bool {
        let stats = self.sender.stats();
        if stats.packets_received > self.received {
            self.received = stats.packets_received;
            self.rounds_at_answer = stats.retransmit_rounds;
            outlet.answered();
            return false;
        }
        if stats.retransmit_rounds < self.rounds_at_answer + UNANSWERED_ROUNDS {
            return false;
        }
        self.rounds_at_answer = stats.retransmit_rounds;
        outlet.silent(format!(
            "the far node does not answer ({}: nothing came back to {UNANSWERED_ROUNDS} rounds of retransmissions): does its senders file list this node's key {}, and \
             does its app {} accept it? (Also: is node_key its key — `pure-serve pubkey` on it — and does it run \
             and take {} there?) docs/operations.md, \"When an outlet does not deliver\"",
            self.far,
            self.own_key,
            self.far_app,
            if self.far.contains("://") { "HTTP" } else { "UDP" },
        ));
        true
    }

    /// Ends the run: what it held is released (the store has it).
    pub fn abandon(&mut self, outlet: &Outlet) {
        outlet.release(self.held.bytes());
        self.held = Held::default();
    }
}

async fn serve(
    outlet: &Outlet,
    target: &LinkTarget,
    identity: &Identity,
    socket: &UdpSocket,
    addr: SocketAddr,
) -> RunEnd {
    let Some(mut flow) = Forwarding::new(
        outlet,
        identity,
        target.node_key,
        &target.far_app,
        &target.to,
    ) else {
        return RunEnd::Later;
    };
    let mut out = Vec::with_capacity(wire::MAX_ACCEPTED_DATAGRAM);
    let mut buf = vec![0u8; 2048];
    loop {
        if let Err(end) = flow.take_fed(outlet) {
            return end;
        }
        let now = Instant::now();
        while flow.sender.poll_transmit(now, &mut out) {
            if let Err(e) = socket.send(&out).await {
                // ICMP port unreachable from an earlier packet, or no route: the RTO resends.
                outlet.error("socket", format!("send to {addr}: {e}"));
                break;
            }
        }
        let deadline = flow.sender.poll_timeout();
        let sleep = async {
            match deadline {
                Some(t) => tokio::time::sleep_until(tokio::time::Instant::from_std(t)).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = outlet.pushed() => {}
            r = socket.recv(&mut buf) => {
                let now = Instant::now();
                match r {
                    Ok(n) => {
                        flow.sender.handle_datagram(now, &buf[..n]);
                        for _ in 1..RECV_BATCH {
                            match socket.try_recv(&mut buf) {
                                Ok(n) => flow.sender.handle_datagram(now, &buf[..n]),
                                Err(_) => break,
                            }
                        }
                    }
                    Err(e) => outlet.error("socket", format!("receive from {addr}: {e}")),
                }
            }
            _ = sleep => flow.sender.handle_timeout(Instant::now()),
        }
        if let Err(end) = flow.events(outlet) {
            return end;
        }
        if flow.check_silence(outlet) {
            // Nothing at all came back: told with its likely cause; look for the far side again.
            flow.abandon(outlet);
            return RunEnd::Unanswered;
        }
        if flow.unanswered() {
            outlet.error(
                "timeout",
                format!(
                    "no answer from {addr} ({}) after {UNANSWERED_ROUNDS} retransmissions; resolving the name again",
                    target.to
                ),
            );
            flow.abandon(outlet);
            return RunEnd::Unanswered;
        }
    }
}
