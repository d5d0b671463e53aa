//! The session cache: the node's on-demand state for active runs (BRIEF.md, "session cache").
//!
//! A session is made by the first packet of a run (one X25519, or a memo lookup) and swept after `idle` of quiet
//! when nothing of it is waiting for a commit or an ack. An idle link therefore holds no transport state at all.
//! Sessions keep key bytes, not cipher contexts.

use std::collections::HashMap;
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
    pub k_s2n: PacketKey,
    pub k_n2s: PacketKey,
    pub peer: SocketAddr,
    pub replay: ReplayWindow,
    pub last_heard: Instant,
    pub flows: Vec<SessionFlow>,
    /// REFUSE frames owed: (app name, reason).
    pub refusals: Vec<(Box<[u8]>, u8)>,
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
        !self.refusals.is_empty() || self.flows.iter().any(|f| f.ack_owed)
    }
}

/// All active sessions, found by (key id, run id) — the two cleartext fields of a sender packet.
#[derive(Debug, Default)]
pub struct SessionCache {
    by_run: HashMap<(u32, u64), SessionId>,
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
    pub fn find(&self, key_id: u32, run_id: u64) -> Option<SessionId> {
        self.by_run.get(&(key_id, run_id)).copied()
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
        k_s2n: PacketKey,
        k_n2s: PacketKey,
        peer: SocketAddr,
        now: Instant,
    ) -> SessionId {
        let id = self.next_id;
        self.next_id += 1;
        if let Some(old) = self.by_run.insert((key_id, run_id), id) {
            // Two allowed senders with the same key id drew the same run id (about 2^-64 per pair): the older
            // session loses its index entry and is swept when idle.
            let _ = old;
        }
        self.sessions.insert(
            id,
            Session {
                id,
                sender,
                key_id,
                run_id,
                k_s2n,
                k_n2s,
                peer,
                replay: ReplayWindow::default(),
                last_heard: now,
                flows: Vec::new(),
                refusals: Vec::new(),
                ack_budget: 0,
                turns_waiting: 0,
            },
        );
        id
    }
    /// Removes sessions quiet for `idle` with nothing waiting; returns how many.
    pub fn sweep(&mut self, now: Instant, idle: Duration) -> usize {
        let before = self.sessions.len();
        let by_run = &mut self.by_run;
        self.sessions.retain(|_, s| {
            let keep = s.turns_waiting > 0
                || s.owes_ack()
                || now.saturating_duration_since(s.last_heard) < idle;
            if !keep && by_run.get(&(s.key_id, s.run_id)) == Some(&s.id) {
                by_run.remove(&(s.key_id, s.run_id));
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
        let by_run = &mut self.by_run;
        self.sessions.retain(|_, s| match remap(s.sender) {
            Some(index) => {
                s.sender = index;
                true
            }
            None => {
                if by_run.get(&(s.key_id, s.run_id)) == Some(&s.id) {
                    by_run.remove(&(s.key_id, s.run_id));
                }
                removed.push(s.id);
                false
            }
        });
        removed
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
}
