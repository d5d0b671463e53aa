#!/bin/sh
# research/026: benches/fleet against two pure-serve binaries in ROUNDS rounds, which binary goes first alternating
# each round and the configurations' order alternating too; every JSON line tagged with the binary's label.
# Usage: run.sh BENCH OLD_BIN NEW_BIN ROUNDS OUT [extra bench args, e.g. --records 1000000]
set -eu
BENCH=$1; OLD=$2; NEW=$3; ROUNDS=$4; OUT=$5; shift 5
for r in $(seq "$ROUNDS"); do
  if [ $((r % 2)) -eq 1 ]; then order="old new"; configs="pg1,sqlite1"; else order="new old"; configs="sqlite1,pg1"; fi
  for which in $order; do
    if [ "$which" = old ]; then bin=$OLD; label=025; else bin=$NEW; label=head; fi
    echo "round $r $label ($configs): $(uptime)" >&2
    "$BENCH" --bin "$bin" --round "$r" --configs "$configs" "$@" | sed "s/^{/{\"bin\":\"$label\",/" >> "$OUT"
  done
done
