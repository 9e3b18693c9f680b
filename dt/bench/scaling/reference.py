"""The original design's sizes: what the study measures at full size, and compares a run against.

The original design measured its tables on a 10-core machine (gloo over
loopback, CPU); docs/original_design.md has its figures. Its sizes are the
defaults of StudySettings; `--quick` and the command-line options shrink them, and
every run says how far (StudySettings.shrinkage).
"""

from __future__ import annotations

T1_BYTES = 33_554_432  # table 1: 33.55 MB, 8,388,608 float32 (the big tensor)
T2_BYTES = 262_144  # table 2: 0.26 MB, 65,536 float32 (the small tensor)
COLL_WORLDS = (2, 4, 8)  # tables 1, 2: all-reduce at these world sizes
DP_WORLDS = (1, 2, 4, 8)  # table 3: data parallel at these world sizes
DP_BATCH = 16384  # table 3's global batch
SWEEP_BATCHES = (256, 1024, 4096, 16384)  # table 4: global batches at the largest world
HIDDEN, LAYERS = 1024, 6  # the model: 6 Linear(1024, 1024), GELU between (6.3M parameters)
PP_STAGES, PP_MICRO = 4, (1, 4, 16)  # the bubble: 4 stages, 1 to 16 micro-batches
