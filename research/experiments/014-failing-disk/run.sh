#!/usr/bin/env bash
# research/014: how many acknowledged records a node loses on a card whose writes start failing (tests/dying_disk.rs),
# for each build given as NAME=WORKTREE (a checkout with tests/dying_disk.rs in it), RUNS runs per room and build,
# builds alternating room by room. Prints one JSON line per run, with the build's name added. As root.
#   run.sh RUNS before=/work/wt-before after=/work/main > results.jsonl
set -euo pipefail
RUNS="$1"; shift
for build in "$@"; do
    (cd "${build#*=}" && cargo test --release --test dying_disk --no-run >/dev/null 2>&1)
done
for room in 16 24 32 48; do
    for build in "$@"; do
        name="${build%%=*}"; dir="${build#*=}"
        (cd "$dir" && DYING_DISK_COUNT=1 DYING_DISK_RUNS="$RUNS" DYING_DISK_ROOM_MIB="$room" \
            cargo test --release --test dying_disk -- --nocapture 2>&1) \
            | grep '^{"round"' | sed "s/^{/{\"build\":\"$name\",/"
    done
done
