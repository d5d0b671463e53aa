#!/usr/bin/env python3
"""Summary of shm_fault.py's JSON lines: how each (phase, setup, block size) ended, and whether readers could read."""
import collections, json, sys

ends = collections.defaultdict(collections.Counter)
readers = {}
for path in sys.argv[1:]:
    for line in open(path):
        r = json.loads(line)
        if "round" in r:
            end = "SIGBUS" if "SIGBUS" in r["end"] else ("clean error" if r["end"] == "exit 3" else r["end"])
            ends[(r.get("phase", "full-at-open"), r["setup"], r["block"])][end] += 1
        elif "reader_while_writer_runs" in r:
            readers[r["setup"]] = (r["reader_while_writer_runs"], r["why"])
print("| phase | setup | block | rounds | SIGBUS | clean error | exit 0 |")
print("|---|---|---:|---:|---:|---:|---:|")
for (phase, setup, block), c in sorted(ends.items()):
    print(f"| {phase} | {setup} | {block} | {sum(c.values())} | {c['SIGBUS']} | {c['clean error']} | {c['exit 0']} |")
print()
for setup, (ok, why) in sorted(readers.items()):
    print(f"- {setup}: another process can read while the writer has the store open: {'yes' if ok else 'no (' + why + ')'}")
