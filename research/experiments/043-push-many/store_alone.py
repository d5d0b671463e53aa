#!/usr/bin/env python3
"""The limit beside a push of many (research/043): the same downlink rows written by SQLite alone, in the node's
layout (src/store/downlink.rs: down_flows, downlink, down_count), in transactions of 8,192 lines like the node's
batches, WAL with synchronous=FULL (the node's NORMAL plus its own fdatasync per commit is the same durability):
for each line the flow's next sequence read and advanced, the row inserted, the count bumped. Prints a JSON line.

usage: store_alone.py DB LINES VARIANT RUN"""
import json, os, sqlite3, sys, time

db_path, lines_path, variant, run = sys.argv[1:5]
lines = [l.rstrip("\n").split(" ", 1) for l in open(lines_path)]
db = sqlite3.connect(db_path, isolation_level=None)
db.execute("PRAGMA journal_mode=WAL")
db.execute("PRAGMA synchronous=FULL")
db.executescript("""
CREATE TABLE down_flows (sender TEXT PRIMARY KEY, next_seq INTEGER NOT NULL, acked INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE downlink (sender TEXT NOT NULL, seq INTEGER NOT NULL, payload BLOB NOT NULL, queued_at INTEGER NOT NULL,
    expires_at INTEGER, PRIMARY KEY (sender, seq)) WITHOUT ROWID;
CREATE TABLE down_count (one INTEGER PRIMARY KEY CHECK (one = 1), waiting INTEGER NOT NULL);
INSERT INTO down_count VALUES (1, 0);
""")
t0 = time.time()
now = int(t0 * 1000)
for start in range(0, len(lines), 8192):
    db.execute("BEGIN")
    for name, record in lines[start:start + 8192]:
        row = db.execute("SELECT next_seq FROM down_flows WHERE sender = ?", (name,)).fetchone()
        seq = row[0] if row else 1
        db.execute("INSERT INTO downlink VALUES (?, ?, ?, ?, NULL)", (name, seq, record.encode(), now))
        db.execute("INSERT INTO down_flows VALUES (?, ?, 0) ON CONFLICT (sender) DO UPDATE SET next_seq = ?",
                   (name, seq + 1, seq + 1))
    db.execute("UPDATE down_count SET waiting = waiting + ? WHERE one = 1", (min(8192, len(lines) - start),))
    db.execute("COMMIT")
secs = time.time() - t0
print(json.dumps({
    "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "n": len(lines), "variant": variant,
    "run": int(run), "seconds": round(secs, 2), "load1": float(open("/proc/loadavg").read().split()[0]),
}), flush=True)
