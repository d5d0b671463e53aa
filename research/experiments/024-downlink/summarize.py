#!/usr/bin/env python3
"""research/024: medians (min-max) of benches/downlink's JSON lines, by part and figure.
Usage: summarize.py results.jsonl"""
import json, statistics, sys
from collections import defaultdict

rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
groups = defaultdict(list)
for r in rows:
    key = (r["part"], r.get("phase", ""), r.get("senders", r.get("devices", "")))
    groups[key].append(r)
for (part, phase, n), rs in sorted(groups.items(), key=lambda kv: str(kv[0])):
    print(f"## {part} {phase} {n} ({len(rs)} rounds)")
    for k in sorted(rs[0]):
        vals = [r[k] for r in rs if isinstance(r.get(k), (int, float)) and not isinstance(r.get(k), bool)]
        if k in ("round",) or not vals:
            continue
        med = statistics.median(vals)
        print(f"- {k}: {med:.4g} ({min(vals):.4g}–{max(vals):.4g})")
    print()
