#!/usr/bin/env python3
"""research/028: per shape, medians (min-max) per configuration, and ratios within each round, from benches/fleet's
lines: pgN beside dbN (the database alone at pgN's batch size), growth with nodes beside the database's own, CPU per
record and the cores each part used.

Usage: summarize.py results.jsonl
"""
import json
import statistics
import sys
from collections import defaultdict

rows = [json.loads(l) for f in sys.argv[1:] for l in open(f) if l.strip()]
by = defaultdict(dict)  # (shape, run, config) -> name -> value
loads = defaultdict(list)
for r in rows:
    shape = r.get("shape", "big")
    if r["config"] == "machine":
        loads[shape].append(r["value"])
        continue
    by[(shape, r["run"], r["config"])][r["name"]] = r["value"]
configs = ["sqlite1", "pg1", "db1", "pg2", "db2", "pg3", "db3"]


def fmt(xs, digits=0, scale=1.0, unit=""):
    xs = [x / scale for x in xs if x is not None]
    if not xs:
        return "—"
    m = statistics.median(xs)
    return f"{m:.{digits}f}{unit} ({min(xs):.{digits}f}–{max(xs):.{digits}f})"


def ratios(shape, runs, a, b, name="records_per_s"):
    return [by[(shape, r, a)][name] / by[(shape, r, b)][name]
            for r in runs if (shape, r, a) in by and (shape, r, b) in by
            and name in by[(shape, r, a)] and name in by[(shape, r, b)]]


def cores(v, name):
    # CPU seconds per second of the span: ns per record × records per second.
    return v[name] * v["records_per_s"] / 1e9 if name in v else None


for shape in sorted({s for s, _, _ in by}, key=lambda s: (s != "big", s)):
    runs = sorted({r for s, r, _ in by if s == shape})
    print(f"\n### {shape}\n")
    print("| configuration | records/s | ÷ sqlite1 | pgN ÷ dbN | ÷ N=1 of its kind | chunk rows per turn | "
          "records per row | node CPU ns/rec | PostgreSQL CPU ns/rec | senders' CPU ns/rec | engines' CPU ns/rec |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for c in configs:
        have = [r for r in runs if (shape, r, c) in by]
        if not have:
            continue
        v = [by[(shape, r, c)] for r in have]
        n = c[-1]
        kind = c[:-1]
        many = shape.startswith("many")
        rate = fmt([x["records_per_s"] for x in v], 1 if many else 2, 1e3 if many else 1e6, "k" if many else "M")
        cells = [
            rate,
            fmt(ratios(shape, have, c, "sqlite1"), 2) if c != "sqlite1" else "—",
            fmt(ratios(shape, have, c, f"db{n}"), 2) if kind == "pg" else "—",
            fmt(ratios(shape, have, c, f"{kind}1"), 2) if kind in ("pg", "db") and n != "1" else "—",
            fmt([x.get("chunk_rows_per_turn") for x in v], 1) if kind == "pg" else "—",
            fmt([x.get("records_per_row") for x in v], 0) if kind == "pg" else "—",
            fmt([x.get("node_cpu_ns_per_record") for x in v], 0),
            fmt([x.get("postgres_cpu_ns_per_record") for x in v], 0),
            fmt([x.get("send_cpu_ns_per_record") for x in v], 0),
            fmt([x.get("engine_cpu_ns_per_record") for x in v], 0),
        ]
        print(f"| {c} | " + " | ".join(cells) + " |")
    print("\nCores used over the span (CPU seconds per second): medians (min–max)\n")
    print("| configuration | nodes | PostgreSQL | senders / driver | engines (this process) | sum | "
          "whole machine, every process |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for c in configs:
        have = [r for r in runs if (shape, r, c) in by]
        if not have:
            continue
        v = [by[(shape, r, c)] for r in have]
        parts = [[cores(x, k) for x in v] for k in ("node_cpu_ns_per_record", "postgres_cpu_ns_per_record",
                                                   "send_cpu_ns_per_record", "engine_cpu_ns_per_record")]
        total = [sum(p[i] for p in parts if p[i] is not None) for i in range(len(v))]
        machine = [x.get("machine_busy_cores") for x in v]
        print(f"| {c} | " + " | ".join(fmt(p, 2) for p in parts) + f" | {fmt(total, 2)} | {fmt(machine, 2)} |")
    print("\nPer round: growth with nodes beside the database's own, and PostgreSQL's CPU per record pgN ÷ dbN\n")
    for n in ("2", "3"):
        pg = ratios(shape, runs, f"pg{n}", "pg1")
        db = ratios(shape, runs, f"db{n}", "db1")
        both = [r for r in runs if all((shape, r, c) in by for c in ("pg1", "db1", f"pg{n}", f"db{n}"))]
        track = [(by[(shape, r, f"pg{n}")]["records_per_s"] / by[(shape, r, "pg1")]["records_per_s"])
                 / (by[(shape, r, f"db{n}")]["records_per_s"] / by[(shape, r, "db1")]["records_per_s"])
                 for r in both]
        if pg:
            print(f"- pg{n} ÷ pg1 {fmt(pg, 2)}; db{n} ÷ db1 {fmt(db, 2)}; "
                  f"(pg{n} ÷ pg1) ÷ (db{n} ÷ db1) {fmt(track, 2)}")
    for n in ("1", "2", "3"):
        pc = ratios(shape, runs, f"pg{n}", f"db{n}", "postgres_cpu_ns_per_record")
        if pc:
            print(f"- PostgreSQL CPU per record, pg{n} ÷ db{n}: {fmt(pc, 2)}")
    made = [by[(shape, r, c)].get("sessions_made") for r in runs for c in configs
            if (shape, r, c) in by and c[:-1] in ("pg", "sqlite")]
    if shape.startswith("many"):
        print(f"- sessions made by the nodes during the timed waves: {fmt(made, 0)}")
    if loads[shape]:
        print(f"\nload average (1 min) at the start of the runs: {min(loads[shape]):.1f}–{max(loads[shape]):.1f}; "
              f"rounds: {len(runs)}")
