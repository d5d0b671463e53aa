#!/bin/bash
# research/034: a device drains N records of 1,000 bytes with `pure-serve send --listen` (one per answer), builds
# side by side, the order alternating. The device's heard file is on tmpfs (/dev/shm) so the figure is the node's.
# Usage: drain.sh ROUNDS N OUT LABEL=BIN [LABEL=BIN ...]
set -eu
ROUNDS=$1; N=$2; OUT=$3; shift 3
W=$(mktemp -d); trap 'rm -rf "$W" /dev/shm/pure-drain-$$*' EXIT
first=${1#*=}
"$first" keygen --out "$W/node.key" >/dev/null 2>&1; "$first" keygen --out "$W/dev.key" >/dev/null 2>&1
echo "dev $("$first" pubkey --key "$W/dev.key")" > "$W/senders"
printf '[apps.main]\n[apps.main.downlink]\nmax_records = 100000\nmax_bytes = 16777216\n' > "$W/apps.toml"
NODEKEY=$("$first" pubkey --key "$W/node.key")
python3 -c "
for i in range($N): print(f'{i:08d}' + 'k' * 992)" > "$W/records"
for r in $(seq "$ROUNDS"); do
  if [ $((r % 2)) -eq 1 ]; then order="$*"; else order=$(printf '%s\n' "$@" | tac | tr '\n' ' '); fi
  for b in $order; do
    label=${b%%=*}; bin=${b#*=}
    rm -rf "$W/state"; rm -f /dev/shm/pure-drain-$$*
    "$bin" --key "$W/node.key" --senders "$W/senders" --apps "$W/apps.toml" --state "$W/state" --bind 127.0.0.1 \
      --link-port 24201 --http-port 0 --metrics-listen 127.0.0.1:24202 > "$W/node.out" 2>/dev/null &
    np=$!
    for i in $(seq 100); do grep -q ready "$W/node.out" && break; sleep 0.05; done
    "$bin" push --state "$W/state" --app main --to dev < "$W/records" > /dev/null
    s0=$(curl -s 127.0.0.1:24202/metrics | awk '/^pure_store_syncs_total/ {print $2}')
    t0=$(date +%s.%N)
    "$bin" send --key "$W/dev.key" --node "$NODEKEY" --to 127.0.0.1:24201 --listen main \
      --heard-file /dev/shm/pure-drain-$$ < /dev/null > "$W/got" 2>/dev/null && ok=1 || ok=0
    t1=$(date +%s.%N)
    s1=$(curl -s 127.0.0.1:24202/metrics | awk '/^pure_store_syncs_total/ {print $2}')
    got=$(wc -l < "$W/got")
    kill $np; wait $np 2>/dev/null || true
    load=$(cut -d' ' -f1 /proc/loadavg)
    echo "{\"label\": \"$label\", \"round\": $r, \"records\": $N, \"got\": $got, \"exit_ok\": $ok, \"seconds\": $(awk "BEGIN {print $t1 - $t0}"), \"syncs\": ${s1:-null}, \"syncs_before\": ${s0:-null}, \"load\": $load}" >> "$OUT"
  done
done
