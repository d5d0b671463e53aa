//! Where the node listens when it is told "every address" (`--bind ::`, the default): one dual-stack socket per
//! port, taking IPv6 and IPv4 alike (IPv4 peers arrive as `::ffff:a.b.c.d`, which [`canonical`] turns back into
//! the IPv4 address everything above the socket knows), or IPv4 alone on a host without IPv6. It lives below the
//! receive loop, the HTTP server and `check`, which all bind with it.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use socket2::{Domain, Protocol, Socket, Type};

/// `--bind`'s default: every address, IPv6 and IPv4.
pub const EVERY_ADDRESS: IpAddr = IpAddr::V6(Ipv6Addr::UNSPECIFIED);

/// The address to bind for `--bind ip`: `::` stays `::` where the host has IPv6, else becomes `0.0.0.0` (a kernel
/// booted with `ipv6.disable=1` makes no IPv6 socket); any other address is kept as given.
pub fn effective(ip: IpAddr) -> IpAddr {
    if ip == EVERY_ADDRESS && Socket::new(Domain::IPV6, Type::DGRAM, None).is_err() {
        return IpAddr::V4(Ipv4Addr::UNSPECIFIED);
    }
    ip
}

/// A socket of `kind` for `addr`, dual-stack when `addr` is `::` (whatever `net.ipv6.bindv6only` says), not yet
/// bound.
pub fn socket(addr: SocketAddr, kind: Type, protocol: Protocol) -> std::io::Result<Socket> {
    let socket = Socket::new(Domain::for_address(addr), kind, Some(protocol))?;
    if addr.ip() == EVERY_ADDRESS {
        socket.set_only_v6(false)?;
    }
    Ok(socket)
}

/// A TCP listener on `addr` (dual-stack for `::`), with `SO_REUSEADDR` as the standard library's own.
pub fn tcp_listener(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let socket = socket(addr, Type::STREAM, Protocol::TCP)?;
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    Ok(socket.into())
}

/// A UDP socket bound to `addr` (dual-stack for `::`).
pub fn udp_socket(addr: SocketAddr) -> std::io::Result<std::net::UdpSocket> {
    let socket = socket(addr, Type::DGRAM, Protocol::UDP)?;
    socket.bind(&addr.into())?;
    Ok(socket.into())
}

/// An IPv4 peer of a dual-stack socket as the IPv4 address it is (`::ffff:a.b.c.d` → `a.b.c.d`); others as they are.
pub fn canonical(addr: SocketAddr) -> SocketAddr {
    match addr {
        SocketAddr::V6(a) => match a.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(IpAddr::V4(v4), a.port()),
            None => addr,
        },
        v4 => v4,
    }
}

/// Where to send to `to` from a socket of the family `v6`: an IPv4 peer through a dual-stack socket is written as
/// `::ffff:a.b.c.d` (an IPv6 socket takes no IPv4 address).
pub fn for_socket(to: SocketAddr, v6: bool) -> SocketAddr {
    match to {
        SocketAddr::V4(a) if v6 => SocketAddr::new(IpAddr::V6(a.ip().to_ipv6_mapped()), a.port()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An IPv4 client reaches a socket on `::`, which sees it as the IPv4 address it is, and answers it there; an
    /// IPv6 client too.
    #[test]
    fn a_socket_on_every_address_takes_ipv4_and_ipv6() {
        let ip = effective(EVERY_ADDRESS);
        if ip != EVERY_ADDRESS {
            eprintln!("skipped: this host has no IPv6");
            return;
        }
        let server = udp_socket(SocketAddr::new(ip, 0)).unwrap();
        let port = server.local_addr().unwrap().port();
        for client_ip in [
            IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(Ipv6Addr::LOCALHOST),
        ] {
            let client = std::net::UdpSocket::bind(SocketAddr::new(client_ip, 0)).unwrap();
            client
                .send_to(b"hi", SocketAddr::new(client_ip, port))
                .unwrap();
            let mut buf = [0u8; 8];
            let (n, from) = server.recv_from(&mut buf).unwrap();
            assert_eq!(&buf[..n], b"hi");
            let from = canonical(from);
            assert_eq!(from, client.local_addr().unwrap());
            server.send_to(b"ok", for_socket(from, true)).unwrap();
            let (n, _) = client.recv_from(&mut buf).unwrap();
            assert_eq!(&buf[..n], b"ok");
        }
    }

    #[test]
    fn mapped_addresses_are_ipv4_and_back() {
        let v4: SocketAddr = "10.1.2.3:7380".parse().unwrap();
        let mapped = for_socket(v4, true);
        assert_eq!(mapped, "[::ffff:10.1.2.3]:7380".parse().unwrap());
        assert_eq!(canonical(mapped), v4);
        assert_eq!(for_socket(v4, false), v4);
        let v6: SocketAddr = "[2001:db8::1]:7380".parse().unwrap();
        assert_eq!(canonical(v6), v6);
        assert_eq!(for_socket(v6, true), v6);
    }
}
