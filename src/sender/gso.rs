//! A run of full datagrams in one system call: UDP GSO (`UDP_SEGMENT`, Linux ≥ 4.18). The kernel cuts one buffer
//! into datagrams of one size (the last may be shorter); on loopback a node whose socket has UDP GRO on takes the
//! whole run as one buffer too (`receive/batch.rs`). Each datagram costs `send` a system call and a pass through
//! the kernel's UDP and IP output otherwise, which was most of its CPU per record in bulk (research/033).
//!
//! Written here rather than taken from quinn-udp, which does the same for quinn: its socket state makes the socket
//! non-blocking and turns on GRO and packet-info control messages for its own receive path, where [`UdpLink`] is a
//! blocking driver that reads plain datagrams. What it needs is one `sendmsg` with one control message, and to stop
//! using GSO where the kernel, the route or the device refuses it (`EIO` where the device cannot checksum a GSO
//! buffer, `EINVAL` or `ENOPROTOOPT` on older kernels, `EMSGSIZE` on a route whose MTU is below the datagram size,
//! where a lone datagram would be fragmented), sending the same datagrams one by one instead.
//!
//! [`UdpLink`]: super::UdpLink

use std::io;
use std::net::UdpSocket;
use std::os::fd::AsRawFd;

/// UDP_SEGMENT (linux/udp.h).
const UDP_SEGMENT: libc::c_int = 103;
/// The most segments one GSO send may carry (UDP_MAX_SEGMENTS in linux/udp.h, 64 before 6.9).
const MAX_SEGMENTS: usize = 64;
/// The most bytes of UDP payload in one IPv4 datagram (65,535 less the IPv4 and UDP headers): a GSO buffer is
/// one datagram to the socket layer before it is cut.
const MAX_GSO_BYTES: usize = 65_507;

/// Datagrams waiting to go out in one GSO send: every one of `size` bytes but possibly the last.
pub(crate) struct Batch {
    buf: Vec<u8>,
    count: usize,
    size: usize,
    /// Whether GSO is used at all (off after the kernel refused it once).
    on: bool,
    /// Runs sent with GSO so far.
    pub(crate) runs: u64,
}

/// What [`Batch::send`] and [`send_one`] met: on `Stop`, a full send buffer or nobody listening (ICMP port
/// unreachable), the driver stops sending for this round and the RTO resends.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Sent {
    Go,
    Stop,
}

impl Batch {
    pub(crate) fn new(on: bool) -> Batch {
        Batch {
            buf: Vec::new(),
            count: 0,
            size: 0,
            on,
            runs: 0,
        }
    }

    pub(crate) fn is_on(&self) -> bool {
        self.on
    }

    /// Adds a datagram of `size` bytes, the full size. Returns true when the batch can take no more.
    pub(crate) fn push_full(&mut self, datagram: &[u8]) -> bool {
        if self.count == 0 {
            self.size = datagram.len();
            self.buf.clear();
        }
        debug_assert_eq!(datagram.len(), self.size);
        self.buf.extend_from_slice(datagram);
        self.count += 1;
        self.count >= MAX_SEGMENTS.min(MAX_GSO_BYTES / self.size.max(1))
    }

    /// Whether a datagram of `len` bytes can close the batch as its last segment (GSO's last may be shorter).
    pub(crate) fn takes_last(&self, len: usize) -> bool {
        self.count > 0 && len <= self.size && self.buf.len() + len <= MAX_GSO_BYTES
    }

    /// Adds the last datagram (shorter than the others, or as long).
    pub(crate) fn push_last(&mut self, datagram: &[u8]) {
        self.buf.extend_from_slice(datagram);
        self.count += 1;
    }

    /// Sends what the batch holds, and empties it.
    pub(crate) fn send(&mut self, socket: &UdpSocket) -> io::Result<Sent> {
        let count = std::mem::take(&mut self.count);
        if count == 0 {
            return Ok(Sent::Go);
        }
        if count > 1 && self.on {
            match send_segments(socket, &self.buf, self.size) {
                Ok(()) => {
                    self.runs += 1;
                    return Ok(Sent::Go);
                }
                Err(e) if gso_refused(&e) => {
                    tracing::debug!("UDP GSO refused ({e}): sending datagrams one by one");
                    self.on = false;
                }
                Err(e) => return stop_or_fail(e),
            }
        }
        for datagram in self.buf.chunks(self.size.max(1)) {
            if send_one(socket, datagram)? == Sent::Stop {
                return Ok(Sent::Stop);
            }
        }
        Ok(Sent::Go)
    }
}

/// Sends one datagram.
pub(crate) fn send_one(socket: &UdpSocket, datagram: &[u8]) -> io::Result<Sent> {
    match socket.send(datagram) {
        Ok(_) => Ok(Sent::Go),
        Err(e) => stop_or_fail(e),
    }
}

fn stop_or_fail(e: io::Error) -> io::Result<Sent> {
    if matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused | io::ErrorKind::WouldBlock
    ) {
        Ok(Sent::Stop)
    } else {
        Err(e)
    }
}

/// Errors that say this kernel, route or device does not do GSO (the datagrams themselves are fine): `EMSGSIZE`
/// where a segment is larger than the route's MTU (a GSO segment is never fragmented, where a lone datagram is).
fn gso_refused(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EIO | libc::EINVAL | libc::ENOPROTOOPT | libc::EOPNOTSUPP | libc::EMSGSIZE)
    )
}

/// One `sendmsg` of `buf` on the connected `socket`, cut by the kernel into datagrams of `size` bytes.
fn send_segments(socket: &UdpSocket, buf: &[u8], size: usize) -> io::Result<()> {
    let segment = u16::try_from(size).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let mut iov = libc::iovec {
        iov_base: buf.as_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // Room for one control message of a u16, aligned as `cmsghdr` needs.
    let mut control = [0u64; 4];
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<u16>() as u32) } as usize;
    debug_assert!(space <= std::mem::size_of_val(&control));
    // SAFETY: an all-zero msghdr is a valid empty one; the pointers set below outlive the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
    msg.msg_controllen = space as _;
    // SAFETY: msg_control points at `space` bytes aligned for cmsghdr, so the first header and its data are in it.
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_UDP;
        (*cmsg).cmsg_type = UDP_SEGMENT;
        (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<u16>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg) as *mut u16, segment);
    }
    loop {
        // SAFETY: a valid descriptor and a msghdr whose buffers live through the call.
        let n = unsafe { libc::sendmsg(socket.as_raw_fd(), &msg, 0) };
        if n >= 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}
