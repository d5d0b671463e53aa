#!/usr/bin/env python3
"""research/051: medians (min-max) over rounds of benches/downlink --only live-mixed lines, per build, with the
paced commit and round trip. Usage: summarize.py FILE [FILE ...]"""
import json, statistics, sys
keys = ["uplink_stored_ack_p50_ms", "dgram_p50_ms", "dgram_over_uplink_pair_p50", "socket_over_uplink_pair_p50",
        "kept_over_uplink_pair_p50", "fdatasync_p50_ms", "udp_rtt_p50_ms", "dgram_p50_over_commit_plus_rtt",
        "commit_paced_p50_ms", "udp_rtt_paced_p50_ms", "dgram_p50_over_paced_commit_plus_rtt", "load"]
for path in sys.argv[1:]:
    rows = [json.loads(l) for l in open(path)]
    for build in dict.fromkeys(r["build"] for r in rows):
        mine = [r for r in rows if r["build"] == build]
        out = {"file": path, "build": build, "rounds": len(mine)}
        for k in keys:
            v = [r[k] for r in mine if k in r]
            if v:
                out[k] = f"{statistics.median(v):.3f} ({min(v):.3f}-{max(v):.3f})"
        print(json.dumps(out))
