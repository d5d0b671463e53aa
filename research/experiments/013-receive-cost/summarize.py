#!/usr/bin/env python3
"""research/013: medians per (build, flood) and each build ÷ the one before it in the same round."""
import json, statistics as st, sys
from collections import defaultdict

path = sys.argv[1] if len(sys.argv) > 1 else "results.jsonl"
runs = [json.loads(l) for l in open(path) if l.startswith("{")]
by = defaultdict(dict)
for r in runs:
    by[(r["build"], r["label"])][r["round"]] = r
builds = sys.argv[2].split(",") if len(sys.argv) > 2 else list(dict.fromkeys(r["build"] for r in runs))
labels = list(dict.fromkeys(r["label"] for r in runs))
med = st.median
print("| flood | " + " | ".join(f"{b}: goodput · node CPU · kernel drops/s" for b in builds) + " | "
      + " | ".join(f"{b} ÷ {a}" for a, b in zip(builds, builds[1:])) + " |")
print("|---|" + "---:|" * (len(builds) + len(builds) - 1))
for l in labels:
    cells = []
    for b in builds:
        rs = list(by[(b, l)].values())
        cells.append(f"{med([r['legit_stored_per_s'] for r in rs])/1e6:.2f}M · {med([r['node_cpu'] for r in rs]):.2f} · "
                     f"{med([r['drops_per_s']['kernel'] for r in rs]):,.0f}")
    ratios = []
    for a, b in zip(builds, builds[1:]):
        x, y = by[(a, l)], by[(b, l)]
        q = [y[k]["legit_stored_per_s"] / x[k]["legit_stored_per_s"] for k in sorted(set(x) & set(y))]
        ratios.append(f"{med(q):.2f} ({min(q):.2f}–{max(q):.2f})")
    print(f"| {l} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
