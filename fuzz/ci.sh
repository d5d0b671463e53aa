#!/usr/bin/env bash
# The bounded fuzz step (issue 8): build every target once, run each from a copy of its corpus for FUZZ_SECONDS
# (default 12: seven targets, about a minute and a half), fail on the first crash. Needs the nightly toolchain and cargo-fuzz
# (`cargo install cargo-fuzz --locked`). Longer runs: FUZZ_SECONDS=600 fuzz/ci.sh (research/009-crash-loop.md,
# fuzzing). A crash leaves its input in fuzz/artifacts/TARGET/; make it a regression test, then fix.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH="${FUZZ_SECONDS:-12}"
TARGETS="packet packet_open node_packet senders_file apps_file http_framing push_request"
cargo +nightly fuzz build -O
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
for t in $TARGETS; do
    cp -r "fuzz/corpus/$t" "$WORK/$t"
    echo "== fuzz $t for ${SECONDS_EACH}s"
    cargo +nightly fuzz run -O "$t" "$WORK/$t" -- -max_total_time="$SECONDS_EACH" -rss_limit_mb=2048 2>&1 \
        | grep -E "^(#[0-9]+\s+DONE|Done|==|SUMMARY|ERROR|thread|panicked)" || true
    # cargo fuzz exits non-zero on a crash; with the pipe above, look for its artifact instead.
    if compgen -G "fuzz/artifacts/$t/crash-*" >/dev/null || compgen -G "fuzz/artifacts/$t/oom-*" >/dev/null \
        || compgen -G "fuzz/artifacts/$t/timeout-*" >/dev/null; then
        echo "fuzz target $t found a failing input: fuzz/artifacts/$t/"; ls "fuzz/artifacts/$t/"
        exit 1
    fi
done
echo "fuzz: 7 targets, ${SECONDS_EACH}s each, no crash"
