//! Where an outlet sends: an `http(s)://` URL ([`HttpUrl`]) or a `HOST:PORT` ([`parse_host_port`]), checked when
//! the apps file is read (src/apps/config.rs) and used by the outlets that connect (src/outlets/). It lives below
//! both so that neither imports from the other.

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};

/// An `http://` or `https://` URL, split into what an HTTP/1.1 client needs.
///
/// Parsed by hand rather than with the `url` crate: that crate implements the WHATWG URL standard for browsers
/// (IDNA mapping, relative references, dozens of special cases), which both accepts URLs no HTTP client here would
/// want and gives no reason we could show an operator when it refuses one. We need four parts and a clear message
/// for each mistake (user info, a fragment, a bad port, an IPv6 address without brackets).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpUrl {
    /// `https`: TLS, verified against the system's roots or the outlet's `ca_file`.
    pub tls: bool,
    /// A DNS name or an IP address, without the brackets of an IPv6 literal. Also the TLS server name.
    pub host: String,
    /// Given, or 80 / 443.
    pub port: u16,
    /// Starts with `/`; the query, if any, included. Never a fragment.
    pub path_and_query: String,
}

impl HttpUrl {
    /// Parses `http(s)://HOST[:PORT][/PATH][?QUERY]`; `default_path` is used when there is no path. The error says
    /// what is wrong, in a phrase that follows "the url …".
    pub fn parse(text: &str, default_path: &str) -> Result<HttpUrl, String> {
        let Some((scheme, rest)) = text.split_once("://") else {
            return Err("has no http:// or https:// in front".into());
        };
        let (tls, default_port) = match scheme.to_ascii_lowercase().as_str() {
            "http" => (false, 80),
            "https" => (true, 443),
            other => {
                return Err(format!(
                    "has scheme {other:?}; only http and https are sent to"
                ));
            }
        };
        if rest.contains('#') {
            return Err("has a fragment (#…), which is never sent to a server".into());
        }
        let end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, path) = rest.split_at(end);
        if authority.contains('@') {
            return Err(
                "has user info (USER@ or USER:PASSWORD@); give credentials as a header instead"
                    .into(),
            );
        }
        let (host, port) = parse_host_port(authority, Some(default_port))?;
        if let Some(bad) = path.chars().find(|c| !c.is_ascii_graphic()) {
            return Err(format!(
                "has {bad:?} in its path; percent-encode it (a space is %20)"
            ));
        }
        let path_and_query = match path {
            "" => default_path.to_string(),
            p if p.starts_with('?') => format!("/{p}"),
            p => p.to_string(),
        };
        Ok(HttpUrl {
            tls,
            host,
            port,
            path_and_query,
        })
    }

    /// `HOST:PORT`, with brackets around an IPv6 address: what a Host header or a connect needs.
    pub fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

impl fmt::Display for HttpUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = if self.tls { "https" } else { "http" };
        write!(f, "{scheme}://{}{}", self.authority(), self.path_and_query)
    }
}

/// Splits `HOST:PORT` (or `[IPV6]:PORT`); with `default_port` the port may be left out. The host is checked to be
/// an IP address or a well-formed DNS name; whether the name resolves is the sending loop's business.
pub fn parse_host_port(text: &str, default_port: Option<u16>) -> Result<(String, u16), String> {
    let (host, port) = if let Some(inner) = text.strip_prefix('[') {
        let Some((addr, after)) = inner.split_once(']') else {
            return Err(format!("{text:?} opens [ without closing it"));
        };
        if addr.parse::<Ipv6Addr>().is_err() {
            return Err(format!("{addr:?} in brackets is not an IPv6 address"));
        }
        let port = match after {
            "" => None,
            p => match p.strip_prefix(':') {
                Some(p) => Some(p),
                None => return Err(format!("{text:?} has {p:?} after ], expected :PORT")),
            },
        };
        (addr, port)
    } else {
        match text.matches(':').count() {
            0 => (text, None),
            1 => {
                let (h, p) = text.split_once(':').unwrap_or((text, ""));
                (h, Some(p))
            }
            _ => {
                return Err(format!(
                    "{text:?} has several colons; write an IPv6 address in brackets, as [2001:db8::1]:7380"
                ));
            }
        }
    };
    if host.is_empty() {
        return Err(format!("{text:?} has no host"));
    }
    if !host.contains(':') {
        check_host_name(host)?;
    }
    let port = match (port, default_port) {
        (Some(p), _) => match p.parse::<u16>() {
            Ok(0) => return Err("has port 0; give the port the far side listens on".into()),
            Ok(n) => n,
            Err(_) => {
                return Err(format!(
                    "has port {p:?}, which is not a number from 1 to 65535"
                ));
            }
        },
        (None, Some(d)) => d,
        (None, None) => return Err(format!("{text:?} has no port")),
    };
    Ok((host.to_string(), port))
}

/// An IPv4 address or a DNS name: labels of 1–63 letters, digits, `-` (not at either end) or `_`, 253 at most.
fn check_host_name(host: &str) -> Result<(), String> {
    if host.parse::<Ipv4Addr>().is_ok() {
        return Ok(());
    }
    let name = host.strip_suffix('.').unwrap_or(host);
    let labels: Vec<&str> = name.split('.').collect();
    let label_ok = |l: &&str| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    if name.len() > 253 || !labels.iter().all(label_ok) {
        return Err(format!(
            "host {host:?} is neither an IP address nor a DNS name (letters, digits and - between dots)"
        ));
    }
    if labels.iter().all(|l| l.bytes().all(|b| b.is_ascii_digit())) {
        return Err(format!("host {host:?} is not a valid IPv4 address"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_http_or_https() {
        let u = HttpUrl::parse("HTTPS://Hooks.example.com?x=1", "/").unwrap();
        assert_eq!(
            (u.tls, u.host.as_str(), u.port, u.path_and_query.as_str()),
            (true, "Hooks.example.com", 443, "/?x=1")
        );
        let u = HttpUrl::parse("http://10.0.0.1:8080/a/b?c=d", "/").unwrap();
        assert_eq!(u.to_string(), "http://10.0.0.1:8080/a/b?c=d");
        for (bad, says) in [
            ("ftp://h/x", "scheme \"ftp\""),
            ("hooks.example.com/x", "no http:// or https://"),
            ("https://u:p@h/x", "user info"),
            ("https://h/x#frag", "fragment"),
            ("https://h/a b", "percent-encode"),
            ("https://h:0/", "port 0"),
            ("https:///x", "no host"),
        ] {
            let e = HttpUrl::parse(bad, "/").unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
