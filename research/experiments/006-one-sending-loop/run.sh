#!/usr/bin/env bash
# research/006-one-sending-loop: builds benches/sending_loop.rs and runs it ROUNDS times (default 5), each round a
# fresh process measuring the machine's limits, then every forwarding run (1 and 4 links, 1 and 4 wires; fed by
# chunks with a push per turn, by records with a push per turn, by records with a push per record) in an order
# turned by the round, then the threads of a real host with 10 links and 10 wires. Writes OUT (default
# results.jsonl: one JSON object per measurement: name, run, value, unit), machine.txt and summary.md beside this
# script.
#
#   research/experiments/006-one-sending-loop/run.sh                  # 5 rounds of 1M records, ~30 s a round here
#   ROUNDS=1 ONLY=forward RECORDS=200000 research/experiments/006-one-sending-loop/run.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../../.." && pwd)
rounds=${ROUNDS:-5}
only=${ONLY:-}
records=${RECORDS:-1000000}
out="$here/${OUT:-results.jsonl}"
cd "$top"
cargo bench --bench sending_loop --no-run
: > "$out.tmp"
{
  echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src benches || echo '+dirty') $(uname -srm)"
  echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores, load at start: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "# net.core.rmem_max=$(cat /proc/sys/net/core/rmem_max) wmem_max=$(cat /proc/sys/net/core/wmem_max) rmem_default=$(cat /proc/sys/net/core/rmem_default)"
  echo "# rounds=$rounds records=$records only=${only:-all}"
} > "$here/machine.txt"
for ((r = 1; r <= rounds; r++)); do
  args=(--round "$r" --records "$records")
  [ -n "$only" ] && args+=(--only "$only")
  # Only the JSON lines go to the results; progress stays on the terminal.
  cargo bench -q --bench sending_loop -- "${args[@]}" | grep '^{' >> "$out.tmp"
done
echo "# load at end: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$here/machine.txt"
mv "$out.tmp" "$out"
python3 "$here/summarize.py" "$out" > "$here/summary.md"
cat "$here/summary.md"
