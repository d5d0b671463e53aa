//! File descriptors: what a configuration needs, against what the process may open (`RLIMIT_NOFILE`).
//!
//! What this module owns: raising the node's soft limit to its hard one at start, as most daemons do (the usual
//! soft limit of 1024 is kept for programs that use `select(2)`; the node uses only poll and epoll), the estimate
//! of the descriptors a configuration needs ([`Need`]), and the one message when the limit is below it — for the
//! node at start and on a reload that adds apps, and for `check`.
//!
//! Why: past the limit every open fails with EMFILE, and SQLite reports that per store as "unable to open database
//! file". 500 apps under 1024 descriptors gave one misleading ERROR per app and an exit, while `check` said the
//! configuration was fine (issue 14, item 3). The estimate is an upper bound of what the node opens (a test
//! measures a running node against it), so a node that starts has room for every store, outlet and connection.

use std::io;

use thiserror::Error;

use crate::apps::config::{AppsConfig, OutletKind};
use crate::store::FDS_PER_STORE;

/// The node's own descriptors, whatever its apps: standard streams (3), the state lock (1), the memo's connection
/// and its kept `-shm` (4), the UDP socket and the two HTTP listeners (3), the epolls and eventfds of the receive loop,
/// the HTTP thread, the sync thread, the signal wake and the sending loop (about 12). A running node with its
/// sending loop holds 20–24 besides its stores; the rest is room for libraries (the resolver's sockets).
pub const FDS_BASE: u64 = 32;
/// An outlet that leaves the host (link, wire, webhook): its socket, and a name lookup's while one runs. An inner
/// outlet (`kind = "app"`) opens nothing.
pub const FDS_PER_OUTLET: u64 = 2;
/// Opened for a moment: a reload's senders file and the index written and mapped beside it, the apps file and
/// its CA files, the reader that fills the memo's key filter at start.
pub const FDS_PASSING: u64 = 16;

/// The process's limit on open files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub soft: u64,
    pub hard: u64,
}

/// The limits as they are now.
pub fn limits() -> io::Result<Limits> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(Limits {
        soft: r.rlim_cur,
        hard: r.rlim_max,
    })
}

/// Raises the soft limit to the hard one; returns the limits before and after. Nothing is asked when they are
/// equal already (the systemd unit's `LimitNOFILE=` sets both).
pub fn raise_soft_limit() -> io::Result<(Limits, Limits)> {
    let before = limits()?;
    if before.soft >= before.hard {
        return Ok((before, before));
    }
    let r = libc::rlimit {
        rlim_cur: before.hard,
        rlim_max: before.hard,
    };
    // SAFETY: setrlimit reads one rlimit from the struct it is given.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &r) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((before, limits()?))
}

/// The descriptors a configuration needs, by what needs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Need {
    /// Apps, each with its store ([`FDS_PER_STORE`]).
    pub apps: u64,
    /// Outlets that leave the host ([`FDS_PER_OUTLET`]).
    pub outlets: u64,
    /// HTTP connections at once: each listener's bound (`--http-port`'s and `--metrics-listen`'s), and the one more
    /// each accepts to tell it 503.
    pub http: u64,
}

impl Need {
    pub fn of(apps: &AppsConfig) -> Self {
        let outlets = apps
            .apps
            .iter()
            .flat_map(|a| &a.outlets)
            .filter(|o| !matches!(o.kind, OutletKind::App { .. }))
            .count();
        Need {
            apps: apps.apps.len() as u64,
            outlets: outlets as u64,
            http: {
                let l = crate::http::HttpLimits::default();
                (l.connections.total + 1 + l.metrics_connections.total + 1) as u64
            },
        }
    }

    /// What the node needs besides its apps, outlets and connections.
    pub fn own(&self) -> u64 {
        FDS_BASE + FDS_PASSING
    }

    pub fn total(&self) -> u64 {
        self.own() + self.apps * FDS_PER_STORE + self.outlets * FDS_PER_OUTLET + self.http
    }
}

#[derive(Debug, Error)]
pub enum FdError {
    #[error("cannot read the limit on open files (RLIMIT_NOFILE): {0}")]
    Limit(io::Error),
    #[error(
        "the configuration needs about {total} file descriptors ({apps} app store{s} at {FDS_PER_STORE} each, \
         {outlets} outlet{os} at {FDS_PER_OUTLET} each, {http} HTTP connections, {own} for the node itself), but \
         the limit on open files (RLIMIT_NOFILE) is {limit}: raise it to at least {total}, with \
         `LimitNOFILE={suggest}` in the systemd unit (`systemctl edit pure-serve`) or `ulimit -n {suggest}` in the \
         shell that starts the node",
        total = need.total(),
        apps = need.apps,
        s = if need.apps == 1 { "" } else { "s" },
        outlets = need.outlets,
        os = if need.outlets == 1 { "" } else { "s" },
        http = need.http,
        own = need.own(),
        suggest = need.total().next_power_of_two()
    )]
    TooFew { need: Need, limit: u64 },
}

/// Whether `limit` descriptors are enough for `need`.
pub fn enough(need: &Need, limit: u64) -> Result<(), FdError> {
    if limit < need.total() {
        return Err(FdError::TooFew { need: *need, limit });
    }
    Ok(())
}

/// At the node's start, before anything is opened: raises the soft limit to the hard one, says what it got, and
/// refuses a configuration that needs more.
pub fn prepare(apps: &AppsConfig) -> Result<Limits, FdError> {
    let need = Need::of(apps);
    let (before, now) = match raise_soft_limit() {
        Ok(both) => both,
        Err(e) => {
            let now = limits().map_err(FdError::Limit)?;
            tracing::warn!(
                "cannot raise the soft limit on open files from {} to its hard limit {}: {e}",
                now.soft,
                now.hard
            );
            (now, now)
        }
    };
    // The refusal is the one message when the limit is short; otherwise one line says what the node got.
    enough(&need, now.soft)?;
    let raised = if before.soft != now.soft {
        format!(" (soft limit raised from {})", before.soft)
    } else {
        String::new()
    };
    tracing::info!(
        "file descriptors: {}{raised}; the configuration needs about {}",
        now.soft,
        need.total()
    );
    Ok(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn apps(text: &str) -> AppsConfig {
        AppsConfig::parse(std::path::Path::new("apps.toml"), text).unwrap()
    }

    #[test]
    fn the_need_counts_stores_outlets_that_leave_and_connections() {
        let one = Need::of(&AppsConfig::default_single());
        assert_eq!(one.apps, 1);
        assert_eq!(one.outlets, 0);
        assert_eq!(
            one.total(),
            FDS_BASE + FDS_PASSING + FDS_PER_STORE + one.http
        );
        // The default node fits the usual soft limit by far.
        assert!(one.total() < 1024 / 2, "{}", one.total());
        let key = crate::keys::encode_key(&[9; 32]);
        let need = Need::of(&apps(&format!(
            "[apps.a.outlets.up]\nkind = \"link\"\nto = \"h:1\"\nnode_key = \"{key}\"\n\
             [apps.a.outlets.copy]\nkind = \"app\"\napp = \"b\"\n[apps.b]\n"
        )));
        assert_eq!((need.apps, need.outlets), (2, 1));
        assert_eq!(need.total() - one.total(), FDS_PER_STORE + FDS_PER_OUTLET);
    }

    #[test]
    fn too_few_says_the_numbers_and_the_fix_once() {
        let text: String = (0..500).map(|i| format!("[apps.a{i}]\n")).collect();
        let need = Need::of(&apps(&text));
        assert!(enough(&need, need.total()).is_ok());
        let e = enough(&need, 1024).unwrap_err().to_string();
        let total = 500 * FDS_PER_STORE + need.http + need.own();
        assert_eq!(need.total(), total);
        assert!(
            e.starts_with(&format!(
                "the configuration needs about {total} file descriptors (500 app stores at {FDS_PER_STORE} each, 0 \
                 outlets at {FDS_PER_OUTLET} each"
            )),
            "{e}"
        );
        assert!(
            e.contains("the limit on open files (RLIMIT_NOFILE) is 1024: raise it to at least"),
            "{e}"
        );
        let suggest = total.next_power_of_two();
        assert!(e.contains(&format!("`LimitNOFILE={suggest}`")), "{e}");
        assert!(e.contains(&format!("`ulimit -n {suggest}`")), "{e}");
    }
}
