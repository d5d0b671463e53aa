#!/bin/sh
# research/046: perf record of a node (BIN, state on tmpfs) over N datagram pushes to a live device, 5 ms apart.
set -u
BIN=$1; N=${2:-600}; OUT=$3; cd /tmp/p46
rm -rf /dev/shm/p46/st st; mkdir -p /dev/shm/p46/st; ln -s /dev/shm/p46/st st
$BIN --key node.key --senders senders --state /dev/shm/p46/st --link-port 17380 --http-port 0 > node.log 2>&1 &
NODE=$!
sleep 1
NODEPUB=$($BIN pubkey --key node.key)
$BIN send --key dev.key --node "$NODEPUB" --to 127.0.0.1:17380 --listen main --stay forever --ask-every 5 --down-window 0 < /dev/null > got.txt 2> dev.log &
DEVP=$!
sleep 0.5
python3 push.py 5 >/dev/null
perf record -F 4999 -g -p $NODE -o "$OUT" 2>perf.err & ST=$!
sleep 0.3
python3 push.py "$N"
sleep 0.2; kill -INT $ST; wait $ST || true
kill $DEVP; wait $DEVP || true
kill $NODE; wait $NODE || true
