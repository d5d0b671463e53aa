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

#[derive(Debug, Default)]
pub struct Turn {
    pub id: u64,
    pub items: Vec<Apply>,
    pub arena: Vec<u8>,
    /// Records (not frames) in `items`, for the turn's bound.
    pub record_count: u64,
}

impl Turn {
    pub fn records_of(&self, item: &Apply) -> &[u8] {
        &self.arena[item.records.clone()]
    }
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
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
}
