#!/usr/bin/env bash
# dt train --dp 2 --zero 3 with FSDP's prefetch and with --no-prefetch, interleaved, three each;
# then one process against two at the default model (tokens/s of the whole job).
set -euo pipefail
common="--dp 2 --zero 3 --n-layer 8 --n-embd 256 --block-size 128 --batch-size 16 --steps 40 --threads 1 --no-progress"
for i in 1 2 3; do
  for flag in "" "--no-prefetch"; do
    echo "== dt train $common $flag (run $i)"
    dt train $common $flag 2>&1 | grep -E "^after the first step"
  done
done
for i in 1 2 3; do
  for dp in 1 2; do
    echo "== dt train --dp $dp --steps 200 --no-progress (run $i)"
    dt train --dp $dp --steps 200 --no-progress 2>&1 | grep -E "^after the first step"
  done
done
