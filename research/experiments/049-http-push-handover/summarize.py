#!/usr/bin/env python3
"""research/049: medians (min-max) over rounds per build of run.sh's --only live-mixed lines (research/046's run.sh,
PART=live-mixed), with the kept-connection HTTP push this note added, and each build's per-pair ratios paired by round
against BASE (build / base of the same round). Usage: summarize.py RESULTS.jsonl [BASE_BUILD]"""
import json, statistics, sys
from collections import defaultdict

KEYS = ["uplink_stored_ack_p50_ms", "dgram_p50_ms", "socket_p50_ms", "kept_p50_ms", "dgram_over_uplink_pair_p50",
        "socket_over_uplink_pair_p50", "kept_over_uplink_pair_p50", "fdatasync_p50_ms", "load"]
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
rows = [r for r in rows if r.get("part") == "live-mixed"]
by = defaultdict(list)
for r in rows:
    by[r["build"]].append(r)
for b, rs in by.items():
    out = {"build": b, "rounds": len(rs)}
    for k in KEYS:
        v = [r[k] for r in rs if r.get(k) is not None]
        if v:
            out[k] = "%.3f (%.3f-%.3f)" % (statistics.median(v), min(v), max(v))
    print(json.dumps(out))
base = sys.argv[2] if len(sys.argv) > 2 else list(by)[0]
rounds = defaultdict(dict)
for r in rows:
    rounds[r["round"]][r["build"]] = r
for b in by:
    if b == base:
        continue
    for key in ["dgram_over_uplink_pair_p50", "socket_over_uplink_pair_p50", "kept_over_uplink_pair_p50",
                "socket_p50_ms", "uplink_stored_ack_p50_ms"]:
        v = [p[b][key] / p[base][key] for p in rounds.values() if b in p and base in p]
        if v:
            print(json.dumps({"paired": f"{b} / {base}, {key}", "rounds": len(v),
                              "median": round(statistics.median(v), 3), "min": round(min(v), 3),
                              "max": round(max(v), 3)}))
