//! The session cache: the node's on-demand state for active runs (BRIEF.md, "session cache").
//!
//! A session is made by the first packet of a run (one X25519, or a memo lookup) and swept after `idle` of quiet
//! when nothing of it is waiting for a commit or an ack. An idle link therefore holds no transport state at all.
//! Sessions keep key bytes, not cipher contexts.

use std::collections::HashMap;
use std::collections::hash_map::Entry as Entry_;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use super::allow_list::SenderIndex;
use super::crypto::PacketKey;
use super::turn::{AppIndex, DownRead, SessionId};

/// Width of the replay window, in packet numbers (docs/protocol.md 6, step 4).
pub const REPLAY_WINDOW: u64 = 64;

/// Accepts each packet number once, within a window below the largest seen (the scheme of RFC 4303 3.4.3).
#[derive(Debug, Clone, Default)]
pub struct ReplayWindow {
    largest: u64,
    /// Bit i set: `largest - i` was seen. Bit 0 is `largest` itself once anything was seen.
    seen: u64,
}

impl ReplayWindow {
    /// Whether `pn` would be accepted (cheap, before decryption).
    pub fn check(&self, pn: u64) -> bool {
        if self.seen == 0 || pn > self.largest {
            return true;
        }
        let back = self.largest - pn;
        back < REPLAY_WINDOW && self.seen & (1 << back) == 0
    }
    /// Marks `pn` seen (only after it authenticated). Returns whether it is the new largest.
    pub fn mark(&mut self, pn: u64) -> bool {
        if self.seen == 0 {
            self.largest = pn;
            self.seen = 1;
            return true;
        }
        if pn > self.largest {
            let shift = pn - self.largest;
            self.seen = if shift >= REPLAY_WINDOW {
                1
            } else {
                (self.seen << shift) | 1
            };
            self.largest = pn;
            true
        } else {
            self.seen |= 1 << (self.largest - pn);
            false
        }
    }
    pub fn largest(&self) -> u64 {
        self.largest
    }
}

/// A flow of this session as the session knows it.
#[derive(Debug, Clone)]
pub struct SessionFlow {
    pub app: AppIndex,
    /// The flow's heard sequence as of the last commit this session saw; `None` until the store told us.
    pub heard: Option<u64>,
    /// An ACK for this flow is owed after the next commit (or now, if nothing of it is in a turn).
    pub ack_owed: bool,
    /// The heard sequence the last ACK of this flow carried: while later turns of the session wait for their
    /// commit, an ACK goes out only for progress beyond it.
    pub acked: Option<u64>,
}

/// A REFUSE or NOT_STORED frame a session is owed (protocol.md 5.2, 5.3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    pub app: Box<[u8]>,
    pub reason: u8,
    /// The turn that holds DATA frames of the packet that earned it, while that turn is not finished: the notice
    /// travels in that turn's answer, beside the ACKs the same packet earned, so one packet gets one answer
    /// (protocol.md 5.3). `None`: it goes in the session's next answer.
    pub after_turn: Option<u64>,
}

/// A downlink flow this session listens on (docs/protocol.md 12.3).
#[derive(Debug, Clone)]
pub struct DownFlow {
    pub app: AppIndex,
    /// The device's downlink heard sequence, as its LISTENs said (the largest in this session).
    pub heard: u64,
    /// The largest sequence sent in a DOWN frame; above `heard`, records are unacknowledged.
    pub sent_through: u64,
    /// A read of this flow is in a turn not yet finished.
    pub fetching: bool,
    /// The downlink RTO, and when it passes while records are unacknowledged.
    pub rto: Duration,
    pub deadline: Option<Instant>,
    /// `last` of the flow's latest read: more waits beyond `sent_through` while it is above.
    pub node_last: u64,
}

/// What a session holds for downlink; only sessions that sent LISTEN have one, so the uplink's sessions pay a
/// pointer and nothing more.
#[derive(Debug, Default)]
pub struct SessionDown {
    pub flows: Vec<DownFlow>,
    /// Reads of finished turns, for the session's next answer.
    pub ready: Vec<DownRead>,
    /// Version 1.2 (docs/protocol.md 13): the run sent RESPONSE over UDP.
    pub wide: Option<Box<super::wide::Wide>>,
}

impl SessionDown {
    pub fn flow_mut(&mut self, app: AppIndex, rto: Duration) -> &mut DownFlow {
        if let Some(i) = self.flows.iter().position(|f| f.app == app) {
            return &mut self.flows[i];
        }
        self.flows.push(DownFlow {
            app,
            heard: 0,
            sent_through: 0,
            fetching: false,
            rto,
            deadline: None,
            node_last: 0,
        });
        self.flows.last_mut().expect("flow was just pushed")
    }
}

#[derive(Debug)]
pub struct Session {
    pub id: SessionId,
    pub sender: SenderIndex,
    pub key_id: u32,
    pub run_id: u64,
    /// Other listed senders share this key id. Only then may a packet under this (key id, run id) that this
    /// session's key does not open belong to someone else, and be tried against their keys (protocol.md 6).
    pub shared_key_id: bool,
    pub k_s2n: PacketKey,
    pub k_n2s: PacketKey,
    pub peer: SocketAddr,
    /// Where the session's next answer goes when it is not `peer`: the link request (over HTTP, protocol.md 10)
    /// whose packets that answer answers. Set by each link packet, and by each finished turn to the last link
    /// request of the session in it; cleared by a UDP packet that moves `peer`.
    pub answer_to: Option<SocketAddr>,
    pub replay: ReplayWindow,
    pub last_heard: Instant,
    pub flows: Vec<SessionFlow>,
    /// REFUSE frames owed.
    pub refusals: Vec<Notice>,
    /// NOT_STORED frames owed.
    pub not_stored: Vec<Notice>,
    /// Bytes received from this session less the bytes of the acks sent to it: the next ack may not be larger, so
    /// the node never answers a session with more than it received (docs/protocol.md 9).
    pub ack_budget: usize,
    /// Turns not yet committed that hold frames of this session; a session with any is never swept.
    pub turns_waiting: u32,
    /// Downlink state, once the run sent LISTEN (docs/protocol.md 12).
    pub down: Option<Box<SessionDown>>,
}

impl Session {
    pub fn flow_mut(&mut self, app: AppIndex) -> &mut SessionFlow {
        if let Some(i) = self.flows.iter().position(|f| f.app == app) {
            return &mut self.flows[i];
        }
        self.flows.push(SessionFlow {
            app,
            heard: None,
            ack_owed: false,
            acked: None,
        });
        // Just pushed, so `last_mut` is `Some`.
        self.flows.last_mut().expect("flow was just pushed")
    }
    pub fn owes_ack(&self) -> bool {
        !self.refusals.is_empty()
            || !self.not_stored.is_empty()
            || self.flows.iter().any(|f| f.ack_owed)
            || self.down.as_ref().is_some_and(|d| !d.ready.is_empty())
    }
}

/// One session in the index of its key id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    run_id: u64,
    sender: SenderIndex,
    id: SessionId,
}

/// The sessions of one key id: nearly always one (one sender, one run); a few for a sender with several runs at
/// once, or for senders whose key ids collide. Inline for one, so the common case costs no allocation.
#[derive(Debug, Clone)]
enum Runs {
    One(Entry),
    Many(Vec<Entry>),
}

impl Runs {
    fn entries(&self) -> &[Entry] {
        match self {
            Runs::One(e) => std::slice::from_ref(e),
            Runs::Many(v) => v,
        }
    }
    fn push(&mut self, e: Entry) {
        match self {
            Runs::One(first) => *self = Runs::Many(vec![*first, e]),
            Runs::Many(v) => v.push(e),
        }
    }
    /// Removes session `id`; returns whether none are left.
    fn remove(&mut self, id: SessionId) -> bool {
        match self {
            Runs::One(e) => e.id == id,
            Runs::Many(v) => {
                v.retain(|e| e.id != id);
                match v.as_slice() {
                    [] => true,
                    [only] => {
                        *self = Runs::One(*only);
                        false
                    }
                    _ => false,
                }
            }
        }
    }
    fn entries_mut(&mut self) -> &mut [Entry] {
        match self {
            Runs::One(e) => std::slice::from_mut(e),
            Runs::Many(v) => v,
        }
    }
}

/// Whether a session waits for nothing: no turn holds its frames and it owes no ack. Only such a session may be
/// swept or evicted.
fn is_idle(s: &Session) -> bool {
    s.turns_waiting == 0 && !s.owes_ack()
}

/// What [`SessionCache::room_for`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Room {
    /// The sender is below its cap.
    Free,
    /// The sender is at its cap; this idle session of it (its least recently heard) can make room.
    Evict(SessionId),
    /// The sender is at its cap and every one of its sessions waits for a commit or an ack.
    Full,
}

/// All active sessions, found by (key id, run id) — the two cleartext fields of a sender packet.
///
/// Several sessions may share one (key id, run id), one per sender: senders whose key ids collide are told apart
/// only by their keys, and the run id travels in clear, so one listed sender can send under another's run id.
/// Each keeps its own session, so neither can take over or block the other's run (protocol.md 6).
///
/// The index is by key id, so the sessions of one sender (its runs) are found together: that is what bounds how
/// many one sender may hold ([`SessionCache::room_for`], protocol.md 6.2).
#[derive(Debug, Default)]
pub struct SessionCache {
    by_key: HashMap<u32, Runs>,
    sessions: HashMap<SessionId, Session>,
    next_id: SessionId,
}

impl SessionCache {
    pub fn len(&self) -> usize {
        self.sessions.len()
    }
    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
    }
    /// Key ids with sessions (the index's size).
    pub fn key_ids(&self) -> usize {
        self.by_key.len()
    }
    /// Puts the sessions of (key id, run id) into `out` (cleared first): usually none or one.
    pub fn find(&self, key_id: u32, run_id: u64, out: &mut Vec<SessionId>) {
        out.clear();
        if let Some(runs) = self.by_key.get(&key_id) {
            out.extend(
                runs.entries()
                    .iter()
                    .filter(|e| e.run_id == run_id)
                    .map(|e| e.id),
            );
        }
    }
    pub fn get(&self, id: SessionId) -> Option<&Session> {
        self.sessions.get(&id)
    }
    pub fn get_mut(&mut self, id: SessionId) -> Option<&mut Session> {
        self.sessions.get_mut(&id)
    }
    /// Sessions `sender` (of key id `key_id`) holds now.
    pub fn sessions_of(&self, key_id: u32, sender: SenderIndex) -> usize {
        self.by_key.get(&key_id).map_or(0, |runs| {
            runs.entries().iter().filter(|e| e.sender == sender).count()
        })
    }
    /// The sessions `sender` holds under `key_id` (its key's id), for downlink records pushed to its live runs.
    pub fn ids_of(&self, key_id: u32, sender: SenderIndex, out: &mut Vec<SessionId>) {
        out.clear();
        if let Some(runs) = self.by_key.get(&key_id) {
            out.extend(
                runs.entries()
                    .iter()
                    .filter(|e| e.sender == sender)
                    .map(|e| e.id),
            );
        }
    }
    /// Whether `sender` may have one more session under a cap of `cap` per sender, and which of its sessions
    /// would go to make room: the idle one heard from least recently.
    pub fn room_for(&self, key_id: u32, sender: SenderIndex, cap: usize) -> Room {
        let Some(runs) = self.by_key.get(&key_id) else {
            return Room::Free;
        };
        let mut count = 0;
        let mut oldest: Option<(Instant, SessionId)> = None;
        for e in runs.entries().iter().filter(|e| e.sender == sender) {
            count += 1;
            if let Some(s) = self.sessions.get(&e.id)
                && is_idle(s)
                && oldest.is_none_or(|(t, _)| s.last_heard < t)
            {
                oldest = Some((s.last_heard, e.id));
            }
        }
        if count < cap {
            Room::Free
        } else {
            oldest.map_or(Room::Full, |(_, id)| Room::Evict(id))
        }
    }
    /// Removes session `id` (to make room: it must be idle).
    pub fn remove(&mut self, id: SessionId) -> bool {
        let Some(s) = self.sessions.remove(&id) else {
            return false;
        };
        debug_assert!(is_idle(&s), "only idle sessions are evicted");
        Self::unindex(&mut self.by_key, s.key_id, id);
        true
    }
    fn unindex(by_key: &mut HashMap<u32, Runs>, key_id: u32, id: SessionId) {
        if let Some(runs) = by_key.get_mut(&key_id)
            && runs.remove(id)
        {
            by_key.remove(&key_id);
        }
    }
    #[allow(clippy::too_many_arguments)]
    pub fn insert(
        &mut self,
        sender: SenderIndex,
        key_id: u32,
        run_id: u64,
        shared_key_id: bool,
        k_s2n: PacketKey,
        k_n2s: PacketKey,
        peer: SocketAddr,
        now: Instant,
    ) -> SessionId {
        let id = self.next_id;
        self.next_id += 1;
        let entry = Entry { run_id, sender, id };
        // Another run of this sender, or another sender of this key id (by chance or on purpose, even under the
        // same run id): all stay, each opened by its own key.
        match self.by_key.entry(key_id) {
            Entry_::Occupied(mut o) => o.get_mut().push(entry),
            Entry_::Vacant(v) => {
                v.insert(Runs::One(entry));
            }
        }
        self.sessions.insert(
            id,
            Session {
                id,
                sender,
                key_id,
                run_id,
                shared_key_id,
                k_s2n,
                k_n2s,
                peer,
                answer_to: None,
                replay: ReplayWindow::default(),
                last_heard: now,
                flows: Vec::new(),
                refusals: Vec::new(),
                not_stored: Vec::new(),
                ack_budget: 0,
                turns_waiting: 0,
                down: None,
            },
        );
        id
    }
    /// Removes sessions quiet for `idle` with nothing waiting; returns how many. Gives the tables' spare room back
    /// (sessions come and go in bursts: BRIEF.md, memory after a burst).
    pub fn sweep(&mut self, now: Instant, idle: Duration) -> usize {
        let before = self.sessions.len();
        let by_key = &mut self.by_key;
        self.sessions.retain(|_, s| {
            let keep = !is_idle(s) || now.saturating_duration_since(s.last_heard) < idle;
            if !keep {
                Self::unindex(by_key, s.key_id, s.id);
            }
            keep
        });
        self.sessions.shrink_to(self.sessions.len() * 2);
        self.by_key.shrink_to(self.by_key.len() * 2);
        before - self.sessions.len()
    }
    /// Points every session at its sender's index in a new allow-list (a reload), or removes it when `remap`
    /// says its sender is gone. Returns the ids of the sessions removed.
    pub fn remap_senders(
        &mut self,
        mut remap: impl FnMut(SenderIndex) -> Option<SenderIndex>,
    ) -> Vec<SessionId> {
        let mut removed = Vec::new();
        let by_key = &mut self.by_key;
        self.sessions.retain(|_, s| match remap(s.sender) {
            Some(index) => {
                s.sender = index;
                if let Some(runs) = by_key.get_mut(&s.key_id) {
                    for e in runs.entries_mut().iter_mut().filter(|e| e.id == s.id) {
                        e.sender = index;
                    }
                }
                true
            }
            None => {
                Self::unindex(by_key, s.key_id, s.id);
                removed.push(s.id);
                false
            }
        });
        removed
    }
    /// Sets each session's `shared_key_id` anew (after a reload changed who shares a key id).
    pub fn set_shared_key_ids(&mut self, mut shared: impl FnMut(u32) -> bool) {
        for s in self.sessions.values_mut() {
            s.shared_key_id = shared(s.key_id);
        }
    }
    pub fn ids(&self) -> Vec<SessionId> {
        self.sessions.keys().copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replay_window_accepts_each_number_once() {
        let mut w = ReplayWindow::default();
        assert!(w.check(5));
        assert!(w.mark(5));
        assert!(!w.check(5));
        assert!(w.check(3));
        assert!(!w.mark(3));
        assert!(!w.check(3));
        assert!(w.check(100));
        w.mark(100);
        assert!(!w.check(100 - REPLAY_WINDOW));
        assert!(w.check(100 - REPLAY_WINDOW + 1));
        assert!(!w.check(0));
    }

    fn insert(
        cache: &mut SessionCache,
        sender: SenderIndex,
        run_id: u64,
        now: Instant,
    ) -> SessionId {
        let peer = SocketAddr::from(([127, 0, 0, 1], 1));
        cache.insert(sender, 7, run_id, true, [0; 16], [0; 16], peer, now)
    }

    #[test]
    fn senders_sharing_a_key_id_and_run_id_each_keep_their_session() {
        let now = Instant::now();
        let idle = Duration::from_secs(1);
        let mut cache = SessionCache::default();
        let mut found = Vec::new();
        let a = insert(&mut cache, 0, 42, now);
        let b = insert(&mut cache, 1, 42, now + idle / 2);
        let c = insert(&mut cache, 2, 42, now + idle);
        let other = insert(&mut cache, 0, 43, now + idle);
        cache.find(7, 42, &mut found);
        assert_eq!(found, vec![a, b, c]);
        // a is swept first: b and c are still found, the first of them now in a's place.
        assert_eq!(cache.sweep(now + idle, idle), 1);
        cache.find(7, 42, &mut found);
        found.sort_unstable();
        assert_eq!(found, vec![b, c]);
        // A middle one removed by a reload.
        assert_eq!(cache.remap_senders(|s| (s != 2).then_some(s)), vec![c]);
        cache.find(7, 42, &mut found);
        assert_eq!(found, vec![b]);
        assert_eq!(cache.sweep(now + idle * 3, idle), 2);
        cache.find(7, 42, &mut found);
        assert!(found.is_empty());
        cache.find(7, 43, &mut found);
        assert!(found.is_empty(), "{other}");
        assert_eq!(cache.key_ids(), 0);
    }

    #[test]
    fn a_sender_at_its_cap_makes_room_from_its_least_recently_heard_idle_session() {
        let t0 = Instant::now();
        let mut cache = SessionCache::default();
        let ids: Vec<SessionId> = (0..3)
            .map(|k| insert(&mut cache, 0, 100 + k, t0 + Duration::from_millis(k)))
            .collect();
        let other = insert(&mut cache, 1, 100, t0);
        assert_eq!(cache.sessions_of(7, 0), 3);
        assert_eq!(cache.room_for(7, 0, 4), Room::Free);
        assert_eq!(cache.room_for(7, 0, 3), Room::Evict(ids[0]));
        // The oldest is waiting for a commit: the next oldest goes instead.
        cache.get_mut(ids[0]).unwrap().turns_waiting = 1;
        assert_eq!(cache.room_for(7, 0, 3), Room::Evict(ids[1]));
        cache.get_mut(ids[1]).unwrap().turns_waiting = 1;
        cache.get_mut(ids[2]).unwrap().refusals.push(Notice {
            app: b"x"[..].into(),
            reason: 1,
            after_turn: None,
        });
        assert_eq!(cache.room_for(7, 0, 3), Room::Full);
        // Another sender of the same key id is counted apart.
        assert_eq!(cache.room_for(7, 1, 1), Room::Evict(other));
        assert!(cache.remove(other));
        let mut found = Vec::new();
        cache.find(7, 100, &mut found);
        assert_eq!(found, vec![ids[0]]);
    }
}
