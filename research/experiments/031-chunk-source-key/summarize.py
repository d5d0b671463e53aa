#!/usr/bin/env python3
"""research/031: per shape and configuration, records/s and PostgreSQL CPU per record with the key and without it;
without ÷ with per round (medians, min–max)."""
import json, statistics as st, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
def get(build, shape, config, name):
    return {r["run"]: r["value"] for r in rows
            if r["build"] == build and r.get("shape", "big") == shape and r["config"] == config and r["name"] == name}
def med(v):
    v = sorted(v)
    return f"{st.median(v):,.0f} ({v[0]:,.0f}–{v[-1]:,.0f})"
def ratio(a, b):
    v = sorted(b[k] / a[k] for k in a if k in b)
    return f"{st.median(v):.2f} ({v[0]:.2f}–{v[-1]:.2f})"
print("| shape | config | records/s, key | records/s, no key | no key ÷ key | PG ns/record, key | no key | no key ÷ key |")
print("|---|---|---:|---:|---:|---:|---:|---:|")
for shape in sorted({r.get("shape", "big") for r in rows if "config" in r}):
    for config in ["pg1", "db1"]:
        k = get("key", shape, config, "records_per_s"); n = get("nokey", shape, config, "records_per_s")
        kc = get("key", shape, config, "postgres_cpu_ns_per_record"); nc = get("nokey", shape, config, "postgres_cpu_ns_per_record")
        if not k or not n:
            continue
        print(f"| {shape} | {config} | {med(k.values())} | {med(n.values())} | {ratio(k, n)} | {med(kc.values())} | {med(nc.values())} | {ratio(kc, nc)} |")
