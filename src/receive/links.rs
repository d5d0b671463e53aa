//! The receive loop's side of links over HTTP ([`crate::http::link`]): the requests taken and their answers.
//!
//! Each round the loop takes waiting requests (at most [`LINK_BYTES_PER_ROUND`] of packets, at least one request),
//! gives each the next request number, and feeds its packets to the node core as datagrams from
//! [`crate::http::link::pseudo_peer`]`(number)`. The turn is applied and committed as always (a request that fills
//! the turn has it committed early, so none of its packets is dropped as `turn_full`); the node core's transmits to
//! a pseudo peer are put into that request's answer instead of the socket ([`LinkRequests::push`]). A request is
//! answered when the turns that hold its packets are finished — committed and synced (research/010) — with no
//! packets if it earned none (replays, bad packets, a failed commit: the sender sends again, exactly as over UDP).

use tokio::sync::oneshot;

/// Packet bytes of link requests taken in one round (BRIEF.md: bound the work per round). A bigger request is
/// still taken whole, alone; the rest wait in the queue, whose bound answers 503 beyond it.
pub const LINK_BYTES_PER_ROUND: usize = 1 << 20;

struct Waiting {
    reply: oneshot::Sender<Vec<Vec<u8>>>,
    packets: Vec<Vec<u8>>,
    /// Every packet of the request was fed to the node core.
    fed: bool,
    /// The host's turn that holds the last of them; the request is answered once it is finished.
    in_turn: Option<u64>,
}

/// The link requests taken and not yet answered, numbered consecutively from `first`.
#[derive(Default)]
pub(super) struct LinkRequests {
    first: u64,
    waiting: std::collections::VecDeque<Waiting>,
}

impl LinkRequests {
    /// Takes request `id`; ids are consecutive.
    pub(super) fn open(&mut self, id: u64, reply: oneshot::Sender<Vec<Vec<u8>>>) {
        if self.waiting.is_empty() {
            self.first = id;
        }
        debug_assert_eq!(id, self.first + self.waiting.len() as u64);
        self.waiting.push_back(Waiting {
            reply,
            packets: Vec::new(),
            fed: false,
            in_turn: None,
        });
    }

    /// Every packet of request `id` was fed to the node core.
    pub(super) fn fed(&mut self, id: u64) {
        if let Some(w) = self.get(id) {
            w.fed = true;
        }
    }

    /// The host took turn `seq`: requests fed whole before it have all their packets in it or in earlier turns.
    pub(super) fn taken(&mut self, seq: u64) {
        for w in self.waiting.iter_mut().rev() {
            if w.in_turn.is_some() {
                break;
            }
            if w.fed {
                w.in_turn = Some(seq);
            }
        }
    }

    /// Adds a node packet to request `id`'s answer; false if that request is not waiting (it was answered
    /// already, so the packet is lost, as a datagram to a peer that moved on would be).
    pub(super) fn push(&mut self, id: u64, packet: Vec<u8>) -> bool {
        match self.get(id) {
            Some(w) => {
                w.packets.push(packet);
                true
            }
            None => false,
        }
    }

    /// Answers, in order, every request whose turns are finished (all of the host's turns up to `finished`).
    pub(super) fn answer_finished(&mut self, finished: u64) {
        while self
            .waiting
            .front()
            .is_some_and(|w| w.in_turn.is_some_and(|t| t <= finished))
        {
            let Some(w) = self.waiting.pop_front() else {
                break;
            };
            self.first += 1;
            // The server gave up waiting (deadline) or the client left: nothing to do, the packets were handled.
            let _ = w.reply.send(w.packets);
        }
    }

    fn get(&mut self, id: u64) -> Option<&mut Waiting> {
        let i = id.checked_sub(self.first)?;
        self.waiting.get_mut(usize::try_from(i).ok()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packets_reach_their_request_only() {
        let mut round = LinkRequests::default();
        let (a, mut ra) = oneshot::channel();
        let (b, mut rb) = oneshot::channel();
        round.open(7, a);
        round.open(8, b);
        assert!(round.push(8, vec![1]));
        assert!(round.push(8, vec![2]));
        assert!(!round.push(6, vec![3]));
        assert!(!round.push(9, vec![4]));
        round.fed(7);
        round.fed(8);
        round.taken(1);
        round.answer_finished(1);
        assert_eq!(ra.try_recv().unwrap(), Vec::<Vec<u8>>::new());
        assert_eq!(rb.try_recv().unwrap(), vec![vec![1], vec![2]]);
        assert!(
            !round.push(8, vec![5]),
            "answered requests take nothing more"
        );
    }

    #[test]
    fn a_request_waits_for_the_turn_that_holds_its_last_packet() {
        let mut requests = LinkRequests::default();
        let (a, mut ra) = oneshot::channel();
        let (b, mut rb) = oneshot::channel();
        requests.open(0, a);
        requests.fed(0);
        requests.open(1, b);
        // Request 1 filled turn 4 halfway through its packets: that turn does not hold all of them.
        requests.taken(4);
        requests.fed(1);
        requests.taken(5);
        requests.answer_finished(3);
        assert!(ra.try_recv().is_err(), "turn 4 is not finished");
        requests.answer_finished(4);
        assert!(ra.try_recv().is_ok());
        assert!(rb.try_recv().is_err(), "its last packets are in turn 5");
        assert!(requests.push(1, vec![9]));
        requests.answer_finished(5);
        assert_eq!(rb.try_recv().unwrap(), vec![vec![9]]);
    }
}
