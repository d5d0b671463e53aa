#!/usr/bin/env python3
"""research/049: the stage table of a push from a build with the temporary stage marks (PURE_STAGES for the node,
PURE_STAGES_BENCH for benches/downlink --only live-mixed), both CLOCK_MONOTONIC ns. For each push the bench made,
each stage's first mark after the push began (the loop's wake: the last before it took the push), in us from the
pusher's start; medians over the pushes. Usage: stages.py NODE_MARKS BENCH_MARKS [LABEL]"""
import bisect, json, statistics, sys
from collections import defaultdict

marks = defaultdict(list)
for path in sys.argv[1:3]:
    for line in open(path):
        t, name = line.split()
        marks[name].append(int(t))
for v in marks.values():
    v.sort()

def first_after(name, t):
    v = marks.get(name, [])
    i = bisect.bisect_left(v, t)
    return v[i] if i < len(v) else None

def last_before(name, t):
    v = marks.get(name, [])
    i = bisect.bisect_right(v, t)
    return v[i - 1] if i else None

out = {}
for kind in ["dgram", "http", "kept"]:
    rows = defaultdict(list)
    for t0, dev in zip(marks[f"b.{kind}_t0"], marks[f"b.{kind}_device"]):
        st = {}
        if kind in ("http", "kept"):
            names = ["h.handle", "h.body", "h.lookup", "h.handed"]
            if kind == "http":
                names = ["h.accept", "h.data_at_serve", "h.nodata_at_serve"] + names
            for n in names:
                st[n] = first_after(n, t0)
            if kind == "http":
                # Which came first after this push began: the request's bytes there when the connection's task
                # started, or not yet (then the thread is woken again for them).
                d, nd = st.pop("h.data_at_serve"), st.pop("h.nodata_at_serve")
                waited = nd is not None and (d is None or nd < d)
                rows["request not there at accept (share)"].append(1.0 if waited else 0.0)
            took = first_after("l.took_http", st["h.handed"] or t0)
        else:
            took = first_after("l.took_dgram", t0)
        if took is None or took > dev:
            continue
        st["l.woke"] = last_before("l.woke", took)
        st["l.took"] = took
        for n in ["l.turn", "l.committed", "s.synced", "l.synced_seen", "l.answer_send", "l.down_send",
                  "l.down_sent"]:
            st[n] = first_after(n, took)
        if kind in ("http", "kept"):
            st["h.answer_rx"] = first_after("h.answer_rx", st["l.answer_send"])
            st["h.conn_done"] = first_after("h.conn_done", st["l.answer_send"])
        st["b.answered"] = first_after(f"b.{kind}_answered", t0)
        st["b.device"] = dev
        for n, t in st.items():
            if t is not None and t >= t0:
                rows[n].append((t - t0) / 1e3)
    out[kind] = {n: round(statistics.mean(v) if "share" in n else statistics.median(v), 2 if "share" in n else 1)
                 for n, v in rows.items()}
    out[kind]["pushes"] = len(rows["b.device"])
label = sys.argv[3] if len(sys.argv) > 3 else ""
for kind, d in out.items():
    print(json.dumps({"label": label, "kind": kind, **dict(sorted(d.items(), key=lambda kv: kv[1] if kv[0] != "pushes" else -1))}))
