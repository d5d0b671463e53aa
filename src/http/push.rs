//! The push socket (docs/downlink.md, "Queueing records"): a Unix stream socket on which programs of the node's
//! machine queue downlink records with `POST /push?app=APP&to=SENDER`, one record per line of the body. The receive
//! loop accepts its connections and serves a complete `POST /push` itself (`receive/push_stream.rs`, research/054);
//! every other request, with the connection it came on, it hands here, where hyper serves it on the HTTP thread like
//! the TCP listeners. Each push goes to the receive loop through a bounded queue
//! ([`crate::common::push`]) and is answered, in JSON, once its records are synced or refused.
//!
//! Why a Unix socket and not a TCP port: who may push is then decided by the kernel's file permissions (the socket
//! is `0660`, in the `0700` state directory by default), with no password to configure, leak or rotate, and nothing
//! about downlink is reachable from the network. Why HTTP on it: `curl --unix-socket` and every HTTP client that
//! dials a Unix socket can push, with no client library of ours.

use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::{Body, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::{mpsc, oneshot, watch};

use super::routes::{Answer, answer};
use super::serve::stopping;
use super::{HttpError, Shared};
use crate::common::blob::{BlobError, DownBlob, MAX_BLOB};
use crate::common::push::{
    Handed, MAX_PUSH_BODY, PushAnswer, PushRefused, PushRequest, answer_json, clear_socket_path,
    file_target, lines, make_private, maybe_queued_json, target, too_large_json,
};

pub use crate::common::push::MAX_PUSH_CONNECTIONS;

/// Connections past the bound being answered busy at once, each for at most [`TURN_AWAY_WITHIN`]; past these, one
/// gets what fits the socket's buffer and is closed at once.
const MAX_TURNED_AWAY: usize = 32;

/// How long a connection turned away is given to read its answer and finish sending its request, which is read
/// and dropped: a Unix socket closed with bytes it has not read resets its peer, which may then lose the answer.
const TURN_AWAY_WITHIN: std::time::Duration = std::time::Duration::from_secs(1);

/// How long a push waits for its answer: a commit and one sync, or the wait for a sync in flight before it.
const ANSWER_WITHIN: std::time::Duration = std::time::Duration::from_secs(30);

/// The answer of a connection past [`MAX_PUSH_CONNECTIONS`], written at accept without parsing its request (which
/// is never applied: nothing of it is queued), so that the pusher is told to try again rather than left to guess
/// why the connection closed.
fn busy_answer() -> Vec<u8> {
    let body = serde_json::json!({
        "error": format!(
            "the node is busy: {MAX_PUSH_CONNECTIONS} push connections are open, the most it serves at once; \
             nothing was queued: push again in a moment"
        ),
    });
    let body = format!("{body}\n");
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The push socket, bound: its listener and where it is (removed by the receive loop when it stops, if it is still
/// ours).
pub struct PushSocket {
    listener: std::os::unix::net::UnixListener,
    path: PathBuf,
    ino: u64,
}

impl PushSocket {
    /// Binds `path`, mode `0660`. A socket left there by a node that is gone is replaced; a socket another
    /// process answers on, or a file that is not a socket, is an error that names the path.
    pub fn bind(path: &Path) -> Result<Self, HttpError> {
        let problem = |why: String| HttpError::PushSocket {
            path: path.to_path_buf(),
            why,
        };
        clear_socket_path(
            path,
            |p| std::os::unix::net::UnixStream::connect(p).is_ok(),
            "--push-socket",
        )
        .map_err(problem)?;
        let listener = std::os::unix::net::UnixListener::bind(path)
            .map_err(|e| problem(crate::common::push::bind_problem(&e)))?;
        let ino = make_private(path).map_err(problem)?;
        Ok(PushSocket {
            listener,
            path: path.to_path_buf(),
            ino,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The listener (non-blocking), its path and the inode bound there, for the receive loop, which accepts on it
    /// and removes the path when it stops if it is still this socket.
    pub fn into_parts(self) -> io::Result<(std::os::unix::net::UnixListener, PathBuf, u64)> {
        self.listener.set_nonblocking(true)?;
        Ok((self.listener, self.path, self.ino))
    }
}

/// Serves the connections the receive loop hands over (research/054) until the server stops.
pub(super) async fn handed_loop(
    mut handed: mpsc::UnboundedReceiver<Handed>,
    shared: Arc<Shared>,
    mut closing: watch::Receiver<bool>,
) {
    let busy: Arc<[u8]> = busy_answer().into();
    let turning_away = Arc::new(AtomicUsize::new(0));
    loop {
        let h = tokio::select! {
            () = stopping(&mut closing) => break,
            h = handed.recv() => match h {
                Some(h) => h,
                None => break,
            },
        };
        match h {
            Handed::Serve {
                stream,
                read,
                write_first,
                serve: then_serve,
                slot,
            } => {
                let stream = match tokio::net::UnixStream::from_std(stream) {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::debug!("push connection handed over: {e}");
                        continue;
                    }
                };
                let (shared, closing) = (shared.clone(), closing.clone());
                tokio::spawn(async move {
                    serve_handed(stream, read, write_first, then_serve, shared, closing).await;
                    drop(slot);
                });
            }
            Handed::TurnAway(stream) => {
                let Ok(stream) = tokio::net::UnixStream::from_std(stream) else {
                    continue;
                };
                if turning_away.load(Ordering::Relaxed) < MAX_TURNED_AWAY {
                    turning_away.fetch_add(1, Ordering::Relaxed);
                    let (busy, turning_away) = (busy.clone(), turning_away.clone());
                    tokio::spawn(async move {
                        turn_away(stream, &busy).await;
                        turning_away.fetch_sub(1, Ordering::Relaxed);
                    });
                } else {
                    // The answer fits the new socket's empty send buffer; the pusher may lose it to a reset, and
                    // then sees the connection closed before its push was read, which `pure-serve push` says is
                    // "busy".
                    let _ = stream.try_write(&busy);
                }
            }
        }
    }
}

/// Answers a connection past the bound `busy` and closes it once the pusher has closed its end, or after
/// [`TURN_AWAY_WITHIN`]; what it sends meanwhile is read and dropped, never parsed.
async fn turn_away(mut stream: tokio::net::UnixStream, busy: &[u8]) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let answer_and_drain = async {
        stream.write_all(busy).await?;
        stream.shutdown().await?;
        let mut sink = [0u8; 8192];
        while stream.read(&mut sink).await? > 0 {}
        Ok::<_, io::Error>(())
    };
    let _ = tokio::time::timeout(TURN_AWAY_WITHIN, answer_and_drain).await;
}

/// A connection the loop handed over: the rest of its answer written, then served by hyper from the bytes the loop
/// read on, or closed.
async fn serve_handed(
    mut stream: tokio::net::UnixStream,
    read: Vec<u8>,
    write_first: Vec<u8>,
    then_serve: bool,
    shared: Arc<Shared>,
    closing: watch::Receiver<bool>,
) {
    use tokio::io::AsyncWriteExt;
    if !write_first.is_empty() {
        let written = tokio::time::timeout(ANSWER_WITHIN, stream.write_all(&write_first)).await;
        if !matches!(written, Ok(Ok(()))) {
            return;
        }
    }
    if then_serve {
        serve(
            Prefixed {
                read,
                at: 0,
                stream,
            },
            shared,
            closing,
        )
        .await;
    } else {
        let _ = stream.shutdown().await;
    }
}

/// A connection whose first bytes were read by the receive loop: hyper reads those first, then the socket.
struct Prefixed {
    read: Vec<u8>,
    at: usize,
    stream: tokio::net::UnixStream,
}

impl tokio::io::AsyncRead for Prefixed {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.at < this.read.len() {
            let n = buf.remaining().min(this.read.len() - this.at);
            buf.put_slice(&this.read[this.at..this.at + n]);
            this.at += n;
            if this.at == this.read.len() {
                this.read = Vec::new();
                this.at = 0;
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.stream).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Prefixed {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

async fn serve(stream: Prefixed, shared: Arc<Shared>, mut closing: watch::Receiver<bool>) {
    let head_timeout = shared.limits.head_timeout;
    let service = service_fn(move |req| {
        let shared = shared.clone();
        async move { Ok::<_, std::convert::Infallible>(handle(req, &shared).await) }
    });
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(head_timeout)
        .keep_alive(true);
    let conn = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    let result = tokio::select! {
        r = conn.as_mut() => r,
        () = stopping(&mut closing) => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = result {
        tracing::debug!("push connection: {e}");
    }
}

fn json(status: StatusCode, value: serde_json::Value) -> Answer {
    answer(status, "application/json", format!("{value}\n"))
}

fn error(status: StatusCode, why: impl Into<String>) -> Answer {
    json(status, serde_json::json!({ "error": why.into() }))
}

/// The answer to a body past [`MAX_PUSH_BODY`] (`too_large_json` says why it reads as it does).
fn push_too_large() -> Answer {
    let (_, value) = too_large_json(format!(
        "this push is more than {MAX_PUSH_BODY} bytes (4 MiB), the most one push takes: nothing was queued; push \
         the records in parts"
    ));
    json(StatusCode::PAYLOAD_TOO_LARGE, value)
}

/// A push's body, read whole within [`MAX_PUSH_BODY`] and the request deadline; or the answer that says why not.
async fn read_body(req: Request<Incoming>, shared: &Shared) -> Result<hyper::body::Bytes, Answer> {
    read_body_within(req, shared, MAX_PUSH_BODY, push_too_large).await
}

/// The answer to a file past [`MAX_BLOB`].
fn file_too_large() -> Answer {
    let (_, value) = too_large_json(format!(
        "this file is more than {MAX_BLOB} bytes (64 MiB), the most a file pushed as pieces may have: nothing was \
         queued; push it in parts, or send the devices a reference to fetch it by"
    ));
    json(StatusCode::PAYLOAD_TOO_LARGE, value)
}

/// A body read whole within `limit` bytes and the request deadline; or the answer that says why not (`too_large`
/// past the limit).
async fn read_body_within(
    req: Request<Incoming>,
    shared: &Shared,
    limit: usize,
    too_large: fn() -> Answer,
) -> Result<hyper::body::Bytes, Answer> {
    if req.body().size_hint().lower() > limit as u64 {
        return Err(too_large());
    }
    match tokio::time::timeout(
        shared.limits.request_deadline,
        Limited::new(req.into_body(), limit).collect(),
    )
    .await
    {
        Ok(Ok(c)) => Ok(c.to_bytes()),
        Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => Err(too_large()),
        Ok(Err(e)) => Err(error(
            StatusCode::BAD_REQUEST,
            format!("could not read the body: {e}"),
        )),
        Err(_) => Err(error(
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "the body did not arrive within {} s",
                shared.limits.request_deadline.as_secs_f64()
            ),
        )),
    }
}

async fn handle(req: Request<Incoming>, shared: &Shared) -> Answer {
    if req.uri().path() == "/push-file" && req.method() == Method::POST {
        let (app, targets, piece) = match file_target(req.uri().query().unwrap_or("")) {
            Ok(t) => t,
            Err(why) => return error(StatusCode::BAD_REQUEST, why),
        };
        let Some(inbox) = shared.pushes.clone() else {
            return error(StatusCode::SERVICE_UNAVAILABLE, "this node takes no pushes");
        };
        let body = match read_body_within(req, shared, MAX_BLOB, file_too_large).await {
            Ok(b) => b,
            Err(answer) => return answer,
        };
        let blob = match DownBlob::new(body.to_vec(), piece) {
            Ok(b) => b,
            Err(BlobError::TooLarge { .. }) => return file_too_large(),
            Err(e) => return error(StatusCode::BAD_REQUEST, format!("{e}: nothing was queued")),
        };
        return super::push_many::handle_file(blob, app, targets, &inbox).await;
    }
    if req.uri().path() == "/push-many" && req.method() == Method::POST {
        let app = match crate::common::push::many_target(req.uri().query().unwrap_or("")) {
            Ok(app) => app,
            Err(why) => return error(StatusCode::BAD_REQUEST, why),
        };
        let Some(inbox) = &shared.pushes else {
            return error(StatusCode::SERVICE_UNAVAILABLE, "this node takes no pushes");
        };
        return super::push_many::handle(req.into_body(), app, inbox).await;
    }
    if req.uri().path() == "/push-all" && req.method() == Method::POST {
        let app = match crate::common::push::many_target(req.uri().query().unwrap_or("")) {
            Ok(app) => app,
            Err(why) => return error(StatusCode::BAD_REQUEST, why),
        };
        let Some(inbox) = shared.pushes.clone() else {
            return error(StatusCode::SERVICE_UNAVAILABLE, "this node takes no pushes");
        };
        let body = match read_body(req, shared).await {
            Ok(b) => b,
            Err(answer) => return answer,
        };
        let records = lines(&body);
        if records.is_empty() {
            return error(
                StatusCode::BAD_REQUEST,
                "a push to every sender has no record: give the records as the body, one per line",
            );
        }
        return super::push_many::handle_all(records, app, &inbox).await;
    }
    // 400, not 404 or 405: a 404 of the push socket means no such app or sender (docs/downlink.md).
    if req.uri().path() != "/push" || req.method() != Method::POST {
        return error(
            StatusCode::BAD_REQUEST,
            format!(
                "{} {}: the push socket serves POST /push?app=APP&to=SENDER, with the records as the body, one per \
                 line, POST /push-many?app=APP, with SENDER RECORD lines, POST /push-all?app=APP, and POST \
                 /push-file?app=APP&to=A,B (or &all=1), with a file as the body (docs/downlink.md)",
                req.method(),
                req.uri().path()
            ),
        );
    }
    let (app, to) = match target(req.uri().query().unwrap_or("")) {
        Ok(t) => t,
        Err(why) => return error(StatusCode::BAD_REQUEST, why),
    };
    let body = match read_body(req, shared).await {
        Ok(b) => b,
        Err(answer) => return answer,
    };
    // A push of no record goes to the loop all the same, which checks its app and sender and queues nothing.
    let records = lines(&body);
    let Some(inbox) = &shared.pushes else {
        return error(StatusCode::SERVICE_UNAVAILABLE, "this node takes no pushes");
    };
    let (tx, rx) = oneshot::channel();
    let request = PushRequest {
        app: app.clone(),
        to: to.clone(),
        records,
        blob: None,
        answer: tx.into(),
        found: Some(inbox.look_up(&to)),
    };
    match inbox.send(request) {
        Ok(()) => {}
        Err(PushRefused::Busy) => {
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                "the node has many pushes waiting: nothing was queued; push again in a second",
            );
        }
        Err(PushRefused::Stopped) => {
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                "the node is stopping: nothing was queued",
            );
        }
    }
    match tokio::time::timeout(ANSWER_WITHIN, rx).await {
        Ok(Ok(a)) => http_answer(&app, &to, a),
        Ok(Err(_)) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the node stopped before the push was applied: nothing was queued",
        ),
        Err(_) => maybe_queued(format!(
            "no answer within {} s (the store may be slow or its disk failing): the records may or may not be \
             queued; pushing them again may queue them twice",
            ANSWER_WITHIN.as_secs()
        )),
    }
}

/// The HTTP answer to what became of a push to `to` in `app` (docs/downlink.md, "The push socket's requests").
fn http_answer(app: &str, to: &str, a: PushAnswer) -> Answer {
    let (status, value) = answer_json(app, to, a);
    json(
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        value,
    )
}

fn maybe_queued(why: String) -> Answer {
    let (_, value) = maybe_queued_json(why);
    json(StatusCode::INTERNAL_SERVER_ERROR, value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status_and_json(a: Answer) -> (u16, serde_json::Value) {
        let status = a.status().as_u16();
        let body = body_of(a);
        (status, serde_json::from_slice(&body).unwrap())
    }

    fn body_of(a: Answer) -> Vec<u8> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(a.into_body().collect())
            .unwrap()
            .to_bytes()
            .to_vec()
    }

    /// Each outcome has a status a client can act on alone: 500 only where the records may or may not be queued,
    /// 503 only where nothing was; a refusal names its bound and what the push deleted as expired.
    #[test]
    fn each_outcome_has_its_own_status() {
        let (status, v) = status_and_json(http_answer(
            "main",
            "dev",
            PushAnswer::MaybeQueued("may or may not".into()),
        ));
        assert_eq!(
            (status, v["maybe_queued"].as_bool()),
            (500, Some(true)),
            "{v}"
        );
        let (status, _) = status_and_json(http_answer(
            "main",
            "dev",
            PushAnswer::Unavailable("nothing".into()),
        ));
        assert_eq!(status, 503);
        let (status, v) = status_and_json(http_answer(
            "main",
            "dev",
            PushAnswer::Refused {
                bound: crate::common::push::PushBound::MaxRecords,
                why: "w".into(),
                expired: 5,
            },
        ));
        assert_eq!(status, 409);
        assert_eq!(
            (v["refused"].as_str(), v["expired"].as_u64()),
            (Some("max_records"), Some(5))
        );
        let (status, v) = status_and_json(http_answer("main", "dev", PushAnswer::Empty));
        assert_eq!(
            (status, v["count"].as_u64(), v["last"].as_u64()),
            (200, Some(0), Some(0))
        );
        let (status, v) = status_and_json(push_too_large());
        assert_eq!((status, v["refused"].as_str()), (413, Some("too_large")));
    }

    #[test]
    fn the_busy_answer_is_whole_http_with_its_length() {
        let busy = String::from_utf8(busy_answer()).unwrap();
        let (head, body) = busy.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 503 "), "{head}");
        assert!(
            head.contains(&format!("content-length: {}", body.len())),
            "{head}"
        );
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert!(
            v["error"]
                .as_str()
                .unwrap()
                .contains(&MAX_PUSH_CONNECTIONS.to_string())
        );
    }
}
