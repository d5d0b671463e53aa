//! The accept loops (one per listener) and one task per connection, on the server's current-thread runtime; the
//! slots that bound a listener's connections ([`Slots`], over [`super::bounds::ConnectionTable`]).

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use super::bounds::{ConnectionLimits, ConnectionTable, Refused, Ticket};
use super::counters::bump;
use super::stall::Stall;
use super::{Listener, Shared, routes, tls};

/// Longest request head, request line included; beyond it hyper answers 431.
const MAX_HEAD: usize = 8 * 1024;
/// How long a stop waits for connections with a request in progress to finish it.
const STOP_GRACE: Duration = Duration::from_secs(2);
/// Pause after a failed accept (EMFILE and friends) instead of spinning on a listener that cannot accept.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The connections of one listener: the table that admits them, and how many are open for a stop to wait on.
pub(super) struct Slots {
    table: Mutex<ConnectionTable>,
    open: watch::Sender<usize>,
}

/// An admitted connection's place; given back when the connection's task ends.
pub(super) struct Slot {
    slots: Arc<Slots>,
    ticket: Ticket,
}

impl Slots {
    pub(super) fn new(limits: ConnectionLimits) -> Arc<Self> {
        Arc::new(Slots {
            table: Mutex::new(ConnectionTable::new(limits)),
            open: watch::Sender::new(0),
        })
    }

    /// The table, also after a panic on this thread while it was held (its counts are still right: every change
    /// is one statement).
    fn table(&self) -> std::sync::MutexGuard<'_, ConnectionTable> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn take(self: &Arc<Self>, ip: IpAddr) -> Result<Slot, Refused> {
        let mut table = self.table();
        let ticket = table.admit(ip)?;
        self.open.send_replace(table.open());
        Ok(Slot {
            slots: self.clone(),
            ticket,
        })
    }

    pub(super) fn open(&self) -> usize {
        *self.open.borrow()
    }

    async fn all_closed(&self) {
        let _ = self.open.subscribe().wait_for(|n| *n == 0).await;
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut table = self.slots.table();
        table.release(self.ticket);
        self.slots.open.send_replace(table.open());
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
    listeners: Vec<(TcpListener, Listener)>,
    shared: Arc<Shared>,
    stop: tokio::sync::oneshot::Receiver<()>,
) {
    let (closing, closing_rx) = watch::channel(false);
    let loops: Vec<_> = listeners
        .into_iter()
        .map(|(l, which)| tokio::spawn(accept_loop(l, which, shared.clone(), closing_rx.clone())))
        .collect();
    let _ = stop.await;
    // The loops drop their listeners when they see the stop: the ports close before the grace.
    let _ = closing.send(true);
    for l in loops {
        let _ = l.await;
    }
    let drained = async {
        shared.http_slots.all_closed().await;
        shared.metrics_slots.all_closed().await;
    };
    let _ = tokio::time::timeout(STOP_GRACE, drained).await;
}

/// Accepts on one listener until the server stops. A connection past its bounds is refused here, before a task
/// or a buffer is spent on it: one write that does not wait, and the close.
async fn accept_loop(
    listener: TcpListener,
    which: Listener,
    shared: Arc<Shared>,
    mut closing: watch::Receiver<bool>,
) {
    let slots = shared.slots(which).clone();
    let counters = shared.counters.listener(which);
    loop {
        tokio::select! {
            () = stopping(&mut closing) => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => match slots.take(peer.ip()) {
                    Ok(slot) => {
                        bump(&counters.served);
                        tokio::spawn(connection(stream, peer, which, shared.clone(), slot, closing.clone()));
                    }
                    Err(why) => {
                        bump(counters.refused(why));
                        let _ = stream.try_write(refusal(why));
                    }
                },
                Err(e) => {
                    tracing::debug!("http accept: {e}");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            },
        }
    }
}

async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    which: Listener,
    shared: Arc<Shared>,
    _slot: Slot,
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
        )
        .await;
    };
    // TLS and plain HTTP share the port: the first byte tells them apart. A client that sends nothing is held no
    // longer than one that sends a head slowly.
    let mut first = [0u8; 1];
    match tokio::time::timeout(limits.head_timeout, stream.peek(&mut first)).await {
        Ok(Ok(1)) => {}
        _ => return,
    }
    let io = Stall::new(stream, limits.write_stall);
    if !tls::starts_tls(first[0]) {
        return serve(io, peer, which, shared, closing).await;
    }
    // Before the ClientHello is read: a refused handshake costs the close, not a key exchange and a signature.
    let granted = shared
        .handshakes
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take(std::time::Instant::now(), peer.ip());
    if let Err(why) = granted {
        bump(shared.counters.http.refused(why));
        return;
    }
    bump(&shared.counters.tls_handshakes);
    match tokio::time::timeout(limits.head_timeout, acceptor.accept(io)).await {
        Ok(Ok(tls)) => serve(tls, peer, which, shared, closing).await,
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
async fn stopping(closing: &mut watch::Receiver<bool>) {
    let _ = closing.wait_for(|c| *c).await;
}

/// HTTP/1.1 on one connection, keep-alive, until the client closes, a limit is hit, or the server stops.
async fn serve<I>(
    io: I,
    peer: SocketAddr,
    which: Listener,
    shared: Arc<Shared>,
    mut closing: watch::Receiver<bool>,
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
    let result = tokio::select! {
        r = conn.as_mut() => r,
        () = stopping(&mut closing) => {
            // Finish the request in progress (if any), then close.
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
