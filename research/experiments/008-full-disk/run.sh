#!/usr/bin/env bash
# research/008-full-disk: the fault experiment per setup (shm_fault.py), as root. Two phases: the disk full when
# the store is opened (a restart on a full disk), and the disk filling after the open (serving). Writes
# results-PHASE.jsonl here and prints the summary.
set -euo pipefail
cd "$(dirname "$0")"
ROUNDS="${ROUNDS:-20}"
PHASES="${PHASES:-full-at-open full-after-open}"
for phase in $PHASES; do
    out="results-$phase.jsonl"
    : > "$out"
    for setup in baseline exclusive room room+alloc; do
        [ "$phase" = full-after-open ] && [ "$setup" = room ] && continue   # room only acts at open
        python3 shm_fault.py "$setup" "$ROUNDS" 1024 "$phase" | tee -a "$out"
    done
    python3 shm_fault.py baseline "$ROUNDS" 4096 "$phase" | tee -a "$out"
done
python3 summarize.py results-*.jsonl
