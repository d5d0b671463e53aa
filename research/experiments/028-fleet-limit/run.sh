#!/bin/sh
# research/028: benches/fleet in ROUNDS rounds, each round the big-turn shape (6 devices × RECORDS records through
# `pure-serve send`) and the many-device shape (10,000 warmed devices, 5 waves of 1 and of 10 records per packet),
# its JSON lines appended to OUT. Each dbN runs right after its pgN (it takes the shape of pgN's turns); the units
# are rotated each round so that none is always first (a cold cache) or last, and which per-packet shape goes
# first alternates.
# Usage: [FIRST=N] run.sh BENCH BIN ROUNDS OUT [RECORDS]   (rounds numbered from FIRST, 1 unless given)
# BENCH is the built bench (cargo bench --no-run --bench fleet prints its path), BIN the release pure-serve.
set -eu
BENCH=$1; BIN=$2; ROUNDS=$3; OUT=$4; RECORDS=${5:-2000000}
rot() { # rot R UNIT...: the units from the R-th on, then the ones before it, joined by commas
  r=$1; shift
  echo "$@" | tr ' ' '\n' | awk -v r="$r" '{a[NR]=$0} END {for (i=0;i<NR;i++) {j=(i+r-1)%NR+1; printf "%s%s", (i?",":""), a[j]}}'
}
FIRST=${FIRST:-1}
for r in $(seq "$FIRST" $((FIRST + ROUNDS - 1))); do
  big=$(rot "$r" sqlite1 pg1,db1 pg2,db2 pg3,db3)
  echo "round $r big ($big): $(uptime)" >&2
  "$BENCH" --bin "$BIN" --round "$r" --configs "$big" --records "$RECORDS" >> "$OUT"
  if [ $((r % 2)) -eq 1 ]; then shapes="1 10"; else shapes="10 1"; fi
  for p in $shapes; do
    many=$(rot "$r" sqlite1 pg1,db1 pg2,db2)
    echo "round $r many p=$p ($many): $(uptime)" >&2
    "$BENCH" --bin "$BIN" --round "$r" --many --waves 5 --per-packet "$p" --configs "$many" >> "$OUT"
  done
done
