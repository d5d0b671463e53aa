# research/049: N rounds of a datagram push and an HTTP push (new connection, Connection: close, as benches/downlink's
# push_http) to dev1, a `send --listen main` device whose stdout is read here; 5 ms apart. Prints per-kind p50 of
# push->answer and push->device line, and (with -v) each push's times as JSON, CLOCK_REALTIME us, for lining up with
# strace -tt. Usage: drive.py STATE N [-v] -- DEVICE_CMD... (the device, `send --listen main`, is started here and its
# standard output read here). Used for research/049's first look (strace, perf trace), not for its figures.
import socket, time, os, sys, json, subprocess, statistics, select
state, n = sys.argv[1], int(sys.argv[2]); verbose = "-v" in sys.argv
dev = subprocess.Popen(sys.argv[sys.argv.index("--")+1:], stdout=subprocess.PIPE, stderr=open("dev.log","w"), stdin=subprocess.DEVNULL, bufsize=0)
devout = dev.stdout
time.sleep(float(os.environ.get("WARM", "1.0")))
d = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); d.bind("")
def line():
    buf = b""
    while not buf.endswith(b"\n"):
        c = os.read(devout.fileno(), 4096)
        assert c, "device gone"
        buf += c
    return buf
def now(): return time.time_ns() // 1000
res = {"dgram": [], "http": []}
for i in range(n):
    t0 = now()
    d.sendto(b"app=main&to=dev1\ndg %d\n" % i, state + "/push.dgram")
    a = d.recv(4096); ta = now()
    l = line(); tl = now()
    assert a.startswith(b"200 "), a
    res["dgram"].append((ta - t0, tl - t0))
    if verbose: print(json.dumps({"k": "dgram", "i": i, "t0": t0, "answer": ta - t0, "device": tl - t0}))
    time.sleep(0.005)
    body = b"ht %d\n" % i
    t0 = now()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.connect(state + "/push.sock")
    s.sendall(b"POST /push?app=main&to=dev1 HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
    ans = b""
    while True:
        c = s.recv(4096)
        if not c: break
        ans += c
    ta = now(); s.close()
    l = line(); tl = now()
    assert ans.startswith(b"HTTP/1.1 200"), ans
    res["http"].append((ta - t0, tl - t0))
    if verbose: print(json.dumps({"k": "http", "i": i, "t0": t0, "answer": ta - t0, "device": tl - t0}))
    time.sleep(0.005)
for k, v in res.items():
    print(json.dumps({"kind": k, "n": len(v), "answer_p50_us": statistics.median(x[0] for x in v),
                      "device_p50_us": statistics.median(x[1] for x in v)}))
dev.terminate()
