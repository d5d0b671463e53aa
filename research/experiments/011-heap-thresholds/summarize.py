#!/usr/bin/env python3
"""research/011: medians per (build, configuration) and the per-round ratios, from run.sh's JSON lines."""
import json, statistics as st, sys
from collections import defaultdict

path = sys.argv[1] if len(sys.argv) > 1 else "results.jsonl"
runs = [json.loads(l) for l in open(path) if l.startswith("{")]
by = defaultdict(dict)  # (build, label) -> round -> run
for r in runs:
    by[(r["build"], r["label"])][r["round"]] = r

def med(xs):
    xs = [x for x in xs if x is not None]
    return st.median(xs) if xs else float("nan")

def rng(xs):
    return f"{min(xs):.2f}–{max(xs):.2f}" if xs else "—"

builds = list(dict.fromkeys(r["build"] for r in runs))
print("| build | configuration | stored records/s (legit) | node CPU | flood tool CPU | senders' CPU | new stored | X25519/s unauthenticated |")
print("|---|---|---:|---:|---:|---:|---:|---:|")
for b in builds:
    for label in ["none/node", "forged/node", "forged/sink"]:
        rs = list(by[(b, label)].values())
        if not rs:
            continue
        new = [r.get("new_stored") for r in rs if r.get("new_stored") is not None]
        wasted = [r.get("x25519_wasted_per_s") for r in rs]
        print(f"| {b} | {label} | {med([r['legit_stored_per_s'] for r in rs])/1e6:.2f}M "
              f"| {med([r['node_cpu'] for r in rs]):.2f} | {med([r['flood_cpu'] for r in rs]):.2f} "
              f"| {med([r['legit_cpu'] for r in rs]):.2f} | {med(new) if new else '—'} "
              f"| {med(wasted) if any(w is not None for w in wasted) else '—'} |")
print()
print("Per-round ratios, median (min–max):")
print()
print("| build | flood ÷ unloaded | sink ÷ unloaded | flood ÷ sink |")
print("|---|---:|---:|---:|")
for b in builds:
    none, node, sink = (by[(b, l)] for l in ("none/node", "forged/node", "forged/sink"))
    rounds = sorted(set(none) & set(node) & set(sink))
    f = [node[k]["legit_stored_per_s"] / none[k]["legit_stored_per_s"] for k in rounds]
    s = [sink[k]["legit_stored_per_s"] / none[k]["legit_stored_per_s"] for k in rounds]
    fs = [node[k]["legit_stored_per_s"] / sink[k]["legit_stored_per_s"] for k in rounds]
    print(f"| {b} | {med(f):.2f} ({rng(f)}) | {med(s):.2f} ({rng(s)}) | {med(fs):.2f} ({rng(fs)}) |")
if len(builds) == 2:
    a, b = builds
    print()
    print(f"{b} ÷ {a}, same round:")
    for label in ["none/node", "forged/node", "forged/sink"]:
        x, y = by[(a, label)], by[(b, label)]
        rounds = sorted(set(x) & set(y))
        q = [y[k]["legit_stored_per_s"] / x[k]["legit_stored_per_s"] for k in rounds]
        print(f"- {label}: {med(q):.2f} ({rng(q)})")
