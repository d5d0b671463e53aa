# research/017: sourced by run.sh and run2.sh. Builds the program if needed, starts a throwaway PostgreSQL 15
# cluster (initdb in a temp dir on the same disk as the SQLite file, fsync on, synchronous_commit on, a unix
# socket; run as the postgres user, as PostgreSQL requires; root), stops and removes it on exit, and defines
# `tag ROUND` (adds the round and the load average to a JSON line, appended to $OUT). Sets BIN, WORK, PG.
BIN=${BIN:-/tmp/t017/release/fleet-store-017}
[ -x "$BIN" ] || (cd "$here" && CARGO_TARGET_DIR=/tmp/t017 cargo build --release)
PGBIN=/usr/lib/postgresql/15/bin
WORK=$(mktemp -d /var/tmp/pg017.XXXXXX)
chown postgres "$WORK"
as_pg() { setpriv --reuid=postgres --regid=postgres --init-groups "$@"; }
trap 'as_pg "$PGBIN/pg_ctl" -D "$WORK/data" -m immediate stop >/dev/null 2>&1 || true; rm -rf "$WORK"' EXIT
as_pg "$PGBIN/initdb" -D "$WORK/data" -A trust -U postgres >/dev/null
as_pg "$PGBIN/pg_ctl" -D "$WORK/data" -l "$WORK/log" -w \
  -o "-k $WORK -c listen_addresses= -c fsync=on -c synchronous_commit=on -c shared_buffers=256MB -c max_wal_size=4GB" start >/dev/null
PG="host=$WORK user=postgres dbname=postgres"
tag() { python3 -c "import json,sys; d=json.loads(sys.stdin.read()); d['round']=$1; d['load1']=float(open('/proc/loadavg').read().split()[0]); print(json.dumps(d))" >> "$OUT"; }
