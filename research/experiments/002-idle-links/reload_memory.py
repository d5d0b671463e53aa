#!/usr/bin/env python3
"""Issue 8, item 7: memory of a reload of a big senders file. Usage: reload_memory.py BINARY LINES [ROUNDS]

Starts the node with a senders file of LINES senders, then per round: changes the file (so the index is rebuilt),
SIGHUPs, samples RssAnon and VmRSS every 5 ms until the reload is logged, and reads the figures after it; then the
same with a bad last line (a refused reload). Prints one JSON line per reload.
"""
import base64, json, os, signal, subprocess, sys, tempfile, time

def status(pid):
    out = {}
    for line in open(f"/proc/{pid}/status"):
        k, _, v = line.partition(":")
        if k in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
            out[k] = int(v.split()[0]) * 1024
    return out

def main():
    binary, lines = sys.argv[1], int(sys.argv[2])
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    d = tempfile.mkdtemp()
    senders = os.path.join(d, "senders")
    with open(senders, "w") as f:
        for i in range(lines):
            f.write(f"dev-{i} {base64.b64encode(os.urandom(31) + b'@').decode()}\n")
    err = open(os.path.join(d, "node.err"), "w+")
    node = subprocess.Popen([binary, "--state", os.path.join(d, "state"), "--senders", senders, "--bind", "127.0.0.1",
                             "--link-port", "0", "--http-port", "0"], stdout=subprocess.PIPE, stderr=err, text=True)
    for line in node.stdout:
        if line.strip() == "ready":
            break
    time.sleep(1)
    rest = status(node.pid)
    print(json.dumps({"bench": "reload_memory", "binary": binary, "lines": lines, "at": "rest", **rest}), flush=True)

    def reload(kind, n):
        with open(senders, "a") as f:
            f.write(f"extra-{kind}-{n} {base64.b64encode(os.urandom(31) + b'@').decode()}\n" if kind == "good"
                    else "broken line with three fields\n")
        seen = err.tell()
        before = status(node.pid)
        peak_anon = peak_rss = 0
        node.send_signal(signal.SIGHUP)
        t0 = time.time()
        while True:
            s = status(node.pid)
            peak_anon, peak_rss = max(peak_anon, s["RssAnon"]), max(peak_rss, s["VmRSS"])
            err.seek(seen)
            text = err.read()
            if ("reloaded senders" in text) or ("refused" in text):
                break
            if time.time() - t0 > 120:
                raise SystemExit("no reload logged: " + text[-500:])
            time.sleep(0.005)
        secs = time.time() - t0
        time.sleep(0.5)
        after = status(node.pid)
        print(json.dumps({"bench": "reload_memory", "binary": binary, "lines": lines, "reload": kind, "round": n,
                          "seconds": round(secs, 2), "anon_before": before["RssAnon"], "anon_peak": peak_anon,
                          "anon_after": after["RssAnon"], "rss_before": before["VmRSS"], "rss_peak": peak_rss,
                          "rss_after": after["VmRSS"]}), flush=True)
        if kind == "bad":
            # Take the bad line out again for the next round.
            with open(senders) as f:
                keep = f.read().replace("broken line with three fields\n", "")
            with open(senders, "w") as f:
                f.write(keep)

    for n in range(rounds):
        reload("good", n)
        reload("bad", n)
    node.send_signal(signal.SIGTERM)
    node.wait()

main()
