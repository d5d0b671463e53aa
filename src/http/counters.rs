//! What the HTTP server counts, and its part of the `/metrics` page (appended after the receive loop's families,
//! which [`crate::ops::metrics::render`] writes unchanged).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

/// Counters of the HTTP server, bumped on its thread and read by `/metrics` (or a test).
#[derive(Debug, Default)]
pub struct HttpCounters {
    /// Connections accepted and served.
    pub connections: AtomicU64,
    /// Connections closed at once because [`super::HttpLimits::max_connections`] were open.
    pub refused: AtomicU64,
    /// TLS handshakes that failed or took longer than the head timeout.
    pub tls_failed: AtomicU64,
    /// `POST /link` requests whose body was framed packets (answered 200, or 503 below).
    pub link_requests: AtomicU64,
    /// Packets of those requests handed to the receive loop.
    pub link_packets: AtomicU64,
    /// Node packets sent back in answers.
    pub link_answers: AtomicU64,
    /// 503: the queue to the receive loop was full.
    pub link_busy: AtomicU64,
    /// 503: the receive loop was gone or dropped the request (the node is stopping).
    pub link_stopping: AtomicU64,
    /// 503: no answer from the receive loop within the request deadline.
    pub link_timeout: AtomicU64,
    /// 400: the body was not framed packets, or could not be read.
    pub link_bad_request: AtomicU64,
    /// 408: the body did not arrive within the request deadline.
    pub link_slow_body: AtomicU64,
    /// 413: the body was larger than allowed.
    pub link_too_large: AtomicU64,
}

pub(super) fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

impl HttpCounters {
    /// Appends the HTTP families to a metrics page. `open` is the number of connections open now; `lost` the
    /// receive loop's count of node packets for link requests answered already
    /// ([`crate::receive::LiveStats::link_packets_unrouted`]).
    pub fn render_into(&self, out: &mut String, open: usize, lost: u64) {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        family(
            out,
            "pure_http_connections_open",
            "gauge",
            "HTTP connections open on --http-port.",
        );
        let _ = writeln!(out, "pure_http_connections_open {open}");
        family(
            out,
            "pure_http_connections_total",
            "counter",
            "HTTP connections: served, or refused at once because the most allowed were open.",
        );
        let _ = writeln!(
            out,
            "pure_http_connections_total{{outcome=\"served\"}} {}",
            get(&self.connections)
        );
        let _ = writeln!(
            out,
            "pure_http_connections_total{{outcome=\"refused\"}} {}",
            get(&self.refused)
        );
        family(
            out,
            "pure_http_tls_failures_total",
            "counter",
            "TLS handshakes that failed or timed out.",
        );
        let _ = writeln!(
            out,
            "pure_http_tls_failures_total {}",
            get(&self.tls_failed)
        );
        family(
            out,
            "pure_http_link_requests_total",
            "counter",
            "POST /link requests with a well-framed body, handed to the receive loop.",
        );
        let _ = writeln!(
            out,
            "pure_http_link_requests_total {}",
            get(&self.link_requests)
        );
        family(
            out,
            "pure_http_link_packets_total",
            "counter",
            "Packets of POST /link, by direction: in (sender packets handed over), out (node packets answered).",
        );
        let _ = writeln!(
            out,
            "pure_http_link_packets_total{{direction=\"in\"}} {}",
            get(&self.link_packets)
        );
        let _ = writeln!(
            out,
            "pure_http_link_packets_total{{direction=\"out\"}} {}",
            get(&self.link_answers)
        );
        family(
            out,
            "pure_http_link_packets_lost_total",
            "counter",
            "Node packets for a POST /link that was answered already (lost, as to a peer that moved on; the sender sends again).",
        );
        let _ = writeln!(out, "pure_http_link_packets_lost_total {lost}");
        family(
            out,
            "pure_http_link_errors_total",
            "counter",
            "POST /link answered with an error, by reason: busy, stopping, timeout (503); bad_request (400); slow_body (408); too_large (413).",
        );
        for (reason, c) in [
            ("busy", &self.link_busy),
            ("stopping", &self.link_stopping),
            ("timeout", &self.link_timeout),
            ("bad_request", &self.link_bad_request),
            ("slow_body", &self.link_slow_body),
            ("too_large", &self.link_too_large),
        ] {
            let _ = writeln!(
                out,
                "pure_http_link_errors_total{{reason=\"{reason}\"}} {}",
                get(c)
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_sample_is_numeric() {
        let c = HttpCounters::default();
        bump(&c.link_busy);
        let mut page = String::new();
        c.render_into(&mut page, 3, 0);
        assert!(page.contains("pure_http_connections_open 3\n"));
        assert!(page.contains("pure_http_link_errors_total{reason=\"busy\"} 1\n"));
        for line in page.lines().filter(|l| !l.starts_with('#')) {
            let value = line.rsplit(' ').next().unwrap();
            assert!(value.parse::<f64>().is_ok(), "{line}");
        }
    }
}
