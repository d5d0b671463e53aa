# research/035: N pushes through the push datagram socket of a node whose state is ./st, one at a time, 5 ms apart,
# to sender dev1 of app main (a device listening with `pure-serve send --listen main`); prints the answer's p50/p99.
# Used to load the node for `perf record`/`perf trace`, not for the note's figures. Usage: push.py N
import socket, time, os, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind("")  # autobind: an abstract name
n = int(sys.argv[1])
ts = []
for i in range(n):
    t = time.perf_counter()
    s.sendto(b"app=main&to=dev1\nrec %d\n" % i, "st/push.dgram")
    a = s.recv(4096)
    ts.append((time.perf_counter() - t) * 1e3)
    assert a.startswith(b"200 "), a
    time.sleep(0.005)
ts.sort()
print("answer p50 %.3f ms p99 %.3f" % (ts[len(ts)//2], ts[int(len(ts)*0.99)]))
print(a)
