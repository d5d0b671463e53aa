//! Wide downlink (docs/protocol.md 13): what a session of version 1.2 holds beside section 12's downlink — the
//! challenge that validates its address, the validated address, and the congestion controller that bounds what
//! the node sends it beyond what it acknowledged once the address is validated. Sans-IO: time comes in as `now`.
//!
//! The controller is NewReno in bytes of DOWN datagrams (13.3), written here rather than taken from a QUIC crate:
//! those controllers are bound to their connection's packet numbers and ack ranges, and this one is driven by
//! a cumulative `heard` per flow and a few dozen lines.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use super::turn::AppIndex;
use super::wire;
use pure_link::sender::Rtt;

/// Datagrams in the first window (13.3).
const INITIAL_WINDOW: usize = 10;
/// The window never goes below this many datagrams.
const MIN_WINDOW: usize = 2;
/// Nor above this many.
const MAX_WINDOW: usize = 256;
/// The third duplicate acknowledgement since `heard` last grew is a loss.
const DUPLICATES_FOR_LOSS: u32 = 3;
/// The RTO before any sample, and its bounds (13.3). The floor is QUIC's largest acknowledgement delay: a device
/// acknowledges at once, and a node's turn that stalls on its disk delays the retransmission's read as much as the
/// acknowledgement, so a low floor costs a read, not a window sent twice.
const INITIAL_RTO: Duration = Duration::from_millis(500);
const MIN_RTO: Duration = Duration::from_millis(25);
pub const MAX_RTO: Duration = Duration::from_secs(8);
/// This node reads at most this many bytes of records for one read of a validated session (13.1, step 4).
pub const MAX_READ: usize = 64 * 1024;
/// And puts at most this many datagrams into one answer.
pub const MAX_DATAGRAMS_PER_ANSWER: usize = 64;

/// A datagram holding DOWN records of one flow, not yet acknowledged.
#[derive(Debug, Clone, Copy)]
struct InFlight {
    app: AppIndex,
    last_seq: u64,
    bytes: usize,
    sent_at: Instant,
    /// Its records had been sent before: its acknowledgement gives no RTT sample (Karn).
    again: bool,
}

/// What a session of version 1.2 holds (docs/protocol.md 13.1).
#[derive(Debug)]
pub struct Wide {
    /// The largest node datagram the device takes, as its last RESPONSE said (96–1472).
    pub datagram: usize,
    /// Bytes of DOWN datagrams it takes in flight beyond its `heard`.
    pub window: usize,
    /// The current challenge: its token and the address it was made for.
    challenge: Option<([u8; wire::TOKEN_LEN], SocketAddr)>,
    /// The address the device proved it receives at.
    validated: Option<SocketAddr>,
    cwnd: usize,
    ssthresh: usize,
    in_flight: Vec<InFlight>,
    /// Duplicate acknowledgements since `heard` last grew, per flow (few flows: a short list).
    duplicates: Vec<(AppIndex, u32)>,
    /// In recovery until this flow's `heard` reaches this sequence.
    recovery: Vec<(AppIndex, u64)>,
    rtt: Rtt,
    backoff: u32,
    /// Sequences of each flow sent at least once, for Karn's rule.
    most_sent: Vec<(AppIndex, u64)>,
}

/// What an acknowledgement (a LISTEN) did to the controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckOutcome {
    /// `heard` grew, or nothing was in flight.
    Progress,
    /// A duplicate below the loss threshold: nothing to do.
    Duplicate,
    /// The third duplicate: every datagram of the flow in flight is lost; send again from `heard`.
    Lost,
}

impl Wide {
    pub fn new(datagram: u64, window: u64) -> Self {
        let mut w = Wide {
            datagram: MSS_MIN,
            window: 0,
            challenge: None,
            validated: None,
            cwnd: 0,
            ssthresh: usize::MAX,
            in_flight: Vec::new(),
            duplicates: Vec::new(),
            recovery: Vec::new(),
            rtt: Rtt::default(),
            backoff: 0,
            most_sent: Vec::new(),
        };
        w.said(datagram, window);
        w.restart();
        w
    }

    /// A RESPONSE's `datagram` and `window`: a value outside 96–1472 is taken as the nearest bound.
    pub fn said(&mut self, datagram: u64, window: u64) {
        self.datagram = datagram.clamp(MSS_MIN as u64, wire::MAX_DATAGRAM as u64) as usize;
        self.window = usize::try_from(window).unwrap_or(usize::MAX);
    }

    fn restart(&mut self) {
        self.cwnd = INITIAL_WINDOW * self.datagram;
        self.ssthresh = usize::MAX;
        self.in_flight.clear();
        self.duplicates.clear();
        self.recovery.clear();
        self.rtt = Rtt::default();
        self.backoff = 0;
    }

    /// Whether `peer` is the validated address.
    pub fn validated_at(&self, peer: SocketAddr) -> bool {
        self.validated == Some(peer)
    }

    /// A RESPONSE's token from `from`, the session's peer after the packet: validates `from` if it is the current
    /// challenge's token for that address (13.1, step 1). Returns whether the address became validated now.
    pub fn response(&mut self, token: &[u8; wire::TOKEN_LEN], from: SocketAddr) -> bool {
        if self.validated == Some(from) {
            return false;
        }
        let matches = self
            .challenge
            .is_some_and(|(t, at)| at == from && &t == token && t != [0; wire::TOKEN_LEN]);
        if matches {
            self.validated = Some(from);
            self.restart();
        }
        matches
    }

    /// The peer address moved (13.1, step 3): a validated address other than `peer` is validated no more, and
    /// what was in flight is lost. Returns whether the validation ended.
    pub fn peer_moved(&mut self, peer: SocketAddr) -> bool {
        if self.validated.is_some_and(|v| v != peer) {
            self.validated = None;
            self.restart();
            return true;
        }
        false
    }

    /// The CHALLENGE an answer to `peer` carries, if the peer is not validated: the current challenge's token if it
    /// was made for `peer`, else a new one from `make` (13.1, step 2).
    pub fn challenge_for(
        &mut self,
        peer: SocketAddr,
        make: impl FnOnce() -> [u8; wire::TOKEN_LEN],
    ) -> Option<[u8; wire::TOKEN_LEN]> {
        if self.validated == Some(peer) {
            return None;
        }
        match self.challenge {
            Some((token, at)) if at == peer => Some(token),
            _ => {
                let token = make();
                self.challenge = Some((token, peer));
                Some(token)
            }
        }
    }

    /// Bytes of DOWN datagrams that may still go out now: the smaller of the congestion window and the device's,
    /// less what is in flight.
    pub fn room(&self) -> usize {
        let limit = self.cwnd.min(self.window).min(MAX_WINDOW * self.datagram);
        limit.saturating_sub(self.bytes_in_flight())
    }

    pub fn bytes_in_flight(&self) -> usize {
        self.in_flight.iter().map(|f| f.bytes).sum()
    }

    pub fn has_in_flight(&self, app: AppIndex) -> bool {
        self.in_flight.iter().any(|f| f.app == app)
    }

    /// A datagram of `bytes` holding `app`'s records through `last_seq` went out at `now`.
    pub fn sent(&mut self, app: AppIndex, last_seq: u64, bytes: usize, now: Instant) {
        let most = match self.most_sent.iter_mut().find(|(a, _)| *a == app) {
            Some((_, m)) => m,
            None => {
                self.most_sent.push((app, 0));
                &mut self.most_sent.last_mut().expect("just pushed").1
            }
        };
        let again = last_seq <= *most;
        *most = (*most).max(last_seq);
        self.in_flight.push(InFlight {
            app,
            last_seq,
            bytes,
            sent_at: now,
            again,
        });
    }

    /// A LISTEN of `app` saying `heard`, against the flow's `old` heard (13.1, step 5; 13.3).
    pub fn acknowledged(
        &mut self,
        app: AppIndex,
        old: u64,
        heard: u64,
        now: Instant,
    ) -> AckOutcome {
        if heard > old {
            let mut acked = 0;
            let mut newest: Option<InFlight> = None;
            self.in_flight.retain(|f| {
                if f.app == app && f.last_seq <= heard {
                    acked += f.bytes;
                    if newest.is_none_or(|n| f.last_seq >= n.last_seq) {
                        newest = Some(*f);
                    }
                    false
                } else {
                    true
                }
            });
            self.duplicates.retain(|(a, _)| *a != app);
            self.backoff = 0;
            if let Some(f) = newest
                && !f.again
            {
                self.rtt.sample(now.saturating_duration_since(f.sent_at));
            }
            let recovering = match self.recovery.iter().position(|(a, _)| *a == app) {
                Some(i) if heard >= self.recovery[i].1 => {
                    self.recovery.swap_remove(i);
                    false
                }
                Some(_) => true,
                None => false,
            };
            if acked > 0 && !recovering {
                if self.cwnd < self.ssthresh {
                    self.cwnd += acked;
                } else {
                    self.cwnd += (self.datagram * acked / self.cwnd).max(1);
                }
                self.cwnd = self.cwnd.min(MAX_WINDOW * self.datagram);
            }
            return AckOutcome::Progress;
        }
        if !self.has_in_flight(app) {
            return AckOutcome::Progress;
        }
        let n = match self.duplicates.iter_mut().find(|(a, _)| *a == app) {
            Some((_, n)) => {
                *n += 1;
                *n
            }
            None => {
                self.duplicates.push((app, 1));
                1
            }
        };
        if n < DUPLICATES_FOR_LOSS {
            return AckOutcome::Duplicate;
        }
        if self.recovery.iter().any(|(a, _)| *a == app) {
            // One cut per window: the duplicates of what was in flight when it was lost say nothing new.
            return AckOutcome::Duplicate;
        }
        let sent = self
            .in_flight
            .iter()
            .filter(|f| f.app == app)
            .map(|f| f.last_seq)
            .max()
            .unwrap_or(old);
        self.recovery.push((app, sent));
        self.cwnd = (self.cwnd / 2).max(MIN_WINDOW * self.datagram);
        self.ssthresh = self.cwnd;
        self.lose(app);
        AckOutcome::Lost
    }

    /// Every datagram of `app` in flight is taken as lost (go-back-N: the device takes nothing past a gap).
    fn lose(&mut self, app: AppIndex) {
        self.in_flight.retain(|f| f.app != app);
        self.duplicates.retain(|(a, _)| *a != app);
    }

    /// The RTO passed with `app`'s records in flight (13.3): the window falls to its least, and what was in flight
    /// is lost.
    pub fn timed_out(&mut self, app: AppIndex) {
        self.ssthresh = (self.cwnd / 2).max(MIN_WINDOW * self.datagram);
        self.cwnd = MIN_WINDOW * self.datagram;
        self.backoff = (self.backoff + 1).min(8);
        self.recovery.retain(|(a, _)| *a != app);
        self.lose(app);
    }

    /// The RTO now: RFC 6298's estimator, doubled per timeout since `heard` last grew.
    pub fn rto(&self) -> Duration {
        let base = self.rtt.rto_within(INITIAL_RTO, MIN_RTO, MAX_RTO);
        (base * 2u32.pow(self.backoff)).min(MAX_RTO)
    }

    pub fn cwnd(&self) -> usize {
        self.cwnd
    }
}

/// A challenge's token: the first 8 bytes of HMAC-SHA-256 under the node's challenge key of a counter it never
/// repeats (docs/protocol.md 13), never all zero (that is an offer's).
pub fn token(key: &[u8; 32], counter: u64) -> [u8; wire::TOKEN_LEN] {
    use hmac::{Hmac, KeyInit, Mac};
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(key).expect("HMAC accepts any key length");
    mac.update(b"pure-serve challenge");
    mac.update(&counter.to_be_bytes());
    let mut token = [0; wire::TOKEN_LEN];
    token.copy_from_slice(&mac.finalize().into_bytes()[..wire::TOKEN_LEN]);
    if token == [0; wire::TOKEN_LEN] {
        token[0] = 1;
    }
    token
}

/// The smallest datagram a device may say it takes.
const MSS_MIN: usize = wire::MIN_SENDER_DATAGRAM;

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    #[test]
    fn only_the_current_challenges_token_from_its_address_validates() {
        let mut w = Wide::new(1200, 1 << 20);
        assert!(!w.response(&[0; 8], addr(1)), "an offer validates nothing");
        let t = w.challenge_for(addr(1), || [7; 8]).unwrap();
        assert!(
            !w.response(&t, addr(2)),
            "the token was sent to another address"
        );
        assert!(!w.response(&[8; 8], addr(1)));
        assert!(w.response(&t, addr(1)));
        assert!(w.validated_at(addr(1)));
        assert_eq!(w.challenge_for(addr(1), || [9; 8]), None);
        // The peer moves: no longer validated, and a new token for the new address.
        assert!(w.peer_moved(addr(2)));
        assert!(!w.validated_at(addr(2)));
        let t2 = w.challenge_for(addr(2), || [9; 8]).unwrap();
        assert_eq!(t2, [9; 8]);
        assert!(!w.response(&t, addr(2)), "the old token is forgotten");
        assert!(w.response(&t2, addr(2)));
    }

    #[test]
    fn the_window_grows_while_acknowledged_and_halves_at_the_third_duplicate() {
        let now = Instant::now();
        let mut w = Wide::new(1000, 1 << 30);
        assert_eq!(w.room(), 10_000);
        for s in 1..=10 {
            w.sent(0, s, 1000, now);
        }
        assert_eq!(w.room(), 0);
        let later = now + Duration::from_millis(10);
        assert_eq!(w.acknowledged(0, 0, 5, later), AckOutcome::Progress);
        assert_eq!(
            w.cwnd(),
            15_000,
            "slow start: the window grows by what was acknowledged"
        );
        assert_eq!(w.room(), 10_000);
        assert_eq!(
            w.rto(),
            Duration::from_millis(30),
            "a 10 ms sample: srtt + 4 × rttvar"
        );
        assert_eq!(w.acknowledged(0, 5, 5, later), AckOutcome::Duplicate);
        assert_eq!(w.acknowledged(0, 5, 5, later), AckOutcome::Duplicate);
        assert_eq!(w.acknowledged(0, 5, 5, later), AckOutcome::Lost);
        assert_eq!(w.cwnd(), 7_500);
        assert!(
            !w.has_in_flight(0),
            "go-back-N: everything in flight is lost"
        );
        // Sent again, and the duplicates of the old window cut nothing more until recovery ends.
        for s in 6..=10 {
            w.sent(0, s, 1000, later);
        }
        for _ in 0..5 {
            w.acknowledged(0, 5, 5, later);
        }
        assert_eq!(w.cwnd(), 7_500);
        assert_eq!(w.acknowledged(0, 5, 10, later), AckOutcome::Progress);
        assert_eq!(
            w.cwnd(),
            7_500 + 1000 * 5000 / 7500,
            "recovery over, it grows by a datagram per window (congestion avoidance)"
        );
    }

    #[test]
    fn a_timeout_leaves_two_datagrams_and_doubles_the_rto_and_the_devices_window_bounds_all() {
        let now = Instant::now();
        let mut w = Wide::new(1200, 3000);
        assert_eq!(w.room(), 3000, "the device's window is the smaller");
        w.sent(0, 1, 1200, now);
        w.timed_out(0);
        assert_eq!(w.cwnd(), 2400);
        assert_eq!(w.rto(), Duration::from_secs(1));
        assert_eq!(w.bytes_in_flight(), 0);
        // Records sent again give no RTT sample (Karn).
        w.sent(0, 1, 1200, now);
        w.acknowledged(0, 0, 1, now + Duration::from_secs(3));
        assert_eq!(w.rto(), INITIAL_RTO);
    }
}
