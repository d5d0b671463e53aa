#!/bin/sh
# research/011: two builds side by side, beside no flood, 100k/s forged first packets to the node (10 new senders),
# and the same flood to a sink nobody reads (`--flood-to sink`); 4 senders at full speed; builds alternating first
# each round. One JSON line per run, with "build" and "round" added, into $OUT (default results.jsonl).
# Usage: [OUT=FILE] run.sh NAME=DIR NAME=DIR [ROUNDS]   (each DIR holds pure-serve; the first DIR's overload runs)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
A=${1%%=*}; ADIR=${1#*=}; B=${2%%=*}; BDIR=${2#*=}; ROUNDS=${3:-5}
OUT="$here/${OUT:-results.jsonl}"
: > "$OUT"
run() { build=$1; dir=$2; label=$3; shift 3
  "$ADIR/overload" --bin "$dir/pure-serve" --label "$label" "$@" 2>/dev/null | grep '^{' |
    python3 -c "import json,sys; d=json.loads(sys.stdin.read()); d['build']='$build'; d['round']=$round; print(json.dumps(d))" >> "$OUT"; }
for round in $(seq "$ROUNDS"); do
  if [ $((round % 2)) = 1 ]; then order="$A $B"; else order="$B $A"; fi
  for cfg in "none 0 node 0" "forged 100000 node 10" "forged 100000 sink 0"; do
    set -- $cfg
    for build in $order; do
      dir=$ADIR; [ "$build" = "$B" ] && dir=$BDIR
      run "$build" "$dir" "$1/$3" --senders 4 --mix forged --flood "$2" --flood-to "$3" --new "$4"
    done
  done
done
