#!/usr/bin/env python3
"""research/043 addendum 3: where a fleet's push of many spends the server's time.

Reads a PostgreSQL 15 server log written with log_min_duration_statement=0 (the bench harness's PURE_PG_OPTS and
PURE_PG_LOG) and prints, per push (statements grouped where the server went over 0.5 s without one), its wall time
from the first statement to the last, and each push statement's summed execute time, as one JSON line.

usage: statement-times.py LABEL SERVER.log
"""
import collections
import datetime
import json
import re
import sys

# Each statement of try_down_part (src/store/postgres.rs) by a piece of its text.
KINDS = [
    ("add_flows", "INSERT INTO down_flows"),
    ("lock_flows", "FOR UPDATE) f"),
    ("claim_flows", "SET next_seq = f.next_seq + t.k"),
    ("expire", "WITH gone AS (DELETE FROM downlink d USING"),
    ("waiting", "SELECT u.i, d.n + r.n"),
    ("insert", "INSERT INTO downlink"),
    ("set_next", "UPDATE down_flows f SET next_seq = t.n"),
    ("count", "down_counts"),
    ("notify", "pg_notify"),
    ("begin", "BEGIN"),
    ("commit", "COMMIT"),
]
LINE = re.compile(r"^(\S+ \S+) UTC \[(\d+)\] LOG:  duration: ([0-9.]+) ms  (\w+)(?: \S+)?: (.*)")

label, path = sys.argv[1], sys.argv[2]
pushes = []
last = None
for line in open(path, errors="replace"):
    m = LINE.match(line)
    if not m or m.group(4) != "execute":
        continue
    kind = next((k for k, t in KINDS if t in m.group(5)), None)
    if kind is None:
        continue
    ts = datetime.datetime.fromisoformat(m.group(1))
    if last is None or (ts - last).total_seconds() > 0.5:
        pushes.append({"start": ts, "ms": collections.defaultdict(float), "n": collections.Counter()})
    p = pushes[-1]
    p["end"] = ts
    p["ms"][kind] += float(m.group(3))
    p["n"][kind] += 1
    last = ts
for k, p in enumerate(pushes):
    wall = (p["end"] - p["start"]).total_seconds()
    if wall < 0.5:
        continue
    print(json.dumps({
        "build": label, "window": k, "turns": p["n"]["commit"], "wall_s": round(wall, 2),
        "statements_s": round(sum(p["ms"].values()) / 1000, 2),
        "by_statement_s": {s: round(v / 1000, 2) for s, v in sorted(p["ms"].items(), key=lambda x: -x[1])},
    }))
