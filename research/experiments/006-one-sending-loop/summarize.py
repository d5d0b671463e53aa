#!/usr/bin/env python3
"""Summarizes the JSON lines of research/006-one-sending-loop into markdown: the median (min–max) of every
measurement over the rounds, and ratios computed within each round (both sides measured in the same process, minutes
apart at most) whose median over rounds is what the note reports.

Usage: summarize.py results.jsonl > summary.md   (standard library only)
"""
import json
import statistics
import sys
from collections import defaultdict

F = "forward"
SHAPES = ["link/1", "link/4", "wire/1", "wire/4"]
MODES = [("", "chunks, push per turn (the daemon)"),
         ("/records_push_per_turn", "a record at a time, push per turn"),
         ("/wake_per_record", "a record at a time, push per record")]

# (label, numerator, denominator, target). Ratio per round, then the median over rounds.
RATIOS = [
    ("four links ÷ one link", f"{F}/link/4/records_per_s", f"{F}/link/1/records_per_s", "≥ 1 (BRIEF)"),
    ("one wire ÷ one link", f"{F}/wire/1/records_per_s", f"{F}/link/1/records_per_s", "≥ 0.8 (BRIEF)"),
    ("four wires ÷ one wire", f"{F}/wire/4/records_per_s", f"{F}/wire/1/records_per_s", "≥ 1 (BRIEF)"),
    ("one link ÷ the store alone (one app, turns of 16,384)", f"{F}/link/1/records_per_s",
     "limit/store_apply_turn16384/apps_1/records_per_s", ""),
    ("four links ÷ the store alone (four apps sharing turns of 16,384)", f"{F}/link/4/records_per_s",
     "limit/store_apply_turn16384/apps_4/records_per_s", ""),
    ("one link ÷ the sans-IO sender alone", f"{F}/link/1/records_per_s", "limit/sender_alone/records_per_s", ""),
    ("one link, packets/s ÷ plain UDP packets/s (1,472 B)", f"{F}/link/1/packets_per_s",
     "limit/udp_1472/recv_packets_per_s", ""),
    ("four links, packets/s ÷ plain UDP packets/s", f"{F}/link/4/packets_per_s",
     "limit/udp_1472/recv_packets_per_s", ""),
]
for shape in SHAPES:
    RATIOS.append((f"{shape}: chunks ÷ a record at a time, both pushed per turn",
                   f"{F}/{shape}/records_per_s", f"{F}/{shape}/records_push_per_turn/records_per_s", ""))
    RATIOS.append((f"{shape}: push per turn ÷ push per record, both a record at a time (what the push buys)",
                   f"{F}/{shape}/records_push_per_turn/records_per_s", f"{F}/{shape}/wake_per_record/records_per_s",
                   "> 1"))
    RATIOS.append((f"{shape}: the daemon ÷ a wake per record (both differences together)",
                   f"{F}/{shape}/records_per_s", f"{F}/{shape}/wake_per_record/records_per_s", "> 1"))

TARGETS = {
    f"{F}/link/1/records_per_s": "≥ 1,000,000 (BRIEF)",
    "threads/host_20_outlets/max_while_sending": "≤ 5 (BRIEF)",
}


def fmt(v):
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 100:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.3f}"


def main(path):
    by_name = defaultdict(dict)
    units = {}
    order = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            o = json.loads(line)
            if o["name"] not in units:
                order.append(o["name"])
            by_name[o["name"]][o["run"]] = o["value"]
            units[o["name"]] = o["unit"]
    runs = sorted({r for v in by_name.values() for r in v})

    def med(name):
        vals = list(by_name.get(name, {}).values())
        return (statistics.median(vals), min(vals), max(vals)) if vals else None

    def cell(name, scale=1.0):
        m = med(name)
        if m is None:
            return "–"
        return f"{fmt(m[0] * scale)} ({fmt(m[1] * scale)}–{fmt(m[2] * scale)})"

    print(f"Rounds: {len(runs)} ({', '.join(map(str, runs))}). Median over rounds (min–max).\n")
    print("## Forwarding runs\n")
    for suffix, what in MODES:
        if not any(f"{F}/{s}{suffix}/records_per_s" in by_name for s in SHAPES):
            continue
        print(f"**{what}**\n")
        print("| | records/s | records/packet | packets/s | far records/turn | waits pure-send | waits a-recv "
              "| ns/record a-recv | pure-send | b-recv | pure-http | threads | exactly once |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for s in SHAPES:
            p = f"{F}/{s}{suffix}"
            if f"{p}/records_per_s" not in by_name:
                continue
            once = by_name.get(f"{p}/exactly_once", {})
            print(f"| {s} | {cell(p + '/records_per_s')} | {cell(p + '/records_per_packet')} "
                  f"| {cell(p + '/packets_per_s')} | {cell(p + '/far_records_per_turn')} "
                  f"| {cell(p + '/waits/pure-send')} | {cell(p + '/waits/a-recv')} "
                  f"| {cell(p + '/cpu_ns_per_record/a-recv')} | {cell(p + '/cpu_ns_per_record/pure-send')} "
                  f"| {cell(p + '/cpu_ns_per_record/b-recv')} | {cell(p + '/cpu_ns_per_record/pure-http')} "
                  f"| {cell(p + '/threads')} | {int(sum(once.values()))} of {len(once)} |")
        print()
    print("## Ratios, computed within each round, median (min–max) over rounds\n")
    print("| ratio | median | min – max | rounds | target |")
    print("|---|---:|---:|---:|---|")
    for label, num, den, target in RATIOS:
        rs = [by_name[num][r] / by_name[den][r] for r in runs
              if r in by_name.get(num, {}) and r in by_name.get(den, {}) and by_name[den][r]]
        if not rs:
            continue
        print(f"| {label} | {statistics.median(rs):.3f} | {min(rs):.3f} – {max(rs):.3f} | {len(rs)} | {target} |")
    print()
    print("## Every measurement\n")
    print("| measurement | median | min – max | unit | target |")
    print("|---|---:|---:|---|---|")
    for name in order:
        vals = list(by_name[name].values())
        m = statistics.median(vals)
        print(f"| `{name}` | {fmt(m)} | {fmt(min(vals))} – {fmt(max(vals))} | {units[name]} | {TARGETS.get(name, '')} |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "results.jsonl")
