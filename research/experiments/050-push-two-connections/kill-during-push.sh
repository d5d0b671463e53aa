#!/usr/bin/env bash
# research/050: the fleet's database SIGKILLed in the middle of a push of many split over two connections, ROUNDS
# times: what `push --many` said against what the database holds. Needs a PostgreSQL 15 cluster at PGDIR (made
# with initdb, owned by postgres, socket in PGDIR, database `fleet`) and a node running on it with a state
# directory STATE whose senders are the first words of LINES (one line per sender).
# usage: kill-during-push.sh BIN PGDIR STATE LINES [ROUNDS]
set -u
BIN="$1"; PGDIR="$2"; STATE="$3"; LINES="$4"; ROUNDS="${5:-6}"
RUN="$(date +%s)"  # a tag of its own per run: the payloads of earlier runs stay in the database
W="$(mktemp -d)"; trap 'rm -rf "$W"' EXIT
q_() { su postgres -c "psql -h $PGDIR fleet -Atc \"$1\""; }
restart() {
  # The killed postmaster's backends end on their own; the server starts again once they have.
  while pgrep -u postgres -x postgres >/dev/null; do sleep 0.1; done
  su postgres -c "/usr/lib/postgresql/15/bin/pg_ctl -D $PGDIR/data -o '-k $PGDIR -c listen_addresses=' -l $PGDIR/log -w start" >/dev/null 2>&1
}
for it in $(seq 1 "$ROUNDS"); do
  sleep 1
  p="k$RUN-$it-"
  awk -v p="$p" '{print $1, p NR}' "$LINES" > "$W/l"
  d=$(python3 -c "import random; print(round(random.uniform(0.3,1.5),2))")
  ("$BIN" push --many --state "$STATE" --app main < "$W/l" > "$W/o" 2> "$W/e"; echo "exit $?" >> "$W/o") &
  sleep "$d"
  kill -9 "$(head -1 "$PGDIR/data/postmaster.pid")"
  sleep 0.5
  restart
  wait
  said=$(sed -n 's/^queued \([0-9]*\) of.*/\1/p' "$W/o")
  maybe=$(grep -o '[0-9]* maybe queued' "$W/e" | cut -d' ' -f1)
  rows=$(q_ "select count(*) from downlink where payload like '$p%'")
  twice=$(q_ "select count(*) - count(distinct sender) from downlink where payload like '$p%'")
  echo "{\"round\":$it,\"kill_after_s\":$d,\"said_queued\":$said,\"maybe_queued\":${maybe:-0},\"rows\":$rows,\"senders_twice\":$twice,\"exit\":$(tail -1 "$W/o" | cut -d' ' -f2)}"
done
