//! Operations: what it takes to run the node as a service rather than a program on a terminal.
//!
//! This module owns the node's conversation with its supervisor and its operators, none of which is protocol:
//!
//! - [`notify`] — the systemd notify protocol (READY, RELOADING, STOPPING, STATUS, WATCHDOG), by hand;
//! - [`signals`] — SIGTERM/SIGINT (clean stop; a second one exits at once) and SIGHUP (reload), as flags the
//!   receive loop polls, because a signal handler may do almost nothing;
//! - [`metrics`] — what `/metrics` (Prometheus text) and `/healthz` say, from a snapshot the receive loop
//!   publishes; [`crate::http`] serves them on `--metrics-listen` (and `/healthz` on `--http-port` too) from its
//!   own thread, so a slow scraper never slows the loop;
//! - [`status`] — the status page's figures (`/status.json`) and the ring of samples behind its charts;
//! - [`devices`] — the devices census: who went quiet, scanned from the stores on a thread of its own, and the
//!   page's search by name;
//! - [`check`] — `pure-serve check`: validate the configuration without serving;
//! - [`fds`] — the limit on open files: raised at start, and checked against what the configuration needs;
//! - [`journal`] — log lines with the journal's priorities when standard error is systemd's journal.
//!
//! The rule that shapes all of it: liveness is reported *by the loop that does the work*. WATCHDOG=1 and the
//! heartbeat `/healthz` reads are both written from inside the receive loop, so a stuck loop stops them; a timer
//! thread that pings regardless would tell systemd nothing.

pub mod check;
pub mod devices;
pub mod fds;
pub mod journal;
pub mod metrics;
pub mod notify;
pub mod signals;
pub mod status;

/// Why a socket could not be bound to `addr`, in words that point at the flag to change: a port in use is the
/// port's flag, an address this host does not have is the address's flag (`--bind`, or `--metrics-listen` which
/// names both), a low port is a privilege.
pub fn bind_problem(
    e: &std::io::Error,
    addr: std::net::SocketAddr,
    port_flag: &str,
    addr_flag: &str,
) -> String {
    use std::io::ErrorKind;
    match e.kind() {
        ErrorKind::AddrInUse => format!(
            "port {} is in use by another program (another node?): choose another with {port_flag}",
            addr.port()
        ),
        ErrorKind::AddrNotAvailable => format!(
            "{} is not an address of this host: give one it has with {addr_flag} (:: listens on all, IPv6 and IPv4)",
            addr.ip()
        ),
        ErrorKind::PermissionDenied if addr.port() < 1024 => format!(
            "ports below 1024 need root or CAP_NET_BIND_SERVICE: choose a higher one with {port_flag}"
        ),
        _ => e.to_string(),
    }
}
