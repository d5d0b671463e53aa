#!/usr/bin/env python3
"""research/002's reload_memory.py lines: per binary and kind of reload, the VmRSS and RssAnon peaks above the
resting figure just before the SIGHUP (MB = 10^6 bytes, as research/018), and the time to the log line.
Usage: summarize_reload.py FILE.jsonl"""
import collections, json, sys
by = collections.defaultdict(list)
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "reload" in r:
        by[(r["binary"], r["reload"])].append(r)
for (binary, kind), rs in by.items():
    rss = [(r["rss_peak"] - r["rss_before"]) / 1e6 for r in rs]
    anon = [(r["anon_peak"] - r["anon_before"]) / 1e6 for r in rs]
    after = [(r["rss_after"] - r["rss_before"]) / 1e6 for r in rs]
    secs = [r["seconds"] for r in rs]
    print(f"{binary} {kind}: VmRSS peak above rest {', '.join(f'{x:.1f}' for x in rss)} MB; "
          f"RssAnon {', '.join(f'{x:.1f}' for x in anon)} MB; VmRSS after - before "
          f"{', '.join(f'{x:+.1f}' for x in after)} MB; {', '.join(f'{x:.2f}' for x in secs)} s")
