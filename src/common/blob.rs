//! A file pushed to many senders as pieces (docs/downlink.md, "Pushing a file"): the HTTP thread reads it, the app
//! host hands it to the store with each sender's push, and the store writes it once per app. Here on the floor
//! because all three pass it along.

use thiserror::Error;

/// The largest piece: a piece is a downlink record, at most 1024 bytes (docs/protocol.md 12.2; the store asserts
/// that this is its record limit).
pub const MAX_PIECE: usize = 1024;

/// The most bytes a file pushed as pieces may have (docs/downlink.md, "Pushing a file"): read whole by the pusher,
/// held whole by the node while its push is applied, stored once per app.
pub const MAX_BLOB: usize = 64 << 20;

/// A file pushed to many senders as a run of downlink records, its **pieces** (docs/downlink.md, "Pushing a file"):
/// piece `k` is `bytes[k * piece_len ..]`, at most `piece_len` bytes (the last may be shorter). Stored once per app
/// (`down_blobs`) however many senders it is pushed to; each sender's waiting pieces are a row of `down_ranges`.
/// The pushes of one request share one `DownBlob` (an `Arc`), so that a request whose senders are applied in
/// several turns stores it once: the first transaction that queues it writes it, and the later ones find it by the
/// id kept here once that transaction committed.
#[derive(Debug)]
pub struct DownBlob {
    bytes: Vec<u8>,
    piece_len: usize,
    /// Its id in the app's store, once a committed transaction wrote it (ids are never given twice:
    /// `AUTOINCREMENT`, PostgreSQL's identity). A store that deleted it since (its last range delivered) writes it
    /// again.
    stored: std::sync::Mutex<Option<i64>>,
}

/// Why a file cannot be pushed as pieces.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum BlobError {
    #[error("the file is empty: there is nothing to push")]
    Empty,
    #[error(
        "the file is {len} bytes, above the {MAX_BLOB} bytes (64 MiB) a file pushed as pieces may have"
    )]
    TooLarge { len: usize },
    #[error("a piece size of {0} bytes is not 1–{MAX_PIECE} (the downlink's record limit)")]
    PieceSize(usize),
}

impl DownBlob {
    /// `bytes` in pieces of `piece_len` bytes (1–[`MAX_PIECE`]); not empty, at most [`MAX_BLOB`].
    pub fn new(bytes: Vec<u8>, piece_len: usize) -> Result<Self, BlobError> {
        if piece_len == 0 || piece_len > MAX_PIECE {
            return Err(BlobError::PieceSize(piece_len));
        }
        if bytes.is_empty() {
            return Err(BlobError::Empty);
        }
        if bytes.len() > MAX_BLOB {
            return Err(BlobError::TooLarge { len: bytes.len() });
        }
        Ok(DownBlob {
            bytes,
            piece_len,
            stored: std::sync::Mutex::new(None),
        })
    }

    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    pub fn piece_len(&self) -> usize {
        self.piece_len
    }

    /// How many pieces it is in.
    pub fn pieces(&self) -> u64 {
        self.bytes.len().div_ceil(self.piece_len) as u64
    }

    /// Its id in the store, if a committed transaction wrote it.
    pub fn stored(&self) -> Option<i64> {
        *self
            .stored
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Keeps its id once the transaction that wrote it committed.
    pub fn set_stored(&self, id: i64) {
        *self
            .stored
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(id);
    }
}

impl PartialEq for DownBlob {
    fn eq(&self, other: &Self) -> bool {
        self.piece_len == other.piece_len && self.bytes == other.bytes
    }
}

impl Eq for DownBlob {}
