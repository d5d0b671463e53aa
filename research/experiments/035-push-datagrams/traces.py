#!/usr/bin/env python3
"""research/035: the figures the note takes from its one-off traces (one run each, raw files beside this script).
- profile-reprepare.json: `perf record --call-graph dwarf` of the loop thread under 600 datagram pushes (build A),
  `perf script` counted: samples, and those with sqlite3Reprepare on the stack.
- perf-trace-push.txt / perf-trace-uplink.txt: `perf trace -e fdatasync,sendmmsg,…` of the node under 12 datagram
  pushes (build C) / 12 records of `pure-serve send`, 0.2 s apart: from each sync's end to the next datagram sent.
- turns-push-then-uplink.jsonl: each turn's time (a throwaway build printing `host.turn`'s elapsed time) under 300
  datagram pushes 5 ms apart (`push.py 300`), then 100 records of `pure-serve send` 10 ms apart.
Usage: traces.py"""
import json, re, statistics

p = json.load(open("profile-reprepare.json"))
print("profile: %d of %d samples in sqlite3Reprepare (%.0f %%)" % (p["in_sqlite3Reprepare"], p["samples"],
                                                                    100 * p["share"]))

def gaps(path):
    out, sync_end = [], None
    for line in open(path):
        m = re.match(r"\s*([\d.]+) \(\s*([\d.]*) ms\): \S+ (\w+)", line)
        if not m:
            continue
        t, d, call = float(m.group(1)), float(m.group(2) or 0), m.group(3)
        if call == "fdatasync":
            sync_end = t + d
        elif call == "sendmmsg" and sync_end is not None:
            out.append((t - sync_end) * 1000)
            sync_end = None
    return out

for name in ("push", "uplink"):
    g = gaps("perf-trace-%s.txt" % name)
    print("%s: sync end -> datagram sent, µs: median %.0f (%.0f-%.0f), n=%d" % (name, statistics.median(g), min(g),
                                                                               max(g), len(g)))

turns = [json.loads(l)["turn_us"] for l in open("turns-push-then-uplink.jsonl")]
busy = [t for t in turns if t > 40]  # turns that did something (an empty turn takes 10-25 µs)
push_phase = busy[100:160]           # the push phase alternates a push's turn and the device's acknowledging read
print("push phase, every other turn: %.0f and %.0f µs (medians)" % (statistics.median(push_phase[0::2]),
                                                                  statistics.median(push_phase[1::2])))
uplink_phase = busy[-100:-3]         # the 100 records of `send`, one turn each (the last few: the node stopping)
print("uplink phase, one record a turn: %.0f µs (median)" % statistics.median(uplink_phase))
