//! The floor: types that several rooms of the node share, so that no room imports from a room above it.
//!
//! The receive loop, the app host, the stores, the outlets, the sending loop and the HTTP server each own their
//! room; what two or more of them pass between each other lives here, with nothing of any of them: where an
//! outlet sends ([`address`]), name lookups on the sending loop ([`dns`], used by every outlet that connects),
//! the figures the receive loop publishes for the metrics, health and status pages ([`figures`]), a push of
//! downlink records from the HTTP thread to the app host and its answer ([`push`]), a file pushed as pieces
//! ([`blob`]), and the
//! eventfd a producer on another thread wakes a sleeping loop with ([`wake`]). Below this floor are only `proto`
//! (the sans-IO core) and the standard library's and crates' types.

pub mod address;
pub mod blob;
pub mod dns;
pub mod figures;
pub mod listen;
pub mod push;
pub mod wake;
