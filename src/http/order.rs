//! Requests of one client handed to the receive loop in the order the client numbered them (`Pure-Order`,
//! docs/protocol.md 10).
//!
//! A wire keeps two requests on their way, on two connections (src/outlets/wire.rs). Their bodies are read side by
//! side, so the later one can be read first; handed to the receive loop in that order, its records would land in a
//! turn before the earlier body's, and a frame beyond the heard sequence is not stored (5.2): the sender would go
//! back N again and again. A request numbered `Pure-Order: TOKEN SEQ` is therefore handed over only after the
//! request before it of the same token (or after [`WAIT`], if that one does not come: lost, or the client gave up).
//! Unnumbered requests are handed over at once, as before.
//!
//! State is per token: the next number expected and who waits. It is bounded ([`MAX_TOKENS`]); a token forgotten
//! costs its next request one [`WAIT`], nothing else.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

/// The request header that numbers a link request: `Pure-Order: TOKEN SEQ`.
pub const HEADER: &str = "pure-order";
/// The longest a numbered request waits for the one before it.
pub const WAIT: Duration = Duration::from_millis(50);
/// Tokens remembered at once; beyond it, those with nobody waiting and quiet longest are forgotten.
pub const MAX_TOKENS: usize = 1024;

struct Stream {
    next: u64,
    waiting: BTreeMap<u64, oneshot::Sender<()>>,
    last: Instant,
}

#[derive(Default)]
pub struct OrderGate {
    streams: Mutex<HashMap<u64, Stream>>,
}

/// The header's value: `TOKEN SEQ`, the token in hex (up to 16 digits), the number in decimal.
pub fn parse(value: &[u8]) -> Option<(u64, u64)> {
    let text = std::str::from_utf8(value).ok()?;
    let (token, seq) = text.trim().split_once(' ')?;
    Some((
        u64::from_str_radix(token, 16).ok()?,
        seq.trim().parse().ok()?,
    ))
}

impl OrderGate {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Stream>> {
        self.streams.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `hand` (the hand-over to the receive loop) for request `seq` of `token` once the request before it has
    /// been handed over, or after [`WAIT`]; under the gate's lock, so the next one cannot overtake it.
    pub async fn in_order<R>(&self, token: u64, seq: u64, hand: impl FnOnce() -> R) -> R {
        let wait = {
            let mut streams = self.lock();
            if streams.len() >= MAX_TOKENS && !streams.contains_key(&token) {
                forget_quiet(&mut streams);
            }
            // A token first seen starts at 0: a client numbers each token's requests from 0.
            let stream = streams.entry(token).or_insert_with(|| Stream {
                next: 0,
                waiting: BTreeMap::new(),
                last: Instant::now(),
            });
            stream.last = Instant::now();
            if seq <= stream.next {
                None
            } else {
                let (tx, rx) = oneshot::channel();
                stream.waiting.insert(seq, tx);
                Some(rx)
            }
        };
        if let Some(rx) = wait {
            let _ = tokio::time::timeout(WAIT, rx).await;
        }
        let mut streams = self.lock();
        let r = hand();
        if let Some(stream) = streams.get_mut(&token) {
            stream.waiting.remove(&seq);
            stream.next = stream.next.max(seq + 1);
            if let Some(tx) = stream.waiting.remove(&stream.next) {
                let _ = tx.send(());
            }
        }
        r
    }
}

fn forget_quiet(streams: &mut HashMap<u64, Stream>) {
    let mut quiet: Vec<(Instant, u64)> = streams
        .iter()
        .filter(|(_, s)| s.waiting.is_empty())
        .map(|(t, s)| (s.last, *t))
        .collect();
    quiet.sort_unstable();
    for (_, token) in quiet.into_iter().take(MAX_TOKENS / 4 + 1) {
        streams.remove(&token);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn the_header_is_a_hex_token_and_a_number() {
        assert_eq!(parse(b"00ff 7"), Some((255, 7)));
        assert_eq!(parse(b" a 0 "), Some((10, 0)));
        assert_eq!(parse(b"zz 1"), None);
        assert_eq!(parse(b"12"), None);
        assert_eq!(parse(b"1 -1"), None);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_later_request_waits_for_the_earlier_one_and_a_missing_one_only_for_a_while() {
        let gate = Arc::new(OrderGate::default());
        let order = Arc::new(Mutex::new(Vec::new()));
        let (g, o) = (gate.clone(), order.clone());
        // Number 1 comes first and waits; number 0 comes 10 ms later and goes first.
        let second =
            tokio::spawn(async move { g.in_order(9, 1, || o.lock().unwrap().push(1)).await });
        tokio::time::sleep(Duration::from_millis(10)).await;
        let o = order.clone();
        gate.in_order(9, 0, || o.lock().unwrap().push(0)).await;
        second.await.unwrap();
        assert_eq!(*order.lock().unwrap(), [0, 1]);
        // Number 3 without a 2: handed over after WAIT, not before.
        let started = tokio::time::Instant::now();
        let o = order.clone();
        gate.in_order(9, 3, || o.lock().unwrap().push(3)).await;
        assert!(started.elapsed() >= WAIT);
        // A late 2 and an old 1 go at once (they wait for nothing), as does another token's first.
        for (token, seq) in [(9, 2), (9, 1), (5, 0)] {
            let o = order.clone();
            gate.in_order(token, seq, || o.lock().unwrap().push(seq))
                .await;
        }
        assert_eq!(*order.lock().unwrap(), [0, 1, 3, 2, 1, 0]);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn tokens_are_bounded() {
        let gate = OrderGate::default();
        for token in 0..(MAX_TOKENS as u64 * 3) {
            gate.in_order(token, 0, || ()).await;
        }
        assert!(gate.lock().len() <= MAX_TOKENS);
    }
}
