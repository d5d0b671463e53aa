#!/bin/sh
# research/012: the lag budget's resume mark. Builds that differ only in LAG_RESUME_PERCENT (src/apps/host.rs),
# each running apps.toml (main -> inner outlet with max_lag_records 200,000 -> slow, 2,048 records a turn) under 4
# senders at full speed; builds in a rotating order each round. One JSON line per run, "build" and "round" added.
# Usage: [OUT=FILE] run.sh ROUNDS NAME=DIR [NAME=DIR ...]   (each DIR holds pure-serve; the first DIR's overload runs)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
ROUNDS=$1; shift
OUT="$here/${OUT:-results.jsonl}"
: > "$OUT"
first=${1#*=}
n=$#
for round in $(seq "$ROUNDS"); do
  i=0
  while [ $i -lt $n ]; do
    k=$(( (i + round) % n + 1 ))
    eval "spec=\${$k}"
    build=${spec%%=*}; dir=${spec#*=}
    "$first/overload" --bin "$dir/pure-serve" --label "lag/$build" --senders 4 --warmup 2 --seconds 5 \
        --node-arg --apps --node-arg "$here/apps.toml" 2>/dev/null | grep '^{' |
      python3 -c "import json,sys; d=json.loads(sys.stdin.read()); d['build']='$build'; d['round']=$round; print(json.dumps(d))" >> "$OUT"
    i=$((i + 1))
  done
done
