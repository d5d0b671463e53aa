#!/usr/bin/env python3
"""research/007-overload: medians (min-max) of results.jsonl by label, and the ratios the note's criteria use,
computed within each round (a round is one pass over every configuration), then the median taken."""
import collections, json, statistics, sys

path = sys.argv[1] if len(sys.argv) > 1 else "research/experiments/007-overload/results.jsonl"
rows = [json.loads(l) for l in open(path) if l.strip()]
by = collections.defaultdict(list)
for r in rows:
    by[r["label"]].append(r)

def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None

def fmt(v):
    if v is None:
        return "—"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.3g}"

def cell(label, key, sub=None):
    vals = [(r[key][sub] if sub else r[key]) for r in by.get(label, [])]
    vals = [v for v in vals if v is not None]
    if not vals:
        return "—"
    return f"{fmt(med(vals))} ({fmt(min(vals))}–{fmt(max(vals))})" if len(vals) > 1 else fmt(vals[0])

def rounds(label):
    return by.get(label, [])

def ratio(label, base, key="legit_stored_per_s"):
    """Per round: label's key over base's key (the i-th run of each is the i-th round)."""
    out = []
    for a, b in zip(rounds(label), rounds(base)):
        if b[key]:
            out.append(a[key] / b[key])
    return out

def rcell(xs):
    return f"{med(xs):.2f} ({min(xs):.2f}–{max(xs):.2f})" if xs else "—"

print("## Goodput curve (valid records only; 200k records/s offered per sender)\n")
print("| senders | offered records/s | stored records/s | ÷ capacity | stored ÷ peak | kernel drops/s | gap records/s | go-back-N rounds | node CPU | tool CPU (senders) |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
curve = [f"curve/{k}" for k in (4, 8, 16, 40, 80)]
for i, lab in enumerate(curve):
    rs = rounds(lab)
    if not rs:
        continue
    cap = ratio(lab, "capacity", "stored_per_s")
    # peak: per round, the largest stored of the curve
    peak = []
    for rnd in range(len(rs)):
        vals = [rounds(l)[rnd]["stored_per_s"] for l in curve if len(rounds(l)) > rnd]
        peak.append(rs[rnd]["stored_per_s"] / max(vals))
    offered_x = [r["legit_offered_per_s"] / c["stored_per_s"] for r, c in zip(rs, rounds("capacity"))]
    print(f"| {lab.split('/')[1]} | {cell(lab,'legit_offered_per_s')} ({fmt(med(offered_x))}× capacity) | {cell(lab,'stored_per_s')} | {rcell(cap)} | {rcell(peak)} | {cell(lab,'drops_per_s','kernel')} | {cell(lab,'gaps_per_s')} | {cell(lab,'legit_go_back_total')} | {cell(lab,'node_cpu')} | {cell(lab,'legit_cpu')} |")
print(f"\ncapacity (8 senders as fast as their windows go): {cell('capacity','stored_per_s')} records/s\n")

print("## Floods beside 4 senders at full speed\n")
print("| flood | sent packets/s | existing senders' records/s | ÷ no flood (same round) | X25519/s wasted | memo hits/s | COOKIEs/s | kernel drops/s | commit share of time | node CPU | flood tool CPU | senders' CPU |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
labels = ["flood/none"] + [l for l in by if l.startswith("flood/") and l != "flood/none"]
for lab in labels:
    print(f"| {lab[6:]} | {cell(lab,'flood_pps_sent')} | {cell(lab,'legit_stored_per_s')} | {rcell(ratio(lab,'flood/none'))} | {cell(lab,'x25519_wasted_per_s')} | {cell(lab,'memo_hits_per_s')} | {cell(lab,'cookies_sent_per_s')} | {cell(lab,'drops_per_s','kernel')} | {cell(lab,'commit_fraction') if all('commit_fraction' in r for r in rounds(lab)) else '—'} | {cell(lab,'node_cpu')} | {cell(lab,'flood_cpu')} | {cell(lab,'legit_cpu')} |")

print("\n## The X25519 budget: forged first packets at 100k/s from 256 /24s, 10 new senders during the flood\n")
print("| budget/s | X25519/s wasted | existing senders' records/s | ÷ no flood | new senders stored | time to stored p50 | max | COOKIEs they got | COOKIEs sent/s | withheld/s | node CPU |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for b in (250, 1000, 4000):
    lab = f"budget/{b}"
    if lab not in by:
        continue
    print(f"| {b} | {cell(lab,'x25519_wasted_per_s')} | {cell(lab,'legit_stored_per_s')} | {rcell(ratio(lab,'flood/none'))} | {cell(lab,'new_stored')} of 10 | {cell(lab,'new_seconds_p50')} s | {cell(lab,'new_seconds_max')} s | {cell(lab,'new_cookies')} | {cell(lab,'cookies_sent_per_s')} | {cell(lab,'cookies_withheld_per_s')} | {cell(lab,'node_cpu')} |")

print("\n## Receive buffer sweep at overload\n")
print("| buffer | 16 senders: records/s | kernel drops/s | ÷ best | 4 senders + 100k/s forged: senders' records/s | kernel drops/s | ÷ best |")
print("|---:|---:|---:|---:|---:|---:|---:|")
bufs = [212992, 524288, 1048576, 1572864, 2097152, 4194304, 8388608]
def best_ratio(kind, buf, key):
    out = []
    nr = min(len(rounds(f"buffer/{kind}/{b}")) for b in bufs if f"buffer/{kind}/{b}" in by)
    for rnd in range(nr):
        vals = {b: rounds(f"buffer/{kind}/{b}")[rnd][key] for b in bufs if f"buffer/{kind}/{b}" in by}
        out.append(vals[buf] / max(vals.values()))
    return out
for b in bufs:
    v, f = f"buffer/valid/{b}", f"buffer/flood/{b}"
    if v not in by:
        continue
    print(f"| {b:,} | {cell(v,'stored_per_s')} | {cell(v,'drops_per_s','kernel')} | {rcell(best_ratio('valid',b,'stored_per_s'))} | {cell(f,'legit_stored_per_s')} | {cell(f,'drops_per_s','kernel')} | {rcell(best_ratio('flood',b,'legit_stored_per_s'))} |")

print("\n## One sender starting a new run with every packet (50k/s for 20 s)\n")
print("| | runs sent | sessions at the end | evicted | session_cap drops/s | anonymous memory min–max | resident | node CPU |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for lab in ("runs/cap16", "runs/nocap"):
    for r in rounds(lab):
        print(f"| {lab} | {r['flood_pps_sent']*r['seconds']:,.0f} | {r['sessions_active']:,.0f} | {r['sessions_evicted']:,.0f} | {r['drops_per_s']['session_cap']:,.0f} | {r['node_anon_min']/2**20:.1f}–{r['node_anon_max']/2**20:.1f} MiB | {r['node_rss']/2**20:.1f} MiB | {r['node_cpu']:.2f} |")
