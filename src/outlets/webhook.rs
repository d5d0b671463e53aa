//! The webhook outlet: an app's records as JSON batches POSTed to any HTTP(S) endpoint; a 2xx answer means stored.
//!
//! A batch (docs/apps.md, "webhook batches") is up to `batch_records` records in position order, each the same JSON
//! object `records --json` prints ([`crate::store::json`]), with an **idempotency key** that names the batch by its
//! node, app, outlet and positions, in the body and in an `Idempotency-Key` header. The receiver's 2xx moves the
//! outlet past the batch; anything else, or no answer within the deadline, sends the same batch again after a
//! backoff.
//!
//! A webhook is **at least once**: a 2xx the node did not get (the connection broke after the receiver stored the
//! batch), or one it got but had not yet written to its store before a crash (`outlets.acked` is written with the
//! app's turns), makes it send those records again. The receiver drops repeats by each record's `(source, seq)`
//! (unique within an app) or by a batch's idempotency key; docs/apps.md says how.
//!
//! Where to resume after a restart is the acknowledged position the host read from the store: there is no far side
//! to ask.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::Outlet;
use super::http::Client;
use super::link::RETRY_AFTER;
use crate::common::address::HttpUrl;
use crate::common::dns::Resolver;
use crate::store::Chunk;

/// Longest wait between retries of a batch.
const BACKOFF_MAX: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookTarget {
    pub url: HttpUrl,
    pub ca_file: Option<std::path::PathBuf>,
    pub headers: Vec<(String, String)>,
    pub batch_records: usize,
}

/// A batch ready to send: its last position and its body.
struct Batch {
    first: u64,
    last: u64,
    key: String,
    body: Bytes,
}

/// The idempotency key of the batch of positions `first..=last`: stable for the same records, so a receiver that
/// saw it stored them already.
pub fn idempotency_key(node: &str, app: &str, outlet: &str, first: u64, last: u64) -> String {
    format!("{node}:{app}:{outlet}:{first}-{last}")
}

/// Builds the next batch from `pending` starting at position `next` (records before it are skipped).
fn build_batch(
    pending: &VecDeque<Arc<Chunk>>,
    next: u64,
    max: usize,
    node: &str,
    outlet: &Outlet,
) -> Option<Batch> {
    let mut records = Vec::new();
    let mut last = next;
    'chunks: for chunk in pending {
        for view in chunk.views(next) {
            if view.pos < next {
                continue;
            }
            records.push(crate::store::json::record(&outlet.app, &view));
            last = view.pos;
            if records.len() >= max {
                break 'chunks;
            }
        }
    }
    if records.is_empty() {
        return None;
    }
    let key = idempotency_key(node, &outlet.app, &outlet.name, next, last);
    let body = serde_json::json!({
        "node": node,
        "app": outlet.app,
        "outlet": outlet.name,
        "idempotency_key": key,
        "first_pos": next,
        "last_pos": last,
        "records": records,
    });
    Some(Batch {
        first: next,
        last,
        key,
        body: Bytes::from(body.to_string()),
    })
}

/// `node` names this node in batches: its public key, as `pure-serve pubkey` prints it.
pub async fn run(outlet: Arc<Outlet>, target: WebhookTarget, node: String, dns: Resolver) {
    let mut client = loop {
        match Client::new(target.url.clone(), target.ca_file.as_deref(), dns.clone()) {
            Ok(c) => break c,
            Err(e) => {
                outlet.error(e.kind(), e.to_string());
                tokio::time::sleep(RETRY_AFTER).await;
            }
        }
    };
    let far = target.url.to_string();
    // Resume after what the store says the receiver acknowledged.
    let mut next = outlet.acked() + 1;
    outlet.restart_from(next);
    outlet.recovered("sending");
    let mut pending: VecDeque<Arc<Chunk>> = VecDeque::new();
    let mut batch: Option<Batch> = None;
    let mut backoff = Duration::ZERO;
    loop {
        pending.extend(outlet.take_fed());
        // Chunks wholly before `next` are done: their bytes are no longer held.
        while let Some(c) = pending.front() {
            if c.pos + c.count > next {
                break;
            }
            outlet.release(c.body.len());
            pending.pop_front();
        }
        if batch.is_none() {
            batch = build_batch(&pending, next, target.batch_records.max(1), &node, &outlet);
        }
        let Some(b) = &batch else {
            outlet.set_status("idle");
            outlet.pushed().await;
            continue;
        };
        let mut headers = target.headers.clone();
        headers.push(("Idempotency-Key".to_string(), b.key.clone()));
        match client
            .post("application/json", &headers, b.body.clone())
            .await
        {
            Ok((status, _)) if (200..300).contains(&status) => {
                next = b.last + 1;
                outlet.set_acked(b.last);
                outlet.recovered("sending");
                batch = None;
                backoff = Duration::ZERO;
            }
            Ok((status, answer)) => {
                outlet.error(
                    "http",
                    refused_batch(&far, status, b.first, b.last, &answer),
                );
                backoff = (backoff * 2).clamp(Duration::from_millis(500), BACKOFF_MAX);
            }
            Err(e) => {
                outlet.error(e.kind(), format!("{far}: {e}"));
                backoff = (backoff * 2).clamp(Duration::from_millis(500), BACKOFF_MAX);
            }
        }
        if !backoff.is_zero() {
            tokio::time::sleep(backoff).await;
        }
    }
}

/// What the outlet says of a batch the receiver answered with a status other than 2xx: the start of the answer's
/// body when it has one, nothing after the status when it has none.
fn refused_batch(far: &str, status: u16, first: u64, last: u64, answer: &[u8]) -> String {
    let text = String::from_utf8_lossy(&answer[..answer.len().min(200)]).to_string();
    let said = match text.trim() {
        "" => String::new(),
        t => format!(": {t}"),
    };
    format!("{far} answered {status} to the batch of positions {first}–{last}{said}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_batch_is_said_with_the_body_if_any() {
        assert_eq!(
            refused_batch("https://h/x", 500, 1, 2, b""),
            "https://h/x answered 500 to the batch of positions 1–2"
        );
        assert_eq!(
            refused_batch("https://h/x", 503, 3, 9, b" busy\n"),
            "https://h/x answered 503 to the batch of positions 3–9: busy"
        );
    }
    use crate::common::wake::Wake;
    use crate::proto::wire::{RecordFormat, put_record};

    #[test]
    fn a_batch_starts_at_the_next_position_and_names_itself() {
        let mut body = Vec::new();
        for r in ["a", "b", "c"] {
            put_record(&mut body, r.as_bytes());
        }
        let chunk = Arc::new(Chunk {
            pos: 10,
            source: "dev".into(),
            first_seq: 5,
            count: 3,
            format: RecordFormat::Plain,
            stored_at_ms: 1,
            body,
        });
        let outlet = Outlet::new(
            1,
            "main",
            "hook",
            "webhook",
            1 << 20,
            Arc::new(Wake::new().unwrap()),
        );
        let pending = VecDeque::from([chunk]);
        let b = build_batch(&pending, 11, 1, "NODE", &outlet).unwrap();
        assert_eq!((b.first, b.last), (11, 11));
        assert_eq!(b.key, "NODE:main:hook:11-11");
        let v: serde_json::Value = serde_json::from_slice(&b.body).unwrap();
        assert_eq!(v["records"][0]["seq"], 6);
        assert_eq!(v["records"][0]["pos"], 11);
        assert_eq!(v["records"][0]["payload"], "b");
        let all = build_batch(&pending, 10, 100, "NODE", &outlet).unwrap();
        assert_eq!((all.first, all.last), (10, 12));
        assert!(build_batch(&pending, 13, 100, "NODE", &outlet).is_none());
    }
}
