#!/usr/bin/env python3
"""research/026: medians of records/s per binary and configuration, and HEAD / 025 per round, from results.jsonl."""
import json, statistics, sys
from collections import defaultdict

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
for name, unit, scale in [("records_per_s", "M records/s", 1e6), ("node_cpu_ns_per_record", "node ns/record", 1),
                          ("postgres_cpu_ns_per_record", "PostgreSQL ns/record", 1)]:
    fig = defaultdict(dict)  # (config, bin) -> {round: value}
    for r in rows:
        if r.get("name") == name:
            fig[(r["config"], r["bin"])][r["run"]] = r["value"]
    print(f"\n{name}\n")
    print(f"| config | 025 median, {unit} | HEAD median, {unit} | HEAD ÷ 025 per round | median ratio |")
    print("|---|---:|---:|---|---:|")
    for config in sorted({c for c, _ in fig}):
        old, new = fig[(config, "025")], fig[(config, "head")]
        ratios = [new[k] / old[k] for k in sorted(old) if k in new and old[k]]
        if not ratios:
            continue
        print(f"| {config} | {statistics.median(old.values())/scale:.2f} | {statistics.median(new.values())/scale:.2f} | "
              f"{', '.join(f'{x:.2f}' for x in ratios)} | {statistics.median(ratios):.2f} |")
