"""Benchmarks, packaged so `dt bench NAME` works from any install.

- collectives.py  every algorithm against torch's collective, nccl-tests columns
                  (collectives_sweep.py: the ranks' side; collectives_table.py: what it prints)
- ddp.py          dt's DDP against torch's on the reference model
- scaling/        the scaling study: what distributed training costs here, table by table
- idle.py         what a rank waiting in a collective costs (CPU time while it waits)
- harness.py      buffers for any collective, a call by algorithm name, the timing loop, gamma
                  (also used by `dt tune` and `dt model --measured`)
- report.py       machine description, statistics, markdown and JSON output
"""
