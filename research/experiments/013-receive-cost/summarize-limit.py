#!/usr/bin/env python3
"""research/013: the flood against the cheapest receiver, from run-limit.sh's JSON lines."""
import json, statistics as st, sys
from collections import defaultdict

path = sys.argv[1] if len(sys.argv) > 1 else "results-limit.jsonl"
runs = [json.loads(l) for l in open(path) if l.startswith("{")]
by = defaultdict(dict)
for r in runs:
    by[r["label"]][r["round"]] = r
med = st.median
base = by["none:0:node"]
print("| flood | to the node: ÷ no flood | to a reading thread: ÷ no flood | node ÷ reader, same round | node CPU | kernel drops/s | new senders stored | X25519/s unauthenticated |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for mix, pps in [("forged", 100000), ("forged", 400000), ("random", 400000)]:
    n, rd = by[f"{mix}:{pps}:node"], by[f"{mix}:{pps}:read"]
    rounds = sorted(set(n) & set(rd) & set(base))
    qn = [n[k]["legit_stored_per_s"] / base[k]["legit_stored_per_s"] for k in rounds]
    qr = [rd[k]["legit_stored_per_s"] / base[k]["legit_stored_per_s"] for k in rounds]
    q = [n[k]["legit_stored_per_s"] / rd[k]["legit_stored_per_s"] for k in rounds]
    new = [f"{r['new_stored']}/{r['new_senders']}" for r in n.values()]
    print(f"| {mix} {pps//1000}k/s | {med(qn):.2f} ({min(qn):.2f}–{max(qn):.2f}) | {med(qr):.2f} ({min(qr):.2f}–{max(qr):.2f}) "
          f"| **{med(q):.2f}** ({min(q):.2f}–{max(q):.2f}) | {med([r['node_cpu'] for r in n.values()]):.2f} "
          f"| {med([r['drops_per_s']['kernel'] for r in n.values()]):,.0f} | {', '.join(new)} "
          f"| {med([r['x25519_wasted_per_s'] for r in n.values()]):.1f} |")
print()
print(f"No flood: {med([r['legit_stored_per_s'] for r in base.values()])/1e6:.2f}M records/s, node CPU "
      f"{med([r['node_cpu'] for r in base.values()]):.2f}; the reading thread took "
      + ", ".join(f"{l.split(':')[0]} {int(l.split(':')[1])//1000}k/s {med([r['reader_cpu'] for r in v.values()]):.3f}"
                  for l, v in by.items() if l.endswith(':read')) + " of a core.")
