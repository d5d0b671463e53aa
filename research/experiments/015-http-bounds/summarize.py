#!/usr/bin/env python3
"""research/015: medians per (via, flood, build): records stored per second, that ÷ no flood in the same round and
build, the node's CPU and its HTTP thread's, handshakes done per second, newcomers' probes; and each build ÷ the one
before it in the same round."""
import json, statistics as st, sys
from collections import defaultdict

path = sys.argv[1] if len(sys.argv) > 1 else "results.jsonl"
runs = [json.loads(l) for l in open(path) if l.startswith("{")]
by = defaultdict(dict)
for r in runs:
    by[(r["build"], r["via"], r["label"])][r["round"]] = r
builds = sys.argv[2].split(",") if len(sys.argv) > 2 else list(dict.fromkeys(r["build"] for r in runs))
labels = list(dict.fromkeys(r["label"] for r in runs))
vias = list(dict.fromkeys(r["via"] for r in runs))
med = st.median


def span(q):
    return f"{med(q):.2f} ({min(q):.2f}–{max(q):.2f})"


print("| via | flood | build | stored/s | ÷ no flood | node CPU | pure-http CPU | flood conns/s | TLS handshakes/s "
      "| refused/s | newcomers ok / tried, p50 ms |")
print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
for v in vias:
    for l in labels:
        for b in builds:
            rs = by[(b, v, l)]
            if not rs:
                continue
            base = by[(b, v, "none/0/64")]
            q = [rs[k]["legit_stored_per_s"] / base[k]["legit_stored_per_s"] for k in sorted(set(rs) & set(base))]
            vals = list(rs.values())
            m = lambda f: med([f(r) for r in vals])
            ok = sum(r["probe_ok"] for r in vals)
            tried = ok + sum(r["probe_failed"] for r in vals)
            p50 = [r["probe_ms_p50"] for r in vals if r["probe_ms_p50"] is not None]
            print(f"| {v} | {l} | {b} | {m(lambda r: r['legit_stored_per_s'])/1e3:,.0f}k | {span(q)} | "
                  f"{m(lambda r: r['node_cpu']):.2f} | {m(lambda r: r['http_thread_cpu']):.2f} | "
                  f"{m(lambda r: r['flood_opened_per_s']):,.0f} | {m(lambda r: r['tls_failures_per_s']):,.0f} | "
                  f"{m(lambda r: sum(r['refused_per_s'].values())):,.0f} | "
                  f"{ok} / {tried}, {med(p50) if p50 else float('nan'):.1f} |")
if len(builds) > 1:
    print()
    print("| via | flood | " + " | ".join(f"{b} ÷ {a}, same round" for a, b in zip(builds, builds[1:])) + " |")
    print("|---|---|" + "---:|" * (len(builds) - 1))
    for v in vias:
        for l in labels:
            cells = []
            for a, b in zip(builds, builds[1:]):
                x, y = by[(a, v, l)], by[(b, v, l)]
                q = [y[k]["legit_stored_per_s"] / x[k]["legit_stored_per_s"] for k in sorted(set(x) & set(y))]
                cells.append(span(q) if q else "—")
            print(f"| {v} | {l} | " + " | ".join(cells) + " |")
