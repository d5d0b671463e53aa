#!/usr/bin/env python3
"""research/024 check 7: medians (min–max) per label of idle_links' figures, and after ÷ before of the medians.
Usage: summarize_uplink.py uplink-idle.jsonl [uplink-link.jsonl]

Idle lines carry no round number; each idle_links invocation prints, in this order, the 0-sender node's `listed`
line, then the 1M-sender node's `listed` and `after_idle` lines, so a round of one label is the 0-sender line and
the 1M lines that follow it. Anonymous bytes per sender = (RssAnon at 1M - RssAnon of the same invocation's
0-sender node, listed) / 1M, for both phases (the 0-sender node sends nothing, so it has no after_idle line;
research/002 divides the same way).
Only complete invocations count (0-sender listed, 1M listed, 1M after_idle, all three): an invocation whose lines
were partly lost is left out whole (round 3 of the first block: the file was replaced under the open appends by
another session's git stash at 13:47:50; that round was rerun and its lines appended after). With the link file, send_path's ratios are added from research/021's lines."""
import json, statistics, sys
from collections import defaultdict

vals = defaultdict(list)
lines = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
groups, i = [], 0
while i < len(lines):
    g = lines[i:i + 3]
    key = [(d["label"], d["senders"], d["phase"]) for d in g]
    lab = g[0]["label"]
    if key == [(lab, 0, "listed"), (lab, 1_000_000, "listed"), (lab, 1_000_000, "after_idle")]:
        groups.append(g)
        i += 3
    else:
        print(f"left out: line {i + 1} ({lab}, {g[0]['senders']}, {g[0]['phase']}): its invocation is incomplete",
              file=sys.stderr)
        i += 1
for d in (d for g in groups for d in g):
    lab = d["label"]
    if d["senders"] == 0:
        base = d["rss_anon_kb"]
        continue
    n = d["senders"]
    if d["phase"] == "listed":
        vals[("anon B/sender listed", lab)].append((d["rss_anon_kb"] - base) * 1024 / n)
        vals[("ready ms at 1M", lab)].append(d["ready_ms"])
        vals[("first ready ms at 1M (index build)", lab)].append(d["first_ready_ms"])
        vals[("anon MB total listed at 1M", lab)].append(d["rss_anon_kb"] / 1024)
    elif d["phase"] == "after_idle":
        vals[("anon B/sender after_idle", lab)].append((d["rss_anon_kb"] - base) * 1024 / n)
        vals[("anon MB total after_idle at 1M", lab)].append(d["rss_anon_kb"] / 1024)
        vals[("anon MB right after sending at 1M", lab)].append(d["rss_anon_after_send_kb"] / 1024)
        vals[("deliver s at 1M", lab)].append(d["deliver_s"])
        vals[("stored at 1M", lab)].append(d["stored"])
        vals[("sessions left at 1M", lab)].append(d["sessions"])
if len(sys.argv) > 2:
    names = {"send/records_per_s": "one link records/s", "ratio/link_per_store_alone": "link ÷ store alone",
             "ratio/send_cpu_per_node_cpu": "send CPU ÷ node CPU",
             "store_alone/turn16384/records_per_s": "store alone records/s",
             "send/exit_ok": "send exit ok", "machine/loadavg_1m_at_start": "load 1m at start"}
    for l in open(sys.argv[2]):
        d = json.loads(l)
        if d["name"] in names:
            vals[(names[d["name"]], d["label"])].append(d["value"])

def f(x):
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.2f}"

order = []
for n, _ in vals:
    if n not in order:
        order.append(n)
print("| figure | before median (min–max) | after median (min–max) | after ÷ before |")
print("|---|---:|---:|---:|")
for n in order:
    cells, meds = [], {}
    for lab in ("before", "after"):
        v = vals.get((n, lab))
        if not v:
            cells.append("—")
            continue
        meds[lab] = statistics.median(v)
        cells.append(f"{f(meds[lab])} ({f(min(v))}–{f(max(v))}), n={len(v)}")
    r = f"{meds['after'] / meds['before']:.3f}" if len(meds) == 2 and meds["before"] else "—"
    print(f"| {n} | {cells[0]} | {cells[1]} | {r} |")
