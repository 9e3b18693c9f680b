"""`dt plan`: predict a whole training step for every layout before a process starts.

- model.py       the model's shape: dt's GPT flags, or presets of public shapes
- layouts.py     every layout dt train accepts (dt.train.layouts' rule) for a model, world, batch
- cluster.py     what the ranks run on: this machine as `dt tune` measured it, or catalogue GPUs
- compute.py     a stage's compute: its kernels (dt.cost.kernels) priced on a catalogue GPU, or timed here
- pricing.py     one kernel's seconds on a catalogue GPU: GEMM waves, attention's rate, HBM bandwidth
- comm.py        one collective's price on the level(s) its group sits on (dt.cost.time, .levels)
- stage.py       one pipeline stage: its tensors, its per-micro-batch work and messages by kind
- pipeline.py    the schedule's own action order played out with the predicted durations
- step_model.py  one layout's per-rank timeline (compute, exposed communication by kind, bubble)
- memory.py      one layout's peak bytes per rank (dt.cost.activations, ZeRO's formula, the stash)
- search.py      every layout: dropped if it does not fit, else priced; ranked
- report.py      the table, JSON, the timeline plot and the scatter
- check.py       `dt plan --check`: layouts run as dt train runs them, predicted beside measured
- trace.py       Chrome trace JSON (Perfetto): measured and predicted timelines side by side
- suite.py       `dt plan --published`: the planner beside published runs (published/), fit.py its fit
- cli.py         the command
"""
