#!/bin/sh
# research/055: layouts.sql's variants in ROUNDS rounds, the order rotated each round, against the cluster at HOST
# (a socket directory). Usage: layouts.sh HOST ROUNDS OUT [TURNS PER_TURN]
set -eu
HOST=$1; ROUNDS=$2; OUT=$3; TURNS=${4:-200}; PER=${5:-474}
here=$(dirname "$0")
set -- now one nopk nopos multi
for r in $(seq 1 "$ROUNDS"); do
  k=$(( (r - 1) % 5 )); order=""
  i=0; for v in "$@"; do [ $i -ge $k ] && order="$order $v"; i=$((i+1)); done
  i=0; for v in "$@"; do [ $i -lt $k ] && order="$order $v"; i=$((i+1)); done
  for v in $order; do
    line=$(runuser -u postgres -- psql -q -h "$HOST" -U postgres -v variant=$v -v turns=$TURNS -v per_turn=$PER \
      -f "$here/layouts.sql" 2>&1 | grep -o '{.*}' | tail -1)
    echo "{\"round\":$r,\"load\":\"$(cut -d' ' -f1 /proc/loadavg)\",${line#\{}" >> "$OUT"
  done
done
