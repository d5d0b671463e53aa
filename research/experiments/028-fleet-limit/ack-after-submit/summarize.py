#!/usr/bin/env python3
"""research/028, experiment: records/s of the node of main (base) and of the one that hands the next turn to the
database before sending the last turn's acks (ack), per shape and configuration: medians (min-max), and ack ÷ base
within each round, with db1 (the engine alone, no node: the same code in both runs) as the control.

Usage: summarize.py results.jsonl [NAME]   (NAME: the other binary's label, "ack" unless given)
"""
import json
import statistics
import sys
from collections import defaultdict

by = defaultdict(dict)  # (bin, shape, run, config) -> name -> value
other = sys.argv[2] if len(sys.argv) > 2 else "ack"
for line in open(sys.argv[1]):
    if line.strip():
        r = json.loads(line)
        by[(r["bin"], r["shape"], r["run"], r["config"])][r["name"]] = r["value"]


def fmt(xs, d=2):
    return f"{statistics.median(xs):.{d}f} ({min(xs):.{d}f}–{max(xs):.{d}f})" if xs else "—"


print(f"| shape | configuration | base records/s | {other} records/s | {other} ÷ base, same round | "
      f"PostgreSQL CPU ns/rec base / {other} |")
print("|---|---|---:|---:|---:|---:|")
for shape in ("many-p1", "many-p10", "big"):
    for c in ("pg1", "pg2", "db1"):
        runs = sorted({k[2] for k in by if k[1] == shape and k[3] == c})
        if not runs:
            continue
        scale, unit = (1e3, "k") if shape.startswith("many") else (1e6, "M")
        rate = {b: [by[(b, shape, r, c)]["records_per_s"] for r in runs if (b, shape, r, c) in by] for b in ("base", other)}
        ratio = [by[(other, shape, r, c)]["records_per_s"] / by[("base", shape, r, c)]["records_per_s"]
                 for r in runs if (other, shape, r, c) in by and ("base", shape, r, c) in by]
        pgc = {b: [by[(b, shape, r, c)].get("postgres_cpu_ns_per_record") for r in runs if (b, shape, r, c) in by]
               for b in ("base", other)}
        print(f"| {shape} | {c} | {fmt([x / scale for x in rate['base']], 1)}{unit} | "
              f"{fmt([x / scale for x in rate[other]], 1)}{unit} | {fmt(ratio)} | "
              f"{statistics.median(pgc['base']):.0f} / {statistics.median(pgc[other]):.0f} |")
print(f"\nrounds: {len({k[2] for k in by})}")
