#!/usr/bin/env bash
# research/029: downlink on a fleet, 5 rounds of benches/downlink.rs --only fleet (a fresh cluster and nodes each).
# Usage: research/experiments/029-fleet-downlink/run.sh [ROUNDS] > results.jsonl
set -euo pipefail
cd "$(dirname "$0")/../../.."
cargo build --release >&2
bench=$(cargo bench --bench downlink --no-run 2>&1 | sed -n 's/.*Executable.*(\(.*\))/\1/p' | tail -1)
for r in $(seq 1 "${1:-5}"); do
    "$bench" --only fleet --round "$r" --bin target/release/pure-serve 2>/dev/null
done
