"""Sharded checkpoints (format documented below; placeholder)."""

from dt.parallel.checkpoint.files import CheckpointError, DirectoryLock, check_directory
from dt.parallel.checkpoint.sharded import Checkpoint, Held, Place, agree, latest, lock_directory, read_full
from dt.parallel.checkpoint.state import Loaded, load, module_places, save, tensor_parallel_places

__all__ = ["Checkpoint", "CheckpointError", "DirectoryLock", "Held", "Loaded", "Place", "agree",
           "check_directory", "latest", "load", "lock_directory", "module_places", "read_full", "save",
           "tensor_parallel_places"]
