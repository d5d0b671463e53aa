#!/usr/bin/env python3
"""research/016: tables from the JSON lines of run.sh (a) and run-memo.sh (b).

Usage: summarize.py results.jsonl [results-memo.jsonl]
Medians over rounds; ratios are taken within a round (the builds of one round ran side by side)."""
import json
import statistics as st
import sys
from collections import defaultdict


def load(path):
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]


def med(xs):
    return st.median(xs) if xs else float("nan")


def span(xs):
    return f"{med(xs):.2f} ({min(xs):.2f}–{max(xs):.2f})" if xs else "—"


def floods(rows):
    builds = sorted({r["build"] for r in rows}, reverse=True)  # before, after
    by = defaultdict(list)
    for r in rows:
        by[(r["label"], r["build"])].append(r)
    labels = []
    for r in rows:
        if r["label"] not in labels:
            labels.append(r["label"])
    print("| flood | build | new senders stored (of all runs) | first ack ≤ 1 s | time to first ack p50 / max | senders' goodput | after ÷ before, same round | X25519/s wasted, max | node CPU |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for label in labels:
        for b in builds:
            rs = by[(label, b)]
            if not rs:
                continue
            times = [t for r in rs for t in r.get("new_seconds", [])]
            ok = [t for t in times if t is not None]
            within = sum(1 for t in ok if t <= 1.0)
            good = [r["legit_stored_per_s"] for r in rs]
            ratio = "—"
            if b != builds[0]:
                base = {r["round"]: r["legit_stored_per_s"] for r in by[(label, builds[0])]}
                rat = [r["legit_stored_per_s"] / base[r["round"]] for r in rs if base.get(r["round"])]
                ratio = span(rat)
            t = (f"{med(ok):.3f} / {max(ok):.3f} s" if ok else "—") if times else "—"
            stored = f"{len(ok)} of {len(times)}" if times else "—"
            w = f"{within} of {len(times)}" if times else "—"
            wasted = max(r["x25519_wasted_per_s"] for r in rs)
            print(f"| {label} | {b} | {stored} | {w} | {t} | {med(good)/1e3:.0f}k | {ratio} | {wasted:.1f} | {med([r['node_cpu'] for r in rs]):.2f} |")
    print()
    print("Per run, new senders' seconds to first ack (None: not stored within the tool's 10 s):")
    print()
    for label in labels:
        for b in builds:
            rs = sorted(by[(label, b)], key=lambda r: r["round"])
            if rs and rs[0].get("new_seconds"):
                runs = "; ".join(", ".join("None" if t is None else f"{t:.2f}" for t in r["new_seconds"]) for r in rs)
                print(f"- {label}, {b}: {runs}")
    print()


def memo(rows):
    builds = sorted({r["build"] for r in rows}, reverse=True)
    by = defaultdict(list)
    for r in rows:
        by[(r["label"], r["build"])].append(r)
    dev = lambda r: r.get("memo_device_written_bytes", 0)
    print("**Forged first packets at 100k/s, no sender** (memo device writes, window through exit):")
    print()
    print("| build | memo bytes/s | per X25519 wasted | X25519/s wasted | whole node bytes/s |")
    print("|---|---:|---:|---:|---:|")
    for b in builds:
        rs = by[("flood:0:0", b)]
        if not rs:
            continue
        bps = [dev(r) / r["seconds"] for r in rs]
        per = [dev(r) / max(r["x25519_wasted_per_s"] * r["seconds"], 1) for r in rs]
        print(f"| {b} | {med(bps):,.0f} ({min(bps):,.0f}–{max(bps):,.0f}) | {med(per):,.0f} | {med([r['x25519_wasted_per_s'] for r in rs]):.1f} | {med([r['node_written_bytes']/r['seconds'] for r in rs]):,.0f} |")
    print()
    print("**2,000 senders, one record each** (memo device bytes; per new secret = (new − known) ÷ 2,000, same round):")
    print()
    print("| senders | memo before | build | memo bytes, new | memo bytes, known | per new secret | stored (new) |")
    print("|---|---|---|---:|---:|---:|---:|")
    for rate, fill in [("200", "0"), ("200", "1000000"), ("0", "0")]:
        for b in builds:
            new = {r["round"]: r for r in by[(f"new:{rate}:{fill}", b)]}
            known = {r["round"]: r for r in by[(f"known:{rate}:{fill}", b)]}
            rounds = sorted(set(new) & set(known))
            if not rounds:
                continue
            per = [(dev(new[k]) - dev(known[k])) / new[k]["burst"] for k in rounds]
            desc = "at 200/s" if rate != "0" else "all at once"
            mem = "empty" if fill == "0" else f"{int(fill):,} secrets"
            stored = min(new[k]["burst_stored"] for k in rounds)
            print(f"| {desc} | {mem} | {b} | {med([dev(new[k]) for k in rounds]):,.0f} | {med([dev(known[k]) for k in rounds]):,.0f} | {med(per):,.0f} ({min(per):,.0f}–{max(per):,.0f}) | {stored} |")
    print()


if __name__ == "__main__":
    floods(load(sys.argv[1]))
    if len(sys.argv) > 2:
        memo(load(sys.argv[2]))
