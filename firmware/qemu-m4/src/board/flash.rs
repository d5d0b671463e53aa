//! Flash that survives power cuts: [`PAGES`] pages of [`PAGE_SIZE`] bytes kept in a host file (semihosting file
//! calls), with NOR flash's rules, and a count of erases and of 8-byte units programmed per page kept in the same file.
//!
//! The file (README.md, "The flash file"): the pages, page 0 first, at offset `page * PAGE_SIZE`; then, at
//! offset [`COUNTS_AT`], per page two little-endian u32s: its erases, its 8-byte units programmed. A missing file is made, a
//! short one (a first start killed while making it) is completed: pages erased (0xFF), counts 0.
//!
//! The rules, as on a NOR part:
//! - [`Flash::erase`] sets a page to 0xFF; [`Flash::program`] can only clear bits (the new bytes are ANDed with
//!   what is there), so writing twice over a byte without an erase between gives the AND of both;
//! - both go to the file in [`UNIT`]-byte writes, each one host `write(2)`: QEMU killed (SIGKILL) during an erase
//!   or a program leaves the units before the kill done and those after it untouched, as a power cut leaves a
//!   part's page half erased or half programmed. A unit itself is never torn;
//! - the counts are raised before the erase or program they count, so a torn one is counted.

use super::host::File;

pub const PAGE_SIZE: usize = 4096;
pub const PAGES: usize = 16;
/// The program (and erase) unit: an 8-byte double word, as on the STM32L4's and nRF's flash controllers.
pub const UNIT: usize = 8;
/// Where the counts start in the file (after the pages).
pub const COUNTS_AT: usize = PAGES * PAGE_SIZE;
/// The file's whole length.
pub const FILE_LEN: usize = COUNTS_AT + PAGES * 8;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlashError {
    /// The host file could not be opened or made.
    Open,
    /// A host read or write did not do all it was asked.
    Io,
    /// Page or offset beyond the flash.
    OutOfRange,
    /// A program whose offset or length is not a multiple of [`UNIT`].
    Unaligned,
}

/// The flash, open on its host file.
pub struct Flash {
    file: File,
}

impl Flash {
    /// Opens (or makes) the file at `path` (NUL-terminated) and completes it to [`FILE_LEN`].
    pub fn open(path: &[u8]) -> Result<Flash, FlashError> {
        let mut file = File::open_or_create(path).ok_or(FlashError::Open)?;
        let len = file.size().ok_or(FlashError::Io)? as usize;
        if len < FILE_LEN {
            // From where the file ends: 0xFF for pages, 0 for counts, in units, so a kill here is picked up again.
            let mut at = len - len % UNIT;
            while at < FILE_LEN {
                let fill = if at < COUNTS_AT {
                    [0xFF; UNIT]
                } else {
                    [0; UNIT]
                };
                if !file.write_at(at as u32, &fill) {
                    return Err(FlashError::Io);
                }
                at += UNIT;
            }
        }
        Ok(Flash { file })
    }

    /// Reads `buf.len()` bytes of `page` from `offset`.
    pub fn read(&mut self, page: usize, offset: usize, buf: &mut [u8]) -> Result<(), FlashError> {
        let at = Self::at(page, offset, buf.len())?;
        self.file
            .read_at(at, buf)
            .then_some(())
            .ok_or(FlashError::Io)
    }

    /// Sets every byte of `page` to 0xFF.
    pub fn erase(&mut self, page: usize) -> Result<(), FlashError> {
        let at = Self::at(page, 0, PAGE_SIZE)?;
        self.count(page, 0, 1)?;
        for unit in 0..PAGE_SIZE / UNIT {
            self.write_unit(at + (unit * UNIT) as u32, &[0xFF; UNIT])?;
        }
        Ok(())
    }

    /// Programs `data` into `page` at `offset`: each bit that is 0 in `data` is cleared, the others stay as they
    /// are. `offset` and `data.len()` must be multiples of [`UNIT`].
    pub fn program(&mut self, page: usize, offset: usize, data: &[u8]) -> Result<(), FlashError> {
        if !offset.is_multiple_of(UNIT) || !data.len().is_multiple_of(UNIT) {
            return Err(FlashError::Unaligned);
        }
        let at = Self::at(page, offset, data.len())?;
        self.count(page, 1, (data.len() / UNIT) as u32)?;
        for (i, new) in data.chunks_exact(UNIT).enumerate() {
            let unit_at = at + (i * UNIT) as u32;
            let mut unit = [0u8; UNIT];
            if !self.file.read_at(unit_at, &mut unit) {
                return Err(FlashError::Io);
            }
            for (old, new) in unit.iter_mut().zip(new) {
                *old &= new;
            }
            self.write_unit(unit_at, &unit)?;
        }
        Ok(())
    }

    /// `page`'s (erases, 8-byte units programmed) since the file was made.
    pub fn counts(&mut self, page: usize) -> Result<(u32, u32), FlashError> {
        let c = self.read_counts(page)?;
        Ok((c[0], c[1]))
    }

    fn read_counts(&mut self, page: usize) -> Result<[u32; 2], FlashError> {
        if page >= PAGES {
            return Err(FlashError::OutOfRange);
        }
        let mut raw = [0u8; 8];
        if !self.file.read_at((COUNTS_AT + page * 8) as u32, &mut raw) {
            return Err(FlashError::Io);
        }
        let word = |i: usize| u32::from_le_bytes([raw[i], raw[i + 1], raw[i + 2], raw[i + 3]]);
        Ok([word(0), word(4)])
    }

    /// Adds `n` to `page`'s erases (`which` 0) or units programmed (1).
    fn count(&mut self, page: usize, which: usize, n: u32) -> Result<(), FlashError> {
        let mut c = self.read_counts(page)?;
        c[which] = c[which].wrapping_add(n);
        let mut raw = [0u8; 8];
        raw[..4].copy_from_slice(&c[0].to_le_bytes());
        raw[4..].copy_from_slice(&c[1].to_le_bytes());
        self.write_unit((COUNTS_AT + page * 8) as u32, &raw)
    }

    fn write_unit(&mut self, at: u32, unit: &[u8; UNIT]) -> Result<(), FlashError> {
        self.file
            .write_at(at, unit)
            .then_some(())
            .ok_or(FlashError::Io)
    }

    /// The file offset of `len` bytes of `page` at `offset`, if they are within the page.
    fn at(page: usize, offset: usize, len: usize) -> Result<u32, FlashError> {
        if page >= PAGES || offset.checked_add(len).is_none_or(|end| end > PAGE_SIZE) {
            return Err(FlashError::OutOfRange);
        }
        Ok((page * PAGE_SIZE + offset) as u32)
    }
}
