# research/049: lines up drive.py -v's pushes with strace -f -tt -T of the node; per push, each stage's time from
# the pusher's t0 (us). strace's own cost (a ptrace stop per syscall) inflates every stage: read the order and the
# differences between the kinds, not the absolute times.
import json, re, sys, statistics
from collections import defaultdict
ev = []
for l in open(sys.argv[1]):
    m = re.match(r"(\d+)\s+(\d\d):(\d\d):(\d\d\.\d+) (.*)", l)
    if not m: continue
    tid, h, mi, s, text = m.groups()
    t = (int(h) * 3600 + int(mi) * 60 + float(s)) * 1e6
    ev.append((t, tid, text))
pushes = [json.loads(l) for l in open(sys.argv[2]) if l.startswith('{"k"')]
def first(after, pred, before=None):
    for t, tid, x in ev:
        if t >= after and pred(tid, x) and (before is None or t <= before): return t, tid, x
    return None
def last_before(at, pred):
    r = None
    for t, tid, x in ev:
        if t > at: break
        if pred(tid, x): r = (t, tid, x)
    return r
rows = defaultdict(lambda: defaultdict(list))
for p in pushes:
    t0 = (p["t0"] % 86400_000000)
    end = t0 + p["device"]
    st = {}
    if p["k"] == "http":
        r = first(t0, lambda tid, x: x.startswith("recvfrom(") and ("ht %d\\n" % p["i"]) in x)
        if not r: continue
        http = r[1]; st["http reads the request"] = r[0]
        w = last_before(r[0], lambda tid, x: tid == http and "epoll_wait resumed" in x)
        if w and w[0] >= t0: st["http thread wakes"] = w[0]
        h = first(r[0], lambda tid, x: tid == http and x.startswith("write("))
        st["handed over (eventfd)"] = h[0]
        after = h[0]
    else:
        r = first(t0, lambda tid, x: x.startswith("recvfrom(") and ("dg %d\\n" % p["i"]) in x)
        if not r: continue
        st["loop reads the push"] = r[0]; after = r[0]
        w = last_before(r[0], lambda tid, x: "poll resumed" in x or x.startswith("poll("))
        if w and w[0] >= t0: st["loop wakes"] = w[0]
    loop = "8"  # filled below
    if p["k"] == "http":
        lw = first(after, lambda tid, x: "poll resumed" in x or x.startswith("poll("))
        if lw: st["loop wakes"] = lw[0]
    f = first(after, lambda tid, x: x.startswith("fdatasync("))
    if f: st["fdatasync starts"] = f[0]
    a = first(after, lambda tid, x: "futex(" in x and "FUTEX_WAKE" in x)
    if a: st["turn handed to sync thread"] = a[0]
    s = first(f[0], lambda tid, x: x.startswith("sendmmsg("))
    if s: st["DOWN sendmmsg"] = s[0]
    if p["k"] == "http":
        w27 = first(f[0], lambda tid, x: x.startswith("write(") and tid != f[1] and not x.startswith("write(14"))
        if w27: st["answer wake (loop -> http)"] = w27[0]
        wv = first(f[0], lambda tid, x: x.startswith("writev("))
        if wv: st["http writes the answer"] = wv[0]
    else:
        a2 = first(f[0], lambda tid, x: x.startswith("sendto("))
        if a2: st["answer sendto"] = a2[0]
    st["device line read (python)"] = end
    for k, v in st.items():
        rows[p["k"]][k].append(v - t0)
for k, d in rows.items():
    print(k)
    for name, v in sorted(d.items(), key=lambda kv: statistics.median(kv[1])):
        print("  %-32s p50 %7.0f us  (n=%d)" % (name, statistics.median(v), len(v)))
