//! The push datagram socket (docs/downlink.md, "The push datagram socket"): a Unix datagram socket on which programs
//! of the node's machine queue downlink records, a push per datagram, read by the receive loop itself and answered
//! by it, one datagram back to the pusher's address, once the records are synced or refused.
//!
//! Why beside the push socket's HTTP: a push through the HTTP thread crosses two threads more than a device's
//! datagram does (the HTTP thread's wake and hyper's request, the hand-over to the loop, and the answer's wake of
//! the HTTP thread before the loop sends the DOWN), which research/035 measured at about 0.2 ms of a push to a live
//! session. A datagram read where the store is reaches the loop as a device's datagram does: one wake. The wire is
//! the HTTP push's own request and answer in two lines (the query, then the body; the status, then the JSON), so the
//! two sockets cannot drift, and a pusher needs no library: any language's Unix datagram socket will do. Why no
//! connection: the loop holds nothing per pusher but the pushes it has taken and not yet answered (at most
//! [`MAX_IN_HAND`]); past that it reads no more, and the kernel holds the pushers back.
//!
//! Who may push is who may write the socket file (mode `0660`), as for the stream socket. A datagram's source address
//! is the pusher's own bound socket, as the kernel says, so an answer cannot be sent elsewhere.
//!
//! The sender is looked up by name here, on the loop (the HTTP path does it on its thread: common/push.rs says why).
//! The list's index by name is made off the loop at its first lookup (`common::push::find_name`); until it is
//! there a lookup is a scan of the names, about half a millisecond at a million senders, so names found are kept
//! (at most [`NAMES_KEPT`], all forgotten when that many are and when the allow-list changes), and a round looks up
//! at most [`SCANS_PER_ROUND`] names not kept: a stream of pushes to many senders is slowed, the uplink is not.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::os::unix::io::{AsRawFd, RawFd};
use std::os::unix::net::{SocketAddr as UnixAddr, UnixDatagram};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::oneshot::{self, error::TryRecvError};

use crate::common::push::{
    PushAnswer, PushRequest, answer_json, clear_socket_path, error_json, lines, make_private,
    maybe_queued_json, target, too_large_json,
};
use crate::proto::allow_list::{AllowList, SenderIndex};

/// The largest push datagram: 64 KiB, room for 63 records of the largest size (1024 bytes). A larger push goes
/// through the stream socket (4 MiB).
pub const MAX_PUSH_DATAGRAM: usize = 65_536;

/// The longest first line (the target) a push datagram may have: far more than an app's and a sender's names.
const MAX_FIRST_LINE: usize = 1024;

/// Pushes taken from the socket and not yet answered; past it the loop reads no more until some are answered.
pub const MAX_IN_HAND: usize = 64;

/// Datagrams read in one round of the loop, so that a stream of pushes shares the loop with the devices.
const READ_PER_ROUND: usize = 16;

/// Names looked up by a scan of the allow-list in one round (module doc).
const SCANS_PER_ROUND: usize = 4;

/// Names kept with their index in the allow-list.
const NAMES_KEPT: usize = 1024;

/// How long a push waits for its answer before it is answered that it may or may not be queued (as on the stream
/// socket).
const ANSWER_WITHIN: Duration = Duration::from_secs(30);

/// The receive buffer asked for: pushes wait in the kernel while the loop has [`MAX_IN_HAND`] in hand.
const RECEIVE_BUFFER: usize = 1 << 20;

/// Why the push datagram socket could not be made; names its path.
#[derive(Debug, thiserror::Error)]
#[error("push datagram socket {path}: {why}")]
pub struct PushDatagramError {
    pub path: PathBuf,
    pub why: String,
}

/// What the socket did, for the metrics.
#[derive(Debug, Default, Clone, Copy)]
pub struct DatagramCounts {
    /// Pushes read (well formed or not).
    pub taken: u64,
    /// Answers not sent: the pusher's socket has no address (it did not bind), is gone, or its buffer is full.
    pub unanswered: u64,
}

/// A push taken and not yet answered.
struct InHand {
    to: UnixAddr,
    app: String,
    sender: String,
    /// The app host's answer to come; none for a push answered by this socket itself (malformed, too large).
    answer: Option<oneshot::Receiver<PushAnswer>>,
    /// Its answer once known, sent when the pusher's earlier pushes are answered.
    ready: Option<(u16, serde_json::Value)>,
    by: Instant,
}

/// The push datagram socket, driven by the receive loop.
pub struct PushDatagrams {
    socket: UnixDatagram,
    path: PathBuf,
    ino: u64,
    buf: Vec<u8>,
    in_hand: Vec<InHand>,
    names: HashMap<Box<str>, Option<SenderIndex>>,
    names_of: Option<Arc<AllowList>>,
    counts: DatagramCounts,
}

impl PushDatagrams {
    /// Binds `path`, mode `0660`. A socket left there by a node that is gone is replaced; a socket another process
    /// is bound to, or a file that is not a socket, is an error that names the path.
    pub fn bind(path: &Path) -> Result<Self, PushDatagramError> {
        let problem = |why: String| PushDatagramError {
            path: path.to_path_buf(),
            why,
        };
        clear_socket_path(
            path,
            |p| UnixDatagram::unbound().is_ok_and(|probe| probe.connect(p).is_ok()),
            "--push-datagrams",
        )
        .map_err(problem)?;
        let socket =
            UnixDatagram::bind(path).map_err(|e| problem(crate::common::push::bind_problem(&e)))?;
        let ino = make_private(path).map_err(problem)?;
        socket
            .set_nonblocking(true)
            .map_err(|e| problem(format!("cannot make it non-blocking ({e})")))?;
        // A smaller buffer than asked is no fault: pushers then wait in send sooner.
        let _ = socket2::SockRef::from(&socket).set_recv_buffer_size(RECEIVE_BUFFER);
        Ok(PushDatagrams {
            socket,
            path: path.to_path_buf(),
            ino,
            buf: vec![0; MAX_PUSH_DATAGRAM + 1],
            in_hand: Vec::new(),
            names: HashMap::new(),
            names_of: None,
            counts: DatagramCounts::default(),
        })
    }

    /// The descriptor to wait on, when the loop would read it: none while [`MAX_IN_HAND`] pushes are in hand.
    pub fn fd_to_wait_on(&self) -> Option<RawFd> {
        (self.in_hand.len() < MAX_IN_HAND).then(|| self.socket.as_raw_fd())
    }

    pub fn counts(&self) -> DatagramCounts {
        self.counts
    }

    /// Reads up to a round's pushes (the loop calls it only when its poll found the socket readable, so a round
    /// without a push costs no read) and hands each well-formed one to `push` (the app host), looked up in `senders`
    /// (the loop's allow-list); a malformed or too large one gets its answer here, sent in its turn among the
    /// pusher's answers.
    pub fn take(
        &mut self,
        now: Instant,
        senders: &Arc<AllowList>,
        mut push: impl FnMut(PushRequest),
    ) {
        if !self
            .names_of
            .as_ref()
            .is_some_and(|l| Arc::ptr_eq(l, senders))
        {
            self.names.clear();
            self.names_of = Some(senders.clone());
        }
        let mut scans = 0;
        for _ in 0..READ_PER_ROUND {
            if self.in_hand.len() >= MAX_IN_HAND || scans >= SCANS_PER_ROUND {
                break;
            }
            let (len, from) = match self.socket.recv_from(&mut self.buf) {
                Ok(r) => r,
                // WouldBlock: none waits. Anything else (ENOMEM) is retried next round; nothing was taken.
                Err(_) => break,
            };
            self.counts.taken += 1;
            if len > MAX_PUSH_DATAGRAM {
                let answer = too_large_json(format!(
                    "this push datagram is more than {MAX_PUSH_DATAGRAM} bytes, the most one push datagram takes: \
                     nothing was queued; push the records in parts, or through the push socket (4 MiB a push)"
                ));
                self.answer_later(from, answer);
                continue;
            }
            let (head, body) = match memchr::memchr(b'\n', &self.buf[..len]) {
                Some(k) => (&self.buf[..k], &self.buf[k + 1..len]),
                None => (&self.buf[..len], &[][..]),
            };
            // Bounded, so that what an error answer repeats of it is too.
            let target = if head.len() > MAX_FIRST_LINE {
                Err(format!(
                    "the first line is {} bytes, more than the {MAX_FIRST_LINE} a push's target may have",
                    head.len()
                ))
            } else {
                std::str::from_utf8(head)
                    .map_err(|_| "the first line is not UTF-8".to_string())
                    .and_then(target)
            };
            let (app, to) = match target {
                Ok(t) => t,
                Err(why) => {
                    let answer = error_json(
                        400,
                        format!(
                            "{why}; a push datagram is app=APP&to=SENDER on its first line, then the records, one \
                             per line (docs/downlink.md)"
                        ),
                    );
                    self.answer_later(from, answer);
                    continue;
                }
            };
            let records = lines(body);
            let index = match self.names.get(to.as_str()) {
                Some(index) => *index,
                None => {
                    scans += 1;
                    let index = crate::common::push::find_name(senders, &to);
                    if self.names.len() >= NAMES_KEPT {
                        self.names.clear();
                    }
                    self.names.insert(to.as_str().into(), index);
                    index
                }
            };
            let (request, rx) =
                PushRequest::looked_up(app.clone(), to.clone(), records, senders, index);
            push(request);
            self.in_hand.push(InHand {
                to: from,
                app,
                sender: to,
                answer: Some(rx),
                ready: None,
                by: now + ANSWER_WITHIN,
            });
        }
    }

    /// Keeps `answer` for a push this socket answers itself, to go out after the pusher's earlier pushes' answers.
    fn answer_later(&mut self, to: UnixAddr, answer: (u16, serde_json::Value)) {
        self.in_hand.push(InHand {
            to,
            app: String::new(),
            sender: String::new(),
            answer: None,
            ready: Some(answer),
            by: Instant::now(),
        });
    }

    /// At the node's stop, after [`PushDatagrams::answer`] answered every push in hand: removes the socket, so that
    /// no push can be sent to it any more, then answers each push still waiting in its queue (never taken) 503.
    pub fn close(&mut self) {
        self.remove_file();
        while let Ok((_, from)) = self.socket.recv_from(&mut self.buf) {
            self.counts.taken += 1;
            self.send(
                &from,
                error_json(
                    503,
                    "the node is stopping: this push was not taken, and nothing of it was queued",
                ),
            );
        }
    }

    fn remove_file(&mut self) {
        if std::fs::symlink_metadata(&self.path).is_ok_and(|m| m.ino() == self.ino) {
            let _ = std::fs::remove_file(&self.path);
        }
    }

    /// Sends the answers that are ready, each pusher's in the order of its pushes. `stopped`: the node is about to
    /// exit, so every push still in hand is answered now.
    pub fn answer(&mut self, now: Instant, stopped: bool) {
        if self.in_hand.is_empty() {
            return;
        }
        for h in self.in_hand.iter_mut().filter(|h| h.ready.is_none()) {
            let Some(answer) = h.answer.as_mut() else {
                continue;
            };
            h.ready = match answer.try_recv() {
                Ok(a) => Some(answer_json(&h.app, &h.sender, a)),
                Err(TryRecvError::Closed) => Some(error_json(
                    503,
                    "the node stopped before the push was applied: nothing was queued",
                )),
                Err(TryRecvError::Empty) if stopped || now >= h.by => {
                    Some(maybe_queued_json(format!(
                        "no answer within {} s, or the node stopped first (the store may be slow or its disk \
                     failing): the records may or may not be queued; pushing them again may queue them twice",
                        ANSWER_WITHIN.as_secs()
                    )))
                }
                Err(TryRecvError::Empty) => None,
            };
        }
        // Pushers with an earlier push not answered yet: their later answers wait behind it.
        let mut behind: Vec<UnixAddr> = Vec::new();
        let mut i = 0;
        while i < self.in_hand.len() {
            let h = &self.in_hand[i];
            let waits = behind.iter().any(|w| same_addr(w, &h.to));
            if h.ready.is_some() && !waits {
                let h = self.in_hand.remove(i);
                if let Some(a) = h.ready {
                    self.send(&h.to, a);
                }
            } else {
                if !waits {
                    behind.push(h.to.clone());
                }
                i += 1;
            }
        }
    }

    fn send(&mut self, to: &UnixAddr, (status, value): (u16, serde_json::Value)) {
        if to.is_unnamed() {
            self.counts.unanswered += 1;
            return;
        }
        let bytes = format!("{status} {value}\n");
        if self.socket.send_to_addr(bytes.as_bytes(), to).is_err() {
            self.counts.unanswered += 1;
        }
    }
}

impl Drop for PushDatagrams {
    /// Removes the socket file if it is still the one this node bound (not one a later node bound there).
    fn drop(&mut self) {
        self.remove_file();
    }
}

/// Whether two pushers' addresses are the same socket: the same path, the same abstract name, or both unnamed (which
/// are never answered, so their order does not matter).
fn same_addr(a: &UnixAddr, b: &UnixAddr) -> bool {
    use std::os::linux::net::SocketAddrExt;
    a.as_pathname() == b.as_pathname() && a.as_abstract_name() == b.as_abstract_name()
}
