#!/bin/sh
# research/043: a million devices one record each through `pure-serve push --many` (one request), against what
# SQLite alone takes for the same rows in the same batches (store_alone.py), side by side, RUNS times, each on a
# fresh state directory on disk. JSON lines on standard output.
# usage: run.sh [N] [RUNS]   (from the repository's root; BIN=path overrides target/release/pure-serve;
#        BINS="label=path label=path" compares builds side by side, VARIANTS picks the variants;
#        FLEET_URL=postgres://… and FLEET_RESET="command" run the node on a fleet's database, emptied each run)
set -eu
N="${1:-1000000}"
RUNS="${2:-3}"
BIN="${BIN:-$PWD/target/release/pure-serve}"
HERE="$(cd "$(dirname "$0")" && pwd)"
WORK="$(mktemp -d /var/tmp/research-043.XXXXXX)"
KEYS="$(mktemp -d /dev/shm/research-043-keys.XXXXXX)"
trap 'rm -rf "$WORK" "$KEYS"' EXIT INT TERM
"$BIN" keygen --many "$N" --out-dir "$KEYS/keys" >/dev/null 2>&1
cp "$KEYS/keys/senders.fragment" "$WORK/senders"
# One of the devices sends records meanwhile, to see what a push of many costs the senders (sends.py).
DEVICE=$(awk '!/^#/ && NF {print $1; exit}' "$WORK/senders")
cp "$KEYS/keys/$DEVICE.key" "$WORK/device.key"
rm -rf "$KEYS"
SENDS="${SENDS:-40}"
awk '!/^#/ && NF {print $1, "interval=300"}' "$WORK/senders" > "$WORK/lines"
VARIANTS="${VARIANTS:-push-many send-alone push-many+send store-alone}"
BINS="${BINS:-main=$BIN}"
for run in $(seq 1 "$RUNS"); do
  for build in $BINS; do
    label="${build%%=*}"
    BIN="${build#*=}"
    for variant in $VARIANTS; do
        rm -rf "$WORK/state"
        mkdir -p "$WORK/state"
        case "$variant" in
        push-many|send-alone|push-many+send)
            # Emptied here, not by the redirection below: that happens in the child, after this shell may have
            # read the last run's "ready".
            : > "$WORK/node.out"
            # A fleet's node (addendum 2): FLEET_URL names a PostgreSQL database, emptied before each run by
            # FLEET_RESET (a shell command), and the node gets an identity file of its own.
            NODE_ARGS=""
            if [ -n "${FLEET_URL:-}" ]; then
                sh -c "$FLEET_RESET"
                [ -e "$WORK/node.key" ] || "$BIN" keygen --out "$WORK/node.key" >/dev/null 2>&1
                NODE_ARGS="--key $WORK/node.key --store $FLEET_URL"
            fi
            # shellcheck disable=SC2086
            "$BIN" --state "$WORK/state" --senders "$WORK/senders" --bind 127.0.0.1 --link-port 0 --http-port 0 \
                --metrics-listen 127.0.0.1:0 $NODE_ARGS >> "$WORK/node.out" 2>&1 &
            NODE=$!
            while ! grep -q '^ready' "$WORK/node.out" 2>/dev/null; do sleep 0.05; done
            PUB=$(sed -n 's/^public key: *//p' "$WORK/node.out")
            LINK=$(sed -n 's/^link: *udp *//p' "$WORK/node.out")
            secs=null; user=null; kb=null
            rm -f "$WORK/stop"
            if [ "$variant" != push-many ]; then
                # One device, one record a run of `send`, again and again: alone for SENDS runs, or until the push
                # has been answered.
                count=$SENDS
                [ "$variant" = send-alone ] || count=100000
                python3 "$HERE/sends.py" "$BIN" "$WORK/device.key" "$PUB" "$LINK" "$count" "$WORK/stop" \
                    "$label:$variant" "$run" > "$WORK/sends.json" &
                SENDER=$!
            fi
            if [ "$variant" != send-alone ]; then
                /usr/bin/time -f '%e %U %S %M' -o "$WORK/time" "$BIN" push --many --state "$WORK/state" --app main \
                    < "$WORK/lines" > "$WORK/out" 2> "$WORK/err" || true
                tail -1 "$WORK/time" > "$WORK/time1"
                read -r secs user sys kb < "$WORK/time1"
            else
                : > "$WORK/out"
            fi
            if [ "$variant" != push-many ]; then
                [ "$variant" = send-alone ] || touch "$WORK/stop"
                wait "$SENDER" || true
                cat "$WORK/sends.json"
            fi
            node_cpu=$(awk '{print ($14 + $15) / 100}' "/proc/$NODE/stat")
            node_anon=$(awk '/^RssAnon/ {print $2}' "/proc/$NODE/status")
            stored=$(curl -s "http://$(sed -n 's|^metrics: *http://\([^/]*\)/metrics.*|\1|p' "$WORK/node.out")/metrics" \
                | awk '/^pure_records_stored_total/ {print $2}')
            kill -TERM "$NODE"; wait "$NODE" || true
            printf '{"when": "%s", "n": %s, "variant": "%s", "run": %s, "seconds": %s, "client_user_s": %s, "client_max_rss_kb": %s, "records_stored": %s, "node_cpu_s": %s, "node_anon_kb_after": %s, "said": "%s", "load1": %s, "disk": "%s"}\n' \
                "$(date -u +%FT%TZ)" "$N" "$label:$variant" "$run" "$secs" "$user" "$kb" "${stored:-null}" \
                "$node_cpu" "$node_anon" "$(head -1 "$WORK/out")" "$(cut -d' ' -f1 /proc/loadavg)" \
                "$(df --output=fstype "$WORK" | tail -1)"
            ;;
        store-alone)
            python3 "$HERE/store_alone.py" "$WORK/state/alone.sqlite" "$WORK/lines" "$variant" "$run"
            ;;
        esac
    done
  done
done
