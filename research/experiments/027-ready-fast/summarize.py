#!/usr/bin/env python3
"""Medians (min–max) per label of ready.py's JSON lines, and each build's ratio to the first label in the same
round. Usage: summarize.py FILE.jsonl [FIRST_LABEL]"""
import collections, json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
for c in [r for r in rows if r["label"] == "check"]:
    print("indexes identical:", c["indexes_identical"])
rows = [r for r in rows if r["label"] != "check"]
by = collections.defaultdict(list)
for r in rows:
    by[r["label"]].append(r)
first = sys.argv[2] if len(sys.argv) > 2 else next(l for l in by if l != "plain-read")
base = {r["round"]: r for r in by[first]}
def med(xs):
    return f"{statistics.median(xs):.3f} ({min(xs):.3f}–{max(xs):.3f})"
loads = [r["load_1m"] for r in rows]
print(f"rounds {len(base)}, load {min(loads):.2f}–{max(loads):.2f}")
for label, rs in by.items():
    line = f"{label:12} ready {med([r['ready_s'] for r in rs])} s  cpu {med([r['cpu_s'] for r in rs])} s"
    if label not in ("plain-read", first):
        ratio = [r["ready_s"] / base[r["round"]]["ready_s"] for r in rs if r["round"] in base]
        cratio = [r["cpu_s"] / base[r["round"]]["cpu_s"] for r in rs if r["round"] in base]
        line += f"  ÷{first}: wall {med(ratio)} cpu {med(cratio)}"
    phases = sorted({k for r in rs for k in r if k.endswith("_ms")})
    if phases:
        line += "  " + " ".join(f"{k}={statistics.median([r[k] for r in rs if k in r]):.0f}" for k in phases)
    print(line)
