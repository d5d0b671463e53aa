#!/usr/bin/env python3
"""research/047: the table of run.sh's JSON lines. Per shape and build: medians (min-max) over rounds of records/s,
of pg1 / sqlite1 in the same round, of the build / the first build named in the same round, and the CPU and WAL
figures per record. Usage: summarize.py FILE.jsonl [BASE_BUILD]"""
import collections
import json
import statistics
import sys

rows = collections.defaultdict(dict)  # (shape, build, run) -> name -> value
load = {}
for line in open(sys.argv[1]):
    j = json.loads(line)
    if j.get("name") == "statement":
        continue
    if j["config"] == "machine":
        load.setdefault((j["shape"], j["run"]), []).append(j["value"])
        continue
    rows[(j["shape"], j["build"], j["run"])][j["name"]] = j["value"]
base = sys.argv[2] if len(sys.argv) > 2 else "base"
shapes = sorted({k[0] for k in rows})
builds = sorted({k[1] for k in rows if k[1] != "sqlite"}, key=lambda b: (b != base, b))


def med(v, fmt="{:.2f}"):
    if not v:
        return "—"
    return (fmt + " (" + fmt + "–" + fmt + ")").format(statistics.median(v), min(v), max(v))


print("| shape | build | rounds | records/s | ÷ sqlite1, same round | ÷ %s, same round | node CPU ns/record | PostgreSQL CPU ns/record | WAL bytes/record | WAL records/record | WAL syncs | load at the rounds' starts |" % base)
print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
for shape in shapes:
    runs = sorted({k[2] for k in rows if k[0] == shape})
    ls = [x for r in runs for x in load.get((shape, r), [])]
    sq = [rows[(shape, "sqlite", r)]["records_per_s"] for r in runs if "records_per_s" in rows.get((shape, "sqlite", r), {})]
    print(f"| {shape} | sqlite1 | {len(sq)} | {med(sq, '{:,.0f}')} | — | — | "
          f"{med([rows[(shape, 'sqlite', r)]['node_cpu_ns_per_record'] for r in runs if (shape, 'sqlite', r) in rows], '{:,.0f}')} | — | — | — | — | {min(ls):.1f}–{max(ls):.1f} |")
    for b in builds:
        have = [r for r in runs if "records_per_s" in rows.get((shape, b, r), {})]
        rate = [rows[(shape, b, r)]["records_per_s"] for r in have]
        vs_sq = [rows[(shape, b, r)]["records_per_s"] / rows[(shape, "sqlite", r)]["records_per_s"]
                 for r in have if "records_per_s" in rows.get((shape, "sqlite", r), {})]
        vs_base = [rows[(shape, b, r)]["records_per_s"] / rows[(shape, base, r)]["records_per_s"]
                   for r in have if "records_per_s" in rows.get((shape, base, r), {})]
        f = lambda n, fmt="{:,.0f}": med([rows[(shape, b, r)][n] for r in have if n in rows[(shape, b, r)]], fmt)
        print(f"| {shape} | pg1 {b} | {len(have)} | {med(rate, '{:,.0f}')} | **{med(vs_sq)}** | {med(vs_base)} | "
              f"{f('node_cpu_ns_per_record')} | {f('postgres_cpu_ns_per_record')} | {f('wal_bytes_per_record', '{:,.1f}')} | "
              f"{f('wal_records_per_record', '{:.2f}')} | {f('wal_syncs')} | |")
