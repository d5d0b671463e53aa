#!/usr/bin/env python3
"""Medians (min–max) per label of each figure in send_path's JSON lines. Usage: summarize.py RESULTS.jsonl"""
import json, statistics, sys
from collections import defaultdict
vals = defaultdict(list)
for l in open(sys.argv[1]):
    d = json.loads(l)
    vals[(d["name"], d["label"])].append(d["value"])
names = sorted({n for n, _ in vals})
labels = sorted({lab for _, lab in vals})
print("| figure | " + " | ".join(labels) + " |")
print("|---|" + "---:|" * len(labels))
for n in names:
    cells = []
    for lab in labels:
        v = vals.get((n, lab))
        if not v:
            cells.append("—")
            continue
        f = (lambda x: f"{x:,.0f}") if max(v) >= 100 else (lambda x: f"{x:.2f}")
        cells.append(f"{f(statistics.median(v))} ({f(min(v))}–{f(max(v))}), n={len(v)}")
    print(f"| {n} | " + " | ".join(cells) + " |")
