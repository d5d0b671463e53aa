#!/bin/sh
# research/049: a node (BIN) on STATEDIR, a live device, drive.py N rounds; STRACE=1 straces the node (-f -tt -T).
set -eu
BIN=$1; N=${2:-200}; ST=${3:-/tmp/p49b/st}; cd /tmp/p49b
rm -rf "$ST"; mkdir -p "$ST"
$BIN --key node.key --senders senders --state "$ST" --link-port 17391 --http-port 0 > node.log 2>&1 &
NODE=$!
sleep 1
NODEPUB=$($BIN pubkey --key node.key)
if [ -n "${STRACE:-}" ]; then strace -f -tt -T -s 100 -p $NODE -o strace.txt & STP=$!; sleep 0.5; fi
python3 drive.py "$ST" "$N" ${V:-} -- $BIN send --key dev.key --node "$NODEPUB" --to 127.0.0.1:17391 --listen main --stay forever --ask-every 5 --down-window 0
if [ -n "${STRACE:-}" ]; then kill -INT $STP; wait $STP || true; fi
kill $NODE; wait $NODE || true
