//! The accept loop and one task per connection, on the server's current-thread runtime.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, watch};

use super::counters::bump;
use super::stall::Stall;
use super::{Shared, routes, tls};

/// Longest request head, request line included; beyond it hyper answers 431.
const MAX_HEAD: usize = 8 * 1024;
/// How long a stop waits for connections with a request in progress to finish it.
const STOP_GRACE: Duration = Duration::from_secs(2);
/// Pause after a failed accept (EMFILE and friends) instead of spinning on a listener that cannot accept.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// What a refused connection is told, written once without waiting (the client may not even read it).
const REFUSED: &[u8] =
    b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nConnection: close\r\n\
Content-Type: text/plain\r\nContent-Length: 22\r\n\r\ntoo many connections\r\n";

/// Accepts until `stop` fires (or its sender is dropped), then lets connections finish their requests for up to
/// [`STOP_GRACE`]. As mini-redis's `run(listener, shutdown)`: the caller owns the listener and the stop signal.
pub(super) async fn run(
    listener: TcpListener,
    shared: Arc<Shared>,
    stop: tokio::sync::oneshot::Receiver<()>,
) {
    let (closing, closing_rx) = watch::channel(false);
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => match shared.permits.clone().try_acquire_owned() {
                    Ok(permit) => {
                        bump(&shared.counters.connections);
                        tokio::spawn(connection(stream, peer, shared.clone(), permit, closing_rx.clone()));
                    }
                    Err(_) => {
                        bump(&shared.counters.refused);
                        let _ = stream.try_write(REFUSED);
                    }
                },
                Err(e) => {
                    tracing::debug!("http accept: {e}");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            },
        }
    }
    drop(listener);
    let _ = closing.send(true);
    // Every connection holds a permit; all permits back means all connections closed.
    let all = shared.limits.max_connections as u32;
    let _ = tokio::time::timeout(STOP_GRACE, shared.permits.acquire_many(all)).await;
}

async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    shared: Arc<Shared>,
    _permit: OwnedSemaphorePermit,
    closing: watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    let limits = shared.limits.clone();
    let Some(acceptor) = shared.tls.clone() else {
        return serve(
            Stall::new(stream, limits.write_stall),
            peer,
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
        return serve(io, peer, shared, closing).await;
    }
    match tokio::time::timeout(limits.head_timeout, acceptor.accept(io)).await {
        Ok(Ok(tls)) => serve(tls, peer, shared, closing).await,
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
async fn serve<I>(io: I, peer: SocketAddr, shared: Arc<Shared>, mut closing: watch::Receiver<bool>)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let limits = shared.limits.clone();
    let service = service_fn(move |req| {
        let shared = shared.clone();
        async move { Ok::<_, std::convert::Infallible>(routes::handle(req, peer, shared).await) }
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
