#!/bin/sh
# research/033: benches/send_path with several builds in the same rounds, the order rotating each round.
# Usage: run.sh BENCH ROUNDS OUT LABEL=BIN [LABEL=BIN ...] -- [extra bench args]
# BENCH is the built bench (cargo bench --no-run --bench send_path prints its path).
set -eu
BENCH=$1; ROUNDS=$2; OUT=$3; shift 3
builds=""
while [ $# -gt 0 ] && [ "$1" != "--" ]; do builds="$builds $1"; shift; done
[ $# -gt 0 ] && shift
n=$(echo $builds | wc -w)
for r in $(seq "$ROUNDS"); do
  # Rotate: round r starts with build (r-1) mod n.
  k=$(( (r - 1) % n )); order=""
  i=0; for b in $builds; do [ $i -ge $k ] && order="$order $b"; i=$((i+1)); done
  i=0; for b in $builds; do [ $i -lt $k ] && order="$order $b"; i=$((i+1)); done
  for b in $order; do
    "$BENCH" --bin "${b#*=}" --label "${b%%=*}" --round "$r" "$@" 2>/dev/null >> "$OUT"
  done
done
