//! A push of downlink records (docs/downlink.md, "Queueing records"), handed from the HTTP thread, which serves the
//! push socket, to the receive loop, whose app host owns the stores: the request, its answer, and the bounded queue
//! between them.
//!
//! It lives on the floor because three rooms pass it along: the HTTP server makes it, the receive loop takes it
//! between turns, and the app host queues its records and answers it once they are synced. The answer is plain
//! data, so that none of them needs another's types.

use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};

use tokio::sync::oneshot;

use super::wake::Wake;

/// Pushes waiting for the receive loop before the server answers 503: each is at most [`MAX_PUSH_BODY`], and the
/// loop takes every waiting push each round.
pub const PUSH_QUEUE: usize = 64;

/// Largest push body: 4 MiB is four times the default `max_bytes` a sender may have waiting.
pub const MAX_PUSH_BODY: usize = 4 << 20;

/// One push: records for one sender of one app, queued all or nothing.
#[derive(Debug)]
pub struct PushRequest {
    pub app: String,
    /// The sender's name, as in the senders file.
    pub to: String,
    pub records: Vec<Vec<u8>>,
    /// Sent once the records are synced, or refused; dropped unsent if the node stops first.
    pub answer: oneshot::Sender<PushAnswer>,
}

/// Which bound refused a push.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushBound {
    /// A record is larger than the downlink's record limit.
    TooLarge,
    MaxRecords,
    MaxBytes,
}

impl PushBound {
    /// The word the push socket's answer names it by (docs/downlink.md).
    pub fn word(self) -> &'static str {
        match self {
            PushBound::TooLarge => "too_large",
            PushBound::MaxRecords => "max_records",
            PushBound::MaxBytes => "max_bytes",
        }
    }
}

/// What became of a push.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PushAnswer {
    /// Queued and synced: sequences `first` ..= `first + count - 1`. `expired`: the sender's records that expired
    /// and were deleted by this push.
    Queued {
        first: u64,
        count: u64,
        expired: u64,
    },
    /// Nothing queued: a bound would be passed.
    Refused { bound: PushBound, why: String },
    /// No such app, or no such sender for it.
    NotFound(String),
    /// Nothing queued: the app's store failed, or the node is stopping. The same push later may succeed.
    Unavailable(String),
}

/// Why a push was not queued for the loop.
#[derive(Debug)]
pub enum PushRefused {
    /// [`PUSH_QUEUE`] pushes wait already.
    Busy,
    /// The receive loop is gone.
    Stopped,
}

/// The producer's end (the HTTP server).
#[derive(Debug, Clone)]
pub struct PushInbox {
    tx: SyncSender<PushRequest>,
    wake: Arc<Wake>,
}

impl PushInbox {
    /// Queues a push and wakes the loop; never blocks.
    pub fn send(&self, request: PushRequest) -> Result<(), PushRefused> {
        match self.tx.try_send(request) {
            Ok(()) => {
                self.wake.wake();
                Ok(())
            }
            Err(TrySendError::Full(_)) => Err(PushRefused::Busy),
            Err(TrySendError::Disconnected(_)) => Err(PushRefused::Stopped),
        }
    }
}

/// The consumer's end (the receive loop). Dropping it drops every queued push's answer: each is told 503.
#[derive(Debug)]
pub struct PushQueue {
    rx: Receiver<PushRequest>,
}

impl PushQueue {
    pub fn try_recv(&self) -> Option<PushRequest> {
        self.rx.try_recv().ok()
    }
}

/// A queue of at most [`PUSH_QUEUE`] pushes that wakes `wake` (the loop's own) when one is queued.
pub fn push_channel(wake: Arc<Wake>) -> (PushInbox, PushQueue) {
    let (tx, rx) = mpsc::sync_channel(PUSH_QUEUE);
    (PushInbox { tx, wake }, PushQueue { rx })
}
