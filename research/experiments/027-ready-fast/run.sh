#!/bin/sh
# research/027: the note's figures for two builds. Usage: run.sh BEFORE AFTER [ROUNDS] [OUT_PREFIX]
#   ready:  ready.py, both builds in the same rounds (order rotating), each round started when the CPU was 90 % idle
#   reload: research/002's reload_memory.py, 3 good and 3 refused reloads of a 1M-line file per build
set -eu
here=$(cd "$(dirname "$0")" && pwd)
BEFORE=$1; AFTER=$2; ROUNDS=${3:-12}; OUT=${4:-$here/results-final}
python3 "$here/ready.py" "$ROUNDS" before="$BEFORE" after="$AFTER" --wait-quiet 0.9 > "$OUT-ready.jsonl"
python3 "$here/summarize.py" "$OUT-ready.jsonl" before
for b in "$BEFORE" "$AFTER"; do
  python3 "$here/../002-idle-links/reload_memory.py" "$b" 1000000 3
done > "$OUT-reload-memory.jsonl"
python3 "$here/summarize_reload.py" "$OUT-reload-memory.jsonl"
