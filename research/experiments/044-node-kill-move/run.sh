#!/bin/sh
# research/044: the fleet test that SIGKILLs a node under `send --to A,B`, RUNS times; one JSON line a run.
# usage: run.sh [RUNS]   (from the repository's root; PostgreSQL's binaries installed, as for the tests)
set -eu
RUNS="${1:-7}"
for run in $(seq 1 "$RUNS"); do
    PURE_REQUIRE_POSTGRES=1 cargo test --release --test fleet send_given_two -- --nocapture 2>&1 \
        | sed -n 's/^research-044 //p' \
        | python3 -c "import json,sys; d=json.loads(sys.stdin.read()); d['run']=$run; print(json.dumps(d))"
done
