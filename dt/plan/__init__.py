"""`dt plan`: predict a whole training step for every layout before a process starts.

- model.py       the model's shape: dt's GPT flags, or presets of public shapes
- layouts.py     every layout dt train accepts (dt.train.layouts' rule) for a model, world, batch
- cluster.py     what the ranks run on: this machine as `dt tune` measured it, or a catalogue cluster
- compute.py     FLOPs of each layer and what they cost on the cluster
- pipeline.py    the schedule's own action order played out with the predicted durations
- step_model.py  one layout's per-rank timeline (compute, exposed communication by kind, bubble)
- memory.py      one layout's peak bytes per rank
- check.py       `dt plan --check`: the layouts run with dt train, predicted beside measured
- trace.py       Chrome trace JSON (Perfetto): measured and predicted timelines side by side
- cli.py         the command: ranked table, --explain, --json, the scatter
"""
