//! A device's outbox in flash: the records it was told are queued, their numbering, its downlink heard sequence
//! and its run counter, kept so that a power cut or a deep sleep at any instant loses nothing queued and doubles
//! nothing (docs/devices.md, "The outbox in flash", is the format; this is its implementation).
//!
//! The outbox is a log of entries over a ring of flash pages the caller gives through [`Flash`] (NOR rules: an
//! erase sets a page to 0xFF, a program only clears bits, programs are whole 8-byte units). Each page starts with
//! a header that is a snapshot of the state (the next sequence, the downlink heard sequence, the run counter, and
//! the page's generation, which orders the ring); entries follow: a record, an acknowledgement, a renumbering, a
//! heard sequence, a run. An entry's payload is programmed before its 8-byte header, which holds its CRC, so a
//! cut while writing leaves either the whole entry or a header still erased; a page with bytes written past its
//! last good entry takes nothing more. A page whose records are all acknowledged has its header cleared (one
//! program) and is erased when the ring comes back to it.
//!
//! Sequences are never stored per record: records are numbered in the order they were queued, from the snapshot
//! of the oldest live page, and the acknowledgement and renumbering entries move that numbering as the sender
//! did. So a sequence is used once: the next one is always past every record ever written.
//!
//! It is the flow's [`RecordQueue`]: the sender reads records from flash when it builds a datagram, and tells it
//! what the node acknowledged ([`RecordQueue::acked`]). RAM holds where each unacknowledged record lies (at most
//! `RECORDS` of them) and a few counters.

use sha2::{Digest, Sha256};

use crate::buf::Out;
use crate::queue::{QueueFull, RecordQueue};
use crate::wire;

/// The flash an outbox lives in: `pages()` pages of `page_size()` bytes, read, programmed and erased by the
/// device's driver. Programs are whole 8-byte units at offsets that are multiples of 8.
pub trait Flash {
    /// Bytes of a page: what one erase clears. A multiple of 8, from 512 to 65,536.
    fn page_size(&self) -> usize;
    /// Pages given to the outbox (at least 3).
    fn pages(&self) -> u16;
    fn read(&self, page: u16, offset: usize, buf: &mut [u8]) -> Result<(), FlashError>;
    /// Clears the bits of `data` that are 0 at `offset` (NOR programming): `data.len()` and `offset` are
    /// multiples of 8.
    fn program(&mut self, page: u16, offset: usize, data: &[u8]) -> Result<(), FlashError>;
    /// Sets every byte of the page to 0xFF.
    fn erase(&mut self, page: u16) -> Result<(), FlashError>;
}

/// The device's flash driver failed a read, program or erase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlashError;

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum OutboxError {
    #[error("the flash driver failed a read, program or erase")]
    Flash,
    #[error(
        "a flash page must be a multiple of 8 bytes from 512 to 65,536, and there must be at least 3 pages"
    )]
    Geometry,
    #[error(
        "the flash holds more unacknowledged records than this outbox was made for: give it more RECORDS"
    )]
    TooManyRecords,
    #[error("the outbox has no room for the entry until the node acknowledges records")]
    Full,
}

impl From<FlashError> for OutboxError {
    fn from(_: FlashError) -> Self {
        OutboxError::Flash
    }
}

/// What the outbox did to its flash since it was opened: the wear it caused.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct OutboxStats {
    /// 8-byte units programmed.
    pub units_programmed: u64,
    pub pages_erased: u64,
    /// Operations of the flash driver that failed.
    pub flash_failures: u64,
    /// Acknowledgements or renumberings that could not be kept (after a restart those records are sent again,
    /// which the node takes as duplicates).
    pub marks_lost: u64,
    /// Records given up unstored by [`Outbox::drop_oldest_page`].
    pub records_dropped: u64,
}

const UNIT: usize = 8;
/// The magic of a page written by this version: its header holds the program's state (below).
const MAGIC: [u8; 4] = *b"PLO2";
/// The magic of a page written by the first version, read still: its header has no program's state.
const MAGIC_V1: [u8; 4] = *b"PLO1";
/// A page's header: magic, generation (u32), next sequence, heard sequence, runs (u64 each), the program's state
/// (16 bytes), CRC-32 of the 52 bytes before it; then 4 bytes of 0xFF. Little-endian.
const HEADER_LEN: usize = 56;
/// Where a page's header has its flags byte: 0xFF, or [`UNNUMBERED`]. Past the CRC, as the 0xFF a first
/// version's reader skips: such a reader takes every page as numbered.
const FLAGS_AT: usize = 52;
/// The flags byte of a page opened before the node told the outbox where its numbering stands: the records in it
/// are counted from 1, and the entry that renumbers them follows (docs/devices.md, "A new outbox").
const UNNUMBERED: u8 = 0xFE;
/// A first version's page header: as above without the program's state; its CRC covers 32 bytes, 40 in all.
const HEADER_LEN_V1: usize = 40;
/// The program's state kept with the downlink heard sequence ([`Outbox::set_heard_with`]).
pub const STATE_LEN: usize = 16;
/// An entry's header: kind, 0, payload length (u16), CRC-32 of those 4 bytes and the payload.
const ENTRY_HEADER: usize = 8;

const KIND_RECORD: u8 = 0x01;
/// Payload: u64 `through`. Records numbered up to it are acknowledged.
const KIND_ACKED: u8 = 0x02;
/// Payload: u64 `from`, u64 `to`. The record numbered `from` (and those after it) are numbered from `to` on.
const KIND_RENUMBERED: u8 = 0x03;
/// Payload: u64, the downlink heard sequence.
const KIND_HEARD: u8 = 0x04;
/// Payload: u64, the run counter.
const KIND_RUN: u8 = 0x05;
/// Payload: u64, the downlink heard sequence, then the program's state ([`STATE_LEN`] bytes) kept with it.
const KIND_HEARD_STATE: u8 = 0x06;
const ERASED: u8 = 0xFF;

static CRC: crc::Crc<u32, crc::NoTable> = crc::Crc::<u32, crc::NoTable>::new(&crc::CRC_32_ISO_HDLC);

fn align(n: usize) -> usize {
    n.div_ceil(UNIT) * UNIT
}

/// Where a queued record lies.
#[derive(Debug, Clone, Copy)]
struct Stored {
    page: u16,
    /// The entry's header.
    offset: u16,
    len: u16,
}

/// The outbox over `F`, holding at most `RECORDS` unacknowledged records.
pub struct Outbox<F: Flash, const RECORDS: usize> {
    flash: F,
    records: heapless::Deque<Stored, RECORDS>,
    /// The sequence of the oldest record queued (or of the next one when none is); counted from 1 until the node
    /// has told where the numbering stands (`numbered`).
    first: u64,
    /// The node has told this outbox where its numbering stands: its flow's first answer was kept (a renumbering
    /// entry, even from 1 to 1; an acknowledgement), or the oldest page was opened after it was ([`UNNUMBERED`]
    /// not in its header). A new outbox is not numbered, so its
    /// flow starts with a probe and its records follow what the node holds from this key (a wiped outbox or a new
    /// board with the same key would otherwise number from 1 again, and the node would drop its new records as
    /// ones it has, telling the device they are stored: docs/protocol.md 7.2).
    numbered: bool,
    heard: u64,
    /// The program's state, kept in the same write as the heard sequence it goes with.
    state: [u8; STATE_LEN],
    runs: u64,
    /// The page written, where its next entry goes, and its generation.
    head: u16,
    head_at: usize,
    head_gen: u32,
    /// Bytes were found written past the head's last good entry (a cut mid-write): the next entry opens a page.
    head_closed: bool,
    /// The oldest live page.
    tail: u16,
    /// The highest acknowledgement kept in flash (or implied by it at opening).
    kept_through: u64,
    /// Where the oldest record lay when the sender let go of records the node has not stored (it refused the
    /// app): their pages are kept, so they come back at the next restart, until an acknowledgement covers them.
    pinned: Option<Stored>,
    /// A renumbering could not be kept: the records in flash still have their old numbers, so none is sent
    /// under the new ones until a restart reads them back (the node then asks for the renumbering again).
    stuck: bool,
    stats: OutboxStats,
}

/// A page's snapshot.
struct Header {
    generation: u32,
    next: u64,
    heard: u64,
    runs: u64,
    state: [u8; STATE_LEN],
    /// Whether the node had told the numbering when the page was opened ([`UNNUMBERED`]).
    numbered: bool,
    /// Where the page's entries start: [`HEADER_LEN`], or [`HEADER_LEN_V1`] in a first version's page.
    len: usize,
}

impl Header {
    fn encode(&self) -> [u8; HEADER_LEN] {
        let mut h = [ERASED; HEADER_LEN];
        h[..4].copy_from_slice(&MAGIC);
        h[4..8].copy_from_slice(&self.generation.to_le_bytes());
        h[8..16].copy_from_slice(&self.next.to_le_bytes());
        h[16..24].copy_from_slice(&self.heard.to_le_bytes());
        h[24..32].copy_from_slice(&self.runs.to_le_bytes());
        h[32..48].copy_from_slice(&self.state);
        let crc = CRC.checksum(&h[..48]);
        h[48..52].copy_from_slice(&crc.to_le_bytes());
        if !self.numbered {
            h[FLAGS_AT] = UNNUMBERED;
        }
        h
    }
    /// A header of either version (the first 40 bytes are all a first version's header has).
    fn decode(h: &[u8; HEADER_LEN]) -> Option<Self> {
        let word = |at: usize| u64::from_le_bytes(h[at..at + 8].try_into().unwrap_or([0; 8]));
        let crc_at = |at: usize| u32::from_le_bytes(h[at..at + 4].try_into().unwrap_or([0; 4]));
        let (state, numbered, len) = if h[..4] == MAGIC && CRC.checksum(&h[..48]) == crc_at(48) {
            let state = h[32..48].try_into().unwrap_or([0; STATE_LEN]);
            (state, h[FLAGS_AT] != UNNUMBERED, HEADER_LEN)
        } else if h[..4] == MAGIC_V1 && CRC.checksum(&h[..32]) == crc_at(32) {
            ([0; STATE_LEN], true, HEADER_LEN_V1)
        } else {
            return None;
        };
        Some(Header {
            generation: u32::from_le_bytes(h[4..8].try_into().unwrap_or([0; 4])),
            next: word(8),
            heard: word(16),
            runs: word(24),
            state,
            numbered,
            len,
        })
    }
}

/// Writes a record's payload to flash as it comes, unit by unit, with its CRC: what [`RecordQueue::push_with`]
/// hands the code that writes a record.
pub struct FlashWriter<'w, F: Flash> {
    flash: &'w mut F,
    page: u16,
    at: usize,
    unit: [u8; UNIT],
    filled: usize,
    written: usize,
    crc: crc::Digest<'static, u32, crc::NoTable>,
    failed: bool,
    units: u64,
}

impl<F: Flash> FlashWriter<'_, F> {
    fn flush(&mut self) {
        if self.filled == 0 {
            return;
        }
        self.unit[self.filled..].fill(ERASED);
        if !self.failed {
            self.failed = self.flash.program(self.page, self.at, &self.unit).is_err();
            self.units += 1;
        }
        self.at += UNIT;
        self.filled = 0;
    }
}

impl<F: Flash> Out for FlashWriter<'_, F> {
    fn push(&mut self, byte: u8) {
        self.unit[self.filled] = byte;
        self.filled += 1;
        self.written += 1;
        self.crc.update(&[byte]);
        if self.filled == UNIT {
            self.flush();
        }
    }
    fn extend_from_slice(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.push(b);
        }
    }
    fn len(&self) -> usize {
        self.written
    }
    /// What is in flash cannot be changed: nothing.
    fn written_mut(&mut self) -> &mut [u8] {
        &mut []
    }
    /// Flash cannot be unwritten: a record is written once, whole.
    fn clear(&mut self) {
        self.failed = true;
    }
    fn truncate(&mut self, len: usize) {
        if len < self.written {
            self.failed = true;
        }
    }
    fn grow(&mut self, _len: usize) -> Option<&mut [u8]> {
        None
    }
}

impl<F: Flash, const RECORDS: usize> Outbox<F, RECORDS> {
    /// Opens the outbox in `flash`: formats it when no page holds a valid header (first use), else reads the
    /// ring back. Records are numbered from 1 in a new outbox.
    pub fn open(flash: F) -> Result<Self, OutboxError> {
        let (page_size, pages) = (flash.page_size(), flash.pages());
        if !(512..=65_536).contains(&page_size) || !page_size.is_multiple_of(UNIT) || pages < 3 {
            return Err(OutboxError::Geometry);
        }
        let mut o = Outbox {
            flash,
            records: heapless::Deque::new(),
            first: 1,
            numbered: false,
            heard: 0,
            state: [0; STATE_LEN],
            runs: 0,
            head: 0,
            head_at: HEADER_LEN,
            head_gen: 0,
            head_closed: false,
            tail: 0,
            kept_through: 0,
            pinned: None,
            stuck: false,
            stats: OutboxStats::default(),
        };
        // The head is the valid page of the largest generation; the ring runs back from it through pages of one
        // generation less each.
        let mut head: Option<(u16, u32)> = None;
        for p in 0..pages {
            if let Some(h) = o.header(p)?
                && head.is_none_or(|(_, g)| h.generation > g)
            {
                head = Some((p, h.generation));
            }
        }
        let Some((head, generation)) = head else {
            o.head_gen = 0;
            o.head = pages - 1;
            o.tail = 0;
            o.start_page(0)?;
            return Ok(o);
        };
        let (mut tail, mut tail_gen) = (head, generation);
        loop {
            let prev = (tail + pages - 1) % pages;
            match o.header(prev)? {
                Some(h) if prev != head && h.generation.wrapping_add(1) == tail_gen => {
                    (tail, tail_gen) = (prev, h.generation);
                }
                _ => break,
            }
        }
        o.tail = tail;
        o.head = head;
        o.head_gen = generation;
        let mut p = tail;
        loop {
            let last = p == head;
            o.replay(p, last)?;
            if last {
                break;
            }
            p = (p + 1) % pages;
        }
        o.kept_through = o.first - 1;
        Ok(o)
    }

    fn header(&self, page: u16) -> Result<Option<Header>, OutboxError> {
        let mut h = [0u8; HEADER_LEN];
        self.flash.read(page, 0, &mut h)?;
        Ok(Header::decode(&h))
    }

    /// Applies one page's snapshot (for the oldest page) and entries; for the head, finds where the next goes.
    fn replay(&mut self, page: u16, head: bool) -> Result<(), OutboxError> {
        let h = self.header(page)?.ok_or(OutboxError::Flash)?;
        if page == self.tail {
            // Records queued when this page was opened lay in pages since erased: all acknowledged.
            self.first = h.next;
            // Pages opened before the node told the numbering count from 1, and the entry that says it lies in a
            // later page (pages are freed oldest first): it is replayed after them.
            self.numbered = h.numbered;
        }
        self.heard = self.heard.max(h.heard);
        // The program's state: the last one written, in the ring's order (it goes with the largest heard).
        self.state = h.state;
        self.runs = self.runs.max(h.runs);
        let size = self.flash.page_size();
        let mut at = h.len;
        let mut clean_end = true;
        while at + ENTRY_HEADER <= size {
            let mut eh = [0u8; ENTRY_HEADER];
            self.flash.read(page, at, &mut eh)?;
            if eh == [ERASED; ENTRY_HEADER] {
                break;
            }
            let len = usize::from(u16::from_le_bytes([eh[2], eh[3]]));
            let crc = u32::from_le_bytes([eh[4], eh[5], eh[6], eh[7]]);
            if eh[1] != 0
                || at + ENTRY_HEADER + len > size
                || self.entry_crc(page, at, &eh, len)? != crc
            {
                clean_end = false;
                break;
            }
            let mut word = [0u8; 8 + STATE_LEN];
            let payload = &mut word[..len.min(8 + STATE_LEN)];
            self.flash.read(page, at + ENTRY_HEADER, payload)?;
            let u =
                |i: usize| u64::from_le_bytes(word[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]));
            match (eh[0], len) {
                (KIND_RECORD, _) => self
                    .records
                    .push_back(Stored {
                        page,
                        offset: at as u16,
                        len: len as u16,
                    })
                    .map_err(|_| OutboxError::TooManyRecords)?,
                (KIND_ACKED, 8) => self.apply_acked(u(0)),
                (KIND_RENUMBERED, 16) => self.apply_renumbered(u(0), u(1)),
                (KIND_HEARD, 8) => self.heard = self.heard.max(u(0)),
                (KIND_HEARD_STATE, 24) => {
                    self.heard = self.heard.max(u(0));
                    self.state.copy_from_slice(&word[8..8 + STATE_LEN]);
                }
                (KIND_RUN, 8) => self.runs = self.runs.max(u(0)),
                // An entry of a later format: skipped, its length is known.
                _ => {}
            }
            at += align(ENTRY_HEADER + len);
        }
        if head {
            self.head_at = at;
            // Bytes written past the last good entry (a cut mid-write): this page takes nothing more.
            self.head_closed = !clean_end || !self.erased_from(page, at)?;
        }
        Ok(())
    }

    fn entry_crc(
        &self,
        page: u16,
        at: usize,
        eh: &[u8; 8],
        len: usize,
    ) -> Result<u32, OutboxError> {
        let mut d = CRC.digest();
        d.update(&eh[..4]);
        let mut chunk = [0u8; 64];
        let mut done = 0;
        while done < len {
            let n = (len - done).min(chunk.len());
            self.flash
                .read(page, at + ENTRY_HEADER + done, &mut chunk[..n])?;
            d.update(&chunk[..n]);
            done += n;
        }
        Ok(d.finalize())
    }

    fn erased_from(&self, page: u16, mut at: usize) -> Result<bool, OutboxError> {
        let size = self.flash.page_size();
        let mut chunk = [0u8; 64];
        while at < size {
            let n = (size - at).min(chunk.len());
            self.flash.read(page, at, &mut chunk[..n])?;
            if chunk[..n].iter().any(|&b| b != ERASED) {
                return Ok(false);
            }
            at += n;
        }
        Ok(true)
    }

    fn apply_acked(&mut self, through: u64) {
        self.numbered = true;
        if through >= self.first {
            let n = (through - self.first + 1).min(self.records.len() as u64) as usize;
            for _ in 0..n {
                self.records.pop_front();
            }
            self.first = through + 1;
        }
    }

    fn apply_renumbered(&mut self, from: u64, to: u64) {
        self.numbered = true;
        // The records queued now are those from `from` on, or a suffix of them (the rest were acknowledged since).
        if self.first >= from {
            self.first = to.saturating_add(self.first - from);
        }
    }

    /// Opens `page` as the new head with a snapshot of the state, erasing it first unless it is blank.
    fn start_page(&mut self, page: u16) -> Result<(), OutboxError> {
        if !self.erased_from(page, 0)? {
            self.flash
                .erase(page)
                .inspect_err(|_| self.stats.flash_failures += 1)?;
            self.stats.pages_erased += 1;
        }
        let header = Header {
            generation: self.head_gen.wrapping_add(1),
            next: self.next_seq(),
            numbered: self.numbered,
            heard: self.heard,
            runs: self.runs,
            state: self.state,
            len: HEADER_LEN,
        }
        .encode();
        self.program(page, 0, &header)?;
        self.head = page;
        self.head_gen = self.head_gen.wrapping_add(1);
        self.head_at = HEADER_LEN;
        self.head_closed = false;
        Ok(())
    }

    fn program(&mut self, page: u16, offset: usize, data: &[u8]) -> Result<(), OutboxError> {
        self.stats.units_programmed += (data.len() / UNIT) as u64;
        self.flash
            .program(page, offset, data)
            .inspect_err(|_| self.stats.flash_failures += 1)?;
        Ok(())
    }

    /// Programs an entry's header, the moment the entry is there. A program the driver says failed is read back:
    /// if the header is in flash whole (a driver that wrote it and then failed a verify or timed out), the entry
    /// is there and will be found at the next start, so it is taken as written; a record it holds reported not
    /// kept and queued again would be stored twice.
    fn commit_entry(
        &mut self,
        page: u16,
        at: usize,
        eh: &[u8; ENTRY_HEADER],
    ) -> Result<(), OutboxError> {
        let Err(e) = self.program(page, at, eh) else {
            return Ok(());
        };
        let mut back = [0u8; ENTRY_HEADER];
        match self.flash.read(page, at, &mut back) {
            Ok(()) if back == *eh => Ok(()),
            _ => Err(e),
        }
    }

    /// Makes room at the head for an entry of `len` bytes (header included), opening the next page if needed.
    /// A record may not take the last free page: that one is kept for the entries that free pages
    /// (acknowledgements) and for run entries, so an outbox full of records can always start and be emptied. Once a
    /// mark has opened it (no page is free after the head), records may not take the rest of it either.
    fn room(&mut self, len: usize, record: bool) -> Result<(), OutboxError> {
        if len > self.flash.page_size() - HEADER_LEN {
            return Err(OutboxError::Full);
        }
        let pages = self.flash.pages();
        if record && (self.head + 1) % pages == self.tail {
            // No page is free after the head: a mark opened the kept page, and a record may not take the rest of
            // it either (records written there would leave the next start no room for its run entry).
            self.free_acked_pages();
            if (self.head + 1) % pages == self.tail {
                return Err(OutboxError::Full);
            }
        }
        if !self.head_closed && self.head_at + len <= self.flash.page_size() {
            return Ok(());
        }
        // Pages whose records were all acknowledged before a restart are freed here, when room is wanted.
        self.free_acked_pages();
        let next = (self.head + 1) % pages;
        let after = (next + 1) % pages;
        if next == self.tail || (record && after == self.tail) {
            return Err(OutboxError::Full);
        }
        self.start_page(next)
    }

    /// Appends a mark of u64 words: its payload, then its header.
    fn mark(&mut self, kind: u8, words: &[u64]) -> Result<(), OutboxError> {
        let mut payload = [0u8; 16];
        for (i, w) in words.iter().enumerate() {
            payload[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
        }
        self.mark_bytes(kind, &payload[..words.len() * 8])
    }

    /// Appends a mark (at most 24 bytes): its payload, then its header.
    fn mark_bytes(&mut self, kind: u8, bytes: &[u8]) -> Result<(), OutboxError> {
        let len = bytes.len();
        self.room(ENTRY_HEADER + len, false)?;
        // Padded with 0xFF to whole units: erased bytes, which a program leaves as they are.
        let mut payload = [ERASED; 24];
        payload[..len].copy_from_slice(bytes);
        let (page, at) = (self.head, self.head_at);
        self.head_at += align(ENTRY_HEADER + len);
        // Written past from here on, whatever happens.
        let r = self.program(page, at + ENTRY_HEADER, &payload[..align(len)]);
        let r = r.and_then(|()| {
            let eh = entry_header(kind, &payload[..len]);
            self.commit_entry(page, at, &eh)
        });
        if r.is_err() {
            self.head_closed = true;
        }
        r
    }

    /// Clears the header of every page before the oldest record's (all their records acknowledged): one program
    /// each; they are erased when the ring comes back to them.
    fn free_acked_pages(&mut self) {
        let oldest = self
            .pinned
            .or(self.records.front().copied())
            .map_or(self.head, |r| r.page);
        while self.tail != oldest && self.tail != self.head {
            if self.program(self.tail, 0, &[0u8; UNIT]).is_err() {
                return;
            }
            self.tail = (self.tail + 1) % self.flash.pages();
        }
    }

    /// The sequence of the oldest record queued, or of the next one when none is: where the sender's flow
    /// starts after a restart ([`crate::sender::FlowStart::At`]). Counted from 1 until the node has told where
    /// the numbering stands ([`Outbox::numbered`]).
    pub fn first_seq(&self) -> u64 {
        self.first
    }

    /// Whether the node has told this outbox where its numbering stands. Until it has (a new outbox: new flash, or
    /// flash wiped, with a key the node may know), the flow starts with a probe ([`Outbox::flow_start`]), and the
    /// node's answer renumbers what was queued meanwhile to follow what it holds.
    pub fn numbered(&self) -> bool {
        self.numbered
    }

    /// How the outbox's flow starts: at [`Outbox::first_seq`] once [`Outbox::numbered`], else with a probe.
    pub fn flow_start(&self) -> crate::sender::FlowStart {
        if self.numbered {
            crate::sender::FlowStart::At(self.first)
        } else {
            crate::sender::FlowStart::Probe
        }
    }

    /// The largest record this outbox takes: an entry (its 8-byte header and the record, in whole 8-byte units) fits
    /// in a page after the page's header, so a page of 512 bytes takes records of at most 448.
    pub fn largest_record(&self) -> usize {
        let units = (self.flash.page_size().saturating_sub(HEADER_LEN)) / UNIT;
        (units * UNIT)
            .saturating_sub(ENTRY_HEADER)
            .min(usize::from(u16::MAX))
    }

    /// The sequence the next record queued gets.
    pub fn next_seq(&self) -> u64 {
        self.first + self.records.len() as u64
    }

    /// The downlink heard sequence kept: give it to [`crate::sender::Sender::listen`] after a restart.
    pub fn heard(&self) -> u64 {
        self.heard
    }

    /// Keeps `heard` as the downlink heard sequence, once the program has done what it does with that record.
    pub fn set_heard(&mut self, heard: u64) -> Result<(), OutboxError> {
        if heard <= self.heard {
            return Ok(());
        }
        self.mark(KIND_HEARD, &[heard])?;
        self.heard = heard;
        Ok(())
    }

    /// Keeps `heard` as the downlink heard sequence and `state` as the program's state, in one write: after a
    /// power cut the outbox has both or neither. A program whose downlink records change a state that fits in
    /// [`STATE_LEN`] bytes (a setting, a counter, a hash of what it applied, where a larger state lies) applies
    /// them to [`Outbox::state`] and keeps the result here: each record is then applied exactly once, whenever the
    /// power goes. A `heard` not above the one kept changes nothing (the records up to it were applied).
    pub fn set_heard_with(
        &mut self,
        heard: u64,
        state: [u8; STATE_LEN],
    ) -> Result<(), OutboxError> {
        if heard <= self.heard {
            return Ok(());
        }
        let mut payload = [0u8; 8 + STATE_LEN];
        payload[..8].copy_from_slice(&heard.to_le_bytes());
        payload[8..].copy_from_slice(&state);
        self.mark_bytes(KIND_HEARD_STATE, &payload)?;
        self.heard = heard;
        self.state = state;
        Ok(())
    }

    /// The program's state kept with the heard sequence ([`Outbox::set_heard_with`]); zeros until one is kept.
    pub fn state(&self) -> [u8; STATE_LEN] {
        self.state
    }

    /// A new run: counts it in flash, then returns its id, SHA-256 of the device's secret key and the count.
    /// Never the same twice for one key while the flash lives: a run id used twice would repeat the run's keys
    /// and packet numbers, and so AES-GCM nonces. Mix in a hardware random number where the device has one.
    pub fn new_run(&mut self, secret: &[u8; 32], entropy: &[u8]) -> Result<u64, OutboxError> {
        let runs = self.runs + 1;
        self.mark(KIND_RUN, &[runs])?;
        self.runs = runs;
        let digest = Sha256::new()
            .chain_update(b"pure-link run id")
            .chain_update(secret)
            .chain_update(runs.to_le_bytes())
            .chain_update(entropy)
            .finalize();
        let mut id = [0u8; 8];
        id.copy_from_slice(&digest[..8]);
        Ok(u64::from_le_bytes(id))
    }

    /// Gives up the records of the oldest page, unstored, and frees it: the way out when [`Outbox::new_run`] says
    /// `Full` because the page kept for marks is full of run entries (a device that started many times without
    /// reaching its node while its records filled every other page, docs/devices.md "Writing"). It is the
    /// program's decision, never the outbox's: those records were queued and will not reach the node. Call it on
    /// an outbox just opened, then open it again; the number of records given up, or `Full` when no page but the
    /// one written holds records. Their sequences are not used again: the node, which never stored them, answers
    /// the next record with an ACK below it, and the sender renumbers the rest after what the node has
    /// (docs/protocol.md 7.3). The page is freed as an acknowledged one is (its header's first unit zeroed), so a
    /// cut during it leaves the outbox as it was or without that page.
    pub fn drop_oldest_page(&mut self) -> Result<usize, OutboxError> {
        let tail = self.tail;
        if tail == self.head {
            return Err(OutboxError::Full);
        }
        self.program(tail, 0, &[0u8; UNIT])?;
        let mut dropped = 0;
        while self.records.front().is_some_and(|r| r.page == tail) {
            self.records.pop_front();
            dropped += 1;
        }
        self.first += dropped as u64;
        if self.pinned.is_some_and(|p| p.page == tail) {
            self.pinned = self.records.front().copied();
        }
        self.tail = (tail + 1) % self.flash.pages();
        self.stats.records_dropped += dropped as u64;
        Ok(dropped)
    }

    /// Runs started on this flash ([`Outbox::new_run`]).
    pub fn runs(&self) -> u64 {
        self.runs
    }

    /// Copies the `i`-th record queued (0: the oldest) into `buf`; its length, or `None` if there is no such
    /// record, it does not fit, or it does not read back whole.
    pub fn record(&self, i: usize, buf: &mut [u8]) -> Option<usize> {
        let r = *self.records.get(i)?;
        let dst = buf.get_mut(..usize::from(r.len))?;
        self.read_record(r, dst).then_some(dst.len())
    }

    fn read_record(&self, r: Stored, dst: &mut [u8]) -> bool {
        let mut eh = [0u8; ENTRY_HEADER];
        let at = usize::from(r.offset);
        if self.flash.read(r.page, at, &mut eh).is_err()
            || self.flash.read(r.page, at + ENTRY_HEADER, dst).is_err()
        {
            return false;
        }
        let mut d = CRC.digest();
        d.update(&eh[..4]);
        d.update(dst);
        d.finalize().to_le_bytes() == eh[4..8]
    }

    pub fn stats(&self) -> OutboxStats {
        self.stats
    }

    pub fn flash(&self) -> &F {
        &self.flash
    }
}

fn entry_header(kind: u8, payload: &[u8]) -> [u8; ENTRY_HEADER] {
    let len = (payload.len() as u16).to_le_bytes();
    let head = [kind, 0, len[0], len[1]];
    let mut d = CRC.digest();
    d.update(&head);
    d.update(payload);
    let crc = d.finalize().to_le_bytes();
    [
        head[0], head[1], head[2], head[3], crc[0], crc[1], crc[2], crc[3],
    ]
}

impl<F: Flash, const RECORDS: usize> RecordQueue for Outbox<F, RECORDS> {
    type Writer<'w>
        = FlashWriter<'w, F>
    where
        Self: 'w;

    fn len(&self) -> usize {
        self.records.len()
    }
    fn bytes_before(&self, i: usize) -> usize {
        self.records
            .iter()
            .take(i)
            .map(|r| wire::varint_len(u64::from(r.len)) + usize::from(r.len))
            .sum()
    }
    fn queued_bytes(&self) -> usize {
        self.bytes_before(self.records.len())
    }
    fn largest_record(&self) -> usize {
        Outbox::largest_record(self)
    }
    fn fit(&self, from: usize, max: usize, room: usize) -> usize {
        let mut used = 0;
        self.records
            .iter()
            .skip(from)
            .take(max)
            .take_while(|r| {
                used += wire::varint_len(u64::from(r.len)) + usize::from(r.len);
                used <= room
            })
            .count()
    }
    fn put_range(&self, out: &mut (impl Out + ?Sized), from: usize, count: usize) -> bool {
        if self.stuck {
            return false;
        }
        for r in self.records.iter().skip(from).take(count) {
            wire::put_varint(out, u64::from(r.len));
            let Some(dst) = out.grow(usize::from(r.len)) else {
                return false;
            };
            if !self.read_record(*r, dst) {
                return false;
            }
        }
        true
    }
    fn push_with(
        &mut self,
        len: usize,
        write: impl FnOnce(&mut FlashWriter<'_, F>),
    ) -> Result<(), QueueFull> {
        if len > usize::from(u16::MAX) || self.records.is_full() {
            return Err(QueueFull);
        }
        let entry = align(ENTRY_HEADER + len);
        self.room(entry, true).map_err(|_| QueueFull)?;
        let (page, at) = (self.head, self.head_at);
        self.head_at += entry;
        let mut w = FlashWriter {
            flash: &mut self.flash,
            page,
            at: at + ENTRY_HEADER,
            unit: [ERASED; UNIT],
            filled: 0,
            written: 0,
            crc: CRC.digest(),
            failed: false,
            units: 0,
        };
        let lenb = (len as u16).to_le_bytes();
        w.crc.update(&[KIND_RECORD, 0, lenb[0], lenb[1]]);
        write(&mut w);
        w.flush();
        let (ok, units) = (!w.failed && w.written == len, w.units);
        let crc = w.crc.finalize().to_le_bytes();
        self.stats.units_programmed += units;
        let eh = [
            KIND_RECORD,
            0,
            lenb[0],
            lenb[1],
            crc[0],
            crc[1],
            crc[2],
            crc[3],
        ];
        // The header last: until it is programmed, the entry is not there.
        if !ok || self.commit_entry(page, at, &eh).is_err() {
            self.stats.flash_failures += u64::from(!ok);
            self.head_closed = true;
            return Err(QueueFull);
        }
        self.records
            .push_back(Stored {
                page,
                offset: at as u16,
                len: len as u16,
            })
            .map_err(|_| QueueFull)
    }
    fn release(&mut self, n: usize) {
        let n = n.min(self.records.len());
        for _ in 0..n {
            self.records.pop_front();
        }
        self.first += n as u64;
    }
    fn clear(&mut self) {
        // Not stored (a refused app) unless an acknowledgement follows (the node was ahead): kept until then.
        if self.pinned.is_none() {
            self.pinned = self.records.front().copied();
        }
        let n = self.records.len();
        self.release(n);
    }
    fn acked(&mut self, through: u64, renumbered: bool) {
        if renumbered {
            let from = self.first;
            self.first = through + 1;
            // The first answer of a new outbox's flow is kept even when it changes no number: it is what says the
            // numbering is the node's from now on.
            if from != self.first || !self.numbered {
                if self.mark(KIND_RENUMBERED, &[from, through + 1]).is_ok() {
                    self.numbered = true;
                } else {
                    self.stats.marks_lost += 1;
                    self.stuck = true;
                }
            }
        } else {
            // The records acknowledged were released already (`release`, `clear`); past every record (the node
            // is ahead), the numbering follows the node.
            self.first = self.first.max(through + 1);
            if through > self.kept_through {
                if self.mark(KIND_ACKED, &[through]).is_ok() {
                    self.numbered = true;
                } else {
                    // Sent again after a restart, and taken by the node as duplicates.
                    self.stats.marks_lost += 1;
                }
            }
        }
        self.kept_through = through;
        if !renumbered {
            self.pinned = None;
        }
        self.free_acked_pages();
    }
}

#[cfg(all(test, feature = "std"))]
mod tests {
    use super::*;
    use alloc::collections::VecDeque;
    use alloc::vec;
    use alloc::vec::Vec;
    use core::cell::Cell;

    /// NOR flash in memory whose power can be cut after a number of unit programs and erases: the operation in
    /// progress is torn (a program clears some of its bits, an erase leaves the page half done) and every later
    /// one fails, as after a real cut, until the device "restarts" with what the pages hold.
    #[derive(Clone)]
    struct SimFlash {
        page: usize,
        pages: Vec<Vec<u8>>,
        /// Operations left before the cut; `None`: no cut.
        budget: Option<u64>,
        dead: bool,
        seed: Cell<u64>,
        erases: Vec<u64>,
    }

    impl SimFlash {
        fn new(page: usize, pages: usize) -> Self {
            SimFlash {
                page,
                pages: vec![vec![0xA5; page]; pages],
                budget: None,
                dead: false,
                seed: Cell::new(7),
                erases: vec![0; pages],
            }
        }
        fn random(&self) -> u64 {
            let mut x = self.seed.get();
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            self.seed.set(x);
            x
        }
        /// True if this operation goes ahead whole; false if the power goes during it.
        fn spend(&mut self) -> bool {
            match &mut self.budget {
                Some(0) => {
                    self.dead = true;
                    false
                }
                Some(n) => {
                    *n -= 1;
                    true
                }
                None => true,
            }
        }
        fn restart(&mut self) {
            self.budget = None;
            self.dead = false;
        }
    }

    impl Flash for SimFlash {
        fn page_size(&self) -> usize {
            self.page
        }
        fn pages(&self) -> u16 {
            self.pages.len() as u16
        }
        fn read(&self, page: u16, offset: usize, buf: &mut [u8]) -> Result<(), FlashError> {
            let p = self.pages.get(usize::from(page)).ok_or(FlashError)?;
            buf.copy_from_slice(p.get(offset..offset + buf.len()).ok_or(FlashError)?);
            Ok(())
        }
        fn program(&mut self, page: u16, offset: usize, data: &[u8]) -> Result<(), FlashError> {
            assert!(
                offset.is_multiple_of(8) && data.len().is_multiple_of(8),
                "whole units only"
            );
            if self.dead {
                return Err(FlashError);
            }
            for (u, unit) in data.chunks(8).enumerate() {
                let at = offset + u * 8;
                if !self.spend() {
                    // Torn: some bytes of this unit are programmed.
                    let keep = self.random() as usize % 8;
                    for (i, b) in unit.iter().enumerate().take(keep) {
                        self.pages[usize::from(page)][at + i] &= b;
                    }
                    return Err(FlashError);
                }
                for (i, b) in unit.iter().enumerate() {
                    self.pages[usize::from(page)][at + i] &= b;
                }
            }
            Ok(())
        }
        fn erase(&mut self, page: u16) -> Result<(), FlashError> {
            if self.dead {
                return Err(FlashError);
            }
            self.erases[usize::from(page)] += 1;
            if !self.spend() {
                let half = self.page / 2;
                self.pages[usize::from(page)][..half].fill(0xFF);
                return Err(FlashError);
            }
            self.pages[usize::from(page)].fill(0xFF);
            Ok(())
        }
    }

    type Box4 = Outbox<SimFlash, 64>;

    fn record(id: u32, len: usize) -> Vec<u8> {
        let mut r = id.to_le_bytes().to_vec();
        r.resize(len.max(4), (id % 251) as u8);
        r
    }

    fn queued(o: &Box4) -> Vec<Vec<u8>> {
        let mut buf = [0u8; 600];
        (0..o.len())
            .map(|i| {
                let n = o.record(i, &mut buf).unwrap();
                buf[..n].to_vec()
            })
            .collect()
    }

    #[test]
    fn records_acks_heard_and_runs_come_back_after_a_restart() {
        let mut o = Box4::open(SimFlash::new(512, 4)).unwrap();
        assert_eq!(
            (o.first_seq(), o.next_seq(), o.heard(), o.runs()),
            (1, 1, 0, 0)
        );
        let run = o.new_run(&[1; 32], b"").unwrap();
        for id in 0..10 {
            o.push_slice(&record(id, 30)).unwrap();
        }
        o.release(4);
        o.acked(4, false);
        o.set_heard(9).unwrap();
        let flash = o.flash().clone();
        let mut o = Box4::open(flash).unwrap();
        assert_eq!(
            (o.first_seq(), o.next_seq(), o.heard(), o.runs()),
            (5, 11, 9, 1)
        );
        assert_eq!(
            queued(&o),
            (4..10).map(|id| record(id, 30)).collect::<Vec<_>>()
        );
        assert_ne!(
            o.new_run(&[1; 32], b"").unwrap(),
            run,
            "a new run, a new id"
        );
    }

    /// A driver that programs an entry's header and then reports a failure (a verify or a timeout after the
    /// write): the record is in flash and will be found at the next start, so `queue` says it is kept. Told it
    /// was not, the program would queue it again, and both would be stored.
    #[test]
    fn a_header_the_driver_wrote_and_then_said_failed_is_taken_as_written() {
        struct SaysFailed {
            flash: SimFlash,
            /// Programs from now on that write and then return an error.
            lie_in: Cell<u32>,
        }
        impl Flash for SaysFailed {
            fn page_size(&self) -> usize {
                self.flash.page_size()
            }
            fn pages(&self) -> u16 {
                self.flash.pages()
            }
            fn read(&self, page: u16, offset: usize, buf: &mut [u8]) -> Result<(), FlashError> {
                self.flash.read(page, offset, buf)
            }
            fn program(&mut self, page: u16, offset: usize, data: &[u8]) -> Result<(), FlashError> {
                self.flash.program(page, offset, data)?;
                let n = self.lie_in.get();
                self.lie_in.set(n.wrapping_sub(1));
                if n == 0 { Err(FlashError) } else { Ok(()) }
            }
            fn erase(&mut self, page: u16) -> Result<(), FlashError> {
                self.flash.erase(page)
            }
        }
        let flash = SaysFailed {
            flash: SimFlash::new(512, 4),
            lie_in: Cell::new(u32::MAX),
        };
        let mut o = Outbox::<_, 64>::open(flash).unwrap();
        o.push_slice(&record(1, 40)).unwrap();
        // The next record: 5 units of payload, then its header, whose program says it failed.
        o.flash.lie_in.set(5);
        o.push_slice(&record(2, 40)).unwrap();
        o.push_slice(&record(3, 40)).unwrap();
        let o = Outbox::<_, 64>::open(o.flash.flash.clone()).unwrap();
        assert_eq!(
            queued(&o),
            [record(1, 40), record(2, 40), record(3, 40)],
            "each once"
        );
    }

    /// A new outbox (new flash, or flash wiped, with a key the node may know) does not know where its numbering
    /// stands: its flow starts with a probe, through restarts, until the node's first answer is kept; the records
    /// queued meanwhile then follow what the node holds, also once the pages opened before are freed.
    #[test]
    fn a_new_outbox_probes_until_the_nodes_first_answer_is_kept() {
        use crate::sender::FlowStart;
        let mut o = Box4::open(SimFlash::new(512, 4)).unwrap();
        assert_eq!(o.flow_start(), FlowStart::Probe);
        // 9 records of 48 bytes a page: pages 0 and 1 full, 2 in page 2, all before the node answered.
        for id in 0..20 {
            o.push_slice(&record(id, 40)).unwrap();
        }
        let o = Box4::open(o.flash().clone()).unwrap();
        assert_eq!(
            (o.flow_start(), o.first_seq(), o.len()),
            (FlowStart::Probe, 1, 20)
        );
        // The node holds 170 from this key: what is queued is numbered from 171.
        let mut o = Box4::open(o.flash().clone()).unwrap();
        o.acked(170, true);
        let mut o = Box4::open(o.flash().clone()).unwrap();
        assert_eq!((o.flow_start(), o.next_seq()), (FlowStart::At(171), 191));
        // The node stores the first 12: page 0 is freed, and page 1 (opened before the answer) is the oldest.
        o.release(12);
        o.acked(182, false);
        let o = Box4::open(o.flash().clone()).unwrap();
        assert_eq!((o.flow_start(), o.next_seq()), (FlowStart::At(183), 191));
        assert_eq!(
            queued(&o),
            (12..20).map(|id| record(id, 40)).collect::<Vec<_>>()
        );
        // A node that holds nothing from the key answers 0: kept too, though no number moves.
        let mut o = Box4::open(SimFlash::new(512, 4)).unwrap();
        o.push_slice(&record(1, 40)).unwrap();
        o.acked(0, true);
        let o = Box4::open(o.flash().clone()).unwrap();
        assert_eq!(o.flow_start(), FlowStart::At(1));
    }

    #[test]
    fn a_renumbering_is_kept_and_applies_to_the_records_that_remain() {
        let mut o = Box4::open(SimFlash::new(512, 4)).unwrap();
        // 9 records of 48 bytes with their headers a page.
        for id in 0..20 {
            o.push_slice(&record(id, 40)).unwrap();
        }
        // The node is behind: what is held is numbered from 8 on.
        o.acked(7, true);
        assert_eq!((o.first_seq(), o.next_seq()), (8, 28));
        // Then the node stores 8..=19 (the first 12), and the page they filled is freed.
        o.release(12);
        o.acked(19, false);
        let o = Box4::open(o.flash().clone()).unwrap();
        assert_eq!((o.first_seq(), o.next_seq()), (20, 28));
        assert_eq!(
            queued(&o),
            (12..20).map(|id| record(id, 40)).collect::<Vec<_>>()
        );
    }

    #[test]
    fn records_let_go_without_being_stored_keep_their_pages_and_come_back() {
        let mut o = Box4::open(SimFlash::new(512, 4)).unwrap();
        for id in 0..5 {
            o.push_slice(&record(id, 100)).unwrap();
        }
        // The node refused the app: the sender lets go of its records, unstored.
        o.clear();
        assert_eq!(o.len(), 0);
        // The device goes on: heard sequences and runs fill pages, which must not free the records' page.
        for h in 1..200 {
            if o.set_heard(h).is_err() {
                break;
            }
        }
        let back = Box4::open(o.flash().clone()).unwrap();
        assert_eq!(
            queued(&back),
            (0..5).map(|id| record(id, 100)).collect::<Vec<_>>()
        );
        // The node was ahead instead: the acknowledgement after letting go frees them.
        let mut o = Box4::open(SimFlash::new(512, 4)).unwrap();
        for id in 0..5 {
            o.push_slice(&record(id, 100)).unwrap();
        }
        o.clear();
        o.acked(9, false);
        let o = Box4::open(o.flash().clone()).unwrap();
        assert_eq!((o.len(), o.first_seq()), (0, 10));
    }

    #[test]
    fn a_full_outbox_says_so_and_takes_records_again_once_acked() {
        let mut o = Box4::open(SimFlash::new(512, 4)).unwrap();
        let fill = |o: &mut Box4, from: u32| {
            let mut n = 0;
            while o.push_slice(&record(from + n, 100)).is_ok() {
                n += 1;
            }
            n
        };
        // Four pages of 512 bytes, one kept for acknowledgements; 4 records of 108 bytes a page.
        let n = fill(&mut o, 0);
        assert_eq!(n, 12);
        o.release(n as usize);
        o.acked(u64::from(n), false);
        // The acknowledgement (16 bytes) does not fit after a page's 56-byte header and 4 records (504 bytes): it
        // opens the next page, whose room then takes 3 records. Once records fill a page past the one that took
        // the acknowledgement, that one is freed too.
        let m = fill(&mut o, n);
        assert_eq!(m, 11);
        let o = Box4::open(o.flash().clone()).unwrap();
        assert_eq!((o.first_seq(), o.len()), (u64::from(n) + 1, 11));
    }

    /// Four pages of 512 bytes: 12 records of 100 bytes fill three; the fourth is kept for marks.
    fn full_of_records() -> Box4 {
        let mut o = Box4::open(SimFlash::new(512, 4)).unwrap();
        let mut n = 0u32;
        while o.push_slice(&record(n, 100)).is_ok() {
            n += 1;
        }
        assert_eq!(n, 12);
        o
    }

    /// An outside audit: run entries filled the kept page of an outbox full of records, and `new_run` said `Full`
    /// at every start for ever (the device could never reach its node to free room). Giving up the oldest page lets
    /// it start again, with the rest of its records and their numbering.
    #[test]
    fn an_outbox_whose_kept_page_filled_with_runs_starts_again_once_its_oldest_page_is_given_up() {
        let secret = [7u8; 32];
        let o = full_of_records();
        let mut starts = 0;
        let mut flash = o.flash().clone();
        loop {
            let mut o = Box4::open(flash.clone()).unwrap();
            match o.new_run(&secret, &[]) {
                Ok(_) => starts += 1,
                Err(e) => {
                    assert_eq!(e, OutboxError::Full);
                    break;
                }
            }
            flash = o.flash().clone();
            assert!(starts < 1000, "never full");
        }
        // 512-byte pages: the kept page takes (512 - 56) / 16 = 28 run entries.
        assert_eq!(starts, 28);
        let runs = Box4::open(flash.clone()).unwrap().runs();
        let mut o = Box4::open(flash).unwrap();
        assert_eq!(o.drop_oldest_page(), Ok(4));
        assert_eq!(o.stats().records_dropped, 4);
        let mut o = Box4::open(o.flash().clone()).unwrap();
        assert_eq!((o.first_seq(), o.len(), o.runs()), (5, 8, runs));
        o.new_run(&secret, &[]).unwrap();
        assert_eq!(o.runs(), runs + 1);
        // The records left are the newest eight, whole.
        let left = queued(&o);
        assert_eq!(left.len(), 8);
        assert_eq!(left[0], record(4, 100));
        // Nothing but the page written holds records: nothing to give up.
        let mut one = Box4::open(SimFlash::new(512, 4)).unwrap();
        one.push_slice(&record(0, 10)).unwrap();
        assert_eq!(one.drop_oldest_page(), Err(OutboxError::Full));
    }

    /// An outside audit's second finding: a device that queues a reading at every start, its node away and the rest
    /// of its outbox full, wrote those readings into the kept page once a run entry had opened it, and could not
    /// start after 12 starts instead of 28 (512-byte pages; about 100 instead of 252 with 4 KiB pages). The kept
    /// page takes marks only, and records again once an acknowledgement frees a page.
    #[test]
    fn records_never_take_the_kept_page_even_after_a_run_entry_opened_it() {
        let secret = [7u8; 32];
        let o = full_of_records();
        let full = o.flash().clone();
        let (mut flash, mut starts) = (full.clone(), 0);
        loop {
            let mut o = Box4::open(flash.clone()).unwrap();
            if o.new_run(&secret, &[]).is_err() {
                break;
            }
            starts += 1;
            assert_eq!(o.push_slice(&record(1000 + starts, 16)), Err(QueueFull));
            flash = o.flash().clone();
            assert!(starts < 1000, "never full");
        }
        assert_eq!(starts, 28);
        let o = Box4::open(flash).unwrap();
        assert_eq!((o.first_seq(), o.len()), (1, 12));
        // A start, then the node acknowledges what it holds: a page is free again, and records go in.
        let mut o = Box4::open(full).unwrap();
        o.new_run(&secret, &[]).unwrap();
        assert_eq!(o.push_slice(&record(100, 16)), Err(QueueFull));
        o.release(12);
        o.acked(12, false);
        o.push_slice(&record(100, 16)).unwrap();
        let o = Box4::open(o.flash().clone()).unwrap();
        assert_eq!((o.first_seq(), queued(&o)), (13, vec![record(100, 16)]));
    }

    /// The model of what the device program was told.
    #[derive(Default)]
    struct Told {
        /// Every record told queued, by sequence: (seq, id).
        queued: VecDeque<(u64, u32)>,
        /// The highest sequence ever given out.
        top: u64,
        acked: u64,
        heard: u64,
        runs: u64,
        run_ids: Vec<u64>,
        /// Every `set_heard_with` tried and possibly written, (heard, state), heard going up; those a restart
        /// shows were not written are dropped.
        states: Vec<(u64, [u8; STATE_LEN])>,
    }

    /// The program's state the model keeps with `heard` in `case`.
    fn state_of(case: u64, heard: u64) -> [u8; STATE_LEN] {
        let mut s = [0u8; STATE_LEN];
        s[..8].copy_from_slice(&heard.to_le_bytes());
        s[8..].copy_from_slice(&(case ^ heard.rotate_left(17)).to_le_bytes());
        s
    }

    /// Power cut at random moments through thousands of operations: after every restart, every record told
    /// queued and not acknowledged is there with its number, in order; no number is given twice; the heard
    /// sequence and the run count never go back; no run id repeats.
    #[test]
    fn power_cuts_at_any_moment_lose_nothing_told_and_reuse_no_number() {
        let only: Option<u64> = std::env::var("OUTBOX_CASE")
            .ok()
            .and_then(|v| v.parse().ok());
        let (mut records_told, mut came_back) = (0u64, 0u64);
        for case in 0..200u64 {
            if only.is_some_and(|c| c != case) {
                continue;
            }
            let mut flash = SimFlash::new(512, 3 + (case % 3) as usize);
            flash.seed.set(case * 7919 + 1);
            let mut told = Told::default();
            let mut id = 0u32;
            for _boot in 0..14 {
                flash.restart();
                flash.budget = Some(flash.random() % 60);
                let Ok(mut o) = Box4::open(flash.clone()) else {
                    // The cut came while a fresh outbox was being made.
                    flash = flash.clone();
                    continue;
                };
                // What came back.
                let first = o.first_seq();
                let back = queued(&o);
                if only.is_some() {
                    std::eprintln!(
                        "boot: first {first} next {} head {} tail {} told.acked {}",
                        o.next_seq(),
                        o.head,
                        o.tail,
                        told.acked
                    );
                }
                let unacked: Vec<_> = told
                    .queued
                    .iter()
                    .filter(|(s, _)| *s > told.acked)
                    .collect();
                // Records acknowledged in memory may come back (their mark was cut); none told is missing.
                assert!(
                    first <= told.acked + 1,
                    "case {case}: starts at {first}, acked {}",
                    told.acked
                );
                for (k, (seq, rid)) in unacked.iter().enumerate() {
                    let i = (*seq - first) as usize;
                    assert_eq!(
                        back.get(i).map(|r| &r[..4]),
                        Some(&rid.to_le_bytes()[..]),
                        "case {case}: record {seq} (#{k} unacked) lost or out of place"
                    );
                }
                assert!(
                    o.next_seq() > told.top,
                    "case {case}: number {} given again",
                    o.next_seq()
                );
                came_back += unacked.len() as u64;
                assert!(
                    o.heard() >= told.heard && o.runs() >= told.runs,
                    "case {case}"
                );
                // The program's state is the one kept with the largest heard sequence that had one.
                told.states.retain(|&(h, _)| h <= o.heard());
                assert_eq!(
                    o.state(),
                    told.states.last().map_or([0; STATE_LEN], |&(_, s)| s),
                    "case {case}: the program's state does not go with heard {}",
                    o.heard()
                );
                told.acked = first - 1;
                told.heard = o.heard();
                told.runs = o.runs();
                // This boot's work, until the power goes.
                for step in 0.. {
                    assert!(
                        step < 10_000,
                        "case {case}: the power never went: the outbox stopped writing"
                    );
                    let r = o.flash().random() % 10;
                    let alive = match r {
                        0..=5 => {
                            let seq = o.next_seq();
                            let len = 4 + (o.flash().random() % 90) as usize;
                            match o.push_slice(&record(id, len)) {
                                Ok(()) => {
                                    if only.is_some() {
                                        std::eprintln!(
                                            "queued {seq} len {len} head {} at {}",
                                            o.head,
                                            o.head_at
                                        );
                                    }
                                    told.queued.push_back((seq, id));
                                    told.top = told.top.max(seq);
                                    records_told += 1;
                                    id += 1;
                                    true
                                }
                                Err(QueueFull) => !o.flash().dead,
                            }
                        }
                        6 | 7 => {
                            let held = o.len() as u64;
                            if held > 0 {
                                let n = 1 + o.flash().random() % held;
                                let through = o.first_seq() + n - 1;
                                o.release(n as usize);
                                o.acked(through, false);
                                if only.is_some() {
                                    std::eprintln!(
                                        "ack {through} dead {} head {} at {} tail {}",
                                        o.flash().dead,
                                        o.head,
                                        o.head_at,
                                        o.tail
                                    );
                                }
                                // The node has them: they may be gone after a restart, cut or not.
                                told.acked = through;
                            }
                            !o.flash().dead
                        }
                        8 => {
                            let h = o.heard() + 1 + o.flash().random() % 3;
                            let with_state = o.flash().random().is_multiple_of(2);
                            let kept = if with_state {
                                told.states.push((h, state_of(case, h)));
                                o.set_heard_with(h, state_of(case, h))
                            } else {
                                o.set_heard(h)
                            };
                            if only.is_some() {
                                std::eprintln!(
                                    "heard {h} with state {with_state}: {kept:?} dead {}",
                                    o.flash().dead
                                );
                            }
                            if kept.is_ok() {
                                told.heard = h;
                            } else if with_state && !o.flash().dead {
                                // Refused (no room), not cut: not written.
                                told.states.pop();
                            }
                            !o.flash().dead
                        }
                        _ => {
                            if let Ok(run) = o.new_run(&[3; 32], b"") {
                                assert!(!told.run_ids.contains(&run), "case {case}: run id again");
                                told.run_ids.push(run);
                                told.runs = o.runs();
                            }
                            !o.flash().dead
                        }
                    };
                    if !alive {
                        break;
                    }
                }
                flash = o.flash().clone();
            }
        }
        // The test did what it says: many records, many of them found again after a cut.
        if only.is_none() {
            assert!(
                records_told > 5_000 && came_back > 1_000,
                "{records_told} told, {came_back} back"
            );
        }
    }

    /// A first version's page (header `PLO1`, 40 bytes, no program's state) is read: its records, heard sequence
    /// and runs come back, and the outbox goes on writing after them.
    #[test]
    fn a_first_version_page_is_read() {
        let mut flash = SimFlash::new(512, 3);
        for p in &mut flash.pages {
            p.fill(ERASED);
        }
        let mut h = [ERASED; HEADER_LEN_V1];
        h[..4].copy_from_slice(&MAGIC_V1);
        h[4..8].copy_from_slice(&1u32.to_le_bytes());
        h[8..16].copy_from_slice(&5u64.to_le_bytes());
        h[16..24].copy_from_slice(&2u64.to_le_bytes());
        h[24..32].copy_from_slice(&3u64.to_le_bytes());
        let crc = CRC.checksum(&h[..32]);
        h[32..36].copy_from_slice(&crc.to_le_bytes());
        flash.pages[0][..HEADER_LEN_V1].copy_from_slice(&h);
        let r = record(77, 8);
        flash.pages[0][HEADER_LEN_V1..HEADER_LEN_V1 + 8]
            .copy_from_slice(&entry_header(KIND_RECORD, &r));
        flash.pages[0][HEADER_LEN_V1 + 8..HEADER_LEN_V1 + 16].copy_from_slice(&r);

        let mut o = Box4::open(flash).unwrap();
        assert_eq!(
            (o.first_seq(), o.next_seq(), o.heard(), o.runs()),
            (5, 6, 2, 3)
        );
        assert_eq!(o.state(), [0; STATE_LEN]);
        assert_eq!(queued(&o), vec![r.clone()]);
        o.push_slice(&record(78, 8)).unwrap();
        o.set_heard_with(4, [9; STATE_LEN]).unwrap();
        let o = Box4::open(o.flash().clone()).unwrap();
        assert_eq!(queued(&o), vec![r, record(78, 8)]);
        assert_eq!((o.next_seq(), o.heard(), o.state()), (7, 4, [9; STATE_LEN]));
    }

    /// The program's state and its heard sequence come back together, through pages opened and freed.
    #[test]
    fn the_programs_state_is_kept_with_heard_across_pages() {
        let mut o = Box4::open(SimFlash::new(512, 3)).unwrap();
        for h in 1..=200u64 {
            o.push_slice(&record(h as u32, 16)).unwrap();
            o.release(1);
            let through = o.first_seq();
            o.acked(through, false);
            if h % 3 == 0 {
                o.set_heard_with(h, state_of(1, h)).unwrap();
            } else {
                o.set_heard(h).unwrap();
            }
            assert_eq!(
                o.set_heard_with(h, [0xEE; STATE_LEN]),
                Ok(()),
                "not above: nothing"
            );
            let back = Box4::open(o.flash().clone()).unwrap();
            assert_eq!(back.heard(), h);
            let expected = if h < 3 {
                [0; STATE_LEN]
            } else {
                state_of(1, h - h % 3)
            };
            assert_eq!(back.state(), expected, "heard {h}");
        }
        assert!(o.stats().pages_erased > 10, "{:?}", o.stats());
    }

    #[test]
    fn wear_one_erase_per_page_per_pass_of_the_ring() {
        let mut o = Box4::open(SimFlash::new(4096, 4)).unwrap();
        // 16-byte records, one acknowledgement each: one record and one mark a wake.
        for id in 0..10_000u32 {
            o.push_slice(&record(id, 16)).unwrap();
            o.release(1);
            let through = o.first_seq() - 1;
            o.acked(through, false);
        }
        let s = o.stats();
        // A record takes 24 bytes with its header and a mark 16: 40 bytes a wake, 101 wakes a page.
        let passes = 10_000 / (101 * 4);
        assert!(s.pages_erased <= (passes as u64 + 1) * 4, "{s:?}");
        assert_eq!(s.flash_failures, 0);
        assert!(
            o.flash().erases.iter().all(|&e| e <= passes as u64 + 2),
            "{:?}",
            o.flash().erases
        );
    }
}
