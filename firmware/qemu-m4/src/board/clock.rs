//! The millisecond clock: timer 1 of the board's CMSDK APB dual timer (0x40002000), free-running, 32 bits,
//! SYSCLK (25 MHz) divided by 256, read whenever [`now_ms`] is asked and widened to 64 bits here.
//!
//! Why not count SysTick exceptions, one a millisecond: measured under QEMU 7.2 that clock ran 20–30% slow
//! (3,000 of its milliseconds took 3.9 s of host time), as ticks that come while one is pending are lost. A
//! counter read when asked is computed by QEMU from its virtual clock, which (without `-icount`) follows the
//! host's: a millisecond here is a millisecond of host time, checked by `tests/firmware.rs` (two datagrams sent
//! 500 ms apart by this clock must reach the host about 500 ms apart).
//!
//! The counter wraps every 2^32 × 256 / 25 MHz ≈ 12.2 hours; reading it at least that often is enough to widen
//! it. SysTick (an exception of the core, every millisecond) reads it, so a firmware that waits in `wfi` keeps
//! its clock and wakes once a millisecond to poll the UART; a lost SysTick costs nothing.

use core::cell::Cell;
use core::ptr::{read_volatile, write_volatile};

use cortex_m::peripheral::{syst::SystClkSource, SYST};
use cortex_m_rt::exception;
use critical_section::Mutex;

/// mps2-an386's SYSCLK, which clocks the core and the APB timers (QEMU `hw/arm/mps2.c`, `SYSCLK_FRQ`).
pub const SYSCLK_HZ: u64 = 25_000_000;
/// The dual timer's registers (ARM DDI0479C 4.4); timer 1 is the first of its two.
pub const DUALTIMER_BASE: usize = 0x4000_2000;
const TIMER1_VALUE: usize = 0x04;
const TIMER1_CONTROL: usize = 0x08;
/// CONTROL: enabled, free-running (MODE 0), no interrupt, prescale 256 (0b10 << 2), 32-bit counter.
const CONTROL: u32 = (1 << 7) | (0b10 << 2) | (1 << 1);
const PRESCALE: u64 = 256;
/// SysTick's reload: 1 ms of core cycles (at most 2^24 - 1).
const SYSTICK_RELOAD: u32 = (SYSCLK_HZ / 1_000) as u32 - 1;

/// (the counter's last value read, timer ticks counted since start).
static TICKS: Mutex<Cell<(u32, u64)>> = Mutex::new(Cell::new((u32::MAX, 0)));

/// Starts the counter (from 0xFFFFFFFF, counting down) and SysTick.
pub(super) fn start(mut syst: SYST) {
    // SAFETY: the dual timer's control register; only this module touches the dual timer.
    unsafe { write_volatile((DUALTIMER_BASE + TIMER1_CONTROL) as *mut u32, CONTROL) };
    syst.set_clock_source(SystClkSource::Core);
    syst.set_reload(SYSTICK_RELOAD);
    syst.clear_current();
    syst.enable_interrupt();
    syst.enable_counter();
}

/// Milliseconds since the board was taken.
pub fn now_ms() -> u64 {
    ticks() * 1_000 * PRESCALE / SYSCLK_HZ
}

/// Timer ticks (25 MHz / 256) since start: the counter's decrease since the last reading, added up.
fn ticks() -> u64 {
    critical_section::with(|cs| {
        let cell = TICKS.borrow(cs);
        let (last, total) = cell.get();
        // SAFETY: the dual timer's value register, read only.
        let now = unsafe { read_volatile((DUALTIMER_BASE + TIMER1_VALUE) as *const u32) };
        let total = total + u64::from(last.wrapping_sub(now));
        cell.set((now, total));
        total
    })
}

#[exception]
fn SysTick() {
    ticks();
}
