//! The device side of a link: [`UdpLink`] drives a [`Sender`] state machine over a real UDP socket.
//!
//! A program on a device makes a link with its key and the node's public key and address, queues records, and
//! calls [`UdpLink::deliver`] (or [`UdpLink::drive`] in its own loop). A device that persists its next sequence per
//! app opens its flows with [`FlowStart::At`] and puts data in the first packet; otherwise the first packet is a
//! probe (docs/protocol.md 7).
//!
//! A fleet's nodes share one key (docs/scale-out.md): a link given several addresses ([`UdpLink::connect_any`])
//! moves to the next when the one in use answers nothing for [`MOVE_AFTER`] while something waits, and goes on
//! with the same run; the nodes' shared store keeps every record once whichever node stores it.
//!
//! The same link receives: [`UdpLink::listen`] on an app, then [`UdpLink::receive`] hands over the app's downlink
//! records (docs/downlink.md), each once and in order while the program keeps the sequence it was last handed.

use std::collections::VecDeque;
use std::io::{self, ErrorKind};
use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use crate::proto::crypto::{Identity, PublicKeyBytes};
use gso::{Batch, Sent};

mod gso;
pub use crate::proto::sender::{FlowStart, Sender, SenderConfig, SenderError, SenderEvent};

/// How a [`UdpLink::deliver`] ended.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Records still not acknowledged (0 on success).
    pub unacked: usize,
    pub refused: Vec<(String, u8)>,
    pub elapsed: Duration,
}

/// One downlink record handed to the program (docs/protocol.md 12.4). The program keeps `seq`, with what it did
/// with the record, as the app's downlink heard sequence, and gives it back to [`UdpLink::listen`] after a restart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DownRecord {
    pub app: String,
    pub seq: u64,
    pub payload: Vec<u8>,
}

/// How long a link waits on an address that answers nothing, while something waits for an answer, before it moves
/// to the next address it was given. A live node answers every packet within a turn and a sync (milliseconds), a
/// node that cannot store says NOT_STORED, and a sender's RTO resends three or four times in a second on a quiet
/// path: a second of silence means the node is gone, and a fleet's senders are then acked by another node within
/// 2 s of its death (BRIEF.md; tests/fleet.rs measures it). Moving costs nothing but one X25519 at the next node.
pub const MOVE_AFTER: Duration = Duration::from_secs(1);

pub struct UdpLink {
    socket: UdpSocket,
    sender: Sender,
    /// The node's addresses (several nodes of one fleet: docs/scale-out.md), the one in use first.
    addrs: Vec<SocketAddr>,
    current: usize,
    /// When a datagram last came from the address in use, or the link last began to wait for one.
    heard_or_waiting_since: Instant,
    was_idle: bool,
    /// Moves to another address so far.
    moves: u64,
    out: Vec<u8>,
    /// Full datagrams that go out together in one GSO send.
    batch: Batch,
    inbuf: Vec<u8>,
    events: Vec<SenderEvent>,
    /// Downlink records that arrived during [`UdpLink::deliver`], kept for the next [`UdpLink::receive`]: a record
    /// handed to nobody would be lost to the program (the node deletes it once the device's LISTEN says it had it).
    downs: VecDeque<DownRecord>,
}

impl UdpLink {
    /// Starts a new run towards the node at `to`. Costs one X25519.
    pub fn connect(
        identity: Identity,
        node_public: PublicKeyBytes,
        to: SocketAddr,
    ) -> io::Result<Self> {
        Self::with_config(SenderConfig::new(identity, node_public), to)
    }

    /// Starts a new run towards a node that has several addresses (the nodes of one fleet): the first is used
    /// until it answers nothing for [`MOVE_AFTER`] while something waits for an answer, then the next, and so on
    /// round. Costs one X25519.
    pub fn connect_any(
        identity: Identity,
        node_public: PublicKeyBytes,
        addrs: Vec<SocketAddr>,
    ) -> io::Result<Self> {
        Self::with_config_any(SenderConfig::new(identity, node_public), addrs)
    }

    pub fn with_config(config: SenderConfig, to: SocketAddr) -> io::Result<Self> {
        Self::with_config_any(config, vec![to])
    }

    /// [`UdpLink::with_config`] with several addresses, as [`UdpLink::connect_any`]. All of one family (the socket
    /// is bound to the first one's).
    pub fn with_config_any(config: SenderConfig, addrs: Vec<SocketAddr>) -> io::Result<Self> {
        let Some(&to) = addrs.first() else {
            return Err(io::Error::new(
                ErrorKind::InvalidInput,
                "no address to send to",
            ));
        };
        if addrs.iter().any(|a| a.is_ipv4() != to.is_ipv4()) {
            return Err(io::Error::new(
                ErrorKind::InvalidInput,
                "the node's addresses mix IPv4 and IPv6: give one family",
            ));
        }
        let local: SocketAddr = if to.is_ipv4() {
            "0.0.0.0:0".parse().expect("literal address")
        } else {
            "[::]:0".parse().expect("literal address")
        };
        let socket = UdpSocket::bind(local)?;
        socket.connect(to)?;
        let sender = Sender::new(config).map_err(|e| io::Error::new(ErrorKind::InvalidInput, e))?;
        Ok(UdpLink {
            socket,
            sender,
            addrs,
            current: 0,
            heard_or_waiting_since: Instant::now(),
            was_idle: true,
            moves: 0,
            out: Vec::with_capacity(1500),
            batch: Batch::new(true),
            inbuf: vec![0u8; 2048],
            events: Vec::new(),
            downs: VecDeque::new(),
        })
    }

    /// The state machine, to queue records and read progress.
    pub fn sender(&mut self) -> &mut Sender {
        &mut self.sender
    }

    /// Listens on `app`'s downlink from `heard`, the last sequence the program was handed (0 the first time): the
    /// next packet asks the node for what waits beyond it. Calling it again on the same app asks again at once
    /// (a device that stays awake does so at least once per the node's `--link-idle-ms`, 30 s by default, so its
    /// session stays live and pushed records reach it without waiting).
    pub fn listen(&mut self, app: &str, heard: u64) -> Result<(), SenderError> {
        self.sender.listen(app, heard)
    }

    /// Drives the link until downlink records arrived or `until` passed, and returns them in order (empty when
    /// none came by then). Every other event stays for [`UdpLink::take_events`].
    pub fn receive(&mut self, until: Instant) -> io::Result<Vec<DownRecord>> {
        loop {
            let mut other = Vec::new();
            for event in self.events.drain(..) {
                match event {
                    SenderEvent::Down { app, seq, payload } => {
                        self.downs.push_back(DownRecord { app, seq, payload })
                    }
                    e => other.push(e),
                }
            }
            self.events = other;
            if !self.downs.is_empty() || Instant::now() >= until {
                return Ok(self.downs.drain(..).collect());
            }
            self.drive(until)?;
        }
    }

    /// Events seen by [`UdpLink::drive`] since the last call.
    pub fn take_events(&mut self) -> Vec<SenderEvent> {
        std::mem::take(&mut self.events)
    }

    /// Asks for a socket receive buffer of `bytes` (the kernel caps it at `net.core.rmem_max` and doubles it for
    /// its bookkeeping): room for the DOWN datagrams a node of version 1.2 sends in flight
    /// ([`Sender::set_down_window`]).
    pub fn set_receive_buffer(&mut self, bytes: usize) -> io::Result<()> {
        socket2::SockRef::from(&self.socket).set_recv_buffer_size(bytes)
    }

    /// The node's address the link uses now.
    pub fn address(&self) -> SocketAddr {
        self.addrs[self.current]
    }

    /// How often the link moved to another of the node's addresses.
    pub fn moves(&self) -> u64 {
        self.moves
    }

    /// Moves to the next address if the one in use answered nothing for [`MOVE_AFTER`] while the link waited.
    fn move_if_silent(&mut self, now: Instant) -> io::Result<()> {
        let idle = self.sender.is_idle();
        if self.was_idle && !idle {
            self.heard_or_waiting_since = now;
        }
        self.was_idle = idle;
        if self.addrs.len() < 2
            || idle
            || now.saturating_duration_since(self.heard_or_waiting_since) < MOVE_AFTER
        {
            return Ok(());
        }
        self.current = (self.current + 1) % self.addrs.len();
        self.socket.connect(self.addrs[self.current])?;
        self.moves += 1;
        self.heard_or_waiting_since = now;
        self.sender.path_changed(now);
        Ok(())
    }

    /// One round: send what is due, wait for an answer until `until` at the latest, handle what came.
    pub fn drive(&mut self, until: Instant) -> io::Result<()> {
        let now = Instant::now();
        self.move_if_silent(now)?;
        self.sender.handle_timeout(now);
        self.transmit(now)?;
        let wake = self.sender.poll_timeout().map_or(until, |t| t.min(until));
        let wait = wake
            .saturating_duration_since(Instant::now())
            .max(Duration::from_micros(100));
        self.socket.set_read_timeout(Some(wait))?;
        let mut got_one = false;
        loop {
            match self.socket.recv(&mut self.inbuf) {
                Ok(n) => {
                    let at = Instant::now();
                    self.heard_or_waiting_since = at;
                    self.sender.handle_datagram(at, &self.inbuf[..n]);
                    if !got_one {
                        got_one = true;
                        // Drain whatever else already arrived without waiting again.
                        self.socket.set_nonblocking(true)?;
                    }
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => break,
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::ConnectionRefused | ErrorKind::Interrupted
                    ) =>
                {
                    if got_one {
                        continue;
                    }
                    break;
                }
                Err(e) => return Err(e),
            }
        }
        if got_one {
            self.socket.set_nonblocking(false)?;
        }
        while let Some(e) = self.sender.poll_event() {
            self.events.push(e);
        }
        Ok(())
    }

    /// Sends every datagram the state machine has now: full ones together (GSO), the others alone. A datagram
    /// within 1/16 of full is padded to full, so records up to that long (75 bytes in a datagram of 1,200) fill
    /// every datagram of a run but its last, and at most that share of a run is padding (docs/protocol.md 7.5).
    /// A full send buffer or a refusing port ends the round; the RTO resends what was lost.
    fn transmit(&mut self, now: Instant) -> io::Result<()> {
        let full = self.sender.datagram_size();
        let slack = self.batch.is_on().then_some(full / 16);
        while self.sender.poll_transmit_padded(now, &mut self.out, slack) {
            let sent = if self.out.len() == full && self.batch.is_on() {
                if !self.batch.push_full(&self.out) {
                    continue;
                }
                self.batch.send(&self.socket)?
            } else if self.batch.takes_last(self.out.len()) {
                self.batch.push_last(&self.out);
                self.batch.send(&self.socket)?
            } else {
                match self.batch.send(&self.socket)? {
                    Sent::Go => gso::send_one(&self.socket, &self.out)?,
                    Sent::Stop => Sent::Stop,
                }
            };
            if sent == Sent::Stop {
                return Ok(());
            }
        }
        self.batch.send(&self.socket)?;
        Ok(())
    }

    /// Drives until every queued record is acknowledged (or refused), or `timeout` passes. On a listening link it
    /// also waits until every LISTEN is answered and the node says nothing more waits; the downlink records that
    /// came meanwhile are kept for [`UdpLink::receive`].
    pub fn deliver(&mut self, timeout: Option<Duration>) -> io::Result<Outcome> {
        let mut downs = VecDeque::new();
        let outcome = self.deliver_with(timeout, |e| {
            if let SenderEvent::Down { app, seq, payload } = e {
                downs.push_back(DownRecord {
                    app: app.clone(),
                    seq: *seq,
                    payload: payload.clone(),
                });
            }
        });
        self.downs.append(&mut downs);
        outcome
    }

    /// Like [`UdpLink::deliver`], calling `on_event` for each event as it happens; downlink records are handed to
    /// `on_event` only.
    pub fn deliver_with(
        &mut self,
        timeout: Option<Duration>,
        mut on_event: impl FnMut(&SenderEvent),
    ) -> io::Result<Outcome> {
        let start = Instant::now();
        let deadline = timeout.map(|t| start + t);
        let mut refused = Vec::new();
        while !self.sender.is_idle() {
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                break;
            }
            let until = deadline
                .unwrap_or(now + Duration::from_secs(1))
                .min(now + Duration::from_secs(1));
            self.drive(until)?;
            for e in self.take_events() {
                if let SenderEvent::Refused { app, reason } = &e {
                    refused.push((app.clone(), *reason));
                }
                on_event(&e);
            }
        }
        Ok(Outcome {
            unacked: self.sender.unacked_total(),
            refused,
            elapsed: start.elapsed(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The datagrams of one round to a receiver that does not coalesce (no UDP GRO): every one but the last of a
    /// run full, each its own datagram, as many as the state machine built, and sent in runs where the kernel
    /// has GSO.
    #[test]
    fn full_datagrams_go_out_in_runs_and_arrive_as_datagrams_of_one_size() {
        let receiver = UdpSocket::bind("127.0.0.1:0").unwrap();
        receiver
            .set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let node = Identity::generate();
        let mut link = UdpLink::connect(
            Identity::generate(),
            *node.public(),
            receiver.local_addr().unwrap(),
        )
        .unwrap();
        // About 60 datagrams of 1,200 bytes in flight: within a default receive buffer.
        link.sender().set_window(12_000);
        link.sender().open_flow("main", FlowStart::At(1)).unwrap();
        for i in 0..30_000u32 {
            link.sender()
                .queue("main", format!("{i:05}").into_bytes())
                .unwrap();
        }
        link.transmit(Instant::now()).unwrap();
        let built = link.sender().stats().packets_sent;
        let full = link.sender().datagram_size();
        let mut sizes = Vec::new();
        let mut buf = [0u8; 65_536];
        while let Ok(n) = receiver.recv(&mut buf) {
            sizes.push(n);
        }
        assert_eq!(
            sizes.len() as u64,
            built,
            "every datagram built arrived, one by one"
        );
        assert!(built > 40, "{built}");
        assert!(
            sizes[..sizes.len() - 1].iter().all(|&n| n == full),
            "{sizes:?}"
        );
        assert!(*sizes.last().unwrap() <= full);
        if link.batch.is_on() {
            assert!(
                link.batch.runs >= built / 64,
                "runs {} for {built}",
                link.batch.runs
            );
        }
    }
}
