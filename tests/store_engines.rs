//! The store interface (`pure_serve::store::engine::TurnStore`) and the engines behind it, for real: SQLite files
//! in a temp dir synced by the `pure-sync` thread, and a PostgreSQL 15 cluster made for the test (`pg_util`;
//! skipped, saying how to run it, on a machine without PostgreSQL). Every engine runs the same turns and must give
//! the same outcomes (docs/store.md, "The invariants"; docs/scale-out.md); two PostgreSQL engines racing on one
//! sender's records must store each exactly once.

mod pg_util;

use pure_serve::proto::turn::DownRecord;
use pure_serve::proto::wire::RecordFormat;
use pure_serve::store::Applied;
use pure_serve::store::downlink::{
    DownLimits, DownPush, DownRefusal, FetchRead, MAX_DOWN_PAYLOAD, OwnedFetch, Pushed,
};
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
        keep_new: true,
        ..AppTurn::default()
    }
}

/// A part of app 0 with pushes and LISTENs only.
fn down_turn(pushes: Vec<DownPush>, fetches: Vec<OwnedFetch>) -> AppTurn {
    AppTurn {
        app: 0,
        pushes,
        fetches,
        ..AppTurn::default()
    }
}

fn push_of(sender: &str, records: &[&[u8]], limits: DownLimits) -> DownPush {
    DownPush {
        sender: sender.into(),
        key: [sender.len() as u8; 32],
        records: records.iter().map(|r| r.to_vec()).collect(),
        blob: None,
        limits,
    }
}

fn listen(index: usize, sender: &str, heard: u64, room: usize) -> OwnedFetch {
    OwnedFetch {
        index,
        source: sender.into(),
        heard,
        from: heard,
        room,
    }
}

fn down(seq: u64, payload: &[u8]) -> DownRecord {
    DownRecord {
        seq,
        payload: payload.to_vec(),
    }
}

/// Downlink through the store interface, the same for every engine (docs/downlink.md, docs/scale-out.md
/// "Downlink on a fleet"): pushes numbered per sender, bounded all or nothing, read above what the device has,
/// deleted when it has them, and a push read by a LISTEN of the same turn.
fn same_downlink_outcomes(store: &mut dyn TurnStore) {
    let limits = DownLimits {
        max_records: 3,
        max_bytes: 10,
        expiry_ms: None,
    };
    let (_, pushed) = apply_down(
        store,
        101,
        down_turn(
            vec![
                push_of("dev", &[b"aa", b"bb"], limits),
                // Two more would make 4 waiting: refused whole.
                push_of("dev", &[b"cc", b"dd"], limits),
                push_of("dev", &[b"1234567"], limits),
                push_of("dev", &[&[0u8; MAX_DOWN_PAYLOAD + 1]], limits),
                push_of("other", &[b"o1"], limits),
            ],
            Vec::new(),
        ),
    );
    assert_eq!(
        pushed,
        vec![
            Pushed::Queued { first: 1, count: 2 },
            Pushed::Refused(DownRefusal::Records {
                pushing: 2,
                waiting: 2,
                max: 3
            }),
            Pushed::Refused(DownRefusal::Bytes {
                pushing: 7,
                waiting: 4,
                max: 10
            }),
            Pushed::Refused(DownRefusal::TooLarge {
                index: 0,
                len: MAX_DOWN_PAYLOAD + 1
            }),
            Pushed::Queued { first: 1, count: 1 },
        ]
    );
    // The device has 1: it is deleted, 2 read, with room for one record only; `other` has nothing yet.
    let a = apply(
        store,
        102,
        down_turn(
            Vec::new(),
            vec![listen(0, "dev", 1, 3), listen(1, "nobody", 0, 100)],
        ),
    );
    assert_eq!((a.down.delivered, a.down.expired), (1, 0));
    assert_eq!(
        a.down.reads,
        vec![
            FetchRead {
                index: 0,
                after: 1,
                last: 2,
                records: vec![down(2, b"bb")]
            },
            FetchRead {
                index: 1,
                after: 0,
                last: 0,
                records: Vec::new()
            }
        ]
    );
    // A push and a LISTEN in one turn: the push comes first, so the LISTEN reads it. Numbering goes on after what
    // was delivered.
    let (a, pushed) = apply_down(
        store,
        103,
        down_turn(
            vec![push_of("dev", &[b"ee"], limits)],
            vec![listen(5, "dev", 1, 100)],
        ),
    );
    assert_eq!(pushed, vec![Pushed::Queued { first: 3, count: 1 }]);
    assert_eq!(
        a.down.reads,
        vec![FetchRead {
            index: 5,
            after: 1,
            last: 3,
            records: vec![down(2, b"bb"), down(3, b"ee")]
        }]
    );
    // A device that has more than the store knows of (9) moves the numbering past it; nothing is left.
    let a = apply(
        store,
        104,
        down_turn(Vec::new(), vec![listen(0, "dev", 9, 100)]),
    );
    assert_eq!(a.down.delivered, 2);
    assert_eq!(a.down.reads[0].last, 0, "nothing waits");
    let (_, pushed) = apply_down(
        store,
        105,
        down_turn(vec![push_of("dev", &[b"ff"], limits)], Vec::new()),
    );
    assert_eq!(
        pushed,
        vec![Pushed::Queued {
            first: 10,
            count: 1
        }]
    );
    // Expired records are deleted unsent and counted, and hold no room.
    let soon = DownLimits {
        expiry_ms: Some(1),
        ..limits
    };
    apply(
        store,
        106,
        down_turn(vec![push_of("exp", &[b"x1", b"x2"], soon)], Vec::new()),
    );
    std::thread::sleep(std::time::Duration::from_millis(20));
    let a = apply(
        store,
        107,
        down_turn(Vec::new(), vec![listen(0, "exp", 0, 100)]),
    );
    assert_eq!((a.down.delivered, a.down.expired), (0, 2));
    assert_eq!(a.down.reads[0].records, Vec::new());
    assert_eq!(a.down.reads[0].last, 0);
    assert_eq!(store.waiting(), 0);
    // A push deletes its sender's expired records first, tells them by its first push to that sender, and they hold
    // no room; a part's pushes to several senders, one of them three times, are each numbered and bounded after the
    // pushes before them in the part (a push of many's turn).
    apply(
        store,
        108,
        down_turn(vec![push_of("old", &[b"o1", b"o2"], soon)], Vec::new()),
    );
    std::thread::sleep(std::time::Duration::from_millis(20));
    let two = DownLimits {
        max_records: 2,
        ..limits
    };
    let pushed = apply_down_expired(
        store,
        109,
        down_turn(
            vec![
                push_of("old", &[b"n1"], two),
                push_of("new", &[b"m1"], two),
                push_of("old", &[b"n2"], two),
                push_of("old", &[b"n3"], two),
                push_of("new", &[b"m2"], two),
            ],
            Vec::new(),
        ),
    );
    assert_eq!(
        pushed,
        vec![
            (Pushed::Queued { first: 3, count: 1 }, 2),
            (Pushed::Queued { first: 1, count: 1 }, 0),
            (Pushed::Queued { first: 4, count: 1 }, 0),
            (
                Pushed::Refused(DownRefusal::Records {
                    pushing: 1,
                    waiting: 2,
                    max: 2
                }),
                0
            ),
            (Pushed::Queued { first: 2, count: 1 }, 0),
        ]
    );
    let a = apply(
        store,
        110,
        down_turn(
            Vec::new(),
            vec![listen(0, "old", 2, 100), listen(1, "new", 0, 100)],
        ),
    );
    assert_eq!(
        a.down.reads[0].records,
        vec![down(3, b"n1"), down(4, b"n2")]
    );
    assert_eq!(
        a.down.reads[1].records,
        vec![down(1, b"m1"), down(2, b"m2")]
    );
    // A part that also stores records: its records are stored, and its pushes are applied before its LISTENs (on a
    // fleet's database in a transaction of their own, ahead of the part's), each bounded after the ones before it.
    let mut mixed = turn(0, vec![piece("mixdev", 1, 2)]);
    mixed.pushes = vec![
        push_of("mix", &[b"p1"], limits),
        push_of("old", &[b"n3"], two),
        push_of("mix", &[b"p2"], limits),
    ];
    mixed.fetches = vec![listen(0, "mix", 0, 100)];
    let (a, pushed) = apply_down(store, 111, mixed);
    assert_eq!(
        pushed,
        vec![
            Pushed::Queued { first: 1, count: 1 },
            Pushed::Refused(DownRefusal::Records {
                pushing: 1,
                waiting: 2,
                max: 2
            }),
            Pushed::Queued { first: 2, count: 1 },
        ]
    );
    assert_eq!(a.stored, 2);
    assert_eq!(
        a.down.reads[0].records,
        vec![down(1, b"p1"), down(2, b"p2")]
    );
    // A part of pushes only whose later pushes to a sender are refused, the last of them to a sender made by the
    // part: a fleet's database moves each flow past every push of the part first and then back to what was queued,
    // so the next push is numbered right after, none skipped.
    let one = DownLimits {
        max_records: 1,
        ..limits
    };
    let (_, pushed) = apply_down(
        store,
        112,
        down_turn(
            vec![
                push_of("gap", &[b"g1"], one),
                push_of("gap", &[b"g2"], one),
                push_of("gap", &[b"g3", b"g4"], one),
                push_of("gap", &[&[0u8; MAX_DOWN_PAYLOAD + 1]], limits),
            ],
            Vec::new(),
        ),
    );
    assert_eq!(pushed[0], Pushed::Queued { first: 1, count: 1 });
    assert!(pushed[1..].iter().all(|p| matches!(p, Pushed::Refused(_))));
    apply(
        store,
        113,
        down_turn(Vec::new(), vec![listen(0, "gap", 1, 100)]),
    );
    let (_, pushed) = apply_down(
        store,
        114,
        down_turn(
            vec![
                push_of("gap", &[b"g5"], limits),
                push_of("gap", &[b"g6", b"g7"], limits),
            ],
            Vec::new(),
        ),
    );
    assert_eq!(
        pushed,
        vec![
            Pushed::Queued { first: 2, count: 1 },
            Pushed::Queued { first: 3, count: 2 },
        ]
    );
    let a = apply(
        store,
        115,
        down_turn(Vec::new(), vec![listen(0, "gap", 1, 100)]),
    );
    assert_eq!(
        a.down.reads[0].records,
        vec![down(2, b"g5"), down(3, b"g6"), down(4, b"g7")]
    );
}

/// [`apply_down`], with each push's count of its sender's records that expired.
fn apply_down_expired(store: &mut dyn TurnStore, seq: u64, part: AppTurn) -> Vec<(Pushed, u64)> {
    store.submit(seq, vec![part]);
    let mut done: Vec<TurnOutcome> = Vec::new();
    while done.is_empty() {
        done = store.wait_done();
    }
    let (_, list) = done.remove(0).pushes.pop().expect("the part's pushes");
    list.iter()
        .map(|p| {
            let (pushed, expired) = p.done().expect("the push is done");
            (pushed.clone(), expired)
        })
        .collect()
}

/// Submits one turn and waits for its outcome; the one app part's result.
fn apply(store: &mut dyn TurnStore, seq: u64, part: AppTurn) -> Applied {
    apply_down(store, seq, part).0
}

/// [`apply`], with what became of each push of the part (each done).
fn apply_down(store: &mut dyn TurnStore, seq: u64, part: AppTurn) -> (Applied, Vec<Pushed>) {
    let pushes = part.pushes.len();
    store.submit(seq, vec![part]);
    let mut done: Vec<TurnOutcome> = Vec::new();
    while done.is_empty() {
        done = store.wait_done();
    }
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].seq, seq);
    let mut outcome = done.remove(0);
    let pushed: Vec<Pushed> = match outcome.pushes.pop() {
        Some((_, list)) => list
            .iter()
            .map(|p| p.done().expect("the push is done").0.clone())
            .collect(),
        None => Vec::new(),
    };
    assert_eq!(pushed.len(), pushes, "an outcome per push");
    let (_, result) = outcome.apps.remove(0);
    (result.expect("the turn is applied"), pushed)
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
    same_downlink_outcomes(&mut engine);
}

#[test]
fn sqlite_engine_in_memory_gives_outcomes_at_once() {
    let apps = vec!["a".to_string(), "b".to_string()];
    let stores = pure_serve::store::Stores::open_in_memory(&apps).unwrap();
    let mut engine = pure_serve::store::sqlite_engine::SqliteTurns::new(stores, None);
    assert!(engine.wake_fd().is_none());
    same_outcomes(&mut engine);
    same_downlink_outcomes(&mut engine);
}

use pure_serve::store::postgres::PostgresTurns;

fn pg_engine(cluster: &pg_util::PgCluster) -> PostgresTurns {
    let apps = vec!["a".to_string(), "b".to_string()];
    PostgresTurns::open(&cluster.url(), None, &apps)
        .expect("the engine connects to the test's cluster")
}

#[test]
fn postgres_engine_gives_the_same_outcomes() {
    let Some(cluster) = pg_util::PgCluster::start("postgres_engine_gives_the_same_outcomes") else {
        return;
    };
    let mut engine = pg_engine(&cluster);
    assert!(engine.wake_fd().is_some());
    same_outcomes(&mut engine);
    same_downlink_outcomes(&mut engine);
    // A LISTEN that acknowledges nothing new writes and locks nothing (its COMMIT then waits for no WAL flush: a
    // push's read costs no second commit, research/029): the flow's row keeps its xmin and xmax.
    let row = || {
        one_row(
            &cluster.conninfo(),
            "SELECT f.xmin::text || ' ' || f.xmax::text FROM down_flows f JOIN apps a ON a.id = f.app \
             WHERE a.name = 'a' AND f.sender = 'dev'",
        )
    };
    let before = row();
    let a = apply(
        &mut engine,
        200,
        down_turn(Vec::new(), vec![listen(0, "dev", 9, 100)]),
    );
    assert_eq!(a.down.reads[0].records, vec![down(10, b"ff")]);
    assert_eq!(
        row(),
        before,
        "the flow's row was neither written nor locked"
    );
    // A second engine (another node) on the same database sees what the first stored.
    drop(engine);
    let mut again = pg_engine(&cluster);
    assert_eq!(again.heard_of(0, "dev").unwrap(), 8);
    assert_eq!(again.head(0).unwrap(), 13);
}

/// Two engines (two nodes of a fleet) pushing to one sender at once, while a third reads and deletes for it
/// (docs/scale-out.md, "Downlink on a fleet"): every push gets sequences of its own, none given twice and none
/// skipped; each engine hears of the other's pushes (a notification per push) and never of its own; and the waiting
/// count the database keeps agrees with the rows.
#[test]
fn two_postgres_engines_pushing_to_one_sender_give_each_sequence_once_and_tell_each_other() {
    let Some(cluster) = pg_util::PgCluster::start(
        "two_postgres_engines_pushing_to_one_sender_give_each_sequence_once_and_tell_each_other",
    ) else {
        return;
    };
    const PUSHES: u64 = 60;
    let limits = DownLimits {
        max_records: 1 << 20,
        ..DownLimits::default()
    };
    // Both listen before either pushes: a notification reaches only the connections listening when it commits.
    let both_open = std::sync::Arc::new(std::sync::Barrier::new(2));
    let threads: Vec<_> = (0..2u8)
        .map(|w| {
            let url = cluster.url();
            let both_open = both_open.clone();
            std::thread::spawn(move || {
                let apps = vec!["a".to_string(), "b".to_string()];
                let mut engine = PostgresTurns::open(&url, None, &apps).unwrap();
                both_open.wait();
                let mut given = Vec::new();
                for k in 0..PUSHES {
                    let mut push = push_of("dev", &[b"x", b"y"], limits);
                    push.key = [w; 32];
                    let (_, pushed) =
                        apply_down(&mut engine, k + 1, down_turn(vec![push], Vec::new()));
                    match pushed[0] {
                        Pushed::Queued { first, count } => given.push((first, count)),
                        ref other => panic!("refused: {other:?}"),
                    }
                }
                // The other's notifications may still be on their way: wait for all of them.
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
                let mut heard = Vec::new();
                while (heard.len() as u64) < PUSHES && std::time::Instant::now() < deadline {
                    heard.extend(engine.down_notices());
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                std::thread::sleep(std::time::Duration::from_millis(200));
                heard.extend(engine.down_notices());
                (given, heard)
            })
        })
        .collect();
    let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let mut seqs: Vec<u64> = results
        .iter()
        .flat_map(|(given, _)| given.iter().flat_map(|&(f, c)| f..f + c))
        .collect();
    seqs.sort_unstable();
    assert_eq!(
        seqs,
        (1..=PUSHES * 4).collect::<Vec<_>>(),
        "each sequence given once, none skipped"
    );
    for (w, (_, heard)) in results.iter().enumerate() {
        let other = 1 - w as u8;
        assert_eq!(
            heard.len() as u64,
            PUSHES,
            "engine {w} heard each of the other's pushes once"
        );
        assert!(
            heard
                .iter()
                .all(|n| n.app == 0 && n.sender == "dev" && n.key == [other; 32]),
            "engine {w} heard only the other's pushes: {:?}",
            heard.first()
        );
    }
    // A reader (a third node) reads them all in order and deletes them as the device says it has them.
    let mut reader = pg_engine(&cluster);
    let a = apply(
        &mut reader,
        1,
        down_turn(
            Vec::new(),
            vec![listen(0, "dev", 0, 4 * PUSHES as usize * 2)],
        ),
    );
    let read: Vec<u64> = a.down.reads[0].records.iter().map(|r| r.seq).collect();
    assert_eq!(read, (1..=PUSHES * 4).collect::<Vec<_>>());
    let a = apply(
        &mut reader,
        2,
        down_turn(Vec::new(), vec![listen(0, "dev", PUSHES * 4, 100)]),
    );
    assert_eq!(a.down.delivered, PUSHES * 4);
    assert_eq!(
        a.down.waiting,
        Some(0),
        "the kept count agrees with the rows"
    );
}

/// Senders of [`many_part`].
const SENDERS: usize = 100;

fn many_name(k: usize) -> String {
    format!("s{k:03}")
}

/// Turn `t`'s part of pushes to many senders: each of [`SENDERS`] twice, the rounds one after another (a sender's two
/// pushes far apart in the part), payloads `T-ROUND-K`.
fn many_part(t: u64) -> AppTurn {
    let limits = DownLimits {
        max_records: 1 << 20,
        ..DownLimits::default()
    };
    let mut pushes = Vec::new();
    for round in 0..2 {
        for k in 0..SENDERS {
            let payload = format!("{t}-{round}-{k}");
            pushes.push(push_of(&many_name(k), &[payload.as_bytes()], limits));
        }
    }
    down_turn(pushes, Vec::new())
}

/// What [`many_part`]`(t)` is answered after turns 1 to `t - 1` of it: each push queued, numbered in order.
fn many_expected(t: u64) -> Vec<Pushed> {
    (0..2)
        .flat_map(|round| {
            (0..SENDERS).map(move |_| Pushed::Queued {
                first: 2 * (t - 1) + round + 1,
                count: 1,
            })
        })
        .collect()
}

/// Whether turn `t` of [`many_part`]'s records were inserted by two transactions (one on each connection).
fn many_split(conninfo: &str, t: u64) -> bool {
    let sql = format!(
        "SELECT count(DISTINCT xmin::text)::text FROM downlink WHERE seq IN ({}, {})",
        2 * t - 1,
        2 * t
    );
    one_row(conninfo, &sql) == "2"
}

/// A part of pushes to many senders is split over the engine's two connections, each sender's pushes in one
/// transaction (research/050): every push numbered as if the part were one transaction, in order, none skipped,
/// through a spare connection ended under it (its half queued on the first connection instead), with the waiting
/// count exact; another node hears every push and the engine none of its own, the spare's included.
#[test]
fn postgres_pushes_to_many_senders_split_over_two_connections_keep_each_senders_order() {
    let Some(cluster) = pg_util::PgCluster::start(
        "postgres_pushes_to_many_senders_split_over_two_connections_keep_each_senders_order",
    ) else {
        return;
    };
    let (name, part, expect) = (many_name, many_part, many_expected);
    let backends = || -> Vec<i32> {
        pg_util::sql(&cluster.conninfo(), async |client| {
            client
                .query(
                    "SELECT pid FROM pg_stat_activity WHERE application_name = 'pure-serve' \
                     ORDER BY backend_start",
                    &[],
                )
                .await
                .unwrap()
                .iter()
                .map(|r| r.get(0))
                .collect()
        })
    };
    // Waits for the event (the spare connection made), not for a time.
    let until_backends = |n: usize| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while backends().len() != n {
            assert!(
                std::time::Instant::now() < deadline,
                "the engine made no spare connection: {:?}",
                backends()
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    };
    let mut engine = pg_engine(&cluster);
    // The first such part goes on one connection, and has the spare made beside it.
    let (_, pushed) = apply_down(&mut engine, 1, part(1));
    assert_eq!(pushed, expect(1));
    until_backends(2);
    // The spare ended under the engine: the part after is queued whole all the same.
    let spare = *backends().last().unwrap();
    pg_util::sql(&cluster.conninfo(), async |client| {
        client
            .execute("SELECT pg_terminate_backend($1)", &[&spare])
            .await
            .unwrap()
    });
    until_backends(1);
    for t in 2..=3 {
        let (_, pushed) = apply_down(&mut engine, t, part(t));
        assert_eq!(pushed, expect(t), "turn {t}, after the spare ended");
    }
    let split = |t: u64| many_split(&cluster.conninfo(), t);
    // Turns after `t` until one is split (the spare is made again beside them), and `more` after it: the first
    // split turn, the last turn, and the waiting count the last said.
    // A spare ended while it was being made counts as refused, and is tried again 10 s later: the bound is a time.
    let until_split = |engine: &mut PostgresTurns, mut t: u64, more: u64| {
        let (mut first_split, mut last) = (None, None);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
        while first_split.is_none_or(|f| t < f + more) {
            t += 1;
            assert!(
                std::time::Instant::now() < deadline,
                "no part was split over two connections"
            );
            let (applied, pushed) = apply_down(engine, t, part(t));
            assert_eq!(pushed, expect(t), "turn {t}");
            // Nothing delivered yet: every record pushed so far waits, whichever half counted last.
            assert_eq!(
                applied.down.waiting,
                Some(t * 2 * SENDERS as u64),
                "turn {t}: the waiting count as the later of its transactions left it"
            );
            last = applied.down.waiting;
            if first_split.is_none() && split(t) {
                first_split = Some(t);
            }
        }
        (first_split.unwrap(), t, last)
    };
    // The spare refuses its half of a part (a trigger that fails its inserts, and counts that it did): the half is
    // queued on the first connection instead, and the spare made again.
    let (_, t, _) = until_split(&mut engine, 3, 0);
    let spare = *backends().last().unwrap();
    pg_util::sql(&cluster.conninfo(), async |client| {
        client
            .batch_execute(&format!(
                "CREATE SEQUENCE spare_refused; \
                 CREATE FUNCTION refuse_spare() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
                     IF pg_backend_pid() = {spare} THEN PERFORM nextval('spare_refused'); \
                         RAISE EXCEPTION 'the test refuses the spare'; END IF; RETURN NULL; END $$; \
                 CREATE TRIGGER refuse_spare BEFORE INSERT ON downlink FOR EACH STATEMENT \
                     EXECUTE FUNCTION refuse_spare();"
            ))
            .await
            .unwrap()
    });
    let t = t + 1;
    let (_, pushed) = apply_down(&mut engine, t, part(t));
    assert_eq!(pushed, expect(t), "turn {t}, its spare's half refused");
    assert_eq!(
        one_row(
            &cluster.conninfo(),
            "SELECT last_value::text FROM spare_refused"
        ),
        "1",
        "the spare's half was refused once"
    );
    pg_util::sql(&cluster.conninfo(), async |client| {
        client
            .batch_execute("DROP TRIGGER refuse_spare ON downlink")
            .await
            .unwrap()
    });
    let mut other = pg_engine(&cluster);
    let heard_from = t + 1;
    let (first_split, t, last) = until_split(&mut engine, t, 2);
    assert!(
        (first_split..=t).all(split),
        "every part after the spare was made again went over two connections"
    );
    assert_eq!(
        last,
        Some(t * 2 * SENDERS as u64),
        "the waiting count as the later of the two transactions left it"
    );
    // Each sender's records in the order pushed.
    let listens = (0..SENDERS)
        .step_by(33)
        .enumerate()
        .map(|(i, k)| listen(i, &name(k), 0, 1 << 20))
        .collect();
    let a = apply(&mut engine, t + 1, down_turn(Vec::new(), listens));
    for (i, k) in (0..SENDERS).step_by(33).enumerate() {
        let want: Vec<DownRecord> = (1..=t)
            .flat_map(|t| (0..2u64).map(move |round| (t, round)))
            .map(|(t, round)| {
                down(
                    2 * (t - 1) + round + 1,
                    format!("{t}-{round}-{k}").as_bytes(),
                )
            })
            .collect();
        assert_eq!(a.down.reads[i].records, want, "sender {}", name(k));
    }
    // The other node hears of each sender's pushes of the turns after it opened (once a transaction: PostgreSQL
    // delivers a payload signalled twice in one transaction once), the engine none of its own.
    let turns = (t + 1 - heard_from) as usize;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut heard = Vec::new();
    while heard.len() < turns * SENDERS && std::time::Instant::now() < deadline {
        heard.extend(other.down_notices());
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    std::thread::sleep(std::time::Duration::from_millis(200));
    heard.extend(other.down_notices());
    let mut senders: Vec<String> = heard.iter().map(|n| n.sender.clone()).collect();
    senders.sort_unstable();
    let want: Vec<String> = (0..SENDERS)
        .flat_map(|k| std::iter::repeat_n(name(k), turns))
        .collect();
    assert_eq!(
        senders, want,
        "each sender's pushes heard by the other node once a turn"
    );
    assert!(
        engine.down_notices().is_empty(),
        "the engine hears none of its own pushes, its spare's included"
    );
}

/// A server that refuses the spare connection (at its `max_connections`): the parts of pushes to many go on one
/// connection, each push queued in order all the same, and once a connection is free the spare is made again and
/// the parts are split again.
#[test]
fn postgres_pushes_to_many_senders_go_on_one_connection_while_the_spare_is_refused() {
    let Some(cluster) = pg_util::PgCluster::start(
        "postgres_pushes_to_many_senders_go_on_one_connection_while_the_spare_is_refused",
    ) else {
        return;
    };
    // Three connections at most, superusers included: the engine's, and two the test holds.
    cluster.restart_with(
        true,
        "-c max_connections=3 -c superuser_reserved_connections=0",
    );
    let mut engine = pg_engine(&cluster);
    let holders: Vec<_> = (0..2)
        .map(|_| {
            let (held_tx, held) = std::sync::mpsc::channel::<()>();
            let (release, release_rx) = std::sync::mpsc::channel::<()>();
            let conninfo = cluster.conninfo();
            let thread = std::thread::spawn(move || {
                pg_util::sql(&conninfo, async |client| {
                    client.execute("SELECT 1", &[]).await.unwrap();
                    held_tx.send(()).unwrap();
                    // Held until the test lets go (a blocking wait: the connection needs nothing meanwhile).
                    let _ = release_rx.recv();
                })
            });
            held.recv().expect("the connection is held");
            (release, thread)
        })
        .collect();
    for t in 1..=3 {
        let (_, pushed) = apply_down(&mut engine, t, many_part(t));
        assert_eq!(pushed, many_expected(t), "turn {t}, the spare refused");
    }
    for (release, thread) in holders {
        release.send(()).unwrap();
        thread.join().unwrap();
    }
    assert!(
        (1..=3).all(|t| !many_split(&cluster.conninfo(), t)),
        "no part went over two connections while the server refused the second"
    );
    // Parts again, until one is split: the spare is tried again some seconds after it was refused.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut t = 3;
    loop {
        t += 1;
        let (_, pushed) = apply_down(&mut engine, t, many_part(t));
        assert_eq!(pushed, many_expected(t), "turn {t}");
        if many_split(&cluster.conninfo(), t) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the spare was not made again once a connection was free"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// The one text value `sql` selects, by a client of the test's own.
fn one_row(conninfo: &str, sql: &str) -> String {
    pg_util::sql(conninfo, async |client| {
        client.query_one(sql, &[]).await.unwrap().get(0)
    })
}

/// Chunks (source, first_seq, count, pos, body) in position order, heard sequences by source, and the head.
type Contents = (
    Vec<(String, i64, i32, i64, Vec<u8>)>,
    Vec<(String, i64)>,
    i64,
);

/// Reads what the database holds of one app: (source, first_seq, count, pos, body) in position order, and the
/// sources' heard sequences.
fn pg_contents(conninfo: &str, app: &str) -> Contents {
    pg_util::sql(conninfo, async |client| {
        let chunks = client
            .query(
                "SELECT s.name, c.first_seq, c.count, c.pos, c.body FROM chunks c JOIN sources s ON s.id = c.source \
                 JOIN apps a ON a.id = c.app WHERE a.name = $1 ORDER BY c.pos",
                &[&app],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
            .collect();
        let heard = client
            .query(
                "SELECT s.name, s.heard FROM sources s JOIN apps a ON a.id = s.app WHERE a.name = $1 ORDER BY s.name",
                &[&app],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        let head: i64 = client
            .query_one("SELECT head FROM apps WHERE name = $1", &[&app])
            .await
            .unwrap()
            .get(0);
        (chunks, heard, head)
    })
}

/// The payloads of a chunk's body (one-byte lengths: every test payload is short).
fn payloads(body: &[u8]) -> Vec<String> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < body.len() {
        let n = body[i] as usize;
        out.push(String::from_utf8(body[i + 1..i + 1 + n].to_vec()).unwrap());
        i += 1 + n;
    }
    out
}

#[test]
fn two_postgres_engines_racing_on_one_sender_store_each_record_once() {
    let Some(cluster) = pg_util::PgCluster::start(
        "two_postgres_engines_racing_on_one_sender_store_each_record_once",
    ) else {
        return;
    };
    const LAST: u64 = 3000;
    // Two engines — two nodes — that a sender reaches at once: each proposes the sender's next records from what
    // it last learned, in frames of varying size that overlap what the other stored meanwhile, with a second
    // sender beside them so turns carry more than one source.
    let threads: Vec<_> = (0..2u64)
        .map(|w| {
            let url = cluster.url();
            std::thread::spawn(move || {
                let apps = vec!["a".to_string(), "b".to_string()];
                let mut engine = PostgresTurns::open(&url, None, &apps).unwrap();
                let (mut next, mut other_next) = (1u64, 1u64);
                let (mut stored, mut duplicate, mut seq) = (0u64, 0u64, 0u64);
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ w;
                while next <= LAST {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let count = 1 + x % 40;
                    let count = count.min(LAST + 1 - next);
                    // Now and then a resend from a little before what it knows, as after a lost ack.
                    let from = if x.is_multiple_of(5) {
                        next.saturating_sub(x % 7).max(1)
                    } else {
                        next
                    };
                    seq += 1;
                    let a = apply(
                        &mut engine,
                        seq,
                        turn(
                            0,
                            vec![
                                piece("dev", from, next + count - from),
                                piece(&format!("side-{w}"), other_next, 3),
                            ],
                        ),
                    );
                    stored += a.stored;
                    duplicate += a.duplicate;
                    let heard = a.heard.iter().find(|(s, _)| s == "dev").unwrap().1;
                    assert!(
                        heard >= next + count - 1,
                        "the turn's records are stored, by it or the other"
                    );
                    next = heard + 1;
                    other_next += 3;
                }
                (stored, duplicate, other_next - 1)
            })
        })
        .collect();
    let results: Vec<(u64, u64, u64)> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let (chunks, heard, head) = pg_contents(&cluster.conninfo(), "a");
    let side: u64 = results.iter().map(|r| r.2).sum();
    // Each record of the raced sender stored by exactly one of the two, and both saw the other's work.
    let dev_stored: u64 = results.iter().map(|r| r.0).sum::<u64>() - side;
    assert_eq!(
        dev_stored, LAST,
        "records of dev stored by the two together: {results:?}"
    );
    let sides: Vec<u64> = results.iter().map(|r| r.2).collect();
    assert!(
        results
            .iter()
            .zip(&sides)
            .all(|(r, side)| r.0 - side > 0 && r.0 - side < LAST),
        "both engines stored some of dev's records, so they raced on it: {results:?}"
    );
    // The database agrees: dev's chunks cover 1..=LAST once, in order, each record's payload its own sequence.
    let mut expect = 1i64;
    let mut all = Vec::new();
    for (source, first, count, _, body) in chunks.iter().filter(|c| c.0 == "dev") {
        assert_eq!(*first, expect, "dev's chunks are consecutive ({source})");
        let p = payloads(body);
        assert_eq!(p.len(), *count as usize);
        all.extend(p);
        expect += *count as i64;
    }
    assert_eq!(expect - 1, LAST as i64);
    let want: Vec<String> = (1..=LAST).map(|s| format!("r{s}")).collect();
    assert_eq!(all, want, "each of dev's records once, in sequence");
    // Positions 1 .. head - 1, each once, in the order chunks were committed.
    let mut pos = 1i64;
    for (_, _, count, p, _) in &chunks {
        assert_eq!(*p, pos, "positions without gaps or overlaps");
        pos += *count as i64;
    }
    assert_eq!(pos, head, "the head is the next position");
    assert_eq!(
        heard,
        vec![
            ("dev".to_string(), LAST as i64),
            ("side-0".to_string(), results[0].2 as i64),
            ("side-1".to_string(), results[1].2 as i64)
        ]
    );
}

#[test]
fn a_postgres_engine_fails_turns_while_the_database_is_down_and_stores_again_when_it_is_back() {
    let Some(cluster) = pg_util::PgCluster::start(
        "a_postgres_engine_fails_turns_while_the_database_is_down_and_stores_again_when_it_is_back",
    ) else {
        return;
    };
    let mut engine = pg_engine(&cluster);
    let a = apply(&mut engine, 1, turn(0, vec![piece("dev", 1, 10)]));
    assert_eq!(a.stored, 10);
    cluster.kill();
    engine.submit(2, vec![turn(0, vec![piece("dev", 11, 10)])]);
    let done = engine.wait_done();
    let (_, result) = &done[0].apps[0];
    let e = result
        .as_ref()
        .expect_err("no outcome while the database is down");
    let words = e.to_string();
    assert!(
        words.contains(&cluster.url()),
        "the error names the database: {words}"
    );
    cluster.start_server();
    // Tried again at most every 0.25 s: the first turns after the restart may still find it down. (How soon it
    // stores again is printed, not checked: a figure for a measurement; the deadline only catches a hang.)
    let started = std::time::Instant::now();
    let mut seq = 2;
    let stored = loop {
        seq += 1;
        engine.submit(seq, vec![turn(0, vec![piece("dev", 11, 10)])]);
        let done = engine.wait_done();
        match &done[0].apps[0].1 {
            Ok(a) => break a.stored,
            Err(e) => {
                assert!(
                    started.elapsed() < std::time::Duration::from_secs(60),
                    "still failing 60 s after the database is back: {e}"
                );
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
        }
    };
    assert_eq!(
        stored, 10,
        "the failed turn stored nothing; its retry stores all"
    );
    assert_eq!(engine.heard_of(0, "dev").unwrap(), 20);
    eprintln!(
        "stored again {:.2} s after the database was started again",
        started.elapsed().as_secs_f64()
    );
}

#[test]
fn a_postgres_url_that_cannot_be_reached_stops_the_open_with_its_reason() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!(
        "postgresql://postgres@localhost/postgres?host={}",
        dir.path().display()
    );
    let e = PostgresTurns::open(&url, None, &["a".to_string()])
        .err()
        .expect("no database there");
    let words = e.to_string();
    assert!(
        words.contains(&url) && words.contains("connecting"),
        "{words}"
    );
}

/// The outlets' leases (docs/scale-out.md, "Outlets of a fleet"), as two nodes' lease connections renew them: one
/// node at a time holds each, a free one is taken by exactly one of two racing nodes, only the holder's
/// acknowledged position is written, and a lease the database let expire is taken over from that position.
#[test]
fn outlet_leases_are_held_by_one_node_at_a_time_and_taken_over_once_expired() {
    use pure_serve::store::engine::OutboxConn as _;
    use pure_serve::store::lease::{OutletKey, Renewal};
    use pure_serve::store::postgres::leases::LeaseConn;
    use std::time::{Duration, Instant};
    let Some(cluster) = pg_util::PgCluster::start(
        "outlet_leases_are_held_by_one_node_at_a_time_and_taken_over_once_expired",
    ) else {
        return;
    };
    drop(pg_engine(&cluster)); // makes the tables and registers apps a and b
    // Long enough that no stall of a loaded machine between two steps below lets a lease lapse unasked.
    let lease = Duration::from_secs(5);
    let open = |node: &str| LeaseConn::open_with_lease(&cluster.url(), None, node, lease).unwrap();
    let key = |app: &str, name: &str| OutletKey {
        app: app.into(),
        name: name.into(),
    };
    let renewal = |outlets: &[(OutletKey, u64)]| Renewal {
        sent_at: Instant::now(),
        outlets: outlets.to_vec(),
    };

    // Racing for free outlets, 20 of them at once: each is taken by exactly one of the two.
    let wanted: Vec<(OutletKey, u64)> = (0..20).map(|i| (key("a", &format!("o{i}")), 0)).collect();
    let (w1, w2) = (wanted.clone(), wanted.clone());
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(2));
    let (b1, b2) = (barrier.clone(), barrier.clone());
    let url = cluster.url();
    let url2 = url.clone();
    let t1 = std::thread::spawn(move || {
        let mut c = LeaseConn::open_with_lease(&url, None, "n1", lease).unwrap();
        b1.wait();
        c.renew(&Renewal {
            sent_at: Instant::now(),
            outlets: w1,
        })
        .unwrap()
        .0
    });
    let t2 = std::thread::spawn(move || {
        let mut c = LeaseConn::open_with_lease(&url2, None, "n2", lease).unwrap();
        b2.wait();
        c.renew(&Renewal {
            sent_at: Instant::now(),
            outlets: w2,
        })
        .unwrap()
        .0
    });
    let (h1, h2) = (t1.join().unwrap(), t2.join().unwrap());
    assert_eq!(
        h1.len() + h2.len(),
        20,
        "every outlet taken once: {h1:?} {h2:?}"
    );
    for (k, _) in &h1 {
        assert!(!h2.iter().any(|(k2, _)| k2 == k), "{k:?} held by both");
    }

    // One outlet of app b, taken by n1.
    let (mut n1, mut n2) = (open("n1"), open("n2"));
    let o = key("b", "out");
    let (held, _, _) = n1.renew(&renewal(&[(o.clone(), 0)])).unwrap();
    assert_eq!(held, vec![(o.clone(), 0)]);
    // n2 asks while n1 holds it: not granted, and its position is not written.
    let (held, all, heads) = n2.renew(&renewal(&[(o.clone(), 5)])).unwrap();
    assert!(held.is_empty(), "{held:?}");
    assert_eq!(all, vec![(o.clone(), 0)]);
    // Its app's head, the next position the fleet gives: nothing stored yet.
    assert_eq!(heads, vec![("b".to_string(), 1)]);
    // n1 renews with what its far side acknowledged; a smaller position later never takes it back.
    let (held, _, _) = n1.renew(&renewal(&[(o.clone(), 7)])).unwrap();
    assert_eq!(held, vec![(o.clone(), 7)]);
    let (held, _, _) = n1.renew(&renewal(&[(o.clone(), 3)])).unwrap();
    assert_eq!(held, vec![(o.clone(), 7)], "acked only grows");
    // n1 stops renewing (it died): once the lease expires by the database's clock, n2 takes it from 7.
    let stopped = Instant::now();
    let (held, all) = loop {
        let (held, all, _) = n2.renew(&renewal(&[(o.clone(), 0)])).unwrap();
        if !held.is_empty() {
            break (held, all);
        }
        assert!(
            stopped.elapsed() < lease + Duration::from_secs(60),
            "never taken over: {all:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(
        held,
        vec![(o.clone(), 7)],
        "taken over from what was acknowledged"
    );
    assert_eq!(all, vec![(o.clone(), 7)]);
    // And n1, back, does not get it while n2 renews.
    let (held, _, _) = n1.renew(&renewal(&[(o.clone(), 9)])).unwrap();
    assert!(held.is_empty(), "{held:?}");
}

/// A fleet keeps outlets' starts by name, but a link or wire renamed into a far flow a row has takes that row's
/// start (docs/scale-out.md, "Where an outlet starts"): a start taken anew would number the far flow a second way,
/// and the far node would take the new records for ones it has (an outside audit lost records that way on one
/// node, re-pointing a link of `from = "next"` away and back).
#[test]
fn a_fleet_outlet_renamed_into_a_known_far_flow_keeps_its_start() {
    use pure_serve::store::OutletStart;
    use pure_serve::store::engine::OutboxConn as _;
    use pure_serve::store::postgres::leases::LeaseConn;
    let Some(cluster) =
        pg_util::PgCluster::start("a_fleet_outlet_renamed_into_a_known_far_flow_keeps_its_start")
    else {
        return;
    };
    drop(pg_engine(&cluster)); // makes the tables and registers apps a and b
    let set_head = |head: i64| {
        pg_util::sql(&cluster.conninfo(), async |c| {
            c.execute("UPDATE apps SET head = $1 WHERE name = 'b'", &[&head])
                .await
                .unwrap();
        })
    };
    let conn = LeaseConn::open(&cluster.url(), None, "n1").unwrap();
    let link = |name: &str, far: &str| OutletStart {
        name: name.into(),
        kind: "link".into(),
        target: format!("127.0.0.1:9 KEY {far}"),
        flow: Some(format!("KEY {far}")),
        start: 0, // from = "next"
    };
    set_head(6);
    assert_eq!(conn.start_of("b", &link("o", "x")).unwrap().start, 6);
    set_head(11);
    assert_eq!(
        conn.start_of("b", &link("o", "x")).unwrap().start,
        6,
        "its own row"
    );
    assert_eq!(
        conn.start_of("b", &link("renamed", "x")).unwrap().start,
        6,
        "renamed into x's far flow: x's start"
    );
    assert_eq!(
        conn.start_of("b", &link("other", "y")).unwrap().start,
        11,
        "a new far flow: the head then"
    );
    let hook = OutletStart {
        name: "hook".into(),
        kind: "webhook".into(),
        target: "http://127.0.0.1:9/".into(),
        flow: None,
        start: 0,
    };
    assert_eq!(conn.start_of("b", &hook).unwrap().start, 11, "no far flow");
}

/// The classic trap of a shared outbox (docs/scale-out.md, "The order of an app's records"): a feed that reads on
/// "from the end of what it read" while two nodes commit to one app must never skip a position that becomes
/// visible after a larger one. A reader follows the app as two engines commit, in chunks of varying size from
/// sources of their own; every read starts exactly where the last ended, and at the end it has read every record
/// once, in position order, as the database holds them.
#[test]
fn a_feed_reading_on_while_two_nodes_commit_skips_no_position() {
    use pure_serve::store::postgres::PgReader;
    use std::sync::atomic::{AtomicBool, Ordering};
    let Some(cluster) =
        pg_util::PgCluster::start("a_feed_reading_on_while_two_nodes_commit_skips_no_position")
    else {
        return;
    };
    drop(pg_engine(&cluster));
    const PER_NODE: u64 = 4000;
    let writing = std::sync::Arc::new(AtomicBool::new(true));
    let writers: Vec<_> = (0..2u64)
        .map(|w| {
            let url = cluster.url();
            std::thread::spawn(move || {
                let apps = vec!["a".to_string(), "b".to_string()];
                let mut engine = PostgresTurns::open(&url, None, &apps).unwrap();
                let (mut next, mut seq) = (1u64, 0u64);
                let mut x = 0x2545_f491_4f6c_dd1du64 ^ (w + 1);
                while next <= PER_NODE {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let count = (1 + x % 30).min(PER_NODE + 1 - next);
                    seq += 1;
                    let a = apply(
                        &mut engine,
                        seq,
                        turn(0, vec![piece(&format!("node{w}"), next, count)]),
                    );
                    assert_eq!(a.stored, count);
                    next += count;
                }
            })
        })
        .collect();
    let url = cluster.url();
    let flag = writing.clone();
    let reader = std::thread::spawn(move || {
        let r = PgReader::open(&url, None).unwrap();
        let (mut from, mut reads, mut seen) = (1u64, 0u64, Vec::<(u64, String, u64)>::new());
        loop {
            let done = !flag.load(Ordering::SeqCst);
            // Small pages, so that reads and commits interleave often.
            let chunks = r.read_from("a", from, 37, 1 << 20).unwrap();
            reads += 1;
            if let Some(first) = chunks.first() {
                assert_eq!(first.pos, from, "a read starts where the last ended");
            }
            for c in &chunks {
                assert_eq!(c.pos, from, "chunks follow each other without a gap");
                for (k, record) in c.records().enumerate() {
                    seen.push((c.pos + k as u64, c.source.clone(), c.first_seq + k as u64));
                    assert_eq!(record, format!("r{}", c.first_seq + k as u64).as_bytes());
                }
                from = c.pos + c.count;
            }
            if chunks.is_empty() && done {
                return (seen, reads);
            }
        }
    });
    for w in writers {
        w.join().unwrap();
    }
    writing.store(false, Ordering::SeqCst);
    let (seen, reads) = reader.join().unwrap();
    assert_eq!(seen.len() as u64, 2 * PER_NODE, "every record read once");
    for (i, (pos, _, _)) in seen.iter().enumerate() {
        assert_eq!(*pos, i as u64 + 1, "positions 1.. in order");
    }
    for w in 0..2 {
        let seqs: Vec<u64> = seen
            .iter()
            .filter(|(_, s, _)| *s == format!("node{w}"))
            .map(|(_, _, q)| *q)
            .collect();
        assert_eq!(
            seqs,
            (1..=PER_NODE).collect::<Vec<_>>(),
            "node{w}'s records in sequence"
        );
    }
    let (chunks, _, head) = pg_contents(&cluster.url(), "a");
    assert_eq!(head as u64, 2 * PER_NODE + 1);
    assert!(
        reads > 10,
        "the reader read while the nodes committed ({reads} reads)"
    );
    eprintln!(
        "{} chunks committed by two nodes, read in {reads} reads",
        chunks.len()
    );
}

/// A push of a file's pieces to `sender`, sharing `blob` with the other pushes of its request.
fn blob_push_of(
    sender: &str,
    blob: &std::sync::Arc<pure_serve::store::downlink::DownBlob>,
    limits: DownLimits,
) -> DownPush {
    DownPush {
        sender: sender.into(),
        key: [sender.len() as u8; 32],
        records: Vec::new(),
        blob: Some(blob.clone()),
        limits,
    }
}

/// What a test reads of an engine's store beside it, for the files' tests: the kept count of app `a`'s waiting
/// records, its blobs as (id, refs, bytes) by id (a blob's bytes stored exactly while its row is), and what waits as
/// `records --waiting` lists it: (sender, seq, payload, piece).
struct Beside<'a> {
    kept: &'a dyn Fn() -> i64,
    blobs: &'a dyn Fn() -> Vec<(i64, i64, i64)>,
    reader: pure_serve::store::engine::StoreReader,
}

type Listed = Vec<(String, u64, Vec<u8>, Option<u64>)>;

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

impl Beside<'_> {
    fn waiting(&self, sender: Option<&str>) -> Listed {
        let app = self.reader.app("a").unwrap();
        let mut out = Vec::new();
        app.for_each_waiting(sender, now_ms(), |w| {
            out.push((
                w.sender.to_string(),
                w.seq,
                w.payload.to_vec(),
                w.piece.map(|(_, k)| k),
            ));
            true
        })
        .unwrap();
        out
    }

    fn by_sender(&self) -> Vec<(String, u64)> {
        let app = self.reader.app("a").unwrap();
        app.waiting_by_sender(now_ms()).unwrap()
    }
}

/// The same files pushed as pieces for every engine (docs/downlink.md, "Pushing a file"; docs/store.md,
/// docs/scale-out.md): stored once for many senders, a range per sender numbered among its records, read merged in
/// sequence order within the room and above `from`, a partial delivery moving a range up, expiry deleting ranges as
/// records, the waiting count exact, a push refused whole past a bound, the blob written again by a later batch of
/// its push once every range of it went.
fn same_file_outcomes(store: &mut dyn TurnStore, beside: &Beside<'_>) {
    use pure_serve::store::downlink::DownBlob;
    let bytes: Vec<u8> = (0..2500u32).map(|i| (i % 253) as u8).collect();
    let blob = std::sync::Arc::new(DownBlob::new(bytes.clone(), 1000).unwrap());
    let limits = DownLimits::default();
    let few = DownLimits {
        max_records: 2,
        ..limits
    };
    let small = DownLimits {
        max_bytes: 2499,
        ..limits
    };
    apply_down(
        store,
        301,
        down_turn(vec![push_of("dev", &[b"before"], limits)], Vec::new()),
    );
    // The file to four senders in one part, two of them refused by a bound; the LISTEN of the same part reads the
    // record and the first piece, and its room holds no more.
    let (a, pushed) = apply_down(
        store,
        302,
        down_turn(
            vec![
                blob_push_of("dev", &blob, limits),
                blob_push_of("other", &blob, limits),
                blob_push_of("few", &blob, few),
                blob_push_of("small", &blob, small),
            ],
            vec![listen(0, "dev", 0, 1100)],
        ),
    );
    assert_eq!(
        pushed,
        vec![
            Pushed::Queued { first: 2, count: 3 },
            Pushed::Queued { first: 1, count: 3 },
            Pushed::Refused(DownRefusal::Records {
                pushing: 3,
                waiting: 0,
                max: 2
            }),
            Pushed::Refused(DownRefusal::Bytes {
                pushing: 2500,
                waiting: 0,
                max: 2499
            }),
        ]
    );
    let read = &a.down.reads[0];
    assert_eq!((read.after, read.last), (0, 4));
    assert_eq!(
        read.records,
        vec![down(1, b"before"), down(2, &bytes[..1000])]
    );
    let blobs = (beside.blobs)();
    assert_eq!(blobs.len(), 1, "stored once");
    assert_eq!((blobs[0].1, blobs[0].2), (2, 2500), "referenced twice");
    let first_id = blobs[0].0;
    assert_eq!((beside.kept)(), 7, "the kept count, pieces as records");
    // What waits, as `records --waiting` lists it: pieces among records, by sender then sequence.
    let listed = beside.waiting(None);
    let got: Vec<(&str, u64, Option<u64>)> = listed
        .iter()
        .map(|(s, q, _, k)| (s.as_str(), *q, *k))
        .collect();
    assert_eq!(
        got,
        [
            ("dev", 1, None),
            ("dev", 2, Some(0)),
            ("dev", 3, Some(1)),
            ("dev", 4, Some(2)),
            ("other", 1, Some(0)),
            ("other", 2, Some(1)),
            ("other", 3, Some(2)),
        ]
    );
    let whole: Vec<u8> = beside
        .waiting(Some("other"))
        .into_iter()
        .flat_map(|(_, _, p, _)| p)
        .collect();
    assert_eq!(whole, bytes, "the pieces make the file");
    assert_eq!(
        beside.by_sender(),
        [("dev".to_string(), 4), ("other".to_string(), 3)]
    );
    // The device has 1 and 2, and 3 is in flight (a wide session reads above it): the record is deleted, the range
    // moved up to begin at 3, and only 4 is read.
    let a = apply(
        store,
        303,
        down_turn(
            Vec::new(),
            vec![OwnedFetch {
                from: 3,
                ..listen(0, "dev", 2, 5000)
            }],
        ),
    );
    assert_eq!((a.down.delivered, a.down.expired), (2, 0));
    assert_eq!(
        a.down.reads,
        vec![FetchRead {
            index: 0,
            after: 3,
            last: 4,
            records: vec![down(4, &bytes[2000..])]
        }]
    );
    assert_eq!((beside.kept)(), 5);
    // Read from its heard: the rest of the range, at the pieces its sequences are.
    let a = apply(
        store,
        304,
        down_turn(Vec::new(), vec![listen(0, "dev", 2, 5000)]),
    );
    assert_eq!(a.down.delivered, 0);
    assert_eq!(
        a.down.reads[0].records,
        vec![down(3, &bytes[1000..2000]), down(4, &bytes[2000..])]
    );
    assert_eq!(
        beside.by_sender(),
        [("dev".to_string(), 2), ("other".to_string(), 3)]
    );
    // The waiting bytes of a range moved up are its pieces' only: 1500 wait for dev, so 1000 more fit 2500, and
    // one more byte does not.
    let tight = DownLimits {
        max_bytes: 2500,
        ..limits
    };
    let (_, pushed) = apply_down(
        store,
        305,
        down_turn(
            vec![
                push_of("dev", &[&[1u8; 1000][..]], tight),
                push_of("dev", &[b"x"], tight),
            ],
            Vec::new(),
        ),
    );
    assert_eq!(
        pushed,
        vec![
            Pushed::Queued { first: 5, count: 1 },
            Pushed::Refused(DownRefusal::Bytes {
                pushing: 1,
                waiting: 2500,
                max: 2500
            })
        ]
    );
    // A later batch of the same push (a turn of its own) refers to the blob stored, in a part that stores records
    // too (the push then a transaction of its own).
    let mut part = turn(0, vec![piece("late", 1, 2)]);
    part.pushes = vec![blob_push_of("late", &blob, limits)];
    let (a, pushed) = apply_down(store, 306, part);
    assert_eq!(a.stored, 2);
    assert_eq!(pushed, vec![Pushed::Queued { first: 1, count: 3 }]);
    let blobs = (beside.blobs)();
    assert_eq!(blobs.len(), 1, "stored once across transactions");
    assert_eq!((blobs[0].0, blobs[0].1), (first_id, 3));
    // Expiry deletes a range unsent, as a record, and drops its reference.
    let soon = DownLimits {
        expiry_ms: Some(1),
        ..limits
    };
    let other_blob = std::sync::Arc::new(DownBlob::new(vec![9; 10], 4).unwrap());
    apply_down(
        store,
        307,
        down_turn(vec![blob_push_of("exp", &other_blob, soon)], Vec::new()),
    );
    assert_eq!((beside.blobs)().len(), 2);
    std::thread::sleep(std::time::Duration::from_millis(20));
    assert!(
        beside.waiting(Some("exp")).is_empty(),
        "expired: not listed"
    );
    let a = apply(
        store,
        308,
        down_turn(Vec::new(), vec![listen(0, "exp", 0, 5000)]),
    );
    assert_eq!((a.down.delivered, a.down.expired), (0, 3));
    assert_eq!(a.down.reads[0].records, Vec::new());
    assert_eq!(a.down.reads[0].last, 0, "nothing waits");
    assert_eq!((beside.blobs)().len(), 1, "the expired range's blob went");
    // Every device has its pieces: the blob goes with the last range, and the count comes to what is left.
    for (k, (dev, heard)) in [("dev", 4), ("other", 3), ("late", 3)]
        .into_iter()
        .enumerate()
    {
        let a = apply(
            store,
            309 + k as u64,
            down_turn(Vec::new(), vec![listen(0, dev, heard, 5000)]),
        );
        assert!(a.down.delivered > 0, "{dev}");
        let left = (beside.blobs)();
        if dev == "late" {
            assert!(left.is_empty(), "deleted with its last range: {left:?}");
        } else {
            assert_eq!(left.len(), 1, "{dev}");
        }
    }
    assert_eq!((beside.kept)(), 1, "dev's record 5 waits");
    // Numbering goes on after the ranges; a later batch of the push writes the blob again, under a new id.
    let (_, pushed) = apply_down(
        store,
        320,
        down_turn(
            vec![
                push_of("other", &[b"after"], limits),
                blob_push_of("again", &blob, limits),
            ],
            vec![listen(0, "again", 0, 5000)],
        ),
    );
    assert_eq!(
        pushed,
        vec![
            Pushed::Queued { first: 4, count: 1 },
            Pushed::Queued { first: 1, count: 3 }
        ]
    );
    let blobs = (beside.blobs)();
    assert_eq!(blobs.len(), 1);
    assert!(blobs[0].0 > first_id, "ids are never given twice");
    assert_eq!((blobs[0].1, blobs[0].2), (1, 2500));
    let whole: Vec<u8> = beside
        .waiting(Some("again"))
        .into_iter()
        .flat_map(|(_, _, p, _)| p)
        .collect();
    assert_eq!(whole, bytes);
}

#[test]
fn sqlite_engine_queues_a_files_pieces_once_for_many_and_delivers_them_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let apps = vec!["a".to_string(), "b".to_string()];
    let stores = pure_serve::store::Stores::open(dir.path(), &apps).unwrap();
    let syncer = pure_serve::store::sync::Syncer::start().unwrap();
    let mut engine = pure_serve::store::sqlite_engine::SqliteTurns::new(stores, Some(syncer));
    let db = rusqlite::Connection::open(dir.path().join("apps").join("a.sqlite")).unwrap();
    let kept = || -> i64 {
        db.query_row("SELECT waiting FROM down_count", [], |r| r.get(0))
            .unwrap()
    };
    let blobs = || -> Vec<(i64, i64, i64)> {
        let count = |t: &str| -> i64 {
            db.query_row(&format!("SELECT COUNT(*) FROM {t}"), [], |r| r.get(0))
                .unwrap()
        };
        assert_eq!(count("down_blobs"), count("down_blob_bytes"));
        let mut q = db
            .prepare(
                "SELECT b.id, b.refs, LENGTH(y.bytes) FROM down_blobs b JOIN down_blob_bytes y ON y.id = b.id \
                 ORDER BY b.id",
            )
            .unwrap();
        q.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    };
    let reader = pure_serve::store::engine::StoreReader::open(
        &pure_serve::store::engine::StoreChoice::Sqlite,
        dir.path(),
        None,
    )
    .unwrap();
    same_file_outcomes(
        &mut engine,
        &Beside {
            kept: &kept,
            blobs: &blobs,
            reader,
        },
    );
}

#[test]
fn postgres_engine_queues_a_files_pieces_once_for_many_and_delivers_them_in_order() {
    let Some(cluster) = pg_util::PgCluster::start(
        "postgres_engine_queues_a_files_pieces_once_for_many_and_delivers_them_in_order",
    ) else {
        return;
    };
    let mut engine = pg_engine(&cluster);
    let conninfo = cluster.conninfo();
    let kept = || -> i64 {
        one_row(
            &conninfo,
            "SELECT c.waiting::text FROM down_counts c JOIN apps a ON a.id = c.app WHERE a.name = 'a'",
        )
        .parse()
        .unwrap()
    };
    let blobs = || -> Vec<(i64, i64, i64)> {
        pg_util::sql(&conninfo, async |client| {
            let count = |t: &'static str| async move {
                client
                    .query_one(&format!("SELECT count(*) FROM {t}"), &[])
                    .await
                    .unwrap()
                    .get::<_, i64>(0)
            };
            assert_eq!(count("down_blobs").await, count("down_blob_bytes").await);
            client
                .query(
                    "SELECT b.id, b.refs, length(y.bytes)::bigint FROM down_blobs b \
                     JOIN down_blob_bytes y ON y.app = b.app AND y.id = b.id \
                     JOIN apps a ON a.id = b.app WHERE a.name = 'a' ORDER BY b.id",
                    &[],
                )
                .await
                .unwrap()
                .iter()
                .map(|r| (r.get(0), r.get(1), r.get(2)))
                .collect()
        })
    };
    let reader = pure_serve::store::engine::StoreReader::open(
        &pure_serve::store::engine::StoreChoice::Postgres(cluster.url()),
        std::path::Path::new("/nonexistent"),
        None,
    )
    .unwrap();
    same_file_outcomes(
        &mut engine,
        &Beside {
            kept: &kept,
            blobs: &blobs,
            reader,
        },
    );
    // The bytes are kept uncompressed out of line, so that a piece's read fetches only its chunks.
    assert_eq!(
        one_row(
            &conninfo,
            "SELECT attstorage::text FROM pg_attribute WHERE attrelid = 'down_blob_bytes'::regclass \
             AND attname = 'bytes'",
        ),
        "e"
    );
}

/// Three nodes at once on one file (docs/scale-out.md, "Downlink on a fleet"): two deliver its pieces to devices
/// (each dropping a reference to the one blob) while the third queues it for more senders in later batches of its
/// push (each taking a reference by the id the first batch kept). No reference is lost or counted twice: once every
/// device has its pieces the blob and its bytes are gone, and the kept count is 0.
#[test]
fn postgres_engines_delivering_and_pushing_one_file_at_once_keep_its_references_exact() {
    let Some(cluster) = pg_util::PgCluster::start(
        "postgres_engines_delivering_and_pushing_one_file_at_once_keep_its_references_exact",
    ) else {
        return;
    };
    const EACH: usize = 24;
    let bytes: Vec<u8> = (0..300u32).map(|i| i as u8).collect();
    let blob = std::sync::Arc::new(
        pure_serve::store::downlink::DownBlob::new(bytes.clone(), 100).unwrap(),
    );
    let limits = DownLimits::default();
    let names = |who: &str| -> Vec<String> { (0..EACH).map(|k| format!("{who}-{k:02}")).collect() };
    let mut first = pg_engine(&cluster);
    let pushes: Vec<DownPush> = names("d0")
        .iter()
        .chain(names("d1").iter())
        .map(|n| blob_push_of(n, &blob, limits))
        .collect();
    let (_, pushed) = apply_down(&mut first, 1, down_turn(pushes, Vec::new()));
    assert!(
        pushed
            .iter()
            .all(|p| *p == Pushed::Queued { first: 1, count: 3 })
    );
    drop(first);
    let start = std::sync::Arc::new(std::sync::Barrier::new(3));
    let threads: Vec<_> = (0..3)
        .map(|w| {
            let (url, start, blob) = (cluster.url(), start.clone(), blob.clone());
            let mine = names(&format!("d{w}"));
            std::thread::spawn(move || {
                let apps = vec!["a".to_string(), "b".to_string()];
                let mut engine = PostgresTurns::open(&url, None, &apps).unwrap();
                start.wait();
                for (k, n) in mine.iter().enumerate() {
                    if w == 2 {
                        // A later batch of the push: one sender a turn, by the id the first batch kept.
                        let (_, pushed) = apply_down(
                            &mut engine,
                            k as u64 + 1,
                            down_turn(vec![blob_push_of(n, &blob, limits)], Vec::new()),
                        );
                        assert_eq!(pushed, vec![Pushed::Queued { first: 1, count: 3 }]);
                    } else {
                        let a = apply(
                            &mut engine,
                            k as u64 + 1,
                            down_turn(Vec::new(), vec![listen(0, n, 3, 5000)]),
                        );
                        assert_eq!(a.down.delivered, 3, "{n}");
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let count = |sql: &str| -> i64 { one_row(&cluster.conninfo(), sql).parse().unwrap() };
    assert_eq!(
        count("SELECT count(*)::text FROM down_blobs"),
        1,
        "stored once"
    );
    assert_eq!(
        count("SELECT refs::text FROM down_blobs"),
        EACH as i64,
        "a reference per range left"
    );
    assert_eq!(
        count("SELECT waiting::text FROM down_counts"),
        3 * EACH as i64
    );
    let mut last = pg_engine(&cluster);
    let listens: Vec<OwnedFetch> = names("d2")
        .iter()
        .enumerate()
        .map(|(k, n)| listen(k, n, 3, 5000))
        .collect();
    let a = apply(&mut last, 1, down_turn(Vec::new(), listens));
    assert_eq!(a.down.delivered, 3 * EACH as u64);
    assert_eq!(a.down.waiting, Some(0));
    assert_eq!(count("SELECT count(*)::text FROM down_blobs"), 0);
    assert_eq!(count("SELECT count(*)::text FROM down_blob_bytes"), 0);
    assert_eq!(count("SELECT count(*)::text FROM down_ranges"), 0);
}

/// Waits until `sql` (a count, as text) says `want`: for a state of the database the test made happen, not for time.
fn until_row(conninfo: &str, sql: &str, want: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while one_row(conninfo, sql) != want {
        assert!(
            std::time::Instant::now() < deadline,
            "{sql} never said {want}"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Turns that queue behind one the database holds up are applied together, per app in one transaction (one WAL
/// flush: research/047), and each turn's outcome is what it would have been had they committed one after another:
/// a turn overlapping the one before it finds its records duplicates, a gap stays a gap, positions follow the turns'
/// order, and another app's part is its own.
#[test]
fn a_postgres_engine_applies_turns_queued_behind_a_slow_one_together_each_with_its_own_outcome() {
    let Some(cluster) = pg_util::PgCluster::start(
        "a_postgres_engine_applies_turns_queued_behind_a_slow_one_together_each_with_its_own_outcome",
    ) else {
        return;
    };
    let conninfo = cluster.conninfo();
    let mut engine = pg_engine(&cluster);
    apply(&mut engine, 1, turn(0, vec![piece("dev", 1, 2)]));
    // Another client holds app a's head row, so the next turn waits in its transaction and the ones after it queue.
    let (release, released) = std::sync::mpsc::channel::<()>();
    let (held_tx, held) = std::sync::mpsc::channel::<()>();
    let holder = {
        let conninfo = conninfo.clone();
        std::thread::spawn(move || {
            pg_util::sql(&conninfo, async |c| {
                c.batch_execute("BEGIN; SELECT head FROM apps WHERE name = 'a' FOR UPDATE")
                    .await
                    .unwrap();
                held_tx.send(()).unwrap();
                released.recv().unwrap();
                c.batch_execute("COMMIT").await.unwrap();
            })
        })
    };
    held.recv().unwrap();
    engine.submit(2, vec![turn(0, vec![piece("dev", 3, 2)])]);
    until_row(
        &conninfo,
        "SELECT count(*)::text FROM pg_stat_activity \
         WHERE application_name = 'pure-serve' AND wait_event_type = 'Lock'",
        "1",
    );
    engine.submit(
        3,
        vec![turn(0, vec![piece("dev", 4, 3), piece("new", 1, 1)])],
    );
    engine.submit(
        4,
        vec![
            turn(0, vec![piece("dev", 9, 1)]),
            turn(1, vec![piece("dev", 1, 1)]),
        ],
    );
    engine.submit(5, vec![turn(0, vec![piece("dev", 7, 2)])]);
    release.send(()).unwrap();
    holder.join().unwrap();
    let mut outcomes: Vec<TurnOutcome> = Vec::new();
    while outcomes.len() < 4 {
        outcomes.extend(engine.wait_done());
    }
    let seqs: Vec<u64> = outcomes.iter().map(|o| o.seq).collect();
    assert_eq!(seqs, vec![2, 3, 4, 5], "every outcome, in order");
    let mut parts: Vec<(u64, u16, Applied)> = Vec::new();
    for o in outcomes {
        for (app, r) in o.apps {
            parts.push((o.seq, app, r.expect("the part is applied")));
        }
    }
    let chunks = |a: &Applied| -> Vec<(String, u64, u64, u64)> {
        a.new_chunks
            .iter()
            .map(|c| (c.source.clone(), c.pos, c.first_seq, c.count))
            .collect()
    };
    let said: Vec<_> = parts
        .iter()
        .map(|(seq, app, a)| {
            (
                *seq,
                *app,
                (a.stored, a.duplicate, a.gap),
                a.heard.clone(),
                chunks(a),
                a.head,
            )
        })
        .collect();
    let s = |v: &str| v.to_string();
    assert_eq!(
        said,
        vec![
            (
                2,
                0,
                (2, 0, 0),
                vec![(s("dev"), 4)],
                vec![(s("dev"), 3, 3, 2)],
                5
            ),
            (
                3,
                0,
                (3, 1, 0),
                vec![(s("dev"), 6), (s("new"), 1)],
                vec![(s("dev"), 5, 5, 2), (s("new"), 7, 1, 1)],
                8
            ),
            (4, 0, (0, 0, 1), vec![(s("dev"), 6)], vec![], 0),
            (
                4,
                1,
                (1, 0, 0),
                vec![(s("dev"), 1)],
                vec![(s("dev"), 1, 1, 1)],
                2
            ),
            (
                5,
                0,
                (2, 0, 0),
                vec![(s("dev"), 8)],
                vec![(s("dev"), 8, 7, 2)],
                10
            ),
        ]
    );
    // The turns that queued went in one transaction: their chunks share the inserting transaction's id.
    assert_eq!(
        one_row(
            &conninfo,
            "SELECT count(DISTINCT c.xmin::text)::text FROM chunks c JOIN apps a ON a.id = c.app \
             WHERE a.name = 'a' AND c.pos >= 5",
        ),
        "1",
        "turns 3 and 5 committed together"
    );
    let (stored, heard, head) = pg_contents(&conninfo, "a");
    let all: Vec<String> = stored
        .iter()
        .filter(|c| c.0 == "dev")
        .flat_map(|c| payloads(&c.4))
        .collect();
    let want: Vec<String> = (1..=8).map(|s| format!("r{s}")).collect();
    assert_eq!(all, want, "each of dev's records once, in sequence");
    assert_eq!(heard, vec![(s("dev"), 8), (s("new"), 1)]);
    assert_eq!(head, 10);
}

/// A turn is cut against the heard sequences its engine last read or committed and written in one wait (research/047);
/// when another node moved one meanwhile, the conditional update finds it moved, the transaction rolls back, and the
/// turn is applied again against what the database holds: each record stored once.
#[test]
fn a_postgres_engine_that_knew_an_older_heard_sequence_stores_each_record_once() {
    let Some(cluster) = pg_util::PgCluster::start(
        "a_postgres_engine_that_knew_an_older_heard_sequence_stores_each_record_once",
    ) else {
        return;
    };
    let mut a = pg_engine(&cluster);
    let mut b = pg_engine(&cluster);
    assert_eq!(
        apply(&mut a, 1, turn(0, vec![piece("dev", 1, 5)])).stored,
        5
    );
    // Both sources' rows and heard sequences known to a from here on: its next turns are written in one wait.
    assert_eq!(
        apply(
            &mut a,
            2,
            turn(0, vec![piece("dev", 6, 1), piece("side", 1, 1)])
        )
        .stored,
        2
    );
    // Another node stores the next four; a still knows 6.
    let r = apply(&mut b, 1, turn(0, vec![piece("dev", 7, 4)]));
    assert_eq!(
        (r.stored, r.heard.clone()),
        (4, vec![("dev".to_string(), 10)])
    );
    let r = apply(
        &mut a,
        3,
        turn(0, vec![piece("dev", 7, 6), piece("side", 2, 1)]),
    );
    assert_eq!((r.stored, r.duplicate, r.gap), (3, 4, 0));
    assert_eq!(
        r.heard,
        vec![("dev".to_string(), 12), ("side".to_string(), 2)]
    );
    let got: Vec<(String, u64, u64, u64)> = r
        .new_chunks
        .iter()
        .map(|c| (c.source.clone(), c.pos, c.first_seq, c.count))
        .collect();
    assert_eq!(
        got,
        vec![("dev".into(), 12, 11, 2), ("side".into(), 14, 2, 1)]
    );
    let (chunks, heard, head) = pg_contents(&cluster.conninfo(), "a");
    let all: Vec<String> = chunks
        .iter()
        .filter(|c| c.0 == "dev")
        .flat_map(|c| payloads(&c.4))
        .collect();
    let want: Vec<String> = (1..=12).map(|s| format!("r{s}")).collect();
    assert_eq!(all, want, "each of dev's records once, in sequence");
    assert_eq!(
        heard,
        vec![("dev".to_string(), 12), ("side".to_string(), 2)]
    );
    assert_eq!(head, 15);
}

/// The tables whose rows every turn moves leave half of each page free: `sources` (a heard sequence, research/047)
/// and `down_flows` (a push's next sequence, research/043 addendum 3). The new row version is then written on the
/// same page (a HOT update), adding no index entries.
#[test]
fn the_tables_a_node_makes_leave_room_to_move_heard_and_next_sequences_in_place() {
    let Some(cluster) = pg_util::PgCluster::start(
        "the_tables_a_node_makes_leave_room_to_move_heard_and_next_sequences_in_place",
    ) else {
        return;
    };
    let _engine = pg_engine(&cluster);
    for table in ["sources", "down_flows"] {
        assert_eq!(
            one_row(
                &cluster.conninfo(),
                &format!(
                    "SELECT array_to_string(reloptions, ',') FROM pg_class WHERE relname = '{table}'"
                ),
            ),
            "fillfactor=50",
            "{table}"
        );
    }
}
