#!/usr/bin/env python3
"""research/041: medians (min-max) of the cut, the failover and the ratio runs.

Usage: summarize.py cut.jsonl failover.jsonl ratio.jsonl
"""
import json
import statistics
import sys
from collections import defaultdict


def rows(path):
    return [json.loads(l) for l in open(path) if l.strip()]


def fmt(xs, digits=2, unit=""):
    m = statistics.median(xs)
    return f"{m:.{digits}f}{unit} ({min(xs):.{digits}f}–{max(xs):.{digits}f})"


cut_path, failover_path, ratio_path = sys.argv[1:4]

cut = rows(cut_path)
ok = [r for r in cut if r.get("ok")]
print(f"(a) the cut: {len(ok)} of {len(cut)} runs passed; load (1 min) at their start "
      f"{min(r['loadavg_1m_at_start'] for r in cut):.1f}–{max(r['loadavg_1m_at_start'] for r in cut):.1f}\n")
print("| from | until | seconds, median (min–max) |")
print("|---|---|---:|")
for key, frm, until in [
    ("healthz_503_s", "the drop rule", "`/healthz` says 503"),
    ("not_stored_s", "the drop rule", "`send` has printed NOT_STORED"),
    ("healthz_200_s", "the rule removed", "`/healthz` says 200"),
    ("stored_again_s", "the rule removed", "stored acks again (`pure_records_stored_total` grows)"),
]:
    print(f"| {frm} | {until} | {fmt([r[key] for r in ok])} |")

fo = rows(failover_path)
ok = [r for r in fo if r.get("ok")]
print(f"\n(b) the failover: {len(ok)} of {len(fo)} runs passed; load (1 min) at their start "
      f"{min(r['loadavg_1m_at_start'] for r in fo):.1f}–{max(r['loadavg_1m_at_start'] for r in fo):.1f}\n")
print("| from | until | seconds, median (min–max) |")
print("|---|---|---:|")
for key, frm, until in [
    ("promote_s", "the primary SIGKILLed", "`pg_ctl promote -w` returned"),
    ("stored_again_after_promotion_s", "`pg_ctl promote -w` returned", "the nodes store again"),
    ("stored_again_after_kill_s", "the primary SIGKILLed", "the nodes store again"),
]:
    print(f"| {frm} | {until} | {fmt([r[key] for r in ok])} |")

by = defaultdict(dict)
for r in rows(ratio_path):
    by[(r["run"], r["config"])][r["name"]] = r["value"]
runs = sorted({run for run, _ in by})
print(f"\n(c) big turns, {len(runs)} rounds\n")
print("| configuration | PostgreSQL fsync | records/s | ÷ sqlite1, same round | node CPU ns/record | "
      "PostgreSQL CPU ns/record |")
print("|---|---|---:|---:|---:|---:|")
for c in ["sqlite1", "pg1", "pg1-fsync-off"]:
    have = [r for r in runs if (r, c) in by]
    if not have:
        continue
    rate = [by[(r, c)]["records_per_s"] for r in have]
    vs = [by[(r, c)]["records_per_s"] / by[(r, "sqlite1")]["records_per_s"] for r in have if (r, "sqlite1") in by]
    fs = {by[(r, c)].get("postgres_fsync_on") for r in have}
    fsync = "—" if c == "sqlite1" else ("on" if fs == {1.0} else "off" if fs == {0.0} else str(fs))
    cells = [
        fsync,
        fmt([x / 1e6 for x in rate], 2, "M"),
        fmt(vs, 2) if c != "sqlite1" else "—",
        fmt([by[(r, c)]["node_cpu_ns_per_record"] for r in have], 0),
        fmt([by[(r, c)]["postgres_cpu_ns_per_record"] for r in have], 0) if c != "sqlite1" else "—",
    ]
    print(f"| {c} | " + " | ".join(cells) + " |")
loads = [by[(r, "machine")]["loadavg_1m_at_start"] for r in runs if (r, "machine") in by]
if loads:
    print(f"\nload average (1 min) at the start of the rounds: {min(loads):.1f}–{max(loads):.1f}")
