#!/bin/sh
# research/017: turn-shaped commits to SQLite and to PostgreSQL (one writer; 2 and 3 writers into one app and into
# an app each), side by side, engines alternating in each round. A throwaway PostgreSQL 15 cluster (initdb in a
# temp dir on the same disk as the SQLite file, fsync on, synchronous_commit on, a unix socket), run as the
# postgres user as PostgreSQL requires; root. Usage: [OUT=FILE] [SECONDS=5] run.sh ROUNDS
set -eu
here=$(cd "$(dirname "$0")" && pwd)
ROUNDS=${1:-3}; SECONDS_EACH=${SECONDS:-5}
OUT="$here/${OUT:-results.jsonl}"
. "$here/cluster.sh"
mkdir -p "$WORK/sqlite"
: > "$OUT"
SHAPES="1:1000 100:10 1000:1"
for round in $(seq "$ROUNDS"); do
  for shape in $SHAPES; do
    s=${shape%%:*}; r=${shape#*:}
    if [ $((round % 2)) -eq 1 ]; then order="sqlite pg"; else order="pg sqlite"; fi
    for e in $order; do
      case $e in
        sqlite) "$BIN" sqlite "$WORK/sqlite" "$s" "$r" "$SECONDS_EACH" | tag "$round" ;;
        pg) "$BIN" pg "$PG" "$s" "$r" "$SECONDS_EACH" 1 own | tag "$round"
            "$BIN" pg "$PG" "$s" "$r" "$SECONDS_EACH" 1 own copy | tag "$round" ;;
      esac
    done
    for w in 2 3; do
      for apps in shared own; do
        "$BIN" pg "$PG" "$s" "$r" "$SECONDS_EACH" "$w" "$apps" | tag "$round"
      done
    done
  done
done
{ git -C "$here" rev-parse HEAD; uname -a; nproc; uptime; "$PGBIN/postgres" --version; } > "$here/machine.txt"
