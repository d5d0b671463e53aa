//! research/017: commits turn-shaped transactions, as the node does, to SQLite or PostgreSQL, and prints one JSON
//! line of what it did.
//!
//! A turn is one transaction per app: per source that has new records one chunk row (`records` records of 32
//! bytes, each behind its one-byte length, as the wire has them), the source's heard sequence moved in the same
//! transaction. SQLite: the node's settings (WAL, `synchronous=NORMAL`) and an `fdatasync` of the `-wal` after
//! each commit. PostgreSQL: the turn's source rows locked (`FOR UPDATE`, in id order), the heard sequences moved,
//! the app's positions taken from its head row (locked to the commit: positions visible in commit order), the
//! chunks inserted from arrays, all pipelined: two round trips of waiting per turn.
//!
//! Usage: fleet-store-017 sqlite DIR SOURCES RECORDS SECONDS
//!        fleet-store-017 pg CONNINFO SOURCES RECORDS SECONDS WRITERS shared|own [copy]
//!        fleet-store-017 pg2 CONNINFO SOURCES RECORDS SECONDS WRITERS plain|external|capN|race

use std::time::{Duration, Instant};

/// `records` records of 32 bytes that do not compress (as sensor readings and sealed payloads mostly do not):
/// PostgreSQL tries to compress any value over 2 KB before it stores it out of line.
fn body(records: usize) -> Vec<u8> {
    let mut b = Vec::with_capacity(records * 33);
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..records {
        b.push(32);
        for _ in 0..32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            b.push(x as u8);
        }
    }
    b
}

fn sqlite(dir: &str, sources: usize, records: usize, seconds: f64) -> serde_json::Value {
    let path = std::path::Path::new(dir).join("app.sqlite");
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(path.with_extension("sqlite-wal"));
    let _ = std::fs::remove_file(path.with_extension("sqlite-shm"));
    let mut db = rusqlite::Connection::open(&path).unwrap();
    db.execute_batch(
        "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;
         CREATE TABLE sources (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, heard INTEGER NOT NULL);
         CREATE TABLE chunks (source INTEGER NOT NULL, first_seq INTEGER NOT NULL, count INTEGER NOT NULL,
             body BLOB NOT NULL, pos INTEGER, stored_at INTEGER NOT NULL DEFAULT 0,
             format INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (source, first_seq));
         CREATE UNIQUE INDEX chunks_pos ON chunks(pos);",
    )
    .unwrap();
    for s in 0..sources {
        db.execute(
            "INSERT INTO sources (id, name, heard) VALUES (?1, ?2, 0)",
            rusqlite::params![s as i64 + 1, format!("s{s}")],
        )
        .unwrap();
    }
    let wal = std::fs::OpenOptions::new()
        .read(true)
        .open(path.with_extension("sqlite-wal"))
        .unwrap();
    let chunk = body(records);
    let mut heard = vec![0i64; sources];
    let mut head = 0i64;
    let (mut turns, mut stored) = (0u64, 0u64);
    let start = Instant::now();
    while start.elapsed().as_secs_f64() < seconds {
        let tx = db.transaction().unwrap();
        {
            let mut get = tx
                .prepare_cached("SELECT heard FROM sources WHERE id = ?1")
                .unwrap();
            let mut set = tx
                .prepare_cached("UPDATE sources SET heard = ?1 WHERE id = ?2")
                .unwrap();
            let mut put = tx
                .prepare_cached(
                    "INSERT INTO chunks (source, first_seq, count, body, pos, stored_at, format)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, 0)",
                )
                .unwrap();
            for (s, h) in heard.iter_mut().enumerate() {
                let id = s as i64 + 1;
                let found: i64 = get.query_row([id], |r| r.get(0)).unwrap();
                assert_eq!(found, *h);
                put.execute(rusqlite::params![
                    id,
                    *h + 1,
                    records as i64,
                    &chunk,
                    head + 1,
                    1i64
                ])
                .unwrap();
                *h += records as i64;
                head += records as i64;
                set.execute([*h, id]).unwrap();
            }
        }
        tx.commit().unwrap();
        wal.sync_data().unwrap();
        turns += 1;
        stored += (sources * records) as u64;
    }
    let secs = start.elapsed().as_secs_f64();
    serde_json::json!({
        "engine": "sqlite", "sources": sources, "records": records, "writers": 1, "apps": "own",
        "seconds": secs, "turns_per_s": turns as f64 / secs, "records_per_s": stored as f64 / secs,
    })
}

struct Pg {
    client: tokio_postgres::Client,
    begin: tokio_postgres::Statement,
    commit: tokio_postgres::Statement,
    lock: tokio_postgres::Statement,
    heard: tokio_postgres::Statement,
    head: tokio_postgres::Statement,
    insert: tokio_postgres::Statement,
}

async fn connect(conninfo: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(conninfo, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            eprintln!("connection: {e}");
        }
    });
    client
}

async fn pg_setup(conninfo: &str, sources: usize, writers: usize, shared: bool) {
    let c = connect(conninfo).await;
    c.batch_execute(
        "DROP TABLE IF EXISTS chunks, sources, apps;
         CREATE TABLE apps (id INTEGER PRIMARY KEY, head BIGINT NOT NULL);
         CREATE TABLE sources (id BIGINT PRIMARY KEY, app INTEGER NOT NULL, name TEXT NOT NULL,
             heard BIGINT NOT NULL, UNIQUE (app, name));
         CREATE TABLE chunks (app INTEGER NOT NULL, source BIGINT NOT NULL, first_seq BIGINT NOT NULL,
             count INTEGER NOT NULL, body BYTEA NOT NULL, pos BIGINT NOT NULL, stored_at BIGINT NOT NULL,
             format SMALLINT NOT NULL, PRIMARY KEY (app, source, first_seq));
         CREATE UNIQUE INDEX chunks_pos ON chunks (app, pos);",
    )
    .await
    .unwrap();
    let apps = if shared { 1 } else { writers };
    for a in 0..apps {
        c.execute("INSERT INTO apps VALUES ($1, 0)", &[&(a as i32)])
            .await
            .unwrap();
    }
    for w in 0..writers {
        let app = if shared { 0 } else { w as i32 };
        let ids: Vec<i64> = (0..sources).map(|s| (w * sources + s) as i64 + 1).collect();
        let names: Vec<String> = (0..sources).map(|s| format!("w{w}-s{s}")).collect();
        c.execute(
            "INSERT INTO sources SELECT i, $1, n, 0 FROM unnest($2::bigint[], $3::text[]) u(i, n)",
            &[&app, &ids, &names],
        )
        .await
        .unwrap();
    }
}

async fn pg_writer(
    conninfo: String,
    w: usize,
    sources: usize,
    records: usize,
    shared: bool,
    copy: bool,
    until: Instant,
) -> (u64, u64) {
    let client = connect(&conninfo).await;
    // BEGIN and COMMIT prepared too: a statement given as text is prepared first (a round trip), so in a pipeline
    // the prepared statements behind it would reach the server before it, outside the transaction.
    let pg = Pg {
        begin: client.prepare("BEGIN").await.unwrap(),
        commit: client.prepare("COMMIT").await.unwrap(),
        lock: client
            .prepare(
                "SELECT id, heard FROM sources WHERE id = ANY($1::bigint[]) ORDER BY id FOR UPDATE",
            )
            .await
            .unwrap(),
        heard: client
            .prepare(
                "UPDATE sources s SET heard = u.h FROM unnest($1::bigint[], $2::bigint[]) u(id, h) \
                 WHERE s.id = u.id",
            )
            .await
            .unwrap(),
        head: client
            .prepare("UPDATE apps SET head = head + $2 WHERE id = $1 RETURNING head")
            .await
            .unwrap(),
        insert: client
            .prepare(
                "INSERT INTO chunks (app, source, first_seq, count, body, pos, stored_at, format) \
                 SELECT $1, u.s, u.f, u.c, u.b, a.head - $2 + u.o, $3, 0 \
                 FROM unnest($4::bigint[], $5::bigint[], $6::int[], $7::bytea[], $8::bigint[]) u(s, f, c, b, o), \
                 apps a WHERE a.id = $1",
            )
            .await
            .unwrap(),
        client,
    };
    let app = if shared { 0i32 } else { w as i32 };
    let ids: Vec<i64> = (0..sources).map(|s| (w * sources + s) as i64 + 1).collect();
    let chunk = body(records);
    let mut heard = vec![0i64; sources];
    let n = (sources * records) as i64;
    let (mut turns, mut stored) = (0u64, 0u64);
    while Instant::now() < until {
        let lock_args: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&ids];
        let (_, locked) = futures_util::try_join!(
            pg.client.execute(&pg.begin, &[]),
            pg.client.query(&pg.lock, &lock_args)
        )
        .unwrap();
        for (row, h) in locked.iter().zip(&heard) {
            // Trim each chunk to what is past the heard sequence found under the lock: here nothing races, so
            // the whole chunk is new.
            let found: i64 = row.get(1);
            assert_eq!(found, *h);
        }
        let first: Vec<i64> = heard.iter().map(|h| h + 1).collect();
        for h in heard.iter_mut() {
            *h += records as i64;
        }
        let counts = vec![records as i32; sources];
        let offsets: Vec<i64> = (0..sources).map(|s| (s * records) as i64 + 1).collect();
        let heard_args: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&ids, &heard];
        let head_args: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&app, &n];
        if copy {
            futures_util::try_join!(
                pg.client.execute(&pg.heard, &heard_args),
                pg.client.query_one(&pg.head, &head_args),
            )
            .unwrap();
            let row = pg
                .client
                .query_one("SELECT head FROM apps WHERE id = $1", &[&app])
                .await
                .unwrap();
            let head: i64 = row.get(0);
            copy_chunks(
                &pg.client,
                app,
                &ids,
                &first,
                records,
                &chunk,
                head - n,
                &offsets,
            )
            .await;
            pg.client.execute(&pg.commit, &[]).await.unwrap();
        } else {
            let bodies: Vec<&[u8]> = vec![&chunk[..]; sources];
            let insert_args: [&(dyn tokio_postgres::types::ToSql + Sync); 8] =
                [&app, &n, &1i64, &ids, &first, &counts, &bodies, &offsets];
            futures_util::try_join!(
                pg.client.execute(&pg.heard, &heard_args),
                pg.client.query_one(&pg.head, &head_args),
                pg.client.execute(&pg.insert, &insert_args),
                pg.client.execute(&pg.commit, &[]),
            )
            .unwrap();
        }
        turns += 1;
        stored += n as u64;
    }
    (turns, stored)
}

#[allow(clippy::too_many_arguments)]
async fn copy_chunks(
    client: &tokio_postgres::Client,
    app: i32,
    ids: &[i64],
    first: &[i64],
    records: usize,
    chunk: &[u8],
    base: i64,
    offsets: &[i64],
) {
    use tokio_postgres::binary_copy::BinaryCopyInWriter;
    use tokio_postgres::types::Type;
    let sink = client
        .copy_in(
            "COPY chunks (app, source, first_seq, count, body, pos, stored_at, format) FROM STDIN BINARY",
        )
        .await
        .unwrap();
    let types = [
        Type::INT4,
        Type::INT8,
        Type::INT8,
        Type::INT4,
        Type::BYTEA,
        Type::INT8,
        Type::INT8,
        Type::INT2,
    ];
    let writer = BinaryCopyInWriter::new(sink, &types);
    futures_util::pin_mut!(writer);
    for i in 0..ids.len() {
        let pos = base + offsets[i];
        writer
            .as_mut()
            .write(&[
                &app,
                &ids[i],
                &first[i],
                &(records as i32),
                &chunk,
                &pos,
                &1i64,
                &0i16,
            ])
            .await
            .unwrap();
    }
    writer.finish().await.unwrap();
}

fn pg(
    conninfo: &str,
    sources: usize,
    records: usize,
    seconds: f64,
    writers: usize,
    shared: bool,
    copy: bool,
) -> serde_json::Value {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(pg_setup(conninfo, sources, writers, shared));
    let start = Instant::now();
    let until = start + Duration::from_secs_f64(seconds);
    // A thread and a connection per writer, as nodes would be.
    let handles: Vec<_> = (0..writers)
        .map(|w| {
            let conninfo = conninfo.to_string();
            std::thread::spawn(move || {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap()
                    .block_on(pg_writer(
                        conninfo, w, sources, records, shared, copy, until,
                    ))
            })
        })
        .collect();
    let (mut turns, mut stored) = (0u64, 0u64);
    for h in handles {
        let (t, s) = h.join().unwrap();
        turns += t;
        stored += s;
    }
    let secs = start.elapsed().as_secs_f64();
    // What the turns left must be whole: positions 1..head with no gap, each once.
    let check = rt.block_on(async {
        let c = connect(conninfo).await;
        let row = c
            .query_one(
                "SELECT count(*), coalesce(sum(count), 0)::bigint, \
                 coalesce(sum(count) FILTER (WHERE pos + count - 1 <= (SELECT max(head) FROM apps)), 0)::bigint \
                 FROM chunks",
                &[],
            )
            .await
            .unwrap();
        let gaps = c
            .query_one(
                "SELECT count(*) FROM (SELECT pos, count, lead(pos) OVER (PARTITION BY app ORDER BY pos) AS next \
                 FROM chunks) t WHERE next IS NOT NULL AND next <> pos + count",
                &[],
            )
            .await
            .unwrap();
        (row.get::<_, i64>(1), gaps.get::<_, i64>(0))
    });
    assert_eq!(check.0 as u64, stored, "records stored");
    assert_eq!(check.1, 0, "positions with gaps");
    serde_json::json!({
        "engine": if copy { "pg-copy" } else { "pg" }, "sources": sources, "records": records,
        "writers": writers, "apps": if shared { "shared" } else { "own" },
        "seconds": secs, "turns_per_s": turns as f64 / secs, "records_per_s": stored as f64 / secs,
    })
}

/// The follow-up variants (written after the first results): `external` (the body column never compressed),
/// `capN` (a source's records of a turn in rows of at most N records, so a row stays inline), `race` (every writer
/// proposes the same sources' next records, as a sender that reaches two nodes at once: each turn stores only
/// what is past the heard sequence found under the lock, and the end checks that each source's chunks cover
/// `1..=heard` exactly once).
fn pg2(
    conninfo: &str,
    sources: usize,
    records: usize,
    seconds: f64,
    writers: usize,
    variant: &str,
) -> serde_json::Value {
    let race = variant == "race";
    let cap = variant
        .strip_prefix("cap")
        .map(|n| n.parse::<usize>().unwrap())
        .unwrap_or(records);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // The race's writers share one app and one set of sources (writer 0's); the others each have their own.
    rt.block_on(async {
        pg_setup(
            conninfo,
            sources,
            if race { 1 } else { writers },
            race || writers == 1,
        )
        .await;
        if variant == "external" {
            connect(conninfo)
                .await
                .batch_execute("ALTER TABLE chunks ALTER COLUMN body SET STORAGE EXTERNAL")
                .await
                .unwrap();
        }
    });
    let start = Instant::now();
    let until = start + Duration::from_secs_f64(seconds);
    let handles: Vec<_> = (0..writers)
        .map(|w| {
            let conninfo = conninfo.to_string();
            std::thread::spawn(move || {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap()
                    .block_on(pg2_writer(
                        conninfo,
                        if race { 0 } else { w },
                        sources,
                        records,
                        cap,
                        until,
                    ))
            })
        })
        .collect();
    let (mut turns, mut stored, mut dup) = (0u64, 0u64, 0u64);
    for h in handles {
        let (t, s, d) = h.join().unwrap();
        turns += t;
        stored += s;
        dup += d;
    }
    let secs = start.elapsed().as_secs_f64();
    let (total, bad_seq, bad_pos, heard_mismatch) = rt.block_on(async {
        let c = connect(conninfo).await;
        let total: i64 = c.query_one("SELECT coalesce(sum(count), 0)::bigint FROM chunks", &[]).await.unwrap().get(0);
        let bad_seq: i64 = c
            .query_one(
                "SELECT count(*) FROM (SELECT first_seq, count, lag(first_seq + count) OVER (PARTITION BY source \
                 ORDER BY first_seq) AS expect FROM chunks) t WHERE first_seq <> coalesce(expect, 1)",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        let bad_pos: i64 = c
            .query_one(
                "SELECT count(*) FROM (SELECT pos, lag(pos + count) OVER (PARTITION BY app ORDER BY pos) AS expect \
                 FROM chunks) t WHERE pos <> coalesce(expect, 1)",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        let heard_mismatch: i64 = c
            .query_one(
                "SELECT count(*) FROM sources s WHERE s.heard <> (SELECT coalesce(sum(count), 0) FROM chunks c \
                 WHERE c.source = s.id)",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        (total, bad_seq, bad_pos, heard_mismatch)
    });
    assert_eq!(total as u64, stored, "records stored");
    assert_eq!(
        (bad_seq, bad_pos, heard_mismatch),
        (0, 0, 0),
        "sequences, positions and heard sequences whole"
    );
    serde_json::json!({
        "engine": format!("pg-{variant}"), "sources": sources, "records": records, "writers": writers,
        "apps": if race || writers == 1 { "shared" } else { "own" },
        "seconds": secs, "turns_per_s": turns as f64 / secs, "records_per_s": stored as f64 / secs,
        "duplicates_skipped_per_s": dup as f64 / secs,
    })
}

async fn pg2_writer(
    conninfo: String,
    w: usize,
    sources: usize,
    records: usize,
    cap: usize,
    until: Instant,
) -> (u64, u64, u64) {
    let client = connect(&conninfo).await;
    let begin = client.prepare("BEGIN").await.unwrap();
    let commit = client.prepare("COMMIT").await.unwrap();
    let lock = client
        .prepare(
            "SELECT id, heard FROM sources WHERE id = ANY($1::bigint[]) ORDER BY id FOR UPDATE",
        )
        .await
        .unwrap();
    let set_heard = client
        .prepare("UPDATE sources s SET heard = u.h FROM unnest($1::bigint[], $2::bigint[]) u(id, h) WHERE s.id = u.id")
        .await
        .unwrap();
    let head = client
        .prepare("UPDATE apps SET head = head + $2 WHERE id = $1 RETURNING head")
        .await
        .unwrap();
    let insert = client
        .prepare(
            "INSERT INTO chunks (app, source, first_seq, count, body, pos, stored_at, format) \
             SELECT $1, u.s, u.f, u.c, u.b, a.head - $2 + u.o, $3, 0 \
             FROM unnest($4::bigint[], $5::bigint[], $6::int[], $7::bytea[], $8::bigint[]) u(s, f, c, b, o), \
             apps a WHERE a.id = $1",
        )
        .await
        .unwrap();
    let app = w as i32;
    let ids: Vec<i64> = (0..sources).map(|s| (w * sources + s) as i64 + 1).collect();
    let chunk = body(records);
    let mut local = vec![0i64; sources];
    let (mut turns, mut stored, mut dup) = (0u64, 0u64, 0u64);
    while Instant::now() < until {
        let lock_args: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&ids];
        let (_, locked) = futures_util::try_join!(
            client.execute(&begin, &[]),
            client.query(&lock, &lock_args)
        )
        .unwrap();
        let (mut r_src, mut r_first, mut r_count, mut r_body, mut r_off) =
            (vec![], vec![], vec![], vec![], vec![]);
        let (mut h_ids, mut h_new) = (vec![], vec![]);
        let mut n = 0i64;
        for (s, row) in locked.iter().enumerate() {
            let found: i64 = row.get(1);
            // This writer proposes its next records from what it last knew; what another writer stored since is
            // cut off here, under the lock, as the node's store cuts a frame that overlaps the heard sequence.
            let first = local[s] + 1;
            let end = first + records as i64 - 1;
            if found >= end {
                dup += records as u64;
                local[s] = found;
                continue;
            }
            let from = found.max(first - 1) + 1;
            dup += (from - first) as u64;
            let mut seq = from;
            while seq <= end {
                let count = ((end - seq + 1) as usize).min(cap);
                let at = (seq - first) as usize * 33;
                r_src.push(ids[s]);
                r_first.push(seq);
                r_count.push(count as i32);
                r_body.push(&chunk[at..at + count * 33]);
                r_off.push(n + 1);
                n += count as i64;
                seq += count as i64;
            }
            h_ids.push(ids[s]);
            h_new.push(end);
            local[s] = end;
        }
        if n == 0 {
            client.execute(&commit, &[]).await.unwrap();
        } else {
            let heard_args: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&h_ids, &h_new];
            let head_args: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&app, &n];
            let insert_args: [&(dyn tokio_postgres::types::ToSql + Sync); 8] =
                [&app, &n, &1i64, &r_src, &r_first, &r_count, &r_body, &r_off];
            futures_util::try_join!(
                client.execute(&set_heard, &heard_args),
                client.query_one(&head, &head_args),
                client.execute(&insert, &insert_args),
                client.execute(&commit, &[]),
            )
            .unwrap();
        }
        turns += 1;
        stored += n as u64;
    }
    (turns, stored, dup)
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let num = |i: usize| a[i].parse::<usize>().unwrap();
    let out = match a[1].as_str() {
        "sqlite" => sqlite(&a[2], num(3), num(4), a[5].parse().unwrap()),
        "pg" => pg(
            &a[2],
            num(3),
            num(4),
            a[5].parse().unwrap(),
            num(6),
            a[7] == "shared",
            a.get(8).is_some_and(|c| c == "copy"),
        ),
        "pg2" => pg2(&a[2], num(3), num(4), a[5].parse().unwrap(), num(6), &a[7]),
        other => panic!("unknown engine {other}"),
    };
    println!("{out}");
}
