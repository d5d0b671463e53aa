#!/usr/bin/env bash
# research/036: what reading a store whole at start costs the node — a 1 GiB store (made by make-store.py, the
# store's own tables) under a state whose last run did not end cleanly, page cache dropped before each start; the
# time is the node's own log line ("checked whole ... N MiB read in S s"). Usage: whole-check.sh ROUNDS [MIB]
set -euo pipefail
ROUNDS=${1:-3}; MIB=${2:-1024}
HERE="$(cd "$(dirname "$0")" && pwd)"; BIN="$HERE/../../../target/release/pure-serve"
WORK="$(mktemp -d /var/tmp/whole-check.XXXXXX)"; trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/state/apps"
python3 "$HERE/make-store.py" "$WORK/state/apps/main.sqlite" "$MIB" >&2
for r in $(seq 1 "$ROUNDS"); do
  rm -f "$WORK/state/clean-stop"
  sync; echo 3 > /proc/sys/vm/drop_caches
  RUST_LOG=info "$BIN" --state "$WORK/state" --bind 127.0.0.1 --link-port 0 --http-port 0 --metrics-listen 127.0.0.1:0 \
    --accept-lost-state >"$WORK/out" 2>"$WORK/err" &
  pid=$!
  for _ in $(seq 1200); do grep -q "checked whole" "$WORK/err" && break; sleep 0.1; done
  kill -9 $pid; wait $pid 2>/dev/null || true
  line=$(grep -o "checked whole ([^)]*): [0-9]* MiB read in [0-9.]* s" "$WORK/err")
  mib=$(sed -E 's/.*: ([0-9]+) MiB read in ([0-9.]+) s/\1/' <<<"$line")
  secs=$(sed -E 's/.*: ([0-9]+) MiB read in ([0-9.]+) s/\2/' <<<"$line")
  echo "{\"bench\":\"whole_check\",\"round\":$r,\"mib\":$mib,\"seconds\":$secs,\"cache\":\"dropped\",\"disk\":\"$(df --output=source "$WORK" | tail -1)\"}"
done
