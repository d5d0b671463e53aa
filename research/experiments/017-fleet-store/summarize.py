#!/usr/bin/env python3
"""research/017: the results table from run.sh's JSON lines. Medians over rounds; ratios to SQLite (or to one
PostgreSQL writer) are taken within a round, where the runs were side by side.

Usage: summarize.py results.jsonl"""
import json
import statistics as st
import sys
from collections import defaultdict

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by = defaultdict(dict)  # (shape, round) -> key -> records/s
for r in rows:
    key = (r["engine"], r["writers"], r["apps"])
    by[((r["sources"], r["records"]), r["round"])][key] = r["records_per_s"]
shapes = sorted({s for s, _ in by}, key=lambda s: -s[1])
keys = [("sqlite", 1, "own"), ("pg", 1, "own"), ("pg-copy", 1, "own"), ("pg", 2, "shared"), ("pg", 3, "shared"),
        ("pg", 2, "own"), ("pg", 3, "own")]
names = {("sqlite", 1, "own"): "SQLite, 1 writer", ("pg", 1, "own"): "PostgreSQL, 1 writer",
         ("pg-copy", 1, "own"): "PostgreSQL COPY, 1 writer", ("pg", 2, "shared"): "PostgreSQL, 2 writers, one app",
         ("pg", 3, "shared"): "PostgreSQL, 3 writers, one app", ("pg", 2, "own"): "PostgreSQL, 2 writers, an app each",
         ("pg", 3, "own"): "PostgreSQL, 3 writers, an app each"}


def span(xs, fmt):
    return f"{fmt(st.median(xs))} ({fmt(min(xs))}–{fmt(max(xs))})"


print("| turn (sources × records) | store | records/s | ÷ SQLite, same round | ÷ 1 PostgreSQL writer, same round |")
print("|---|---|---:|---:|---:|")
for shape in shapes:
    rounds = sorted(r for s, r in by if s == shape)
    for k in keys:
        vals = [by[(shape, r)][k] for r in rounds if k in by[(shape, r)]]
        if not vals:
            continue
        sq = [by[(shape, r)][k] / by[(shape, r)][("sqlite", 1, "own")] for r in rounds
              if k in by[(shape, r)] and ("sqlite", 1, "own") in by[(shape, r)]]
        one = [by[(shape, r)][k] / by[(shape, r)][("pg", 1, "own")] for r in rounds
               if k in by[(shape, r)] and ("pg", 1, "own") in by[(shape, r)]]
        print(f"| {shape[0]} × {shape[1]} | {names[k]} | {span(vals, lambda v: f'{v/1000:.0f}k')} | "
              f"{span(sq, lambda v: f'{v:.2f}') if k[0] != 'sqlite' else '—'} | "
              f"{span(one, lambda v: f'{v:.2f}') if k[0] == 'pg' and k[1] > 1 else '—'} |")
loads = [r["load1"] for r in rows if "load1" in r]
if loads:
    print(f"\nload average (1 min) during the runs: {min(loads):.1f}–{max(loads):.1f}")

if len(sys.argv) > 2:
    # run2.sh: the follow-up variants, each against `plain` of the same shape in the same round.
    rows2 = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
    plain = {(r["sources"], r["records"], r["round"]): r["records_per_s"] for r in rows2 if r["engine"] == "pg-plain"}
    groups = defaultdict(list)
    for r in rows2:
        groups[(r["sources"], r["records"], r["engine"], r["writers"])].append(r)
    print("\n| turn (sources × records) | variant | writers | records/s stored | ÷ plain, same round | records/s cut off as stored already |")
    print("|---|---|---:|---:|---:|---:|")
    for (s, n, e, w), rs in groups.items():
        vals = [r["records_per_s"] for r in rs]
        ratio = [r["records_per_s"] / plain[(s, n, r["round"])] for r in rs]
        dup = [r.get("duplicates_skipped_per_s", 0) for r in rs]
        print(f"| {s} × {n} | {e[3:]} | {w} | {span(vals, lambda v: f'{v/1000:.0f}k')} | "
              f"{span(ratio, lambda v: f'{v:.2f}') if e != 'pg-plain' else '—'} | "
              f"{span(dup, lambda v: f'{v/1000:.0f}k') if e == 'pg-race' else '—'} |")
    loads = [r["load1"] for r in rows2]
    print(f"\nload average (1 min) during the runs: {min(loads):.1f}–{max(loads):.1f}")
