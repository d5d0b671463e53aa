//! Datagrams over UART0: the board's CMSDK APB UART at 0x40004000 (QEMU's first serial port, `-serial`), polled,
//! each datagram one SLIP frame (RFC 1055) in both directions.
//!
//! A frame is `END, escaped bytes, END`: END (0xC0) in the datagram goes as ESC ESC_END (0xDB 0xDC), ESC (0xDB)
//! as ESC ESC_ESC (0xDB 0xDD). The leading END ends whatever noise came before. Empty frames (two ENDs in a row)
//! are not datagrams and are skipped; a frame longer than the caller's buffer, or with ESC followed by anything
//! but ESC_END or ESC_ESC (END included), is dropped whole (counted in [`Uart::dropped`]).
//!
//! The UART holds one byte each way (QEMU's model as the hardware): [`Uart::send`] waits for the transmit
//! register before each byte; [`Uart::recv`] takes what has arrived and returns at once. Under QEMU a byte the
//! firmware has not read yet waits in the host's socket (QEMU takes no more until RXFULL clears); on a part, a
//! firmware that does not poll often enough loses bytes, and so whole frames, which the link's retransmission
//! covers as it covers a lost datagram.

use core::ptr::{read_volatile, write_volatile};

/// UART0's registers (CMSDK APB UART, ARM DDI0479C 4.3): QEMU `hw/arm/mps2.c` puts UART0 at 0x40004000.
pub const UART0_BASE: usize = 0x4000_4000;
const DATA: usize = 0x00;
const STATE: usize = 0x04;
const CTRL: usize = 0x08;
const BAUDDIV: usize = 0x10;
/// STATE: a byte waits in the transmit register.
const STATE_TX_FULL: u32 = 1 << 0;
/// STATE: a received byte waits in DATA.
const STATE_RX_FULL: u32 = 1 << 1;
/// STATE: a byte came while one was waiting (lost); write 1 to clear.
const STATE_RX_OVERRUN: u32 = 1 << 3;
const CTRL_TX_EN: u32 = 1 << 0;
const CTRL_RX_EN: u32 = 1 << 1;
/// The smallest divisor the UART allows: 25 MHz / 16, about 1.5 Mbit/s (QEMU does not pace a socket by it).
const BAUD_DIVISOR: u32 = 16;

pub const END: u8 = 0xC0;
pub const ESC: u8 = 0xDB;
pub const ESC_END: u8 = 0xDC;
pub const ESC_ESC: u8 = 0xDD;

/// UART0 and the state of the frame being received.
pub struct Uart {
    /// Bytes of the current frame already put in the caller's buffer.
    len: usize,
    /// The last byte was ESC.
    escaped: bool,
    /// The current frame is being dropped (too long or a bad escape) until its END.
    dropping: bool,
    dropped: u32,
}

fn reg(offset: usize) -> *mut u32 {
    (UART0_BASE + offset) as *mut u32
}

impl Uart {
    /// Sets the divisor and enables transmit and receive (no interrupts: the UART is polled).
    pub(super) fn new() -> Uart {
        // SAFETY: UART0's registers, owned by this one value (made once, by Board::take).
        unsafe {
            write_volatile(reg(BAUDDIV), BAUD_DIVISOR);
            write_volatile(reg(CTRL), CTRL_TX_EN | CTRL_RX_EN);
        }
        Uart {
            len: 0,
            escaped: false,
            dropping: false,
            dropped: 0,
        }
    }

    /// Sends one datagram as one SLIP frame; returns when its last byte is in the transmit register.
    pub fn send(&mut self, datagram: &[u8]) {
        self.put(END);
        for &b in datagram {
            match b {
                END => {
                    self.put(ESC);
                    self.put(ESC_END);
                }
                ESC => {
                    self.put(ESC);
                    self.put(ESC_ESC);
                }
                b => self.put(b),
            }
        }
        self.put(END);
    }

    /// Takes the bytes that have arrived; when they end a frame, returns its datagram's length (the datagram is
    /// `buf[..n]`). Never waits.
    ///
    /// A frame that has begun is kept in `buf` between calls: pass the same buffer until this returns `Some`.
    pub fn recv(&mut self, buf: &mut [u8]) -> Option<usize> {
        while let Some(b) = self.get() {
            if let Some(n) = self.take(b, buf) {
                return Some(n);
            }
        }
        None
    }

    /// Frames dropped since start: longer than the buffer, a bad escape, or bytes lost in the UART.
    pub fn dropped(&self) -> u32 {
        self.dropped
    }

    /// One received byte through the SLIP decoder.
    fn take(&mut self, b: u8, buf: &mut [u8]) -> Option<usize> {
        if b == END {
            // ESC then END: the escaped byte never came, the frame is bad.
            if self.escaped && !self.dropping {
                self.dropped += 1;
            }
            let good = !self.dropping && !self.escaped && self.len > 0;
            let len = self.len;
            self.len = 0;
            self.escaped = false;
            self.dropping = false;
            return good.then_some(len);
        }
        if self.dropping {
            return None;
        }
        let byte = if self.escaped {
            self.escaped = false;
            match b {
                ESC_END => END,
                ESC_ESC => ESC,
                _ => return self.drop_frame(),
            }
        } else if b == ESC {
            self.escaped = true;
            return None;
        } else {
            b
        };
        match buf.get_mut(self.len) {
            Some(slot) => {
                *slot = byte;
                self.len += 1;
                None
            }
            None => self.drop_frame(),
        }
    }

    fn drop_frame(&mut self) -> Option<usize> {
        self.dropping = true;
        self.dropped += 1;
        None
    }

    fn put(&mut self, b: u8) {
        // SAFETY: UART0's registers, owned by self.
        unsafe {
            while read_volatile(reg(STATE)) & STATE_TX_FULL != 0 {}
            write_volatile(reg(DATA), b as u32);
        }
    }

    fn get(&mut self) -> Option<u8> {
        // SAFETY: UART0's registers, owned by self.
        unsafe {
            let state = read_volatile(reg(STATE));
            if state & STATE_RX_OVERRUN != 0 {
                write_volatile(reg(STATE), STATE_RX_OVERRUN);
                if !self.dropping {
                    self.drop_frame();
                }
            }
            (state & STATE_RX_FULL != 0).then(|| read_volatile(reg(DATA)) as u8)
        }
    }
}
