#!/bin/sh
# research/016 (b): what the memo writes to disk. The state directory on an ext4 of its own (a loop device on an
# image in $WORK, made and removed here; root), the stores back on the main disk, so the device's sectors written
# from the window's start through the node's exit are the memo's. Builds side by side, order alternating each
# round: forged first packets at 100k/s for 5 s and no sender; 2,000 new senders at 200/s (into an empty memo and
# into one of a million secrets) and all at once, each beside the same senders already in the memo (the control).
# Usage: [OUT=FILE] [WORK=DIR] run-memo.sh ROUNDS OVERLOAD NAME=DIR [NAME=DIR ...]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
ROUNDS=$1; TOOL=$2; shift 2
OUT="$here/${OUT:-results-memo.jsonl}"
WORK=${WORK:-/tmp/memo016}
mkdir -p "$WORK/fs"
truncate -s 4G "$WORK/memo.img"
mkfs.ext4 -q -F "$WORK/memo.img"
DEV=$(losetup -f --show "$WORK/memo.img")
mount "$DEV" "$WORK/fs"
trap 'umount "$WORK/fs"; losetup -d "$DEV"; rm -f "$WORK/memo.img"' EXIT
NAME=$(basename "$DEV")
: > "$OUT"
n=$#
CFGS="flood:0:0 new:200:0 known:200:0 new:200:1000000 known:200:1000000 new:0:0 known:0:0"
for round in $(seq "$ROUNDS"); do
  for cfg in $CFGS; do
    kind=${cfg%%:*}; rest=${cfg#*:}; rate=${rest%%:*}; fill=${rest#*:}
    i=0
    while [ $i -lt $n ]; do
      k=$(( (i + round) % n + 1 ))
      eval "spec=\${$k}"
      build=${spec%%=*}; dir=${spec#*=}
      case $kind in
        flood) args="--mix forged --prefixes 256 --flood 100000 --seconds 5" ;;
        new) args="--burst 2000 --burst-rate $rate --memo-fill $fill --seconds 1" ;;
        known) args="--burst 2000 --burst-rate $rate --burst-known --memo-fill $fill --seconds 1" ;;
      esac
      # shellcheck disable=SC2086
      "$TOOL" --bin "$dir/pure-serve" --label "$cfg" --senders 0 $args --memo-dir "$WORK/fs" --memo-dev "$NAME" 2>/dev/null |
        grep '^{' | python3 -c "import json,sys; d=json.loads(sys.stdin.read()); d['build']='$build'; d['round']=$round; print(json.dumps(d))" >> "$OUT"
      i=$((i + 1))
    done
  done
done
