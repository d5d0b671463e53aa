//! An HTTP/1.1 client for one outlet on the sending loop: hyper's client connection over TCP, or TLS by rustls.
//!
//! One outlet keeps one keep-alive connection and has one request on it at a time: it waits for the answer (the
//! far node answers after its commit) before it sends the next. Outlets do not share connections, so every wire and
//! webhook has its request in flight at the same time as the others (the seed's loop wrote and read them one after
//! another and lost 2.3%). A request that makes no progress for [`REQUEST_DEADLINE`] is abandoned and its
//! connection dropped; the outlet retries with a backoff.
//!
//! TLS verifies the server against the system's roots or the CA file the apps file names; an untrusted, expired or
//! misnamed certificate fails the handshake and is reported as a `tls` error, never accepted.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use thiserror::Error;
use tokio::net::TcpStream;

use crate::common::address::HttpUrl;
use crate::common::dns::Resolver;

/// A request whose answer has not come within this is abandoned (issue 7: a 10 s deadline without progress).
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(10);
/// Largest answer body read.
const MAX_ANSWER: usize = 4 << 20;

#[derive(Debug, Error)]
pub enum HttpError {
    #[error("{0}")]
    Dns(#[from] crate::common::dns::DnsError),
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("TLS with {host}: {why}")]
    Tls { host: String, why: String },
    #[error("CA file {path}: {why}")]
    CaFile { path: PathBuf, why: String },
    /// A CA file that is not a regular file, too big, or unreadable (crate::files).
    #[error(transparent)]
    CaRead(#[from] crate::files::FileError),
    #[error("HTTP: {0}")]
    Http(String),
    #[error("no answer within {} s", REQUEST_DEADLINE.as_secs())]
    Timeout,
    #[error("answer larger than {} bytes", MAX_ANSWER)]
    TooLarge,
}

impl HttpError {
    /// The error kind an outlet counts it under (`pure_outlet_errors_total{kind}`).
    pub fn kind(&self) -> &'static str {
        match self {
            HttpError::Dns(_) => "dns",
            HttpError::Connect { .. } => "connect",
            HttpError::Tls { .. } | HttpError::CaFile { .. } | HttpError::CaRead(_) => "tls",
            HttpError::Http(_) | HttpError::TooLarge => "http",
            HttpError::Timeout => "timeout",
        }
    }
}

/// The client of one outlet: where to, how to trust it, and the connection when there is one.
pub struct Client {
    url: HttpUrl,
    tls: Option<tokio_rustls::TlsConnector>,
    resolver: Resolver,
    connection: Option<SendRequest<Full<Bytes>>>,
}

/// What to do about a failed TLS handshake, for the errors an operator meets: a far side whose certificate this
/// node cannot trust (its own CA, not given), has expired, or names another host.
fn tls_hint(e: &std::io::Error) -> &'static str {
    use rustls::CertificateError;
    let Some(rustls::Error::InvalidCertificate(cert)) = e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    else {
        return "";
    };
    match cert {
        CertificateError::UnknownIssuer => {
            " (its certificate is not signed by a CA this node trusts: give the outlet `ca_file` with that CA's \
             PEM file in the apps file, or add the CA to the system's certificates)"
        }
        CertificateError::BadSignature => {
            " (its certificate does not verify with the CAs this node trusts: is the outlet's `ca_file` the CA that \
             signed it?)"
        }
        CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
            " (its certificate has expired: renew it on the far side; check this host's clock too)"
        }
        CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
            " (its certificate is for another name: the outlet's URL must use a host name the certificate lists)"
        }
        _ => "",
    }
}

/// Builds the TLS client configuration: the CA file's certificates, or the system's roots.
pub fn tls_config(ca_file: Option<&Path>) -> Result<rustls::ClientConfig, HttpError> {
    let mut roots = rustls::RootCertStore::empty();
    match ca_file {
        Some(path) => {
            use rustls::pki_types::pem::PemObject;
            let bad = |why: String| HttpError::CaFile {
                path: path.to_path_buf(),
                why,
            };
            let pem = crate::files::read(path, &crate::files::CA_FILE)?;
            for cert in rustls::pki_types::CertificateDer::pem_slice_iter(&pem) {
                roots
                    .add(cert.map_err(|e| bad(e.to_string()))?)
                    .map_err(|e| bad(e.to_string()))?;
            }
            if roots.is_empty() {
                return Err(bad("holds no certificate (expected PEM)".into()));
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            for cert in found.certs {
                // A system store may hold certificates rustls cannot use; the rest still count.
                let _ = roots.add(cert);
            }
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| HttpError::Tls {
            host: String::new(),
            why: e.to_string(),
        })?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

impl Client {
    pub fn new(
        url: HttpUrl,
        ca_file: Option<&Path>,
        resolver: Resolver,
    ) -> Result<Self, HttpError> {
        let tls = if url.tls {
            Some(tokio_rustls::TlsConnector::from(Arc::new(tls_config(
                ca_file,
            )?)))
        } else {
            None
        };
        Ok(Client {
            url,
            tls,
            resolver,
            connection: None,
        })
    }

    pub fn url(&self) -> &HttpUrl {
        &self.url
    }

    async fn connect(&mut self) -> Result<SendRequest<Full<Bytes>>, HttpError> {
        let addr = self.resolver.resolve(&self.url.authority()).await?;
        let stream = TcpStream::connect(addr)
            .await
            .map_err(|source| HttpError::Connect { addr, source })?;
        let _ = stream.set_nodelay(true);
        let http = |e: hyper::Error| HttpError::Http(e.to_string());
        match &self.tls {
            None => {
                let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                    .await
                    .map_err(http)?;
                tokio::spawn(async move {
                    let _ = conn.await;
                });
                Ok(send)
            }
            Some(tls) => {
                let name = rustls::pki_types::ServerName::try_from(self.url.host.clone()).map_err(
                    |e| HttpError::Tls {
                        host: self.url.host.clone(),
                        why: e.to_string(),
                    },
                )?;
                let stream = tls
                    .connect(name, stream)
                    .await
                    .map_err(|e| HttpError::Tls {
                        host: self.url.host.clone(),
                        why: format!("{e}{}", tls_hint(&e)),
                    })?;
                let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                    .await
                    .map_err(http)?;
                tokio::spawn(async move {
                    let _ = conn.await;
                });
                Ok(send)
            }
        }
    }

    /// POSTs `body` to the URL's path and returns the status and the whole answer body. The connection is kept for
    /// the next request, and dropped on any error (the next request makes a new one).
    pub async fn post(
        &mut self,
        content_type: &str,
        headers: &[(String, String)],
        body: Bytes,
    ) -> Result<(u16, Bytes), HttpError> {
        let result = tokio::time::timeout(
            REQUEST_DEADLINE,
            self.post_inner(content_type, headers, body),
        )
        .await;
        let result = match result {
            Ok(r) => r,
            Err(_) => Err(HttpError::Timeout),
        };
        if result.is_err() {
            self.connection = None;
        }
        result
    }

    async fn post_inner(
        &mut self,
        content_type: &str,
        headers: &[(String, String)],
        body: Bytes,
    ) -> Result<(u16, Bytes), HttpError> {
        let mut send = match self.connection.take() {
            Some(c) if !c.is_closed() => c,
            _ => self.connect().await?,
        };
        send.ready()
            .await
            .map_err(|e| HttpError::Http(e.to_string()))?;
        let mut request = hyper::Request::post(self.url.path_and_query.as_str())
            .header(hyper::header::HOST, self.url.authority())
            .header(hyper::header::CONTENT_TYPE, content_type)
            .header(hyper::header::CONTENT_LENGTH, body.len());
        for (k, v) in headers {
            request = request.header(k.as_str(), v.as_str());
        }
        let request = request
            .body(Full::new(body))
            .map_err(|e| HttpError::Http(e.to_string()))?;
        let answer = send
            .send_request(request)
            .await
            .map_err(|e| HttpError::Http(e.to_string()))?;
        let status = answer.status().as_u16();
        let limited = http_body_util::Limited::new(answer.into_body(), MAX_ANSWER);
        let bytes = limited
            .collect()
            .await
            .map_err(|e| {
                if e.downcast_ref::<http_body_util::LengthLimitError>()
                    .is_some()
                {
                    HttpError::TooLarge
                } else {
                    HttpError::Http(e.to_string())
                }
            })?
            .to_bytes();
        self.connection = Some(send);
        Ok((status, bytes))
    }
}
