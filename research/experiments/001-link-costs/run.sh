#!/usr/bin/env bash
# research/001-link-costs: builds benches/link_costs.rs and runs it ROUNDS times (default 5), each round a fresh
# process measuring every limit and the node's figure next to it. Writes results.jsonl (one JSON object per
# measurement: name, run, value, unit) and summary.md (medians and per-round ratios) beside this script.
#
#   research/experiments/001-link-costs/run.sh            # 5 rounds, ~1-2 min per round on the 2-core VM
#   ROUNDS=1 ONLY=x25519,aes research/experiments/001-link-costs/run.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../../.." && pwd)
rounds=${ROUNDS:-5}
only=${ONLY:-}
cd "$top"
cargo bench --bench link_costs --no-run
out="$here/results.jsonl"
: > "$out.tmp"
{
  echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) $(git rev-parse --short HEAD) $(uname -srm)"
  echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores, load: $(cut -d' ' -f1-3 /proc/loadavg)"
} > "$here/machine.txt"
for ((r = 1; r <= rounds; r++)); do
  args=(--round "$r")
  [ -n "$only" ] && args+=(--only "$only")
  # Only the JSON lines go to the results; progress stays on the terminal.
  cargo bench -q --bench link_costs -- "${args[@]}" | grep '^{' >> "$out.tmp"
done
mv "$out.tmp" "$out"
python3 "$here/summarize.py" "$out" > "$here/summary.md"
cat "$here/summary.md"
