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

use super::wire::TAG_LEN;

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

/// A static X25519 identity.
#[derive(Clone)]
pub struct Identity {
    secret: StaticSecret,
    public: PublicKeyBytes,
}

/// Shows the public key only: a private key never reaches a log line.
impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
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
/// daemon, so it aborts with a clear message rather than continuing with weak randomness.
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
pub fn seal(key: &PacketKey, packet_number: u64, packet: &mut Vec<u8>, header_len: usize) {
    let cipher = Aes128Gcm::new(key.into());
    let (header, body) = packet.split_at_mut(header_len);
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
pub fn open_copy(
    key: &PacketKey,
    packet_number: u64,
    packet: &[u8],
    header_len: usize,
    scratch: &mut Vec<u8>,
) -> Result<usize, CryptoError> {
    scratch.clear();
    scratch.extend_from_slice(packet);
    open(key, packet_number, scratch, header_len)
}

#[cfg(test)]
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
