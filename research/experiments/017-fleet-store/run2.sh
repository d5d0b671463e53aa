#!/bin/sh
# research/017, the follow-up (written after the first results): a link's big chunk stored without compression
# (`external`) or in rows of at most 60 records (`cap60`), beside the first run's `plain` insert; and two writers
# racing on the same sources (`race`). The same throwaway cluster as run.sh. Usage: [OUT=FILE] run2.sh ROUNDS
set -eu
here=$(cd "$(dirname "$0")" && pwd)
ROUNDS=${1:-3}; SECONDS_EACH=${SECONDS:-5}
OUT="$here/${OUT:-results-2.jsonl}"
. "$here/cluster.sh"
: > "$OUT"
for round in $(seq "$ROUNDS"); do
  for v in plain external cap60; do "$BIN" pg2 "$PG" 1 1000 "$SECONDS_EACH" 1 "$v" | tag "$round"; done
  "$BIN" pg2 "$PG" 1 1000 "$SECONDS_EACH" 2 race | tag "$round"
  "$BIN" pg2 "$PG" 100 10 "$SECONDS_EACH" 1 plain | tag "$round"
  "$BIN" pg2 "$PG" 100 10 "$SECONDS_EACH" 2 race | tag "$round"
done
