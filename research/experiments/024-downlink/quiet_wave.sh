#!/bin/sh
# research/024, check 7 again at a quiet moment: the 1M first-packet wave (benches/idle_links --send) with the control
# build (7670091, main before the downlink merge) and this session's build, order alternating, ROUNDS rounds.
# Usage: quiet_wave.sh IDLE_LINKS_BENCH CONTROL_BIN AFTER_BIN ROUNDS OUT
set -eu
B=$1; BEFORE=$2; AFTER=$3; ROUNDS=$4; OUT=$5
for r in $(seq "$ROUNDS"); do
  if [ $((r % 2)) -eq 1 ]; then order="before after"; else order="after before"; fi
  for b in $order; do
    if [ "$b" = before ]; then bin=$BEFORE; else bin=$AFTER; fi
    echo "round $r $b: $(uptime)" >&2
    "$B" --senders 0 --senders 1000000 --send --runs 1 --bin "$bin" --label "$b" >> "$OUT"
  done
done
