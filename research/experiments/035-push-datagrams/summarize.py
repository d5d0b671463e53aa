#!/usr/bin/env python3
"""research/035: medians (min-max) per build of a run.sh output (--only live), and ratios paired by round (run.sh runs
the builds of one round one after the other). Usage: summarize.py RESULTS.jsonl"""
import json, statistics, sys
from collections import defaultdict

KEYS = ["dgram_p50_ms", "dgram_p99_ms", "dgram_answer_p50_ms", "socket_p50_ms", "socket_p99_ms",
        "socket_answer_p50_ms", "uplink_stored_ack_p50_ms", "dgram_p50_over_uplink_stored_ack_p50",
        "socket_p50_over_uplink_stored_ack_p50", "uplink_commit_us_per_turn", "dgram_commit_us_per_turn",
        "fdatasync_p50_ms", "udp_rtt_p50_ms", "command_p50_ms",
        # From the pacing run on (the bench's uplink also 5 ms apart, and pushes back to back):
        "paced_uplink_stored_ack_p50_ms", "dgram_p50_over_paced_uplink_stored_ack_p50",
        "socket_p50_over_paced_uplink_stored_ack_p50", "dgram_hot_p50_ms", "dgram_hot_p50_over_uplink_stored_ack_p50",
        "paced_uplink_commit_us_per_turn"]

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
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
# Rounds: the lines of one round are consecutive, one per build.
builds = list(by)
rounds = defaultdict(dict)
for r in rows:
    rounds[r["round"]][r["build"]] = r


def paired(name, f):
    v = [f(p) for p in rounds.values() if all(b in p for b in builds)]
    v = [x for x in v if x is not None]
    if v:
        print(json.dumps({"paired": name, "rounds": len(v), "median": round(statistics.median(v), 3),
                          "min": round(min(v), 3), "max": round(max(v), 3)}))


for b in builds:
    if by[b][0].get("dgram_p50_ms") is not None:
        paired(f"{b}: dgram p50 / socket p50", lambda p, b=b: p[b]["dgram_p50_ms"] / p[b]["socket_p50_ms"])
        paired(f"{b}: dgram p50 / uplink stored ack p50",
               lambda p, b=b: p[b]["dgram_p50_ms"] / p[b]["uplink_stored_ack_p50_ms"])
if "A" in builds and "B" in builds:
    paired("B / A, dgram p50", lambda p: p["B"]["dgram_p50_ms"] / p["A"]["dgram_p50_ms"])
    paired("B / A, socket p50", lambda p: p["B"]["socket_p50_ms"] / p["A"]["socket_p50_ms"])
    paired("B / A, uplink stored ack p50",
           lambda p: p["B"]["uplink_stored_ack_p50_ms"] / p["A"]["uplink_stored_ack_p50_ms"])
if "main" in builds and "A" in builds:
    paired("A / main, socket p50", lambda p: p["A"]["socket_p50_ms"] / p["main"]["socket_p50_ms"])
    paired("A / main, uplink stored ack p50",
           lambda p: p["A"]["uplink_stored_ack_p50_ms"] / p["main"]["uplink_stored_ack_p50_ms"])
