//! The push socket's connections, accepted and polled by the receive loop (docs/downlink.md, "The push socket's
//! requests"; research/054). A whole `POST /push` that is in the socket when the loop reads it — the request line,
//! its headers and a `content-length` body of at most [`MAX_BODY_HERE`] bytes — is served here: its push goes to the
//! app host as a push datagram's does, its answer is written once the records are synced or refused, and the
//! connection, if its pusher keeps it, waits here for the next request (a new connection waits here for its first
//! one too, for at most the HTTP server's head timeout, as hyper would wait). Everything else goes to the HTTP
//! thread with the bytes read so far, and hyper serves it there as it serves every request of the socket: another
//! path or method, a chunked body or `expect`, a body not all there when read or larger, a request hyper must
//! refuse, what the pusher wrote after a push on the same connection, and a push whose sender only a scan of a long
//! allow-list would find past [`SCANS_PER_ROUND`] in a round (while the list's index by name is being made).
//!
//! Why here: through the HTTP thread a push costs a second thread's wake before its turn (the HTTP thread's, then
//! the loop's, research/053's stage table), which a push datagram does not pay. Read here it reaches the loop as a
//! device's datagram does: one wake. Why only the simplest requests: hyper (the well-kept HTTP library) stays the
//! server of everything else, with its limits and timeouts; what is parsed here is parsed with `httparse`, hyper's
//! own parser, and anything it would not take whole here is left to hyper whole. The loop never waits on a
//! connection: it reads what is there, and a request not all there is handed over, not waited for. At most
//! [`crate::common::push::MAX_PUSH_CONNECTIONS`] connections are open in all, on either thread.

use std::io::{self, Read as _, Write as _};
use std::os::unix::fs::MetadataExt;
use std::os::unix::io::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::{Duration, Instant};

use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::oneshot::{self, error::TryRecvError};

use crate::common::push::{
    ConnectionSlot, Handed, MAX_PUSH_CONNECTIONS, PushAnswer, PushRequest, answer_json, error_json,
    find_name, find_name_without_scan, lines, maybe_queued_json, target,
};
use crate::proto::allow_list::AllowList;

/// The largest body served here; a larger push (up to 4 MiB) is served by hyper.
pub const MAX_BODY_HERE: usize = 64 * 1024;

/// The longest request head read here (a push's line and headers are far shorter).
const MAX_HEAD: usize = 8 * 1024;

/// The most the loop reads of a connection: a head and a body it serves, and one byte to see that there is more.
const READ_AT_MOST: usize = MAX_HEAD + MAX_BODY_HERE + 1;

/// Headers a request served here may have.
const MAX_HEADERS: usize = 32;

/// Connections accepted in one round of the loop, so that a burst of pushers shares the loop with the devices.
const ACCEPT_PER_ROUND: usize = 8;

/// How long the loop waits for a new connection's request, without sleeping: a pusher writes it right after its
/// `connect`, which woke the loop (research/052: within 40–50 µs here). Past it the connection goes to hyper.
const REQUEST_SOON: Duration = Duration::from_micros(50);

/// Names looked up by a scan of a long allow-list in one round, while its index by name is being made (as on the push
/// datagram socket: about half a millisecond each at a million senders); past them a push goes to the HTTP thread,
/// which looks its sender up there.
const SCANS_PER_ROUND: usize = 4;

/// How long a push waits for its answer (as through hyper).
const ANSWER_WITHIN: Duration = Duration::from_secs(30);

/// How often the log says that pushers are turned away at the bound.
const BUSY_LOG_EVERY: Duration = Duration::from_secs(10);

/// A push whose answer is to come, and its connection.
struct InFlight {
    stream: UnixStream,
    slot: ConnectionSlot,
    /// What the pusher wrote after this request (read with it): the next request, served by hyper.
    rest: Vec<u8>,
    /// The pusher keeps the connection for another request.
    keep: bool,
    app: String,
    to: String,
    answer: oneshot::Receiver<PushAnswer>,
    by: Instant,
}

/// What the loop counts of the socket, for the metrics and tests.
#[derive(Debug, Default, Clone, Copy)]
pub struct StreamCounts {
    /// Pushes served here.
    pub served: u64,
    /// Connections handed to the HTTP thread (served there by hyper).
    pub handed: u64,
    /// Connections past the bound, answered busy.
    pub turned_away: u64,
}

/// A connection waiting for a request: new, or kept by its pusher for another request.
struct Idle {
    stream: UnixStream,
    slot: ConnectionSlot,
    /// When it is closed if no request came, as hyper closes one (its head timeout).
    until: Instant,
}

/// The push socket's listener, driven by the receive loop.
pub struct PushStream {
    listener: UnixListener,
    path: PathBuf,
    ino: u64,
    open: Arc<AtomicUsize>,
    hand: UnboundedSender<Handed>,
    /// How long a connection may wait for its request: [`crate::http::HttpLimits::head_timeout`], as for hyper.
    head_timeout: Duration,
    in_flight: Vec<InFlight>,
    /// Kept connections waiting for their next request, polled by the loop (at most one per connection open).
    idle: Vec<Idle>,
    buf: Vec<u8>,
    counts: StreamCounts,
    /// Names this round may still look up by a scan of the allow-list (its index by name not made yet).
    scans_left: usize,
    busy_logged: Option<Instant>,
    busy_since_log: u64,
}

/// What a connection's first bytes are ([`parse_request`]).
#[derive(Debug, PartialEq, Eq)]
pub enum Request {
    /// A complete `POST /push` to serve here: its query, body and what follows it.
    Push {
        query: String,
        body: std::ops::Range<usize>,
        rest: usize,
        keep: bool,
    },
    /// Anything else: hyper's.
    Other,
}

impl PushStream {
    /// The bound socket's listener (non-blocking), its path and the inode bound there (`http::push::PushSocket`);
    /// connections this loop does not serve go to `hand` (the HTTP thread).
    pub fn new(
        listener: UnixListener,
        path: PathBuf,
        ino: u64,
        hand: UnboundedSender<Handed>,
        head_timeout: Duration,
    ) -> Self {
        PushStream {
            listener,
            path,
            ino,
            open: Arc::new(AtomicUsize::new(0)),
            hand,
            head_timeout,
            in_flight: Vec::new(),
            idle: Vec::new(),
            buf: vec![0; READ_AT_MOST],
            counts: StreamCounts::default(),
            scans_left: SCANS_PER_ROUND,
            busy_logged: None,
            busy_since_log: 0,
        }
    }

    pub fn fd(&self) -> RawFd {
        self.listener.as_raw_fd()
    }

    pub fn counts(&self) -> StreamCounts {
        self.counts
    }

    /// The kept connections to poll for their next request, in the order `take`'s `idle_ready` bits are in.
    pub fn idle_fds(&self) -> impl Iterator<Item = RawFd> + '_ {
        self.idle.iter().map(|i| i.stream.as_raw_fd())
    }

    /// Serves the kept connections the loop's poll found readable (`idle_ready`: bit `i` for the `i`-th of
    /// [`PushStream::idle_fds`]) and, if `accept` (the poll found the listener readable), accepts up to a round's new
    /// connections; serves each one's push here or hands it over. A push goes to `push` (the app host), its sender
    /// looked up in `senders` (the loop's allow-list).
    pub fn take(
        &mut self,
        now: Instant,
        senders: &Arc<AllowList>,
        accept: bool,
        idle_ready: u64,
        mut push: impl FnMut(PushRequest),
    ) {
        self.scans_left = SCANS_PER_ROUND;
        if idle_ready != 0 {
            for (i, c) in std::mem::take(&mut self.idle).into_iter().enumerate() {
                if i < 64 && idle_ready & (1 << i) != 0 {
                    self.serve(c.stream, c.slot, Some(c.until), now, senders, &mut push);
                } else {
                    self.idle.push(c);
                }
            }
        }
        if !accept {
            return;
        }
        for _ in 0..ACCEPT_PER_ROUND {
            let stream = match self.listener.accept() {
                Ok((s, _)) => s,
                // WouldBlock: none waits. Anything else (EMFILE, ECONNABORTED) is tried again next round.
                Err(_) => break,
            };
            let Some(slot) = ConnectionSlot::take(&self.open, MAX_PUSH_CONNECTIONS) else {
                self.turn_away(stream, now);
                continue;
            };
            if stream.set_nonblocking(true).is_err() {
                continue;
            }
            request_soon(stream.as_raw_fd());
            self.serve(stream, slot, None, now, senders, &mut push);
        }
    }

    /// Reads what `stream` holds and serves its push here or hands it over with what was read. A connection its
    /// pusher closed is closed; one with nothing to read yet waits here for its request, `until` then (a new one:
    /// the head timeout from now).
    fn serve(
        &mut self,
        stream: UnixStream,
        slot: ConnectionSlot,
        until: Option<Instant>,
        now: Instant,
        senders: &Arc<AllowList>,
        push: &mut impl FnMut(PushRequest),
    ) {
        let (n, closed, request) = read_request(&stream, &mut self.buf);
        if n == 0 && closed {
            return;
        }
        if n == 0 {
            // Nothing yet (a kept connection woken for nothing, or a new one whose pusher has not written): it waits
            // here, polled with the others.
            self.idle.push(Idle {
                stream,
                slot,
                until: until.unwrap_or(now + self.head_timeout),
            });
            return;
        }
        let read = &self.buf[..n];
        let Request::Push {
            query,
            body,
            rest,
            keep,
        } = request
        else {
            let read = read.to_vec();
            self.hand_over(stream, slot, read, Vec::new(), true);
            return;
        };
        // A target hyper would refuse, or a sender only a scan would find past the round's scans: hyper's, with the
        // bytes read.
        let found = target(&query).ok().and_then(|(app, to)| {
            let index = match find_name_without_scan(senders, &to) {
                Some(index) => index,
                None if self.scans_left > 0 => {
                    self.scans_left -= 1;
                    find_name(senders, &to)
                }
                None => return None,
            };
            Some((index, app, to))
        });
        let Some((index, app, to)) = found else {
            let read = read.to_vec();
            self.hand_over(stream, slot, read, Vec::new(), true);
            return;
        };
        let records = lines(&read[body]);
        let rest = read[rest..].to_vec();
        let (request, rx) =
            PushRequest::looked_up(app.clone(), to.clone(), records, senders, index);
        push(request);
        self.counts.served += 1;
        self.in_flight.push(InFlight {
            stream,
            slot,
            rest,
            keep,
            app,
            to,
            answer: rx,
            by: now + ANSWER_WITHIN,
        });
    }

    /// Hands `stream` to the HTTP thread: `write_first`, then (if `serve`) hyper from `read` (what the loop read of
    /// it and did not use) on.
    fn hand_over(
        &mut self,
        stream: UnixStream,
        slot: ConnectionSlot,
        read: Vec<u8>,
        write_first: Vec<u8>,
        serve: bool,
    ) {
        self.counts.handed += 1;
        // Refused only when the HTTP thread is gone (the node is stopping): the connection closes.
        let _ = self.hand.send(Handed::Serve {
            stream,
            read,
            write_first,
            serve,
            slot,
        });
    }

    fn turn_away(&mut self, stream: UnixStream, now: Instant) {
        self.counts.turned_away += 1;
        let _ = self.hand.send(Handed::TurnAway(stream));
        self.busy_since_log += 1;
        if self
            .busy_logged
            .is_none_or(|t| now.duration_since(t) >= BUSY_LOG_EVERY)
        {
            tracing::warn!(
                "push socket: {MAX_PUSH_CONNECTIONS} connections are open, the most it serves; {} pusher(s) answered \
                 503 (busy) since this was last said",
                self.busy_since_log
            );
            self.busy_logged = Some(now);
            self.busy_since_log = 0;
        }
    }

    /// Writes the answers that are ready. `stopped`: the node is about to exit, so every push still in flight is
    /// answered now.
    pub fn answer(&mut self, now: Instant, stopped: bool) {
        let mut i = 0;
        while i < self.in_flight.len() {
            let f = &mut self.in_flight[i];
            let (status, value) = match f.answer.try_recv() {
                Ok(a) => answer_json(&f.app, &f.to, a),
                Err(TryRecvError::Closed) => error_json(
                    503,
                    "the node stopped before the push was applied: nothing was queued",
                ),
                Err(TryRecvError::Empty) if stopped || now >= f.by => maybe_queued_json(format!(
                    "no answer within {} s, or the node stopped first (the store may be slow or its disk failing): \
                     the records may or may not be queued; pushing them again may queue them twice",
                    ANSWER_WITHIN.as_secs()
                )),
                Err(TryRecvError::Empty) => {
                    i += 1;
                    continue;
                }
            };
            let f = self.in_flight.swap_remove(i);
            let keep = f.keep && !stopped;
            let bytes = http_answer(status, &value, keep);
            let mut stream = f.stream;
            let written = match stream.write(&bytes) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
                // The pusher is gone: nothing to answer.
                Err(_) => continue,
            };
            if written == bytes.len() && !keep {
                continue;
            }
            // Answered whole and kept, with no request after it yet: the loop waits for the next one.
            if written == bytes.len() && f.rest.is_empty() {
                self.idle.push(Idle {
                    stream,
                    slot: f.slot,
                    until: now + self.head_timeout,
                });
                continue;
            }
            // The rest of the answer (a pusher whose buffer is full), and the connection kept: hyper's from here.
            self.hand_over(stream, f.slot, f.rest, bytes[written..].to_vec(), keep);
        }
    }

    /// Closes the connections that waited for a request past their head timeout, as hyper closes its own.
    pub fn expire(&mut self, now: Instant) {
        self.idle.retain(|i| now < i.until);
    }

    /// At the node's stop, after [`PushStream::answer`] answered every push in flight: removes the socket, so that
    /// no pusher can connect any more.
    pub fn close(&mut self) {
        self.remove_file();
    }

    fn remove_file(&mut self) {
        if std::fs::symlink_metadata(&self.path).is_ok_and(|m| m.ino() == self.ino) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl Drop for PushStream {
    /// Removes the socket file if it is still the one this node bound (not one a later node bound there).
    fn drop(&mut self) {
        self.remove_file();
    }
}

/// An answer as hyper writes one: the status line, the JSON's type and length, and `connection: close` when the
/// connection ends with it.
fn http_answer(status: u16, value: &serde_json::Value, keep: bool) -> Vec<u8> {
    let body = format!("{value}\n");
    let reason = hyper::StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("");
    let close = if keep { "" } else { "connection: close\r\n" };
    format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{close}\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Waits up to [`REQUEST_SOON`] for a new connection's first bytes, giving the CPU away between looks, without
/// reading them (research/052).
fn request_soon(fd: RawFd) {
    let start = Instant::now();
    let mut byte = 0u8;
    loop {
        // SAFETY: one byte into a live buffer, peeked without waiting, on a descriptor the caller owns.
        let n = unsafe {
            libc::recv(
                fd,
                (&raw mut byte).cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        // Bytes, the end, or an error other than "nothing yet": read it.
        if n >= 0 || io::Error::last_os_error().kind() != io::ErrorKind::WouldBlock {
            return;
        }
        if start.elapsed() >= REQUEST_SOON {
            return;
        }
        std::thread::yield_now();
    }
}

/// Reads what `stream` holds now (non-blocking) into `buf`, at most its length ([`READ_AT_MOST`]): how much,
/// whether the pusher closed its end, and whether it is a push to serve here.
fn read_request(mut stream: &UnixStream, buf: &mut [u8]) -> (usize, bool, Request) {
    let mut n = 0;
    let mut closed = false;
    while n < buf.len() {
        match stream.read(&mut buf[n..]) {
            Ok(0) => {
                closed = true;
                break;
            }
            Ok(k) => n += k,
            Err(e) => {
                closed =
                    e.kind() != io::ErrorKind::WouldBlock && e.kind() != io::ErrorKind::Interrupted;
                break;
            }
        }
    }
    (n, closed, parse_request(&buf[..n]))
}

/// Whether `bytes` open with a whole `POST /push` this loop serves (the module doc says which). Public for the fuzz
/// target (`fuzz/fuzz_targets/push_request.rs`).
pub fn parse_request(bytes: &[u8]) -> Request {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let head = match req.parse(bytes) {
        Ok(httparse::Status::Complete(n)) if n <= MAX_HEAD => n,
        _ => return Request::Other,
    };
    if req.method != Some("POST") || req.version != Some(1) {
        return Request::Other;
    }
    let Some(path) = req.path else {
        return Request::Other;
    };
    let (path, query) = path.split_once('?').unwrap_or((path, ""));
    if path != "/push" {
        return Request::Other;
    }
    let mut length = None;
    let mut keep = true;
    for h in req.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            let parsed = std::str::from_utf8(h.value)
                .ok()
                .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|v| v.parse::<usize>().ok());
            match (length, parsed) {
                (None, Some(n)) => length = Some(n),
                _ => return Request::Other,
            }
        } else if h.name.eq_ignore_ascii_case("transfer-encoding")
            || h.name.eq_ignore_ascii_case("expect")
        {
            return Request::Other;
        } else if h.name.eq_ignore_ascii_case("connection") {
            let v = String::from_utf8_lossy(h.value).to_ascii_lowercase();
            if v.split(',').any(|t| t.trim() == "close") {
                keep = false;
            }
        }
    }
    let Some(length) = length else {
        return Request::Other;
    };
    if length > MAX_BODY_HERE || bytes.len() - head < length {
        return Request::Other;
    }
    Request::Push {
        query: query.to_string(),
        body: head..head + length,
        rest: head + length,
        keep,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn push(query: &str, body: std::ops::Range<usize>, keep: bool) -> Request {
        Request::Push {
            query: query.into(),
            body: body.clone(),
            rest: body.end,
            keep,
        }
    }

    /// Only a whole `POST /push` with a `content-length` body is the loop's; everything hyper must judge is hyper's.
    #[test]
    fn only_a_whole_simple_push_is_served_by_the_loop() {
        let head = "POST /push?app=main&to=dev HTTP/1.1\r\nhost: x\r\ncontent-length: 6\r\n\r\n";
        let whole = format!("{head}a\nbcd\n");
        assert_eq!(
            parse_request(whole.as_bytes()),
            push("app=main&to=dev", head.len()..head.len() + 6, true)
        );
        // What follows the body is the next request's, not this body's.
        let two = format!("{whole}POST /push");
        assert_eq!(
            parse_request(two.as_bytes()),
            push("app=main&to=dev", head.len()..head.len() + 6, true)
        );
        let close =
            "POST /push?app=a&to=b HTTP/1.1\r\nConnection: Close\r\nContent-Length: 0\r\n\r\n";
        let Request::Push { keep, body, .. } = parse_request(close.as_bytes()) else {
            panic!("a push with connection: close is the loop's");
        };
        assert!(!keep);
        assert!(body.is_empty());
        for other in [
            // Not all there yet.
            &whole[..whole.len() - 1],
            &head[..head.len() - 2],
            "",
            // Another path, method or version.
            "POST /push-many?app=main HTTP/1.1\r\ncontent-length: 0\r\n\r\n",
            "GET /push?app=main&to=dev HTTP/1.1\r\n\r\n",
            "POST /push?app=main&to=dev HTTP/1.0\r\ncontent-length: 0\r\n\r\n",
            // A body hyper must read: chunked, expected, of no length, two lengths, a length not a number.
            "POST /push?app=a&to=b HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n",
            "POST /push?app=a&to=b HTTP/1.1\r\nexpect: 100-continue\r\ncontent-length: 0\r\n\r\n",
            "POST /push?app=a&to=b HTTP/1.1\r\n\r\n",
            "POST /push?app=a&to=b HTTP/1.1\r\ncontent-length: 0\r\ncontent-length: 0\r\n\r\n",
            "POST /push?app=a&to=b HTTP/1.1\r\ncontent-length: +1\r\n\r\nx",
            // Not HTTP.
            "hello\r\n\r\n",
        ] {
            assert_eq!(parse_request(other.as_bytes()), Request::Other, "{other:?}");
        }
        let large = format!(
            "POST /push?app=a&to=b HTTP/1.1\r\ncontent-length: {}\r\n\r\n{}",
            MAX_BODY_HERE + 1,
            "x".repeat(MAX_BODY_HERE + 1)
        );
        assert_eq!(parse_request(large.as_bytes()), Request::Other);
    }

    /// The answer is whole HTTP/1.1, its length that of its body, closing the connection only when asked.
    #[test]
    fn an_answer_is_whole_http_with_its_length() {
        let v = serde_json::json!({"first": 1, "count": 2});
        for keep in [true, false] {
            let a = String::from_utf8(http_answer(200, &v, keep)).unwrap();
            let (head, body) = a.split_once("\r\n\r\n").unwrap();
            assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
            assert!(
                head.contains(&format!("content-length: {}", body.len())),
                "{head}"
            );
            assert_eq!(head.contains("connection: close"), !keep, "{head}");
            assert_eq!(serde_json::from_str::<serde_json::Value>(body).unwrap(), v);
        }
    }

    /// `request_soon` only looks: a request there (or coming within the wait) is left whole to be read, one that
    /// comes after the wait is read whole when it comes, and a connection closed without one ends the wait at once.
    #[test]
    fn waiting_for_a_request_reads_nothing_and_ends_with_the_request_the_wait_or_the_close() {
        let pair = || {
            let (a, b) = UnixStream::pair().unwrap();
            a.set_nonblocking(true).unwrap();
            (a, b)
        };
        let read_all = |mut s: UnixStream, want: usize| {
            s.set_nonblocking(false).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut got = vec![0u8; want];
            s.read_exact(&mut got).unwrap();
            got
        };
        let (node, mut pusher) = pair();
        pusher.write_all(b"POST /push").unwrap();
        request_soon(node.as_raw_fd());
        assert_eq!(read_all(node, 10), b"POST /push");
        let (node, mut pusher) = pair();
        let writer = std::thread::spawn(move || {
            pusher.write_all(b"GET").unwrap();
            pusher
        });
        request_soon(node.as_raw_fd());
        let _pusher = writer.join().unwrap();
        assert_eq!(read_all(node, 3), b"GET");
        let (node, mut pusher) = pair();
        request_soon(node.as_raw_fd());
        pusher.write_all(b"late").unwrap();
        assert_eq!(read_all(node, 4), b"late");
        let (mut node, pusher) = pair();
        drop(pusher);
        request_soon(node.as_raw_fd());
        node.set_nonblocking(false).unwrap();
        let mut rest = Vec::new();
        node.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty());
    }

    /// What the loop reads of a connection is what is there, bounded: the bytes it hands over are all it took.
    #[test]
    fn reading_takes_what_is_there_and_stops_at_the_bound() {
        let (node, mut pusher) = UnixStream::pair().unwrap();
        node.set_nonblocking(true).unwrap();
        let head = "POST /push?app=a&to=b HTTP/1.1\r\ncontent-length: 3\r\n\r\n";
        pusher.write_all(format!("{head}x\ny").as_bytes()).unwrap();
        let mut buf = vec![0; READ_AT_MOST];
        assert_eq!(
            read_request(&node, &mut buf),
            (
                head.len() + 3,
                false,
                push("app=a&to=b", head.len()..head.len() + 3, true)
            )
        );
        // Nothing more there: nothing read, and nothing to serve.
        assert_eq!(read_request(&node, &mut buf), (0, false, Request::Other));
        // More than the bound: it stops there, and the request is hyper's.
        pusher.write_all(&vec![b'z'; READ_AT_MOST + 100]).unwrap();
        assert_eq!(
            read_request(&node, &mut buf),
            (READ_AT_MOST, false, Request::Other)
        );
        // The pusher gone: what is left is read, then the end is seen.
        drop(pusher);
        assert_eq!(read_request(&node, &mut buf), (100, true, Request::Other));
    }

    fn stream_in(
        dir: &std::path::Path,
    ) -> (
        PushStream,
        tokio::sync::mpsc::UnboundedReceiver<Handed>,
        PathBuf,
    ) {
        let path = dir.join("push.sock");
        let listener = UnixListener::bind(&path).unwrap();
        listener.set_nonblocking(true).unwrap();
        let ino = std::fs::metadata(&path).unwrap().ino();
        let (hand, handed) = tokio::sync::mpsc::unbounded_channel();
        (
            PushStream::new(listener, path.clone(), ino, hand, Duration::from_secs(10)),
            handed,
            path,
        )
    }

    fn send_queued(p: PushRequest) {
        p.answer
            .send(PushAnswer::Queued {
                first: 1,
                count: 1,
                expired: 0,
            })
            .unwrap();
    }

    fn answer_of(pusher: &mut UnixStream) -> String {
        pusher
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut got = Vec::new();
        let mut chunk = [0u8; 4096];
        while !got.ends_with(b"}\n") {
            let n = pusher.read(&mut chunk).unwrap();
            assert!(
                n > 0,
                "closed before a whole answer: {:?}",
                String::from_utf8_lossy(&got)
            );
            got.extend_from_slice(&chunk[..n]);
        }
        String::from_utf8(got).unwrap()
    }

    /// A whole push is taken here, with its sender looked up and the bytes after it kept for hyper; its answer is
    /// written when the host answers, and the connection, kept, goes to the HTTP thread with the next request; a
    /// request the loop does not serve goes there at once with every byte read; past the bound, a connection is
    /// turned away; and the socket's file goes with the loop's listener.
    #[test]
    fn a_whole_push_is_served_here_and_the_rest_handed_over_with_what_was_read() {
        let dir = tempfile::tempdir().unwrap();
        let (mut stream, mut handed, path) = stream_in(dir.path());
        let senders = Arc::new(AllowList::from_unique(vec![("dev".to_string(), [7u8; 32])]));
        let now = Instant::now();
        let mut pusher = UnixStream::connect(&path).unwrap();
        let push = "POST /push?app=main&to=dev HTTP/1.1\r\ncontent-length: 4\r\n\r\na\nb\n";
        let next = "GET /next HTTP/1.1\r\n\r\n";
        pusher
            .write_all(format!("{push}{next}").as_bytes())
            .unwrap();
        let mut taken = Vec::new();
        stream.take(now, &senders, true, 0, |p| taken.push(p));
        assert_eq!(taken.len(), 1);
        let p = taken.pop().unwrap();
        assert_eq!((p.app.as_str(), p.to.as_str()), ("main", "dev"));
        assert_eq!(p.records, vec![b"a".to_vec(), b"b".to_vec()]);
        assert_eq!(
            p.found.as_ref().map(|f| f.index),
            Some(senders.find_name("dev"))
        );
        assert_eq!(stream.counts().served, 1);
        // No answer yet: nothing written.
        stream.answer(now, false);
        assert!(handed.try_recv().is_err());
        p.answer
            .send(PushAnswer::Queued {
                first: 1,
                count: 2,
                expired: 0,
            })
            .unwrap();
        stream.answer(now, false);
        let answer = answer_of(&mut pusher);
        assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
        assert!(!answer.contains("connection: close"), "{answer}");
        match handed.try_recv() {
            Ok(Handed::Serve {
                read,
                write_first,
                serve,
                ..
            }) => {
                assert_eq!(read, next.as_bytes());
                assert!(write_first.is_empty());
                assert!(serve);
            }
            other => panic!("the kept connection goes to hyper with the next request: {other:?}"),
        }
        // A kept connection with nothing after its push waits on the loop for its next request, served here too.
        let mut kept = UnixStream::connect(&path).unwrap();
        kept.write_all(push.as_bytes()).unwrap();
        let mut taken = Vec::new();
        stream.take(now, &senders, true, 0, |p| taken.push(p));
        send_queued(taken.pop().unwrap());
        stream.answer(now, false);
        assert!(answer_of(&mut kept).starts_with("HTTP/1.1 200 OK\r\n"));
        assert!(handed.try_recv().is_err(), "kept on the loop");
        assert_eq!(stream.idle_fds().count(), 1);
        // Nothing to read after all: still kept.
        stream.take(now, &senders, false, 1, |_| panic!("nothing was written"));
        assert_eq!(stream.idle_fds().count(), 1);
        kept.write_all(push.as_bytes()).unwrap();
        let mut taken = Vec::new();
        stream.take(now, &senders, false, 1, |p| taken.push(p));
        assert_eq!(taken.len(), 1);
        assert_eq!(stream.idle_fds().count(), 0);
        send_queued(taken.pop().unwrap());
        stream.answer(now, false);
        assert!(answer_of(&mut kept).starts_with("HTTP/1.1 200 OK\r\n"));
        // Closed by its pusher while kept: closed here, its slot given back.
        let open_before = stream.open.load(std::sync::atomic::Ordering::Acquire);
        drop(kept);
        stream.take(now, &senders, false, 1, |_| panic!("closed"));
        assert_eq!(stream.idle_fds().count(), 0);
        assert_eq!(
            stream.open.load(std::sync::atomic::Ordering::Acquire),
            open_before - 1
        );
        // Another path: to hyper at once, with all that was read.
        let mut other = UnixStream::connect(&path).unwrap();
        let many = "POST /push-many?app=main HTTP/1.1\r\ncontent-length: 6\r\n\r\ndev a\n";
        other.write_all(many.as_bytes()).unwrap();
        stream.take(now, &senders, true, 0, |_| {
            panic!("not a push the loop serves")
        });
        match handed.try_recv() {
            Ok(Handed::Serve { read, serve, .. }) => {
                assert_eq!(read, many.as_bytes());
                assert!(serve);
            }
            other => panic!("another path is hyper's: {other:?}"),
        }
        // A sender not in the list is the host's to answer (not found), looked up here all the same.
        let mut unknown = UnixStream::connect(&path).unwrap();
        unknown
            .write_all(b"POST /push?app=main&to=nobody HTTP/1.1\r\nconnection: close\r\ncontent-length: 0\r\n\r\n")
            .unwrap();
        let mut taken = Vec::new();
        stream.take(now, &senders, true, 0, |p| taken.push(p));
        assert_eq!(taken[0].found.as_ref().map(|f| f.index), Some(None));
        drop(taken);
        // Its answer's sender dropped (the node stopped first): 503, and the connection closed as asked.
        stream.answer(now, false);
        let answer = answer_of(&mut unknown);
        assert!(answer.starts_with("HTTP/1.1 503 "), "{answer}");
        assert!(answer.contains("connection: close"), "{answer}");
        // A connection with no request yet waits here, and is closed once the head timeout passed without one.
        let silent = UnixStream::connect(&path).unwrap();
        stream.take(now, &senders, true, 0, |_| panic!("nothing was written"));
        assert_eq!(stream.idle_fds().count(), 1);
        stream.expire(now + Duration::from_secs(9));
        assert_eq!(stream.idle_fds().count(), 1);
        stream.expire(now + Duration::from_secs(10));
        assert_eq!(stream.idle_fds().count(), 0);
        let mut end = Vec::new();
        (&silent).read_to_end(&mut end).unwrap();
        assert!(
            end.is_empty(),
            "closed without an answer, as hyper closes it"
        );
        // Past the bound: turned away.
        let _open: Vec<_> = (0..MAX_PUSH_CONNECTIONS)
            .map(|_| ConnectionSlot::take(&stream.open, MAX_PUSH_CONNECTIONS))
            .collect();
        let _busy = UnixStream::connect(&path).unwrap();
        stream.take(now, &senders, true, 0, |_| panic!("past the bound"));
        assert!(matches!(handed.try_recv(), Ok(Handed::TurnAway(_))));
        assert_eq!(stream.counts().turned_away, 1);
        drop(stream);
        assert!(!path.exists(), "the socket's file goes with the listener");
    }
}
