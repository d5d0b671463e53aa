#!/usr/bin/env bash
# research/045: a 1 MiB image over version 1.2, 1.1 and HTTPS; through a lossy namespace; to many devices; beside
# others' uplink. Run as root (network namespaces, nftables), from the repository's root, on a quiet machine.
set -euo pipefail
out=research/experiments/045-image-downlink
for r in 1 2 3; do cargo bench --bench downlink -- --only image --round "$r" >> "$out/image.jsonl"; done
cargo bench --bench downlink -- --only image-lossy --round 1 >> "$out/lossy.jsonl"
for r in 1 2; do cargo bench --bench downlink -- --only image-many --devices 1000 --round "$r" >> "$out/many.jsonl"; done
cargo bench --bench downlink -- --only image-many --devices 10000 --round 2 > "$out/many10k.jsonl"
cargo bench --bench downlink -- --only image-uplink --round 1 > "$out/uplink.jsonl"
