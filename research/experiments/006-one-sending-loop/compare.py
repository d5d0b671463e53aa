#!/usr/bin/env python3
"""Compares builds measured side by side by ab.sh: for each figure, the median over rounds per build, and the median
(min–max) over rounds of each later build ÷ the first, computed within the round.

Usage: compare.py PREFIX-before PREFIX-after [...]   (the .jsonl files without the extension; standard library)
"""
import json
import statistics
import sys
from collections import defaultdict

KEEP = ("records_per_s", "records_per_packet", "far_records_per_turn", "cpu_ns_per_record", "exactly_once",
        "p50_ms", "packets_per_s", "far_duplicates", "waits/pure-send")


def load(path):
    d = defaultdict(dict)
    with open(path + ".jsonl") as f:
        for line in f:
            if line.startswith("{"):
                o = json.loads(line)
                d[o["name"]][o["run"]] = o["value"]
    return d


def main(paths):
    builds = [load(p) for p in paths]
    tags = [p.rsplit("-", 1)[-1] for p in paths]
    names = [n for n in builds[0] if any(k in n for k in KEEP)]
    head = " | ".join(tags) + " | " + " | ".join(f"{t} ÷ {tags[0]}" for t in tags[1:])
    print(f"| figure | {head} |")
    print("|---" * (1 + len(tags) + len(tags) - 1) + "|")
    for n in names:
        cells = []
        for b in builds:
            v = list(b.get(n, {}).values())
            cells.append(f"{statistics.median(v):,.3g}" if v else "–")
        for b in builds[1:]:
            rs = [b[n][r] / builds[0][n][r] for r in builds[0].get(n, {})
                  if r in b.get(n, {}) and builds[0][n][r]]
            cells.append(f"{statistics.median(rs):.3f} ({min(rs):.2f}–{max(rs):.2f})" if rs else "–")
        print(f"| `{n}` | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
