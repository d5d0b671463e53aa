//! The pure-serve link protocol, sans-IO and without the standard library (docs/protocol.md).
//!
//! This crate owns what both ends of a link must agree on and what a device needs to speak it: the byte layout
//! of packets and frames ([`wire`]), key agreement, derivation and sealing ([`crypto`]), and the sender's state
//! machine ([`sender`]), which the node's outlets, `UdpLink`, `pure-serve send` and a microcontroller's firmware
//! all run — one implementation of the sender.
//!
//! It builds with `#![no_std]` and without a heap: a device gives it its buffers (a datagram buffer, a record
//! queue of a fixed size), its capacities (flows, listens, sent packets remembered for round-trip samples, as
//! const parameters), the time as milliseconds ([`time::Millis`]) and its randomness (a run id, a secret key).
//! The `alloc` feature adds the growable forms the node uses; `std` adds `std::time::Instant` as a time and the
//! operating system's random generator. The crate depends on nothing that could open a socket, read a clock or
//! touch a database, so the sans-IO rule is held by the compiler, not by review.

#![no_std]
#![forbid(unsafe_code)]

#[cfg(feature = "alloc")]
extern crate alloc;
#[cfg(feature = "std")]
extern crate std;

pub mod buf;
pub mod crypto;
pub mod outbox;
pub mod queue;
pub mod sender;
pub mod time;
pub mod wire;
