//! A push of downlink records (docs/downlink.md, "Queueing records"), handed from the HTTP thread, which serves the
//! push socket, to the receive loop, whose app host owns the stores: the request, its answer, and the bounded queue
//! between them.
//!
//! It lives on the floor because three rooms pass it along: the HTTP server makes it, the receive loop takes it
//! between turns, and the app host queues its records and answers it once they are synced. The answer is plain
//! data, so that none of them needs another's types.
//!
//! The sender is looked up by name on the HTTP thread, not on the loop. The loop publishes its allow-list to the
//! inbox at start and after each reload; a request carries the list it was looked up in, and the loop trusts the
//! lookup only if that is still its own list (else it looks again, once). Every lookup by name goes through
//! [`find_name`]: a list's index by name is made at its first lookup, off the loop, and until it is there the
//! lookups scan the names (about half a millisecond at a million senders, research/024; with the index about a
//! microsecond, research/046).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};

use crate::proto::allow_list::{AllowList, SenderIndex};

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
    /// A file pushed as pieces instead of `records` (then empty), shared by every sender of its request: stored once
    /// per app ([`super::blob::DownBlob`]).
    pub blob: Option<Arc<super::blob::DownBlob>>,
    /// Sent once the records are synced, or refused; dropped unsent if the node stops first.
    pub answer: AnswerTo,
    /// `to` looked up by the producer ([`PushInbox::look_up`]), if it did.
    pub found: Option<Found>,
}

impl PushRequest {
    /// A push of `records` to `to` in `app`, its sender looked up in `list` (`index`, none: no such sender there), and
    /// where its answer will come.
    pub fn looked_up(
        app: String,
        to: String,
        records: Vec<Vec<u8>>,
        list: &Arc<AllowList>,
        index: Option<SenderIndex>,
    ) -> (Self, oneshot::Receiver<PushAnswer>) {
        let (tx, rx) = oneshot::channel();
        let request = PushRequest {
            app,
            to,
            records,
            blob: None,
            answer: tx.into(),
            found: Some(Found {
                list: list.clone(),
                index,
            }),
        };
        (request, rx)
    }
}

/// A sender looked up by name in one allow-list.
#[derive(Debug, Clone)]
pub struct Found {
    pub list: Arc<AllowList>,
    /// The sender's index in `list`, or none: `list` has no sender of that name.
    pub index: Option<SenderIndex>,
}

impl Found {
    /// The lookup's answer if it was made in `current`, the loop's list now; else none (look again).
    pub fn in_list(&self, current: &Arc<AllowList>) -> Option<Option<SenderIndex>> {
        Arc::ptr_eq(&self.list, current).then_some(self.index)
    }
}

/// Lists of at most this many senders have their index by name made by the first lookup itself, on whichever
/// thread asks, the receive loop included (at most about half a millisecond here, what one scan of a million names
/// costs: research/046 measured 124 ms for a million under load); a longer list's is made on a thread of its own,
/// and lookups scan until it is there.
const INDEX_NAMES_INLINE: usize = 4096;

/// Finds the sender named `name` in `list` without waiting for more than a scan: by the list's index by name, and
/// at the first lookup in a list, the index is made (on a thread of its own for a long list, so that neither the
/// receive loop nor the HTTP thread waits for it; the lookups meanwhile scan). A node never pushed to never makes
/// one (about 5 B of heap per sender, research/046).
pub fn find_name(list: &Arc<AllowList>, name: &str) -> Option<SenderIndex> {
    start_name_index(list);
    list.find_name(name)
}

/// [`find_name`] where it costs no scan of a long list: the list's index by name is there (made now if the list is
/// short); else none, and the index is being made.
pub fn find_name_without_scan(list: &Arc<AllowList>, name: &str) -> Option<Option<SenderIndex>> {
    start_name_index(list);
    list.name_index().is_some().then(|| list.find_name(name))
}

/// Makes `list`'s index by name at its first lookup: at once for a short list, on a thread of its own for a long one.
fn start_name_index(list: &Arc<AllowList>) {
    if list.name_index().is_none() && list.claim_name_index() {
        if list.len() <= INDEX_NAMES_INLINE {
            list.index_names();
        } else {
            let made = list.clone();
            let spawned = std::thread::Builder::new()
                .name("pure-names".into())
                .spawn(move || {
                    made.index_names();
                });
            if let Err(e) = spawned {
                // Not fatal: lookups in this list go on scanning.
                tracing::warn!("could not start a thread to index the senders by name: {e}");
            }
        }
    }
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
    /// A push of no record: the app and the sender were found and the app takes records for it; nothing was
    /// queued (a typo in either is answered [`PushAnswer::NotFound`] as for a push of records).
    Empty,
    /// Nothing queued: a bound would be passed. `expired`: the sender's records that expired and were deleted by
    /// this push all the same (its transaction committed them).
    Refused {
        bound: PushBound,
        why: String,
        expired: u64,
    },
    /// No such sender for the app.
    NotFound(String),
    /// The node has no such app (answered as [`PushAnswer::NotFound`]; a push to many whose every line names it is
    /// answered 404 whole, as one push is).
    NoSuchApp(String),
    /// The sender is listed but the app does not accept it (answered as [`PushAnswer::NotFound`]; a push to every
    /// sender an app accepts passes over it).
    NotAccepted(String),
    /// Nothing queued: the app's store failed, or the node is stopping. The same push later may succeed.
    Unavailable(String),
    /// The push may or may not be queued: its store failed after it may have committed it (a failed sync, a
    /// checkpoint, a fleet's connection lost after its COMMIT was sent). Pushing it again may queue it twice.
    MaybeQueued(String),
}

/// Where a push's answer goes: to its own pusher, or as one line of a push of many (`POST /push-many`,
/// docs/downlink.md "Pushing to many devices"), whose answers go back together.
#[derive(Debug)]
pub enum AnswerTo {
    One(oneshot::Sender<PushAnswer>),
    Line(LineAnswer),
}

impl AnswerTo {
    /// Sends the answer; `Err` gives it back when nobody waits for it any more.
    pub fn send(self, answer: PushAnswer) -> Result<(), PushAnswer> {
        match self {
            AnswerTo::One(tx) => tx.send(answer),
            AnswerTo::Line(mut line) => {
                line.put(answer);
                Ok(())
            }
        }
    }
}

impl From<oneshot::Sender<PushAnswer>> for AnswerTo {
    fn from(tx: oneshot::Sender<PushAnswer>) -> Self {
        AnswerTo::One(tx)
    }
}

/// The answers of a batch of lines of a push of many: sent together once every line has its own.
#[derive(Debug)]
struct BatchAnswers {
    answers: Vec<Option<PushAnswer>>,
    left: usize,
    done: Option<oneshot::Sender<Vec<PushAnswer>>>,
}

/// One line's answer slot in a batch ([`batch_answers`]). Dropped unanswered (the node stopped before the line was
/// applied), it answers that nothing was queued, as a single push's pusher is told when its answer is dropped.
#[derive(Debug)]
pub struct LineAnswer {
    batch: Arc<Mutex<BatchAnswers>>,
    k: usize,
    answered: bool,
}

impl LineAnswer {
    fn put(&mut self, answer: PushAnswer) {
        self.answered = true;
        let mut b = self
            .batch
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if b.answers[self.k].replace(answer).is_none() {
            b.left -= 1;
        }
        if b.left == 0
            && let Some(done) = b.done.take()
        {
            let all = b
                .answers
                .iter_mut()
                .map(|a| a.take().unwrap_or(PushAnswer::Empty))
                .collect();
            let _ = done.send(all);
        }
    }
}

impl Drop for LineAnswer {
    fn drop(&mut self) {
        if !self.answered {
            self.put(PushAnswer::Unavailable(
                "the node stopped before this line was applied: nothing of it was queued".into(),
            ));
        }
    }
}

/// `n` answer slots and where their answers come, together, in the order of the slots.
pub fn batch_answers(n: usize) -> (Vec<LineAnswer>, oneshot::Receiver<Vec<PushAnswer>>) {
    let (tx, rx) = oneshot::channel();
    let batch = Arc::new(Mutex::new(BatchAnswers {
        answers: (0..n).map(|_| None).collect(),
        left: n,
        done: Some(tx),
    }));
    if n == 0 {
        let _ = batch
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .done
            .take()
            .map(|d| d.send(Vec::new()));
    }
    let slots = (0..n)
        .map(|k| LineAnswer {
            batch: batch.clone(),
            k,
            answered: false,
        })
        .collect();
    (slots, rx)
}

/// What the push queue carries: one push, or a batch of the lines of a push of many, taken into one turn.
#[derive(Debug)]
pub enum PushWork {
    One(PushRequest),
    Many(Vec<PushRequest>),
}

impl PushWork {
    pub fn into_requests(self) -> std::vec::IntoIter<PushRequest> {
        match self {
            PushWork::One(r) => vec![r].into_iter(),
            PushWork::Many(v) => v.into_iter(),
        }
    }
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
    tx: SyncSender<PushWork>,
    wake: Arc<Wake>,
    senders: Arc<Mutex<Arc<AllowList>>>,
}

impl PushInbox {
    /// Looks `name` up in the loop's allow-list as last published, on the caller's thread.
    pub fn look_up(&self, name: &str) -> Found {
        let list = self
            .senders
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone();
        let index = find_name(&list, name);
        Found { list, index }
    }

    /// The allow-list as the loop last published it.
    pub fn list(&self) -> Arc<AllowList> {
        self.senders
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Queues a push and wakes the loop; never blocks.
    pub fn send(&self, request: PushRequest) -> Result<(), PushRefused> {
        self.send_work(PushWork::One(request))
    }

    /// Queues a batch of pushes, taken into one turn, and wakes the loop; never blocks. Refused, the batch comes back.
    pub fn send_many(
        &self,
        requests: Vec<PushRequest>,
    ) -> Result<(), (PushRefused, Vec<PushRequest>)> {
        match self.tx.try_send(PushWork::Many(requests)) {
            Ok(()) => {
                self.wake.wake();
                Ok(())
            }
            Err(TrySendError::Full(w)) => Err((PushRefused::Busy, w.into_requests().collect())),
            Err(TrySendError::Disconnected(w)) => {
                Err((PushRefused::Stopped, w.into_requests().collect()))
            }
        }
    }

    fn send_work(&self, work: PushWork) -> Result<(), PushRefused> {
        match self.tx.try_send(work) {
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
    rx: Receiver<PushWork>,
    senders: Arc<Mutex<Arc<AllowList>>>,
}

impl PushQueue {
    /// Makes `list` the one producers look senders up in (at start and after a reload).
    pub fn publish(&self, list: Arc<AllowList>) {
        *self
            .senders
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = list;
    }

    pub fn try_recv(&self) -> Option<PushWork> {
        self.rx.try_recv().ok()
    }
}

/// A queue of at most [`PUSH_QUEUE`] pushes that wakes `wake` (the loop's own) when one is queued; producers look
/// senders up in `senders` until [`PushQueue::publish`] gives another list.
pub fn push_channel(wake: Arc<Wake>, senders: Arc<AllowList>) -> (PushInbox, PushQueue) {
    let (tx, rx) = mpsc::sync_channel(PUSH_QUEUE);
    let senders = Arc::new(Mutex::new(senders));
    (
        PushInbox {
            tx,
            wake,
            senders: senders.clone(),
        },
        PushQueue { rx, senders },
    )
}

/// Makes `path` ready for one of the node's push sockets to be bound at: a socket there that `answers` (another
/// process is bound to it) is refused, as is a file that is not a socket; a socket nobody answers on, left by a node
/// that did not stop cleanly, is removed. `flag` is the flag that puts the socket elsewhere, for the messages.
pub fn clear_socket_path(
    path: &std::path::Path,
    answers: impl Fn(&std::path::Path) -> bool,
    flag: &str,
) -> Result<(), String> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            if answers(path) {
                return Err(format!(
                    "another process answers on it (another node?): stop it, or give this node another {flag}"
                ));
            }
            std::fs::remove_file(path)
                .map_err(|e| format!("a stale socket is there and cannot be removed ({e})"))
        }
        Ok(_) => Err(format!(
            "it exists and is not a socket: remove it, or give {flag} another path"
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("cannot look at it ({e})")),
    }
}

/// The longest path a Unix socket's address holds: `sun_path` is 108 bytes, its NUL included.
pub const MAX_SOCKET_PATH: usize = 107;

/// Where the node serves its push sockets (docs/downlink.md): (the stream socket, the datagram socket), `None` for
/// one it serves nowhere, from `--push-socket` and `--push-datagrams` as given (`None`: not given) and the state
/// directory. The datagram socket's default is the stream socket's path with the extension `.dgram` (`.dgram`
/// added to a path that has it already).
pub fn socket_paths(
    push_socket: Option<&std::path::Path>,
    push_datagrams: Option<&std::path::Path>,
    state: &std::path::Path,
) -> (Option<std::path::PathBuf>, Option<std::path::PathBuf>) {
    let stream = match push_socket {
        Some(p) if p.as_os_str() == "none" => None,
        Some(p) => Some(p.to_path_buf()),
        None => Some(state.join("push.sock")),
    };
    let datagrams = match (push_datagrams, &stream) {
        (Some(p), _) if p.as_os_str() == "none" => None,
        (Some(p), _) => Some(p.to_path_buf()),
        // A push socket named *.dgram gets *.dgram.dgram, not its own path.
        (None, Some(s)) if s.extension().is_some_and(|e| e == "dgram") => {
            let mut name = s.as_os_str().to_owned();
            name.push(".dgram");
            Some(std::path::PathBuf::from(name))
        }
        (None, Some(s)) => Some(s.with_extension("dgram")),
        (None, None) => None,
    };
    (stream, datagrams)
}

/// One of the two push sockets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushSocketKind {
    Stream,
    Datagram,
}

/// A push socket's path that cannot be bound, found before binding (the node at its start, `check`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathProblem {
    pub kind: PushSocketKind,
    pub path: std::path::PathBuf,
    /// What is wrong, the flag to change and the fix.
    pub why: String,
}

impl std::fmt::Display for PathProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match self.kind {
            PushSocketKind::Stream => "push socket",
            PushSocketKind::Datagram => "push datagram socket",
        };
        write!(f, "{what} {}: {}", self.path.display(), self.why)
    }
}

/// What can be told about the push sockets' paths before binding them: the same path for both, a path too long
/// for a Unix socket, a directory that is not there. `datagrams_given`: `--push-datagrams` was given (else its path
/// was made from `--push-socket`'s, and that is the flag to change). `state`: the state directory, which the node
/// makes at its start, so it need not exist yet.
pub fn path_problems(
    stream: Option<&std::path::Path>,
    datagrams: Option<&std::path::Path>,
    datagrams_given: bool,
    state: Option<&std::path::Path>,
) -> Vec<PathProblem> {
    use std::os::unix::ffi::OsStrExt;
    let mut problems = Vec::new();
    let problem = |kind, path: &std::path::Path, why: String| PathProblem {
        kind,
        path: path.to_path_buf(),
        why,
    };
    if let (Some(s), Some(d)) = (stream, datagrams)
        && s == d
    {
        problems.push(problem(
            PushSocketKind::Datagram,
            d,
            "it is the push socket's own path (--push-socket): give one of them another".into(),
        ));
    }
    let datagrams_flag = if datagrams_given {
        "--push-datagrams"
    } else {
        "--push-socket"
    };
    for (kind, path, flag) in [
        (PushSocketKind::Stream, stream, "--push-socket"),
        (PushSocketKind::Datagram, datagrams, datagrams_flag),
    ] {
        let Some(path) = path else { continue };
        let len = path.as_os_str().as_bytes().len();
        if len > MAX_SOCKET_PATH {
            let fix = if kind == PushSocketKind::Datagram && !datagrams_given {
                "it is --push-socket's path with .dgram: give --push-socket a shorter path, or --push-datagrams one \
                 of its own (or none)"
            } else if kind == PushSocketKind::Datagram {
                "give --push-datagrams a shorter one (or none)"
            } else {
                "give --push-socket a shorter one (or none)"
            };
            problems.push(problem(
                kind,
                path,
                format!(
                    "its path is {len} bytes, and a Unix socket's path must be at most {MAX_SOCKET_PATH}: {fix}"
                ),
            ));
            continue;
        }
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => std::path::Path::new("."),
        };
        if !dir.is_dir() && Some(dir) != state {
            problems.push(problem(
                kind,
                path,
                format!(
                    "its directory {} does not exist: make it, or give {flag} another path",
                    dir.display()
                ),
            ));
        }
    }
    problems
}

/// Why a push socket could not be bound, and what to do.
pub fn bind_problem(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied => format!(
            "cannot bind it ({e}): its directory must exist and be writable by the node's user"
        ),
        // A path longer than a Unix socket's address holds (107 bytes) is refused as invalid input.
        std::io::ErrorKind::InvalidInput => format!(
            "cannot bind it ({e}): a Unix socket's path must be shorter than 108 bytes; choose a shorter one"
        ),
        _ => format!("cannot bind it ({e})"),
    }
}

/// After a push socket is bound at `path`: its mode made `0660` (who may push is who may open it), and its inode,
/// so that a node removes at its stop only the socket it bound.
pub fn make_private(path: &std::path::Path) -> Result<u64, String> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))
        .map_err(|e| format!("cannot set its mode to 0660 ({e})"))?;
    std::fs::symlink_metadata(path)
        .map(|m| m.ino())
        .map_err(|e| format!("cannot look at it after binding ({e})"))
}

/// What the push sockets answer (docs/downlink.md, "The push socket's requests"): the HTTP status and the JSON body,
/// the same on the stream socket (as HTTP) and on the datagram socket (as `STATUS JSON`).
pub fn answer_json(app: &str, to: &str, a: PushAnswer) -> (u16, serde_json::Value) {
    match a {
        PushAnswer::Queued {
            first,
            count,
            expired,
        } => (
            200,
            serde_json::json!({
                "app": app, "to": to, "first": first, "last": first + count.max(1) - 1, "count": count,
                "expired": expired,
            }),
        ),
        PushAnswer::Empty => (
            200,
            serde_json::json!({ "app": app, "to": to, "first": 0, "last": 0, "count": 0, "expired": 0 }),
        ),
        PushAnswer::Refused {
            bound,
            why,
            expired,
        } => {
            let status = match bound {
                PushBound::TooLarge => 413,
                _ => 409,
            };
            (
                status,
                serde_json::json!({ "error": why, "refused": bound.word(), "expired": expired }),
            )
        }
        PushAnswer::NotFound(why) | PushAnswer::NoSuchApp(why) | PushAnswer::NotAccepted(why) => {
            error_json(404, why)
        }
        PushAnswer::Unavailable(why) => error_json(503, why),
        PushAnswer::MaybeQueued(why) => maybe_queued_json(why),
    }
}

/// An answer that is only its `error`.
pub fn error_json(status: u16, why: impl Into<String>) -> (u16, serde_json::Value) {
    (status, serde_json::json!({ "error": why.into() }))
}

/// The answer to a push larger than a push socket takes (`why` says how large and what to do): refused `too_large`
/// like a record too large, so a client that reads `refused` of a 413 finds it; not counted in the app's refused
/// records (the push is not read, so neither are its records).
pub fn too_large_json(why: String) -> (u16, serde_json::Value) {
    (
        413,
        serde_json::json!({ "error": why, "refused": "too_large", "expired": 0 }),
    )
}

/// The answer to a push whose outcome the node does not know: 500, apart from 503's "nothing was queued", so that a
/// client can tell "push again" from "pushing again may queue twice" by the status alone.
pub fn maybe_queued_json(why: String) -> (u16, serde_json::Value) {
    (
        500,
        serde_json::json!({ "error": why, "maybe_queued": true }),
    )
}

/// `app` and `to` from a query string, percent-decoded.
pub fn target(query: &str) -> Result<(String, String), String> {
    let (mut app, mut to) = (None, None);
    for (k, v) in decoded_pairs(query)? {
        let slot = match k {
            "app" => &mut app,
            "to" => &mut to,
            _ => return Err(format!("unknown parameter {k:?}: a push takes app and to")),
        };
        // Refused, not "the last wins": a push goes to one sender of one app, and a guess could queue records for
        // the wrong device.
        if slot.is_some() {
            return Err(format!(
                "{k} is given twice: a push names one app and one sender (push to each in a request of its own)"
            ));
        }
        *slot = Some(v);
    }
    match (app, to) {
        (Some(a), Some(t)) if !a.is_empty() && !t.is_empty() => Ok((a, t)),
        _ => Err("a push names its app and its sender: POST /push?app=APP&to=SENDER".into()),
    }
}

/// The app of a push of many, `POST /push-many?app=APP` (docs/downlink.md, "Pushing to many devices"): its
/// senders are in its lines.
pub fn many_target(query: &str) -> Result<String, String> {
    let mut app = None;
    for (k, v) in decoded_pairs(query)? {
        match k {
            "app" if app.is_none() => app = Some(v),
            "app" => return Err("app is given twice: a push of many names one app".into()),
            "to" => {
                return Err(
                    "a push of many takes its senders from its lines (SENDER RECORD), not from to=: give app only"
                        .into(),
                );
            }
            _ => return Err(format!("unknown parameter {k:?}: a push of many takes app")),
        }
    }
    match app {
        Some(a) if !a.is_empty() => Ok(a),
        _ => Err(
            "a push of many names its app: POST /push-many?app=APP (or /push-all?app=APP)".into(),
        ),
    }
}

/// Whom a file pushed as pieces goes to (`POST /push-file`, docs/downlink.md "Pushing a file").
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileTargets {
    /// These senders, by name, each once.
    Names(Vec<String>),
    /// Every sender of the senders file that the app accepts.
    All,
}

/// The target of a file pushed as pieces: `POST /push-file?app=APP&to=A,B` or `?app=APP&all=1`, with an optional
/// `piece_size=N` (default and most [`super::blob::MAX_PIECE`]).
pub fn file_target(query: &str) -> Result<(String, FileTargets, usize), String> {
    let (mut app, mut to, mut all, mut piece) = (None, None, false, None);
    for (k, v) in decoded_pairs(query)? {
        match k {
            "app" if app.is_none() => app = Some(v),
            "to" if to.is_none() => to = Some(v),
            "all" if v == "1" && !all => all = true,
            "all" => return Err("all is given twice or is not 1: give all=1 once".into()),
            "piece_size" if piece.is_none() => {
                piece = Some(
                    v.parse::<usize>()
                        .ok()
                        .filter(|n| (1..=super::blob::MAX_PIECE).contains(n))
                        .ok_or_else(|| {
                            format!(
                                "piece_size {v:?} is not a number from 1 to {}",
                                super::blob::MAX_PIECE
                            )
                        })?,
                )
            }
            "app" | "to" | "piece_size" => {
                return Err(format!(
                    "{k} is given twice: a push of a file names it once"
                ));
            }
            _ => {
                return Err(format!(
                    "unknown parameter {k:?}: a push of a file takes app, to or all=1, and piece_size"
                ));
            }
        }
    }
    let Some(app) = app.filter(|a| !a.is_empty()) else {
        return Err(
            "a push of a file names its app: POST /push-file?app=APP&to=A,B (or &all=1)".into(),
        );
    };
    let targets = match (to, all) {
        (Some(_), true) => return Err("give to=A,B or all=1, not both".into()),
        (None, false) => {
            return Err(
                "a push of a file names its senders: to=A,B (comma-separated) or all=1".into(),
            );
        }
        (None, true) => FileTargets::All,
        (Some(to), false) => {
            let mut names: Vec<String> = Vec::new();
            for name in to.split(',') {
                if name.is_empty() {
                    return Err(format!(
                        "to={to:?} has an empty name: give names separated by single commas"
                    ));
                }
                if names.iter().any(|n| n == name) {
                    return Err(format!(
                        "{name:?} is named twice in to: name each sender once"
                    ));
                }
                names.push(name.to_string());
            }
            FileTargets::Names(names)
        }
    };
    Ok((app, targets, piece.unwrap_or(super::blob::MAX_PIECE)))
}

/// A query's `NAME=VALUE` pairs in their order, each value percent-decoded; an error names a value that is not
/// percent-encoded UTF-8. (The push sockets' targets and the status page's search.)
pub fn decoded_pairs(query: &str) -> Result<Vec<(&str, String)>, String> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            percent_decode(v)
                .map(|v| (k, v))
                .ok_or_else(|| format!("{k}: not a percent-encoded UTF-8 value"))
        })
        .collect()
}

/// Decodes `%XX` and `+` of a query value. By hand: two names per request need no URL crate.
fn percent_decode(v: &str) -> Option<String> {
    let b = v.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// The records of a body: each line without its `\n`; a last line without one counts; nothing after a last `\n`.
pub fn lines(body: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut rest = body;
    while !rest.is_empty() {
        match memchr::memchr(b'\n', rest) {
            Some(k) => {
                out.push(rest[..k].to_vec());
                rest = &rest[k + 1..];
            }
            None => {
                out.push(rest.to_vec());
                rest = &[];
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list_of(n: usize) -> Arc<AllowList> {
        Arc::new(AllowList::from_unique(
            (0..n)
                .map(|i| {
                    let mut k = [0u8; 32];
                    k[..4].copy_from_slice(&(i as u32).to_be_bytes());
                    k[31] = 1;
                    (format!("dev-{i}"), k)
                })
                .collect(),
        ))
    }

    /// A short list is indexed by its first lookup; a long one on a thread of its own while the lookups scan, and
    /// either way every lookup finds what the scan finds (research/046).
    #[test]
    fn the_first_lookup_by_name_makes_the_index_inline_or_on_a_thread() {
        let short = list_of(INDEX_NAMES_INLINE);
        assert!(short.name_index().is_none());
        assert_eq!(
            find_name(&short, "dev-7").map(|i| short.name(i)),
            Some("dev-7")
        );
        assert!(short.name_index().is_some());
        let long = list_of(INDEX_NAMES_INLINE + 1);
        let found = find_name(&long, "dev-4096");
        assert_eq!(found, long.scan_name("dev-4096"));
        assert_eq!(found.map(|i| long.name(i)), Some("dev-4096"));
        // The thread's index is there once it has run: wait for it (the event; the minute is only a safety valve
        // against a thread that never ran, not a bound on its speed).
        let gave_up = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while long.name_index().is_none() {
            assert!(
                std::time::Instant::now() < gave_up,
                "the index was never made"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        for name in ["dev-0", "dev-4096", "dev-4097", "dev-", "x"] {
            assert_eq!(find_name(&long, name), long.scan_name(name), "{name}");
        }
    }

    #[test]
    fn a_body_is_its_lines_and_an_unended_last_line_counts() {
        assert_eq!(lines(b""), Vec::<Vec<u8>>::new());
        assert_eq!(lines(b"a\n\nb"), vec![b"a".to_vec(), vec![], b"b".to_vec()]);
        assert_eq!(lines(b"a\n"), vec![b"a".to_vec()]);
        assert_eq!(lines(b"\n"), vec![Vec::<u8>::new()]);
    }

    #[test]
    fn a_files_target_is_its_app_its_senders_or_all_and_its_piece_size() {
        assert_eq!(
            file_target("app=main&to=a,b%2Cc"),
            Ok((
                "main".into(),
                FileTargets::Names(vec!["a".into(), "b".into(), "c".into()]),
                1024
            ))
        );
        assert_eq!(
            file_target("app=main&all=1&piece_size=200"),
            Ok(("main".into(), FileTargets::All, 200))
        );
        for (query, words) in [
            ("app=main", "names its senders"),
            ("to=a", "names its app"),
            ("app=main&to=a&all=1", "not both"),
            ("app=main&to=a,,b", "empty name"),
            ("app=main&to=a,a", "named twice"),
            ("app=main&to=a&piece_size=1025", "from 1 to 1024"),
            ("app=main&to=a&piece_size=0", "from 1 to 1024"),
            ("app=main&all=2", "not 1"),
            ("app=main&to=a&x=1", "unknown parameter"),
        ] {
            let why = file_target(query).unwrap_err();
            assert!(why.contains(words), "{query}: {why}");
        }
    }

    #[test]
    fn the_target_is_decoded_and_checked() {
        assert_eq!(
            target("app=main&to=kitchen%2D1"),
            Ok(("main".into(), "kitchen-1".into()))
        );
        assert_eq!(target("to=a+b&app=x"), Ok(("x".into(), "a b".into())));
        assert!(target("app=main").is_err());
        assert!(target("app=main&to=").is_err());
        assert!(target("app=main&to=x&from=y").unwrap_err().contains("from"));
        assert!(target("app=%zz&to=x").is_err());
        assert!(target("app=%ff&to=x").is_err());
        // Named twice, even the same: refused, never the last one taken.
        assert!(
            target("app=main&to=a&to=b")
                .unwrap_err()
                .contains("to is given twice")
        );
        assert!(
            target("app=main&app=main&to=a")
                .unwrap_err()
                .contains("app is given twice")
        );
    }
}

/// One of the push socket's connections open: the receive loop takes one at accept, and it is given back when the
/// connection closes, on whichever thread serves it then (docs/downlink.md: at most
/// [`MAX_PUSH_CONNECTIONS`] at once).
#[derive(Debug)]
pub struct ConnectionSlot(Arc<AtomicUsize>);

impl ConnectionSlot {
    /// A slot of `open`, unless `max` are taken.
    pub fn take(open: &Arc<AtomicUsize>, max: usize) -> Option<Self> {
        open.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < max).then_some(n + 1)
        })
        .ok()
        .map(|_| ConnectionSlot(open.clone()))
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Push connections open at once (docs/downlink.md, "The push socket's requests"); one more is answered 503 and
/// closed. Pushers are the node's own machine's programs, so a few suffice, and a runaway one cannot take the
/// process's descriptors.
pub const MAX_PUSH_CONNECTIONS: usize = 32;

/// A push socket's connection the receive loop hands to the HTTP thread (research/054): what the loop does not
/// serve itself is served there by hyper, as if it had been accepted there.
#[derive(Debug)]
pub enum Handed {
    /// Write `write_first` (the end of an answer the loop could not write at once); then, if `serve`, serve the
    /// connection from `read` (the bytes the loop read off it and did not use) on; else close it.
    Serve {
        stream: std::os::unix::net::UnixStream,
        read: Vec<u8>,
        write_first: Vec<u8>,
        serve: bool,
        slot: ConnectionSlot,
    },
    /// A connection past [`MAX_PUSH_CONNECTIONS`]: answer it busy and close it.
    TurnAway(std::os::unix::net::UnixStream),
}
