#!/usr/bin/env python3
"""Medians per build of research/004's results.jsonl, as a markdown table."""
import json
import statistics
import sys
from collections import defaultdict

vals = defaultdict(list)
for line in open(sys.argv[1]):
    if not line.startswith("{"):
        continue
    r = json.loads(line)
    vals[(r["name"], r["build"])].append(r["value"])
names = sorted({n for n, _ in vals})
print("| measurement | before (median, min–max) | after (median, min–max) | after / before |")
print("|---|---:|---:|---:|")
for n in names:
    b, a = vals.get((n, "before"), []), vals.get((n, "after"), [])
    if not b or not a:
        continue
    mb, ma = statistics.median(b), statistics.median(a)
    ratio = f"{ma / mb:.2f}" if mb else "—"
    print(f"| {n} | {mb:,.0f} ({min(b):,.0f}–{max(b):,.0f}) | {ma:,.0f} ({min(a):,.0f}–{max(a):,.0f}) | {ratio} |")
