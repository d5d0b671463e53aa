#!/bin/sh
# research/030: benches/fleet for two builds side by side, ROUNDS rounds, the order of the builds alternating:
# pg1 with 10k devices at 1 and 10 records per packet, without ANALYZE (plans made on an empty database, the case
# this note is about) and with it (as autovacuum would leave it), then pg1 with big turns (6 × RECORDS).
# Usage: run.sh BENCH BEFORE_BIN AFTER_BIN ROUNDS OUT [RECORDS]
set -eu
BENCH=$1; BEFORE=$2; AFTER=$3; ROUNDS=$4; OUT=$5; RECORDS=${6:-2000000}
for r in $(seq 1 "$ROUNDS"); do
  if [ $((r % 2)) -eq 1 ]; then builds="before after"; else builds="after before"; fi
  for b in $builds; do
    if [ "$b" = before ]; then bin=$BEFORE; else bin=$AFTER; fi
    echo "round $r $b: $(uptime)" >&2
    for p in 1 10; do
      for a in --no-analyze ""; do
        "$BENCH" --bin "$bin" --round "$r" --many --waves 5 --per-packet "$p" --configs pg1 $a 2>/dev/null |
          sed "s/^{/{\"build\":\"$b\",\"analyze\":\"${a:-yes}\",/" >> "$OUT"
      done
    done
    "$BENCH" --bin "$bin" --round "$r" --configs pg1 --records "$RECORDS" 2>/dev/null |
      sed "s/^{/{\"build\":\"$b\",\"analyze\":\"big\",/" >> "$OUT"
  done
done
