//! Who may hold the server's connections: per source address, per source prefix and in total, with room kept for
//! sources that hold few (issue 14, item 4). Sans-IO: time comes in as
//! `now`, and the accept loop asks before it spends anything on a connection.
//!
//! One address could hold every connection of a server bounded only in total (256 idle, partial-header or
//! stalled-TLS connections lock the port for everyone until their 10 s run out, and reopened they keep it locked).
//! So a connection is admitted only if
//!
//! - its **source** holds fewer than [`ConnectionLimits::per_source`] (a source is an IPv4 address, or the /64 of
//!   an IPv6 one: a host picks any address of its /64 at will, SLAAC privacy addresses do so by design),
//! - its **prefix** (the /24 or /56 of [`crate::proto::admission::Prefix`], the X25519 budget's) holds fewer than
//!   [`ConnectionLimits::per_prefix`] (an attacker with one customer network has a /56 of IPv6 or a few IPv4
//!   addresses; /56 is what ISPs delegate to a customer),
//! - fewer than [`ConnectionLimits::total`] are open, and, when its prefix already holds
//!   [`QUIET_PREFIX_CONNECTIONS`] or more, fewer than `total − reserved`: the last
//!   [`ConnectionLimits::reserved`] are kept for prefixes that hold almost none, so a flood from a few prefixes,
//!   each at its cap, still leaves a new source room.
//!
//! State is bounded: the table has an entry per source and prefix holding a connection (at most `total` of each).

use std::collections::HashMap;
use std::net::IpAddr;

use crate::proto::admission::Prefix;

/// A prefix holding fewer connections than this is *quiet* and may take the reserved share of the total: one
/// client's two (a wire outlet keeps two requests on their way, docs/protocol.md 10).
pub const QUIET_PREFIX_CONNECTIONS: usize = 2;
/// Most prefixes whose handshake buckets are remembered at once (~40 B each); beyond it new prefixes share one
/// bucket of a prefix's size, so a flood from more prefixes than this gets one prefix's share between them.
pub const MAX_HANDSHAKE_PREFIXES: usize = 4096;
/// Why a connection was refused: the label of `pure_http_refused_total{reason}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The source (an IPv4 address, an IPv6 /64) held its most.
    PerSource = 0,
    /// The source's prefix (/24, /56) held its most.
    PerPrefix = 1,
    /// The prefix is not quiet and only the reserved share of the total was left.
    Reserved = 2,
    /// Every connection of the total was open.
    Total = 3,
}

impl Refused {
    pub const ALL: [Refused; 4] = [
        Refused::PerSource,
        Refused::PerPrefix,
        Refused::Reserved,
        Refused::Total,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Refused::PerSource => "per_source",
            Refused::PerPrefix => "per_prefix",
            Refused::Reserved => "reserved",
            Refused::Total => "total",
        }
    }

    /// What a refused client is told, in the body of a 503.
    pub fn why(self) -> &'static str {
        match self {
            Refused::PerSource => "too many connections from your address",
            Refused::PerPrefix => "too many connections from your network",
            Refused::Reserved | Refused::Total => "too many connections",
        }
    }
}

/// The bounds on connections open at once. [`Default`] is the node's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// In all. 256 kept-alive connections cost about 256 × 16 KiB of buffers at worst.
    pub total: usize,
    /// From one source: an IPv4 address or an IPv6 /64. A node's wire outlets keep two each; 32 leaves room for
    /// a host with many, or a few devices behind one NAT address.
    pub per_source: usize,
    /// From one prefix: /24 or /56. A quarter of the total: one network at its most leaves three quarters.
    pub per_prefix: usize,
    /// The last of the total, taken only by prefixes holding fewer than [`QUIET_PREFIX_CONNECTIONS`].
    pub reserved: usize,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            total: 256,
            per_source: 32,
            per_prefix: 64,
            reserved: 64,
        }
    }
}

impl ConnectionLimits {
    /// The limits made consistent: at least one connection in all, a source's most within its prefix's and a
    /// prefix's within the total, and a reserve that leaves loud prefixes at least one.
    fn normalized(self) -> Self {
        let total = self.total.max(1);
        let per_prefix = self.per_prefix.clamp(1, total);
        ConnectionLimits {
            total,
            per_prefix,
            per_source: self.per_source.clamp(1, per_prefix),
            reserved: self.reserved.min(total - 1),
        }
    }
}

/// A source: an IPv4 address (also IPv4-mapped IPv6), or the /64 of an IPv6 address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    V4([u8; 4]),
    V6([u8; 8]),
}

impl Source {
    pub fn of(ip: IpAddr) -> Source {
        match ip.to_canonical() {
            IpAddr::V4(a) => Source::V4(a.octets()),
            IpAddr::V6(a) => {
                let o = a.octets();
                Source::V6([o[0], o[1], o[2], o[3], o[4], o[5], o[6], o[7]])
            }
        }
    }
}

/// What an admitted connection holds; give it back with [`ConnectionTable::release`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket {
    source: Source,
    prefix: Prefix,
}

/// The connections open now, by source and prefix (module docs).
#[derive(Debug)]
pub struct ConnectionTable {
    limits: ConnectionLimits,
    open: usize,
    sources: HashMap<Source, usize>,
    prefixes: HashMap<Prefix, usize>,
}

impl ConnectionTable {
    pub fn new(limits: ConnectionLimits) -> Self {
        ConnectionTable {
            limits: limits.normalized(),
            open: 0,
            sources: HashMap::new(),
            prefixes: HashMap::new(),
        }
    }

    pub fn open(&self) -> usize {
        self.open
    }

    pub fn limits(&self) -> ConnectionLimits {
        self.limits
    }

    /// Admits a connection from `ip`, or says why not. The source's own bounds are asked first, so a refusal
    /// names the source's excess when there is one, not the total it helped fill.
    pub fn admit(&mut self, ip: IpAddr) -> Result<Ticket, Refused> {
        let l = self.limits;
        let source = Source::of(ip);
        let prefix = Prefix::of(ip);
        let from_source = self.sources.get(&source).copied().unwrap_or(0);
        if from_source >= l.per_source {
            return Err(Refused::PerSource);
        }
        let from_prefix = self.prefixes.get(&prefix).copied().unwrap_or(0);
        if from_prefix >= l.per_prefix {
            return Err(Refused::PerPrefix);
        }
        if self.open >= l.total {
            return Err(Refused::Total);
        }
        if from_prefix >= QUIET_PREFIX_CONNECTIONS && self.open >= l.total - l.reserved {
            return Err(Refused::Reserved);
        }
        self.open += 1;
        *self.sources.entry(source).or_default() += 1;
        *self.prefixes.entry(prefix).or_default() += 1;
        Ok(Ticket { source, prefix })
    }

    /// The connection of `ticket` closed.
    pub fn release(&mut self, ticket: Ticket) {
        fn down<K: std::hash::Hash + Eq>(map: &mut HashMap<K, usize>, key: K) {
            if let Some(n) = map.get_mut(&key) {
                *n -= 1;
                if *n == 0 {
                    map.remove(&key);
                }
            }
        }
        self.open = self.open.saturating_sub(1);
        down(&mut self.sources, ticket.source);
        down(&mut self.prefixes, ticket.prefix);
    }

    /// Sources and prefixes with a connection open (each at most `total`).
    pub fn entries(&self) -> (usize, usize) {
        (self.sources.len(), self.prefixes.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn small() -> ConnectionLimits {
        ConnectionLimits {
            total: 16,
            per_source: 4,
            per_prefix: 6,
            reserved: 4,
        }
    }

    #[test]
    fn a_source_holds_its_most_and_another_source_still_gets_in() {
        let mut t = ConnectionTable::new(small());
        let held: Vec<Ticket> = (0..4).map(|_| t.admit(ip("192.0.2.1")).unwrap()).collect();
        assert_eq!(t.admit(ip("192.0.2.1")), Err(Refused::PerSource));
        assert!(t.admit(ip("192.0.2.2")).is_ok());
        // One closes: the source may open one again.
        t.release(held[0]);
        assert!(t.admit(ip("192.0.2.1")).is_ok());
        assert_eq!(t.admit(ip("192.0.2.1")), Err(Refused::PerSource));
    }

    #[test]
    fn a_prefix_holds_its_most_and_another_prefix_still_gets_in() {
        let mut t = ConnectionTable::new(small());
        for host in 1..=6 {
            t.admit(ip(&format!("192.0.2.{host}"))).unwrap();
        }
        assert_eq!(t.admit(ip("192.0.2.200")), Err(Refused::PerPrefix));
        assert!(t.admit(ip("192.0.3.1")).is_ok());
    }

    #[test]
    fn the_reserve_is_kept_for_quiet_prefixes() {
        let mut t = ConnectionTable::new(small());
        // Two loud prefixes take what is not reserved: 16 − 4 = 12.
        for net in [2, 3] {
            for host in 1..=6 {
                t.admit(ip(&format!("192.0.{net}.{host}"))).unwrap();
            }
        }
        assert_eq!(t.open(), 12);
        // A third loud prefix gets its first two (quiet until it holds two), then only the reserve is left.
        t.admit(ip("192.0.4.1")).unwrap();
        t.admit(ip("192.0.4.2")).unwrap();
        assert_eq!(t.admit(ip("192.0.4.3")), Err(Refused::Reserved));
        // Quiet prefixes take the rest.
        t.admit(ip("192.0.5.1")).unwrap();
        t.admit(ip("192.0.6.1")).unwrap();
        assert_eq!(t.open(), 16);
        assert_eq!(t.admit(ip("192.0.7.1")), Err(Refused::Total));
    }

    #[test]
    fn ipv6_sources_are_slash_64_and_prefixes_slash_56_and_mapped_v4_is_v4() {
        let mut t = ConnectionTable::new(ConnectionLimits {
            total: 100,
            per_source: 2,
            per_prefix: 3,
            reserved: 0,
        });
        t.admit(ip("2001:db8:0:1::1")).unwrap();
        t.admit(ip("2001:db8:0:1::ffff")).unwrap();
        assert_eq!(t.admit(ip("2001:db8:0:1:abcd::9")), Err(Refused::PerSource));
        // Another /64 of the same /56: a source of its own, the prefix's third.
        t.admit(ip("2001:db8:0:2::1")).unwrap();
        assert_eq!(t.admit(ip("2001:db8:0:3::1")), Err(Refused::PerPrefix));
        assert!(t.admit(ip("2001:db8:0:100::1")).is_ok(), "another /56");
        t.admit(ip("192.0.2.1")).unwrap();
        t.admit(ip("::ffff:192.0.2.1")).unwrap();
        assert_eq!(t.admit(ip("192.0.2.1")), Err(Refused::PerSource));
    }

    #[test]
    fn released_connections_leave_no_entries() {
        let mut t = ConnectionTable::new(ConnectionLimits::default());
        let tickets: Vec<Ticket> = (0..200)
            .map(|i| t.admit(ip(&format!("10.{}.{}.1", i / 8, i % 8))).unwrap())
            .collect();
        assert_eq!(t.open(), 200);
        for k in tickets {
            t.release(k);
        }
        assert_eq!((t.open(), t.entries()), (0, (0, 0)));
    }

    #[test]
    fn limits_are_made_consistent() {
        let l = ConnectionTable::new(ConnectionLimits {
            total: 4,
            per_source: 32,
            per_prefix: 64,
            reserved: 64,
        })
        .limits();
        assert_eq!(
            (l.total, l.per_prefix, l.per_source, l.reserved),
            (4, 4, 4, 3)
        );
    }
}
