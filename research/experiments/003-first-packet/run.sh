#!/usr/bin/env bash
# research/003-first-packet-latency: builds benches/first_packet.rs and runs it ROUNDS times (default 5), each round a
# fresh process with its own node, quinn server and state directory; the variants are interleaved sample by sample
# inside a round, in a random order per set of samples; then the node's steps for one wake, timed one by one
# (--phases). Writes results.jsonl (a header line, then one JSON object per variant per round, raw samples
# included) and prints the summary table (summarize.py).
#
#   research/experiments/003-first-packet/run.sh                # 5 rounds of 200 samples: ~7 min on the 2-core VM
#   ROUNDS=1 SAMPLES=50 research/experiments/003-first-packet/run.sh
#
# The state directories are made under TMPDIR (default /tmp), which must be on the disk being measured (here /tmp
# is on the root ext4 file system, not tmpfs).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../../.." && pwd)
rounds=${ROUNDS:-5}
samples=${SAMPLES:-200}
idle_ms=${IDLE_MS:-100}
gap_ms=${GAP_MS:-20}
cd "$top"
cargo bench --bench first_packet --no-run
out="$here/results.jsonl"
tmpfs=$(findmnt -n -o FSTYPE --target "${TMPDIR:-/tmp}" || echo unknown)
python3 - "$tmpfs" > "$out.tmp" <<PY
import json, os, platform, subprocess, sys, datetime
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
print(json.dumps({
    "bench": "first_packet", "variant": "header",
    "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip(),
    "kernel": platform.release(), "cpu": cpu, "cores": os.cpu_count(),
    "load": open("/proc/loadavg").read().split()[:3], "state_fs": sys.argv[1],
    "rounds": $rounds, "samples": $samples, "idle_ms": $idle_ms, "gap_ms": $gap_ms,
}))
PY
for ((r = 1; r <= rounds; r++)); do
  # Only the JSON lines go to the results; progress stays on the terminal.
  cargo bench -q --bench first_packet -- --round "$r" --samples "$samples" --idle-ms "$idle_ms" \
    --gap-ms "$gap_ms" | grep '^{' >> "$out.tmp"
done
# Where the node's own time goes: its steps for one wake on the sans-IO node, timed one by one (no sockets).
cargo bench -q --bench first_packet -- --phases --samples "$samples" --idle-ms "$idle_ms" --gap-ms "$gap_ms" \
  | grep '^{' >> "$out.tmp"
mv "$out.tmp" "$out"
python3 "$here/summarize.py" "$out"
