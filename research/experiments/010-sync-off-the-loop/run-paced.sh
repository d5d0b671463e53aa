#!/bin/sh
# research/010, the flood with paced senders: 4 senders offering 250k records/s each (1M/s, a quarter of capacity)
# beside forged first packets (100k/s, 200k/s) and random bytes (200k/s), and without a flood; before and after,
# alternating each round, one flood tool (after's) for both. Writes results-paced.jsonl (field "build" added).
# Usage: [RATE=250000] [OUT=results-paced.jsonl] run-paced.sh before=DIR after=DIR [ROUNDS]   (DIR holds pure-serve and overload)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
B=${1#before=}; A=${2#after=}; ROUNDS=${3:-3}
RATE=${RATE:-250000}
OUT="$here/${OUT:-results-paced.jsonl}"
: > "$OUT"
run() { build=$1; dir=$2; label=$3; shift 3
  "$A/overload" --bin "$dir/pure-serve" --label "$label" "$@" 2>/dev/null | grep '^{' |
    python3 -c "import json,sys; d=json.loads(sys.stdin.read()); d['build']='$build'; d['round']=$round; print(json.dumps(d))" >> "$OUT"; }
for round in $(seq "$ROUNDS"); do
  for cfg in "none 0 forged" "forged 100000 forged" "forged 200000 forged" "random 200000 random"; do
    set -- $cfg
    if [ $((round % 2)) = 1 ]; then order="before after"; else order="after before"; fi
    for build in $order; do
      dir=$B; [ "$build" = after ] && dir=$A
      run "$build" "$dir" "paced/$1/$2" --senders 4 --rate-each "$RATE" --mix "$3" --flood "$2"
    done
  done
done
