#!/usr/bin/env python3
"""research/032: medians (min-max) per build of a run.sh output (--only live or --only fleet), and the after ÷
before ratio of the main figure paired by round (run.sh runs the builds of one round one after the other).
Usage: summarize.py RESULTS.jsonl"""
import json, statistics, sys
from collections import defaultdict

LIVE = ["socket_p50_ms", "socket_p99_ms", "socket_answer_p50_ms", "uplink_stored_ack_p50_ms",
        "socket_p50_over_uplink_stored_ack_p50", "kept_p50_ms", "kept_p99_ms", "kept_answer_p50_ms",
        "kept_p50_over_uplink_stored_ack_p50", "fdatasync_p50_ms", "udp_rtt_p50_ms",
        "socket_p50_over_commit_plus_rtt", "command_p50_ms"]
FLEET = ["own_node_p50_ms", "own_node_p99_ms", "other_node_p50_ms", "uplink_stored_ack_p50_ms",
         "own_p50_over_uplink_stored_ack_p50", "other_over_own_p50", "pg_commit_p50_ms"]

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
fleet = rows[0].get("part") == "fleet"
keys, main = (FLEET, "own_node_p50_ms") if fleet else (LIVE, "socket_p50_ms")
by = defaultdict(list)
for r in rows:
    by[r["build"]].append(r)
for b, rs in by.items():
    out = {"build": b, "rounds": len(rs)}
    for k in keys:
        v = [r[k] for r in rs if k in r]
        if v:
            out[k] = "%.3f (%.3f-%.3f)" % (statistics.median(v), min(v), max(v))
    print(json.dumps(out))
builds = list(by)
if len(builds) == 2:
    before, after = builds
    # Pair the lines of one round in file order: run.sh writes each round's builds together.
    pairs, cur = [], {}
    for r in rows:
        cur[r["build"]] = r
        if len(cur) == 2:
            pairs.append(cur)
            cur = {}
    ratios = [p[after][main] / p[before][main] for p in pairs]
    print(json.dumps({"paired": f"{after} / {before}", "figure": main, "rounds": len(ratios),
                      "median": round(statistics.median(ratios), 3),
                      "min": round(min(ratios), 3), "max": round(max(ratios), 3)}))
