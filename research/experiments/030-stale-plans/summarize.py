#!/usr/bin/env python3
"""research/030: records/s and PostgreSQL CPU per record by shape, statistics and build; after ÷ before per round."""
import json, statistics as st, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
def get(build, analyze, shape, name):
    return {r["run"]: r["value"] for r in rows
            if r["build"] == build and r["analyze"] == analyze and r.get("shape", "big") == shape and r["name"] == name}
def med(v):
    v = sorted(v)
    return f"{st.median(v):,.0f} ({v[0]:,.0f}–{v[-1]:,.0f})"
def ratio(a, b):
    v = sorted(b[k] / a[k] for k in a if k in b)
    return f"{st.median(v):.2f} ({v[0]:.2f}–{v[-1]:.2f})"
print("| shape | statistics | before records/s | after records/s | after ÷ before | before PG ns/rec | after PG ns/rec |")
print("|---|---|---:|---:|---:|---:|---:|")
shapes = sorted({r.get("shape", "big") for r in rows})
for shape in shapes:
    for analyze in ["--no-analyze", "yes", "big"]:
        b = get("before", analyze, shape, "records_per_s"); a = get("after", analyze, shape, "records_per_s")
        if not b or not a:
            continue
        bc = get("before", analyze, shape, "postgres_cpu_ns_per_record"); ac = get("after", analyze, shape, "postgres_cpu_ns_per_record")
        label = {"--no-analyze": "made on an empty table", "yes": "analyzed", "big": "—"}[analyze]
        print(f"| {shape} | {label} | {med(b.values())} | {med(a.values())} | {ratio(b, a)} | {med(bc.values())} | {med(ac.values())} |")
# the after build without ANALYZE beside itself with ANALYZE, same round
for shape in shapes:
    na = get("after", "--no-analyze", shape, "records_per_s"); y = get("after", "yes", shape, "records_per_s")
    if na and y:
        print(f"\nafter, {shape}: without ÷ with ANALYZE, same round: {ratio(y, na)}")
