#!/bin/sh
# research/013, the limit again with the kept change: one build, 4 senders at full speed, beside no flood and beside
# floods sent to the node and, in the same round, to a thread of the tool that only reads them (research/011's
# `--flood-to read`); rotating order each round. Usage: [OUT=FILE] run-limit.sh DIR [ROUNDS]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
D=$1; ROUNDS=${2:-3}
OUT="$here/${OUT:-results-limit.jsonl}"
: > "$OUT"
CFGS="none:0:node forged:100000:node forged:100000:read forged:400000:node forged:400000:read random:400000:node random:400000:read"
n=$(echo $CFGS | wc -w)
for round in $(seq "$ROUNDS"); do
  i=0
  while [ $i -lt "$n" ]; do
    k=$(( (i + round) % n + 1 ))
    cfg=$(echo $CFGS | cut -d' ' -f$k)
    mix=${cfg%%:*}; rest=${cfg#*:}; pps=${rest%%:*}; to=${rest#*:}
    [ "$mix" = none ] && mix=forged
    "$D/overload" --bin "$D/pure-serve" --label "$cfg" --senders 4 --mix "$mix" --flood "$pps" --flood-to "$to" --new "$([ "$to" = node ] && [ "$pps" != 0 ] && echo 10 || echo 0)" 2>/dev/null |
      grep '^{' | python3 -c "import json,sys; d=json.loads(sys.stdin.read()); d['build']='${BUILD:-meminfo}'; d['round']=$round; print(json.dumps(d))" >> "$OUT"
    i=$((i + 1))
  done
done
