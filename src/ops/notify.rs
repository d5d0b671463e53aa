//! The systemd notify protocol (sd_notify(3)), written by hand: one datagram of `KEY=VALUE` lines to the Unix
//! socket named by `$NOTIFY_SOCKET`.
//!
//! Why by hand: the protocol is a single `sendto` of text, and doing it ourselves keeps the dependency tree small on
//! the Raspberry Pi and lets tests point `$NOTIFY_SOCKET` at a socket they read. Both address forms systemd uses
//! are supported: a filesystem path (`/run/systemd/notify`) and an abstract socket (`@name`, where the `@` stands
//! for the leading NUL byte).
//!
//! Without `$NOTIFY_SOCKET` (a terminal, a test, another supervisor) there is no [`Notifier`] and nothing is sent.
//! A failed send is logged at debug level and otherwise ignored: the node must serve whether or not anyone listens.
//!
//! The watchdog interval comes from `$WATCHDOG_USEC` (and `$WATCHDOG_PID`, which, when set, must be our pid: the
//! variable may have been inherited by a child it was not meant for). The node pings at half the interval, as
//! sd_watchdog_enabled(3) advises, and only from its receive loop (see [`crate::ops`]).

use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::{Duration, Instant};

use thiserror::Error;

#[derive(Debug, Error)]
pub enum NotifyError {
    #[error(
        "NOTIFY_SOCKET={0:?} is neither an absolute path nor an abstract socket name starting with '@'"
    )]
    BadAddress(String),
    #[error("NOTIFY_SOCKET {addr:?}: {source}")]
    Socket {
        addr: String,
        source: std::io::Error,
    },
}

/// Where notifications go, parsed from the text of `$NOTIFY_SOCKET`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotifyTarget {
    /// A socket in the filesystem.
    Path(std::path::PathBuf),
    /// A Linux abstract socket; the name without its leading NUL (`@` in the variable).
    Abstract(Vec<u8>),
}

impl NotifyTarget {
    /// Parses the value of `$NOTIFY_SOCKET`. systemd only ever sets an absolute path or `@name`.
    pub fn parse(value: &str) -> Result<Self, NotifyError> {
        if let Some(name) = value.strip_prefix('@') {
            if name.is_empty() {
                return Err(NotifyError::BadAddress(value.to_string()));
            }
            Ok(NotifyTarget::Abstract(name.as_bytes().to_vec()))
        } else if value.starts_with('/') {
            Ok(NotifyTarget::Path(value.into()))
        } else {
            Err(NotifyError::BadAddress(value.to_string()))
        }
    }

    fn socket_addr(&self) -> std::io::Result<SocketAddr> {
        match self {
            NotifyTarget::Path(p) => SocketAddr::from_pathname(p),
            NotifyTarget::Abstract(name) => {
                use std::os::linux::net::SocketAddrExt;
                SocketAddr::from_abstract_name(name)
            }
        }
    }
}

/// The watchdog interval systemd asked for, if it asked this process. `usec` and `pid` are the texts of
/// `$WATCHDOG_USEC` and `$WATCHDOG_PID`.
pub fn watchdog_interval(usec: Option<&str>, pid: Option<&str>, my_pid: u32) -> Option<Duration> {
    if let Some(pid) = pid
        && pid.trim().parse::<u32>().ok() != Some(my_pid)
    {
        return None;
    }
    let usec: u64 = usec?.trim().parse().ok()?;
    (usec > 0).then(|| Duration::from_micros(usec))
}

/// A connection to the supervisor's notify socket.
#[derive(Debug)]
pub struct Notifier {
    socket: UnixDatagram,
    addr: SocketAddr,
    label: String,
    watchdog: Option<Duration>,
}

impl Notifier {
    /// The notifier systemd asked for through the environment, or `None` when `$NOTIFY_SOCKET` is unset.
    pub fn from_env() -> Result<Option<Self>, NotifyError> {
        let Some(value) = std::env::var_os("NOTIFY_SOCKET") else {
            return Ok(None);
        };
        let value = value.to_string_lossy().to_string();
        let target = NotifyTarget::parse(&value)?;
        let watchdog = watchdog_interval(
            std::env::var("WATCHDOG_USEC").ok().as_deref(),
            std::env::var("WATCHDOG_PID").ok().as_deref(),
            std::process::id(),
        );
        Self::connect(&target, &value, watchdog).map(Some)
    }

    /// A notifier for `target`; `label` names it in messages.
    pub fn connect(
        target: &NotifyTarget,
        label: &str,
        watchdog: Option<Duration>,
    ) -> Result<Self, NotifyError> {
        let err = |source| NotifyError::Socket {
            addr: label.to_string(),
            source,
        };
        let addr = target.socket_addr().map_err(err)?;
        let socket = UnixDatagram::unbound().map_err(err)?;
        // A notification must never stall the loop that sends it; a full socket buffer loses one line instead.
        socket.set_nonblocking(true).map_err(err)?;
        Ok(Notifier {
            socket,
            addr,
            label: label.to_string(),
            watchdog,
        })
    }

    /// The watchdog interval systemd expects pings within (`WatchdogSec=`), if any.
    pub fn watchdog(&self) -> Option<Duration> {
        self.watchdog
    }

    /// Sends one notification: newline-separated `KEY=VALUE` assignments.
    pub fn notify(&self, state: &str) {
        if let Err(e) = self.socket.send_to_addr(state.as_bytes(), &self.addr) {
            tracing::debug!("notify {:?} to {} not sent: {e}", state, self.label);
        }
    }

    pub fn ready(&self, status: &str) {
        self.notify(&format!("READY=1\nSTATUS={}", one_line(status)));
    }

    /// RELOADING=1 with the monotonic timestamp systemd 253+ requires to match the reload to its request.
    pub fn reloading(&self, status: &str) {
        self.notify(&format!(
            "RELOADING=1\nMONOTONIC_USEC={}\nSTATUS={}",
            monotonic_usec(),
            one_line(status)
        ));
    }

    pub fn stopping(&self, status: &str) {
        self.notify(&format!("STOPPING=1\nSTATUS={}", one_line(status)));
    }

    pub fn status(&self, status: &str) {
        self.notify(&format!("STATUS={}", one_line(status)));
    }

    pub fn watchdog_ping(&self) {
        self.notify("WATCHDOG=1");
    }
}

/// A STATUS value is one line; a newline would start a new (bogus) assignment.
fn one_line(s: &str) -> String {
    s.replace(['\n', '\r'], " ")
}

/// CLOCK_MONOTONIC in microseconds: the clock systemd compares MONOTONIC_USEC against.
fn monotonic_usec() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux.
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts);
    }
    ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1_000
}

/// When the next WATCHDOG=1 is due: every half interval, checked by the loop each round (sans clock: the loop
/// passes `now`).
#[derive(Debug, Clone)]
pub struct WatchdogTimer {
    every: Duration,
    next: Instant,
}

impl WatchdogTimer {
    /// Pings every half of `interval`; the first is due at once.
    pub fn new(interval: Duration, now: Instant) -> Self {
        WatchdogTimer {
            every: interval / 2,
            next: now,
        }
    }

    /// Whether a ping is due at `now`; if so, schedules the next one.
    pub fn due(&mut self, now: Instant) -> bool {
        if now < self.next {
            return false;
        }
        self.next = now + self.every;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse() {
        assert_eq!(
            NotifyTarget::parse("/run/systemd/notify").unwrap(),
            NotifyTarget::Path("/run/systemd/notify".into())
        );
        assert_eq!(
            NotifyTarget::parse("@sd-notify-1").unwrap(),
            NotifyTarget::Abstract(b"sd-notify-1".to_vec())
        );
        assert!(NotifyTarget::parse("relative").is_err());
        assert!(NotifyTarget::parse("@").is_err());
        assert!(NotifyTarget::parse("").is_err());
    }

    #[test]
    fn watchdog_only_for_this_pid() {
        let d = Duration::from_secs(20);
        assert_eq!(watchdog_interval(Some("20000000"), None, 7), Some(d));
        assert_eq!(watchdog_interval(Some("20000000"), Some("7"), 7), Some(d));
        assert_eq!(watchdog_interval(Some("20000000"), Some("8"), 7), None);
        assert_eq!(watchdog_interval(Some("0"), None, 7), None);
        assert_eq!(watchdog_interval(Some("x"), None, 7), None);
        assert_eq!(watchdog_interval(None, None, 7), None);
    }

    #[test]
    fn watchdog_timer_pings_every_half_interval() {
        let t0 = Instant::now();
        let mut w = WatchdogTimer::new(Duration::from_secs(10), t0);
        assert!(w.due(t0));
        assert!(!w.due(t0 + Duration::from_secs(4)));
        assert!(w.due(t0 + Duration::from_secs(5)));
        assert!(!w.due(t0 + Duration::from_secs(9)));
        assert!(w.due(t0 + Duration::from_secs(10)));
    }

    #[test]
    fn sends_to_path_and_abstract_sockets() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let listener = UnixDatagram::bind(&path).unwrap();
        let n = Notifier::connect(&NotifyTarget::Path(path.clone()), "test", None).unwrap();
        n.ready("serving");
        let mut buf = [0u8; 256];
        let len = listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"READY=1\nSTATUS=serving");

        use std::os::linux::net::SocketAddrExt;
        let name = format!("pure-serve-test-{}", std::process::id());
        let abs = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let listener = UnixDatagram::bind_addr(&abs).unwrap();
        let n = Notifier::connect(
            &NotifyTarget::parse(&format!("@{name}")).unwrap(),
            "test",
            None,
        )
        .unwrap();
        n.status("two\nlines");
        let len = listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"STATUS=two lines");
    }
}
