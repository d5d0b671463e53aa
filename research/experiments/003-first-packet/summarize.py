#!/usr/bin/env python3
"""Summarizes results.jsonl of research/003-first-packet-latency into the markdown tables of the note.

Per variant: the median over rounds of each round's p50 and p99 (and the p50's range over rounds). Ratios and
differences are computed within each round (the variants were measured side by side, interleaved) and then the
median over rounds is reported, with the range.

Usage: summarize.py results.jsonl   (standard library only; prints markdown)
"""
import json
import statistics
import sys
from collections import defaultdict

VARIANTS = [
    ("ours/known", "idle link wakes, sender in the node's memo (0 X25519 on the node); sender's X25519 before the clock"),
    ("ours/new", "idle link, sender never seen (1 X25519 on the node)"),
    ("ours/known+setup", "as ours/known, clock started before `UdpLink::connect` (socket, sender's X25519, HKDF)"),
    ("quinn/new", "quinn: new endpoint, full TLS 1.3 handshake, bi stream, 40 B → 1 B answer (nothing stored)"),
    ("quinn/0rtt", "quinn: same with session resumption and 0-RTT data"),
    ("machine/udp_commit_rtt", "floor: UDP round trip to a thread that commits one row (WAL, synchronous=FULL) first"),
    ("machine/sqlite_commit", "one SQLite commit of one row, WAL, synchronous=FULL (the fsync)"),
    ("machine/udp_rtt", "one UDP round trip to an echo thread (96 B)"),
    ("machine/x25519", "one X25519 (x25519-dalek)"),
    ("ours/sender_setup", "the sender's setup alone (new `UdpLink`: socket, X25519, HKDF), from the ours/known samples"),
    ("ours/first_contact", "first contact of each known sender, before the rounds' samples (1 X25519 on the node)"),
    ("phase/handle_datagram", "node step (`--phases`, no sockets): a known sender's first packet of a new run (memo lookup in SQLite, HKDF, AES open, new session)"),
    ("phase/apply_turn_commit", "node step: the turn applied to the app's store and committed (the fsync)"),
    ("phase/acks", "node step: committed → ack frame sealed"),
    ("phase/memo_put", "node step: memo write (nothing new for a known sender)"),
    ("phase/probe_commit", "the one-row commit probe beside the phases"),
]

# (label, numerator, denominator, target)
RATIOS = [
    ("**ours/known p50 ÷ quinn/new p50** (BRIEF target)", "ours/known", "quinn/new", "≤ 0.5"),
    ("ours/new p50 ÷ quinn/new p50", "ours/new", "quinn/new", "≤ 0.5"),
    ("ours/known+setup p50 ÷ quinn/new p50", "ours/known+setup", "quinn/new", ""),
    ("ours/known p50 ÷ quinn/0rtt p50", "ours/known", "quinn/0rtt", ""),
    ("floor (udp_commit_rtt) p50 ÷ quinn/new p50", "machine/udp_commit_rtt", "quinn/new", "what a design with one durable commit per ack can reach here"),
    ("ours/known p50 ÷ floor p50", "ours/known", "machine/udp_commit_rtt", "≈ 1 if nothing but the round trip and the commit counts"),
    ("sqlite_commit p50 ÷ ours/known p50", "machine/sqlite_commit", "ours/known", "share of the commit"),
    ("node's apply+commit p50 ÷ one-row commit p50 (`--phases`)", "phase/apply_turn_commit", "phase/probe_commit", "≈ 1 if the store's commit costs what SQLite's least does"),
]

# (label, minuend, subtrahend)
DIFFS = [
    ("ours/known − floor (our own work above a round trip with a commit)", "ours/known", "machine/udp_commit_rtt"),
    ("ours/new − ours/known (the node's X25519 and memo miss)", "ours/new", "ours/known"),
    ("ours/known+setup − ours/known (the sender's setup at wake)", "ours/known+setup", "ours/known"),
    ("floor − udp_rtt (what the commit adds to a bare round trip)", "machine/udp_commit_rtt", "machine/udp_rtt"),
    ("quinn/new − quinn/0rtt (what resumption with 0-RTT saves)", "quinn/new", "quinn/0rtt"),
]


def fmt(v, digits=3):
    return "–" if v is None else f"{v:.{digits}f}"


def main(path):
    rows = [json.loads(l) for l in open(path) if l.strip()]
    header = next((r for r in rows if r["variant"] == "header"), None)
    by = defaultdict(dict)  # variant -> round -> row
    counters = {}
    for r in rows:
        if r["variant"] == "header":
            continue
        if r["variant"] == "counters":
            counters[r["round"]] = r
        else:
            by[r["variant"]][r["round"]] = r
    rounds = sorted(counters)
    if header:
        print(f"Run {header['date']}, commit {header['commit']}, {header['cpu']}, {header['cores']} cores, "
              f"kernel {header['kernel']}, load at start {' '.join(header['load'])}, state on {header['state_fs']}; "
              f"{len(rounds)} rounds, idle {header['idle_ms']} ms, gap before each sample {header['gap_ms']} ms.")
        print()
    print("| variant | what | p50 ms (median of rounds) | p50 range over rounds | p99 ms (median of rounds) | samples per round |")
    print("|---|---|---:|---:|---:|---:|")
    for name, what in VARIANTS:
        rs = by.get(name, {})
        if not rs:
            continue
        p50 = [rs[k]["p50_ms"] for k in sorted(rs)]
        p99 = [rs[k]["p99_ms"] for k in sorted(rs)]
        n = sorted({rs[k]["n"] for k in rs})
        print(f"| {name} | {what} | {fmt(statistics.median(p50))} | {fmt(min(p50))}–{fmt(max(p50))} | "
              f"{fmt(statistics.median(p99))} | {'/'.join(map(str, n))} |")
    print()
    print("| ratio (within each round, then median) | median | range over rounds | reads against |")
    print("|---|---:|---:|---|")
    for label, a, b, target in RATIOS:
        vals = [by[a][k]["p50_ms"] / by[b][k]["p50_ms"] for k in by.get(a, {}) if k in by.get(b, {})]
        if vals:
            print(f"| {label} | {fmt(statistics.median(vals), 2)} | {fmt(min(vals), 2)}–{fmt(max(vals), 2)} | {target} |")
    print()
    print("| difference of p50s (within each round, then median) | ms | range over rounds |")
    print("|---|---:|---:|")
    for label, a, b in DIFFS:
        vals = [by[a][k]["p50_ms"] - by[b][k]["p50_ms"] for k in by.get(a, {}) if k in by.get(b, {})]
        if vals:
            print(f"| {label} | {fmt(statistics.median(vals))} | {fmt(min(vals))} – {fmt(max(vals))} |")
    print()
    print("| round | variant order | node X25519 (expected) | memo hits (expected) | sessions made / swept | "
          "0-RTT fallbacks | quinn failures | round s |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for k in rounds:
        c = counters[k]
        fb = by.get("quinn/0rtt", {}).get(k, {}).get("fallbacks", "–")
        order = c["order"] if isinstance(c["order"], str) else ", ".join(c["order"])
        print(f"| {k} | {order} | {c['x25519']} ({c['x25519_expected']}) | {c['memo_hits']} ({c['memo_hits_expected']}) | "
              f"{c['sessions_made']} / {c['sessions_swept']} | {fb} | {c['quinn_failures']} | {c['elapsed_s']} |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "results.jsonl")
