//! The node's HTTP server: `/healthz` and `POST /link` (links over HTTP) on `--http-port`, plain and TLS on the same
//! port; `/metrics`, `/healthz` and the status page (`/`, `/status.json`; [`crate::ops::status`]) on a listener of
//! their own, `--metrics-listen` (loopback by default).
//!
//! It owns one thread, `pure-http`, running a tokio current-thread runtime with hyper's HTTP/1.1 server: one epoll,
//! one task per connection, timers, for both listeners. A host runs on a handful of threads (BRIEF.md: ≤ 5 with 20
//! outputs), so the server is exactly one whatever the number of connections, and it never touches the node core:
//! the receive loop publishes a [`crate::common::figures::Snapshot`] and a heartbeat for the pages, and takes link
//! requests from a bounded queue ([`link`]).
//!
//! Why two listeners: `--http-port` takes links from the internet, and what the metrics say (senders, apps,
//! outlets and their errors, memory) is for the operator, not for everyone who can reach that port. Load balancers
//! probe `/healthz` where the links are, so it stays there too. Each listener has its own connection bounds, so a
//! flood of the public port does not stop Prometheus or the operator from reading the metrics.
//!
//! Nothing a client does can stall it or grow it without bound (issue 9, item 7; issue 14, item 4):
//!
//! - connections are bounded per source address (IPv6: per /64), per source prefix (/24, /56) and in total, and
//!   the total's last share is kept for prefixes that hold almost none ([`bounds`]); a connection past a bound is
//!   told 503 and closed at once, without a task, and counted by reason (`pure_http_refused_total{reason}`);
//! - new TLS connections are bounded in rate, in total (`--tls-handshake-budget`) and per prefix, before the
//!   server spends a key exchange and a signature on their handshake ([`bounds::HandshakeBudget`]);
//! - a request head must be complete within [`HttpLimits::head_timeout`] of the server being ready for it — on a
//!   new connection or after the previous answer, so this is also the keep-alive idle time (and a TLS handshake's
//!   limit);
//! - a `POST /link` body must arrive, and the node answer it, within [`HttpLimits::request_deadline`];
//! - a body is at most [`HttpLimits::max_link_body`] bytes (413 beyond);
//! - a write that waits [`HttpLimits::write_stall`] for a client that does not read fails the connection.
//!
//! Connections are served concurrently on the one thread, so a client sending a byte a second holds only its own
//! connection: `/healthz` and `/metrics` answer everyone else at once.
//!
//! Layout: [`framing`] (the body format, pure), [`link`] (the hand-over to the receive loop and the pseudo peer
//! addresses that route acks back to a request), [`tls`] (certificate files), [`bounds`] (who may hold connections
//! and handshakes, pure), `serve` (accept loops, connections), `routes` (what each request is answered on each
//! listener), `stall` (the write timeout), [`counters`] (the server's metrics).

pub mod bounds;
pub mod counters;
pub mod framing;
pub mod link;
pub mod order;
pub mod push;
pub mod push_many;
mod routes;
mod serve;
mod stall;
pub mod tls;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use thiserror::Error;
use tokio::sync::oneshot;

pub use bounds::{ConnectionLimits, Refused};
pub use counters::HttpCounters;
pub use framing::{Framed, FramingError};
pub use link::{LINK_QUEUE, LinkInbox, LinkQueue, LinkRequest, link_channel};
pub use routes::LINK_CONTENT_TYPE;
pub use tls::TlsConfig;

use crate::common::figures::LiveStats;

#[derive(Debug, Error)]
pub enum HttpError {
    #[error(
        "cannot listen on TCP {addr} for HTTP: {}",
        crate::ops::bind_problem(source, *addr, "--http-port", "--bind")
    )]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error(
        "cannot listen on TCP {addr} for the metrics: {}",
        crate::ops::bind_problem(source, *addr, "--metrics-listen", "--metrics-listen")
    )]
    MetricsBind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot start the HTTP server: {0}")]
    Start(std::io::Error),
    #[error("push socket {path}: {why}")]
    PushSocket { path: PathBuf, why: String },
    /// A TLS file that is not a regular file, too big, or unreadable (crate::files).
    #[error(transparent)]
    TlsFile(#[from] crate::files::FileError),
    #[error(
        "{path} is not a usable TLS certificate file: {why} (give --tls-cert a PEM file: the server's certificate first, then any intermediates)"
    )]
    TlsCert { path: PathBuf, why: String },
    #[error(
        "{path} is not a usable TLS private key file: {why} (give --tls-key the PEM private key of the certificate)"
    )]
    TlsKey { path: PathBuf, why: String },
    #[error(
        "the key in {key} cannot serve the certificate in {cert}: {why} (give the private key that belongs to the first certificate of the file)"
    )]
    TlsPair {
        cert: PathBuf,
        key: PathBuf,
        why: String,
    },
    #[error("TLS setup: {0}")]
    TlsSetup(String),
}

impl HttpError {
    /// Whether a file or path the operator named is at fault (a TLS file, the push socket's path), so that starting
    /// again cannot help; a port in use or a thread that cannot start may be cured by a restart.
    pub fn is_configuration(&self) -> bool {
        matches!(
            self,
            HttpError::TlsFile(_)
                | HttpError::TlsCert { .. }
                | HttpError::TlsKey { .. }
                | HttpError::TlsPair { .. }
                | HttpError::PushSocket { .. }
        )
    }
}

/// New TLS connections per second the server takes by default, in total (one prefix an eighth of it):
/// research/015 measured what a flood of handshakes did to links over UDP and HTTP without a bound and with it.
pub const DEFAULT_TLS_HANDSHAKE_BUDGET: u32 = 200;

/// The server's bounds. [`Default`] is what the node uses; tests shorten them.
#[derive(Debug, Clone)]
pub struct HttpLimits {
    /// Connections open at once on `--http-port`, per source, per prefix and in total ([`bounds`]).
    pub connections: ConnectionLimits,
    /// The same on the metrics listener: fewer ([`ConnectionLimits::metrics`]).
    pub metrics_connections: ConnectionLimits,
    /// New TLS connections per second, in total (`--tls-handshake-budget`); one prefix may have an eighth
    /// ([`bounds::HandshakeBudget`]).
    pub tls_handshakes_per_second: u32,
    /// From ready-for-a-request to the end of its head; also the keep-alive idle time, and the most a TLS
    /// handshake may take.
    pub head_timeout: Duration,
    /// From the end of a `POST /link` head to its answer: reading the body and waiting for the node's commit.
    pub request_deadline: Duration,
    /// How long one write may wait for a client that does not read.
    pub write_stall: Duration,
    /// Largest `POST /link` body: 1 MiB is about 700 full-size packets, a long turn's worth from one sender.
    pub max_link_body: usize,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            connections: ConnectionLimits::default(),
            metrics_connections: ConnectionLimits::metrics(),
            tls_handshakes_per_second: DEFAULT_TLS_HANDSHAKE_BUDGET,
            head_timeout: Duration::from_secs(10),
            request_deadline: Duration::from_secs(10),
            write_stall: Duration::from_secs(10),
            max_link_body: 1 << 20,
        }
    }
}

/// Which listener a connection came in on: what it is served and which counters it bumps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    /// `--http-port`: `/healthz`, `POST /link`; TLS if configured.
    Http,
    /// `--metrics-listen`: `/metrics`, `/healthz`, the status page (`/`, `/status.json`).
    Metrics,
}

impl Listener {
    /// The value of the `listener` label.
    pub fn label(self) -> &'static str {
        match self {
            Listener::Http => "http",
            Listener::Metrics => "metrics",
        }
    }
}

/// What every connection task shares.
struct Shared {
    stats: Arc<LiveStats>,
    links: Option<LinkInbox>,
    /// Where the push socket's pushes go (docs/downlink.md), when it is served.
    pushes: Option<crate::common::push::PushInbox>,
    /// Where the status page's search by name goes (the devices census), when there is one.
    devices: Option<crate::ops::devices::DeviceSearch>,
    counters: Arc<HttpCounters>,
    limits: HttpLimits,
    /// The connections of each listener.
    http_slots: Arc<serve::Slots>,
    metrics_slots: Arc<serve::Slots>,
    handshakes: std::sync::Mutex<bounds::HandshakeBudget>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    /// Numbered link requests of one client, handed over in their order.
    order: order::OrderGate,
    /// The status page's history (sampled on this thread only while there is a metrics listener).
    history: std::sync::Mutex<crate::ops::status::History>,
    listens: crate::ops::status::Listens,
}

impl Shared {
    fn slots(&self, listener: Listener) -> &Arc<serve::Slots> {
        match listener {
            Listener::Http => &self.http_slots,
            Listener::Metrics => &self.metrics_slots,
        }
    }
}

/// The listeners, bound before the node reports ready (so a port in use stops the start with a clear error).
pub struct HttpServer {
    listener: std::net::TcpListener,
    metrics: Option<std::net::TcpListener>,
    push: Option<(
        tokio::sync::mpsc::UnboundedReceiver<crate::common::push::Handed>,
        crate::common::push::PushInbox,
    )>,
    devices: Option<crate::ops::devices::DeviceSearch>,
    limits: HttpLimits,
    tls: Option<TlsConfig>,
}

impl HttpServer {
    /// Binds `--http-port`'s listener.
    pub fn bind(addr: SocketAddr) -> Result<Self, HttpError> {
        let listener = crate::common::listen::tcp_listener(addr)
            .map_err(|source| HttpError::Bind { addr, source })?;
        Ok(HttpServer {
            listener,
            metrics: None,
            push: None,
            devices: None,
            limits: HttpLimits::default(),
            tls: None,
        })
    }

    /// Also binds the metrics listener (`--metrics-listen`). Without one, `/metrics` is served nowhere.
    pub fn with_metrics_listener(mut self, addr: SocketAddr) -> Result<Self, HttpError> {
        let listener = crate::common::listen::tcp_listener(addr)
            .map_err(|source| HttpError::MetricsBind { addr, source })?;
        self.metrics = Some(listener);
        Ok(self)
    }

    /// Also serves the push socket's connections the receive loop hands over (`handed`, research/054;
    /// docs/downlink.md), handing their pushes to `inbox`.
    pub fn with_pushes(
        mut self,
        handed: tokio::sync::mpsc::UnboundedReceiver<crate::common::push::Handed>,
        inbox: crate::common::push::PushInbox,
    ) -> Self {
        self.push = Some((handed, inbox));
        self
    }

    /// Also answers the status page's search by name (`/devices.json?name=TEXT`) through the devices census.
    pub fn with_device_search(mut self, search: crate::ops::devices::DeviceSearch) -> Self {
        self.devices = Some(search);
        self
    }

    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.listener.local_addr().ok()
    }

    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// Also answers TLS on the port (plain HTTP stays).
    pub fn with_tls(mut self, tls: TlsConfig) -> Self {
        self.tls = Some(tls);
        self
    }

    pub fn with_limits(mut self, limits: HttpLimits) -> Self {
        self.limits = limits;
        self
    }

    pub fn limits(&self) -> &HttpLimits {
        &self.limits
    }

    /// Starts serving on the `pure-http` thread. `links`: where `POST /link` goes (`None`: it is answered 404).
    /// The server stops when the handle is stopped or dropped.
    pub fn spawn(
        self,
        stats: Arc<LiveStats>,
        links: Option<LinkInbox>,
    ) -> Result<HttpHandle, HttpError> {
        let local_addr = self.local_addr();
        let metrics_addr = self.metrics_addr();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(HttpError::Start)?;
        let counters = Arc::new(HttpCounters::default());
        let limits = self.limits;
        let listens = crate::ops::status::Listens {
            http: local_addr,
            metrics: metrics_addr,
            tls: self.tls.is_some(),
        };
        let shared = Arc::new(Shared {
            history: std::sync::Mutex::new(crate::ops::status::History::new(
                stats.heartbeat.started(),
            )),
            listens,
            stats,
            links,
            pushes: self.push.as_ref().map(|(_, inbox)| inbox.clone()),
            devices: self.devices,
            counters: counters.clone(),
            http_slots: serve::Slots::new(limits.connections),
            metrics_slots: serve::Slots::evicting(limits.metrics_connections),
            handshakes: std::sync::Mutex::new(bounds::HandshakeBudget::new(
                limits.tls_handshakes_per_second,
            )),
            limits,
            tls: self.tls.map(|t| tokio_rustls::TlsAcceptor::from(t.config)),
            order: order::OrderGate::default(),
        });
        // Registering the listeners needs the runtime's reactor; doing it here reports a failure to the caller.
        // Registered as descriptors, not as tokio listeners: the accept loop accepts with the standard library, so
        // that a refused connection is never registered (serve.rs).
        let register = |l: std::net::TcpListener| {
            l.set_nonblocking(true).map_err(HttpError::Start)?;
            let _entered = runtime.enter();
            // SAFETY: a std TcpListener owns its descriptor, which stays open and the same until the AsyncFd (which
            // owns the listener) is dropped; nothing else closes or replaces it.
            unsafe {
                tokio::io::unix::AsyncFd::register_with_interest(l, tokio::io::Interest::READABLE)
            }
            .map_err(|e| HttpError::Start(e.into_parts().1))
        };
        let mut listeners = vec![(register(self.listener)?, Listener::Http)];
        let status_page = self.metrics.is_some();
        if let Some(m) = self.metrics {
            listeners.push((register(m)?, Listener::Metrics));
        }
        let push = self.push.map(|(handed, _)| handed);
        let (stop, stop_rx) = oneshot::channel();
        let thread = std::thread::Builder::new()
            .name("pure-http".into())
            .spawn(move || {
                runtime.block_on(async move {
                    // Ends with the runtime, when the server stops.
                    if status_page {
                        tokio::spawn(routes::sample_history(shared.clone()));
                    }
                    serve::run(listeners, push, shared, stop_rx).await
                })
            })
            .map_err(HttpError::Start)?;
        Ok(HttpHandle {
            stop: Some(stop),
            thread: Some(thread),
            counters,
            local_addr,
            metrics_addr,
        })
    }
}

/// The running server. [`HttpHandle::stop`] (or drop) stops accepting, lets requests in progress finish for up to
/// two seconds, and joins the thread.
pub struct HttpHandle {
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
    counters: Arc<HttpCounters>,
    local_addr: Option<SocketAddr>,
    metrics_addr: Option<SocketAddr>,
}

impl HttpHandle {
    pub fn counters(&self) -> &HttpCounters {
        &self.counters
    }

    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.local_addr
    }

    /// The metrics listener's address, if it has one.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    pub fn stop(mut self) {
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!("the HTTP thread panicked");
        }
    }
}

impl Drop for HttpHandle {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}
