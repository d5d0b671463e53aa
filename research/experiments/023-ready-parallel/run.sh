#!/bin/sh
# research/023: ready.py for two builds in the same run, order alternating. Usage: run.sh BEFORE AFTER [PAIRS] [ROUNDS]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
BEFORE=$1; AFTER=$2; PAIRS=${3:-4}; ROUNDS=${4:-2}
for p in $(seq "$PAIRS"); do
  if [ $((p % 2)) -eq 1 ]; then order="before after"; else order="after before"; fi
  for b in $order; do
    eval "bin=\$$(echo "$b" | tr a-z A-Z)"
    python3 "$here/ready.py" "$bin" 1000000 "$ROUNDS" "$b"
  done
done
