#!/usr/bin/env bash
# research/002-idle-links: node memory per idle link and start-up time, before and after the mapped allow-list.
# Builds the "before" node (in-memory allow-list, no heap trim after sweeps) from commit 79bf285 in a worktree,
# then runs benches/idle_links.rs against both binaries, alternating, and writes results.jsonl.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../../.." && pwd)
cd "$top"
runs=${RUNS:-5}
out="$here/results.jsonl"
before_dir=${BEFORE_DIR:-/tmp/pure-serve-002-before}
if [ ! -x "$before_dir/target/release/pure-serve" ]; then
  rm -rf "$before_dir"
  git worktree add --force --detach "$before_dir" 79bf285 >/dev/null
  (cd "$before_dir" && cargo build --release --bin pure-serve)
fi
cargo build --release --bin pure-serve
cargo bench --bench idle_links --no-run
after_bin="$top/target/release/pure-serve"
before_bin="$before_dir/target/release/pure-serve"
: > "$out"
echo "host: $(nproc) cores, $(uname -r); $(date -u +%FT%TZ)" >&2
for run in $(seq 1 "$runs"); do
  # Listed, never sent: the allow-list alone.
  for label in before after; do
    bin=$before_bin; [ "$label" = after ] && bin=$after_bin
    cargo bench -q --bench idle_links -- --senders 0 --senders 100000 --senders 1000000 --reload \
      --bin "$bin" --label "$label" 2>/dev/null | grep '^{' | sed "s/\"run\":0/\"run\":$run/" >> "$out"
  done
  # Sent once each and idled: 100k senders, both builds.
  for label in before after; do
    bin=$before_bin; [ "$label" = after ] && bin=$after_bin
    cargo bench -q --bench idle_links -- --senders 100000 --send \
      --bin "$bin" --label "$label" 2>/dev/null | grep '^{' | grep after_idle | sed "s/\"run\":0/\"run\":$run/" >> "$out"
  done
done
# A million senders, each sent once, then idle: the brief's figure, current build only (3 runs: ~3 min each).
for run in $(seq 1 "${RUNS_1M:-3}"); do
  cargo bench -q --bench idle_links -- --senders 1000000 --send --bin "$after_bin" --label after 2>/dev/null \
    | grep '^{' | grep after_idle | sed "s/\"run\":0/\"run\":$run/" >> "$out"
done
python3 "$here/summarize.py" "$out"
