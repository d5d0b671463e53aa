//! What the HTTP server counts, and its part of the `/metrics` page (appended after the receive loop's families,
//! which [`crate::ops::metrics::render`] writes unchanged).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use super::Listener;
use super::bounds::Refused;

/// The connections of one listener.
#[derive(Debug, Default)]
pub struct ListenerCounters {
    /// Connections accepted and served.
    pub served: AtomicU64,
    /// Connections closed at once, by reason ([`Refused`], indexed by its value).
    refused: [AtomicU64; Refused::ALL.len()],
    /// Older connections asked to close to make room for a new one (the metrics listener only).
    pub evicted: AtomicU64,
}

impl ListenerCounters {
    pub fn refused(&self, why: Refused) -> &AtomicU64 {
        &self.refused[why as usize]
    }

    /// Connections refused at accept, for every reason (TLS handshakes refused had a connection first).
    pub fn refused_total(&self) -> u64 {
        Refused::ALL
            .iter()
            .filter(|r| r.at_accept())
            .map(|r| self.refused(*r).load(Ordering::Relaxed))
            .sum()
    }
}

/// Counters of the HTTP server, bumped on its thread and read by `/metrics` (or a test).
#[derive(Debug, Default)]
pub struct HttpCounters {
    /// `--http-port`'s connections.
    pub http: ListenerCounters,
    /// `--metrics-listen`'s connections.
    pub metrics: ListenerCounters,
    /// TLS handshakes begun: granted by the handshake budget.
    pub tls_handshakes: AtomicU64,
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
    pub fn listener(&self, which: Listener) -> &ListenerCounters {
        match which {
            Listener::Http => &self.http,
            Listener::Metrics => &self.metrics,
        }
    }

    /// Appends the HTTP families to a metrics page. `open` is the number of connections open now on each listener
    /// (`--http-port`'s, then `--metrics-listen`'s); `lost` the receive loop's count of node packets for link
    /// requests answered already ([`crate::common::figures::LiveStats::link_packets_unrouted`]); `tls_budget` the handshake
    /// budget in force.
    pub fn render_into(&self, out: &mut String, open: [usize; 2], lost: u64, tls_budget: u32) {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let listeners = [
            (Listener::Http, &self.http, open[0]),
            (Listener::Metrics, &self.metrics, open[1]),
        ];
        family(
            out,
            "pure_http_connections_open",
            "gauge",
            "HTTP connections open, by listener: http (--http-port), metrics (--metrics-listen).",
        );
        for (which, _, n) in listeners {
            let _ = writeln!(
                out,
                "pure_http_connections_open{{listener=\"{}\"}} {n}",
                which.label()
            );
        }
        family(
            out,
            "pure_http_connections_total",
            "counter",
            "HTTP connections by listener: served, or refused at once (pure_http_refused_total says why).",
        );
        for (which, c, _) in listeners {
            let l = which.label();
            let _ = writeln!(
                out,
                "pure_http_connections_total{{listener=\"{l}\",outcome=\"served\"}} {}",
                get(&c.served)
            );
            let _ = writeln!(
                out,
                "pure_http_connections_total{{listener=\"{l}\",outcome=\"refused\"}} {}",
                c.refused_total()
            );
        }
        family(
            out,
            "pure_http_refused_total",
            "counter",
            "HTTP connections refused at once, by listener and reason: per_source (the address, or an IPv6 /64, held \
             its most), per_prefix (its /24 or /56 did), reserved (the last of the total is kept for prefixes that \
             hold almost none), total (every connection of the listener was open); and TLS handshakes refused before \
             they began: tls_prefix (the /24 or /56 had its share of --tls-handshake-budget), tls_budget (the \
             budget had none left).",
        );
        for (which, c, _) in listeners {
            for why in Refused::ALL {
                let _ = writeln!(
                    out,
                    "pure_http_refused_total{{listener=\"{}\",reason=\"{}\"}} {}",
                    which.label(),
                    why.label(),
                    get(c.refused(why))
                );
            }
        }
        family(
            out,
            "pure_http_evicted_total",
            "counter",
            "Connections of the metrics listener asked to close (the oldest first) to make room for a new one past \
             a bound, so that one local program holding connections cannot lock out every scrape.",
        );
        for (which, c, _) in listeners {
            if which == Listener::Metrics {
                let _ = writeln!(
                    out,
                    "pure_http_evicted_total{{listener=\"{}\"}} {}",
                    which.label(),
                    get(&c.evicted)
                );
            }
        }
        family(
            out,
            "pure_http_tls_handshakes_total",
            "counter",
            "TLS handshakes begun (granted by --tls-handshake-budget); those that did not end in a connection are \
             pure_http_tls_failures_total.",
        );
        let _ = writeln!(
            out,
            "pure_http_tls_handshakes_total {}",
            get(&self.tls_handshakes)
        );
        family(
            out,
            "pure_http_tls_handshake_budget",
            "gauge",
            "New TLS connections per second --http-port takes, in total (--tls-handshake-budget).",
        );
        let _ = writeln!(out, "pure_http_tls_handshake_budget {tls_budget}");
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
        bump(c.http.refused(Refused::PerSource));
        bump(c.http.refused(Refused::Total));
        let mut page = String::new();
        bump(c.http.refused(Refused::TlsBudget));
        c.render_into(&mut page, [3, 1], 0, 200);
        assert!(page.contains("pure_http_connections_open{listener=\"http\"} 3\n"));
        assert!(page.contains("pure_http_connections_open{listener=\"metrics\"} 1\n"));
        assert!(
            page.contains("pure_http_connections_total{listener=\"http\",outcome=\"refused\"} 2\n")
        );
        assert!(
            page.contains("pure_http_refused_total{listener=\"http\",reason=\"per_source\"} 1\n")
        );
        // A refused handshake is not a connection refused at accept.
        assert!(
            page.contains("pure_http_refused_total{listener=\"http\",reason=\"tls_budget\"} 1\n")
        );
        assert!(page.contains("pure_http_tls_handshake_budget 200\n"));
        assert!(page.contains("pure_http_link_errors_total{reason=\"busy\"} 1\n"));
        for line in page.lines().filter(|l| !l.starts_with('#')) {
            let value = line.rsplit(' ').next().unwrap();
            assert!(value.parse::<f64>().is_ok(), "{line}");
        }
    }
}
