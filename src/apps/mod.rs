//! The host: the apps one node runs, their turns and budgets, and the outlets that forward what they store.
//!
//! An **app** (BRIEF.md, words) is a named unit with its own store (`STATE/apps/NAME.sqlite`), the senders it
//! accepts and its outlets; a **turn** takes a bounded batch of its input, stores it in one transaction, commits,
//! acks, then pushes each outlet once; an **outlet** (link, wire, webhook or inner) forwards every record the app
//! stores, in order, exactly once end to end. This module is where that host lives.
//!
//! So far it has [`config`]: the `--apps FILE` format, its parser and validation, and what a reload of it may
//! change. The host itself (turns, fairness, budgets, failure boundaries) comes beside it.

pub mod config;
