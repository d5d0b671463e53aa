#!/bin/sh
# research/015: builds side by side (rotating order each round): records stored through UDP and through POST /link
# (4 senders at full speed each way, one way per run), beside no flood, a flood of TLS handshakes as fast as the tool
# makes them from 64 /24s and from one address, and the control: plain HTTP connections at about the TLS flood's
# rate, and plain connections as fast as the tool makes them (CONFIGS=FLOOD:RATE:SOURCES ... to choose). One JSON
# line per run, "build" and "round" added.
# Usage: [OUT=FILE] run.sh ROUNDS NAME=DIR [NAME=DIR ...]   (each DIR holds pure-serve; the first DIR's http_bounds runs)
set -eu
CONFIGS=${CONFIGS:-"none:0:64 tls:0:64 tls:0:1 plain:3500:64 plain:0:64"}
here=$(cd "$(dirname "$0")" && pwd)
ROUNDS=$1; shift
OUT="$here/${OUT:-results.jsonl}"
: > "$OUT"
first=${1#*=}
n=$#
for round in $(seq "$ROUNDS"); do
  for via in udp http; do
    for cfg in $CONFIGS; do
      flood=${cfg%%:*}; rest=${cfg#*:}; rate=${rest%%:*}; sources=${rest#*:}
      i=0
      while [ $i -lt $n ]; do
        k=$(( (i + round) % n + 1 ))
        eval "spec=\${$k}"
        build=${spec%%=*}; dir=${spec#*=}
        "$first/http_bounds" --bin "$dir/pure-serve" --label "$flood/$rate/$sources" --via "$via" --flood "$flood" \
            --flood-rate "$rate" --flood-sources "$sources" 2>/dev/null |
          grep '^{' | python3 -c "import json,sys; d=json.loads(sys.stdin.read()); d['build']='$build'; d['round']=$round; print(json.dumps(d))" >> "$OUT"
        i=$((i + 1))
      done
    done
  done
done
