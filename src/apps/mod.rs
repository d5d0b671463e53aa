//! The host: the apps of this node, their turns, budgets and failure boundaries, and how their outlets are fed.
//!
//! [`host::Host`] owns every app's store and runs on the receive loop's thread: each turn it applies the node
//! core's records and the inner outlets' records app by app (one transaction each, so one failing store stops only
//! its app), then feeds each link, wire and webhook outlet what it stored and pushes it once.

pub mod config;
pub mod host;
