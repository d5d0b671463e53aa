#!/usr/bin/env python3
"""research/023: time from start to "ready" of a node whose 1M-line senders file changed since the last start
(no index to reuse: parse, check, sort, write the index). Usage: ready.py BINARY [SENDERS] [ROUNDS] [LABEL]
Prints a JSON line per round: the wall time to "ready" and the node's CPU time until then (all threads)."""
import base64, json, os, subprocess, sys, tempfile, time
binary = sys.argv[1]
n = int(sys.argv[2]) if len(sys.argv) > 2 else 1_000_000
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
label = sys.argv[4] if len(sys.argv) > 4 else "current"
d = tempfile.mkdtemp(prefix="ready-", dir="/tmp")
senders = os.path.join(d, "senders")
with open(senders, "w") as f:
    for i in range(n):
        # random bytes are a valid X25519 public key for the list (low-order points aside: vanishingly rare)
        f.write(f"dev-{i} {base64.b64encode(os.urandom(32)).decode()}\n")
state = os.path.join(d, "state")
for r in range(1, rounds + 1):
    # A changed file each round: one more line, so the index of the last start is not reused.
    with open(senders, "a") as f:
        f.write(f"extra-{r} {base64.b64encode(os.urandom(32)).decode()}\n")
    load = float(open("/proc/loadavg").read().split()[0])
    t = time.monotonic()
    p = subprocess.Popen([binary, "--senders", senders, "--state", state, "--bind", "127.0.0.1",
                          "--link-port", "0", "--http-port", "0"], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True, env={**os.environ, "RUST_LOG": "warn"})
    for line in p.stdout:
        if line.strip() == "ready":
            break
    secs = time.monotonic() - t
    fields = open(f"/proc/{p.pid}/stat").read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    p.terminate(); p.wait()
    print(json.dumps({"label": label, "round": r, "senders": n, "ready_s": secs, "cpu_s": cpu, "load_1m": load}))
