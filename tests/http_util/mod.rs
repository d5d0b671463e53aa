//! Helpers for the tests of the HTTP server (tests/http_*.rs): a blocking HTTP/1.1 client that keeps its
//! connection (plain or TLS), a test CA made at test time, and a sans-IO sender driven over `POST /link`.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pure_serve::http::Framed;
use pure_serve::proto::sender::{Sender, SenderEvent};
use rustls::pki_types::{CertificateDer, ServerName};

/// One answer.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).to_string()
    }

    /// The body as framed link packets.
    pub fn packets(&self) -> Vec<Vec<u8>> {
        Framed::parse(self.body.clone())
            .expect("answer is framed")
            .iter()
            .map(<[u8]>::to_vec)
            .collect()
    }
}

/// A kept-alive HTTP/1.1 connection.
pub struct Client<S: Read + Write> {
    io: BufReader<S>,
}

pub type TlsStream = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

/// A TCP connection to `addr` from the address `from` (any port): the whole of 127/8 is loopback on Linux, so a
/// test can be many sources and prefixes at once (127.0.0.1 and 127.0.0.2 are one /24; 127.0.1.1 is another).
pub fn connect_from(from: IpAddr, addr: SocketAddr) -> std::io::Result<TcpStream> {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    socket.bind(&SocketAddr::new(from, 0).into())?;
    socket.connect(&addr.into())?;
    let s: TcpStream = socket.into();
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    Ok(s)
}

impl Client<TcpStream> {
    pub fn connect(addr: SocketAddr) -> Self {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        Client {
            io: BufReader::new(s),
        }
    }

    /// [`Client::connect`] from the address `from` ([`connect_from`]).
    pub fn connect_from(from: IpAddr, addr: SocketAddr) -> Self {
        Client {
            io: BufReader::new(connect_from(from, addr).unwrap()),
        }
    }
}

impl Client<TlsStream> {
    /// TLS to `addr`, trusting only `ca_der`, asking for the name `localhost`.
    pub fn connect_tls(addr: SocketAddr, ca_der: &[u8]) -> std::io::Result<Self> {
        let tcp = TcpStream::connect(addr)?;
        tcp.set_read_timeout(Some(Duration::from_secs(30)))?;
        Self::tls_over(tcp, ca_der)
    }

    /// [`Client::connect_tls`] from the address `from` ([`connect_from`]).
    pub fn connect_tls_from(
        from: IpAddr,
        addr: SocketAddr,
        ca_der: &[u8],
    ) -> std::io::Result<Self> {
        Self::tls_over(connect_from(from, addr)?, ca_der)
    }

    fn tls_over(tcp: TcpStream, ca_der: &[u8]) -> std::io::Result<Self> {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from(ca_der.to_vec()))
            .expect("CA certificate");
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        let conn = rustls::ClientConnection::new(
            Arc::new(config),
            ServerName::try_from("localhost").unwrap(),
        )
        .unwrap();
        let mut stream = rustls::StreamOwned::new(conn, tcp);
        // Drive the handshake now, so a refused certificate shows here.
        while stream.conn.is_handshaking() {
            stream.conn.complete_io(&mut stream.sock)?;
        }
        Ok(Client {
            io: BufReader::new(stream),
        })
    }
}

impl<S: Read + Write> Client<S> {
    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> std::io::Result<Reply> {
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: test\r\nContent-Length: {}\r\n",
            body.len()
        );
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        let mut whole = head.into_bytes();
        whole.extend_from_slice(body);
        let w = self.io.get_mut();
        w.write_all(&whole)?;
        w.flush()?;
        self.read_reply(method == "HEAD")
    }

    pub fn get(&mut self, path: &str) -> Reply {
        self.request("GET", path, &[], &[]).unwrap()
    }

    /// `POST /link` of `packets`, framed.
    pub fn post_link(&mut self, packets: &[Vec<u8>]) -> Reply {
        let body = Framed::from_packets(packets).unwrap().into_bytes();
        self.request(
            "POST",
            "/link",
            &[("Content-Type", "application/x-pure-link")],
            &body,
        )
        .unwrap()
    }

    /// Reads one answer (by Content-Length; the server always sends one).
    pub fn read_reply(&mut self, head_only: bool) -> std::io::Result<Reply> {
        let mut line = String::new();
        if self.io.read_line(&mut line)? == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "connection closed before an answer",
            ));
        }
        let status = line
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or_else(|| panic!("bad status line {line:?}"));
        let mut headers = Vec::new();
        loop {
            line.clear();
            self.io.read_line(&mut line)?;
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            let (k, v) = l.split_once(':').expect("header line");
            headers.push((k.trim().to_string(), v.trim().to_string()));
        }
        let mut reply = Reply {
            status,
            headers,
            body: Vec::new(),
        };
        if !head_only {
            let len: usize = reply
                .header("content-length")
                .expect("content-length")
                .parse()
                .unwrap();
            reply.body = vec![0; len];
            self.io.read_exact(&mut reply.body)?;
        }
        Ok(reply)
    }

    /// Writes raw bytes (a partial or broken request).
    pub fn write_raw(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        let w = self.io.get_mut();
        w.write_all(bytes)?;
        w.flush()
    }

    /// Whether the server closed the connection (reads EOF or a reset) within `within`.
    pub fn closed_within(&mut self, within: Duration) -> bool
    where
        S: AsTcp,
    {
        self.io
            .get_ref()
            .tcp()
            .set_read_timeout(Some(within))
            .unwrap();
        let mut rest = Vec::new();
        match self.io.read_to_end(&mut rest) {
            Ok(_) => true,
            Err(e) => !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
        }
    }
}

pub trait AsTcp {
    fn tcp(&self) -> &TcpStream;
}
impl AsTcp for TcpStream {
    fn tcp(&self) -> &TcpStream {
        self
    }
}
impl AsTcp for TlsStream {
    fn tcp(&self) -> &TcpStream {
        &self.sock
    }
}

/// A test CA and a server certificate for `localhost` signed by it, written as PEM into `dir` (`ca.pem`,
/// `server.pem`, `server.key`: give each CA a directory of its own).
pub struct TestCa {
    pub ca_der: Vec<u8>,
    /// The CA's certificate as PEM, for an apps file's `ca_file`.
    pub ca_file: PathBuf,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

pub fn test_ca(dir: &Path) -> TestCa {
    test_ca_with(dir, false)
}

/// As [`test_ca`]; with `expired`, the server certificate was valid only in the year 2000.
pub fn test_ca_with(dir: &Path, expired: bool) -> TestCa {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
        KeyPair, KeyUsagePurpose,
    };
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "pure-serve test CA");
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::CrlSign,
    ];
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    params
        .distinguished_name
        .push(DnType::CommonName, "localhost");
    params.use_authority_key_identifier_extension = true;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    if expired {
        params.not_before = rcgen::date_time_ymd(2000, 1, 1);
        params.not_after = rcgen::date_time_ymd(2001, 1, 1);
    }
    let cert = params.signed_by(&key, &issuer).unwrap();
    let cert_file = dir.join("server.pem");
    let key_file = dir.join("server.key");
    let ca_file = dir.join("ca.pem");
    std::fs::write(&cert_file, cert.pem()).unwrap();
    std::fs::write(&key_file, key.serialize_pem()).unwrap();
    std::fs::write(&ca_file, ca_cert.pem()).unwrap();
    TestCa {
        ca_der: ca_cert.der().to_vec(),
        ca_file,
        cert_file,
        key_file,
    }
}

/// What a sender's delivery over HTTP did.
#[derive(Debug, Default)]
pub struct Delivery {
    /// Every request's packets, in order.
    pub requests: Vec<Vec<Vec<u8>>>,
    /// Every node packet answered.
    pub answers: usize,
    pub events: Vec<SenderEvent>,
}

/// Drives `sender` until it is idle: its datagrams go out through `post` (one request per batch) and the answers
/// come back into it. Panics after `limit`.
pub fn deliver(
    sender: &mut Sender,
    limit: Duration,
    mut post: impl FnMut(&[Vec<u8>]) -> Vec<Vec<u8>>,
) -> Delivery {
    let deadline = Instant::now() + limit;
    let mut d = Delivery::default();
    let mut buf = Vec::new();
    while !sender.is_idle() {
        assert!(
            Instant::now() < deadline,
            "not delivered within {limit:?}: {d:?}"
        );
        let now = Instant::now();
        if sender.poll_timeout().is_some_and(|t| now >= t) {
            sender.handle_timeout(now);
        }
        let mut packets = Vec::new();
        while sender.poll_transmit(now, &mut buf) {
            packets.push(buf.clone());
        }
        if packets.is_empty() {
            std::thread::sleep(Duration::from_millis(5));
            continue;
        }
        let answers = post(&packets);
        d.requests.push(packets);
        d.answers += answers.len();
        for a in &answers {
            sender.handle_datagram(Instant::now(), a);
        }
        while let Some(e) = sender.poll_event() {
            d.events.push(e);
        }
    }
    d
}
