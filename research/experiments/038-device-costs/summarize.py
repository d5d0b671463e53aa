#!/usr/bin/env python3
"""Tables for research/038 from sizes.jsonl, cost.jsonl and symbols.jsonl (markdown on stdout)."""
import collections, json, os, statistics

HERE = os.path.dirname(os.path.abspath(__file__))


def load(name):
    p = os.path.join(HERE, name)
    return [json.loads(l) for l in open(p)] if os.path.exists(p) else []


def sizes():
    rows = load("sizes.jsonl")
    print("| target | variant | opt | vectors | .text | .rodata | .eh_frame | .data | .bss (stub 4,096) | **flash** | core::fmt in .text |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['target']} | {r['variant']} | {r['opt_level']} | {r['vector_table']:,} | {r['text']:,} | "
              f"{r['rodata']:,} | {r['eh_frame']:,} | {r['data']:,} | {r['bss']:,} | **{r['flash']:,}** | "
              f"{r['core_fmt_text_bytes']:,} B |")


def cost():
    rows = [r for r in load("cost.jsonl") if r.get("kind") == "cost" and "instructions" in r]
    by = collections.defaultdict(list)
    for r in rows:
        by[r["op"]].append(r["instructions"])
    print("| operation | samples | median instructions | min–max | µs at 64 MHz, 1 instr/cycle |")
    print("|---|---:|---:|---:|---:|")
    for op, v in by.items():
        m = statistics.median(v)
        print(f"| {op} | {len(v)} | {m:,.0f} | {min(v):,}–{max(v):,} | {m / 64:,.1f} |")
    for r in load("cost.jsonl"):
        if r.get("kind") == "stack":
            print(f"\nstack run {r['run']}: exit {r['exit']}, stack peak {r.get('stack_peak')}, sender "
                  f"{r.get('sender_state')}, outbox {r.get('outbox_state')}")


if __name__ == "__main__":
    print("## Sizes\n")
    sizes()
    print("\n## Instructions\n")
    cost()
