#!/usr/bin/env python3
"""research/053: per build, the medians over rounds of the node's CPU over the live-mixed part and of the per-pair
ratios. Usage: cpu.py RUN.jsonl"""
import json, sys, statistics as st
by = {}
for r in (json.loads(l) for l in open(sys.argv[1])):
    by.setdefault(r['build'], []).append(r)
for b, v in by.items():
    med = lambda k: round(st.median(r[k] for r in v if k in r), 3)
    print(json.dumps({'build': b, 'rounds': len(v), 'node_cpu_ms': med('node_cpu_ms'),
                      'socket_over_uplink_pair_p50': med('socket_over_uplink_pair_p50'),
                      'kept_over_uplink_pair_p50': med('kept_over_uplink_pair_p50'),
                      'dgram_over_uplink_pair_p50': med('dgram_over_uplink_pair_p50'),
                      'dgram_p50_over_paced_commit_plus_rtt': med('dgram_p50_over_paced_commit_plus_rtt')}))
