#!/usr/bin/env python3
"""research/046: medians (min-max) over rounds per build and listed senders of run.sh's --only live-mixed lines, and
the builds' ratios paired by round against BASE. Usage: summarize_mixed.py RESULTS.jsonl [BASE_BUILD]"""
import json, statistics, sys
from collections import defaultdict

KEYS = ["uplink_stored_ack_p50_ms", "dgram_p50_ms", "socket_p50_ms", "dgram_over_uplink_pair_p50",
        "socket_over_uplink_pair_p50", "dgram_p50_over_uplink_p50", "socket_p50_over_uplink_p50",
        "fdatasync_p50_ms", "dgram_p50_over_commit_plus_rtt", "dgram_p99_ms", "socket_p99_ms", "load"]
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
rows = [r for r in rows if r.get("part") == "live-mixed"]
by = defaultdict(list)
for r in rows:
    by[(r["build"], r["senders"])].append(r)
for (b, n), rs in sorted(by.items(), key=lambda x: (x[0][1], x[0][0])):
    out = {"build": b, "senders": n, "rounds": len(rs)}
    for k in KEYS:
        v = [r[k] for r in rs if r.get(k) is not None]
        if v:
            out[k] = "%.3f (%.3f-%.3f)" % (statistics.median(v), min(v), max(v))
    print(json.dumps(out))
builds = list(dict.fromkeys(r["build"] for r in rows))
base = sys.argv[2] if len(sys.argv) > 2 else builds[0]
rounds = defaultdict(dict)
for r in rows:
    rounds[(r["round"], r["senders"])][r["build"]] = r
for b in builds:
    if b == base:
        continue
    for key in ["dgram_p50_ms", "socket_p50_ms", "uplink_stored_ack_p50_ms"]:
        for n in sorted({k[1] for k in rounds}):
            v = [p[b][key] / p[base][key] for (r, m), p in rounds.items() if m == n and b in p and base in p]
            if v:
                print(json.dumps({"paired": f"{b} / {base}, {key}", "senders": n, "rounds": len(v),
                                  "median": round(statistics.median(v), 3), "min": round(min(v), 3),
                                  "max": round(max(v), 3)}))
