//! The receive loop's side of links over HTTP ([`crate::http::link`]): the requests of one round and their
//! answers.
//!
//! Each round the loop takes waiting requests (at most [`LINK_BYTES_PER_ROUND`] of packets, at least one request),
//! gives each the next request number, and feeds its packets to the node core as datagrams from
//! [`crate::http::link::pseudo_peer`]`(number)`. The turn is applied and committed as always (a request that fills
//! the turn has it committed early, so none of its packets is dropped as `turn_full`); the node core's transmits to
//! a pseudo peer are put into that request's answer instead of the socket ([`LinkRound::push`]). After the round's
//! last commit every request taken is answered, with no packets if it earned none (replays, bad packets, a failed
//! commit: the sender sends again, exactly as over UDP).

use tokio::sync::oneshot;

/// Packet bytes of link requests taken in one round (BRIEF.md: bound the work per round). A bigger request is
/// still taken whole, alone; the rest wait in the queue, whose bound answers 503 beyond it.
pub const LINK_BYTES_PER_ROUND: usize = 1 << 20;

struct Waiting {
    reply: oneshot::Sender<Vec<Vec<u8>>>,
    packets: Vec<Vec<u8>>,
}

/// The link requests taken this round, numbered consecutively from `first`.
#[derive(Default)]
pub(super) struct LinkRound {
    first: u64,
    waiting: Vec<Waiting>,
}

impl LinkRound {
    /// Takes request `id`; ids of one round are consecutive.
    pub(super) fn open(&mut self, id: u64, reply: oneshot::Sender<Vec<Vec<u8>>>) {
        if self.waiting.is_empty() {
            self.first = id;
        }
        debug_assert_eq!(id, self.first + self.waiting.len() as u64);
        self.waiting.push(Waiting {
            reply,
            packets: Vec::new(),
        });
    }

    /// Adds a node packet to request `id`'s answer; false if that request is not of this round (it was answered
    /// already, so the packet is lost, as a datagram to a peer that moved on would be).
    pub(super) fn push(&mut self, id: u64, packet: Vec<u8>) -> bool {
        let Some(i) = id.checked_sub(self.first) else {
            return false;
        };
        match self.waiting.get_mut(i as usize) {
            Some(w) => {
                w.packets.push(packet);
                true
            }
            None => false,
        }
    }

    /// Answers every request of the round.
    pub(super) fn answer(&mut self) {
        for w in self.waiting.drain(..) {
            // The server gave up waiting (deadline) or the client left: nothing to do, the packets were handled.
            let _ = w.reply.send(w.packets);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packets_reach_their_request_only() {
        let mut round = LinkRound::default();
        let (a, mut ra) = oneshot::channel();
        let (b, mut rb) = oneshot::channel();
        round.open(7, a);
        round.open(8, b);
        assert!(round.push(8, vec![1]));
        assert!(round.push(8, vec![2]));
        assert!(!round.push(6, vec![3]));
        assert!(!round.push(9, vec![4]));
        round.answer();
        assert_eq!(ra.try_recv().unwrap(), Vec::<Vec<u8>>::new());
        assert_eq!(rb.try_recv().unwrap(), vec![vec![1], vec![2]]);
        assert!(
            !round.push(8, vec![5]),
            "answered requests take nothing more"
        );
    }
}
