#!/usr/bin/env python3
"""research/036: an app store of about MIB MiB with the node's tables (docs/store.md): 1,000 sources, chunks of 64
records of ~130 bytes at consecutive positions, heard sequences matching. Usage: make-store.py PATH MIB"""
import os
import random
import sqlite3
import sys

path, target = sys.argv[1], int(sys.argv[2]) << 20
for suffix in ("", "-wal", "-shm"):
    if os.path.exists(path + suffix):
        os.remove(path + suffix)
c = sqlite3.connect(path)
c.executescript("""
PRAGMA journal_mode=WAL; PRAGMA synchronous=OFF;
CREATE TABLE sources (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, heard INTEGER NOT NULL);
CREATE TABLE chunks (source INTEGER NOT NULL REFERENCES sources(id), first_seq INTEGER NOT NULL,
  count INTEGER NOT NULL, body BLOB NOT NULL, pos INTEGER, stored_at INTEGER NOT NULL DEFAULT 0,
  format INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (source, first_seq));
CREATE UNIQUE INDEX chunks_pos ON chunks(pos);
CREATE TABLE outlets (name TEXT PRIMARY KEY, acked INTEGER NOT NULL);
CREATE TABLE outlet_starts (name TEXT PRIMARY KEY, kind TEXT NOT NULL, target TEXT NOT NULL, flow TEXT,
  start INTEGER NOT NULL);
CREATE TABLE down_flows (sender TEXT PRIMARY KEY, next_seq INTEGER NOT NULL, acked INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE downlink (sender TEXT NOT NULL, seq INTEGER NOT NULL, payload BLOB NOT NULL,
  queued_at INTEGER NOT NULL, expires_at INTEGER, PRIMARY KEY (sender, seq)) WITHOUT ROWID;
CREATE TABLE down_count (one INTEGER PRIMARY KEY CHECK (one = 1), waiting INTEGER NOT NULL);
INSERT INTO down_count VALUES (1, 0);
PRAGMA user_version = 2;
""")
sources = 1000
c.executemany("INSERT INTO sources VALUES (?,?,0)", [(i, f"dev{i}") for i in range(1, sources + 1)])
random.seed(36)
seq = [1] * (sources + 1)
pos = 1
body = os.urandom(64 * 130)
size = 0
while size < target:
    rows = []
    for _ in range(256):
        s = random.randint(1, sources)
        rows.append((s, seq[s], 64, body, pos, 1))
        seq[s] += 64
        pos += 64
    c.executemany("INSERT INTO chunks (source, first_seq, count, body, pos, stored_at) VALUES (?,?,?,?,?,?)", rows)
    c.commit()
    size = sum(os.path.getsize(path + x) for x in ("", "-wal") if os.path.exists(path + x))
c.executemany("UPDATE sources SET heard=? WHERE id=?", [(seq[s] - 1, s) for s in range(1, sources + 1)])
c.commit()
c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
c.close()
print(f"made {path}: {os.path.getsize(path) >> 20} MiB", file=sys.stderr)
