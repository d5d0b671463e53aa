#!/usr/bin/env python3
"""research/014: tables from results.jsonl (loss counts per build and room) and costs.jsonl (checkpoint_costs)."""
import json
import statistics
import sys
from collections import defaultdict


def losses(path):
    runs = defaultdict(list)
    for line in open(path):
        r = json.loads(line)
        runs[(r["build"], r["room_mib"])].append(r)
    print("| build | room MiB | runs | runs that lost acked records | acked records lost (each losing run) "
          "| runs where b held records a lost | acked per run (median) |")
    print("|---|---:|---:|---:|---|---:|---:|")
    for (build, room), rs in sorted(runs.items(), key=lambda kv: (kv[0][0] != "before", kv[0][1])):
        losing = [r["lost"] for r in rs if r["lost"]]
        print(f"| {build} | {room} | {len(rs)} | {len(losing)} | {', '.join(map(str, losing)) or '—'} | "
              f"{sum(1 for r in rs if r['b_not_in_a'])} | {statistics.median(r['acked'] for r in rs):,.0f} |")
    for build in sorted({b for b, _ in runs}):
        rs = [r for (b, _), v in runs.items() if b == build for r in v]
        print(f"\n{build}: {sum(1 for r in rs if r['lost'])} of {len(rs)} runs lost acked records "
              f"({sum(r['lost'] for r in rs)} in all); doubled: {sum(r['doubled_in_a'] for r in rs)}")


def costs(path):
    rows = defaultdict(list)
    for line in open(path):
        r = json.loads(line)
        rows[(r["records_per_turn"], r["variant"])].append(r)
    print("| records per turn | variant | records/s | ÷ sqlite_auto, same round | commit p50 / p99 / max µs "
          "| commit→synced p50 / p99 µs | -wal at the end |")
    print("|---:|---|---:|---:|---|---|---:|")
    for (turn, variant), rs in sorted(rows.items()):
        base = {r["round"]: r["records_per_s"] for r in rows[(turn, "sqlite_auto")]}
        ratios = [r["records_per_s"] / base[r["round"]] for r in rs if r["round"] in base]
        med = lambda k: statistics.median(r[k] for r in rs)
        print(f"| {turn} | {variant} | {med('records_per_s'):,.0f} | {statistics.median(ratios):.2f} "
              f"({min(ratios):.2f}–{max(ratios):.2f}) | {med('commit_us_p50'):.0f} / {med('commit_us_p99'):.0f} / "
              f"{med('commit_us_max'):.0f} | {med('synced_us_p50'):.0f} / {med('synced_us_p99'):.0f} | "
              f"{med('wal_bytes') / 2**20:.1f} MiB |")


if __name__ == "__main__":
    which, path = sys.argv[1], sys.argv[2]
    {"losses": losses, "costs": costs}[which](path)
