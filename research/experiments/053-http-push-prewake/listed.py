#!/usr/bin/env python3
"""research/053: main's live-mixed figures per number of senders listed, medians over rounds (min, max).
Usage: listed.py RUN.jsonl"""
import json, sys, statistics as st
by = {}
for r in (json.loads(l) for l in open(sys.argv[1])):
    by.setdefault(r['senders'], []).append(r)
keys = ['uplink_stored_ack_p50_ms', 'dgram_over_uplink_pair_p50', 'socket_over_uplink_pair_p50',
        'kept_over_uplink_pair_p50', 'commit_paced_p50_ms', 'dgram_p50_over_paced_commit_plus_rtt', 'node_cpu_ms']
for n, v in sorted(by.items()):
    out = {'senders': n, 'rounds': len(v)}
    for k in keys:
        xs = [r[k] for r in v]
        out[k] = f'{st.median(xs):.3f} ({min(xs):.3f}-{max(xs):.3f})'
    print(json.dumps(out))
