#!/bin/sh
# rounds: sqlite1, pg1, pg1-fsync-off at the row-bound shape, order rotated
set -eu
BENCH=$1; BIN=$2; ROUNDS=$3; OUT=$4
for r in $(seq 1 $ROUNDS); do
  case $((r % 3)) in 0) o="sqlite1 pg1 pg1-fsync-off";; 1) o="pg1 pg1-fsync-off sqlite1";; 2) o="pg1-fsync-off sqlite1 pg1";; esac
  for c in $o; do
    echo "round $r $c: $(uptime)" >&2
    "$BENCH" --bin "$BIN" --round "$r" --configs $c --many --waves 10 --per-packet 1 2>/dev/null | grep '^{' >> "$OUT"
  done
done
