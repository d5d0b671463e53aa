#!/usr/bin/env python3
"""research/036: tables from the JSON lines of this folder.

  summarize.py losses FILE...   rounds of tests/dying_disk.rs, by build and card
  summarize.py costs FILE       checkpoint_costs (src/store/mod.rs), medians per variant and turn size, and each
                                variant's records/s over `node_unverified`'s in the same round
  summarize.py check FILE...    whole_check (whole-check.sh)
"""
import json
import statistics
import sys
from collections import defaultdict


def losses(paths):
    runs = defaultdict(list)
    for path in paths:
        for line in open(path):
            r = json.loads(line)
            card = r.get("card") or ("metadata_backed" if r.get("metadata_backed") else "plain")
            runs[(r["build"], card)].append(r)
    print("| build | card | rounds | rounds that lost acked records | acked records lost (each losing round) | "
          "stores taken back while failing (median per round) | served after the repair |")
    print("|---|---|---:|---:|---|---:|---:|")
    for (build, card), rs in sorted(runs.items()):
        losing = [r["lost"] for r in rs if r["lost"]]
        back = [r["came_back"] for r in rs if "came_back" in r]
        served = [r for r in rs if r.get("restart") == "served"]
        print(f"| {build} | {card} | {len(rs)} | {len(losing)} | {', '.join(f'{x:,}' for x in losing) or '—'} | "
              f"{statistics.median(back) if back else '—'} | {len(served) if back else '—'} |")


def costs(path):
    rows = defaultdict(list)
    by_round = defaultdict(dict)
    for line in open(path):
        r = json.loads(line)
        rows[(r["records_per_turn"], r["variant"])].append(r)
        by_round[(r["records_per_turn"], r["round"])][r["variant"]] = r["records_per_s"]
    print("| records per turn | variant | records/s (median) | ÷ node_unverified, same round (median, range) | "
          "commit p50 / p99 µs | commit→synced p50 / p99 µs |")
    print("|---:|---|---:|---|---|---|")
    for (turn, variant), rs in sorted(rows.items()):
        ratios = [v[variant] / v["node_unverified"] for (t, _), v in by_round.items()
                  if t == turn and "node_unverified" in v and variant in v]
        med = lambda k: statistics.median(r[k] for r in rs)
        print(f"| {turn} | {variant} | {med('records_per_s'):,.0f} | {statistics.median(ratios):.2f} "
              f"({min(ratios):.2f}–{max(ratios):.2f}) | {med('commit_us_p50'):.0f} / {med('commit_us_p99'):.0f} | "
              f"{med('synced_us_p50'):.0f} / {med('synced_us_p99'):.0f} |")


def check(paths):
    for path in paths:
        rs = [json.loads(line) for line in open(path)]
        secs = [r["seconds"] for r in rs]
        print(f"| {path} | {rs[0]['mib']} | {len(rs)} | {statistics.median(secs):.1f} ({min(secs)}–{max(secs)}) |")


if __name__ == "__main__":
    {"losses": losses, "costs": lambda p: costs(p[0]), "check": check}[sys.argv[1]](sys.argv[2:])
