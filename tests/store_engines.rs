//! The store interface (`pure_serve::store::engine::TurnStore`) and the engines behind it, for real: SQLite files
//! in a temp dir synced by the `pure-sync` thread, and a PostgreSQL 15 cluster made for the test (`pg_util`;
//! skipped, saying how to run it, on a machine without PostgreSQL). Every engine runs the same turns and must give
//! the same outcomes (docs/store.md, "The invariants"; docs/scale-out.md); two PostgreSQL engines racing on one
//! sender's records must store each exactly once.

mod pg_util;

use pure_serve::proto::wire::RecordFormat;
use pure_serve::store::Applied;
use pure_serve::store::engine::{AppTurn, OwnedPiece, TurnOutcome, TurnStore};

/// `count` records from `first`, each the payload `r{seq}` behind its one-byte length (the wire's varint).
fn piece(source: &str, first: u64, count: u64) -> OwnedPiece {
    let mut records = Vec::new();
    for seq in first..first + count {
        let payload = format!("r{seq}");
        records.push(payload.len() as u8);
        records.extend_from_slice(payload.as_bytes());
    }
    OwnedPiece {
        source: source.into(),
        first_seq: first,
        count,
        format: RecordFormat::Plain,
        records,
    }
}

fn turn(app: u16, pieces: Vec<OwnedPiece>) -> AppTurn {
    AppTurn {
        app,
        pieces,
        outlets: Vec::new(),
        keep_new: true,
    }
}

/// Submits one turn and waits for its outcome; the one app part's result.
fn apply(store: &mut dyn TurnStore, seq: u64, part: AppTurn) -> Applied {
    store.submit(seq, vec![part]);
    let mut done: Vec<TurnOutcome> = Vec::new();
    while done.is_empty() {
        done = store.wait_done();
    }
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].seq, seq);
    let (_, result) = done.remove(0).apps.remove(0);
    result.expect("the turn is applied")
}

/// The same turns for every engine, and what each must say about them.
fn same_outcomes(store: &mut dyn TurnStore) {
    assert_eq!(store.head(0).unwrap(), 1, "an empty app's head");
    let a = apply(store, 1, turn(0, vec![piece("dev", 1, 5)]));
    assert_eq!((a.stored, a.duplicate, a.gap), (5, 0, 0));
    assert_eq!(a.heard, vec![("dev".to_string(), 5)]);
    assert_eq!(a.new_chunks.len(), 1);
    assert_eq!(
        (
            a.new_chunks[0].pos,
            a.new_chunks[0].first_seq,
            a.new_chunks[0].count
        ),
        (1, 1, 5)
    );
    // Out of order within a turn, overlapping what is stored, and a frame past a gap.
    let a = apply(
        store,
        2,
        turn(
            0,
            vec![
                piece("dev", 12, 2),
                piece("dev", 3, 6),
                piece("other", 1, 2),
            ],
        ),
    );
    assert_eq!((a.stored, a.duplicate, a.gap), (5, 3, 2));
    assert_eq!(
        a.heard,
        vec![("dev".to_string(), 8), ("other".to_string(), 2)]
    );
    let got: Vec<(String, u64, u64, u64)> = a
        .new_chunks
        .iter()
        .map(|c| (c.source.clone(), c.pos, c.first_seq, c.count))
        .collect();
    assert_eq!(
        got,
        vec![("dev".into(), 6, 6, 3), ("other".into(), 9, 1, 2)],
        "chunks at the next positions, in the sources' order"
    );
    let records: Vec<Vec<u8>> = a.new_chunks[0].records().map(<[u8]>::to_vec).collect();
    assert_eq!(
        records,
        vec![b"r6".to_vec(), b"r7".to_vec(), b"r8".to_vec()]
    );
    // Nothing new: a turn of duplicates stores nothing and says the heard sequence.
    let a = apply(store, 3, turn(0, vec![piece("dev", 1, 8)]));
    assert_eq!((a.stored, a.duplicate, a.gap), (0, 8, 0));
    assert_eq!(a.heard, vec![("dev".to_string(), 8)]);
    assert!(a.new_chunks.is_empty());
    assert_eq!(store.heard_of(0, "dev").unwrap(), 8);
    assert_eq!(store.heard_of(0, "other").unwrap(), 2);
    assert_eq!(store.heard_of(0, "nobody").unwrap(), 0);
    assert_eq!(store.head(0).unwrap(), 11);
    // A second app is its own: its own positions and flows.
    let a = apply(store, 4, turn(1, vec![piece("dev", 1, 1)]));
    assert_eq!((a.stored, a.new_chunks[0].pos), (1, 1));
    assert_eq!(store.heard_of(1, "dev").unwrap(), 1);
    assert_eq!(store.head(1).unwrap(), 2);
    assert_eq!(store.waiting(), 0);
}

#[test]
fn sqlite_engine_gives_the_outcomes_after_the_sync() {
    let dir = tempfile::tempdir().unwrap();
    let apps = vec!["a".to_string(), "b".to_string()];
    let stores = pure_serve::store::Stores::open(dir.path(), &apps).unwrap();
    let syncer = pure_serve::store::sync::Syncer::start().unwrap();
    let mut engine = pure_serve::store::sqlite_engine::SqliteTurns::new(stores, Some(syncer));
    assert!(engine.wake_fd().is_some());
    same_outcomes(&mut engine);
}

#[test]
fn sqlite_engine_in_memory_gives_outcomes_at_once() {
    let apps = vec!["a".to_string(), "b".to_string()];
    let stores = pure_serve::store::Stores::open_in_memory(&apps).unwrap();
    let mut engine = pure_serve::store::sqlite_engine::SqliteTurns::new(stores, None);
    assert!(engine.wake_fd().is_none());
    same_outcomes(&mut engine);
}
