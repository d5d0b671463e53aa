//! Who may hold the server's connections, and how many TLS handshakes it does: per source address, per source
//! prefix and in total, with room kept for sources that hold few (issue 14, item 4). Sans-IO: time comes in as
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
//! A TLS handshake costs the server a key exchange and a signature on its one thread (research/015), so new TLS
//! connections are also bounded in rate: [`HandshakeBudget`], a token bucket in total and one per prefix of an
//! eighth of it; a prefix that asks for more than [`QUIET_HANDSHAKES_PER_PREFIX`] a second takes the total's
//! tokens only while the total is more than half full, so the lower half serves prefixes that handshake rarely (as
//! the COOKIEs' total does, docs/protocol.md 6.1). A handshake is refused before the server reads its ClientHello
//! (it has peeked at the first byte, which says TLS): the connection is closed.
//!
//! State is bounded: the connection table has an entry per source and prefix holding a connection (at most
//! `total` of each); the handshake table at most [`MAX_HANDSHAKE_PREFIXES`] prefixes, forgotten when their bucket
//! is full again.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use crate::proto::admission::Prefix;

/// A prefix holding fewer connections than this is *quiet* and may take the reserved share of the total: one
/// client's two (a wire outlet keeps two requests on their way, docs/protocol.md 10).
pub const QUIET_PREFIX_CONNECTIONS: usize = 2;
/// Most prefixes whose handshake buckets are remembered at once (~40 B each); beyond it new prefixes share one
/// bucket of a prefix's size, so a flood from more prefixes than this gets one prefix's share between them.
pub const MAX_HANDSHAKE_PREFIXES: usize = 4096;
/// A prefix that asks for no more handshakes a second than this (its burst too) is *quiet*: it may take the
/// budget's total to empty, where a louder one may take it only while it is more than half full. A device
/// reconnects after 10 s of quiet (the keep-alive time), so four a second is some 40 devices of one network each
/// sending every 10 s on a new connection.
pub const QUIET_HANDSHAKES_PER_PREFIX: f32 = 4.0;
/// How deep in debt a prefix's asks may go, in seconds of the quiet rate: a prefix that has flooded is quiet again
/// only after this long without a handshake.
const QUIET_DEBT_SECONDS: f32 = 4.0;
/// One prefix may use this share of the handshake budget.
const HANDSHAKE_PREFIX_SHARE: f32 = 8.0;
/// A bucket holds this many seconds of its rate: a fleet reconnecting at once after a restart comes in a burst.
const HANDSHAKE_BURST_SECONDS: f32 = 1.0;
/// How often full handshake buckets are forgotten.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

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
    /// A TLS handshake, refused because the prefix had used its share of the handshake budget.
    TlsPrefix = 4,
    /// A TLS handshake, refused because the handshake budget had no token for it.
    TlsBudget = 5,
}

impl Refused {
    pub const ALL: [Refused; 6] = [
        Refused::PerSource,
        Refused::PerPrefix,
        Refused::Reserved,
        Refused::Total,
        Refused::TlsPrefix,
        Refused::TlsBudget,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Refused::PerSource => "per_source",
            Refused::PerPrefix => "per_prefix",
            Refused::Reserved => "reserved",
            Refused::Total => "total",
            Refused::TlsPrefix => "tls_prefix",
            Refused::TlsBudget => "tls_budget",
        }
    }

    /// Whether the refusal was made at accept, before the connection got a slot (the rest are TLS handshakes).
    pub fn at_accept(self) -> bool {
        !matches!(self, Refused::TlsPrefix | Refused::TlsBudget)
    }

    /// What a client refused at accept is told, in the body of a 503.
    pub fn why(self) -> &'static str {
        match self {
            Refused::PerSource => "too many connections from your address",
            Refused::PerPrefix => "too many connections from your network",
            Refused::Reserved | Refused::Total => "too many connections",
            Refused::TlsPrefix | Refused::TlsBudget => "too many new TLS connections",
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
    /// The metrics listener's: a scraper, a status page and an operator's `curl` need a few, so 64 in all (each
    /// costs a descriptor), half of them from one address, the last 16 for networks holding fewer than 2.
    pub fn metrics() -> Self {
        ConnectionLimits {
            total: 64,
            per_source: 32,
            per_prefix: 48,
            reserved: 16,
        }
    }

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

    /// Admits a connection from `ip` past the bounds: for a listener that makes room by closing an older one
    /// (the metrics listener, [`super::serve`]), which gives its place back when it has closed.
    pub fn admit_over(&mut self, ip: IpAddr) -> Ticket {
        let (source, prefix) = (Source::of(ip), Prefix::of(ip));
        self.open += 1;
        *self.sources.entry(source).or_default() += 1;
        *self.prefixes.entry(prefix).or_default() += 1;
        Ticket { source, prefix }
    }

    /// Sources and prefixes with a connection open (each at most `total`).
    pub fn entries(&self) -> (usize, usize) {
        (self.sources.len(), self.prefixes.len())
    }
}

/// A token bucket.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f32,
    last: Instant,
}

impl Bucket {
    fn full(burst: f32, now: Instant) -> Self {
        Bucket {
            tokens: burst,
            last: now,
        }
    }

    fn refill(&mut self, now: Instant, rate: f32, burst: f32) {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f32();
        self.tokens = (self.tokens + elapsed * rate).min(burst);
        self.last = now;
    }

    fn full_by(&self, now: Instant, rate: f32, burst: f32) -> bool {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f32();
        self.tokens + elapsed * rate >= burst
    }
}

/// One prefix's handshake state.
#[derive(Debug, Clone, Copy)]
struct PrefixHandshakes {
    /// Its share of the budget.
    share: Bucket,
    /// Its asks, granted or not, at [`QUIET_HANDSHAKES_PER_PREFIX`], in debt down to [`QUIET_DEBT_SECONDS`] of it:
    /// whether it is quiet.
    asks: Bucket,
}

/// New TLS connections per second, in total and per prefix (module docs).
#[derive(Debug)]
pub struct HandshakeBudget {
    rate: f32,
    burst: f32,
    prefix_rate: f32,
    prefix_burst: f32,
    total: Option<Bucket>,
    prefixes: HashMap<Prefix, PrefixHandshakes>,
    /// Shared by every prefix that arrives while the table holds [`MAX_HANDSHAKE_PREFIXES`].
    overflow: Option<PrefixHandshakes>,
    next_sweep: Option<Instant>,
}

impl HandshakeBudget {
    /// A budget of `per_second` handshakes (at least 1).
    pub fn new(per_second: u32) -> Self {
        let rate = per_second.max(1) as f32;
        let prefix_rate = rate / HANDSHAKE_PREFIX_SHARE;
        HandshakeBudget {
            rate,
            // At least 2 in total, so that the half kept for quiet prefixes leaves the others a token.
            burst: (rate * HANDSHAKE_BURST_SECONDS).max(2.0),
            prefix_rate,
            prefix_burst: (prefix_rate * HANDSHAKE_BURST_SECONDS).max(1.0),
            total: None,
            prefixes: HashMap::new(),
            overflow: None,
            next_sweep: None,
        }
    }

    pub fn per_second(&self) -> u32 {
        self.rate as u32
    }

    /// Prefixes remembered now.
    pub fn prefixes_tracked(&self) -> usize {
        self.prefixes.len()
    }

    /// Asks for one handshake from `ip` now; takes its tokens if granted.
    pub fn take(&mut self, now: Instant, ip: IpAddr) -> Result<(), Refused> {
        if self.next_sweep.is_none_or(|at| now >= at) {
            self.sweep(now);
        }
        let (rate, burst, prefix_rate, prefix_burst) =
            (self.rate, self.burst, self.prefix_rate, self.prefix_burst);
        let total = self.total.get_or_insert_with(|| Bucket::full(burst, now));
        total.refill(now, rate, burst);
        let total_tokens = total.tokens;
        let fresh = || PrefixHandshakes {
            share: Bucket::full(prefix_burst, now),
            asks: Bucket::full(QUIET_HANDSHAKES_PER_PREFIX, now),
        };
        let prefix = Prefix::of(ip);
        let full = self.prefixes.len() >= MAX_HANDSHAKE_PREFIXES;
        let state = if full && !self.prefixes.contains_key(&prefix) {
            self.overflow.get_or_insert_with(fresh)
        } else {
            self.prefixes.entry(prefix).or_insert_with(fresh)
        };
        state.share.refill(now, prefix_rate, prefix_burst);
        state.asks.refill(
            now,
            QUIET_HANDSHAKES_PER_PREFIX,
            QUIET_HANDSHAKES_PER_PREFIX,
        );
        // Every ask counts, granted or not: loudness is what the prefix asks for, not what it was given. One that
        // asks faster than the quiet rate goes into debt, so that it does not win back a quiet handshake every
        // quarter of a second while it floods: 64 flooding networks doing so would take more than the budget.
        let quiet = state.asks.tokens >= 1.0;
        state.asks.tokens =
            (state.asks.tokens - 1.0).max(-QUIET_HANDSHAKES_PER_PREFIX * QUIET_DEBT_SECONDS);
        if state.share.tokens < 1.0 {
            return Err(Refused::TlsPrefix);
        }
        let floor = if quiet { 0.0 } else { (burst / 2.0).floor() };
        if total_tokens - floor < 1.0 {
            return Err(Refused::TlsBudget);
        }
        state.share.tokens -= 1.0;
        if let Some(t) = self.total.as_mut() {
            t.tokens -= 1.0;
        }
        Ok(())
    }

    /// Forgets prefixes whose buckets are full again: the same as never seen.
    pub fn sweep(&mut self, now: Instant) {
        let (rate, burst) = (self.prefix_rate, self.prefix_burst);
        let q = QUIET_HANDSHAKES_PER_PREFIX;
        self.prefixes
            .retain(|_, s| !(s.share.full_by(now, rate, burst) && s.asks.full_by(now, q, q)));
        if self.prefixes.capacity() > 2 * self.prefixes.len() + 64 {
            self.prefixes.shrink_to(self.prefixes.len() * 2);
        }
        self.next_sweep = Some(now + SWEEP_EVERY);
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

    #[test]
    fn handshakes_are_bounded_per_prefix_and_in_total() {
        let t0 = Instant::now();
        // 80 a second: a prefix may have 10 a second, with a burst of 10.
        let mut b = HandshakeBudget::new(80);
        let granted = (0..100)
            .filter(|_| b.take(t0, ip("192.0.2.1")).is_ok())
            .count();
        assert_eq!(granted, 10);
        assert_eq!(b.take(t0, ip("192.0.2.99")), Err(Refused::TlsPrefix));
        // A second later the prefix has its share again.
        let t1 = t0 + Duration::from_secs(1);
        let granted = (0..100)
            .filter(|_| b.take(t1, ip("192.0.2.1")).is_ok())
            .count();
        assert_eq!(granted, 10);
        // Twenty prefixes asking for ten each take the total's burst (80) and no more: the first four their whole
        // share, down to the total's half; the rest the four each asks for while quiet, down to empty.
        let mut b = HandshakeBudget::new(80);
        let mut granted = 0;
        for net in 0..20 {
            for _ in 0..10 {
                granted += b.take(t0, ip(&format!("10.0.{net}.1"))).is_ok() as usize;
            }
        }
        assert_eq!(granted, 80);
        assert_eq!(b.take(t0, ip("10.9.0.1")), Err(Refused::TlsBudget));
    }

    #[test]
    fn loud_prefixes_leave_half_the_total_to_quiet_ones() {
        let t0 = Instant::now();
        // 800 a second: a prefix's share 100, the total's burst 800, its half 400.
        let mut b = HandshakeBudget::new(800);
        let mut granted = 0;
        for net in 0..16 {
            for _ in 0..100 {
                granted += b.take(t0, ip(&format!("10.0.{net}.1"))).is_ok() as usize;
            }
        }
        // Four prefixes take their share until the total is at its half; the other twelve then get only the four
        // handshakes they ask for while still quiet.
        assert_eq!(granted, 400 + 12 * 4);
        assert_eq!(b.take(t0, ip("10.0.4.1")), Err(Refused::TlsBudget));
        // New prefixes are quiet: they take from the lower half.
        let quiet = (0..50)
            .filter(|i| b.take(t0, ip(&format!("10.1.{i}.1"))).is_ok())
            .count();
        assert_eq!(quiet, 50);
    }

    #[test]
    fn many_loud_prefixes_over_time_leave_newcomers_their_handshakes() {
        // 64 networks asking 3,500 a second together, in a random order, for five seconds; a newcomer from a network
        // of its own every 100 ms after the first second. A loud network must not win back a quiet handshake now
        // and then: 64 of them each doing so four times a second would be more than the whole budget, and drain the
        // half kept for newcomers. (In the first moments each new network is quiet for its first four: 64 × 4 is
        // more than the burst, once.)
        let t0 = Instant::now();
        let mut b = HandshakeBudget::new(200);
        let mut rng = 0x2545_f491_4f6c_dd1d_u64;
        let (mut granted, mut newcomers) = (0, 0);
        for i in 0..5 * 3500u32 {
            let now = t0 + Duration::from_micros(u64::from(i) * 1_000_000 / 3500);
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let net = (rng % 64) as u8;
            granted += b.take(now, IpAddr::from([10, 0, net, 1])).is_ok() as u32;
            if i >= 3500 && i % 350 == 349 {
                let n = (i / 350) as u8;
                if b.take(now, IpAddr::from([10, 1, n, 1])).is_ok() {
                    newcomers += 1;
                }
            }
        }
        assert_eq!(newcomers, 40, "every newcomer got its handshake");
        // The flood got no more than the budget: its burst and five seconds of its rate.
        assert!(granted <= 200 + 5 * 200, "{granted}");
    }

    #[test]
    fn handshake_prefixes_are_bounded_and_forgotten() {
        let t0 = Instant::now();
        let mut b = HandshakeBudget::new(1_000_000);
        for i in 0..(MAX_HANDSHAKE_PREFIXES + 100) as u32 {
            let [_, _, x, y] = i.to_be_bytes();
            let _ = b.take(t0, IpAddr::from([10, x, y, 1]));
        }
        assert_eq!(b.prefixes_tracked(), MAX_HANDSHAKE_PREFIXES);
        b.sweep(t0 + Duration::from_secs(5));
        assert_eq!(b.prefixes_tracked(), 0);
    }
}
