#!/usr/bin/env python3
"""research/054: per build and number of senders listed, medians (min-max) over rounds of live-mixed's per-pair
ratios. Usage: listed.py RUN.jsonl"""
import json, sys, statistics as st
by = {}
for r in (json.loads(l) for l in open(sys.argv[1])):
    by.setdefault((r['build'], r['senders']), []).append(r)
for (b, n), v in sorted(by.items()):
    m = lambda k: f"{st.median(r[k] for r in v):.3f} ({min(r[k] for r in v):.3f}-{max(r[k] for r in v):.3f})"
    print(json.dumps({'build': b, 'senders': n, 'rounds': len(v), 'uplink_stored_ack_p50_ms': m('uplink_stored_ack_p50_ms'),
                      'dgram_over_uplink_pair_p50': m('dgram_over_uplink_pair_p50'),
                      'socket_over_uplink_pair_p50': m('socket_over_uplink_pair_p50'),
                      'kept_over_uplink_pair_p50': m('kept_over_uplink_pair_p50'), 'node_cpu_ms': m('node_cpu_ms')}))
