//! A push of many (docs/downlink.md, "Pushing to many devices"): `POST /push-many?app=APP` on the push socket, a
//! body of `SENDER RECORD` lines, each line a push of one record to one sender, answered with an outcome per line
//! once every line is applied. It is how a configuration reaches a million devices: a push a request costs a
//! request, a lookup of its sender by name and a turn of its own; here the names are found in the allow-list's
//! index by name (made once per list, off the HTTP thread, if no push has made it yet: research/046; the request
//! sorted the names for itself before), and the lines go to the receive loop in batches of [`BATCH`], each applied in one turn (one transaction, one sync), two batches
//! in flight so that one fills while the other syncs. A million lines are queued in about 12 s here (research/043).
//!
//! The body is read as it comes, a batch at a time: the node holds at most [`IN_FLIGHT`] + 1 batches of lines,
//! however long the body is, beside the index by name (about 5 bytes per sender, kept with the list). Each line is a push
//! of its own, with the outcome a single push would have (queued, refused by a bound, no such sender, the store
//! unable to take it); lines to one sender are queued in the order of the body. Nothing is all or nothing across
//! lines: the answer counts the outcomes and lists the lines not queued.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::BodyExt;
use hyper::StatusCode;
use hyper::body::Incoming;
use tokio::sync::oneshot;

use super::routes::{Answer, answer};
use crate::common::blob::DownBlob;
use crate::common::push::FileTargets;
use crate::common::push::{
    AnswerTo, Found, PushAnswer, PushInbox, PushRefused, PushRequest, batch_answers,
};
use crate::proto::allow_list::{AllowList, SenderIndex};
use crate::senders::MAX_NAME_LEN;
use crate::store::downlink::MAX_DOWN_PAYLOAD;

/// Lines handed to the receive loop at once, applied in one turn. research/043 measured 8,192 and 2,048 side by
/// side: a million lines took as long with either (12 s), but a turn of 8,192 pushes kept the loop from the
/// senders long enough that a tenth of their records waited 0.33–0.37 s for their ack (0.11–0.13 s with 2,048).
pub const BATCH: usize = 2048;

/// Batches handed over and not yet answered, at most: one fills a turn while the one before it syncs.
const IN_FLIGHT: usize = 2;

/// The longest line: a sender's name, a space, a record.
const MAX_LINE: usize = MAX_NAME_LEN + 1 + MAX_DOWN_PAYLOAD;

/// Lines not queued listed in the answer, at most (all are counted).
const PROBLEMS_LISTED: usize = 100;

/// How long the body may pause between two of its parts, and a batch wait for its answer.
const WAIT: Duration = Duration::from_secs(30);

/// What became of one line, by the word the answer counts it under.
fn outcome_word(a: &PushAnswer) -> &'static str {
    match a {
        PushAnswer::Queued { .. } | PushAnswer::Empty => "queued",
        PushAnswer::Refused { .. } => "refused",
        PushAnswer::NotFound(_) | PushAnswer::NoSuchApp(_) | PushAnswer::NotAccepted(_) => {
            "not_found"
        }
        PushAnswer::Unavailable(_) => "unavailable",
        PushAnswer::MaybeQueued(_) => "maybe_queued",
    }
}

/// The tally of a push of many, made into its answer at the end.
#[derive(Default)]
struct Tally {
    /// A push to every sender an app accepts: senders it does not accept are passed over, not counted as lines.
    to_all: bool,
    passed_over: u64,
    lines: u64,
    counts: std::collections::BTreeMap<&'static str, u64>,
    /// The lines not queued with the lowest numbers, at most [`PROBLEMS_LISTED`]: a line found malformed is noted
    /// at once and one refused when its batch is answered, so they come out of order.
    problems: std::collections::BinaryHeap<ByLine>,
    expired: u64,
    /// A push of a file: its bytes, its pieces and their size.
    file: Option<(u64, u64, u64)>,
    /// Lines answered that the node has no such app, and what it said.
    no_app: u64,
    no_app_why: Option<String>,
}

impl Tally {
    fn note(&mut self, line: u64, to: &str, outcome: &'static str, why: Option<String>) {
        *self.counts.entry(outcome).or_default() += 1;
        if outcome == "queued"
            || self.problems.len() >= PROBLEMS_LISTED
                && self.problems.peek().is_some_and(|last| last.0 < line)
        {
            return;
        }
        self.problems.push(ByLine(
            line,
            serde_json::json!({ "line": line, "to": to, "outcome": outcome, "error": why }),
        ));
        if self.problems.len() > PROBLEMS_LISTED {
            self.problems.pop();
        }
    }

    fn answered(&mut self, line: u64, to: &str, a: PushAnswer) {
        let word = outcome_word(&a);
        let why = match a {
            PushAnswer::Queued { expired, .. } => {
                self.expired += expired;
                None
            }
            PushAnswer::Empty => None,
            PushAnswer::Refused { why, expired, .. } => {
                self.expired += expired;
                Some(why)
            }
            PushAnswer::NotAccepted(_) if self.to_all => {
                // A push to every sender the app accepts passes over those it does not.
                self.lines -= 1;
                self.passed_over += 1;
                return;
            }
            PushAnswer::NoSuchApp(why) => {
                self.no_app += 1;
                self.no_app_why.get_or_insert_with(|| why.clone());
                Some(why)
            }
            PushAnswer::NotFound(why)
            | PushAnswer::NotAccepted(why)
            | PushAnswer::Unavailable(why)
            | PushAnswer::MaybeQueued(why) => Some(why),
        };
        self.note(line, to, word, why);
    }

    fn into_answer(self, app: &str, cut: Option<String>) -> Answer {
        // A push to every sender of an app the node does not have: said once, as for one push (404), not once a
        // sender. (A push of many lines says it of each line, as it says every line's outcome.)
        if self.to_all
            && self.lines > 0
            && self.no_app == self.lines
            && let Some(why) = self.no_app_why
        {
            let (_, value) = crate::common::push::error_json(404, why);
            return answer(
                StatusCode::NOT_FOUND,
                "application/json",
                format!("{value}\n"),
            );
        }
        let queued = self.counts.get("queued").copied().unwrap_or(0);
        let listed = self.problems.len() as u64;
        let problems: Vec<serde_json::Value> = self
            .problems
            .into_sorted_vec()
            .into_iter()
            .map(|p| p.1)
            .collect();
        let mut value = serde_json::json!({
            "app": app,
            "lines": self.lines,
            "queued": queued,
            "not_queued": self.lines - queued,
            "outcomes": self.counts,
            "expired": self.expired,
            "problems": problems,
            "problems_left_out": self.lines - queued - listed,
            "cut": cut,
        });
        if self.to_all {
            value["passed_over"] = self.passed_over.into();
        }
        if let Some((bytes, pieces, piece_size)) = self.file {
            value["bytes"] = bytes.into();
            value["pieces"] = pieces.into();
            value["piece_size"] = piece_size.into();
        }
        answer(StatusCode::OK, "application/json", format!("{value}\n"))
    }
}

/// A line not queued, ordered by its number alone (the largest first out of the heap).
struct ByLine(u64, serde_json::Value);

impl PartialEq for ByLine {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}
impl Eq for ByLine {}
impl PartialOrd for ByLine {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for ByLine {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.cmp(&other.0)
    }
}

/// A line of the body, parsed: its sender and record, or why it is not a push.
fn parse_line(line: &[u8]) -> Result<(&str, &[u8]), String> {
    let Some(space) = memchr::memchr(b' ', line) else {
        return Err("a line is SENDER RECORD: no space after the sender's name".into());
    };
    let (name, record) = (&line[..space], &line[space + 1..]);
    match std::str::from_utf8(name) {
        Ok(n) if !n.is_empty() && n.len() <= MAX_NAME_LEN => Ok((n, record)),
        _ => Err(format!(
            "the sender's name is not 1–{MAX_NAME_LEN} characters of a senders file's name"
        )),
    }
}

/// A line to hand to the loop: its number, its sender (and the sender's index in the list, if it is there), its
/// records.
struct Line {
    number: u64,
    to: String,
    index: Option<SenderIndex>,
    records: Vec<Vec<u8>>,
    blob: Option<Arc<DownBlob>>,
}

/// A batch handed to the loop: its lines' numbers and senders, and where their answers come.
struct Sent {
    lines: Vec<(u64, String)>,
    answers: oneshot::Receiver<Vec<PushAnswer>>,
}

/// Serves `POST /push-many?app=APP` (docs/downlink.md, "Pushing to many devices").
pub(super) async fn handle(body: Incoming, app: String, inbox: &PushInbox) -> Answer {
    // Indexed off the HTTP thread (a million names take about a tenth of a second, and this thread also answers
    // /link), unless a push has indexed this list already.
    let list = inbox.list();
    let names = if list.name_index().is_some() {
        list
    } else {
        let indexing = list.clone();
        if tokio::task::spawn_blocking(move || {
            indexing.index_names();
        })
        .await
        .is_err()
        {
            return answer(
                StatusCode::INTERNAL_SERVER_ERROR,
                "application/json",
                "{\"error\": \"could not index the senders' names\"}\n",
            );
        }
        list
    };
    let mut tally = Tally::default();
    let mut handing = Handing::new(&app, names.clone(), inbox);
    let mut pending: Vec<u8> = Vec::new();
    // The line being skipped because it is too long (its number), until its end.
    let mut skipping: Option<u64> = None;
    let mut body = body;
    let mut cut = None;
    loop {
        let frame = match tokio::time::timeout(WAIT, body.frame()).await {
            Ok(Some(Ok(f))) => f,
            Ok(None) => break,
            Ok(Some(Err(e))) => {
                cut = Some(format!(
                    "the body could not be read past line {}: {e}",
                    tally.lines
                ));
                break;
            }
            Err(_) => {
                cut = Some(format!(
                    "the body paused for more than {} s after line {}: what came before was applied",
                    WAIT.as_secs(),
                    tally.lines
                ));
                break;
            }
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        pending.extend_from_slice(&data);
        let mut start = 0;
        while let Some(k) = memchr::memchr(b'\n', &pending[start..]) {
            let line = &pending[start..start + k];
            start += k + 1;
            if skipping.take().is_some() {
                continue;
            }
            if let Some(line) = take_line(line, &names, &mut tally) {
                handing.add(line, &mut tally).await;
            }
        }
        pending.drain(..start);
        if pending.len() > MAX_LINE {
            // Too long to be a line: counted once, and skipped to its end.
            if skipping.is_none() {
                tally.lines += 1;
                tally.note(
                    tally.lines,
                    "",
                    "malformed",
                    Some(format!(
                        "the line is longer than {MAX_LINE} bytes (a name of at most {MAX_NAME_LEN}, a space and a \
                         record of at most {MAX_DOWN_PAYLOAD})"
                    )),
                );
                skipping = Some(tally.lines);
            }
            pending.clear();
        }
    }
    if !pending.is_empty() && skipping.is_none() && cut.is_none() {
        // The last line, without its newline.
        let line = std::mem::take(&mut pending);
        if let Some(line) = take_line(&line, &names, &mut tally) {
            handing.add(line, &mut tally).await;
        }
    }
    handing.finish(&mut tally).await;
    tally.into_answer(&app, cut)
}

/// Serves `POST /push-all?app=APP` (docs/downlink.md, "Pushing to many devices"): the body's records (one per line,
/// at most [`crate::common::push::MAX_PUSH_BODY`] as a single push) pushed to every sender of the senders file that the app accepts, each
/// sender's all or nothing; senders the app does not accept are passed over.
pub(super) async fn handle_all(records: Vec<Vec<u8>>, app: String, inbox: &PushInbox) -> Answer {
    let list = inbox.list();
    let mut tally = Tally {
        to_all: true,
        ..Tally::default()
    };
    let mut handing = Handing::new(&app, list.clone(), inbox);
    for index in 0..list.len() as SenderIndex {
        tally.lines += 1;
        let line = Line {
            number: tally.lines,
            to: list.name(index).to_string(),
            index: Some(index),
            records: records.clone(),
            blob: None,
        };
        handing.add(line, &mut tally).await;
    }
    handing.finish(&mut tally).await;
    tally.into_answer(&app, None)
}

/// Serves `POST /push-file?app=APP&to=A,B` (or `&all=1`; docs/downlink.md, "Pushing a file"): `blob`'s pieces pushed
/// to each sender named (or every sender of the senders file that the app accepts), each sender's all or nothing,
/// in batches of [`BATCH`] senders a turn as a push to all; the blob is stored once in the app's store, however many
/// senders and turns. Senders are counted as lines.
pub(super) async fn handle_file(
    blob: DownBlob,
    app: String,
    targets: FileTargets,
    inbox: &PushInbox,
) -> Answer {
    let blob = Arc::new(blob);
    let list = inbox.list();
    let mut tally = Tally {
        to_all: targets == FileTargets::All,
        file: Some((
            blob.bytes().len() as u64,
            blob.pieces(),
            blob.piece_len() as u64,
        )),
        ..Tally::default()
    };
    let mut handing = Handing::new(&app, list.clone(), inbox);
    let mut add = async |to: String, index: Option<SenderIndex>, tally: &mut Tally| {
        tally.lines += 1;
        let line = Line {
            number: tally.lines,
            to,
            index,
            records: Vec::new(),
            blob: Some(blob.clone()),
        };
        handing.add(line, tally).await;
    };
    match targets {
        FileTargets::All => {
            for index in 0..list.len() as SenderIndex {
                add(list.name(index).to_string(), Some(index), &mut tally).await;
            }
        }
        FileTargets::Names(names) => {
            for name in names {
                let index = crate::common::push::find_name(&list, &name);
                add(name, index, &mut tally).await;
            }
        }
    }
    handing.finish(&mut tally).await;
    tally.into_answer(&app, None)
}

/// Counts a line: the push it is, or none (noted why).
fn take_line(line: &[u8], names: &AllowList, tally: &mut Tally) -> Option<Line> {
    tally.lines += 1;
    match parse_line(line) {
        Ok((to, record)) => Some(Line {
            number: tally.lines,
            to: to.to_string(),
            index: names.find_name(to),
            records: vec![record.to_vec()],
            blob: None,
        }),
        Err(why) => {
            tally.note(tally.lines, "", "malformed", Some(why));
            None
        }
    }
}

/// The lines of a request on their way to the loop: a batch filling, and the batches handed over and not yet
/// answered.
struct Handing<'a> {
    app: &'a str,
    list: Arc<AllowList>,
    inbox: &'a PushInbox,
    batch: Vec<Line>,
    in_flight: VecDeque<Sent>,
}

impl<'a> Handing<'a> {
    fn new(app: &'a str, list: Arc<AllowList>, inbox: &'a PushInbox) -> Self {
        Handing {
            app,
            list,
            inbox,
            batch: Vec::with_capacity(BATCH),
            in_flight: VecDeque::new(),
        }
    }

    /// Adds a line; a full batch goes to the loop.
    async fn add(&mut self, line: Line, tally: &mut Tally) {
        self.batch.push(line);
        if self.batch.len() == BATCH {
            self.send(tally).await;
        }
    }

    /// Hands what is left to the loop and counts every batch's answers.
    async fn finish(mut self, tally: &mut Tally) {
        if !self.batch.is_empty() {
            self.send(tally).await;
        }
        while let Some(sent) = self.in_flight.pop_front() {
            collect(sent, tally).await;
        }
    }

    /// Hands the batch to the loop (waiting while its queue is full), after waiting for the oldest batch in flight
    /// if [`IN_FLIGHT`] are.
    async fn send(&mut self, tally: &mut Tally) {
        if self.in_flight.len() >= IN_FLIGHT
            && let Some(sent) = self.in_flight.pop_front()
        {
            collect(sent, tally).await;
        }
        let (slots, answers) = batch_answers(self.batch.len());
        let mut lines = Vec::with_capacity(self.batch.len());
        let mut requests: Vec<PushRequest> = Vec::with_capacity(self.batch.len());
        for (line, slot) in self.batch.drain(..).zip(slots) {
            requests.push(PushRequest {
                app: self.app.to_string(),
                to: line.to.clone(),
                records: line.records,
                blob: line.blob,
                answer: AnswerTo::Line(slot),
                found: Some(Found {
                    list: self.list.clone(),
                    index: line.index,
                }),
            });
            lines.push((line.number, line.to));
        }
        // The queue holds 64 pushes of any kind; a push of many waits for room rather than fail its lines.
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            match self.inbox.send_many(requests) {
                Ok(()) => break,
                Err((PushRefused::Busy, back)) if tokio::time::Instant::now() < deadline => {
                    requests = back;
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                Err((why, back)) => {
                    let words = match why {
                        PushRefused::Busy => format!(
                            "the node's push queue stayed full for {} s: nothing of this line was queued",
                            WAIT.as_secs()
                        ),
                        PushRefused::Stopped => {
                            "the node is stopping: nothing of this line was queued".to_string()
                        }
                    };
                    for r in back {
                        let _ = r.answer.send(PushAnswer::Unavailable(words.clone()));
                    }
                    break;
                }
            }
        }
        self.in_flight.push_back(Sent { lines, answers });
    }
}

/// Waits for a batch's answers and counts them.
async fn collect(sent: Sent, tally: &mut Tally) {
    match tokio::time::timeout(WAIT, sent.answers).await {
        Ok(Ok(answers)) => {
            for ((line, to), a) in sent.lines.iter().zip(answers) {
                tally.answered(*line, to, a);
            }
        }
        Ok(Err(_)) => {
            for (line, to) in &sent.lines {
                tally.note(
                    *line,
                    to,
                    "unavailable",
                    Some(
                        "the node stopped before this line was applied: nothing of it was queued"
                            .into(),
                    ),
                );
            }
        }
        Err(_) => {
            for (line, to) in &sent.lines {
                tally.note(
                    *line,
                    to,
                    "maybe_queued",
                    Some(format!(
                        "no answer within {} s (the store may be slow or its disk failing): the record may or may \
                         not be queued",
                        WAIT.as_secs()
                    )),
                );
            }
        }
    }
}
