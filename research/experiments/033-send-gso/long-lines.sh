#!/bin/bash
# research/033: `pure-serve send` of 200,000 lines of 1,000 bytes into a local node, builds side by side.
# Usage: long-lines.sh ROUNDS OUT LABEL=BIN [LABEL=BIN ...]
# Prints one JSON line per build and round: seconds, send's CPU and peak RSS, the node's kernel drops.
set -eu
ROUNDS=$1; OUT=$2; shift 2
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
python3 -c "
import sys
pad = 'x' * 990
with open('$W/long', 'w') as f:
    for i in range(200000): f.write(f'{i:09d}{pad}\n')"
first=${1#*=}
"$first" keygen --out "$W/node.key" >/dev/null 2>&1; "$first" keygen --out "$W/dev.key" >/dev/null 2>&1
echo "dev $("$first" pubkey --key "$W/dev.key")" > "$W/senders"
NODEKEY=$("$first" pubkey --key "$W/node.key")
for r in $(seq "$ROUNDS"); do
  for b in "$@"; do
    label=${b%%=*}; bin=${b#*=}
    rm -rf "$W/state"
    "$bin" --key "$W/node.key" --senders "$W/senders" --state "$W/state" --bind 127.0.0.1 --link-port 24101 \
      --http-port 0 --metrics-listen 127.0.0.1:24102 > "$W/node.out" 2>/dev/null &
    np=$!
    for i in $(seq 100); do grep -q ready "$W/node.out" && break; sleep 0.05; done
    /usr/bin/time -o "$W/time" -f "%e %U %S %M" "$bin" send --key "$W/dev.key" --node "$NODEKEY" \
      --to 127.0.0.1:24101 --timeout 60 < "$W/long" > /dev/null 2>&1 && ok=1 || ok=0
    drops=$(curl -s 127.0.0.1:24102/metrics | awk '/^pure_drops_total\{stage="kernel"\}/ {print $2}')
    stored=$(curl -s 127.0.0.1:24102/metrics | awk '/^pure_records_stored_total/ {print $2}')
    kill $np; wait $np 2>/dev/null || true
    read -r secs user sys rss < "$W/time"
    echo "{\"label\": \"$label\", \"round\": $r, \"exit_ok\": $ok, \"seconds\": $secs, \"send_cpu_s\": $(awk "BEGIN {print $user + $sys}"), \"send_peak_rss_kb\": $rss, \"kernel_drops\": ${drops:-0}, \"stored\": ${stored:-0}}" >> "$OUT"
  done
done
