#!/bin/sh
# research/021 (and 022): benches/send_path, two builds in the same rounds, order alternating.
# Usage: run.sh BENCH BEFORE AFTER ROUNDS OUT [extra bench args]
# BENCH is the built bench (cargo bench --no-run --bench send_path prints its path).
set -eu
BENCH=$1; BEFORE=$2; AFTER=$3; ROUNDS=$4; OUT=$5; shift 5
for r in $(seq "$ROUNDS"); do
  if [ $((r % 2)) -eq 1 ]; then order="before after"; else order="after before"; fi
  for b in $order; do
    if [ "$b" = before ]; then bin=$BEFORE; else bin=$AFTER; fi
    "$BENCH" --bin "$bin" --label "$b" --round "$r" "$@" 2>/dev/null >> "$OUT"
  done
done
