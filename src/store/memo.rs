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
    conn: Connection,
    path: PathBuf,
    /// Lookup errors are counted, not fatal: a failed lookup only costs an X25519.
    pub lookup_errors: u64,
}

impl Memo {
    pub fn open(path: &Path) -> Result<Self, StoreError> {
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
        Ok(Memo {
            conn,
            path: path.to_path_buf(),
            lookup_errors: 0,
        })
    }

    pub fn put_all(&mut self, secrets: &[(PublicKeyBytes, [u8; 32])]) -> Result<(), StoreError> {
        if secrets.is_empty() {
            return Ok(());
        }
        let path = self.path.clone();
        let sql = |source| StoreError::Sqlite {
            path: path.clone(),
            source,
        };
        let tx = self.conn.transaction().map_err(sql)?;
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
        self.conn
            .query_row("SELECT count(*) FROM secrets", [], |r| r.get::<_, i64>(0))
            .map(|n| n as u64)
            .unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl SecretMemo for Memo {
    fn get(&mut self, sender: &PublicKeyBytes) -> Option<[u8; 32]> {
        let found: Result<Option<Vec<u8>>, _> = self
            .conn
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
