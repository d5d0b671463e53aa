#!/bin/sh
# research/041 (c): benches/fleet (big turns) in ROUNDS rounds, sqlite1, pg1 and pg1-fsync-off side by side, in a
# rotated order each round, its JSON lines appended to OUT.
# Usage: run-ratio.sh BENCH BIN ROUNDS OUT [extra bench args, e.g. --records 2000000]
# BENCH is the built bench (cargo bench --no-run --bench fleet prints its path), BIN the release pure-serve.
set -eu
BENCH=$1; BIN=$2; ROUNDS=$3; OUT=$4; shift 4
CONFIGS="sqlite1 pg1 pg1-fsync-off"
for r in $(seq "$ROUNDS"); do
  order=$(echo $CONFIGS | tr ' ' '\n' | awk -v r="$r" '{a[NR]=$0} END {for (i=0;i<NR;i++) {j=(i+r-1)%NR+1; printf "%s%s", (i?",":""), a[j]}}')
  echo "round $r ($order): $(uptime)" >&2
  "$BENCH" --bin "$BIN" --round "$r" --configs "$order" "$@" >> "$OUT"
done
