#!/bin/sh
# research/049: a node (BIN) on STATEDIR, a live device, drive.py N rounds. TRACE=strace straces the node
# (-f -tt -T); TRACE=perf runs `perf trace -T` of the node, the pusher (drive.py) and the device together, so that
# every stage of a push is on one clock (perf trace costs a few µs a syscall, strace tens).
set -eu
BIN=$1; N=${2:-200}; ST=${3:-/tmp/p49b/st}; cd /tmp/p49b
rm -rf "$ST"; mkdir -p "$ST"
$BIN --key node.key --senders senders --state "$ST" --link-port 17391 --http-port 0 > node.log 2>&1 &
NODE=$!
sleep 1
NODEPUB=$($BIN pubkey --key node.key)
DEVICE="$BIN send --key dev.key --node $NODEPUB --to 127.0.0.1:17391 --listen main --stay forever --ask-every 5 --down-window 0"
case "${TRACE:-}" in
perf)
  # shellcheck disable=SC2086
  WARM=2 python3 drive.py "$ST" "$N" -v -- $DEVICE > drive-pt.log 2>&1 &
  PY=$!
  sleep 0.7
  DEV=$(pgrep -P $PY)
  perf trace -T -p $NODE,$PY,$DEV -o pt.txt & PT=$!
  wait $PY
  kill -INT $PT; wait $PT || true
  echo "node $NODE py $PY dev $DEV" ;;
strace)
  strace -f -tt -T -s 100 -p $NODE -o strace.txt & STP=$!; sleep 0.5
  # shellcheck disable=SC2086
  python3 drive.py "$ST" "$N" ${V:-} -- $DEVICE
  kill -INT $STP; wait $STP || true ;;
*)
  # shellcheck disable=SC2086
  python3 drive.py "$ST" "$N" ${V:-} -- $DEVICE ;;
esac
kill $NODE; wait $NODE || true
