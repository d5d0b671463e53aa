#!/bin/sh
# research/017, the follow-up (written after the first results): a link's big chunk stored without compression
# (`external`) or in rows of at most 60 records (`cap60`), beside the first run's `plain` insert; and two writers
# racing on the same sources (`race`). The same throwaway cluster as run.sh. Usage: [OUT=FILE] run2.sh ROUNDS
set -eu
here=$(cd "$(dirname "$0")" && pwd)
ROUNDS=${1:-3}; SECONDS_EACH=${SECONDS:-5}
OUT="$here/${OUT:-results-2.jsonl}"
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
: > "$OUT"
tag() { python3 -c "import json,sys; d=json.loads(sys.stdin.read()); d['round']=$1; d['load1']=float(open('/proc/loadavg').read().split()[0]); print(json.dumps(d))" >> "$OUT"; }
for round in $(seq "$ROUNDS"); do
  for v in plain external cap60; do "$BIN" pg2 "$PG" 1 1000 "$SECONDS_EACH" 1 "$v" | tag "$round"; done
  "$BIN" pg2 "$PG" 1 1000 "$SECONDS_EACH" 2 race | tag "$round"
  "$BIN" pg2 "$PG" 100 10 "$SECONDS_EACH" 1 plain | tag "$round"
  "$BIN" pg2 "$PG" 100 10 "$SECONDS_EACH" 2 race | tag "$round"
done
