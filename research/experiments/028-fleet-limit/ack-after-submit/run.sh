#!/bin/sh
# research/028, experiment: the node of main (BASE) beside one that hands a filled turn to the fleet's database
# before it sends the last turn's acks (ACK, branch fleet-limit-ack-after-submit), side by side in each round, which
# binary first alternating; many devices (P = 1 and 10 records per packet) and big turns. Adds "bin" to each line:
# "base", or NAME (default "ack"; "take" for the variant that also hands a turn over while another waits).
# Usage: run.sh BENCH BASE ACK ROUNDS OUT [NAME]
set -eu
BENCH=$1; BASE=$2; ACK=$3; ROUNDS=$4; OUT=$5; NAME=${6:-ack}
one() { # one NAME BIN ARGS...: the bench's lines with "bin":NAME added
  name=$1; bin=$2; shift 2
  "$BENCH" --bin "$bin" "$@" | sed "s/^{/{\"bin\":\"$name\",/" >> "$OUT"
}
for r in $(seq "$ROUNDS"); do
  if [ $((r % 2)) -eq 1 ]; then order="base $NAME"; else order="$NAME base"; fi
  echo "round $r ($order): $(uptime)" >&2
  for p in 1 10; do
    for b in $order; do
      if [ "$b" = base ]; then bin=$BASE; else bin=$ACK; fi
      one "$b" "$bin" --round "$r" --many --per-packet "$p" --configs pg1,pg2,db1
    done
  done
  for b in $order; do
    if [ "$b" = base ]; then bin=$BASE; else bin=$ACK; fi
    one "$b" "$bin" --round "$r" --records 1000000 --configs pg1,pg2
  done
done
