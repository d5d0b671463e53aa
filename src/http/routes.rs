//! What each request is answered, by listener: on `--http-port` `/healthz`, `/` (GET or HEAD) and `POST /link`; on
//! `--metrics-listen` `/metrics`, `/healthz`, the status page `/` and its figures `/status.json`; and errors, each
//! saying where the thing asked for is served.
//!
//! The page is one file, `status.html` (HTML, CSS and the script that draws its charts, no third-party code),
//! compiled into the binary: it works with no internet, and it only reads `/status.json`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::{Body, Bytes, Incoming};
use hyper::header::{ALLOW, CACHE_CONTROL, CONNECTION, CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use hyper::{Method, Request, Response, StatusCode};
use tokio::sync::oneshot;

use super::counters::bump;
use super::framing::Framed;
use super::link::{LinkRefused, LinkRequest};
use super::{Listener, Shared};
use crate::ops::metrics::{ProcessFigures, health, render};

/// The status page, served whole from the binary.
pub(super) const STATUS_PAGE: &str = include_str!("status.html");

/// Samples the status page's history every [`crate::ops::status::SAMPLE_EVERY`], on the HTTP thread: a copy of a
/// few integers under the snapshot's lock (the module doc of [`crate::ops::status`] weighs the cost).
pub(super) async fn sample_history(shared: Arc<Shared>) {
    let mut tick = tokio::time::interval(crate::ops::status::SAMPLE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let now = Instant::now();
        let snapshot = shared
            .stats
            .snapshot
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Ok(mut h) = shared.history.lock() {
            h.sample(now, &snapshot);
        }
    }
}

/// `/status.json`: the figures of the status page.
fn status_json(shared: &Shared, now: Instant) -> Answer {
    let snapshot = match shared.stats.snapshot.lock() {
        Ok(s) => s.clone(),
        Err(poisoned) => poisoned.into_inner().clone(),
    };
    let mut status = match shared.history.lock() {
        Ok(h) => crate::ops::status::report(
            &snapshot,
            &h,
            &shared.listens,
            shared.stats.heartbeat.started(),
            shared.stats.heartbeat.age(now),
            now,
            crate::ops::metrics::wall_ms(),
        ),
        Err(poisoned) => crate::ops::status::report(
            &snapshot,
            &poisoned.into_inner(),
            &shared.listens,
            shared.stats.heartbeat.started(),
            shared.stats.heartbeat.age(now),
            now,
            crate::ops::metrics::wall_ms(),
        ),
    };
    status.host = ProcessFigures::read(snapshot.state_dir.as_deref(), &snapshot.apps);
    status.devices = shared
        .stats
        .devices
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .clone();
    match serde_json::to_vec(&status) {
        Ok(body) => {
            let mut r = answer(StatusCode::OK, "application/json", body);
            r.headers_mut()
                .insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
            r
        }
        Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")),
    }
}

/// `/devices.json?name=TEXT`: the senders whose names contain TEXT (ASCII letters in either case), at most
/// [`crate::ops::devices::SEARCH_LISTED`], each with its last record's time, from the devices census's thread (which
/// reads the stores; a search waits for a scan in progress).
async fn devices_json(query: Option<&str>, shared: &Shared) -> Answer {
    let Some(search) = &shared.devices else {
        return text(
            StatusCode::NOT_FOUND,
            "this node runs no devices census: /devices.json is not served\n",
        );
    };
    let text_asked = crate::common::push::decoded_pairs(query.unwrap_or(""))
        .ok()
        .and_then(|pairs| pairs.into_iter().find(|(k, _)| *k == "name"))
        .map(|(_, v)| v);
    let Some(name) = text_asked.filter(|t| !t.is_empty() && t.len() <= 256) else {
        return text(
            StatusCode::BAD_REQUEST,
            "give the text to look for: /devices.json?name=TEXT (1 to 256 bytes)\n",
        );
    };
    let asked = match search.ask(&name) {
        Ok(rx) => rx,
        Err(crate::ops::devices::SearchRefused::Busy) => {
            return unavailable("busy: other searches wait for the devices census; try again\n");
        }
        Err(crate::ops::devices::SearchRefused::Stopped) => {
            return unavailable("the devices census has stopped (the node is stopping)\n");
        }
    };
    match tokio::time::timeout(SEARCH_WAIT, asked).await {
        Ok(Ok(Ok((found, more)))) => {
            let body = serde_json::json!({"name": name, "senders": found, "more": more});
            let mut r = answer(StatusCode::OK, "application/json", body.to_string());
            r.headers_mut()
                .insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
            r
        }
        Ok(Ok(Err(why))) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the stores could not be read: {why}\n"),
        ),
        Ok(Err(_)) => unavailable("the devices census has stopped (the node is stopping)\n"),
        Err(_) => unavailable(format!(
            "no answer within {} s: the devices census is scanning the stores; try again\n",
            SEARCH_WAIT.as_secs()
        )),
    }
}

/// How long a search may wait for the devices census (a scan of a million senders takes about 5 s here).
const SEARCH_WAIT: std::time::Duration = std::time::Duration::from_secs(15);

/// The media type of a `POST /link` answer (and what a request should say it sends).
pub const LINK_CONTENT_TYPE: &str = "application/x-pure-link";

pub(super) type Answer = Response<Full<Bytes>>;

pub(super) fn answer(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Answer {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

fn text(status: StatusCode, body: impl Into<Bytes>) -> Answer {
    answer(status, "text/plain", body)
}

/// An error after which the connection is not reused: the rest of the request body may still be on its way.
fn closing(mut r: Answer) -> Answer {
    r.headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("close"));
    r
}

/// 503 with `Retry-After: 1`: the node cannot take it now; the same request a second later may succeed.
fn unavailable(body: impl Into<Bytes>) -> Answer {
    let mut r = text(StatusCode::SERVICE_UNAVAILABLE, body);
    r.headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from_static("1"));
    r
}

pub(super) async fn handle(
    req: Request<Incoming>,
    peer: SocketAddr,
    which: Listener,
    shared: Arc<Shared>,
) -> Answer {
    let path = req.uri().path();
    if path == "/link" && which == Listener::Metrics {
        return text(
            StatusCode::NOT_FOUND,
            "POST /link is served on the node's --http-port, not on its metrics listener\n",
        );
    }
    if path == "/link" {
        if req.method() != Method::POST {
            let mut r = text(
                StatusCode::METHOD_NOT_ALLOWED,
                "/link takes POST: a body of framed link packets (docs/protocol.md, Links over HTTP)\n",
            );
            r.headers_mut()
                .insert(ALLOW, HeaderValue::from_static("POST"));
            return r;
        }
        return link(req, peer, &shared).await;
    }
    // A path not served is 404 whatever the method (a POST to a mistyped /link too): 405 would say the path
    // exists (protocol.md 10).
    let served = matches!(
        path,
        "/" | "/status.json" | "/devices.json" | "/healthz" | "/metrics"
    );
    if served && req.method() != Method::GET && req.method() != Method::HEAD {
        let mut r = text(StatusCode::METHOD_NOT_ALLOWED, "only GET and HEAD\n");
        r.headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    let now = Instant::now();
    match path {
        "/metrics" if which == Listener::Http => text(
            StatusCode::NOT_FOUND,
            "/metrics is not served on this port: it is on the node's --metrics-listen address (loopback unless \
             changed; docs/operations.md, Ports)\n",
        ),
        "/metrics" => {
            let snapshot = match shared.stats.snapshot.lock() {
                Ok(s) => s.clone(),
                // The loop panicked while publishing; the last figures are still worth showing.
                Err(poisoned) => poisoned.into_inner().clone(),
            };
            let mut page = render(
                &snapshot,
                ProcessFigures::read(snapshot.state_dir.as_deref(), &snapshot.apps),
                shared.stats.heartbeat.age(now),
                crate::ops::metrics::wall_ms(),
            );
            shared.counters.render_into(
                &mut page,
                [
                    shared.slots(Listener::Http).open(),
                    shared.slots(Listener::Metrics).open(),
                ],
                shared
                    .stats
                    .link_packets_unrouted
                    .load(std::sync::atomic::Ordering::Relaxed),
                shared.limits.tls_handshakes_per_second,
            );
            if let Some(c) = shared
                .stats
                .devices
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .as_ref()
            {
                crate::ops::metrics::render_devices(&mut page, c);
            }
            answer(
                StatusCode::OK,
                "text/plain; version=0.0.4; charset=utf-8",
                page,
            )
        }
        "/healthz" => {
            let age = shared.stats.heartbeat.age(now);
            let verdict = match shared.stats.snapshot.lock() {
                Ok(s) => health(&s, age),
                Err(_) => {
                    Err("the receive loop's figures are unreadable (it panicked)".to_string())
                }
            };
            match verdict {
                Ok(()) => text(StatusCode::OK, "ok\n"),
                Err(why) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
            }
        }
        "/" | "/status.json" | "/devices.json" if which == Listener::Http => text(
            if path == "/" {
                StatusCode::OK
            } else {
                StatusCode::NOT_FOUND
            },
            "pure-serve: /healthz, POST /link (links over HTTP); the status page is on the node's \
             --metrics-listen address (loopback unless changed; docs/operations.md, Status page)\n",
        ),
        "/" => {
            let mut r = answer(StatusCode::OK, "text/html; charset=utf-8", STATUS_PAGE);
            r.headers_mut()
                .insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
            r
        }
        "/status.json" => status_json(&shared, now),
        "/devices.json" => devices_json(req.uri().query(), &shared).await,
        _ => text(
            StatusCode::NOT_FOUND,
            match which {
                Listener::Http => "not found: this port serves /healthz, / and POST /link\n",
                Listener::Metrics => {
                    "not found: try / (the status page), /status.json, /metrics or /healthz\n"
                }
            },
        ),
    }
}

/// `POST /link` on a node started with `--no-http-links`: 404 whatever the body (protocol.md 10), said after the
/// body was read, since closing on an unread body would reset the connection and could lose the answer. A body
/// too large or too slow to read is not waited for: the answer then closes the connection.
async fn no_http_links(
    req: Request<Incoming>,
    deadline: tokio::time::Instant,
    max: usize,
) -> Answer {
    let read = req.body().size_hint().lower() <= max as u64
        && matches!(
            tokio::time::timeout_at(deadline, Limited::new(req.into_body(), max).collect()).await,
            Ok(Ok(_))
        );
    let refused = text(
        StatusCode::NOT_FOUND,
        "this node does not take links over HTTP (it runs with --no-http-links): send over UDP to its \
         --link-port\n",
    );
    if read { refused } else { closing(refused) }
}

/// `POST /link`: read and check the body, hand its packets to the receive loop, answer what they earned. One
/// deadline covers reading the body and waiting for the loop's answer (which comes after its commit).
async fn link(req: Request<Incoming>, peer: SocketAddr, shared: &Shared) -> Answer {
    let limits = &shared.limits;
    let c = &shared.counters;
    let deadline = tokio::time::Instant::now() + limits.request_deadline;
    let max = limits.max_link_body;
    let Some(inbox) = &shared.links else {
        return no_http_links(req, deadline, max).await;
    };
    let order = req
        .headers()
        .get(super::order::HEADER)
        .and_then(|v| super::order::parse(v.as_bytes()));
    let too_large = || {
        bump(&c.link_too_large);
        closing(text(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("a POST /link body is at most {max} bytes: send fewer packets per request\n"),
        ))
    };
    if req.body().size_hint().lower() > max as u64 {
        return too_large();
    }
    let body = match tokio::time::timeout_at(deadline, Limited::new(req.into_body(), max).collect())
        .await
    {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => return too_large(),
        Ok(Err(e)) => {
            bump(&c.link_bad_request);
            return closing(text(
                StatusCode::BAD_REQUEST,
                format!("could not read the body: {e}\n"),
            ));
        }
        Err(_) => {
            bump(&c.link_slow_body);
            return closing(text(
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "the body did not arrive within {} s\n",
                    limits.request_deadline.as_secs_f64()
                ),
            ));
        }
    };
    let packets = match Framed::parse(Vec::from(body)) {
        Ok(p) => p,
        Err(e) => {
            bump(&c.link_bad_request);
            return text(StatusCode::BAD_REQUEST, format!("{e}\n"));
        }
    };
    bump(&c.link_requests);
    if packets.is_empty() {
        return answer(StatusCode::OK, LINK_CONTENT_TYPE, Bytes::new());
    }
    c.link_packets
        .fetch_add(packets.len() as u64, std::sync::atomic::Ordering::Relaxed);
    let (reply, answered) = oneshot::channel();
    let request = LinkRequest {
        peer,
        packets,
        reply,
    };
    let sent = match order {
        Some((token, seq)) => {
            shared
                .order
                .in_order(token, seq, || inbox.send(request))
                .await
        }
        None => inbox.send(request),
    };
    match sent {
        Ok(()) => {}
        Err(LinkRefused::Busy(_)) => {
            bump(&c.link_busy);
            return unavailable("the node is busy: send again in a second\n");
        }
        Err(LinkRefused::Stopped(_)) => {
            bump(&c.link_stopping);
            return unavailable("the node is stopping\n");
        }
    }
    match tokio::time::timeout_at(deadline, answered).await {
        Ok(Ok(node_packets)) => {
            c.link_answers.fetch_add(
                node_packets.len() as u64,
                std::sync::atomic::Ordering::Relaxed,
            );
            match Framed::from_packets(&node_packets) {
                Ok(f) => answer(StatusCode::OK, LINK_CONTENT_TYPE, f.into_bytes()),
                // The node's packets are at most one datagram each; this would be a bug, not the client's fault.
                Err(e) => {
                    tracing::error!("POST /link answer not framed: {e}");
                    text(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n"))
                }
            }
        }
        Ok(Err(_)) => {
            bump(&c.link_stopping);
            unavailable("the node is stopping\n")
        }
        Err(_) => {
            bump(&c.link_timeout);
            unavailable(format!(
                "no answer from the node within {} s: its store may be slow; send again\n",
                limits.request_deadline.as_secs_f64()
            ))
        }
    }
}
