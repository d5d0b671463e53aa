//! The link protocol, sans-IO: wire format, crypto, the allow-list, the session cache and the two state machines.
//!
//! Nothing in here reads a clock, opens a socket or touches SQLite; time comes in as `now` and bytes in and out
//! as slices. That makes every protocol behaviour testable on a simulated network (tests/sim.rs).

pub mod admission;
pub mod allow_list;
pub mod crypto;
pub mod node;
pub mod sender;
pub mod session_cache;
pub mod turn;
pub mod wire;
