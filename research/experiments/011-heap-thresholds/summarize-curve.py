#!/usr/bin/env python3
"""research/011: the flood curve against the limit, from run-curve.sh's JSON lines."""
import json, statistics as st, sys
from collections import defaultdict

path = sys.argv[1] if len(sys.argv) > 1 else "results-curve.jsonl"
runs = [json.loads(l) for l in open(path) if l.startswith("{")]
by = defaultdict(dict)
for r in runs:
    by[r["label"]][r["round"]] = r
med = st.median
base = by["none:0:node"]
print("| flood | sent/s | to the node: ÷ no flood | to a reading thread: ÷ no flood | node ÷ reader | node CPU | kernel drops/s at the node | tool's flood thread CPU |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for mix in ["forged", "random"]:
    for pps in [50000, 200000, 400000]:
        n, rd = by[f"{mix}:{pps}:node"], by[f"{mix}:{pps}:read"]
        rounds = sorted(set(n) & set(rd) & set(base))
        qn = [n[k]["legit_stored_per_s"] / base[k]["legit_stored_per_s"] for k in rounds]
        qr = [rd[k]["legit_stored_per_s"] / base[k]["legit_stored_per_s"] for k in rounds]
        q = [n[k]["legit_stored_per_s"] / rd[k]["legit_stored_per_s"] for k in rounds]
        sent = med([r["flood_pps_sent"] for r in n.values()])
        print(f"| {mix} {pps//1000}k/s | {sent/1e3:.0f}k | {med(qn):.2f} ({min(qn):.2f}–{max(qn):.2f}) "
              f"| {med(qr):.2f} ({min(qr):.2f}–{max(qr):.2f}) | **{med(q):.2f}** ({min(q):.2f}–{max(q):.2f}) "
              f"| {med([r['node_cpu'] for r in n.values()]):.2f} | {med([r['drops_per_s']['kernel'] for r in n.values()]):,.0f} "
              f"| {med([r['flood_cpu'] for r in n.values()]):.2f} |")
print()
print(f"No flood: {med([r['legit_stored_per_s'] for r in base.values()])/1e6:.2f}M records/s, node CPU {med([r['node_cpu'] for r in base.values()]):.2f}.")
