#!/usr/bin/env bash
# research/004-congestion: the node over UDP loopback (one link, four links, four links with a 4 MiB buffer) with
# the sender of commit 2805f07 (fixed 16,384-record window, 10 ms RTO floor) and with the current sender
# (congestion window, early loss detection, 50 ms floor), alternating, ROUNDS rounds. Uses benches/link_costs.rs
# (research/001) at both commits, `--only link`. Writes $OUT (default results.jsonl) with a "build" field; the note
# says which working tree each committed results file was made with.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../../.." && pwd)
rounds=${ROUNDS:-5}
before_dir=${BEFORE_DIR:-/tmp/pure-serve-004-before}
cd "$top"
if [ ! -d "$before_dir" ]; then
  git worktree add --force --detach "$before_dir" 2805f07 >/dev/null
fi
(cd "$before_dir" && cargo bench --bench link_costs --no-run)
cargo bench --bench link_costs --no-run
out="$here/${OUT:-results.jsonl}"
: > "$out"
echo "# $(date -u +%FT%TZ) after=$(git rev-parse --short HEAD) before=2805f07 $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)" > "$here/machine.txt"
for ((r = 1; r <= rounds; r++)); do
  for build in before after; do
    dir=$top; [ "$build" = before ] && dir=$before_dir
    (cd "$dir" && cargo bench -q --bench link_costs -- --round "$r" --only link 2>/dev/null) \
      | grep '^{' | sed "s/^{/{\"build\":\"$build\",/" >> "$out"
  done
done
python3 "$here/summarize.py" "$out"
