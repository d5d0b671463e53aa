//! The probe: one run of everything the board offers, so that the harness (`tests/firmware_util`) and the board
//! are proven before the sender is dropped in, and the firmware's size is a realistic one.
//!
//! 1. Reads a counter from flash, adds one, writes it back (a log of 8-byte slots, safe at any power cut).
//! 2. Does one X25519 and one AES-128-GCM seal of 64 bytes, as a sender's first packet does.
//! 3. Sends datagram 1 (the seal in it) over the UART and waits, at most [`ANSWER_TIMEOUT_MS`] by the
//!    millisecond clock, for an answer equal to it (the test's echo server).
//! 4. Sends datagram 2 [`CLOCK_GAP_MS`] after datagram 1 by the clock, and waits for its echo likewise: the test
//!    checks the gap against the host's time.
//! 5. Prints what it knows on the host's console (`key: value` lines) and exits 0.
//!
//! Datagram layout: `b'P'`, kind (1, 2), counter (u32 LE), `now_ms` when sent (u64 LE), then the seal's
//! ciphertext and tag (80 bytes) and the device's public key (32), then [`SLIP_BYTES`] so that every SLIP escape
//! is crossed.
#![no_std]
#![no_main]

use aes_gcm::aead::AeadInOut;
use aes_gcm::{Aes128Gcm, KeyInit};
use cortex_m_rt::entry;
use pure_qemu_m4::board::{self, exit, now_ms, stack, Board};
use pure_qemu_m4::println;
use x25519_dalek::{PublicKey, StaticSecret};

/// How long an answer may take before the probe gives up (exit [`EXIT_NO_ANSWER`]).
const ANSWER_TIMEOUT_MS: u64 = 10_000;
/// Datagram 2 goes this long after datagram 1, by the board's clock.
const CLOCK_GAP_MS: u64 = 500;
/// Bytes SLIP must escape, and the escape codes themselves as plain bytes.
const SLIP_BYTES: [u8; 5] = [0xC0, 0xDB, 0xDC, 0xDD, 0xC0];
const DATAGRAM_LEN: usize = 1 + 1 + 4 + 8 + 64 + 16 + 32 + SLIP_BYTES.len();

const EXIT_NO_ANSWER: u32 = 2;
const EXIT_WRONG_ANSWER: u32 = 3;
const EXIT_FLASH: u32 = 4;
const EXIT_BOARD: u32 = 5;

#[entry]
fn main() -> ! {
    let mut board = Board::take().unwrap_or_else(|e| {
        println!("error: board: {:?}", e);
        exit(EXIT_BOARD)
    });

    let count = counter::read(&mut board.flash)
        .and_then(|n| counter::write(&mut board.flash, n + 1).map(|()| n + 1))
        .unwrap_or_else(|e| {
            println!("error: flash: {:?}", e);
            exit(EXIT_FLASH)
        });
    println!("counter: {}", count);

    let (sealed, public) = seal(count);
    let mut datagram = [0u8; DATAGRAM_LEN];
    let mut answer = [0u8; 1500];

    let first = now_ms();
    fill(&mut datagram, 1, count, first, &sealed, &public);
    board.uart.send(&datagram);
    let took = expect_echo(&mut board, &datagram, &mut answer);
    println!("echo 1: {} ms", took);

    let second = loop {
        let now = now_ms();
        if now >= first + CLOCK_GAP_MS {
            break now;
        }
    };
    fill(&mut datagram, 2, count, second, &sealed, &public);
    board.uart.send(&datagram);
    let took = expect_echo(&mut board, &datagram, &mut answer);
    println!("echo 2: {} ms", took);
    println!("clock gap: {} ms", second - first);

    for page in 0..2 {
        if let Ok((erases, programs)) = board.flash.counts(page) {
            println!(
                "flash page {}: {} erases, {} units programmed",
                page, erases, programs
            );
        }
    }
    println!("uart dropped: {}", board.uart.dropped());
    println!("run: {} ms", now_ms());
    println!("stack peak: {} of {} bytes", stack::peak(), stack::size());
    exit(0)
}

/// Waits for the next datagram and checks it equals `sent`; returns how long it took. Exits on a timeout or a
/// different answer.
fn expect_echo(board: &mut Board, sent: &[u8], buf: &mut [u8]) -> u64 {
    let start = now_ms();
    loop {
        if let Some(n) = board.uart.recv(buf) {
            if &buf[..n] != sent {
                println!(
                    "error: answer of {} bytes differs from the datagram sent",
                    n
                );
                exit(EXIT_WRONG_ANSWER);
            }
            return now_ms() - start;
        }
        if now_ms() - start > ANSWER_TIMEOUT_MS {
            println!("error: no answer in {} ms", ANSWER_TIMEOUT_MS);
            exit(EXIT_NO_ANSWER);
        }
    }
}

/// One X25519 with a node key and one AES-128-GCM seal of 64 bytes under (part of) the shared secret: the public
/// key work and the AEAD a sender's first packet costs. Returns ciphertext‖tag and the device's public key.
fn seal(count: u32) -> ([u8; 80], [u8; 32]) {
    let mut device_secret = [0x42u8; 32];
    device_secret[..4].copy_from_slice(&count.to_le_bytes());
    let device = StaticSecret::from(device_secret);
    let node = PublicKey::from(&StaticSecret::from([0x07u8; 32]));
    let shared = device.diffie_hellman(&node);
    let mut key = [0u8; 16];
    key.copy_from_slice(&shared.as_bytes()[..16]);

    let mut out = [0u8; 80];
    let (body, tag_out) = out.split_at_mut(64);
    for (i, b) in body.iter_mut().enumerate() {
        *b = i as u8;
    }
    let mut nonce = [0u8; 12];
    nonce[..4].copy_from_slice(&count.to_be_bytes());
    let tag = Aes128Gcm::new(&key.into())
        .encrypt_inout_detached(&nonce.into(), b"probe", body.into())
        .unwrap_or_else(|_| exit(board::host::EXIT_PANIC));
    tag_out.copy_from_slice(tag.as_slice());
    (out, PublicKey::from(&device).to_bytes())
}

fn fill(
    d: &mut [u8; DATAGRAM_LEN],
    kind: u8,
    count: u32,
    now: u64,
    sealed: &[u8; 80],
    public: &[u8; 32],
) {
    d[0] = b'P';
    d[1] = kind;
    d[2..6].copy_from_slice(&count.to_le_bytes());
    d[6..14].copy_from_slice(&now.to_le_bytes());
    d[14..94].copy_from_slice(sealed);
    d[94..126].copy_from_slice(public);
    d[126..].copy_from_slice(&SLIP_BYTES);
}

/// A counter in flash that no power cut can take back or tear: pages 0 and 1, each a log of 8-byte slots
/// `(n, !n)` as u32 LE, the counter the largest valid `n` in either. An increment programs the next erased slot of
/// the page holding it; when that page is full, the other page is erased, gets the counter in its first slot, and
/// then the full page is erased. A slot torn by a cut is neither erased nor valid, and is skipped.
mod counter {
    use pure_qemu_m4::board::flash::{Flash, FlashError, PAGE_SIZE, UNIT};

    const SLOTS: usize = PAGE_SIZE / UNIT;

    /// The counter's value and where it is: (value, page, first erased slot after the last used one).
    fn find(flash: &mut Flash) -> Result<(u32, usize, usize), FlashError> {
        let mut best = (0u32, 0usize, 0usize);
        let mut chunk = [0u8; 256];
        for page in 0..2 {
            let mut next = 0;
            let mut max = None;
            for start in (0..PAGE_SIZE).step_by(chunk.len()) {
                flash.read(page, start, &mut chunk)?;
                for (i, slot) in chunk.chunks_exact(UNIT).enumerate() {
                    if slot != [0xFF; UNIT] {
                        next = start / UNIT + i + 1;
                    }
                    let n = u32::from_le_bytes([slot[0], slot[1], slot[2], slot[3]]);
                    let check = u32::from_le_bytes([slot[4], slot[5], slot[6], slot[7]]);
                    if check == !n && max.is_none_or(|m| n > m) {
                        max = Some(n);
                    }
                }
            }
            if let Some(n) = max {
                if n >= best.0 {
                    best = (n, page, next);
                }
            }
        }
        Ok(best)
    }

    pub fn read(flash: &mut Flash) -> Result<u32, FlashError> {
        find(flash).map(|(n, _, _)| n)
    }

    pub fn write(flash: &mut Flash, n: u32) -> Result<(), FlashError> {
        let (_, page, next) = find(flash)?;
        let mut slot = [0u8; UNIT];
        slot[..4].copy_from_slice(&n.to_le_bytes());
        slot[4..].copy_from_slice(&(!n).to_le_bytes());
        if next < SLOTS {
            return flash.program(page, next * UNIT, &slot);
        }
        let other = 1 - page;
        flash.erase(other)?;
        flash.program(other, 0, &slot)?;
        flash.erase(page)
    }
}
