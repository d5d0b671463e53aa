#!/usr/bin/env python3
"""Summarizes results.jsonl of research/001-link-costs into markdown: medians per measurement, and ratios computed
within each round (limit and node figure measured side by side) then taken as the median over rounds.

Usage: summarize.py results.jsonl > summary.md   (standard library only)
"""
import json
import statistics
import sys
from collections import defaultdict

# (label, numerator, denominator, how to read it). A ratio is computed per round, then its median is reported.
RATIOS = [
    ("unpaired: new senders/s, turns of 1024, real store ÷ X25519 ops/s (0.6 s before and after)", "new_sender/turn1024/per_s", "x25519/ops_per_s", "≥ 0.85 (BRIEF)"),
    ("unpaired, CPU time: X25519 µs ÷ node CPU µs per new sender (turns of 1024, real store)", "x25519/cpu_us", "new_sender/turn1024/cpu_us", "≥ 0.85 (BRIEF, on one core)"),
    ("unpaired: new senders/s, protocol only (no SQLite) ÷ X25519 ops/s", "new_sender/node_only/per_s", "x25519/ops_per_s", ""),
    ("unpaired, CPU time, protocol only", "x25519/cpu_us", "new_sender/node_only/cpu_us", ""),
    ("unpaired: new senders/s, a turn (commit) per sender ÷ X25519 ops/s", "new_sender/turn1/per_s", "x25519/ops_per_s", ""),
    ("unpaired: known senders/s after restart (memo) ÷ X25519 ops/s", "known_sender/turn1024/per_s", "x25519/ops_per_s", "> 1"),
    ("node packet on a session, no store ÷ one AES-GCM open (time)", "session_packet/node_only/ns", "aes_gcm_open_1200/ns", "stop if > 3"),
    ("node packet on a session, with store ÷ one AES-GCM open (time)", "session_packet/with_store/ns", "aes_gcm_open_1200/ns", ""),
    ("chunk store ÷ row per record, 16384 per commit", "store_chunks/16384/records_per_s", "sqlite_rows/16384/records_per_s", ""),
    ("one link over UDP ÷ chunk store alone at 16384 per commit", "link_udp/1/records_per_s", "store_chunks/16384/records_per_s", "stop if < 0.5"),
    ("one link over UDP ÷ row per record at 16384 per commit", "link_udp/1/records_per_s", "sqlite_rows/16384/records_per_s", ""),
    ("four links ÷ one link (records/s)", "link_udp/4/records_per_s", "link_udp/1/records_per_s", "≥ 1 (BRIEF)"),
    ("four links with a 4 MiB receive buffer ÷ four links with the default 2 MiB", "link_udp/4_rcvbuf4m/records_per_s", "link_udp/4/records_per_s", ""),
    ("one link, node packets/s ÷ plain UDP recv packets/s", "link_udp/1/packets_per_s", "udp_1200/recv_packets_per_s", ""),
    ("four links, node packets/s ÷ plain UDP recv packets/s", "link_udp/4/packets_per_s", "udp_1200/recv_packets_per_s", ""),
    ("idle wake → stored ack p50 ÷ fsync p50 just before", "wake/idle/p50_ms", "fsync_4k_before_wake/p50_ms", ""),
    ("idle wake p50 ÷ same record on a kept session p50", "wake/idle/p50_ms", "wake/active_session/p50_ms", "≈ 1: waking costs ~nothing"),
]

TARGETS = {
    "new_sender/turn1024/ratio_to_paired_x25519": "≥ 0.85 (BRIEF)",
    "new_sender/turn1024/cpu_ratio_to_paired_x25519": "≥ 0.85 (BRIEF, one core)",
    "link_udp/1/records_per_s": "≥ 1,000,000 (BRIEF)",
    "link_udp/4/records_per_s": "≥ one link (BRIEF)",
    "known_sender/turn1024/x25519": "0 (BRIEF)",
    "wake/idle/x25519": "0",
    "link_udp/1/exactly_once": "1",
    "link_udp/4/exactly_once": "1",
}


def fmt(v):
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 100:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.3f}"


def main(path):
    by_name = defaultdict(dict)
    units = {}
    order = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            o = json.loads(line)
            if o["name"] not in units:
                order.append(o["name"])
            by_name[o["name"]][o["run"]] = o["value"]
            units[o["name"]] = o["unit"]
    runs = sorted({r for v in by_name.values() for r in v})
    print(f"Rounds: {len(runs)} ({', '.join(map(str, runs))}). Median over rounds; min–max beside it.\n")
    print("| measurement | median | min – max | unit | target |")
    print("|---|---:|---:|---|---|")
    for name in order:
        vals = list(by_name[name].values())
        med = statistics.median(vals)
        print(f"| `{name}` | {fmt(med)} | {fmt(min(vals))} – {fmt(max(vals))} | {units[name]} | {TARGETS.get(name, '')} |")
    print()
    print("Ratios, computed within each round, median over rounds:\n")
    print("| ratio | median | min – max | rounds | reading |")
    print("|---|---:|---:|---:|---|")
    for label, num, den, reading in RATIOS:
        rs = [by_name[num][r] / by_name[den][r] for r in runs
              if r in by_name.get(num, {}) and r in by_name.get(den, {}) and by_name[den][r]]
        if not rs:
            continue
        print(f"| {label} | {statistics.median(rs):.3f} | {min(rs):.3f} – {max(rs):.3f} | {len(rs)} | {reading} |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "results.jsonl")
