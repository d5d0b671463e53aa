#!/bin/sh
# research/011, the limit: one build, 4 senders at full speed, beside no flood, 100k/s forged first packets to the
# node, to a sink nobody reads, and to a socket a thread of the tool only reads (the cheapest receiver there can
# be); configurations in a rotating order each round. Usage: [OUT=FILE] run-limit.sh DIR [ROUNDS]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
D=$1; ROUNDS=${2:-5}
OUT="$here/${OUT:-results-limit.jsonl}"
: > "$OUT"
set -- "none 0 node" "forged 100000 node" "forged 100000 sink" "forged 100000 read"
for round in $(seq "$ROUNDS"); do
  i=0
  while [ $i -lt 4 ]; do
    k=$(( (i + round) % 4 + 1 ))
    eval "cfg=\${$k}"
    set -- $cfg
    "$D/overload" --bin "$D/pure-serve" --label "$1/$3" --senders 4 --mix forged --flood "$2" --flood-to "$3" 2>/dev/null |
      grep '^{' | python3 -c "import json,sys; d=json.loads(sys.stdin.read()); d['build']='final'; d['round']=$round; print(json.dumps(d))" >> "$OUT"
    set -- "none 0 node" "forged 100000 node" "forged 100000 sink" "forged 100000 read"
    i=$((i + 1))
  done
done
