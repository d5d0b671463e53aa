#!/usr/bin/env python3
"""research/018: tables from results.jsonl (reload_memory.py through run.sh), results-time.jsonl (reload_time.py)
and results-ready.jsonl (benches/idle_links, first start with a parse). Medians (min–max); ratios within a pair
or round, where the two builds ran side by side."""
import json
import statistics as st
from collections import defaultdict


def span(xs, f):
    return f"{f(st.median(xs))} ({f(min(xs))}–{f(max(xs))})"


mb = lambda v: f"{v / 1e6:.1f}"
rows = [json.loads(l) for l in open("results.jsonl")]
print("| build | resting VmRSS MB (of which file) | good reload: VmRSS peak above rest, MB | refused reload: peak above rest, MB | VmRSS after, MB |")
print("|---|---:|---:|---:|---:|")
for b in ("before", "after"):
    rest = [r for r in rows if r["build"] == b and r.get("at") == "rest"]
    good = [r for r in rows if r["build"] == b and r.get("reload") == "good"]
    bad = [r for r in rows if r["build"] == b and r.get("reload") == "bad"]
    print(f"| {b} | {span([r['VmRSS'] for r in rest], mb)} ({span([r['RssFile'] for r in rest], mb)}) | "
          f"{span([r['rss_peak'] - r['rss_before'] for r in good], mb)} | "
          f"{span([r['rss_peak'] - r['rss_before'] for r in bad], mb)} | "
          f"{span([r['rss_after'] for r in good + bad], mb)} |")

t = [json.loads(l) for l in open("results-time.jsonl")]
by = defaultdict(dict)
for r in t:
    if "round" in r:
        by[(r["phase"], r["round"])][r["build"]] = r["seconds"]
print("\n| reload (two nodes, reloaded in turn) | before, s | after, s | after ÷ before, same round |")
print("|---|---:|---:|---:|")
for phase in ("good", "bad"):
    pairs = [v for (p, _), v in by.items() if p == phase]
    print(f"| {phase} | {span([v['before'] for v in pairs], lambda x: f'{x:.2f}')} | "
          f"{span([v['after'] for v in pairs], lambda x: f'{x:.2f}')} | "
          f"{span([v['after'] / v['before'] for v in pairs], lambda x: f'{x:.2f}')} |")

ready = [json.loads(l) for l in open("results-ready.jsonl")]
byp = defaultdict(dict)
for r in ready:
    if r["phase"] == "listed":
        byp[r["pair"]][r["label"]] = r
print("\n| first start, 1M senders (idle_links) | before | after | after ÷ before, same pair |")
print("|---|---:|---:|---:|")
ms = lambda x: f"{x:.0f} ms"
print(f"| ready (parse, index written and checked) | {span([v['before']['first_ready_ms'] for v in byp.values()], ms)} | "
      f"{span([v['after']['first_ready_ms'] for v in byp.values()], ms)} | "
      f"{span([v['after']['first_ready_ms'] / v['before']['first_ready_ms'] for v in byp.values()], lambda x: f'{x:.2f}')} |")
print(f"| ready again (index mapped, nothing parsed) | {span([v['before']['ready_ms'] for v in byp.values()], ms)} | "
      f"{span([v['after']['ready_ms'] for v in byp.values()], ms)} | "
      f"{span([v['after']['ready_ms'] / v['before']['ready_ms'] for v in byp.values()], lambda x: f'{x:.2f}')} |")
kb = lambda x: f"{x / 1000:.1f} MB"
print(f"| resident file pages when ready | {span([v['before']['rss_file_kb'] * 1000 for v in byp.values()], mb)} MB | "
      f"{span([v['after']['rss_file_kb'] * 1000 for v in byp.values()], mb)} MB | — |")
loads = [r["load1"] for r in t + ready if "load1" in r]
print(f"\nload average (1 min) during the timed runs: {min(loads):.1f}–{max(loads):.1f}")
