#!/usr/bin/env bash
# Runs tests/dying_disk.rs in several settings of the failing card, round after round, beside two busy loops (the
# outside report's losses came at load 3-8), counting rather than failing; a losing round's evidence (node log,
# e2fsck, the stores) is kept under $OUT/keep. Usage: hunt.sh OUT ROUNDS_PER_SETTING [TEST_BINARY]
set -uo pipefail
OUT=${1:?out dir}; ROUNDS=${2:-4}
BIN=${3:-$(ls -t target/release/deps/dying_disk-* | grep -v '\.d$' | head -1)}
mkdir -p "$OUT/keep"
yes >/dev/null & Y1=$!; yes >/dev/null & Y2=$!
trap 'kill $Y1 $Y2 2>/dev/null' EXIT
settings=(
  "DYING_DISK_TRIM=1 DYING_DISK_QUIET_S=12 DYING_DISK_DEVICES=8 DYING_DISK_WINDOW=100000"
  "DYING_DISK_TRIM=1 DYING_DISK_QUIET_S=12 DYING_DISK_DEVICES=8 DYING_DISK_WINDOW=100000 DYING_DISK_ABORT_MS=10000"
  "DYING_DISK_TRIM=1 DYING_DISK_QUIET_S=12"
  "DYING_DISK_TRIM=1 DYING_DISK_QUIET_S=12 DYING_DISK_ABORT_MS=4000"
  "DYING_DISK_TRIM=1 DYING_DISK_QUIET_S=12 DYING_DISK_ROOM_MIB=16"
  "DYING_DISK_TRIM=1 DYING_DISK_QUIET_S=12 DYING_DISK_DEVICES=1"
  "DYING_DISK_LAZY=1"
  ""
)
for pass in $(seq 1 1000); do
  for s in "${settings[@]}"; do
    env $s DYING_DISK_RUNS=$ROUNDS DYING_DISK_COUNT=1 DYING_DISK_KEEP="$OUT/keep" timeout 1800 "$BIN" --nocapture \
      2>&1 | grep -E '^\{' | sed "s/^{/{\"pass\":$pass,\"setting\":\"$s\",/" >>"$OUT/results.jsonl"
  done
  [ -e "$OUT/stop" ] && break
done
