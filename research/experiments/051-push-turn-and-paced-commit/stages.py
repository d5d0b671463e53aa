#!/usr/bin/env python3
"""research/051: the stages of an uplink record and of a datagram push, from the node's and the bench's marks.
Usage: stages.py NODE_MARKS BENCH_MARKS. Prints, per mark, the median µs from the event's start (the first of it
after the start, before the next event's start)."""
import sys, bisect, statistics
node = [(int(t), w) for t, w in (l.split() for l in open(sys.argv[1]))]
bench = [(int(t), w) for t, w in (l.split() for l in open(sys.argv[2]))]
node.sort()
times = [t for t, _ in node]
ev = {}
for t, w in bench:
    ev.setdefault(w, []).append(t)
starts = sorted([(t, 'u') for t in ev['b.u_t0']] + [(t, 'd') for t in ev['b.d_t0']])
ends = {'u': dict(zip(ev['b.u_t0'], ev['b.u_ack'])), 'd': dict(zip(ev['b.d_t0'], ev['b.d_dev']))}
out = {'u': {}, 'd': {}}
for i, (t0, kind) in enumerate(starts):
    t1 = starts[i + 1][0] if i + 1 < len(starts) else t0 + 5_000_000
    end = ends[kind][t0]
    seen = {}
    for j in range(bisect.bisect_left(times, t0), bisect.bisect_left(times, t1)):
        t, w = node[j]
        if t > end:  # only what happens before the event ends
            break
        seen.setdefault(w, (t - t0) / 1000)
    seen['END'] = (end - t0) / 1000
    for w, us in seen.items():
        out[kind].setdefault(w, []).append(us)
for kind, name in (('u', 'uplink record -> stored ack'), ('d', 'datagram push -> program')):
    print(f'## {name} ({len(out[kind]["END"])} events)')
    for w, v in sorted(out[kind].items(), key=lambda kv: statistics.median(kv[1])):
        print(f'{w:16s} {statistics.median(v):8.1f} µs  (in {len(v)})')
