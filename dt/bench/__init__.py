"""Benchmarks, packaged so `dt bench NAME` works from any install.

- collectives.py  every algorithm against torch's collective, nccl-tests columns
- ddp.py          dt's DDP against torch's on the reference model
- scaling/        the scaling study: what distributed training costs here, table by table
- report.py       machine description, statistics, markdown and JSON output
"""
