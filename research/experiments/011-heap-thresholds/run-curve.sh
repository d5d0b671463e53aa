#!/bin/sh
# research/011, the flood curve against the limit: one build, 4 senders at full speed, beside floods of forged first
# packets and of random bytes at 50k, 200k and 400k datagrams/s, each sent to the node and to a socket a thread of
# the tool only reads (the cheapest receiver there can be), and without a flood; rotating order each round.
# Usage: [OUT=FILE] run-curve.sh DIR [ROUNDS]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
D=$1; ROUNDS=${2:-3}
OUT="$here/${OUT:-results-curve.jsonl}"
: > "$OUT"
CFGS="none:0:node"
for mix in forged random; do for pps in 50000 200000 400000; do for to in node read; do
  CFGS="$CFGS $mix:$pps:$to"; done; done; done
n=$(echo $CFGS | wc -w)
for round in $(seq "$ROUNDS"); do
  i=0
  while [ $i -lt "$n" ]; do
    k=$(( (i + round) % n + 1 ))
    cfg=$(echo $CFGS | cut -d' ' -f$k)
    mix=${cfg%%:*}; rest=${cfg#*:}; pps=${rest%%:*}; to=${rest#*:}
    [ "$mix" = none ] && mix=forged
    "$D/overload" --bin "$D/pure-serve" --label "$cfg" --senders 4 --mix "$mix" --flood "$pps" --flood-to "$to" 2>/dev/null |
      grep '^{' | python3 -c "import json,sys; d=json.loads(sys.stdin.read()); d['build']='final'; d['round']=$round; print(json.dumps(d))" >> "$OUT"
    i=$((i + 1))
  done
done
