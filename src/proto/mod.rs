//! The link protocol, sans-IO: the node's side of it (the allow-list, admission, the session cache, the node's
//! state machine, turns) here, and what both ends share — wire format, crypto, the sender's state machine — in
//! the `pure-link` crate (link/), re-exported as `wire`, `crypto` and, with the node's choices, `sender`.
//!
//! Nothing in here reads a clock, opens a socket or touches SQLite; time comes in as `now` and bytes in and out
//! as slices. That makes every protocol behaviour testable on a simulated network (tests/sim.rs).

pub mod admission;
pub mod allow_list;
pub mod node;
pub mod sender;
pub mod session_cache;
pub mod turn;
pub mod wide;

pub use pure_link::{crypto, wire};
