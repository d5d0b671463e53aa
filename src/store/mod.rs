//! The stores: one SQLite file per app holding its records and heard sequences, and the memo of derived secrets.
//!
//! Layout (docs/store.md has the why): records are kept as **chunks** — one row per run of consecutive records of
//! one source applied in one turn, the records in their wire encoding — because a row per record cannot reach a
//! million records per second (research/001). A source's heard sequence sits in its row of `sources` and is
//! updated in the same transaction as the chunk it covers, so a failed commit rolls both back and a record is
//! stored exactly once.

pub mod memo;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use rusqlite::{Connection, OptionalExtension, params};
use thiserror::Error;

use crate::proto::allow_list::{AllowList, SenderIndex};
use crate::proto::turn::{AppIndex, Committed, FlowHeard, Turn};
use crate::proto::wire::RecordIter;

#[derive(Debug, Error)]
pub enum StoreError {
    #[error("store {path}: {source}")]
    Sqlite {
        path: PathBuf,
        source: rusqlite::Error,
    },
    #[error("cannot create {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("store {path} holds a malformed chunk for source {source_name} at sequence {seq}")]
    Corrupt {
        path: PathBuf,
        source_name: String,
        seq: u64,
    },
    #[error("no store for app {app} in {dir} (stores there: {known})")]
    NoSuchApp {
        app: String,
        dir: PathBuf,
        known: String,
    },
}

/// Sequences are SQLite integers (signed 64-bit); above this a flow can go no further.
const MAX_SEQ: u64 = i64::MAX as u64;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS sources (
    id    INTEGER PRIMARY KEY,
    name  TEXT NOT NULL UNIQUE,
    heard INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS chunks (
    source    INTEGER NOT NULL REFERENCES sources(id),
    first_seq INTEGER NOT NULL,
    count     INTEGER NOT NULL,
    body      BLOB NOT NULL,
    PRIMARY KEY (source, first_seq)
);
PRAGMA user_version = 1;
";

/// Path of an app's store under the state directory.
pub fn app_store_path(state_dir: &Path, app: &str) -> PathBuf {
    state_dir.join("apps").join(format!("{app}.sqlite"))
}

/// One app's store.
pub struct AppStore {
    conn: Connection,
    path: PathBuf,
}

/// One stored record, as read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredRecord {
    pub source: String,
    pub seq: u64,
    pub payload: Vec<u8>,
}

#[derive(Debug, Default, Clone, Copy)]
struct FlowOutcome {
    stored: u64,
    duplicate: u64,
    gap: u64,
}

impl AppStore {
    /// Opens (creating if needed) an app's store for writing: WAL, and `synchronous=FULL` so a commit is on disk
    /// before the node acks it.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|source| StoreError::Io {
                path: dir.to_path_buf(),
                source,
            })?;
        }
        let sql = |source| StoreError::Sqlite {
            path: path.to_path_buf(),
            source,
        };
        let conn = Connection::open(path).map_err(sql)?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(sql)?;
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(sql)?;
        conn.execute_batch(SCHEMA).map_err(sql)?;
        Ok(AppStore {
            conn,
            path: path.to_path_buf(),
        })
    }

    /// An app store in memory: the same schema and code path, for the simulated-network tests.
    pub fn open_in_memory(label: &str) -> Result<Self, StoreError> {
        let path = PathBuf::from(format!(":memory:{label}"));
        let conn = Connection::open_in_memory().map_err(|source| StoreError::Sqlite {
            path: path.clone(),
            source,
        })?;
        conn.execute_batch(SCHEMA)
            .map_err(|source| StoreError::Sqlite {
                path: path.clone(),
                source,
            })?;
        Ok(AppStore { conn, path })
    }

    /// Opens an existing store to read (the node may be writing it at the same time; WAL allows that).
    pub fn open_read(path: &Path) -> Result<Self, StoreError> {
        let conn = Connection::open_with_flags(
            path,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(|source| StoreError::Sqlite {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(AppStore {
            conn,
            path: path.to_path_buf(),
        })
    }

    fn err(&self) -> impl Fn(rusqlite::Error) -> StoreError + '_ {
        move |source| StoreError::Sqlite {
            path: self.path.clone(),
            source,
        }
    }

    /// Applies the items of `app` in `turn` in one transaction and commits (docs/protocol.md 5.2).
    fn apply(
        &mut self,
        turn: &Turn,
        app: AppIndex,
        senders: &AllowList,
        heard_out: &mut Vec<FlowHeard>,
        totals: &mut FlowOutcome,
    ) -> Result<(), StoreError> {
        let mut items: Vec<usize> = (0..turn.items.len())
            .filter(|&i| turn.items[i].app == app)
            .collect();
        if items.is_empty() {
            return Ok(());
        }
        // Sorting a flow's frames by first_seq makes reordering within a turn free (protocol.md 5.2, 3).
        items.sort_by_key(|&i| (turn.items[i].sender, turn.items[i].first_seq));
        let path = self.path.clone();
        let sql = |source| StoreError::Sqlite {
            path: path.clone(),
            source,
        };
        let tx = self.conn.transaction().map_err(sql)?;
        {
            let mut find = tx
                .prepare_cached("SELECT id, heard FROM sources WHERE name = ?1")
                .map_err(sql)?;
            let mut add = tx
                .prepare_cached("INSERT INTO sources (name, heard) VALUES (?1, ?2)")
                .map_err(sql)?;
            let mut put = tx
                .prepare_cached(
                    "INSERT INTO chunks (source, first_seq, count, body) VALUES (?1, ?2, ?3, ?4)",
                )
                .map_err(sql)?;
            let mut set_heard = tx
                .prepare_cached("UPDATE sources SET heard = ?2 WHERE id = ?1")
                .map_err(sql)?;
            let mut body: Vec<u8> = Vec::new();
            let mut start = 0;
            while start < items.len() {
                let sender: SenderIndex = turn.items[items[start]].sender;
                let mut end = start;
                while end < items.len() && turn.items[items[end]].sender == sender {
                    end += 1;
                }
                let name = senders.name(sender);
                let found: Option<(i64, i64)> = find
                    .query_row([name], |r| Ok((r.get(0)?, r.get(1)?)))
                    .optional()
                    .map_err(sql)?;
                // A new source gets its row only when it has something stored, written once with its heard
                // sequence: a new sender costs one insert here, not an insert and an update (research/001).
                let (id, heard_before) = match found {
                    Some((id, heard)) => (Some(id), heard as u64),
                    None => (None, 0),
                };
                let mut heard = heard_before;
                let mut out = FlowOutcome::default();
                body.clear();
                for &i in &items[start..end] {
                    let item = &turn.items[i];
                    if item.count == 0 {
                        continue;
                    }
                    // Never first_seq + count - 1: the last sequence may be 2^64 - 1 (protocol.md 5.1).
                    let last = item.first_seq + (item.count - 1);
                    if last <= heard {
                        out.duplicate += item.count;
                        continue;
                    }
                    if item.first_seq > heard + 1 || last > MAX_SEQ {
                        out.gap += item.count;
                        continue;
                    }
                    let skip = heard + 1 - item.first_seq;
                    out.duplicate += skip;
                    let records = turn.records_of(item);
                    let mut it = RecordIter::new(records);
                    for _ in 0..skip {
                        it.next();
                    }
                    body.extend_from_slice(&records[it.position()..]);
                    out.stored += last - heard;
                    heard = last;
                }
                if heard > heard_before {
                    let id = match id {
                        Some(id) => {
                            set_heard.execute(params![id, heard as i64]).map_err(sql)?;
                            id
                        }
                        None => {
                            add.execute(params![name, heard as i64]).map_err(sql)?;
                            tx.last_insert_rowid()
                        }
                    };
                    put.execute(params![
                        id,
                        (heard_before + 1) as i64,
                        (heard - heard_before) as i64,
                        &body
                    ])
                    .map_err(sql)?;
                }
                heard_out.push(FlowHeard { sender, app, heard });
                totals.stored += out.stored;
                totals.duplicate += out.duplicate;
                totals.gap += out.gap;
                start = end;
            }
        }
        tx.commit().map_err(sql)?;
        Ok(())
    }

    /// Heard sequence of every source, by name.
    pub fn heard(&self) -> Result<HashMap<String, u64>, StoreError> {
        let mut stmt = self
            .conn
            .prepare("SELECT name, heard FROM sources")
            .map_err(self.err())?;
        let rows = stmt
            .query_map([], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)? as u64))
            })
            .map_err(self.err())?;
        rows.collect::<Result<_, _>>().map_err(self.err())
    }

    /// Calls `each` for every stored record (of one source, if given), ordered by source then sequence.
    pub fn for_each_record(
        &self,
        source: Option<&str>,
        mut each: impl FnMut(&str, u64, &[u8]) -> bool,
    ) -> Result<(), StoreError> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT s.name, c.first_seq, c.count, c.body FROM chunks c JOIN sources s ON s.id = c.source
                 WHERE ?1 IS NULL OR s.name = ?1 ORDER BY s.name, c.first_seq",
            )
            .map_err(self.err())?;
        let mut rows = stmt.query([source]).map_err(self.err())?;
        while let Some(row) = rows.next().map_err(self.err())? {
            let name: String = row.get(0).map_err(self.err())?;
            let first: i64 = row.get(1).map_err(self.err())?;
            let count: i64 = row.get(2).map_err(self.err())?;
            let body = row.get_ref(3).map_err(self.err())?.as_blob().unwrap_or(&[]);
            let mut it = RecordIter::new(body);
            let mut seq = first as u64;
            let mut n = 0;
            for payload in it.by_ref() {
                if !each(&name, seq, payload) {
                    return Ok(());
                }
                seq += 1;
                n += 1;
            }
            if !it.is_clean() || n != count {
                return Err(StoreError::Corrupt {
                    path: self.path.clone(),
                    source_name: name,
                    seq,
                });
            }
        }
        Ok(())
    }
}

/// The stores of all apps of a node, by app index.
pub struct Stores {
    apps: Vec<AppStore>,
}

impl Stores {
    pub fn open(state_dir: &Path, apps: &[String]) -> Result<Self, StoreError> {
        let apps = apps
            .iter()
            .map(|a| AppStore::open(&app_store_path(state_dir, a)))
            .collect::<Result<_, _>>()?;
        Ok(Stores { apps })
    }

    /// In-memory stores for `apps` (tests).
    pub fn open_in_memory(apps: &[String]) -> Result<Self, StoreError> {
        let apps = apps
            .iter()
            .map(|a| AppStore::open_in_memory(a))
            .collect::<Result<_, _>>()?;
        Ok(Stores { apps })
    }

    /// The store of one app.
    pub fn app(&self, app: AppIndex) -> Option<&AppStore> {
        self.apps.get(app as usize)
    }

    /// Applies a turn: one transaction per app it touches. On error the failing app's transaction is rolled back;
    /// the caller must treat the whole turn as not acknowledged.
    pub fn apply_turn(
        &mut self,
        turn: &Turn,
        senders: &AllowList,
    ) -> Result<Committed, StoreError> {
        let mut committed = Committed {
            turn: turn.id,
            ..Committed::default()
        };
        let mut totals = FlowOutcome::default();
        for (i, store) in self.apps.iter_mut().enumerate() {
            store.apply(
                turn,
                i as AppIndex,
                senders,
                &mut committed.heard,
                &mut totals,
            )?;
        }
        committed.stored_records = totals.stored;
        committed.duplicate_records = totals.duplicate;
        committed.gap_records = totals.gap;
        Ok(committed)
    }
}

/// Opens the store of `app` under `state_dir` to read, with a helpful error if there is none.
pub fn open_app_for_reading(state_dir: &Path, app: &str) -> Result<AppStore, StoreError> {
    let path = app_store_path(state_dir, app);
    if !path.exists() {
        return Err(StoreError::NoSuchApp {
            app: app.to_string(),
            dir: state_dir.join("apps"),
            known: list_apps(state_dir).join(", "),
        });
    }
    AppStore::open_read(&path)
}

/// Names of the apps that have a store under `state_dir`, sorted.
pub fn list_apps(state_dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(state_dir.join("apps"))
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| {
                    e.file_name()
                        .to_str()
                        .and_then(|n| n.strip_suffix(".sqlite"))
                        .map(str::to_string)
                })
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::turn::Apply;
    use crate::proto::wire::put_record;

    fn list() -> AllowList {
        AllowList::from_unique(vec![("a".into(), [1; 32]), ("b".into(), [2; 32])])
    }

    /// A turn of frames (sender, first_seq, count); record `s` has payload "s".
    fn turn(id: u64, frames: &[(SenderIndex, u64, u64)]) -> Turn {
        let mut t = Turn {
            id,
            ..Turn::default()
        };
        for &(sender, first_seq, count) in frames {
            let start = t.arena.len();
            for s in (0..count).map(|k| first_seq + k) {
                put_record(&mut t.arena, s.to_string().as_bytes());
            }
            t.items.push(Apply {
                session: 0,
                sender,
                app: 0,
                first_seq,
                count,
                records: start..t.arena.len(),
            });
            t.record_count += count;
        }
        t
    }

    fn stored(stores: &Stores) -> Vec<(String, u64, String)> {
        let mut v = Vec::new();
        stores
            .app(0)
            .unwrap()
            .for_each_record(None, |s, seq, p| {
                v.push((s.to_string(), seq, String::from_utf8(p.to_vec()).unwrap()));
                true
            })
            .unwrap();
        v
    }

    #[test]
    fn overlaps_gaps_and_reordering_store_each_record_once() {
        let senders = list();
        let mut stores = Stores::open_in_memory(&["main".into()]).unwrap();
        // Out of order within the turn (sorted before applying), a probe, and a gap for b.
        let c = stores
            .apply_turn(
                &turn(1, &[(0, 4, 3), (0, 1, 3), (1, 0, 0), (1, 5, 2)]),
                &senders,
            )
            .unwrap();
        assert_eq!(
            (c.stored_records, c.duplicate_records, c.gap_records),
            (6, 0, 2)
        );
        assert!(c.heard.contains(&FlowHeard {
            sender: 0,
            app: 0,
            heard: 6
        }));
        assert!(c.heard.contains(&FlowHeard {
            sender: 1,
            app: 0,
            heard: 0
        }));
        // A frame that overlaps what is stored: only its new tail is stored.
        let c = stores
            .apply_turn(&turn(2, &[(0, 5, 4), (0, 1, 2)]), &senders)
            .unwrap();
        assert_eq!(
            (c.stored_records, c.duplicate_records, c.gap_records),
            (2, 4, 0)
        );
        let got = stored(&stores);
        let want: Vec<_> = (1..=8)
            .map(|s| ("a".to_string(), s, s.to_string()))
            .collect();
        assert_eq!(got, want);
        assert_eq!(stores.app(0).unwrap().heard().unwrap()["a"], 8);
    }

    #[test]
    fn sequences_past_the_signed_range_are_a_gap_up_to_the_largest_u64() {
        let senders = list();
        let mut stores = Stores::open_in_memory(&["main".into()]).unwrap();
        let c = stores
            .apply_turn(
                &turn(1, &[(0, 1, 2), (0, u64::MAX, 1), (0, u64::MAX - 1, 2)]),
                &senders,
            )
            .unwrap();
        assert_eq!(
            (c.stored_records, c.duplicate_records, c.gap_records),
            (2, 0, 3)
        );
        assert_eq!(stores.app(0).unwrap().heard().unwrap()["a"], 2);
    }
}
