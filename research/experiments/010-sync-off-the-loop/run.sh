#!/usr/bin/env bash
# research/010-sync-off-the-loop: before/after side by side. Runs the bench executables of two (or more) builds,
# each copied aside into a directory of its own, step by step, round after round; within a round every step runs
# once per build, the builds in an order turned each round (round 1: after then before, round 2: before then after,
# ...), so a slow minute of the shared disk or CPU falls on both alike and neither always runs first. Use an even
# ROUNDS for each build to go first equally often.
#
#   research/experiments/010-sync-off-the-loop/run.sh before=/tmp/before after=/tmp/after   # 5 rounds, ~4 min each
#
# Each DIR holds the executables pure-serve, sending_loop, overload, first_packet, link_costs (link_costs is
# optional: its step is skipped for a build without it). The steps of a round:
#
#   sending_loop  research/006: --only forward --shapes link/1,link/4,wire/1,wire/4 (--records RECORDS)
#   overload      research/007, the DIR's overload with the DIR's pure-serve:
#                   unloaded  --senders 4 --flood 0
#                   forged    --senders 4 --mix forged --flood 100000 --budget 250 --new 10
#                   capacity  --senders 8 --flood 0
#                   curve/40  --senders 40 --rate-each 200000 --flood 0
#   first_packet  research/003: --samples SAMPLES --idle-ms 100 --gap-ms 20 (the round is its shuffle's seed, so
#                 both builds interleave their variants in the same order)
#   link_costs    research/001: --only link (one link of 1M records, four of 250k, four with a 4 MiB buffer)
#
# Every JSON line of every tool goes to OUT_DIR/results-TAG.jsonl with "build", "round" and "bench" added (and
# "label" for overload, which has it already); a step that fails adds {"bench", "build", "round", "label",
# "failed": exit status} instead and the run goes on. Each tool's stderr is kept in OUT_DIR/stderr-TAG.log;
# OUT_DIR/machine.txt has the machine, the builds' checksums and each round's duration. Then summarize.py prints
# the table (also written to OUT_DIR/summary.md).
#
# Environment (defaults in brackets): ROUNDS [5]; OUT_DIR [this directory]; RECORDS [1000000] for sending_loop;
# SAMPLES [200] for first_packet; SECONDS_OVERLOAD [3] and WARMUP [1] for overload's window; STEPS
# [sending_loop,overload,first_packet,link_costs] to run fewer steps; FLOOD_TOOL [each DIR's overload] to drive
# every build's pure-serve with one flood tool. A quick check of the script itself (~1.5 min, results in /tmp):
#
#   ROUNDS=1 RECORDS=200000 SAMPLES=30 SECONDS_OVERLOAD=1 WARMUP=0.5 OUT_DIR=/tmp/010-check \
#     research/experiments/010-sync-off-the-loop/run.sh before=/tmp/before after=/tmp/before
#
# The tools make their state directories under TMPDIR (default /tmp), which must be on the disk being measured
# (here the root ext4, not tmpfs): the fsync is what this experiment is about.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../../.." && pwd)
rounds=${ROUNDS:-5}
out_dir=${OUT_DIR:-$here}
records=${RECORDS:-1000000}
samples=${SAMPLES:-200}
seconds=${SECONDS_OVERLOAD:-3}
warmup=${WARMUP:-1}
steps=${STEPS:-sending_loop,overload,first_packet,link_costs}
mkdir -p "$out_dir"

if [ $# -lt 2 ]; then
  echo "usage: $0 before=DIR after=DIR [more=DIR ...]" >&2
  exit 2
fi
tags=()
dirs=()
for spec in "$@"; do
  case $spec in
    *=*) ;;
    *) echo "not TAG=DIR: $spec" >&2; exit 2 ;;
  esac
  tag=${spec%%=*}
  dir=${spec#*=}
  for exe in pure-serve sending_loop overload first_packet; do
    if [ ! -x "$dir/$exe" ]; then
      echo "$tag: $dir/$exe is missing (or not executable)" >&2
      exit 2
    fi
  done
  [ -x "$dir/link_costs" ] || echo "$tag: no $dir/link_costs; its step is skipped for this build" >&2
  tags+=("$tag")
  dirs+=("$(cd "$dir" && pwd)")
done
if [ -n "${FLOOD_TOOL:-}" ] && [ ! -x "$FLOOD_TOOL" ]; then
  echo "FLOOD_TOOL=$FLOOD_TOOL is not executable" >&2
  exit 2
fi

want() { [[ ",$steps," == *",$1,"* ]]; }

# Adds build, round, bench (and label) to each JSON line on stdin; everything else (non-JSON lines) is dropped.
tag_lines() {
  python3 -c '
import json, sys
bench, build, rnd, label = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
for line in sys.stdin:
    if not line.startswith("{"):
        continue
    o = json.loads(line)
    o.setdefault("bench", bench)
    o["build"] = build
    o["round"] = rnd
    if label:
        o.setdefault("label", label)
    print(json.dumps(o, separators=(",", ":")), flush=True)
' "$@"
}

# run_tool STEP LABEL TAG ROUND EXE ARGS...: one invocation, its JSON lines tagged into the build's results.
run_tool() {
  local bench=$1 label=$2 tag=$3 round=$4
  shift 4
  local out="$out_dir/results-$tag.jsonl" log="$out_dir/stderr-$tag.log" t0=$SECONDS rc=0
  echo "== round $round $tag $bench ${label:+$label }($(date -u +%H:%M:%S), load $(cut -d' ' -f1 /proc/loadavg))" >&2
  echo "== round $round $bench ${label:+$label }: $*" >> "$log"
  # pipefail: rc is the tool's status (or the tagger's).
  "$@" 2>> "$log" | tag_lines "$bench" "$tag" "$round" "$label" >> "$out" || rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "!! round $round $tag $bench $label failed (exit $rc); see $log" >&2
    printf '{"bench":"%s","build":"%s","round":%d,"label":"%s","failed":%d}\n' \
      "$bench" "$tag" "$round" "$label" "$rc" >> "$out"
  fi
  echo "   $((SECONDS - t0)) s" >&2
}

# One step for one build.
step() {
  local what=$1 tag=$2 dir=$3 round=$4
  local flood=${FLOOD_TOOL:-$dir/overload}
  local ov=(--bin "$dir/pure-serve" --warmup "$warmup" --seconds "$seconds")
  case $what in
    sending_loop)
      run_tool sending_loop "" "$tag" "$round" "$dir/sending_loop" --round "$round" --only forward \
        --shapes link/1,link/4,wire/1,wire/4 --records "$records" ;;
    overload/unloaded)
      run_tool overload unloaded "$tag" "$round" "$flood" "${ov[@]}" --label unloaded --senders 4 --flood 0 ;;
    overload/forged)
      run_tool overload forged "$tag" "$round" "$flood" "${ov[@]}" --label forged --senders 4 --mix forged \
        --flood 100000 --budget 250 --new 10 ;;
    overload/capacity)
      run_tool overload capacity "$tag" "$round" "$flood" "${ov[@]}" --label capacity --senders 8 --flood 0 ;;
    overload/curve40)
      run_tool overload curve/40 "$tag" "$round" "$flood" "${ov[@]}" --label curve/40 --senders 40 \
        --rate-each 200000 --flood 0 ;;
    first_packet)
      run_tool first_packet "" "$tag" "$round" "$dir/first_packet" --round "$round" --samples "$samples" \
        --idle-ms 100 --gap-ms 20 ;;
    link_costs)
      if [ -x "$dir/link_costs" ]; then
        run_tool link_costs "" "$tag" "$round" "$dir/link_costs" --round "$round" --only link
      fi ;;
  esac
}

sequence=()
want sending_loop && sequence+=(sending_loop)
want overload && sequence+=(overload/unloaded overload/forged overload/capacity overload/curve40)
want first_packet && sequence+=(first_packet)
want link_costs && sequence+=(link_costs)

for tag in "${tags[@]}"; do
  : > "$out_dir/results-$tag.jsonl"
  : > "$out_dir/stderr-$tag.log"
done
{
  echo "# research/010-sync-off-the-loop, run.sh $*"
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "uname: $(uname -a)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), nproc $(nproc)"
  echo "loadavg at start: $(cat /proc/loadavg)"
  echo "git (working tree, not necessarily the builds): $(git -C "$top" rev-parse HEAD)$(git -C "$top" diff --quiet HEAD -- src benches Cargo.toml Cargo.lock 2>/dev/null || echo ' +dirty')"
  echo "state fs (TMPDIR=${TMPDIR:-/tmp}): $(findmnt -n -o FSTYPE,SOURCE --target "${TMPDIR:-/tmp}" 2>/dev/null || echo unknown)"
  echo "net.core.rmem_max=$(cat /proc/sys/net/core/rmem_max) wmem_max=$(cat /proc/sys/net/core/wmem_max)"
  echo "rounds=$rounds records=$records samples=$samples overload warmup=$warmup seconds=$seconds steps=$steps flood_tool=${FLOOD_TOOL:-per build}"
  for i in "${!tags[@]}"; do
    echo "build ${tags[$i]}: ${dirs[$i]}"
    for exe in pure-serve sending_loop overload first_packet link_costs; do
      f="${dirs[$i]}/$exe"
      [ -e "$f" ] && echo "  $(sha256sum "$f" | cut -c1-16)  $(date -u -r "$f" +%Y-%m-%dT%H:%M:%SZ)  $exe"
    done
  done
} > "$out_dir/machine.txt"

n=${#tags[@]}
for ((r = 1; r <= rounds; r++)); do
  t_round=$SECONDS
  order=()
  for ((k = 0; k < n; k++)); do order+=($(( (k + r) % n ))); done
  echo "round $r of $rounds: order $(for i in "${order[@]}"; do printf '%s ' "${tags[$i]}"; done)" >&2
  for s in "${sequence[@]}"; do
    for i in "${order[@]}"; do
      step "$s" "${tags[$i]}" "${dirs[$i]}" "$r"
    done
  done
  echo "round $r: $((SECONDS - t_round)) s, order $(for i in "${order[@]}"; do printf '%s ' "${tags[$i]}"; done), load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out_dir/machine.txt"
done
echo "loadavg at end: $(cat /proc/loadavg)" >> "$out_dir/machine.txt"

files=()
for tag in "${tags[@]}"; do files+=("$out_dir/results-$tag.jsonl"); done
python3 "$here/summarize.py" "${files[@]}" | tee "$out_dir/summary.md"
