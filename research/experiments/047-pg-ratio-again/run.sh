#!/bin/sh
# research/047: builds side by side in ROUNDS rounds. Each round, at each shape (big turns: 6 `send`s x RECORDS;
# row-bound: --many, 10,000 devices, 1 record a packet, WAVES waves), `sqlite1` once (with the first build's binary:
# the SQLite path is the same in every build) and `pg1` with each build, in an order rotated every round; every
# JSON line gets the build's name ("build") added.
# Usage: run.sh BENCH ROUNDS OUT RECORDS WAVES NAME=BIN [NAME=BIN ...]
set -eu
BENCH=$1; ROUNDS=$2; OUT=$3; RECORDS=$4; WAVES=$5; shift 5
first_bin=${1#*=}
for r in $(seq 1 "$ROUNDS"); do
  n=$#; k=$(( (r - 1) % n ))
  order=""
  i=0; for b in "$@"; do if [ $i -ge $k ]; then order="$order $b"; fi; i=$((i+1)); done
  i=0; for b in "$@"; do if [ $i -lt $k ]; then order="$order $b"; fi; i=$((i+1)); done
  for shape in big many; do
    if [ $shape = big ]; then args="--records $RECORDS"; else args="--many --waves $WAVES --per-packet 1"; fi
    echo "round $r $shape sqlite1: $(uptime)" >&2
    "$BENCH" --bin "$first_bin" --round "$r" --configs sqlite1 $args 2>/dev/null | sed "s/^{/{\"build\":\"sqlite\",/" >> "$OUT"
    for nb in $order; do
      name=${nb%%=*}; bin=${nb#*=}
      echo "round $r $shape pg1 $name: $(uptime)" >&2
      "$BENCH" --bin "$bin" --round "$r" --configs pg1 $args 2>/dev/null | sed "s/^{/{\"build\":\"$name\",/" >> "$OUT"
    done
  done
done
