"""Saving a sharded checkpoint and reading it back on any layout (the package docstring has the format).

Both are collective over the whole world: every rank writes its own file,
rank 0 writes the manifest and publishes the step directory, and every
failure is agreed on (`agree`) so that all ranks raise the same one-line
CheckpointError together instead of some waiting on the others forever.
"""

from __future__ import annotations

import io
import json
import math
import os
import shutil
from typing import Any

import torch

from dt.layout import Block, edges, flat_blocks, intersect, split_sizes
from dt.parallel.checkpoint import files
from dt.parallel.checkpoint.agree import agree, broadcast_bytes, gather_bytes, raise_if, world
from dt.parallel.checkpoint.files import MANIFEST, CheckpointError
from dt.parallel.checkpoint.place import Held, Place

__all__ = ["Checkpoint", "latest", "read_full", "save"]


# -- saving ---------------------------------------------------------------------------------------
def _chunks(h: Held) -> list[tuple[Block, torch.Tensor]]:
    """The boxes this rank writes for `h`: its replica's share of the range, cut into boxes."""
    p = h.place
    lo, hi = p.range
    sizes = split_sizes(hi - lo, p.replicas)  # replicas split the writing evenly
    a = edges(sizes)[p.replica]
    flat = h.data.reshape(-1)
    out, pos = [], a
    origin, lengths = p.box
    for off, n in flat_blocks(lo + a, lo + a + sizes[p.replica], lengths):
        k = math.prod(n)
        box = (tuple(o + d for o, d in zip(origin, off)), n)
        out.append((box, flat[pos:pos + k].reshape(n).clone()))  # clone: save the piece, not the storage
        pos += k
    return out


def _write_rank_file(private: str, rank: int, held: list[Held]) -> dict[str, Any]:
    chunks: dict[str, torch.Tensor] = {}
    tensors: dict[str, Any] = {}
    for h in held:
        if not h.place.saved:
            continue
        entry = tensors.setdefault(h.place.name, {"shape": list(h.place.shape),
                                                  "dtype": str(h.data.dtype).removeprefix("torch."),
                                                  "chunks": []})
        for box, t in _chunks(h):
            key = str(len(chunks))
            chunks[key] = t
            entry["chunks"].append({"key": key, "offsets": list(box[0]), "lengths": list(box[1])})
    buf = io.BytesIO()
    torch.save(chunks, buf)
    data = buf.getvalue()
    name = files.rank_file(rank)
    files.write_new(os.path.join(private, name), data)
    return {"file": name, "bytes": len(data), "sha256": files.sha256(data), "tensors": tensors}


def _merge(step: int, entries: list[dict[str, Any]]) -> dict[str, Any]:
    """Every rank's chunks into one table; identical boxes written by several ranks are kept once."""
    tensors: dict[str, Any] = {}
    for e in entries:
        for name, t in e["tensors"].items():
            m = tensors.setdefault(name, {"shape": t["shape"], "dtype": t["dtype"], "chunks": []})
            if (m["shape"], m["dtype"]) != (t["shape"], t["dtype"]):
                raise CheckpointError(f"saving step {step}: ranks disagree on tensor {name}: "
                                      f"{m['shape']} {m['dtype']} and {t['shape']} {t['dtype']}")
            seen = {(tuple(c["offsets"]), tuple(c["lengths"])) for c in m["chunks"]}
            for c in t["chunks"]:
                if (tuple(c["offsets"]), tuple(c["lengths"])) not in seen:
                    m["chunks"].append({"file": e["file"], **c})
    for name, m in tensors.items():  # the pieces must tile the tensor: no gap, no overlap
        boxes = [(tuple(c["offsets"]), tuple(c["lengths"])) for c in m["chunks"]]
        overlap = any(intersect(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
        covered = sum(math.prod(b[1]) for b in boxes)
        if overlap or covered != math.prod(m["shape"]):
            raise CheckpointError(f"saving step {step}: the ranks' pieces of {name} "
                                  f"{'overlap' if overlap else f'cover {covered} of its elements'} "
                                  f"(shape {m['shape']}): the model describes its shards wrongly")
    return tensors


def _dumps(manifest: dict[str, Any]) -> str:
    """JSON with one line per file and per tensor: readable, and diffable between two saves."""
    def table(d: dict[str, Any]) -> str:
        return "{\n" + ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in d.items()) + "\n }"
    body = [f" {json.dumps(k)}: {table(v) if k in ('files', 'tensors') else json.dumps(v)}"
            for k, v in manifest.items()]
    return "{\n" + ",\n".join(body) + "\n}\n"


def save(directory: str, step: int, held: list[Held], *, layout: dict[str, Any] | None = None,
         meta: dict[str, Any] | None = None, keep: int = 3) -> str:
    """Write `held` (this rank's tensors) as DIRECTORY/step-NNNNNNNN; collective over the world.

    Returns the step directory. Cost: each rank writes its share; rank 0 gathers every
    rank's file description (a few hundred bytes each) and writes the manifest; four
    small agreements (`agree`) make a failure anywhere an error everywhere.
    """
    rank, size = world()
    private, problem = "", None
    if rank == 0:
        try:  # made here if it is missing and its parent is not
            private = files.make_private_dir(files.check_directory(directory), step)
        except CheckpointError as e:
            problem = str(e)
        except OSError as e:
            problem = files.describe_os_error(f"checkpoint directory {directory}", e)
    raise_if(agree(problem))
    private = os.path.join(directory, broadcast_bytes(os.path.basename(private).encode(), 0).decode()
                           if size > 1 else os.path.basename(private))
    done = False
    try:
        entry, problem = {}, None
        try:
            entry = _write_rank_file(private, rank, held)
        except OSError as e:
            path = os.path.join(private, files.rank_file(rank))
            problem = files.describe_os_error(f"checkpoint file {path}", e)
        raise_if(agree(problem))
        entries = gather_bytes(json.dumps(entry).encode()) if size > 1 else [json.dumps(entry).encode()]
        final = os.path.join(directory, files.step_name(step))
        if rank == 0:
            try:
                manifest = {"format": files.FORMAT, "version": files.VERSION, "step": step, "world": size,
                            "layout": layout or {}, "meta": meta or {}}
                described = [json.loads(e) for e in entries]
                manifest["files"] = {e["file"]: {"bytes": e["bytes"], "sha256": e["sha256"]}
                                     for e in described}
                manifest["tensors"] = _merge(step, described)
                files.write_new(os.path.join(private, MANIFEST), _dumps(manifest).encode())
                files.commit(private, final)
                files.prune(directory, keep)
            except OSError as e:
                problem = files.describe_os_error(f"checkpoint {final}", e)
            except CheckpointError as e:
                problem = str(e)
        raise_if(agree(problem))
        done = True
        return final
    finally:
        if rank == 0 and not done:
            shutil.rmtree(private, ignore_errors=True)  # a failed save leaves nothing behind


# -- loading --------------------------------------------------------------------------------------
def _slices(box: Block, origin: tuple[int, ...]) -> tuple[slice, ...]:
    return tuple(slice(o - a, o - a + n) for o, a, n in zip(box[0], origin, box[1]))


class Checkpoint:
    """One step directory whose manifest and files passed their checks."""

    def __init__(self, path: str, manifest: dict[str, Any]):
        self.path, self.manifest = path, manifest
        self.step: int = manifest["step"]
        self.layout: dict[str, Any] = manifest["layout"]
        self.meta: dict[str, Any] = manifest["meta"]
        self.tensors: dict[str, Any] = manifest["tensors"]
        self._open: dict[str, dict[str, torch.Tensor]] = {}

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.tensors[name]["shape"])

    def dtype(self, name: str) -> torch.dtype:
        return getattr(torch, self.tensors[name]["dtype"])

    def _chunk(self, file: str, key: str) -> torch.Tensor:
        if file not in self._open:
            path = os.path.join(self.path, file)
            try:  # mmap: only the pages of the chunks this rank copies are read
                self._open[file] = torch.load(path, mmap=True, weights_only=True, map_location="cpu")
            except Exception as e:  # noqa: BLE001 - torch's reader raises many kinds; one line says which
                first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise CheckpointError(f"checkpoint file {path}: unreadable ({first})") from None
        try:
            return self._open[file][key]
        except (KeyError, TypeError):
            raise CheckpointError(f"checkpoint file {os.path.join(self.path, file)}: has no "
                                  f"chunk {key!r}") from None

    def _fill(self, h: Held) -> None:
        p = h.place
        t = self.tensors.get(p.name)
        if t is None:
            raise CheckpointError(f"checkpoint {self.path}: has no tensor {p.name} (saved from another "
                                  f"model?)")
        if tuple(t["shape"]) != tuple(p.shape):
            raise CheckpointError(f"checkpoint {self.path}: {p.name} has shape {tuple(t['shape'])} there, "
                                  f"{tuple(p.shape)} in this model")
        if not h.data.is_contiguous():
            raise ValueError(f"{p.name}: loading needs a contiguous tensor to write into")
        flat, pos = h.data.view(-1), 0
        origin, lengths = p.box
        lo, hi = p.range
        boxes = [(c, (tuple(c["offsets"]), tuple(c["lengths"]))) for c in t["chunks"]]
        for off, n in flat_blocks(lo, hi, lengths):
            want = (tuple(o + d for o, d in zip(origin, off)), n)
            k = math.prod(n)
            dst = flat[pos:pos + k].view(n)
            pos += k
            covered = 0
            for c, box in boxes:
                overlap = intersect(want, box)
                if overlap is not None:
                    src = self._chunk(c["file"], c["key"])
                    dst[_slices(overlap, want[0])].copy_(src[_slices(overlap, box[0])])
                    covered += math.prod(overlap[1])
            if covered != k:
                raise CheckpointError(f"checkpoint {self.path}: {p.name} is covered for {covered} of "
                                      f"{k} elements of block {want}")

    def read(self, targets: list[Held]) -> None:
        """Fill every target from the chunks that overlap it. Collective (errors are agreed on)."""
        problem = None
        try:
            for h in targets:
                self._fill(h)
        except CheckpointError as e:
            problem = str(e)
        finally:
            self._open.clear()  # drop the maps
        raise_if(agree(problem))


def _check(path: str, step: int, rank: int, size: int) -> dict[str, Any]:
    manifest = files.read_manifest(path)
    if manifest["step"] != step:
        raise CheckpointError(f"checkpoint file {os.path.join(path, MANIFEST)}: says step "
                              f"{manifest['step']}, its directory says {step}")
    names = sorted(manifest["files"])
    for i in range(rank, len(names), size):  # every file is hashed once, by one rank
        files.check_file(path, names[i], manifest["files"][names[i]])
    return manifest


def latest(directory: str) -> tuple[Checkpoint | None, list[str]]:
    """The newest usable checkpoint under `directory`, and a warning for each one skipped.

    Collective: rank 0 lists the step directories; for each, newest first,
    every rank reads the manifest and checks its share of the files (size and
    sha256); the ranks agree. A bad one is skipped with a warning naming the
    file and what is wrong; if every one is bad, that is a CheckpointError.
    (None, []) when there is no checkpoint at all.
    """
    rank, size = world()
    listing = json.dumps([[s, p] for s, p in files.step_dirs(directory)]).encode() if rank == 0 else b""
    candidates = json.loads(broadcast_bytes(listing, 0) if size > 1 else listing)
    warnings: list[str] = []
    problems: list[str] = []
    for i, (step, path) in enumerate(candidates):
        manifest, problem = None, None
        try:
            manifest = _check(path, step, rank, size)
        except CheckpointError as e:
            problem = str(e)
        problem = agree(problem)
        if problem is None:
            return Checkpoint(path, manifest), warnings
        problems.append(problem)
        if i + 1 < len(candidates):
            warnings.append(f"{problem}; falling back to {candidates[i + 1][1]}")
    if len(problems) == 1:
        raise CheckpointError(problems[0])
    if problems:
        raise CheckpointError(f"no usable checkpoint in {directory}: " + "; ".join(problems))
    return None, []


def read_full(path: str) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """One step directory's manifest and every tensor in full, in this process (no collectives)."""
    manifest = _check(path, files.read_manifest(path)["step"], 0, 1)
    ckpt = Checkpoint(path, manifest)
    out = {}
    for name, t in ckpt.tensors.items():
        full = torch.empty(t["shape"], dtype=getattr(torch, t["dtype"]))  # host: never sent
        ckpt._fill(Held(Place(name, tuple(t["shape"])), full))
        out[name] = full
    return manifest, out
