"""The parallelisms, each built on dt's collectives and nothing else.

- buckets.py        gradient buckets: the rule DDP, ZeRO and the training step share
- data_parallel.py  DDP: one all-reduce of the gradients per step, overlapped with backward
- zero/             ZeRO 1-2 (sharded optimizer state and gradients), 3 (FSDP)
- tensor/           Megatron's tensor parallelism: f/g mappings, parallel layers, vocab parallel
- pipeline/         stages, micro-batches, GPipe / 1F1B / interleaved schedules
- expert/           expert parallelism: a mixture-of-experts layer over an all-to-all
- context/          context parallelism: ring attention and Ulysses over a split sequence
- exchange.py       the all-to-all and all-reduce as autograd functions (expert/, context/)
- mesh.py           the dp x cp x ep x tp x pp process grid (ep inside dp x cp)
- grid.py           the named grid: Grid({"pp": 2, "dp": 2, "tp": 2}), groups by axis names
- plan.py           dt.parallelize(model, grid, plan): tensor-parallel styles swapped in by name
"""
