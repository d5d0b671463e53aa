#!/usr/bin/env python3
"""research/054: CPU time per thread of every process whose executable ends with NAME, sampled every 0.5 s for
SECONDS (utime + stime from /proc/PID/task/TID/stat, clock ticks of 10 ms). Run it beside the bench, e.g.
  bench --only live-mixed --senders 1000000 --bin BIN & threads.py BIN_NAME 45"""
import collections, os, sys, time
name, seconds = sys.argv[1], float(sys.argv[2])
def snap():
    d = {}
    for p in filter(str.isdigit, os.listdir('/proc')):
        try:
            if not os.readlink(f'/proc/{p}/exe').endswith(name):
                continue
            for t in os.listdir(f'/proc/{p}/task'):
                s = open(f'/proc/{p}/task/{t}/stat').read()
                f = s[s.rindex(')') + 2:].split()
                d[(p, t)] = (s[s.index('(') + 1:s.rindex(')')], int(f[11]) + int(f[12]))
        except OSError:
            pass
    return d
total, prev, start = collections.Counter(), snap(), time.time()
while time.time() - start < seconds:
    time.sleep(0.5)
    cur = snap()
    for k, (comm, ticks) in cur.items():
        if k in prev:
            total[(k[0], comm)] += (ticks - prev[k][1]) * 10
    prev = cur
for (pid, comm), ms in total.most_common():
    print(f'{pid} {comm} {ms} ms')
