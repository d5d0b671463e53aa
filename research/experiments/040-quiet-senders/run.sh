#!/bin/sh
# research/040: `pure-serve senders` at N senders (default 1,000,000), 5 runs each, beside the query alone.
# Prints one JSON line per run on stdout. usage: run.sh [N]   (from the repository's root, release binary built)
set -eu
N="${1:-1000000}"
BIN="$PWD/target/release/pure-serve"
HERE="$(cd "$(dirname "$0")" && pwd)"
WORK="$(mktemp -d /var/tmp/research-040.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
"$BIN" keygen --many "$N" --out-dir "$WORK/keys" >/dev/null 2>&1
mkdir -p "$WORK/state"
cp "$WORK/keys/senders.fragment" "$WORK/state/senders"
# A node makes the store and its layout; then it stops.
"$BIN" --state "$WORK/state" --bind 127.0.0.1 --link-port 0 --http-port 0 --metrics-listen 127.0.0.1:0 \
    --push-socket none > "$WORK/node.out" 2>&1 &
NODE=$!
while ! grep -q '^ready' "$WORK/node.out"; do sleep 0.2; done
kill -TERM "$NODE"; wait "$NODE" || true
python3 "$HERE/make_store.py" "$WORK/state" "$WORK/state/senders"
for run in 1 2 3 4 5; do
    for variant in all quiet-1d query-alone; do
        case "$variant" in
        all) set -- "$BIN" senders --state "$WORK/state" ;;
        quiet-1d) set -- "$BIN" senders --state "$WORK/state" --quiet-for 1d ;;
        query-alone) set -- python3 -c "
import sqlite3,sys
db=sqlite3.connect('file:$WORK/state/apps/main.sqlite?mode=ro', uri=True)
n=0
for r in db.execute('SELECT s.name, s.heard, COALESCE((SELECT c.stored_at FROM chunks c WHERE c.source = s.id ORDER BY c.first_seq DESC LIMIT 1), 0) FROM sources s ORDER BY s.name'): n+=1
print(n, file=sys.stderr)" ;;
        esac
        /usr/bin/time -f '%e %M' -o "$WORK/time" "$@" > "$WORK/out" 2> "$WORK/err"
        read -r secs kb < "$WORK/time"
        lines=$(wc -l < "$WORK/out")
        load=$(cut -d' ' -f1 /proc/loadavg)
        printf '{"when": "%s", "n": %s, "variant": "%s", "run": %s, "seconds": %s, "max_rss_kb": %s, "lines_out": %s, "load1": %s, "disk": "%s"}\n' \
            "$(date -u +%FT%TZ)" "$N" "$variant" "$run" "$secs" "$kb" "$lines" "$load" "$(df --output=fstype /var/tmp | tail -1)"
    done
done
