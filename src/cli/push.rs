//! `pure-serve push`: queue downlink records for one sender through the running node's push socket
//! (docs/downlink.md, "Queueing records"), and exit 0 only once every record is durably queued.
//!
//! The node alone writes its stores, so this command does not open them: it reads standard input (one record per
//! line, all in one push), posts it on the socket as HTTP/1.1 (hyper, over a Unix stream), and turns the JSON
//! answer into a line and an exit status a script can act on.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};

use anyhow::Context as _;
use clap::Args;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use thiserror::Error;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::common::blob::MAX_BLOB;
use crate::common::push::MAX_PUSH_BODY;
use crate::http::push::MAX_PUSH_CONNECTIONS;

#[derive(Args, Debug)]
pub struct PushArgs {
    /// The app whose downlink queues the records (as in the apps file; `main` without one).
    #[arg(long, value_name = "APP", default_value = "main")]
    pub app: String,
    /// The sender the records are for, by its name in the senders file.
    #[arg(long, value_name = "SENDER", required_unless_present_any = ["many", "to_all"])]
    pub to: Option<String>,
    /// A push of many: standard input is `SENDER RECORD` lines, each a record for its sender (a configuration to a
    /// million devices in one command; docs/downlink.md, "Pushing to many devices"). Prints what became of the lines
    /// and lists those not queued.
    #[arg(long, conflicts_with = "to")]
    pub many: bool,
    /// Push standard input's records (one per line, as for --to) to every sender of the senders file that the app
    /// accepts, each sender's all or nothing (docs/downlink.md, "Pushing to many devices").
    #[arg(long, conflicts_with_all = ["to", "many"])]
    pub to_all: bool,
    /// Push this file as pieces (records of at most --piece-size bytes, in order) to the senders of --to (names
    /// separated by commas) or --to-all, stored once in the app's store however many senders (docs/downlink.md,
    /// "Pushing a file"). Read whole; at most 64 MiB. Standard input is not read.
    #[arg(long, value_name = "PATH", conflicts_with = "many")]
    pub file: Option<PathBuf>,
    /// With --file: the bytes of each piece, 1–1024 (a piece is a downlink record).
    #[arg(long, value_name = "N", requires = "file", default_value_t = 1024,
          value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub piece_size: u16,
    /// The running node's state directory: its push socket is push.sock there (default: as the node's, i.e.
    /// $STATE_DIRECTORY under systemd, else ./pure-state).
    #[arg(long, value_name = "DIR")]
    pub state: Option<PathBuf>,
    /// The node's push socket, for a node started with --push-socket PATH (instead of --state).
    #[arg(long, value_name = "PATH", conflicts_with = "state")]
    pub socket: Option<PathBuf>,
}

/// How long ago the process `pid` started, in seconds, if that is less than [`STARTING_AGE`] (from /proc: its
/// start time in clock ticks since boot, against the time since boot).
fn starting(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid.trim())).ok()?;
    // The fields after the command's name, which is in parentheses and may hold anything.
    let after = &stat[stat.rfind(')')? + 2..];
    let start_ticks: f64 = after.split(' ').nth(19)?.parse().ok()?;
    let uptime: f64 = std::fs::read_to_string("/proc/uptime")
        .ok()?
        .split(' ')
        .next()?
        .parse()
        .ok()?;
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let age = uptime - start_ticks / ticks.max(1.0);
    (age < STARTING_AGE).then_some(age.max(0.0))
}

/// Whether the node `pid` was started to serve its push socket at `path`: without `--push-socket` (its state
/// directory's push.sock, the one asked for here), or with `--push-socket` naming it.
fn will_serve(pid: &str, path: &Path) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{}/cmdline", pid.trim())) else {
        return false;
    };
    let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
    let given = args.iter().enumerate().find_map(|(i, a)| {
        if *a == b"--push-socket" {
            Some(args.get(i + 1).copied().unwrap_or_default())
        } else {
            a.strip_prefix(b"--push-socket=")
        }
    });
    match given {
        None => true,
        Some(value) => {
            use std::os::unix::ffi::OsStrExt;
            let named = Path::new(std::ffi::OsStr::from_bytes(value));
            named == path || (named.is_relative() && path.ends_with(named))
        }
    }
}

/// Exit statuses (sysexits.h), as docs/downlink.md lists them.
pub const EXIT_REFUSED: i32 = 65;
pub const EXIT_NO_SUCH: i32 = 67;
pub const EXIT_NO_NODE: i32 = 69;
/// EX_IOERR: the connection broke after the push was sent, or the node does not know whether it kept the records.
pub const EXIT_MAYBE_QUEUED: i32 = 74;
pub const EXIT_TRY_AGAIN: i32 = 75;

/// Why a push did not queue, with the exit status it gives.
#[derive(Debug, Error)]
pub enum PushError {
    #[error("refused: {0}")]
    Refused(String),
    #[error("{0}")]
    NoSuch(String),
    #[error(
        "no node answers on {path} ({why}): nothing was sent; start the node, or name its socket (--state DIR of the \
         node, or --socket PATH for a node started with --push-socket)"
    )]
    NoNode { path: PathBuf, why: String },
    #[error(
        "the node running on {dir} (pid {pid}) serves no push socket at {path}: it was started with --push-socket \
         none, or with --push-socket elsewhere; nothing was sent: push with --socket PATH of that node, or start it \
         without --push-socket none (docs/downlink.md, \"Queueing records\")"
    )]
    NoSocket {
        dir: PathBuf,
        pid: String,
        path: PathBuf,
    },
    #[error(
        "may not connect to the push socket {path} (permission denied): nothing was sent; run push as the node's \
         user, or as a member of the node's group with the socket where that group may reach it (docs/downlink.md, \
         \"Who may push\")"
    )]
    NotPermitted { path: PathBuf },
    #[error(
        "{path} is a directory, not a push socket: nothing was sent; name the node's state directory with --state \
         {path} (its socket is push.sock in it), or the socket itself with --socket PATH"
    )]
    Directory { path: PathBuf },
    #[error("not queued now: {0}")]
    TryAgain(String),
    #[error("{0}")]
    MaybeQueued(String),
}

impl PushError {
    pub fn exit_status(&self) -> i32 {
        match self {
            PushError::Refused(_) => EXIT_REFUSED,
            PushError::NoSuch(_) => EXIT_NO_SUCH,
            PushError::NoNode { .. }
            | PushError::NoSocket { .. }
            | PushError::NotPermitted { .. }
            | PushError::Directory { .. } => EXIT_NO_NODE,
            PushError::TryAgain(_) => EXIT_TRY_AGAIN,
            PushError::MaybeQueued(_) => EXIT_MAYBE_QUEUED,
        }
    }

    /// Connecting to `path` failed with `e`: nothing was sent.
    fn connect(path: &Path, e: &std::io::Error) -> Self {
        if e.raw_os_error() == Some(libc::EPROTOTYPE) {
            // A datagram socket where a stream socket was asked for: the node's push datagram socket.
            return PushError::NoNode {
                path: path.to_path_buf(),
                why: "it is a datagram socket: the node's push datagram socket (--push-datagrams) takes a push a \
                      datagram, not this command; give the node's push socket (push.sock in its state directory)"
                    .to_string(),
            };
        }
        if e.kind() == std::io::ErrorKind::PermissionDenied {
            PushError::NotPermitted {
                path: path.to_path_buf(),
            }
        } else if path.is_dir() {
            PushError::Directory {
                path: path.to_path_buf(),
            }
        } else if let Some((dir, pid)) = path
            .parent()
            .and_then(|dir| Some((dir, crate::store::state::StateLock::holder(dir)?)))
        {
            // A node holds the directory the socket would be in, and answers nowhere there.
            PushError::NoSocket {
                dir: dir.to_path_buf(),
                pid,
                path: path.to_path_buf(),
            }
        } else {
            PushError::NoNode {
                path: path.to_path_buf(),
                why: e.to_string(),
            }
        }
    }

    /// The connection broke (`why`) before a whole answer came. If the node cannot have read all of the request
    /// ([`Progress::unread`]), it queued nothing (a node at its bound of connections closes one it does not
    /// serve); else it may have queued the records before the connection closed.
    fn broken(progress: &Progress, why: &str) -> Self {
        if progress.unread() {
            PushError::TryAgain(format!(
                "the node closed the connection before it had read the push ({why}): nothing was queued; the node \
                 may be busy (it serves at most {MAX_PUSH_CONNECTIONS} push connections at once) or stopping: push \
                 again in a moment"
            ))
        } else {
            PushError::MaybeQueued(format!(
                "the node closed the connection after the push was sent, before it answered ({why}): the records \
                 may or may not be queued (was the node stopped or killed? its log says). Pushing them again is at \
                 least once: if they were queued, the device is handed them twice, with new sequences; push again \
                 if a repeat does no harm, else look first at what the device got and at what still waits for it \
                 (pure-serve records --waiting --source SENDER; docs/downlink.md, \"pure-serve push\")"
            ))
        }
    }
}

/// The exit status for an error of `push`: the one its [`PushError`] says, else 1.
pub fn exit_status(e: &anyhow::Error) -> i32 {
    e.chain()
        .find_map(|c| c.downcast_ref::<PushError>())
        .map_or(1, PushError::exit_status)
}

/// What became of the connection's bytes, for telling "not all sent" from "sent, not answered" when it breaks.
#[derive(Debug)]
struct Progress {
    /// The request's body length: the whole request (head and body) is longer.
    body: u64,
    /// Bytes of the request the socket took.
    written: AtomicU64,
    /// A write of the request failed: the rest of it never reached the node.
    write_failed: AtomicBool,
    /// A read failed with ECONNRESET: on Linux a Unix stream socket closed with bytes it had not read (or never
    /// accepted) resets its peer, and this client sends nothing after its request, so the node left some of it
    /// unread.
    reset: AtomicBool,
}

impl Progress {
    fn new(body: u64) -> Self {
        Progress {
            body,
            written: AtomicU64::new(0),
            write_failed: AtomicBool::new(false),
            reset: AtomicBool::new(false),
        }
    }

    /// Whether the node cannot have read the whole request, so queued nothing.
    fn unread(&self) -> bool {
        self.write_failed.load(Ordering::Relaxed)
            || self.reset.load(Ordering::Relaxed)
            || self.written.load(Ordering::Relaxed) <= self.body
    }
}

/// The socket, watched: what it took and how it failed are noted in [`Progress`].
struct Watched {
    stream: tokio::net::UnixStream,
    progress: Arc<Progress>,
}

impl Watched {
    fn noted(&self, r: Poll<std::io::Result<usize>>) -> Poll<std::io::Result<usize>> {
        match &r {
            Poll::Ready(Ok(n)) => {
                self.progress
                    .written
                    .fetch_add(*n as u64, Ordering::Relaxed);
            }
            Poll::Ready(Err(_)) => self.progress.write_failed.store(true, Ordering::Relaxed),
            Poll::Pending => {}
        }
        r
    }
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let r = Pin::new(&mut self.stream).poll_read(cx, buf);
        if let Poll::Ready(Err(e)) = &r
            && e.kind() == std::io::ErrorKind::ConnectionReset
        {
            self.progress.reset.store(true, Ordering::Relaxed);
        }
        r
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.noted(r)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.noted(r)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// `app` and `to` as a query value: everything but unreserved characters percent-encoded.
fn encode(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for b in v.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

pub fn run(args: &PushArgs) -> anyhow::Result<()> {
    let path = args.socket.clone().unwrap_or_else(|| {
        args.state
            .clone()
            .unwrap_or_else(super::node::default_state_dir)
            .join("push.sock")
    });
    if let Some(file) = &args.file {
        return push_file(args, file, &path);
    }
    let Some(to) = args.to.as_deref() else {
        return push_many(args, &path);
    };
    let mut body = Vec::new();
    std::io::stdin()
        .lock()
        .take(MAX_PUSH_BODY as u64 + 1)
        .read_to_end(&mut body)
        .context("cannot read standard input")?;
    if body.len() > MAX_PUSH_BODY {
        return Err(PushError::Refused(format!(
            "standard input is more than {MAX_PUSH_BODY} bytes (4 MiB), the most one push takes: nothing was \
             queued; push the records in parts"
        ))
        .into());
    }
    // An empty input is posted all the same: the node checks the app and the sender, so a typo is found now.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .context("cannot start the push")?;
    let target = format!("/push?app={}&to={}", encode(&args.app), encode(to));
    let (status, answer) = runtime.block_on(post(&path, &target, body))?;
    let value: serde_json::Value = serde_json::from_slice(&answer).unwrap_or_default();
    let field = |k: &str| value.get(k).and_then(serde_json::Value::as_u64);
    let error = value
        .get("error")
        .and_then(serde_json::Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| String::from_utf8_lossy(&answer).trim().to_string());
    match status {
        200 => {
            let (first, last, count) = (field("first"), field("last"), field("count"));
            match (first, last, count) {
                (Some(_), Some(_), Some(0)) => {
                    println!(
                        "nothing to queue: standard input was empty (app {} takes records for {to})",
                        args.app
                    );
                    Ok(())
                }
                (Some(f), Some(l), Some(c)) => {
                    let seqs = if c == 1 {
                        format!("sequence {f}")
                    } else {
                        format!("sequences {f}-{l}")
                    };
                    let records = if c == 1 { "record" } else { "records" };
                    println!("queued {c} {records} for {to} in app {}: {seqs}", args.app);
                    if let Some(e) = field("expired").filter(|e| *e > 0) {
                        println!("({e} of its records had expired and were deleted unsent)");
                    }
                    Ok(())
                }
                _ => Err(anyhow::anyhow!(
                    "the node answered 200 without the sequences it gave ({error}): is {} a pure-serve push socket?",
                    path.display()
                )),
            }
        }
        409 | 413 => Err(PushError::Refused(error).into()),
        404 => Err(PushError::NoSuch(error).into()),
        503 => Err(PushError::TryAgain(error).into()),
        500 => Err(PushError::MaybeQueued(format!(
            "{error} (pure-serve records --waiting --app {} --source {to} lists what still waits for it)",
            args.app
        ))
        .into()),
        other => Err(anyhow::anyhow!("the node answered {other}: {error}")),
    }
}

/// `push --file`: the file, read whole, in one `POST /push-file`, and what became of each sender's push.
fn push_file(args: &PushArgs, file: &Path, path: &Path) -> anyhow::Result<()> {
    let too_large = || {
        PushError::Refused(format!(
            "{} is more than {MAX_BLOB} bytes (64 MiB), the most a file pushed as pieces may have: nothing was \
             queued; push it in parts, or send the devices a reference to fetch it by",
            file.display()
        ))
    };
    let opened = std::fs::File::open(file)
        .with_context(|| format!("cannot open --file {}: nothing was queued", file.display()))?;
    if opened.metadata().is_ok_and(|m| m.len() > MAX_BLOB as u64) {
        return Err(too_large().into());
    }
    let mut body = Vec::new();
    opened
        .take(MAX_BLOB as u64 + 1)
        .read_to_end(&mut body)
        .with_context(|| format!("cannot read --file {}: nothing was queued", file.display()))?;
    if body.len() > MAX_BLOB {
        return Err(too_large().into());
    }
    if body.is_empty() {
        return Err(PushError::Refused(format!(
            "{} is empty: there is nothing to push; nothing was queued",
            file.display()
        ))
        .into());
    }
    let who = match (&args.to, args.to_all) {
        (Some(to), false) => format!("to={}", encode(to).replace("%2C", ",")),
        (None, true) => "all=1".to_string(),
        _ => {
            return Err(anyhow::anyhow!(
                "--file needs --to NAME[,NAME…] or --to-all: the senders to push it to"
            ));
        }
    };
    let target = format!(
        "/push-file?app={}&{who}&piece_size={}",
        encode(&args.app),
        args.piece_size
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .context("cannot start the push")?;
    let (status, answer) = runtime.block_on(post(path, &target, body))?;
    let what = format!("{}", file.display());
    tell_outcomes(args, status, &answer, Some(&what))
}

/// `push --many`: standard input's `SENDER RECORD` lines in one `POST /push-many`, and what became of each; `push
/// --to-all`: standard input's records in one `POST /push-all`, and what became of each sender's push.
fn push_many(args: &PushArgs, path: &Path) -> anyhow::Result<()> {
    let mut body = Vec::new();
    let limit = if args.to_all {
        MAX_PUSH_BODY as u64 + 1
    } else {
        u64::MAX
    };
    std::io::stdin()
        .lock()
        .take(limit)
        .read_to_end(&mut body)
        .context("cannot read standard input")?;
    if args.to_all && body.len() > MAX_PUSH_BODY {
        return Err(PushError::Refused(format!(
            "standard input is more than {MAX_PUSH_BODY} bytes (4 MiB), the most one push takes: nothing was \
             queued"
        ))
        .into());
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .context("cannot start the push")?;
    let target = if args.to_all {
        format!("/push-all?app={}", encode(&args.app))
    } else {
        format!("/push-many?app={}", encode(&args.app))
    };
    let (status, answer) = runtime.block_on(post(path, &target, body))?;
    tell_outcomes(args, status, &answer, None)
}

/// Says what became of each line (or sender) of a push of many, to all or of a file (`file`: its name), and gives
/// the worst outcome as the error.
fn tell_outcomes(
    args: &PushArgs,
    status: u16,
    answer: &[u8],
    file: Option<&str>,
) -> anyhow::Result<()> {
    let value: serde_json::Value = serde_json::from_slice(answer).unwrap_or_default();
    let field = |k: &str| value.get(k).and_then(serde_json::Value::as_u64);
    let (Some(lines), Some(queued), 200) = (field("lines"), field("queued"), status) else {
        let error = value
            .get("error")
            .and_then(serde_json::Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| String::from_utf8_lossy(answer).trim().to_string());
        return Err(match status {
            404 => PushError::NoSuch(error).into(),
            413 => PushError::Refused(error).into(),
            503 => PushError::TryAgain(error).into(),
            400 => PushError::Refused(error).into(),
            other => anyhow::anyhow!("the node answered {other}: {error}"),
        });
    };
    let outcomes = value.get("outcomes").cloned().unwrap_or_default();
    let count = |k: &str| {
        outcomes
            .get(k)
            .and_then(serde_json::Value::as_u64)
            .unwrap_or(0)
    };
    let senders = if lines == 1 { "sender" } else { "senders" };
    if let Some(file) = file {
        let (bytes, pieces, size) = (
            field("bytes").unwrap_or(0),
            field("pieces").unwrap_or(0),
            field("piece_size").unwrap_or(0),
        );
        let passed = if args.to_all {
            format!(
                " app {} accepts ({} it does not accept passed over)",
                args.app,
                field("passed_over").unwrap_or(0)
            )
        } else {
            String::new()
        };
        println!(
            "queued {file} ({bytes} bytes, {pieces} pieces of at most {size}) for {queued} of the {lines} \
             {senders}{passed} in app {}",
            args.app
        );
    } else if args.to_all {
        let passed = field("passed_over").unwrap_or(0);
        println!(
            "queued for {queued} of the {lines} senders app {} accepts ({passed} it does not accept passed over)",
            args.app
        );
    } else {
        println!("queued {queued} of {lines} lines in app {}", args.app);
    }
    if let Some(e) = field("expired").filter(|e| *e > 0) {
        println!("({e} records that had expired were deleted unsent)");
    }
    for p in value
        .get("problems")
        .and_then(serde_json::Value::as_array)
        .into_iter()
        .flatten()
    {
        eprintln!(
            "{} {}: {} ({}): {}",
            if file.is_some() { "sender" } else { "line" },
            p["line"],
            p["outcome"].as_str().unwrap_or("?"),
            p["to"].as_str().unwrap_or(""),
            p["error"].as_str().unwrap_or("")
        );
    }
    if let Some(n) = field("problems_left_out").filter(|n| *n > 0) {
        let what = if file.is_some() { "senders" } else { "lines" };
        eprintln!("… and {n} more {what} not queued");
    }
    if let Some(cut) = value.get("cut").and_then(serde_json::Value::as_str) {
        eprintln!("the push was cut: {cut}");
    }
    let not_queued = lines - queued;
    if not_queued == 0 {
        return Ok(());
    }
    let summary = format!(
        "{not_queued} of {lines} {} not queued: {} refused by a bound, {} to no such sender or app, {} malformed, \
         {} while the store could not take them, {} maybe queued (the lines above say which and why)",
        if file.is_some() { senders } else { "lines" },
        count("refused"),
        count("not_found"),
        count("malformed"),
        count("unavailable"),
        count("maybe_queued"),
    );
    // The worst outcome decides the status: maybe queued (pushing again may queue twice), then try again, then
    // refused.
    Err(if count("maybe_queued") > 0 {
        PushError::MaybeQueued(summary)
    } else if count("unavailable") > 0 {
        PushError::TryAgain(summary)
    } else {
        PushError::Refused(summary)
    }
    .into())
}

/// How long a push waits for the socket of a node that started moments ago (it binds it once its senders file is
/// read and its stores are open), and how young a node counts as starting.
const STARTING_WAIT: std::time::Duration = std::time::Duration::from_secs(10);
const STARTING_AGE: f64 = 60.0;

async fn post(path: &Path, target: &str, body: Vec<u8>) -> anyhow::Result<(u16, Bytes)> {
    let began = std::time::Instant::now();
    let stream = loop {
        match tokio::net::UnixStream::connect(path).await {
            Ok(stream) => break stream,
            Err(e) => match PushError::connect(path, &e) {
                // A lock held with no pid in it yet: the node took it a moment ago and is writing its pid.
                PushError::NoSocket { pid, .. }
                    if pid.is_empty() && began.elapsed() < STARTING_WAIT =>
                {
                    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                    continue;
                }
                PushError::NoSocket { pid, .. }
                    if let Some(age) = starting(&pid)
                        && will_serve(&pid, path) =>
                {
                    if began.elapsed() < STARTING_WAIT {
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        continue;
                    }
                    return Err(PushError::TryAgain(format!(
                        "the node (pid {pid}) started {age:.0} s ago and does not serve {} yet (it reads its \
                         senders file and opens its stores first): push again in a moment",
                        path.display()
                    ))
                    .into());
                }
                other => return Err(other.into()),
            },
        }
    };
    let progress = Arc::new(Progress::new(body.len() as u64));
    let watched = Watched {
        stream,
        progress: progress.clone(),
    };
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(watched))
        .await
        .map_err(|e| PushError::broken(&progress, &e.to_string()))?;
    tokio::spawn(conn);
    let request = Request::post(target)
        .header(hyper::header::HOST, "pure-serve")
        .body(Full::new(Bytes::from(body)))
        .context("cannot make the request")?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| PushError::broken(&progress, &e.to_string()))?;
    let status = response.status().as_u16();
    let answer = response
        .into_body()
        .collect()
        .await
        .map_err(|e| PushError::broken(&progress, &format!("the answer was cut: {e}")))?
        .to_bytes();
    Ok((status, answer))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_encoded_for_the_query() {
        assert_eq!(encode("kitchen-1"), "kitchen-1");
        assert_eq!(encode("a b&c=d"), "a%20b%26c%3Dd");
        assert_eq!(encode("é"), "%C3%A9");
    }
}
