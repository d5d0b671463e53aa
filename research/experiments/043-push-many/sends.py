#!/usr/bin/env python3
"""What a push of many costs the node's senders (research/043): one device sends one record at a time, each a run
of `pure-serve send` (wake, one record, its stored ack, exit), again and again until STOP_FILE exists or COUNT runs
are done; prints one JSON line with each run's elapsed seconds.

usage: sends.py BIN KEY NODE_PUBKEY LINK COUNT STOP_FILE VARIANT RUN"""
import json, os, subprocess, sys, time

bin_, key, pub, link, count, stop, variant, run = sys.argv[1:9]
elapsed = []
for i in range(int(count)):
    if os.path.exists(stop):
        break
    t0 = time.time()
    subprocess.run([bin_, "send", "--key", key, "--node", pub, "--to", link, "--app", "main"],
                   input=f"r{i}\n".encode(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    elapsed.append(round(time.time() - t0, 4))
s = sorted(elapsed)
pick = lambda q: s[min(len(s) - 1, int(q * len(s)))] if s else None
print(json.dumps({
    "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "variant": variant, "run": int(run),
    "sends": len(s), "p50_s": pick(0.5), "p90_s": pick(0.9), "max_s": s[-1] if s else None, "elapsed_s": elapsed,
    "load1": float(open("/proc/loadavg").read().split()[0]),
}), flush=True)
