#!/usr/bin/env bash
# research/043 addendum 2: push --many on a fleet, builds side by side (BINS="label=path ..."), ROUNDS rounds.
set -u
B="$1"; OUT="$2"; ROUNDS="${3:-2}"; N="${4:-100000}"
mkdir -p ${PGLOG_DIR:-/tmp/r046/pglog} && chmod 777 ${PGLOG_DIR:-/tmp/r046/pglog}
for r in $(seq 1 "$ROUNDS"); do
  for lb in $BINS; do
    label="${lb%%=*}"; bin="${lb#*=}"
    load="$(cut -d' ' -f1 /proc/loadavg)"
    log="${PGLOG_DIR:-/tmp/r046/pglog}/$label-$r.log"; rm -f "$log"
    PURE_PG_LOG="$log" PURE_PG_OPTS="-c log_min_duration_statement=20" \
      "$B" --bench --only many-fleet --bin "$bin" --round "$r" --senders "$N" 2>/dev/null \
      | grep '^{' | sed "s/^{/{\"build\":\"$label\",\"load\":$load,/" >> "$OUT"
    slow="$(grep -c 'duration:' "$log")"
    max="$(grep -o 'duration: [0-9.]*' "$log" | awk '{if ($2>m) m=$2} END {print m+0}')"
    echo "{\"build\":\"$label\",\"round\":$r,\"lines\":$N,\"statements_over_20ms\":$slow,\"slowest_ms\":$max}" >> "$OUT"
  done
done
