//! The accept loops (one per listener) and one task per connection, on the server's current-thread runtime; the
//! slots that bound a listener's connections ([`Slots`], over [`super::bounds::ConnectionTable`]).
//!
//! A refused connection must cost as little as can be: a flood of them is the one thing the bounds cannot bound
//! (research/015: past the handshake budget, a TLS flood becomes tens of thousands of connections a second). So
//! the loop accepts with the standard library on a listener registered once (tokio's `AsyncFd`), and decides
//! before the connection is registered with the reactor or given a task: its slot (refused: one write and the
//! close) and, where TLS is served, its first byte if it has come (a handshake past the budget: the close).
//! Only admitted connections are registered and spawned.

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::{Notify, watch};

use super::bounds::{ConnectionLimits, ConnectionTable, Refused, Source, Ticket};
use super::counters::bump;
use super::stall::Stall;
use super::{Listener, Shared, routes, tls};

/// Longest request head, request line included; beyond it hyper answers 431.
const MAX_HEAD: usize = 8 * 1024;
/// How long a stop waits for connections with a request in progress to finish it.
const STOP_GRACE: Duration = Duration::from_secs(2);
/// How often a stop looks whether every connection has closed.
const STOP_POLL: Duration = Duration::from_millis(10);
/// Pause after a failed accept (EMFILE and friends) instead of spinning on a listener that cannot accept.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// Connections accepted per wake of a loop before it lets the connections' tasks run: a flood of connections must
/// not keep the thread from the requests it has.
const ACCEPT_BATCH: usize = 64;

/// The connections of one listener: the table that admits them, and, for a listener that makes room by closing
/// its oldest connection rather than refusing the new one (the metrics listener: its clients are the operator's
/// own, all from one address when it is loopback, so a refusal by address would let one program holding
/// connections lock out every scrape), the connections open, oldest first.
pub(super) struct Slots {
    table: Mutex<ConnectionTable>,
    open: Option<Mutex<VecDeque<Open>>>,
    next_id: AtomicU64,
}

/// An open connection of an evicting listener: its source, and the signal that asks it to close.
struct Open {
    id: u64,
    source: Source,
    close: Arc<Notify>,
    asked: bool,
}

/// An admitted connection's place; given back when the connection's task ends.
pub(super) struct Slot {
    slots: Arc<Slots>,
    ticket: Ticket,
    id: u64,
    /// Notified when the listener asks this connection to close to make room (evicting listeners only).
    pub(super) close: Option<Arc<Notify>>,
}

impl Slots {
    pub(super) fn new(limits: ConnectionLimits) -> Arc<Self> {
        Self::with_eviction(limits, false)
    }

    /// A listener that, past a bound, asks its oldest connection (of the same source when the source is at its
    /// bound) to close and admits the new one; it refuses only when every connection it could ask has been asked.
    pub(super) fn evicting(limits: ConnectionLimits) -> Arc<Self> {
        Self::with_eviction(limits, true)
    }

    fn with_eviction(limits: ConnectionLimits, evicting: bool) -> Arc<Self> {
        Arc::new(Slots {
            table: Mutex::new(ConnectionTable::new(limits)),
            open: evicting.then(|| Mutex::new(VecDeque::new())),
            next_id: AtomicU64::new(0),
        })
    }

    fn open_list(&self) -> Option<std::sync::MutexGuard<'_, VecDeque<Open>>> {
        self.open
            .as_ref()
            .map(|m| m.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// The table, also after a panic on this thread while it was held (its counts are still right: every change
    /// is one statement).
    fn table(&self) -> std::sync::MutexGuard<'_, ConnectionTable> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A place for a connection from `ip`, and whether an older connection was asked to close for it.
    fn take(self: &Arc<Self>, ip: IpAddr) -> Result<(Slot, bool), Refused> {
        let admitted = self.table().admit(ip);
        let (ticket, evicted) = match admitted {
            Ok(t) => (t, false),
            Err(why) => {
                let Some(mut open) = self.open_list() else {
                    return Err(why);
                };
                let source = Source::of(ip);
                let victim = open
                    .iter_mut()
                    .find(|o| !o.asked && (why != Refused::PerSource || o.source == source))
                    .ok_or(why)?;
                victim.asked = true;
                victim.close.notify_one();
                (self.table().admit_over(ip), true)
            }
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let close = self.open_list().map(|mut open| {
            let close = Arc::new(Notify::new());
            open.push_back(Open {
                id,
                source: Source::of(ip),
                close: close.clone(),
                asked: false,
            });
            close
        });
        Ok((
            Slot {
                slots: self.clone(),
                ticket,
                id,
                close,
            },
            evicted,
        ))
    }

    pub(super) fn open(&self) -> usize {
        self.table().open()
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.slots.table().release(self.ticket);
        if let Some(mut open) = self.slots.open_list() {
            open.retain(|o| o.id != self.id);
        }
    }
}

/// What a refused connection is told, written once without waiting (the client may not even read it).
fn refusal(why: Refused) -> &'static [u8] {
    match why {
        Refused::PerSource => {
            b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nConnection: close\r\n\
Content-Type: text/plain\r\nContent-Length: 39\r\n\r\ntoo many connections from your address\n"
        }
        Refused::PerPrefix => {
            b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nConnection: close\r\n\
Content-Type: text/plain\r\nContent-Length: 39\r\n\r\ntoo many connections from your network\n"
        }
        Refused::TlsPrefix | Refused::TlsBudget => {
            b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nConnection: close\r\n\
Content-Type: text/plain\r\nContent-Length: 29\r\n\r\ntoo many new TLS connections\n"
        }
        Refused::Reserved | Refused::Total => {
            b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nConnection: close\r\n\
Content-Type: text/plain\r\nContent-Length: 21\r\n\r\ntoo many connections\n"
        }
    }
}

/// Serves `listeners` until `stop` fires (or its sender is dropped), then lets connections finish their requests
/// for up to [`STOP_GRACE`]. As mini-redis's `run(listener, shutdown)`: the caller owns the listeners and the stop
/// signal.
pub(super) async fn run(
    listeners: Vec<(AsyncFd<std::net::TcpListener>, Listener)>,
    push: Option<tokio::sync::mpsc::UnboundedReceiver<crate::common::push::Handed>>,
    shared: Arc<Shared>,
    stop: tokio::sync::oneshot::Receiver<()>,
) {
    let (closing, closing_rx) = watch::channel(false);
    let mut loops: Vec<_> = listeners
        .into_iter()
        .map(|(l, which)| tokio::spawn(accept_loop(l, which, shared.clone(), closing_rx.clone())))
        .collect();
    if let Some(handed) = push {
        loops.push(tokio::spawn(super::push::handed_loop(
            handed,
            shared.clone(),
            closing_rx.clone(),
        )));
    }
    let _ = stop.await;
    // The loops drop their listeners when they see the stop: the ports close before the grace.
    let _ = closing.send(true);
    for l in loops {
        let _ = l.await;
    }
    let drained = async {
        while shared.http_slots.open() + shared.metrics_slots.open() > 0 {
            tokio::time::sleep(STOP_POLL).await;
        }
    };
    let _ = tokio::time::timeout(STOP_GRACE, drained).await;
}

/// Accepts on one listener until the server stops.
async fn accept_loop(
    listener: AsyncFd<std::net::TcpListener>,
    which: Listener,
    shared: Arc<Shared>,
    mut closing: watch::Receiver<bool>,
) {
    loop {
        let mut ready = tokio::select! {
            () = stopping(&mut closing) => break,
            ready = listener.readable() => match ready {
                Ok(r) => r,
                Err(e) => {
                    tracing::debug!("http listener: {e}");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
        };
        for _ in 0..ACCEPT_BATCH {
            match ready.try_io(|l| l.get_ref().accept()) {
                Ok(Ok((stream, peer))) => admit(stream, peer, which, &shared, &closing),
                Ok(Err(e)) => {
                    tracing::debug!("http accept: {e}");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    break;
                }
                // Nothing more queued; the readiness is cleared and the next wake comes from the reactor.
                Err(_would_block) => break,
            }
        }
        drop(ready);
        tokio::task::yield_now().await;
    }
}

/// The first byte of a connection, if it has come: `Ok(None)` if not yet, `Err` if the connection is closed or
/// failed. Does not wait.
fn first_byte_now(stream: &std::net::TcpStream) -> Result<Option<u8>, ()> {
    let mut first = [std::mem::MaybeUninit::<u8>::uninit()];
    let sock = socket2::SockRef::from(stream);
    match sock.recv_with_flags(&mut first, libc::MSG_PEEK | libc::MSG_DONTWAIT) {
        // SAFETY: recv wrote the one byte it says it read.
        Ok(1) => Ok(Some(unsafe { first[0].assume_init() })),
        Ok(_) => Err(()),
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(None),
        Err(_) => Err(()),
    }
}

/// Whether a TLS handshake from `peer` may begin now: takes its token, or counts why not.
fn handshake_granted(shared: &Shared, peer: SocketAddr) -> bool {
    let granted = shared
        .handshakes
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take(std::time::Instant::now(), peer.ip());
    match granted {
        Ok(()) => {
            bump(&shared.counters.tls_handshakes);
            true
        }
        Err(why) => {
            bump(shared.counters.http.refused(why));
            false
        }
    }
}

/// Admits or refuses one accepted connection; an admitted one is registered and gets a task.
fn admit(
    stream: std::net::TcpStream,
    peer: SocketAddr,
    which: Listener,
    shared: &Arc<Shared>,
    closing: &watch::Receiver<bool>,
) {
    let counters = shared.counters.listener(which);
    let slot = match shared.slots(which).take(peer.ip()) {
        Ok((slot, evicted)) => {
            if evicted {
                bump(&counters.evicted);
            }
            slot
        }
        Err(why) => {
            bump(counters.refused(why));
            let sock = socket2::SockRef::from(&stream);
            let _ = sock.send_with_flags(refusal(why), libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL);
            return;
        }
    };
    // Served: it has a slot. (A handshake refused below had one too; it is counted by its reason as well.)
    bump(&counters.served);
    let tls = shared.tls.is_some() && which == Listener::Http;
    // Where TLS is served, the first byte decides; a flood's has come by now, and a handshake past the budget is
    // refused here, before the connection costs a registration and a task.
    let first = if tls {
        match first_byte_now(&stream) {
            Ok(Some(b)) if tls::starts_tls(b) && !handshake_granted(shared, peer) => return,
            Ok(first) => first,
            Err(()) => return,
        }
    } else {
        None
    };
    let stream = match stream
        .set_nonblocking(true)
        .and_then(|()| TcpStream::from_std(stream))
    {
        Ok(s) => s,
        Err(e) => {
            tracing::debug!(%peer, "http connection: {e}");
            return;
        }
    };
    tracing::trace!(%peer, fd = stream.as_raw_fd(), "http connection");
    tokio::spawn(connection(
        stream,
        peer,
        which,
        first,
        shared.clone(),
        slot,
        closing.clone(),
    ));
}

/// One connection. `first`: its first byte, if the accept loop saw it (and, for TLS, granted the handshake).
async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    which: Listener,
    first: Option<u8>,
    shared: Arc<Shared>,
    slot: Slot,
    closing: watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    let limits = shared.limits.clone();
    // TLS only where the links are: the metrics listener is for the operator's own network.
    let acceptor = match which {
        Listener::Http => shared.tls.clone(),
        Listener::Metrics => None,
    };
    let Some(acceptor) = acceptor else {
        return serve(
            Stall::new(stream, limits.write_stall),
            peer,
            which,
            shared,
            closing,
            slot.close.clone(),
        )
        .await;
    };
    // TLS and plain HTTP share the port: the first byte tells them apart. A client that sends nothing is held no
    // longer than one that sends a head slowly.
    let first = match first {
        Some(b) => b,
        None => {
            let mut first = [0u8; 1];
            match tokio::time::timeout(limits.head_timeout, stream.peek(&mut first)).await {
                Ok(Ok(1)) => {}
                _ => return,
            }
            // Before the ClientHello is read: a refused handshake costs the close, not a key exchange and a
            // signature.
            if tls::starts_tls(first[0]) && !handshake_granted(&shared, peer) {
                return;
            }
            first[0]
        }
    };
    let io = Stall::new(stream, limits.write_stall);
    if !tls::starts_tls(first) {
        return serve(io, peer, which, shared, closing, slot.close.clone()).await;
    }
    match tokio::time::timeout(limits.head_timeout, acceptor.accept(io)).await {
        Ok(Ok(tls)) => serve(tls, peer, which, shared, closing, slot.close.clone()).await,
        Ok(Err(e)) => {
            bump(&shared.counters.tls_failed);
            tracing::debug!(%peer, "TLS handshake failed: {e}");
        }
        Err(_) => {
            bump(&shared.counters.tls_failed);
            tracing::debug!(%peer, "TLS handshake timed out");
        }
    }
}

/// Resolves once the server stops (or is gone).
pub(super) async fn stopping(closing: &mut watch::Receiver<bool>) {
    let _ = closing.wait_for(|c| *c).await;
}

/// HTTP/1.1 on one connection, keep-alive, until the client closes, a limit is hit, the server stops, or (on an
/// evicting listener) `close` asks it to make room.
async fn serve<I>(
    io: I,
    peer: SocketAddr,
    which: Listener,
    shared: Arc<Shared>,
    mut closing: watch::Receiver<bool>,
    close: Option<Arc<Notify>>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let limits = shared.limits.clone();
    let service = service_fn(move |req| {
        let shared = shared.clone();
        async move { Ok::<_, std::convert::Infallible>(routes::handle(req, peer, which, shared).await) }
    });
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        // Runs from when the server is ready for a request (a new connection, or after the last answer) to the
        // end of its head: the bound on a slow head and the keep-alive idle time both.
        .header_read_timeout(limits.head_timeout)
        .max_header_size(MAX_HEAD)
        .keep_alive(true);
    let conn = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(conn);
    let asked_to_close = async {
        match close {
            Some(n) => n.notified().await,
            None => std::future::pending().await,
        }
    };
    let result = tokio::select! {
        r = conn.as_mut() => r,
        () = stopping(&mut closing) => {
            // Finish the request in progress (if any), then close.
            conn.as_mut().graceful_shutdown();
            conn.await
        }
        () = asked_to_close => {
            // Room for a newer connection: the request in progress (if any) is answered, then it closes.
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = result {
        tracing::debug!(%peer, "http connection: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_whole_answers_that_say_why() {
        for why in Refused::ALL {
            let text = std::str::from_utf8(refusal(why)).unwrap();
            let (head, body) = text.split_once("\r\n\r\n").unwrap();
            assert!(head.starts_with("HTTP/1.1 503 "), "{head}");
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("Content-Length: "))
                .unwrap()
                .parse()
                .unwrap();
            assert_eq!(length, body.len(), "{text}");
            assert_eq!(body.trim_end(), why.why(), "{text}");
        }
    }
}
