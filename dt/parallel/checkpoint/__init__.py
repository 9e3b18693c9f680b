"""Sharded checkpoints: each rank writes what it holds, any layout reads them back.

    ck.save("ckpt", step, model, optimizer, keep=3)    # collective: DDP, ZeRO 1-2, FSDP, dt.parallelize's
    loaded = ck.load("ckpt", model, optimizer)         # collective: the newest good one, resharded
    loaded.step, loaded.layout, loaded.warnings        # None if "ckpt" holds no checkpoint yet

`dt train --checkpoint DIR` is built on these (dt.train.checkpoint).

The directory
-------------
    ckpt/
      .lock                        flock(2)'d by rank 0 of the job writing here
      step-00000040/               one checkpoint: appears whole or not at all
        manifest.json              what is where (below), written last
        rank-00000.pt ... rank-00007.pt
      step-00000050/
      .step-00000060.tmp-4242-9f3c/   a save in progress (pid and a random token: one per writer)

Saving (collective over the world; `save`, sharded.py):
1. rank 0 makes a private directory `.step-N.tmp-<pid>-<random>` and broadcasts its name;
2. every rank writes its own file rank-R.pt into it (torch.save of a dict of
   tensors, written with O_EXCL and fsync'd), and hashes it (sha256);
3. rank 0 gathers every rank's description of its file (dt.gather, a few hundred
   bytes each), merges them into the manifest, writes it, and renames the private
   directory to step-N: rename(2) is atomic, so a reader sees step-N complete or
   not at all; a crash at any point leaves only a private directory, which the
   next holder of the lock removes. Then the oldest beyond `keep` are removed.
Any failure on any rank (disk full, a bad path) is agreed on (`agree`: one
8-byte all-reduce, then a broadcast of the message) and raised on every rank
as the same one-line CheckpointError; the private directory is removed.

The manifest (one line per file and per tensor)
-----------------------------------------------
    {"format": "dt-checkpoint", "version": 1, "step": 40, "world": 8,
     "layout": {"world": 8, "dp": 2, "tp": 2, "pp": 2, "virtual": 1, "zero": 1},
     "meta": {"trainer": "dt train", "model": {...}, "param_groups": [{"lr": 0.003, ...}]},
     "files": {"rank-00000.pt": {"bytes": 39419, "sha256": "4421..."}, ...},
     "tensors": {
      "layers.2.mlp.dense_4h_to_h.weight": {"shape": [16, 64], "dtype": "float32", "chunks": [
         {"file": "rank-00000.pt", "key": "7", "offsets": [0, 0], "lengths": [8, 32]}, ...]},
      "optim/layers.2.mlp.dense_4h_to_h.weight/exp_avg": {...}, ...}}

Tensors are named as in the unsharded model (dt's GPT: layers.<i>.<name in
the layer>, whatever the grid), optimizer state as optim/<parameter>/<key>
(torch's keys: step, exp_avg, exp_avg_sq). A chunk is a box of the full
tensor: offsets and lengths per dimension, its data stored under `key` in
`file`. The chunks of a tensor tile it exactly (checked when saving: no gap,
no overlap). `layout` says how the saving run was cut; loading does not need it.

Who writes what (place.py, state.py)
------------------------------------
A rank describes each tensor it holds with a Place: the full tensor's name and
shape, the block it holds (tensor parallel: its slice along one dimension,
dt.layout.shard_block with split_sizes), the flat range of that block it holds
(ZeRO and FSDP: their shard of a flat buffer, cut at the parameter's edges),
and how many ranks hold the same piece (data parallel). Replicas split the
writing (split_sizes of the piece, one share each), so DDP on N ranks writes
each parameter once, 1/N per rank, and identical boxes written by several ranks
(Adam's per-parameter step, on every ZeRO rank) are kept once. A flat range of
a block is cut into boxes (dt.layout.flat_blocks: a partial row, whole rows, a
partial row), so every chunk is a box and resharding is box intersection.

Loading and resharding (sharded.py)
-----------------------------------
1. rank 0 lists the step directories, newest first, and broadcasts the list;
2. for each: every rank reads the manifest, and checks its share of the files
   (file i is hashed by rank i mod world: size, then sha256); the ranks agree.
   A bad one is skipped with a one-line warning naming the file and what is
   wrong ("truncated (812 of 4096 bytes); falling back to ckpt/step-00000030");
   if none is good, that is a one-line CheckpointError;
3. every rank computes the Places of the tensors it holds under *its* layout
   (the new mesh, ZeRO stage, world), cuts each into boxes, and for each box
   copies from every saved chunk that intersects it (dt.layout.intersect),
   reading the files memory-mapped: only the bytes it needs. It checks that the
   copies covered every element. dp, tp, pp, the ZeRO stage and the world size
   may all differ from the saving run's; the model may not (a tensor missing or
   of another shape is a one-line error naming it).
No tensor crosses the network: every rank reads the files itself, so this
needs the files where every rank can read them (one machine, or a shared
filesystem), as torch's distributed checkpoint does. What ranks exchange is
small: names, descriptions, verdicts.

Locking: `lock_directory` (agree.py) has rank 0 check the directory can be
written and take its flock before the first step; a second job is refused in
one line, and the kernel drops the lock when its holder dies, however it dies.

- files.py   names, the lock, the manifest, size and checksum checks (no collectives)
- agree.py   world, agree, broadcast_bytes, gather_bytes, lock_directory
- place.py   Place and Held
- sharded.py save, latest, Checkpoint.read, read_full
- state.py   a model and its optimizer as Held tensors: save, load
"""

from dt.parallel.checkpoint.agree import agree, lock_directory
from dt.parallel.checkpoint.files import CheckpointError, DirectoryLock, check_directory
from dt.parallel.checkpoint.place import Held, Place
from dt.parallel.checkpoint.sharded import Checkpoint, latest, read_full
from dt.parallel.checkpoint.state import Loaded, load, module_places, save, tensor_parallel_places

__all__ = ["Checkpoint", "CheckpointError", "DirectoryLock", "Held", "Loaded", "Place", "agree",
           "check_directory", "latest", "load", "lock_directory", "module_places", "read_full", "save",
           "tensor_parallel_places"]
