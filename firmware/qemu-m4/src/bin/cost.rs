//! Instructions per operation of the link on the Cortex-M4 (research/038): run under `qemu-system-arm -icount
//! shift=0`, where virtual time advances one nanosecond per guest instruction, each operation is timed by the
//! dual timer's timer 2 (25 MHz, prescale 1, free-running): one tick = 40 ns = 40 instructions. The timer's own
//! read (an empty interval) is measured and printed; the host script subtracts it.
//!
//! First a calibration: a loop of `subs`/`bne` (2 instructions an iteration) run 10^6 times must read 2,000,000.
//! Then, 5 times each: X25519 (`Identity::shared_secret`), a public key from a secret (`from_secret_bytes`), one
//! HKDF-SHA256 derivation (`sender_to_node_key`), `crypto::seal` of a 96-byte and a 1,200-byte datagram, opening
//! a blank outbox, `Sender::queue` of 16-byte records into the outbox over a RAM stub and over the board's flash
//! (semihosting: the host's file I/O is not guest instructions), and `poll_transmit` with 1 and 20 records queued.
//!
//! Prints one JSON line per sample on the console: `{"op":..,"i":..,"ticks":..}`. No `Board::take`: SysTick is
//! not started, so no exception lands in a timed interval. Exits 0, or 4 on a flash error, 5 without a flash path.
#![no_std]
#![no_main]

use core::cell::RefCell;
use core::ptr::{addr_of_mut, read_volatile, write_volatile};

use cortex_m_rt::entry;
use pure_link::buf::{Out, SliceOut};
use pure_link::crypto::{self, Identity};
use pure_link::outbox::{Flash, FlashError, Outbox};
use pure_link::sender::{FlowStart, Sender, SenderConfig};
use pure_link::time::Millis;
use pure_link::wire::RecordFormat;
use pure_qemu_m4::board::{self, exit, host};
use pure_qemu_m4::println;

const RECORDS: usize = 64;
const SAMPLES: usize = 5;
const PAGE_SIZE: usize = board::flash::PAGE_SIZE;
const PAGES: u16 = 4;

/// Timer 2 of the CMSDK dual timer (ARM DDI0479C 4.4): LOAD +0x00, VALUE +0x04, CONTROL +0x08.
const TIMER2: usize = 0x4000_2020;
/// Enabled, free-running, no interrupt, prescale 1, 32-bit.
const CONTROL: u32 = (1 << 7) | (1 << 1);

fn timer_start() {
    // SAFETY: timer 2's registers; nothing else in this firmware touches timer 2.
    unsafe {
        write_volatile(TIMER2 as *mut u32, u32::MAX);
        write_volatile((TIMER2 + 0x08) as *mut u32, CONTROL);
    }
}

#[inline(always)]
fn ticks() -> u32 {
    // SAFETY: timer 2's value register, read only. It counts down.
    unsafe { read_volatile((TIMER2 + 0x04) as *const u32) }
}

/// Ticks `f` takes.
#[inline(always)]
fn time<R>(f: impl FnOnce() -> R) -> (u32, R) {
    let t0 = ticks();
    let r = f();
    let t1 = ticks();
    (t0.wrapping_sub(t1), r)
}

fn report(op: &str, i: usize, ticks: u32) {
    println!("{{\"op\":\"{}\",\"i\":{},\"ticks\":{}}}", op, i, ticks);
}

/// `n` iterations of 2 instructions.
#[inline(never)]
fn spin(n: u32) {
    // SAFETY: a register-only loop.
    unsafe {
        core::arch::asm!("2:", "subs {n}, #1", "bne 2b", n = inout(reg) n => _, options(nomem, nostack));
    }
}

/// A RAM stub flash: 4 pages of 4 KiB, NOR rules, the CPU work a copying driver does.
static mut RAM_FLASH: [u8; PAGE_SIZE * PAGES as usize] = [0; PAGE_SIZE * PAGES as usize];

struct RamFlash(&'static mut [u8; PAGE_SIZE * PAGES as usize]);

impl RamFlash {
    fn take() -> RamFlash {
        // SAFETY: one RamFlash lives at a time (each is dropped, with its outbox, before the next is taken).
        let mem = unsafe { &mut *addr_of_mut!(RAM_FLASH) };
        mem.fill(0);
        RamFlash(mem)
    }
}

impl Flash for RamFlash {
    fn page_size(&self) -> usize {
        PAGE_SIZE
    }
    fn pages(&self) -> u16 {
        PAGES
    }
    fn read(&self, page: u16, offset: usize, buf: &mut [u8]) -> Result<(), FlashError> {
        let at = page as usize * PAGE_SIZE + offset;
        buf.copy_from_slice(self.0.get(at..at + buf.len()).ok_or(FlashError)?);
        Ok(())
    }
    fn program(&mut self, page: u16, offset: usize, data: &[u8]) -> Result<(), FlashError> {
        let at = page as usize * PAGE_SIZE + offset;
        let dst = self.0.get_mut(at..at + data.len()).ok_or(FlashError)?;
        for (d, s) in dst.iter_mut().zip(data) {
            *d &= *s;
        }
        Ok(())
    }
    fn erase(&mut self, page: u16) -> Result<(), FlashError> {
        let at = page as usize * PAGE_SIZE;
        self.0[at..at + PAGE_SIZE].fill(0xFF);
        Ok(())
    }
}

/// The board's flash (pages 8–11 of the host file, through semihosting) as the outbox's `Flash`.
struct BoardFlash(RefCell<board::flash::Flash>);

const FIRST_PAGE: usize = 8;

impl Flash for BoardFlash {
    fn page_size(&self) -> usize {
        PAGE_SIZE
    }
    fn pages(&self) -> u16 {
        PAGES
    }
    fn read(&self, page: u16, offset: usize, buf: &mut [u8]) -> Result<(), FlashError> {
        let mut f = self.0.borrow_mut();
        f.read(FIRST_PAGE + page as usize, offset, buf)
            .map_err(|_| FlashError)
    }
    fn program(&mut self, page: u16, offset: usize, data: &[u8]) -> Result<(), FlashError> {
        let f = self.0.get_mut();
        f.program(FIRST_PAGE + page as usize, offset, data)
            .map_err(|_| FlashError)
    }
    fn erase(&mut self, page: u16) -> Result<(), FlashError> {
        self.0
            .get_mut()
            .erase(FIRST_PAGE + page as usize)
            .map_err(|_| FlashError)
    }
}

fn secret(i: usize) -> [u8; 32] {
    let mut s = [0x42u8; 32];
    s[0] = i as u8;
    s
}

/// A sender over outbox `F` (blank flash) with `n` records of 16 B queued (each queue timed as `queue_op` when
/// `n` > 1), then one `poll_transmit` timed as `build_op`. The outbox's open is timed as `open_op`.
fn deliver<F: Flash>(flash: F, n: usize, i: usize, ops: [&str; 3], node: &[u8; 32]) {
    let [open_op, queue_op, build_op] = ops;
    let (t, outbox) = time(|| Outbox::<F, RECORDS>::open(flash));
    let mut outbox = outbox.unwrap_or_else(|_| exit(4));
    report(open_op, i, t);
    let run_id = outbox
        .new_run(&secret(i), &[i as u8; 8])
        .unwrap_or_else(|_| exit(4));
    let first = outbox.first_seq();
    let mut s = Sender::<Millis, Outbox<F, RECORDS>, 1, 1, 8>::new(SenderConfig::with_run_id(
        Identity::from_secret_bytes(secret(i)),
        *node,
        run_id,
    ))
    .unwrap_or_else(|_| exit(3));
    s.open_flow_with("main", FlowStart::At(first), RecordFormat::Plain, outbox)
        .unwrap_or_else(|_| exit(3));
    let mut record = [b'.'; 16];
    for k in 0..n {
        record[0] = b'0' + (k % 10) as u8;
        let (t, r) = time(|| s.queue("main", &record));
        r.unwrap_or_else(|_| exit(4));
        if n > 1 {
            report(queue_op, i * n + k, t);
        }
    }
    let mut buf = [0u8; 1200];
    let mut out = SliceOut::new(&mut buf);
    let (t, sent) = time(|| s.poll_transmit(Millis(0), &mut out));
    if !sent {
        exit(2);
    }
    report(build_op, i, t);
    println!(
        "{{\"op\":\"{}_bytes\",\"i\":{},\"bytes\":{}}}",
        build_op,
        i,
        out.written().len()
    );
}

/// The board's flash, pages 8–11 erased (untimed), for a blank outbox.
fn board_flash() -> BoardFlash {
    let mut line = [0u8; 512];
    let path = host::flash_path(&mut line).unwrap_or_else(|| exit(5));
    let mut f = board::flash::Flash::open(path).unwrap_or_else(|_| exit(5));
    for p in 0..PAGES as usize {
        f.erase(FIRST_PAGE + p).unwrap_or_else(|_| exit(4));
    }
    BoardFlash(RefCell::new(f))
}

#[entry]
fn main() -> ! {
    timer_start();

    // The timer's own cost, and the calibration loop.
    for i in 0..SAMPLES {
        let (t, ()) = time(|| ());
        report("empty", i, t);
    }
    for i in 0..SAMPLES {
        let (t, ()) = time(|| spin(1_000_000));
        report("calib_spin_1e6x2", i, t);
    }

    let node_id = Identity::from_secret_bytes([7u8; 32]);
    let node = *node_id.public();

    for i in 0..SAMPLES {
        let (t, id) = time(|| Identity::from_secret_bytes(secret(i)));
        report("x25519_public_key", i, t);
        let (t, shared) = time(|| id.shared_secret(&node));
        report("x25519_shared", i, t);
        let shared = shared.unwrap_or_else(|_| exit(3));
        let (t, key) = time(|| crypto::sender_to_node_key(&shared, i as u64, id.public(), &node));
        report("hkdf_key", i, t);
        for (op, len) in [("seal_96", 96usize), ("seal_1200", 1200)] {
            let mut buf = [0u8; 1200];
            let mut out = SliceOut::new(&mut buf);
            for b in 0..len - 16 {
                out.push(b as u8);
            }
            let (t, ()) = time(|| crypto::seal(&key, i as u64, &mut out, 21));
            report(op, i, t);
            if out.written().len() != len {
                exit(8);
            }
        }
    }

    for i in 0..SAMPLES {
        deliver(
            RamFlash::take(),
            1,
            i,
            ["outbox_open_ram", "-", "datagram_1_ram"],
            &node,
        );
        deliver(
            RamFlash::take(),
            20,
            i,
            ["outbox_open_ram", "queue16_ram", "datagram_20_ram"],
            &node,
        );
    }
    for i in 0..SAMPLES {
        deliver(
            board_flash(),
            1,
            i,
            ["outbox_open_board", "-", "datagram_1_board"],
            &node,
        );
        deliver(
            board_flash(),
            20,
            i,
            ["outbox_open_board", "queue16_board", "datagram_20_board"],
            &node,
        );
    }
    exit(0)
}
