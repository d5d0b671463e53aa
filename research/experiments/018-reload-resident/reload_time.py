#!/usr/bin/env python3
"""research/018: the time of a reload, two builds side by side: one node of each build, each with its own copy of
a 1M-line senders file, reloaded in turn (good: one line added, the index rebuilt; bad: a bad last line, refused),
so both see the same load. Time from SIGHUP to the node's log line. Usage: reload_time.py BEFORE AFTER ROUNDS"""
import base64, json, os, signal, subprocess, sys, tempfile, time

def start(binary, d, lines_text):
    os.makedirs(d)
    senders = os.path.join(d, "senders")
    with open(senders, "w") as f:
        f.write(lines_text)
    err = open(os.path.join(d, "node.err"), "w+")
    t0 = time.time()
    node = subprocess.Popen([binary, "--state", os.path.join(d, "state"), "--senders", senders, "--bind", "127.0.0.1",
                             "--link-port", "0", "--http-port", "0", "--metrics-listen", "127.0.0.1:0"],
                            stdout=subprocess.PIPE, stderr=err, text=True)
    for line in node.stdout:
        if line.strip() == "ready":
            break
    return node, senders, err, time.time() - t0

def reload(node, senders, err, kind, n):
    with open(senders, "a") as f:
        f.write(f"extra-{n} {base64.b64encode(os.urandom(31) + b'@').decode()}\n" if kind == "good"
                else "broken line with three fields\n")
    seen = err.tell()
    node.send_signal(signal.SIGHUP)
    t0 = time.time()
    while True:
        err.seek(seen)
        text = err.read()
        if "reloaded senders" in text or "refused" in text:
            break
        if time.time() - t0 > 120:
            raise SystemExit("no reload logged: " + text[-500:])
        time.sleep(0.002)
    secs = time.time() - t0
    if kind == "bad":
        with open(senders) as f:
            keep = f.read().replace("broken line with three fields\n", "")
        with open(senders, "w") as f:
            f.write(keep)
    return secs

def main():
    builds = {"before": sys.argv[1], "after": sys.argv[2]}
    rounds = int(sys.argv[3])
    text = "".join(f"dev-{i} {base64.b64encode(os.urandom(31) + b'@').decode()}\n" for i in range(1_000_000))
    d = tempfile.mkdtemp()
    nodes = {}
    for i, (b, binary) in enumerate(builds.items() if True else []):
        nodes[b] = start(binary, os.path.join(d, b), text)
        print(json.dumps({"bench": "reload_time", "build": b, "phase": "first_ready", "seconds": round(nodes[b][3], 3)}), flush=True)
    time.sleep(1)
    for n in range(rounds):
        order = ["before", "after"] if n % 2 == 0 else ["after", "before"]
        for kind in ("good", "bad"):
            for b in order:
                node, senders, err, _ = nodes[b]
                s = reload(node, senders, err, kind, n)
                print(json.dumps({"bench": "reload_time", "build": b, "phase": kind, "round": n, "seconds": round(s, 3),
                                  "load1": float(open("/proc/loadavg").read().split()[0])}), flush=True)
    for node, *_ in nodes.values():
        node.send_signal(signal.SIGTERM)
        node.wait()

main()
