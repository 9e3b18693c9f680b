#!/usr/bin/env bash
# The planner's peak per rank beside dt train's live-tensor peak, one layout at a time
# (dt plan --explain LAYOUT --check: the check's own memory run in fresh processes), for the layouts
# whose memory has terms of its own: gradient accumulation under DDP, context parallel's backward,
# pipelines. Each line: the layout, then --check's comparison row (pred peak, meas peak, err).
set -euo pipefail
unset DT_RECORD_HEADLINE  # recorded (python -m dt.record), the inner dt plans declare no headline
cases=(
  "2 dp2.tp1.pp1.z0.1f1b.m1" "2 dp2.tp1.pp1.z0.1f1b.m2" "2 dp2.tp1.pp1.z0.1f1b.m4"
  "2 dp2.tp1.pp1.z1.1f1b.m2" "2 dp2.tp1.pp1.z2.1f1b.m2" "2 dp1.tp1.pp2.z0.1f1b.m2"
  "2 dp1.tp1.pp1.cp2ring.z0.1f1b.m1" "2 dp1.tp1.pp1.cp2ring.z0.1f1b.m2"
  "4 dp2.tp2.pp1.z0.1f1b.m2" "4 dp2.tp1.pp2.z0.1f1b.m1" "4 dp2.tp1.pp2.z0.1f1b.m4"
  "4 dp2.tp1.pp2.z0.gpipe.m4" "4 dp2.tp1.pp2.z0.interleaved.m4.v2"
  "4 dp1.tp1.pp2.cp2ring.z0.interleaved.m2.v2" "4 dp1.tp1.pp2.cp2ring.z0.interleaved.m4.v2"
)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for case in "${cases[@]}"; do
  read -r world layout <<< "$case"
  python -m dt plan --world "$world" --global-batch 16 --seq 32 --explain "$layout" --check --steps 2 \
    --out "$out/timeline.png" > "$out/run.txt"
  echo "world $world $(grep "^$layout " "$out/run.txt")"
done
