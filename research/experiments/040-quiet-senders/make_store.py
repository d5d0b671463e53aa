#!/usr/bin/env python3
"""Fills a node's store (STATE/apps/main.sqlite, made by a node that ran and stopped) with one source per line of
a senders file and one chunk of one 16-byte record each, stored_at spread over the last 48 hours (research/040).

usage: make_store.py STATE SENDERS_FILE"""
import os, sqlite3, sys, time

state, senders = sys.argv[1], sys.argv[2]
names = [l.split()[0] for l in open(senders) if l.strip() and not l.startswith("#")]
db = sqlite3.connect(os.path.join(state, "apps", "main.sqlite"))
now = int(time.time() * 1000)
body = bytes([16]) + b"x" * 16  # one record: its length (varint) and 16 bytes (docs/protocol.md 5.1)
t0 = time.time()
with db:
    db.executemany("INSERT INTO sources (id, name, heard) VALUES (?, ?, 1)", ((i + 1, n) for i, n in enumerate(names)))
    db.executemany(
        "INSERT INTO chunks (source, first_seq, count, body, pos, stored_at, format) VALUES (?, 1, 1, ?, ?, ?, 0)",
        ((i + 1, body, i + 1, now - (i * 172_800_000) // len(names)) for i in range(len(names))))
print(f"{len(names)} sources and chunks in {time.time() - t0:.1f} s", file=sys.stderr)
