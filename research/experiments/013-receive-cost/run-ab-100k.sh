#!/bin/sh
# research/013: meminfo against quiet beside 100k/s forged first packets (10 new senders), 6 rounds alternating.
# Usage: run-ab-100k.sh OUT   (builds in /tmp/b013/meminfo and /tmp/b013/quiet)
set -eu
OUT=$1; : > "$OUT"
for round in 1 2 3 4 5 6; do
  if [ $((round % 2)) = 1 ]; then order="meminfo quiet"; else order="quiet meminfo"; fi
  for b in $order; do
    /tmp/b013/meminfo/overload --bin /tmp/b013/$b/pure-serve --label forged/100000 --senders 4 --mix forged --flood 100000 --new 10 2>/dev/null | grep '^{' |
      python3 -c "import json,sys; d=json.loads(sys.stdin.read()); d['build']='$b'; d['round']=$round; print(json.dumps(d))" >> "$OUT"
  done
done
