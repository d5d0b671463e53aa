#!/usr/bin/env python3
"""research/032: medians (min-max) per build of the live push figures in a run.sh output."""
import json, statistics, sys
from collections import defaultdict

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by = defaultdict(list)
for r in rows:
    by[r["build"]].append(r)
keys = ["socket_p50_ms", "socket_p99_ms", "socket_answer_p50_ms", "uplink_stored_ack_p50_ms",
        "socket_p50_over_uplink_stored_ack_p50", "kept_p50_ms", "kept_p99_ms", "kept_answer_p50_ms",
        "kept_p50_over_uplink_stored_ack_p50", "fdatasync_p50_ms", "udp_rtt_p50_ms",
        "socket_p50_over_commit_plus_rtt", "command_p50_ms"]
for b, rs in by.items():
    out = {"build": b, "rounds": len(rs)}
    for k in keys:
        v = [r[k] for r in rs if k in r]
        if not v:
            continue
        out[k] = "%.3f (%.3f-%.3f)" % (statistics.median(v), min(v), max(v))
    print(json.dumps(out))
