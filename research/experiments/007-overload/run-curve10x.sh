#!/bin/sh
# research/007-overload, addendum (2026-12-01): the goodput curve to 10x capacity, on the build with the sync off the
# receive loop (research/010). ROUNDS rounds (default 3) of: capacity (8 senders as fast as their windows go), then
# valid records offered at about 2x, 4x and 10x of it (80 senders at 550k/s and 200 senders at 220k/s: ~44M/s).
# Usage: research/experiments/007-overload/run-curve10x.sh [ROUNDS]   (from the repository root)
set -eu
ROUNDS=${1:-3}
OUT=research/experiments/007-overload/results-curve10x.jsonl
cargo build --release --quiet
cargo bench --bench overload --no-run --quiet 2>/dev/null
TOOL=$(ls -t target/release/deps/overload-* | grep -v '\.d$' | head -1)
BIN=target/release/pure-serve
run() { label=$1; shift; "$TOOL" --bin "$BIN" --label "$label" "$@" >> "$OUT"; }
{ date -u; uname -r; nproc; uptime; git rev-parse HEAD; } > research/experiments/007-overload/machine-curve10x.txt
: > "$OUT"
for round in $(seq "$ROUNDS"); do
  echo "round $round" >&2
  run capacity --senders 8 --flood 0
  run curve/40x200k --senders 40 --rate-each 200000 --flood 0
  run curve/80x200k --senders 80 --rate-each 200000 --flood 0
  run curve/80x550k --senders 80 --rate-each 550000 --flood 0
  run curve/200x220k --senders 200 --rate-each 220000 --flood 0
done
uptime >> research/experiments/007-overload/machine-curve10x.txt
