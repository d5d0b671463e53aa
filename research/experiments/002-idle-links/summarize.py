#!/usr/bin/env python3
"""Medians of research/002's results.jsonl, as the markdown tables of research/002-idle-links.md."""
import json
import statistics
import sys
from collections import defaultdict

rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
listed = defaultdict(lambda: defaultdict(list))
idle = defaultdict(lambda: defaultdict(list))
reload = defaultdict(lambda: defaultdict(list))
for r in rows:
    key = (r["label"], r["senders"])
    target = {"listed": listed, "reload": reload}.get(r["phase"], idle)
    for k, v in r.items():
        if isinstance(v, (int, float)) and k not in ("run", "senders"):
            target[key][k].append(v)

def med(d, k):
    return statistics.median(d[k]) if d[k] else float("nan")

print("| build | senders | runs | ready (ms), unchanged file | ready (ms), first start | RssAnon (kB) | RssFile (kB) |")
print("|---|---:|---:|---:|---:|---:|---:|")
for (label, n), d in sorted(listed.items()):
    print(f"| {label} | {n:,} | {len(d['ready_ms'])} | {med(d,'ready_ms'):.0f} | {med(d,'first_ready_ms'):.0f} | "
          f"{med(d,'rss_anon_kb'):,.0f} | {med(d,'rss_file_kb'):,.0f} |")
print()
for label in sorted({l for l, _ in listed}):
    a, b = listed.get((label, 100000)), listed.get((label, 1000000))
    if a and b:
        slope = (med(b, "rss_anon_kb") - med(a, "rss_anon_kb")) * 1024 / 900000
        fslope = (med(b, "rss_file_kb") - med(a, "rss_file_kb")) * 1024 / 900000
        print(f"- {label}: anonymous memory per listed sender (slope 100k→1M) {slope:.1f} B; file-backed {fslope:.1f} B")
print()
print("| build | senders | runs | deliver (s) | X25519 | RssAnon after sending (kB) | RssAnon after idle (kB) | per sender after idle (B) |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for (label, n), d in sorted(idle.items()):
    base = listed.get((label, 0))
    base_kb = med(base, "rss_anon_kb") if base else 0
    per = (med(d, "rss_anon_kb") - base_kb) * 1024 / n
    print(f"| {label} | {n:,} | {len(d['rss_anon_kb'])} | {med(d,'deliver_s'):.1f} | {med(d,'x25519'):,.0f} | "
          f"{med(d,'rss_anon_after_send_kb'):,.0f} | {med(d,'rss_anon_kb'):,.0f} | {per:.0f} |")

print()
print("| build | senders | runs | SIGHUP → reload done, changed file (ms) |")
print("|---|---:|---:|---:|")
for (label, n), d in sorted(reload.items()):
    print(f"| {label} | {n:,} | {len(d['reload_ms'])} | {med(d,'reload_ms'):.0f} |")
