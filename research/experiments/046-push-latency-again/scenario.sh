#!/bin/sh
# research/046: strace -c -f of a node (BIN) over N datagram pushes to a live device (5 ms apart), then over N uplink
# records of one device (5 ms apart, each its own turn). Prints the syscall tables of each phase.
set -eu
BIN=$1; N=${2:-200}; cd /tmp/p46
rm -rf st; mkdir -p st
$BIN --key node.key --senders senders --state st --link-port 17380 --http-port 0 > node.log 2>&1 &
NODE=$!
sleep 1
NODEPUB=$($BIN pubkey --key node.key)
$BIN send --key dev.key --node "$NODEPUB" --to 127.0.0.1:17380 --listen main --stay forever --ask-every 5 --down-window 0 < /dev/null > got.txt 2> dev.log &
DEVP=$!
sleep 0.5
python3 push.py 5 >/dev/null
strace -c -f -p $NODE -o strace-push.txt & ST=$!
sleep 0.3
python3 push.py "$N"
sleep 0.2; kill -INT $ST; wait $ST || true
kill $DEVP; wait $DEVP || true
python3 uplink.py 5 5 | $BIN send --key dev.key --node "$NODEPUB" --to 127.0.0.1:17380 2>/dev/null
strace -c -f -p $NODE -o strace-uplink.txt & ST=$!
sleep 0.3
python3 uplink.py "$N" 5 | $BIN send --key dev.key --node "$NODEPUB" --to 127.0.0.1:17380 2>/dev/null
sleep 0.2; kill -INT $ST; wait $ST || true
kill $NODE; wait $NODE || true
echo "pushed: $(wc -l < got.txt) lines"
