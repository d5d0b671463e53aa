#!/usr/bin/env python3
"""research/032: stage times of pushes from a trace build's standard error (trace.patch applied; PURE_TRACE=1).

Each push is cut from one `bench_push` mark to the next; pushes whose marks came in the most common order are
kept, and for each mark the median time since `bench_push` is printed as a JSON line.
Usage: stages.py TRACE_STDERR LABEL"""
import collections, json, re, statistics, sys

events = []
for line in open(sys.argv[1]):
    m = re.match(r"TR (\d+) (\S+)$", line.strip())
    if m:
        events.append((int(m.group(1)), m.group(2)))
events.sort()
pushes, cur = [], None
for ns, label in events:
    if label == "bench_push":
        if cur:
            pushes.append(cur)
        cur = [(ns, label)]
    elif cur is not None:
        cur.append((ns, label))
if cur:
    pushes.append(cur)
pushes = pushes[:200]
orders = collections.Counter(tuple(l for _, l in p) for p in pushes)
common = orders.most_common(1)[0][0]
kept = [p for p in pushes if tuple(l for _, l in p) == common]
for i, label in enumerate(common):
    if label == "bench_answered":
        break
    us = statistics.median((p[i][0] - p[0][0]) / 1000 for p in kept)
    print(json.dumps({"build": sys.argv[2], "pushes": len(kept), "stage": i, "mark": label, "us": round(us, 1)}))
