#!/usr/bin/env python3
"""research/025: medians (min-max) per configuration, and ratios within each round, from benches/fleet's lines.

Usage: summarize.py results.jsonl
"""
import json
import statistics
import sys
from collections import defaultdict

rows = [json.loads(l) for f in sys.argv[1:] for l in open(f) if l.strip()]
by = defaultdict(dict)  # (run, config) -> name -> value
for r in rows:
    by[(r["run"], r["config"])][r["name"]] = r["value"]
runs = sorted({run for run, _ in by})
configs = ["sqlite1", "pg1", "pg2", "pg3", "pg1-pglz", "pg1-lz4"]


def fmt(xs, scale=1.0, digits=0, unit=""):
    xs = [x / scale for x in xs]
    m = statistics.median(xs)
    return f"{m:.{digits}f}{unit} ({min(xs):.{digits}f}–{max(xs):.{digits}f})"


print("| configuration | records/s | ÷ sqlite1, same round | ÷ pg1, same round | node CPU ns/record | "
      "PostgreSQL CPU ns/record | send CPU ns/record | ÷ the 2 cores' limit |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for c in configs:
    have = [r for r in runs if (r, c) in by]
    if not have:
        continue
    rate = [by[(r, c)]["records_per_s"] for r in have]
    vs_sqlite = [by[(r, c)]["records_per_s"] / by[(r, "sqlite1")]["records_per_s"]
                 for r in have if (r, "sqlite1") in by]
    vs_pg1 = [by[(r, c)]["records_per_s"] / by[(r, "pg1")]["records_per_s"] for r in have if (r, "pg1") in by]
    cells = [
        fmt(rate, 1e6, 2, "M"),
        fmt(vs_sqlite, 1, 2) if c != "sqlite1" else "—",
        fmt(vs_pg1, 1, 2) if c not in ("sqlite1", "pg1") else "—",
        fmt([by[(r, c)]["node_cpu_ns_per_record"] for r in have], 1, 0),
        fmt([by[(r, c)]["postgres_cpu_ns_per_record"] for r in have], 1, 0) if c != "sqlite1" else "—",
        fmt([by[(r, c)]["send_cpu_ns_per_record"] for r in have], 1, 0),
        # The most records/s the machine's 2 cores give if every one of them is spent at this round's CPU per
        # record (nodes + PostgreSQL + senders), and the share of it reached.
        fmt([by[(r, c)]["records_per_s"] / (2e9 / (by[(r, c)]["node_cpu_ns_per_record"]
                                                  + by[(r, c)]["postgres_cpu_ns_per_record"]
                                                  + by[(r, c)]["send_cpu_ns_per_record"])) for r in have], 1, 2),
    ]
    print(f"| {c} | " + " | ".join(cells) + " |")
loads = [by[(r, "machine")]["loadavg_1m_at_start"] for r in runs if (r, "machine") in by]
if loads:
    print(f"\nload average (1 min) at the start of the rounds: {min(loads):.1f}–{max(loads):.1f}; rounds: {len(runs)}")
