//! A 64-bit counter in two flash pages that no power cut can take back or tear: each page a log of 16-byte slots
//! `(n, !n)` (u64 LE each), the counter the largest valid `n` in either page (0 when there is none).
//!
//! [`Counter::set`] programs the next erased slot of the page holding the counter; when that page is full, the
//! other page is erased, gets the value in its first slot, and then the full page is erased. A slot torn by a cut
//! (one of its two 8-byte units programmed) is neither erased nor valid and is skipped; a cut anywhere in a move
//! leaves the value in at least one page. Values only grow: a smaller one is never written. The probe keeps a
//! 32-bit form of the same log (`src/bin/probe.rs`).
//!
//! Where the counter is (page, next slot) is found once by [`Counter::load`] and kept, so a write costs one
//! program of one slot; a page holds [`SLOTS`] writes before it moves.

use crate::board::flash::{Flash, FlashError, PAGES, PAGE_SIZE};

/// A slot: `n` then `!n`, two of the flash's 8-byte units.
pub const SLOT: usize = 16;
/// Slots in a page.
pub const SLOTS: usize = PAGE_SIZE / SLOT;

/// A counter kept in pages `base` and `base + 1`.
#[derive(Debug)]
pub struct Counter {
    base: usize,
    value: u64,
    /// The page (0 or 1 from `base`) holding `value`, and its first erased slot after the last used one.
    page: usize,
    next: usize,
}

impl Counter {
    /// Reads the counter in pages `base`, `base + 1`.
    pub fn load(flash: &mut Flash, base: usize) -> Result<Counter, FlashError> {
        if base + 1 >= PAGES {
            return Err(FlashError::OutOfRange);
        }
        let mut best: Option<(u64, usize, usize)> = None;
        let mut chunk = [0u8; 256];
        for page in 0..2 {
            let mut next = 0;
            let mut max: Option<u64> = None;
            for start in (0..PAGE_SIZE).step_by(chunk.len()) {
                flash.read(base + page, start, &mut chunk)?;
                for (i, slot) in chunk.chunks_exact(SLOT).enumerate() {
                    if slot.iter().any(|&b| b != 0xFF) {
                        next = start / SLOT + i + 1;
                    }
                    let (n, check) = split(slot);
                    if check == !n && max.is_none_or(|m| n > m) {
                        max = Some(n);
                    }
                }
            }
            if let Some(n) = max {
                // Equal in both (a cut during a move, before the full page was erased): the emptier page.
                let better = match best {
                    None => true,
                    Some((b, _, b_next)) => n > b || (n == b && next < b_next),
                };
                if better {
                    best = Some((n, page, next));
                }
            }
        }
        let (value, page, next) = best.unwrap_or((0, 0, 0));
        // Nothing valid anywhere: start in page 0 after whatever torn slots it has.
        let next = if best.is_none() {
            Self::first_free(flash, base)?
        } else {
            next
        };
        Ok(Counter {
            base,
            value,
            page,
            next,
        })
    }

    /// After the last slot of page `base` that is not erased (a fresh flash: 0).
    fn first_free(flash: &mut Flash, base: usize) -> Result<usize, FlashError> {
        let mut chunk = [0u8; 256];
        let mut next = 0;
        for start in (0..PAGE_SIZE).step_by(chunk.len()) {
            flash.read(base, start, &mut chunk)?;
            for (i, slot) in chunk.chunks_exact(SLOT).enumerate() {
                if slot.iter().any(|&b| b != 0xFF) {
                    next = start / SLOT + i + 1;
                }
            }
        }
        Ok(next)
    }

    pub fn get(&self) -> u64 {
        self.value
    }

    /// Makes the counter `n`, durably, when `n` is above it; a smaller or equal `n` writes nothing.
    pub fn set(&mut self, flash: &mut Flash, n: u64) -> Result<(), FlashError> {
        if n <= self.value {
            return Ok(());
        }
        let mut slot = [0u8; SLOT];
        slot[..8].copy_from_slice(&n.to_le_bytes());
        slot[8..].copy_from_slice(&(!n).to_le_bytes());
        if self.next < SLOTS {
            flash.program(self.base + self.page, self.next * SLOT, &slot)?;
            self.next += 1;
        } else {
            let other = 1 - self.page;
            flash.erase(self.base + other)?;
            flash.program(self.base + other, 0, &slot)?;
            flash.erase(self.base + self.page)?;
            self.page = other;
            self.next = 1;
        }
        self.value = n;
        Ok(())
    }
}

fn split(slot: &[u8]) -> (u64, u64) {
    let mut a = [0u8; 8];
    let mut b = [0u8; 8];
    a.copy_from_slice(&slot[..8]);
    b.copy_from_slice(&slot[8..SLOT]);
    (u64::from_le_bytes(a), u64::from_le_bytes(b))
}
