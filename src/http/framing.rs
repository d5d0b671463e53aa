//! The body of `POST /link` and of its answer (docs/protocol.md, "Links over HTTP"): zero or more packets, each a
//! 2-byte big-endian length (1 to 1600, the largest datagram a node accepts: protocol.md 4 and 5.4) followed by that many bytes.
//!
//! The packets are exactly the datagrams a sender would send over UDP, and the answer's are exactly the node's
//! datagrams; the framing only puts them one after another in a stream. Parse, don't validate: [`Framed::parse`]
//! checks a whole body once, and a [`Framed`] can then only be iterated.

use thiserror::Error;

use crate::proto::wire::MAX_ACCEPTED_DATAGRAM as MAX_DATAGRAM;

/// Bytes of a packet's length prefix.
pub const LENGTH_PREFIX: usize = 2;

/// Why a body is not a sequence of framed packets. Each names the packet (counted from 1) and the byte offset of
/// its length prefix, so the sender of a bad body can find the fault.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum FramingError {
    #[error(
        "packet {index} (at byte {offset}): length 0; every packet is 1 to {MAX_DATAGRAM} bytes after its 2-byte big-endian length"
    )]
    Empty { index: usize, offset: usize },
    #[error(
        "packet {index} (at byte {offset}): length {len} is more than {MAX_DATAGRAM}, the largest packet of the link protocol"
    )]
    TooLong {
        index: usize,
        offset: usize,
        len: usize,
    },
    #[error(
        "packet {index} (at byte {offset}): length {len}, but only {left} bytes follow; the body ends inside the packet"
    )]
    Truncated {
        index: usize,
        offset: usize,
        len: usize,
        left: usize,
    },
    #[error(
        "packet {index} (at byte {offset}): the body ends inside the 2-byte length; a length is 2 bytes, big-endian"
    )]
    CutLength { index: usize, offset: usize },
}

/// A body checked to be framed packets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Framed {
    bytes: Vec<u8>,
    count: usize,
}

impl Framed {
    /// Checks a whole body. Takes no copy: the packets are read from `bytes` where they are.
    pub fn parse(bytes: Vec<u8>) -> Result<Self, FramingError> {
        let mut offset = 0;
        let mut index = 0;
        while offset < bytes.len() {
            index += 1;
            let Some(prefix) = bytes.get(offset..offset + LENGTH_PREFIX) else {
                return Err(FramingError::CutLength { index, offset });
            };
            let len = u16::from_be_bytes([prefix[0], prefix[1]]) as usize;
            if len == 0 {
                return Err(FramingError::Empty { index, offset });
            }
            if len > MAX_DATAGRAM {
                return Err(FramingError::TooLong { index, offset, len });
            }
            let left = bytes.len() - offset - LENGTH_PREFIX;
            if len > left {
                return Err(FramingError::Truncated {
                    index,
                    offset,
                    len,
                    left,
                });
            }
            offset += LENGTH_PREFIX + len;
        }
        Ok(Framed {
            bytes,
            count: index,
        })
    }

    /// Frames packets, e.g. a sender's datagrams for a request or the node's for an answer.
    pub fn from_packets<P: AsRef<[u8]>>(
        packets: impl IntoIterator<Item = P>,
    ) -> Result<Self, FramingError> {
        let mut bytes = Vec::new();
        let mut count = 0;
        for p in packets {
            let p = p.as_ref();
            count += 1;
            if p.is_empty() {
                return Err(FramingError::Empty {
                    index: count,
                    offset: bytes.len(),
                });
            }
            if p.len() > MAX_DATAGRAM {
                return Err(FramingError::TooLong {
                    index: count,
                    offset: bytes.len(),
                    len: p.len(),
                });
            }
            // Fits: checked against MAX_DATAGRAM (1600) just above.
            bytes.extend_from_slice(&(p.len() as u16).to_be_bytes());
            bytes.extend_from_slice(p);
        }
        Ok(Framed { bytes, count })
    }

    /// Number of packets.
    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The framed body.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }

    /// The packets, in order.
    pub fn iter(&self) -> Packets<'_> {
        Packets { rest: &self.bytes }
    }
}

/// The packets of a [`Framed`].
#[derive(Debug, Clone)]
pub struct Packets<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for Packets<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        // The body was checked by `parse`/`from_packets`; `get` keeps this total anyway.
        let prefix = self.rest.get(..LENGTH_PREFIX)?;
        let len = u16::from_be_bytes([prefix[0], prefix[1]]) as usize;
        let packet = self.rest.get(LENGTH_PREFIX..LENGTH_PREFIX + len)?;
        self.rest = &self.rest[LENGTH_PREFIX + len..];
        Some(packet)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn round_trip() {
        let packets = [vec![1u8; 96], vec![2u8; MAX_DATAGRAM], vec![3u8]];
        let f = Framed::from_packets(&packets).unwrap();
        assert_eq!(f.len(), 3);
        assert_eq!(f.as_bytes()[..2], [0, 96]);
        let back = Framed::parse(f.clone().into_bytes()).unwrap();
        assert_eq!(back, f);
        let got: Vec<&[u8]> = back.iter().collect();
        assert_eq!(got, packets.iter().map(|p| &p[..]).collect::<Vec<_>>());
        assert!(Framed::parse(Vec::new()).unwrap().is_empty());
    }

    #[test]
    fn every_fault_is_named() {
        assert_eq!(
            Framed::parse(vec![0, 1, 9, 0, 0]),
            Err(FramingError::Empty {
                index: 2,
                offset: 3
            })
        );
        let too_long = (MAX_DATAGRAM as u16 + 1).to_be_bytes().to_vec();
        assert!(matches!(
            Framed::parse(too_long),
            Err(FramingError::TooLong { len: 1601, .. })
        ));
        assert_eq!(
            Framed::parse(vec![0, 5, 1, 2]),
            Err(FramingError::Truncated {
                index: 1,
                offset: 0,
                len: 5,
                left: 2
            })
        );
        assert_eq!(
            Framed::parse(vec![0, 1, 7, 0]),
            Err(FramingError::CutLength {
                index: 2,
                offset: 3
            })
        );
        let why = Framed::parse(vec![0, 0]).unwrap_err().to_string();
        assert!(why.contains("length 0"), "{why}");
        assert!(Framed::from_packets([Vec::<u8>::new()]).is_err());
        assert!(Framed::from_packets([vec![0u8; MAX_DATAGRAM + 1]]).is_err());
    }

    proptest! {
        #[test]
        fn parse_is_total(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
            if let Ok(f) = Framed::parse(bytes.clone()) {
                let total: usize = f.iter().map(|p| p.len() + LENGTH_PREFIX).sum();
                prop_assert_eq!(total, bytes.len());
                prop_assert_eq!(f.iter().count(), f.len());
            }
        }
    }
}
