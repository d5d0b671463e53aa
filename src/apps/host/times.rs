//! When an app's records not yet delivered by all its outlets were stored: what an outlet's lag in seconds is
//! taken from (the age of its oldest record not acknowledged, docs/operations.md), so that it says how long the
//! outlet has been behind, across restarts, without a read of the store per figure or per turn.
//!
//! Every chunk of the store carries its `stored_at` (docs/store.md). The host notes, per app, a bounded list of
//! points "the records from position P on were stored at T or later": the first chunk of each turn it commits,
//! the chunks it reads back anyway to feed an outlet or an inner outlet, and, when an outlet's oldest record is
//! before every point (after a start, a reopened store or a reload that added an outlet), a few chunks read from
//! the store by the position index ([`StoredTimes::SEED_READS`] at most, once, not per turn). A record's time is
//! that of the last point at or before it, so the lag is **never understated**: it is exact when the point is the
//! record's own chunk, and otherwise overstated by less than the time between the point and the next one
//! (under a second for what this run stored or read, as points within a second of the one before are not kept).
//!
//! Memory is at most [`StoredTimes::MAX_POINTS`] points per app (16 bytes each); past it every second point is
//! dropped, which coarsens the figure and never understates it. Points before every outlet's oldest record are
//! forgotten as the outlets advance.

use std::collections::VecDeque;

/// A note of when the records from a position on were stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Point {
    pos: u64,
    /// Milliseconds since the Unix epoch (`stored_at`).
    ms: i64,
}

/// One app's points, by position.
#[derive(Debug, Default)]
pub(super) struct StoredTimes {
    points: VecDeque<Point>,
    /// The lowest position seeded from the store: a seed is not read again unless an outlet's oldest record is
    /// before it (a chunk of an old layout has no time, and is not asked for at every turn).
    seeded_from: Option<u64>,
}

impl StoredTimes {
    /// Points kept per app at most.
    pub const MAX_POINTS: usize = 512;
    /// Chunks read from the store for one seed at most: the one holding the oldest record, then evenly to the head.
    pub const SEED_READS: u64 = 16;
    /// A point this close after the one before it adds nothing worth its room.
    const RESOLUTION_MS: i64 = 1000;

    /// The records from `pos` on were stored at `ms` or later (a chunk starting at `pos` was stored at `ms`).
    /// `ms` ≤ 0 is a chunk of unknown time (an old layout): nothing is noted.
    pub fn note(&mut self, pos: u64, ms: i64) {
        if ms <= 0 {
            return;
        }
        let at = self.points.partition_point(|p| p.pos <= pos);
        if let Some(before) = at.checked_sub(1).map(|i| self.points[i])
            && (before.pos == pos || ms - before.ms < Self::RESOLUTION_MS)
        {
            return;
        }
        self.points.insert(at, Point { pos, ms });
        if self.points.len() > Self::MAX_POINTS {
            // Every second point goes (the first stays): the time a record is given can only get earlier.
            let mut i = 0;
            self.points.retain(|_| {
                i += 1;
                i % 2 == 1
            });
        }
    }

    /// When the record at `pos` was stored, at the latest: the time of the last point at or before it. `None`
    /// when no point is at or before it.
    pub fn stored_at(&self, pos: u64) -> Option<i64> {
        let at = self.points.partition_point(|p| p.pos <= pos);
        at.checked_sub(1).map(|i| self.points[i].ms)
    }

    /// Whether a seed from the store should be read for an outlet whose oldest record is at `oldest`.
    pub fn wants_seed(&self, oldest: u64) -> bool {
        self.stored_at(oldest).is_none() && self.seeded_from.is_none_or(|s| oldest < s)
    }

    /// The positions whose chunks a seed reads, for records from `oldest` to before `head`.
    pub fn seed_positions(oldest: u64, head: u64) -> impl Iterator<Item = u64> {
        let span = head.saturating_sub(oldest);
        let step = span.div_ceil(Self::SEED_READS).max(1);
        (0..Self::SEED_READS)
            .map(move |k| oldest + k * step)
            .take_while(move |p| *p < head)
    }

    /// A seed was read for records from `oldest` on.
    pub fn seeded(&mut self, oldest: u64) {
        self.seeded_from = Some(self.seeded_from.map_or(oldest, |s| s.min(oldest)));
    }

    /// Forgets the points no record from `oldest` on needs: all before the last one at or before it. An outlet
    /// that later needs what was forgotten (one added by a reload, or one whose far side went back) gets a seed.
    pub fn forget_before(&mut self, oldest: u64) {
        while self.points.len() > 1 && self.points[1].pos <= oldest {
            self.points.pop_front();
            self.seeded_from = None;
        }
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.points.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_gets_the_time_of_the_last_point_at_or_before_it() {
        let mut t = StoredTimes::default();
        assert_eq!(t.stored_at(1), None);
        t.note(1, 10_000);
        t.note(51, 20_000);
        // Out of order: a chunk read back from the store.
        t.note(21, 15_000);
        assert_eq!(t.stored_at(1), Some(10_000));
        assert_eq!(t.stored_at(20), Some(10_000));
        assert_eq!(t.stored_at(21), Some(15_000));
        assert_eq!(t.stored_at(60), Some(20_000));
        // Within a second of the point before: not kept, the earlier time stands.
        t.note(55, 20_500);
        assert_eq!(t.len(), 3);
        assert_eq!(t.stored_at(56), Some(20_000));
        // Unknown times are not points.
        t.note(70, 0);
        assert_eq!(t.len(), 3);
        t.forget_before(30);
        assert_eq!(t.stored_at(30), Some(15_000));
        assert_eq!(t.stored_at(1), None);
        assert_eq!(t.len(), 2);
    }

    #[test]
    fn the_points_are_bounded_and_thinning_never_makes_a_record_younger() {
        let mut t = StoredTimes::default();
        let truth = |pos: u64| (pos as i64) * 2_000;
        for pos in 1..=5_000u64 {
            t.note(pos, truth(pos));
            assert!(t.len() <= StoredTimes::MAX_POINTS);
        }
        for pos in 1..=5_000u64 {
            let at = t.stored_at(pos).unwrap();
            assert!(at <= truth(pos), "{pos}: {at} after {}", truth(pos));
        }
        // The first point stays through thinning: no record before the last point is without a time.
        assert_eq!(t.stored_at(1), Some(truth(1)));
    }

    #[test]
    fn a_seed_reads_a_few_chunks_once() {
        let p: Vec<u64> = StoredTimes::seed_positions(101, 1_101).collect();
        assert_eq!(p.len() as u64, StoredTimes::SEED_READS);
        assert_eq!(p[0], 101);
        assert!(p.iter().all(|x| (101..1_101).contains(x)));
        assert_eq!(
            StoredTimes::seed_positions(5, 8).collect::<Vec<_>>(),
            [5, 6, 7]
        );
        let mut t = StoredTimes::default();
        assert!(t.wants_seed(101));
        t.seeded(101);
        // The store had no time for it (an old layout): not read again for the same records.
        assert!(!t.wants_seed(101) && !t.wants_seed(500));
        assert!(t.wants_seed(50), "an outlet added from further back");
        t.note(101, 1);
        assert!(!t.wants_seed(101));
        // Forgotten as the outlets went on: an outlet added from further back is seeded again.
        t.note(300, 5_000);
        t.forget_before(400);
        assert!(!t.wants_seed(400));
        assert!(t.wants_seed(101), "a reload added an outlet from 101");
    }
}
