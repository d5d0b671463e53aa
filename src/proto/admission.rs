//! Admission of public-key work: the X25519 budget and stateless cookies (docs/protocol.md 6.1 and 4.4).
//!
//! A sender packet that no session opens and whose sender is not in the memo costs the node one X25519 per
//! candidate key (~66 µs here, research/001): the one thing unauthenticated input can make the node do that is
//! expensive. This module decides whether the node may spend it, sans-IO (time comes in as `now`):
//!
//! - **Token buckets.** One global bucket of `--x25519-budget` X25519 per second, and per source address prefix
//!   (/24 for IPv4, /56 for IPv6) buckets of an eighth of it, so one prefix cannot take the whole budget. Each
//!   X25519 takes a token; **a token is given back when the packet authenticates**: work caused by a real sender is
//!   not waste, so the budget bounds exactly the X25519 spent on input that turned out to be garbage (BRIEF.md:
//!   "X25519 operations per second caused by unauthenticated input ≤ a configured budget"), and new senders are
//!   never slowed by it when nobody is flooding.
//! - **Validated addresses first.** A packet from an address that proved it receives what is sent to it — it
//!   echoes a cookie (protocol.md 4.4), or came over TCP (links over HTTP, section 10) — draws from separate
//!   per-prefix buckets and may use the whole global bucket; any other packet may use only the half above a
//!   reserve. A flood of packets from addresses that never see an answer (spoofed, or an attacker that does not
//!   echo) therefore drains the global bucket to the reserve and no further, and the reserve serves validated
//!   senders: they get their X25519 ahead of the rest.
//! - **Quiet prefixes first within the reserve.** An attacker that holds its addresses can echo real cookies, and
//!   16 prefixes at an eighth each ask for twice the budget: every token the total regains went to the next flood
//!   packet, and a new sender's packet, once per RTO, almost never found one (research/016). So each prefix also
//!   counts its validated requests against [`QUIET_SHARE`] of the rate; a request within it is quiet and may take
//!   the total to empty, a louder one only down to [`LOUD_RESERVE`] of its burst. Loud prefixes of any number
//!   leave the lowest quarter, and the refill, to quiet ones. Validated prefixes have a table of their own that only
//!   validated packets make entries in, so spoofed floods that fill the table of all prefixes cannot push them
//!   into its shared entry.
//! - **Cookies.** When an unvalidated packet is refused, the node may answer it with a COOKIE packet: 16 bytes
//!   that are a MAC, under a secret that rotates every [`COOKIE_PERIOD`], of the packet's source IP address. The
//!   node keeps no state for it; a cookie is checked by computing it again. COOKIE packets are rate-limited, in
//!   total ([`COOKIE_REPLIES_PER_SECOND`], generous) and per prefix, and are smaller than any packet they answer (no
//!   amplification, protocol.md 9). Quiet prefixes come first: a prefix that asks for more than
//!   [`QUIET_ASKS_PER_PREFIX`] a second may take the total only while it is more than half full, so a flood from a
//!   few prefixes leaves the lower half to new senders elsewhere.
//!
//! Tries of a candidate sender (the memo lookup, HKDF and open of step 3, a few µs) have a budget of their own with
//! the same rules ([`Work::Try`], 20 times the X25519 one): forged packets for senders in the memo cost no X25519
//! but would otherwise cost a try each without limit.
//!
//! Prefix state is bounded ([`MAX_PREFIXES`], and [`MAX_VALIDATED_PREFIXES`] apart); a prefix whose buckets are
//! all full is the same as one never seen and is forgotten by [`Admission::sweep`], so the tables are empty again
//! after a burst.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

pub use super::wire::COOKIE_LEN;
/// A cookie secret is used for this long; a cookie of the current or the previous period is accepted, so a cookie
/// is good for at least this long after it was sent (WireGuard rotates its cookie secret every two minutes).
pub const COOKIE_PERIOD: Duration = Duration::from_secs(120);
/// X25519 per second unauthenticated input may cost by default (x25519 takes ~66 µs here: under 2% of one core).
/// research/007-overload measured 250, 1000 and 4000 under a flood of forged first packets: more budget, less
/// goodput for existing senders, and none of them kept 0.9 of it, so by the rule written before measuring the
/// smallest. New senders do not need more: their X25519s are given back, and during a flood they come in with a
/// cookie from the reserve.
pub const DEFAULT_X25519_BUDGET: u32 = 250;
/// Tries of candidate senders (memo lookup, HKDF, open: a few µs each) per second that input which does not
/// authenticate may cost, as a multiple of the X25519 budget: about the same CPU as the X25519s.
const TRY_FACTOR: f32 = 20.0;
/// One prefix may have this share of the budget: 1/8.
const PREFIX_SHARE: f32 = 8.0;
/// The bucket holds this many seconds of its rate (its burst).
const BURST_SECONDS: f32 = 0.1;
/// Unvalidated packets may draw from the global bucket only above this fraction of its burst.
const RESERVE: f32 = 0.5;
/// Validated packets from a loud prefix may draw from the global bucket only above this fraction of its burst;
/// quiet prefixes may take it to empty (protocol.md 6.1).
const LOUD_RESERVE: f32 = 0.25;
/// A prefix's validated requests for work are quiet within this share of the total's rate of that work: 1/64, so
/// an attacker needs at least 64 prefixes asking at the quiet rate to take the lowest quarter from a new sender,
/// while a prefix of real senders asks for one per new run, and gets it back when the run authenticates.
pub const QUIET_SHARE: f32 = 1.0 / 64.0;
/// COOKIE packets per second in total. A new sender's first packet during a flood gets a COOKIE with the chance
/// replies/flood, so this must be of the order of a flood's packet rate, not of the X25519 budget: a COOKIE costs
/// an HMAC and a send (a few µs, research/007), not an X25519.
pub const COOKIE_REPLIES_PER_SECOND: f32 = 50_000.0;
/// COOKIE packets per second to one address prefix: one flooding prefix cannot take the total, nor be sent more
/// than 2,000 × 37 bytes a second (74 kB/s, a third of what it sent).
pub const COOKIE_REPLIES_PER_PREFIX: f32 = 2_000.0;
/// A prefix whose packets ask for COOKIEs no faster than this is *quiet*: it may take the COOKIEs' total bucket to
/// empty, where a louder one may take it only while it is more than half full. A flood from a few prefixes then
/// leaves the lower half to the prefixes that ask for few, where a new sender is (research/013: with one shared
/// total, a new sender beside 400k forged packets a second got its COOKIE one try in eight).
pub const QUIET_ASKS_PER_PREFIX: f32 = 100.0;
/// Most source prefixes tracked at once (16 B of state each, ~40 B in the table). Beyond it, new prefixes share one
/// entry; a flood from random prefixes is then held by that entry and the global bucket.
pub const MAX_PREFIXES: usize = 16_384;
/// Most validated prefixes tracked at once, in a table of their own (only a packet from an address that receives
/// makes an entry: an attacker needs real addresses in this many /24s to fill it). Beyond it they share one entry.
pub const MAX_VALIDATED_PREFIXES: usize = 16_384;
/// How often full buckets are forgotten.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// What a packet proved about its source address before any X25519.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Validated {
    /// Nothing: it may come from a spoofed address.
    No,
    /// It echoed a valid cookie for its source address.
    Cookie,
    /// It came over a TCP connection (links over HTTP): the handshake proved the address.
    Transport,
}

impl Validated {
    pub fn is_validated(self) -> bool {
        !matches!(self, Validated::No)
    }
}

/// Why an X25519 was not granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The packet's address is not validated and unvalidated input has used its share: a cookie may help.
    CookieRequired,
    /// The address is validated, but the budget (global or its prefix's) has no token left.
    Budget,
}

/// The settings of admission, from the driver.
#[derive(Debug, Clone)]
pub struct AdmissionConfig {
    /// X25519 per second that input which does not authenticate may cost (`--x25519-budget`). At least 1.
    pub x25519_per_second: u32,
    /// Random bytes from which the rotating cookie secrets are derived; drawn once per process.
    pub cookie_key: [u8; 32],
}

impl AdmissionConfig {
    pub fn new(x25519_per_second: u32, cookie_key: [u8; 32]) -> Self {
        AdmissionConfig {
            x25519_per_second: x25519_per_second.max(1),
            cookie_key,
        }
    }
}

/// A source address prefix: /24 of IPv4 (also IPv4-mapped IPv6), /56 of IPv6.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Prefix {
    V4([u8; 3]),
    V6([u8; 7]),
}

impl Prefix {
    pub fn of(ip: IpAddr) -> Prefix {
        match ip {
            IpAddr::V4(a) => {
                let o = a.octets();
                Prefix::V4([o[0], o[1], o[2]])
            }
            IpAddr::V6(a) => match a.to_ipv4_mapped() {
                Some(v4) => Prefix::of(IpAddr::V4(v4)),
                None => {
                    let o = a.octets();
                    Prefix::V6([o[0], o[1], o[2], o[3], o[4], o[5], o[6]])
                }
            },
        }
    }
}

/// A token bucket: `tokens` up to `burst`, refilled at `rate` per second.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f32,
}

impl Bucket {
    fn full(burst: f32) -> Self {
        Bucket { tokens: burst }
    }
    fn refill(&mut self, elapsed_s: f32, rate: f32, burst: f32) {
        self.tokens = (self.tokens + elapsed_s * rate).min(burst);
    }
}

/// The two kinds of work a first packet can cost, cheapest last to be asked for (protocol.md 6.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Work {
    /// Trying one candidate sender for a packet no session opened: a memo lookup, then HKDF-Expand and an AES-GCM
    /// open (a few µs), or an X25519 too when the sender is not in the memo.
    Try = 0,
    /// One X25519 (~66 µs).
    X25519 = 1,
}

/// The buckets of one prefix for unvalidated packets and COOKIEs, refilled together.
#[derive(Debug, Clone, Copy)]
struct PrefixState {
    /// Work for packets from unvalidated addresses of the prefix, per kind.
    unvalidated: [Bucket; 2],
    /// COOKIE packets sent to the prefix.
    replies: Bucket,
    /// Packets of the prefix that asked for a COOKIE (refused for want of one): whether it is quiet.
    asks: Bucket,
    /// Milliseconds since the admission's base at the last refill (wrapping; differences stay far below 49 days
    /// because full entries are swept every second).
    last_ms: u32,
}

/// The buckets of one validated prefix (only real addresses can drain them), refilled together.
#[derive(Debug, Clone, Copy)]
struct ValidatedState {
    /// Work for packets from validated addresses of the prefix, per kind.
    work: [Bucket; 2],
    /// Validated requests of the prefix, per kind: a token taken means the request was quiet.
    quiet: [Bucket; 2],
    /// As [`PrefixState::last_ms`].
    last_ms: u32,
}

/// A rate and its burst.
#[derive(Debug, Clone, Copy)]
struct Rate {
    per_s: f32,
    burst: f32,
}

impl Rate {
    fn of(per_s: f32, least_burst: f32) -> Rate {
        Rate {
            per_s,
            burst: (per_s * BURST_SECONDS).max(least_burst),
        }
    }
}

/// Rates and bursts derived from the budget.
#[derive(Debug, Clone, Copy)]
struct Rates {
    /// Per kind of work, in total and per prefix.
    global: [Rate; 2],
    prefix: [Rate; 2],
    /// Quiet validated requests per prefix, per kind.
    quiet: [Rate; 2],
    replies: Rate,
    prefix_replies: Rate,
    prefix_asks: Rate,
}

impl Rates {
    fn of(budget: u32) -> Rates {
        let x25519 = budget.max(1) as f32;
        let tries = x25519 * TRY_FACTOR;
        Rates {
            // At least 2 in total, so that the reserve leaves unvalidated input a token when nobody floods.
            global: [Rate::of(tries, 2.0), Rate::of(x25519, 2.0)],
            prefix: [
                Rate::of(tries / PREFIX_SHARE, 1.0),
                Rate::of(x25519 / PREFIX_SHARE, 1.0),
            ],
            quiet: [
                Rate::of(tries * QUIET_SHARE, 1.0),
                Rate::of(x25519 * QUIET_SHARE, 1.0),
            ],
            replies: Rate::of(COOKIE_REPLIES_PER_SECOND, 1.0),
            prefix_replies: Rate::of(COOKIE_REPLIES_PER_PREFIX, 1.0),
            prefix_asks: Rate::of(QUIET_ASKS_PER_PREFIX, 1.0),
        }
    }
}

/// The admission state of a node (module docs).
pub struct Admission {
    rates: Rates,
    /// Per kind of work.
    global: [Bucket; 2],
    global_last: Option<Instant>,
    replies: Bucket,
    prefixes: HashMap<Prefix, PrefixState>,
    /// Shared by every prefix that arrives while the table holds [`MAX_PREFIXES`].
    overflow: PrefixState,
    /// Validated prefixes, apart (made only by validated packets).
    validated: HashMap<Prefix, ValidatedState>,
    /// Shared by every validated prefix that arrives while that table holds [`MAX_VALIDATED_PREFIXES`].
    validated_overflow: ValidatedState,
    /// When the admission first saw time; cookie periods and prefix times count from it.
    base: Option<Instant>,
    next_sweep: Option<Instant>,
    cookie_key: [u8; 32],
    /// The secrets of the current and the previous cookie period: (period number, secret).
    secrets: [(u64, [u8; 32]); 2],
}

type HmacSha256 = Hmac<Sha256>;

fn hmac(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    // HMAC takes keys of any length, so `new_from_slice` cannot fail.
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC accepts any key length");
    for p in parts {
        mac.update(p);
    }
    mac.finalize().into_bytes().into()
}

/// The 16 bytes of an IP address that a cookie covers: IPv4 as IPv4-mapped IPv6, so both forms of one address get
/// one cookie.
fn address_bytes(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => a.octets(),
    }
}

impl Admission {
    pub fn new(config: AdmissionConfig) -> Self {
        let rates = Rates::of(config.x25519_per_second);
        Admission {
            rates,
            global: rates.global.map(|r| Bucket::full(r.burst)),
            global_last: None,
            replies: Bucket::full(rates.replies.burst),
            prefixes: HashMap::new(),
            overflow: Self::fresh(&rates, 0),
            validated: HashMap::new(),
            validated_overflow: Self::fresh_validated(&rates, 0),
            base: None,
            next_sweep: None,
            cookie_key: config.cookie_key,
            secrets: [(u64::MAX, [0; 32]); 2],
        }
    }

    fn fresh(rates: &Rates, now_ms: u32) -> PrefixState {
        PrefixState {
            unvalidated: rates.prefix.map(|r| Bucket::full(r.burst)),
            replies: Bucket::full(rates.prefix_replies.burst),
            asks: Bucket::full(rates.prefix_asks.burst),
            last_ms: now_ms,
        }
    }

    fn fresh_validated(rates: &Rates, now_ms: u32) -> ValidatedState {
        ValidatedState {
            work: rates.prefix.map(|r| Bucket::full(r.burst)),
            quiet: rates.quiet.map(|r| Bucket::full(r.burst)),
            last_ms: now_ms,
        }
    }

    /// The X25519 budget per second in force.
    pub fn budget(&self) -> u32 {
        self.rates.global[Work::X25519 as usize].per_s as u32
    }

    /// Entries of source prefixes with state now (a validated prefix has one in each table).
    pub fn prefixes_tracked(&self) -> usize {
        self.prefixes.len() + self.validated.len()
    }

    fn base(&mut self, now: Instant) -> Instant {
        *self.base.get_or_insert(now)
    }

    fn ms(&mut self, now: Instant) -> u32 {
        let base = self.base(now);
        now.saturating_duration_since(base).as_millis() as u32
    }

    fn refill_global(&mut self, now: Instant) {
        let last = *self.global_last.get_or_insert(now);
        let elapsed = now.saturating_duration_since(last).as_secs_f32();
        if elapsed > 0.0 {
            let r = self.rates;
            for (b, rate) in self.global.iter_mut().zip(r.global) {
                b.refill(elapsed, rate.per_s, rate.burst);
            }
            self.replies
                .refill(elapsed, r.replies.per_s, r.replies.burst);
            self.global_last = Some(now);
        }
    }

    /// The refilled state of `prefix`, made if new (or the overflow entry when the table is full).
    fn prefix_state(&mut self, now: Instant, prefix: Prefix) -> &mut PrefixState {
        let now_ms = self.ms(now);
        let rates = self.rates;
        let full = self.prefixes.len() >= MAX_PREFIXES;
        let state = if full && !self.prefixes.contains_key(&prefix) {
            &mut self.overflow
        } else {
            self.prefixes
                .entry(prefix)
                .or_insert_with(|| Self::fresh(&rates, now_ms))
        };
        let elapsed = now_ms.wrapping_sub(state.last_ms) as f32 / 1000.0;
        if elapsed > 0.0 {
            for k in 0..2 {
                let r = rates.prefix[k];
                state.unvalidated[k].refill(elapsed, r.per_s, r.burst);
            }
            state.replies.refill(
                elapsed,
                rates.prefix_replies.per_s,
                rates.prefix_replies.burst,
            );
            state
                .asks
                .refill(elapsed, rates.prefix_asks.per_s, rates.prefix_asks.burst);
            state.last_ms = now_ms;
        }
        state
    }

    /// The refilled validated state of `prefix`, made if new (or the shared entry when its table is full).
    fn validated_state(&mut self, now: Instant, prefix: Prefix) -> &mut ValidatedState {
        let now_ms = self.ms(now);
        let rates = self.rates;
        let full = self.validated.len() >= MAX_VALIDATED_PREFIXES;
        let state = if full && !self.validated.contains_key(&prefix) {
            &mut self.validated_overflow
        } else {
            self.validated
                .entry(prefix)
                .or_insert_with(|| Self::fresh_validated(&rates, now_ms))
        };
        let elapsed = now_ms.wrapping_sub(state.last_ms) as f32 / 1000.0;
        if elapsed > 0.0 {
            for k in 0..2 {
                let (r, q) = (rates.prefix[k], rates.quiet[k]);
                state.work[k].refill(elapsed, r.per_s, r.burst);
                state.quiet[k].refill(elapsed, q.per_s, q.burst);
            }
            state.last_ms = now_ms;
        }
        state
    }

    /// Asks for one X25519 for a packet from `ip` ([`Admission::try_work`]).
    pub fn try_x25519(
        &mut self,
        now: Instant,
        ip: IpAddr,
        validated: Validated,
    ) -> Result<(), Refusal> {
        self.try_work(now, ip, validated, Work::X25519)
    }

    /// Asks for one unit of `work` for a packet from `ip`. On success the token is taken; give it back with
    /// [`Admission::refund`] if the packet authenticates.
    pub fn try_work(
        &mut self,
        now: Instant,
        ip: IpAddr,
        validated: Validated,
        work: Work,
    ) -> Result<(), Refusal> {
        self.maybe_sweep(now);
        self.refill_global(now);
        let k = work as usize;
        let burst = self.rates.global[k].burst;
        // The floor the total must be above: 1 + ⌊burst × reserve⌋, at most the burst (protocol.md 6.1).
        let floor = |reserve: f32| 1.0 + (burst * reserve).floor().min(burst - 1.0);
        let total = self.global[k].tokens;
        let prefix = Prefix::of(ip);
        let (bucket, global_ok, refusal) = if validated.is_validated() {
            let quiet_burst = self.rates.quiet[k].burst;
            let state = self.validated_state(now, prefix);
            // Every validated request counts, granted or not: loudness is what the prefix asks for. The count goes
            // below zero (to minus its burst), so a prefix that asks faster than the quiet rate is never quiet, not
            // quiet once each time its count refills to one.
            let quiet = state.quiet[k].tokens >= 1.0;
            state.quiet[k].tokens = (state.quiet[k].tokens - 1.0).max(-quiet_burst);
            // Quiet requests may take the total to empty; loud ones leave its lowest quarter to quiet ones.
            let least = if quiet { 1.0 } else { floor(LOUD_RESERVE) };
            (&mut state.work[k], total >= least, Refusal::Budget)
        } else {
            // Unvalidated input keeps off the reserve; with the least burst (2) it may still take one token.
            let state = self.prefix_state(now, prefix);
            (
                &mut state.unvalidated[k],
                total >= floor(RESERVE),
                Refusal::CookieRequired,
            )
        };
        if !global_ok || bucket.tokens < 1.0 {
            return Err(refusal);
        }
        bucket.tokens -= 1.0;
        self.global[k].tokens -= 1.0;
        Ok(())
    }

    /// Gives back `n` tokens of `work` taken for a packet from `ip` that authenticated.
    pub fn refund(&mut self, now: Instant, ip: IpAddr, validated: Validated, work: Work, n: u32) {
        if n == 0 {
            return;
        }
        let k = work as usize;
        let r = self.rates;
        let give = |b: &mut Bucket, rate: Rate| b.tokens = (b.tokens + n as f32).min(rate.burst);
        give(&mut self.global[k], r.global[k]);
        if validated.is_validated() {
            // Its quiet count too: a prefix whose senders authenticate stays quiet.
            let state = self.validated_state(now, Prefix::of(ip));
            give(&mut state.work[k], r.prefix[k]);
            give(&mut state.quiet[k], r.quiet[k]);
        } else {
            let state = self.prefix_state(now, Prefix::of(ip));
            give(&mut state.unvalidated[k], r.prefix[k]);
        }
    }

    /// Whether a COOKIE packet may be sent to `ip` now, asked for a packet refused for want of a cookie: the reply
    /// limits in total and per prefix, and the total's lower half only for quiet prefixes
    /// ([`QUIET_ASKS_PER_PREFIX`]). Takes the tokens if so.
    pub fn may_send_cookie(&mut self, now: Instant, ip: IpAddr) -> bool {
        self.refill_global(now);
        let reserve = self.rates.replies.burst * RESERVE;
        let overflow =
            !self.prefixes.contains_key(&Prefix::of(ip)) && self.prefixes.len() >= MAX_PREFIXES;
        let total = self.replies.tokens;
        let state = self.prefix_state(now, Prefix::of(ip));
        // A prefix in the overflow entry is limited by the total only, and counts as quiet: the overflow entry is
        // shared by a flood of random prefixes, and must not keep the real ones among them from their cookies.
        if !overflow {
            // Every ask counts, answered or not: loudness is what the prefix sends, not what it was given.
            let quiet = state.asks.tokens >= 1.0;
            if quiet {
                state.asks.tokens -= 1.0;
            }
            let floor = if quiet { 0.0 } else { reserve };
            if total - floor < 1.0 || state.replies.tokens < 1.0 {
                return false;
            }
            state.replies.tokens -= 1.0;
        } else if total < 1.0 {
            return false;
        }
        self.replies.tokens -= 1.0;
        true
    }

    /// The secret of cookie period `period` (cached for the current and the previous period).
    fn secret(&mut self, period: u64) -> [u8; 32] {
        if let Some((_, s)) = self.secrets.iter().find(|(p, _)| *p == period) {
            return *s;
        }
        let s = hmac(
            &self.cookie_key,
            &[b"pure-serve cookie secret", &period.to_be_bytes()],
        );
        // Keep the newer of the two cached periods and this one.
        let keep = if self.secrets[0].0 == u64::MAX
            || (self.secrets[1].0 != u64::MAX && self.secrets[0].0 < self.secrets[1].0)
        {
            0
        } else {
            1
        };
        self.secrets[keep] = (period, s);
        s
    }

    fn period(&mut self, now: Instant) -> u64 {
        let base = self.base(now);
        now.saturating_duration_since(base).as_secs() / COOKIE_PERIOD.as_secs()
    }

    fn cookie_of(&mut self, period: u64, ip: IpAddr) -> [u8; COOKIE_LEN] {
        let secret = self.secret(period);
        let mac = hmac(&secret, &[&address_bytes(ip)]);
        let mut c = [0u8; COOKIE_LEN];
        c.copy_from_slice(&mac[..COOKIE_LEN]);
        c
    }

    /// The cookie for `ip` now.
    pub fn cookie(&mut self, now: Instant, ip: IpAddr) -> [u8; COOKIE_LEN] {
        let period = self.period(now);
        self.cookie_of(period, ip)
    }

    /// Whether `cookie` is the cookie of `ip` in the current or the previous period.
    pub fn check_cookie(&mut self, now: Instant, ip: IpAddr, cookie: &[u8]) -> bool {
        let period = self.period(now);
        let mut ok = false;
        for p in [Some(period), period.checked_sub(1)].into_iter().flatten() {
            let want = self.cookie_of(p, ip);
            // Compare all bytes: no early exit that would tell a forger how many were right.
            ok |= want
                .iter()
                .zip(cookie)
                .fold(cookie.len() == COOKIE_LEN, |eq, (a, b)| eq & (a == b));
        }
        ok
    }

    /// Forgets prefixes whose buckets are all full again (nothing to remember), and gives their memory back.
    pub fn sweep(&mut self, now: Instant) {
        let now_ms = self.ms(now);
        let r = self.rates;
        let full = |b: &Bucket, rate: Rate, last_ms: u32| {
            let elapsed = now_ms.wrapping_sub(last_ms) as f32 / 1000.0;
            b.tokens + elapsed * rate.per_s >= rate.burst
        };
        self.prefixes.retain(|_, s| {
            !((0..2).all(|k| full(&s.unvalidated[k], r.prefix[k], s.last_ms))
                && full(&s.replies, r.prefix_replies, s.last_ms)
                && full(&s.asks, r.prefix_asks, s.last_ms))
        });
        self.validated.retain(|_, s| {
            !(0..2).all(|k| {
                full(&s.work[k], r.prefix[k], s.last_ms) && full(&s.quiet[k], r.quiet[k], s.last_ms)
            })
        });
        if self.prefixes.capacity() > 2 * self.prefixes.len() + 64 {
            self.prefixes.shrink_to(self.prefixes.len() * 2);
        }
        if self.validated.capacity() > 2 * self.validated.len() + 64 {
            self.validated.shrink_to(self.validated.len() * 2);
        }
        self.next_sweep = Some(now + SWEEP_EVERY);
    }

    /// Sweeps if the last sweep is [`SWEEP_EVERY`] ago.
    pub fn maybe_sweep(&mut self, now: Instant) {
        match self.next_sweep {
            Some(at) if now < at => {}
            _ => self.sweep(now),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn admission(budget: u32) -> Admission {
        Admission::new(AdmissionConfig::new(budget, [7; 32]))
    }

    #[test]
    fn prefixes_are_slash_24_and_slash_56_and_mapped_v4_is_v4() {
        assert_eq!(Prefix::of(ip("192.0.2.1")), Prefix::of(ip("192.0.2.254")));
        assert_ne!(Prefix::of(ip("192.0.2.1")), Prefix::of(ip("192.0.3.1")));
        assert_eq!(
            Prefix::of(ip("::ffff:192.0.2.9")),
            Prefix::of(ip("192.0.2.1"))
        );
        assert_eq!(
            Prefix::of(ip("2001:db8:0:1200::1")),
            Prefix::of(ip("2001:db8:0:12ff::2"))
        );
        assert_ne!(
            Prefix::of(ip("2001:db8:0:1200::1")),
            Prefix::of(ip("2001:db8:0:1300::1"))
        );
    }

    /// However many packets come, in any time, the X25519 granted to input that never authenticates stay within
    /// the burst plus the rate times the time.
    #[test]
    fn garbage_gets_at_most_the_budget_and_real_senders_give_their_tokens_back() {
        let budget = 1000;
        let mut a = admission(budget);
        let t0 = Instant::now();
        let mut granted = 0u32;
        // 10 s of 100k packets/s from 256 prefixes, none authenticating.
        for i in 0..1_000_000u32 {
            let now = t0 + Duration::from_micros(u64::from(i) * 10);
            let from = IpAddr::from([10, 0, (i % 256) as u8, 1]);
            if a.try_x25519(now, from, Validated::No).is_ok() {
                granted += 1;
            }
        }
        let limit = (budget as f32 * 10.0 + a.rates.global[Work::X25519 as usize].burst) as u32;
        assert!(granted <= limit, "{granted} > {limit}");
        assert!(
            granted > limit / 2,
            "the flood still gets the budget: {granted}"
        );
        // A real sender, authenticated at once each time, can go on as often as it likes.
        let t1 = t0 + Duration::from_secs(11);
        for i in 0..10_000u64 {
            let now = t1 + Duration::from_micros(i);
            assert!(
                a.try_x25519(now, ip("192.0.2.1"), Validated::No).is_ok(),
                "{i}"
            );
            a.refund(now, ip("192.0.2.1"), Validated::No, Work::X25519, 1);
        }
    }

    /// protocol.md 6.1, "Fractions", with its numbers: at `--x25519-budget 8` the total holds 2 and a prefix 1, a
    /// new sender's first packet is served at once, and a bucket below the bound refuses whatever its fraction.
    #[test]
    fn a_small_budget_serves_a_first_packet_at_once_and_fractions_refuse() {
        let mut a = admission(8);
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let (here, there) = (ip("192.0.2.1"), ip("198.51.100.1"));
        assert!(a.try_x25519(at(0), here, Validated::No).is_ok(), "at once");
        // The total is at 1: an unvalidated request needs 2.
        assert!(a.try_x25519(at(0), there, Validated::No).is_err());
        // 1.8 after 100 ms at 8 a second: still refused.
        assert!(a.try_x25519(at(100), there, Validated::No).is_err());
        // 2.04 after 130 ms.
        assert!(a.try_x25519(at(130), there, Validated::No).is_ok());
        // The first prefix's bucket (1 a second) holds 0.5 after half a second: refused though the total is full.
        assert!(a.try_x25519(at(500), here, Validated::No).is_err());
        assert!(a.try_x25519(at(1001), here, Validated::No).is_ok());
    }

    #[test]
    fn one_prefix_cannot_drain_the_budget_and_a_validated_sender_uses_the_reserve() {
        let mut a = admission(1000);
        let now = Instant::now();
        let mut from_one = 0;
        for _ in 0..1000 {
            if a.try_x25519(now, ip("198.51.100.7"), Validated::No).is_ok() {
                from_one += 1;
            }
        }
        assert_eq!(
            from_one,
            a.rates.prefix[Work::X25519 as usize].burst as u32,
            "a prefix's burst"
        );
        // Many prefixes together drain the unvalidated half of the global bucket, and stop at the reserve.
        for i in 0..=255u8 {
            while a
                .try_x25519(now, IpAddr::from([203, 0, i, 1]), Validated::No)
                .is_ok()
            {}
        }
        assert_eq!(
            a.try_x25519(now, ip("192.0.2.1"), Validated::No),
            Err(Refusal::CookieRequired)
        );
        // A validated sender still gets its X25519.
        assert_eq!(
            a.try_x25519(now, ip("192.0.2.1"), Validated::Cookie),
            Ok(())
        );
        // Until the reserve is spent too.
        let mut more = 0;
        for i in 0..=255u8 {
            while a
                .try_x25519(now, IpAddr::from([100, 64, i, 1]), Validated::Transport)
                .is_ok()
            {
                more += 1;
            }
        }
        assert!(more > 0);
        assert_eq!(
            a.try_x25519(now, ip("192.0.2.1"), Validated::Cookie),
            Err(Refusal::Budget)
        );
        // Time refills it.
        let later = now + Duration::from_secs(1);
        assert_eq!(
            a.try_x25519(later, ip("192.0.2.1"), Validated::Cookie),
            Ok(())
        );
    }

    /// Tries of candidates have a budget of their own, 20 times the X25519 one, with the same rules.
    #[test]
    fn tries_have_their_own_larger_budget() {
        let mut a = admission(100);
        let now = Instant::now();
        let mut tries = 0;
        for i in 0..=255u8 {
            while a
                .try_work(now, IpAddr::from([203, 0, i, 1]), Validated::No, Work::Try)
                .is_ok()
            {
                tries += 1;
            }
        }
        // The unvalidated half of a burst of 0.1 s of 2000/s.
        assert_eq!(tries, 100);
        // X25519s are counted apart.
        assert_eq!(a.try_x25519(now, ip("192.0.2.1"), Validated::No), Ok(()));
        assert_eq!(
            a.try_work(now, ip("192.0.2.1"), Validated::Cookie, Work::Try),
            Ok(())
        );
    }

    #[test]
    fn cookies_are_bound_to_the_address_and_the_period() {
        let mut a = admission(1000);
        let t0 = Instant::now();
        a.cookie(t0, ip("192.0.2.1")); // sets the base
        let c = a.cookie(t0, ip("192.0.2.1"));
        assert!(a.check_cookie(t0, ip("192.0.2.1"), &c));
        assert!(a.check_cookie(t0, ip("::ffff:192.0.2.1"), &c));
        assert!(!a.check_cookie(t0, ip("192.0.2.2"), &c));
        assert!(!a.check_cookie(t0, ip("192.0.2.1"), &c[..15]));
        let mut forged = c;
        forged[0] ^= 1;
        assert!(!a.check_cookie(t0, ip("192.0.2.1"), &forged));
        // Good through the next period, not after it.
        assert!(a.check_cookie(
            t0 + COOKIE_PERIOD + Duration::from_secs(119),
            ip("192.0.2.1"),
            &c
        ));
        assert!(!a.check_cookie(t0 + COOKIE_PERIOD * 2, ip("192.0.2.1"), &c));
        // Another process (another key) does not accept it.
        let mut b = Admission::new(AdmissionConfig::new(1000, [8; 32]));
        assert!(!b.check_cookie(t0, ip("192.0.2.1"), &c));
    }

    #[test]
    fn cookie_replies_are_limited_in_total_and_per_prefix() {
        let mut a = admission(1000);
        let now = Instant::now();
        let mut to_one = 0;
        while a.may_send_cookie(now, ip("192.0.2.1")) {
            to_one += 1;
        }
        assert_eq!(to_one, a.rates.prefix_replies.burst as u32);
        let mut total = to_one;
        for i in 0..=255u8 {
            while a.may_send_cookie(now, IpAddr::from([203, 0, i, 1])) {
                total += 1;
            }
        }
        // Never more than the total; each prefix here turns loud after its quiet share, so the lower half goes only
        // to those shares (the next test).
        let burst = a.rates.replies.burst as u32;
        assert!(total <= burst, "{total} COOKIEs against a total of {burst}");
        assert!(total >= burst - (burst as f32 * RESERVE) as u32);
    }

    /// A flood from a few loud prefixes takes the COOKIEs' total to half; a prefix that asks for few still gets its
    /// COOKIE from the half below (research/013).
    #[test]
    fn loud_prefixes_leave_the_lower_half_of_the_cookies_to_quiet_ones() {
        let mut a = admission(250);
        let now = Instant::now();
        let burst = a.rates.replies.burst;
        let quiet_burst = a.rates.prefix_asks.burst as u32;
        let mut sent = 0u32;
        // Each flooding prefix asks far more than its quiet share within the same instant.
        for i in 0..=255u8 {
            for _ in 0..(quiet_burst + 40) {
                sent += u32::from(a.may_send_cookie(now, IpAddr::from([198, 18, i, 1])));
            }
        }
        let reserve = (burst * RESERVE) as u32;
        assert!(
            sent <= burst as u32 - reserve + 256 * quiet_burst,
            "loud asks took the reserve: {sent} of {burst}"
        );
        assert!(a.replies.tokens >= 1.0, "the lower half is left");
        // Now loud: each of them asks again and is refused, while the total still holds the lower half.
        assert!(!a.may_send_cookie(now, IpAddr::from([198, 18, 7, 1])));
        assert!(
            a.may_send_cookie(now, IpAddr::from([192, 0, 2, 9])),
            "a quiet prefix gets its COOKIE"
        );
    }

    /// What a node asks for a first packet: a try, and if granted an X25519 (the candidate is not in the memo).
    /// Returns whether both were granted; a packet that authenticates gets its tokens back.
    fn first_packet(a: &mut Admission, now: Instant, from: IpAddr, authentic: bool) -> bool {
        if a.try_work(now, from, Validated::Cookie, Work::Try).is_err() {
            return false;
        }
        let x = a.try_x25519(now, from, Validated::Cookie).is_ok();
        if authentic {
            a.refund(now, from, Validated::Cookie, Work::Try, 1);
            a.refund(now, from, Validated::Cookie, Work::X25519, u32::from(x));
        }
        x
    }

    /// Issue 14 item 6: 16 /24s echoing real cookies at 400k packets/s used to take every token the total regained,
    /// so a new sender waited for the flood to end. Loud prefixes now leave the lowest quarter to quiet ones: every
    /// new sender from a 17th prefix gets its try and its X25519 with its first packet, and the flood still gets
    /// the budget and no more.
    #[test]
    fn a_cookie_echoing_flood_from_16_prefixes_leaves_new_senders_their_first_x25519() {
        let budget = 250;
        let mut a = admission(budget);
        let t0 = Instant::now();
        let secs = 5u64;
        let (mut flood_x25519, mut flood_tries, mut new_senders) = (0u64, 0u64, 0);
        // A packet every 2.5 µs (400k/s) from 16 /24s in turn; a new sender of 192.0.2.0/24 every 50 ms.
        let packets = secs * 400_000;
        for i in 0..packets {
            let now = t0 + Duration::from_nanos(i * 2_500);
            let from = IpAddr::from([198, 18, (i % 16) as u8, 1 + (i % 200) as u8]);
            if a.try_work(now, from, Validated::Cookie, Work::Try).is_ok() {
                flood_tries += 1;
                flood_x25519 += u64::from(a.try_x25519(now, from, Validated::Cookie).is_ok());
            }
            if i % 20_000 == 7_777 {
                let new = IpAddr::from([192, 0, 2, 1 + (new_senders % 250) as u8]);
                assert!(
                    first_packet(&mut a, now, new, true),
                    "new sender {new_senders} at {:?} refused; total {:?}",
                    now - t0,
                    a.global.map(|b| b.tokens)
                );
                new_senders += 1;
            }
        }
        assert_eq!(new_senders, 100);
        let r = a.rates;
        let within = |k: usize| (r.global[k].per_s * secs as f32 + r.global[k].burst) as u64;
        assert!(
            flood_x25519 <= within(1),
            "{flood_x25519} X25519s in {secs} s"
        );
        assert!(flood_tries <= within(0), "{flood_tries} tries in {secs} s");
        // The flood is held to the budget, not shut out: it still takes nearly all of it (loud, above the quarter).
        assert!(
            flood_x25519 >= within(1) * 9 / 10,
            "the flood got {flood_x25519} of {}",
            within(1)
        );
        // Loud requests never took the total below its quarter.
        assert!(a.global[1].tokens >= (r.global[1].burst * LOUD_RESERVE).floor());
    }

    /// A prefix is quiet by what it asks for: its first request is quiet, a prefix asking faster than the quiet
    /// rate is loud from then on (its count stays below one, not quiet again each time it refills to one), and the
    /// tokens given back when its packets authenticate keep a prefix of real senders quiet however many it has.
    #[test]
    fn a_prefix_is_quiet_by_what_it_asks_and_real_senders_keep_it_quiet() {
        let mut a = admission(250);
        let t0 = Instant::now();
        let quarter = (a.rates.global[1].burst * LOUD_RESERVE).floor();
        let mut real = 0;
        for ms in 0..2_000u64 {
            let now = t0 + Duration::from_millis(ms);
            // 16 prefixes asking 10 times a millisecond, never authenticating.
            for i in 0..160u64 {
                let _ = a.try_x25519(
                    now,
                    IpAddr::from([198, 18, (i % 16) as u8, 1]),
                    Validated::Cookie,
                );
            }
            if ms >= 1 {
                let t = a.global[1].tokens;
                assert!(
                    t >= quarter,
                    "at {ms} ms loud requests took the total to {t}"
                );
            }
            // From the second second, a prefix of real senders: 100 new ones, one every 10 ms, each quiet and
            // given its X25519 from the lowest quarter.
            if ms >= 1_000 && ms % 10 == 0 {
                assert!(
                    first_packet(&mut a, now, ip("192.0.2.9"), true),
                    "real sender {real}"
                );
                real += 1;
            }
        }
        assert_eq!(real, 100);
    }

    /// A flood of spoofed first packets fills the table of prefixes; validated prefixes have their own, so a new
    /// sender there is not put in the shared entry with a cookie-echoing flood.
    #[test]
    fn a_spoofed_flood_that_fills_the_prefix_table_does_not_crowd_out_validated_prefixes() {
        let mut a = admission(250);
        let t0 = Instant::now();
        for i in 0..(MAX_PREFIXES as u32 + 100) {
            let from = IpAddr::from((0x0a00_0000 + (i << 8)).to_be_bytes());
            let _ = a.try_x25519(t0, from, Validated::No);
        }
        assert_eq!(a.prefixes.len(), MAX_PREFIXES);
        for i in 0..200_000u64 {
            let now = t0 + Duration::from_nanos(i * 2_500);
            let from = IpAddr::from([198, 18, (i % 16) as u8, 1]);
            let _ = first_packet(&mut a, now, from, false);
        }
        let now = t0 + Duration::from_millis(500);
        assert!(first_packet(&mut a, now, ip("192.0.2.1"), true));
        assert_eq!(a.validated.len(), 17);
        // The validated table is bounded too, and empties after a burst.
        for i in 0..(MAX_VALIDATED_PREFIXES as u32 + 100) {
            let from = IpAddr::from((0x6440_0000 + (i << 8)).to_be_bytes());
            let _ = a.try_x25519(now, from, Validated::Transport);
        }
        assert_eq!(a.validated.len(), MAX_VALIDATED_PREFIXES);
        a.sweep(now + Duration::from_secs(5));
        assert_eq!(a.prefixes_tracked(), 0);
    }

    #[test]
    fn the_prefix_table_is_bounded_and_empties_after_a_burst() {
        let mut a = admission(1000);
        let t0 = Instant::now();
        for i in 0..(MAX_PREFIXES as u32 + 5000) {
            let from = IpAddr::from((0x0a00_0000 + (i << 8)).to_be_bytes());
            let _ = a.try_x25519(t0, from, Validated::No);
        }
        assert_eq!(a.prefixes_tracked(), MAX_PREFIXES);
        a.sweep(t0 + Duration::from_secs(5));
        assert_eq!(a.prefixes_tracked(), 0);
    }
}
