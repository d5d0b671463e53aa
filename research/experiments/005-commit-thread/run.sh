#!/usr/bin/env bash
# research/005-commit-thread: research/001's bench (`--only link,x25519`) at the commit before the store thread
# (BEFORE_REV) and at the working tree, alternating, ROUNDS rounds. Writes results.jsonl with a "build" field.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../../.." && pwd)
rounds=${ROUNDS:-5}
before_rev=${BEFORE_REV:?the commit before the change}
before_dir=${BEFORE_DIR:-/tmp/pure-serve-005-before}
cd "$top"
[ -d "$before_dir" ] || git worktree add --force --detach "$before_dir" "$before_rev" >/dev/null
git -C "$before_dir" checkout -q --detach "$before_rev"
(cd "$before_dir" && cargo bench --bench link_costs --no-run)
cargo bench --bench link_costs --no-run
out="$here/results.jsonl"
: > "$out"
echo "# $(date -u +%FT%TZ) before=$before_rev after=working tree on $(git rev-parse --short HEAD); $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)" > "$here/machine.txt"
for ((r = 1; r <= rounds; r++)); do
  for build in before after; do
    dir=$top; [ "$build" = before ] && dir=$before_dir
    (cd "$dir" && cargo bench -q --bench link_costs -- --round "$r" --only link,x25519 2>/dev/null) \
      | grep '^{' | sed "s/^{/{\"build\":\"$build\",/" >> "$out"
  done
done
python3 "$top/research/experiments/004-congestion/summarize.py" "$out"
