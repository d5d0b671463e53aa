//! Which outlets of a fleet this node drives: the leases in the database's `outlets` table, kept as a sans-IO state
//! machine (docs/scale-out.md, "Outlets of a fleet").
//!
//! Every link, wire and webhook outlet of a fleet is driven by one node at a time. [`Leases`] decides when this
//! node renews (every [`RENEW_EVERY`], one renewal in flight at a time), learns from each answer which outlets it
//! holds and how far every outlet's far side has acknowledged, and says when to start driving an outlet
//! ([`LeaseEvent::Take`]) and when to stop ([`LeaseEvent::Lose`]). It never touches the database or a clock: the
//! driver hands it `now` (the node's **monotonic** clock) and the rows a renewal returned, and runs the statement.
//!
//! The one rule that keeps two nodes from driving one outlet at once: a lease is held until [`HOLD_FOR`] after the
//! moment the last renewal that succeeded was **sent**, by this node's clock, and the database grants it for
//! [`DATABASE_LEASE`] from a moment after that sending, by its own clock. Since `HOLD_FOR < DATABASE_LEASE` and
//! both are measured from no earlier than the sending, this node stops before any other node can take the lease,
//! whatever the two clocks read, as long as neither runs more than 30 % fast over 10 s. An answer that comes back
//! after its hold has run out gives nothing (the lease may be someone else's by then).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// How often a node renews its leases and writes its outlets' progress.
pub const RENEW_EVERY: Duration = Duration::from_secs(3);

/// How long after sending the last good renewal a node still drives the outlets it returned.
pub const HOLD_FOR: Duration = Duration::from_secs(7);

/// How long the database grants a lease for, from the renewal's `now()`.
pub const DATABASE_LEASE: Duration = Duration::from_secs(10);

/// An outlet of an app, as the database names it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OutletKey {
    pub app: String,
    pub name: String,
}

/// What the driver must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseEvent {
    /// This node now drives the outlet: start it as at a restart, from what its far side acknowledged.
    Take { outlet: OutletKey, acked: u64 },
    /// This node no longer drives the outlet: stop it on the sending loop now.
    Lose { outlet: OutletKey },
}

/// A renewal to run: the outlets this node wants, each with the highest position its far side acknowledged to
/// this node (0 where this node does not drive it: the database keeps the greatest).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Renewal {
    pub sent_at: Instant,
    pub outlets: Vec<(OutletKey, u64)>,
}

/// The leases of one node (module docs).
#[derive(Debug)]
pub struct Leases {
    wanted: BTreeSet<OutletKey>,
    /// Outlets this node drives, with the far side's position as this node last knew it.
    held: BTreeMap<OutletKey, u64>,
    /// Every wanted outlet's acknowledged position, fleet-wide, as the last answer read it.
    fleet_acked: BTreeMap<OutletKey, u64>,
    /// When the renewal in flight was sent.
    in_flight: Option<Instant>,
    /// When the last renewal that succeeded was sent: the held leases end [`HOLD_FOR`] after it.
    last_good_sent: Option<Instant>,
    next_renewal: Instant,
}

impl Leases {
    /// No outlet wanted yet; the first renewal is due at once.
    pub fn new(now: Instant) -> Self {
        Leases {
            wanted: BTreeSet::new(),
            held: BTreeMap::new(),
            fleet_acked: BTreeMap::new(),
            in_flight: None,
            last_good_sent: None,
            next_renewal: now,
        }
    }

    /// The outlets of the apps file (at start and at each reload). An outlet held and no longer wanted is lost at
    /// once; a new one is asked for with the next renewal, which is made due now.
    pub fn set_wanted(
        &mut self,
        outlets: impl IntoIterator<Item = OutletKey>,
        now: Instant,
    ) -> Vec<LeaseEvent> {
        let wanted: BTreeSet<OutletKey> = outlets.into_iter().collect();
        let mut events = Vec::new();
        self.held.retain(|k, _| {
            let keep = wanted.contains(k);
            if !keep {
                events.push(LeaseEvent::Lose { outlet: k.clone() });
            }
            keep
        });
        self.fleet_acked.retain(|k, _| wanted.contains(k));
        if wanted.iter().any(|k| !self.wanted.contains(k)) {
            self.next_renewal = now;
        }
        self.wanted = wanted;
        events
    }

    /// Whether this node drives `outlet` now.
    pub fn holds(&self, outlet: &OutletKey) -> bool {
        self.held.contains_key(outlet)
    }

    /// The outlets this node drives.
    pub fn held(&self) -> impl Iterator<Item = &OutletKey> {
        self.held.keys()
    }

    /// How far `outlet`'s far side has acknowledged, fleet-wide, as of the last answer (for lag budgets).
    pub fn fleet_acked(&self, outlet: &OutletKey) -> Option<u64> {
        self.fleet_acked.get(outlet).copied()
    }

    /// The most this node knows `outlet`'s far side acknowledged: the database's last answer, or what this node's
    /// driver reported while it held the lease (written with the next renewal). Where an outlet made again while
    /// its lease stays held (a reload changed it) starts from: no taking of the lease says it.
    pub fn known_acked(&self, outlet: &OutletKey) -> u64 {
        let fleet = self.fleet_acked.get(outlet).copied().unwrap_or(0);
        fleet.max(self.held.get(outlet).copied().unwrap_or(0))
    }

    /// The driver's outlet reports what its far side acknowledged: written with the next renewal.
    pub fn progress(&mut self, outlet: &OutletKey, acked: u64) {
        if let Some(a) = self.held.get_mut(outlet) {
            *a = (*a).max(acked);
        }
    }

    /// A renewal to run now, if one is due and none is in flight.
    pub fn poll_renewal(&mut self, now: Instant) -> Option<Renewal> {
        if self.in_flight.is_some() || now < self.next_renewal || self.wanted.is_empty() {
            return None;
        }
        self.in_flight = Some(now);
        self.next_renewal = now + RENEW_EVERY;
        let outlets = self
            .wanted
            .iter()
            .map(|k| (k.clone(), self.held.get(k).copied().unwrap_or(0)))
            .collect();
        Some(Renewal {
            sent_at: now,
            outlets,
        })
    }

    /// The renewal sent at `sent_at` came back: `held` the rows its update returned (the leases this node holds,
    /// with their acknowledged positions), `all` every wanted outlet's acknowledged position.
    pub fn renewed(
        &mut self,
        sent_at: Instant,
        held: Vec<(OutletKey, u64)>,
        all: Vec<(OutletKey, u64)>,
        now: Instant,
    ) -> Vec<LeaseEvent> {
        if self.in_flight != Some(sent_at) {
            // Not the renewal in flight (one given up already): its answer says nothing about now.
            return Vec::new();
        }
        self.in_flight = None;
        for (k, a) in all {
            if self.wanted.contains(&k) {
                let e = self.fleet_acked.entry(k).or_insert(0);
                *e = (*e).max(a);
            }
        }
        if now >= sent_at + HOLD_FOR {
            // Too late to hold anything it granted: another node may take these leases any moment now.
            return self.lose_all();
        }
        self.last_good_sent = Some(sent_at);
        let now_held: BTreeMap<OutletKey, u64> = held
            .into_iter()
            .filter(|(k, _)| self.wanted.contains(k))
            .collect();
        let mut events = Vec::new();
        let before = std::mem::take(&mut self.held);
        for (k, mine) in &before {
            if !now_held.contains_key(k) {
                events.push(LeaseEvent::Lose { outlet: k.clone() });
            } else {
                // Still ours: keep what this node knows beyond the row.
                let a = now_held[k].max(*mine);
                self.held.insert(k.clone(), a);
            }
        }
        for (k, a) in now_held {
            if !before.contains_key(&k) {
                events.push(LeaseEvent::Take {
                    outlet: k.clone(),
                    acked: a,
                });
                self.held.insert(k, a);
            }
        }
        events
    }

    /// The renewal in flight failed (the database said no, or the connection broke): the leases stay held until
    /// their hold runs out, and the next renewal is tried at its time.
    pub fn renewal_failed(&mut self, sent_at: Instant) {
        if self.in_flight == Some(sent_at) {
            self.in_flight = None;
        }
    }

    /// When [`Leases::handle_timeout`] next has something to do (a renewal due, or the hold running out).
    pub fn poll_timeout(&self) -> Option<Instant> {
        let hold_ends = self.hold_ends();
        let renew =
            (!self.wanted.is_empty() && self.in_flight.is_none()).then_some(self.next_renewal);
        match (hold_ends, renew) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// When the held leases end unless a renewal succeeds first (`None` while none is held): no wait of the driver
    /// may last past it.
    pub fn hold_ends(&self) -> Option<Instant> {
        self.last_good_sent
            .filter(|_| !self.held.is_empty())
            .map(|t| t + HOLD_FOR)
    }

    /// The held outlets with what their far sides acknowledged, as this node knows it (for giving them back).
    pub fn held_progress(&self) -> Vec<(OutletKey, u64)> {
        self.held.iter().map(|(k, a)| (k.clone(), *a)).collect()
    }

    /// Loses every held lease once its hold has run out.
    pub fn handle_timeout(&mut self, now: Instant) -> Vec<LeaseEvent> {
        match self.last_good_sent {
            Some(t) if now >= t + HOLD_FOR && !self.held.is_empty() => self.lose_all(),
            _ => Vec::new(),
        }
    }

    fn lose_all(&mut self) -> Vec<LeaseEvent> {
        std::mem::take(&mut self.held)
            .into_keys()
            .map(|outlet| LeaseEvent::Lose { outlet })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key(name: &str) -> OutletKey {
        OutletKey {
            app: "main".into(),
            name: name.into(),
        }
    }

    #[test]
    fn a_renewal_answered_takes_what_it_returned_and_loses_what_it_did_not() {
        let t0 = Instant::now();
        let mut l = Leases::new(t0);
        assert!(
            l.poll_renewal(t0).is_none(),
            "nothing wanted, nothing to renew"
        );
        l.set_wanted([key("a"), key("b")], t0);
        let r = l.poll_renewal(t0).unwrap();
        assert_eq!(r.outlets, vec![(key("a"), 0), (key("b"), 0)]);
        assert!(l.poll_renewal(t0).is_none(), "one in flight at a time");
        let ev = l.renewed(
            t0,
            vec![(key("a"), 5)],
            vec![(key("a"), 5), (key("b"), 9)],
            t0,
        );
        assert_eq!(
            ev,
            vec![LeaseEvent::Take {
                outlet: key("a"),
                acked: 5
            }]
        );
        assert!(l.holds(&key("a")) && !l.holds(&key("b")));
        assert_eq!(l.fleet_acked(&key("b")), Some(9));
        l.progress(&key("a"), 12);
        let t1 = t0 + RENEW_EVERY;
        assert!(l.poll_renewal(t1 - Duration::from_millis(1)).is_none());
        let r = l.poll_renewal(t1).unwrap();
        assert_eq!(r.outlets, vec![(key("a"), 12), (key("b"), 0)]);
        let ev = l.renewed(t1, vec![(key("b"), 9)], vec![], t1);
        assert_eq!(
            ev,
            vec![
                LeaseEvent::Lose { outlet: key("a") },
                LeaseEvent::Take {
                    outlet: key("b"),
                    acked: 9
                }
            ]
        );
    }

    #[test]
    fn leases_are_lost_hold_for_after_sending_the_last_good_renewal() {
        let t0 = Instant::now();
        let mut l = Leases::new(t0);
        l.set_wanted([key("a")], t0);
        let r = l.poll_renewal(t0).unwrap();
        // Answered late, but within the hold: held, until HOLD_FOR after the sending (not the answer).
        let answered = t0 + Duration::from_secs(2);
        l.renewed(r.sent_at, vec![(key("a"), 0)], vec![], answered);
        assert!(l.holds(&key("a")));
        // Every later renewal fails.
        let r = l.poll_renewal(t0 + RENEW_EVERY).unwrap();
        l.renewal_failed(r.sent_at);
        assert_eq!(l.poll_timeout(), Some(t0 + 2 * RENEW_EVERY));
        assert!(
            l.handle_timeout(t0 + HOLD_FOR - Duration::from_millis(1))
                .is_empty()
        );
        assert_eq!(
            l.handle_timeout(t0 + HOLD_FOR),
            vec![LeaseEvent::Lose { outlet: key("a") }]
        );
        assert!(!l.holds(&key("a")));
    }

    #[test]
    fn an_answer_after_its_hold_ran_out_holds_nothing() {
        let t0 = Instant::now();
        let mut l = Leases::new(t0);
        l.set_wanted([key("a")], t0);
        let r = l.poll_renewal(t0).unwrap();
        let ev = l.renewed(r.sent_at, vec![(key("a"), 0)], vec![], t0 + HOLD_FOR);
        assert!(ev.is_empty() && !l.holds(&key("a")));
        // And it is not in flight any more: the next is sent at its time.
        assert!(l.poll_renewal(t0 + RENEW_EVERY).is_some());
    }

    #[test]
    fn an_outlet_removed_by_a_reload_is_lost_at_once_and_a_new_one_asked_for_now() {
        let t0 = Instant::now();
        let mut l = Leases::new(t0);
        l.set_wanted([key("a")], t0);
        let r = l.poll_renewal(t0).unwrap();
        l.renewed(r.sent_at, vec![(key("a"), 3)], vec![], t0);
        let t1 = t0 + Duration::from_secs(1);
        let ev = l.set_wanted([key("b")], t1);
        assert_eq!(ev, vec![LeaseEvent::Lose { outlet: key("a") }]);
        assert_eq!(l.poll_renewal(t1).unwrap().outlets, vec![(key("b"), 0)]);
    }

    /// Two nodes' leases against a model of the database's row (its clock may run apart from theirs within the
    /// 30 % the module docs allow): at no moment of real time do both drive the outlet, whatever renewals are lost,
    /// delayed or answered late.
    #[derive(Debug, Clone)]
    enum Step {
        Advance(u16),
        Send(bool),
        Answer(bool, u16),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (1u16..2000).prop_map(Step::Advance),
            any::<bool>().prop_map(Step::Send),
            (any::<bool>(), 0u16..9000).prop_map(|(n, d)| Step::Answer(n, d)),
        ]
    }

    proptest! {
        #[test]
        fn two_nodes_never_drive_one_outlet_at_once(steps in proptest::collection::vec(step(), 1..200), db_rate in 0.77f64..1.3) {
            let t0 = Instant::now();
            let mut now = t0;
            let mut nodes = [Leases::new(t0), Leases::new(t0)];
            for n in &mut nodes {
                n.set_wanted([key("a")], t0);
            }
            // The row: its holder and until when, in the database's clock (seconds since t0 times db_rate).
            let mut row: Option<(usize, f64)> = None;
            let db = |at: Instant| at.duration_since(t0).as_secs_f64() * db_rate;
            // Renewals in flight: (node, sent_at).
            let mut flying: Vec<(usize, Instant)> = Vec::new();
            for s in steps {
                match s {
                    Step::Advance(ms) => now += Duration::from_millis(ms as u64),
                    Step::Send(which) => {
                        let i = which as usize;
                        if let Some(r) = nodes[i].poll_renewal(now) {
                            flying.push((i, r.sent_at));
                        }
                    }
                    Step::Answer(which, delay_ms) => {
                        let i = which as usize;
                        if let Some(at) = flying.iter().position(|(n, _)| *n == i) {
                            let (_, sent_at) = flying.remove(at);
                            // The statement runs somewhere between the sending and the answer.
                            let runs = sent_at + (now - sent_at) / 2;
                            let answer_at = now + Duration::from_millis(delay_ms as u64);
                            let d = db(runs);
                            let granted = match row {
                                Some((h, until)) if h != i && until >= d => false,
                                _ => {
                                    row = Some((i, d + DATABASE_LEASE.as_secs_f64()));
                                    true
                                }
                            };
                            // Real time passes to the answer; meanwhile the holds run out as they would.
                            now = answer_at;
                            for n in &mut nodes {
                                n.handle_timeout(now);
                            }
                            let held = if granted { vec![(key("a"), 0)] } else { vec![] };
                            nodes[i].renewed(sent_at, held, vec![], now);
                        }
                    }
                }
                for n in &mut nodes {
                    n.handle_timeout(now);
                }
                prop_assert!(!(nodes[0].holds(&key("a")) && nodes[1].holds(&key("a"))), "both hold at {:?}", now - t0);
                // And whoever holds it, the database's row says so.
                for (i, n) in nodes.iter().enumerate() {
                    if n.holds(&key("a")) {
                        let (h, until) = row.unwrap();
                        prop_assert!(h == i && until >= db(now), "node {i} drives an outlet the database gave up");
                    }
                }
            }
        }
    }
}
