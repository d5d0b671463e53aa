#!/bin/sh
# research/025: benches/fleet in ROUNDS rounds, the configurations in a rotated order each round, its JSON lines
# appended to OUT.
# Usage: run.sh BENCH BIN ROUNDS OUT [extra bench args, e.g. --records 2000000]
# BENCH is the built bench (cargo bench --no-run --bench fleet prints its path), BIN the release pure-serve.
set -eu
BENCH=$1; BIN=$2; ROUNDS=$3; OUT=$4; shift 4
CONFIGS="sqlite1 pg1 pg2 pg3 pg1-pglz pg1-lz4"
for r in $(seq "$ROUNDS"); do
  # Round r starts at the r-th configuration, so none is always first (a cold cache) or last.
  order=$(echo $CONFIGS | tr ' ' '\n' | awk -v r="$r" '{a[NR]=$0} END {for (i=0;i<NR;i++) {j=(i+r-1)%NR+1; printf "%s%s", (i?",":""), a[j]}}')
  echo "round $r ($order): $(uptime)" >&2
  "$BENCH" --bin "$BIN" --round "$r" --configs "$order" "$@" >> "$OUT"
done
