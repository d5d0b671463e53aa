//! Time as the sender's state machine sees it: a point that can be moved forward by a `Duration` and measured
//! against an earlier one. The node and `UdpLink` pass `std::time::Instant`; a device passes [`Millis`], the
//! milliseconds of its own clock (any origin, e.g. since boot). The machine never reads a clock itself.

use core::time::Duration;

/// A point in time the sender's state machine is given as `now`.
pub trait Time: Copy + Ord {
    /// This time moved `by` later.
    fn after(self, by: Duration) -> Self;
    /// How long after `earlier` this is; zero if it is not after it.
    fn since(self, earlier: Self) -> Duration;
}

/// Milliseconds of a device's clock (from any origin that does not move backwards while the sender lives).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Millis(pub u64);

impl Time for Millis {
    fn after(self, by: Duration) -> Self {
        // Rounded up: a deadline is never earlier than asked.
        let ms = by.as_millis() + u128::from(!by.subsec_nanos().is_multiple_of(1_000_000));
        Millis(self.0.saturating_add(u64::try_from(ms).unwrap_or(u64::MAX)))
    }
    fn since(self, earlier: Self) -> Duration {
        Duration::from_millis(self.0.saturating_sub(earlier.0))
    }
}

#[cfg(feature = "std")]
impl Time for std::time::Instant {
    fn after(self, by: Duration) -> Self {
        self + by
    }
    fn since(self, earlier: Self) -> Duration {
        self.saturating_duration_since(earlier)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn millis_round_deadlines_up_and_never_go_back() {
        assert_eq!(Millis(10).after(Duration::from_micros(1)), Millis(11));
        assert_eq!(Millis(10).after(Duration::from_millis(5)), Millis(15));
        assert_eq!(
            Millis(u64::MAX).after(Duration::from_secs(1)),
            Millis(u64::MAX)
        );
        assert_eq!(Millis(3).since(Millis(5)), Duration::ZERO);
        assert_eq!(Millis(5).since(Millis(3)), Duration::from_millis(2));
    }
}
