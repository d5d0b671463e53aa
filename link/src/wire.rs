//! The byte layout of link packets (docs/protocol.md sections 4 and 5): headers, frames and varints.
//!
//! Parsing is total: every function here returns an error instead of panicking, whatever the bytes, because all
//! of it runs on network input. Emitting writes into a caller-owned [`Out`] (a `Vec` on the node, a fixed buffer
//! on a device) so the caller decides where the bytes live.

#[cfg(feature = "alloc")]
use alloc::vec::Vec;

use thiserror::Error;

use crate::buf::Out;

/// Protocol version carried in the high 4 bits of byte 0 (protocol.md 4.3).
pub const VERSION: u8 = 1;
/// Byte 0 of a sender → node packet: version 1, type 1.
pub const TYPE_SENDER: u8 = (VERSION << 4) | 1;
/// Byte 0 of a node → sender packet: version 1, type 2.
pub const TYPE_NODE: u8 = (VERSION << 4) | 2;
/// Byte 0 of a COOKIE packet, node → sender: version 1, type 3 (protocol.md 4.4).
pub const TYPE_COOKIE: u8 = (VERSION << 4) | 3;
/// Byte 0 of a sender packet that echoes a cookie: version 1, type 4, then the cookie, then a whole type-1 packet
/// (protocol.md 4.4).
pub const TYPE_SENDER_COOKIE: u8 = (VERSION << 4) | 4;
/// Length of a cookie.
pub const COOKIE_LEN: usize = 16;
/// The largest sequence a node stores (its store's integers are signed 64-bit, protocol.md 5.1): no node
/// acknowledges past it.
pub const MAX_STORED_SEQ: u64 = (1 << 63) - 1;
/// What a cookie adds in front of a sender packet: the type byte and the cookie.
pub const COOKIE_PREFIX_LEN: usize = 1 + COOKIE_LEN;
/// A COOKIE packet: type, the header fields of the packet it answers (key id, run id, packet number), cookie.
pub const COOKIE_PACKET_LEN: usize = 1 + 4 + 8 + 8 + COOKIE_LEN;
/// Sender header: type, key id, run id, packet number (protocol.md 4.1).
pub const SENDER_HEADER_LEN: usize = 1 + 4 + 8 + 8;
/// Node header: type, epoch, packet number (protocol.md 4.2).
pub const NODE_HEADER_LEN: usize = 1 + 8 + 8;
/// AES-GCM tag length.
pub const TAG_LEN: usize = 16;
/// Largest datagram either side sends or accepts (protocol.md 4).
pub const MAX_DATAGRAM: usize = 1472;
/// Smallest sender datagram; senders pad up to it so one ACK always fits (protocol.md 4, 9).
pub const MIN_SENDER_DATAGRAM: usize = 96;
/// Longest app name (protocol.md 5).
pub const MAX_APP_LEN: usize = 32;

pub const FRAME_PADDING: u8 = 0x00;
pub const FRAME_DATA: u8 = 0x01;
pub const FRAME_ACK: u8 = 0x02;
pub const FRAME_ECHO: u8 = 0x03;
pub const FRAME_REFUSE: u8 = 0x04;
/// A DATA frame whose records are forwarded records (protocol.md 5.4): sent by a node's outlets.
pub const FRAME_FORWARD: u8 = 0x05;
/// Node → sender: the app cannot store now; the records were not taken and should be sent again later
/// (docs/protocol.md 5, NOT_STORED).
pub const FRAME_NOT_STORED: u8 = 0x06;
/// Sender → node, version 1.1 (docs/protocol.md 12): this run wants the app's downlink records, and its program
/// has been handed every one up to `heard`.
pub const FRAME_LISTEN: u8 = 0x07;
/// Node → sender, version 1.1 (docs/protocol.md 12): downlink records, with what waits (`last`) and the sequence
/// they follow (`after`).
pub const FRAME_DOWN: u8 = 0x08;
/// CHALLENGE (protocol.md 13): a token for the run to echo from the address it was sent to. Node → sender.
pub const FRAME_CHALLENGE: u8 = 0x09;
/// RESPONSE (protocol.md 13): the latest CHALLENGE's token (zero: an offer), the largest node datagram the device
/// takes and its window. Sender → node.
pub const FRAME_RESPONSE: u8 = 0x0a;
/// Bytes of a CHALLENGE's (and RESPONSE's) token.
pub const TOKEN_LEN: usize = 8;
/// A CHALLENGE frame's size.
pub const CHALLENGE_LEN: usize = 1 + TOKEN_LEN;

/// Largest sender datagram a node accepts. Devices send at most [`MAX_DATAGRAM`]; a node forwarding a record adds
/// its origin (up to 75 bytes), so the one datagram that carries a record too large for [`MAX_DATAGRAM`] with its
/// origin may be this large (protocol.md 4 and 5.4).
pub const MAX_ACCEPTED_DATAGRAM: usize = 1600;
/// Longest origin name in a forwarded record (protocol.md 5.4): a sender name is at most 64 bytes.
pub const MAX_ORIGIN_LEN: usize = 64;

/// REFUSE reason: the node has no app of that name.
pub const REFUSE_NO_APP: u8 = 1;
/// REFUSE reason: the app does not accept this sender.
pub const REFUSE_NOT_ACCEPTED: u8 = 2;
/// REFUSE reason: the app accepts this sender but does not let it forward (protocol.md 5.4): its FORWARD frames,
/// which say where each record came from, are not applied.
pub const REFUSE_NOT_FORWARDER: u8 = 3;
/// NOT_STORED reason: the app's store cannot commit (a full or read-only disk, a store deleted under the node).
pub const NOT_STORED_STORE_FAILING: u8 = 1;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum WireError {
    #[error("packet ends inside a field")]
    Truncated,
    #[error("varint longer than 10 bytes or above 2^64-1")]
    BadVarint,
    #[error("unknown frame type {0:#04x}")]
    UnknownFrame(u8),
    #[error("frame type {0:#04x} is not allowed in this direction")]
    WrongDirection(u8),
    #[error("bad app name")]
    BadAppName,
    #[error("a probe (count 0) must have first_seq 0")]
    BadProbe,
    #[error("sequence numbers overflow")]
    SequenceOverflow,
    #[error("a forwarded record's origin is not 1–64 printable bytes with a sequence ≥ 1")]
    BadOrigin,
    #[error(
        "a datagram over 1472 bytes holds a DATA frame (only FORWARD frames may be that large)"
    )]
    Oversized,
    #[error("two LISTEN frames for one app in one packet")]
    DuplicateListen,
    #[error("two RESPONSE frames in one packet")]
    DuplicateResponse,
    #[error("a DOWN frame's sequences are not after `after` and within `last`")]
    BadDown,
}

/// Whether `name` is a valid app name: 1–32 bytes of `[a-z0-9_-]`.
pub fn valid_app_name(name: &[u8]) -> bool {
    !name.is_empty()
        && name.len() <= MAX_APP_LEN
        && name
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'_' || *b == b'-')
}

pub fn put_varint(out: &mut (impl Out + ?Sized), mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

pub fn varint_len(mut value: u64) -> usize {
    let mut n = 1;
    while value >= 0x80 {
        value >>= 7;
        n += 1;
    }
    n
}

/// A cursor over untrusted bytes.
pub struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Reader { bytes, pos: 0 }
    }
    pub fn is_empty(&self) -> bool {
        self.pos >= self.bytes.len()
    }
    pub fn position(&self) -> usize {
        self.pos
    }
    pub fn u8(&mut self) -> Result<u8, WireError> {
        let b = *self.bytes.get(self.pos).ok_or(WireError::Truncated)?;
        self.pos += 1;
        Ok(b)
    }
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        let end = self.pos.checked_add(n).ok_or(WireError::Truncated)?;
        let s = self.bytes.get(self.pos..end).ok_or(WireError::Truncated)?;
        self.pos = end;
        Ok(s)
    }
    pub fn varint(&mut self) -> Result<u64, WireError> {
        let mut value: u64 = 0;
        for i in 0..10 {
            let b = self.u8()?;
            let part = u64::from(b & 0x7f);
            if i == 9 && part > 1 {
                return Err(WireError::BadVarint);
            }
            value |= part << (7 * i);
            if b & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(WireError::BadVarint)
    }
    fn token(&mut self) -> Result<[u8; TOKEN_LEN], WireError> {
        let mut token = [0; TOKEN_LEN];
        token.copy_from_slice(self.take(TOKEN_LEN)?);
        Ok(token)
    }
    fn app(&mut self) -> Result<&'a [u8], WireError> {
        let len = self.u8()? as usize;
        let name = self.take(len)?;
        if !valid_app_name(name) {
            return Err(WireError::BadAppName);
        }
        Ok(name)
    }
}

/// The cleartext header of a sender → node packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SenderHeader {
    pub key_id: u32,
    pub run_id: u64,
    pub packet_number: u64,
}

impl SenderHeader {
    /// Reads the header of a datagram whose byte 0 was already checked to be `TYPE_SENDER`.
    pub fn parse(datagram: &[u8]) -> Result<Self, WireError> {
        let h = datagram
            .get(..SENDER_HEADER_LEN)
            .ok_or(WireError::Truncated)?;
        Ok(SenderHeader {
            key_id: u32::from_be_bytes([h[1], h[2], h[3], h[4]]),
            run_id: u64::from_be_bytes(h[5..13].try_into().map_err(|_| WireError::Truncated)?),
            packet_number: u64::from_be_bytes(
                h[13..21].try_into().map_err(|_| WireError::Truncated)?,
            ),
        })
    }
    pub fn emit(&self, out: &mut (impl Out + ?Sized)) {
        out.push(TYPE_SENDER);
        out.extend_from_slice(&self.key_id.to_be_bytes());
        out.extend_from_slice(&self.run_id.to_be_bytes());
        out.extend_from_slice(&self.packet_number.to_be_bytes());
    }
}

/// The cleartext header of a node → sender packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeHeader {
    pub epoch: u64,
    pub packet_number: u64,
}

impl NodeHeader {
    pub fn parse(datagram: &[u8]) -> Result<Self, WireError> {
        let h = datagram
            .get(..NODE_HEADER_LEN)
            .ok_or(WireError::Truncated)?;
        Ok(NodeHeader {
            epoch: u64::from_be_bytes(h[1..9].try_into().map_err(|_| WireError::Truncated)?),
            packet_number: u64::from_be_bytes(
                h[9..17].try_into().map_err(|_| WireError::Truncated)?,
            ),
        })
    }
    pub fn emit(&self, out: &mut (impl Out + ?Sized)) {
        out.push(TYPE_NODE);
        out.extend_from_slice(&self.epoch.to_be_bytes());
        out.extend_from_slice(&self.packet_number.to_be_bytes());
    }
}

/// A COOKIE packet (protocol.md 4.4): the node asks the sender to prove its address before it spends an X25519.
/// It names the packet it answers by that packet's key id, run id and packet number, so a sender takes it only for
/// a packet it sent (someone off the path does not know the run id).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CookiePacket {
    pub answers: SenderHeader,
    pub cookie: [u8; COOKIE_LEN],
}

impl CookiePacket {
    /// Reads a COOKIE packet: exactly [`COOKIE_PACKET_LEN`] bytes starting with [`TYPE_COOKIE`].
    pub fn parse(datagram: &[u8]) -> Result<Self, WireError> {
        if datagram.len() != COOKIE_PACKET_LEN || datagram[0] != TYPE_COOKIE {
            return Err(WireError::Truncated);
        }
        // The answered header has a sender packet's layout after byte 0.
        let answers = SenderHeader::parse(&datagram[..SENDER_HEADER_LEN])?;
        let mut cookie = [0u8; COOKIE_LEN];
        cookie.copy_from_slice(&datagram[SENDER_HEADER_LEN..]);
        Ok(CookiePacket { answers, cookie })
    }
    pub fn emit(&self, out: &mut (impl Out + ?Sized)) {
        // A sender header's layout after its type byte.
        out.push(TYPE_COOKIE);
        out.extend_from_slice(&self.answers.key_id.to_be_bytes());
        out.extend_from_slice(&self.answers.run_id.to_be_bytes());
        out.extend_from_slice(&self.answers.packet_number.to_be_bytes());
        out.extend_from_slice(&self.cookie);
    }
}

/// What a DATA-shaped frame's records are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum RecordFormat {
    /// DATA (0x01): each record is its payload.
    #[default]
    Plain = 0,
    /// FORWARD (0x05): each record is a forwarded record, its origin and origin sequence before the payload.
    Forwarded = 1,
}

/// One DATA or FORWARD frame as read from a packet: the records stay in their wire encoding (`len`, bytes)*, which
/// is also the store's chunk encoding, so they are copied once and never re-encoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataFrame<'a> {
    pub format: RecordFormat,
    pub app: &'a [u8],
    pub first_seq: u64,
    pub count: u64,
    /// `count` records, each a varint length and that many bytes.
    pub records: &'a [u8],
}

/// Frames a node accepts in a sender packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SenderFrame<'a> {
    Data(DataFrame<'a>),
    /// LISTEN (protocol.md 12.2): downlink wanted for `app`; the program has had every record up to `heard`.
    Listen {
        app: &'a [u8],
        heard: u64,
    },
    /// RESPONSE (protocol.md 13): the token of the latest CHALLENGE (zero: an offer), the largest node datagram
    /// the device takes, and the bytes of DOWN datagrams it takes in flight beyond its `heard`.
    Response {
        token: [u8; TOKEN_LEN],
        datagram: u64,
        window: u64,
    },
}

/// A DOWN frame (protocol.md 12.2): `count` downlink records `first_seq ..`, nothing waiting between `after` and
/// `first_seq`, and `last` the largest sequence the node has given the flow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DownFrame<'a> {
    pub app: &'a [u8],
    pub last: u64,
    pub after: u64,
    pub first_seq: u64,
    pub count: u64,
    /// `count` records, each a varint length and that many bytes.
    pub records: &'a [u8],
}

/// Frames a sender accepts in a node packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeFrame<'a> {
    Ack {
        app: &'a [u8],
        stored_through: u64,
    },
    Echo {
        packet_number: u64,
    },
    Refuse {
        app: &'a [u8],
        reason: u8,
    },
    NotStored {
        app: &'a [u8],
        reason: u8,
    },
    Down(DownFrame<'a>),
    /// CHALLENGE (protocol.md 13): echo this token in RESPONSE from the address this packet came to.
    Challenge {
        token: [u8; TOKEN_LEN],
    },
}

/// Walks `count` records from the reader and returns the bytes they span; forwarded records are checked to be
/// well formed on the way.
fn skip_records<'a>(
    r: &mut Reader<'a>,
    count: u64,
    format: RecordFormat,
) -> Result<&'a [u8], WireError> {
    let start = r.pos;
    for _ in 0..count {
        let len = r.varint()?;
        let len = usize::try_from(len).map_err(|_| WireError::Truncated)?;
        let record = r.take(len)?;
        if format == RecordFormat::Forwarded {
            Forwarded::parse(record)?;
        }
    }
    Ok(&r.bytes[start..r.pos])
}

/// A forwarded record (protocol.md 5.4): where a record first entered a node (the origin: the name of the sender
/// or inner inlet it came from there, and its sequence in that flow), then its payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Forwarded<'a> {
    pub origin: &'a [u8],
    pub origin_seq: u64,
    pub payload: &'a [u8],
}

/// Whether `origin` is a valid origin name: 1–64 bytes of printable ASCII without space.
pub fn valid_origin(origin: &[u8]) -> bool {
    !origin.is_empty()
        && origin.len() <= MAX_ORIGIN_LEN
        && origin.iter().all(|b| (0x21..=0x7e).contains(b))
}

impl<'a> Forwarded<'a> {
    pub fn parse(record: &'a [u8]) -> Result<Self, WireError> {
        let mut r = Reader::new(record);
        let len = r.u8()? as usize;
        let origin = r.take(len)?;
        if !valid_origin(origin) {
            return Err(WireError::BadOrigin);
        }
        let origin_seq = r.varint()?;
        if origin_seq == 0 {
            return Err(WireError::BadOrigin);
        }
        Ok(Forwarded {
            origin,
            origin_seq,
            payload: &record[r.position()..],
        })
    }
    /// Bytes the record takes (without its length varint).
    pub fn len(origin: &[u8], origin_seq: u64, payload_len: usize) -> usize {
        1 + origin.len() + varint_len(origin_seq) + payload_len
    }
    /// Appends the forwarded record, with its length varint in front, as it goes in a FORWARD frame or a chunk.
    pub fn put(out: &mut (impl Out + ?Sized), origin: &[u8], origin_seq: u64, payload: &[u8]) {
        put_varint(out, Self::len(origin, origin_seq, payload.len()) as u64);
        Self::put_bare(out, origin, origin_seq, payload);
    }
    /// Appends the forwarded record without a length in front.
    pub fn put_bare(out: &mut (impl Out + ?Sized), origin: &[u8], origin_seq: u64, payload: &[u8]) {
        out.push(origin.len() as u8);
        out.extend_from_slice(origin);
        put_varint(out, origin_seq);
        out.extend_from_slice(payload);
    }
}

/// Parses the plaintext of a sender packet. PADDING is skipped.
#[cfg(feature = "alloc")]
pub fn parse_sender_frames(plain: &[u8]) -> Result<Vec<SenderFrame<'_>>, WireError> {
    let mut r = Reader::new(plain);
    let mut frames = Vec::new();
    while !r.is_empty() {
        match r.u8()? {
            FRAME_PADDING => {}
            t @ (FRAME_DATA | FRAME_FORWARD) => {
                let format = if t == FRAME_DATA {
                    RecordFormat::Plain
                } else {
                    RecordFormat::Forwarded
                };
                let app = r.app()?;
                let first_seq = r.varint()?;
                let count = r.varint()?;
                if count == 0 && first_seq != 0 {
                    return Err(WireError::BadProbe);
                }
                if count > 0 && first_seq == 0 {
                    return Err(WireError::SequenceOverflow);
                }
                // The last sequence, first_seq + count - 1, may be 2^64 - 1 itself; only passing it is an
                // overflow (protocol.md 5.1).
                if count > 0 && first_seq.checked_add(count - 1).is_none() {
                    return Err(WireError::SequenceOverflow);
                }
                let records = skip_records(&mut r, count, format)?;
                frames.push(SenderFrame::Data(DataFrame {
                    format,
                    app,
                    first_seq,
                    count,
                    records,
                }));
            }
            FRAME_LISTEN => {
                let app = r.app()?;
                let heard = r.varint()?;
                // One per app per packet (protocol.md 12.2): a second would say two things at once.
                if frames
                    .iter()
                    .any(|f| matches!(f, SenderFrame::Listen { app: a, .. } if *a == app))
                {
                    return Err(WireError::DuplicateListen);
                }
                frames.push(SenderFrame::Listen { app, heard });
            }
            FRAME_RESPONSE => {
                let token = r.token()?;
                let datagram = r.varint()?;
                let window = r.varint()?;
                if frames
                    .iter()
                    .any(|f| matches!(f, SenderFrame::Response { .. }))
                {
                    return Err(WireError::DuplicateResponse);
                }
                frames.push(SenderFrame::Response {
                    token,
                    datagram,
                    window,
                });
            }
            t @ (FRAME_ACK | FRAME_ECHO | FRAME_REFUSE | FRAME_NOT_STORED | FRAME_DOWN
            | FRAME_CHALLENGE) => {
                return Err(WireError::WrongDirection(t));
            }
            t => return Err(WireError::UnknownFrame(t)),
        }
    }
    Ok(frames)
}

/// Parses the plaintext of a node packet. PADDING is skipped.
#[cfg(feature = "alloc")]
pub fn parse_node_frames(plain: &[u8]) -> Result<Vec<NodeFrame<'_>>, WireError> {
    NodeFrames::new(plain).collect()
}

/// The frames of a node packet's plaintext, one at a time, without a heap; PADDING is skipped. After an error it
/// yields nothing more. A sender that must not act on a packet with a bad frame walks it twice: once to check it
/// ([`NodeFrames::check`]), then to apply it.
pub struct NodeFrames<'a> {
    reader: Reader<'a>,
    failed: bool,
}

impl<'a> NodeFrames<'a> {
    pub fn new(plain: &'a [u8]) -> Self {
        NodeFrames {
            reader: Reader::new(plain),
            failed: false,
        }
    }

    /// Whether every frame of `plain` is well formed.
    pub fn check(plain: &'a [u8]) -> Result<(), WireError> {
        NodeFrames::new(plain).try_for_each(|f| f.map(|_| ()))
    }

    fn frame(&mut self) -> Result<Option<NodeFrame<'a>>, WireError> {
        let r = &mut self.reader;
        loop {
            if r.is_empty() {
                return Ok(None);
            }
            let frame = match r.u8()? {
                FRAME_PADDING => continue,
                FRAME_ACK => {
                    let app = r.app()?;
                    let stored_through = r.varint()?;
                    NodeFrame::Ack {
                        app,
                        stored_through,
                    }
                }
                FRAME_ECHO => NodeFrame::Echo {
                    packet_number: r.varint()?,
                },
                FRAME_REFUSE => {
                    let app = r.app()?;
                    let reason = r.u8()?;
                    NodeFrame::Refuse { app, reason }
                }
                FRAME_NOT_STORED => {
                    let app = r.app()?;
                    let reason = r.u8()?;
                    NodeFrame::NotStored { app, reason }
                }
                FRAME_DOWN => {
                    let app = r.app()?;
                    let last = r.varint()?;
                    let after = r.varint()?;
                    let first_seq = r.varint()?;
                    let count = r.varint()?;
                    let well_formed = if count == 0 {
                        first_seq == 0
                    } else {
                        first_seq > after
                            && first_seq
                                .checked_add(count - 1)
                                .is_some_and(|end| end <= last)
                    };
                    if !well_formed {
                        return Err(WireError::BadDown);
                    }
                    let records = skip_records(r, count, RecordFormat::Plain)?;
                    NodeFrame::Down(DownFrame {
                        app,
                        last,
                        after,
                        first_seq,
                        count,
                        records,
                    })
                }
                FRAME_CHALLENGE => NodeFrame::Challenge { token: r.token()? },
                t @ (FRAME_DATA | FRAME_FORWARD | FRAME_LISTEN | FRAME_RESPONSE) => {
                    return Err(WireError::WrongDirection(t));
                }
                t => return Err(WireError::UnknownFrame(t)),
            };
            return Ok(Some(frame));
        }
    }
}

impl<'a> Iterator for NodeFrames<'a> {
    type Item = Result<NodeFrame<'a>, WireError>;
    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        match self.frame() {
            Ok(f) => f.map(Ok),
            Err(e) => {
                self.failed = true;
                Some(Err(e))
            }
        }
    }
}

/// Appends a DATA frame header; the caller appends `count` records after it with [`put_record`].
pub fn put_data_header(out: &mut (impl Out + ?Sized), app: &[u8], first_seq: u64, count: u64) {
    put_frame_header(out, RecordFormat::Plain, app, first_seq, count);
}

/// Appends a DATA (plain) or FORWARD (forwarded) frame header.
pub fn put_frame_header(
    out: &mut (impl Out + ?Sized),
    format: RecordFormat,
    app: &[u8],
    first_seq: u64,
    count: u64,
) {
    out.push(match format {
        RecordFormat::Plain => FRAME_DATA,
        RecordFormat::Forwarded => FRAME_FORWARD,
    });
    out.push(app.len() as u8);
    out.extend_from_slice(app);
    put_varint(out, first_seq);
    put_varint(out, count);
}

/// Bytes a DATA frame header takes.
pub fn data_header_len(app: &[u8], first_seq: u64, count: u64) -> usize {
    2 + app.len() + varint_len(first_seq) + varint_len(count)
}

pub fn put_record(out: &mut (impl Out + ?Sized), payload: &[u8]) {
    put_varint(out, payload.len() as u64);
    out.extend_from_slice(payload);
}

pub fn record_len(payload: &[u8]) -> usize {
    varint_len(payload.len() as u64) + payload.len()
}

pub fn put_ack(out: &mut (impl Out + ?Sized), app: &[u8], stored_through: u64) {
    out.push(FRAME_ACK);
    out.push(app.len() as u8);
    out.extend_from_slice(app);
    put_varint(out, stored_through);
}

pub fn ack_len(app: &[u8], stored_through: u64) -> usize {
    2 + app.len() + varint_len(stored_through)
}

pub fn put_echo(out: &mut (impl Out + ?Sized), packet_number: u64) {
    out.push(FRAME_ECHO);
    put_varint(out, packet_number);
}

pub fn put_refuse(out: &mut (impl Out + ?Sized), app: &[u8], reason: u8) {
    out.push(FRAME_REFUSE);
    out.push(app.len() as u8);
    out.extend_from_slice(app);
    out.push(reason);
}

pub fn put_not_stored(out: &mut (impl Out + ?Sized), app: &[u8], reason: u8) {
    out.push(FRAME_NOT_STORED);
    out.push(app.len() as u8);
    out.extend_from_slice(app);
    out.push(reason);
}

pub fn put_listen(out: &mut (impl Out + ?Sized), app: &[u8], heard: u64) {
    out.push(FRAME_LISTEN);
    out.push(app.len() as u8);
    out.extend_from_slice(app);
    put_varint(out, heard);
}

pub fn listen_len(app: &[u8], heard: u64) -> usize {
    2 + app.len() + varint_len(heard)
}

pub fn put_challenge(out: &mut (impl Out + ?Sized), token: &[u8; TOKEN_LEN]) {
    out.push(FRAME_CHALLENGE);
    out.extend_from_slice(token);
}

pub fn put_response(
    out: &mut (impl Out + ?Sized),
    token: &[u8; TOKEN_LEN],
    datagram: u64,
    window: u64,
) {
    out.push(FRAME_RESPONSE);
    out.extend_from_slice(token);
    put_varint(out, datagram);
    put_varint(out, window);
}

pub fn response_len(datagram: u64, window: u64) -> usize {
    1 + TOKEN_LEN + varint_len(datagram) + varint_len(window)
}

/// Appends a DOWN frame header; the caller appends `count` records after it with [`put_record`].
pub fn put_down_header(
    out: &mut (impl Out + ?Sized),
    app: &[u8],
    last: u64,
    after: u64,
    first_seq: u64,
    count: u64,
) {
    out.push(FRAME_DOWN);
    out.push(app.len() as u8);
    out.extend_from_slice(app);
    put_varint(out, last);
    put_varint(out, after);
    put_varint(out, first_seq);
    put_varint(out, count);
}

/// Bytes a DOWN frame header takes.
pub fn down_header_len(app: &[u8], last: u64, after: u64, first_seq: u64, count: u64) -> usize {
    2 + app.len() + varint_len(last) + varint_len(after) + varint_len(first_seq) + varint_len(count)
}

/// Iterates the records of a chunk body, `(len, bytes)*`, as stored and as sent. Stops (returns `None`) at the
/// end or at the first malformed record; callers that need to tell the two apart check [`RecordIter::is_clean`].
pub struct RecordIter<'a> {
    reader: Reader<'a>,
    broken: bool,
}

impl<'a> RecordIter<'a> {
    pub fn new(body: &'a [u8]) -> Self {
        RecordIter {
            reader: Reader::new(body),
            broken: false,
        }
    }
    /// Whether iteration ended at the end of the body rather than at a malformed record.
    pub fn is_clean(&self) -> bool {
        !self.broken
    }
    /// Byte offset of the next record.
    pub fn position(&self) -> usize {
        self.reader.position()
    }
}

impl<'a> Iterator for RecordIter<'a> {
    type Item = &'a [u8];
    fn next(&mut self) -> Option<&'a [u8]> {
        if self.broken || self.reader.is_empty() {
            return None;
        }
        let item = self
            .reader
            .varint()
            .and_then(|len| usize::try_from(len).map_err(|_| WireError::Truncated))
            .and_then(|len| self.reader.take(len));
        match item {
            Ok(bytes) => Some(bytes),
            Err(_) => {
                self.broken = true;
                None
            }
        }
    }
}

#[cfg(all(test, feature = "std"))]
mod tests {
    use super::*;
    use alloc::vec;
    use alloc::vec::Vec;
    use proptest::prelude::*;

    #[test]
    fn varint_round_trips_at_the_edges() {
        for v in [0, 1, 127, 128, 16383, 16384, u64::MAX / 2, u64::MAX] {
            let mut b = Vec::new();
            put_varint(&mut b, v);
            assert_eq!(b.len(), varint_len(v));
            assert_eq!(Reader::new(&b).varint(), Ok(v));
        }
    }

    #[test]
    fn overlong_varint_is_refused() {
        let b = [0xffu8; 11];
        assert_eq!(Reader::new(&b).varint(), Err(WireError::BadVarint));
        let mut b = vec![0xffu8; 9];
        b.push(0x02); // bit 64 set
        assert_eq!(Reader::new(&b).varint(), Err(WireError::BadVarint));
    }

    #[test]
    fn data_frame_round_trips() {
        let mut p = Vec::new();
        put_data_header(&mut p, b"main", 7, 2);
        put_record(&mut p, b"hello");
        put_record(&mut p, b"");
        p.push(FRAME_PADDING);
        let frames = parse_sender_frames(&p).unwrap();
        assert_eq!(frames.len(), 1);
        let SenderFrame::Data(d) = &frames[0] else {
            panic!("a DATA frame")
        };
        assert_eq!((d.app, d.first_seq, d.count), (&b"main"[..], 7, 2));
        let recs: Vec<_> = RecordIter::new(d.records).collect();
        assert_eq!(recs, vec![&b"hello"[..], &b""[..]]);
    }

    #[test]
    fn forward_frames_carry_origins_and_bad_origins_are_malformed() {
        let mut p = Vec::new();
        put_frame_header(&mut p, RecordFormat::Forwarded, b"ingest", 1, 2);
        Forwarded::put(&mut p, b"dev-1", 41, b"hello");
        Forwarded::put(&mut p, b"app/main", 7, b"");
        let frames = parse_sender_frames(&p).unwrap();
        let SenderFrame::Data(d) = &frames[0] else {
            panic!("a DATA frame")
        };
        assert_eq!(d.format, RecordFormat::Forwarded);
        let recs: Vec<Forwarded> = RecordIter::new(d.records)
            .map(|r| Forwarded::parse(r).unwrap())
            .collect();
        assert_eq!(
            (recs[0].origin, recs[0].origin_seq, recs[0].payload),
            (&b"dev-1"[..], 41, &b"hello"[..])
        );
        assert_eq!((recs[1].origin, recs[1].origin_seq), (&b"app/main"[..], 7));
        for bad in [&b""[..], b"a b", b"\x7f"] {
            let mut p = Vec::new();
            put_frame_header(&mut p, RecordFormat::Forwarded, b"ingest", 1, 1);
            Forwarded::put(&mut p, bad, 1, b"x");
            assert_eq!(
                parse_sender_frames(&p),
                Err(WireError::BadOrigin),
                "{bad:?}"
            );
        }
        let mut p = Vec::new();
        put_frame_header(&mut p, RecordFormat::Forwarded, b"ingest", 1, 1);
        Forwarded::put(&mut p, b"dev", 0, b"x");
        assert_eq!(
            parse_sender_frames(&p),
            Err(WireError::BadOrigin),
            "origin_seq 0"
        );
    }

    #[test]
    fn the_last_sequence_may_be_the_largest_u64_but_not_pass_it() {
        let frame = |first: u64, count: u64| {
            let mut p = Vec::new();
            put_data_header(&mut p, b"main", first, count);
            for _ in 0..count {
                put_record(&mut p, b"r");
            }
            p
        };
        for (first, count) in [(u64::MAX, 1), (u64::MAX - 1, 2), (1, 3)] {
            let p = frame(first, count);
            let frames = parse_sender_frames(&p).unwrap();
            let SenderFrame::Data(d) = &frames[0] else {
                panic!("a DATA frame")
            };
            assert_eq!((d.first_seq, d.count), (first, count));
        }
        for (first, count) in [(u64::MAX, 2), (u64::MAX - 1, 3)] {
            assert_eq!(
                parse_sender_frames(&frame(first, count)),
                Err(WireError::SequenceOverflow)
            );
        }
    }

    #[test]
    fn a_data_frame_ends_after_count_records_and_zero_bytes_inside_it_are_empty_records() {
        // count 3 with one record written: the two PADDING bytes after it are read as two empty records, and
        // what follows the third record is the next frame (protocol.md 5).
        let mut p = Vec::new();
        put_data_header(&mut p, b"main", 1, 3);
        put_record(&mut p, b"x");
        p.extend_from_slice(&[FRAME_PADDING, FRAME_PADDING, FRAME_PADDING]);
        let frames = parse_sender_frames(&p).unwrap();
        assert_eq!(frames.len(), 1);
        let SenderFrame::Data(d) = &frames[0] else {
            panic!("a DATA frame")
        };
        let recs: Vec<_> = RecordIter::new(d.records).collect();
        assert_eq!(recs, vec![&b"x"[..], &b""[..], &b""[..]]);
    }

    #[test]
    fn frames_from_the_wrong_direction_are_malformed() {
        let mut p = Vec::new();
        put_ack(&mut p, b"main", 3);
        assert_eq!(
            parse_sender_frames(&p),
            Err(WireError::WrongDirection(FRAME_ACK))
        );
        let mut p = Vec::new();
        put_data_header(&mut p, b"main", 0, 0);
        assert_eq!(
            parse_node_frames(&p),
            Err(WireError::WrongDirection(FRAME_DATA))
        );
    }

    #[test]
    fn not_stored_round_trips_and_is_node_to_sender_only() {
        let mut p = Vec::new();
        put_echo(&mut p, 9);
        put_not_stored(&mut p, b"main", NOT_STORED_STORE_FAILING);
        put_ack(&mut p, b"other", 4);
        let frames = parse_node_frames(&p).unwrap();
        assert_eq!(
            frames,
            vec![
                NodeFrame::Echo { packet_number: 9 },
                NodeFrame::NotStored {
                    app: b"main",
                    reason: NOT_STORED_STORE_FAILING
                },
                NodeFrame::Ack {
                    app: b"other",
                    stored_through: 4
                },
            ]
        );
        assert!(matches!(
            parse_sender_frames(&p[2..]),
            Err(WireError::WrongDirection(FRAME_NOT_STORED))
        ));
    }

    #[test]
    fn listen_and_down_round_trip_and_bad_ones_are_malformed() {
        let mut p = Vec::new();
        put_listen(&mut p, b"main", 7);
        put_data_header(&mut p, b"main", 0, 0);
        put_listen(&mut p, b"other", 0);
        assert_eq!(
            parse_sender_frames(&p).unwrap()[0],
            SenderFrame::Listen {
                app: b"main",
                heard: 7
            }
        );
        put_listen(&mut p, b"main", 8);
        assert_eq!(parse_sender_frames(&p), Err(WireError::DuplicateListen));

        let mut p = Vec::new();
        put_echo(&mut p, 1);
        put_down_header(&mut p, b"main", 9, 3, 5, 2);
        put_record(&mut p, b"five");
        put_record(&mut p, b"");
        put_down_header(&mut p, b"main", 9, 6, 0, 0);
        assert_eq!(
            p.len(),
            2 + down_header_len(b"main", 9, 3, 5, 2) + 5 + 1 + down_header_len(b"main", 9, 6, 0, 0)
        );
        let frames = parse_node_frames(&p).unwrap();
        let NodeFrame::Down(d) = &frames[1] else {
            panic!("a DOWN frame: {frames:?}")
        };
        assert_eq!((d.last, d.after, d.first_seq, d.count), (9, 3, 5, 2));
        assert_eq!(
            RecordIter::new(d.records).collect::<Vec<_>>(),
            vec![&b"five"[..], &b""[..]]
        );
        // first_seq not after `after`, records past `last`, first_seq 0 with records, count 0 with a first_seq.
        for (last, after, first, count) in [(9, 5, 5, 1), (9, 3, 8, 3), (9, 0, 0, 1), (9, 0, 4, 0)]
        {
            let mut p = Vec::new();
            put_down_header(&mut p, b"main", last, after, first, count);
            for _ in 0..count {
                put_record(&mut p, b"r");
            }
            assert_eq!(
                parse_node_frames(&p),
                Err(WireError::BadDown),
                "{last} {after} {first} {count}"
            );
        }
        assert_eq!(
            parse_sender_frames(&p[2..]),
            Err(WireError::WrongDirection(FRAME_DOWN))
        );
        let mut p = Vec::new();
        put_listen(&mut p, b"main", 1);
        assert_eq!(
            parse_node_frames(&p),
            Err(WireError::WrongDirection(FRAME_LISTEN))
        );
    }

    #[test]
    fn bad_app_names_are_refused() {
        assert!(valid_app_name(b"main"));
        assert!(valid_app_name(b"a-b_9"));
        assert!(!valid_app_name(b""));
        assert!(!valid_app_name(b"Main"));
        assert!(!valid_app_name(&[b'a'; 33]));
    }

    proptest! {
        #[test]
        fn parsers_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = parse_sender_frames(&bytes);
            let _ = parse_node_frames(&bytes);
            let _ = SenderHeader::parse(&bytes);
            let _ = NodeHeader::parse(&bytes);
            let mut it = RecordIter::new(&bytes);
            while it.next().is_some() {}
        }
    }
}
