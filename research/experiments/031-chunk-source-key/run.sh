#!/bin/sh
# research/031: two builds side by side — with the chunks' foreign key to sources (KEY) and without (NOKEY) — in
# ROUNDS rounds, the order alternating: pg1 and db1 (the engine alone, inside the bench: hence a bench per build)
# with 10k devices at 1 and 10 records per packet, then with big turns (6 × RECORDS).
# Usage: run.sh KEY_BENCH KEY_BIN NOKEY_BENCH NOKEY_BIN ROUNDS OUT [RECORDS]
set -eu
KB=$1; KBIN=$2; NB=$3; NBIN=$4; ROUNDS=$5; OUT=$6; RECORDS=${7:-2000000}
for r in $(seq 1 "$ROUNDS"); do
  if [ $((r % 2)) -eq 1 ]; then builds="key nokey"; else builds="nokey key"; fi
  for b in $builds; do
    if [ "$b" = key ]; then bench=$KB; bin=$KBIN; else bench=$NB; bin=$NBIN; fi
    echo "round $r $b: $(uptime)" >&2
    for p in 1 10; do
      "$bench" --bin "$bin" --round "$r" --many --waves 5 --per-packet "$p" --configs pg1,db1 2>/dev/null |
        sed "s/^{/{\"build\":\"$b\",/" >> "$OUT"
    done
    "$bench" --bin "$bin" --round "$r" --configs pg1,db1 --records "$RECORDS" 2>/dev/null |
      sed "s/^{/{\"build\":\"$b\",/" >> "$OUT"
  done
done
