#!/usr/bin/env python3
"""Runs every wake of the experiment one after another and logs each (setting, payload, records per wake, rep,
start and end time) to wakes.jsonl, for summarize.py to cut the capture by. Called by run.sh, in its work dir."""
import json, os, subprocess, sys, time

W = os.getcwd()
HERE = os.path.dirname(os.path.abspath(__file__))
B = os.environ["B"]; NODE = os.environ["NODE_PUB"]; REPS = int(os.environ.get("REPS", "5"))
PASSWORD = open("mqtt.password").read().strip()
NS = ["ip", "netns", "exec", "air37"]
SIZES = [16, 64]; NS_PER_WAKE = [1, 10, 100]
GAP = 0.4
log = open("wakes.jsonl", "w")

def lines(size, n):
    return b"".join(l + b"\n" for l in open(f"payload-{size}.txt", "rb").read().split(b"\n")[:n])

def run(setting, size, n, rep, cmd, stdin, counted=True, extra=None):
    t0 = time.time()
    p = subprocess.run(NS + cmd, input=stdin, capture_output=True)
    time.sleep(GAP)
    t1 = time.time()
    rec = {"setting": setting, "payload": size, "per_wake": n, "rep": rep, "counted": counted,
           "t0": t0, "t1": t1, "rc": p.returncode}
    out = p.stdout.decode().strip()
    if setting == "link-device" and p.returncode == 0:
        rec["device"] = json.loads(out)
    if p.returncode != 0:
        rec["stderr"] = p.stderr.decode()[-500:]
        print("FAILED", rec, file=sys.stderr)
    if extra: rec.update(extra)
    log.write(json.dumps(rec) + "\n"); log.flush()

WARM = 128  # so that every counted wake's sequences and acks (probe answers too) are 2-byte varints (128..16383)

for size in SIZES:
    for n in NS_PER_WAKE:
        key = f"keys/d-{size}-{n}.key"
        dev = ["python3", f"{HERE}/device.py", "--key", key, "--node", NODE, "--to", "10.237.0.1:17380",
               "--seq-file", f"keys/d-{size}-{n}.seq"]
        run("link-device", size, n, "warm", dev, lines(size, 100) + lines(size, WARM - 100), counted=False)
        for r in range(REPS):
            run("link-device", size, n, r, dev, lines(size, n))
        key = f"keys/s-{size}-{n}.key"
        snd = [B, "send", "--key", key, "--node", NODE, "--to", "10.237.0.1:17380"]
        run("link-send", size, n, "warm", snd, lines(size, 100) + lines(size, WARM - 100), counted=False)
        for r in range(REPS):
            run("link-send", size, n, r, snd, lines(size, n))
        common = ["-h", "10.237.0.1", "-q", "1", "-t", "t/dev1", "-i", "dev1", "-u", "dev1", "-P", PASSWORD, "-l"]
        mq = {
            "mqtt-plain": ["-p", "18883"],
            "mqtt-tls13-ecdsa": ["-p", "18884", "--cafile", "ec/ca.pem", "--tls-version", "tlsv1.3"],
            "mqtt-tls13-rsa": ["-p", "18885", "--cafile", "rsa/ca.pem", "--tls-version", "tlsv1.3"],
        }
        for setting, opts in mq.items():
            for r in range(REPS):
                run(setting, size, n, r, ["mosquitto_pub"] + common + opts, lines(size, n))
        # the minimal client (mosquitto_pub's --tls-version is a minimum: it cannot force TLS 1.2, nor resume):
        # full handshakes, then resumed ones (one process keeps the session between wakes, as a device in RAM)
        py = [("mqtt-py-tls13-ecdsa", "18884", "ec", "1.3", None, False),
              ("mqtt-py-tls13-ecdsa-resumed", "18884", "ec", "1.3", None, True),
              ("mqtt-py-tls12-ecdsa", "18884", "ec", "1.2", "ECDHE-ECDSA-AES128-GCM-SHA256", False),
              ("mqtt-py-tls12-ecdsa-resumed", "18884", "ec", "1.2", "ECDHE-ECDSA-AES128-GCM-SHA256", True),
              ("mqtt-py-tls12-rsa", "18885", "rsa", "1.2", "ECDHE-RSA-AES128-GCM-SHA256", False)]
        for setting, port, ca, ver, ciphers, resume in py:
            wakes = REPS + (1 if resume else 0)
            cmd = ["python3", f"{HERE}/mqtt_min.py", "--host", "10.237.0.1", "--port", port, "--cafile",
                   f"{ca}/ca.pem", "--tls-version", ver, "--password", PASSWORD, "--wakes", str(wakes),
                   "--gap", str(GAP)] + (["--resume"] if resume else []) + (["--ciphers", ciphers] if ciphers else [])
            p = subprocess.run(NS + cmd, input=lines(size, n), capture_output=True)
            if p.returncode != 0:
                print("FAILED", setting, p.stderr.decode()[-800:], file=sys.stderr)
            for l in p.stdout.decode().splitlines():
                w = json.loads(l)
                counted = not (resume and w["wake"] == 0)
                rec = {"setting": setting, "payload": size, "per_wake": n,
                       "rep": w["wake"] - (1 if resume else 0) if counted else "warm", "counted": counted,
                       "t0": w["t0"], "t1": w["t1"], "rc": p.returncode,
                       "tls": w.get("tls"), "cipher": w.get("cipher"), "resumed": w.get("resumed")}
                log.write(json.dumps(rec) + "\n"); log.flush()
            time.sleep(GAP)
