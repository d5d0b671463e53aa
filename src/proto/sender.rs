//! The sender's link state machine as the node's outlets, `UdpLink` and `pure-serve send` use it: the one in
//! `pure-link` (link/src/sender.rs), with `Instant` as its time, growable record queues, and its events kept in
//! order until the driver reads them with [`Sender::poll_event`] (names and payloads owned).
//!
//! Everything else is the core's own: `Sender` dereferences to it, so one implementation of the sender serves
//! the node and a device's firmware alike.

use std::collections::VecDeque;
use std::ops::{Deref, DerefMut};
use std::time::Instant;

use pure_link::queue::VecQueue;
use pure_link::sender::Event;
pub use pure_link::sender::{
    AppName, DEFAULT_DATAGRAM, DEFAULT_WINDOW, FlowStart, SenderConfig, SenderError, SenderStats,
};

/// The most apps one sender sends to, and listens on, at once.
pub const MAX_APPS: usize = 16;
/// How many sent packets' times are kept for round-trip samples (24 KiB with the sender). The sender before
/// `pure-link` kept up to 4,096 in a growing list; 1,024 covers a window of full datagrams of short records. With
/// more packets in flight (long records), an ECHO of a packet older than the last 1,024 sent gives no sample and
/// the estimate stays as it was; nothing else depends on them.
pub const SENT_TIMES: usize = 1024;

/// The core state machine with the node's choices.
pub type Core = pure_link::sender::Sender<Instant, VecQueue, MAX_APPS, MAX_APPS, SENT_TIMES>;

/// An [`Event`] kept until the driver reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SenderEvent {
    /// The node has stored every record of `app` up to and including `through`.
    Stored { app: String, through: u64 },
    /// The node refused the app (reason as in protocol.md 5); its records were dropped.
    Refused { app: String, reason: u8 },
    /// The node cannot store the app's records now; they stay queued and are sent again.
    NotStored { app: String, reason: u8 },
    /// The node holds records of this flow past anything this sender numbered.
    NodeAhead { app: String, node: u64, ours: u64 },
    /// The node's heard sequence is below where this sender started: records renumbered and sent again.
    NodeBehind { app: String, node: u64, ours: u64 },
    /// A downlink record for the program, handed over once, in sequence order.
    Down {
        app: String,
        seq: u64,
        payload: Vec<u8>,
    },
    /// The node never answered this run's LISTEN for `app` while it answered its other packets.
    DownlinkUnanswered { app: String },
}

impl From<Event<'_>> for SenderEvent {
    fn from(e: Event<'_>) -> Self {
        match e {
            Event::Stored { app, through } => SenderEvent::Stored {
                app: app.to_string(),
                through,
            },
            Event::Refused { app, reason } => SenderEvent::Refused {
                app: app.to_string(),
                reason,
            },
            Event::NotStored { app, reason } => SenderEvent::NotStored {
                app: app.to_string(),
                reason,
            },
            Event::NodeAhead { app, node, ours } => SenderEvent::NodeAhead {
                app: app.to_string(),
                node,
                ours,
            },
            Event::NodeBehind { app, node, ours } => SenderEvent::NodeBehind {
                app: app.to_string(),
                node,
                ours,
            },
            Event::Down { app, seq, payload } => SenderEvent::Down {
                app: app.to_string(),
                seq,
                payload: payload.to_vec(),
            },
            Event::DownlinkUnanswered { app } => SenderEvent::DownlinkUnanswered {
                app: app.to_string(),
            },
        }
    }
}

/// The core sender, with its events queued for [`Sender::poll_event`].
pub struct Sender {
    core: Box<Core>,
    events: VecDeque<SenderEvent>,
    /// A node datagram is decrypted in place: into this copy, so the caller's bytes stay as they were.
    scratch: Vec<u8>,
}

impl Deref for Sender {
    type Target = Core;
    fn deref(&self) -> &Core {
        &self.core
    }
}

impl DerefMut for Sender {
    fn deref_mut(&mut self) -> &mut Core {
        &mut self.core
    }
}

impl Sender {
    /// Makes a sender for one run. Costs one X25519.
    pub fn new(config: SenderConfig) -> Result<Self, SenderError> {
        Ok(Sender {
            core: Box::new(Core::new(config)?),
            events: VecDeque::new(),
            scratch: Vec::new(),
        })
    }

    /// Queues one record for `app`.
    pub fn queue(&mut self, app: &str, payload: Vec<u8>) -> Result<(), SenderError> {
        self.core.queue(app, &payload)
    }

    /// Queues one record for `app`, copied from `record`.
    pub fn queue_slice(&mut self, app: &str, record: &[u8]) -> Result<(), SenderError> {
        self.core.queue(app, record)
    }

    /// The RTO passed: send everything unacknowledged again (go-back-N) with a doubled RTO.
    pub fn handle_timeout(&mut self, now: Instant) {
        let events = &mut self.events;
        self.core
            .handle_timeout(now, &mut |e| events.push_back(e.into()));
    }

    /// Takes a datagram from the node. Anything that does not authenticate is ignored and counted.
    pub fn handle_datagram(&mut self, now: Instant, datagram: &[u8]) {
        self.scratch.clear();
        self.scratch.extend_from_slice(datagram);
        let events = &mut self.events;
        self.core
            .handle_datagram(now, &mut self.scratch, &mut |e| events.push_back(e.into()));
    }

    pub fn poll_event(&mut self) -> Option<SenderEvent> {
        self.events.pop_front()
    }
}
