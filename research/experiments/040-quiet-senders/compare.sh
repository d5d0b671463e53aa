#!/bin/sh
# research/040, second round: the command before (binary search per store row, names compared as UTF-8) and
# after (a merge walk, names compared as bytes) side by side in one run, on one 1M-sender state, 5 runs each;
# also the command with no store (the senders file, the sort and the output alone) and the query alone.
# usage: compare.sh BEFORE_BINARY [N]   (from the repository's root; AFTER is target/release/pure-serve)
set -eu
BEFORE="$1"
N="${2:-1000000}"
AFTER="$PWD/target/release/pure-serve"
HERE="$(cd "$(dirname "$0")" && pwd)"
WORK="$(mktemp -d /var/tmp/research-040.XXXXXX)"
KEYS="$(mktemp -d /dev/shm/research-040-keys.XXXXXX)"
trap 'rm -rf "$WORK" "$KEYS"' EXIT INT TERM
"$AFTER" keygen --many "$N" --out-dir "$KEYS/keys" >/dev/null 2>&1
mkdir -p "$WORK/state" "$WORK/empty"
cp "$KEYS/keys/senders.fragment" "$WORK/state/senders"
cp "$KEYS/keys/senders.fragment" "$WORK/empty/senders"
rm -rf "$KEYS"
"$AFTER" --state "$WORK/state" --bind 127.0.0.1 --link-port 0 --http-port 0 --metrics-listen 127.0.0.1:0 \
    --push-socket none > "$WORK/node.out" 2>&1 &
NODE=$!
while ! grep -q '^ready' "$WORK/node.out" 2>/dev/null; do sleep 0.2; done
kill -TERM "$NODE"; wait "$NODE" || true
python3 "$HERE/make_store.py" "$WORK/state" "$WORK/state/senders"
for run in 1 2 3 4 5; do
    for variant in before after no-store query-alone; do
        case "$variant" in
        before) set -- "$BEFORE" senders --state "$WORK/state" ;;
        after) set -- "$AFTER" senders --state "$WORK/state" ;;
        no-store) set -- "$AFTER" senders --state "$WORK/empty" ;;
        query-alone) set -- python3 -c "
import sqlite3,sys
db=sqlite3.connect('file:$WORK/state/apps/main.sqlite?mode=ro', uri=True)
n=0
for r in db.execute('SELECT s.name, s.heard, COALESCE((SELECT c.stored_at FROM chunks c WHERE c.source = s.id ORDER BY c.first_seq DESC LIMIT 1), 0) FROM sources s ORDER BY s.name'): n+=1
print(n, file=sys.stderr)" ;;
        esac
        /usr/bin/time -f '%e %U %S %M' -o "$WORK/time" "$@" > "$WORK/out" 2> "$WORK/err"
        read -r secs user sys kb < "$WORK/time"
        lines=$(wc -l < "$WORK/out")
        load=$(cut -d' ' -f1 /proc/loadavg)
        printf '{"when": "%s", "n": %s, "variant": "%s", "run": %s, "seconds": %s, "user_s": %s, "sys_s": %s, "max_rss_kb": %s, "lines_out": %s, "load1": %s, "disk": "%s"}\n' \
            "$(date -u +%FT%TZ)" "$N" "$variant" "$run" "$secs" "$user" "$sys" "$kb" "$lines" "$load" "$(df --output=fstype "$WORK" | tail -1)"
    done
done
