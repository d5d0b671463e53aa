#!/bin/sh
# research/024: benches/downlink in ROUNDS rounds, its JSON lines appended to OUT.
# Usage: run.sh BENCH ROUNDS OUT [extra bench args, e.g. --only live,one]
# BENCH is the built bench (cargo bench --no-run --bench downlink prints its path).
set -eu
BENCH=$1; ROUNDS=$2; OUT=$3; shift 3
for r in $(seq "$ROUNDS"); do
  echo "round $r: $(uptime)" >&2
  "$BENCH" --round "$r" "$@" >> "$OUT"
done
