#!/bin/sh
# research/017: turn-shaped commits to SQLite and to PostgreSQL (one writer; 2 and 3 writers into one app and into
# an app each), side by side, engines alternating in each round. A throwaway PostgreSQL 15 cluster (initdb in a
# temp dir on the same disk as the SQLite file, fsync on, synchronous_commit on, a unix socket), run as the
# postgres user as PostgreSQL requires; root. Usage: [OUT=FILE] [SECONDS=5] run.sh ROUNDS
set -eu
here=$(cd "$(dirname "$0")" && pwd)
ROUNDS=${1:-3}; SECONDS_EACH=${SECONDS:-5}
OUT="$here/${OUT:-results.jsonl}"
BIN=${BIN:-/tmp/t017/release/fleet-store-017}
[ -x "$BIN" ] || (cd "$here" && CARGO_TARGET_DIR=/tmp/t017 cargo build --release)
PGBIN=/usr/lib/postgresql/15/bin
WORK=$(mktemp -d /var/tmp/pg017.XXXXXX)
chown postgres "$WORK"
trap 'setpriv --reuid=postgres --regid=postgres --init-groups "$PGBIN/pg_ctl" -D "$WORK/data" -m immediate stop >/dev/null 2>&1 || true; rm -rf "$WORK"' EXIT
setpriv --reuid=postgres --regid=postgres --init-groups "$PGBIN/initdb" -D "$WORK/data" -A trust -U postgres >/dev/null
setpriv --reuid=postgres --regid=postgres --init-groups "$PGBIN/pg_ctl" -D "$WORK/data" -l "$WORK/log" -w \
  -o "-k $WORK -c listen_addresses= -c fsync=on -c synchronous_commit=on -c shared_buffers=256MB -c max_wal_size=4GB" start >/dev/null
PG="host=$WORK user=postgres dbname=postgres"
mkdir -p "$WORK/sqlite"
: > "$OUT"
tag() { python3 -c "import json,sys; d=json.loads(sys.stdin.read()); d['round']=$1; d['load1']=float(open('/proc/loadavg').read().split()[0]); print(json.dumps(d))" >> "$OUT"; }
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
