//! The board's flash as `pure-link`'s outbox flash ([`pure_link::outbox::Flash`]): a run of the board's 4 KiB
//! pages ([`crate::board::flash`]) given to the outbox, which keeps the sender's records, their numbering, the
//! downlink heard sequence and the run count there (docs/devices.md, "The outbox in flash").
//!
//! The board's flash already has the outbox's rules: NOR (an erase sets 0xFF, a program only clears bits),
//! 8-byte units, and a power cut (QEMU SIGKILLed) tears an erase or a program between units, never within one.
//! Reads go through the host file's seek and read, which want the file mutably; the outbox reads through `&self`,
//! so the flash sits in a [`RefCell`] (one task, never an interrupt: a borrow already taken is a failed read, not
//! a panic).

use core::cell::RefCell;

use pure_link::outbox::{Flash as OutboxFlash, FlashError as OutboxFlashError};

use crate::board::flash::{Flash, FlashError, PAGES, PAGE_SIZE};

/// Pages `first .. first + pages` of the board's flash, as the outbox sees them (its page 0 is `first`).
pub struct BoardFlash {
    flash: RefCell<Flash>,
    first: usize,
    pages: u16,
    /// The last error of the board's flash, for the firmware to print (the outbox only knows that one failed).
    last_error: Option<FlashError>,
}

impl BoardFlash {
    /// Gives pages `first .. first + pages` of `flash` to an outbox.
    pub fn new(flash: Flash, first: usize, pages: u16) -> Result<BoardFlash, FlashError> {
        if first + usize::from(pages) > PAGES {
            return Err(FlashError::OutOfRange);
        }
        Ok(BoardFlash {
            flash: RefCell::new(flash),
            first,
            pages,
            last_error: None,
        })
    }

    /// The outbox's page `page`'s (erases, 8-byte units programmed) since the flash file was made.
    pub fn counts(&self, page: u16) -> Result<(u32, u32), FlashError> {
        self.flash
            .try_borrow_mut()
            .map_err(|_| FlashError::Io)?
            .counts(self.first + usize::from(page))
    }

    /// The last error the board's flash gave, if any.
    pub fn last_error(&self) -> Option<FlashError> {
        self.last_error
    }

    fn page(&self, page: u16) -> Result<usize, OutboxFlashError> {
        (page < self.pages)
            .then(|| self.first + usize::from(page))
            .ok_or(OutboxFlashError)
    }

    fn note<T>(&mut self, r: Result<T, FlashError>) -> Result<T, OutboxFlashError> {
        r.map_err(|e| {
            self.last_error = Some(e);
            OutboxFlashError
        })
    }
}

impl OutboxFlash for BoardFlash {
    fn page_size(&self) -> usize {
        PAGE_SIZE
    }

    fn pages(&self) -> u16 {
        self.pages
    }

    fn read(&self, page: u16, offset: usize, buf: &mut [u8]) -> Result<(), OutboxFlashError> {
        let page = self.page(page)?;
        let mut flash = self.flash.try_borrow_mut().map_err(|_| OutboxFlashError)?;
        flash.read(page, offset, buf).map_err(|_| OutboxFlashError)
    }

    fn program(&mut self, page: u16, offset: usize, data: &[u8]) -> Result<(), OutboxFlashError> {
        let page = self.page(page)?;
        let r = self.flash.get_mut().program(page, offset, data);
        self.note(r)
    }

    fn erase(&mut self, page: u16) -> Result<(), OutboxFlashError> {
        let page = self.page(page)?;
        let r = self.flash.get_mut().erase(page);
        self.note(r)
    }
}
