//! The session cache: the node's on-demand state for active runs (BRIEF.md, "session cache").
//!
//! A session is made by the first packet of a run (one X25519, or a memo lookup) and swept after `idle` of quiet
//! when nothing of it is waiting for a commit or an ack. An idle link therefore holds no transport state at all.
//! Sessions keep key bytes, not cipher contexts.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use super::allow_list::SenderIndex;
use super::crypto::PacketKey;
use super::turn::{AppIndex, SessionId};

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
    pub replay: ReplayWindow,
    pub last_heard: Instant,
    pub flows: Vec<SessionFlow>,
    /// REFUSE frames owed: (app name, reason).
    pub refusals: Vec<(Box<[u8]>, u8)>,
    /// NOT_STORED frames owed: (app name, reason).
    pub not_stored: Vec<(Box<[u8]>, u8)>,
    /// Bytes received from this session since its last ack: the ack may not be larger (docs/protocol.md 9).
    pub ack_budget: usize,
    /// Turns not yet committed that hold frames of this session; a session with any is never swept.
    pub turns_waiting: u32,
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
        });
        // Just pushed, so `last_mut` is `Some`.
        self.flows.last_mut().expect("flow was just pushed")
    }
    pub fn owes_ack(&self) -> bool {
        !self.refusals.is_empty()
            || !self.not_stored.is_empty()
            || self.flows.iter().any(|f| f.ack_owed)
    }
}

/// All active sessions, found by (key id, run id) — the two cleartext fields of a sender packet.
///
/// Several sessions may share one (key id, run id), one per sender: senders whose key ids collide are told apart
/// only by their keys, and the run id travels in clear, so one listed sender can send under another's run id.
/// Each keeps its own session, so neither can take over or block the other's run (protocol.md 6).
#[derive(Debug, Default)]
pub struct SessionCache {
    /// The first session of each (key id, run id).
    by_run: HashMap<(u32, u64), SessionId>,
    /// Any further sessions under the same (key id, run id): only ever filled for colliding key ids.
    more: HashMap<(u32, u64), Vec<SessionId>>,
    sessions: HashMap<SessionId, Session>,
    next_id: SessionId,
}

/// Takes session `id` out of the index of (key id, run id) `key`.
fn unindex(
    by_run: &mut HashMap<(u32, u64), SessionId>,
    more: &mut HashMap<(u32, u64), Vec<SessionId>>,
    key: (u32, u64),
    id: SessionId,
) {
    if by_run.get(&key) == Some(&id) {
        match more.get_mut(&key).and_then(|v| v.pop()) {
            Some(next) => {
                by_run.insert(key, next);
            }
            None => {
                by_run.remove(&key);
            }
        }
    } else if let Some(v) = more.get_mut(&key) {
        v.retain(|&other| other != id);
    }
    if more.get(&key).is_some_and(|v| v.is_empty()) {
        more.remove(&key);
    }
}

impl SessionCache {
    pub fn len(&self) -> usize {
        self.sessions.len()
    }
    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
    }
    /// Puts the sessions of (key id, run id) into `out` (cleared first): usually none or one.
    pub fn find(&self, key_id: u32, run_id: u64, out: &mut Vec<SessionId>) {
        out.clear();
        let key = (key_id, run_id);
        if let Some(&id) = self.by_run.get(&key) {
            out.push(id);
            if let Some(v) = self.more.get(&key) {
                out.extend_from_slice(v);
            }
        }
    }
    pub fn get(&self, id: SessionId) -> Option<&Session> {
        self.sessions.get(&id)
    }
    pub fn get_mut(&mut self, id: SessionId) -> Option<&mut Session> {
        self.sessions.get_mut(&id)
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
        let key = (key_id, run_id);
        match self.by_run.entry(key) {
            // Another sender of this key id under the same run id (by chance, about 2^-64 per pair, or on
            // purpose): both sessions stay, each opened by its own key.
            Entry::Occupied(_) => self.more.entry(key).or_default().push(id),
            Entry::Vacant(slot) => {
                slot.insert(id);
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
                replay: ReplayWindow::default(),
                last_heard: now,
                flows: Vec::new(),
                refusals: Vec::new(),
                not_stored: Vec::new(),
                ack_budget: 0,
                turns_waiting: 0,
            },
        );
        id
    }
    /// Removes sessions quiet for `idle` with nothing waiting; returns how many.
    pub fn sweep(&mut self, now: Instant, idle: Duration) -> usize {
        let before = self.sessions.len();
        let (by_run, more) = (&mut self.by_run, &mut self.more);
        self.sessions.retain(|_, s| {
            let keep = s.turns_waiting > 0
                || s.owes_ack()
                || now.saturating_duration_since(s.last_heard) < idle;
            if !keep {
                unindex(by_run, more, (s.key_id, s.run_id), s.id);
            }
            keep
        });
        self.sessions.shrink_to(self.sessions.len() * 2);
        self.by_run.shrink_to(self.by_run.len() * 2);
        before - self.sessions.len()
    }
    /// Points every session at its sender's index in a new allow-list (a reload), or removes it when `remap`
    /// says its sender is gone. Returns the ids of the sessions removed.
    pub fn remap_senders(
        &mut self,
        mut remap: impl FnMut(SenderIndex) -> Option<SenderIndex>,
    ) -> Vec<SessionId> {
        let mut removed = Vec::new();
        let (by_run, more) = (&mut self.by_run, &mut self.more);
        self.sessions.retain(|_, s| match remap(s.sender) {
            Some(index) => {
                s.sender = index;
                true
            }
            None => {
                unindex(by_run, more, (s.key_id, s.run_id), s.id);
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
        assert!(cache.more.is_empty());
        assert_eq!(cache.sweep(now + idle * 3, idle), 2);
        cache.find(7, 42, &mut found);
        assert!(found.is_empty());
        cache.find(7, 43, &mut found);
        assert!(found.is_empty(), "{other}");
        assert!(cache.by_run.is_empty() && cache.more.is_empty());
    }
}
