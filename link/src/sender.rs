//! The sender's link state machine, sans-IO and without a heap (docs/protocol.md 7 and 12): one implementation
//! for the node's outlets, `UdpLink`, `pure-serve send` and a device's firmware.
//!
//! Order of calls for a driver: [`Sender::queue`] records; then loop: send every datagram
//! [`Sender::poll_transmit`] yields; wait for a datagram or [`Sender::poll_timeout`]; feed it to
//! [`Sender::handle_datagram`] or call [`Sender::handle_timeout`], each with a sink that takes the [`Event`]s
//! they cause (acknowledgements, downlink records).
//!
//! What it holds is sized by the caller: the time `T` ([`crate::time::Millis`] on a device), each flow's queue
//! `Q` (a [`crate::queue::RecordQueue`]: a fixed buffer, an outbox in flash, or a `Vec`), and as const
//! parameters the most flows (apps sent to) and listens (apps whose downlink is wanted) at once and how many
//! sent packets' times are kept for round-trip samples.

use core::time::Duration;

use thiserror::Error;

use crate::buf::Out;
use crate::crypto::{self, Identity, PacketKey, PublicKeyBytes};
use crate::queue::RecordQueue;
use crate::time::Time;
use crate::wire::{self, NodeFrame, NodeFrames, NodeHeader, RecordFormat};

/// Sender packets are this large by default: fits nearly every path (docs/protocol.md 4).
pub const DEFAULT_DATAGRAM: usize = 1200;
/// Records in flight per flow before the sender waits for acks (docs/protocol.md 7).
pub const DEFAULT_WINDOW: u64 = 16_384;
/// RTO before any round-trip sample, and its bounds (docs/protocol.md 7).
const INITIAL_RTO: Duration = Duration::from_millis(250);
/// A node's commit can stall for tens of milliseconds (an fsync on a busy disk); an RTO below that resends a
/// whole window for nothing (research/001 saw 10–45 ms stalls).
const MIN_RTO: Duration = Duration::from_millis(50);
const MAX_RTO: Duration = Duration::from_secs(2);
/// A cookie is echoed for at most this long after it arrived: a node accepts it for at least its cookie period,
/// 120 s (docs/protocol.md 4.4).
const COOKIE_USE: Duration = Duration::from_secs(120);
#[derive(Debug, Error, PartialEq, Eq)]
pub enum SenderError {
    #[error("an app name must be 1–32 characters of a-z 0-9 _ -")]
    BadApp,
    #[error(
        "a record of {len} bytes is too long: at most {max} bytes here (what one datagram carries, or a page of \
         the outbox holds)"
    )]
    TooLarge { len: usize, max: usize },
    #[error("the node's public key is a low-order point")]
    BadNodeKey,
    #[error("app {0} was refused by the node")]
    Refused(AppName),
    #[error(
        "the queue of app {0} is full: queue the record again once the node has acknowledged some"
    )]
    QueueFull(AppName),
    #[error("this sender already sends to or listens on as many apps as it was made for ({0})")]
    TooManyApps(usize),
    #[error("no flow to app {0} is open: open it with its queue (open_flow_with) before queueing")]
    NoFlow(AppName),
}

/// An app's name, 1–32 bytes of `[a-z0-9_-]`, held without a heap.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct AppName {
    len: u8,
    bytes: [u8; wire::MAX_APP_LEN],
}

impl AppName {
    /// The name, if `name` is a valid app name (docs/protocol.md 5).
    pub fn new(name: &str) -> Result<Self, SenderError> {
        Self::from_bytes(name.as_bytes()).ok_or(SenderError::BadApp)
    }
    fn from_bytes(name: &[u8]) -> Option<Self> {
        if !wire::valid_app_name(name) {
            return None;
        }
        let mut bytes = [0u8; wire::MAX_APP_LEN];
        bytes[..name.len()].copy_from_slice(name);
        Some(AppName {
            len: name.len() as u8,
            bytes,
        })
    }
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
    pub fn as_str(&self) -> &str {
        // Valid app names are ASCII.
        core::str::from_utf8(self.as_bytes()).unwrap_or("")
    }
}

impl PartialEq<str> for AppName {
    fn eq(&self, other: &str) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl core::fmt::Display for AppName {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl core::fmt::Debug for AppName {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        core::fmt::Debug::fmt(self.as_str(), f)
    }
}

/// What the sender tells its program, handed to the sink of [`Sender::handle_datagram`] or
/// [`Sender::handle_timeout`] as it happens; borrowed names and payloads, so nothing is allocated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event<'a> {
    /// The node has stored every record of `app` up to and including `through`.
    Stored { app: &'a str, through: u64 },
    /// The node refused the app (reason as in protocol.md 5); its records were dropped.
    Refused { app: &'a str, reason: u8 },
    /// The node cannot store the app's records now (NOT_STORED, reason as in protocol.md 5): they stay queued
    /// and are sent again. Said once until the node stores something of the flow again.
    NotStored { app: &'a str, reason: u8 },
    /// The node holds records of this flow past anything this sender numbered (it lost its counter). What was
    /// queued is released (the node counted it as duplicates) and numbering continues after `node`.
    NodeAhead { app: &'a str, node: u64, ours: u64 },
    /// The node's heard sequence is below where this sender started (e.g. the node lost its store): the
    /// unacknowledged records are renumbered from `node + 1` and sent again (docs/protocol.md 7, Acks).
    NodeBehind { app: &'a str, node: u64, ours: u64 },
    /// A downlink record for the program (docs/protocol.md 12.4): handed over once, in sequence order. The program
    /// keeps `seq` as the flow's downlink heard sequence, with what it did with the record, and gives it back to
    /// [`Sender::listen`] after a restart.
    Down {
        app: &'a str,
        seq: u64,
        payload: &'a [u8],
    },
    /// The node never answered this run's LISTEN for `app` while it answered its other packets: a node without
    /// downlink (docs/protocol.md 12.6). Said once; uplink goes on.
    DownlinkUnanswered { app: &'a str },
}

/// A downlink flow this sender listens on (docs/protocol.md 12.4).
struct Listen<T> {
    app: AppName,
    /// The program's downlink heard sequence: the last record it was handed.
    heard: u64,
    /// `last` of the latest DOWN frame: more waits when it is above `heard`.
    node_last: u64,
    /// A DOWN frame of this flow came in this run: the node knows LISTEN, so it may travel beside DATA.
    confirmed: bool,
    /// The packet number of the packet whose LISTEN waits for its answer.
    outstanding: Option<u64>,
    /// The `heard` the last LISTEN sent carried: when `heard` grows past it, a LISTEN acknowledges at once.
    sent_heard: Option<u64>,
    /// The program (or an RTO) asked for a LISTEN.
    want: bool,
    /// An answer handed nothing over and still said more waits: the next LISTEN waits until then.
    hold_until: Option<T>,
    /// RTO resends of an unconfirmed LISTEN, for [`Event::DownlinkUnanswered`].
    resends: u32,
    told_unanswered: bool,
    refused: bool,
}

impl<T: Time> Listen<T> {
    fn due(&self, now: T) -> bool {
        // The hold delays only asking for more; an acknowledgement (heard grew) goes at once.
        !self.refused
            && self.outstanding.is_none()
            && (self.want
                || self.sent_heard != Some(self.heard)
                || (self.node_last > self.heard && self.hold_until.is_none_or(|t| now >= t)))
    }
}

/// Resends of an unconfirmed LISTEN, with the run's other packets answered, before the sender says the node has
/// no downlink (docs/protocol.md 12.6).
const LISTEN_UNANSWERED_AFTER: u32 = 3;

/// Where a flow's numbering starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlowStart {
    /// Ask the node with a probe and number from its heard sequence + 1.
    Probe,
    /// The device knows: its next record is this sequence (≥ 1). Data goes in the first packet.
    At(u64),
}

struct Flow<Q> {
    app: AppName,
    /// DATA frames for a device's own records, FORWARD frames for a node's outlet (protocol.md 5.4).
    format: RecordFormat,
    /// False until the node told us the heard sequence (FlowStart::Probe).
    synced: bool,
    probe_outstanding: bool,
    /// Highest sequence the node has acknowledged.
    acked: u64,
    /// Records `acked + 1 ..= acked + records.len()`.
    records: Q,
    /// Next sequence to put in a packet.
    cursor: u64,
    /// Packet number of the first packet that carried record `acked + 1` since `acked` last changed. An ACK
    /// below `acked` is only believed if its ECHO shows the node had received that packet: an older ACK that
    /// arrives late (or is replayed) is not mistaken for a node that went back (docs/protocol.md 7.3).
    base_sent_pn: Option<u64>,
    /// The ECHO of the node packet that last made this flow renumber. ACKs of this flow in node packets with a
    /// smaller ECHO (or none) were built before the node went back and are ignored: they speak of records the
    /// node no longer has (docs/protocol.md 7.3).
    floor_echo: Option<u64>,
    refused: bool,
    /// The node said it cannot store this flow now (NOT_STORED), and has acknowledged nothing of it since.
    not_stored: bool,
}

impl<Q: RecordQueue> Flow<Q> {
    fn in_flight(&self) -> u64 {
        self.cursor - self.acked - 1
    }
    fn last_seq(&self) -> u64 {
        self.acked + self.records.len() as u64
    }
    fn has_unsent(&self) -> bool {
        self.synced && !self.refused && self.cursor <= self.last_seq()
    }
}

/// Room a DATA frame header may take: the count is reserved at 3 varint bytes (up to 2^21 - 1 records, far more
/// than a datagram holds), so the frame's size is known before its records are counted.
fn frame_overhead(app: &[u8], first_seq: u64) -> usize {
    wire::data_header_len(app, first_seq, 1 << 14)
}

/// RFC 6298's estimator: the sender's, and the node's for a validated session's downlink (docs/protocol.md 13.3).
#[derive(Debug, Default, Clone, Copy)]
pub struct Rtt {
    srtt: Option<Duration>,
    rttvar: Duration,
}

impl Rtt {
    pub fn sample(&mut self, rtt: Duration) {
        match self.srtt {
            None => {
                self.srtt = Some(rtt);
                self.rttvar = rtt / 2;
            }
            Some(srtt) => {
                let diff = srtt.abs_diff(rtt);
                self.rttvar = (self.rttvar * 3 + diff) / 4;
                self.srtt = Some((srtt * 7 + rtt) / 8);
            }
        }
    }
    fn rto(&self) -> Duration {
        self.rto_within(INITIAL_RTO, MIN_RTO, MAX_RTO)
    }

    /// `srtt + max(4 × rttvar, 2 ms)` clamped to `min..=max`; `initial` before any sample.
    pub fn rto_within(&self, initial: Duration, min: Duration, max: Duration) -> Duration {
        match self.srtt {
            None => initial,
            Some(srtt) => (srtt + (self.rttvar * 4).max(Duration::from_millis(2))).clamp(min, max),
        }
    }

    pub fn srtt(&self) -> Option<Duration> {
        self.srtt
    }
}

pub struct SenderConfig {
    pub identity: Identity,
    pub node_public: PublicKeyBytes,
    /// Random per run (docs/protocol.md 2): never the same twice for one identity, or the run's keys and packet
    /// numbers repeat. On a device, from its hardware random generator (docs/devices.md).
    pub run_id: u64,
    pub max_datagram: usize,
    pub window: u64,
    /// A forwarding node's outlet: one record too large for `max_datagram` with its origin may go alone in a
    /// datagram of up to [`wire::MAX_ACCEPTED_DATAGRAM`] (protocol.md 5.4). Devices leave this off.
    pub allow_oversize: bool,
}

impl SenderConfig {
    /// A run whose id comes from the operating system's random generator.
    #[cfg(feature = "std")]
    pub fn new(identity: Identity, node_public: PublicKeyBytes) -> Self {
        Self::with_run_id(
            identity,
            node_public,
            u64::from_be_bytes(crypto::random_array()),
        )
    }

    /// A run with the id the caller drew (random, docs/protocol.md 2).
    pub fn with_run_id(identity: Identity, node_public: PublicKeyBytes, run_id: u64) -> Self {
        SenderConfig {
            identity,
            node_public,
            run_id,
            max_datagram: DEFAULT_DATAGRAM,
            window: DEFAULT_WINDOW,
            allow_oversize: false,
        }
    }
}

/// The sender of one run: `T` its time, `Q` each flow's record queue, at most `FLOWS` apps sent to and `LISTENS`
/// apps listened on, and the times of the last `SENT` packets kept for round-trip samples (a packet whose time is
/// gone gives no sample; nothing else depends on them).
pub struct Sender<T, Q, const FLOWS: usize, const LISTENS: usize, const SENT: usize> {
    shared: [u8; 32],
    public: PublicKeyBytes,
    node_public: PublicKeyBytes,
    key_id: u32,
    run_id: u64,
    k_s2n: PacketKey,
    /// Keys of the latest node epoch that authenticated.
    n2s: Option<(u64, PacketKey)>,
    next_pn: u64,
    max_datagram: usize,
    allow_oversize: bool,
    window: u64,
    /// The same bound in bytes (`set_window_bytes`).
    window_bytes: usize,
    flows: heapless::Vec<Flow<Q>, FLOWS>,
    /// Send time per packet number not yet answered, oldest first; an entry is removed once an ECHO reaches it.
    sent_times: heapless::Deque<(u64, T), SENT>,
    /// The largest ECHO seen from the node in this run: only a larger one may give a round-trip sample, so a
    /// late or replayed node packet (or a node answering a replay of an old packet of ours) gives none.
    largest_echo: Option<u64>,
    rtt: Rtt,
    rto_deadline: Option<T>,
    backoff: u32,
    last_progress: Option<T>,
    /// Round-robin start so one busy flow does not starve the others.
    next_flow: usize,
    /// The node's cookie and when it came (protocol.md 4.4): echoed in front of every packet until the node answers
    /// one with an authenticated packet (it then has our session and needs no X25519) or [`COOKIE_USE`] passes.
    cookie: Option<([u8; wire::COOKIE_LEN], T)>,
    /// A COOKIE answering a packet numbered at least this resends at once; one for an older packet (sent before
    /// the last such resend) does not, so a burst of COOKIEs for one window resends it once.
    cookie_resend_from: u64,
    /// Downlink flows listened on (docs/protocol.md 12), and how large a packet carrying LISTEN is made.
    listens: heapless::Vec<Listen<T>, LISTENS>,
    listen_room: usize,
    wide: WideState,
    stats: SenderStats,
}

/// Version 1.2's state of a run (docs/protocol.md 13.2).
#[derive(Default)]
struct WideState {
    /// The `window` a RESPONSE says; 0: this sender does not offer 1.2.
    window: u64,
    /// Offers made in the run (at most [`MAX_OFFERS`]), the packet of the one not yet answered, whether the node
    /// answered one without a CHALLENGE (it will not validate this run), and whether the next LISTEN goes without
    /// one (an offer's RTO passed: the node may be 1.1).
    offers: u8,
    offer_pn: Option<u64>,
    declined: bool,
    skip_offer: bool,
    /// The latest CHALLENGE's token.
    token: Option<[u8; wire::TOKEN_LEN]>,
    /// A new token came: the next LISTEN is padded to the room (the address may not be validated yet).
    pad: bool,
    /// A node datagram with DOWN records came: acknowledge it with a LISTEN at once.
    ack: bool,
}

/// A sender offers 1.2 at most this many times a run (docs/protocol.md 13.2).
const MAX_OFFERS: u8 = 2;

#[derive(Debug, Default, Clone)]
pub struct SenderStats {
    pub packets_sent: u64,
    pub retransmit_rounds: u64,
    pub packets_received: u64,
    pub packets_rejected: u64,
    /// COOKIE packets taken (protocol.md 4.4).
    pub cookies_received: u64,
    /// Datagrams left unsent because a flow's queue could not read its records (a queue in flash).
    pub queue_read_failures: u64,
    /// ACK frames ignored because they acknowledged past the largest sequence a node stores (2^63 − 1,
    /// protocol.md 7.3): no node sends one.
    pub acks_past_stored_range: u64,
}

impl<T: Time, Q: RecordQueue, const FLOWS: usize, const LISTENS: usize, const SENT: usize>
    Sender<T, Q, FLOWS, LISTENS, SENT>
{
    /// Makes a sender for one run. Costs one X25519.
    pub fn new(config: SenderConfig) -> Result<Self, SenderError> {
        let shared = config
            .identity
            .shared_secret(&config.node_public)
            .map_err(|_| SenderError::BadNodeKey)?;
        let public = *config.identity.public();
        Ok(Sender {
            k_s2n: crypto::sender_to_node_key(&shared, config.run_id, &public, &config.node_public),
            shared,
            key_id: crypto::key_id(&public),
            public,
            node_public: config.node_public,
            run_id: config.run_id,
            n2s: None,
            next_pn: 0,
            max_datagram: config
                .max_datagram
                .clamp(wire::MIN_SENDER_DATAGRAM, wire::MAX_DATAGRAM),
            allow_oversize: config.allow_oversize,
            window: config.window.max(1),
            window_bytes: usize::MAX,
            flows: heapless::Vec::new(),
            sent_times: heapless::Deque::new(),
            largest_echo: None,
            rtt: Rtt {
                srtt: None,
                rttvar: Duration::ZERO,
            },
            rto_deadline: None,
            backoff: 0,
            last_progress: None,
            next_flow: 0,
            cookie: None,
            cookie_resend_from: 0,
            listens: heapless::Vec::new(),
            listen_room: config
                .max_datagram
                .clamp(wire::MIN_SENDER_DATAGRAM, wire::MAX_DATAGRAM),
            wide: WideState::default(),
            stats: SenderStats::default(),
        })
    }

    pub fn run_id(&self) -> u64 {
        self.run_id
    }
    /// Changes how many records a flow may have sent and unacknowledged (`SenderConfig::window`); records
    /// already in flight stay so.
    pub fn set_window(&mut self, window: u64) {
        self.window = window.max(1);
    }

    /// Bounds a flow's records in flight in bytes too (each with its length varint; no bound unless set), so a
    /// window of many records stays a few megabytes when the records are long. At least one datagram's worth.
    pub fn set_window_bytes(&mut self, bytes: usize) {
        self.window_bytes = bytes.max(wire::MAX_ACCEPTED_DATAGRAM);
    }

    pub fn stats(&self) -> &SenderStats {
        &self.stats
    }
    pub fn srtt(&self) -> Option<Duration> {
        self.rtt.srtt
    }
    /// When an ack last released records (or answered a probe).
    pub fn last_progress(&self) -> Option<T> {
        self.last_progress
    }

    fn flow_index(&self, app: &str) -> Option<usize> {
        self.flows.iter().position(|f| f.app == *app)
    }

    /// Opens a flow explicitly; [`Sender::queue`] opens one with [`FlowStart::Probe`] if there is none.
    pub fn open_flow(&mut self, app: &str, start: FlowStart) -> Result<(), SenderError>
    where
        Q: Default,
    {
        self.open_flow_as(app, start, RecordFormat::Plain)
    }

    /// Opens a flow whose records go in frames of `format`: [`RecordFormat::Forwarded`] for a node forwarding
    /// forwarded records (each queued record then must be one, protocol.md 5.4).
    pub fn open_flow_as(
        &mut self,
        app: &str,
        start: FlowStart,
        format: RecordFormat,
    ) -> Result<(), SenderError>
    where
        Q: Default,
    {
        self.open_flow_with(app, start, format, Q::default())
    }

    /// Opens a flow whose records are kept in `records` (a device's outbox, say): records already in it are the
    /// flow's next ones, numbered from `start` ([`FlowStart::At`] of the oldest; with [`FlowStart::Probe`], from
    /// the node's heard sequence + 1). A flow already open keeps its own queue.
    pub fn open_flow_with(
        &mut self,
        app: &str,
        start: FlowStart,
        format: RecordFormat,
        records: Q,
    ) -> Result<(), SenderError> {
        let name = AppName::new(app)?;
        if self.flow_index(app).is_some() {
            return Ok(());
        }
        let (synced, acked) = match start {
            FlowStart::Probe => (false, 0),
            FlowStart::At(next) => (true, next.max(1) - 1),
        };
        self.flows
            .push(Flow {
                app: name,
                format,
                synced,
                probe_outstanding: false,
                acked,
                records,
                cursor: acked + 1,
                base_sent_pn: None,
                floor_echo: None,
                refused: false,
                not_stored: false,
            })
            .map_err(|_| SenderError::TooManyApps(FLOWS))?;
        Ok(())
    }

    /// Largest payload that fits in one datagram for `app`, also when the datagram carries a cookie (protocol.md
    /// 4.4), so that every queued record can be sent whatever the node asks.
    pub fn max_payload(&self, app: &str) -> usize {
        let fixed = wire::COOKIE_PREFIX_LEN
            + wire::SENDER_HEADER_LEN
            + wire::TAG_LEN
            + frame_overhead(app.as_bytes(), u64::MAX);
        let room = self.hard_max_datagram() - fixed;
        // The record's own length varint takes up to 2 bytes at these sizes.
        room.saturating_sub(2)
    }

    /// Queues one record for `app`, copied from `record`.
    pub fn queue(&mut self, app: &str, record: &[u8]) -> Result<(), SenderError> {
        let i = self.queue_flow(app, record.len())?;
        let f = &mut self.flows[i];
        f.records
            .push_slice(record)
            .map_err(|_| SenderError::QueueFull(f.app))
    }

    /// Queues each line of `block` ended by `\n` (without it) as a record for `app`, at most `max` of them, each
    /// copied once into the flow's queue: the flow is found once per block, and nothing is allocated per record.
    /// What follows the last `\n` taken is left for the caller (a line the block's end cut). Returns the bytes of
    /// `block` consumed (through the last `\n` taken) and the lines queued; on a line that cannot be queued, the
    /// lines queued before it and why (those stay queued).
    pub fn queue_lines(
        &mut self,
        app: &str,
        block: &[u8],
        max: usize,
    ) -> Result<(usize, usize), (usize, SenderError)> {
        let i = self.queue_flow(app, 0).map_err(|e| (0, e))?;
        let most = self
            .max_payload(app)
            .min(self.flows[i].records.largest_record());
        let name = self.flows[i].app;
        let records = &mut self.flows[i].records;
        let (mut pos, mut n) = (0, 0);
        while n < max {
            let Some(k) = memchr::memchr(b'\n', &block[pos..]) else {
                break;
            };
            if k > most {
                return Err((n, SenderError::TooLarge { len: k, max: most }));
            }
            records
                .push_slice(&block[pos..pos + k])
                .map_err(|_| (n, SenderError::QueueFull(name)))?;
            pos += k + 1;
            n += 1;
        }
        Ok((pos, n))
    }

    /// Queues one forwarded record for `app` (protocol.md 5.4), written in place: `origin`, `origin_seq`, then
    /// `payload`. For a forwarding node's outlet, whose flow was opened with [`RecordFormat::Forwarded`].
    pub fn queue_forwarded(
        &mut self,
        app: &str,
        origin: &[u8],
        origin_seq: u64,
        payload: &[u8],
    ) -> Result<usize, SenderError> {
        let len = wire::Forwarded::len(origin, origin_seq, payload.len());
        let i = self.queue_flow(app, len)?;
        let f = &mut self.flows[i];
        f.records
            .push_with(len, |b| {
                wire::Forwarded::put_bare(b, origin, origin_seq, payload)
            })
            .map_err(|_| SenderError::QueueFull(f.app))?;
        Ok(len)
    }

    /// The largest record [`Sender::queue`] takes for `app`: what a datagram carries ([`Sender::max_payload`]) and
    /// what its flow's queue can ever hold (an outbox in flash: a page's room).
    pub fn max_record(&self, app: &str) -> usize {
        let most = self.max_payload(app);
        self.flow_index(app)
            .map_or(most, |i| most.min(self.flows[i].records.largest_record()))
    }

    /// The flow a record of `len` bytes for `app` goes to, opened with a probe if there is none; or why it cannot.
    fn queue_flow(&mut self, app: &str, len: usize) -> Result<usize, SenderError> {
        let max = self.max_payload(app);
        if len > max {
            return Err(SenderError::TooLarge { len, max });
        }
        let i = match self.flow_index(app) {
            Some(i) => i,
            None => {
                let name = AppName::new(app)?;
                let records = Q::for_new_flow().ok_or(SenderError::NoFlow(name))?;
                self.open_flow_with(app, FlowStart::Probe, RecordFormat::Plain, records)?;
                self.flows.len() - 1
            }
        };
        if self.flows[i].refused {
            return Err(SenderError::Refused(self.flows[i].app));
        }
        let max = max.min(self.flows[i].records.largest_record());
        if len > max {
            return Err(SenderError::TooLarge { len, max });
        }
        Ok(i)
    }

    fn hard_max_datagram(&self) -> usize {
        if self.allow_oversize {
            wire::MAX_ACCEPTED_DATAGRAM
        } else {
            self.max_datagram
        }
    }

    /// The sequence the next record queued for `app` will get, once the flow is synced (after the probe's
    /// answer, or from the start for [`FlowStart::At`]).
    pub fn next_seq(&self, app: &str) -> Option<u64> {
        let f = &self.flows[self.flow_index(app)?];
        f.synced.then(|| f.last_seq() + 1)
    }

    /// The queue of `app`'s flow, once the flow is open: a device's outbox ([`crate::outbox::Outbox`]), to keep
    /// its downlink heard sequence there after an [`Event::Down`], or to read where its numbering is.
    pub fn queue_mut(&mut self, app: &str) -> Option<&mut Q> {
        let i = self.flow_index(app)?;
        Some(&mut self.flows[i].records)
    }

    /// Records of `app` queued and not yet acknowledged.
    pub fn unacked(&self, app: &str) -> usize {
        self.flow_index(app)
            .map_or(0, |i| self.flows[i].records.len())
    }

    /// Records of all flows not yet acknowledged (refused flows hold none).
    pub fn unacked_total(&self) -> usize {
        self.flows.iter().map(|f| f.records.len()).sum()
    }

    /// The bytes of every record not yet acknowledged (each with its length varint), all flows together.
    pub fn unacked_bytes(&self) -> usize {
        self.flows.iter().map(|f| f.records.queued_bytes()).sum()
    }

    /// The highest sequence of `app` the node acknowledged, once known.
    pub fn stored_through(&self, app: &str) -> Option<u64> {
        let f = &self.flows[self.flow_index(app)?];
        f.synced.then_some(f.acked)
    }

    /// Listens on `app`'s downlink (docs/protocol.md 12): `heard` is the last downlink sequence the program was
    /// handed (kept by the program; 0 the first time). Records above it arrive as [`Event::Down`]. The first
    /// LISTEN goes in the next [`Sender::poll_transmit`].
    pub fn listen(&mut self, app: &str, heard: u64) -> Result<(), SenderError> {
        let name = AppName::new(app)?;
        if let Some(l) = self.listens.iter_mut().find(|l| l.app == *app) {
            l.want = true;
            return Ok(());
        }
        self.listens
            .push(Listen {
                app: name,
                heard,
                node_last: 0,
                confirmed: false,
                outstanding: None,
                sent_heard: None,
                want: true,
                hold_until: None,
                resends: 0,
                told_unanswered: false,
                refused: false,
            })
            .map_err(|_| SenderError::TooManyApps(LISTENS))?;
        Ok(())
    }

    /// Asks the node again for `app`'s downlink (a device that stays awake does this at least once per the node's
    /// `--link-idle-ms`, so its session stays live and pushed records reach it at once).
    pub fn listen_now(&mut self, app: &str) {
        if let Some(l) = self.listens.iter_mut().find(|l| l.app == *app) {
            l.want = true;
        }
    }

    /// How large a packet that carries LISTEN is made (padding): the room the node's answer gets for records
    /// (docs/protocol.md 12.4). Default: the datagram size.
    pub fn set_listen_room(&mut self, bytes: usize) {
        self.listen_room = bytes.clamp(wire::MIN_SENDER_DATAGRAM, self.max_datagram);
    }

    /// Offers the node version 1.2 (docs/protocol.md 13): once it validated this device's address it may send DOWN
    /// records beyond what the device sent, at most `bytes` of datagrams in flight beyond what the program was
    /// handed. 0 (the default) offers nothing: section 12's room.
    pub fn set_down_window(&mut self, bytes: u64) {
        self.wide.window = bytes;
    }

    /// Whether the node sent this run a CHALLENGE (it speaks 1.2 and will validate the address it was sent to).
    pub fn wide(&self) -> bool {
        self.wide.token.is_some()
    }

    /// The downlink heard sequence of `app`: the last record handed to the program.
    pub fn downlink_heard(&self, app: &str) -> Option<u64> {
        self.listens.iter().find(|l| l.app == *app).map(|l| l.heard)
    }

    /// True when nothing waits for the node: every flow synced and acknowledged, or refused; every LISTEN answered
    /// and acknowledging what was handed over, and the node saying nothing more waits.
    pub fn is_idle(&self) -> bool {
        self.flows
            .iter()
            .all(|f| f.refused || (f.synced && f.records.is_empty()))
            && self.listens.iter().all(|l| {
                l.refused
                    || (l.outstanding.is_none()
                        && !l.want
                        && !self.wide.ack
                        && l.sent_heard == Some(l.heard)
                        && l.node_last <= l.heard)
            })
    }

    fn wants_probe(&self, f: &Flow<Q>) -> bool {
        !f.synced && !f.refused && !f.probe_outstanding
    }

    /// Builds the next datagram into `out` (cleared first). Returns false when there is nothing to send now.
    pub fn poll_transmit(&mut self, now: T, out: &mut (impl Out + ?Sized)) -> bool {
        self.poll_transmit_padded(now, out, None)
    }

    /// The size of a full datagram (its cookie prefix included): what [`Sender::poll_transmit_padded`] pads to.
    pub fn datagram_size(&self) -> usize {
        self.max_datagram
    }

    /// [`Sender::poll_transmit`] for a driver that sends datagrams of one size together (UDP GSO: every segment
    /// but the last of one size): a datagram that comes within `slack` bytes of [`Sender::datagram_size`] is
    /// padded to exactly that size with PADDING (protocol.md 5), so a run of full datagrams has one size whatever
    /// its records' lengths. A shorter datagram is left as it is. `None` pads as `poll_transmit` does.
    pub fn poll_transmit_padded(
        &mut self,
        now: T,
        out: &mut (impl Out + ?Sized),
        slack: Option<usize>,
    ) -> bool {
        let wants = self
            .flows
            .iter()
            .any(|f| self.wants_probe(f) || (f.has_unsent() && f.in_flight() < self.window))
            || self.listens.iter().any(|l| l.due(now))
            || (self.wide.ack && self.listens.iter().any(|l| !l.refused));
        if !wants {
            return false;
        }
        if self
            .cookie
            .is_some_and(|(_, at)| now.since(at) >= COOKIE_USE)
        {
            self.cookie = None;
        }
        out.clear();
        // A cookie goes in front of the packet, outside what is sealed (type 4, protocol.md 4.4): the type byte
        // and the cookie, then a whole type-1 packet. The whole datagram stays within its size.
        let cookie_room = match &self.cookie {
            Some((cookie, _)) => {
                out.push(wire::TYPE_SENDER_COOKIE);
                out.extend_from_slice(cookie);
                wire::COOKIE_PREFIX_LEN
            }
            None => 0,
        };
        let pn = self.next_pn;
        wire::SenderHeader {
            key_id: self.key_id,
            run_id: self.run_id,
            packet_number: pn,
        }
        .emit(out);
        let limit = self.max_datagram - wire::TAG_LEN;
        let empty = cookie_room + wire::SENDER_HEADER_LEN;
        // LISTENs first. Until the node has answered one with DOWN, they go in a packet of their own: a node
        // without downlink drops a packet with an unknown frame whole, and DATA must not go with it (12.6).
        let mut listened = false;
        let ack = core::mem::take(&mut self.wide.ack);
        let due = |l: &Listen<T>| l.due(now) || (ack && !l.refused);
        // An offer of 1.2 goes without DATA too: a node of 1.1 drops it whole (13.2).
        let offering = self.wide.token.is_none()
            && self.wide.window > 0
            && !self.wide.declined
            && !self.wide.skip_offer
            && self.wide.offers < MAX_OFFERS;
        let alone = self
            .listens
            .iter()
            .any(|l| due(l) && (!l.confirmed || offering));
        let response = if self.wide.token.is_some() || offering {
            wire::response_len(self.max_datagram as u64, self.wide.window)
        } else {
            0
        };
        for l in &mut self.listens {
            if !due(l) || out.len() + wire::listen_len(l.app.as_bytes(), l.heard) + response > limit
            {
                continue;
            }
            wire::put_listen(out, l.app.as_bytes(), l.heard);
            l.outstanding = Some(pn);
            l.sent_heard = Some(l.heard);
            l.want = false;
            l.hold_until = None;
            listened = true;
        }
        let mut padded = true;
        if listened {
            if let Some(token) = self.wide.token {
                wire::put_response(out, &token, self.max_datagram as u64, self.wide.window);
                // The node validated the address this token came from: an acknowledgement needs no room, unless
                // the token is new (13.2, step 3).
                padded = core::mem::take(&mut self.wide.pad);
            } else if offering {
                wire::put_response(
                    out,
                    &[0; wire::TOKEN_LEN],
                    self.max_datagram as u64,
                    self.wide.window,
                );
                self.wide.offers += 1;
                self.wide.offer_pn = Some(pn);
            } else {
                self.wide.skip_offer = false;
            }
        }
        let n = if alone { 0 } else { self.flows.len() };
        for k in 0..n {
            let i = (self.next_flow + k) % n;
            let window = self.window;
            let f = &mut self.flows[i];
            if !f.synced && !f.refused && !f.probe_outstanding {
                let len = wire::data_header_len(f.app.as_bytes(), 0, 0);
                if out.len() + len <= limit {
                    // In the flow's own frame type: a forwarding node's FORWARD probe is refused at once by a far
                    // app that does not let it forward (protocol.md 5.4), before any record is sent.
                    wire::put_frame_header(out, f.format, f.app.as_bytes(), 0, 0);
                    f.probe_outstanding = true;
                }
                continue;
            }
            if !f.has_unsent() || f.in_flight() >= window {
                continue;
            }
            // Count how many records fit from the cursor, then write them.
            let first = f.cursor;
            let start_idx = (first - f.acked - 1) as usize;
            let in_flight_bytes = f.records.bytes_before(start_idx);
            let room = limit
                .saturating_sub(out.len() + frame_overhead(f.app.as_bytes(), first))
                .min(self.window_bytes.saturating_sub(in_flight_bytes));
            let may = usize::try_from(window - f.in_flight()).unwrap_or(usize::MAX);
            let mut count = f.records.fit(start_idx, may, room);
            // One record that does not fit even an empty datagram of the usual size goes alone in a larger one,
            // when this sender may (a forwarding node, protocol.md 5.4); `queue` let only such records in.
            let alone = out.len() == empty;
            if count == 0
                && alone
                && self.allow_oversize
                && start_idx < f.records.len()
                && in_flight_bytes < self.window_bytes
            {
                let hard_room = wire::MAX_ACCEPTED_DATAGRAM
                    - wire::TAG_LEN
                    - wire::SENDER_HEADER_LEN
                    - frame_overhead(f.app.as_bytes(), first);
                count = f.records.fit(start_idx, 1, hard_room);
            }
            if count == 0 {
                continue;
            }
            if first == f.acked + 1 && f.base_sent_pn.is_none() {
                f.base_sent_pn = Some(pn);
            }
            let frame_start = out.len();
            wire::put_frame_header(out, f.format, f.app.as_bytes(), first, count as u64);
            if !f.records.put_range(out, start_idx, count) {
                // The queue could not read its records (flash): this datagram is not sent, the records stay.
                self.stats.queue_read_failures += 1;
                if frame_start == empty {
                    return false;
                }
                out.truncate(frame_start);
                continue;
            }
            f.cursor += count as u64;
        }
        self.next_flow = (self.next_flow + 1) % n.max(1);
        if out.len() == empty {
            return false;
        }
        // A packet that carries LISTEN is the room of the node's answer (no amplification, protocol.md 9, 12.4).
        let target = if listened && padded {
            self.listen_room.saturating_sub(cookie_room)
        } else {
            wire::MIN_SENDER_DATAGRAM
        }
        .max(wire::MIN_SENDER_DATAGRAM);
        // Within `slack` of a full datagram: full, so it goes out with the full ones in one GSO send.
        let full = self.max_datagram - cookie_room;
        let target = match slack {
            Some(slack) if out.len() - cookie_room + wire::TAG_LEN + slack >= full => {
                target.max(full)
            }
            _ => target,
        };
        while out.len() - cookie_room + wire::TAG_LEN < target {
            out.push(wire::FRAME_PADDING);
        }
        crypto::seal_from(&self.k_s2n, pn, out, cookie_room, wire::SENDER_HEADER_LEN);
        self.next_pn += 1;
        self.stats.packets_sent += 1;
        if self.sent_times.is_full() {
            self.sent_times.pop_front();
        }
        let _ = self.sent_times.push_back((pn, now));
        if self.rto_deadline.is_none() {
            self.rto_deadline = Some(now.after(self.current_rto()));
        }
        true
    }

    fn current_rto(&self) -> Duration {
        (self.rtt.rto() * 2u32.pow(self.backoff.min(8))).min(MAX_RTO)
    }

    fn outstanding(&self) -> bool {
        self.flows
            .iter()
            .any(|f| !f.refused && (f.probe_outstanding || (f.synced && f.in_flight() > 0)))
            || self
                .listens
                .iter()
                .any(|l| !l.refused && l.outstanding.is_some())
    }

    pub fn poll_timeout(&self) -> Option<T> {
        let rto = if self.outstanding() {
            self.rto_deadline
        } else {
            None
        };
        let hold = self
            .listens
            .iter()
            .filter(|l| !l.refused && l.outstanding.is_none())
            .filter_map(|l| l.hold_until)
            .min();
        match (rto, hold) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The program moved the link to another address of the node (another node of its fleet, docs/scale-out.md):
    /// what is unacknowledged goes again at once, the old path's backoff is forgotten, and a cookie the old path
    /// gave is dropped (another node's cookie secret is its own). Nothing else changes: the run, its numbering and
    /// its keys are the fleet's, and the node reached next learns the flows' heard sequences from its store.
    pub fn path_changed(&mut self, now: T) {
        self.backoff = 0;
        self.cookie = None;
        if self.outstanding() {
            self.rto_deadline = Some(now);
        }
    }

    /// The RTO passed: send everything unacknowledged again (go-back-N) with a doubled RTO. What it tells the
    /// program goes to `sink`.
    pub fn handle_timeout(&mut self, now: T, sink: &mut impl FnMut(Event<'_>)) {
        let Some(deadline) = self.rto_deadline else {
            return;
        };
        if now < deadline {
            return;
        }
        if !self.outstanding() {
            self.rto_deadline = None;
            return;
        }
        self.stats.retransmit_rounds += 1;
        for f in &mut self.flows {
            f.cursor = f.acked + 1;
            f.probe_outstanding = false;
        }
        let answered_any = self.stats.packets_received > 0;
        if self.wide.offer_pn.take().is_some() {
            // The offer went unanswered: the node may be 1.1, which drops it whole; the LISTEN goes again
            // without it (13.2, step 1).
            self.wide.skip_offer = true;
        }
        for l in &mut self.listens {
            if l.outstanding.take().is_some() {
                l.want = true;
                if !l.confirmed {
                    l.resends += 1;
                    if l.resends >= LISTEN_UNANSWERED_AFTER && answered_any && !l.told_unanswered {
                        l.told_unanswered = true;
                        sink(Event::DownlinkUnanswered {
                            app: l.app.as_str(),
                        });
                    }
                }
            }
        }
        // Retransmitted records travel in new packets; `base_sent_pn` keeps the first one, which is the oldest
        // the node could have answered about.
        self.backoff = (self.backoff + 1).min(8);
        self.rto_deadline = None;
    }

    fn n2s_key(&self, epoch: u64) -> PacketKey {
        match self.n2s {
            Some((e, k)) if e == epoch => k,
            _ => crypto::node_to_sender_key(
                &self.shared,
                self.run_id,
                epoch,
                &self.public,
                &self.node_public,
            ),
        }
    }

    /// Takes a datagram from the node, decrypting it in place (its bytes are garbage after). Anything that does
    /// not authenticate or holds a malformed frame is ignored and counted. What it tells the program goes to
    /// `sink`, in order.
    pub fn handle_datagram(
        &mut self,
        now: T,
        datagram: &mut [u8],
        sink: &mut impl FnMut(Event<'_>),
    ) {
        if datagram.first() == Some(&wire::TYPE_COOKIE) {
            return self.handle_cookie(now, datagram);
        }
        if datagram.len() < wire::NODE_HEADER_LEN + wire::TAG_LEN || datagram[0] != wire::TYPE_NODE
        {
            self.stats.packets_rejected += 1;
            return;
        }
        let Ok(header) = NodeHeader::parse(datagram) else {
            self.stats.packets_rejected += 1;
            return;
        };
        let key = self.n2s_key(header.epoch);
        let Ok(len) = crypto::open(&key, header.packet_number, datagram, wire::NODE_HEADER_LEN)
        else {
            self.stats.packets_rejected += 1;
            return;
        };
        let plain = &datagram[wire::NODE_HEADER_LEN..wire::NODE_HEADER_LEN + len];
        // A packet with a malformed frame is not acted on at all: checked whole before any frame is applied.
        if NodeFrames::check(plain).is_err() {
            self.stats.packets_rejected += 1;
            return;
        }
        let frames = NodeFrames::new(plain).flatten();
        if self.n2s.is_some_and(|(epoch, _)| epoch != header.epoch) {
            // Another node process answers (the node restarted, or another node of a fleet): its session of this
            // run is new and knows nothing of what the run listens on, so every flow's LISTEN goes again at once
            // rather than at the program's next poll (docs/protocol.md 12.4).
            for l in &mut self.listens {
                l.want = true;
            }
        }
        self.n2s = Some((header.epoch, key));
        self.stats.packets_received += 1;
        // The node answered with our keys: it has our session, and will not need an X25519 for this run again.
        self.cookie = None;
        let mut progress = false;
        let mut echoed: Option<u64> = None;
        let mut challenged = false;
        let mut down_answer = false;
        for frame in frames {
            match frame {
                NodeFrame::Echo { packet_number } => {
                    echoed = Some(packet_number);
                    self.take_rtt_sample(now, packet_number);
                }
                NodeFrame::Ack {
                    app,
                    stored_through,
                } => {
                    let Some(i) = self.flows.iter().position(|f| f.app.as_bytes() == app) else {
                        continue;
                    };
                    if stored_through > wire::MAX_STORED_SEQ {
                        // Acknowledging it would number records past 2^64 - 1.
                        self.stats.acks_past_stored_range += 1;
                        continue;
                    }
                    let f = &mut self.flows[i];
                    if f.floor_echo.is_some() && echoed < f.floor_echo {
                        // Built before the node went back (docs/protocol.md 7.3): about records it lost.
                        continue;
                    }
                    // An ACK comes only after a commit: the node stores this flow again.
                    f.not_stored = false;
                    if !f.synced {
                        f.synced = true;
                        f.probe_outstanding = false;
                        f.acked = stored_through;
                        f.cursor = stored_through + 1;
                        f.records.acked(stored_through, true);
                        progress = true;
                        sink(Event::Stored {
                            app: f.app.as_str(),
                            through: stored_through,
                        });
                        continue;
                    }
                    if stored_through < f.acked
                        && f.base_sent_pn.is_some()
                        && echoed >= f.base_sent_pn
                    {
                        // The node saw our first unacknowledged record and is still below it: a gap it can
                        // never fill. Renumber what we hold so it follows the node's heard sequence.
                        sink(Event::NodeBehind {
                            app: f.app.as_str(),
                            node: stored_through,
                            ours: f.acked,
                        });
                        f.acked = stored_through;
                        f.cursor = stored_through + 1;
                        f.base_sent_pn = None;
                        f.floor_echo = echoed;
                        f.records.acked(stored_through, true);
                        progress = true;
                        continue;
                    }
                    if stored_through <= f.acked {
                        continue;
                    }
                    progress = true;
                    let last = f.last_seq();
                    if stored_through > last {
                        sink(Event::NodeAhead {
                            app: f.app.as_str(),
                            node: stored_through,
                            ours: last,
                        });
                        f.records.clear();
                    } else {
                        f.records.release((stored_through - f.acked) as usize);
                    }
                    f.acked = stored_through;
                    f.cursor = f.cursor.max(stored_through + 1);
                    f.base_sent_pn = None;
                    f.records.acked(stored_through, false);
                    sink(Event::Stored {
                        app: f.app.as_str(),
                        through: stored_through,
                    });
                }
                NodeFrame::NotStored { app, reason } => {
                    let Some(i) = self.flows.iter().position(|f| f.app.as_bytes() == app) else {
                        continue;
                    };
                    let f = &mut self.flows[i];
                    if !f.not_stored {
                        f.not_stored = true;
                        sink(Event::NotStored {
                            app: f.app.as_str(),
                            reason,
                        });
                    }
                }
                NodeFrame::Challenge { token } => {
                    challenged = true;
                    if self.wide.token != Some(token) {
                        // A new token: every flow's LISTEN goes at once with it, padded, since this address may
                        // not be validated yet (13.2, step 2).
                        self.wide.token = Some(token);
                        self.wide.pad = true;
                        self.wide.declined = false;
                        for l in &mut self.listens {
                            l.want = true;
                        }
                    }
                    self.wide.offer_pn = None;
                }
                NodeFrame::Down(d) => {
                    let Some(l) = self.listens.iter_mut().find(|l| l.app.as_bytes() == d.app)
                    else {
                        continue;
                    };
                    down_answer = true;
                    if d.count > 0 && self.wide.token.is_some() {
                        // Every datagram with DOWN records is acknowledged at once, also one that could not be
                        // taken (a duplicate acknowledgement, 13.2 step 3).
                        self.wide.ack = true;
                    }
                    l.node_last = d.last;
                    l.confirmed = true;
                    let answered = l.outstanding.is_some_and(|pn| echoed >= Some(pn));
                    if answered {
                        l.outstanding = None;
                        progress = true;
                    }
                    let mut handed = false;
                    // Records are handed over only from a frame that skips nothing the program has not had
                    // (`after ≤ heard`), and only above `heard` (docs/protocol.md 12.4).
                    if d.after <= l.heard {
                        for (seq, payload) in (d.first_seq..).zip(wire::RecordIter::new(d.records))
                        {
                            if seq > l.heard {
                                l.heard = seq;
                                handed = true;
                                sink(Event::Down {
                                    app: l.app.as_str(),
                                    seq,
                                    payload,
                                });
                            }
                        }
                    }
                    if answered && !handed && l.node_last > l.heard {
                        // More waits but this answer had no room for it: ask again after an RTO, not at once.
                        l.hold_until = Some(now.after(self.rtt.rto()));
                    }
                }
                NodeFrame::Refuse { app, reason } => {
                    if let Some(l) = self.listens.iter_mut().find(|l| l.app.as_bytes() == app)
                        && !l.refused
                    {
                        l.refused = true;
                        if !self.flows.iter().any(|f| f.app.as_bytes() == app) {
                            sink(Event::Refused {
                                app: l.app.as_str(),
                                reason,
                            });
                        }
                    }
                    let Some(i) = self.flows.iter().position(|f| f.app.as_bytes() == app) else {
                        continue;
                    };
                    let f = &mut self.flows[i];
                    if !f.refused {
                        f.refused = true;
                        f.records.clear();
                        sink(Event::Refused {
                            app: f.app.as_str(),
                            reason,
                        });
                    }
                }
            }
        }
        if down_answer && !challenged && self.wide.offer_pn.is_some_and(|pn| echoed >= Some(pn)) {
            // The offer was answered without a CHALLENGE: this node will not validate the run (13.2, step 1).
            self.wide.offer_pn = None;
            self.wide.declined = true;
        }
        if progress {
            self.backoff = 0;
            self.last_progress = Some(now);
            self.rto_deadline = if self.outstanding() {
                Some(now.after(self.current_rto()))
            } else {
                None
            };
        }
    }

    /// A COOKIE packet (protocol.md 4.4): the node is under load and wants us to prove our address before it spends
    /// an X25519 on our first packet. Taken only if it names a packet of this run we sent (someone off the path
    /// does not know the run id); then every later packet echoes the cookie, and what the answered packet carried
    /// is sent again at once (it was dropped) rather than after the RTO.
    fn handle_cookie(&mut self, now: T, datagram: &[u8]) {
        let Ok(c) = wire::CookiePacket::parse(datagram) else {
            self.stats.packets_rejected += 1;
            return;
        };
        if c.answers.key_id != self.key_id
            || c.answers.run_id != self.run_id
            || c.answers.packet_number >= self.next_pn
        {
            self.stats.packets_rejected += 1;
            return;
        }
        self.stats.cookies_received += 1;
        self.cookie = Some((c.cookie, now));
        if c.answers.packet_number >= self.cookie_resend_from {
            self.cookie_resend_from = self.next_pn;
            for f in &mut self.flows {
                f.cursor = f.acked + 1;
                f.probe_outstanding = false;
            }
        }
    }

    /// Whether the sender holds a cookie it echoes (protocol.md 4.4).
    pub fn has_cookie(&self) -> bool {
        self.cookie.is_some()
    }

    /// A round-trip sample from an ECHO (docs/protocol.md 7.4): only from an ECHO larger than any before in this
    /// run, and only once per packet number, since the entries it reaches are removed.
    fn take_rtt_sample(&mut self, now: T, echo: u64) {
        if self.largest_echo.is_some_and(|largest| echo <= largest) {
            return;
        }
        self.largest_echo = Some(echo);
        if let Some(&(_, sent)) = self.sent_times.iter().find(|(pn, _)| *pn == echo) {
            self.rtt.sample(now.since(sent));
        }
        while self.sent_times.front().is_some_and(|&(pn, _)| pn <= echo) {
            self.sent_times.pop_front();
        }
    }
}

#[cfg(all(test, feature = "std"))]
mod tests {
    use super::*;
    use crate::queue::VecQueue;
    use alloc::format;
    use alloc::vec;
    use alloc::vec::Vec;
    use std::time::Instant;

    type Sender = super::Sender<Instant, VecQueue, 4, 4, 64>;

    #[test]
    fn a_down_frame_that_would_skip_past_heard_is_ignored_and_duplicates_are_not_handed_over() {
        let node = Identity::generate();
        let device = Identity::generate();
        let mut config = SenderConfig::new(device.clone(), *node.public());
        config.run_id = 9;
        let mut s = Sender::new(config).unwrap();
        s.listen("main", 3).unwrap();
        let now = Instant::now();
        let mut out = Vec::new();
        assert!(s.poll_transmit(now, &mut out));
        assert!(
            out.len() >= DEFAULT_DATAGRAM,
            "a LISTEN packet is the answer's room"
        );
        let shared = node.shared_secret(device.public()).unwrap();
        let key = crypto::node_to_sender_key(&shared, 9, 1, device.public(), node.public());
        let deliver = |s: &mut Sender, pn: u64, after: u64, first: u64, records: &[&[u8]]| {
            let mut p = Vec::new();
            NodeHeader {
                epoch: 1,
                packet_number: pn,
            }
            .emit(&mut p);
            wire::put_echo(&mut p, 0);
            wire::put_down_header(&mut p, b"main", 9, after, first, records.len() as u64);
            for r in records {
                wire::put_record(&mut p, r);
            }
            crypto::seal(&key, pn, &mut p, wire::NODE_HEADER_LEN);
            let mut handed = Vec::new();
            s.handle_datagram(now, &mut p, &mut |e| {
                if let Event::Down { seq, .. } = e {
                    handed.push(seq)
                }
            });
            handed
        };
        // Something waits between 3 and 5 that this frame does not carry: taking 5 and 6 would skip it.
        assert_eq!(
            deliver(&mut s, 1, 4, 5, &[b"five", b"six"]),
            Vec::<u64>::new()
        );
        assert_eq!(s.downlink_heard("main"), Some(3));
        // 3 is a duplicate; 4 is new.
        assert_eq!(deliver(&mut s, 2, 2, 3, &[b"three", b"four"]), vec![4]);
        assert_eq!(
            deliver(&mut s, 3, 2, 3, &[b"three", b"four"]),
            Vec::<u64>::new(),
            "a copy hands nothing over"
        );
        assert_eq!(s.downlink_heard("main"), Some(4));
        // The acknowledgement goes at once, carrying the new heard sequence.
        assert!(s.poll_transmit(now, &mut out));
    }

    #[test]
    fn acks_near_the_largest_sequence_move_nothing_past_it_and_never_panic() {
        // A hostile node may acknowledge any sequence up to 2^64 - 1 (the fuzz target node_packet found a panic
        // there: `stored_through + 1` wrapped). No honest node acknowledges past 2^63 - 1 (protocol.md 5.1).
        let node = Identity::generate();
        let device = Identity::generate();
        let shared = node.shared_secret(device.public()).unwrap();
        let key = crypto::node_to_sender_key(&shared, 3, 1, device.public(), node.public());
        let big = [
            u64::MAX,
            u64::MAX - 1,
            u64::MAX - 2,
            1 << 63,
            (1 << 63) - 1,
            (1 << 63) - 2,
        ];
        for &first in &big {
            for &second in &big {
                let mut s =
                    Sender::new(SenderConfig::with_run_id(device.clone(), *node.public(), 3))
                        .unwrap();
                s.open_flow("main", FlowStart::At(1)).unwrap();
                for _ in 0..3 {
                    s.queue("main", b"record").unwrap();
                }
                let now = Instant::now();
                let mut out = Vec::new();
                while s.poll_transmit(now, &mut out) {}
                for (pn, through) in [(0, first), (1, second)] {
                    let mut p = Vec::new();
                    NodeHeader {
                        epoch: 1,
                        packet_number: pn,
                    }
                    .emit(&mut p);
                    wire::put_echo(&mut p, pn + 1);
                    wire::put_ack(&mut p, b"main", through);
                    crypto::seal(&key, pn, &mut p, wire::NODE_HEADER_LEN);
                    s.handle_datagram(now, &mut p, &mut |_| {});
                    while s.poll_transmit(now, &mut out) {}
                    let _ = s.queue("main", b"more");
                    while s.poll_transmit(now, &mut out) {}
                }
                let later = now + core::time::Duration::from_secs(10);
                s.handle_timeout(later, &mut |_| {});
                while s.poll_transmit(later, &mut out) {}
                let past = [first, second]
                    .iter()
                    .filter(|&&a| a > wire::MAX_STORED_SEQ)
                    .count() as u64;
                assert_eq!(
                    s.stats().acks_past_stored_range,
                    past,
                    "{first} then {second}"
                );
                let f = &s.flows[0];
                assert!(f.acked <= wire::MAX_STORED_SEQ && f.cursor > f.acked);
                if past == 2 {
                    assert_eq!((f.acked, f.records.len()), (0, 5), "nothing released");
                }
            }
        }
    }

    #[test]
    fn a_node_packet_of_a_new_epoch_sends_the_listen_again() {
        let node = Identity::generate();
        let device = Identity::generate();
        let mut s =
            Sender::new(SenderConfig::with_run_id(device.clone(), *node.public(), 4)).unwrap();
        s.listen("main", 0).unwrap();
        let now = Instant::now();
        let mut out = Vec::new();
        assert!(s.poll_transmit(now, &mut out), "the first LISTEN");
        let shared = node.shared_secret(device.public()).unwrap();
        let answer = |s: &mut Sender, epoch: u64, pn: u64, echo: u64| {
            let key = crypto::node_to_sender_key(&shared, 4, epoch, device.public(), node.public());
            let mut p = Vec::new();
            NodeHeader {
                epoch,
                packet_number: pn,
            }
            .emit(&mut p);
            wire::put_echo(&mut p, echo);
            wire::put_down_header(&mut p, b"main", 0, 0, 0, 0);
            crypto::seal(&key, pn, &mut p, wire::NODE_HEADER_LEN);
            s.handle_datagram(now, &mut p, &mut |_| {});
        };
        answer(&mut s, 7, 1, 0);
        assert!(!s.poll_transmit(now, &mut out), "answered: nothing to send");
        // The same node again: still nothing.
        answer(&mut s, 7, 2, 0);
        assert!(!s.poll_transmit(now, &mut out));
        // A node packet of another epoch (the node restarted): the LISTEN goes again at once.
        answer(&mut s, 8, 1, 0);
        assert!(
            s.poll_transmit(now, &mut out),
            "LISTEN again after a new epoch"
        );
        let plain = opened(&node, &device, 4, &out);
        assert!(matches!(
            wire::parse_sender_frames(&plain).unwrap()[..],
            [wire::SenderFrame::Listen { heard: 0, .. }]
        ));
    }

    #[test]
    fn records_queued_through_queue_mut_are_the_flows_and_are_sent() {
        let node = Identity::generate();
        let device = Identity::generate();
        let mut s =
            Sender::new(SenderConfig::with_run_id(device.clone(), *node.public(), 3)).unwrap();
        assert!(s.queue_mut("main").is_none(), "no flow yet");
        s.open_flow_with(
            "main",
            FlowStart::At(7),
            RecordFormat::Plain,
            VecQueue::default(),
        )
        .unwrap();
        s.queue_mut("main").unwrap().push_slice(b"seven").unwrap();
        assert_eq!((s.unacked("main"), s.next_seq("main")), (1, Some(8)));
        let mut out = Vec::new();
        assert!(s.poll_transmit(Instant::now(), &mut out));
        let plain = opened(&node, &device, 3, &out);
        assert!(
            plain.windows(5).any(|w| w == b"seven"),
            "the record goes in the flow's next datagram"
        );
    }

    /// Opens the sealed datagram `out` of sender `s` and returns its plaintext after the header.
    fn opened(node: &Identity, device: &Identity, run_id: u64, out: &[u8]) -> Vec<u8> {
        let shared = node.shared_secret(device.public()).unwrap();
        let key = crypto::sender_to_node_key(&shared, run_id, device.public(), node.public());
        let header = wire::SenderHeader::parse(&out[..wire::SENDER_HEADER_LEN]).unwrap();
        let mut p = out.to_vec();
        let len =
            crypto::open(&key, header.packet_number, &mut p, wire::SENDER_HEADER_LEN).unwrap();
        p[wire::SENDER_HEADER_LEN..wire::SENDER_HEADER_LEN + len].to_vec()
    }

    #[test]
    fn a_datagram_near_full_is_padded_to_full_and_a_short_one_is_not() {
        let node = Identity::generate();
        let device = Identity::generate();
        let mut config = SenderConfig::new(device.clone(), *node.public());
        config.run_id = 5;
        let mut s = Sender::new(config).unwrap();
        s.open_flow("main", FlowStart::At(1)).unwrap();
        // Records of 41 bytes (42 with the length): a datagram's room is not a multiple of them.
        for i in 0..100u32 {
            s.queue("main", format!("{i:041}").as_bytes()).unwrap();
        }
        let now = Instant::now();
        let slack = s.datagram_size() / 16;
        let mut out = Vec::new();
        assert!(s.poll_transmit_padded(now, &mut out, Some(slack)));
        assert_eq!(out.len(), s.datagram_size(), "padded to full");
        let plain = opened(&node, &device, 5, &out);
        let frames = wire::parse_sender_frames(&plain).unwrap();
        let stored: u64 = frames
            .iter()
            .map(|f| match f {
                wire::SenderFrame::Data(d) => d.count,
                _ => 0,
            })
            .sum();
        assert!(stored > 20, "the full datagram carries records: {stored}");
        // Without padding the same records make a shorter datagram.
        let mut t = Sender::new(SenderConfig::new(device.clone(), *node.public())).unwrap();
        t.open_flow("main", FlowStart::At(1)).unwrap();
        for i in 0..100u32 {
            t.queue("main", format!("{i:041}").as_bytes()).unwrap();
        }
        let mut plain_out = Vec::new();
        assert!(t.poll_transmit(now, &mut plain_out));
        assert!(
            plain_out.len() < t.datagram_size() && plain_out.len() + slack >= t.datagram_size()
        );
        // What is left after full datagrams is shorter than full less the slack: not padded.
        while s.poll_transmit_padded(now, &mut out, Some(slack)) && out.len() == s.datagram_size() {
        }
        assert!(
            out.len() + slack < s.datagram_size(),
            "the last one is short: {}",
            out.len()
        );
        assert!(!s.poll_transmit_padded(now, &mut out, Some(slack)));
    }

    #[test]
    fn the_window_in_bytes_bounds_what_is_in_flight() {
        let node = Identity::generate();
        let mut s = Sender::new(SenderConfig::new(Identity::generate(), *node.public())).unwrap();
        s.open_flow("main", FlowStart::At(1)).unwrap();
        for _ in 0..20 {
            s.queue("main", &[7u8; 1000]).unwrap();
        }
        // 1,002 bytes a record in frame form: a bound of 4,000 bytes lets three be in flight, not four.
        s.set_window_bytes(4_000);
        let now = Instant::now();
        let mut out = Vec::new();
        let mut sent = 0;
        while s.poll_transmit(now, &mut out) {
            sent += 1;
        }
        assert_eq!(sent, 3, "one record a datagram, three in 4,000 bytes");
        assert_eq!(s.flows[0].in_flight(), 3);
        assert_eq!(s.unacked_bytes(), 20 * 1002);
    }

    #[test]
    fn a_changed_path_sends_what_is_unacknowledged_again_at_once_with_the_backoff_forgotten() {
        let node = Identity::generate();
        let mut s = Sender::new(SenderConfig::new(Identity::generate(), *node.public())).unwrap();
        s.open_flow("main", FlowStart::At(1)).unwrap();
        s.queue("main", b"r1").unwrap();
        let t0 = Instant::now();
        let mut out = Vec::new();
        assert!(s.poll_transmit(t0, &mut out));
        while s.poll_transmit(t0, &mut out) {}
        // Three silent RTOs: the backoff has grown.
        let mut now = t0;
        for _ in 0..3 {
            now = s.poll_timeout().unwrap();
            s.handle_timeout(now, &mut |_| {});
            while s.poll_transmit(now, &mut out) {}
        }
        assert!(s.poll_timeout().unwrap() - now >= Duration::from_millis(1000));
        let sent = s.stats().packets_sent;
        s.path_changed(now);
        assert_eq!(s.poll_timeout(), Some(now), "due at once");
        s.handle_timeout(now, &mut |_| {});
        assert!(s.poll_transmit(now, &mut out), "the record goes again");
        assert_eq!(s.stats().packets_sent, sent + 1);
        // The backoff starts again from the first RTO.
        assert!(s.poll_timeout().unwrap() - now <= INITIAL_RTO * 2);
    }

    #[test]
    fn queue_lines_takes_whole_lines_up_to_max_and_leaves_the_cut_one() {
        let mut s = Sender::new(SenderConfig::new(
            Identity::generate(),
            *Identity::generate().public(),
        ))
        .unwrap();
        let block = b"a\n\nbc\r\ndef\ncut";
        assert_eq!(s.queue_lines("main", block, 2).unwrap(), (3, 2));
        assert_eq!(s.queue_lines("main", &block[3..], 10).unwrap(), (8, 2));
        let q = &s.flows[0].records;
        let got: Vec<&[u8]> = (0..q.len()).map(|i| q.get(i)).collect();
        assert_eq!(got, [&b"a"[..], b"", b"bc\r", b"def"]);
        let mut long = vec![b'z'; s.max_payload("main") + 1];
        long.push(b'\n');
        let mut with_long = b"ok\n".to_vec();
        with_long.extend_from_slice(&long);
        let (n, e) = s.queue_lines("main", &with_long, 10).unwrap_err();
        assert_eq!(n, 1);
        assert!(matches!(e, SenderError::TooLarge { .. }));
        assert_eq!(s.unacked("main"), 5);
    }

    /// A record longer than the flow's queue can ever hold is too large, not "full": no acknowledgement makes room
    /// for it (an outside audit found pl_queue saying "full" for ever; an outbox in flash bounds by its page).
    #[test]
    fn a_record_longer_than_its_queue_can_ever_hold_is_too_large_not_full() {
        type Small = crate::queue::ArrayQueue<64, 4>;
        let mut s = super::Sender::<Instant, Small, 2, 2, 8>::new(SenderConfig::new(
            Identity::generate(),
            *Identity::generate().public(),
        ))
        .unwrap();
        s.open_flow_with(
            "main",
            FlowStart::At(1),
            RecordFormat::Plain,
            Small::default(),
        )
        .unwrap();
        assert_eq!(s.max_record("main"), 63);
        assert_eq!(
            s.queue("main", &[0; 64]),
            Err(SenderError::TooLarge { len: 64, max: 63 })
        );
        assert_eq!(
            s.queue_lines(
                "main",
                &[b'x'; 65][..]
                    .iter()
                    .chain(b"\n")
                    .copied()
                    .collect::<Vec<_>>(),
                1
            ),
            Err((0, SenderError::TooLarge { len: 65, max: 63 }))
        );
        s.queue("main", &[0; 63]).unwrap();
        assert!(matches!(
            s.queue("main", &[0; 1]),
            Err(SenderError::QueueFull(_))
        ));
    }

    #[test]
    fn a_forwarded_record_is_queued_as_its_bytes() {
        let id = Identity::generate();
        let node = Identity::generate();
        let mut s = Sender::new(SenderConfig::new(id, *node.public())).unwrap();
        s.open_flow_as("far", FlowStart::At(1), RecordFormat::Forwarded)
            .unwrap();
        let len = s.queue_forwarded("far", b"dev", 300, b"payload").unwrap();
        let mut expected = Vec::new();
        wire::Forwarded::put_bare(&mut expected, b"dev", 300, b"payload");
        assert_eq!(len, expected.len());
        assert_eq!(s.flows[0].records.get(0), &expected[..]);
        let too_big = vec![0u8; s.max_payload("far") + 1];
        assert!(matches!(
            s.queue("far", &too_big),
            Err(SenderError::TooLarge { .. })
        ));
        assert_eq!(s.unacked("far"), 1);
    }
}
