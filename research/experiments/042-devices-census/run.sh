#!/bin/sh
# research/042: a node with 1M senders and one store of 1M sources, with its devices census (target/release) and
# without (BEFORE: a binary built before it), side by side: RssAnon every 0.1 s for WINDOW s after `ready`, CPU
# time over the window, the census's scan time. JSON lines on standard output.
# usage: run.sh BEFORE_BINARY [N] [WINDOW] [RUNS]   (from the repository's root)
set -eu
BEFORE="$1"
N="${2:-1000000}"
WINDOW="${3:-120}"
RUNS="${4:-3}"
AFTER="${AFTER:-$PWD/target/release/pure-serve}"
HERE="$(cd "$(dirname "$0")" && pwd)"
WORK="$(mktemp -d /var/tmp/research-042.XXXXXX)"
KEYS="$(mktemp -d /dev/shm/research-042-keys.XXXXXX)"
trap 'rm -rf "$WORK" "$KEYS"' EXIT INT TERM
"$AFTER" keygen --many "$N" --out-dir "$KEYS/keys" >/dev/null 2>&1
mkdir -p "$WORK/state"
cp "$KEYS/keys/senders.fragment" "$WORK/state/senders"
rm -rf "$KEYS"
"$AFTER" --state "$WORK/state" --bind 127.0.0.1 --link-port 0 --http-port 0 --metrics-listen 127.0.0.1:0 \
    --push-socket none > "$WORK/node.out" 2>&1 &
NODE=$!
while ! grep -q '^ready' "$WORK/node.out" 2>/dev/null; do sleep 0.2; done
kill -TERM "$NODE"; wait "$NODE" || true
python3 "$HERE/../040-quiet-senders/make_store.py" "$WORK/state" "$WORK/state/senders"
for run in $(seq 1 "$RUNS"); do
    for variant in before after; do
        case "$variant" in
        before) BIN="$BEFORE"; EXTRA="" ;;
        after) BIN="$AFTER"; EXTRA="--quiet-after 1h" ;;
        esac
        # shellcheck disable=SC2086
        "$BIN" --state "$WORK/state" --bind 127.0.0.1 --link-port 0 --http-port 0 \
            --metrics-listen 127.0.0.1:0 --push-socket none $EXTRA > "$WORK/node.out" 2>&1 &
        NODE=$!
        while ! grep -q '^ready' "$WORK/node.out" 2>/dev/null; do sleep 0.05; done
        METRICS=$(sed -n 's|^metrics: *http://\([^/]*\)/metrics.*|\1|p' "$WORK/node.out")
        python3 "$HERE/sample.py" "$NODE" "$WINDOW" "$METRICS" "$variant" "$run" "$N"
        kill -TERM "$NODE"; wait "$NODE" || true
    done
done
