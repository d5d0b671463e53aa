#!/usr/bin/env python3
"""Samples a running node's RssAnon every 0.1 s for WINDOW seconds, with its CPU time over the window and, at the
end, its devices census's figures from /metrics (research/042). Prints one JSON line.

usage: sample.py PID WINDOW METRICS_ADDR VARIANT RUN N"""
import json, os, sys, time, urllib.request

pid, window, metrics, variant, run, n = sys.argv[1:7]
window = float(window)
tick = os.sysconf("SC_CLK_TCK")


def anon_kb():
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
    return None


def cpu_s():
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / tick


t0, c0 = time.time(), cpu_s()
samples = []
while time.time() - t0 < window:
    samples.append((time.time() - t0, anon_kb()))
    time.sleep(0.1)
wall, cpu = time.time() - t0, cpu_s() - c0
page = urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10).read().decode()
figures = {}
for line in page.splitlines():
    if line.startswith("pure_senders_") and " " in line:
        name, value = line.rsplit(" ", 1)
        figures[name] = float(value)
kb = [k for _, k in samples]
last = [k for t, k in samples if t >= window - 10]
print(json.dumps({
    "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "variant": variant, "run": int(run), "n": int(n),
    "window_s": round(wall, 1), "anon_at_ready_kb": kb[0], "anon_peak_kb": max(kb), "anon_min_kb": min(kb),
    "anon_last10s_min_kb": min(last), "anon_end_kb": kb[-1], "cpu_s": round(cpu, 2),
    "cpu_share": round(cpu / wall, 4), "census": figures,
    "load1": float(open("/proc/loadavg").read().split()[0]),
    # The peak's time, to tell a scan's peak from the start's.
    "peak_at_s": round(samples[kb.index(max(kb))][0], 1),
}), flush=True)
