//! The host: the apps one node runs, their turns and budgets, and the outlets that forward what they store.
//!
//! An **app** (BRIEF.md, words) is a named unit with its own store (`STATE/apps/NAME.sqlite`), the senders it
//! accepts and its outlets; a **turn** takes a bounded batch of its input, stores it in one transaction, commits,
//! acks, then pushes each outlet once; an **outlet** (link, wire, webhook or inner) forwards every record the app
//! stores, in order, exactly once end to end.
//!
//! - [`config`]: the `--apps FILE` format, its parser and validation, and what a reload of it may change;
//! - [`host`]: [`host::Host`] owns every app's store and runs on the receive loop's thread: each turn it applies the
//!   node core's records and the inner outlets' records app by app (one transaction each, so one failing store
//!   stops only its app), then feeds each link, wire and webhook outlet what it stored and pushes it once.

pub mod config;
pub mod host;
