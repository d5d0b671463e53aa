//! Key agreement, key derivation and packet sealing (docs/protocol.md sections 1–3).
//!
//! State holds key *bytes*, never cipher contexts: an AES-128 key schedule is made per packet (about 0.1 µs here),
//! which keeps a session small and keeps long-lived allocations out of the heap (BRIEF.md, lessons).

use aes_gcm::aead::AeadInOut;
use aes_gcm::{Aes128Gcm, KeyInit, Nonce, Tag};
use hkdf::Hkdf;
use sha2::Sha256;
use thiserror::Error;
use x25519_dalek::{PublicKey, StaticSecret};

use crate::buf::Out;
use crate::wire::TAG_LEN;

pub type PublicKeyBytes = [u8; 32];
/// A 16-byte AES-128-GCM key.
pub type PacketKey = [u8; 16];

#[derive(Debug, Error, PartialEq, Eq)]
pub enum CryptoError {
    #[error("the shared secret is all zeros (a low-order public key)")]
    NotContributory,
    #[error("packet failed authentication")]
    Auth,
    #[error("packet too short for a tag")]
    Short,
}

const HKDF_SALT: &[u8] = b"pure-serve link v1";

/// The key id of a public key: its first four bytes, big-endian (protocol.md 1).
pub fn key_id(public: &PublicKeyBytes) -> u32 {
    u32::from_be_bytes([public[0], public[1], public[2], public[3]])
}

/// The low-order points of Curve25519 and its twist (order dividing 8), as 32-byte little-endian u-coordinates
/// with the top bit clear (X25519 ignores that bit, RFC 7748 5): 0, 1, the two points of order 8, p − 1, and the
/// non-canonical p and p + 1. X25519 of any private key with one of these is all zeros, so no key pair has
/// such a public key, and a listed one would cost an X25519 per packet that can never succeed (protocol.md 2).
/// This is the list libsodium and others check against.
const LOW_ORDER: [[u8; 32]; 7] = [
    [0; 32],
    [
        1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        0, 0,
    ],
    [
        0xe0, 0xeb, 0x7a, 0x7c, 0x3b, 0x41, 0xb8, 0xae, 0x16, 0x56, 0xe3, 0xfa, 0xf1, 0x9f, 0xc4,
        0x6a, 0xda, 0x09, 0x8d, 0xeb, 0x9c, 0x32, 0xb1, 0xfd, 0x86, 0x62, 0x05, 0x16, 0x5f, 0x49,
        0xb8, 0x00,
    ],
    [
        0x5f, 0x9c, 0x95, 0xbc, 0xa3, 0x50, 0x8c, 0x24, 0xb1, 0xd0, 0xb1, 0x55, 0x9c, 0x83, 0xef,
        0x5b, 0x04, 0x44, 0x5c, 0xc4, 0x58, 0x1c, 0x8e, 0x86, 0xd8, 0x22, 0x4e, 0xdd, 0xd0, 0x9f,
        0x11, 0x57,
    ],
    [
        0xec, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
        0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
        0xff, 0x7f,
    ],
    [
        0xed, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
        0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
        0xff, 0x7f,
    ],
    [
        0xee, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
        0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
        0xff, 0x7f,
    ],
];

/// Whether `public` is a low-order point (see [`LOW_ORDER`]): a few byte comparisons, no X25519, so a senders
/// file of a million keys is checked in milliseconds. The first bytes of the seven points differ, so most keys are
/// told apart by one byte each (whole comparisons were 3–6 % of a start with a million senders, research/027).
pub fn is_low_order(public: &PublicKeyBytes) -> bool {
    let mut u = *public;
    u[31] &= 0x7f;
    LOW_ORDER.iter().any(|p| p[0] == u[0] && *p == u)
}

/// A static X25519 identity.
#[derive(Clone)]
pub struct Identity {
    secret: StaticSecret,
    public: PublicKeyBytes,
}

/// Shows the public key only: a private key never reaches a log line.
impl core::fmt::Debug for Identity {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Identity")
            .field("public", &self.public)
            .finish_non_exhaustive()
    }
}

impl Identity {
    pub fn from_secret_bytes(bytes: [u8; 32]) -> Self {
        let secret = StaticSecret::from(bytes);
        let public = PublicKey::from(&secret).to_bytes();
        Identity { secret, public }
    }
    /// A new identity from the operating system's random generator.
    #[cfg(feature = "std")]
    pub fn generate() -> Self {
        Self::from_secret_bytes(random_array())
    }
    pub fn public(&self) -> &PublicKeyBytes {
        &self.public
    }
    pub fn secret_bytes(&self) -> [u8; 32] {
        self.secret.to_bytes()
    }
    /// One X25519: the shared secret with `peer` (protocol.md 2).
    pub fn shared_secret(&self, peer: &PublicKeyBytes) -> Result<[u8; 32], CryptoError> {
        let shared = self.secret.diffie_hellman(&PublicKey::from(*peer));
        if !shared.was_contributory() {
            return Err(CryptoError::NotContributory);
        }
        Ok(shared.to_bytes())
    }
}

/// Random bytes from the operating system. Failure of the OS generator is not recoverable for a cryptographic
/// daemon, so it aborts with a clear message rather than continuing with weak randomness. A device without an
/// operating system draws its randomness itself (docs/devices.md).
#[cfg(feature = "std")]
pub fn random_array<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    getrandom::fill(&mut b).expect("the operating system's random generator failed");
    b
}

fn prk(shared: &[u8; 32]) -> Hkdf<Sha256> {
    Hkdf::<Sha256>::new(Some(HKDF_SALT), shared)
}

/// `k_s2n` for a run (protocol.md 2).
pub fn sender_to_node_key(
    shared: &[u8; 32],
    run_id: u64,
    sender: &PublicKeyBytes,
    node: &PublicKeyBytes,
) -> PacketKey {
    let mut key = [0u8; 16];
    prk(shared)
        .expand_multi_info(&[b"s2n", &run_id.to_be_bytes(), sender, node], &mut key)
        .expect("16 bytes is a valid HKDF-SHA256 output length");
    key
}

/// `k_n2s` for a run under a node epoch (protocol.md 2).
pub fn node_to_sender_key(
    shared: &[u8; 32],
    run_id: u64,
    epoch: u64,
    sender: &PublicKeyBytes,
    node: &PublicKeyBytes,
) -> PacketKey {
    let mut key = [0u8; 16];
    prk(shared)
        .expand_multi_info(
            &[
                b"n2s",
                &run_id.to_be_bytes(),
                &epoch.to_be_bytes(),
                sender,
                node,
            ],
            &mut key,
        )
        .expect("16 bytes is a valid HKDF-SHA256 output length");
    key
}

fn nonce(packet_number: u64) -> Nonce<aes_gcm::aead::consts::U12> {
    let mut n = [0u8; 12];
    n[4..].copy_from_slice(&packet_number.to_be_bytes());
    n.into()
}

/// Encrypts `packet[header_len..]` in place and appends the tag. The header is the associated data.
pub fn seal(
    key: &PacketKey,
    packet_number: u64,
    packet: &mut (impl Out + ?Sized),
    header_len: usize,
) {
    seal_from(key, packet_number, packet, 0, header_len)
}

/// [`seal`] for a packet that begins at `from` in `packet` (after a cookie prefix, which is not sealed).
pub fn seal_from(
    key: &PacketKey,
    packet_number: u64,
    packet: &mut (impl Out + ?Sized),
    from: usize,
    header_len: usize,
) {
    let cipher = Aes128Gcm::new(key.into());
    let (header, body) = packet.written_mut()[from..].split_at_mut(header_len);
    let tag = cipher
        .encrypt_inout_detached(&nonce(packet_number), header, body.into())
        .expect("packets are far below AES-GCM's length limit");
    packet.extend_from_slice(tag.as_slice());
}

/// Checks and decrypts a packet in place; on success returns the plaintext's length (it starts at `header_len`).
/// On failure the buffer's body is garbage and must not be used.
pub fn open(
    key: &PacketKey,
    packet_number: u64,
    packet: &mut [u8],
    header_len: usize,
) -> Result<usize, CryptoError> {
    let body_len = packet
        .len()
        .checked_sub(header_len + TAG_LEN)
        .ok_or(CryptoError::Short)?;
    let cipher = Aes128Gcm::new(key.into());
    let (header, rest) = packet.split_at_mut(header_len);
    let (body, tag) = rest.split_at_mut(body_len);
    let tag = Tag::try_from(&*tag).map_err(|_| CryptoError::Short)?;
    cipher
        .decrypt_inout_detached(&nonce(packet_number), header, body.into(), &tag)
        .map_err(|_| CryptoError::Auth)?;
    Ok(body_len)
}

/// Like [`open`] but on a copy, so a failed attempt leaves `packet` intact for the next candidate key.
#[cfg(feature = "alloc")]
pub fn open_copy(
    key: &PacketKey,
    packet_number: u64,
    packet: &[u8],
    header_len: usize,
    scratch: &mut alloc::vec::Vec<u8>,
) -> Result<usize, CryptoError> {
    scratch.clear();
    scratch.extend_from_slice(packet);
    open(key, packet_number, scratch, header_len)
}

#[cfg(all(test, feature = "std"))]
mod tests {
    use super::*;

    #[test]
    fn both_sides_derive_the_same_keys() {
        let s = Identity::generate();
        let n = Identity::generate();
        let a = s.shared_secret(n.public()).unwrap();
        let b = n.shared_secret(s.public()).unwrap();
        assert_eq!(a, b);
        assert_eq!(
            sender_to_node_key(&a, 9, s.public(), n.public()),
            sender_to_node_key(&b, 9, s.public(), n.public())
        );
        assert_ne!(
            sender_to_node_key(&a, 9, s.public(), n.public()),
            sender_to_node_key(&a, 10, s.public(), n.public())
        );
        assert_ne!(
            node_to_sender_key(&a, 9, 1, s.public(), n.public()),
            node_to_sender_key(&a, 9, 2, s.public(), n.public())
        );
    }

    #[test]
    fn low_order_keys_are_refused() {
        let n = Identity::generate();
        assert_eq!(
            n.shared_secret(&[0u8; 32]),
            Err(CryptoError::NotContributory)
        );
    }

    #[test]
    fn the_low_order_list_is_what_x25519_finds_and_real_keys_are_not_on_it() {
        let n = Identity::generate();
        for point in LOW_ORDER {
            for top in [0, 0x80] {
                let mut p = point;
                p[31] |= top;
                assert!(is_low_order(&p), "{p:02x?}");
                assert_eq!(
                    n.shared_secret(&p),
                    Err(CryptoError::NotContributory),
                    "X25519 gives zeros with {p:02x?}"
                );
            }
        }
        for _ in 0..64 {
            let real = Identity::generate();
            assert!(!is_low_order(real.public()));
            assert!(n.shared_secret(real.public()).is_ok());
        }
        // Neighbours of the listed points are ordinary keys.
        let mut near = LOW_ORDER[2];
        near[0] ^= 1;
        assert!(!is_low_order(&near));
    }

    #[test]
    fn seal_open_round_trip_and_tamper() {
        let key = [7u8; 16];
        let mut p = b"HEADERbody bytes".to_vec();
        seal(&key, 5, &mut p, 6);
        let mut q = p.clone();
        let n = open(&key, 5, &mut q, 6).unwrap();
        assert_eq!(&q[6..6 + n], b"body bytes");
        assert_eq!(open(&key, 6, &mut p.clone(), 6), Err(CryptoError::Auth));
        p[0] ^= 1;
        assert_eq!(open(&key, 5, &mut p, 6), Err(CryptoError::Auth));
    }
}
