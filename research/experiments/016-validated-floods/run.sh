#!/bin/sh
# research/016 (a): builds side by side (order alternating each round), 4 senders at full speed, beside no flood,
# a flood echoing real cookies from 16 /24s at 100k/s and 400k/s, and forged (unvalidated) first packets at 100k/s;
# 5 new senders from a 17th /24, one after another, during each flood. One JSON line per run, "build" and "round"
# added. Usage: [OUT=FILE] [NEW=5] run.sh ROUNDS OVERLOAD NAME=DIR [NAME=DIR ...]   (each DIR holds pure-serve)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
ROUNDS=$1; TOOL=$2; shift 2
OUT="$here/${OUT:-results.jsonl}"
: > "$OUT"
n=$#
for round in $(seq "$ROUNDS"); do
  for cfg in "forged:0" "cookies:100000" "cookies:400000" "forged:100000"; do
    mix=${cfg%%:*}; pps=${cfg#*:}
    i=0
    while [ $i -lt $n ]; do
      k=$(( (i + round) % n + 1 ))
      eval "spec=\${$k}"
      build=${spec%%=*}; dir=${spec#*=}
      new=$([ "$pps" != 0 ] && echo "${NEW:-5}" || echo 0)
      "$TOOL" --bin "$dir/pure-serve" --label "$mix/$pps" --senders 4 --mix "$mix" --prefixes 16 --flood "$pps" --new "$new" 2>/dev/null |
        grep '^{' | python3 -c "import json,sys; d=json.loads(sys.stdin.read()); d['build']='$build'; d['round']=$round; print(json.dumps(d))" >> "$OUT"
      i=$((i + 1))
    done
  done
done
