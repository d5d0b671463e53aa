#!/bin/sh
# research/046: a node (BIN) with N senders listed (random keys; names dev0000000…), its anonymous memory ready and
# idle, then after pushes through the datagram socket to listed senders (the first makes the index by name), and
# how long those pushes took to be answered (queued and synced; no device listens). One JSON line.
# Usage: memory.sh BIN [N] [DIR]  (DIR: where the state goes, default /tmp)
set -eu
BIN=$1; N=${2:-1000000}; DIR=${3:-/tmp}
W=$(mktemp -d "$DIR/p46mem.XXXXXX")
python3 - "$W/senders" "$N" <<'PY'
import base64, os, sys
n = int(sys.argv[2])
with open(sys.argv[1], "w") as f:
    for i in range(n):
        f.write("dev%07d %s\n" % (i, base64.b64encode(os.urandom(32)).decode()))
PY
$BIN keygen --out "$W/node.key" > /dev/null
$BIN --key "$W/node.key" --senders "$W/senders" --state "$W/st" --link-port 0 --http-port 0 > "$W/node.log" 2>&1 &
NODE=$!
while [ ! -S "$W/st/push.dgram" ]; do sleep 0.05; done
sleep 1
anon() { grep RssAnon /proc/$NODE/status | awk '{print $2}'; }
A0=$(anon)
python3 - "$W/st/push.dgram" "$N" > "$W/pushes.json" <<'PY'
import json, socket, sys, time, random
path, n = sys.argv[1], int(sys.argv[2])
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); s.bind("")
out = []
for k in range(60):
    name = "dev%07d" % random.randrange(n)
    t = time.perf_counter()
    s.sendto(b"app=main&to=%s\nrec %d\n" % (name.encode(), k), path)
    a = s.recv(4096)
    assert a.startswith(b"200 "), a
    out.append((time.perf_counter() - t) * 1e3)
    time.sleep(0.02)
print(json.dumps({"first_ms": out[0], "later_p50_ms": sorted(out[20:])[len(out[20:]) // 2]}))
PY
sleep 1
A1=$(anon)
kill $NODE; wait $NODE || true
echo "{\"bin\":\"$BIN\",\"senders\":$N,\"anon_kb_idle\":$A0,\"anon_kb_after_pushes\":$A1,\"pushes\":$(cat "$W/pushes.json"),\"load\":$(cut -d' ' -f1 /proc/loadavg)}"
rm -rf "$W"
