#!/bin/sh
# research/028: pg1 and db1 of the many-device shape with PostgreSQL alone on CPU 1 and everything else (the bench,
# its driver and engines, the node) on CPU 0: the postmaster and its children are pinned once it has started (the
# backends it forks later inherit it), the bench's threads too (the nodes it starts later inherit it).
# Usage: run.sh BENCH BIN   (writes pin-1.jsonl and pin-10.jsonl here)
set -eu
BENCH=$1; BIN=$2
for p in 1 10; do
  "$BENCH" --bin "$BIN" --many --per-packet "$p" --configs pg1,db1 --round "$p" > "pin-$p.jsonl" 2> "pin-$p.log" &
  B=$!
  pm=""
  while [ -z "$pm" ] || [ "$(ps -o ppid= -p "$pm" | tr -d ' ')" = "$B" ]; do
    sleep 0.05; pm=$(pgrep -n -f "postgres -D /var/tmp/pure-pg-" || true)
  done
  sleep 0.3
  taskset -apc 1 "$pm" > /dev/null
  for c in $(pgrep -P "$pm"); do taskset -apc 1 "$c" > /dev/null; done
  taskset -apc 0 "$B" > /dev/null
  wait "$B"
done
