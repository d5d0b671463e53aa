#!/usr/bin/env python3
"""research/024: where a push's time goes, on the real node. Three kinds of request on the push socket, interleaved,
in one run: an empty body (answered by the HTTP thread alone), a push to a sender the node does not list (the HTTP
thread, its lookup, the hand-over to the receive loop and back: no commit), and a push that is queued (all that,
plus the push's transaction, the turn and the sync). Prints one JSON line of medians.
Usage: push_stages.py PURE_SERVE_BIN [ROUNDS]"""
import json, os, socket, statistics, subprocess, sys, tempfile, time

BIN = sys.argv[1]
N = int(sys.argv[2]) if len(sys.argv) > 2 else 300
d = tempfile.mkdtemp(dir="/tmp")
pub = subprocess.run([BIN, "keygen", "--out", d + "/d.key"], capture_output=True, text=True).stdout.strip()
open(d + "/senders", "w").write("dev " + pub + "\n")
node = subprocess.Popen([BIN, "--state", d + "/st", "--senders", d + "/senders", "--bind", "127.0.0.1",
                         "--link-port", "0", "--http-port", "0"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                        text=True)
for line in node.stdout:
    if line.strip() == "ready":
        break
sock = d + "/st/push.sock"


def post(target, body):
    t = time.perf_counter()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(sock)
    s.sendall(("POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
               % (target, len(body))).encode() + body)
    answer = b""
    while True:
        b = s.recv(4096)
        if not b:
            break
        answer += b
    s.close()
    return (time.perf_counter() - t) * 1e3, answer[9:12].decode()


times = {"empty": [], "unknown_sender": [], "queued": []}
for k in range(N):
    for kind, target, body in (("empty", "/push?app=main&to=dev", b""),
                               ("unknown_sender", "/push?app=main&to=nobody", b"x\n"),
                               ("queued", "/push?app=main&to=dev", b"x\n")):
        ms, status = post(target, body)
        if kind == "queued" and status != "200":
            # Past max_records (1024 waiting): the rest are refusals, still a transaction; stop counting them.
            continue
        times[kind].append(ms)
    if len(times["queued"]) >= 1000:
        break
node.terminate()
node.wait()
print(json.dumps({"bench": "push_stages", **{k + "_p50_ms": statistics.median(v) for k, v in times.items()},
                  **{k + "_n": len(v) for k, v in times.items()}}))
