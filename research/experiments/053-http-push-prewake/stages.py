#!/usr/bin/env python3
"""research/053: the stages of an uplink record and of a push through each of the push paths (datagram socket,
HTTP on a connection of its own, HTTP on a kept connection), from the node's and the bench's marks (research/051's
stages.py with the HTTP paths). Usage: stages.py NODE_MARKS BENCH_MARKS. Prints, per mark, the median µs from the
event's start (the first of it after the start, before the event ended and before the next event's start)."""
import sys, bisect, statistics
node = sorted((int(t), w) for t, w in (l.split() for l in open(sys.argv[1])))
times = [t for t, _ in node]
ev = {}
for t, w in (l.split() for l in open(sys.argv[2])):
    ev.setdefault(w, []).append(int(t))
kinds = {'u': ('b.u_t0', 'b.u_ack', 'uplink record -> stored ack'),
         'd': ('b.d_t0', 'b.d_dev', 'datagram push -> program'),
         'h': ('b.h_t0', 'b.h_dev', 'HTTP push, a connection of its own -> program'),
         'k': ('b.k_t0', 'b.k_dev', 'HTTP push, kept connection -> program')}
kinds = {k: v for k, v in kinds.items() if v[0] in ev}
starts = sorted((t, k) for k, (s, _, _) in kinds.items() for t in ev[s])
ends = {k: dict(zip(ev[s], ev[e])) for k, (s, e, _) in kinds.items()}
out = {k: {} for k in kinds}
for i, (t0, kind) in enumerate(starts):
    t1 = starts[i + 1][0] if i + 1 < len(starts) else t0 + 5_000_000
    end = ends[kind][t0]
    seen = {}
    for j in range(bisect.bisect_left(times, t0), bisect.bisect_left(times, t1)):
        t, w = node[j]
        if t > end:
            break
        seen.setdefault(w, (t - t0) / 1000)
    seen['END'] = (end - t0) / 1000
    for w, us in seen.items():
        out[kind].setdefault(w, []).append(us)
for kind, (_, _, name) in kinds.items():
    print(f'## {name} ({len(out[kind]["END"])} events)')
    for w, v in sorted(out[kind].items(), key=lambda kv: statistics.median(kv[1])):
        print(f'{w:16s} {statistics.median(v):8.1f} µs  (in {len(v)})')
