#!/bin/sh
# research/016, the goodput question: instructions the node executes per unit of work, counted by callgrind (which
# counts whatever the machine's load), for builds side by side under the same paced work: 4 senders at 1,000
# records/s each and 2,000 forged first packets/s from 16 /24s, 5 s after a 3 s warm-up. One JSON line per run.
# Usage: [OUT=FILE] run-callgrind.sh ROUNDS OVERLOAD NAME=DIR [NAME=DIR ...]   (each DIR holds pure-serve)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
ROUNDS=$1; TOOL=$2; shift 2
OUT="$here/${OUT:-results-callgrind.jsonl}"
work=$(mktemp -d)
: > "$OUT"
for round in $(seq "$ROUNDS"); do
  for spec in "$@"; do
    build=${spec%%=*}; dir=${spec#*=}
    rm -f "$work"/cg.*
    printf '#!/bin/sh\nexec valgrind -q --tool=callgrind --callgrind-out-file=%s/cg.%%p %s/pure-serve "$@"\n' "$work" "$dir" > "$work/vg"
    chmod +x "$work/vg"
    "$TOOL" --bin "$work/vg" --label "callgrind" --senders 4 --rate-each 1000 --mix forged --prefixes 16 --flood 2000 \
      --new 0 --warmup 3 --seconds 5 2>/dev/null | grep '^{' > "$work/run.json"
    # The node's own profile is the largest file (the tool runs the binary once more for a key).
    cg=$(ls -S "$work"/cg.* | head -1)
    callgrind_annotate --threshold=100 "$cg" 2>/dev/null > "$work/annotate.txt"
    python3 "$here/callgrind_line.py" "$work/run.json" "$work/annotate.txt" "$build" "$round" >> "$OUT"
  done
done
rm -rf "$work"
