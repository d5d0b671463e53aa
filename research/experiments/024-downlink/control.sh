#!/bin/sh
# Control for research/024 check 7: pre-downlink main with fastpath and fleet merged (7670091, first parent of the
# downlink merge fad95ca) vs the after build, same benches, order alternating. Outputs kept in /work/bins.
set -eu
B=/work/bins
echo "control link start: $(uptime)"
/work/main/research/experiments/021-send-cpu/run.sh $B/send_path-faef344ee3780594 $B/pure-serve-7670091 $B/pure-serve-after 6 $B/control-link.jsonl --records 3000000
echo "control link end: $(uptime)"
echo "control idle start: $(uptime)"
for r in 1 2; do
  if [ $((r % 2)) -eq 1 ]; then order="before after"; else order="after before"; fi
  for b in $order; do
    if [ $b = before ]; then bin=$B/pure-serve-7670091; else bin=$B/pure-serve-after; fi
    $B/idle_links-bc3f068d2038cb74 --senders 0 --senders 1000000 --send --runs 1 --bin $bin --label $b >> $B/control-idle.jsonl
  done
done
echo "control idle end: $(uptime)"
