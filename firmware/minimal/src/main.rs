//! The smallest firmware that links `pure-link` and sends a record with its outbox in flash (research/038): open
//! the outbox, start a run, open the flow, queue one record, build one datagram with `poll_transmit`, hand it to
//! [`send`]. Built for `thumbv7em-none-eabihf`, `thumbv6m-none-eabi` (cortex-m-rt) and
//! `riscv32imc-unknown-none-elf` (riscv-rt) to measure what the library costs in flash and RAM; nothing runs this
//! image (the Cortex-M4 run with the board's real flash is `firmware/qemu-m4/src/bin/minimal.rs`).
//!
//! The flash driver is a stub over a static RAM array (`FLASH_MEM`, 4 pages of 1 KiB, in `.bss`): a part's real
//! driver (a few register writes per program and erase) is not in these figures, and the array is not the
//! library's RAM. The radio is [`send`]: a volatile write of each byte, which the linker cannot drop.
//!
//! Feature `receive`: also hands one datagram from the "radio" to `handle_datagram` and calls `handle_timeout`,
//! as a device that takes acknowledgements (and so frees its outbox) must.
#![no_std]
#![no_main]

use core::panic::PanicInfo;
use core::ptr::{addr_of, addr_of_mut, read_volatile, write_volatile};

use pure_link::buf::SliceOut;
use pure_link::crypto::Identity;
use pure_link::outbox::{Flash, FlashError, Outbox};
use pure_link::sender::{Sender, SenderConfig};
use pure_link::time::Millis;
use pure_link::wire::RecordFormat;

#[cfg(target_arch = "arm")]
use cortex_m_rt::entry;
#[cfg(target_arch = "riscv32")]
use riscv_rt::entry;

const PAGE_SIZE: usize = 1024;
const PAGES: u16 = 4;
const RECORDS: usize = 64;
const DATAGRAM: usize = 1200;

/// The stub flash (zeros at reset: `Outbox::open` finds no valid page and formats it).
static mut FLASH_MEM: [u8; PAGE_SIZE * PAGES as usize] = [0; PAGE_SIZE * PAGES as usize];
/// Where the radio's bytes go, one volatile write each.
static mut SINK: u8 = 0;
/// Where the radio's bytes come from (feature `receive`) and the entropy of the run id.
static mut SOURCE: u8 = 0;
/// The device's secret key and the node's public key, "in flash": read with volatile reads so nothing is folded.
static SECRET: [u8; 32] = [0x42; 32];
static NODE: [u8; 32] = [9; 32];

struct RamFlash(&'static mut [u8; PAGE_SIZE * PAGES as usize]);

impl RamFlash {
    fn range(
        &self,
        page: u16,
        offset: usize,
        len: usize,
    ) -> Result<core::ops::Range<usize>, FlashError> {
        if page >= PAGES || offset + len > PAGE_SIZE {
            return Err(FlashError);
        }
        let start = page as usize * PAGE_SIZE + offset;
        Ok(start..start + len)
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
        let r = self.range(page, offset, buf.len())?;
        buf.copy_from_slice(&self.0[r]);
        Ok(())
    }
    fn program(&mut self, page: u16, offset: usize, data: &[u8]) -> Result<(), FlashError> {
        if offset % 8 != 0 || data.len() % 8 != 0 {
            return Err(FlashError);
        }
        let r = self.range(page, offset, data.len())?;
        for (d, s) in self.0[r].iter_mut().zip(data) {
            *d &= *s;
        }
        Ok(())
    }
    fn erase(&mut self, page: u16) -> Result<(), FlashError> {
        let r = self.range(page, 0, PAGE_SIZE)?;
        self.0[r].fill(0xFF);
        Ok(())
    }
}

/// The radio: every byte of the datagram, one volatile write each.
#[inline(never)]
fn send(datagram: &[u8]) {
    for &b in datagram {
        // SAFETY: one byte static, written by this single thread only.
        unsafe { write_volatile(addr_of_mut!(SINK), b) };
    }
}

fn source() -> u8 {
    // SAFETY: one byte static, read by this single thread only.
    unsafe { read_volatile(addr_of!(SOURCE)) }
}

fn halt(code: u8) -> ! {
    // SAFETY: as in `send`.
    unsafe { write_volatile(addr_of_mut!(SINK), code) };
    loop {
        core::hint::spin_loop();
    }
}

#[entry]
fn main() -> ! {
    // SAFETY: taken once, here; nothing else touches FLASH_MEM.
    let flash = RamFlash(unsafe { &mut *addr_of_mut!(FLASH_MEM) });
    // SAFETY: plain statics, read whole.
    let secret: [u8; 32] = unsafe { read_volatile(addr_of!(SECRET)) };
    let node: [u8; 32] = unsafe { read_volatile(addr_of!(NODE)) };

    let mut outbox = Outbox::<_, RECORDS>::open(flash).unwrap_or_else(|_| halt(1));
    let entropy = [source(); 8];
    let run_id = outbox
        .new_run(&secret, &entropy)
        .unwrap_or_else(|_| halt(2));
    let start = outbox.flow_start();
    let mut s = Sender::<Millis, Outbox<RamFlash, RECORDS>, 1, 1, 8>::new(
        SenderConfig::with_run_id(Identity::from_secret_bytes(secret), node, run_id),
    )
    .unwrap_or_else(|_| halt(3));
    s.open_flow_with("main", start, RecordFormat::Plain, outbox)
        .unwrap_or_else(|_| halt(4));
    s.queue("main", b"21.5C").unwrap_or_else(|_| halt(5));

    let mut buf = [0u8; DATAGRAM];
    let mut out = SliceOut::new(&mut buf);
    if s.poll_transmit(Millis(0), &mut out) {
        send(out.written());
    }

    #[cfg(feature = "receive")]
    {
        // One datagram from the radio (its length and bytes from SOURCE), then the timer.
        let mut rx = [0u8; 1472];
        let n = (source() as usize * 8).min(rx.len());
        for b in &mut rx[..n] {
            *b = source();
        }
        let mut sink = |e: pure_link::sender::Event<'_>| {
            if let pure_link::sender::Event::Stored { through, .. } = e {
                send(&through.to_le_bytes());
            }
        };
        s.handle_datagram(Millis(1), &mut rx[..n], &mut sink);
        s.handle_timeout(Millis(2), &mut sink);
        if s.poll_transmit(Millis(3), &mut out) {
            send(out.written());
        }
    }
    halt(0)
}

#[panic_handler]
fn panic(_: &PanicInfo) -> ! {
    halt(0xFF)
}
