#!/usr/bin/env bash
# research/006: before/after side by side. Runs bench executables (built from two commits, copied aside) in turn,
# round after round, so the shared machine's drift falls on both alike, and writes OUT_PREFIX-TAG.jsonl for each;
# compare.py prints each figure's median per build and the median of the per-round ratios.
#
#   ab.sh before=/tmp/sl-before after=/tmp/sl-after          # ROUNDS (default 5), ARGS passed to each run
#   ROUNDS=6 ARGS="--only forward --shapes link/1,link/4" OUT_PREFIX=ab-window ab.sh before=... after=...
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
rounds=${ROUNDS:-5}
prefix="$here/${OUT_PREFIX:-ab}"
read -r -a extra <<< "${ARGS:---only forward}"
tags=()
for spec in "$@"; do
  tag=${spec%%=*}
  tags+=("$tag")
  : > "$prefix-$tag.jsonl"
done
for ((r = 1; r <= rounds; r++)); do
  # Turn the order each round too.
  n=${#tags[@]}
  for ((k = 0; k < n; k++)); do
    i=$(( (k + r) % n ))
    spec=${*:i+1:1}
    tag=${spec%%=*}
    bin=${spec#*=}
    echo "round $r: $tag" >&2
    "$bin" --round "$r" "${extra[@]}" | grep '^{' >> "$prefix-$tag.jsonl"
  done
done
python3 "$here/compare.py" "${tags[@]/#/$prefix-}"
