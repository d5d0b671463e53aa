#!/bin/sh
# research/041 (b): the failover test of tests/fleet_failover.rs run RUNS times in a row; each run's JSON line (printed by the
# test, "research-041 {...}") appended to OUT with the run's number, the build and the load at its start.
# Usage: run-cut.sh TESTBIN RUNS OUT
# TESTBIN is the built test (cargo test --release --no-run --test fleet_failover prints its path). Needs
# PostgreSQL (the test's own requirements).
set -eu
BIN=$1; RUNS=$2; OUT=$3
TEST=a_primary_sigkilled_under_load_and_its_synchronous_standby_promoted_loses_nothing_acked
BUILD=$(git rev-parse --short HEAD)
for r in $(seq "$RUNS"); do
  load=$(cut -d' ' -f1 /proc/loadavg)
  log=$(mktemp)
  if PURE_REQUIRE_POSTGRES=1 PURE_REQUIRE_NETNS=1 "$BIN" --exact "$TEST" --nocapture >"$log" 2>&1; then
    ok=true
  else
    ok=false
  fi
  line=$(grep -a '^research-041 ' "$log" | sed 's/^research-041 //' || true)
  [ -n "$line" ] || line='{"what":"failover"}'
  echo "$line" | python3 -c "import json,sys; d=json.load(sys.stdin); d.update(run=$r, ok=('$ok' == 'true'), build='$BUILD', loadavg_1m_at_start=$load); print(json.dumps(d))" >> "$OUT"
  $ok || { echo "run $r failed:" >&2; tail -30 "$log" >&2; }
  rm -f "$log"
done
