#!/bin/sh
# research/007-overload: builds the node and the flood tool, then runs every configuration once per round,
# interleaved, ROUNDS rounds (default 3), each a JSON line in results.jsonl; then the million-run check once.
# Usage: research/experiments/007-overload/run.sh [ROUNDS]   (from the repository root)
set -eu
ROUNDS=${1:-3}
OUT=research/experiments/007-overload/results.jsonl
cargo build --release --quiet
cargo bench --bench overload --no-run --quiet 2>/dev/null
TOOL=$(ls -t target/release/deps/overload-* | grep -v '\.d$' | head -1)
BIN=target/release/pure-serve
run() { label=$1; shift; "$TOOL" --bin "$BIN" --label "$label" "$@" >> "$OUT"; }
{ date -u; uname -r; nproc; uptime; git rev-parse HEAD; } > research/experiments/007-overload/machine.txt
: > "$OUT"
for round in $(seq "$ROUNDS"); do
  echo "round $round" >&2
  # The goodput curve: valid records only, 200k records/s offered per sender, more senders for more load; and the
  # capacity (8 senders as fast as their windows go).
  run capacity --senders 8 --flood 0
  for k in 4 8 16 40 80; do run "curve/$k" --senders "$k" --rate-each 200000 --flood 0; done
  # Floods beside 4 senders at full speed.
  run flood/none --senders 4 --flood 0
  for mix in random unknown forged forged_memo replay; do
    for pps in 50000 200000; do run "flood/$mix/$pps" --senders 4 --mix "$mix" --flood "$pps"; done
  done
  run flood/forged-one-prefix/200000 --senders 4 --mix forged --flood 200000 --prefixes 1
  # The budget: forged first packets at 100k/s, and 10 new senders getting in during the flood.
  for b in 250 1000 4000; do run "budget/$b" --senders 4 --mix forged --flood 100000 --budget "$b" --new 10; done
  # The receive buffer at two overloads: 16 senders at full speed; 4 senders and 100k/s of forged first packets.
  for buf in 212992 524288 1048576 1572864 2097152 4194304 8388608; do
    run "buffer/valid/$buf" --senders 16 --flood 0 --recv-buffer "$buf"
    run "buffer/flood/$buf" --senders 4 --mix forged --flood 100000 --recv-buffer "$buf"
  done
done
# One sender starting a new run with every packet: 50k runs/s for 20 s, with its cap of 16 sessions and without.
run runs/cap16 --senders 1 --mix runs --flood 50000 --prefixes 1 --seconds 20
run runs/cap1024 --senders 1 --mix runs --flood 50000 --prefixes 1 --seconds 20 --node-arg --sessions-per-sender --node-arg 1024  # runs 1 and 2 used 10^9, before the flag was bounded
uptime >> research/experiments/007-overload/machine.txt
