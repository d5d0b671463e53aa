//! A turn: the bounded batch of records the node hands to the store to apply in one transaction, and what the store
//! hands back after the commit (BRIEF.md, "turn"; docs/protocol.md 5.2–5.3).
//!
//! Record bytes stay in their wire encoding, `(len varint, payload)*`, copied once into one arena per turn; the
//! store keeps the same encoding in its chunks, so nothing is re-encoded between the socket and the disk.

use std::ops::Range;

use super::allow_list::SenderIndex;
use super::wire::RecordFormat;

/// Index of an app in the node's app table.
pub type AppIndex = u16;

/// Identifies a session in the session cache; never reused within one node process.
pub type SessionId = u64;

/// One DATA frame to apply: `count` records of flow (sender, app) starting at `first_seq`. `count == 0` is a
/// probe, applied as "tell me the heard sequence".
#[derive(Debug, Clone)]
pub struct Apply {
    pub session: SessionId,
    pub sender: SenderIndex,
    pub app: AppIndex,
    pub first_seq: u64,
    pub count: u64,
    /// DATA (payloads) or FORWARD (forwarded records, protocol.md 5.4).
    pub format: RecordFormat,
    /// The records, in the turn's arena.
    pub records: Range<usize>,
}

/// A downlink read to make in the turn's transaction (docs/protocol.md 12.3): delete the flow's records at or below
/// `heard` (the device has them) and those expired, then read what waits above `heard` within `room` bytes of
/// records (each record counted with its length varint).
#[derive(Debug, Clone)]
pub struct DownFetch {
    pub session: SessionId,
    pub sender: SenderIndex,
    pub app: AppIndex,
    pub heard: u64,
    /// Records are read above this (≥ `heard`): `heard`, or for a validated session the highest sequence sent and
    /// not taken as lost, so that an acknowledgement brings new records, not those in flight (protocol.md 13.1).
    pub from: u64,
    pub room: usize,
}

/// One downlink record read for a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DownRecord {
    pub seq: u64,
    pub payload: Vec<u8>,
}

/// What the store read for a [`DownFetch`], after its commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DownRead {
    pub session: SessionId,
    pub app: AppIndex,
    /// The `heard` the fetch was made with: nothing waits between it and the first record.
    pub after: u64,
    /// The flow's largest sequence given so far (0: none).
    pub last: u64,
    /// Waiting records above `after`, in sequence order, as many as fit the room.
    pub records: Vec<DownRecord>,
}

#[derive(Debug, Default)]
pub struct Turn {
    pub id: u64,
    pub items: Vec<Apply>,
    pub arena: Vec<u8>,
    /// Records (not frames) in `items`, for the turn's bound.
    pub record_count: u64,
    /// Downlink reads (and deletions of what was delivered) in this turn's transactions; empty unless a session
    /// listens (docs/protocol.md 12), so the uplink's turns carry nothing more.
    pub fetches: Vec<DownFetch>,
}

impl Turn {
    pub fn records_of(&self, item: &Apply) -> &[u8] {
        &self.arena[item.records.clone()]
    }
    pub fn is_empty(&self) -> bool {
        self.items.is_empty() && self.fetches.is_empty()
    }
}

/// What the store reports for one flow after the commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowHeard {
    pub sender: SenderIndex,
    pub app: AppIndex,
    pub heard: u64,
}

/// The outcome of applying a turn.
#[derive(Debug, Default, Clone)]
pub struct Committed {
    pub turn: u64,
    /// Heard sequence after the commit of every flow the turn touched.
    pub heard: Vec<FlowHeard>,
    pub stored_records: u64,
    pub duplicate_records: u64,
    pub gap_records: u64,
    /// What the turn's downlink fetches read.
    pub down: Vec<DownRead>,
}
