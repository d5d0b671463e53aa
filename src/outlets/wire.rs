//! The wire outlet: the link protocol's sealed packets carried in HTTP/1.1 POSTs to another node's `--http-port`
//! (docs/protocol.md, links over HTTP), answered with the sealed stored acks; `https://` with TLS.
//!
//! The forwarded flow is the link outlet's ([`super::link::Forwarding`]): probe, resume after the far side's heard
//! sequence, FORWARD frames numbered by the app's positions. Only the transport differs: instead of a datagram at a
//! time, what the sender has to send is framed (2-byte length, packet) into one request body of up to
//! [`MAX_BODY`] bytes, and the answer's packets are fed back to the sender. HTTP/1.1 carries one request at a
//! time on a connection, and the far node answers after its turn is on disk, so a wire keeps [`LANES`] requests on
//! their way, each on a connection of its own, and the sender's window keeps enough records in each body. An HTTP failure costs a retry with a backoff; the sender's retransmission timer
//! resends what was lost, so nothing is lost and the far side's heard sequence keeps it from being stored twice.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::Outlet;
use super::http::Client;
use super::link::{Forwarding, RETRY_AFTER, RunEnd};
use crate::common::address::HttpUrl;
use crate::common::dns::Resolver;
use crate::proto::crypto::{Identity, PublicKeyBytes};
use crate::proto::wire;

/// Largest request body: the far node takes up to 1 MiB (docs/protocol.md 10).
pub const MAX_BODY: usize = 512 << 10;
/// The media type of link packets over HTTP.
pub const CONTENT_TYPE: &str = "application/x-pure-link";
/// Longest wait between retries after HTTP errors.
const BACKOFF_MAX: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireTarget {
    pub url: HttpUrl,
    pub node_key: PublicKeyBytes,
    pub far_app: String,
    pub ca_file: Option<std::path::PathBuf>,
}

/// Frames `packet` into a request or answer body.
pub fn put_framed(body: &mut Vec<u8>, packet: &[u8]) {
    body.extend_from_slice(&(packet.len() as u16).to_be_bytes());
    body.extend_from_slice(packet);
}

/// The packets of a framed body; `None` if the framing is broken.
pub fn framed_packets(body: &[u8]) -> Option<Vec<&[u8]>> {
    let mut out = Vec::new();
    let mut rest = body;
    while !rest.is_empty() {
        let len = u16::from_be_bytes([*rest.first()?, *rest.get(1)?]) as usize;
        let packet = rest.get(2..2 + len)?;
        if len == 0 {
            return None;
        }
        out.push(packet);
        rest = &rest[2 + len..];
    }
    Some(out)
}

/// Requests a wire keeps on their way at once, each on a connection of its own (HTTP/1.1 carries one at a time).
/// The far node answers a request after its turn is on disk, so with one request the far side's receive loop waits
/// for the next body while it syncs this one (research/010: most of a request's time): two overlap the two. They
/// are numbered so the far node hands them over in order (`Pure-Order`); answers may come back in either order,
/// and the sender's acks are cumulative, so that changes nothing.
const LANES: usize = 2;

/// Records a wire's forwarded flow may have unacknowledged (the link's window is a quarter of it).
const WIRE_WINDOW: u64 = 4 * crate::proto::sender::DEFAULT_WINDOW;

type Answer = Result<(u16, Bytes), super::http::HttpError>;
type InFlight = Pin<Box<dyn Future<Output = (Client, Answer)> + Send>>;

pub async fn run(outlet: Arc<Outlet>, target: WireTarget, identity: Identity, dns: Resolver) {
    let far = target.url.to_string();
    let mut clients: Vec<Client> = Vec::new();
    loop {
        // Connections lost with a run that ended mid-request are made again.
        while clients.len() < LANES {
            match Client::new(target.url.clone(), target.ca_file.as_deref(), dns.clone()) {
                Ok(c) => clients.push(c),
                // A CA file that cannot be read now: say so and look again later (it may be fixed without a
                // reload).
                Err(e) => {
                    outlet.error(e.kind(), e.to_string());
                    break;
                }
            }
        }
        if clients.is_empty() {
            tokio::time::sleep(RETRY_AFTER).await;
            continue;
        }
        let end = serve(&outlet, &target, &identity, &mut clients, &far).await;
        if let RunEnd::Later = end {
            tokio::time::sleep(RETRY_AFTER).await;
        }
    }
}

/// Posts `body` on `client` as request `seq` of `token` (`Pure-Order`, docs/protocol.md 10: the far node hands
/// a wire's requests to its receive loop in this order, whichever body it reads first), handing the client back
/// with the answer.
fn post(mut client: Client, body: Bytes, token: u64, seq: u64) -> InFlight {
    Box::pin(async move {
        let order = [(
            crate::http::order::HEADER.to_string(),
            format!("{token:x} {seq}"),
        )];
        let answer = client.post(CONTENT_TYPE, &order, body).await;
        (client, answer)
    })
}

/// Waits for the answer of lane `lane`, if it has a request on its way (else never).
async fn answer_of(lane: &mut Option<InFlight>) -> (Client, Answer) {
    match lane {
        Some(request) => request.await,
        None => std::future::pending().await,
    }
}

async fn serve(
    outlet: &Outlet,
    target: &WireTarget,
    identity: &Identity,
    clients: &mut Vec<Client>,
    far: &str,
) -> RunEnd {
    let Some(mut flow) = Forwarding::new(outlet, identity, target.node_key, &target.far_app, far)
    else {
        return RunEnd::Later;
    };
    // Enough records in flight for a full body on every lane (a body holds ~10k records of 40 bytes): TCP carries
    // them, so a larger window costs no loss, and the outlet's memory budget still bounds what it holds.
    flow.sender.set_window(WIRE_WINDOW);
    let mut out = Vec::with_capacity(wire::MAX_ACCEPTED_DATAGRAM);
    let mut body: Vec<u8> = Vec::with_capacity(MAX_BODY);
    let mut backoff = Duration::ZERO;
    // The last request failed before the far node could answer (connect, TLS, DNS, an HTTP error).
    let mut request_failed = false;
    let mut lanes: [Option<InFlight>; LANES] = std::array::from_fn(|_| None);
    // Requests of this run are numbered from 0 under a token of their own.
    let token = u64::from_le_bytes(crate::proto::crypto::random_array());
    let mut seq = 0u64;
    loop {
        if let Err(end) = flow.take_fed(outlet) {
            return end;
        }
        // Every free lane with a connection gets a request, while the sender has packets to send.
        for lane in lanes.iter_mut().filter(|l| l.is_none()) {
            let Some(client) = clients.pop() else { break };
            let now = Instant::now();
            body.clear();
            while body.len() + wire::MAX_ACCEPTED_DATAGRAM + 2 <= MAX_BODY
                && flow.sender.poll_transmit(now, &mut out)
            {
                put_framed(&mut body, &out);
            }
            if body.is_empty() {
                clients.push(client);
                break;
            }
            *lane = Some(post(client, Bytes::copy_from_slice(&body), token, seq));
            seq += 1;
        }
        let deadline = flow.sender.poll_timeout();
        let sleep = async {
            match deadline {
                Some(t) => tokio::time::sleep_until(tokio::time::Instant::from_std(t)).await,
                None => std::future::pending().await,
            }
        };
        let [first, second] = &mut lanes;
        let (lane, (client, answer)) = tokio::select! {
            _ = outlet.pushed() => continue,
            _ = sleep => {
                flow.sender.handle_timeout(Instant::now());
                if let Err(end) = flow.events(outlet) {
                    return end;
                }
                if !request_failed {
                    flow.check_silence(outlet);
                }
                continue;
            }
            done = answer_of(first) => (0, done),
            done = answer_of(second) => (1, done),
        };
        lanes[lane] = None;
        clients.push(client);
        match answer {
            Ok((200, answer)) => {
                backoff = Duration::ZERO;
                request_failed = false;
                let now = Instant::now();
                match framed_packets(&answer) {
                    Some(packets) => {
                        for p in packets {
                            flow.sender.handle_datagram(now, p);
                        }
                    }
                    None => outlet.error("http", format!("{far} answered with broken framing")),
                }
            }
            Ok((status, answer)) => {
                let text = String::from_utf8_lossy(&answer[..answer.len().min(200)]).to_string();
                outlet.error("http", format!("{far} answered {status}: {}", text.trim()));
                backoff = (backoff * 2).clamp(Duration::from_millis(250), BACKOFF_MAX);
                request_failed = true;
            }
            Err(e) => {
                outlet.error(e.kind(), format!("{far}: {e}"));
                backoff = (backoff * 2).clamp(Duration::from_millis(250), BACKOFF_MAX);
                request_failed = true;
            }
        }
        if !backoff.is_zero() {
            tokio::time::sleep(backoff).await;
        }
        flow.sender.handle_timeout(Instant::now());
        if let Err(end) = flow.events(outlet) {
            return end;
        }
        // HTTP answers 200 with no packets when the far node cannot open them: say what that likely means. Not
        // while requests fail (connect, TLS, DNS, an HTTP error): that is the cause, counted and told already.
        if !request_failed {
            flow.check_silence(outlet);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn framing_round_trips_and_refuses_broken_bodies() {
        let mut body = Vec::new();
        put_framed(&mut body, b"abc");
        put_framed(&mut body, &[7; 300]);
        let packets = framed_packets(&body).unwrap();
        assert_eq!(packets, vec![&b"abc"[..], &[7u8; 300][..]]);
        assert!(framed_packets(&body[..body.len() - 1]).is_none());
        assert!(framed_packets(&[0, 0]).is_none());
        assert_eq!(framed_packets(&[]).unwrap().len(), 0);
    }
}
