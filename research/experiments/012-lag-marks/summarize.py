#!/usr/bin/env python3
"""research/012: medians per build (resume mark) from run.sh's JSON lines, and each build ÷ p50 in the same round."""
import json, statistics as st, sys
from collections import defaultdict

path = sys.argv[1] if len(sys.argv) > 1 else "results.jsonl"
runs = [json.loads(l) for l in open(path) if l.startswith("{")]
by = defaultdict(dict)
for r in runs:
    by[r["build"]][r["round"]] = r

def med(xs):
    return st.median(xs) if xs else float("nan")

def fig(r):
    secs = r["seconds"]
    return {
        "slow": r["apps_stored_per_s"].get("slow", 0.0),
        "main": r["apps_stored_per_s"].get("main", 0.0),
        "pauses": r["apps_pauses"].get("main", 0.0) / secs,
        "bp": r["drops_per_s"].get("backpressure", 0.0),
        "gobacks": r["legit_go_back_total"],
        "srtt": r["legit_srtt_ms"],
        "cpu": r["node_cpu"],
    }

order = sorted(by, key=lambda b: int(b.lstrip("p")))
print("| resume below | slow stored/s (the goodput) | main stored/s | pauses/s | backpressure drops/s | senders' go-back-N rounds (run) | SRTT ms | node CPU | slow ÷ p50, same round |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for b in order:
    fs = [fig(r) for r in by[b].values()]
    ratio = [by[b][k]["apps_stored_per_s"].get("slow", 0) / by["p50"][k]["apps_stored_per_s"]["slow"]
             for k in by[b] if k in by.get("p50", {})]
    rng = f" ({min(ratio):.2f}–{max(ratio):.2f})" if ratio else ""
    m = lambda k: med([f[k] for f in fs])
    print(f"| {b.lstrip('p')} % | {m('slow')/1e6:.2f}M | {m('main')/1e6:.2f}M | {m('pauses'):.1f} | {m('bp'):,.0f} "
          f"| {m('gobacks'):.0f} | {m('srtt'):.1f} | {m('cpu'):.2f} | {med(ratio):.2f}{rng} |")
