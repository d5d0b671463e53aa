#!/usr/bin/env bash
# research/014: what each way of checkpointing and syncing costs the commit path (the ignored test checkpoint_costs
# in src/store/mod.rs), ROUNDS rounds on the disk holding DIR (default: the repository's, not a tmpfs).
#   run-costs.sh ROUNDS [DIR] > costs.jsonl
set -euo pipefail
cd "$(dirname "$0")/../../.."
DIR="${2:-$PWD/target}"
CHECKPOINT_COSTS_ROUNDS="$1" CHECKPOINT_COSTS_DIR="$DIR" \
    cargo test --release --lib checkpoint_costs -- --ignored --nocapture 2>/dev/null | grep '^{"bench"'
