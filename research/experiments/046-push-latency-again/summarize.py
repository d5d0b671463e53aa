#!/usr/bin/env python3
"""research/046: medians (min-max) per build and listed senders of a run.sh output (--only live), and ratios paired by
round against the build named first on the command line (default: the first in the file).
Usage: summarize.py RESULTS.jsonl [BASE_BUILD]"""
import json, statistics, sys
from collections import defaultdict

KEYS = ["dgram_p50_ms", "paced_uplink_stored_ack_p50_ms", "dgram_p50_over_paced_uplink_stored_ack_p50",
        "socket_p50_ms", "socket_p50_over_paced_uplink_stored_ack_p50", "kept_p50_ms",
        "dgram_hot_p50_ms", "uplink_stored_ack_p50_ms", "dgram_hot_p50_over_uplink_stored_ack_p50",
        "dgram_answer_p50_ms", "socket_answer_p50_ms", "uplink_commit_us_per_turn", "paced_uplink_commit_us_per_turn",
        "dgram_commit_us_per_turn", "fdatasync_p50_ms", "udp_rtt_p50_ms", "load"]

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip() and l.startswith("{")]
rows = [r for r in rows if r.get("part", "live") == "live"]
by = defaultdict(list)
for r in rows:
    by[(r["build"], r.get("senders", 1))].append(r)
for (b, n), rs in by.items():
    out = {"build": b, "senders": n, "rounds": len(rs)}
    for k in KEYS:
        v = [r[k] for r in rs if r.get(k) is not None and r[k] == r[k]]
        if v:
            out[k] = "%.3f (%.3f-%.3f)" % (statistics.median(v), min(v), max(v))
    print(json.dumps(out))
builds = list(dict.fromkeys(r["build"] for r in rows))
base = sys.argv[2] if len(sys.argv) > 2 else builds[0]
rounds = defaultdict(dict)
for r in rows:
    rounds[(r["round"], r.get("senders", 1))][r["build"]] = r
for b in builds:
    if b == base:
        continue
    for key in ["dgram_p50_ms", "socket_p50_ms", "paced_uplink_stored_ack_p50_ms",
                "dgram_p50_over_paced_uplink_stored_ack_p50", "socket_p50_over_paced_uplink_stored_ack_p50"]:
        for n in sorted({k[1] for k in rounds}):
            v = [p[b][key] / p[base][key] for (r, m), p in rounds.items()
                 if m == n and b in p and base in p and p[base].get(key)]
            if v:
                print(json.dumps({"paired": f"{b} / {base}, {key}", "senders": n, "rounds": len(v),
                                  "median": round(statistics.median(v), 3), "min": round(min(v), 3),
                                  "max": round(max(v), 3)}))
