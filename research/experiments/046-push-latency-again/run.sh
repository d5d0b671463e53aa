#!/bin/sh
# research/046: benches/downlink --only live with several node builds, ROUNDS rounds, the order rotating each round
# (research/032's run.sh); each JSON line gets its build's name and the load average when its round began.
# Usage: run.sh BENCH ROUNDS OUT NAME=BIN [NAME=BIN ...]; EXTRA in the environment is passed to the bench
# (e.g. EXTRA="--senders 1000000").
set -eu
BENCH=$1; ROUNDS=$2; OUT=$3; shift 3
n=$#
for r in $(seq "$ROUNDS"); do
  load=$(cut -d' ' -f1 /proc/loadavg)
  echo "round $r: $(uptime)" >&2
  for i in $(seq 0 $((n - 1))); do
    idx=$(( (i + r - 1) % n + 1 ))
    eval pair=\${$idx}
    name=${pair%%=*}; bin=${pair#*=}
    # shellcheck disable=SC2086
    "$BENCH" --only "${PART:-live}" --round "$r" --bin "$bin" ${EXTRA:-} \
      | sed "s/^{/{\"build\":\"$name\",\"load\":$load,/" >> "$OUT"
  done
done
