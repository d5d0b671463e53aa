//! Many devices driven from one thread of a bench (`downlink`, `fleet`): one sans-IO [`Sender`] per device, a UDP
//! socket per device in flight (1024 unless the bench says), each carrying one device at a time, until each is idle.

// Each bench that includes this module uses a part of it.
#![allow(dead_code)]

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::Instant;

use pure_serve::proto::sender::{Sender, SenderEvent};

/// Devices in flight at once unless the bench says: one per socket.
pub const SOCKETS: usize = 1024;

/// A device the driver carries: its sender, and what it does with what the node tells it.
pub trait Driven {
    fn sender(&mut self) -> &mut Sender;
    /// An event of its sender (downlink records handed to its program, refusals, …).
    fn event(&mut self, _e: SenderEvent) {}
    /// A datagram of `bytes` it sent, and one it received (research/045 counts them).
    fn sent(&mut self, _bytes: usize) {}
    fn received(&mut self, _bytes: usize) {}
}

/// Drives `todo` to the node(s) — device `d`'s packets go to `link_of(d)` — each until its sender is idle (its
/// records stored, or its LISTEN answered with nothing more waiting and what it was handed acknowledged), at most
/// `in_flight` at once. Returns the devices done, in the order they finished, and, if `stop_at` came first, those
/// still in flight or not begun.
pub fn drive<D: Driven>(
    mut todo: Vec<D>,
    in_flight: usize,
    stop_at: Option<usize>,
    link_of: impl Fn(&D) -> SocketAddr,
) -> (Vec<D>, Vec<D>) {
    let total = todo.len();
    todo.reverse();
    // Not connected: the devices of one socket may go to different nodes of a fleet.
    let sockets: Vec<UdpSocket> = (0..in_flight.min(total.max(1)))
        .map(|_| {
            // Any address: a node in a namespace of its own is reached over a veth pair (research/045).
            let s = UdpSocket::bind("0.0.0.0:0").unwrap();
            s.set_nonblocking(true).unwrap();
            s
        })
        .collect();
    let mut slots: Vec<Option<D>> = (0..sockets.len()).map(|_| None).collect();
    let mut done = Vec::with_capacity(total);
    let mut buf = [0u8; 2048];
    let mut out = Vec::with_capacity(1500);
    let mut fds: Vec<libc::pollfd> = sockets
        .iter()
        .map(|s| libc::pollfd {
            fd: s.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let transmit = |d: &mut D, s: &UdpSocket, out: &mut Vec<u8>| {
        let now = Instant::now();
        let to = link_of(d);
        d.sender().handle_timeout(now);
        while d.sender().poll_transmit(now, out) {
            let _ = s.send_to(out, to);
            d.sent(out.len());
        }
    };
    while done.len() < total {
        if stop_at.is_some_and(|s| done.len() >= s) {
            break;
        }
        let now = Instant::now();
        for (k, slot) in slots.iter_mut().enumerate() {
            match slot {
                None => {
                    if let Some(mut d) = todo.pop() {
                        transmit(&mut d, &sockets[k], &mut out);
                        *slot = Some(d);
                    }
                }
                Some(d) => {
                    if d.sender().poll_timeout().is_some_and(|t| t <= now) {
                        transmit(d, &sockets[k], &mut out)
                    }
                }
            }
        }
        // SAFETY: a valid array of pollfds for the call's duration.
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 5) };
        for (k, fd) in fds.iter_mut().enumerate() {
            if fd.revents & libc::POLLIN == 0 {
                continue;
            }
            fd.revents = 0;
            while let Ok(n) = sockets[k].recv(&mut buf) {
                let Some(d) = &mut slots[k] else { continue };
                d.received(n);
                d.sender().handle_datagram(Instant::now(), &buf[..n]);
                while let Some(e) = d.sender().poll_event() {
                    d.event(e);
                }
                transmit(d, &sockets[k], &mut out);
                if d.sender().is_idle() {
                    done.push(slots[k].take().unwrap());
                }
            }
        }
    }
    let mut rest: Vec<D> = slots.into_iter().flatten().collect();
    todo.reverse();
    rest.extend(todo);
    (done, rest)
}
