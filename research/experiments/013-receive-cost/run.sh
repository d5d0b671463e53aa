#!/bin/sh
# research/013: builds side by side (rotating order each round), 4 senders at full speed, beside no flood, 100k/s
# and 400k/s forged first packets and 400k/s random bytes. One JSON line per run, "build" and "round" added.
# Usage: [OUT=FILE] [NEW=N new senders during each flood] run.sh ROUNDS NAME=DIR [NAME=DIR ...]   (each DIR holds pure-serve; the first DIR's overload runs)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
ROUNDS=$1; shift
OUT="$here/${OUT:-results.jsonl}"
: > "$OUT"
first=${1#*=}
n=$#
for round in $(seq "$ROUNDS"); do
  for cfg in "forged:0" "forged:100000" "forged:400000" "random:400000"; do
    mix=${cfg%%:*}; pps=${cfg#*:}
    i=0
    while [ $i -lt $n ]; do
      k=$(( (i + round) % n + 1 ))
      eval "spec=\${$k}"
      build=${spec%%=*}; dir=${spec#*=}
      "$first/overload" --bin "$dir/pure-serve" --label "$mix/$pps" --senders 4 --mix "$mix" --flood "$pps" --new "$([ "$pps" != 0 ] && echo "${NEW:-0}" || echo 0)" 2>/dev/null |
        grep '^{' | python3 -c "import json,sys; d=json.loads(sys.stdin.read()); d['build']='$build'; d['round']=$round; print(json.dumps(d))" >> "$OUT"
      i=$((i + 1))
    done
  done
done
