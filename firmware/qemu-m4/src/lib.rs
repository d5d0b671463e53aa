//! The emulated board a `pure-link` sender firmware runs on: QEMU's `mps2-an386` (a Cortex-M4 on ARM's MPS2 FPGA
//! board), as `qemu-system-arm -M mps2-an386` gives it, with the host reached through semihosting.
//!
//! [`board`] is all a firmware uses: datagrams over UART0 ([`board::uart`]), a millisecond clock
//! ([`board::clock`]), flash that survives power cuts kept in a host file ([`board::flash`]), the stack's peak
//! ([`board::stack`]), printing and exiting through the host ([`board::host`]). The probe (`src/bin/probe.rs`)
//! uses every part once; README.md has the addresses, the flash file's format and the measured sizes.
#![no_std]

pub mod board;
pub mod outbox;
