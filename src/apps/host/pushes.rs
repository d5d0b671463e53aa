//! Pushes of downlink records on their way through a turn (docs/downlink.md, "Queueing records"), the same on the
//! host's own files and on a fleet's store. A push the loop takes waits in the host for the next turn, rides in its
//! app's part ahead of the part's LISTEN reads (so that a live session's read in the same turn finds its records),
//! and is answered from that turn's outcome, once it is durable: on the host's own files it is written in the app's
//! transaction of the turn and answered after that transaction's sync, one commit and one sync for the push and its
//! delivery (research/032); on a fleet's store the part's pushes are one transaction, the part's when it only
//! LISTENs, else one of their own ahead of the part's (docs/scale-out.md, "Downlink on a fleet").

use std::time::Instant;

use super::Host;
use crate::common::push::{AnswerTo, PushAnswer, PushBound};
use crate::proto::allow_list::SenderIndex;
use crate::proto::node::Node;
use crate::proto::turn::AppIndex;
use crate::store::downlink::{DownPush, DownRefusal, MAX_DOWN_PAYLOAD, PushOutcome, Pushed};

/// A push taken by the loop: its records ride with the next turn, and its answer waits for that turn's outcome.
pub(in crate::apps) struct TurnPush {
    pub(super) app: AppIndex,
    sender: SenderIndex,
    /// Until the next turn hands it to the store.
    push: Option<DownPush>,
    /// The sender's name, for the answer.
    to: String,
    records: u64,
    answer: AnswerTo,
    /// Whether a read of the sender's listening session rides the same turn after the push (the node core put it
    /// there when the push was taken): then the records go out when the turn is finished, and nothing need be
    /// read again. Else a session whose read was already on its way reads again once the push is answered.
    read_with_it: bool,
}

impl TurnPush {
    pub(in crate::apps) fn new(
        app: AppIndex,
        sender: SenderIndex,
        push: DownPush,
        answer: AnswerTo,
        read_with_it: bool,
    ) -> Self {
        TurnPush {
            app,
            sender,
            records: push.count(),
            to: push.sender.clone(),
            push: Some(push),
            answer,
            read_with_it,
        }
    }

    /// The records to queue, until the turn's store takes them ([`TurnPush::take`]).
    pub(super) fn records(&self) -> Option<&DownPush> {
        self.push.as_ref()
    }

    /// Hands the records to a store that owns what it applies (a fleet's).
    pub(super) fn take(&mut self) -> Option<DownPush> {
        self.push.take()
    }

    /// Answers that nothing was queued, and why.
    pub(super) fn unavailable(self, words: String) {
        let _ = self.answer.send(PushAnswer::Unavailable(words));
    }

    /// Answers that the records may or may not be queued (the store may have kept them before it failed), and why.
    pub(super) fn maybe_queued(self, words: String) {
        let _ = self.answer.send(PushAnswer::MaybeQueued(words));
    }
}

/// Why a push was refused, said to its pusher: what it would have made wait against the bound, where the bound is
/// set, and what to do; and the expired records the refused push deleted, if it did.
pub(super) fn refusal_words(app: &str, to: &str, refusal: &DownRefusal, expired: u64) -> String {
    let why = match refusal {
        DownRefusal::TooLarge { index, len } => format!(
            "record {} of this push is {len} bytes, above the downlink limit of {MAX_DOWN_PAYLOAD} bytes per record \
             (fixed: a record must fit one datagram to the device): split it into records of at most \
             {MAX_DOWN_PAYLOAD} bytes, or send the device a reference to fetch it by",
            index + 1
        ),
        DownRefusal::Records {
            pushing,
            waiting,
            max,
        } => format!(
            "this push has {pushing} {}; {waiting} already wait{} for {to}; at most {max} may wait (max_records \
             in [apps.{app}.downlink] of the apps file): push fewer at once, wait until the device takes what \
             waits, or raise max_records and reload the node (SIGHUP)",
            plural(*pushing, "record", "records"),
            if *waiting == 1 { "s" } else { "" },
        ),
        DownRefusal::Bytes {
            pushing,
            waiting,
            max,
        } => format!(
            "this push has {pushing} {} of records; {waiting} {} already wait{} for {to}; at most {max} may wait \
             (max_bytes in [apps.{app}.downlink] of the apps file): push fewer or smaller records, wait until the \
             device takes what waits, or raise max_bytes and reload the node (SIGHUP)",
            plural(*pushing, "byte", "bytes"),
            plural(*waiting, "byte", "bytes"),
            if *waiting == 1 { "s" } else { "" },
        ),
    };
    let swept = if expired > 0 {
        format!(
            " (this push deleted {expired} of {to}'s {} that had expired unsent)",
            plural(expired, "record", "records")
        )
    } else {
        String::new()
    };
    format!("nothing was queued for {to} in app {app}: {why}{swept}")
}

fn plural(n: u64, one: &'static str, many: &'static str) -> &'static str {
    if n == 1 { one } else { many }
}

/// Takes the pushes of `app` out of `pushes` and the outcomes beside them out of `pushed` (each app's in the order
/// its part carried them).
pub(super) fn extract(
    pushes: &mut Vec<TurnPush>,
    pushed: &mut [(AppIndex, Vec<PushOutcome>)],
    app: AppIndex,
) -> Vec<TurnPush> {
    for (a, list) in pushed.iter_mut() {
        if *a == app {
            list.clear();
        }
    }
    let (of_app, rest) = std::mem::take(pushes)
        .into_iter()
        .partition(|p| p.app == app);
    *pushes = rest;
    of_app
}

/// What a push's pusher is told of its outcome in app `app` (none: the store ended before it said).
pub(super) fn answer_of(outcome: Option<&PushOutcome>, app: &str, to: &str) -> PushAnswer {
    match outcome {
        Some(PushOutcome::Done(Pushed::Queued { first, count }, expired)) => PushAnswer::Queued {
            first: *first,
            count: *count,
            expired: *expired,
        },
        Some(PushOutcome::Done(Pushed::Refused(r), expired)) => PushAnswer::Refused {
            bound: match r {
                DownRefusal::TooLarge { .. } => PushBound::TooLarge,
                DownRefusal::Records { .. } => PushBound::MaxRecords,
                DownRefusal::Bytes { .. } => PushBound::MaxBytes,
            },
            why: refusal_words(app, to, r, *expired),
            expired: *expired,
        },
        Some(PushOutcome::Failed {
            error,
            maybe_queued: false,
        }) => PushAnswer::Unavailable(format!(
            "app {app} could not queue ({error}): nothing was queued; push again once it stores"
        )),
        Some(PushOutcome::Failed { error, .. }) => PushAnswer::MaybeQueued(format!(
            "app {app} could not queue ({error}): the records may or may not be queued (the store may have \
             committed them before it failed); pushing them again may queue them twice"
        )),
        None => PushAnswer::MaybeQueued(format!(
            "app {app}: the store ended before it answered this push: the records may or may not be queued; \
             pushing them again may queue them twice"
        )),
    }
}

impl Host {
    /// Answers a turn's pushes from their outcomes: each app's pushes in the order its part carried them.
    pub(super) fn answer_pushes(
        &mut self,
        pushes: Vec<TurnPush>,
        mut pushed: Vec<(AppIndex, Vec<PushOutcome>)>,
        node: &mut Node,
        now: Instant,
    ) {
        for list in &mut pushed {
            list.1.reverse();
        }
        for p in pushes {
            let i = p.app as usize;
            let outcome = pushed
                .iter_mut()
                .find(|(a, _)| *a == p.app)
                .and_then(|(_, list)| list.pop());
            let a = &mut self.apps[i];
            let answer = answer_of(outcome.as_ref(), &a.config.name, &p.to);
            if let Some((done, expired)) = outcome.as_ref().and_then(PushOutcome::done) {
                a.down_expired += expired;
                match done {
                    Pushed::Queued { count, .. } => {
                        a.down_queued += count;
                        if !p.read_with_it {
                            node.downlink_queued(now, p.sender, p.app);
                        }
                    }
                    Pushed::Refused(_) => a.down_refused += p.records,
                }
            }
            self.due_answers.0.push((p.answer, answer));
        }
    }

    /// Sends the answers of the pushes finished since the last call. The receive loop calls it once the finished
    /// turns' datagrams are sent, so that a pushed record's DOWN leaves before its pusher is answered
    /// ([`DueAnswers`] says why).
    pub fn send_push_answers(&mut self) {
        self.due_answers.send_all();
    }
}

/// Answers of finished pushes, held until the loop has sent the datagrams of the same turns
/// ([`Host::send_push_answers`]). An answer to a pusher on the push socket wakes the HTTP thread; sent before the
/// DOWN that carries the pushed records, that wake took the loop's core on two cores and the device waited for its
/// records until the HTTP thread had answered (research/049: about 30 µs a push). A datagram pusher's answer
/// is read from the same queue after the datagrams too, as it always was. Dropped (the host is gone), the answers
/// held are sent: one is never lost for being held.
#[derive(Debug, Default)]
pub(super) struct DueAnswers(Vec<(AnswerTo, PushAnswer)>);

impl DueAnswers {
    fn send_all(&mut self) {
        for (to, answer) in self.0.drain(..) {
            // A pusher that stopped waiting is nobody to tell.
            let _ = to.send(answer);
        }
    }
}

impl Drop for DueAnswers {
    fn drop(&mut self) {
        self.send_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoreError;

    /// A finished push's answer waits for [`Host::send_push_answers`], which the loop calls once the same turns'
    /// datagrams are sent, and goes then, in the order the pushes were finished; answers still held when the host
    /// goes away are sent as it does, so none is lost (the pusher would be told that nothing was queued).
    #[test]
    fn answers_are_held_until_sent_in_order_and_never_dropped_unsent() {
        use tokio::sync::oneshot;
        let mut due = DueAnswers::default();
        let (first, mut first_rx) = oneshot::channel();
        let (second, mut second_rx) = oneshot::channel();
        due.0.push((first.into(), PushAnswer::Empty));
        due.0
            .push((second.into(), PushAnswer::NotFound("no sender".into())));
        assert!(first_rx.try_recv().is_err(), "held until sent");
        due.send_all();
        assert_eq!(first_rx.try_recv().unwrap(), PushAnswer::Empty);
        assert_eq!(
            second_rx.try_recv().unwrap(),
            PushAnswer::NotFound("no sender".into())
        );
        assert!(due.0.is_empty());

        let (held, mut held_rx) = oneshot::channel();
        due.0.push((held.into(), PushAnswer::Empty));
        drop(due);
        assert_eq!(
            held_rx.try_recv().unwrap(),
            PushAnswer::Empty,
            "sent when dropped"
        );
    }

    fn failed(maybe_queued: bool) -> PushOutcome {
        PushOutcome::Failed {
            error: std::sync::Arc::new(StoreError::FailedEarlier {
                path: "main.sqlite".into(),
            }),
            maybe_queued,
        }
    }

    /// A store that may have kept the records before it failed is told apart from one that kept nothing: the
    /// pusher may not push again as if nothing were queued (docs/downlink.md, exit 74 and 500).
    #[test]
    fn a_push_the_store_may_have_kept_is_answered_maybe_queued() {
        assert!(matches!(
            answer_of(Some(&failed(true)), "main", "dev"),
            PushAnswer::MaybeQueued(w) if w.contains("may or may not be queued")
        ));
        assert!(matches!(
            answer_of(None, "main", "dev"),
            PushAnswer::MaybeQueued(w) if w.contains("may or may not be queued")
        ));
        assert!(matches!(
            answer_of(Some(&failed(false)), "main", "dev"),
            PushAnswer::Unavailable(w) if w.contains("nothing was queued")
        ));
    }

    /// A refusal says the push's own size beside what waits, names the app's own table, gives the fix, and says
    /// what expired records the refused push deleted.
    #[test]
    fn a_refusal_says_the_push_the_table_the_fix_and_what_expired() {
        let refused = |r: DownRefusal, expired: u64| match answer_of(
            Some(&PushOutcome::Done(Pushed::Refused(r), expired)),
            "sensors",
            "hall",
        ) {
            PushAnswer::Refused { why, expired, .. } => (why, expired),
            other => panic!("{other:?}"),
        };
        let (why, expired) = refused(
            DownRefusal::Records {
                pushing: 6,
                waiting: 0,
                max: 5,
            },
            5,
        );
        assert_eq!(expired, 5);
        for words in [
            "nothing was queued for hall in app sensors",
            "this push has 6 records; 0 already wait for hall; at most 5 may wait",
            "max_records in [apps.sensors.downlink] of the apps file",
            "push fewer at once, wait until the device takes what waits, or raise max_records and reload",
            "this push deleted 5 of hall's records that had expired unsent",
        ] {
            assert!(why.contains(words), "{words:?} not in {why:?}");
        }
        let (why, _) = refused(
            DownRefusal::Bytes {
                pushing: 120,
                waiting: 1,
                max: 100,
            },
            0,
        );
        for words in [
            "this push has 120 bytes of records; 1 byte already waits for hall; at most 100 may wait",
            "max_bytes in [apps.sensors.downlink]",
            "raise max_bytes and reload",
        ] {
            assert!(why.contains(words), "{words:?} not in {why:?}");
        }
        assert!(!why.contains("expired"), "{why}");
        let (why, _) = refused(
            DownRefusal::TooLarge {
                index: 1,
                len: 1025,
            },
            0,
        );
        assert!(
            why.contains("record 2 of this push is 1025 bytes") && why.contains("split it"),
            "{why}"
        );
    }
}
