//! The device's side of the link for C: `pure-link`'s sender with its outbox in flash, behind
//! `include/pure_link.h`. One device, one app, its records in flash the caller's callbacks reach, the time and
//! the randomness from the caller; no heap, no operating system.
//!
//! Everything here is the thin layer C needs: C types in, the sender's events out through a callback, errors as
//! negative numbers. The protocol is `pure-link`'s (one implementation of the sender); nothing is decided here.
//! This is the one place of the project with `unsafe` code: C hands raw pointers, and each is checked for null
//! and trusted for the length the C side gives, as the header says.

#![no_std]
#![allow(non_camel_case_types)]

use core::ffi::{c_char, c_int, c_void};
use core::mem::{align_of, size_of};
use core::ptr;
use core::slice;

use pure_link::buf::SliceOut;
use pure_link::crypto::Identity;
use pure_link::outbox::{Flash, FlashError, Outbox, OutboxError, STATE_LEN};
use pure_link::queue::RecordQueue;
use pure_link::sender::{AppName, Event, Sender, SenderConfig, SenderError};
use pure_link::time::Millis;
use pure_link::wire::RecordFormat;
use pure_link::wire::{MAX_DATAGRAM, MIN_SENDER_DATAGRAM};

/// Records the outbox holds unacknowledged at most (6 bytes of RAM each).
const RECORDS: usize = 64;
/// `PL_DEVICE_SIZE` in the header: the bytes a `pl_device` takes.
const DEVICE_SIZE: usize = 2048;

pub const PL_OK: c_int = 0;
pub const PL_ERR_ARG: c_int = -1;
pub const PL_ERR_FLASH: c_int = -2;
pub const PL_ERR_FULL: c_int = -3;
pub const PL_ERR_TOO_LARGE: c_int = -4;
pub const PL_ERR_REFUSED: c_int = -5;
pub const PL_ERR_KEY: c_int = -6;
pub const PL_ERR_GEOMETRY: c_int = -7;

pub const PL_EVENT_STORED: c_int = 1;
pub const PL_EVENT_REFUSED: c_int = 2;
pub const PL_EVENT_NOT_STORED: c_int = 3;
pub const PL_EVENT_NODE_AHEAD: c_int = 4;
pub const PL_EVENT_NODE_BEHIND: c_int = 5;
pub const PL_EVENT_DOWN: c_int = 6;
pub const PL_EVENT_DOWNLINK_UNANSWERED: c_int = 7;

pub type pl_read_fn = Option<
    unsafe extern "C" fn(
        ctx: *mut c_void,
        page: u16,
        offset: u32,
        buf: *mut u8,
        len: usize,
    ) -> c_int,
>;
pub type pl_program_fn = Option<
    unsafe extern "C" fn(
        ctx: *mut c_void,
        page: u16,
        offset: u32,
        data: *const u8,
        len: usize,
    ) -> c_int,
>;
pub type pl_erase_fn = Option<unsafe extern "C" fn(ctx: *mut c_void, page: u16) -> c_int>;

/// The flash the outbox lives in (docs/devices.md, "The outbox in flash").
#[repr(C)]
#[derive(Clone, Copy)]
pub struct pl_flash {
    pub ctx: *mut c_void,
    pub page_size: u32,
    pub pages: u16,
    pub read: pl_read_fn,
    pub program: pl_program_fn,
    pub erase: pl_erase_fn,
}

/// What the sender tells the program.
#[repr(C)]
pub struct pl_event {
    pub kind: c_int,
    /// STORED: through; NODE_AHEAD, NODE_BEHIND: the node's; DOWN: the record's sequence.
    pub seq: u64,
    /// NODE_AHEAD, NODE_BEHIND: ours.
    pub ours: u64,
    /// REFUSED, NOT_STORED: the reason (docs/protocol.md 5).
    pub reason: u8,
    /// DOWN: the record (valid during the callback only).
    pub payload: *const u8,
    pub payload_len: usize,
}

pub type pl_event_fn = Option<unsafe extern "C" fn(ctx: *mut c_void, event: *const pl_event)>;

/// Memory for one device, given by the caller (static, on the stack of the task that runs it, anywhere).
#[repr(C, align(8))]
pub struct pl_device {
    _opaque: [u8; DEVICE_SIZE],
}

struct CFlash(pl_flash);

impl Flash for CFlash {
    fn page_size(&self) -> usize {
        self.0.page_size as usize
    }
    fn pages(&self) -> u16 {
        self.0.pages
    }
    fn read(&self, page: u16, offset: usize, buf: &mut [u8]) -> Result<(), FlashError> {
        let f = self.0.read.ok_or(FlashError)?;
        // SAFETY: the callback was given by the C side for this flash; `buf` is valid for `len` bytes.
        let r = unsafe { f(self.0.ctx, page, offset as u32, buf.as_mut_ptr(), buf.len()) };
        if r == 0 { Ok(()) } else { Err(FlashError) }
    }
    fn program(&mut self, page: u16, offset: usize, data: &[u8]) -> Result<(), FlashError> {
        let f = self.0.program.ok_or(FlashError)?;
        // SAFETY: as for `read`; `data` is valid for its length.
        let r = unsafe { f(self.0.ctx, page, offset as u32, data.as_ptr(), data.len()) };
        if r == 0 { Ok(()) } else { Err(FlashError) }
    }
    fn erase(&mut self, page: u16) -> Result<(), FlashError> {
        let f = self.0.erase.ok_or(FlashError)?;
        // SAFETY: as for `read`.
        let r = unsafe { f(self.0.ctx, page) };
        if r == 0 { Ok(()) } else { Err(FlashError) }
    }
}

type DeviceSender = Sender<Millis, Outbox<CFlash, RECORDS>, 1, 1, 8>;

struct Device {
    sender: DeviceSender,
    app: AppName,
}

const _: () = assert!(size_of::<Device>() <= DEVICE_SIZE && align_of::<Device>() <= 8);

impl Device {
    fn outbox(&mut self) -> Option<&mut Outbox<CFlash, RECORDS>> {
        let app = self.app;
        self.sender.queue_mut(app.as_str())
    }
}

fn sender_error(e: SenderError) -> c_int {
    match e {
        SenderError::BadApp | SenderError::TooManyApps(_) | SenderError::NoFlow(_) => PL_ERR_ARG,
        SenderError::TooLarge { .. } => PL_ERR_TOO_LARGE,
        SenderError::BadNodeKey => PL_ERR_KEY,
        SenderError::Refused(_) => PL_ERR_REFUSED,
        SenderError::QueueFull(_) => PL_ERR_FULL,
    }
}

fn outbox_error(e: OutboxError) -> c_int {
    match e {
        OutboxError::Flash => PL_ERR_FLASH,
        OutboxError::Geometry | OutboxError::TooManyRecords => PL_ERR_GEOMETRY,
        OutboxError::Full => PL_ERR_FULL,
    }
}

/// # Safety
/// `dev` must point to a `pl_device` opened by `pl_open` and not closed.
unsafe fn device<'a>(dev: *mut pl_device) -> Option<&'a mut Device> {
    // SAFETY: per the function's contract, an open device holds a `Device` at this address.
    unsafe { dev.cast::<Device>().as_mut() }
}

fn deliver(cb: pl_event_fn, ctx: *mut c_void, e: Event<'_>) {
    let Some(cb) = cb else { return };
    let mut ev = pl_event {
        kind: 0,
        seq: 0,
        ours: 0,
        reason: 0,
        payload: ptr::null(),
        payload_len: 0,
    };
    match e {
        Event::Stored { through, .. } => (ev.kind, ev.seq) = (PL_EVENT_STORED, through),
        Event::Refused { reason, .. } => (ev.kind, ev.reason) = (PL_EVENT_REFUSED, reason),
        Event::NotStored { reason, .. } => (ev.kind, ev.reason) = (PL_EVENT_NOT_STORED, reason),
        Event::NodeAhead { node, ours, .. } => {
            (ev.kind, ev.seq, ev.ours) = (PL_EVENT_NODE_AHEAD, node, ours)
        }
        Event::NodeBehind { node, ours, .. } => {
            (ev.kind, ev.seq, ev.ours) = (PL_EVENT_NODE_BEHIND, node, ours)
        }
        Event::Down { seq, payload, .. } => {
            (ev.kind, ev.seq, ev.payload, ev.payload_len) =
                (PL_EVENT_DOWN, seq, payload.as_ptr(), payload.len())
        }
        Event::DownlinkUnanswered { .. } => ev.kind = PL_EVENT_DOWNLINK_UNANSWERED,
    }
    // SAFETY: the callback and its context were given by the C side; the event lives through the call.
    unsafe { cb(ctx, &ev) }
}

/// Opens a device in `dev`: its outbox in `flash` (formatted on first use), a new run (counted in flash), and its
/// flow to `app` going on from the outbox. See the header.
///
/// # Safety
/// Pointers as the header says: `dev` writable for a `pl_device`, `flash` readable, `secret` and `node_public`
/// 32 bytes each, `app` a NUL-terminated string, `entropy` readable for `entropy_len` bytes (or null with 0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pl_open(
    dev: *mut pl_device,
    flash: *const pl_flash,
    secret: *const u8,
    node_public: *const u8,
    app: *const c_char,
    entropy: *const u8,
    entropy_len: usize,
    max_datagram: usize,
) -> c_int {
    if dev.is_null()
        || flash.is_null()
        || secret.is_null()
        || node_public.is_null()
        || app.is_null()
    {
        return PL_ERR_ARG;
    }
    // SAFETY: non-null, and per the contract valid for these lengths.
    let (flash, secret, node_public, app) = unsafe {
        (
            *flash,
            *secret.cast::<[u8; 32]>(),
            *node_public.cast::<[u8; 32]>(),
            core::ffi::CStr::from_ptr(app).to_bytes(),
        )
    };
    let entropy: &[u8] = if entropy.is_null() {
        &[]
    } else {
        // SAFETY: per the contract.
        unsafe { slice::from_raw_parts(entropy, entropy_len) }
    };
    if flash.read.is_none() || flash.program.is_none() || flash.erase.is_none() {
        return PL_ERR_ARG;
    }
    // Outside the range the header gives, it was once taken in silence (clamped): a carrier's size mistaken.
    if max_datagram != 0 && !(MIN_SENDER_DATAGRAM..=MAX_DATAGRAM).contains(&max_datagram) {
        return PL_ERR_ARG;
    }
    let Ok(name) = core::str::from_utf8(app) else {
        return PL_ERR_ARG;
    };
    let Ok(app) = AppName::new(name) else {
        return PL_ERR_ARG;
    };
    let mut outbox = match Outbox::<CFlash, RECORDS>::open(CFlash(flash)) {
        Ok(o) => o,
        Err(e) => return outbox_error(e),
    };
    let run_id = match outbox.new_run(&secret, entropy) {
        Ok(id) => id,
        Err(e) => return outbox_error(e),
    };
    // A new outbox asks the node where its numbering stands (Outbox::numbered).
    let start = outbox.flow_start();
    let mut config =
        SenderConfig::with_run_id(Identity::from_secret_bytes(secret), node_public, run_id);
    if max_datagram != 0 {
        config.max_datagram = max_datagram;
    }
    let mut sender = match DeviceSender::new(config) {
        Ok(s) => s,
        Err(e) => return sender_error(e),
    };
    if let Err(e) = sender.open_flow_with(name, start, RecordFormat::Plain, outbox) {
        return sender_error(e);
    }
    // SAFETY: `dev` is writable for a `pl_device`, which is large and aligned enough for a `Device` (asserted).
    unsafe { dev.cast::<Device>().write(Device { sender, app }) };
    PL_OK
}

/// Listens on the app's downlink from the heard sequence kept in the outbox.
///
/// # Safety
/// `dev` opened by `pl_open`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pl_listen(dev: *mut pl_device) -> c_int {
    // SAFETY: per the contract.
    let Some(d) = (unsafe { device(dev) }) else {
        return PL_ERR_ARG;
    };
    let heard = d.outbox().map_or(0, |o| o.heard());
    let app = d.app;
    match d.sender.listen(app.as_str(), heard) {
        Ok(()) => PL_OK,
        Err(e) => sender_error(e),
    }
}

/// Offers the node version 1.2 of downlink (docs/protocol.md 13): once the node has validated the device's address
/// it sends DOWN records beyond what the device sent, at most `bytes` of datagrams in flight beyond what the
/// program was handed. 0 (the default) offers nothing: each answer stays within what the device sent.
///
/// # Safety
/// `dev` opened by `pl_open`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pl_set_down_window(dev: *mut pl_device, bytes: u32) -> c_int {
    // SAFETY: per the contract.
    let Some(d) = (unsafe { device(dev) }) else {
        return PL_ERR_ARG;
    };
    d.sender.set_down_window(u64::from(bytes));
    PL_OK
}

/// 1 once the node challenged this run (it speaks version 1.2 and sends wide downlink once answered), else 0.
///
/// # Safety
/// `dev` opened by `pl_open`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pl_is_wide(dev: *mut pl_device) -> c_int {
    // SAFETY: per the contract.
    unsafe { device(dev) }.map_or(0, |d| c_int::from(d.sender.wide()))
}

/// Queues a record: in flash when this returns `PL_OK`.
///
/// # Safety
/// `dev` opened by `pl_open`; `record` readable for `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pl_queue(dev: *mut pl_device, record: *const u8, len: usize) -> c_int {
    // SAFETY: per the contract.
    let Some(d) = (unsafe { device(dev) }) else {
        return PL_ERR_ARG;
    };
    if record.is_null() && len > 0 {
        return PL_ERR_ARG;
    }
    let record: &[u8] = if len == 0 {
        &[]
    } else {
        // SAFETY: per the contract.
        unsafe { slice::from_raw_parts(record, len) }
    };
    // The sender says "too large" for a record larger than a page takes (refused for good), and the outbox "full"
    // for every other record it did not keep; a failed flash callback is the flash's fault, not the node's.
    let failures = d.outbox().map_or(0, |o| o.stats().flash_failures);
    let app = d.app;
    match d.sender.queue(app.as_str(), record) {
        Ok(()) => PL_OK,
        Err(SenderError::QueueFull(_))
            if d.outbox()
                .is_some_and(|o| o.stats().flash_failures > failures) =>
        {
            PL_ERR_FLASH
        }
        Err(e) => sender_error(e),
    }
}

/// Gives up the records of the oldest page of the outbox in `flash`, unstored: the way out when `pl_open` says
/// `PL_ERR_FULL` because the page kept for marks filled with run entries ([`Outbox::drop_oldest_page`]). The number
/// of records given up, or a negative error (`PL_ERR_FULL`: no page but the one written holds records). Call it
/// with no device open on that flash, then `pl_open` again.
///
/// # Safety
/// `flash` points to a valid `pl_flash` whose callbacks may be called.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pl_drop_oldest(flash: *const pl_flash) -> c_int {
    if flash.is_null() {
        return PL_ERR_ARG;
    }
    // SAFETY: non-null, and per the contract valid.
    let flash = unsafe { *flash };
    if flash.read.is_none() || flash.program.is_none() || flash.erase.is_none() {
        return PL_ERR_ARG;
    }
    let mut outbox = match Outbox::<CFlash, RECORDS>::open(CFlash(flash)) {
        Ok(o) => o,
        Err(e) => return outbox_error(e),
    };
    match outbox.drop_oldest_page() {
        Ok(n) => c_int::try_from(n).unwrap_or(c_int::MAX),
        Err(e) => outbox_error(e),
    }
}

/// Builds the next datagram into `out`; its length, or 0 when nothing is to be sent now.
///
/// # Safety
/// `dev` opened by `pl_open`; `out` writable for `out_len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pl_poll_transmit(
    dev: *mut pl_device,
    now_ms: u64,
    out: *mut u8,
    out_len: usize,
) -> usize {
    // SAFETY: per the contract.
    let Some(d) = (unsafe { device(dev) }) else {
        return 0;
    };
    if out.is_null() || out_len < d.sender.datagram_size() {
        return 0;
    }
    // SAFETY: per the contract.
    let buf = unsafe { slice::from_raw_parts_mut(out, out_len) };
    let mut o = SliceOut::new(buf);
    if d.sender.poll_transmit(Millis(now_ms), &mut o) && !o.overflowed() {
        o.written().len()
    } else {
        0
    }
}

/// When `pl_handle_timeout` is due: 1 and `*at_ms` set, or 0 when nothing waits on a timer.
///
/// # Safety
/// `dev` opened by `pl_open`; `at_ms` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pl_poll_timeout(dev: *mut pl_device, at_ms: *mut u64) -> c_int {
    // SAFETY: per the contract.
    let Some(d) = (unsafe { device(dev) }) else {
        return 0;
    };
    match d.sender.poll_timeout() {
        Some(Millis(t)) if !at_ms.is_null() => {
            // SAFETY: per the contract.
            unsafe { at_ms.write(t) };
            1
        }
        _ => 0,
    }
}

/// Takes a datagram from the node (decrypted in place: its bytes are garbage after); events go to `cb`.
///
/// # Safety
/// `dev` opened by `pl_open`; `datagram` writable for `len` bytes; `cb` null or a function taking `ctx`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pl_handle_datagram(
    dev: *mut pl_device,
    now_ms: u64,
    datagram: *mut u8,
    len: usize,
    cb: pl_event_fn,
    ctx: *mut c_void,
) {
    // SAFETY: per the contract.
    let Some(d) = (unsafe { device(dev) }) else {
        return;
    };
    if datagram.is_null() {
        return;
    }
    // SAFETY: per the contract.
    let buf = unsafe { slice::from_raw_parts_mut(datagram, len) };
    d.sender
        .handle_datagram(Millis(now_ms), buf, &mut |e| deliver(cb, ctx, e));
}

/// The timer of `pl_poll_timeout` passed; events go to `cb`.
///
/// # Safety
/// As `pl_handle_datagram`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pl_handle_timeout(
    dev: *mut pl_device,
    now_ms: u64,
    cb: pl_event_fn,
    ctx: *mut c_void,
) {
    // SAFETY: per the contract.
    let Some(d) = (unsafe { device(dev) }) else {
        return;
    };
    d.sender
        .handle_timeout(Millis(now_ms), &mut |e| deliver(cb, ctx, e));
}

/// Keeps `seq` as the downlink heard sequence in flash: call it once the program has done what a DOWN record
/// asks, before the next `pl_poll_transmit`.
///
/// # Safety
/// `dev` opened by `pl_open`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pl_set_heard(dev: *mut pl_device, seq: u64) -> c_int {
    // SAFETY: per the contract.
    let Some(d) = (unsafe { device(dev) }) else {
        return PL_ERR_ARG;
    };
    match d.outbox().map(|o| o.set_heard(seq)) {
        Some(Ok(())) => PL_OK,
        Some(Err(e)) => outbox_error(e),
        None => PL_ERR_ARG,
    }
}

/// Keeps `seq` as the downlink heard sequence and the program's `state` (`PL_STATE_LEN` bytes) in one write:
/// after a power cut the flash has both or neither.
///
/// # Safety
/// `dev` opened by `pl_open`; `state` readable for `PL_STATE_LEN` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pl_set_heard_with(
    dev: *mut pl_device,
    seq: u64,
    state: *const u8,
) -> c_int {
    // SAFETY: per the contract.
    let Some(d) = (unsafe { device(dev) }) else {
        return PL_ERR_ARG;
    };
    if state.is_null() {
        return PL_ERR_ARG;
    }
    let mut kept = [0u8; STATE_LEN];
    // SAFETY: `state` is readable for STATE_LEN bytes, per the contract.
    kept.copy_from_slice(unsafe { slice::from_raw_parts(state, STATE_LEN) });
    match d.outbox().map(|o| o.set_heard_with(seq, kept)) {
        Some(Ok(())) => PL_OK,
        Some(Err(e)) => outbox_error(e),
        None => PL_ERR_ARG,
    }
}

/// Copies the program's state kept with the heard sequence (zeros until `pl_set_heard_with` kept one) to `out`.
///
/// # Safety
/// `dev` opened by `pl_open`; `out` writable for `PL_STATE_LEN` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pl_state(dev: *mut pl_device, out: *mut u8) -> c_int {
    // SAFETY: per the contract.
    let Some(d) = (unsafe { device(dev) }) else {
        return PL_ERR_ARG;
    };
    let (Some(state), false) = (d.outbox().map(|o| o.state()), out.is_null()) else {
        return PL_ERR_ARG;
    };
    // SAFETY: `out` is writable for STATE_LEN bytes, per the contract.
    unsafe { slice::from_raw_parts_mut(out, STATE_LEN) }.copy_from_slice(&state);
    PL_OK
}

/// The sequence the next record queued gets.
///
/// # Safety
/// `dev` opened by `pl_open`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pl_next_seq(dev: *mut pl_device) -> u64 {
    // SAFETY: per the contract.
    unsafe { device(dev) }
        .and_then(|d| d.outbox().map(|o| o.next_seq()))
        .unwrap_or(0)
}

/// The downlink heard sequence kept in the outbox: the last downlink record the program kept with
/// `pl_set_heard` (0 before any).
///
/// # Safety
/// `dev` opened by `pl_open`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pl_heard(dev: *mut pl_device) -> u64 {
    // SAFETY: per the contract.
    unsafe { device(dev) }
        .and_then(|d| d.outbox().map(|o| o.heard()))
        .unwrap_or(0)
}

/// Records queued and not yet stored by the node.
///
/// # Safety
/// `dev` opened by `pl_open`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pl_unacked(dev: *mut pl_device) -> usize {
    // SAFETY: per the contract.
    unsafe { device(dev) }
        .and_then(|d| d.outbox().map(|o| o.len()))
        .unwrap_or(0)
}

/// 1 when nothing waits for the node (every record stored, every downlink answer in), else 0.
///
/// # Safety
/// `dev` opened by `pl_open`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pl_is_idle(dev: *mut pl_device) -> c_int {
    // SAFETY: per the contract.
    unsafe { device(dev) }.map_or(0, |d| c_int::from(d.sender.is_idle()))
}

/// The largest record `pl_queue` takes.
///
/// # Safety
/// `dev` opened by `pl_open`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pl_max_record(dev: *mut pl_device) -> usize {
    // SAFETY: per the contract.
    unsafe { device(dev) }.map_or(0, |d| d.sender.max_record(d.app.as_str()))
}

/// Closes the device; `dev`'s memory may be reused after.
///
/// # Safety
/// `dev` opened by `pl_open`, not used again until opened again.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pl_close(dev: *mut pl_device) {
    if !dev.is_null() {
        // SAFETY: an open device holds a `Device` here; it is dropped once.
        unsafe { ptr::drop_in_place(dev.cast::<Device>()) }
    }
}

/// The size of `pl_device` this library was built with, to check the header against (`PL_DEVICE_SIZE`).
#[unsafe(no_mangle)]
pub extern "C" fn pl_device_size() -> usize {
    DEVICE_SIZE
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo<'_>) -> ! {
    // Nothing here panics on any input (the core is written so); were it to, stop as C's abort does.
    unsafe extern "C" {
        fn abort() -> !;
    }
    // SAFETY: abort takes nothing and does not return; the C library (libc, newlib) provides it.
    unsafe { abort() }
}
