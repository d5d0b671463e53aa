#!/bin/sh
# research/035 (from research/032): benches/downlink --only PART (default live; PART=fleet in the environment) with several node builds, ROUNDS rounds, the order rotating each round;
# each JSON line gets its build's name. Usage: run.sh BENCH ROUNDS OUT NAME=BIN [NAME=BIN ...]
# BENCH is the built bench (cargo bench --no-run --bench downlink prints its path).
set -eu
BENCH=$1; ROUNDS=$2; OUT=$3; shift 3
n=$#
for r in $(seq "$ROUNDS"); do
  echo "round $r: $(uptime)" >&2
  for i in $(seq 0 $((n - 1))); do
    idx=$(( (i + r - 1) % n + 1 ))
    eval pair=\${$idx}
    name=${pair%%=*}; bin=${pair#*=}
    "$BENCH" --only "${PART:-live}" --round "$r" --bin "$bin" | sed "s/^{/{\"build\":\"$name\",/" >> "$OUT"
  done
done
