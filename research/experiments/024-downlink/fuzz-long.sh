#!/usr/bin/env bash
# research/024: a long fuzz run of the targets that take LISTEN and DOWN frames, from copies of the kept corpora.
set -uo pipefail
mkdir -p "${OUT:-/tmp/fuzzlong}"
cd "$(dirname "$0")/../../.."
cargo +nightly fuzz build -O > ${OUT:-/tmp/fuzzlong}/build.log 2>&1 || { echo "build failed"; exit 1; }
for t in packet_open node_packet packet; do
  rm -rf ${OUT:-/tmp/fuzzlong}/$t; cp -r fuzz/corpus/$t ${OUT:-/tmp/fuzzlong}/$t
  start=$(date +%s)
  cargo +nightly fuzz run -O $t ${OUT:-/tmp/fuzzlong}/$t -- -max_total_time=${SECS:-600} -rss_limit_mb=2048 > ${OUT:-/tmp/fuzzlong}/$t.log 2>&1
  rc=$?
  echo "{\"target\":\"$t\",\"seconds\":$(( $(date +%s) - start )),\"exit\":$rc,\"done\":\"$(grep -E '^#[0-9]+\s+DONE' ${OUT:-/tmp/fuzzlong}/$t.log | tail -1)\",\"corpus_files\":$(ls ${OUT:-/tmp/fuzzlong}/$t | wc -l)}"
done
