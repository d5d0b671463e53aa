//! The hand-over of `POST /link` from the HTTP thread to the receive loop, which alone owns the node core.
//!
//! The server puts a [`LinkRequest`] (the request's packets and a one-shot reply) in a bounded queue and wakes the
//! loop once ([`crate::common::wake::Wake`]). The loop takes a bounded amount of requests per round, feeds their
//! packets to the node core as if they were datagrams, applies and commits the turn, and answers each request with
//! the node packets its packets earned ([`crate::receive`] shows the order). A full queue is answered 503 at once:
//! the server never waits for room, so a flood of requests cannot tie up the HTTP thread.
//!
//! **How acks find their request.** The node core sends every ack to a [`SocketAddr`]. A request's packets are
//! given one that no UDP datagram can come from: an address of the IPv6 discard-only prefix `100::/64` (RFC 6666)
//! whose low 64 bits are the request's number, with port 0 ([`pseudo_peer`]). The core answers a turn to the last
//! such address that put the session's packets into it (not to the address of the run's highest packet number, as
//! over UDP: that request may have been answered already; protocol.md 10), and after the commit the loop sends a
//! transmit to such an address to that request's answer instead of the socket ([`request_of`]). A session whose
//! highest packet comes over UDP is answered at its UDP address again, as when a NAT rebinding moves it.

use std::net::{Ipv6Addr, SocketAddr, SocketAddrV6};
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};

use tokio::sync::oneshot;

use super::framing::Framed;
use crate::common::wake::Wake;

/// Requests waiting for the receive loop before the server answers 503 (`Retry-After: 1`): with at most 1 MiB each,
/// enough to keep the loop busy for many rounds, few enough that a waiting request is answered within its deadline.
pub const LINK_QUEUE: usize = 64;

/// One `POST /link`, handed to the receive loop.
#[derive(Debug)]
pub struct LinkRequest {
    /// The TCP peer (for logs and, later, admission by address); the node core sees [`pseudo_peer`] instead.
    pub peer: SocketAddr,
    /// The sealed sender packets, checked to be framed.
    pub packets: Framed,
    /// Where the loop sends the node packets the request earned (possibly none), after the commit. Dropped unsent
    /// if the node stops first; the server then answers 503.
    pub reply: oneshot::Sender<Vec<Vec<u8>>>,
}

/// Why a request was not queued.
#[derive(Debug)]
pub enum LinkRefused {
    /// The queue holds [`LINK_QUEUE`] requests already.
    Busy(LinkRequest),
    /// The receive loop is gone (the node is stopping).
    Stopped(LinkRequest),
}

/// The producer's end: the HTTP server holds it.
#[derive(Debug, Clone)]
pub struct LinkInbox {
    tx: SyncSender<LinkRequest>,
    wake: Arc<Wake>,
}

impl LinkInbox {
    /// Queues a request and wakes the loop; never blocks.
    pub fn send(&self, request: LinkRequest) -> Result<(), LinkRefused> {
        match self.tx.try_send(request) {
            Ok(()) => {
                self.wake.wake();
                Ok(())
            }
            Err(TrySendError::Full(r)) => Err(LinkRefused::Busy(r)),
            Err(TrySendError::Disconnected(r)) => Err(LinkRefused::Stopped(r)),
        }
    }
}

/// The consumer's end: the receive loop holds it. Dropping it fails every request still queued (their replies are
/// dropped, so each is answered 503).
#[derive(Debug)]
pub struct LinkQueue {
    rx: Receiver<LinkRequest>,
    wake: Arc<Wake>,
}

impl LinkQueue {
    /// The next request, if one is waiting.
    pub fn try_recv(&self) -> Option<LinkRequest> {
        self.rx.try_recv().ok()
    }

    /// Waits up to `timeout` for a request (for consumers that do not poll, such as tests).
    pub fn recv_timeout(&self, timeout: std::time::Duration) -> Option<LinkRequest> {
        self.rx.recv_timeout(timeout).ok()
    }

    /// The descriptor that is readable after a request was queued; [`Wake::clear`] it before draining.
    pub fn wake(&self) -> &Wake {
        &self.wake
    }
}

/// A queue of at most `bound` requests (at least 1) between the HTTP server and the receive loop.
pub fn link_channel(bound: usize) -> std::io::Result<(LinkInbox, LinkQueue)> {
    let (tx, rx) = mpsc::sync_channel(bound.max(1));
    let wake = Arc::new(Wake::new()?);
    Ok((
        LinkInbox {
            tx,
            wake: wake.clone(),
        },
        LinkQueue { rx, wake },
    ))
}

/// The IPv6 discard-only prefix (RFC 6666), `100::/64`: its first 64 bits.
const DISCARD_PREFIX: [u16; 4] = [0x0100, 0, 0, 0];

/// The peer address the node core is given for the packets of request `id`: `[100::id]:0`.
pub fn pseudo_peer(id: u64) -> SocketAddr {
    let [p0, p1, p2, p3] = DISCARD_PREFIX;
    let ip = Ipv6Addr::new(
        p0,
        p1,
        p2,
        p3,
        (id >> 48) as u16,
        (id >> 32) as u16,
        (id >> 16) as u16,
        id as u16,
    );
    SocketAddr::V6(SocketAddrV6::new(ip, 0, 0, 0))
}

/// The request number of a [`pseudo_peer`] address, or `None` for any other address (a real UDP peer).
pub fn request_of(addr: SocketAddr) -> Option<u64> {
    let SocketAddr::V6(a) = addr else {
        return None;
    };
    let s = a.ip().segments();
    if s[..4] != DISCARD_PREFIX || a.port() != 0 {
        return None;
    }
    Some(((s[4] as u64) << 48) | ((s[5] as u64) << 32) | ((s[6] as u64) << 16) | s[7] as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pseudo_peers_round_trip_and_real_peers_are_not_requests() {
        for id in [0, 1, 0xffff, 1 << 40, u64::MAX] {
            assert_eq!(request_of(pseudo_peer(id)), Some(id));
        }
        assert_eq!(pseudo_peer(5).to_string(), "[100::5]:0");
        for real in [
            "127.0.0.1:0",
            "[::1]:0",
            "[100::5]:7380",
            "[100:0:0:1::5]:0",
        ] {
            assert_eq!(request_of(real.parse().unwrap()), None, "{real}");
        }
    }

    #[test]
    fn full_queue_and_gone_loop_are_told_apart() {
        let (inbox, queue) = link_channel(1).unwrap();
        let request = || LinkRequest {
            peer: "127.0.0.1:1".parse().unwrap(),
            packets: Framed::default(),
            reply: oneshot::channel().0,
        };
        inbox.send(request()).unwrap();
        assert!(matches!(inbox.send(request()), Err(LinkRefused::Busy(_))));
        assert!(queue.try_recv().is_some());
        assert!(queue.try_recv().is_none());
        drop(queue);
        assert!(matches!(
            inbox.send(request()),
            Err(LinkRefused::Stopped(_))
        ));
    }
}
