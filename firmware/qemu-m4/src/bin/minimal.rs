//! The minimal firmware of research/038 (`firmware/minimal/src/main.rs`'s `main`) on the emulated board, to measure
//! its stack: open the outbox over the board's flash (pages 8–15 of the host file, through semihosting), start a
//! run, open flow `main`, queue one record, build one datagram with `poll_transmit`, send it on the UART. Then it
//! prints the stack peak (painted by cortex-m-rt's `paint-stack`) and the sizes of what `main` holds, and exits 0.
//!
//! Run: `qemu-system-arm -M mps2-an386 -nographic -monitor none -serial null -semihosting-config
//! enable=on,target=native,arg=minimal,arg=FLASH-PATH -kernel target/thumbv7em-none-eabihf/release/minimal`.
//! The peak is read before anything is printed, so `core::fmt`'s frames are not in it; `Board::take`'s (its
//! 512-byte command-line buffer) are.
#![no_std]
#![no_main]

use core::cell::RefCell;
use core::mem::size_of;

use cortex_m_rt::entry;
use pure_link::buf::SliceOut;
use pure_link::crypto::Identity;
use pure_link::outbox::{Flash, FlashError, Outbox};
use pure_link::sender::{Sender, SenderConfig};
use pure_link::time::Millis;
use pure_link::wire::RecordFormat;
use pure_qemu_m4::board::{self, exit, stack, Board};
use pure_qemu_m4::println;

const RECORDS: usize = 64;
const DATAGRAM: usize = 1200;
/// The outbox's pages in the board's flash: 8–15 (0–7 are the probe's and the sender's).
const FIRST_PAGE: usize = 8;
const PAGES: u16 = 8;

/// The board's flash as the outbox's `Flash` (its reads take `&mut`, hence the cell).
struct BoardFlash(RefCell<board::flash::Flash>);

impl Flash for BoardFlash {
    fn page_size(&self) -> usize {
        board::flash::PAGE_SIZE
    }
    fn pages(&self) -> u16 {
        PAGES
    }
    fn read(&self, page: u16, offset: usize, buf: &mut [u8]) -> Result<(), FlashError> {
        self.0
            .borrow_mut()
            .read(FIRST_PAGE + page as usize, offset, buf)
            .map_err(|_| FlashError)
    }
    fn program(&mut self, page: u16, offset: usize, data: &[u8]) -> Result<(), FlashError> {
        self.0
            .get_mut()
            .program(FIRST_PAGE + page as usize, offset, data)
            .map_err(|_| FlashError)
    }
    fn erase(&mut self, page: u16) -> Result<(), FlashError> {
        self.0
            .get_mut()
            .erase(FIRST_PAGE + page as usize)
            .map_err(|_| FlashError)
    }
}

type DeviceSender = Sender<Millis, Outbox<BoardFlash, RECORDS>, 1, 1, 8>;

#[entry]
fn main() -> ! {
    let Board { mut uart, flash } = Board::take().unwrap_or_else(|_| exit(5));
    let secret = [0x42u8; 32];
    let node = *Identity::from_secret_bytes([7u8; 32]).public();

    let mut outbox =
        Outbox::<_, RECORDS>::open(BoardFlash(RefCell::new(flash))).unwrap_or_else(|_| exit(4));
    let run_id = outbox
        .new_run(&secret, &[0u8; 8])
        .unwrap_or_else(|_| exit(4));
    let first = outbox.first_seq();
    let start = outbox.flow_start();
    let mut s = DeviceSender::new(SenderConfig::with_run_id(
        Identity::from_secret_bytes(secret),
        node,
        run_id,
    ))
    .unwrap_or_else(|_| exit(3));
    s.open_flow_with("main", start, RecordFormat::Plain, outbox)
        .unwrap_or_else(|_| exit(3));
    s.queue("main", b"21.5C").unwrap_or_else(|_| exit(4));
    let mut buf = [0u8; DATAGRAM];
    let mut out = SliceOut::new(&mut buf);
    let sent = if s.poll_transmit(Millis(0), &mut out) {
        uart.send(out.written());
        out.written().len()
    } else {
        0
    };
    let peak = stack::peak();

    println!("first seq: {}", first);
    println!("datagram: {} bytes", sent);
    println!("sender state: {} bytes", size_of::<DeviceSender>());
    println!(
        "outbox state: {} bytes",
        size_of::<Outbox<BoardFlash, RECORDS>>()
    );
    println!("stack peak: {} of {} bytes", peak, stack::size());
    exit(if sent > 0 { 0 } else { 2 })
}
