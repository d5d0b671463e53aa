#!/bin/sh
# research/024 check 7: the uplink figures with the last build before downlink (8a5cda0) and after it, in the same
# rounds, order alternating. Usage: run_uplink.sh BINS_DIR IDLE_BENCH SEND_BENCH
#   BINS_DIR holds pure-serve-before and pure-serve-after; IDLE_BENCH and SEND_BENCH are the built benches
#   (cargo bench --no-run --bench idle_links / --bench send_path print their paths).
# Ran as: run_uplink.sh /work/bins /work/bins/idle_links-bc3f068d2038cb74 /work/bins/send_path-faef344ee3780594
set -eu
BINS=$1; IDLE=$2; SEND=$3
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../../.." && pwd)
# Idle links: 0 and 1M senders, each sends one record and idles; 3 rounds, before/after, after/before, before/after.
echo "idle block start: $(uptime)"
for r in 1 2 3; do
  if [ $((r % 2)) -eq 1 ]; then order="before after"; else order="after before"; fi
  for b in $order; do
    "$IDLE" --senders 0 --senders 1000000 --send --runs 1 --bin "$BINS/pure-serve-$b" --label "$b" \
      >> "$HERE/uplink-idle.jsonl"
  done
done
echo "idle block end: $(uptime)"
# One link: research/021's runner, 6 rounds of 3M records, order alternating.
echo "link block start: $(uptime)"
"$REPO/research/experiments/021-send-cpu/run.sh" "$SEND" "$BINS/pure-serve-before" "$BINS/pure-serve-after" 6 \
  "$HERE/uplink-link.jsonl" --records 3000000
echo "link block end: $(uptime)"
