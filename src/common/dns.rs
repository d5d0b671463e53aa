//! Name lookups for outlets, asynchronous on the sending loop (hickory-resolver).
//!
//! The seed's loop called `getaddrinfo` in place, so one slow name stopped every output (BRIEF.md, lessons). Here a
//! lookup is a future on the loop like any other: an outlet waiting for its name waits alone, and a name server
//! that never answers costs its outlet a timeout, not the others their turn. `localhost` and `/etc/hosts` names are
//! answered from the hosts file, IP literals without a lookup at all.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use hickory_resolver::TokioResolver;
use hickory_resolver::config::{
    ConnectionConfig, NameServerConfig, ProtocolConfig, ResolveHosts, ResolverConfig, ResolverOpts,
};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use thiserror::Error;

/// How long one lookup may take before its outlet counts a DNS failure and retries later.
pub const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum DnsError {
    #[error("{0:?} is not HOST:PORT (e.g. node.example.net:7380 or 192.0.2.1:7380)")]
    NotHostPort(String),
    #[error("name {name} did not resolve: {why}")]
    NoAnswer { name: String, why: String },
    #[error("name {name} did not resolve within {} s (is the name server reachable?)", LOOKUP_TIMEOUT.as_secs())]
    Timeout { name: String },
}

/// Which name servers to ask.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DnsSettings {
    /// `None`: the system's (`/etc/resolv.conf`). `Some`: only this server (`--dns`), e.g. a local resolver.
    pub server: Option<SocketAddr>,
}

/// A resolver on the sending loop; cheap to clone (one cache shared by every outlet).
#[derive(Clone)]
pub struct Resolver {
    inner: Option<TokioResolver>,
    /// Why there is no resolver (the system configuration could not be read): every name lookup says so.
    broken: Option<String>,
}

impl Resolver {
    /// Must be called on the sending loop's runtime (the resolver's background work runs there).
    pub fn new(settings: &DnsSettings) -> Self {
        let built = match settings.server {
            Some(server) => {
                let mut connection = ConnectionConfig::new(ProtocolConfig::Udp);
                connection.port = server.port();
                let config = ResolverConfig::from_name_servers(vec![NameServerConfig::new(
                    server.ip(),
                    true,
                    vec![connection],
                )]);
                let mut builder =
                    TokioResolver::builder_with_config(config, TokioRuntimeProvider::default());
                *builder.options_mut() = options();
                builder.build()
            }
            None => TokioResolver::builder_tokio().and_then(|mut builder| {
                let system = builder.options_mut();
                system.timeout = LOOKUP_TIMEOUT;
                system.use_hosts_file = ResolveHosts::Always;
                builder.build()
            }),
        };
        match built {
            Ok(r) => Resolver {
                inner: Some(r),
                broken: None,
            },
            Err(e) => {
                tracing::warn!("no DNS resolver ({e}); outlets given by name will not connect");
                Resolver {
                    inner: None,
                    broken: Some(e.to_string()),
                }
            }
        }
    }

    /// Resolves `HOST:PORT` (or `[V6]:PORT`) to one address, IPv4 first.
    pub async fn resolve(&self, host_port: &str) -> Result<SocketAddr, DnsError> {
        if let Ok(addr) = host_port.parse::<SocketAddr>() {
            return Ok(addr);
        }
        let (host, port) = split_host_port(host_port)?;
        if let Ok(ip) = host.parse::<IpAddr>() {
            return Ok(SocketAddr::new(ip, port));
        }
        let Some(resolver) = &self.inner else {
            return Err(DnsError::NoAnswer {
                name: host.to_string(),
                why: self.broken.clone().unwrap_or_default(),
            });
        };
        let lookup = tokio::time::timeout(LOOKUP_TIMEOUT, resolver.lookup_ip(host)).await;
        match lookup {
            Err(_) => Err(DnsError::Timeout {
                name: host.to_string(),
            }),
            Ok(Err(e)) => Err(DnsError::NoAnswer {
                name: host.to_string(),
                why: lookup_failure(&e),
            }),
            Ok(Ok(ips)) => {
                let all: Vec<IpAddr> = ips.iter().collect();
                all.iter()
                    .find(|ip| ip.is_ipv4())
                    .or(all.first())
                    .map(|ip| SocketAddr::new(*ip, port))
                    .ok_or_else(|| DnsError::NoAnswer {
                        name: host.to_string(),
                        why: "no address in the answer".into(),
                    })
            }
        }
    }
}

/// A failed lookup in words: hickory's own text for an empty answer is a debug dump of one of the two queries
/// (naming only AAAA, say), when both the IPv4 and the IPv6 address were asked for.
fn lookup_failure(e: &hickory_resolver::net::NetError) -> String {
    if e.is_nx_domain() {
        "no such name (the name server answered NXDOMAIN): check the host in the outlet's `to` or `url`".into()
    } else if e.is_no_records_found() {
        "the name has no address (no A or AAAA record): check the host in the outlet's `to` or `url`".into()
    } else {
        e.to_string()
    }
}

fn options() -> ResolverOpts {
    let mut o = ResolverOpts::default();
    o.timeout = LOOKUP_TIMEOUT;
    o.attempts = 1;
    o.use_hosts_file = ResolveHosts::Always;
    o
}

/// Splits `host:port` or `[v6]:port`.
pub fn split_host_port(s: &str) -> Result<(&str, u16), DnsError> {
    let bad = || DnsError::NotHostPort(s.to_string());
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (host, rest) = rest.split_once(']').ok_or_else(bad)?;
        (host, rest.strip_prefix(':').ok_or_else(bad)?)
    } else {
        s.rsplit_once(':').ok_or_else(bad)?
    };
    let port: u16 = port.parse().map_err(|_| bad())?;
    if host.is_empty() || port == 0 {
        return Err(bad());
    }
    Ok((host, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_port_forms() {
        assert_eq!(split_host_port("a.example:7380"), Ok(("a.example", 7380)));
        assert_eq!(split_host_port("[::1]:9"), Ok(("::1", 9)));
        assert!(split_host_port("a.example").is_err());
        assert!(split_host_port("a.example:0").is_err());
        assert!(split_host_port(":80").is_err());
    }
}
