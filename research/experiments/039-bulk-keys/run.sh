#!/usr/bin/env bash
# research/039: `pure-serve keygen --many 100000` on tmpfs, RUNS times; one JSON line per run on stdout.
# Usage: run.sh [BINARY] [RUNS] [N]   (default: target/release/pure-serve, 5, 100000)
set -euo pipefail
BIN="${1:-target/release/pure-serve}"
RUNS="${2:-5}"
N="${3:-100000}"
BASE="$(mktemp -d /dev/shm/pure-keys.XXXXXX)"
trap 'rm -rf "$BASE"' EXIT
load() { cut -d' ' -f1 /proc/loadavg; }
for run in $(seq 1 "$RUNS"); do
    out="$BASE/run$run"
    before="$(load)"
    # GNU time's %e %U %S: wall, user and system seconds; %M: peak resident KiB.
    /usr/bin/time -f '%e %U %S %M' -o "$BASE/time" "$BIN" keygen --many "$N" --out-dir "$out" >/dev/null 2>"$BASE/err"
    read -r wall user sys rss <"$BASE/time"
    files="$(find "$out" -type f | wc -l)"
    printf '{"run":%d,"n":%d,"fs":"tmpfs","wall_s":%s,"user_s":%s,"sys_s":%s,"max_rss_kib":%s,"files":%d,"load1_before":%s,"cores":%d}\n' \
        "$run" "$N" "$wall" "$user" "$sys" "$rss" "$files" "$before" "$(nproc)"
    rm -rf "$out"
done
