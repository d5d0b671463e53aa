//! Batched receive: many datagrams per system call (recvmmsg), coalesced datagrams where the kernel has UDP GRO, and
//! the kernel's own drop count for the socket (SO_RXQ_OVFL), counted as the drop stage `kernel`.
//!
//! Reading one datagram per `recvfrom` costs a system call per packet, which under a flood is most of what the
//! receive thread does (BRIEF.md: ~570k packets/s with plain send/receive here). `recvmmsg` fills up to [`SLOTS`]
//! buffers per call. With UDP GRO on (Linux ≥ 5.0), the kernel may hand over one buffer holding several datagrams of
//! one source, all of the size the kernel gives in a `UDP_GRO` control message but the last; quinn-udp does the same
//! (it sets `UDP_GRO` and sizes every buffer for the 64 segments the kernel may coalesce).
//!
//! The kernel's drops for the socket (its receive buffer full: the one drop the node cannot see otherwise) are read
//! once a round with `getsockopt(SO_MEMINFO)`, whose `SK_MEMINFO_DROPS` is the socket's drop counter (Linux ≥ 4.18).
//! SO_RXQ_OVFL reports the same counter, but as a control message on every datagram, which under a flood is work
//! on every datagram (research/011). Where SO_MEMINFO has no drop count, SO_RXQ_OVFL is used, and drops show with
//! the next datagram queued after them.

use std::io;
use std::mem::{self, MaybeUninit};
use std::net::SocketAddr;
use std::os::fd::RawFd;

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV4, SocketAddrV6};

/// SO_RXQ_OVFL on the Linux architectures we build for (x86-64, aarch64: asm-generic/socket.h); the libc crate does
/// not export it for them.
const SO_RXQ_OVFL: libc::c_int = 40;
/// SO_MEMINFO (asm-generic/socket.h, as SO_RXQ_OVFL) and the index of the drop count in what it returns
/// (SK_MEMINFO_DROPS in linux/sock_diag.h, the ninth of its u32s).
const SO_MEMINFO: libc::c_int = 55;
const SK_MEMINFO_DROPS: usize = 8;
/// UDP_GRO (linux/udp.h).
const UDP_GRO: libc::c_int = 104;
/// The most segments the kernel coalesces into one GRO buffer (UDP_GRO_CNT_MAX in net/ipv4/udp_offload.c).
const GRO_SEGMENTS: usize = 64;

/// Buffers filled per `recvmmsg` without GRO, each [`PLAIN_SLOT`] bytes (128 KiB in all).
pub const SLOTS: usize = 64;
/// A plain slot: larger than any datagram the node takes (1617 with a cookie), so a datagram is never cut; a
/// longer one is seen as longer than the node takes and dropped by the size check.
const PLAIN_SLOT: usize = 2048;
/// Buffers filled per call with GRO: each must hold 64 coalesced datagrams of up to 1,617 bytes; 64 KiB (the largest
/// UDP payload) does.
const GRO_SLOTS: usize = 16;
const GRO_SLOT: usize = 1 << 16;
/// Room for the control messages of one datagram: UDP_GRO (an int) and, without SO_MEMINFO, SO_RXQ_OVFL (a u32),
/// each in a cmsghdr.
const CTRL_LEN: usize = 64;

/// One datagram read: where it came from and where its bytes are in the receiver's buffer.
#[derive(Debug, Clone, Copy)]
pub struct Segment {
    pub from: SocketAddr,
    start: usize,
    len: usize,
}

/// The receiver's buffers and what the kernel said.
pub struct BatchReceiver {
    fd: RawFd,
    gro: bool,
    slot_len: usize,
    slots: usize,
    buf: Vec<u8>,
    names: Vec<MaybeUninit<libc::sockaddr_storage>>,
    /// u64 so each control buffer is aligned for cmsghdr.
    ctrls: Vec<[u64; CTRL_LEN / 8]>,
    /// The system call's vectors, kept so a call allocates nothing; their pointers are set anew each call.
    iovs: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
    /// The kernel's drop count for the socket as last read: from SO_MEMINFO, or from the last message that carried
    /// it (SO_RXQ_OVFL).
    last_drops: Option<u32>,
    /// Whether drops are read with SO_MEMINFO (else they come with the datagrams, SO_RXQ_OVFL).
    meminfo: bool,
    /// Datagrams the kernel dropped because the socket buffer was full, since this receiver started.
    kernel_drops: u64,
}

/// The socket's drop counter, if the kernel gives it through SO_MEMINFO.
fn meminfo_drops(fd: RawFd) -> Option<u32> {
    let mut info = [0u32; 16];
    let mut len = mem::size_of_val(&info) as libc::socklen_t;
    // SAFETY: a valid fd, and a buffer of `len` bytes the kernel fills (it says how much it wrote in `len`).
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            SO_MEMINFO,
            info.as_mut_ptr().cast(),
            &mut len,
        )
    };
    (r == 0 && len as usize >= (SK_MEMINFO_DROPS + 1) * mem::size_of::<u32>())
        .then_some(info[SK_MEMINFO_DROPS])
}

// SAFETY: the raw pointers in `iovs` and `hdrs` point into buffers the receiver owns; they are written anew at the
// start of every call and not used outside one, so moving the receiver to another thread moves all they refer to.
unsafe impl Send for BatchReceiver {}

/// Sets an int socket option; whether the kernel took it.
fn set_int(fd: RawFd, level: libc::c_int, name: libc::c_int, value: libc::c_int) -> bool {
    // SAFETY: a valid fd and a pointer to a c_int of the size passed.
    unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&value as *const libc::c_int).cast(),
            mem::size_of::<libc::c_int>() as libc::socklen_t,
        ) == 0
    }
}

impl BatchReceiver {
    /// Sets up receiving on `fd` (a bound, non-blocking UDP socket): the kernel's drop count (SO_MEMINFO, else
    /// SO_RXQ_OVFL), and UDP GRO if `gro` and the kernel has it.
    pub fn new(fd: RawFd, gro: bool) -> Self {
        let at_start = meminfo_drops(fd);
        let meminfo = at_start.is_some();
        if !meminfo && !set_int(fd, libc::SOL_SOCKET, SO_RXQ_OVFL, 1) {
            tracing::debug!(
                "neither SO_MEMINFO nor SO_RXQ_OVFL available: kernel drops are not counted"
            );
        }
        let gro = gro && set_int(fd, libc::SOL_UDP, UDP_GRO, 1);
        let (slots, slot_len) = if gro {
            (GRO_SLOTS, GRO_SLOT)
        } else {
            (SLOTS, PLAIN_SLOT)
        };
        const { assert!(GRO_SLOT >= GRO_SEGMENTS * 1024) };
        BatchReceiver {
            fd,
            gro,
            slot_len,
            slots,
            buf: vec![0; slots * slot_len],
            names: vec![MaybeUninit::uninit(); slots],
            ctrls: vec![[0; CTRL_LEN / 8]; slots],
            iovs: Vec::with_capacity(slots),
            hdrs: Vec::with_capacity(slots),
            last_drops: at_start,
            meminfo,
            kernel_drops: 0,
        }
    }

    /// Datagrams the kernel dropped because the socket buffer was full, since this receiver started (read now, with
    /// SO_MEMINFO; with SO_RXQ_OVFL as of the last datagram read).
    pub fn kernel_drops(&mut self) -> u64 {
        if self.meminfo
            && let Some(now) = meminfo_drops(self.fd)
        {
            self.add_drops(now);
        }
        self.kernel_drops
    }

    fn add_drops(&mut self, count: u32) {
        let before = self.last_drops.unwrap_or(0);
        self.kernel_drops += u64::from(count.wrapping_sub(before));
        self.last_drops = Some(count);
    }

    /// Whether the kernel coalesces datagrams for this socket.
    pub fn gro(&self) -> bool {
        self.gro
    }

    /// The bytes of a segment read by the last [`BatchReceiver::recv`] (the next call reuses the buffers).
    pub fn data(&self, s: &Segment) -> &[u8] {
        &self.buf[s.start..s.start + s.len]
    }

    /// One `recvmmsg` without waiting: appends the datagrams read to `out` (a GRO buffer gives several). Returns
    /// how many messages the kernel gave (0: nothing was waiting).
    pub fn recv(&mut self, out: &mut Vec<Segment>) -> io::Result<usize> {
        let mut iovs = std::mem::take(&mut self.iovs);
        let mut hdrs = std::mem::take(&mut self.hdrs);
        iovs.clear();
        hdrs.clear();
        let base = self.buf.as_mut_ptr();
        for i in 0..self.slots {
            iovs.push(libc::iovec {
                // SAFETY: i * slot_len + slot_len <= buf.len(), so the slot is inside the buffer.
                iov_base: unsafe { base.add(i * self.slot_len) }.cast(),
                iov_len: self.slot_len,
            });
        }
        for n in &mut self.names {
            *n = MaybeUninit::zeroed();
        }
        for ((name, iov), ctrl) in self.names.iter_mut().zip(&mut iovs).zip(&mut self.ctrls) {
            // SAFETY: mmsghdr is plain old data; all-zero is a valid (empty) value.
            let mut h: libc::mmsghdr = unsafe { mem::zeroed() };
            h.msg_hdr.msg_name = name.as_mut_ptr().cast();
            h.msg_hdr.msg_namelen = mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            h.msg_hdr.msg_iov = iov;
            h.msg_hdr.msg_iovlen = 1;
            h.msg_hdr.msg_control = ctrl.as_mut_ptr().cast();
            h.msg_hdr.msg_controllen = CTRL_LEN as _;
            hdrs.push(h);
        }
        let result = self.call(&mut hdrs, out);
        self.iovs = iovs;
        self.hdrs = hdrs;
        result
    }

    fn call(&mut self, hdrs: &mut [libc::mmsghdr], out: &mut Vec<Segment>) -> io::Result<usize> {
        let n = loop {
            // SAFETY: every header points into buffers owned by self (or the iovs), alive for the call.
            let n = unsafe {
                libc::recvmmsg(
                    self.fd,
                    hdrs.as_mut_ptr(),
                    self.slots as libc::c_uint,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                )
            };
            if n >= 0 {
                break n as usize;
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock => return Ok(0),
                // ICMP errors from earlier sends surface here on some systems; they are not fatal.
                io::ErrorKind::ConnectionRefused => continue,
                _ => return Err(e),
            }
        };
        for (i, h) in hdrs.iter().enumerate().take(n) {
            let len = h.msg_len as usize;
            let stride = self.control(&h.msg_hdr).unwrap_or(len);
            // SAFETY: the kernel wrote the source's sockaddr into names[i] (zeroed first, so it is initialised).
            let Some(from) = decode_addr(unsafe { self.names[i].assume_init_ref() }) else {
                continue;
            };
            // A datagram cut to the slot (MSG_TRUNC) keeps its cut length; it is longer than any the node takes
            // only if it was cut, and then the size check drops it. A GRO buffer is whole by construction.
            let start = i * self.slot_len;
            let stride = stride.max(1);
            let mut at = 0;
            while at < len {
                let seg = stride.min(len - at);
                out.push(Segment {
                    from,
                    start: start + at,
                    len: seg,
                });
                at += seg;
            }
            if len == 0 {
                // An empty datagram is still a datagram (dropped by the size check).
                out.push(Segment {
                    from,
                    start,
                    len: 0,
                });
            }
        }
        Ok(n)
    }

    /// Reads a message's control data: the kernel's drop count (added to `kernel_drops`) and the GRO stride.
    fn control(&mut self, h: &libc::msghdr) -> Option<usize> {
        let mut stride = None;
        // SAFETY: the header's control buffer and length are what the kernel filled in; CMSG_* walk within them.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(h);
            while !c.is_null() {
                let level = (*c).cmsg_level;
                let kind = (*c).cmsg_type;
                let data = libc::CMSG_DATA(c);
                if level == libc::SOL_SOCKET && kind == SO_RXQ_OVFL {
                    let count = std::ptr::read_unaligned(data.cast::<u32>());
                    self.add_drops(count);
                } else if level == libc::SOL_UDP && kind == UDP_GRO {
                    let s = std::ptr::read_unaligned(data.cast::<libc::c_int>());
                    if s > 0 {
                        stride = Some(s as usize);
                    }
                }
                c = libc::CMSG_NXTHDR(h, c);
            }
        }
        stride
    }
}

/// Datagrams sent per `sendmmsg`.
const SEND_BATCH: usize = 64;

/// Sends node packets with as few system calls as it can (sendmmsg, up to [`SEND_BATCH`] a call). A datagram the
/// kernel will not take (a full send buffer, an unreachable peer) is lost, as any datagram may be: the sender's
/// resend earns another answer.
pub fn send_all(socket: &std::net::UdpSocket, out: &[crate::proto::node::Transmit]) {
    use std::os::fd::AsRawFd;
    // A dual-stack socket (`--bind ::`) takes its IPv4 peers' addresses as `::ffff:a.b.c.d`.
    let v6 = socket.local_addr().is_ok_and(|a| a.is_ipv6());
    for chunk in out.chunks(SEND_BATCH) {
        let names: Vec<socket2::SockAddr> = chunk
            .iter()
            .map(|t| crate::common::listen::for_socket(t.to, v6).into())
            .collect();
        let mut iovs: Vec<libc::iovec> = chunk
            .iter()
            .map(|t| libc::iovec {
                iov_base: t.bytes.as_ptr() as *mut libc::c_void,
                iov_len: t.bytes.len(),
            })
            .collect();
        let mut hdrs: Vec<libc::mmsghdr> = iovs
            .iter_mut()
            .zip(&names)
            .map(|(iov, name)| {
                // SAFETY: mmsghdr is plain old data; all-zero is a valid (empty) value.
                let mut h: libc::mmsghdr = unsafe { mem::zeroed() };
                h.msg_hdr.msg_name = name.as_ptr() as *mut libc::c_void;
                h.msg_hdr.msg_namelen = name.len();
                h.msg_hdr.msg_iov = iov;
                h.msg_hdr.msg_iovlen = 1;
                h
            })
            .collect();
        let mut at = 0;
        while at < hdrs.len() {
            // SAFETY: the headers point at names, iovecs and packet bytes alive for the call.
            let n = unsafe {
                libc::sendmmsg(
                    socket.as_raw_fd(),
                    hdrs[at..].as_mut_ptr(),
                    (hdrs.len() - at) as libc::c_uint,
                    libc::MSG_DONTWAIT,
                )
            };
            if n > 0 {
                at += n as usize;
                continue;
            }
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            // The first datagram of the rest failed: it is lost (logged at debug); go on with the others.
            tracing::debug!("datagram to {} not sent: {e}", chunk[at].to);
            at += 1;
        }
    }
}

/// The source address the kernel wrote (IPv4 or IPv6; nothing else comes to a UDP socket).
fn decode_addr(name: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match libc::c_int::from(name.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family is AF_INET, so the storage holds a sockaddr_in.
            let a =
                unsafe { &*(name as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)),
                u16::from_be(a.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: the family is AF_INET6, so the storage holds a sockaddr_in6.
            let a =
                unsafe { &*(name as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            // An IPv4 peer of a dual-stack socket (`--bind ::`) is the IPv4 address it is.
            Some(crate::common::listen::canonical(SocketAddr::V6(
                SocketAddrV6::new(
                    Ipv6Addr::from(a.sin6_addr.s6_addr),
                    u16::from_be(a.sin6_port),
                    a.sin6_flowinfo,
                    a.sin6_scope_id,
                ),
            )))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;
    use std::os::fd::AsRawFd;

    #[test]
    fn reads_many_datagrams_per_call_with_their_sources() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        rx.set_nonblocking(true).unwrap();
        let a = UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = UdpSocket::bind("127.0.0.1:0").unwrap();
        for i in 0..100u8 {
            let s = if i % 2 == 0 { &a } else { &b };
            s.send_to(&vec![i; 100 + i as usize], rx.local_addr().unwrap())
                .unwrap();
        }
        let mut r = BatchReceiver::new(rx.as_raw_fd(), true);
        let mut got = Vec::new();
        let mut seen = 0;
        let mut calls = 0;
        while seen < 100 {
            got.clear();
            let n = r.recv(&mut got).unwrap();
            assert!(n > 0, "all 100 were sent before");
            calls += 1;
            // A segment's bytes are good until the next call.
            for s in &got {
                let i = seen;
                let d = r.data(s);
                assert_eq!(d.len(), 100 + i, "datagram {i} whole");
                assert!(d.iter().all(|&x| x == i as u8));
                let want = if i % 2 == 0 { &a } else { &b };
                assert_eq!(s.from, want.local_addr().unwrap());
                seen += 1;
            }
        }
        assert!(calls < 100, "{calls} calls for 100 datagrams");
        assert_eq!(r.recv(&mut got).unwrap(), 0, "nothing more waiting");
        assert_eq!(r.kernel_drops, 0);
    }

    /// A sender that segments with GSO (UDP_SEGMENT): on loopback a GRO socket may get one buffer of 10 datagrams;
    /// either way they come out as 10 datagrams of their own size.
    #[test]
    fn coalesced_datagrams_come_out_one_by_one() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        rx.set_nonblocking(true).unwrap();
        let mut r = BatchReceiver::new(rx.as_raw_fd(), true);
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        const UDP_SEGMENT: libc::c_int = 103;
        if !set_int(tx.as_raw_fd(), libc::SOL_UDP, UDP_SEGMENT, 100) {
            return; // no GSO in this kernel: nothing to coalesce
        }
        let payload: Vec<u8> = (0..1000u32).map(|i| (i / 100) as u8).collect();
        tx.send_to(&payload, rx.local_addr().unwrap()).unwrap();
        let mut got = Vec::new();
        let mut datagrams = Vec::new();
        for _ in 0..100 {
            got.clear();
            r.recv(&mut got).unwrap();
            datagrams.extend(got.iter().map(|s| r.data(s).to_vec()));
            if datagrams.len() >= 10 {
                break;
            }
        }
        assert_eq!(datagrams.len(), 10, "gro {}", r.gro());
        for (k, d) in datagrams.iter().enumerate() {
            assert_eq!(d, &vec![k as u8; 100]);
        }
    }

    #[test]
    fn sends_many_datagrams_to_many_peers() {
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let peers: Vec<UdpSocket> = (0..3)
            .map(|_| UdpSocket::bind("127.0.0.1:0").unwrap())
            .collect();
        let out: Vec<crate::proto::node::Transmit> = (0..150u8)
            .map(|i| crate::proto::node::Transmit {
                to: peers[i as usize % 3].local_addr().unwrap(),
                bytes: vec![i; 37],
            })
            .collect();
        send_all(&tx, &out);
        let mut buf = [0u8; 64];
        for (k, p) in peers.iter().enumerate() {
            for i in (k..150).step_by(3) {
                let n = p.recv(&mut buf).unwrap();
                assert_eq!(&buf[..n], &[i as u8; 37][..]);
            }
        }
    }

    /// A socket with a 4 KiB receive buffer, read through a receiver that `setup` may change first, sent 500
    /// datagrams of 1000 bytes at once: returns the receiver, the socket and how many datagrams it kept.
    fn overflowed(
        setup: impl FnOnce(&mut BatchReceiver, RawFd),
    ) -> (BatchReceiver, UdpSocket, usize) {
        let rx = socket2::Socket::new(
            socket2::Domain::IPV4,
            socket2::Type::DGRAM,
            Some(socket2::Protocol::UDP),
        )
        .unwrap();
        rx.set_recv_buffer_size(4096).unwrap();
        rx.bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into())
            .unwrap();
        rx.set_nonblocking(true).unwrap();
        let rx: UdpSocket = rx.into();
        let mut r = BatchReceiver::new(rx.as_raw_fd(), false);
        setup(&mut r, rx.as_raw_fd());
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        for _ in 0..500 {
            tx.send_to(&[7; 1000], rx.local_addr().unwrap()).unwrap();
        }
        let mut got = Vec::new();
        while r.recv(&mut got).unwrap() > 0 {}
        let kept = got.len();
        assert!(kept < 500, "a 4 KiB buffer cannot hold 500 datagrams");
        (r, rx, kept)
    }

    #[test]
    fn counts_what_the_kernel_dropped_on_a_full_buffer() {
        let (mut r, _rx, kept) = overflowed(|_, _| {});
        assert!(r.meminfo, "this kernel gives drops through SO_MEMINFO");
        assert_eq!(r.kernel_drops() as usize, 500 - kept);
        // Counted once: reading again adds nothing.
        assert_eq!(r.kernel_drops() as usize, 500 - kept);
    }

    /// The fallback, for kernels without SO_MEMINFO's drop count: the kernel stamps each datagram with the drops
    /// counted when it was queued, so the drops after the last one read show with the next.
    #[test]
    fn counts_kernel_drops_from_the_datagrams_without_meminfo() {
        let (mut r, rx, kept) = overflowed(|r, fd| {
            // As on such a kernel: SO_RXQ_OVFL on, drops read from the datagrams.
            r.meminfo = false;
            r.last_drops = None;
            assert!(set_int(fd, libc::SOL_SOCKET, SO_RXQ_OVFL, 1));
        });
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        tx.send_to(&[8; 10], rx.local_addr().unwrap()).unwrap();
        let mut got = Vec::new();
        while r.recv(&mut got).unwrap() > 0 {}
        assert_eq!(got.len(), 1);
        assert_eq!(r.kernel_drops() as usize, 500 - kept);
    }
}
