#!/usr/bin/env python3
"""research/047 addendum 2: the row-bound shape's CPU budget, from a bench's raw lines (benches/fleet --many).

Per round and configuration: CPU per record of the node, of PostgreSQL (its whole cluster) and of the devices the
bench drives (`send_cpu_ns_per_record`: the bench process itself), their sum, the machine's busy cores over the span,
and the records/s that sum would allow if the configuration kept the machine as busy as sqlite1 did in the same
round (busy cores of sqlite1 / total CPU per record). Medians over rounds (min-max).

Usage: cpu_budget.py results-quiet-many.jsonl
"""
import collections
import json
import statistics
import sys

rows = collections.defaultdict(dict)  # (build, run) -> {(config, name): value}
for line in open(sys.argv[1]):
    r = json.loads(line)
    rows[r["run"]][(r["config"], r["name"])] = r["value"]


def med(xs):
    return f"{statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})"


out = collections.defaultdict(list)
for run, v in sorted(rows.items()):
    if ("pg1", "records_per_s") not in v or ("sqlite1", "records_per_s") not in v:
        continue
    busy_sqlite = v[("sqlite1", "machine_busy_cores")]
    for c in ("sqlite1", "pg1"):
        node = v[(c, "node_cpu_ns_per_record")] / 1000
        pg = v.get((c, "postgres_cpu_ns_per_record"), 0) / 1000
        dev = v[(c, "send_cpu_ns_per_record")] / 1000
        total = node + pg + dev
        out[(c, "node_us")].append(node)
        out[(c, "postgres_us")].append(pg)
        out[(c, "devices_us")].append(dev)
        out[(c, "total_us")].append(total)
        out[(c, "busy_cores")].append(v[(c, "machine_busy_cores")])
        out[(c, "records_per_s_k")].append(v[(c, "records_per_s")] / 1000)
        out[(c, "at_sqlite_busy_k")].append(busy_sqlite / total * 1e3)
    out[("ratio", "measured")].append(v[("pg1", "records_per_s")] / v[("sqlite1", "records_per_s")])
    out[("ratio", "pg1_at_sqlite1_busy")].append(
        (busy_sqlite / (out[("pg1", "total_us")][-1])) / v[("sqlite1", "records_per_s")] * 1e6
    )
for k in sorted(out):
    print(json.dumps({"config": k[0], "name": k[1], "rounds": len(out[k]), "median_min_max": med(out[k])}))
