//! The board: what a firmware gets from [`Board::take`], once, at the start of `main`.
//!
//! Each part owns one thing of the emulated machine: [`uart`] the CMSDK APB UART0 and the SLIP framing of
//! datagrams on it, [`clock`] SysTick and the millisecond count, [`flash`] the flash pages in a host file,
//! [`stack`] the painted stack, [`host`] the semihosting calls (console, files, command line, exit). Nothing here
//! knows the link's protocol: the sender's firmware is built on top.

pub mod clock;
pub mod flash;
pub mod host;
pub mod stack;
pub mod uart;

pub use clock::now_ms;
pub use host::exit;

/// The parts a firmware owns: the UART (datagrams) and the flash. Time ([`now_ms`]), printing ([`crate::println`])
/// and [`exit`] are free functions: they hold no state a caller could misuse.
pub struct Board {
    pub uart: uart::Uart,
    pub flash: flash::Flash,
}

/// Why the board could not be brought up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BoardError {
    /// `take` was called twice (the core peripherals are gone).
    Taken,
    /// The host gave no flash path: the command line (semihosting `arg=`s) is `NAME FLASH-PATH` or
    /// `NAME WORD... -- FLASH-PATH`.
    NoFlashPath,
    /// The flash file could not be opened or brought to its size.
    Flash(flash::FlashError),
}

impl Board {
    /// Starts the millisecond clock, enables UART0 and opens the flash file named by the command line's second
    /// word onwards (`-semihosting-config ...,arg=probe,arg=/path/to/flash.bin`), or by what follows its ` -- `
    /// (`...,arg=sender,arg=key=...,arg=--,arg=/path/to/flash.bin`: the firmware's own words before it).
    pub fn take() -> Result<Board, BoardError> {
        let p = cortex_m::Peripherals::take().ok_or(BoardError::Taken)?;
        clock::start(p.SYST);
        let uart = uart::Uart::new();
        let mut line = [0u8; 512];
        let path = host::flash_path(&mut line).ok_or(BoardError::NoFlashPath)?;
        let flash = flash::Flash::open(path).map_err(BoardError::Flash)?;
        Ok(Board { uart, flash })
    }
}

/// Prints a line on the host's console (QEMU's stdout; never the UART).
#[macro_export]
macro_rules! println {
    ($($arg:tt)*) => { ::cortex_m_semihosting::hprintln!($($arg)*) };
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo) -> ! {
    cortex_m_semihosting::hprintln!("panic: {}", info);
    exit(host::EXIT_PANIC)
}
