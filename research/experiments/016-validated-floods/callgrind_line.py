"""One JSON line from a run of the flood tool and callgrind_annotate's function list of the node in it: the work
the run counted and the node's instructions, split into X25519 (curve25519_dalek), SHA-256 (the cookies' HMAC and
the key schedule) and the rest, which is what a change to the receive path would move."""
import json
import re
import sys

run = json.load(open(sys.argv[1]))
total = curve = sha = 0
functions = {}
for line in open(sys.argv[2]):
    m = re.match(r"\s*([\d,]+) \([\s\d.]+%\)\s+(.*)$", line)
    if not m:
        continue
    ir = int(m.group(1).replace(",", ""))
    name = m.group(2)
    if "PROGRAM TOTALS" in name:
        total = ir
        continue
    name = re.sub(r" \[.*\]$", "", name).split(":", 1)[-1]
    functions[name] = functions.get(name, 0) + ir
    if "curve25519" in name:
        curve += ir
    elif "sha2::" in name:
        sha += ir
print(json.dumps({
    "build": sys.argv[3], "round": int(sys.argv[4]),
    "stored_per_s": run["legit_stored_per_s"], "legit_packets_per_s": run["legit_packets_per_s"],
    "flood_pps_sent": run["flood_pps_sent"], "cookies_sent_per_s": run["cookies_sent_per_s"],
    "auth_drops_per_s": run["drops_per_s"]["auth"],
    "ir_total": total, "ir_x25519": curve, "ir_sha256": sha, "ir_rest": total - curve - sha,
    "top": dict(sorted(functions.items(), key=lambda kv: -kv[1])[:25]),
}))
