//! TLS for `--http-port`: the certificate chain and key from PEM files (`--tls-cert`, `--tls-key`), served by rustls
//! with the `ring` provider. Not aws-lc (rustls's default): a far larger C build, on the Pi or for it, for nothing
//! the node needs; ring is in the tree already for the benches' QUIC.
//!
//! The same port keeps answering plain HTTP: a TLS connection starts with a handshake record, whose first byte is
//! 0x16 (RFC 8446 5.1, content type `handshake`), and no HTTP request starts with that byte, so the server peeks
//! at one byte to choose ([`starts_tls`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::HttpError;
use crate::files;

/// The TLS record content type of a handshake: the first byte of every TLS connection.
pub const HANDSHAKE: u8 = 0x16;

/// Whether a connection whose first byte is `first` speaks TLS.
pub fn starts_tls(first: u8) -> bool {
    first == HANDSHAKE
}

/// A server configuration made from the operator's files.
#[derive(Clone)]
pub struct TlsConfig {
    pub(super) config: Arc<rustls::ServerConfig>,
    /// The certificate file, for the banner and logs.
    pub cert_file: PathBuf,
}

impl std::fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsConfig")
            .field("cert_file", &self.cert_file)
            .finish_non_exhaustive()
    }
}

impl TlsConfig {
    /// Loads a PEM certificate chain (the server's certificate first, then any intermediates) and its PEM private
    /// key (PKCS#8, PKCS#1 or SEC1). Every error names the file and what to give instead.
    pub fn load(cert_file: &Path, key_file: &Path) -> Result<Self, HttpError> {
        let cert_pem = files::read(cert_file, &files::TLS_CERT)?;
        let certs = CertificateDer::pem_slice_iter(&cert_pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| HttpError::TlsCert {
                path: cert_file.to_path_buf(),
                why: format!("it is not valid PEM ({e})"),
            })?;
        if certs.is_empty() {
            return Err(HttpError::TlsCert {
                path: cert_file.to_path_buf(),
                why: "it holds no `-----BEGIN CERTIFICATE-----` block".into(),
            });
        }
        let key_pem = files::read(key_file, &files::TLS_KEY)?;
        let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| HttpError::TlsKey {
            path: key_file.to_path_buf(),
            why: match e {
                rustls::pki_types::pem::Error::NoItemsFound => {
                    "it holds no `-----BEGIN PRIVATE KEY-----` (or RSA / EC PRIVATE KEY) block"
                        .into()
                }
                e => format!("it is not valid PEM ({e})"),
            },
        })?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| HttpError::TlsSetup(e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .map_err(|e| HttpError::TlsPair {
                cert: cert_file.to_path_buf(),
                key: key_file.to_path_buf(),
                why: e.to_string(),
            })?;
        // HTTP/1.1 only; a client offering h2 alone fails the handshake instead of speaking h2 to an h1 server.
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(TlsConfig {
            config: Arc::new(config),
            cert_file: cert_file.to_path_buf(),
        })
    }
}
