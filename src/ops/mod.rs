//! Operations: what it takes to run the node as a service rather than a program on a terminal.
//!
//! This module owns the node's conversation with its supervisor and its operators, none of which is protocol:
//!
//! - [`notify`] — the systemd notify protocol (READY, RELOADING, STOPPING, STATUS, WATCHDOG), by hand;
//! - [`signals`] — SIGTERM/SIGINT (clean stop; a second one exits at once) and SIGHUP (reload), as flags the
//!   receive loop polls, because a signal handler may do almost nothing;
//! - [`metrics`] — what `/metrics` (Prometheus text) and `/healthz` say, from a snapshot the receive loop
//!   publishes; [`crate::http`] serves them on `--http-port` from its own thread, so a slow scraper never slows
//!   the loop;
//! - [`wake`] — an eventfd another thread writes to wake the receive loop out of poll(2);
//! - [`check`] — `pure-serve check`: validate the configuration without serving.
//!
//! The rule that shapes all of it: liveness is reported *by the loop that does the work*. WATCHDOG=1 and the
//! heartbeat `/healthz` reads are both written from inside the receive loop, so a stuck loop stops them; a timer
//! thread that pings regardless would tell systemd nothing.

pub mod check;
pub mod metrics;
pub mod notify;
pub mod signals;
pub mod wake;
