#!/bin/sh
# research/018: a reload's resident memory, builds side by side, order alternating. Usage: run.sh BEFORE AFTER [PAIRS]
# Each invocation of reload_memory.py (research/002) is 3 rounds of a good and a refused reload of 1M senders.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
BEFORE=$1; AFTER=$2; PAIRS=${3:-2}
OUT="$here/results.jsonl"
: > "$OUT"
for p in $(seq "$PAIRS"); do
  if [ $((p % 2)) -eq 1 ]; then order="before after"; else order="after before"; fi
  for b in $order; do
    eval "bin=\$$(echo "$b" | tr a-z A-Z)"
    python3 "$here/../002-idle-links/reload_memory.py" "$bin" 1000000 3 |
      python3 -c "import json,sys
for l in sys.stdin:
    d=json.loads(l); d['build']='$b'; d['pair']=$p; print(json.dumps(d))" >> "$OUT"
  done
done
