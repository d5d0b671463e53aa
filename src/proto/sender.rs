//! The sender's link state machine, sans-IO (docs/protocol.md 7).
//!
//! Order of calls for a driver: [`Sender::queue`] records; then loop: send every datagram
//! [`Sender::poll_transmit`] yields; wait for a datagram or [`Sender::poll_timeout`]; feed it to
//! [`Sender::handle_datagram`] or call [`Sender::handle_timeout`]; read [`Sender::poll_event`].

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use thiserror::Error;

use super::crypto::{self, Identity, PacketKey, PublicKeyBytes};
use super::wire::{self, NodeFrame, NodeHeader, RecordFormat};

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
/// How many sent packets' times are kept for ECHO round-trip samples.
const SENT_TIMES: usize = 4096;
/// A cookie is echoed for at most this long after it arrived: a node accepts it for at least its cookie period,
/// 120 s (docs/protocol.md 4.4).
const COOKIE_USE: Duration = Duration::from_secs(120);
#[derive(Debug, Error, PartialEq, Eq)]
pub enum SenderError {
    #[error("app name {0:?} is not 1–32 characters of a-z 0-9 _ -")]
    BadApp(String),
    #[error("record of {len} bytes does not fit in one {max}-byte datagram")]
    TooLarge { len: usize, max: usize },
    #[error("the node's public key is a low-order point")]
    BadNodeKey,
    #[error("app {0} was refused by the node")]
    Refused(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SenderEvent {
    /// The node has stored every record of `app` up to and including `through`.
    Stored { app: String, through: u64 },
    /// The node refused the app (reason as in protocol.md 5); its records were dropped.
    Refused { app: String, reason: u8 },
    /// The node cannot store the app's records now (NOT_STORED, reason as in protocol.md 5): they stay queued
    /// and are sent again. Said once until the node stores something of the flow again.
    NotStored { app: String, reason: u8 },
    /// The node holds records of this flow past anything this sender numbered (it lost its counter). What was
    /// queued is released (the node counted it as duplicates) and numbering continues after `node`.
    NodeAhead { app: String, node: u64, ours: u64 },
    /// The node's heard sequence is below where this sender started (e.g. the node lost its store): the
    /// unacknowledged records are renumbered from `node + 1` and sent again (docs/protocol.md 7, Acks).
    NodeBehind { app: String, node: u64, ours: u64 },
    /// A downlink record for the program (docs/protocol.md 12.4): handed over once, in sequence order. The program
    /// keeps `seq` as the flow's downlink heard sequence, with what it did with the record, and gives it back to
    /// [`Sender::listen`] after a restart.
    Down {
        app: String,
        seq: u64,
        payload: Vec<u8>,
    },
    /// The node never answered this run's LISTEN for `app` while it answered its other packets: a node without
    /// downlink (docs/protocol.md 12.6). Said once; uplink goes on.
    DownlinkUnanswered { app: String },
}

/// A downlink flow this sender listens on (docs/protocol.md 12.4).
struct Listen {
    app: String,
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
    hold_until: Option<Instant>,
    /// RTO resends of an unconfirmed LISTEN, for [`SenderEvent::DownlinkUnanswered`].
    resends: u32,
    told_unanswered: bool,
    refused: bool,
}

impl Listen {
    fn due(&self, now: Instant) -> bool {
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

struct Flow {
    app: String,
    /// DATA frames for a device's own records, FORWARD frames for a node's outlet (protocol.md 5.4).
    format: RecordFormat,
    /// False until the node told us the heard sequence (FlowStart::Probe).
    synced: bool,
    probe_outstanding: bool,
    /// Highest sequence the node has acknowledged.
    acked: u64,
    /// Records `acked + 1 ..= acked + records.len()`.
    records: RecordQueue,
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

impl Flow {
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

/// A flow's queued records back to back in one buffer, with the end of each: queueing a record copies its bytes
/// and allocates nothing per record, and an ack releases a prefix by moving an offset (research/006: an outlet's
/// loop spent about a third of its time allocating and freeing a `Vec` per record). Each record is kept as a DATA
/// frame carries it (its length as a varint, then its bytes), so a frame's records are one copy (research/022).
#[derive(Debug, Default)]
struct RecordQueue {
    /// The records in their frame form; those before `start` are released.
    bytes: Vec<u8>,
    start: usize,
    /// Where each record ends in `bytes`.
    ends: VecDeque<usize>,
}

/// Released bytes are moved out of the buffer once they are at least this many and at least half of it.
const COMPACT_AFTER: usize = 64 << 10;

impl RecordQueue {
    fn len(&self) -> usize {
        self.ends.len()
    }
    fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }
    /// Where the `i`-th record (0: the oldest) begins, its length varint included.
    fn begin(&self, i: usize) -> usize {
        if i == 0 { self.start } else { self.ends[i - 1] }
    }
    /// The bytes of the records before the `i`-th, in their frame form.
    fn bytes_before(&self, i: usize) -> usize {
        self.begin(i) - self.start
    }
    /// The bytes of every record queued, in their frame form.
    fn queued_bytes(&self) -> usize {
        self.bytes.len() - self.start
    }
    /// The `i`-th record's bytes, without its length.
    #[cfg(test)]
    fn get(&self, i: usize) -> &[u8] {
        let (from, to) = (self.begin(i), self.ends[i]);
        let len = self.bytes[from..to]
            .iter()
            .position(|b| b & 0x80 == 0)
            .map_or(0, |k| k + 1);
        &self.bytes[from + len..to]
    }
    /// The `i`-th record's length in a frame (its length varint included).
    fn wire_len(&self, i: usize) -> usize {
        self.ends[i] - self.begin(i)
    }
    /// Appends one record of `len` bytes, written by `write` to the buffer it is given.
    fn push_with(&mut self, len: usize, write: impl FnOnce(&mut Vec<u8>)) {
        wire::put_varint(&mut self.bytes, len as u64);
        write(&mut self.bytes);
        self.ends.push_back(self.bytes.len());
    }
    /// Appends one record, copied from `record`.
    fn push_slice(&mut self, record: &[u8]) {
        self.push_with(record.len(), |b| b.extend_from_slice(record));
    }
    /// How many records from the `from`-th (at most `max`) fit in `room` bytes of a frame, each with its length.
    /// One walk over the ends: a record's length is the distance to the end before it.
    fn fit(&self, from: usize, max: usize, room: usize) -> usize {
        let begin = self.begin(from);
        let to = self.ends.len().min(from.saturating_add(max));
        // Ends grow, so the records that fit are those whose end is within `room` of the first one's start.
        self.ends
            .range(from..to)
            .take_while(|&&end| end - begin <= room)
            .count()
    }
    /// Writes records `from .. from + count` into `out` as a DATA frame carries them: one copy.
    fn put_range(&self, out: &mut Vec<u8>, from: usize, count: usize) {
        if count > 0 {
            out.extend_from_slice(&self.bytes[self.begin(from)..self.ends[from + count - 1]]);
        }
    }
    fn clear(&mut self) {
        self.bytes.clear();
        self.start = 0;
        self.ends.clear();
    }
    /// Releases the `n` oldest records.
    fn release(&mut self, n: usize) {
        if n >= self.ends.len() {
            self.clear();
            return;
        }
        if n == 0 {
            return;
        }
        self.start = self.ends[n - 1];
        self.ends.drain(..n);
        if self.start >= COMPACT_AFTER && self.start * 2 >= self.bytes.len() {
            // Amortized: what moves is at most what was released since the last compaction.
            self.bytes.drain(..self.start);
            let gone = self.start;
            for e in &mut self.ends {
                *e -= gone;
            }
            self.start = 0;
        }
    }
}

/// Room a DATA frame header may take: the count is reserved at 3 varint bytes (up to 2^21 - 1 records, far more
/// than a datagram holds), so the frame's size is known before its records are counted.
fn frame_overhead(app: &[u8], first_seq: u64) -> usize {
    wire::data_header_len(app, first_seq, 1 << 14)
}

/// RFC 6298's estimator.
struct Rtt {
    srtt: Option<Duration>,
    rttvar: Duration,
}

impl Rtt {
    fn sample(&mut self, rtt: Duration) {
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
        match self.srtt {
            None => INITIAL_RTO,
            Some(srtt) => {
                (srtt + (self.rttvar * 4).max(Duration::from_millis(2))).clamp(MIN_RTO, MAX_RTO)
            }
        }
    }
}

pub struct SenderConfig {
    pub identity: Identity,
    pub node_public: PublicKeyBytes,
    /// Random per run (docs/protocol.md 2); draw it with [`crypto::random_array`].
    pub run_id: u64,
    pub max_datagram: usize,
    pub window: u64,
    /// A forwarding node's outlet: one record too large for `max_datagram` with its origin may go alone in a
    /// datagram of up to [`wire::MAX_ACCEPTED_DATAGRAM`] (protocol.md 5.4). Devices leave this off.
    pub allow_oversize: bool,
}

impl SenderConfig {
    pub fn new(identity: Identity, node_public: PublicKeyBytes) -> Self {
        SenderConfig {
            identity,
            node_public,
            run_id: u64::from_be_bytes(crypto::random_array()),
            max_datagram: DEFAULT_DATAGRAM,
            window: DEFAULT_WINDOW,
            allow_oversize: false,
        }
    }
}

pub struct Sender {
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
    flows: Vec<Flow>,
    /// Send time per packet number not yet answered, oldest first; an entry is removed once an ECHO reaches it.
    sent_times: VecDeque<(u64, Instant)>,
    /// The largest ECHO seen from the node in this run: only a larger one may give a round-trip sample, so a
    /// late or replayed node packet (or a node answering a replay of an old packet of ours) gives none.
    largest_echo: Option<u64>,
    rtt: Rtt,
    rto_deadline: Option<Instant>,
    backoff: u32,
    last_progress: Option<Instant>,
    events: VecDeque<SenderEvent>,
    /// Round-robin start so one busy flow does not starve the others.
    next_flow: usize,
    /// The node's cookie and when it came (protocol.md 4.4): echoed in front of every packet until the node answers
    /// one with an authenticated packet (it then has our session and needs no X25519) or [`COOKIE_USE`] passes.
    cookie: Option<([u8; wire::COOKIE_LEN], Instant)>,
    /// A COOKIE answering a packet numbered at least this resends at once; one for an older packet (sent before
    /// the last such resend) does not, so a burst of COOKIEs for one window resends it once.
    cookie_resend_from: u64,
    /// Downlink flows listened on (docs/protocol.md 12), and how large a packet carrying LISTEN is made.
    listens: Vec<Listen>,
    listen_room: usize,
    stats: SenderStats,
}

#[derive(Debug, Default, Clone)]
pub struct SenderStats {
    pub packets_sent: u64,
    pub retransmit_rounds: u64,
    pub packets_received: u64,
    pub packets_rejected: u64,
    /// COOKIE packets taken (protocol.md 4.4).
    pub cookies_received: u64,
}

impl Sender {
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
            flows: Vec::new(),
            sent_times: VecDeque::new(),
            largest_echo: None,
            rtt: Rtt {
                srtt: None,
                rttvar: Duration::ZERO,
            },
            rto_deadline: None,
            backoff: 0,
            last_progress: None,
            events: VecDeque::new(),
            next_flow: 0,
            cookie: None,
            cookie_resend_from: 0,
            listens: Vec::new(),
            listen_room: config
                .max_datagram
                .clamp(wire::MIN_SENDER_DATAGRAM, wire::MAX_DATAGRAM),
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
    pub fn last_progress(&self) -> Option<Instant> {
        self.last_progress
    }

    fn flow_index(&self, app: &str) -> Option<usize> {
        self.flows.iter().position(|f| f.app == app)
    }

    /// Opens a flow explicitly; [`Sender::queue`] opens one with [`FlowStart::Probe`] if there is none.
    pub fn open_flow(&mut self, app: &str, start: FlowStart) -> Result<(), SenderError> {
        self.open_flow_as(app, start, RecordFormat::Plain)
    }

    /// Opens a flow whose records go in frames of `format`: [`RecordFormat::Forwarded`] for a node forwarding
    /// forwarded records (each queued record then must be one, protocol.md 5.4).
    pub fn open_flow_as(
        &mut self,
        app: &str,
        start: FlowStart,
        format: RecordFormat,
    ) -> Result<(), SenderError> {
        if !wire::valid_app_name(app.as_bytes()) {
            return Err(SenderError::BadApp(app.to_string()));
        }
        if self.flow_index(app).is_some() {
            return Ok(());
        }
        let (synced, acked) = match start {
            FlowStart::Probe => (false, 0),
            FlowStart::At(next) => (true, next.max(1) - 1),
        };
        self.flows.push(Flow {
            app: app.to_string(),
            format,
            synced,
            probe_outstanding: false,
            acked,
            records: RecordQueue::default(),
            cursor: acked + 1,
            base_sent_pn: None,
            floor_echo: None,
            refused: false,
            not_stored: false,
        });
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

    /// Queues one record for `app`.
    pub fn queue(&mut self, app: &str, payload: Vec<u8>) -> Result<(), SenderError> {
        self.queue_slice(app, &payload)
    }

    /// Queues one record for `app`, copied from `record`.
    pub fn queue_slice(&mut self, app: &str, record: &[u8]) -> Result<(), SenderError> {
        let i = self.queue_flow(app, record.len())?;
        self.flows[i].records.push_slice(record);
        Ok(())
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
        let most = self.max_payload(app);
        let records = &mut self.flows[i].records;
        let (mut pos, mut n) = (0, 0);
        while n < max {
            let Some(k) = memchr::memchr(b'\n', &block[pos..]) else {
                break;
            };
            if k > most {
                return Err((n, SenderError::TooLarge { len: k, max: most }));
            }
            records.push_slice(&block[pos..pos + k]);
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
        self.flows[i].records.push_with(len, |b| {
            wire::Forwarded::put_bare(b, origin, origin_seq, payload)
        });
        Ok(len)
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
                self.open_flow(app, FlowStart::Probe)?;
                self.flows.len() - 1
            }
        };
        if self.flows[i].refused {
            return Err(SenderError::Refused(app.to_string()));
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
    /// handed (kept by the program; 0 the first time). Records above it arrive as [`SenderEvent::Down`]. The first
    /// LISTEN goes in the next [`Sender::poll_transmit`].
    pub fn listen(&mut self, app: &str, heard: u64) -> Result<(), SenderError> {
        if !wire::valid_app_name(app.as_bytes()) {
            return Err(SenderError::BadApp(app.to_string()));
        }
        if let Some(l) = self.listens.iter_mut().find(|l| l.app == app) {
            l.want = true;
            return Ok(());
        }
        self.listens.push(Listen {
            app: app.to_string(),
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
        });
        Ok(())
    }

    /// Asks the node again for `app`'s downlink (a device that stays awake does this at least once per the node's
    /// `--link-idle-ms`, so its session stays live and pushed records reach it at once).
    pub fn listen_now(&mut self, app: &str) {
        if let Some(l) = self.listens.iter_mut().find(|l| l.app == app) {
            l.want = true;
        }
    }

    /// How large a packet that carries LISTEN is made (padding): the room the node's answer gets for records
    /// (docs/protocol.md 12.4). Default: the datagram size.
    pub fn set_listen_room(&mut self, bytes: usize) {
        self.listen_room = bytes.clamp(wire::MIN_SENDER_DATAGRAM, self.max_datagram);
    }

    /// The downlink heard sequence of `app`: the last record handed to the program.
    pub fn downlink_heard(&self, app: &str) -> Option<u64> {
        self.listens.iter().find(|l| l.app == app).map(|l| l.heard)
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
                        && l.sent_heard == Some(l.heard)
                        && l.node_last <= l.heard)
            })
    }

    fn wants_probe(&self, f: &Flow) -> bool {
        !f.synced && !f.refused && !f.probe_outstanding
    }

    /// Builds the next datagram into `out` (cleared first). Returns false when there is nothing to send now.
    pub fn poll_transmit(&mut self, now: Instant, out: &mut Vec<u8>) -> bool {
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
        now: Instant,
        out: &mut Vec<u8>,
        slack: Option<usize>,
    ) -> bool {
        let wants = self
            .flows
            .iter()
            .any(|f| self.wants_probe(f) || (f.has_unsent() && f.in_flight() < self.window))
            || self.listens.iter().any(|l| l.due(now));
        if !wants {
            return false;
        }
        if self
            .cookie
            .is_some_and(|(_, at)| now.saturating_duration_since(at) >= COOKIE_USE)
        {
            self.cookie = None;
        }
        out.clear();
        let pn = self.next_pn;
        wire::SenderHeader {
            key_id: self.key_id,
            run_id: self.run_id,
            packet_number: pn,
        }
        .emit(out);
        // A cookie goes in front of the packet: keep the whole datagram within its size.
        let cookie_room = if self.cookie.is_some() {
            wire::COOKIE_PREFIX_LEN
        } else {
            0
        };
        let limit = self.max_datagram - wire::TAG_LEN - cookie_room;
        // LISTENs first. Until the node has answered one with DOWN, they go in a packet of their own: a node
        // without downlink drops a packet with an unknown frame whole, and DATA must not go with it (12.6).
        let mut listened = false;
        let alone = self.listens.iter().any(|l| l.due(now) && !l.confirmed);
        for l in &mut self.listens {
            if !l.due(now) || out.len() + wire::listen_len(l.app.as_bytes(), l.heard) > limit {
                continue;
            }
            wire::put_listen(out, l.app.as_bytes(), l.heard);
            l.outstanding = Some(pn);
            l.sent_heard = Some(l.heard);
            l.want = false;
            l.hold_until = None;
            listened = true;
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
            let alone = out.len() == wire::SENDER_HEADER_LEN;
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
                if f.records.wire_len(start_idx) <= hard_room {
                    count = 1;
                }
            }
            if count == 0 {
                continue;
            }
            if first == f.acked + 1 && f.base_sent_pn.is_none() {
                f.base_sent_pn = Some(pn);
            }
            wire::put_frame_header(out, f.format, f.app.as_bytes(), first, count as u64);
            f.records.put_range(out, start_idx, count);
            f.cursor += count as u64;
        }
        self.next_flow = (self.next_flow + 1) % n.max(1);
        if out.len() == wire::SENDER_HEADER_LEN {
            return false;
        }
        // A packet that carries LISTEN is the room of the node's answer (no amplification, protocol.md 9, 12.4).
        let target = if listened {
            self.listen_room.saturating_sub(cookie_room)
        } else {
            wire::MIN_SENDER_DATAGRAM
        }
        .max(wire::MIN_SENDER_DATAGRAM);
        // Within `slack` of a full datagram: full, so it goes out with the full ones in one GSO send.
        let full = self.max_datagram - cookie_room;
        let target = match slack {
            Some(slack) if out.len() + wire::TAG_LEN + slack >= full => target.max(full),
            _ => target,
        };
        while out.len() + wire::TAG_LEN < target {
            out.push(wire::FRAME_PADDING);
        }
        crypto::seal(&self.k_s2n, pn, out, wire::SENDER_HEADER_LEN);
        if let Some((cookie, _)) = &self.cookie {
            // Type 4: the type byte and the cookie, then the sealed type-1 packet unchanged (protocol.md 4.4).
            let mut prefix = [0u8; wire::COOKIE_PREFIX_LEN];
            prefix[0] = wire::TYPE_SENDER_COOKIE;
            prefix[1..].copy_from_slice(cookie);
            out.splice(0..0, prefix);
        }
        self.next_pn += 1;
        self.stats.packets_sent += 1;
        if self.sent_times.len() == SENT_TIMES {
            self.sent_times.pop_front();
        }
        self.sent_times.push_back((pn, now));
        if self.rto_deadline.is_none() {
            self.rto_deadline = Some(now + self.current_rto());
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

    pub fn poll_timeout(&self) -> Option<Instant> {
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
    pub fn path_changed(&mut self, now: Instant) {
        self.backoff = 0;
        self.cookie = None;
        if self.outstanding() {
            self.rto_deadline = Some(now);
        }
    }

    /// The RTO passed: send everything unacknowledged again (go-back-N) with a doubled RTO.
    pub fn handle_timeout(&mut self, now: Instant) {
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
        for l in &mut self.listens {
            if l.outstanding.take().is_some() {
                l.want = true;
                if !l.confirmed {
                    l.resends += 1;
                    if l.resends >= LISTEN_UNANSWERED_AFTER && answered_any && !l.told_unanswered {
                        l.told_unanswered = true;
                        self.events
                            .push_back(SenderEvent::DownlinkUnanswered { app: l.app.clone() });
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

    /// Takes a datagram from the node. Anything that does not authenticate is ignored and counted.
    pub fn handle_datagram(&mut self, now: Instant, datagram: &[u8]) {
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
        let mut buf = datagram.to_vec();
        let Ok(len) = crypto::open(&key, header.packet_number, &mut buf, wire::NODE_HEADER_LEN)
        else {
            self.stats.packets_rejected += 1;
            return;
        };
        let plain = &buf[wire::NODE_HEADER_LEN..wire::NODE_HEADER_LEN + len];
        let Ok(frames) = wire::parse_node_frames(plain) else {
            self.stats.packets_rejected += 1;
            return;
        };
        self.n2s = Some((header.epoch, key));
        self.stats.packets_received += 1;
        // The node answered with our keys: it has our session, and will not need an X25519 for this run again.
        self.cookie = None;
        let mut progress = false;
        let mut echoed: Option<u64> = None;
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
                        progress = true;
                        self.events.push_back(SenderEvent::Stored {
                            app: f.app.clone(),
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
                        self.events.push_back(SenderEvent::NodeBehind {
                            app: f.app.clone(),
                            node: stored_through,
                            ours: f.acked,
                        });
                        f.acked = stored_through;
                        f.cursor = stored_through + 1;
                        f.base_sent_pn = None;
                        f.floor_echo = echoed;
                        progress = true;
                        continue;
                    }
                    if stored_through <= f.acked {
                        continue;
                    }
                    progress = true;
                    let last = f.last_seq();
                    if stored_through > last {
                        self.events.push_back(SenderEvent::NodeAhead {
                            app: f.app.clone(),
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
                    self.events.push_back(SenderEvent::Stored {
                        app: f.app.clone(),
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
                        self.events.push_back(SenderEvent::NotStored {
                            app: f.app.clone(),
                            reason,
                        });
                    }
                }
                NodeFrame::Down(d) => {
                    let Some(l) = self.listens.iter_mut().find(|l| l.app.as_bytes() == d.app)
                    else {
                        continue;
                    };
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
                                self.events.push_back(SenderEvent::Down {
                                    app: l.app.clone(),
                                    seq,
                                    payload: payload.to_vec(),
                                });
                            }
                        }
                    }
                    if answered && !handed && l.node_last > l.heard {
                        // More waits but this answer had no room for it: ask again after an RTO, not at once.
                        l.hold_until = Some(now + self.rtt.rto());
                    }
                }
                NodeFrame::Refuse { app, reason } => {
                    if let Some(l) = self.listens.iter_mut().find(|l| l.app.as_bytes() == app)
                        && !l.refused
                    {
                        l.refused = true;
                        if !self.flows.iter().any(|f| f.app.as_bytes() == app) {
                            self.events.push_back(SenderEvent::Refused {
                                app: l.app.clone(),
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
                        self.events.push_back(SenderEvent::Refused {
                            app: f.app.clone(),
                            reason,
                        });
                    }
                }
            }
        }
        if progress {
            self.backoff = 0;
            self.last_progress = Some(now);
            self.rto_deadline = if self.outstanding() {
                Some(now + self.current_rto())
            } else {
                None
            };
        }
    }

    /// A COOKIE packet (protocol.md 4.4): the node is under load and wants us to prove our address before it spends
    /// an X25519 on our first packet. Taken only if it names a packet of this run we sent (someone off the path
    /// does not know the run id); then every later packet echoes the cookie, and what the answered packet carried
    /// is sent again at once (it was dropped) rather than after the RTO.
    fn handle_cookie(&mut self, now: Instant, datagram: &[u8]) {
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
    fn take_rtt_sample(&mut self, now: Instant, echo: u64) {
        if self.largest_echo.is_some_and(|largest| echo <= largest) {
            return;
        }
        self.largest_echo = Some(echo);
        if let Some(&(_, sent)) = self.sent_times.iter().find(|(pn, _)| *pn == echo) {
            self.rtt.sample(now.saturating_duration_since(sent));
        }
        while self.sent_times.front().is_some_and(|&(pn, _)| pn <= echo) {
            self.sent_times.pop_front();
        }
    }

    pub fn poll_event(&mut self) -> Option<SenderEvent> {
        self.events.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            s.handle_datagram(now, &p);
        };
        let handed = |s: &mut Sender| {
            std::iter::from_fn(|| s.poll_event())
                .filter_map(|e| match e {
                    SenderEvent::Down { seq, .. } => Some(seq),
                    _ => None,
                })
                .collect::<Vec<_>>()
        };
        // Something waits between 3 and 5 that this frame does not carry: taking 5 and 6 would skip it.
        deliver(&mut s, 1, 4, 5, &[b"five", b"six"]);
        assert_eq!(handed(&mut s), Vec::<u64>::new());
        assert_eq!(s.downlink_heard("main"), Some(3));
        // 3 is a duplicate; 4 is new.
        deliver(&mut s, 2, 2, 3, &[b"three", b"four"]);
        assert_eq!(handed(&mut s), vec![4]);
        deliver(&mut s, 3, 2, 3, &[b"three", b"four"]);
        assert_eq!(
            handed(&mut s),
            Vec::<u64>::new(),
            "a copy hands nothing over"
        );
        assert_eq!(s.downlink_heard("main"), Some(4));
        // The acknowledgement goes at once, carrying the new heard sequence.
        assert!(s.poll_transmit(now, &mut out));
    }

    #[test]
    fn the_record_queue_keeps_records_in_order_through_releases_and_compaction() {
        let mut q = RecordQueue::default();
        let record = |i: usize| vec![(i % 251) as u8; 1 + i % 700];
        let (mut first, mut next) = (0usize, 0usize);
        // Enough bytes that compaction runs many times; release in uneven steps.
        for round in 0..200 {
            for _ in 0..(50 + round % 37) {
                let r = record(next);
                q.push_slice(&r);
                next += 1;
            }
            let n = (round * 7) % 60;
            q.release(n);
            first = (first + n).min(next);
            assert_eq!(q.len(), next - first);
            for k in [0, q.len() / 2, q.len().saturating_sub(1)] {
                if k < q.len() {
                    assert_eq!(
                        q.get(k),
                        &record(first + k)[..],
                        "record {} after round {round}",
                        first + k
                    );
                }
            }
        }
        assert!(q.start < COMPACT_AFTER || q.start * 2 < q.bytes.len());
        q.release(q.len() + 5);
        assert!(q.is_empty());
        assert_eq!((q.start, q.bytes.len()), (0, 0));
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
            s.queue("main", format!("{i:041}").into_bytes()).unwrap();
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
            t.queue("main", format!("{i:041}").into_bytes()).unwrap();
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
            s.queue("main", vec![7u8; 1000]).unwrap();
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
        s.queue("main", b"r1".to_vec()).unwrap();
        let t0 = Instant::now();
        let mut out = Vec::new();
        assert!(s.poll_transmit(t0, &mut out));
        while s.poll_transmit(t0, &mut out) {}
        // Three silent RTOs: the backoff has grown.
        let mut now = t0;
        for _ in 0..3 {
            now = s.poll_timeout().unwrap();
            s.handle_timeout(now);
            while s.poll_transmit(now, &mut out) {}
        }
        assert!(s.poll_timeout().unwrap() - now >= Duration::from_millis(1000));
        let sent = s.stats().packets_sent;
        s.path_changed(now);
        assert_eq!(s.poll_timeout(), Some(now), "due at once");
        s.handle_timeout(now);
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
            s.queue_slice("far", &too_big),
            Err(SenderError::TooLarge { .. })
        ));
        assert_eq!(s.unacked("far"), 1);
    }
}
