//! glibc's heap thresholds and giving freed memory back: the node's one policy for the process heap.
//!
//! Two phases want opposite settings (research/002, research/011):
//!
//! - **Reading a senders file** (at start, and on the reload thread) builds arrays of tens of MB. With the mmap and
//!   trim thresholds fixed at 128 KiB (glibc's defaults for a fresh process), each large array is a mapping of its
//!   own that goes back to the kernel when freed. Left to glibc, the thresholds rise after the first large free, and
//!   20 MB and more stayed in the reload thread's arena after every reload.
//! - **Serving** frees and allocates the same large buffers every turn: the turn's arena, the store's chunk body,
//!   SQLite's copy of each bound blob and the record it builds. Mapped fresh at 128 KiB, each was faulted in page by
//!   page and unmapped again (115–145k page faults a second at full speed, 17 % of the receive loop). At 4 MiB they
//!   are reused from the heap: no faults, 1.13× the records stored by the same senders.
//!
//! So the thresholds are low while a senders file is read and high while serving, and what serving leaves in the heap
//! goes back when the node falls idle ([`release_freed_memory`]).

use std::time::{Duration, Instant};

/// Blocks at least this large are mapped of their own while a senders file is read; a free heap top beyond it is
/// trimmed. glibc's own default.
const READING_THRESHOLD: i32 = 128 * 1024;

/// The same thresholds while serving: above a turn's buffers at the default turn of 16,384 records (about 0.7 MB of
/// 40-byte records), so they stay in the heap between turns.
const SERVING_THRESHOLD: i32 = 4 << 20;

/// A node that has read nothing for this long gives back what serving left in the heap.
pub const IDLE_TRIM_AFTER: Duration = Duration::from_secs(1);

/// What the heap is being used for now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// A senders file is being read (start, reload): large arrays, each to be given back when freed.
    ReadingSenders,
    /// Turns are being taken: the same large buffers again and again.
    Serving,
}

/// Fixes glibc's mmap and trim thresholds for `phase` (fixing them also stops glibc from moving them itself).
pub fn set_phase(phase: Phase) {
    let threshold = match phase {
        Phase::ReadingSenders => READING_THRESHOLD,
        Phase::Serving => SERVING_THRESHOLD,
    };
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets glibc's tuning parameters; it has no preconditions.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, threshold);
        libc::mallopt(libc::M_TRIM_THRESHOLD, threshold);
    }
    #[cfg(not(target_env = "gnu"))]
    let _ = threshold;
}

/// Returns free heap pages to the kernel. Sessions are small allocations made and freed in bursts, between
/// long-lived ones, and serving keeps turn-sized buffers; glibc keeps such freed memory in the process unless asked
/// (BRIEF.md: memory is not returned after a burst; research/002 measures the effect).
pub fn release_freed_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only walks glibc's own free lists; it has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Gives the heap back once per quiet spell: after [`IDLE_TRIM_AFTER`] without a datagram read.
#[derive(Debug)]
pub struct IdleTrim {
    last_read: Instant,
    trimmed: bool,
}

impl IdleTrim {
    pub fn new(now: Instant) -> Self {
        IdleTrim {
            last_read: now,
            trimmed: true,
        }
    }

    /// After each round: `read` datagrams were read in it. Returns whether the heap was trimmed now.
    pub fn after_round(&mut self, now: Instant, read: usize) -> bool {
        if read > 0 {
            self.last_read = now;
            self.trimmed = false;
            return false;
        }
        if self.trimmed || now.saturating_duration_since(self.last_read) < IDLE_TRIM_AFTER {
            return false;
        }
        self.trimmed = true;
        release_freed_memory();
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trims_once_per_quiet_spell_and_not_while_reading() {
        let t0 = Instant::now();
        let mut idle = IdleTrim::new(t0);
        assert!(
            !idle.after_round(t0 + IDLE_TRIM_AFTER * 2, 0),
            "nothing served yet"
        );
        assert!(!idle.after_round(t0 + IDLE_TRIM_AFTER * 2, 3));
        assert!(!idle.after_round(t0 + IDLE_TRIM_AFTER * 2 + IDLE_TRIM_AFTER / 2, 0));
        assert!(idle.after_round(t0 + IDLE_TRIM_AFTER * 3, 0));
        assert!(
            !idle.after_round(t0 + IDLE_TRIM_AFTER * 9, 0),
            "once per spell"
        );
        assert!(!idle.after_round(t0 + IDLE_TRIM_AFTER * 9, 1));
        assert!(idle.after_round(t0 + IDLE_TRIM_AFTER * 11, 0));
    }
}
