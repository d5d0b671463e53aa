//! The memo of derived secrets: sender public key → X25519 shared secret, on disk.
//!
//! It is what makes "X25519 operations for a known sender after a restart: 0" true (BRIEF.md). It is as sensitive
//! as the node's key file (docs/protocol.md 9), so it is created with mode 0600. Losing it costs only X25519s, so
//! it is written with `synchronous=NORMAL`, batched once per turn.

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use rusqlite::{Connection, OptionalExtension};

use super::StoreError;
use crate::proto::crypto::PublicKeyBytes;
use crate::proto::node::SecretMemo;

pub struct Memo {
    /// `None`: the memo could not be opened (a full or read-only disk); the node runs without it, which costs an
    /// X25519 per new run of a sender and nothing else.
    conn: Option<Connection>,
    /// Its `-shm`, allocated whole at open and kept open after the connection (store/disk.rs, `open_shm`).
    _shm: Option<std::fs::File>,
    path: PathBuf,
    /// Lookup errors are counted, not fatal: a failed lookup only costs an X25519.
    pub lookup_errors: u64,
}

impl Memo {
    /// Opens the memo, or, when the disk under it cannot take it, a memo that remembers nothing (said in the log).
    pub fn open_or_none(path: &Path) -> Self {
        match Self::open(path) {
            Ok(m) => m,
            Err(e) => {
                let why = match &e {
                    StoreError::NoRoom { free, .. } => {
                        format!("{}: {free} bytes free on its filesystem", path.display())
                    }
                    other => other.to_string(),
                };
                tracing::warn!(
                    "running without the memo of derived secrets ({why}): each new run of a sender costs an \
                     X25519 until a restart with room for it"
                );
                Memo {
                    conn: None,
                    _shm: None,
                    path: path.to_path_buf(),
                    lookup_errors: 0,
                }
            }
        }
    }

    pub fn open(path: &Path) -> Result<Self, StoreError> {
        // The same guard as an app's store: SQLite's first mapping of the wal-index must not meet a full disk.
        if let Err((free, wanted)) = super::disk::room_to_open(path) {
            return Err(StoreError::NoRoom {
                path: path.to_path_buf(),
                free,
                wanted,
            });
        }
        // Make the file private before SQLite writes a secret into it.
        OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(path)
            .map_err(|source| StoreError::Io {
                path: path.to_path_buf(),
                source,
            })?;
        let sql = |source| StoreError::Sqlite {
            path: path.to_path_buf(),
            source,
        };
        let conn = Connection::open(path).map_err(sql)?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(sql)?;
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(sql)?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS secrets (public BLOB PRIMARY KEY, shared BLOB NOT NULL) WITHOUT ROWID;",
        )
        .map_err(sql)?;
        let shm = super::disk::open_shm(path)
            .and_then(|f| super::disk::reserve_shm(&f, 4 * super::disk::SHM_REGION).map(|_| f))
            .map_err(|source| StoreError::Shm {
                path: path.to_path_buf(),
                source,
            })?;
        Ok(Memo {
            conn: Some(conn),
            _shm: Some(shm),
            path: path.to_path_buf(),
            lookup_errors: 0,
        })
    }

    pub fn put_all(&mut self, secrets: &[(PublicKeyBytes, [u8; 32])]) -> Result<(), StoreError> {
        let Some(conn) = &mut self.conn else {
            return Ok(());
        };
        if secrets.is_empty() {
            return Ok(());
        }
        let path = self.path.clone();
        let sql = |source| StoreError::Sqlite {
            path: path.clone(),
            source,
        };
        let tx = conn.transaction().map_err(sql)?;
        {
            let mut put = tx
                .prepare_cached("INSERT OR REPLACE INTO secrets (public, shared) VALUES (?1, ?2)")
                .map_err(sql)?;
            for (public, shared) in secrets {
                put.execute((&public[..], &shared[..])).map_err(sql)?;
            }
        }
        tx.commit().map_err(sql)
    }

    pub fn len(&self) -> u64 {
        let Some(conn) = &self.conn else { return 0 };
        conn.query_row("SELECT count(*) FROM secrets", [], |r| r.get::<_, i64>(0))
            .map(|n| n as u64)
            .unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl SecretMemo for Memo {
    fn get(&mut self, sender: &PublicKeyBytes) -> Option<[u8; 32]> {
        let conn = self.conn.as_ref()?;
        let found: Result<Option<Vec<u8>>, _> = conn
            .prepare_cached("SELECT shared FROM secrets WHERE public = ?1")
            .and_then(|mut s| s.query_row([&sender[..]], |r| r.get(0)).optional());
        match found {
            Ok(Some(bytes)) => bytes.as_slice().try_into().ok(),
            Ok(None) => None,
            Err(_) => {
                self.lookup_errors += 1;
                None
            }
        }
    }
}
