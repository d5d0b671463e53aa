#!/usr/bin/env python3
"""research/010-sync-off-the-loop: the before/after table of run.sh's results.

Usage: summarize.py results-before.jsonl results-after.jsonl [...]   (the first build is the base; standard library)
       summarize.py DIR                                             (DIR/results-before.jsonl, DIR/results-after.jsonl)

For each figure: the median (min–max) over rounds per build, and the median (min–max) of the per-round ratios
later build ÷ first build (both measured in the same round, minutes apart). Then the ratios the note's pass lines
use, computed per build within each round (same round, same build) and their median (min–max): four links ÷ one
link, one wire ÷ one link, four wires ÷ one wire (sending_loop), the existing senders' goodput beside the forged
flood ÷ unloaded, 40 senders' goodput ÷ capacity (overload); then the pass lines of research/010 and the checks
(exactly once, failed steps, X25519 and memo counts).
"""
import glob
import json
import os
import statistics
import sys
from collections import defaultdict

SHAPES = ("link/1", "link/4", "wire/1", "wire/4")
# sending_loop: forward/SHAPE/FIELD
SL_FIELDS = ("records_per_s", "exactly_once", "far_records_per_turn", "far_duplicates", "far_gap_records",
             "kernel_rcvbuf_errors", "longest_no_progress_ms", "first_stored_ms", "cpu_ns_per_record/b-recv",
             "waits/b-recv", "cpu_ns_per_record/pure-send", "cpu_ns_per_record/pure-http")
# overload: label → fields (drops_per_s.kernel flattened as drops_kernel_per_s)
OV_LABELS = ("unloaded", "forged", "capacity", "curve/40")
OV_FIELDS = ("legit_stored_per_s", "stored_per_s", "legit_offered_per_s", "legit_srtt_ms", "x25519_wasted_per_s",
             "new_stored", "new_seconds_p50", "new_seconds_max", "drops_kernel_per_s", "gaps_per_s",
             "duplicates_per_s", "commit_fraction", "turns_per_s", "node_cpu", "legit_cpu", "flood_cpu",
             "flood_pps_sent")
# first_packet: variant → fields
FP_VARIANTS = ("ours/known", "ours/new", "ours/known+setup", "machine/udp_commit_rtt", "machine/sqlite_commit",
               "machine/udp_rtt", "quinn/new")
FP_FIELDS = ("p50_ms", "p99_ms", "n")
# link_costs: link_udp/NAME/FIELD
LC_NAMES = ("link_udp/1", "link_udp/4", "link_udp/4_rcvbuf4m")
LC_FIELDS = ("records_per_s", "exactly_once", "retransmit_rounds", "node_duplicates", "kernel_rcvbuf_errors",
             "longest_no_progress_ms")


def load(path):
    """{figure: {round: value}} and the raw lines, for one build."""
    fig = defaultdict(dict)
    lines = []
    with open(path) as f:
        for line in f:
            if not line.startswith("{"):
                continue
            o = json.loads(line)
            lines.append(o)
            if "failed" in o:
                continue
            r, bench = o["round"], o.get("bench")
            if bench in ("sending_loop", "link_costs") and "name" in o:
                fig[f"{bench}:{o['name']}"][r] = o["value"]
            elif bench == "overload":
                for k, v in o.items():
                    if isinstance(v, (int, float)) and not isinstance(v, bool):
                        fig[f"overload:{o['label']}/{k}"][r] = v
                for k, v in (o.get("drops_per_s") or {}).items():
                    fig[f"overload:{o['label']}/drops_{k}_per_s"][r] = v
            elif bench == "first_packet":
                for k, v in o.items():
                    if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "round":
                        fig[f"first_packet:{o['variant']}/{k}"][r] = v
    return fig, lines


def fmt(v):
    if v is None:
        return "—"
    a = abs(v)
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 0.01 or a == 0:
        return f"{v:.3g}"
    return f"{v:.2g}"


def spread(xs, ratio=False):
    xs = [x for x in xs if x is not None]
    if not xs:
        return "—"
    f = (lambda v: f"{v:.3f}") if ratio else fmt
    m = statistics.median(xs)
    if len(xs) == 1:
        return f(m)
    g = (lambda v: f"{v:.2f}") if ratio else fmt
    return f"{f(m)} ({g(min(xs))}–{g(max(xs))})"


def per_round_ratio(num, den):
    """num[r] / den[r] for the rounds both have (den non-zero)."""
    return [num[r] / den[r] for r in num if r in den and den[r]]


def med(xs):
    return statistics.median(xs) if xs else None


def main(args):
    if len(args) == 1 and os.path.isdir(args[0]):
        d = args[0]
        paths = [p for p in (os.path.join(d, "results-before.jsonl"), os.path.join(d, "results-after.jsonl"))
                 if os.path.exists(p)]
        paths = paths if len(paths) == 2 else sorted(glob.glob(os.path.join(d, "results-*.jsonl")))
    else:
        paths = args
    if not paths:
        sys.exit(__doc__)
    tags = [os.path.basename(p)[len("results-"):-len(".jsonl")] if os.path.basename(p).startswith("results-")
            else os.path.basename(p) for p in paths]
    loaded = [load(p) for p in paths]
    figs = [f for f, _ in loaded]
    base = figs[0]
    rounds = sorted({r for f in figs for v in f.values() for r in v})
    print(f"research/010: {', '.join(tags)}; rounds {', '.join(map(str, rounds)) or 'none'}; "
          f"ratios are {' and '.join(t + ' ÷ ' + tags[0] for t in tags[1:])}, taken within each round.\n")

    # ------------------------------------------------------------------ every figure
    head = " | ".join(tags) + "".join(f" | {t} ÷ {tags[0]}" for t in tags[1:])
    sep = "|---" + "|---:" * (len(tags) + len(tags) - 1) + "|"

    def section(title, rows):
        rows = [(label, key) for label, key in rows if any(key in f for f in figs)]
        if not rows:
            return
        print(f"## {title}\n")
        print(f"| figure | {head} |")
        print(sep)
        for label, key in rows:
            cells = [spread(list(f.get(key, {}).values())) for f in figs]
            for f in figs[1:]:
                cells.append(spread(per_round_ratio(f.get(key, {}), base.get(key, {})), ratio=True))
            print(f"| {label} | " + " | ".join(cells) + " |")
        print()

    section("sending_loop (research/006): records/s between two nodes in one process",
            [(f"`{s}` {fld}", f"sending_loop:forward/{s}/{fld}") for fld in SL_FIELDS for s in SHAPES]
            + [("load average at start", "sending_loop:machine/loadavg_1m_at_start")])
    section("overload (research/007): the release binary driven from outside",
            [(f"`{lab}` {fld}", f"overload:{lab}/{fld}") for lab in OV_LABELS for fld in OV_FIELDS])
    section("first_packet (research/003): idle link's first packet → stored ack",
            [(f"`{v}` {fld}", f"first_packet:{v}/{fld}") for v in FP_VARIANTS for fld in FP_FIELDS])
    section("link_costs --only link (research/001): the node over UDP loopback",
            [(f"`{n}` {fld}", f"link_costs:{n}/{fld}") for fld in LC_FIELDS for n in LC_NAMES])

    # ------------------------------------------------------------------ derived ratios, per build, same round
    derived = [
        ("four links ÷ one link (sending_loop)",
         "sending_loop:forward/link/4/records_per_s", "sending_loop:forward/link/1/records_per_s"),
        ("one wire ÷ one link (sending_loop)",
         "sending_loop:forward/wire/1/records_per_s", "sending_loop:forward/link/1/records_per_s"),
        ("four wires ÷ one wire (sending_loop)",
         "sending_loop:forward/wire/4/records_per_s", "sending_loop:forward/wire/1/records_per_s"),
        ("forged flood ÷ unloaded, existing senders' goodput (overload, legit_stored_per_s)",
         "overload:forged/legit_stored_per_s", "overload:unloaded/legit_stored_per_s"),
        ("40 senders ÷ capacity (overload, stored_per_s)",
         "overload:curve/40/stored_per_s", "overload:capacity/stored_per_s"),
        ("four links ÷ one link (link_costs)",
         "link_costs:link_udp/4/records_per_s", "link_costs:link_udp/1/records_per_s"),
        # The disk's fsync floor moves by 1.5× within minutes here; the same process's UDP round trip with one
        # synchronous=FULL commit (not the node's code, so the same in both builds) is the floor to read it against.
        ("first packet p50 ÷ UDP round trip with one FULL commit (first_packet)",
         "first_packet:ours/known/p50_ms", "first_packet:machine/udp_commit_rtt/p50_ms"),
    ]
    print("## Derived ratios, per build, each within one round\n")
    print(f"| ratio | {head} |")
    print(sep)
    dvals = {}
    for label, num, den in derived:
        per_build = []
        for f in figs:
            per_build.append({r: f[num][r] / f[den][r] for r in f.get(num, {}) if r in f.get(den, {}) and f[den][r]})
        dvals[label] = per_build
        cells = [spread(list(pb.values()), ratio=True) for pb in per_build]
        for pb in per_build[1:]:
            cells.append(spread(per_round_ratio(pb, per_build[0]), ratio=True))
        print(f"| {label} | " + " | ".join(cells) + " |")
    print()

    # ------------------------------------------------------------------ the note's pass lines
    if len(figs) >= 2:
        after, a_tag = figs[-1], tags[-1]
        b_tag = tags[0]
        d = {label: [med(list(pb.values())) for pb in v] for label, v in dvals.items()}

        def rr(key):
            return med(per_round_ratio(after.get(key, {}), base.get(key, {})))

        checks = [
            (f"{a_tag}: four links ÷ one link ≥ 1.0", d["four links ÷ one link (sending_loop)"][-1], 1.0, "≥"),
            (f"one link {a_tag} ÷ {b_tag} ≥ 0.95", rr("sending_loop:forward/link/1/records_per_s"), 0.95, "≥"),
            (f"four wires {a_tag} ÷ {b_tag} ≥ 0.95", rr("sending_loop:forward/wire/4/records_per_s"), 0.95, "≥"),
            (f"flood ÷ unloaded: {a_tag} ≥ {b_tag}",
             d["forged flood ÷ unloaded, existing senders' goodput (overload, legit_stored_per_s)"][-1],
             d["forged flood ÷ unloaded, existing senders' goodput (overload, legit_stored_per_s)"][0], "≥"),
            (f"first packet (`ours/known`) p50 {a_tag} ÷ {b_tag} ≤ 1.15",
             rr("first_packet:ours/known/p50_ms"), 1.15, "≤"),
            (f"(the same, each ÷ its round's `machine/udp_commit_rtt` p50) ≤ 1.15",
             med(per_round_ratio(
                 dvals["first packet p50 ÷ UDP round trip with one FULL commit (first_packet)"][-1],
                 dvals["first packet p50 ÷ UDP round trip with one FULL commit (first_packet)"][0])), 1.15, "≤"),
        ]
        print(f"## research/010's pass lines (medians; {a_tag} against {b_tag})\n")
        print("| line | value | against | |")
        print("|---|---:|---:|---|")
        for label, v, lim, op in checks:
            ok = None if v is None or lim is None else (v >= lim if op == "≥" else v <= lim)
            verdict = "—" if ok is None else ("meets" if ok else "misses")
            print(f"| {label} | {'—' if v is None else f'{v:.3f}'} | "
                  f"{'—' if lim is None else f'{lim:.3f}'} | {verdict} |")
        print()

    # ------------------------------------------------------------------ checks
    print("## Checks\n")
    for tag, (f, lines) in zip(tags, loaded):
        notes = []
        failed = [o for o in lines if "failed" in o]
        for o in failed:
            notes.append(f"round {o['round']} {o['bench']} {o.get('label', '')} failed (exit {o['failed']})")
        for key, v in sorted(f.items()):
            if key.endswith("/exactly_once"):
                bad = [r for r, x in v.items() if x != 1]
                if bad:
                    notes.append(f"`{key}` = 0 in round(s) {bad}")
        n_once = sum(len(v) for k, v in f.items() if k.endswith("/exactly_once"))
        for o in lines:
            if o.get("bench") == "first_packet" and o.get("variant") == "counters":
                if o.get("x25519") != o.get("x25519_expected") or o.get("memo_hits") != o.get("memo_hits_expected"):
                    notes.append(f"round {o['round']} first_packet counters: x25519 {o.get('x25519')} "
                                 f"(expected {o.get('x25519_expected')}), memo hits {o.get('memo_hits')} "
                                 f"(expected {o.get('memo_hits_expected')})")
            if o.get("bench") == "overload" and o.get("label") == "forged" and o.get("new_stored") != o.get("new_senders"):
                notes.append(f"round {o['round']} overload forged: {o.get('new_stored')} of "
                             f"{o.get('new_senders')} new senders stored")
        print(f"- **{tag}**: {len(lines)} lines, {n_once} exactly-once checks, {len(failed)} failed steps"
              + ("; " + "; ".join(notes) if notes else "; nothing odd"))
    print()


if __name__ == "__main__":
    main(sys.argv[1:])
