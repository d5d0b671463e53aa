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
# What was run on 2026-12-02, beyond the above: round 3 of the idle block lost lines (another session's git stash
# at 13:47:50 replaced uplink-idle.jsonl under the open appends: before's 1M after_idle and after's 1M lines never
# reached the file). Round 3 was rerun (before, after) into a file outside the repository and appended here; its
# partial lines stay in the file and summarize_uplink.py leaves incomplete invocations out. The rerun was:
#   for b in before after; do "$IDLE" --senders 0 --senders 1000000 --send --runs 1 --bin "$BINS/pure-serve-$b" \
#     --label $b >> /work/bins/uplink-idle-r3.jsonl; done; cat /work/bins/uplink-idle-r3.jsonl >> uplink-idle.jsonl
# Summaries: summarize_uplink.py uplink-idle.jsonl uplink-link.jsonl (both), ../021-send-cpu/summarize.py
# uplink-link.jsonl (every send_path figure).
